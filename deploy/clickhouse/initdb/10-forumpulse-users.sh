#!/bin/bash
# First-start initialisation of the ClickHouse container (clickhouse/clickhouse-server runs the scripts in
# /docker-entrypoint-initdb.d once, when the data volume is empty).  Creates the database and the two
# least-privilege users from the SQL files next to it, passing passwords as query parameters (never written
# into a file):
#   forumpulse_ingest (deploy/clickhouse/ingest_user.sql)   password $FORUMPULSE_INGEST_PASSWORD
#   grafana_ro        (deploy/clickhouse/grafana_user.sql)  password $GRAFANA_CH_PASSWORD
# The admin is the image's $CLICKHOUSE_USER / $CLICKHOUSE_PASSWORD.  To change a password later:
#   ALTER USER grafana_ro IDENTIFIED WITH sha256_password BY '...'   (as admin)
set -euo pipefail
SQL_DIR=${FORUMPULSE_SQL_DIR:-/forumpulse/clickhouse}
CLIENT=${CLICKHOUSE_CLIENT:-clickhouse}
: "${CLICKHOUSE_USER:?CLICKHOUSE_USER is not set}"
: "${CLICKHOUSE_PASSWORD:?CLICKHOUSE_PASSWORD is not set}"
: "${FORUMPULSE_INGEST_PASSWORD:?FORUMPULSE_INGEST_PASSWORD is not set}"
: "${GRAFANA_CH_PASSWORD:?GRAFANA_CH_PASSWORD is not set}"
run() {  # password-param sql-file
  "$CLIENT" client --user "$CLICKHOUSE_USER" --password "$CLICKHOUSE_PASSWORD" \
    --param_pw="$1" --queries-file "$2"
}
"$CLIENT" client --user "$CLICKHOUSE_USER" --password "$CLICKHOUSE_PASSWORD" \
  --query "CREATE DATABASE IF NOT EXISTS forumpulse"
run "$FORUMPULSE_INGEST_PASSWORD" "$SQL_DIR/ingest_user.sql"
run "$GRAFANA_CH_PASSWORD" "$SQL_DIR/grafana_user.sql"
echo "forumpulse: database forumpulse, users forumpulse_ingest and grafana_ro created"
