"""Webhook (signed, retried) against a local http.server, and the CrowdSec-compatible decision stream."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from forumpulse.detectors.actions import (
    ActionError,
    WebhookAction,
    parse_value,
    verify_signature,
    verify_timed_signature,
)
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
            timed = verify_timed_signature(SECRET.encode(), body, self.headers.get("X-Forumpulse-Timestamp"),
                                           self.headers.get("X-Forumpulse-Signature-Timed"))
            assert ok == timed  # both signatures, with one secret
            state.setdefault("raw", []).append((body, self.headers.get("X-Forumpulse-Timestamp"),
                                                self.headers.get("X-Forumpulse-Signature-Timed")))
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
    # the timed signature refuses a replay: the same delivery, ten minutes later, or with another timestamp
    body, ts, sig = receiver["raw"][0]
    assert verify_timed_signature(SECRET.encode(), body, ts, sig, now=int(ts) + 60)
    assert not verify_timed_signature(SECRET.encode(), body, ts, sig, now=int(ts) + 600)
    assert not verify_timed_signature(SECRET.encode(), body, str(int(ts) + 600), sig, now=int(ts) + 600)
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


class _FakeIpset:
    """``_run`` for IpsetAction without root: sets of element -> timeout, refusing what ipset 7 refuses (a timeout
    over 2147483 s) plus the elements in ``bad``; ``restore`` stops at the first refused line, as ipset does."""

    def __init__(self, bad: tuple[str, ...] = ()) -> None:
        self.sets: dict[str, dict[str, int]] = {}
        self.bad = bad
        self.calls: list[list[str]] = []

    def _add(self, name: str, el: str, timeout: int) -> None:
        if timeout > 2_147_483 or el in self.bad:
            raise ActionError(f"ipset add {name} {el} failed (1): ipset v7.17: Syntax error: bad element")
        self.sets[name][el] = timeout

    def __call__(self, argv: Any, stdin: str | None = None) -> str:
        argv = list(argv)
        self.calls.append(argv)
        if argv[:2] == ["ipset", "create"]:
            self.sets.setdefault(argv[2], {})
        elif argv[:2] == ["ipset", "save"]:
            return "".join(f"add {argv[2]} {e} timeout {t}\n" for e, t in self.sets.get(argv[2], {}).items())
        elif argv[:2] == ["ipset", "add"]:
            self._add(argv[2], argv[3], int(argv[argv.index("timeout") + 1]))
        elif argv[:3] == ["ipset", "-exist", "restore"]:
            for line in (stdin or "").splitlines():
                p = line.split()
                self._add(p[1], p[2], int(p[4]))
        return ""


def test_ipset_long_ban_is_clamped_and_one_bad_element_blocks_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ban longer than ipset's maximum timeout used to be recorded, fail, and then fail every later ``ipset
    restore`` batch (so later bans were not applied either).  Now it is added with 2147483 s and added again for
    what it has left when the kernel dropped it; an element ipset refuses is added one by one, dropped from the
    record, and the others go in."""
    from forumpulse.detectors import actions
    from forumpulse.detectors.actions import IPSET_MAX_TIMEOUT, IpsetAction

    fake = _FakeIpset(bad=("198.51.100.66",))
    monkeypatch.setattr(actions, "_run", fake)
    now = [1000.0]
    a = IpsetAction(iptables_rule=False, clock=lambda: now[0])
    a.ban(decision("198.51.100.1", duration=30 * 86_400))
    a.ban(decision("198.51.100.2"))
    assert fake.sets["forumpulse4"] == {"198.51.100.1": IPSET_MAX_TIMEOUT, "198.51.100.2": 600}
    # the kernel drops the clamped element after 24.8 days; the periodic check puts it back for the rest
    now[0] += IPSET_MAX_TIMEOUT + 10
    fake.sets["forumpulse4"].clear()
    a.ensure()
    assert fake.sets["forumpulse4"] == {"198.51.100.1": 30 * 86_400 - IPSET_MAX_TIMEOUT - 10}
    # one element ipset refuses (put in the record as an earlier run could have) keeps no other out
    fake.sets["forumpulse4"].clear()
    a.held.put(parse_value("198.51.100.66"), 600)
    a.held.put(parse_value("198.51.100.3"), 600)
    with pytest.raises(ActionError, match=r"refused 1 of 3 element\(s\): 198.51.100.66"):
        a.ensure()
    assert sorted(fake.sets["forumpulse4"]) == ["198.51.100.1", "198.51.100.3"]
    a.ban(decision("198.51.100.4"))
    fake.sets["forumpulse4"].clear()
    a.ensure()  # the refused element left the record: the check no longer fails
    assert sorted(fake.sets["forumpulse4"]) == ["198.51.100.1", "198.51.100.3", "198.51.100.4"]


def _raw_receiver(answer: Callable[[socket.socket], None]) -> tuple[str, Callable[[], None]]:
    """A TCP server reading one request per connection and answering with ``answer(conn)``."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, rest = data.partition(b"\r\n\r\n")
                length = int(next(x.split(b":")[1] for x in head.split(b"\r\n") if x.lower().startswith(
                    b"content-length")))
                while len(rest) < length:
                    rest += conn.recv(65536)
                with contextlib.suppress(OSError):
                    answer(conn)

    threading.Thread(target=serve, daemon=True).start()

    def close() -> None:
        stop.set()
        srv.close()

    return f"http://127.0.0.1:{srv.getsockname()[1]}/hook", close


def test_webhook_retries_408_and_429_after_retry_after() -> None:
    codes = [b"429 Too Many Requests\r\nRetry-After: 3", b"408 Request Timeout", b"204 No Content"]

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 " + codes.pop(0) + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    url, close = _raw_receiver(answer)
    sleeps: list[float] = []
    try:
        assert WebhookAction(url, SECRET, retries=3, backoff_s=0.01, sleep=sleeps.append)._post({"a": 1}) == 204
    finally:
        close()
    assert sleeps == [3.0, 0.02] and codes == []


def test_webhook_timeout_bounds_the_whole_attempt() -> None:
    """A receiver trickling its answer (a byte every 0.3 s, under the 1 s socket timeout) is cut off after
    timeout_s; it used to hold the delivery worker for as long as it kept trickling."""

    def answer(conn: socket.socket) -> None:
        for b in b"HTTP/1.1 204 No Content\r\nX-Slow: " + b"a" * 40 + b"\r\n\r\n":
            conn.sendall(bytes([b]))
            time.sleep(0.3)

    url, close = _raw_receiver(answer)
    t0 = time.monotonic()
    try:
        with pytest.raises(ActionError, match="after 1 attempts"):
            WebhookAction(url, SECRET, retries=0, timeout_s=1.0, sleep=lambda s: None).ban(decision("198.51.100.7"))
    finally:
        close()
    assert time.monotonic() - t0 < 3
