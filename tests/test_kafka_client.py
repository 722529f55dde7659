"""Shared librdkafka client settings: reconnect back-off and folded log lines (pipeline/kafka_client.py)."""

from __future__ import annotations

import logging
import socket
import time

from forumpulse.pipeline import kafka_client
from forumpulse.pipeline.kafka_client import RECONNECT, RepeatFilter, client_config


def _record(msg: str, level: int = logging.ERROR, name: str = "forumpulse.kafka", args: tuple = ()) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_repeats_are_folded_and_counted_then_reported():
    now = [0.0]
    f = RepeatFilter(every_s=60.0, clock=lambda: now[0])
    first = _record("%s [%s] %s", args=("FAIL", "rdkafka#consumer-1", "Connect failed (after 0ms in state CONNECT)"))
    assert f.filter(first) and "more like this" not in first.getMessage()
    passed = []
    for i in range(1, 100):
        now[0] = i * 0.5
        r = _record(f"FAIL [rdkafka#consumer-1] Connect failed (after {i % 3}ms in state CONNECT)")
        passed.append(f.filter(r))
    assert not any(passed)  # numbers differ, the kind is the same
    now[0] = 61.0
    r = _record("FAIL [rdkafka#consumer-1] Connect failed (after 7ms in state CONNECT)")
    assert f.filter(r)
    assert r.getMessage().endswith("(99 more like this in the last 61 s)")
    now[0] = 62.0
    assert not f.filter(_record("FAIL [rdkafka#consumer-1] Connect failed (after 1ms in state CONNECT)"))


def test_other_kinds_pass_on_their_own():
    now = [0.0]
    f = RepeatFilter(every_s=60.0, clock=lambda: now[0])
    assert f.filter(_record("Connect to ipv4#127.0.0.1:9092 failed: Connection refused"))
    assert f.filter(_record("Connect to ipv4#127.0.0.1:9092 failed: Connection refused", level=logging.WARNING))
    assert f.filter(_record("Connect to ipv4#127.0.0.1:9092 failed: Connection refused", name="other"))
    assert f.filter(_record("GroupCoordinator: Broker transport failure"))
    assert not f.filter(_record("Connect to ipv4#127.0.0.1:9093 failed: Connection refused"))


def test_kinds_are_bounded():
    f = RepeatFilter(every_s=60.0, clock=lambda: 0.0, max_kinds=10)
    for i in range(50):
        assert f.filter(_record(f"message kind {'x' * i}"))
    assert len(f._kinds) == 10


def test_client_config_defaults_and_precedence():
    conf = client_config({"bootstrap.servers": "b:1", "linger.ms": 20})
    assert conf["reconnect.backoff.ms"] == RECONNECT["reconnect.backoff.ms"] == 1000
    assert conf["reconnect.backoff.max.ms"] == 10000
    assert conf["logger"] is logging.getLogger(kafka_client.LOGGER_NAME)
    assert sum(isinstance(f, RepeatFilter) for f in conf["logger"].filters) == 1
    client_config({})  # the filter is attached once
    assert sum(isinstance(f, RepeatFilter) for f in conf["logger"].filters) == 1
    mine = client_config({"reconnect.backoff.ms": 200, "linger.ms": 20}, {"linger.ms": 5})
    assert mine["reconnect.backoff.ms"] == 200 and mine["linger.ms"] == 5  # caller, then site overrides win


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def _log_lines_while_down(conf: dict, seconds: float) -> int:
    from confluent_kafka import Consumer

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    lg = conf["logger"]
    h = Keep()
    lg.addHandler(h)
    try:
        c = Consumer(conf)
        c.subscribe(["nowhere"])
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            c.poll(0.2)
        c.close()
    finally:
        lg.removeHandler(h)
    return sum("Connection refused" in r.getMessage() for r in seen)


def test_a_broker_that_is_down_is_logged_once_not_twenty_times_a_second():
    """Real librdkafka against a closed port for 4 s: with its own defaults (a plain logger) it logs every
    attempt; through client_config the lines are few and folded."""
    port = _closed_port()
    plain = logging.getLogger("test.kafka.plain")
    plain.propagate = False
    base = {"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "down"}
    flood = _log_lines_while_down({**base, "logger": plain}, 4.0)
    logging.getLogger(kafka_client.LOGGER_NAME).filters.clear()  # a fresh fold window for this test
    ours = _log_lines_while_down(client_config(base), 4.0)
    assert flood >= 30, flood  # librdkafka's defaults: ~20 per second
    assert 1 <= ours <= 2, ours  # the first, then folded (the next one would pass after 60 s)
