-- forumpulse schema, migration 0002: Kafka consumer batch intents (exactly-once effect of `forumpulse consume`).
--
-- Before a consumer inserts the rows of a batch (one Kafka partition, offsets first..last), it records the range
-- here.  After a crash or a rebalance, the next owner of the partition reads the ranges at or after its committed
-- offset and cuts its first batches at exactly the same offsets, so the replayed inserts carry the same
-- insert_deduplication_token and are stored once in `requests`, `quarantine` and every rollup.
-- Rows are tiny (one per batch) and expire after 30 days; only ranges after the committed offset matter.
CREATE TABLE IF NOT EXISTS consumer_batches
(
    group_id     LowCardinality(String),
    topic        LowCardinality(String),
    partition    UInt32,
    first_offset UInt64,
    last_offset  UInt64,
    messages     UInt32,
    instance     LowCardinality(String),
    created_at   DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(created_at)
ORDER BY (group_id, topic, partition, first_offset)
TTL toDateTime(created_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;
