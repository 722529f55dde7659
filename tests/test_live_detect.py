"""Live detectors in the owner process against the real stack (real Kafka broker, real engine in chDB):

* a flood written as lines into Kafka ``weblogs.raw`` makes the owner (``--dos``, both line sources: the DoS feed
  group and the loader hook) write a ban row, publish it on ``weblogs.decisions`` (read back), and serve it on
  the CrowdSec-compatible decision stream over HTTP; background clients are not banned; ``POST /fp/unban``
  lifts it everywhere; ``unban_command`` / ``decisions_command`` work through the owner and without one;
* a restarted detector restores the bans still in force from the ``decisions`` table;
* the traffic service writes detections for a fixture (a site whose answers turn into 5xx) to the table and
  to ``weblogs.events``.
"""

from __future__ import annotations

import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fake_kafka import FakeKafka
from forumpulse.detectors.dos import Decision, StoreSink
from forumpulse.detectors.dos_cli import decisions_command, unban_command, unban_direct
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.contracts import build_envelope
from forumpulse.pipeline.live_detect import (
    LiveDos,
    LiveHandles,
    TrafficService,
    active_from_store,
    decision_view,
    live_services,
    normalize_value,
    with_published,
)
from forumpulse.pipeline.owner import Owner
from forumpulse.pipeline.process import Processor, SourceContext
from forumpulse.pipeline.store import Store, migrate, open_store
from live_stack import Broker, free_ports, kafka_broker, wait_until
from table_rows import forum_requests
from test_live_support import Msg, produce

pytestmark = [pytest.mark.kafka]

NO_TTL = {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0}
API_KEY = "test-bouncer-key-7f3a"
ATTACKER = "198.51.100.7"
_MON = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def clf(t: float) -> str:
    tm = time.gmtime(t)
    return f"{tm.tm_mday:02d}/{_MON[tm.tm_mon - 1]}/{tm.tm_year}:{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000"


def line(ip: str, t: float, path: str, ua: str = "Mozilla/5.0 (X11; Linux x86_64) Firefox/121.0") -> str:
    return f'{ip} - - [{clf(t)}] "GET {path} HTTP/1.1" 200 5120 "https://forum.example/" "{ua}"'


def flood_and_background(t0: float, seed: int) -> tuple[list[Msg], set[str]]:
    """A 25 req/s flood from ATTACKER for 3 s inside 20 s of background traffic (200 clients, 15 lines/s)."""
    rng = random.Random(seed)
    rows: list[tuple[float, str, str]] = []
    background = {f"203.0.113.{i % 250 + 1}" if i < 250 else f"192.0.2.{i % 250 + 1}" for i in range(200)}
    bg = sorted(background)
    for i in range(300):
        rows.append((t0 + i / 15, rng.choice(bg), f"/showthread.php?t={rng.randrange(1, 400)}"))
    for i in range(75):
        rows.append((t0 + 8 + i / 25, ATTACKER, "/forumdisplay.php?f=3"))
    rows.sort()
    msgs = [Msg(ip.encode(), build_envelope("forum", "web1", "/var/log/apache2/access.log", "combined",
                                            line(ip, t, path))) for t, ip, path in rows]
    return msgs, background


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as b:
        yield b


def _settings(base: Settings, broker: Broker, tag: str, source: str) -> Settings:
    s = base.model_copy(deep=True)
    s.kafka.bootstrap_servers = broker.bootstrap
    s.kafka.raw_topic = broker.create_topic(f"raw-{tag}", 4)
    s.kafka.dead_letter_topic = broker.create_topic(f"dlq-{tag}", 1)
    s.kafka.decisions_topic = broker.create_topic(f"decisions-{tag}", 1)
    s.kafka.events_topic = broker.create_topic(f"events-{tag}", 1)
    s.kafka.group_id = f"loader-{tag}"
    s.detectors = {"dos": {"crawlers": {"verify": "ua"}},
                   "live": {**base.detectors.get("live", {}), "dos_source": source, "feed_group": f"dos-{tag}",
                            "feed_start": "earliest"}}
    s.actions = {"decision_api": {"enabled": True, "listen": "127.0.0.1:0", "api_key": API_KEY}}
    return s


def _http(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text -> {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(x.name, tuple(sorted(x.labels.items()))): x.value
            for fam in text_string_to_metric_families(text) for x in fam.samples}


def _decisions(store: Store) -> list[tuple[str, str, str]]:
    return [(str(a), str(v), str(r)) for a, v, r in
            store.query_rows("SELECT action, value, reason FROM decisions ORDER BY created_at")]


@pytest.mark.parametrize("source", ["feed", "loader"])
def test_flood_through_kafka_is_banned_published_and_served(
        broker: Broker, chdb_path: Path, settings: Settings, source: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    s = _settings(settings, broker, f"flood-{source}", source)
    handles = LiveHandles()
    owner = Owner(s, store_url=f"chdb:{chdb_path}?database=live_{source}", port=0, consume=source == "loader",
                  services=live_services(dos=True, handles=handles))
    owner.start()
    try:
        assert handles.dos is not None and handles.api is not None
        assert (handles.feed is not None) == (source == "feed")
        store = owner.store
        assert store is not None
        msgs, background = flood_and_background(1_760_000_000.0, seed=3)
        produce(broker.bootstrap, s.kafka.raw_topic, msgs)

        wait_until(lambda: any(a == "ban" for a, _, _ in _decisions(store)), 90, what="a ban row")
        bans = [(v, r) for a, v, r in _decisions(store) if a == "ban"]
        assert bans == [(ATTACKER, "client_flood")], bans
        assert not background & {v for v, _ in bans}
        if source == "loader":  # the loader stored the lines too
            wait_until(lambda: store.query_rows("SELECT count() FROM requests")[0][0] == len(msgs), 60,
                       what="all lines loaded")
            # its Kafka client's statistics say a broker is up (every 5 s)
            wait_until(lambda: _http(f"http://127.0.0.1:{owner.port}/fp/health")[1]["kafka"]["reachable"] is True,
                       30, what="/fp/health kafka reachable")
            assert _http(f"http://127.0.0.1:{owner.port}/fp/health")[1]["status"] == "ok"

        published = broker.read_all(s.kafka.decisions_topic, expected=1)
        payloads = [json.loads(m.value) for m in published]
        assert [(p["action"], p["value"], p["reason"]) for p in payloads] == [("ban", ATTACKER, "client_flood")]
        assert published[0].key == ATTACKER.encode()

        api = f"http://127.0.0.1:{handles.api.port}"
        code, body = _http(api + "/v1/decisions/stream?startup=true", headers={"X-Api-Key": API_KEY})
        assert code == 200 and [d["value"] for d in body["new"]] == [ATTACKER] and body["deleted"] is None
        assert body["new"][0]["scope"] == "Ip" and body["new"][0]["type"] == "ban"
        assert _http(api + "/v1/decisions/stream?startup=true", headers={"X-Api-Key": "wrong"})[0] == 403

        code, active = _http(f"http://127.0.0.1:{owner.port}/fp/decisions")
        assert code == 200 and [d["value"] for d in active] == [ATTACKER] and active[0]["remaining_s"] > 0
        # the topic confirmed it (a firewall host reading weblogs.decisions has it)
        wait_until(lambda: _http(f"http://127.0.0.1:{owner.port}/fp/decisions")[1][0]["published"] is True, 30,
                   what="published: true")
        capsys.readouterr()
        decisions_command(config=None, owner=f"http://127.0.0.1:{owner.port}", store=None, password_env=None)
        listed = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        assert [d["value"] for d in listed] == [ATTACKER]

        # manual unban through the owner (the CLI function): table, Kafka, registry
        unban_command(ATTACKER, config=None, owner=f"http://127.0.0.1:{owner.port}", store=None, password_env=None,
                      reason="manual")
        out = json.loads(capsys.readouterr().out)
        assert out["via"] == "owner" and out["held"] is True and out["unbanned"] == ATTACKER
        code, body = _http(api + "/v1/decisions/stream?startup=false", headers={"X-Api-Key": API_KEY})
        assert body["new"] is None and [d["value"] for d in body["deleted"]] == [ATTACKER]
        assert [a for a, v, _ in _decisions(store) if v == ATTACKER] == ["ban", "unban"]
        assert active_from_store(store) == []
        assert [json.loads(m.value)["action"] for m in broker.read_all(s.kafka.decisions_topic, expected=2)] == \
            ["ban", "unban"]
        assert _http(f"http://127.0.0.1:{owner.port}/fp/unban?value=not-an-ip", method="POST")[0] == 400
        # asked with GET: told to use POST (it answered "no handler for /fp/unban", 404; user trial 37)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{owner.port}/fp/unban?value={ATTACKER}", timeout=30)
            raise AssertionError("GET /fp/unban answered 2xx")
        except urllib.error.HTTPError as exc:
            assert exc.code == 405 and exc.headers["Allow"] == "POST", exc.headers
            assert b"/fp/unban takes POST, not GET" in exc.read()

        # the owner's /metrics says what the live detector judged and decided
        with urllib.request.urlopen(f"http://127.0.0.1:{owner.port}/metrics", timeout=30) as r:
            m = _samples(r.read().decode())
        ban = (("action", "ban"), ("mode", "enforce"), ("reason", "client_flood"), ("scope", "ip"))
        unban = (("action", "unban"), ("mode", "enforce"), ("reason", "manual"), ("scope", "ip"))
        assert m[("forumpulse_dos_decisions_total", ban)] == 1 and m[("forumpulse_dos_decisions_total", unban)] == 1
        assert m[("forumpulse_dos_lines_total", ())] == handles.dos.detector.stats["lines"] > 0
        assert m[("forumpulse_dos_batches_total", ())] == handles.dos.batches >= 1
        assert m[("forumpulse_dos_active_bans", ())] == 0
        assert m[("forumpulse_dos_refused_total", (("reason", "loopback"),))] == 0
        assert m[("forumpulse_dos_action_errors_total", ())] == 0
        assert (("forumpulse_dos_feed_errors_total", ()) in m) == (source == "feed")
        assert m.get(("forumpulse_dos_feed_replayed_total", ()), 0) == 0
        # every decision reached the table and was confirmed by Kafka: nothing waits to be emitted again
        for sink in ("store", "kafka"):
            assert m[("forumpulse_dos_sink_retrying", (("sink", sink),))] == 0, m
            assert m[("forumpulse_dos_sink_errors_total", (("sink", sink),))] == 0, m
        assert ("forumpulse_lines_loaded_total", ()) in m  # the owner's own metrics are still served
    finally:
        owner.shutdown()


def test_dos_feed_restarted_does_not_judge_a_line_twice(broker: Broker, settings: Settings) -> None:
    """The owner restarts a failed feed with the same detector; it re-reads from the last auto-commit.  Lines its
    hook already had must not reach the detector again (a client just under a threshold would be banned by its
    own replayed lines); new lines still do."""
    import threading

    from confluent_kafka import Consumer, TopicPartition
    from forumpulse.pipeline.live_detect import DosFeed

    s = _settings(settings, broker, "feed-replay", "feed")
    msgs, _ = flood_and_background(1_760_000_000.0, seed=5)
    produce(broker.bootstrap, s.kafka.raw_topic, msgs)
    judged: list[int] = []
    feed = DosFeed(s, lambda stream, info: judged.append(stream.num_rows), threading.Event())

    def run_until(done: Any, what: str) -> None:
        feed.stop = threading.Event()
        t = threading.Thread(target=feed.run, daemon=True)
        t.start()
        try:
            wait_until(done, 60, what=what)
        finally:
            feed.stop.set()
            t.join(30)
        assert not t.is_alive()

    run_until(lambda: sum(judged) == len(msgs), "every line judged once")
    # as after a crash before the commit: the group's offsets back at the start
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": s.detectors["live"]["feed_group"]})
    c.commit(offsets=[TopicPartition(s.kafka.raw_topic, p, 0) for p in range(4)], asynchronous=False)
    c.close()
    # every replayed message either skipped or judged again: only the first is right
    run_until(lambda: feed.replayed + sum(judged) == 2 * len(msgs), "the replay read")
    assert (sum(judged), feed.replayed, feed.errors) == (len(msgs), len(msgs), 0)
    more, _ = flood_and_background(1_760_000_100.0, seed=6)
    produce(broker.bootstrap, s.kafka.raw_topic, more[:40])
    run_until(lambda: sum(judged) == len(msgs) + 40, "new lines judged")
    assert feed.replayed == len(msgs)


class _FakeMsg:
    def __init__(self, off: int) -> None:
        self.off = off

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "weblogs.raw"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.off

    def value(self) -> bytes:
        return b"x"


def test_dos_feed_tells_a_replay_from_a_log_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offsets below those already judged are a replay only right after an assignment (restart, rebalance); once
    new messages came, offsets going back mean the log was reset while assigned (librdkafka's offset reset after
    a truncation, no reassignment): those are new lines.  A fake consumer stands in for the broker, which cannot
    be made to reset a partition on cue."""
    import threading
    from types import SimpleNamespace

    import confluent_kafka
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import DosFeed

    runs: list[list[list[int]]] = []  # per run: the batches consume() returns after the assignment

    class Consumer:
        def __init__(self, cfg: dict[str, Any]) -> None:
            self.batches = runs.pop(0)

        def subscribe(self, topics: list[str], on_assign: Any) -> None:
            self.on_assign, self.assigned = on_assign, False

        def list_topics(self, topic: str, timeout: float) -> Any:
            raise RuntimeError("no metadata here")

        def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
            return 0, 10_000

        def consume(self, num_messages: int, timeout: float) -> list[_FakeMsg]:
            if not self.assigned:
                self.assigned = True
                self.on_assign(self, [SimpleNamespace(topic="weblogs.raw", partition=0)])
            if self.batches:
                return [_FakeMsg(o) for o in self.batches.pop(0)]
            feed.stop.set()
            return []

        def close(self) -> None:
            pass

    monkeypatch.setattr(confluent_kafka, "Consumer", Consumer)
    judged: list[int] = []
    feed = DosFeed(load_settings(), lambda st, info: None, threading.Event(), bootstrap_servers="x",
                   topic="weblogs.raw")
    monkeypatch.setattr(feed, "stream_of", lambda msgs: judged.extend(m.offset() for m in msgs))
    runs.append([list(range(100)), list(range(100, 120)), list(range(30))])  # then the log reset to 0
    feed.run()
    assert judged == [*range(120), *range(30)] and feed.replayed == 0
    judged.clear()
    feed.stop = threading.Event()
    runs.append([list(range(20, 60))])  # restarted: re-reads from an old commit (20..29 already judged)
    feed.run()
    assert judged == list(range(30, 60)) and feed.replayed == 10


def _flood_stream(settings: Settings, ip: str, t0: float) -> pa.Table:
    lines = [line(ip, t0 + i / 25, "/forumdisplay.php?f=3") for i in range(40)]
    return Processor(settings).process(lines, SourceContext(format="combined")).stream


def test_restart_restores_active_bans_and_direct_unban(chdb_path: Path, settings: Settings,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    store = open_store(f"chdb:{chdb_path}?database=live_restore")
    try:
        migrate(store, NO_TTL)
        first = LiveDos(settings, store, actions=[], publish=False)
        made = first.process_stream(_flood_stream(settings, "198.51.100.9", 1_760_000_000.0))
        made += first.process_stream(_flood_stream(settings, "198.51.100.10", 1_760_000_100.0))
        assert sorted(d.value for d in made) == ["198.51.100.10", "198.51.100.9"]
        first.unban("198.51.100.10/32")  # lifted before the restart: must not come back
        first.close()

        second = LiveDos(settings, store, actions=[], publish=False)
        assert second.restored == 1 and set(second.manager.active) == {"198.51.100.9"}
        startup = second.registry.stream("bouncer", True)
        assert [d["value"] for d in startup["new"] or []] == ["198.51.100.9"]
        # the ban lifted before the restart reaches a bouncer that kept its set (rebuilt from the store)
        assert [d["value"] for d in startup["deleted"] or []] == ["198.51.100.10"]
        # a repeat flood from a restored ban is suppressed (already banned), not a second decision
        again = second.process_stream(_flood_stream(settings, "198.51.100.9", 1_760_000_200.0))
        assert again == [] and second.manager.suppressed["active"] >= 1

        # no owner: unban directly on the store (and the configured actions: none here)
        out = unban_direct("198.51.100.9", settings, store)
        assert out["held"] is True and out["via"] == "store" and out["action_errors"] == []
        assert active_from_store(store) == []
        assert [a for (a,) in store.query_rows(
            "SELECT action FROM decisions WHERE value = '198.51.100.9' ORDER BY created_at")] == ["ban", "unban"]
    finally:
        store.close()
    with pytest.raises(ValueError, match="is a whole address family: never a ban value"):  # said for an unban too
        normalize_value("0.0.0.0/0")  # (it said "refusing to ban", user trial 43)
    with pytest.raises(SystemExit):
        unban_command("no-such-address", config=None, owner="http://127.0.0.1:9", store=None, password_env=None,
                      reason="manual")


def test_decisions_kafka_never_confirmed_are_published_at_the_next_start(broker: Broker, chdb_path: Path,
                                                                          settings: Settings) -> None:
    """The owner stopped with the broker away: its ban and unban were in the table, never on the topic (a
    firewall host reading it missed them; stop 41's open end).  The next start publishes them, with their ids,
    in order; what the topic confirmed before is not sent again, and a third start sends nothing."""
    s = _settings(settings, broker, "republish", "feed")
    store = open_store(f"chdb:{chdb_path}?database=live_republish")
    try:
        migrate(store, NO_TTL)
        up = LiveDos(s, store, actions=[], publish=True)
        [sent] = up.process_stream(_flood_stream(s, "198.51.100.21", 1_760_000_000.0))
        up.close()  # confirmed: recorded in decisions_published
        assert [i for (i,) in store.query_rows("SELECT id FROM decisions_published")] == [sent.id]

        away = s.model_copy(deep=True)
        away.kafka.bootstrap_servers = f"127.0.0.1:{free_ports(1)[0]}"  # nothing listens: the broker is away
        down = LiveDos(away, store, actions=[], publish=True)
        assert down.republished == 0  # the topic confirmed everything so far
        lost = down.process_stream(_flood_stream(s, "198.51.100.22", 1_760_000_100.0))
        lost += down.process_stream(_flood_stream(s, "198.51.100.23", 1_760_000_200.0))
        down.unban("198.51.100.23")  # lifted while away: the unban is the latest word, the ban is not sent
        down.close()  # waits, then gives them up (logged); before this they never reached the topic
        assert sorted(d.value for d in lost) == ["198.51.100.22", "198.51.100.23"]
        assert [json.loads(m.value)["id"] for m in broker.read_all(s.kafka.decisions_topic)] == [sent.id]
        # `detect decisions` without an owner says which bans the topic has not got
        views = with_published([decision_view(d) for d in active_from_store(store)], store, s.kafka.decisions_topic)
        assert {v["value"]: v["published"] for v in views} == {"198.51.100.21": True, "198.51.100.22": False}

        back = LiveDos(s, store, actions=[], publish=True)
        assert back.republished == 2
        back.close()
        got = [json.loads(m.value) for m in broker.read_all(s.kafka.decisions_topic, expected=3)]
        assert [(d["action"], d["value"]) for d in got] == [
            ("ban", "198.51.100.21"), ("ban", "198.51.100.22"), ("unban", "198.51.100.23")]
        assert got[1]["id"] == next(d.id for d in lost if d.value == "198.51.100.22")
        assert len({d["id"] for d in got}) == 3

        again = LiveDos(s, store, actions=[], publish=True)
        assert again.republished == 0  # their delivery was recorded this time
        again.close()
        assert broker.count(s.kafka.decisions_topic) == 3
    finally:
        store.close()


def test_a_direct_unban_is_published_where_owners_publish(broker: Broker, chdb_path: Path,
                                                           settings: Settings) -> None:
    """``detect unban`` with no owner, default configuration (``actions.kafka`` off, owners publish): once an
    owner has published on the decisions topic (Kafka is in use), the unban goes there too; before, the topic
    said "banned" until an owner started (user trial 42).  On a store that never published it is left to the
    next owner start (``pending``; ``not_needed`` with no ban in force), and with publishing off it is ``off``."""
    s = _settings(settings, broker, "direct", "feed")
    topic = s.kafka.decisions_topic
    store = open_store(f"chdb:{chdb_path}?database=live_direct_unban")
    try:
        migrate(store, NO_TTL)
        now_ms = int(time.time() * 1000)
        sink = StoreSink(store)
        sink.emit(Decision(id="ban-31", created_at=now_ms, decided_at=now_ms, first_seen=now_ms,
                           expires_at=now_ms + 3_600_000, site="forum", action="ban", value="198.51.100.31",
                           scope="ip", reason="client_flood", duration_s=3600, mode="enforce", origin="forumpulse",
                           evidence={}))
        sink.close()
        out = unban_direct("198.51.100.31", s, store)
        assert (out["kafka"], out["held"]) == ("pending", True)  # nothing published there yet: the next start
        again = unban_direct("198.51.100.31", s, store)  # lifted already, but the ban has not run out: the next
        assert (again["kafka"], again["held"]) == ("pending", False)  # start sends this latest word (from a review)
        # nothing in force to lift: no start sends it later either (user trial 43: "pending" forever)
        assert unban_direct("198.51.100.30", s, store)["kafka"] == "not_needed"
        up = LiveDos(s, store, actions=[], publish=True)
        [ban] = up.process_stream(_flood_stream(s, "198.51.100.32", 1_760_000_000.0))
        up.close()
        out = unban_direct("198.51.100.32", s, store)
        assert out["kafka"] == "published" and out["action_errors"] == []
        got = [json.loads(m.value) for m in broker.read_all(topic, expected=3)]
        # the pending unban went out at the owner's start, as the answer said it would
        by_value: dict[str, list[str]] = {}
        for d in got:  # per value in order (one key, one partition)
            by_value.setdefault(d["value"], []).append(d["action"])
        assert by_value == {"198.51.100.31": ["unban"], "198.51.100.32": ["ban", "unban"]}
        assert [d["evidence"]["ban_id"] for d in got if d["value"] == "198.51.100.32" and d["action"] == "unban"] == [
            ban.id]
        off = s.model_copy(deep=True)
        off.detectors["live"]["publish_decisions"] = False
        assert unban_direct("198.51.100.33", off, store)["kafka"] == "off"
        assert broker.count(topic) == 3
    finally:
        store.close()


def test_dos_metrics_follow_the_wall_clock_and_count_every_unban(chdb_path: Path, settings: Settings) -> None:
    """The active-bans gauge counts bans in force by the wall clock (the manager only expires its own when a
    candidate arrives); an unban of a ban this process does not hold is counted like any other; the registry
    (in memory) is the first action."""
    from forumpulse.pipeline.live_detect import DosCollector
    from prometheus_client import CollectorRegistry, generate_latest

    store = open_store(f"chdb:{chdb_path}?database=live_metrics")
    try:
        migrate(store, NO_TTL)
        t = [1_760_000_002.0]
        live = LiveDos(settings, store, actions=[], publish=False, clock=lambda: t[0])
        assert live.manager.actions[0] is live.registry
        made = live.process_stream(_flood_stream(settings, "198.51.100.9", 1_760_000_000.0))
        assert [d.value for d in made] == ["198.51.100.9"]
        live.unban("198.51.100.77")  # never banned here
        reg = CollectorRegistry()
        reg.register(DosCollector(live))

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            return _samples(generate_latest(reg).decode())

        m = scrape()
        assert m[("forumpulse_dos_active_bans", ())] == 1
        assert m[("forumpulse_dos_decisions_total",
                  (("action", "unban"), ("mode", "enforce"), ("reason", "manual"), ("scope", "ip")))] == 1
        t[0] += made[0].duration_s + 1  # quiet since: no candidate to make the manager expire it
        assert "198.51.100.9" in live.manager.active and scrape()[("forumpulse_dos_active_bans", ())] == 0
        live.close()
        # observe mode: the decision is held (GET /fp/decisions shows it, mode observe) but is no ban in force
        # (it counted as one in forumpulse_dos_active_bans: user trial 37)
        obs = settings.model_copy(deep=True)
        obs.detectors["dos"] = {**(obs.detectors.get("dos") or {}), "mode": "observe"}
        t[0] = 1_760_000_002.0
        watch = LiveDos(obs, store, actions=[], publish=False, clock=lambda: t[0])
        seen = watch.process_stream(_flood_stream(obs, "198.51.100.10", 1_760_000_000.0))
        assert [(d.value, d.mode) for d in seen] == [("198.51.100.10", "observe")]
        # (.9's enforced ban, restored from the table at start, is still in force by this clock: it counts)
        assert {d["value"]: d["mode"] for d in watch.active()} == {"198.51.100.9": "enforce",
                                                                    "198.51.100.10": "observe"}
        assert watch.active_count() == 1
        watch.close()
    finally:
        store.close()


def test_a_restarted_owner_learns_prefix_rates_from_the_store(chdb_path: Path, settings: Settings) -> None:
    """Without it every range is "never seen" after a restart: a carrier NAT /24 busy since yesterday would be
    judged at prefix_surge's bare threshold once the warm-up ends."""
    store = open_store(f"chdb:{chdb_path}?database=live_warm")
    try:
        migrate(store, NO_TTL)
        now = 1_760_000_000.0
        t0 = now // 60 * 60 - 3600  # an hour ago: 5 whole minutes of a busy /24 (20 req/s from 12 addresses), a quiet one
        busy = [line(f"198.51.100.{i % 12 + 1}", t0 + i / 20, "/showthread.php?t=1") for i in range(6000)]
        quiet = [line(f"203.0.113.{i % 3 + 1}", t0 + i * 6, "/showthread.php?t=2") for i in range(50)]
        store.insert("requests", Processor(settings).process(busy + quiet, SourceContext(format="combined")).requests)
        live = LiveDos(settings, store, actions=[], publish=False, clock=lambda: now)
        assert live.warmed_prefixes == 1
        rates = live.detector.prefix_rates
        assert rates.per_minute("198.51.100.0/24", int(now) // 60) == pytest.approx(1200, rel=0.01)
        assert rates.per_minute("203.0.113.0/24", int(now) // 60) == 0  # 10 a minute: below the floor (30)
        live.close()
        # stored addresses rewritten by privacy say nothing about the client's range: nothing learned
        pseud = settings.model_copy(deep=True)
        pseud.privacy.client_ip = "pseudonymize"
        other = LiveDos(pseud, store, actions=[], publish=False, clock=lambda: now)
        assert other.warmed_prefixes == 0 and not other.detector.prefix_rates.rate
        other.close()
        # a range decided against (here in observe mode: its flood reached the logs) teaches nothing up to its
        # ban's end, as on the live path
        from forumpulse.detectors.dos import Decision, StoreSink

        at = int(t0 * 1000) + 60_000
        sink = StoreSink(store)
        sink.emit(Decision(id="obs", created_at=at, decided_at=at, first_seen=at, expires_at=at + 900_000,
                           site="forum", action="ban", value="198.51.100.0/24", scope="range",
                           reason="prefix_surge", duration_s=900, mode="observe", origin="forumpulse", evidence={}))
        sink.flush()
        third = LiveDos(settings, store, actions=[], publish=False, clock=lambda: now)
        assert third.detector.prefix_rates.per_minute("198.51.100.0/24", int(now) // 60) == 0
        third.close()
    finally:
        store.close()


def test_an_unban_written_on_the_store_directly_reaches_the_running_owner(chdb_path: Path,
                                                                          settings: Settings) -> None:
    """``forumpulse detect unban`` without an owner (not reachable at --owner) writes the store and the actions
    only; the running owner must lift its ban too, or its periodic firewall check would put the element back
    and the decision API would keep serving it."""
    store = open_store(f"chdb:{chdb_path}?database=live_sync_unban")
    try:
        migrate(store, NO_TTL)
        firewall = _Recorder("nftables", True)
        now = time.time()  # the direct unban judges "in force" by the wall clock
        live = LiveDos(settings, store, actions=[firewall], publish=False, clock=lambda: now)
        made = live.process_stream(_flood_stream(settings, "198.51.100.9", now - 2))
        assert [d.value for d in made] == ["198.51.100.9"]
        assert live.sync_store_unbans() == 0  # nothing unbanned yet
        assert [d["value"] for d in live.registry.stream("bouncer", True)["new"] or []] == ["198.51.100.9"]
        out = unban_direct("198.51.100.9", settings, store)
        assert out["held"] is True
        assert live.check_firewall() == 0  # the check syncs first
        assert "198.51.100.9" not in live.manager.active
        assert not live.registry.stream("other-bouncer", True)["new"]  # no longer served to bouncers
        assert firewall.unbans == ["198.51.100.9"]
        assert live.sync_store_unbans() == 0  # read again: already lifted
        live.close()
    finally:
        store.close()


class _Recorder:
    """An action that records what it was asked to do."""

    def __init__(self, name: str, reapply: bool) -> None:
        self.name, self.reapply_on_restore, self.bans = name, reapply, []
        self.unbans: list[str] = []

    def ban(self, d: Any) -> None:
        self.bans.append((d.value, d.duration_s))

    def unban(self, d: Any) -> None:
        self.unbans.append(d.value)


def test_restart_reapplies_bans_in_force_to_kernel_state_actions_only(chdb_path: Path, settings: Settings) -> None:
    """After a reboot the nftables/ipset sets are empty: a restarted owner must put the bans still in force back,
    with the time they have left; a webhook receiver is not told twice."""
    store = open_store(f"chdb:{chdb_path}?database=live_reapply")
    try:
        migrate(store, NO_TTL)
        t0 = 1_760_000_000.0
        first = LiveDos(settings, store, actions=[], publish=False, clock=lambda: t0 + 2)
        made = first.process_stream(_flood_stream(settings, "198.51.100.9", t0))
        assert [d.value for d in made] == ["198.51.100.9"]
        duration = made[0].duration_s
        first.close()

        firewall, webhook = _Recorder("nftables", True), _Recorder("webhook", False)
        later = t0 + 2 + 100  # 100 s after the ban was made
        second = LiveDos(settings, store, actions=[firewall, webhook], publish=False, clock=lambda: later)
        assert second.restored == 1
        assert len(firewall.bans) == 1 and firewall.bans[0][0] == "198.51.100.9"
        assert duration - 105 <= firewall.bans[0][1] <= duration - 95  # what is left, not the full duration
        assert webhook.bans == []
        second.close()

        expired = LiveDos(settings, store, actions=[firewall], publish=False, clock=lambda: t0 + duration + 60)
        assert len(firewall.bans) == 1  # a ban past its end is not re-applied
        expired.close()
    finally:
        store.close()


def test_restore_keys_old_rows_canonically_and_refuses_what_is_never_banned(chdb_path: Path,
                                                                           settings: Settings) -> None:
    """Rows written by a version that did not canonicalise values or refuse loopback: a ban under an old spelling
    ended by an unban under the canonical one stays ended; one still in force is held under the canonical value;
    a loopback ban is neither restored, served to bouncers, nor re-applied."""
    from forumpulse.detectors.dos import Decision, StoreSink

    store = open_store(f"chdb:{chdb_path}?database=live_canonical")
    try:
        migrate(store, NO_TTL)
        t0 = 1_760_000_000_000

        def row(value: str, action: str, at: int) -> Decision:
            return Decision(id=f"{action}-{value}-{at}", created_at=at, decided_at=at, first_seen=at,
                            expires_at=at + 3_600_000, site="forum", action=action, value=value, scope="ip",
                            reason="client_flood" if action == "ban" else "manual",
                            duration_s=3600 if action == "ban" else 0, mode="enforce", origin="forumpulse",
                            evidence={})

        sink = StoreSink(store)
        for d in (row("::ffff:198.51.100.38", "ban", t0), row("198.51.100.38", "unban", t0 + 1000),
                  row("2001:DB8:0:0::7", "ban", t0 + 2000), row("127.0.0.5", "ban", t0 + 3000)):
            sink.emit(d)
        sink.flush()
        assert sorted(d.value for d in active_from_store(store, t0 / 1000 + 10)) == ["127.0.0.5", "2001:db8::7"]

        firewall = _Recorder("nftables", True)
        live = LiveDos(settings, store, actions=[firewall], publish=False, clock=lambda: t0 / 1000 + 10)
        assert set(live.manager.active) == {"2001:db8::7"} and live.restored == 1
        assert live.manager.suppressed["loopback"] == 1
        assert [d["value"] for d in live.registry.stream("bouncer", True)["new"] or []] == ["2001:db8::7"]
        assert [v for v, _ in firewall.bans] == ["2001:db8::7"]
        live.close()
    finally:
        store.close()


def test_restore_refuses_a_ban_of_a_proxy_listed_since(chdb_path: Path, settings: Settings) -> None:
    """A ban of the site's own reverse proxy, made before it was listed in ``sites[].trusted_proxies``, is lifted
    when the owner starts -- an unban row, a deletion for bouncers, an unban for the firewall action -- and not
    re-applied; other bans are restored."""
    from forumpulse.detectors.dos import Decision, StoreSink
    from forumpulse.pipeline.config import SiteConfig

    store = open_store(f"chdb:{chdb_path}?database=live_proxy")
    try:
        migrate(store, NO_TTL)
        t0 = 1_760_000_000_000
        sink = StoreSink(store)
        for i, v in enumerate(("10.0.0.5", "198.51.100.40")):
            sink.emit(Decision(id=f"ban-{v}", created_at=t0 + i, decided_at=t0 + i, first_seen=t0 + i,
                               expires_at=t0 + 3_600_000, site="forum", action="ban", value=v, scope="ip",
                               reason="client_flood", duration_s=3600, mode="enforce", origin="forumpulse",
                               evidence={}))
        sink.flush()
        s = settings.model_copy(deep=True)
        s.sites = [SiteConfig(name="forum", trusted_proxies=["10.0.0.0/29"])]
        firewall = _Recorder("nftables", True)
        live = LiveDos(s, store, actions=[firewall], publish=False, clock=lambda: t0 / 1000 + 10)
        assert set(live.manager.active) == {"198.51.100.40"} and live.restored == 1
        assert live.manager.suppressed["trusted_proxy"] == 1
        assert [v for v, _ in firewall.bans] == ["198.51.100.40"] and firewall.unbans == ["10.0.0.5"]
        stream = live.registry.stream("bouncer", True)
        assert [d["value"] for d in stream["new"] or []] == ["198.51.100.40"]
        live.close()
        assert [(str(a), str(v)) for a, v in store.query_rows(
            "SELECT action, value FROM decisions WHERE value = '10.0.0.5' ORDER BY created_at")] == [
            ("ban", "10.0.0.5"), ("unban", "10.0.0.5")]
    finally:
        store.close()


# ------------------------------------------------------------------------------------------------ traffic


def _site_requests(site: str, now: datetime, outage_minutes: int) -> pa.Table:
    """Two days of steady traffic (30/min) for ``site`` up to ``now``; the last ``outage_minutes`` answer 503."""
    rng = np.random.default_rng(7)
    start = now.replace(second=0, microsecond=0) - timedelta(days=2)
    minutes = int((now.replace(second=0, microsecond=0) - start).total_seconds() // 60)
    counts = rng.poisson(30, minutes)
    idx = np.repeat(np.arange(minutes), counts)
    n = len(idx)
    ts = int(start.timestamp() * 1000) + idx * 60_000 + rng.integers(0, 60_000, n)
    status = np.where(idx >= minutes - outage_minutes, 503, 200)
    return forum_requests(site, ts, status, rng)


def test_traffic_service_writes_detections_and_events(broker: Broker, chdb_path: Path, settings: Settings) -> None:
    now = datetime(2026, 3, 11, 14, 0, 30, tzinfo=UTC)
    s = settings.model_copy(deep=True)
    s.kafka.bootstrap_servers = broker.bootstrap
    s.kafka.events_topic = broker.create_topic("events-traffic", 1)
    s.sites[0].name = "fixture-site"
    store = open_store(f"chdb:{chdb_path}?database=live_traffic")
    try:
        migrate(store, NO_TTL)
        requests = _site_requests("fixture-site", now, outage_minutes=40)
        store.insert("requests", requests)
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": broker.bootstrap})
        svc = TrafficService(s, store, lambda topic, key, value: producer.produce(topic, key=key, value=value),
                             clock=now.timestamp, flush=lambda: producer.flush(10))
        dets = svc.tick()
        rows = store.query_rows("SELECT kind, site, state FROM detections FINAL")
        assert dets and len(rows) == len({d.id for d in dets})
        kinds = {str(k) for k, _, _ in rows}
        assert "outage" in kinds, rows
        assert {str(site) for _, site, _ in rows} == {"fixture-site"}
        events = broker.read_all(s.kafka.events_topic, expected=len(dets))
        assert sorted(json.loads(m.value)["id"] for m in events) == sorted(d.id for d in dets)
        # the same minute again adds nothing new
        assert svc.tick() == [] and svc.runs == 2 and svc.errors == 0
        # what the owner's /metrics serves for it
        from forumpulse.pipeline.live_detect import TrafficCollector
        from prometheus_client import CollectorRegistry, generate_latest

        reg = CollectorRegistry()
        reg.register(TrafficCollector(svc))
        m = _samples(generate_latest(reg).decode())
        assert m[("forumpulse_traffic_runs_total", ())] == 2 and m[("forumpulse_traffic_run_errors_total", ())] == 0
        assert m[("forumpulse_traffic_detections_total", ())] == len(dets)
        assert m[("forumpulse_traffic_last_run_timestamp_seconds", ())] == now.timestamp()
        cursor = svc.detector.sites["fixture-site"].cursor
        assert cursor is not None
        behind = m[("forumpulse_traffic_minutes_judged_behind_seconds", (("site", "fixture-site"),))]
        assert behind == pytest.approx(now.timestamp() - cursor.timestamp()) and 30 <= behind < 3600, behind
    finally:
        store.close()


@pytest.mark.parametrize(("interval", "now", "delay"), [
    (60.0, 1_700_000_010.0, 35.0),    # 30 s past a minute: 5 s after the next one
    (60.0, 1_699_999_983.0, 2.0),     # 3 s past a minute (inside the offset): this minute's run
    (60.0, 1_699_999_950.0, 35.0),
    (120.0, 1_699_999_950.0, 95.0),   # every 2 minutes: the next even minute (+5 s), not the next minute
    (300.0, 1_700_000_010.0, 95.0),   # every 5 minutes: 5 s past the next multiple of 300 s
    (300.0, 1_699_999_803.0, 2.0),    # 3 s past a 5-minute boundary: that run
    (45.0, 1_700_000_010.0, 45.0),    # not whole minutes: a plain interval
])
def test_traffic_runs_follow_intervals_longer_than_a_minute(interval: float, now: float, delay: float) -> None:
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import TrafficService

    svc = TrafficService(load_settings(), store=None, interval_s=interval, offset_s=5.0, clock=lambda: now)
    assert svc._next_delay() == pytest.approx(delay)


class _NullStore:
    def __init__(self) -> None:
        self.inserts = 0

    def insert(self, _table: str, _rows: Any) -> None:
        self.inserts += 1


def test_events_leave_the_outbox_only_once_kafka_confirms_delivery() -> None:
    """Before the fix a detection left the outbox as soon as produce() had queued it: with the broker away the
    message was dropped after message.timeout.ms and nobody noticed.  Now it stays (stored once) until Kafka
    confirms it; failures are counted in forumpulse_traffic_publish_failures_total."""
    from forumpulse.detectors.series import Detection
    from forumpulse.detectors.traffic import _Outgoing
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import EventsPublisher, TrafficCollector
    from prometheus_client import CollectorRegistry, generate_latest

    kafka = FakeKafka()
    svc = TrafficService(load_settings(), store=None, producer=EventsPublisher(kafka, timeout_s=0.01))
    det = svc.detector
    t = datetime(2026, 3, 11, 10, 0, tzinfo=UTC)
    d = Detection("outage", "site", t, None, t, 0.0, 100.0, 1.0, "outage", site="s1")
    det._outbox[d.id] = _Outgoing(d)
    store = _NullStore()
    assert det._flush(store, t) == []                   # broker away: not confirmed ...
    assert d.id in det._outbox and det._outbox[d.id].stored and store.inserts == 1  # ... kept, stored once
    kafka.fail = "KafkaError{code=_MSG_TIMED_OUT}"
    assert det._flush(store, t) == [] and d.id in det._outbox  # an error report: kept too
    kafka.fail, kafka.up = None, True
    assert det._flush(store, t) == [d]                  # delivered: leaves the outbox
    assert d.id not in det._outbox and store.inserts == 1
    assert [k for k, _ in kafka.delivered] == [d.id.encode()]
    reg = CollectorRegistry()
    reg.register(TrafficCollector(svc))
    m = _samples(generate_latest(reg).decode())
    assert m[("forumpulse_traffic_publish_failures_total", ())] == 2


def test_a_produce_that_raised_leaves_nothing_pending() -> None:
    """produce() raising (BufferError: the local queue full) hands nothing over: no pending entry may outlive
    it, or the next flush would count a failure and refuse the re-sent detection Kafka did confirm."""
    from forumpulse.pipeline.live_detect import EventsPublisher

    class _Full(FakeKafka):
        def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None) -> None:
            if key == b"full":
                raise BufferError("Local: Queue full")
            super().produce(topic, key, value, on_delivery)

    kafka = _Full()
    kafka.up = True
    pub = EventsPublisher(kafka, timeout_s=0.01)
    with pytest.raises(BufferError):
        pub("weblogs.events", b"full", b"{}")
    assert pub.confirm() == set() and pub.failures == 0
    pub("weblogs.events", b"k1", b"{}")
    assert pub.confirm() == {b"k1"} and pub.failures == 0


def test_detections_count_when_stored_even_if_kafka_does_not_confirm_them() -> None:
    """forumpulse_traffic_detections_total counts what the detectors stored; with the broker away nothing is
    confirmed (run_once returns []) and the counter stayed at 0 while the detections table filled (user trial)."""
    from forumpulse.detectors.series import Detection
    from forumpulse.pipeline.config import load_settings

    svc = TrafficService(load_settings(), store=None, clock=lambda: 1_773_223_230.0)

    def run_once(_store: Any, _now: datetime) -> list[Detection]:
        svc.detector.stored_total += 3  # three states stored, none confirmed by Kafka
        return []

    svc.detector.run_once = run_once  # type: ignore[method-assign]
    assert svc.tick() == [] and svc.emitted == 3


def test_a_partly_failed_run_counts_what_it_emitted() -> None:
    """run_once raising TrafficRunError after storing detections: they count in
    forumpulse_traffic_detections_total (before the fix the counter missed them)."""
    from forumpulse.detectors.series import Detection
    from forumpulse.detectors.traffic import TrafficRunError
    from forumpulse.pipeline.config import load_settings

    svc = TrafficService(load_settings(), store=None, clock=lambda: 1_773_223_230.0)
    t = datetime(2026, 3, 11, 10, 0, tzinfo=UTC)
    emitted = [Detection("spike", "site", t, None, t, 1.0, 1.0, 1.0, "spike", site=s) for s in ("a", "b")]

    def run_once(_store: Any, _now: datetime) -> list[Detection]:
        svc.detector.stored_total += len(emitted)
        raise TrafficRunError({"c": RuntimeError("store away")}, emitted)

    svc.detector.run_once = run_once  # type: ignore[method-assign]
    with pytest.raises(TrafficRunError):
        svc.tick()
    assert svc.emitted == 2 and svc.errors == 1 and svc.runs == 1


def test_a_run_under_way_is_told_from_a_stuck_detector_thread() -> None:
    """The first run warms the baselines on history_days of rollups (2-4 min for a 1M-lines/day forum in user
    trial 32) with ``forumpulse_traffic_last_run_timestamp_seconds`` still 0, so the documented staleness alert
    fired on every start: ``forumpulse_traffic_run_in_progress_seconds`` says a run is under way, and for how
    long."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import TrafficCollector, TrafficService
    from prometheus_client import CollectorRegistry, generate_latest

    t = [1_773_223_230.0]
    svc = TrafficService(load_settings(), store=None, clock=lambda: t[0])
    reg = CollectorRegistry()
    reg.register(TrafficCollector(svc))
    during: list[dict[Any, float]] = []

    def warm_up(store: Any, now: datetime) -> list[Any]:
        t[0] += 240.0
        during.append(_samples(generate_latest(reg).decode()))
        return []

    svc.detector.run_once = warm_up  # type: ignore[method-assign]
    svc.tick()
    after = _samples(generate_latest(reg).decode())
    assert during[0][("forumpulse_traffic_run_in_progress_seconds", ())] == 240.0
    assert during[0][("forumpulse_traffic_last_run_timestamp_seconds", ())] == 0.0
    assert after[("forumpulse_traffic_run_in_progress_seconds", ())] == 0.0
    assert after[("forumpulse_traffic_last_run_timestamp_seconds", ())] == 1_773_223_230.0
