"""Delivery to Kafka when the broker is away, mostly without a broker (FakeKafka decides what a flush reports;
one test stops and restarts a real broker under the sink; the owner's path is in test_live_detect.py), and the
CLI's owner client when the owner is slow:

* the DoS decision sink (KafkaSink inside the owner's _GuardedSink) keeps a decision Kafka did not confirm and
  sends it again; a closing sink says what it could not deliver (it returned quietly, from a review);
* the traffic events publisher queues a pending detection once, not once per run (from a review);
* ``detect unban`` whose owner took the request but answered late does not also unban directly (two unbans,
  two webhook calls, user trial 41).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeKafka
from forumpulse.detectors.dos import Decision, KafkaSink, StoreSink, UndeliveredError, published_recorder
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.live_detect import (
    EventsPublisher,
    LiveDos,
    OwnerNoAnswer,
    _GuardedSink,
    active_from_store,
    latest_words,
    owner_request,
    unpublished_from_store,
)
from forumpulse.pipeline.store import Store


def decision(value: str) -> Decision:
    return Decision(id="d-" + value, created_at=0, decided_at=1_700_000_000_000, first_seen=1_700_000_000_000,
                    expires_at=1_700_000_600_000, site="forum", action="ban", value=value, scope="ip",
                    reason="client_flood", duration_s=600, mode="enforce", origin="forumpulse", evidence={})


def test_a_decision_kafka_did_not_confirm_is_sent_again() -> None:
    kafka = FakeKafka()
    sink = _GuardedSink(KafkaSink(producer=kafka, flush_timeout_s=0.01), "kafka")
    sink.emit(decision("198.51.100.7"))
    sink.flush()  # broker away: no report yet, still queued in the producer (not an error, not lost)
    assert sink.errors == 0 and sink.retrying == 0 and sink.inner.waiting == 1
    kafka.fail = "KafkaError{code=_MSG_TIMED_OUT}"
    sink.flush()  # librdkafka gave up on it: kept for the next flush (before: dropped without a word)
    assert sink.errors == 1 and sink.retrying == 1 and sink.inner.waiting == 0 and kafka.queue == []
    kafka.fail, kafka.up = None, True
    sink.flush()  # sent again, confirmed
    assert sink.retrying == 0 and sink.inner.waiting == 0 and sink.inner.delivered == 1
    assert [(k, json.loads(v)["value"]) for k, v in kafka.delivered] == [(b"198.51.100.7", "198.51.100.7")]


def test_a_closing_sink_names_what_it_could_not_deliver() -> None:
    kafka = FakeKafka()
    sink = KafkaSink(producer=kafka, flush_timeout_s=0.01, close_timeout_s=0.01)
    sink.emit(decision("198.51.100.7"))
    sink.emit(decision("198.51.100.8"))
    with pytest.raises(UndeliveredError, match="2 decision") as err:
        sink.close()  # the process is about to drop the producer's queue
    assert [d.value for d in err.value.undelivered] == ["198.51.100.7", "198.51.100.8"]
    assert sink.failed == 2 and sink.waiting == 0
    guarded = _GuardedSink(KafkaSink(producer=FakeKafka(), flush_timeout_s=0.01, close_timeout_s=0.01), "kafka",
                           keep=1)
    guarded.emit(decision("198.51.100.9"))
    guarded.emit(decision("198.51.100.10"))
    guarded.close()  # logged and counted, not raised: one kept (keep=1), one dropped
    assert guarded.retrying == 1 and guarded.dropped == 1 and guarded.errors == 1


def test_a_real_producer_with_no_broker_keeps_and_then_names_its_decisions() -> None:
    """The same with librdkafka itself (no stand-in), a broker that is not there (nothing listens on the port):
    a flush leaves the decision waiting, not failed; close gives it up and names it."""
    sink = KafkaSink("127.0.0.1:9", flush_timeout_s=0.2, close_timeout_s=0.5)
    sink.emit(decision("198.51.100.7"))
    sink.flush()
    assert sink.waiting == 1 and sink.failed == 0 and len(sink.producer) == 1
    with pytest.raises(UndeliveredError, match="1 decision") as err:
        sink.close()
    assert [d.value for d in err.value.undelivered] == ["198.51.100.7"] and sink.waiting == 0


def test_confirmed_decisions_are_handed_on_and_a_failed_record_is_offered_again() -> None:
    """``on_delivered`` gets the ids Kafka confirmed; when it fails (the store away) the flush still succeeds
    (the decisions *were* delivered) and the ids are offered again at the next flush."""
    kafka = FakeKafka()
    kafka.up = True
    got: list[list[str]] = []
    fail = [True]

    def record(ids: list[str]) -> None:
        if fail.pop() if fail else False:
            raise RuntimeError("store unavailable")
        got.append(list(ids))

    sink = KafkaSink(producer=kafka, flush_timeout_s=0.01, on_delivered=record)
    sink.emit(decision("198.51.100.7"))
    sink.flush()  # delivered, not recorded: no exception, counted
    assert sink.delivered == 1 and sink.record_errors == 1 and got == []
    sink.flush()  # a moment later: not tried again (the store away would cost a second timeout per flush)
    assert got == [] and sink.record_errors == 1
    sink._record_after = 0.0  # RECORD_RETRY_S later
    sink.emit(decision("198.51.100.8"))
    kafka.fail = "KafkaError{code=_MSG_TIMED_OUT}"
    with pytest.raises(UndeliveredError):  # .8 failed; .7 (delivered before) is recorded all the same
        sink.flush()
    assert got == [["d-198.51.100.7"]]
    kafka.fail = None
    sink.emit(decision("198.51.100.8"))
    sink.close()
    assert got == [["d-198.51.100.7"], ["d-198.51.100.8"]] and sink.record_errors == 1


def test_only_the_latest_unconfirmed_word_per_value_is_published_again(store: Store) -> None:
    """What a restarted owner publishes again (unpublished_from_store): per value, the latest row when the
    topic never confirmed it and it still matters; never an older row that a later (confirmed) one overrides."""
    now = 1_800_000_000.0
    rows: list[Decision] = []

    def row(value: str, action: str, ago_s: float, duration_s: int = 3600) -> Decision:
        at = int((now - ago_s) * 1000)
        d = replace(decision(value), id=f"{action}-{value}-{ago_s:g}", action=action, created_at=at,
                    duration_s=duration_s if action == "ban" else 0)
        rows.append(d)
        return d

    row("198.51.100.1", "ban", 61)  # in force, never confirmed: sent again
    confirmed = [row("198.51.100.2", "ban", 62).id]  # in force, confirmed: not sent
    row("198.51.100.3", "ban", 600)
    row("198.51.100.3", "unban", 300)  # unban never confirmed: the unban is sent, not the ban
    row("198.51.100.4", "ban", 600)  # a ban never confirmed ...
    confirmed.append(row("198.51.100.4", "unban", 301).id)  # ... lifted, and that was confirmed: nothing
    row("198.51.100.5", "unban", 900)  # an old unban never confirmed ...
    confirmed.append(row("198.51.100.5", "ban", 120).id)  # ... then a new ban, confirmed: nothing (it would lift it)
    row("198.51.100.6", "ban", 7200)  # expired (1 h ban, 2 h ago): nothing
    row("198.51.100.7", "unban", 8 * 86400)  # an unban older than the longest ban: nothing
    row("::FFFF:198.51.100.9", "ban", 60)  # an old spelling, in force, never confirmed: sent under its canonical one
    sink = StoreSink(store)
    for d in rows:
        sink.emit(d)
    sink.close()
    published_recorder(store, "weblogs.decisions")(confirmed)
    published_recorder(store, "other.topic")(["ban-198.51.100.1-61"])  # another topic's confirmation: not this one's

    again = unpublished_from_store(store, "weblogs.decisions", keep_unbans_s=7 * 86400, now=now)
    assert [(d.action, d.value, d.id) for d in again] == [
        ("unban", "198.51.100.3", "unban-198.51.100.3-300"),
        ("ban", "198.51.100.1", "ban-198.51.100.1-61"),
        ("ban", "198.51.100.9", "ban-::FFFF:198.51.100.9-60")]  # oldest first
    assert [d.id for d in unpublished_from_store(store, "other.topic", 7 * 86400, now)] == [
        "unban-198.51.100.4-301", "unban-198.51.100.3-300", "ban-198.51.100.5-120", "ban-198.51.100.2-62",
        "ban-::FFFF:198.51.100.9-60"]
    # a starting owner reads the latest words once for republish and restore: the same answers as two reads
    latest = latest_words(store, 7 * 86400, now)
    assert unpublished_from_store(store, "weblogs.decisions", 7 * 86400, now, latest=latest) == again
    assert active_from_store(store, now, latest=latest) == active_from_store(store, now)
    assert [d.value for d in active_from_store(store, now)] == [
        "198.51.100.9", "198.51.100.1", "198.51.100.2", "198.51.100.5"]


def test_an_unban_under_another_old_spelling_is_not_undone_by_the_older_ban(store: Store) -> None:
    """Two old spellings of one address (rows from before values were canonical): the ban under one, a later
    unban under the other.  The unban is the latest word: sent while unconfirmed, and once the topic confirmed
    it the older ban is *not* sent in its place (it was, from a review: the confirmed filter ran before the
    spellings were merged), nor restored as active."""
    now = 1_800_000_000.0
    ban = replace(decision("2001:DB8::1"), id="ban-old", created_at=int((now - 600) * 1000), duration_s=3600)
    unban = replace(decision("2001:0db8::1"), id="unban-old", action="unban", created_at=int((now - 300) * 1000),
                    duration_s=0)
    sink = StoreSink(store)
    for d in (ban, unban):
        sink.emit(d)
    sink.close()
    first = unpublished_from_store(store, "weblogs.decisions", 7 * 86400, now)
    assert [(d.action, d.value, d.id) for d in first] == [("unban", "2001:db8::1", "unban-old")]
    published_recorder(store, "weblogs.decisions")(["unban-old"])
    assert unpublished_from_store(store, "weblogs.decisions", 7 * 86400, now) == []
    assert active_from_store(store, now) == []  # the ban is over (restore put it back, from the same review)
    assert active_from_store(store, now, latest=latest_words(store, 7 * 86400, now)) == []


def test_a_later_unban_under_another_spelling_ends_the_ban_on_every_path(store: Store) -> None:
    """A ban of the canonical spelling, then an unban written under an old one (upper case): the ban is over for
    active_from_store read alone (detect decisions, a direct unban's ``held``) as for the start's shared read --
    they disagreed, from a review -- and a ban and an unban in the same millisecond end lifted, whatever order
    the engine returns them in."""
    now = 1_800_000_000.0
    at = int((now - 300) * 1000)
    rows = [replace(decision("2001:db8::1"), id="ban-1", created_at=at - 60_000, duration_s=3600),
            replace(decision("2001:DB8::1"), id="unban-1", action="unban", created_at=at, duration_s=0),
            replace(decision("2001:db8::2"), id="ban-2", created_at=at, duration_s=3600),  # same ms: lifted
            replace(decision("2001:DB8::2"), id="unban-2", action="unban", created_at=at, duration_s=0),
            replace(decision("198.51.100.3"), id="ban-3", created_at=at, duration_s=3600),  # one spelling, same ms
            replace(decision("198.51.100.3"), id="unban-3", action="unban", created_at=at, duration_s=0),
            replace(decision("2001:db8::4"), id="ban-4", created_at=at, duration_s=3600)]  # still in force
    sink = StoreSink(store)
    for d in rows:
        sink.emit(d)
    sink.close()
    assert [d.id for d in active_from_store(store, now)] == ["ban-4"]
    assert [d.id for d in active_from_store(store, now, latest=latest_words(store, 7 * 86400, now))] == ["ban-4"]


def test_an_unban_counts_for_as_long_as_the_longest_ban_in_the_table(store: Store) -> None:
    """The rules now ban for at most a day, but a 30-day ban made before is still in force: its unban (8 days
    ago, never confirmed) is still sent -- the window is the longest ban in the table, not today's rules."""
    now = 1_800_000_000.0
    ban = replace(decision("198.51.100.40"), id="ban-long", created_at=int((now - 10 * 86400) * 1000),
                  duration_s=30 * 86400)
    unban = replace(decision("198.51.100.40"), id="unban-long", action="unban",
                    created_at=int((now - 8 * 86400) * 1000), duration_s=0)
    short = replace(decision("198.51.100.41"), id="ban-short", created_at=int((now - 2 * 86400) * 1000),
                    duration_s=600)
    short_unban = replace(decision("198.51.100.41"), id="unban-short", action="unban",
                          created_at=int((now - 2 * 86400 + 60) * 1000), duration_s=0)
    sink = StoreSink(store)
    for d in (ban, unban, short, short_unban):
        sink.emit(d)
    sink.close()
    # the 10-minute ban lifted two days ago would be over by now: its unban is not sent (user trial 42)
    assert [d.id for d in unpublished_from_store(store, "weblogs.decisions", 86400, now)] == ["unban-long"]


def test_a_ban_lifted_at_start_follows_its_republished_ban_on_the_topic(store: Store, settings: Settings) -> None:
    """The owner starts with an unconfirmed ban of an address listed as a trusted proxy since: the ban is
    published again *before* restore lifts it, so the topic ends with the unban (it ended with the ban, from a
    review: consumers banned the site's own proxy), and the unban row is in the table at once."""
    settings.sites[0].trusted_proxies = ["10.0.0.5"]
    settings.actions = {"decision_api": {"enabled": False}}
    now = time.time()
    old = replace(decision("10.0.0.5"), id="ban-proxy", created_at=int((now - 60) * 1000), duration_s=3600)
    sink = StoreSink(store)
    sink.emit(old)
    sink.close()
    kafka = FakeKafka()
    kafka.up = True
    live = LiveDos(settings, store, actions=[], publish=True, kafka_producer=kafka)
    try:
        assert live.republished == 1
        assert [(json.loads(v)["action"], k) for k, v in kafka.delivered] == [("ban", b"10.0.0.5"),
                                                                               ("unban", b"10.0.0.5")]
        assert [a for (a,) in store.query_rows(
            "SELECT action FROM decisions WHERE value = '10.0.0.5' ORDER BY created_at")] == ["ban", "unban"]
    finally:
        live.close()
    again = LiveDos(settings, store, actions=[], publish=True, kafka_producer=FakeKafka())
    assert again.republished == 0  # both confirmed and recorded
    again.close()


def test_a_store_without_the_table_publishes_nothing_again_and_still_starts(
        store: Store, settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    """A store not migrated to 0012 (no decisions_published): the owner starts, says it could not tell what
    the topic confirmed, publishes nothing again, and a new decision is still published (its record fails,
    logged and counted, not raised)."""
    store.command("DROP TABLE decisions_published")
    settings.actions = {"decision_api": {"enabled": False}}
    sink = StoreSink(store)
    sink.emit(replace(decision("198.51.100.76"), created_at=int(time.time() * 1000), duration_s=3600))
    sink.close()
    kafka = FakeKafka()
    kafka.up = True
    with caplog.at_level("WARNING"):
        live = LiveDos(settings, store, actions=[], publish=True, kafka_producer=kafka)
    assert live.republished == 0 and "could not read which decisions" in caplog.text
    assert live.restored == 1  # the ban in force is restored all the same
    live.unban("198.51.100.77")
    kafka_sink = live._kafka_sink()
    assert kafka_sink is not None and kafka_sink.errors == 0 and kafka_sink.inner.record_errors == 1
    assert [json.loads(v)["action"] for _, v in kafka.delivered] == ["unban"]
    live.close()


def test_decisions_the_store_had_not_taken_at_shutdown_are_spooled_and_loaded_at_the_next_start(
        store: Store, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The store away when the owner stops (a ClickHouse server down): the decisions it had not taken were
    logged and lost to the table -- a restarted owner then neither served nor re-applied those bans.  Now they
    are spooled (JSON lines in detectors.live.spool_dir) and loaded at the next start; while the store is
    still away the file stays, and a malformed file is set aside as .bad, not deleted."""
    spool = tmp_path / "spool"
    settings.detectors = {"live": {"spool_dir": str(spool)}}
    settings.actions = {"decision_api": {"enabled": False}}
    first = LiveDos(settings, store, actions=[], publish=False)
    store.command("RENAME TABLE decisions TO decisions_away")  # the store refuses decisions from here on
    ban = replace(decision("198.51.100.91"), id="ban-spooled", created_at=int(time.time() * 1000),
                  duration_s=3600)
    first.manager.dispatch(ban)  # a ban and an unban the store cannot take
    first.unban("198.51.100.90")
    with caplog.at_level("WARNING"):
        first.close()
    files = sorted(spool.glob("decisions-*.jsonl"))
    assert len(files) == 1 and "spooled to" in caplog.text
    rows = [json.loads(x) for x in files[0].read_text().splitlines()]
    assert [(r["action"], r["value"]) for r in rows] == [("ban", "198.51.100.91"), ("unban", "198.51.100.90")]

    still_away = LiveDos(settings, store, actions=[], publish=False)  # the store still refuses: kept as it was
    assert still_away.unspooled == 0 and sorted(spool.glob("decisions-*.jsonl")) == files
    still_away.close()

    store.command("RENAME TABLE decisions_away TO decisions")
    (spool / "decisions-1-1.jsonl").write_text("{not json\n")  # older name: read first
    back = LiveDos(settings, store, actions=[], publish=False)
    back.close()
    assert back.unspooled == 2 and sorted(p.name for p in spool.iterdir()) == ["decisions-1-1.bad"]
    assert sorted(store.query_rows("SELECT action, value FROM decisions")) == [("ban", "198.51.100.91"),
                                                                               ("unban", "198.51.100.90")]
    # loaded before restore: the spooled ban is held again and served to bouncers
    assert back.restored == 1 and set(back.manager.active) == {"198.51.100.91"}
    assert "198.51.100.91" in back.registry.active
    again = LiveDos(settings, store, actions=[], publish=False)
    again.close()
    assert again.unspooled == 0 and store.query_rows("SELECT count() FROM decisions") == [(2,)]

    # an owner that crashed after claiming a file (renamed .loading-<pid>) left it: the next start loads it
    crashed = spool / "decisions-0000000000002-abc.jsonl.loading-999999999"
    crashed.write_text(json.dumps(rows[1]) + "\n")
    later = LiveDos(settings, store, actions=[], publish=False)
    later.close()
    assert later.unspooled == 1 and not crashed.exists()
    assert sorted(p.name for p in spool.iterdir()) == ["decisions-1-1.bad"]
    # a crash between a file's insert and its removal: loaded again, it lands once (migration 0013: the table
    # honours the block's insert token, the hash of its decision ids; before, both rows landed twice)
    n = store.query_rows("SELECT count() FROM decisions")[0][0]
    (spool / "decisions-0000000000003-abc.jsonl.loading-999999999").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))
    last = LiveDos(settings, store, actions=[], publish=False)
    last.close()
    assert last.unspooled == 2 and store.query_rows("SELECT count() FROM decisions") == [(n,)]
    assert sorted(p.name for p in spool.iterdir()) == ["decisions-1-1.bad"]


def test_a_spool_folder_that_cannot_be_written_is_said_at_start_and_its_losses_are_named(
        store: Store, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A spool folder this process cannot write (user trial 42: immutable): said at start, not first at the stop
    that needs it; and at that stop each decision neither stored nor spooled is named in the log (value, id),
    not summed up as "in the decisions table" (it is not)."""
    (tmp_path / "file").write_text("")
    settings.detectors = {"live": {"spool_dir": str(tmp_path / "file" / "spool")}}  # under a file: mkdir fails
    settings.actions = {"decision_api": {"enabled": False}}
    with caplog.at_level("WARNING"):
        live = LiveDos(settings, store, actions=[], publish=False)
    assert "spool_dir" in caplog.text and "would be lost" in caplog.text
    # said as config check says it, not as the OS error of mkdir (user trial 43: "[Errno 17] File exists")
    assert f"cannot be created ({tmp_path / 'file'} is not a folder)" in caplog.text, caplog.text
    store.command("RENAME TABLE decisions TO decisions_away")
    try:
        live.unban("198.51.100.95")
        caplog.clear()
        with caplog.at_level("WARNING"):
            live.close()
        assert "not spooled" in caplog.text and "unban 198.51.100.95 id " in caplog.text
        assert re.search(r"unban 198\.51\.100\.95 id \w+ until 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", caplog.text)
        assert "they are in the decisions table" not in caplog.text
    finally:
        store.command("RENAME TABLE decisions_away TO decisions")


def test_a_spool_file_that_cannot_be_claimed_is_logged_not_skipped_in_silence(
        store: Store, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Claiming a file (renaming it) fails for a reason other than another owner having taken it (the trial's
    immutable folder; here its claimed name is taken by a folder): logged with the fix, the file left as it is."""
    spool = tmp_path / "spool"
    spool.mkdir()
    f = spool / "decisions-0000000000001-abc.jsonl"
    f.write_text(json.dumps(decision("198.51.100.96").to_json()) + "\n")
    blocker = spool / f"{f.name}.loading-{os.getpid()}"
    blocker.mkdir()
    (blocker / "x").write_text("")
    settings.detectors = {"live": {"spool_dir": str(spool)}}
    settings.actions = {"decision_api": {"enabled": False}}
    with caplog.at_level("WARNING"):
        live = LiveDos(settings, store, actions=[], publish=False)
    live.close()
    assert live.unspooled == 0 and f.exists() and "cannot claim it" in caplog.text


def test_bans_restore_refuses_are_not_published_again(store: Store, settings: Settings) -> None:
    """A stored ban of an address never banned (loopback, link-local: a version that banned them) or of no
    address at all is neither restored nor sent on the topic at start (it was sent, from a review)."""
    now = int(time.time() * 1000)
    sink = StoreSink(store)
    for i, v in enumerate(["127.0.0.1", "169.254.1.1", "not-an-ip", "198.51.100.60"]):
        sink.emit(replace(decision(v), id=f"old-{i}", created_at=now - 60_000, duration_s=3600))
    sink.close()
    kafka = FakeKafka()
    kafka.up = True
    live = LiveDos(settings, store, actions=[], publish=True, kafka_producer=kafka)
    live.close()
    assert live.republished == 1 and [k for k, _ in kafka.delivered] == [b"198.51.100.60"]
    assert live.restored == 1 and live.manager.suppressed["invalid"] == 1


@pytest.fixture(scope="module")
def away_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real broker of this module's own, which its tests stop and start again."""
    from live_stack import kafka_broker

    with kafka_broker(tmp_path_factory.mktemp("kafka"), create_topics=False) as broker:
        yield broker


def _producer(bootstrap: str, **extra: Any) -> Any:
    from confluent_kafka import Producer
    from forumpulse.pipeline.kafka_client import client_config

    return Producer(client_config({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                                   **extra}))


@pytest.mark.kafka
@pytest.mark.slow
def test_a_real_broker_away_and_back_gets_each_decision_once(away_broker: Any) -> None:
    """The stand-in's story with librdkafka and a real broker: while the broker is stopped a decision waits,
    then librdkafka gives it up (``message.timeout.ms``) and the guarded sink keeps it; once the broker is back
    the next flush sends it, and the topic holds every decision once, in order.  Each confirmation is handed
    to ``on_delivered`` (what ``decisions_published`` records)."""
    from live_stack import wait_until

    broker = away_broker
    if True:
        topic = broker.create_topic("decisions-away", 1)
        producer = _producer(broker.bootstrap, **{"message.timeout.ms": 4000})
        recorded: list[str] = []
        sink = _GuardedSink(KafkaSink(topic=topic, producer=producer, flush_timeout_s=0.5,
                                      on_delivered=recorded.extend), "kafka")
        sink.emit(decision("198.51.100.1"))
        wait_until(lambda: (sink.flush(), sink.inner.delivered)[1] == 1, 30, what="the first delivery")

        broker.stop()
        sink.emit(decision("198.51.100.2"))
        sink.flush()  # no report yet: waiting in the producer, not an error
        assert sink.inner.waiting == 1 and sink.errors == 0
        wait_until(lambda: (sink.flush(), sink.retrying)[1] == 1, 60, what="librdkafka giving the decision up")
        assert sink.errors >= 1 and sink.inner.failed >= 1 and recorded == ["d-198.51.100.1"]

        broker.start()
        wait_until(lambda: (sink.flush(), sink.inner.delivered)[1] == 2, 120, what="the decision sent again")
        assert sink.retrying == 0 and sink.inner.waiting == 0 and sink.dropped == 0
        sink.close()
        assert recorded == ["d-198.51.100.1", "d-198.51.100.2"]
        got = [json.loads(m.value)["id"] for m in broker.read_all(topic, expected=2)]
        assert got == ["d-198.51.100.1", "d-198.51.100.2"]


@pytest.mark.kafka
@pytest.mark.slow
def test_a_real_broker_away_gets_a_pending_detection_once(away_broker: Any) -> None:
    """The events publisher with librdkafka and a real broker stopped for five runs: the pending detection is
    queued once (the producer holds one message, not five), and once the broker is back the topic gets it once."""
    broker = away_broker
    topic = broker.create_topic("events-away", 1)
    producer = _producer(broker.bootstrap)
    pub = EventsPublisher(producer, timeout_s=0.3)
    broker.stop()
    try:
        for _ in range(5):  # five traffic runs hand the same open detection over
            pub(topic, b"det-1", b'{"state": "open"}')
            assert pub.confirm() == set()
        assert len(producer) == 1 and pub.waiting == 1 and pub.requeues_saved == 4
    finally:
        broker.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pub(topic, b"det-1", b'{"state": "open"}')  # the next run: answered by the queued message's report
        if pub.confirm() == {b"det-1"}:
            break
    else:
        raise AssertionError("the detection was never confirmed once the broker was back")
    assert [(m.key, m.value) for m in broker.read_all(topic, expected=1)] == [(b"det-1", b'{"state": "open"}')]


@pytest.mark.kafka
def test_on_a_real_broker_a_ban_lifted_at_start_follows_its_republished_ban(
        away_broker: Any, store: Store, settings: Settings) -> None:
    """The start order (republish, then restore) with librdkafka and a real topic of 3 partitions: the
    republished ban of an address now listed as a trusted proxy and the unban restore makes of it share the
    value's key, hence one partition, and the topic holds them in that order -- consumers end with the unban."""
    broker = away_broker
    topic = broker.create_topic("decisions-start-order", 3)
    settings.kafka.bootstrap_servers = broker.bootstrap
    settings.kafka.decisions_topic = topic
    settings.sites[0].trusted_proxies = ["10.0.0.5"]
    settings.actions = {"decision_api": {"enabled": False}}
    now = time.time()
    sink = StoreSink(store)
    for v in ("10.0.0.5", "198.51.100.60"):  # the proxy's ban and another one, both never confirmed
        sink.emit(replace(decision(v), id=f"ban-{v}", created_at=int((now - 60) * 1000), duration_s=3600))
    sink.close()
    live = LiveDos(settings, store, actions=[], publish=True)
    try:
        assert live.republished == 2
    finally:
        live.close()
    msgs = broker.read_all(topic, expected=3)
    by_key: dict[bytes, list[str]] = {}
    for m in msgs:
        by_key.setdefault(m.key, []).append(json.loads(m.value)["action"])
    assert by_key == {b"10.0.0.5": ["ban", "unban"], b"198.51.100.60": ["ban"]}
    assert {i for (i,) in store.query_rows(f"SELECT id FROM decisions_published WHERE topic = '{topic}'")} == {
        "ban-10.0.0.5", "ban-198.51.100.60", *(i for (i,) in store.query_rows(
            "SELECT id FROM decisions WHERE action = 'unban'"))}


def test_a_pending_detection_is_queued_once_not_once_per_run() -> None:
    kafka = FakeKafka()
    pub = EventsPublisher(kafka, timeout_s=0.01)
    for _ in range(5):  # five runs with the broker away, the detection unchanged
        pub("weblogs.events", b"det-1", b'{"state": "open"}')
        assert pub.confirm() == set()
    assert len(kafka.queue) == 1 and pub.waiting == 1 and pub.failures == 5 and pub.requeues_saved == 4
    pub("weblogs.events", b"det-1", b'{"state": "closed"}')  # a new state is a new message
    assert pub.confirm() == set() and len(kafka.queue) == 2 and pub.waiting == 1
    kafka.fail = "KafkaError{code=_MSG_TIMED_OUT}"
    pub("weblogs.events", b"det-1", b'{"state": "closed"}')  # still queued: answered by that message's report
    assert pub.confirm() == set() and pub.waiting == 0 and len(kafka.queue) == 0
    kafka.fail, kafka.up = None, True
    pub("weblogs.events", b"det-1", b'{"state": "closed"}')  # reported failed: queued again
    assert pub.confirm() == {b"det-1"} and kafka.delivered == [(b"det-1", b'{"state": "closed"}')]


@pytest.fixture
def slow_owner() -> Iterator[dict[str, Any]]:
    """An owner that takes a request and answers after ``delay`` seconds (a broker away held its unban ~23 s)."""
    state: dict[str, Any] = {"delay": 1.5, "got": []}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            state["got"].append(self.path)
            time.sleep(state["delay"])
            body = json.dumps({"unbanned": "198.51.100.7", "held": True}).encode()
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting: what the test is about

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield state
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_owner_that_answers_late_is_not_taken_for_no_owner(slow_owner: dict[str, Any], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(OwnerNoAnswer, match=r"did not answer within 0\.3 s"):
        owner_request(slow_owner["url"], "POST", "/fp/unban", {"value": "198.51.100.7"}, timeout=0.3)
    with pytest.raises(OSError):  # nothing listens: the caller may work directly
        owner_request("http://127.0.0.1:9", "GET", "/fp/decisions", timeout=0.3)
    # the CLI: no direct unban on the default store (./data/chdb) behind the owner's back
    from forumpulse.detectors import dos_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FORUMPULSE_CONFIG", raising=False)
    real = owner_request

    def short(*a: Any, **kw: Any) -> Any:
        return real(*a, **{**kw, "timeout": 0.3})

    monkeypatch.setattr("forumpulse.pipeline.live_detect.owner_request", short)
    with pytest.raises(SystemExit) as ex:
        dos_cli.unban_command("198.51.100.7", config=None, owner=slow_owner["url"], store=None, password_env=None,
                              reason="manual")
    assert ex.value.code == 1
    err = json.loads(capsys.readouterr().err)["error"]
    assert "did not answer within 0.3 s: it may still lift the ban; not done directly" in err, err
    assert not (tmp_path / "data").exists() and len(slow_owner["got"]) == 2
