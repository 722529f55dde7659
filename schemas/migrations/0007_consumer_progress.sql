-- forumpulse schema, migration 0007: how far each consumer group has loaded each Kafka partition.
--
-- The live detectors read a site only up to its watermark.  The sources' latest lines and heartbeats
-- (`source_liveness`) cannot show a loader that is behind on one partition only: a source's lines are spread over
-- the partitions by client address, so its latest line comes from whichever partition is current.  Each consumer
-- therefore writes, every stats interval (10 s), one row per partition it owns: the Kafka timestamp of the newest
-- message it has stored and committed, the partition's lag (messages between that and the high watermark; -1 when
-- unknown) and whether it still owns the partition (`active` = false on a clean exit).  The detectors hold back to
-- `loaded_ts` while a partition is behind, and to `updated_at` when its owner has stopped reporting
-- (TrafficDetector._watermark).  One row per partition is kept (the newest `updated_at`); rows of a group no
-- longer running stay (a few bytes each) and are ignored once older than `gap_min_minutes`.  No TTL: a row's age
-- is judged by its reader against its own clock (a history or test clock too).
CREATE TABLE IF NOT EXISTS consumer_progress
(
    group_id    LowCardinality(String),
    topic       LowCardinality(String),
    partition   UInt32,
    loaded_ts   DateTime64(3, 'UTC'),
    next_offset UInt64,
    lag         Int64,
    active      Bool,
    instance    LowCardinality(String),
    updated_at  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (group_id, topic, partition);
