"""In-process consumer tests with the real Kafka broker and the real engine (chDB):

* a crash between the ``requests`` insert and the commit, then a restart with a *different* batch size: the
  recorded ranges make the replay cut identical batches, so every table is exact;
* liveness: a source with old lines but fresh heartbeats is ``silent``, one with neither is ``dead``, one with
  fresh lines is ``live`` (Kafka message timestamps drive it);
* the envelope contract (split/build round trip, refusals).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer, source_status
from forumpulse.pipeline.contracts import (
    build_envelope,
    build_heartbeat,
    heartbeat_time_ms,
    split_envelope,
)
from forumpulse.pipeline.store import Store
from hypothesis import given
from hypothesis import strategies as st
from live_stack import Broker, kafka_broker
from test_live_support import (
    assert_same_as_reference,
    create_topics,
    make_line,
    produce,
    reference_diff,
    stream,
)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka"), create_topics=False) as b:
        yield b


class Crash(BaseException):
    """Simulates the process dying (not an Exception: nothing in the consumer catches it)."""


class CrashAfterRequests:
    """Store proxy: the ``crash_at``-th insert into ``requests`` succeeds, then the process 'dies'."""

    def __init__(self, inner: Store, crash_at: int) -> None:
        self.inner = inner
        self.crash_at = crash_at
        self.n = 0
        self.url = inner.url
        self.database = inner.database

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def insert(self, table: str, data: Any, dedup_token: str | None = None) -> None:
        self.inner.insert(table, data, dedup_token=dedup_token)
        if table == "requests":
            self.n += 1
            if self.n == self.crash_at:
                raise Crash()


def _opts(broker: Broker, topic: str, batch: int, instance: str) -> ConsumerOptions:
    return ConsumerOptions(bootstrap_servers=broker.bootstrap, topic=topic, dead_letter_topic=None,
                           group_id=f"g-{topic}", instance_id=instance, batch_lines=batch, max_wait_s=0.3,
                           stats_interval_s=1.0)


def test_crash_after_insert_before_commit_replays_identically(broker: Broker, store: Store, settings: Settings,
                                                              chdb_path: Path) -> None:
    topic = "replay.raw"
    create_topics(broker.bootstrap, 2, topic, "replay.dlq")
    msgs = list(stream(30_000, seed=3))
    produce(broker.bootstrap, topic, msgs)
    crashing = CrashAfterRequests(store, crash_at=3)
    c1 = LiveConsumer(settings, crashing, _opts(broker, topic, 4000, "r1"))  # type: ignore[arg-type]
    with pytest.raises(Crash):
        c1.run(idle_exit_s=2)
    loaded_before = store.query_rows("SELECT count() FROM requests")[0][0]
    assert loaded_before > 0
    # restart with another batch size: boundaries must come from the recorded ranges, not from the setting
    c2 = LiveConsumer(settings, store, _opts(broker, topic, 2500, "r1"))
    summary = c2.run(idle_exit_s=2)
    assert summary["replayed_batches"] >= 1
    diff = reference_diff(store, chdb_path, settings, msgs)
    assert_same_as_reference(diff)
    assert diff["counts"]["requests"] > 20_000
    stats = store.query_rows("SELECT sum(lines_in), count() FROM pipeline_stats WHERE component = 'consumer'")[0]
    assert stats[0] > 0 and stats[1] >= 1


def test_silent_source_with_heartbeats_vs_dead_source(broker: Broker, store: Store, settings: Settings) -> None:
    import random

    from confluent_kafka import Producer

    topic = "live.raw"
    create_topics(broker.bootstrap, 2, topic, "live.dlq")
    rng = random.Random(5)
    now_ms = int(time.time() * 1000)
    hour = 3_600_000
    p = Producer({"bootstrap.servers": broker.bootstrap})
    sources = {"quiet": "web-quiet", "gone": "web-gone", "busy": "web-busy"}
    for i in range(30):
        for name, line_age in (("quiet", hour), ("gone", hour), ("busy", 5_000)):
            line = make_line(rng, now_ms / 1000 - 3600, "combined")
            p.produce(topic, build_envelope("forum", sources[name], "access.log", "combined", line),
                      timestamp=now_ms - line_age + i)
    p.produce(topic, build_heartbeat("forum", "web-quiet", "access.log", f"ts={now_ms // 1000 - 20} size=1"),
              timestamp=now_ms - 20_000)
    # made an hour ago, delivered late (a Kafka outage): its own ts counts, not the arrival time
    p.produce(topic, build_heartbeat("forum", "web-gone", "access.log", f"ts={now_ms // 1000 - 3600}"),
              timestamp=now_ms - 1000)
    assert p.flush(30) == 0
    c = LiveConsumer(settings, store, _opts(broker, topic, 1000, "live1"))
    summary = c.run(idle_exit_s=1.5)
    assert summary["heartbeats"] == 2 and summary["loaded"] == 90
    states = {s.origin_host: s.state for s in source_status(store, now=now_ms / 1000, quiet_after_s=300,
                                                             heartbeat_timeout_s=120)}
    assert states == {"web-quiet": "silent", "web-gone": "dead", "web-busy": "live"}


# ------------------------------------------------------------------------------------------------ envelope

_field = st.text(st.characters(blacklist_characters="\t\n\r", blacklist_categories=("Cs",)), max_size=20)


@given(_field, _field, _field, _field.filter(lambda f: f not in ("", "-")),
       st.binary(max_size=200).filter(lambda b: b"\n" not in b))
def test_envelope_round_trip(site: str, host: str, file: str, fmt: str, line: bytes) -> None:
    e = split_envelope(build_envelope(site, host, file, fmt, line))
    assert e is not None
    assert (e.site, e.origin_host, e.origin_file, e.format, e.line) == (site, host, file, fmt, line)


def test_envelope_refusals_and_non_envelopes() -> None:
    with pytest.raises(ValueError):
        build_envelope("a\tb", "h", "f", "combined", "x")
    with pytest.raises(ValueError):
        build_envelope("s", "h", "f", "combined", "two\nlines")
    assert split_envelope(b"fp2\ts\th\tf\tcombined\tline") is None
    assert split_envelope(b"fp1\ts\th\tf") is None
    e = split_envelope(b"fp1\ts\th\tf\t-\ta\tb\r\n")
    assert e is not None and e.format == "auto" and e.line == b"a\tb"
    hb = split_envelope(build_heartbeat("s", "h"))
    assert hb is not None and hb.is_heartbeat and hb.origin_file == ""
    assert heartbeat_time_ms(b"ts=1697000000 size=5 inode=7", 1) == 1_697_000_000_000
    assert heartbeat_time_ms(b"size=5", 42) == 42 and heartbeat_time_ms(b"ts=x", 42) == 42
