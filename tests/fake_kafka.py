"""A confluent-kafka Producer stand-in for unit tests of delivery confirmation (no broker): the real broker's
behaviour is covered by the live tests (test_live_detect.py); this one lets a test choose what a flush
reports."""

from __future__ import annotations

from typing import Any


class FakeKafka:
    """A confluent-kafka Producer stand-in: messages wait in a queue; ``up`` decides whether a flush delivers
    them (delivery callback without error) or leaves them queued (a broker away: no report, flush returns the
    count left).  ``fail`` delivers them with an error report instead."""

    def __init__(self) -> None:
        self.up = False
        self.fail: str | None = None
        self.queue: list[tuple[str, bytes, bytes, Any]] = []
        self.delivered: list[tuple[bytes, bytes]] = []

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None) -> None:
        self.queue.append((topic, key, value, on_delivery))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        if self.fail is not None:
            for _, _, _, cb in self.queue:
                cb(self.fail, None)
            self.queue = []
        elif self.up:
            for _, key, value, cb in self.queue:
                self.delivered.append((key, value))
                cb(None, None)
            self.queue = []
        return len(self.queue)
