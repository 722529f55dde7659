"""Webhook (signed, retried) against a local http.server, and the CrowdSec-compatible decision stream."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from forumpulse.detectors.actions import ActionError, WebhookAction, parse_value, verify_signature
from forumpulse.detectors.decision_api import DecisionApiServer, DecisionRegistry
from forumpulse.detectors.dos import Decision

SECRET = "test-shared-secret"


def decision(value: str, action: str = "ban", duration: int = 600, reason: str = "client_flood") -> Decision:
    return Decision(id="d-" + value, created_at=0, decided_at=1_700_000_000_000, first_seen=1_700_000_000_000,
                    expires_at=1_700_000_600_000, site="forum", action=action, value=value,
                    scope="range" if "/" in value else "ip", reason=reason, duration_s=duration, mode="enforce",
                    origin="forumpulse", evidence={"count": 40})


@pytest.fixture
def receiver() -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"fail_first": 0, "got": [], "codes": []}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if state["fail_first"] > 0:
                state["fail_first"] -= 1
                state["codes"].append(503)
                self.send_response(503)
                self.end_headers()
                return
            ok = verify_signature(SECRET.encode(), body, self.headers.get("X-Forumpulse-Signature"))
            state["got"].append((ok, json.loads(body)))
            state["codes"].append(204 if ok else 401)
            self.send_response(204 if ok else 401)
            self.end_headers()

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["url"] = f"http://127.0.0.1:{srv.server_address[1]}/hook"
    yield state
    srv.shutdown()
    srv.server_close()


def test_webhook_signed_and_retried(receiver: dict[str, Any]) -> None:
    sleeps: list[float] = []
    receiver["fail_first"] = 2
    w = WebhookAction(receiver["url"], SECRET, retries=3, backoff_s=0.01, sleep=sleeps.append)
    w.ban(decision("198.51.100.7"))
    assert receiver["codes"] == [503, 503, 204]
    assert sleeps == [0.01, 0.02]  # exponential backoff
    ok, payload = receiver["got"][0]
    assert ok and payload["value"] == "198.51.100.7" and payload["action"] == "ban"
    # a wrong secret is rejected by the receiver (4xx: not retried)
    bad = WebhookAction(receiver["url"], "wrong", retries=3, backoff_s=0.01, sleep=sleeps.append)
    with pytest.raises(ActionError, match="HTTP 401"):
        bad.unban(decision("198.51.100.7", action="unban"))
    assert receiver["got"][-1][0] is False and len(sleeps) == 2
    receiver["fail_first"] = 10
    with pytest.raises(ActionError, match="after 2 attempts"):
        WebhookAction(receiver["url"], SECRET, retries=1, backoff_s=0, sleep=sleeps.append).ban(decision("1.2.3.4"))


@pytest.mark.parametrize("bad", ["1.2.3.4; rm -rf /", "1.2.3.4 } ; flush ruleset", "0.0.0.0/0", "", "::/0", "host"])
def test_values_are_validated_before_any_command(bad: str) -> None:
    with pytest.raises(ActionError):
        parse_value(bad)


def test_parse_value_normalises() -> None:
    assert str(parse_value("::ffff:10.1.2.3")) == "10.1.2.3/32"
    assert str(parse_value("10.1.2.99/24")) == "10.1.2.0/24"


def _get(port: int, path: str, key: str = SECRET) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"X-Api-Key": key})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_decision_stream_protocol() -> None:
    now = [1000.0]
    reg = DecisionRegistry(clock=lambda: now[0])
    srv = DecisionApiServer(reg, SECRET, port=0).start()
    try:
        with pytest.raises(urllib.error.HTTPError) as ei:
            _get(srv.port, "/v1/decisions/stream?startup=true", key="nope")
        assert ei.value.code == 403
        reg.ban(decision("198.51.100.7", duration=60))
        reg.ban(decision("192.0.2.0/24", duration=600))
        first = _get(srv.port, "/v1/decisions/stream?startup=true")
        assert first["deleted"] is None
        assert {(d["value"], d["scope"], d["type"]) for d in first["new"]} == {
            ("198.51.100.7", "Ip", "ban"), ("192.0.2.0/24", "Range", "ban")}
        assert all(d["origin"] == "forumpulse" and d["scenario"].startswith("forumpulse/") for d in first["new"])
        assert {d["duration"] for d in first["new"]} == {"60s", "600s"}
        assert _get(srv.port, "/v1/decisions/stream?startup=false") == {"new": None, "deleted": None}
        reg.unban(decision("192.0.2.0/24", action="unban"))
        reg.ban(decision("2001:db8::1"))
        now[0] += 61  # the /32 ban expires
        nxt = _get(srv.port, "/v1/decisions/stream?startup=false")
        assert [d["value"] for d in nxt["new"]] == ["2001:db8::1"]
        assert sorted(d["value"] for d in nxt["deleted"]) == ["192.0.2.0/24", "198.51.100.7"]
        assert _get(srv.port, "/v1/decisions?ip=2001:db8::1")[0]["value"] == "2001:db8::1"
        assert _get(srv.port, "/v1/decisions?ip=198.51.100.7") is None
        reg.ban(decision("203.0.113.0/24"))
        assert _get(srv.port, "/v1/decisions?ip=203.0.113.77")[0]["scope"] == "Range"
    finally:
        srv.stop()


def test_empty_api_key_refused() -> None:
    with pytest.raises(ValueError, match="api_key"):
        DecisionApiServer(DecisionRegistry(), "", port=0)


def test_webhook_retries_do_not_hold_up_bans(receiver: dict[str, Any]) -> None:
    """A failing receiver (503 twice, backoff 0.4 s then 0.8 s) delays neither the manager nor the decision API:
    the webhook built from the config delivers in the background, in order, and still retries."""
    import time

    from forumpulse.detectors.actions import build_actions
    from forumpulse.detectors.dos import Candidate, DecisionManager
    from forumpulse.detectors.dos_rules import ActionsConfig, DosConfig

    receiver["fail_first"] = 2
    cfg = ActionsConfig.model_validate({"webhook": {"enabled": True, "url": receiver["url"], "secret": SECRET,
                                                    "retries": 3, "backoff_s": 0.4}})
    reg = DecisionRegistry()
    acts = build_actions(cfg, registry=reg)
    assert acts[0] is reg  # the in-memory registry first: bouncers see a ban before any network call
    mgr = DecisionManager(DosConfig(crawlers={"verify": "off"}), actions=acts)  # type: ignore[arg-type]
    t0 = time.monotonic()
    for i in range(3):
        mgr.submit(Candidate(rule="client_flood", value=f"198.51.100.{i + 1}", scope="ip",
                             decided_at=1_700_000_000_000 + i, first_seen=1_700_000_000_000, duration_s=600,
                             evidence={}))
    mgr.unban("198.51.100.1")
    took = time.monotonic() - t0
    assert took < 0.6, f"bans waited {took:.2f} s for the webhook"
    assert sorted(reg.active) == ["198.51.100.2", "198.51.100.3"] and mgr.action_errors == 0
    hook = next(a for a in acts if a.name == "webhook")
    assert hook.join(timeout=10)  # everything delivered
    assert receiver["codes"] == [503, 503, 204, 204, 204, 204]
    assert [(p["action"], p["value"]) for ok, p in receiver["got"] if ok] == [
        ("ban", "198.51.100.1"), ("ban", "198.51.100.2"), ("ban", "198.51.100.3"), ("unban", "198.51.100.1")]


def test_webhook_gives_up_at_exit_with_a_trace(tmp_path: Any) -> None:
    """Decisions still undelivered when the exit wait ends (queued, or being retried) are logged with their
    values and counted in ``failed`` (they used to vanish without a trace)."""
    import subprocess
    import sys

    script = tmp_path / "exit.py"
    script.write_text(
        "import atexit, logging\n"
        "logging.basicConfig(level=logging.ERROR, format='%(levelname)s %(message)s')\n"
        "from forumpulse.detectors.actions import WebhookAction\n"
        "from forumpulse.detectors.dos import Decision\n"
        "hook = WebhookAction('http://127.0.0.1:9/', 's', retries=4, backoff_s=0.5, background=True)\n"
        "hook.exit_wait_s = 0.3\n"
        "atexit.register(lambda: print('failed', hook.failed, flush=True))  # runs after the webhook's own\n"
        "def d(v, action='ban'):\n"
        "    return Decision(id='x', created_at=0, decided_at=0, first_seen=0, expires_at=0, site='f',\n"
        "                    action=action, value=v, scope='ip', reason='client_flood', duration_s=600,\n"
        "                    mode='enforce', origin='forumpulse', evidence={})\n"
        "for i in range(25):\n"
        "    hook.ban(d(f'198.51.100.{i + 1}'))\n"
        "hook.unban(d('198.51.100.1', 'unban'))\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False)
    assert p.returncode == 0, p.stderr
    assert "failed 26" in p.stdout
    line = next(x for x in p.stderr.splitlines() if "undelivered" in x)
    assert "gave up 26 undelivered decision(s)" in line
    assert "ban 198.51.100.1, ban 198.51.100.2," in line and "and 6 more" in line
    assert "ban 198.51.100.21" not in line


def test_firewall_record_keeps_what_is_in_force() -> None:
    """The record the nftables/ipset actions re-add from: wall-clock expiry, lifted on unban, an adopted kernel
    element never overrides a recorded ban, and expired entries are dropped (also now and then on put)."""
    from forumpulse.detectors.actions import _Held

    now = [1000.0]
    h = _Held(lambda: now[0])
    h.put(parse_value("198.51.100.1"), 600)
    h.put(parse_value("203.0.113.0/24"), 60)
    h.adopt(parse_value("198.51.100.1"), 5)  # already recorded: kept as it is
    h.adopt(parse_value("198.51.100.2"), 300)
    h.put(parse_value("198.51.100.3"), 600)
    h.drop(parse_value("198.51.100.3"))
    now[0] += 59.5
    assert sorted((str(n), s) for n, s in h.in_force()) == [("198.51.100.1/32", 540), ("198.51.100.2/32", 240)]
    for i in range(5000):
        h.put(parse_value(f"10.0.{i // 256}.{i % 256}"), 1)
        now[0] += 0.01
    assert len(h._d) < 5000 and len(h) == 2  # the 1 s bans are gone, the two long ones stay
