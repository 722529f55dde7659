-- forumpulse schema, migration 0006: `requests` partitioned by day (was: by month).
--
-- Daily partitions let retention drop whole days, keep a day's parts together for the dashboards' and detectors'
-- day ranges, and bound the parts a merge rewrites.  ClickHouse cannot change a table's partition key in place,
-- so the table is rebuilt: a copy with the new key is filled from `requests` and the two are exchanged
-- (EXCHANGE TABLES is atomic; the materialized views follow the name `requests`), then the old table is dropped.
-- Rows are copied as stored (INSERT ... SELECT of the stored columns: the views do not see them again).
--
-- Idempotent: every data-moving step runs only while `requests` still has the monthly key (`--@only-if`), so a
-- migration interrupted at any point is run again from the top: the copy is emptied and refilled, the exchange
-- happens once, and the last step removes the old table.  Run it with ingestion stopped, as every migration; a
-- large store needs free disk for a second copy of `requests` while it runs.

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)'
CREATE TABLE IF NOT EXISTS requests_by_day AS requests
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (site, toStartOfDay(ts), page_kind, topic_id, ts)
{raw_ttl:toDateTime(ts)}
SETTINGS non_replicated_deduplication_window = 1000;

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)'
TRUNCATE TABLE requests_by_day;

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)'
INSERT INTO requests_by_day SELECT * FROM requests;

--@only-if SELECT count() = 1 FROM system.tables WHERE database = currentDatabase() AND name = 'requests' AND partition_key = 'toYYYYMM(ts)'
EXCHANGE TABLES requests AND requests_by_day;

DROP TABLE IF EXISTS requests_by_day;
