"""Pipeline metrics: Prometheus (prometheus-client, own registry per component) and ``pipeline_stats`` rows.

One :class:`PipelineMetrics` per component instance (consumer, owner).  Each has its own
``CollectorRegistry``, so several instances in one process (tests, the owner hosting a consumer) never clash;
serve it with :meth:`PipelineMetrics.serve` (a port) or :meth:`PipelineMetrics.exposition` (the owner's
``/metrics`` route).

``pipeline_stats`` rows (:meth:`PipelineMetrics.stats_row`) are interval deltas since the previous row: lines
in / loaded / quarantined, mean batch latency (ms from the start of a batch's processing to its offsets being
committed), lag (messages behind the high watermarks of the assigned partitions, -1 when unknown) and
freshness (seconds between now and the newest log timestamp loaded; -1 before the first row is loaded).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pyarrow as pa
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

PIPELINE_STATS_SCHEMA = pa.schema([
    ("ts", pa.timestamp("ms", tz="UTC")), ("component", pa.string()), ("instance", pa.string()),
    ("lines_in", pa.uint64()), ("loaded", pa.uint64()), ("quarantined", pa.uint64()),
    ("batch_latency_ms", pa.float64()), ("lag", pa.int64()), ("freshness_s", pa.float64()),
])


class PipelineMetrics:
    """Counters and gauges of one component instance.  Thread-safe (prometheus-client is; deltas use a lock)."""

    def __init__(self, component: str = "consumer", instance: str = "local") -> None:
        self.component = component
        self.instance = instance
        self.registry = CollectorRegistry()
        r = self.registry
        p = "forumpulse_"
        self.lines_in = Counter(p + "lines_in", "Kafka messages carrying access lines received", registry=r)
        self.loaded = Counter(p + "lines_loaded", "lines stored in requests", registry=r)
        self.quarantined = Counter(p + "lines_quarantined", "lines stored in quarantine", ["reason"], registry=r)
        self.dead_lettered = Counter(p + "dead_lettered", "messages sent to the dead-letter topic", ["reason"],
                                     registry=r)
        self.heartbeats = Counter(p + "heartbeats", "heartbeat messages received", registry=r)
        self.batches = Counter(p + "batches", "batches committed", ["kind"], registry=r)
        self.store_errors = Counter(p + "store_errors", "store operations that failed and were retried", registry=r)
        self.commit_failures = Counter(p + "commit_failures", "offset commits that failed (batch replays later)",
                                       registry=r)
        self.slow_inserts = Counter(p + "slow_inserts", "inserts still running after keepalive_after_s (waited for "
                                    "while polling, partitions paused)", registry=r)
        self.rebalances = Counter(p + "rebalances", "partition assignments and revocations", ["kind"], registry=r)
        self.buffered = Gauge(p + "buffered_lines", "messages held in memory waiting for their batch", registry=r)
        self.buffered_max = Gauge(p + "buffered_lines_max", "highest buffered_lines seen since start", registry=r)
        self.paused = Gauge(p + "paused", "1 while fetching is paused (store slow or down, or buffers full)",
                            registry=r)
        self.lag = Gauge(p + "lag", "messages behind the high watermark (assigned partitions)", registry=r)
        self.freshness = Gauge(p + "freshness_seconds", "now minus the newest log timestamp loaded", registry=r)
        self.batch_seconds = Histogram(p + "batch_seconds", "processing + insert + commit time per batch",
                                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
                                       registry=r)
        self._lock = threading.Lock()
        self._in = self._ld = self._q = 0
        self._lat_sum = 0.0
        self._lat_n = 0
        self._newest_ms: int | None = None
        self._lag_value = -1
        self._max_buf = 0
        self.totals: dict[str, Any] = {"lines_in": 0, "loaded": 0, "quarantined": 0, "dead_lettered": 0,
                                       "heartbeats": 0, "batches": 0, "replayed_batches": 0, "store_errors": 0,
                                       "commit_failures": 0}

    # ---------------------------------------------------------------------------------------- recording

    def record_batch(self, lines_in: int, loaded: int, quarantined: int, by_reason: dict[str, int],
                     seconds: float, newest_ts_ms: int | None, replay: bool) -> None:
        self.lines_in.inc(lines_in)
        self.loaded.inc(loaded)
        for reason, n in by_reason.items():
            self.quarantined.labels(reason).inc(n)
        self.batches.labels("replay" if replay else "normal").inc()
        self.batch_seconds.observe(seconds)
        with self._lock:
            self._in += lines_in
            self._ld += loaded
            self._q += quarantined
            self._lat_sum += seconds * 1000
            self._lat_n += 1
            if newest_ts_ms is not None and (self._newest_ms is None or newest_ts_ms > self._newest_ms):
                self._newest_ms = newest_ts_ms
            t = self.totals
            t["lines_in"] += lines_in
            t["loaded"] += loaded
            t["quarantined"] += quarantined
            t["batches"] += 1
            t["replayed_batches"] += int(replay)

    def record_dead_letter(self, reason: str, n: int = 1) -> None:
        self.dead_lettered.labels(reason).inc(n)
        with self._lock:
            self.totals["dead_lettered"] += n

    def record_heartbeats(self, n: int) -> None:
        self.heartbeats.inc(n)
        with self._lock:
            self.totals["heartbeats"] += n

    def record_store_error(self) -> None:
        self.store_errors.inc()
        with self._lock:
            self.totals["store_errors"] += 1

    def record_slow_insert(self) -> None:
        self.slow_inserts.inc()

    def record_commit_failure(self) -> None:
        self.commit_failures.inc()
        with self._lock:
            self.totals["commit_failures"] += 1

    def set_buffered(self, n: int) -> None:
        self.buffered.set(n)
        if n > self._max_buf:
            self._max_buf = n
            self.buffered_max.set(n)

    @property
    def max_buffered(self) -> int:
        return self._max_buf

    def set_lag(self, lag: int) -> None:
        self._lag_value = lag
        self.lag.set(lag)

    def freshness_s(self, now: float | None = None) -> float:
        if self._newest_ms is None:
            return -1.0
        return max(0.0, (now if now is not None else time.time()) - self._newest_ms / 1000)

    # ---------------------------------------------------------------------------------------- output

    def stats_row(self, now: float | None = None) -> dict[str, Any]:
        """The interval row for ``pipeline_stats`` (deltas since the previous call)."""
        now = time.time() if now is None else now
        fresh = self.freshness_s(now)
        self.freshness.set(fresh)
        with self._lock:
            row = {
                "ts": int(now * 1000), "component": self.component, "instance": self.instance,
                "lines_in": self._in, "loaded": self._ld, "quarantined": self._q,
                "batch_latency_ms": self._lat_sum / self._lat_n if self._lat_n else 0.0,
                "lag": self._lag_value, "freshness_s": fresh,
            }
            self._in = self._ld = self._q = 0
            self._lat_sum = 0.0
            self._lat_n = 0
        return row

    def summary(self) -> dict[str, Any]:
        """Totals since start (for logs and the consumer's exit line)."""
        with self._lock:
            return {**self.totals, "max_buffered": self._max_buf, "lag": self._lag_value}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread (prometheus-client's server)."""
        return start_http_server(port, addr=addr, registry=self.registry)


def stats_table(rows: list[dict[str, Any]]) -> pa.Table:
    """``pipeline_stats`` rows as an Arrow table matching migration 0001."""
    if not rows:
        return PIPELINE_STATS_SCHEMA.empty_table()
    return pa.Table.from_pylist(rows, schema=PIPELINE_STATS_SCHEMA)
