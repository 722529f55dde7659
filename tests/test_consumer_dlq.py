"""The consumer's dead-letter topic with the real Kafka broker and the real engine (chDB):

* every bad envelope and every quarantined line arrives in the DLQ, once, with its original key and value and the
  ``fp-reason`` / ``fp-detail`` / ``fp-source`` headers of schemas/contracts/weblogs.raw.dlq.v1.md;
* a dead letter the broker refuses (here: the DLQ topic does not exist, auto-creation is off) keeps its batch
  uncommitted — counted in ``forumpulse_dead_letter_delivery_failures`` — until the topic exists, then the batch
  is committed; a consumer stopped meanwhile exits promptly and commits nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer
from forumpulse.pipeline.contracts import split_envelope
from forumpulse.pipeline.store import Store
from live_stack import Broker, committed_offsets, kafka_broker, wait_until
from test_live_support import Msg, create_topics, produce, stream

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka"), create_topics=False) as b:
        yield b


def _opts(broker: Broker, topic: str, dlq: str, group: str, **kw: Any) -> ConsumerOptions:
    base: dict[str, Any] = {"bootstrap_servers": broker.bootstrap, "topic": topic, "dead_letter_topic": dlq,
                            "group_id": group, "instance_id": group, "batch_lines": 3000, "max_wait_s": 0.3,
                            "stats_interval_s": 1.0}
    base.update(kw)
    return ConsumerOptions(**base)


def _read_with_headers(bootstrap: str, topic: str) -> list[Any]:
    """Every message of ``topic`` (all partitions, from the start), with headers."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"dlq-read-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: list[Any] = []
    try:
        md = c.list_topics(topic, timeout=15)
        marks = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15) for p in md.topics[topic].partitions}
        c.assign([TopicPartition(topic, p, lo) for p, (lo, _hi) in marks.items()])
        todo = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
        deadline = time.monotonic() + 60
        while todo and time.monotonic() < deadline:
            for m in c.consume(num_messages=1000, timeout=1.0):
                assert m.error() is None, m.error()
                out.append(m)
                if m.offset() + 1 >= todo.get(m.partition(), 0):
                    todo.pop(m.partition(), None)
        assert not todo, f"{topic}: not read to its end: {todo}"
    finally:
        c.close()
    return out


def _committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    return committed_offsets(bootstrap, group, topic, partitions)


def _raw_messages(bootstrap: str, topic: str) -> dict[str, Any]:
    """``{"<topic>/<partition>/<offset>": message}`` of the whole topic."""
    return {f"{m.topic()}/{m.partition()}/{m.offset()}": m for m in _read_with_headers(bootstrap, topic)}


def _headers(m: Any) -> dict[str, bytes]:
    hs = m.headers() or []
    assert len({k for k, _ in hs}) == len(hs), hs
    return dict(hs)


def _extra_bad(n: int) -> list[Msg]:
    """Values that are not v1 envelopes, with and without a key (one empty, one a tombstone)."""
    out = [Msg(f"k{i}".encode(), f"fp2\tnot\tan\tenvelope\t{i}".encode()) for i in range(n)]
    return [*out, Msg(None, b""), Msg(b"tomb", None)]  # type: ignore[arg-type]


def _in_thread(c: LiveConsumer, **kw: Any) -> tuple[threading.Thread, dict[str, Any]]:
    res: dict[str, Any] = {}

    def target() -> None:
        try:
            res["summary"] = c.run(**kw)
        except BaseException as exc:  # reported by the test
            res["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t, res


def test_every_dead_letter_arrives_once_with_its_headers(broker: Broker, store: Store, settings: Settings) -> None:
    topic, dlq = "dlq.raw", "dlq.dlq"
    create_topics(broker.bootstrap, 2, topic, dlq)
    msgs = list(stream(9000, seed=31)) + _extra_bad(20) + list(stream(3000, seed=32))
    produce(broker.bootstrap, topic, msgs)
    c = LiveConsumer(settings, store, _opts(broker, topic, dlq, "g-dlq"))
    summary = c.run(idle_exit_s=1.5)
    assert summary["lag"] == 0 and summary["dead_letter_failures"] == 0

    raw = _raw_messages(broker.bootstrap, topic)
    bad = {src for src, m in raw.items() if m.value() is None or split_envelope(m.value()) is None}
    assert len(bad) == 22 + 1  # _extra_bad + stream(9000)'s one non-envelope (every 5000th)
    quarantined = {(f"{ref.removeprefix('kafka:')}/{off}", reason) for ref, off, reason in store.query_rows(
        "SELECT source_ref, line_no, reason FROM quarantine")}
    assert quarantined and len(quarantined) == store.query_rows("SELECT count() FROM quarantine")[0][0]
    expected = {(src, "bad_envelope") for src in bad} | quarantined

    got = _read_with_headers(broker.bootstrap, dlq)
    seen = []
    for m in got:
        h = _headers(m)
        assert set(h) == {"fp-reason", "fp-detail", "fp-source"}, h
        src, reason = h["fp-source"].decode(), h["fp-reason"].decode()
        seen.append((src, reason))
        orig = raw[src]  # fp-source names the original message ...
        assert (m.key(), m.value()) == (orig.key(), orig.value())  # ... and key and value are byte for byte its own
        assert h["fp-detail"] and len(h["fp-detail"]) <= 1000
    assert len(seen) == len(set(seen)), "a dead letter arrived twice"
    assert set(seen) == expected
    assert summary["dead_lettered"] == len(expected)


def _failures(c: LiveConsumer) -> float:
    """forumpulse_dead_letter_delivery_failures, summed over its ``error`` label."""
    return sum(s.value for metric in c.metrics.registry.collect()
               if metric.name == "forumpulse_dead_letter_delivery_failures"
               for s in metric.samples if s.name.endswith("_total"))


def _attempts(caplog: pytest.LogCaptureFixture, dlq: str, level: int = logging.WARNING) -> int:
    """Failed delivery attempts logged for ``dlq`` at ``level`` or above."""
    return sum(f"not delivered to {dlq} " in r.getMessage() for r in list(caplog.records) if r.levelno >= level)


def _waiting(c: LiveConsumer) -> float | None:
    return c.metrics.registry.get_sample_value("forumpulse_dead_letter_waiting")


def test_batch_stays_uncommitted_until_the_dead_letter_topic_exists(broker: Broker, store: Store, settings: Settings,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="forumpulse.consumer")
    topic, dlq = "dlqlate.raw", "dlqlate.dlq"
    create_topics(broker.bootstrap, 1, topic, "dlqlate.unused")
    msgs = list(stream(1500, seed=41)) + _extra_bad(3) + list(stream(500, seed=42))
    produce(broker.bootstrap, topic, msgs)
    fast = {"backoff_initial_s": 0.1, "backoff_max_s": 0.5, "dead_letter_error_after": 3,
            # librdkafka gives up on a topic the broker does not know after this (default 30 s)
            "dead_letter_config": {"topic.metadata.propagation.max.ms": 500}}

    # 1. stopping while the DLQ refuses: run() returns promptly, nothing committed
    c0 = LiveConsumer(settings, store, _opts(broker, topic, "dlqlate.never", "g-dlq-stop", **fast))
    t0, res0 = _in_thread(c0)
    wait_until(lambda: _attempts(caplog, "dlqlate.never") >= 2 or not t0.is_alive(), 60,
               what="failed dead-letter deliveries (stop case)")
    stopped = time.monotonic()
    c0.stop()
    t0.join(30)
    assert not t0.is_alive() and "error" not in res0, res0
    assert time.monotonic() - stopped < 10
    assert _committed(broker.bootstrap, "g-dlq-stop", topic, 1) == [-1001]
    assert res0["summary"]["dead_letter_failures"] >= 2

    # 2. the DLQ topic is missing, then created: the batch is committed only after its dead letters arrived
    c = LiveConsumer(settings, store, _opts(broker, topic, dlq, "g-dlq-late", **fast))
    t, res = _in_thread(c)
    try:
        # retried past dead_letter_error_after: an error is logged, the failures are counted, loading is stalled
        wait_until(lambda: _attempts(caplog, dlq, logging.ERROR) >= 1 or not t.is_alive(), 60,
                   what="failed dead-letter deliveries")
        assert t.is_alive(), res
        assert _attempts(caplog, dlq) >= 3 and _failures(c) >= 3
        assert _waiting(c) == 1
        assert _committed(broker.bootstrap, "g-dlq-late", topic, 1) == [-1001]
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic(dlq, 1, 1)])[dlq].result(30)
        wait_until(lambda: _committed(broker.bootstrap, "g-dlq-late", topic, 1) == [len(msgs)], 60,
                   what="the commit after the DLQ topic was created")
    finally:
        c.stop()
        t.join(60)
    assert not t.is_alive() and "error" not in res, res
    assert _waiting(c) == 0
    raw = _raw_messages(broker.bootstrap, topic)
    bad = {src for src, m in raw.items() if m.value() is None or split_envelope(m.value()) is None}
    assert len(bad) == 5
    got = [_headers(m) for m in _read_with_headers(broker.bootstrap, dlq)]
    arrived = {h["fp-source"].decode() for h in got if h["fp-reason"] == b"bad_envelope"}
    assert arrived == bad
    assert res["summary"]["dead_letter_failures"] >= 3
