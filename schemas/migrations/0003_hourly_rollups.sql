-- forumpulse schema, migration 0003: hourly topic rollup (dashboard ranges of days), url/referer LowCardinality.
--
-- topic_hour holds what topic_minute holds, per hour.  It is fed by a CASCADED materialized view on topic_minute
-- (not on requests): the view sees only the small aggregated blocks the topic_minute view writes, so the insert
-- path into requests does not grow.  The view receives the block of states inserted into topic_minute, so it
-- re-aggregates them: sum() of the sums, uniqMergeState() of the uniq states.  Exactly once: a replayed insert
-- into requests carries the same insert_deduplication_token; the store inserts with
-- deduplicate_blocks_in_dependent_materialized_views = 1, so topic_minute and topic_hour (both with
-- non_replicated_deduplication_window) each drop the replayed block (tests/test_schema.py checks).
--
-- Upgrades keep history: the last two statements fill topic_hour from the topic_minute rows already stored.
-- Run this migration with ingestion stopped (as every migration: the embedded store migrates when it opens,
-- before it ingests).  A migration that failed half-way is re-run from its first statement: the TRUNCATE makes the
-- backfill idempotent (topic_hour holds nothing but this backfill until the migration is recorded).
-- The backfill is not part of the cluster DDL (schemas/cluster): a cluster created from it has no history.
--
-- Dashboards read topic_hour for the whole hours inside a range and topic_minute for the partial hours at its
-- edges (forumpulse.dashboards.panels), so every number is the same as from topic_minute alone.
--
-- requests.url / requests.referer become LowCardinality(String): forum URLs and referers repeat (a few % distinct
-- per part), 14.8 -> 9.3 B/row for requests (BENCHMARKS.md), and the insert is not slower (measured: docs/schema.md).
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
