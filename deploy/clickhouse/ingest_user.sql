-- Writer ClickHouse user for the forumpulse loaders (forumpulse consume / run / detect), for ClickHouse SERVER
-- deployments.  Companion of grafana_user.sql (read-only Grafana user); same conventions:
--   the password filled into the CREATE USER below, the SQL piped to clickhouse-client, never on a command line
--   (deploy/clickhouse/initdb/10-forumpulse-users.sh does that)
-- Run once as an admin, after `forumpulse db migrate` or before it (grants do not need the tables to exist).
--
-- Least privilege: reads and inserts in database forumpulse only; no DROP, TRUNCATE, no ALTER but the DELETE of
-- topic_groups (the loaders make that table the configured topic groups: a removed group's rows are deleted), no
-- other database, no user management.  CREATE DATABASE / CREATE TABLE on forumpulse are granted only because the client issues
-- `CREATE DATABASE IF NOT EXISTS forumpulse` and `CREATE TABLE IF NOT EXISTS schema_migrations` when it
-- connects (no-ops once `forumpulse db migrate` has run as admin); schema changes stay with the admin.
-- Materialized views created by the admin insert into the rollups with the admin's (definer's) rights.

CREATE SETTINGS PROFILE IF NOT EXISTS forumpulse_writer_profile
    SETTINGS max_execution_time = 600, max_memory_usage = 8000000000;

CREATE ROLE IF NOT EXISTS forumpulse_writer;
GRANT SELECT, INSERT ON forumpulse.* TO forumpulse_writer;
GRANT CREATE DATABASE ON forumpulse.* TO forumpulse_writer;
GRANT CREATE TABLE ON forumpulse.* TO forumpulse_writer;
-- topic groups removed from topics.groups (pipeline/enrich.py sync_topic_groups); on a cluster, the local table
GRANT ALTER DELETE ON forumpulse.topic_groups TO forumpulse_writer;
GRANT ALTER DELETE ON forumpulse.topic_groups_local TO forumpulse_writer;
-- clickhouse-connect probes the server on connect
GRANT SELECT ON system.settings TO forumpulse_writer;

CREATE USER IF NOT EXISTS forumpulse_ingest IDENTIFIED WITH sha256_password BY {pw:String}
    DEFAULT ROLE forumpulse_writer SETTINGS PROFILE forumpulse_writer_profile;
GRANT forumpulse_writer TO forumpulse_ingest;
