-- forumpulse schema, migration 0011: log sources that ops retired (a web server removed, a vhost deleted, a sender
-- decommissioned), written by `forumpulse sources retire`.
--
-- Without it a source that stops for good keeps a `pipeline_gap` open forever and shows `dead` on the status page
-- and the sources panel.  A retirement at `retired_at` holds while the source sends nothing after it: the source's
-- open gap closes where the retirement begins (`detail.closed_by = retired`), no gap opens for its silence after
-- it, and the status page shows it `retired`.  A line after `retired_at` makes it an ordinary source again (a
-- server put back needs no command).  `--undo` writes `retired_at` = 1970-01-01 (every line is after it).  The
-- row with the latest `updated_at` per source stands (read with FINAL or argMax).  Rows are tiny; no TTL.
CREATE TABLE IF NOT EXISTS source_retired
(
    site        LowCardinality(String),
    origin_host String,
    origin_file String,
    retired_at  DateTime64(3, 'UTC'),
    note        String,
    updated_at  DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (site, origin_host, origin_file);
