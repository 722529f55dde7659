-- Read-only ClickHouse user for Grafana (grafana-clickhouse-datasource), for ClickHouse SERVER deployments.
--
-- Not a schema migration: chDB (the embedded default) has no network listener and no users, and a password must
-- never live in a versioned migration.  Run once as an admin on the server, with the password from your secret
-- store, neither on a command line (`ps` shows those to every local user) nor as a query parameter (logged as
-- it is): fill it into the CREATE USER below, which ClickHouse masks in its logs, and pipe the SQL to
-- clickhouse-client -- deploy/clickhouse/initdb/10-forumpulse-users.sh does that (docs/operations.md, "Compose").
-- Database name: forumpulse (change it if you use another).
--
-- readonly = 2 allows the plugin to set per-query settings (max_execution_time etc., which clickhouse-go sends)
-- while forbidding writes and DDL; the grants limit reads to the forumpulse tables the dashboards use
-- (tests/test_grafana_grants.py checks every table a panel reads is granted and exists in the schema).

CREATE SETTINGS PROFILE IF NOT EXISTS forumpulse_grafana_ro
    SETTINGS readonly = 2, max_execution_time = 60, max_result_rows = 1000000, result_overflow_mode = 'break';

CREATE ROLE IF NOT EXISTS forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.site_minute TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.topic_minute TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.topic_hour TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.client_minute TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.prefix_minute TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.prefix_hour TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.transfer_minute TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.detections TO forumpulse_grafana_reader;
-- decisions and quarantine: not the columns that hold other people's addresses or raw lines (a decision's
-- evidence names the range's busiest clients and sample requests; a quarantined line is the raw log line, with its
-- address and any session token the privacy settings would have stripped).  The banned value itself is granted:
-- the security panels list the bans.  The id (a random hex string) tells whether the decisions topic confirmed a
-- decision (decisions_published, migration 0012: topic, id, time; nothing about clients).
GRANT SELECT(id, decided_at, expires_at, site, action, value, scope, reason, duration_s, mode, origin)
    ON forumpulse.decisions TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.decisions_published TO forumpulse_grafana_reader;
GRANT SELECT(ingested_at, site, origin_host, origin_file, source_format, reason, line_no)
    ON forumpulse.quarantine TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.pipeline_stats TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.source_liveness TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.topic_titles TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.topic_groups TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.consumer_progress TO forumpulse_grafana_reader;
GRANT SELECT ON forumpulse.source_heartbeat_minute TO forumpulse_grafana_reader;
-- retired sources (migration 0011): not the operators' free-text note
GRANT SELECT(site, origin_host, origin_file, retired_at, updated_at)
    ON forumpulse.source_retired TO forumpulse_grafana_reader;
-- the plugin's query editor lists databases/tables/columns
GRANT SELECT ON system.databases TO forumpulse_grafana_reader;
GRANT SELECT ON system.tables TO forumpulse_grafana_reader;
GRANT SELECT ON system.columns TO forumpulse_grafana_reader;

CREATE USER IF NOT EXISTS grafana_ro IDENTIFIED WITH sha256_password BY {pw:String}
    DEFAULT ROLE forumpulse_grafana_reader SETTINGS PROFILE forumpulse_grafana_ro;
GRANT forumpulse_grafana_reader TO grafana_ro;
