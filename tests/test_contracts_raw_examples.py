"""Every ``weblogs.raw`` v1 example payload (schemas/contracts/weblogs.raw.v1.example and
weblogs.raw.v1.heartbeat.example) through the consumer's own batch processing, and what liveness makes of them.

* one batch of all example values goes through ``LiveConsumer._prepare`` (the envelope split and the line
  processor the live consumer runs, no Kafka): no value is dead-lettered, every data line is loaded (none
  quarantined), every heartbeat is a heartbeat of its (site, origin_host, origin_file) at its ``ts=``;
* the sender heartbeat envelopes the contract documents (a forwarded syslog-ng MARK: site ``*``; a
  ``<site>/-heartbeat-`` tag: that site; both with an empty ``origin_file``) are host-level heartbeats: after the
  consumer records the batch's liveness, ``source_status`` lists no listener or host-heartbeat row as a source, the
  syslog sender whose host forwards MARKs is ``silent``, the raw TCP sender (no heartbeats possible) is ``quiet``
  behind its listener, and the ops dashboard's liveness panels say the same.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer, listener_status, source_status
from forumpulse.pipeline.contracts import HEARTBEAT_FORMAT, heartbeat_time_ms, split_envelope
from forumpulse.pipeline.store import Store
from test_dashboards_liveness import assert_listeners_agree, assert_sources_agree

CONTRACTS = Path(__file__).resolve().parents[1] / "schemas" / "contracts"
DATA = (CONTRACTS / "weblogs.raw.v1.example").read_bytes().splitlines()
HEARTBEATS = (CONTRACTS / "weblogs.raw.v1.heartbeat.example").read_bytes().splitlines()
LINES_MS = 1_696_942_000_000  # Kafka timestamp of the data lines: an hour before the heartbeats


class Msg:
    """The parts of a confluent_kafka Message the consumer's batch preparation reads."""

    def __init__(self, value: bytes, offset: int, ts_ms: int) -> None:
        self._v, self._o, self._t = value, offset, ts_ms

    def value(self) -> bytes:
        return self._v

    def offset(self) -> int:
        return self._o

    def timestamp(self) -> tuple[int, int]:
        return 1, self._t


def _messages() -> list[Msg]:
    values = DATA + HEARTBEATS
    # heartbeats arrive a little after they were made (their ts= counts, not the Kafka timestamp)
    return [Msg(v, i, LINES_MS if i < len(DATA) else 1_696_946_200_000) for i, v in enumerate(values)]


def test_sender_heartbeat_examples_are_documented_envelopes() -> None:
    senders = [e for e in map(split_envelope, HEARTBEATS) if e is not None and e.origin_file == ""]
    assert {e.site for e in senders} >= {"*"} and any(e.site not in ("*", "") for e in senders), \
        "examples of both sender heartbeats: a forwarded MARK (site *) and a <site>/-heartbeat- tag"
    for e in senders:
        assert e.format == HEARTBEAT_FORMAT and e.origin_host
        kv = dict(item.split("=") for item in e.line.decode().split())
        assert set(kv) == {"ts", "sent"}, "the collector writes ts=<received> sent=<sender's time>"
    doc = (CONTRACTS / "weblogs.raw.v1.md").read_text()
    for phrase in ("fp1 TAB * TAB web7 TAB  TAB -heartbeat- TAB ts=", "fp1 TAB forum.example.org TAB web8 TAB  TAB "
                   "-heartbeat- TAB ts=", "`-- MARK --`", "`<site>/-heartbeat-`", "site `*`"):
        assert phrase in doc, phrase


def test_every_example_through_the_consumer(store: Store, settings: Settings) -> None:
    c = LiveConsumer(settings, store, ConsumerOptions(bootstrap_servers="unused:9", topic="weblogs.raw",
                                                      dead_letter_topic=None, group_id="g-examples"))
    msgs = _messages()
    b = c._prepare(("weblogs.raw", 0), msgs, False, time.perf_counter())  # type: ignore[arg-type]
    assert b.bad_n == 0 and not b.dlq, "every example is a v1 envelope"
    assert (b.read, b.loaded, b.quarantined) == (len(DATA), len(DATA), 0), b.by_reason
    assert b.hb_n == len(HEARTBEATS)
    want_hb: dict[tuple[bytes, bytes, bytes], int] = {}
    for v in HEARTBEATS:
        _fp1, site, host, file, _fmt, line = v.split(b"\t", 5)
        want_hb[(site, host, file)] = max(want_hb.get((site, host, file), 0), heartbeat_time_ms(line, 0))
    assert b.heartbeats == want_hb
    assert (b"*", b"web2", b"") in b.heartbeats and (b"forum.example.org", b"web3", b"") in b.heartbeats
    assert c._store_batch(b) is None
    # what the consumer does with a finished batch's side channel: liveness rows
    for src, ts in b.line_ts.items():
        c._touch_liveness(src, line_ms=ts, n=b.line_n[src])
    for src, ts in b.heartbeats.items():
        c._touch_liveness(src, hb_ms=ts)
    c._write_liveness()

    now = max(want_hb.values()) // 1000 + 30
    states = {(s.site, s.origin_host, s.origin_file): s for s in source_status(store, now=float(now))}
    assert {k: s.state for k, s in states.items()} == {
        ("forum.example.org", "web1", "/var/log/apache2/vhosts/forum.example.org.access.log"): "silent",
        ("proxy", "cache1", "/var/log/squid/access.log"): "silent",
        ("board.example.net", "web2", "board.example.net/combined"): "silent",  # web2 forwards MARKs (site *)
        ("default", "10.0.0.5", "tcp:5140"): "quiet",  # raw TCP: no heartbeats of its own, its listener is up
    }, "listener and host heartbeat rows are not sources"
    assert states[("default", "10.0.0.5", "tcp:5140")].listener == "web1 tcp:5140"
    hb_web2 = states[("board.example.net", "web2", "board.example.net/combined")].last_heartbeat_s_ago
    assert hb_web2 is not None and abs(hb_web2 - (now - 1_696_946_140)) < 1e-6
    assert {(x.site, x.collector, x.listener): (x.state, x.sources) for x in listener_status(store, now=float(now))} \
        == {("default", "web1", "tcp:5140"): ("up", 1), ("*", "web1", "syslog:5514"): ("up", 0)}
    # the ops dashboard's panels agree on the same rows
    rows: list[dict[str, Any]] = []
    for site in ("forum.example.org", "proxy", "board.example.net", "default"):
        rows += assert_sources_agree(store, site, now)
        assert_listeners_agree(store, site, now)
    assert len(rows) == len(states)
