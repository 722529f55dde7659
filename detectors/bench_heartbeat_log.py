"""What reading the heartbeat log costs a history run (``source_heartbeat_minute``, migration 0008).

``python -m forumpulse.detectors.bench_heartbeat_log [--sources 50] [--days 43]`` fills a scratch chDB store
with one log row per source and minute (a heartbeat at :05 and :55, the file growing), then times what
:meth:`~forumpulse.detectors.traffic.TrafficDetector._heartbeat_log` does for a history run over the whole range:
the runs of heartbeats merged in the store, liveness at every tenth minute, and a growth test of every source
over one 20-minute silence.  A measurement on this machine, not a target (docs/detectors.md quotes it)."""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
from forumpulse.detectors.traffic import TrafficDetector
from forumpulse.pipeline.consumer import BEAT_TYPE, HEARTBEAT_LOG_SCHEMA
from forumpulse.pipeline.store import migrate, open_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=50)
    ap.add_argument("--days", type=int, default=43)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        st = open_store(f"chdb:{tmp}")
        migrate(st, {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0})
        t0 = datetime(2026, 1, 1, tzinfo=UTC)
        n = args.days * 1440
        minutes = np.arange(n, dtype=np.int64) * 60_000 + int(t0.timestamp() * 1000)
        sizes = np.arange(n, dtype=np.uint64) * 1000

        def beats(ts: np.ndarray, size: np.ndarray) -> pa.StructArray:
            return pa.StructArray.from_arrays(
                [pa.array(ts).cast(pa.timestamp("ms", tz="UTC")), pa.array(size),
                 pa.array(np.full(n, 7, np.uint64))], fields=list(BEAT_TYPE))

        for s in range(args.sources):
            st.insert("source_heartbeat_minute", pa.table({
                "site": ["s"] * n, "origin_host": [f"h{s}"] * n, "origin_file": ["access.log"] * n,
                "minute": pa.array(minutes // 1000).cast(pa.timestamp("s", tz="UTC")),
                "first_beat": beats(minutes + 5_000, sizes), "last_beat": beats(minutes + 55_000, sizes + 500)},
                schema=HEARTBEAT_LOG_SCHEMA))
        det = TrafficDetector()
        a = time.perf_counter()
        log = det._heartbeat_log(st, "s", t0, t0 + timedelta(days=args.days))
        b = time.perf_counter()
        assert log is not None
        alive = sum(len(log.at(t0 + timedelta(minutes=i))) for i in range(0, n, 10))
        c = time.perf_counter()
        grown = log.growing(t0 + timedelta(days=1), t0 + timedelta(days=1, minutes=20))
        d = time.perf_counter()
        st.close()
    print(f"{args.sources} sources x {args.days} days = {args.sources * n:,} log rows: read and merged "
          f"{b - a:.2f} s; liveness at {n // 10:,} minutes {c - b:.2f} s ({alive:,} source-minutes alive); "
          f"growth of {len(grown)} sources over one silence {d - c:.2f} s; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (with the scratch data)")


if __name__ == "__main__":
    main()
