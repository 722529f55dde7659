#!/usr/bin/env bash
# mypy on the installed package layout: the repository folders pipeline/ detectors/ dashboards/ are the
# subpackages forumpulse.pipeline / .detectors / .dashboards, so build a tree of links mypy can follow.
set -euo pipefail
BIN=${1:-.venv/bin}
root=$(cd "$(dirname "$0")/.." && pwd)
tree="$root/build/mypy"
rm -rf "$tree"; mkdir -p "$tree/forumpulse"
for p in pipeline detectors dashboards; do ln -s "$root/$p" "$tree/forumpulse/$p"; done
cd "$tree" && "$root/$BIN/mypy" --config-file "$root/pyproject.toml" --namespace-packages --explicit-package-bases \
  -p forumpulse.pipeline -p forumpulse.detectors -p forumpulse.dashboards
