-- forumpulse schema, migration 0009: which file contents `forumpulse ingest` has loaded, so a file is read once.
--
-- The insert blocks' deduplication tokens already make a re-run of the very same input store nothing twice, but a
-- file that has grown since (more lines appended), been renamed by logrotate (access.log -> access.log.1), compressed
-- (access.log.1.gz) or named another way (./access.log, an absolute path) gives other blocks, and its lines would
-- be stored again.  After each insert block of a file is stored, one row here records the input up to the block's
-- end: how many bytes, their SHA-256 and lines, under the hash of the file's first line (`head_sha256`, the lookup
-- key).  The next ingest of a file with the same first line, site, origin host and format whose first
-- `prefix_bytes` bytes have that hash skips the longest such prefix and reads only what follows
-- (pipeline/ingest.py, its module docstring says what is not covered).  Content decides, not the name; a file
-- rewritten or truncated (copytruncate) no longer matches and is read whole, its blocks deduplicated as before.
-- Checkpoints stop at the first block left out for retention (all its rows past both TTLs), so that
-- `db migrate --apply-retention` and the same file load it later.  Rows are tiny, one per insert block; no TTL.
CREATE TABLE IF NOT EXISTS ingest_files
(
    site          LowCardinality(String),
    origin_host   LowCardinality(String),
    format        String,
    head_sha256   String,
    prefix_bytes  UInt64,
    prefix_lines  UInt64,
    prefix_sha256 String,
    origin_file   String,
    ingested_at   DateTime64(3, 'UTC')
)
ENGINE = MergeTree
ORDER BY (site, origin_host, head_sha256, format, prefix_bytes);
