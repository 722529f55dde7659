#!/usr/bin/env bash
# The local real stack: Kafka (KRaft, 127.0.0.1) -> syslog-ng (syslog-ng/forumpulse.conf) -> owner process
# (`forumpulse run --consume`, chDB store).  `make up | down | status` call this script.
#
#   deploy/stack.sh up | down | status
#
# Environment (defaults in brackets):
#   FP_STACK_DIR [./run]            everything lives here: kafka/, syslog-ng/, chdb/, logs/, owner.{pid,log}
#   FP_KAFKA_PORT [9092]  FP_KAFKA_CONTROLLER_PORT [9093]  FP_RAW_PARTITIONS [4]
#   FP_VHOST_DIR [$FP_STACK_DIR/logs/vhosts]  FP_VHOST_PATTERN [*access.log]  FP_VHOST_FORMAT [combined]
#   FP_SQUID_DIR [$FP_STACK_DIR/logs/squid]   FP_SQUID_SITE [proxy]
#   FP_RAW_TCP_PORT [5140] (also UDP)  FP_RAW_SITE [default]  FP_RAW_FORMAT [combined] (site, format of raw lines)
#   FP_SYSLOG_PORT [5514]  FP_SYSLOG5424_PORT [5515]  FP_HEARTBEAT_S [10]
#   FP_SYSLOGNG_CONFIG [syslog-ng/forumpulse.conf]  FP_SYSLOGNG_DEFINES ["k=v k=v" extra --define pairs]
#   FP_HTTP_PORT [8123] (owner's ClickHouse-compatible endpoint)  FP_CONFIG [unset: forumpulse config file]
#   The three ports `up` used are recorded in $FP_STACK_DIR/stack.env: later commands use them unless set again.
# Ports bind 127.0.0.1 only.  Nothing here touches system services; `down` stops only the pids we recorded.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
DIR=${FP_STACK_DIR:-$root/run}
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
# ports: FP_* variables win, then the ones recorded by the last `up` (so `status`/`down` in a fresh shell look
# where the stack runs), then the defaults
STACK_ENV="$DIR/stack.env"
REC_KPORT="" REC_KCPORT="" REC_HTTP_PORT=""
if [ -f "$STACK_ENV" ]; then
  while IFS='=' read -r k v; do
    case "$k" in KPORT) REC_KPORT=$v;; KCPORT) REC_KCPORT=$v;; HTTP_PORT) REC_HTTP_PORT=$v;; esac
  done <"$STACK_ENV"
fi
KPORT=${FP_KAFKA_PORT:-${REC_KPORT:-9092}}
KCPORT=${FP_KAFKA_CONTROLLER_PORT:-${REC_KCPORT:-9093}}
HTTP_PORT=${FP_HTTP_PORT:-${REC_HTTP_PORT:-8123}}
KAFKA=(bash "$root/deploy/kafka/kafka.sh")
SNG=(bash "$root/deploy/syslog-ng/syslogng.sh")
FP="$root/.venv/bin/forumpulse"
OWNER_PID="$DIR/owner.pid" OWNER_LOG="$DIR/owner.log"

# shellcheck source=deploy/port_open.sh
. "$root/deploy/port_open.sh"
# alive AND our owner (its command line names this stack's store): a pid recorded before a reboot may now be an
# unrelated process, which `down` must not kill and `up` must not take for the owner
owner_ours() {
  local args
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null && args=$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null) \
    && grep -Fxq -- "chdb:$DIR/chdb" <<<"$args"
}
owner_alive() { [ -f "$OWNER_PID" ] && owner_ours "$(cat "$OWNER_PID")"; }
# the owner answers /fp/health with its own pid: another server on the port (a developer's ClickHouse on 8123) is
# not mistaken for it
owner_health() { curl -fsS --max-time 2 "http://127.0.0.1:$HTTP_PORT/fp/health" 2>/dev/null; }
owner_healthy() { owner_health | grep -Eq "\"pid\": *$(cat "$OWNER_PID" 2>/dev/null)[,}]"; }

syslog_defines() {
  local a=(
    --define "fp_kafka_bootstrap=127.0.0.1:$KPORT"
    --define "fp_vhost_dir=${FP_VHOST_DIR:-$DIR/logs/vhosts}"
    --define "fp_vhost_pattern=${FP_VHOST_PATTERN:-*access.log}"
    --define "fp_vhost_format=${FP_VHOST_FORMAT:-combined}"
    --define "fp_squid_dir=${FP_SQUID_DIR:-$DIR/logs/squid}"
    --define "fp_squid_site=${FP_SQUID_SITE:-proxy}"
    --define "fp_raw_tcp_port=${FP_RAW_TCP_PORT:-5140}"
    --define "fp_raw_udp_port=${FP_RAW_TCP_PORT:-5140}"
    --define "fp_syslog_port=${FP_SYSLOG_PORT:-5514}"
    --define "fp_syslog5424_port=${FP_SYSLOG5424_PORT:-5515}"
    --define "fp_heartbeat_interval=${FP_HEARTBEAT_S:-10}"
    --define "fp_heartbeat_cmd=$root/syslog-ng/heartbeat.sh"
  )
  # the site and format of raw TCP/UDP lines (syslog-ng/forumpulse.conf's defaults: "default", combined)
  if [ -n "${FP_RAW_SITE:-}" ]; then a+=(--define "fp_raw_site=$FP_RAW_SITE"); fi
  if [ -n "${FP_RAW_FORMAT:-}" ]; then a+=(--define "fp_raw_format=$FP_RAW_FORMAT"); fi
  local kv
  for kv in ${FP_SYSLOGNG_DEFINES:-}; do a+=(--define "$kv"); done
  printf '%s\0' "${a[@]}"
}

up() {
  mkdir -p "${FP_VHOST_DIR:-$DIR/logs/vhosts}" "${FP_SQUID_DIR:-$DIR/logs/squid}"
  printf 'KPORT=%s\nKCPORT=%s\nHTTP_PORT=%s\n' "$KPORT" "$KCPORT" "$HTTP_PORT" >"$STACK_ENV"
  bash "$root/deploy/kafka/install.sh"
  "${KAFKA[@]}" start --dir "$DIR/kafka" --port "$KPORT" --controller-port "$KCPORT"
  "${KAFKA[@]}" topics --dir "$DIR/kafka" --partitions "${FP_RAW_PARTITIONS:-4}"
  local defs=()
  mapfile -d '' defs < <(syslog_defines)
  "${SNG[@]}" start --dir "$DIR/syslog-ng" --config "${FP_SYSLOGNG_CONFIG:-$root/syslog-ng/forumpulse.conf}" "${defs[@]}"
  if owner_alive; then
    echo "owner already running (pid $(cat "$OWNER_PID"))"
  elif [ -x "$FP" ] && "$FP" run --help >/dev/null 2>&1; then
    local cfg=()
    [ -n "${FP_CONFIG:-}" ] && cfg=(--config "$FP_CONFIG")
    echo "==== start $(date -Is) ====" >>"$OWNER_LOG"
    # the live detectors too (DoS: decisions recorded; firewall actions only where the configuration enables them)
    setsid "$FP" run "${cfg[@]}" --store "chdb:$DIR/chdb" --port "$HTTP_PORT" --consume --dos --traffic \
      --bootstrap "127.0.0.1:$KPORT" >>"$OWNER_LOG" 2>&1 </dev/null &
    echo $! > "$OWNER_PID"
    local i
    for i in $(seq 1 600); do
      owner_alive || { tail -n 30 "$OWNER_LOG" >&2; echo "stack.sh: owner process exited during start-up" >&2; exit 1; }
      owner_healthy && break
      sleep 0.1
    done
    owner_healthy || { tail -n 30 "$OWNER_LOG" >&2; echo "stack.sh: owner (pid $(cat "$OWNER_PID")) does not answer /fp/health on $HTTP_PORT after 60 s" >&2; exit 1; }
    echo "owner started (pid $(cat "$OWNER_PID"), http://127.0.0.1:$HTTP_PORT, store chdb:$DIR/chdb)"
    # the owner holds the folder: other commands (detect history, report, ingest) go through its endpoint
    echo "  other commands: --store clickhouse://default@127.0.0.1:$HTTP_PORT/forumpulse"
    echo "  detect decisions / detect unban: --owner http://127.0.0.1:$HTTP_PORT"
  else
    echo "stack.sh: \`forumpulse run\` is not available (run \`make install\`); Kafka and syslog-ng are up without a consumer" >&2
  fi
  echo "stack up in $DIR — follow: ${FP_VHOST_DIR:-$DIR/logs/vhosts}/<site>.access.log, ${FP_SQUID_DIR:-$DIR/logs/squid}/access.log;"
  echo "  raw lines: tcp/udp 127.0.0.1:${FP_RAW_TCP_PORT:-5140}; syslog: 127.0.0.1:${FP_SYSLOG_PORT:-5514} (RFC3164), ${FP_SYSLOG5424_PORT:-5515} (RFC5424, --octet-count on TCP)"
}

down() {
  local rc=0
  "${SNG[@]}" stop --dir "$DIR/syslog-ng" || rc=1     # first: flushes what it read into Kafka
  if owner_alive; then                                # then the consumer commits and closes the store
    local pid; pid=$(cat "$OWNER_PID")
    kill -TERM "$pid" 2>/dev/null || true
    local i
    # wait for the process itself (checked ours above; an exiting one has an empty cmdline, still holding the store)
    for i in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "stack.sh: owner ignored SIGTERM for 60 s, SIGKILL" >&2; kill -KILL "$pid" || true; fi
    echo "owner stopped (pid $pid)"
  else
    echo "owner not running"
  fi
  rm -f "$OWNER_PID"
  "${KAFKA[@]}" stop --dir "$DIR/kafka" || rc=1
  return $rc
}

status() {
  local rc=0
  echo "== kafka";  "${KAFKA[@]}" status --dir "$DIR/kafka" || rc=1
  echo "== syslog-ng"; "${SNG[@]}" status --dir "$DIR/syslog-ng" || rc=1
  if "${SNG[@]}" status --dir "$DIR/syslog-ng" >/dev/null 2>&1; then
    "${SNG[@]}" stats --dir "$DIR/syslog-ng" | awk -F';' '
      $1 ~ /^(src\.file|src\.network|src\.program|src\.syslog|dst\.kafka)$/ && $5 ~ /^(processed|dropped|queued|written)$/ && $6 > 0 {
        printf "   %-12s %-22s %-60s %-9s %s\n", $1, $2, substr($3, 1, 60), $5, $6 }'
  fi
  echo "== owner"
  if owner_alive; then
    echo "owner running: pid $(cat "$OWNER_PID"), http://127.0.0.1:$HTTP_PORT" \
      "(other commands: --store clickhouse://default@127.0.0.1:$HTTP_PORT/forumpulse)"
    if owner_healthy; then
      owner_health | sed 's/^/   health: /'; echo
      echo "== sources (live: lines; silent: up and idle, heartbeats only; quiet: no heartbeat of its own;"
      echo "   stuck: its file grows but no line arrives; dead: nothing for too long; retired: by \`forumpulse sources"
      echo "   retire\`, nothing since -- docs/operations.md)"
      curl -fsS --max-time 5 "http://127.0.0.1:$HTTP_PORT/fp/sources" 2>/dev/null | "$root/.venv/bin/python" -c '
import json, sys
rows = json.load(sys.stdin)
for s in rows:
    age = ["-" if v is None else "%.0f s ago" % v for v in (s["last_line_s_ago"], s["last_heartbeat_s_ago"])]
    print("   %-7s %s  %s  %s  last line %s, heartbeat %s" % (s["state"], s["site"], s["origin_host"],
                                                           s["origin_file"], age[0], age[1]))
if not rows:
    print("   (no source has sent anything yet)")' || echo "   /fp/sources did not answer"
      echo "== DoS decisions in force (GET /fp/decisions; actions from FP_CONFIG -- docs/dos.md)"
      curl -fsS --max-time 5 "http://127.0.0.1:$HTTP_PORT/fp/decisions" 2>/dev/null | "$root/.venv/bin/python" -c '
import json, sys
rows = json.load(sys.stdin)
for d in rows[:20]:
    print("   %-8s %-8s %-26s %-22s %s s left" % (d["action"], d["mode"], d["value"], d["reason"], d["remaining_s"]))
if not rows:
    print("   (none)")
elif len(rows) > 20:
    print("   (%d in all)" % len(rows))' || echo "   /fp/decisions did not answer (a password is set, or the owner runs without --dos)"
    else echo "   /fp/health on port $HTTP_PORT does not answer with pid $(cat "$OWNER_PID")"; rc=1; fi
  else
    echo "owner not running"; rc=1
  fi
  if port_open "$KPORT"; then echo "== topics"; "${KAFKA[@]}" offsets --dir "$DIR/kafka" | sed 's/^/   /' || true; fi
  return $rc
}

case "${1:-}" in
  up) up;;
  down) down;;
  status) status;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2;;
esac
