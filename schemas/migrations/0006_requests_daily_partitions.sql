-- forumpulse schema, migration 0006: `requests` partitioned by day, for stores where it is still empty.
--
-- Daily partitions let retention drop whole days (a part whose rows are all past the TTL is dropped, not rewritten;
-- by month, every TTL merge rewrote the month's parts to remove the day that expired), keep a
-- day's parts together for the dashboards' and detectors' day ranges, and bound the parts a merge rewrites.
-- ClickHouse cannot change a table's partition key in place.  A store whose `requests` is still EMPTY (every new
-- store: 0001 made it by month) gets an empty table by day in its place: created, exchanged with `requests`
-- (EXCHANGE TABLES is atomic; the materialized views follow the name `requests`), and the old one dropped.
-- A store that already holds rows keeps its monthly partitions: rebuilding a loaded table (copying it, with the
-- TTL, the deduplication log and the writers of the old one) is not done by a migration (schemas/README.md).
--
-- Only in an Atomic database (the default; EXCHANGE TABLES needs it).  On a ClickHouse server, run `forumpulse db
-- migrate` once before starting consumers (the compose stack does), with a user allowed to create and drop tables.
-- Idempotent (`--@only-if` guards): interrupted at any point, it is run again from the top.  A row inserted into the
-- empty monthly table by a process of an older version between the check and the exchange is not lost: the old
-- table is dropped only if it is still empty (else it stays, as requests_by_day, for an operator to look at).

--@only-if SELECT (SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)' AND total_rows = 0) = 1 AND (SELECT engine FROM system.databases WHERE name = currentDatabase()) = 'Atomic'
CREATE TABLE IF NOT EXISTS requests_by_day AS requests
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (site, toStartOfDay(ts), page_kind, topic_id, ts)
{raw_ttl:toDateTime(ts)}
SETTINGS non_replicated_deduplication_window = 1000;

--@only-if SELECT (SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)' AND total_rows = 0) = 1 AND (SELECT engine FROM system.databases WHERE name = currentDatabase()) = 'Atomic'
EXCHANGE TABLES requests AND requests_by_day;

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests_by_day' AND partition_key = 'toYYYYMM(ts)' AND total_rows = 0
DROP TABLE IF EXISTS requests_by_day;

-- Two processes running this migration at once (consumers starting together on a new server) can exchange the
-- tables twice, putting the monthly one back: then exchange again, and drop the left-over if it is empty.
--@only-if SELECT (SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)' AND total_rows = 0) = 1 AND (SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = 'requests_by_day' AND partition_key = 'toYYYYMMDD(ts)') = 1
EXCHANGE TABLES requests AND requests_by_day;

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests_by_day' AND partition_key = 'toYYYYMM(ts)' AND total_rows = 0
DROP TABLE IF EXISTS requests_by_day;
