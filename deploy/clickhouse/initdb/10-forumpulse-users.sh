#!/bin/bash
# First-start initialisation of the ClickHouse container (clickhouse/clickhouse-server runs the scripts in
# /docker-entrypoint-initdb.d once, when the data volume is empty).  Creates the database and the two
# least-privilege users from the SQL files next to it:
#   forumpulse_ingest (deploy/clickhouse/ingest_user.sql)   password $FORUMPULSE_INGEST_PASSWORD
#   grafana_ro        (deploy/clickhouse/grafana_user.sql)  password $GRAFANA_CH_PASSWORD
# The admin is the image's $CLICKHOUSE_USER / $CLICKHOUSE_PASSWORD.
#
# No secret on a command line (`ps` shows command lines, in the container and on the Docker host to every user
# there) and none in ClickHouse's logs: the admin's credentials go into a client config file (mode 0600, removed
# on exit); each new user's password is written into its SQL file's `CREATE USER ... BY {pw:String}` as a string
# literal in this shell (no other process sees it) and the SQL reaches the client on its standard input --
# ClickHouse masks the password of a CREATE USER in query_log and the server log (a `SET param_pw = '...'`
# would be logged as it is).  Passwords must be URL-safe (they also go into clickhouse://user:PASSWORD@ URLs),
# so they need no quoting in SQL or XML; any other character is refused before anything runs.  If that
# happens, the container stops with the data volume already created and the init will not run again: fix .env,
# then remove the volume (`docker compose down` and `docker volume rm <project>_clickhouse-data`).
# The image's own CLICKHOUSE_DB must stay unset (its entrypoint would pass the admin password on a command line).
# To change a password later:  ALTER USER grafana_ro IDENTIFIED WITH sha256_password BY '...'   (as admin)
(  # a subshell: harmless also if the entrypoint sources this file (when it is not executable)
set -euo pipefail
SQL_DIR=${FORUMPULSE_SQL_DIR:-/forumpulse/clickhouse}
CLIENT=${CLICKHOUSE_CLIENT:-clickhouse}
: "${CLICKHOUSE_USER:?CLICKHOUSE_USER is not set}"
: "${CLICKHOUSE_PASSWORD:?CLICKHOUSE_PASSWORD is not set}"
: "${FORUMPULSE_INGEST_PASSWORD:?FORUMPULSE_INGEST_PASSWORD is not set}"
: "${GRAFANA_CH_PASSWORD:?GRAFANA_CH_PASSWORD is not set}"
url_safe() {  # name value
  if [[ ! $2 =~ ^[A-Za-z0-9._~-]+$ ]]; then
    echo "forumpulse: $1 must be URL-safe (letters, digits, . _ ~ -), e.g. openssl rand -hex 24" >&2
    exit 2
  fi
}
url_safe CLICKHOUSE_USER "$CLICKHOUSE_USER"
url_safe CLICKHOUSE_PASSWORD "$CLICKHOUSE_PASSWORD"
url_safe FORUMPULSE_INGEST_PASSWORD "$FORUMPULSE_INGEST_PASSWORD"
url_safe GRAFANA_CH_PASSWORD "$GRAFANA_CH_PASSWORD"
umask 077
cfg=$(mktemp "${TMPDIR:-/tmp}/forumpulse-client.XXXXXX.xml")
trap 'rm -f "$cfg"' EXIT
printf '<clickhouse>\n  <host>127.0.0.1</host>\n  <user>%s</user>\n  <password>%s</password>\n</clickhouse>\n' \
  "$CLICKHOUSE_USER" "$CLICKHOUSE_PASSWORD" > "$cfg"
client() { "$CLIENT" client --config-file "$cfg" --multiquery; }
run() {  # password sql-file: its statements (comment lines left out), the password in place of {pw:String}
  local sql="" line q="'$1'"
  while IFS= read -r line || [[ -n $line ]]; do
    [[ $line == --* ]] || sql+="$line"$'\n'
  done < "$2"
  [[ $sql == *"{pw:String}"* ]] || { echo "forumpulse: $2 has no {pw:String}" >&2; exit 2; }
  printf '%s' "${sql//"{pw:String}"/$q}" | client
}
echo "CREATE DATABASE IF NOT EXISTS forumpulse;" | client
run "$FORUMPULSE_INGEST_PASSWORD" "$SQL_DIR/ingest_user.sql"
run "$GRAFANA_CH_PASSWORD" "$SQL_DIR/grafana_user.sql"
echo "forumpulse: database forumpulse, users forumpulse_ingest and grafana_ro created"
)
