#!/bin/bash
# Entrypoint of the syslog-ng container: render syslog-ng/forumpulse.conf with the container's defines
# (deploy/syslog-ng/syslogng.sh render: unknown define names are errors), check its syntax, then exec
# syslog-ng in the foreground (it becomes the container's main process).
#
# Environment:
#   FP_KAFKA_BOOTSTRAP   [kafka:9092]      Kafka bootstrap servers
#   FP_ORIGIN_HOST       [unset: ${HOST}]  origin_host recorded for tailed files (the container's hostname otherwise)
#   FP_SYSLOGNG_DEFINES  [""]              extra space-separated k=v defines (e.g. fp_squid_site=proxy)
#   FP_STATE_DIR         [/var/lib/forumpulse/syslog-ng]  config, persist file, control socket, disk buffer
#   FP_TEMPLATE          [/usr/share/forumpulse/syslog-ng/forumpulse.conf]
#   FP_HEARTBEAT_CMD     [/usr/share/forumpulse/syslog-ng/heartbeat.sh]
#   FP_RENDER            [/usr/share/forumpulse/syslogng.sh]
#   FP_CHECK_ONLY        [unset]           1 = render and --syntax-only, then exit (tests, CI)
# The state folder must be a volume: the persist file keeps file positions and the reliable disk buffer keeps
# what Kafka has not acknowledged across container restarts.
set -euo pipefail
STATE=${FP_STATE_DIR:-/var/lib/forumpulse/syslog-ng}
TEMPLATE=${FP_TEMPLATE:-/usr/share/forumpulse/syslog-ng/forumpulse.conf}
RENDER=${FP_RENDER:-/usr/share/forumpulse/syslogng.sh}
SYSLOGNG=${SYSLOGNG:-syslog-ng}
defines=(
  --define "fp_kafka_bootstrap=${FP_KAFKA_BOOTSTRAP:-kafka:9092}"
  --define "fp_listen_ip=0.0.0.0"
  --define "fp_state_dir=$STATE/buffer"
  --define "fp_heartbeat_cmd=${FP_HEARTBEAT_CMD:-/usr/share/forumpulse/syslog-ng/heartbeat.sh}"
  --define "fp_squid_dir=/var/log/squid"
  --define "fp_vhost_dir=/var/log/apache2/vhosts"
)
[ -n "${FP_ORIGIN_HOST:-}" ] && defines+=(--define "fp_origin_host=$FP_ORIGIN_HOST")
for kv in ${FP_SYSLOGNG_DEFINES:-}; do defines+=(--define "$kv"); done
mkdir -p "$STATE/buffer"
conf=$(bash "$RENDER" render --config "$TEMPLATE" --dir "$STATE" "${defines[@]}" | tail -n 1)
"$SYSLOGNG" --syntax-only -f "$conf"
if [ "${FP_CHECK_ONLY:-}" = 1 ]; then
  echo "syntax ok: $conf"
  exit 0
fi
rm -f "$STATE/syslog-ng.pid" "$STATE/syslog-ng.ctl"
exec "$SYSLOGNG" -F --no-caps -e -f "$conf" -R "$STATE/syslog-ng.persist" -p "$STATE/syslog-ng.pid" \
     -c "$STATE/syslog-ng.ctl"
