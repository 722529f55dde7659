"""Traffic detector runs against a real chDB store: live runs survive store failures (nothing lost, nothing fed
twice, sites isolated), history runs judge liveness with heartbeats up to the end of the range only, and report
events that started before ``--from`` but overlap the range."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from forumpulse.detectors.series import Detection
from forumpulse.detectors.traffic import LIVE_CLOCK_SKEW_S, TrafficDetector, TrafficRunError, detect_history
from forumpulse.pipeline.config import Settings, SiteConfig
from forumpulse.pipeline.store import Store, StoreError
from table_rows import forum_requests

DAY0 = datetime(2026, 3, 9, tzinfo=UTC)  # a Monday


def _requests(site: str, end: datetime, down: list[tuple[datetime, datetime]], seed: int) -> pa.Table:
    """Steady traffic (Poisson 30 per minute, one log source) for ``site`` from ``DAY0`` to ``end``; requests in
    the ``down`` ranges answer 503."""
    rng = np.random.default_rng(seed)
    minutes = int((end - DAY0).total_seconds() // 60)
    idx = np.repeat(np.arange(minutes), rng.poisson(30, minutes))
    n = len(idx)
    ts = int(DAY0.timestamp() * 1000) + idx * 60_000 + rng.integers(0, 60_000, n)
    status = np.full(n, 200)
    for lo, hi in down:
        status[(ts >= lo.timestamp() * 1000) & (ts < hi.timestamp() * 1000)] = 503
    return forum_requests(site, ts, status, rng)


def _heartbeat(store: Store, site: str, hb: datetime) -> None:
    store.insert("source_liveness", pa.table({
        "site": [site], "origin_host": ["web1"], "origin_file": ["access.log"],
        "last_line_ts": pa.array([hb - timedelta(hours=1)], pa.timestamp("ms", tz="UTC")),
        "last_heartbeat_ts": pa.array([hb], pa.timestamp("ms", tz="UTC")), "lines": pa.array([1], pa.uint64()),
        "updated_at": pa.array([datetime.now(UTC)], pa.timestamp("ms", tz="UTC"))}))


def _settings(*sites: str) -> Settings:
    return Settings(sites=[SiteConfig(name=s) for s in sites])


# ------------------------------------------------------------------------------------------------ live failures


class FlakyStore:
    """A real store that fails once on the next query containing every ``query_parts`` string, and once on the
    next insert into ``insert_table`` (each armed by the test)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.query_parts: tuple[str, ...] | None = None
        self.insert_table: str | None = None
        self.failed: list[str] = []

    def query_rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.query_parts is not None and all(p in sql for p in self.query_parts):
            self.query_parts = None
            self.failed.append("query")
            raise StoreError(f"injected failure\nSQL: {sql[:200]}")
        return self.inner.query_rows(sql)

    def insert(self, table: str, data: pa.Table, dedup_token: str | None = None) -> None:
        if table == self.insert_table:
            self.insert_table = None
            self.failed.append("insert")
            raise StoreError(f"injected failure: insert into {table}")
        self.inner.insert(table, data, dedup_token)


STEP0 = datetime(2026, 3, 11, 13, 58, 30, tzinfo=UTC)
STEPS = [STEP0 + timedelta(minutes=i) for i in range(48)]  # 13:58:30 (warm-up) ... 14:45:30


def _stored(store: Store) -> list[tuple[Any, ...]]:
    return sorted(store.query_rows(
        "SELECT id, kind, site, scope, start_ts, end_ts, state, label FROM detections FINAL"))


def _by_id(messages: list[tuple[bytes, bytes]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for key, value in messages:
        out.setdefault(key.decode(), []).append(json.loads(value))
    return out


def test_live_runs_survive_store_failures_without_losing_or_repeating(store: Store) -> None:
    """Reference: a detector stepping minute by minute over two sites whose answers turn into 503 at 14:00 (site
    b recovers at 14:30).  Same steps with one failing ``requests`` query of site a in the run where both
    outages open, and one failing ``detections`` insert in a later run that emits something: the failing runs
    raise, site b is emitted in the run where site a failed, every later run succeeds, and the stored detections
    and the published events end as in the reference, each state published at most as often."""
    end = datetime(2026, 3, 11, 15, 0, tzinfo=UTC)
    store.insert("requests", _requests("a", end, [(datetime(2026, 3, 11, 14, 0, tzinfo=UTC), end)], seed=1))
    store.insert("requests", _requests("b", end, [(datetime(2026, 3, 11, 14, 0, tzinfo=UTC),
                                                   datetime(2026, 3, 11, 14, 30, tzinfo=UTC))], seed=2))
    settings = _settings("a", "b")

    ref_msgs: list[tuple[bytes, bytes]] = []
    ref = TrafficDetector(settings, producer=lambda _t, k, v: ref_msgs.append((k, v)))
    ref_runs = [{(d.site, d.kind, d.id) for d in ref.run_once(store, now)} for now in STEPS]
    ref_stored = _stored(store)
    store.command("TRUNCATE TABLE detections")

    def outages(run: set[tuple[str, str, str]], site: str) -> set[str]:
        return {i for s, k, i in run if s == site and k == "outage"}

    k1 = next(i for i, run in enumerate(ref_runs) if i > 0 and outages(run, "a"))
    assert outages(ref_runs[k1], "b"), "both outages open in the same run"
    k2 = next(i for i in range(k1 + 2, len(ref_runs)) if ref_runs[i])
    assert k2 < len(STEPS) - 1 and outages(ref_runs[k2], "b"), "site b's outage closes in a later run"

    msgs: list[tuple[bytes, bytes]] = []
    flaky = FlakyStore(store)
    det = TrafficDetector(settings, producer=lambda _t, k, v: msgs.append((k, v)))
    runs: list[set[tuple[str, str, str]]] = []
    for i, now in enumerate(STEPS):
        if i == k1:
            flaky.query_parts = ("FROM requests", "site = 'a'")
            with pytest.raises(TrafficRunError) as err:
                det.run_once(flaky, now)
            assert set(err.value.errors) == {"a"} and isinstance(err.value.errors["a"], StoreError)
            # site b advanced and was emitted although site a failed
            assert {(d.site, d.kind, d.id) for d in err.value.emitted} == {x for x in ref_runs[k1] if x[0] == "b"}
            runs.append({(d.site, d.kind, d.id) for d in err.value.emitted})
            continue
        if i == k2:
            flaky.insert_table = "detections"
            before = len(msgs)
            with pytest.raises(StoreError, match="injected"):
                det.run_once(flaky, now)
            assert len(msgs) == before  # nothing published that is not stored
            runs.append(set())
            continue
        runs.append({(d.site, d.kind, d.id) for d in det.run_once(flaky, now)})
    assert flaky.failed == ["query", "insert"]

    # the delayed detections come with the next run: site a's outage, then what the failed insert held
    assert outages(ref_runs[k1], "a") <= {i for _, _, i in runs[k1 + 1]}
    assert {x[2] for x in ref_runs[k2]} <= {x[2] for x in runs[k2 + 1]}
    assert set().union(*runs) == set().union(*ref_runs)

    stored = _stored(store)
    assert stored == ref_stored and any(r[1] == "outage" and r[2] == "a" for r in stored)
    assert store.query_rows("SELECT count(), uniqExact(id) FROM detections FINAL")[0] == (len(stored), len(stored))

    ref_pub, pub = _by_id(ref_msgs), _by_id(msgs)
    assert set(pub) == set(ref_pub)
    for key, states in pub.items():
        assert len(states) <= len(ref_pub[key]), key  # delayed states merge, none is added
        assert len({json.dumps(s, sort_keys=True) for s in states}) == len(states), key  # none published twice
        last, ref_last = states[-1], ref_pub[key][-1]
        assert (last["state"], last["start"], last["end"], last["label"]) == \
            (ref_last["state"], ref_last["start"], ref_last["end"], ref_last["label"]), key


# ------------------------------------------------------------------------------------------------ history


STOP = datetime(2026, 3, 11, 12, 0, tzinfo=UTC)  # lines stop
END = datetime(2026, 3, 11, 12, 40, tzinfo=UTC)  # end of the history range; live "now" is END + 30 s


def _site_kinds(dets: list[Detection]) -> set[tuple[str, str]]:
    return {(d.kind, d.scope) for d in dets}


@pytest.mark.parametrize(("site", "hb", "history_alive", "live_alive"), [
    ("hb-fresh", END - timedelta(seconds=60), True, True),
    # later than the end of the range: no evidence the sources were alive then
    ("hb-after", END + timedelta(minutes=5), False, False),
    # 50 s after END but within the live clock-skew allowance of the live "now" (END + 30 s)
    ("hb-skew", END + timedelta(seconds=30 + LIVE_CLOCK_SKEW_S - 10), False, True),
])
def test_liveness_uses_heartbeats_up_to_the_evaluated_time(store: Store, site: str, hb: datetime,
                                                            history_alive: bool, live_alive: bool) -> None:
    """Lines stop at 12:00.  Heartbeats at most ``heartbeat_fresh_seconds`` old at the end of the range mean the
    site answers nothing (outage); a heartbeat later than that time is no evidence (pipeline_gap)."""
    store.insert("requests", _requests(site, STOP, [], seed=3))
    _heartbeat(store, site, hb)
    settings = _settings(site)
    for mode, alive in (("history", history_alive), ("live", live_alive)):
        if mode == "history":
            dets = detect_history(store, datetime(2026, 3, 11, tzinfo=UTC), END, settings, sites=[site])
        else:
            dets = TrafficDetector(settings, sites=[site]).run_once(store, END + timedelta(seconds=30))
        kinds = _site_kinds(dets)
        if alive:
            assert ("outage", "site") in kinds and ("pipeline_gap", "pipeline") not in kinds, (mode, kinds)
        else:
            assert ("pipeline_gap", "pipeline") in kinds and ("outage", "site") not in kinds, (mode, kinds)
            gap = next(d for d in dets if (d.kind, d.scope) == ("pipeline_gap", "pipeline"))
            assert gap.start == STOP and gap.end is None, (mode, gap)


def test_history_reports_events_overlapping_the_range(store: Store) -> None:
    """An outage 10:00-12:00 is reported by a run from 11:00 (it started before and overlaps), not by a run from
    13:30 (it ended before)."""
    down = (datetime(2026, 3, 11, 10, 0, tzinfo=UTC), datetime(2026, 3, 11, 12, 0, tzinfo=UTC))
    store.insert("requests", _requests("mid", datetime(2026, 3, 11, 14, 0, tzinfo=UTC), [down], seed=4))
    settings = _settings("mid")
    to = datetime(2026, 3, 11, 14, 0, tzinfo=UTC)
    dets = detect_history(store, datetime(2026, 3, 11, 11, 0, tzinfo=UTC), to, settings, sites=["mid"])
    outage = [d for d in dets if d.kind == "outage"]
    assert len(outage) == 1, [d.to_json() for d in dets]
    o = outage[0]
    assert down[0] <= o.start <= down[0] + timedelta(minutes=1) and o.state == "closed"
    assert o.end is not None and datetime(2026, 3, 11, 11, 0, tzinfo=UTC) <= o.end < datetime(2026, 3, 11, 13, 30,
                                                                                                tzinfo=UTC)
    later = detect_history(store, datetime(2026, 3, 11, 13, 30, tzinfo=UTC), to, settings, sites=["mid"])
    assert not [d for d in later if d.kind == "outage"], [d.to_json() for d in later]
    assert all(d.end is None or d.end >= datetime(2026, 3, 11, 13, 30, tzinfo=UTC) for d in later)
    # each run's range is recorded as judged (report daily tells a day no run covered from a quiet one); a dry
    # run records nothing
    detect_history(store, datetime(2026, 3, 11, 9, 0, tzinfo=UTC), to, settings, sites=["mid"], record=False)
    assert _runs(store, "mid") == [("history", datetime(2026, 3, 11, 11, 0, tzinfo=UTC), to),
                                   ("history", datetime(2026, 3, 11, 13, 30, tzinfo=UTC), to)]


def _runs(store: Store, site: str) -> list[tuple[str, datetime, datetime]]:
    return [(str(m), datetime.fromtimestamp(int(a), UTC), datetime.fromtimestamp(int(b), UTC)) for m, a, b in
            store.query_rows("SELECT mode, toUnixTimestamp(from_ts), toUnixTimestamp(to_ts) FROM detection_runs "
                             f"FINAL WHERE site = '{site}' ORDER BY mode, from_ts")]


def test_a_live_session_records_the_minutes_it_judged(store: Store) -> None:
    """A live session's detection_runs row starts at the first minute it read (its warm-up) and is moved on
    every 15 judged minutes; a failed insert of it is tried again at the next run and holds no detection back."""
    end = datetime(2026, 3, 11, 15, 0, tzinfo=UTC)
    store.insert("requests", _requests("lv", end, [(datetime(2026, 3, 11, 14, 0, tzinfo=UTC), end)], seed=5))
    flaky = FlakyStore(store)
    det = TrafficDetector(_settings("lv"), sites=["lv"])
    now = datetime(2026, 3, 11, 13, 55, 30, tzinfo=UTC)
    det.run_once(flaky, now)
    first = datetime(2026, 3, 11, 13, 54, tzinfo=UTC)
    warm = first - timedelta(days=det.cfg.history_days)
    assert _runs(store, "lv") == [("live", warm, first)]
    det.run_once(flaky, now + timedelta(minutes=10))  # 10 more minutes judged: not yet moved on
    assert _runs(store, "lv")[0][2] == first
    flaky.insert_table = "detection_runs"
    opened = det.run_once(flaky, now + timedelta(minutes=20))  # the outage opens; the runs row fails
    assert flaky.failed == ["insert"] and any(d.kind == "outage" for d in opened)
    assert _runs(store, "lv")[0][2] == first
    det.run_once(flaky, now + timedelta(minutes=21))
    assert _runs(store, "lv") == [("live", warm, datetime(2026, 3, 11, 14, 15, tzinfo=UTC))]
