#!/usr/bin/env bash
# syslog-ng 3.38 as a plain process with its own files (never the system service).
#
#   syslogng.sh start  --dir DIR --config FILE [--define k=v ...] [--timeout 20]
#   syslogng.sh stop   --dir DIR [--kill] [--timeout 60]   SIGTERM by pid, wait, SIGKILL fallback; then
#                                                            its program() children left orphaned (heartbeat.sh)
#   syslogng.sh status --dir DIR                           exit 0 = running, 3 = not running
#   syslogng.sh stats  --dir DIR                           syslog-ng-ctl stats (CSV) on our control socket
#   syslogng.sh check  --config FILE [--dir DIR] [--define k=v ...]   --syntax-only on the generated config
#   syslogng.sh render --config FILE --dir DIR [--define k=v ...]     write DIR/syslog-ng.conf and print its path
#
# --define k=v replaces the line `@define k "..."` of the template FILE (every tunable of our configs has such a
# default line); an unknown k is an error, so a typo cannot silently keep a default.  The generated config is
# DIR/syslog-ng.conf; runtime files are DIR/syslog-ng.{persist,pid,ctl,log}.  `fp_state_dir` defaults to DIR/state
# (disk buffers) and `fp_heartbeat_cmd` to the heartbeat.sh next to FILE (when it is there) unless defined
# explicitly; a heartbeat command that is not an executable file is an error.
# Runs: syslog-ng -F --no-caps -e -f CONF -R PERSIST -p PID -c CTL.
set -euo pipefail
SYSLOGNG=${SYSLOGNG:-syslog-ng}
SYSLOGNG_CTL=${SYSLOGNG_CTL:-syslog-ng-ctl}
die() { echo "syslogng.sh: $*" >&2; exit 1; }
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

cmd=${1:-}; [ -n "$cmd" ] || usage; shift
DIR="" CONFIG="" TIMEOUT="" KILL=0; DEFINES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2;;
    --config) CONFIG=$2; shift 2;;
    --define) DEFINES+=("$2"); shift 2;;
    --define=*) DEFINES+=("${1#--define=}"); shift;;
    --timeout) TIMEOUT=$2; shift 2;;
    --kill) KILL=1; shift;;
    -h|--help) usage;;
    *) die "unknown argument: $1";;
  esac
done
if [ -z "$DIR" ]; then
  [ "$cmd" = check ] || die "--dir DIR is required"
  DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT
fi
mkdir -p "$DIR"; DIR=$(cd "$DIR" && pwd)
CONF="$DIR/syslog-ng.conf" PERSIST="$DIR/syslog-ng.persist" PIDF="$DIR/syslog-ng.pid"
CTL="$DIR/syslog-ng.ctl" LOG="$DIR/syslog-ng.log"

# alive AND this instance: after a reboot the recorded pid may belong to an unrelated process, which must be neither
# taken for this syslog-ng (start would be skipped) nor killed by stop.  Its command line names this DIR's config.
pid_ours() {
  local args
  [ -n "$1" ] && kill -0 "$1" 2>/dev/null && args=$(tr '\0' '\n' <"/proc/$1/cmdline" 2>/dev/null) \
    && grep -Fxq -- "$CONF" <<<"$args"
}
pid_alive() { [ -f "$PIDF" ] && pid_ours "$(cat "$PIDF")"; }
log_tail() { echo "---- last lines of $LOG ----" >&2; tail -n "${1:-30}" "$LOG" >&2 2>/dev/null || true; }

render() {
  [ -n "$CONFIG" ] || die "--config FILE is required"
  [ -f "$CONFIG" ] || die "config template not found: $CONFIG"
  command -v "$SYSLOGNG" >/dev/null || die "syslog-ng not found (apt-get install syslog-ng-core syslog-ng-mod-rdkafka)"
  local have_state=0 have_hb=0 kv k v out tmp
  tmp=$(mktemp "$DIR/.conf.XXXXXX")
  cp "$CONFIG" "$tmp"
  for kv in "${DEFINES[@]}"; do
    [[ "$kv" == *=* ]] || die "--define expects k=v, got: $kv"
    k=${kv%%=*}; v=${kv#*=}
    [[ "$k" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "bad define name: $k"
    [ "$k" = fp_state_dir ] && have_state=1
    [ "$k" = fp_heartbeat_cmd ] && have_hb=1
    grep -qE "^@define[[:space:]]+$k[[:space:]]" "$tmp" || die "$CONFIG has no '@define $k' line to override"
    v=${v//\\/\\\\}; v=${v//\"/\\\"}
    out=$(K="$k" V="$v" awk '{ if ($1 == "@define" && $2 == ENVIRON["K"]) print "@define " ENVIRON["K"] " \"" ENVIRON["V"] "\""; else print }' "$tmp")
    printf '%s\n' "$out" > "$tmp"
  done
  if [ "$have_state" = 0 ] && grep -qE '^@define[[:space:]]+fp_state_dir[[:space:]]' "$tmp"; then
    mkdir -p "$DIR/state"
    out=$(S="$DIR/state" awk '{ if ($1 == "@define" && $2 == "fp_state_dir") print "@define fp_state_dir \"" ENVIRON["S"] "\""; else print }' "$tmp")
    printf '%s\n' "$out" > "$tmp"
  fi
  local hb_default
  hb_default="$(cd "$(dirname "$CONFIG")" && pwd)/heartbeat.sh"
  if [ "$have_hb" = 0 ] && [ -x "$hb_default" ] && grep -qE '^@define[[:space:]]+fp_heartbeat_cmd[[:space:]]' "$tmp"; then
    out=$(H="$hb_default" awk '{ if ($1 == "@define" && $2 == "fp_heartbeat_cmd") print "@define fp_heartbeat_cmd \"" ENVIRON["H"] "\""; else print }' "$tmp")
    printf '%s\n' "$out" > "$tmp"
  fi
  # syslog-ng re-runs a program() source that cannot start many times a second, silently: refuse instead
  local hb
  hb=$(awk '$1 == "@define" && $2 == "fp_heartbeat_cmd" { v = $3; gsub(/^"|"$/, "", v); print v }' "$tmp")
  if [ -n "$hb" ] && [ ! -x "$hb" ]; then
    rm -f "$tmp"
    die "fp_heartbeat_cmd is not an executable file: $hb (--define fp_heartbeat_cmd=/path/to/syslog-ng/heartbeat.sh)"
  fi
  mv "$tmp" "$CONF"
}

check() {
  "$SYSLOGNG" --syntax-only -f "$CONF" >"$DIR/syntax-check.log" 2>&1 || {
    cat "$DIR/syntax-check.log" >&2; die "syntax check failed for $CONFIG (generated $CONF)"; }
}

do_start() {
  if pid_alive; then
    # the running process keeps the configuration it started with: say so when this start asked for another
    local running=""
    [ -f "$CONF" ] && running=$(cat "$CONF")
    render; check
    if [ "$running" != "$(cat "$CONF")" ]; then
      printf '%s\n' "$running" >"$CONF"
      echo "syslog-ng already running (pid $(cat "$PIDF")) with another configuration: the new one was NOT applied" \
           "(stop, then start, to apply it)" >&2
      return 1
    fi
    echo "syslog-ng already running (pid $(cat "$PIDF"))"; return 0
  fi
  render; check
  rm -f "$PIDF" "$CTL"
  echo "==== start $(date -Is) config=$CONFIG ====" >>"$LOG"
  setsid "$SYSLOGNG" -F --no-caps -e -f "$CONF" -R "$PERSIST" -p "$PIDF" -c "$CTL" >>"$LOG" 2>&1 </dev/null &
  local child=$! t=${TIMEOUT:-20} waited=0
  # ready = the control socket answers (sources are listening by then)
  until [ -S "$CTL" ] && "$SYSLOGNG_CTL" stats -c "$CTL" >/dev/null 2>&1; do
    kill -0 "$child" 2>/dev/null || { log_tail; die "syslog-ng exited during start-up"; }
    [ "$waited" -ge $((t * 10)) ] && { log_tail; die "syslog-ng not ready within ${t}s (pid $child)"; }
    sleep 0.1; waited=$((waited + 1))
  done
  echo "$child" > "$PIDF"
  echo "syslog-ng started (pid $child, ctl $CTL, config $CONF)"
}

descendants() {  # pid: its descendants (from /proc), each child before its own children
  local c
  for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do echo "$c"; descendants "$c"; done
}

do_stop() {
  if ! pid_alive; then rm -f "$PIDF"; echo "syslog-ng not running"; return 0; fi
  local pid t=${TIMEOUT:-60} waited=0 kids k ppid
  pid=$(cat "$PIDF")
  # its program() sources (heartbeat.sh): a graceful stop ends them, a SIGKILL orphans them (sleeping until
  # their next write fails) -- those left once syslog-ng is gone are stopped below
  kids=" $(descendants "$pid" | tr '\n' ' ') "
  if [ "$KILL" = 1 ]; then kill -KILL "$pid" 2>/dev/null || true; else kill -TERM "$pid" 2>/dev/null || true; fi
  # wait for the process itself to go (checked ours above): an exiting process has an empty cmdline while it
  # still holds its sockets and files, so pid_ours would stop waiting too early
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$waited" -ge $((t * 10)) ]; then
      echo "syslogng.sh: pid $pid ignored SIGTERM for ${t}s, sending SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
    sleep 0.1; waited=$((waited + 1))
  done
  for k in $kids; do  # still alive and still in that tree (reparented to init, or under another of them)
    ppid=$(sed 's/.*) //' /proc/"$k"/stat 2>/dev/null | cut -d' ' -f2) || continue  # gone already
    case " 1$kids" in *" $ppid "*) kill -TERM "$k" 2>/dev/null || true;; esac
  done
  rm -f "$PIDF"
  echo "syslog-ng stopped (pid $pid)"
}

case "$cmd" in
  start) do_start;;
  stop) do_stop;;
  status)
    if pid_alive; then echo "syslog-ng running: pid $(cat "$PIDF"), ctl $CTL"; exit 0; fi
    echo "syslog-ng not running (dir $DIR)"; exit 3;;
  stats)
    pid_alive || die "syslog-ng not running (dir $DIR)"
    "$SYSLOGNG_CTL" stats -c "$CTL";;
  check) render; check; echo "syntax ok: $CONFIG";;
  render) render; echo "$CONF";;
  *) usage;;
esac
