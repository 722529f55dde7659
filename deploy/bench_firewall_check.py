#!/usr/bin/env python3
"""Cost of the owner's periodic firewall check (``detectors.live.firewall_check_s``) by the number of bans held.

For nftables and ipset, in a fresh network namespace (``fpfwbench``, deleted on exit): ``N`` bans are recorded
(one in ten a /24 range, the rest addresses), put in the kernel by ``ensure()``, then timed:

* ``check``: ``ensure()`` with nothing missing (the common case: a read of the whole table and a comparison),
  median of 5;
* ``after_flush``: ``ensure()`` right after the firewall was wiped (``nft flush ruleset``; for ipset the
  iptables rules and the sets destroyed), which puts every ban back in one transaction.

Usage (root; nftables, ipset and iptables installed, see deploy/install-system-deps.sh)::

    .venv/bin/python deploy/bench_firewall_check.py [--sizes 1000,10000,50000]

Prints one line per action and size.
"""

from __future__ import annotations

import argparse
import ipaddress
import statistics
import subprocess
import time
from typing import Any

from forumpulse.detectors.actions import IpsetAction, NftablesAction

NS = "fpfwbench"
WIPE = {"nftables": "nft flush ruleset",
        "ipset": "iptables -F INPUT; ip6tables -F INPUT; ipset destroy"}


def _wipe(kind: str) -> None:
    subprocess.run(["ip", "netns", "exec", NS, "sh", "-c", WIPE[kind]], check=True, capture_output=True)


def _value(i: int) -> str:
    """The i-th ban: every tenth a /24 of 100.64.0.0/10 (distinct up to 163,840 bans), else an address."""
    if i % 10 == 0:
        j = i // 10
        return f"100.{64 + (j >> 8)}.{j & 255}.0/24"
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def measure(kind: str, n: int) -> dict[str, Any]:
    _wipe(kind)
    act = NftablesAction(netns=NS) if kind == "nftables" else IpsetAction(netns=NS)
    act.ensure()
    for i in range(n):
        act.held.put(ipaddress.ip_network(_value(i)), 3600)
    act.ensure()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        act.ensure()
        times.append(time.perf_counter() - t)
    _wipe(kind)
    t = time.perf_counter()
    act.ensure()
    after = time.perf_counter() - t
    return {"action": kind, "held": len(act.held), "check_ms": round(statistics.median(times) * 1000),
            "after_flush_ms": round(after * 1000)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,10000,50000")
    a = ap.parse_args()
    subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        for kind in ("nftables", "ipset"):
            for n in (int(x) for x in a.sizes.split(",")):
                print(measure(kind, n), flush=True)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)


if __name__ == "__main__":
    main()
