"""DecisionManager: addresses never banned, one canonical key per address, circuit-breaker decisions, bounded
memory.  (The audit findings of the DoS detector and its actions; nftables ones are in test_dos_netns.py.)"""

from __future__ import annotations

import logging
import pathlib

import pytest
from forumpulse.detectors.actions import ActionError, parse_value
from forumpulse.detectors.decision_api import DecisionRegistry
from forumpulse.detectors.dos import Candidate, Decision, DecisionManager, canonical_value, never_ban_reason
from forumpulse.detectors.dos import log as dos_log
from forumpulse.detectors.dos_rules import DosConfig

T0 = 1_700_000_000_000


def cfg(**kw: object) -> DosConfig:
    kw.setdefault("crawlers", {"verify": "off"})
    return DosConfig(**kw)  # type: ignore[arg-type]


def cand(value: str, at: int = T0, scope: str | None = None, rule: str = "client_flood",
         duration: int = 600) -> Candidate:
    return Candidate(rule=rule, value=value, scope=scope or ("range" if "/" in value else "ip"), decided_at=at,
                     first_seen=at, duration_s=duration, evidence={"count": 30})


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def ban(self, d: Decision) -> None:
        self.calls.append(("ban", d.value))

    def unban(self, d: Decision) -> None:
        self.calls.append(("unban", d.value))


# ------------------------------------------------------------------------------- 1. addresses never banned


@pytest.mark.parametrize(("value", "reason"), [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("127.0.0.0/24", "loopback"), ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("0.0.0.0/24", "unspecified"),
    ("169.254.1.2", "link_local"), ("fe80::1", "link_local"), ("fe80::/64", "link_local"),
    ("224.0.0.251", "multicast"), ("ff02::1", "multicast"), ("239.1.2.0/24", "multicast"),
    ("126.0.0.0/7", "loopback"),  # a range that contains loopback
])
def test_special_addresses_are_never_banned_whatever_the_config(value: str, reason: str) -> None:
    act = Recorder()
    mgr = DecisionManager(cfg(allowlist=[]), actions=[act])
    assert mgr.submit(cand(value)) is None
    assert mgr.suppressed[reason] == 1 and mgr.decisions_made == 0
    assert act.calls == [] and not mgr.active
    assert never_ban_reason(parse_value(value)) == reason


def test_ordinary_addresses_are_still_banned() -> None:
    mgr = DecisionManager(cfg())
    for v in ("198.51.100.7", "2001:db8::7", "203.0.113.0/24", "10.0.0.1", "100.64.0.1"):
        assert mgr.submit(cand(v)) is not None, v
    assert never_ban_reason(parse_value("128.0.0.1")) is None


def test_firewall_actions_refuse_special_addresses_too() -> None:
    """A decision that did not come through the manager (restored from the table, made by hand) is refused."""
    from forumpulse.detectors.actions import IpsetAction, NftablesAction, WebhookAction

    d = Decision(id="x", created_at=0, decided_at=0, first_seen=0, expires_at=0, site="forum", action="ban",
                 value="::1", scope="ip", reason="client_flood", duration_s=60, mode="enforce", origin="forumpulse",
                 evidence={})
    for act in (NftablesAction(netns="fp-no-such-ns"), IpsetAction(netns="fp-no-such-ns"),
                WebhookAction("http://127.0.0.1:9/", "s", retries=0)):
        with pytest.raises(ActionError, match="loopback"):
            act.ban(d)


# ------------------------------------------------------------------------------- 2. one canonical key


@pytest.mark.parametrize(("raw", "canon"), [
    ("::ffff:198.51.100.7", "198.51.100.7"), ("::FFFF:198.51.100.7", "198.51.100.7"),
    ("2001:DB8::1", "2001:db8::1"), ("2001:0db8:0000:0000:0000:0000:0000:0001", "2001:db8::1"),
    ("198.51.100.7/32", "198.51.100.7"), ("203.0.113.9/24", "203.0.113.0/24"), (" 198.51.100.7 ", "198.51.100.7"),
    ("2001:db8:0:0::/64", "2001:db8::/64"),
])
def test_candidate_values_get_one_canonical_key(raw: str, canon: str) -> None:
    from forumpulse.pipeline.live_detect import normalize_value

    assert canonical_value(raw) == canon == normalize_value(raw)
    reg = DecisionRegistry()
    act = Recorder()
    mgr = DecisionManager(cfg(), actions=[act, reg])
    d = mgr.submit(cand(raw))
    assert d is not None and d.value == canon and list(mgr.active) == [canon]
    assert list(reg.active) == [canon]
    # the same address in another spelling is a repeat of the active ban, not a second one
    assert mgr.submit(cand(canon, at=T0 + 1000)) is None and mgr.suppressed["active"] == 1
    # an unban in any spelling finds it everywhere
    assert mgr.unban(raw) is not None
    assert not mgr.active and not reg.active and act.calls == [("ban", canon), ("unban", canon)]


def test_offences_are_counted_per_canonical_address() -> None:
    mgr = DecisionManager(cfg())
    d1 = mgr.submit(cand("::ffff:198.51.100.7", duration=60))
    d2 = mgr.submit(cand("198.51.100.7", at=T0 + 120_000, duration=60))
    assert d1 is not None and d2 is not None
    assert d2.evidence["offence"] == 2 and d2.duration_s == 60 * mgr.cfg.escalation.factor


def test_values_that_are_not_addresses_are_refused_with_a_reason() -> None:
    mgr = DecisionManager(cfg())
    for v in ("not-an-ip", "", "2001:db8::1%eth0"):
        assert mgr.submit(cand(v)) is None
    assert mgr.suppressed["invalid"] == 3 and mgr.decisions_made == 0


# ------------------------------------------------------------------------------- 3. scoped IPv6 addresses


@pytest.mark.parametrize("bad", ["fe80::1%eth0", "2001:db8::1%eth0", "2001:db8::1%1", "2001:db8::%eth0/64"])
def test_scope_ids_are_refused_at_parse_time(bad: str) -> None:
    with pytest.raises(ActionError, match="zone"):
        parse_value(bad)
    with pytest.raises(ValueError, match="zone"):
        canonical_value(bad)


# ------------------------------------------------------------------------------- 6. circuit breaker


def test_breaker_decisions_neither_block_later_bans_nor_count_as_offences() -> None:
    act = Recorder()
    mgr = DecisionManager(cfg(max_bans_per_minute=2), actions=[act])
    assert mgr.submit(cand("198.51.100.1")) is not None
    assert mgr.submit(cand("198.51.100.2")) is not None
    b = mgr.submit(cand("198.51.100.3", at=T0 + 1000))
    assert b is not None and b.mode == "breaker" and "198.51.100.3" not in mgr.active
    # the same offender again in the same minute: no second breaker record
    assert mgr.submit(cand("198.51.100.3", at=T0 + 2000)) is None and mgr.suppressed["breaker_repeat"] == 1
    # a minute later the budget is free again: a real ban, its first offence, enforced
    d = mgr.submit(cand("198.51.100.3", at=T0 + 61_000))
    assert d is not None and d.mode == "enforce" and d.evidence["offence"] == 1 and d.duration_s == 600
    assert mgr.active["198.51.100.3"] is d and ("ban", "198.51.100.3") in act.calls


def test_the_breaker_logs_one_line_per_minute_not_one_per_offender(caplog: pytest.LogCaptureFixture) -> None:
    """A swarm past the budget makes one breaker decision per offender for as long as its ban would have lasted
    (600 s here): recorded, logged once per minute, not again the next minute."""
    mgr = DecisionManager(cfg(max_bans_per_minute=1))
    with caplog.at_level(logging.WARNING, logger=dos_log.name):
        for minute in range(2):
            for i in range(50):
                mgr.submit(cand(f"198.51.100.{i + 1}", at=T0 + minute * 60_000 + i))
    lines = [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    assert len(lines) == 1, lines  # minute 2: .1 still banned, .2 enforced, .3-.50 already recorded
    assert sum(1 for d in mgr.decisions if d.mode == "breaker") == 49
    assert mgr.suppressed["breaker_repeat"] == 48
    # once the would-be ban is over (minute 11), an offender still over budget is recorded again
    for i in range(50):
        mgr.submit(cand(f"198.51.100.{i + 1}", at=T0 + 10 * 60_000 + i))
    assert sum(1 for d in mgr.decisions if d.mode == "breaker") == 49 + 48


# ------------------------------------------------------------------------------- 7. bounded memory


def test_decisions_and_offences_stay_bounded() -> None:
    mgr = DecisionManager(cfg(max_bans_per_minute=10**6), keep_decisions=50)
    window_ms = mgr.cfg.escalation.window_s * 1000
    n = 5000
    for i in range(n):
        at = T0 + i * (window_ms // 1000)  # the whole run spans 5 escalation windows
        assert mgr.submit(cand(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", at=at, duration=1)) is not None
    assert mgr.decisions_made == n and len(mgr.decisions) == 50
    assert mgr.decisions[-1].value == "10.0.19.135"  # the newest are kept
    # offences older than the escalation window are forgotten; at most about one window's worth is held
    assert len(mgr.offences) <= 2 * 1000 + 1
    assert all(h and h[-1] >= T0 + (n - 1) * (window_ms // 1000) - 2 * window_ms for h in mgr.offences.values())



def test_a_manual_unban_resets_the_escalation() -> None:
    """An operator unbans because the ban was wrong: the next ban of that value is a first offence (600 s), not
    offence 2 (2400 s) -- also when the ban had expired before the unban (the owner's unban, or one written on
    the store directly and picked up by the owner)."""
    mgr = DecisionManager(cfg())
    first = mgr.submit(cand("198.51.100.7", T0))
    assert first is not None and first.duration_s == 600
    assert mgr.unban("::ffff:198.51.100.7", now_ms=T0 + 1_000) is not None
    again = mgr.submit(cand("198.51.100.7", T0 + 2_000))
    assert again is not None and (again.duration_s, again.evidence["offence"]) == (600, 1)
    # expired, then unbanned by hand: nothing held, the history is forgotten all the same
    assert mgr.submit(cand("192.0.2.77", T0 + 650_000)) is not None  # stream time moves on: the ban expired
    assert mgr.unban("198.51.100.7", now_ms=T0 + 700_000) is None
    later = mgr.submit(cand("198.51.100.7", T0 + 800_000))
    assert later is not None and (later.duration_s, later.evidence["offence"]) == (600, 1)
    # without an unban a repeat escalates as before
    repeat = mgr.submit(cand("198.51.100.7", T0 + 1_500_000))
    assert repeat is not None and (repeat.duration_s, repeat.evidence["offence"]) == (2400, 2)


def test_an_unban_written_on_the_store_resets_the_escalation_in_the_owner() -> None:
    """`forumpulse detect unban` without an owner writes an unban row; the owner's periodic check lifts a ban it
    holds and forgets the value's offences, also when the ban had expired in its memory already."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos

    live = LiveDos(load_settings(None), store=None, actions=[], publish=False, restore=False,
                   clock=lambda: T0 / 1000 + 10)
    mgr = live.manager
    assert mgr.submit(cand("198.51.100.7", T0)) is not None
    assert mgr.submit(cand("192.0.2.77", T0 + 700_000)) is not None  # the first ban expired in memory
    assert "198.51.100.7" not in mgr.active and "198.51.100.7" in mgr.offences
    live._query = lambda sql, what: [("198.51.100.7", T0 + 720_000, "manual")]  # type: ignore[method-assign]
    assert live.sync_store_unbans() == 0  # nothing held to lift
    again = mgr.submit(cand("198.51.100.7", T0 + 800_000))
    assert again is not None and (again.duration_s, again.evidence["offence"]) == (600, 1)


def test_an_unban_lets_the_address_teach_its_baseline_again(caplog: pytest.LogCaptureFixture) -> None:
    """A ban stops its address (or range) teaching its learned rate until the ban's expiry; a manual unban -- the
    ban was wrong -- lifts that at once, through the owner and through an unban written on the store (from a
    review: a NAT banned by mistake kept not learning its rate and fell into repeated bans)."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos

    live = LiveDos(load_settings(None), store=None, actions=[], publish=False, restore=False,
                   clock=lambda: T0 / 1000 + 10)
    live.detector.baseline.tainted["198.51.100.7"] = T0 // 1000 + 600
    live.detector.prefix_rates.tainted["198.51.100.0/24"] = T0 // 1000 + 600
    with caplog.at_level(logging.INFO, logger="forumpulse"):
        live.unban("198.51.100.7")  # logged as a ban is (user trial 43: /fp/unban left no line)
    assert "dos decision: unban ip 198.51.100.7 (manual, no ban held here" in caplog.text
    live.unban("198.51.100.0/24")
    assert "198.51.100.7" not in live.detector.baseline.tainted
    assert "198.51.100.0/24" not in live.detector.prefix_rates.tainted
    live.detector.baseline.tainted["192.0.2.9"] = T0 // 1000 + 600
    live._query = lambda sql, what: [("192.0.2.9", T0 + 20_000, "manual")]  # type: ignore[method-assign]
    live.sync_store_unbans()
    assert "192.0.2.9" not in live.detector.baseline.tainted


def test_a_store_away_is_logged_when_the_unban_sync_starts_failing_then_sparingly_then_when_it_answers(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The unban sync runs at every firewall check (10 s): a store away logged a warning each time.  Now: one
    when it starts failing, repeats at most every QUERY_FAILURE_LOG_EVERY_S with how long and how often, and one
    line when it answers again."""
    import logging
    import time as _time

    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos

    class Store:
        away = True

        def query_rows(self, sql: str) -> list[tuple[str, int, str]]:
            if self.away:
                raise ConnectionError("Connection refused\nsecond line")
            return []

    st = Store()
    live = LiveDos(load_settings(None), store=st, actions=[], publish=False, restore=False,
                   clock=lambda: T0 / 1000 + 10)
    t = [1000.0]
    monkeypatch.setattr(_time, "monotonic", lambda: t[0])
    caplog.set_level(logging.INFO, logger="forumpulse")

    def said() -> list[str]:
        out = [r.getMessage() for r in caplog.records if "unbans" in r.getMessage()]
        caplog.clear()
        return out

    for _ in range(20):  # 20 checks, 10 s apart: 190 s
        assert live.sync_store_unbans() == 0
        t[0] += 10
    assert said() == ["could not read unbans from the store: Connection refused"]
    for _ in range(12):  # 120 s more: the 31st, 300 s after the first, says how long and how often
        live.sync_store_unbans()
        t[0] += 10
    assert said() == ["could not read unbans from the store: Connection refused (failing for 300 s, 31 attempt(s))"]
    st.away = False
    live.sync_store_unbans()
    live.sync_store_unbans()
    assert said() == ["the store answers again: read unbans from the store works (failed 32 time(s) over 320 s)"]
    st.away = True  # a new outage is told at once
    live.sync_store_unbans()
    assert said() == ["could not read unbans from the store: Connection refused"]
    st.query_rows = lambda sql: (_ for _ in ()).throw(TimeoutError())  # type: ignore[method-assign]
    live._query_failing.clear()  # an error without a message is named by its type
    live.sync_store_unbans()
    assert said() == ["could not read unbans from the store: TimeoutError"]


def test_a_store_failing_without_a_message_does_not_break_the_start(
        caplog: pytest.LogCaptureFixture, tmp_path: pathlib.Path) -> None:
    """An exception with an empty message (``TimeoutError()``) made the handlers that log store errors raise
    IndexError (``str(exc).splitlines()[0]``) -- at start, inside restore's own handler.  Now it is named by its
    type and the owner starts without the store's bans."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos
    from forumpulse.pipeline.runtime import error_line

    assert error_line(TimeoutError()) == "TimeoutError"
    assert error_line(ValueError("first\nsecond"), 3) == "fir"
    assert error_line(OSError(" \nsecond")) == "OSError"
    from forumpulse.pipeline.store import StoreError

    try:  # what every store method raises: the cause's empty text, then the SQL
        try:
            raise TimeoutError()
        except TimeoutError as inner:
            raise StoreError(f"{inner}\nSQL: SELECT 1") from inner
    except StoreError as wrapped:
        assert error_line(wrapped) == "TimeoutError"

    asked: list[str] = []

    class Store:
        def query_rows(self, sql: str) -> list[tuple[object, ...]]:
            asked.append(sql)
            raise TimeoutError()

    settings = load_settings(None)
    settings.detectors = {"live": {"spool_dir": str(tmp_path / "spool")}}
    settings.actions = {"decision_api": {"enabled": False}}
    caplog.set_level(logging.WARNING, logger="forumpulse")
    live = LiveDos(settings, store=Store(), actions=[], publish=False)
    assert live.restored == 0 and not live.manager.active
    assert "could not restore active decisions: TimeoutError" in caplog.text
    # the latest words are asked once at start; restore logs that error without asking the store away again
    assert sum("max(duration_s)" in q for q in asked) == 1, asked


def test_a_jsonl_path_that_cannot_be_opened_is_named_at_start(tmp_path: pathlib.Path) -> None:
    """``run --dos`` said "cannot start the owner: [Errno 2] No such file or directory: '...'" without the key."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos

    settings = load_settings(None)
    settings.actions = {"jsonl_path": str(tmp_path / "nope" / "d.jsonl"), "decision_api": {"enabled": False}}
    with pytest.raises(OSError, match=r"actions\.jsonl_path .*nope/d\.jsonl: No such file or directory"):
        LiveDos(settings, store=None, actions=[], publish=False, restore=False)


def test_a_failing_decision_sink_is_logged_when_it_starts_failing_then_sparingly_then_when_it_works(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store away: a flush follows every feed batch, and each failed one was a warning (user trial 43: 328
    in 81 s for one pending decision).  Now one when it starts failing, one a minute with the count, one when it
    works again; the decision is kept and stored once."""
    import time as _time

    from forumpulse.pipeline.live_detect import _GuardedSink

    class Sink:
        def __init__(self) -> None:
            self.buf: list[str] = []
            self.stored: list[str] = []
            self.away = True

        def emit(self, d: str) -> None:
            self.buf.append(d)

        def flush(self) -> None:
            b, self.buf = self.buf, []
            if self.away:
                raise ConnectionError("Connection refused")
            self.stored += b

    inner = Sink()
    sink = _GuardedSink(inner, "store")
    t = [500.0]
    monkeypatch.setattr(_time, "monotonic", lambda: t[0])
    caplog.set_level(logging.INFO, logger="forumpulse")
    sink.emit("ban-1")
    for _ in range(300):  # 75 s of flushes, 4 a second
        sink.flush()
        t[0] += 0.25
    said = [r.getMessage() for r in caplog.records if "decision sink" in r.getMessage()]
    assert said == ["decision sink store: flush failed (1 kept for retry): Connection refused",
                    "decision sink store: flush still failing (1 kept for retry; failing for 60 s, 241 attempt(s)): "
                    "Connection refused"], said
    caplog.clear()
    inner.away = False
    sink.flush()
    sink.flush()
    assert inner.stored == ["ban-1"] and sink.retrying == 0 and sink.errors == 300
    assert [r.getMessage() for r in caplog.records] == [
        "decision sink store: flushed again (it failed 300 time(s) over 75 s)"]


# ------------------------------------------------------------------------------- an address inside a range ban


def test_an_address_inside_an_enforced_range_ban_is_not_banned_again() -> None:
    """Its ban would block nothing more, yet took a place in the minute's breaker budget (from a trial); a range
    ban ending sooner, or one only observed, leaves the address its own ban."""
    act = Recorder()
    mgr = DecisionManager(cfg(max_bans_per_minute=2), actions=[act])
    assert mgr.submit(cand("198.51.100.0/24", rule="prefix_flood", duration=3600)) is not None
    for host in range(1, 6):  # five members tripping client_flood: none banned, the budget untouched
        assert mgr.submit(cand(f"198.51.100.{host}", at=T0 + host)) is None
    assert mgr.submit(cand("::ffff:198.51.100.9", at=T0 + 7)) is None  # in any spelling
    assert mgr.suppressed["active_range"] == 6
    outside = mgr.submit(cand("203.0.113.5", at=T0 + 8))  # the minute's second ban: within the budget of 2
    assert outside is not None and outside.mode == "enforce"
    assert act.calls == [("ban", "198.51.100.0/24"), ("ban", "203.0.113.5")]
    # a range ban ending before the address's own would: the address gets its own
    mgr.submit(cand("192.0.2.0/24", at=T0 + 61_000, rule="prefix_flood", duration=60))
    mine = mgr.submit(cand("192.0.2.7", at=T0 + 61_001, duration=600))
    assert mine is not None and mine.value == "192.0.2.7"
    observe = DecisionManager(cfg(mode="observe"))
    observe.submit(cand("198.51.100.0/24", rule="prefix_flood", duration=3600))
    assert observe.submit(cand("198.51.100.1", at=T0 + 1)) is not None  # an observed range blocks nothing
