-- forumpulse schema baseline: the schema that migrations 0001-0010 build, as one file for NEW databases.
--
-- `migrate` applies this file instead of the 0001-0010 chain when the database has no table yet, then records
-- 0001-0010 in schema_migrations with their own checksums, so later migrations apply exactly as after the chain.
-- A new store then sends 29 queries instead of 54 (the 0006 baseline, squashed again at 0010: 33 by then; each
-- query costs a new store's set-up time, and waits for the GIL once more while `forumpulse ingest` parses beside
-- it).  Any database that already has a table (an existing store, or a baseline interrupted half-way) takes the
-- chain, whose statements are idempotent.
--
-- The file name says the last migration it covers.  tests/test_schema_baseline.py checks that a database made
-- from it equals one made by the chain (every table's and view's CREATE statement, for several retention
-- settings) and that the chain completes a half-applied baseline.  A new migration (0011...) is added to
-- schemas/migrations/ as before and applies on top of this baseline; nothing here changes then.
-- Comments and rationale for each table are in the migrations themselves; placeholders as there.

-- Raw requests (partitioned by day: 0006; url and referer LowCardinality: 0003) and quarantined lines.

CREATE TABLE IF NOT EXISTS requests
(
    ts            DateTime64(3, 'UTC') CODEC(Delta, ZSTD(3)),
    site          LowCardinality(String) CODEC(ZSTD(3)),
    origin_host   LowCardinality(String) CODEC(ZSTD(3)),
    origin_file   LowCardinality(String) CODEC(ZSTD(3)),
    source_format LowCardinality(String) CODEC(ZSTD(3)),
    client_ip     IPv6 CODEC(ZSTD(3)),
    client_host   String CODEC(ZSTD(6)),
    ident         LowCardinality(String) CODEC(ZSTD(3)),
    user          String CODEC(ZSTD(6)),
    method        LowCardinality(String) CODEC(ZSTD(3)),
    url           LowCardinality(String) CODEC(ZSTD(3)),
    path          String ALIAS multiIf(
        startsWith(url, '/'), if(position(url, '?') > 0, substring(url, 1, position(url, '?') - 1), url),
        method != '' AND match(url, '^(?i)(https?|ftp)://'),
            if(position(substring(url, position(url, '//') + 2), '/') = 0
               OR (position(substring(url, position(url, '//') + 2), '?') > 0
                   AND position(substring(url, position(url, '//') + 2), '?') < position(substring(url, position(url, '//') + 2), '/')),
               '/',
               splitByChar('?', substring(substring(url, position(url, '//') + 2), position(substring(url, position(url, '//') + 2), '/')))[1]),
        ''),
    protocol      LowCardinality(String) CODEC(ZSTD(3)),
    status        UInt16 CODEC(T64, ZSTD(3)),
    bytes         UInt64 CODEC(T64, ZSTD(3)),
    referer       LowCardinality(String) CODEC(ZSTD(3)),
    user_agent    LowCardinality(String) CODEC(ZSTD(3)),
    elapsed_ms    Nullable(Float32) CODEC(ZSTD(3)),
    cache_result  LowCardinality(String) CODEC(ZSTD(3)),
    hierarchy     LowCardinality(String) CODEC(ZSTD(3)),
    upstream      LowCardinality(String) CODEC(ZSTD(3)),
    content_type  LowCardinality(String) CODEC(ZSTD(3)),
    vhost         LowCardinality(String) CODEC(ZSTD(3)),
    topic_id      UInt64 CODEC(T64, ZSTD(3)),
    page_kind     LowCardinality(String) CODEC(ZSTD(3)),
    is_static     Bool,
    is_bot        Bool,
    bot_name      LowCardinality(String) CODEC(ZSTD(3)),
    query         String ALIAS multiIf(
        startsWith(url, '/') OR (method != '' AND match(url, '^(?i)(https?|ftp)://')),
            if(position(url, '?') > 0, substring(url, position(url, '?') + 1), ''),
        ''),
    client        String ALIAS if(client_host != '', client_host, replaceRegexpOne(toString(client_ip), '^::ffff:', ''))
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (site, toStartOfDay(ts), page_kind, topic_id, ts)
{raw_ttl:toDateTime(ts)}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE TABLE IF NOT EXISTS quarantine
(
    ingested_at   DateTime64(3, 'UTC'),
    site          LowCardinality(String),
    origin_host   LowCardinality(String),
    origin_file   LowCardinality(String),
    source_format LowCardinality(String),
    reason        LowCardinality(String),
    detail        String,
    raw           String CODEC(ZSTD(3)),
    line_no       UInt64,
    source_ref    String
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ingested_at)
ORDER BY (site, reason, ingested_at)
{quarantine_ttl:toDateTime(ingested_at)}
SETTINGS non_replicated_deduplication_window = 1000;

-- Per-minute rollups fed from requests (views as of 0005: hostname clients under their fd68::/16 key).

CREATE TABLE IF NOT EXISTS site_minute
(
    site            LowCardinality(String),
    minute          DateTime('UTC'),
    requests        SimpleAggregateFunction(sum, UInt64),
    bytes           SimpleAggregateFunction(sum, UInt64),
    pageviews       SimpleAggregateFunction(sum, UInt64),
    topic_views     SimpleAggregateFunction(sum, UInt64),
    replies         SimpleAggregateFunction(sum, UInt64),
    bot_requests    SimpleAggregateFunction(sum, UInt64),
    static_requests SimpleAggregateFunction(sum, UInt64),
    status_1xx      SimpleAggregateFunction(sum, UInt64),
    status_2xx      SimpleAggregateFunction(sum, UInt64),
    status_3xx      SimpleAggregateFunction(sum, UInt64),
    status_4xx      SimpleAggregateFunction(sum, UInt64),
    status_5xx      SimpleAggregateFunction(sum, UInt64),
    status_none     SimpleAggregateFunction(sum, UInt64),
    elapsed_sum_ms  SimpleAggregateFunction(sum, Float64),
    elapsed_count   SimpleAggregateFunction(sum, UInt64),
    visitors        AggregateFunction(uniq, IPv6)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, minute)
{rollup_ttl:minute}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS site_minute_mv TO site_minute AS
SELECT
    site,
    toStartOfMinute(ts) AS minute,
    count() AS requests,
    sum(bytes) AS bytes,
    countIf(NOT is_bot AND NOT is_static) AS pageviews,
    countIf(NOT is_bot AND page_kind = 'topic_view') AS topic_views,
    countIf(NOT is_bot AND page_kind = 'reply') AS replies,
    countIf(is_bot) AS bot_requests,
    countIf(is_static) AS static_requests,
    countIf(status >= 100 AND status < 200) AS status_1xx,
    countIf(status >= 200 AND status < 300) AS status_2xx,
    countIf(status >= 300 AND status < 400) AS status_3xx,
    countIf(status >= 400 AND status < 500) AS status_4xx,
    countIf(status >= 500) AS status_5xx,
    countIf(status < 100) AS status_none,
    sum(ifNull(elapsed_ms, 0)) AS elapsed_sum_ms,
    countIf(elapsed_ms IS NOT NULL) AS elapsed_count,
    uniqStateIf(if(client_host = '', client_ip,
                   CAST(bitOr(bitShiftLeft(toUInt128(0xfd68), 112), toUInt128(cityHash64(client_host))) AS IPv6)),
                NOT is_bot) AS visitors
FROM requests
GROUP BY site, minute;

CREATE TABLE IF NOT EXISTS topic_minute
(
    site      LowCardinality(String),
    topic_id  UInt64,
    minute    DateTime('UTC'),
    views     SimpleAggregateFunction(sum, UInt64),
    replies   SimpleAggregateFunction(sum, UInt64),
    bot_views SimpleAggregateFunction(sum, UInt64),
    visitors  AggregateFunction(uniq, IPv6)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, minute, topic_id)
{rollup_ttl:minute}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS topic_minute_mv TO topic_minute AS
SELECT
    site,
    topic_id,
    toStartOfMinute(ts) AS minute,
    countIf(NOT is_bot AND page_kind = 'topic_view') AS views,
    countIf(NOT is_bot AND page_kind = 'reply') AS replies,
    countIf(is_bot AND page_kind = 'topic_view') AS bot_views,
    uniqStateIf(if(client_host = '', client_ip,
                   CAST(bitOr(bitShiftLeft(toUInt128(0xfd68), 112), toUInt128(cityHash64(client_host))) AS IPv6)),
                NOT is_bot) AS visitors
FROM requests
WHERE topic_id != 0
GROUP BY site, topic_id, minute;

CREATE TABLE IF NOT EXISTS client_minute
(
    site       LowCardinality(String),
    minute     DateTime('UTC'),
    client_ip  IPv6,
    requests   SimpleAggregateFunction(sum, UInt64),
    bytes      SimpleAggregateFunction(sum, UInt64),
    status_4xx SimpleAggregateFunction(sum, UInt64),
    status_5xx SimpleAggregateFunction(sum, UInt64),
    bot_requests SimpleAggregateFunction(sum, UInt64)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, minute, client_ip)
{rollup_ttl:minute}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS client_minute_mv TO client_minute AS
SELECT
    site,
    toStartOfMinute(ts) AS minute,
    if(client_host = '', client_ip,
       CAST(bitOr(bitShiftLeft(toUInt128(0xfd68), 112), toUInt128(cityHash64(client_host))) AS IPv6)) AS client_ip,
    count() AS requests,
    sum(bytes) AS bytes,
    countIf(status >= 400 AND status < 500) AS status_4xx,
    countIf(status >= 500) AS status_5xx,
    countIf(is_bot) AS bot_requests
FROM requests
GROUP BY site, minute, client_ip;

CREATE TABLE IF NOT EXISTS prefix_minute
(
    site       LowCardinality(String),
    minute     DateTime('UTC'),
    prefix     IPv6,
    prefix_len UInt8,
    requests   SimpleAggregateFunction(sum, UInt64),
    clients    AggregateFunction(uniq, IPv6)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, minute, prefix_len, prefix)
{rollup_ttl:minute}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS prefix_minute_mv TO prefix_minute AS
SELECT
    site,
    toStartOfMinute(ts) AS minute,
    IPv6CIDRToRange(client_ip, if(IPv6CIDRToRange(client_ip, 96).1 = toIPv6('::ffff:0.0.0.0'), 120, 64)).1 AS prefix,
    toUInt8(if(IPv6CIDRToRange(client_ip, 96).1 = toIPv6('::ffff:0.0.0.0'), 24, 64)) AS prefix_len,
    count() AS requests,
    uniqState(client_ip) AS clients
FROM requests
WHERE client_host = ''
GROUP BY site, minute, prefix, prefix_len;

CREATE TABLE IF NOT EXISTS transfer_minute
(
    site           LowCardinality(String),
    origin_host    LowCardinality(String),
    upstream       LowCardinality(String),
    size_class     LowCardinality(String),
    minute         DateTime('UTC'),
    requests       SimpleAggregateFunction(sum, UInt64),
    bytes          SimpleAggregateFunction(sum, UInt64),
    elapsed_sum_ms SimpleAggregateFunction(sum, Float64),
    status_5xx     SimpleAggregateFunction(sum, UInt64),
    elapsed_q      AggregateFunction(quantilesTDigest(0.5, 0.95, 0.99), Float32),
    rate_q         AggregateFunction(quantilesTDigest(0.05, 0.5, 0.95), Float32)
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (site, origin_host, upstream, size_class, minute)
{rollup_ttl:minute}
SETTINGS non_replicated_deduplication_window = 1000;

CREATE MATERIALIZED VIEW IF NOT EXISTS transfer_minute_mv TO transfer_minute AS
SELECT
    site,
    origin_host,
    upstream,
    multiIf(b < 102400, 'lt100k', b < 1048576, '100k-1m', b < 10485760, '1m-10m', 'ge10m') AS size_class,
    toStartOfMinute(ts) AS minute,
    count() AS requests,
    sum(b) AS bytes,
    sum(e) AS elapsed_sum_ms,
    countIf(status >= 500) AS status_5xx,
    quantilesTDigestState(0.5, 0.95, 0.99)(e) AS elapsed_q,
    quantilesTDigestStateIf(0.05, 0.5, 0.95)(toFloat32(b * 1000 / e), e > 0) AS rate_q
FROM (SELECT site, origin_host, upstream, ts, status, bytes AS b, assumeNotNull(elapsed_ms) AS e
      FROM requests WHERE elapsed_ms IS NOT NULL)
GROUP BY site, origin_host, upstream, size_class, minute;

-- Hourly rollups, cascaded from the minute rollups (0003).

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

-- Detections, firewall decisions, pipeline statistics, source liveness, topic names and groups (0001).

CREATE TABLE IF NOT EXISTS detections
(
    id         String,
    kind       LowCardinality(String),
    site       LowCardinality(String),
    scope      String,
    start_ts   DateTime64(3, 'UTC'),
    end_ts     Nullable(DateTime64(3, 'UTC')),
    peak_ts    DateTime64(3, 'UTC'),
    observed   Float64,
    expected   Float64,
    score      Float64,
    label      LowCardinality(String),
    state      LowCardinality(String),
    detail     String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
PARTITION BY toYYYYMM(start_ts)
ORDER BY (site, kind, id);

CREATE TABLE IF NOT EXISTS decisions
(
    id          String,
    created_at  DateTime64(3, 'UTC'),
    decided_at  DateTime64(3, 'UTC'),
    first_seen  DateTime64(3, 'UTC'),
    expires_at  DateTime64(3, 'UTC'),
    site        LowCardinality(String),
    action      LowCardinality(String),
    value       String,
    scope       LowCardinality(String),
    reason      LowCardinality(String),
    duration_s  UInt32,
    mode        LowCardinality(String),
    origin      LowCardinality(String),
    evidence    String
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(decided_at)
ORDER BY (site, decided_at, value);

CREATE TABLE IF NOT EXISTS pipeline_stats
(
    ts               DateTime64(3, 'UTC'),
    component        LowCardinality(String),
    instance         LowCardinality(String),
    lines_in         UInt64,
    loaded           UInt64,
    quarantined      UInt64,
    batch_latency_ms Float64,
    lag              Int64,
    freshness_s      Float64
)
ENGINE = MergeTree
PARTITION BY toYYYYMMDD(ts)
ORDER BY (component, instance, ts)
{stats_ttl:toDateTime(ts)};

CREATE TABLE IF NOT EXISTS source_liveness
(
    site              LowCardinality(String),
    origin_host       LowCardinality(String),
    origin_file       LowCardinality(String),
    last_line_ts      DateTime64(3, 'UTC'),
    last_heartbeat_ts DateTime64(3, 'UTC'),
    lines             UInt64,
    updated_at        DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (site, origin_host, origin_file);

CREATE TABLE IF NOT EXISTS topic_titles
(
    site       LowCardinality(String),
    topic_id   UInt64,
    title      String,
    forum      String,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (site, topic_id);

CREATE TABLE IF NOT EXISTS topic_groups
(
    site       LowCardinality(String),
    group_name LowCardinality(String),
    topic_id   UInt64,
    updated_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(updated_at)
ORDER BY (site, group_name, topic_id);

-- Kafka consumer batch intents (0002) with the topic ID of each batch (0004).

CREATE TABLE IF NOT EXISTS consumer_batches
(
    group_id     LowCardinality(String),
    topic        LowCardinality(String),
    partition    UInt32,
    first_offset UInt64,
    last_offset  UInt64,
    messages     UInt32,
    instance     LowCardinality(String),
    created_at   DateTime64(3, 'UTC'),
    topic_id     LowCardinality(String) DEFAULT ''
)
ENGINE = ReplacingMergeTree(created_at)
ORDER BY (group_id, topic, partition, first_offset)
TTL toDateTime(created_at) + INTERVAL 30 DAY
SETTINGS non_replicated_deduplication_window = 1000;

-- migration 0007: how far each consumer group has loaded each Kafka partition.

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

-- migration 0008: a log of the sources' heartbeats, one row per source and minute.

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

-- migration 0009: which file contents `forumpulse ingest` has loaded, so a file is read once.

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

-- migration 0010: which minutes the traffic detectors have judged, so a report can tell a day

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
