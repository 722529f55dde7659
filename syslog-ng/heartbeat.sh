#!/bin/sh
# forumpulse heartbeat generator, run by syslog-ng's program() source (see forumpulse.conf).
# Every INTERVAL seconds it prints one line per followed log file and one per network listener, so the
# pipeline can tell a quiet source (heartbeats keep arriving) from a dead one (no heartbeats):
#   file<TAB><kind><TAB><path><TAB>ts=<unix s> size=<bytes> inode=<n>   each file matching a followed pattern
#   net<TAB><name><TAB><listener><TAB>ts=<unix s>                        each network listener (name=listener)
# Usage: heartbeat.sh INTERVAL SQUID_DIR SQUID_PATTERN VHOST_DIR VHOST_PATTERN [NAME=LISTENER ...]
# Files are listed again on every tick (squid: SQUID_DIR only; vhosts: VHOST_DIR recursively), so new vhost
# files get heartbeats without a reload.  Never reads log contents.  Ends when syslog-ng closes its stdout.
set -u
interval=$1 sdir=$2 spat=$3 vdir=$4 vpat=$5
shift 5
beat_files() {  # kind dir pattern maxdepth-args...
  kind=$1 dir=$2 pat=$3; shift 3
  [ -d "$dir" ] || return 0
  find "$dir" "$@" -type f -name "$pat" 2>/dev/null | sort | while IFS= read -r f; do
    st=$(stat -c '%s %i' "$f" 2>/dev/null) || continue
    printf 'file\t%s\t%s\tts=%s size=%s inode=%s\n' "$kind" "$f" "$now" "${st% *}" "${st#* }"
  done
}
while :; do
  now=$(date +%s)
  beat_files squid "$sdir" "$spat" -maxdepth 1 || exit 0
  beat_files vhost "$vdir" "$vpat" || exit 0
  for l in "$@"; do printf 'net\t%s\t%s\tts=%s\n' "${l%%=*}" "${l#*=}" "$now" || exit 0; done
  sleep "$interval"
done
