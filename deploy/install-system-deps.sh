#!/usr/bin/env bash
# Installs the Debian packages and Maven jars the test suite and the local stack need.  Idempotent and cached:
# a package already installed is not touched; Kafka jars are fetched once into deploy/kafka/libs.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(syslog-ng-core syslog-ng-mod-rdkafka goaccess nftables python3-nftables ipset iptables iproute2 chromium
      crowdsec-firewall-bouncer docker-compose maven openjdk-17-jre-headless fail2ban curl
      gcc libc6-dev)  # gcc: the fast path's native scanner (pipeline/native), built on first use
missing=()
for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  echo "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  # We run everything as plain processes: packages must not start system services (syslog-ng, fail2ban, the
  # bouncer...).  Without a policy-rc.d, put one in place for the install (exit 101 = "do not start") and remove
  # it afterwards; an existing one is left alone.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ -x deploy/kafka/install.sh ]; then bash deploy/kafka/install.sh; fi
