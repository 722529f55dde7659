"""librdkafka settings every forumpulse Kafka client starts from (consumers, producers, admin clients).

Why: with its defaults, librdkafka 2.x retries a refused connection about every 50 ms and logs each attempt — a
broker that is down for an hour (an upgrade, a crash) makes every forumpulse process write ~70,000 identical
``FAIL ... Connection refused`` lines to its log (measured here: 19-20 per second per client).  So:

* :data:`RECONNECT`: the first reconnect after 1 s, backing off to at most 10 s (librdkafka's own maximum).  A
  broker that comes back is reached again within about a second; nothing is given up (librdkafka retries
  forever, and the consumer waits, see :mod:`forumpulse.pipeline.consumer`).
* librdkafka's log lines go to the Python logger ``forumpulse.kafka`` (same handlers and format as the rest of
  the process) through :class:`RepeatFilter`: the first line of a kind is logged, repeats of it (the same text
  once numbers are ignored) are counted, not logged, for ``every_s`` seconds, after which the next one is logged
  with how many were folded into it.  The counts make an outage's length visible without the flood.

How not to misuse it: pass the result of :func:`client_config` to the client's constructor; settings given by the
caller (and a site's own ``kafka.config`` overrides applied after) win over these defaults.  The logger receives
librdkafka's lines when the client is polled (``poll``/``consume``/``flush``), as confluent-kafka forwards them
then — a client that is never polled logs nothing.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

#: reconnect back-off for every client (milliseconds): first retry after 1 s, then exponential up to 10 s
RECONNECT: dict[str, Any] = {"reconnect.backoff.ms": 1000, "reconnect.backoff.max.ms": 10000}

LOGGER_NAME = "forumpulse.kafka"

_NUMBERS = re.compile(r"\d+")


class RepeatFilter(logging.Filter):
    """Folds repeated log lines: a record passes when no record of its kind (logger, level, text with every run of
    digits replaced) passed in the last ``every_s`` seconds; the others are counted and dropped, and the next one
    that passes says ``(N more like this in the last S s)``.  Thread-safe; keeps at most ``max_kinds`` kinds (the
    oldest are forgotten first)."""

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 max_kinds: int = 1000) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self.max_kinds = max_kinds
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, int, str], list[float]] = {}  # kind -> [last passed at, folded since]

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, _NUMBERS.sub("#", record.getMessage()))
        now = self.clock()
        with self._lock:
            st = self._kinds.get(kind)
            if st is not None and now - st[0] < self.every_s:
                st[1] += 1
                return False
            folded, since = (int(st[1]), now - st[0]) if st is not None else (0, 0.0)
            self._kinds.pop(kind, None)
            self._kinds[kind] = [now, 0]
            while len(self._kinds) > self.max_kinds:
                self._kinds.pop(next(iter(self._kinds)))
        if folded:
            record.msg = f"{record.getMessage()} ({folded} more like this in the last {since:.0f} s)"
            record.args = None
        return True


def kafka_logger() -> logging.Logger:
    """The logger librdkafka's lines go to, with one :class:`RepeatFilter` (attached on first use)."""
    lg = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(f, RepeatFilter) for f in lg.filters):
        lg.addFilter(RepeatFilter())
    return lg


class BrokerLink:
    """Whether a client reaches its brokers, as librdkafka sees it: its statistics (every ``interval_ms``: any
    broker connection in state ``UP``) and its error callback (``_ALL_BROKERS_DOWN``: none is).  For health
    reports (``/fp/health``, ``forumpulse_kafka_reachable``): the client keeps retrying on its own, this only
    tells whether it is getting anywhere.

    Use: ``conf.update(link.config())`` before the client is built; the callbacks run inside the client's
    ``poll``/``consume`` (a client that is never polled updates nothing, and :meth:`snapshot` says how old
    the last word is).  Thread-safe: the owner's HTTP thread reads what the consumer thread writes."""

    def __init__(self, interval_ms: int = 5000, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.interval_ms = interval_ms
        self.clock = clock  # for the times shown (since, last_error_at)
        self.monotonic = monotonic  # for ages: a wall-clock step must not make the last word look stale
        self._lock = threading.Lock()
        self.reachable: bool | None = None  # None: not known yet (no statistics, no error)
        self.since: float | None = None  # when ``reachable`` took its value
        self.checked_at: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None

    def config(self) -> dict[str, Any]:
        return {"statistics.interval.ms": self.interval_ms, "stats_cb": self.on_stats, "error_cb": self.on_error}

    def _set(self, up: bool, now: float) -> None:
        if self.reachable is not up:
            self.reachable, self.since = up, now
        self.checked_at = self.monotonic()

    def on_stats(self, stats_json: str) -> None:
        try:
            brokers = json.loads(stats_json).get("brokers", {})
        except ValueError:
            return
        states = [b.get("state") for b in brokers.values()
                  if isinstance(b, dict) and b.get("source") not in ("internal", "logical")]
        if states:
            with self._lock:
                self._set("UP" in states, self.clock())

    def on_error(self, err: Any) -> None:
        from confluent_kafka import KafkaError

        now = self.clock()
        with self._lock:
            self.last_error, self.last_error_at = str(err), now
            if err.code() == KafkaError._ALL_BROKERS_DOWN:
                self._set(False, now)

    def stale_after_s(self) -> float:
        """No word from the client for this long: its thread stopped polling (statistics come every interval)."""
        return max(60.0, 6 * self.interval_ms / 1000)

    def snapshot(self) -> dict[str, Any]:
        """``reachable`` (true / false / null = not known yet), ``since`` (ISO time it took that value),
        ``checked_s_ago``, ``stale`` (no statistics for :meth:`stale_after_s`: the client is not being polled,
        so ``reachable`` is old news), ``last_error`` and its ``last_error_at``."""
        def iso(t: float | None) -> str | None:
            return None if t is None else datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")

        with self._lock:
            ago = None if self.checked_at is None else self.monotonic() - self.checked_at
            return {"reachable": self.reachable, "since": iso(self.since),
                    "checked_s_ago": None if ago is None else round(ago, 1),
                    "stale": ago is not None and ago > self.stale_after_s(),
                    "last_error": self.last_error, "last_error_at": iso(self.last_error_at)}

    def gauge_value(self) -> float:
        """1 reachable, 0 not, NaN not known yet (a Prometheus gauge)."""
        return float("nan") if self.reachable is None else float(self.reachable)


def client_config(conf: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``conf`` for a confluent-kafka client on top of :data:`RECONNECT` and the folded logger; ``overrides`` (a
    site's ``kafka.config``) last."""
    return {**RECONNECT, "logger": kafka_logger(), **conf, **(overrides or {})}
