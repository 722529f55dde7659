"""Decision stream for CrowdSec bouncers: a cursor per bouncer key, ids that survive a restart, a registry rebuilt
from the ``decisions`` table, deletions in startup answers, bounded state, connection limits, lookups."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from forumpulse.detectors.decision_api import DecisionApiServer, DecisionRegistry, decision_number
from forumpulse.detectors.dos import Decision, StoreSink

T0 = 1_760_000_000.0


def dec(value: str, action: str = "ban", duration: int = 600, id: str | None = None, at: float = T0) -> Decision:
    return Decision(id=id or f"{action}-{value}", created_at=int(at * 1000), decided_at=int(at * 1000),
                    first_seen=int(at * 1000), expires_at=int((at + duration) * 1000), site="forum", action=action,
                    value=value, scope="range" if "/" in value else "ip", reason="client_flood",
                    duration_s=duration if action == "ban" else 0, mode="enforce", origin="forumpulse", evidence={})


def poll(port: int, key: str, startup: bool, agent: str = "crowdsec-firewall-bouncer/v0.0.31") -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/decisions/stream?startup={str(startup).lower()}",
                                 headers={"X-Api-Key": key, "User-Agent": agent})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def values(answer: dict[str, Any], part: str) -> list[str]:
    return sorted(d["value"] for d in answer[part] or [])


def test_each_bouncer_key_has_its_own_cursor() -> None:
    """Two bouncers behind one address (a TLS proxy, NAT, one host) with their own keys each get every change
    (they used to share one cursor: each change reached only whichever polled first)."""
    reg = DecisionRegistry()
    srv = DecisionApiServer(reg, {"fw1": "k" * 20, "fw2": "m" * 20}, port=0).start()
    try:
        poll(srv.port, "k" * 20, True)
        poll(srv.port, "m" * 20, True)
        reg.ban(dec("203.0.113.7"))
        assert values(poll(srv.port, "k" * 20, False), "new") == ["203.0.113.7"]
        assert values(poll(srv.port, "m" * 20, False), "new") == ["203.0.113.7"]
        reg.unban(dec("203.0.113.7", "unban"))
        assert values(poll(srv.port, "m" * 20, False), "deleted") == ["203.0.113.7"]
        assert values(poll(srv.port, "k" * 20, False), "deleted") == ["203.0.113.7"]
        with pytest.raises(urllib.error.HTTPError) as ei:
            poll(srv.port, "x" * 20, True)
        assert ei.value.code == 403
        assert srv.shared_keys == set()
        # one key polled by two different clients: told apart where possible, and logged as shared
        poll(srv.port, "k" * 20, False, agent="other-bouncer/1")
        assert srv.shared_keys == {"fw1"}
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="same key"):
        DecisionApiServer(DecisionRegistry(), {"a": "k" * 20, "b": "k" * 20}, port=0)


def test_config_takes_several_bouncer_keys() -> None:
    from forumpulse.detectors.dos_rules import ActionsConfig

    cfg = ActionsConfig.model_validate({"decision_api": {"enabled": True, "api_key": "a" * 20, "bouncers": [
        {"name": "fw1", "api_key": "b" * 20}, {"name": "fw2", "api_key": "c" * 20}]}}).decision_api
    assert cfg.keys() == {"default": "a" * 20, "fw1": "b" * 20, "fw2": "c" * 20}
    for bad, why in (({"bouncers": [{"name": "a", "api_key": "x"}, {"name": "b", "api_key": "x"}]}, "same api_key"),
                     ({"api_key": "x", "bouncers": [{"name": "default", "api_key": "y"}]}, "unique"),
                     ({"enabled": True, "bouncers": []}, "needs api_key")):
        with pytest.raises(ValueError, match=why):
            ActionsConfig.model_validate({"decision_api": bad})


def test_restart_keeps_ids_and_delivers_deletions_made_while_down() -> None:
    """After a restart the registry is rebuilt from the decisions rows; a bouncer whose cursor belongs to the old
    process gets the bans still in force with the ids it already holds, and the deletion (same id) of a ban
    lifted while forumpulse was down (it used to get a startup answer without deletions, ids from 1)."""
    now = [T0 + 100]
    first = DecisionRegistry(clock=lambda: now[0])
    a, b = dec("198.51.100.1", id="uuid-a", at=T0), dec("2001:db8::5", id="uuid-b", at=T0)
    first.ban(a)
    first.ban(b)
    held = {d["value"]: d["id"] for d in first.stream("fw1|x", True)["new"]}
    assert held == {"198.51.100.1": decision_number("uuid-a", "198.51.100.1"),
                    "2001:db8::5": decision_number("uuid-b", "2001:db8::5")}
    assert all(0 < i < 2**53 for i in held.values())

    now[0] = T0 + 300  # restarted; 2001:db8::5 was unbanned on the store while it was down
    second = DecisionRegistry(clock=lambda: now[0])
    rows = [a, b, dec("2001:db8::5", "unban", at=T0 + 200), dec("192.0.2.1", id="old", duration=60, at=T0 - 30)]
    assert second.load(rows) == 1
    second.ban(Decision(**{**a.__dict__, "duration_s": 300}))  # the restore bans it again: no change
    out = second.stream("fw1|x", False)  # a cursor of the previous process
    assert [(d["value"], d["id"]) for d in out["new"]] == [("198.51.100.1", held["198.51.100.1"])]
    assert {d["value"]: d["id"] for d in out["deleted"]} == {
        "2001:db8::5": held["2001:db8::5"], "192.0.2.1": decision_number("old", "192.0.2.1")}
    assert second.stream("fw1|x", False) == {"new": None, "deleted": None}


def test_registry_rebuilt_from_the_store(store: Any) -> None:
    sink = StoreSink(store)
    for d in (dec("198.51.100.1", id="a", at=T0), dec("198.51.100.2", id="b", at=T0),
              dec("198.51.100.2", "unban", at=T0 + 10), dec("198.51.100.3", id="c", duration=60, at=T0),
              dec("198.51.100.4", id="gone", duration=60, at=T0 - 30 * 86_400), dec("127.0.0.1", id="lo", at=T0)):
        sink.emit(d)
    sink.flush()
    reg = DecisionRegistry(clock=lambda: T0 + 100)
    assert reg.load_store(store) == 1
    out = reg.stream("fw1|x", True)
    assert values(out, "new") == ["198.51.100.1"] and values(out, "deleted") == ["198.51.100.2", "198.51.100.3"]
    assert out["new"][0]["id"] == decision_number("a", "198.51.100.1")


def test_startup_answers_carry_recent_deletions() -> None:
    """A bouncer restarted with startup=true (its kernel set survived) is told what was lifted or expired, as
    LAPI does, until keep_deleted_s; a cursor older than the change log gets the same answer."""
    now = [T0]
    reg = DecisionRegistry(clock=lambda: now[0], keep_deleted_s=3600, max_log=3)
    reg.stream("b|1", True)
    reg.ban(dec("198.51.100.1"))
    reg.ban(dec("198.51.100.2", duration=60))
    reg.unban(dec("198.51.100.1", "unban"))
    now[0] += 61
    first = reg.stream("b|2", True)
    assert first["new"] is None and values(first, "deleted") == ["198.51.100.1", "198.51.100.2"]
    # negative durations, the time since each ended, as LAPI's: lifted 61 s ago, expired 1 s ago
    assert [d["duration"] for d in first["deleted"]] == ["-61s", "-1s"]
    for i in range(5):  # the change log (3 entries) no longer reaches b|1's cursor
        reg.ban(dec(f"198.51.100.{10 + i}"))
    late = reg.stream("b|1", False)
    assert len(late["new"]) == 5 and values(late, "deleted") == ["198.51.100.1", "198.51.100.2"]
    now[0] += 3600  # the first two deletions are older than keep_deleted_s; the five bans have expired since
    assert values(reg.stream("b|3", True), "deleted") == [f"198.51.100.{10 + i}" for i in range(5)]


def test_registry_stays_bounded_without_polls() -> None:
    now = [T0]
    reg = DecisionRegistry(clock=lambda: now[0], keep_deleted_s=3600)
    for i in range(20_000):
        reg.ban(dec(f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"))
        now[0] += 2.0
    assert len(reg.active) <= 301 and len(reg.log) == 0
    assert len(reg.deleted) <= 1801 and len(reg._expiry) <= 2 * 301 + 1024
    reg.stream("b|1", True)
    reg.ban(dec("192.0.2.1"))
    assert len(reg.log) == 1  # only what the one cursor has not seen


def test_lookup_of_an_ipv4_mapped_address() -> None:
    reg = DecisionRegistry()
    reg.ban(dec("192.0.2.9"))
    reg.ban(dec("203.0.113.0/24"))
    assert [d["value"] for d in reg.lookup("::ffff:192.0.2.9") or []] == ["192.0.2.9"]
    assert [d["value"] for d in reg.lookup("::FFFF:203.0.113.8") or []] == ["203.0.113.0/24"]
    assert reg.lookup("::ffff:192.0.2.10") is None


def test_idle_connections_are_closed_and_capped() -> None:
    """Unauthenticated connections that never finish their headers are closed after timeout_s, and at most
    max_connections are served at a time (each used to hold a thread forever)."""
    reg = DecisionRegistry()
    srv = DecisionApiServer(reg, "k" * 20, port=0, timeout_s=0.5, max_connections=4).start()
    base = threading.active_count()
    socks = []
    try:
        for _ in range(10):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"GET /v1/decisions/stream HTTP/1.1\r\n")
            socks.append(s)
        time.sleep(0.2)
        assert threading.active_count() <= base + 4
        deadline = time.monotonic() + 5
        for s in socks:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            assert s.recv(1) == b""  # closed by the server
        for _ in range(50):
            if threading.active_count() <= base:
                break
            time.sleep(0.05)
        assert threading.active_count() <= base and srv.refused >= 1
        assert poll(srv.port, "k" * 20, True) == {"new": None, "deleted": None}
    finally:
        for s in socks:
            s.close()
        srv.stop()


def _get(port: int, path: str, key: str = "k" * 20) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"X-Api-Key": key})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


def test_lapi_filters_and_usage_metrics_as_stock_bouncers_use_them() -> None:
    """``scopes``, ``origins`` and the scenario filters narrow the stream and lookups (a bouncer configured for
    addresses only gets no ranges; they were ignored, user trial 37); ``POST /v1/usage-metrics``, which current
    bouncers push, is accepted (201; it answered 501 with an HTML page) -- with a valid key only."""
    reg = DecisionRegistry()
    srv = DecisionApiServer(reg, "k" * 20, port=0).start()
    try:
        reg.ban(dec("203.0.113.7"))
        reg.ban(dec("198.51.100.0/24"))
        s = "/v1/decisions/stream?startup=true"
        assert values(_get(srv.port, s), "new") == ["198.51.100.0/24", "203.0.113.7"]
        assert values(_get(srv.port, s + "&scopes=ip"), "new") == ["203.0.113.7"]
        assert values(_get(srv.port, s + "&scopes=Range"), "new") == ["198.51.100.0/24"]
        assert values(_get(srv.port, s + "&scopes=ip,range"), "new") == ["198.51.100.0/24", "203.0.113.7"]
        assert _get(srv.port, s + "&origins=crowdsec")["new"] is None
        assert values(_get(srv.port, s + "&origins=forumpulse,cscli"), "new") == ["198.51.100.0/24", "203.0.113.7"]
        assert _get(srv.port, s + "&scenarios_containing=http-probing")["new"] is None
        assert _get(srv.port, s + "&scenarios_not_containing=client_flood")["new"] is None
        assert len(_get(srv.port, s + "&scenarios_containing=flood")["new"]) == 2
        assert _get(srv.port, "/v1/decisions?ip=198.51.100.9&scopes=ip") is None
        assert [d["value"] for d in _get(srv.port, "/v1/decisions?ip=198.51.100.9")] == ["198.51.100.0/24"]
        body = json.dumps({"remediation_components": [{"version": "v0.0.31", "type": "crowdsec-firewall-bouncer"}]})

        def push(key: str, path: str = "/v1/usage-metrics") -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", data=body.encode(), method="POST",
                                         headers={"X-Api-Key": key, "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return int(r.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert push("k" * 20) == 201 and srv.usage_metrics == 1
        assert push("x" * 20) == 403 and push("k" * 20, "/v1/watchers") == 404 and srv.usage_metrics == 1
    finally:
        srv.stop()


def test_a_deletion_is_not_sent_while_its_value_is_banned_again() -> None:
    """An expired or replaced ban of a value banned again is not sent as a deletion next to the new ban (LAPI
    hides it behind the later decision): bouncers that apply ``new`` before ``deleted`` and delete by value
    (the PHP remediation engine, older Traefik plugins) dropped the escalated re-ban.  Once the value has no ban
    in force, its deletions are sent again."""
    now = [T0]
    reg = DecisionRegistry(clock=lambda: now[0])
    reg.stream("b|1", True)
    reg.ban(dec("203.0.113.7", duration=60, id="first"))
    assert values(reg.stream("b|1", False), "new") == ["203.0.113.7"]
    now[0] += 61  # expired ...
    reg.ban(dec("203.0.113.7", duration=240, id="again"))  # ... and banned again (escalated) before the next poll
    out = reg.stream("b|1", False)
    assert [d["id"] for d in out["new"]] == [decision_number("again", "203.0.113.7")] and out["deleted"] is None
    startup = reg.stream("b|2", True)
    assert values(startup, "new") == ["203.0.113.7"] and startup["deleted"] is None
    reg.ban(dec("203.0.113.7", duration=960, id="third"))  # replaced while in force
    out = reg.stream("b|1", False)
    assert [d["id"] for d in out["new"]] == [decision_number("third", "203.0.113.7")] and out["deleted"] is None
    reg.unban(dec("203.0.113.7", "unban"))
    assert [d["id"] for d in reg.stream("b|1", False)["deleted"] or []] == [decision_number("third", "203.0.113.7")]
    gone = {d["id"] for d in reg.stream("b|3", True)["deleted"] or []}
    assert gone == {decision_number(i, "203.0.113.7") for i in ("first", "again", "third")}


def test_lookup_filters_value_type_range_contains_and_head() -> None:
    """``GET /v1/decisions`` takes LAPI's ``scope``, ``value``, ``type``, ``range`` and ``contains`` (they were
    ignored: the PHP bouncers' country look-up ``scope=Country&value=FR`` got every ban, and they apply what
    comes back to the visitor); ``HEAD`` answers 200 with no body, as LAPI."""
    reg = DecisionRegistry()
    srv = DecisionApiServer(reg, "k" * 20, port=0).start()
    try:
        reg.ban(dec("203.0.113.7"))
        reg.ban(dec("198.51.100.0/24"))
        reg.ban(dec("2001:db8::5"))

        def got(query: str) -> list[str] | None:
            out = _get(srv.port, "/v1/decisions?" + query)
            return None if out is None else sorted(d["value"] for d in out)

        assert got("scope=Country&value=FR") is None and got("scope=as&value=13335") is None
        assert got("scope=ip&value=203.0.113.7") == ["203.0.113.7"] and got("scope=Ip") == ["2001:db8::5", "203.0.113.7"]
        assert got("value=198.51.100.0/24") == ["198.51.100.0/24"] and got("value=198.51.100.0") is None
        assert got("ip=203.0.113.7&type=captcha") is None and got("ip=203.0.113.7&type=ban") == ["203.0.113.7"]
        assert got("range=198.51.100.128/25") == ["198.51.100.0/24"] and got("range=198.51.0.0/16") is None
        assert got("range=198.51.0.0/16&contains=false") == ["198.51.100.0/24"]
        assert got("range=203.0.0.0/8&contains=false") == ["203.0.113.7"] and got("range=2001:db8::/32") is None
        assert got("range=2001:db8::/32&contains=false") == ["2001:db8::5"]
        for bad in ("range=198.51.100.0/33", "ip=203.0.113.7&contains=maybe", "ip=", "range=&scope=ip"):
            with pytest.raises(urllib.error.HTTPError) as ei:
                _get(srv.port, "/v1/decisions?" + bad)
            assert ei.value.code == 400
        for key, path, code in (("k" * 20, "/v1/decisions", 200), ("k" * 20, "/v1/decisions/stream", 200),
                                ("x" * 20, "/v1/decisions", 403), ("k" * 20, "/v1/alerts", 404)):
            req = urllib.request.Request(f"http://127.0.0.1:{srv.port}{path}", method="HEAD", headers={"X-Api-Key": key})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    status, body = int(r.status), r.read()
            except urllib.error.HTTPError as exc:
                status, body = int(exc.code), exc.read()
            assert (status, body) == (code, b"")
    finally:
        srv.stop()
