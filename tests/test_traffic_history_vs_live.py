"""``detect history`` (and a live run catching up on a batch) judges each site minute with the source gaps a
minute-by-minute live run knew at that minute.  A gap is reported ``gap_min_minutes`` after the silence began and
back-dated to its start; history used to block the site's minutes from that start, so the minutes a live run had
already judged were left out and a spike confirmed live 3 minutes after a minor source fell silent was missed
(found by a review)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from forumpulse.detectors.traffic import TrafficDetector, detect_history
from test_traffic_cases import _local, _settings, build_requests

CASE = {"site": {"name": "hvl", "timezone": "UTC"}, "start": "2026-03-02", "days": 10, "per_minute": 20,
        "weekend_factor": 1.0, "sources": [{"file": "a.log", "share": 0.75}, {"file": "b.log", "share": 0.25}],
        "events": [{"kind": "factor", "factor": 5.0, "from": "2026-03-11T13:20", "to": "2026-03-11T16:00"},
                   {"kind": "source_gap", "source": "b.log", "from": "2026-03-11T13:40", "to": "2026-03-11T16:00"}]}


def test_history_judges_minutes_with_the_gaps_known_then(store: Any) -> None:
    store.insert("requests", build_requests(CASE))
    s = _settings([CASE])
    day = _local(CASE, "2026-03-11T00:00")
    live = TrafficDetector(s, sites=["hvl"])
    seen: dict[str, tuple[str, str, Any]] = {}
    t = _local(CASE, "2026-03-11T13:00") + timedelta(seconds=30)
    while t <= _local(CASE, "2026-03-11T15:00"):
        for d in live.run_once(store, t):
            if d.start >= day:
                seen[d.id] = (d.kind, d.scope, d.start)
        t += timedelta(minutes=1)
    spikes = [st for k, sc, st in seen.values() if k == "spike" and sc == "site"]
    assert len(spikes) == 1 and _local(CASE, "2026-03-11T13:20") <= spikes[0] < _local(CASE, "2026-03-11T13:40")
    assert any(k == "pipeline_gap" and sc == "source:origin/b.log" for k, sc, _ in seen.values())
    store.command("TRUNCATE TABLE detections")
    hist = detect_history(store, day, _local(CASE, "2026-03-11T15:00"), s, sites=["hvl"], record=False)
    assert {d.id: (d.kind, d.scope, d.start) for d in hist if d.kind in ("spike", "pipeline_gap")} == seen


ORPHAN = {"site": {"name": "orphan", "timezone": "UTC"}, "start": "2026-03-01", "days": 21, "per_minute": 10,
          "weekend_factor": 1.0, "sources": [{"file": "a.log", "share": 0.5}, {"file": "b.log", "share": 0.5}],
          "events": [{"kind": "source_gap", "source": "b.log", "from": "2026-03-03T10:00",
                      "to": "2026-03-20T11:00"}]}


def _gaps(store: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in store.query_rows(
        "SELECT id, scope, start_ts, end_ts, state FROM detections FINAL WHERE kind = 'pipeline_gap' "
        "ORDER BY start_ts")]


def test_a_restart_closes_a_gap_that_began_before_its_warm_up(store: Any) -> None:
    """A source silent for 17 days when the owner restarts (its warm-up reads history_days = 15 back) was never
    seen by the new process, so its stored open gap stayed open after its lines came back (found by a review).
    The first run now reads from the hour before the oldest stored open gap: the same gap, closed as without a
    restart."""
    store.insert("requests", build_requests(ORPHAN))
    s = _settings([ORPHAN])
    TrafficDetector(s, sites=["orphan"]).run_once(store, _local(ORPHAN, "2026-03-03T12:00") + timedelta(seconds=30))
    opened = _gaps(store)
    assert [r[1:] for r in opened] == [("source:origin/b.log", _local(ORPHAN, "2026-03-03T10:00"), None, "open")]
    restarted = TrafficDetector(s, sites=["orphan"])
    t = _local(ORPHAN, "2026-03-20T10:30") + timedelta(seconds=30)
    emitted = []
    while t <= _local(ORPHAN, "2026-03-20T11:30"):
        emitted += restarted.run_once(store, t)
        t += timedelta(minutes=1)
    after_restart = _gaps(store)
    # the longer warm-up neither re-emits what ended before the usual one nor counts those days as judged
    usual = _local(ORPHAN, "2026-03-20T10:29") - timedelta(days=restarted.cfg.history_days)
    assert emitted and all(d.end is None or d.end >= usual for d in emitted)
    assert restarted.sites["orphan"].judged_from == usual
    assert after_restart[0][0] == opened[0][0] and after_restart[0][3:] == (_local(ORPHAN, "2026-03-20T10:59"),
                                                                           "closed")
    store.command("TRUNCATE TABLE detections")
    kept_running = TrafficDetector(s, sites=["orphan"])
    kept_running.run_once(store, _local(ORPHAN, "2026-03-03T12:00") + timedelta(seconds=30))
    kept_running.run_once(store, _local(ORPHAN, "2026-03-20T11:30") + timedelta(seconds=30))
    assert _gaps(store) == after_restart


SILENT = {"site": {"name": "silent2h", "timezone": "UTC"}, "start": "2026-03-02", "days": 9, "per_minute": 30,
          "weekend_factor": 1.0, "sources": [{"file": "a.log", "share": 0.5}, {"file": "b.log", "share": 0.5}],
          "events": [{"kind": "source_gap", "source": "b.log", "from": "2026-03-10T10:00",
                      "to": "2026-03-10T12:00"}]}


def test_a_closed_source_gap_states_its_whole_silence_live_and_in_history(store: Any) -> None:
    """A source gap that opened live and closed when its lines came back kept the figure of the minute it opened
    (10 minutes' lines for 2 hours of silence) and no length (user trial 40); one found closed by history had
    both.  Now both give ``detail.minutes`` = 120 and ``expected`` = the source's rate x 120."""
    store.insert("requests", build_requests(SILENT))
    s = _settings([SILENT])
    live = TrafficDetector(s, sites=["silent2h"])
    t = _local(SILENT, "2026-03-10T09:50") + timedelta(seconds=30)
    last: dict[str, Any] = {}
    while t <= _local(SILENT, "2026-03-10T12:10"):
        for d in live.run_once(store, t):
            if d.kind == "pipeline_gap":
                last[d.id] = d
        t += timedelta(minutes=1)
    (gap,) = last.values()
    assert gap.state == "closed" and gap.detail["minutes"] == 120 and gap.end == _local(SILENT, "2026-03-10T11:59")
    (hour,) = store.query_rows(  # b.log's lines in the hour before it fell silent, at 120 minutes
        "SELECT count() FROM requests WHERE site = 'silent2h' AND origin_file = 'b.log' "
        "AND ts >= '2026-03-10 09:00:00' AND ts < '2026-03-10 10:00:00'")[0]
    assert hour > 100 and gap.expected == pytest.approx(hour / 60 * 120)
    hist = detect_history(store, _local(SILENT, "2026-03-10T00:00"), _local(SILENT, "2026-03-10T13:00"), s,
                          sites=["silent2h"], record=False)
    (h,) = [d for d in hist if d.kind == "pipeline_gap"]
    assert (h.id, h.end, h.detail["minutes"]) == (gap.id, gap.end, 120)
    assert h.expected == pytest.approx(gap.expected)
