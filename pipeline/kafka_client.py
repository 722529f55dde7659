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

import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
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


def client_config(conf: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``conf`` for a confluent-kafka client on top of :data:`RECONNECT` and the folded logger; ``overrides`` (a
    site's ``kafka.config``) last."""
    return {**RECONNECT, "logger": kafka_logger(), **conf, **(overrides or {})}
