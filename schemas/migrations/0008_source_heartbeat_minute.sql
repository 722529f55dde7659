-- forumpulse schema, migration 0008: a log of the sources' heartbeats, one row per source and minute.
--
-- `source_liveness` keeps only each source's latest heartbeat, so a history run (`forumpulse detect --from --to`)
-- and a live run catching up after a restart could not tell whether a silence that ended before the time they
-- judge was an outage (the shippers heartbeating, the site answering nothing) or a pipeline gap (nothing arriving
-- at all): such a gap carried `detail.liveness = "unknown"`.  With this log they judge every minute as a live run
-- judged it then.  The consumers add, every stats interval (10 s), one row per source and minute in which it
-- heartbeated: its earliest and latest heartbeat as (time, file size, inode) -- the time is the heartbeat's
-- `ts=` (the shipper's clock); size and inode are what a file heartbeat reports (`syslog-ng/heartbeat.sh`), 0
-- for host heartbeats, MARKs and listeners.  A file that keeps growing while none of its lines arrive is written but not
-- read (a stuck shipper): a `pipeline_gap`, not an outage.  Idempotent: a replayed batch writes the same minimum
-- and maximum again, which the engine folds (tuples compare by time first); a killed consumer loses its last
-- interval's rows (written after the offsets are committed), and a heartbeat whose `ts=` is more than 7 days
-- from its Kafka time (a wrong clock, `ts=0`) is left out.  A heartbeat at `h` is evidence of liveness at `t`
-- when `0 <= t - h <= health.heartbeat_fresh_seconds`; the detectors merge consecutive heartbeats at most that
-- far apart into runs (detectors/traffic.py HeartbeatLog).  Times before the first row of a site's sources
-- plus `heartbeat_fresh_seconds` are of unknown liveness, as before this migration.  Size: one row per
-- heartbeating source and minute, kept as long as the rollups.
CREATE TABLE IF NOT EXISTS source_heartbeat_minute
(
    site        LowCardinality(String),
    origin_host LowCardinality(String),
    origin_file LowCardinality(String),
    minute      DateTime('UTC'),
    first_beat  SimpleAggregateFunction(min, Tuple(DateTime64(3, 'UTC'), UInt64, UInt64)),
    last_beat   SimpleAggregateFunction(max, Tuple(DateTime64(3, 'UTC'), UInt64, UInt64))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, origin_host, origin_file, minute)
{rollup_ttl:minute};
