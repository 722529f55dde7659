-- forumpulse schema, migration 0010: which minutes the traffic detectors have judged, so a report can tell a day
-- without events from a day no detection run covered (a nightly `detect --from D --to D+1` cron that did not run).
--
-- One row per history run and site (`forumpulse detect --from … --to …`, mode 'history': the range it reported on),
-- and one per live session and site (`forumpulse run`, mode 'live': from the first minute it read, warm-up
-- included), whose to_ts the session moves on as it judges more minutes: the row with the latest recorded_at per
-- (site, mode, from_ts) stands (read with FINAL).  A --dry-run records nothing.  Rows are tiny; no TTL.
CREATE TABLE IF NOT EXISTS detection_runs
(
    site        LowCardinality(String),
    mode        LowCardinality(String),
    from_ts     DateTime('UTC'),
    to_ts       DateTime('UTC'),
    recorded_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(recorded_at)
ORDER BY (site, mode, from_ts);
