#!/usr/bin/env bash
# Makes sure `python3 -m venv` works before `make` creates .venv.  A fresh Debian has python3 but not its venv
# module (package python3-venv): install it with apt-get when it is missing (as root, or with sudo).  Idempotent:
# does nothing when python3 can already create a virtual environment.
set -euo pipefail
PY="${1:-python3}"
if command -v "$PY" >/dev/null && "$PY" -c "import venv, ensurepip" 2>/dev/null; then exit 0; fi
if ! command -v apt-get >/dev/null; then
  echo "$PY with its venv module is required (Debian/Ubuntu: apt-get install python3 python3-venv)" >&2; exit 1
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
echo "installing Debian packages: python3 python3-venv"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends python3 python3-venv
