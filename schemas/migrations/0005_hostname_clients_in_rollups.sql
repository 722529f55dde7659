-- forumpulse schema, migration 0005: hostname clients count as themselves in the rollups.
--
-- A client logged as a host name (old CLF logs written with HostnameLookups On: `dialup-42.example.net - - [...]`)
-- is stored with client_host = the name and client_ip = '::'.  Until now the visitor counts (site_minute,
-- topic_minute) and client_minute used client_ip alone, so every such client was one client '::' (NASA-HTTP 1995:
-- 25 visitors counted for 185 clients).  The views now use a client key: client_ip for an address, and for a
-- host name an address derived from it inside fd68::/16 (unique-local, never a real client; one per name:
-- fd68:: + cityHash64 of the name).  client_minute shows that key for hostname clients.
-- Address clients are counted exactly as before.  Rows already aggregated keep their old counts (rebuilding the
-- rollups from requests would double-count with the loaders running; re-ingest to recount an archive).
-- Idempotent: each view is dropped and created again.  Run with ingestion stopped, as every migration.

DROP VIEW IF EXISTS site_minute_mv;

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

DROP VIEW IF EXISTS topic_minute_mv;

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

DROP VIEW IF EXISTS client_minute_mv;

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
