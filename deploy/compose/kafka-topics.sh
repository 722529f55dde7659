#!/bin/bash
# Create the forumpulse topics (idempotent); run by the compose service kafka-init with the apache/kafka image.
#   kafka-topics.sh BOOTSTRAP            partitions of weblogs.raw from $RAW_PARTITIONS (default 8)
# weblogs.raw is keyed by client address: its partition count is the upper bound of loader parallelism
# (docs/operations.md, "Scaling"). Raising it later re-maps keys (a client's lines move partition once);
# lowering it is impossible. Topics the same as deploy/kafka/kafka.sh creates for the local stack.
set -euo pipefail
BOOTSTRAP=${1:?usage: kafka-topics.sh BOOTSTRAP}
RAW_PARTITIONS=${RAW_PARTITIONS:-8}
KT=${KAFKA_TOPICS:-/opt/kafka/bin/kafka-topics.sh}
[[ "$RAW_PARTITIONS" =~ ^[1-9][0-9]*$ ]] || { echo "RAW_PARTITIONS must be a positive integer, got '$RAW_PARTITIONS'" >&2; exit 2; }
create() {  # name partitions [--config k=v ...]
  local name=$1 parts=$2; shift 2
  "$KT" --bootstrap-server "$BOOTSTRAP" --create --if-not-exists --topic "$name" \
        --partitions "$parts" --replication-factor 1 "$@"
}
create weblogs.raw "$RAW_PARTITIONS" --config compression.type=producer --config max.message.bytes=4194304
create weblogs.raw.dlq 1 --config retention.ms=$((30 * 86400 * 1000)) --config max.message.bytes=4194304
create weblogs.events 1
create weblogs.decisions 1
"$KT" --bootstrap-server "$BOOTSTRAP" --describe --topic weblogs.raw
