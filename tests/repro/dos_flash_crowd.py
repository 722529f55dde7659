"""A flash crowd against the DoS detector (run by hand, not a test): N busy /24 ranges of readers (carrier NATs)
all rise K-fold within one second -- breaking news, a push notification -- after 25 minutes of steady traffic.
Prints how many decisions the detector made, by rule.  ``CROWD=0`` turns the crowd guard off
(``prefix_baseline.crowd_min_ranges``); docs/dos.md "Flash crowds" quotes ``python tests/repro/dos_flash_crowd.py
60 5 6`` with and without it.  ``NEW=n`` adds n /24s never seen before that join the crowd with its traffic
(new readers the news brought: ~200 addresses and rise x rate non-static req/s each).

Usage: python tests/repro/dos_flash_crowd.py [ranges=60] [rise=5] [non-static req/s per range=6]
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np
from forumpulse.detectors.dos import Batch, DosDetector
from forumpulse.detectors.dos_rules import load_rules


def main() -> None:
    n_ranges = int(sys.argv[1]) if len(sys.argv) > 1 else 60
    rise = float(sys.argv[2]) if len(sys.argv) > 2 else 5.0
    rate = float(sys.argv[3]) if len(sys.argv) > 3 else 6.0
    rules = load_rules()
    pb = rules.prefix_baseline.model_copy(update={"crowd_min_ranges": int(os.environ.get("CROWD", "10"))})
    det = DosDetector(rules.model_copy(update={"prefix_baseline": pb}))
    rng = np.random.default_rng(1)
    uas = [f"Mozilla/5.0 (Linux; Android 1{i}) Chrome/12{i}.0 Mobile" for i in range(10)]
    t0 = 1_700_000_000
    made: Counter[str] = Counter()
    new = int(os.environ.get("NEW", "0"))
    for sec in range(40 * 60):
        k = rise if sec >= 25 * 60 else 1.0
        ts: list[int] = []
        ip: list[str] = []
        path: list[str] = []
        for r in range(n_ranges + (new if sec >= 25 * 60 else 0)):
            pages, statics = rng.poisson(rate * k), rng.poisson(rate * k * 2)
            for j in range(pages + statics):
                ts.append((t0 + sec) * 1000 + int(rng.integers(0, 1000)))
                ip.append(f"100.{64 + r // 250}.{r % 250}.{int(rng.integers(1, 200))}")
                path.append(f"/t/{int(rng.integers(1, 500))}" if j < pages else f"/static/a{int(rng.integers(1, 50))}.js")
        o = np.argsort(ts, kind="stable")
        ips = np.asarray(ip, dtype=object)[o]
        b = Batch(np.asarray(ts)[o], ips, np.full(len(ts), "GET", dtype=object), np.asarray(path, dtype=object)[o],
                  np.full(len(ts), "", dtype=object), np.full(len(ts), 200),
                  np.asarray([uas[int(a.rsplit(".", 1)[1]) % 10] for a in ips], dtype=object))  # one per address
        for d in det.process(b):
            made[d.reason] += 1
    print(f"ranges={n_ranges} (+{new} new) rise={rise}x non-static={rate}/s per range "
          f"crowd_min_ranges={pb.crowd_min_ranges}: "
          f"{sum(made.values())} decisions {dict(made)}")


if __name__ == "__main__":
    main()
