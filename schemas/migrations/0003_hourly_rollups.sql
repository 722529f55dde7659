-- forumpulse schema, migration 0003: hourly topic and prefix rollups (dashboard ranges of days),
-- url/referer LowCardinality.
--
-- X_hour (topic_hour, prefix_hour) holds what X_minute holds, per hour.  Each is fed by a CASCADED
-- materialized view on X_minute (not on requests): the view sees only the small aggregated blocks the X_minute
-- view writes, so the insert path into requests does not grow.  The view receives the block of states inserted
-- into X_minute, so it re-aggregates them: sum() of the sums, uniqMergeState() of the uniq states.  Exactly once:
-- a replayed insert into requests carries the same insert_deduplication_token; the store inserts with
-- deduplicate_blocks_in_dependent_materialized_views = 1, so X_minute and X_hour (all with
-- non_replicated_deduplication_window) each drop the replayed block (tests/test_schema.py checks).
--
-- Upgrades keep history: the TRUNCATE + INSERT pairs at the end fill X_hour from the X_minute rows already stored.
-- Run this migration with ingestion stopped (as every migration: the embedded store migrates when it opens,
-- before it ingests).  A migration that failed half-way is re-run from its first statement: the TRUNCATE makes the
-- backfill idempotent (X_hour holds nothing but this backfill until the migration is recorded).
-- The backfill is not part of the cluster DDL (schemas/cluster): a cluster created from it has no history.
--
-- Dashboards read X_hour for the whole hours inside a range and X_minute for the partial hours at its
-- edges (forumpulse.dashboards.panels), so every number is the same as from X_minute alone.
-- No client_hour: client rows hardly aggregate by hour (0.59 of client_minute's rows on the 10M-line benchmark,
-- against 0.25 for topics and 0.33 for prefixes), so it would cost inserts nearly what client_minute does for
-- a 1.2x faster "Top clients".
--
-- requests.url / requests.referer become LowCardinality(String): forum URLs and referers repeat (a few % distinct
-- per part), 14.8 -> 9.3 B/row for requests (BENCHMARKS.md).  Insert of 100k-line blocks into requests with all
-- its views, old vs new schema side by side in one process (issue #8): this change alone 1.00x the CPU time;
-- with the hourly cascades ~1.1x.
-- ALTER … MODIFY COLUMN rewrites these two columns of every existing part (a mutation, in the background on a
-- server); re-running it on columns that already have the type is a no-op.  LowCardinality(String) accepts the
-- plain strings the pipeline inserts (pipeline/tables.py is unchanged).

ALTER TABLE requests MODIFY COLUMN url LowCardinality(String) CODEC(ZSTD(3));

ALTER TABLE requests MODIFY COLUMN referer LowCardinality(String) CODEC(ZSTD(3));

CREATE TABLE IF NOT EXISTS topic_hour
(
    site      LowCardinality(String),
    topic_id  UInt64,
    hour      DateTime('UTC'),
    views     SimpleAggregateFunction(sum, UInt64),
    replies   SimpleAggregateFunction(sum, UInt64),
    bot_views SimpleAggregateFunction(sum, UInt64),
    visitors  AggregateFunction(uniq, IPv6)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (site, hour, topic_id)
{rollup_ttl:hour}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS topic_hour_mv TO topic_hour AS
SELECT
    site,
    topic_id,
    toStartOfHour(minute) AS hour,
    sum(views) AS views,
    sum(replies) AS replies,
    sum(bot_views) AS bot_views,
    uniqMergeState(visitors) AS visitors
FROM topic_minute
GROUP BY site, topic_id, hour;

CREATE TABLE IF NOT EXISTS prefix_hour
(
    site       LowCardinality(String),
    hour       DateTime('UTC'),
    prefix     IPv6,
    prefix_len UInt8,
    requests   SimpleAggregateFunction(sum, UInt64),
    clients    AggregateFunction(uniq, IPv6)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (site, hour, prefix_len, prefix)
{rollup_ttl:hour}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS prefix_hour_mv TO prefix_hour AS
SELECT
    site,
    toStartOfHour(minute) AS hour,
    prefix,
    prefix_len,
    sum(requests) AS requests,
    uniqMergeState(clients) AS clients
FROM prefix_minute
GROUP BY site, hour, prefix, prefix_len;

TRUNCATE TABLE IF EXISTS topic_hour;

INSERT INTO topic_hour (site, topic_id, hour, views, replies, bot_views, visitors)
SELECT
    site,
    topic_id,
    toStartOfHour(minute) AS hour,
    sum(views) AS views,
    sum(replies) AS replies,
    sum(bot_views) AS bot_views,
    uniqMergeState(visitors) AS visitors
FROM topic_minute
GROUP BY site, topic_id, hour;

TRUNCATE TABLE IF EXISTS prefix_hour;

INSERT INTO prefix_hour (site, hour, prefix, prefix_len, requests, clients)
SELECT
    site,
    toStartOfHour(minute) AS hour,
    prefix,
    prefix_len,
    sum(requests) AS requests,
    uniqMergeState(clients) AS clients
FROM prefix_minute
GROUP BY site, hour, prefix, prefix_len;
