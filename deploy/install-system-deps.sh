#!/usr/bin/env bash
# Installs the Debian packages and Maven jars the test suite and the local stack need.  Idempotent and cached:
# a package already installed is not touched; Kafka jars are fetched once into deploy/kafka/libs.
# syslog-ng-core conflicts with every other system-log-daemon (Debian: Conflicts: system-log-daemon): installing
# it REMOVES rsyslog (or any other system logger) and makes syslog-ng the system's logger.  So when syslog-ng-core
# is missing and another system logger is installed, this script stops unless FP_REPLACE_SYSTEM_LOGGER=1.
# forumpulse itself runs syslog-ng as a separate process (its own config, persist file and control socket).
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS=(syslog-ng-core syslog-ng-mod-rdkafka goaccess nftables python3-nftables ipset iptables iproute2 chromium
      crowdsec-firewall-bouncer docker-compose maven openjdk-17-jre-headless fail2ban curl
      gcc libc6-dev)  # gcc: the fast path's native scanner (pipeline/native), built on first use
missing=()
for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
# CI machines (CI=true, as .ci/run is started) are throw-away: there the replacement is accepted with a warning
if [[ " ${missing[*]} " == *" syslog-ng-core "* ]] && [ "${CI:-}" = true ] && [ "${FP_REPLACE_SYSTEM_LOGGER:-0}" != 1 ]; then
  echo "install-system-deps.sh: CI=true: syslog-ng-core replaces any other system logger on this machine" >&2
  FP_REPLACE_SYSTEM_LOGGER=1
fi
if [[ " ${missing[*]} " == *" syslog-ng-core "* ]] && [ "${FP_REPLACE_SYSTEM_LOGGER:-0}" != 1 ]; then
  other=$(dpkg-query -W -f='${Package} ${Status} ${Provides}\n' 2>/dev/null \
          | awk '/install ok installed/ && /system-log-daemon/ {print $1}' | grep -vx syslog-ng-core || true)
  if [ -n "$other" ]; then
    echo "install-system-deps.sh: installing syslog-ng-core would remove the system logger ($other):" \
         "Debian's syslog-ng-core conflicts with system-log-daemon.  Re-run with FP_REPLACE_SYSTEM_LOGGER=1" \
         "to accept that, or install syslog-ng-core yourself." >&2
    exit 1
  fi
fi
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
