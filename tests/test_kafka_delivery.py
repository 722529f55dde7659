"""Delivery to Kafka when the broker is away, without a broker (FakeKafka decides what a flush reports; the real
broker's path is in test_live_detect.py), and the CLI's owner client when the owner is slow:

* the DoS decision sink (KafkaSink inside the owner's _GuardedSink) keeps a decision Kafka did not confirm and
  sends it again; a closing sink says what it could not deliver (it returned quietly, from a review);
* the traffic events publisher queues a pending detection once, not once per run (from a review);
* ``detect unban`` whose owner took the request but answered late does not also unban directly (two unbans,
  two webhook calls, user trial 41).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeKafka
from forumpulse.detectors.dos import Decision, KafkaSink, UndeliveredError
from forumpulse.pipeline.live_detect import EventsPublisher, OwnerNoAnswer, _GuardedSink, owner_request


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
