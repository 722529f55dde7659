#!/usr/bin/env bash
# Fetches the pinned Kafka broker runtime (deploy/kafka/pom.xml) into deploy/kafka/libs/ with Maven.
# Idempotent and cached: skips when libs/.stamp holds the sha1 of the pom that produced the jars.
# Needs: maven + a JDK/JRE 17 (deploy/install-system-deps.sh installs both) and access to Maven Central.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
libs="$here/libs"
want=$(sha1sum "$here/pom.xml" | cut -c1-40)
if [ -f "$libs/.stamp" ] && [ "$(cat "$libs/.stamp")" = "$want" ] && ls "$libs"/kafka_2.13-*.jar >/dev/null 2>&1; then
  exit 0
fi
command -v mvn >/dev/null || { echo "deploy/kafka/install.sh: mvn not found (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "deploy/kafka/install.sh: java not found (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }
echo "fetching Kafka runtime jars into $libs (mvn: from the local repository ~/.m2 when there, else Maven Central)"
tmp="$libs.tmp.$$"
rm -rf "$tmp"; mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
(cd "$here" && mvn -B -q -f pom.xml dependency:copy-dependencies -DoutputDirectory="$tmp" -DincludeScope=runtime)
ls "$tmp"/kafka_2.13-*.jar >/dev/null 2>&1 || { echo "deploy/kafka/install.sh: kafka_2.13 jar missing after mvn" >&2; exit 1; }
echo "$want" > "$tmp/.stamp"
rm -rf "$libs"; mv "$tmp" "$libs"
trap - EXIT
rm -rf "$here/target"
echo "Kafka runtime: $(ls "$libs"/*.jar | wc -l) jars in $libs"
