"""Live traffic detection, from a review: an event superseded by an outage reaches the store closed; an outage
(sources heartbeating, no lines) is not also reported as a pipeline gap, neither by live runs when the lines come
back nor by a history run written next to the live outage; history without an end reads as live does."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from forumpulse.detectors.series import Detection
from forumpulse.detectors.traffic import TrafficDetector, detect_history
from test_traffic_cases import _local, _settings, build_requests


def _beat(store: Any, name: str, line: datetime, hb: datetime, host: str = "origin", file: str = "access.log",
          lines: int = 1) -> None:
    """One ``source_liveness`` row, as the consumer writes it."""
    ts = pa.timestamp("ms", tz="UTC")
    store.insert("source_liveness", pa.table({
        "site": [name], "origin_host": [host], "origin_file": [file],
        "last_line_ts": pa.array([line], ts), "last_heartbeat_ts": pa.array([hb], ts),
        "lines": pa.array([lines], pa.uint64()), "updated_at": pa.array([hb], ts)}))


OVERLOAD = {"site": {"name": "case-overload", "timezone": "UTC"}, "start": "2026-03-01", "days": 11,
            "per_minute": 20, "weekend_factor": 1.0,
            "events": [{"kind": "factor", "from": "2026-03-11T10:00", "to": "2026-03-11T10:40", "factor": 5},
                       {"kind": "status", "from": "2026-03-11T10:40", "to": "2026-03-11T11:30", "status": 503}]}


def test_a_spike_superseded_by_an_outage_is_stored_closed(store: Any) -> None:
    """The site spikes, then falls over (503s).  Before the fix the spike stayed ``open`` (no end) in
    ``detections`` for good."""
    name = OVERLOAD["site"]["name"]
    store.insert("requests", build_requests(OVERLOAD))
    det = TrafficDetector(_settings([OVERLOAD]), sites=[name])
    t = _local(OVERLOAD, "2026-03-11T09:55:30")
    while t <= _local(OVERLOAD, "2026-03-11T13:30:30"):
        det.run_once(store, t)
        t += timedelta(minutes=1)
    rows = store.query_rows(f"SELECT kind, state, start_ts, end_ts FROM detections FINAL WHERE site = '{name}' "
                            "AND start_ts >= toDateTime('2026-03-11 09:00:00', 'UTC') ORDER BY start_ts")
    kinds = {str(r[0]): r for r in rows}
    assert set(kinds) == {"spike", "outage"}, rows
    assert all(str(r[1]) == "closed" for r in rows), rows
    assert kinds["spike"][3] == kinds["outage"][2], rows  # the spike ends where the outage begins


DOWN = {"site": {"name": "case-down", "timezone": "UTC"}, "start": "2026-03-01", "days": 11, "per_minute": 20,
        "weekend_factor": 1.0, "events": [{"kind": "gap", "from": "2026-03-11T10:00", "to": "2026-03-11T10:40"}]}


def test_an_outage_with_heartbeating_sources_is_no_pipeline_gap_live_or_in_history(store: Any) -> None:
    """No access-log lines 10:00-10:40 while the shipper heartbeats: an outage.  Before the fix, live runs also
    reported a closed ``pipeline_gap`` of the source when the lines came back, and a later history run over the
    range wrote site and source ``pipeline_gap`` rows next to the live outage."""
    name = DOWN["site"]["name"]
    store.insert("requests", build_requests(DOWN))
    det = TrafficDetector(_settings([DOWN]), sites=[name])
    seen: dict[str, tuple[str, str, str]] = {}
    t = _local(DOWN, "2026-03-11T09:50:30")
    last_line = _local(DOWN, "2026-03-11T09:59:59")
    while t <= _local(DOWN, "2026-03-11T11:00:30"):
        line = last_line if t < _local(DOWN, "2026-03-11T10:40:30") else t - timedelta(seconds=2)
        _beat(store, name, line, t - timedelta(seconds=5))  # the shipper heartbeats all along
        for d in det.run_once(store, t):
            if d.start >= _local(DOWN, "2026-03-11T09:00"):
                seen[d.id] = (d.kind, d.scope, d.state)
        t += timedelta(minutes=1)
    kinds = {(k, s) for k, s, _ in seen.values()}
    assert ("outage", "site") in kinds, seen
    assert not [v for v in seen.values() if v[0] == "pipeline_gap"], seen

    hist = detect_history(store, _local(DOWN, "2026-03-11T09:00"), _local(DOWN, "2026-03-11T11:00"),
                          _settings([DOWN]), sites=[name])
    # history cannot know the heartbeats of 10:00-10:40: the silence is a gap of unknown liveness ...
    gaps = [d for d in hist if d.kind == "pipeline_gap"]
    assert gaps and all(d.detail.get("liveness") == "unknown" for d in gaps), [d.to_json() for d in hist]
    # ... which is not written next to the live outage of those minutes
    rows = store.query_rows(f"SELECT kind, scope, state FROM detections FINAL WHERE site = '{name}' "
                            "AND start_ts >= toDateTime('2026-03-11 09:00:00', 'UTC')")
    assert ("outage", "site", "closed") in {tuple(map(str, r)) for r in rows}, rows
    assert not [r for r in rows if str(r[0]) == "pipeline_gap"], rows


def test_a_past_gap_without_a_live_outage_is_still_stored(store: Any) -> None:
    """The other side: a silence nobody judged live (no outage stored) is still written as a pipeline_gap."""
    case = {**DOWN, "site": {"name": "case-pastgap", "timezone": "UTC"}}
    name = case["site"]["name"]
    store.insert("requests", build_requests(case))
    hist = detect_history(store, _local(case, "2026-03-11T09:00"), _local(case, "2026-03-11T11:00"),
                          _settings([case]), sites=[name])
    assert ("pipeline_gap", "pipeline") in {(d.kind, d.scope) for d in hist}
    rows = store.query_rows(f"SELECT kind, scope FROM detections FINAL WHERE site = '{name}'")
    assert ("pipeline_gap", "pipeline") in {tuple(map(str, r)) for r in rows}, rows


BEHIND = {"site": {"name": "case-behind", "timezone": "UTC"}, "start": "2026-03-01", "days": 11, "per_minute": 20,
          "weekend_factor": 1.0,
          "events": [{"kind": "status", "from": "2026-03-11T10:25", "to": "2026-03-11T11:30", "status": 503}]}


def test_history_without_an_end_reads_whole_minutes_behind_the_watermark_as_live(store: Any) -> None:
    """The loader has reported up to 10:26 (the source's last line and heartbeat) while the clock says 10:34:30.
    Live judges nothing after 10:26; ``detect history`` without ``--to`` used to read up to the wall clock
    (lag 0, no watermark, the current minute half loaded) and report an outage from minutes live had not judged."""
    name = BEHIND["site"]["name"]
    store.insert("requests", build_requests(BEHIND))
    mark = _local(BEHIND, "2026-03-11T10:26")
    _beat(store, name, mark, mark)
    now = _local(BEHIND, "2026-03-11T10:34:30")
    start = _local(BEHIND, "2026-03-11T09:00")
    hist = detect_history(store, start, None, _settings([BEHIND]), sites=[name], now=now)
    assert not [d for d in hist if d.kind == "outage"], [d.to_json() for d in hist]
    live = TrafficDetector(_settings([BEHIND]), sites=[name])
    live_dets = [d for d in live.run_once(store, now) if d.end is None or d.end >= start]
    assert live.sites[name].cursor == mark
    assert sorted((d.id, d.state) for d in hist) == sorted((d.id, d.state) for d in live_dets)
    # with an explicit end, history reads what it is asked to: the outage of 10:25 is there
    full = detect_history(store, start, _local(BEHIND, "2026-03-11T10:40"), _settings([BEHIND]), sites=[name])
    assert [d for d in full if d.kind == "outage"]
    assert datetime(2026, 1, 1, tzinfo=UTC) < now


def _beat_log(store: Any, name: str, hb: datetime, size: int = 0, inode: int = 0, host: str = "origin",
              file: str = "access.log") -> None:
    """One heartbeat in ``source_heartbeat_minute`` (migration 0008), as the consumer writes it."""
    from forumpulse.pipeline.consumer import HEARTBEAT_LOG_SCHEMA
    minute = hb.replace(second=0, microsecond=0)
    beat = {"ts": hb, "size": size, "inode": inode}
    store.insert("source_heartbeat_minute", pa.Table.from_pylist([{
        "site": name, "origin_host": host, "origin_file": file, "minute": minute,
        "first_beat": beat, "last_beat": beat}], schema=HEARTBEAT_LOG_SCHEMA))


def _history_and_restart(store: Any, case: dict[str, Any], end: datetime) -> tuple[list[Detection], ...]:
    """The detections since 09:00 of ``detect history`` up to ``end`` and of a live detector started at ``end``
    (its first run catches up over everything)."""
    name, since = case["site"]["name"], _local(case, "2026-03-11T09:00")
    hist = detect_history(store, since, end, _settings([case]), sites=[name])
    caught_up = TrafficDetector(_settings([case]), sites=[name]).run_once(store, end + timedelta(seconds=30))
    return tuple([d for d in got if d.start >= since] for got in (hist, caught_up))


def _live_minute_by_minute(store: Any, case: dict[str, Any], silent: tuple[str, str], growing: bool = False,
                           ) -> tuple[dict[str, Detection], dict[str, datetime]]:
    """A live detector run every minute 09:50-11:00 while the shipper heartbeats all along (``source_liveness``
    and the heartbeat log) and sends no line from ``silent[0]`` to ``silent[1]``; with ``growing`` its file keeps
    growing meanwhile (~200 bytes/s, lines read or not).  Returns the detections since 09:00 (latest state per
    id) and the run time at which each was first seen."""
    name = case["site"]["name"]
    det = TrafficDetector(_settings([case]), sites=[name])
    live: dict[str, Detection] = {}
    first_seen: dict[str, datetime] = {}
    t = _local(case, "2026-03-11T09:50:30")
    last_line = t
    size = 5_000_000
    lo, hi = _local(case, silent[0]), _local(case, silent[1]) + timedelta(seconds=30)
    while t <= _local(case, "2026-03-11T11:00:30"):
        if not lo <= t < hi:
            last_line = t - timedelta(seconds=2)
        size += 12_000
        _beat_log(store, name, t - timedelta(seconds=5), *((size, 42) if growing else ()))
        _beat(store, name, last_line, t - timedelta(seconds=5))
        for d in det.run_once(store, t):
            if d.start >= _local(case, "2026-03-11T09:00"):
                live[d.id] = d
                first_seen.setdefault(d.id, t)
        t += timedelta(minutes=1)
    return live, first_seen


def test_history_and_a_restarted_live_run_judge_a_past_silence_with_the_heartbeat_log(store: Any) -> None:
    """With the heartbeat log (migration 0008), a silence that ended before the evaluated time is judged with the
    heartbeats of its own minutes: the live run's outage, also from ``detect history`` and from a live detector
    started after the silence (its first run catches up over it).  Without the log both called it a
    ``pipeline_gap`` of unknown liveness (the test above); a silence without heartbeats in the log is a
    ``pipeline_gap`` whose liveness is known."""
    case = {**DOWN, "site": {"name": "case-down-log", "timezone": "UTC"},
            "events": [*DOWN["events"], {"kind": "gap", "from": "2026-03-11T12:00", "to": "2026-03-11T12:40"}]}
    name = case["site"]["name"]
    store.insert("requests", build_requests(case))
    det = TrafficDetector(_settings([case]), sites=[name])
    live: dict[str, Detection] = {}
    t = _local(case, "2026-03-11T09:50:30")
    last_line = t
    while t <= _local(case, "2026-03-11T13:00:30"):
        if not (_local(case, "2026-03-11T10:00") <= t < _local(case, "2026-03-11T10:40:30") or
                _local(case, "2026-03-11T12:00") <= t < _local(case, "2026-03-11T12:40:30")):
            last_line = t - timedelta(seconds=2)
        if not _local(case, "2026-03-11T12:00") <= t < _local(case, "2026-03-11T12:40:30"):
            _beat_log(store, name, t - timedelta(seconds=5))  # the shipper heartbeats, except 12:00-12:40
            _beat(store, name, last_line, t - timedelta(seconds=5))
        for d in det.run_once(store, t):
            if d.start >= _local(case, "2026-03-11T09:00"):
                live[d.id] = d
        t += timedelta(minutes=1)
    want = {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in live.values()}
    assert any(w[:3] == ("outage", "site", _local(case, "2026-03-11T10:00")) for w in want), want
    assert ("pipeline_gap", "pipeline", _local(case, "2026-03-11T12:00"), "no lines and no heartbeats") in want

    end = _local(case, "2026-03-11T13:00")
    for got in _history_and_restart(store, case, end):
        assert {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in got} == want, [d.to_json() for d in got]
        assert not [d for d in got if d.detail.get("liveness") == "unknown"]


def test_a_stuck_shipper_is_a_pipeline_gap_live_in_history_and_after_a_restart(store: Any) -> None:
    """No lines 10:00-10:40 while the shipper heartbeats -- but its heartbeats report the access log growing
    (size=, same inode): the site answers and logs, the shipper does not read.  Live (minute by minute), history
    and a restarted live run all report a ``pipeline_gap`` naming the growing file, and no outage."""
    case = {**DOWN, "site": {"name": "case-stuck-live", "timezone": "UTC"}}
    store.insert("requests", build_requests(case))
    live, _ = _live_minute_by_minute(store, case, ("2026-03-11T10:00", "2026-03-11T10:40"), growing=True)
    want = {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in live.values()}
    down = _local(case, "2026-03-11T10:00")
    assert want == {("pipeline_gap", "pipeline", down, "no lines while log files grow"),
                    ("pipeline_gap", "source:origin/access.log", down, "source silent, its file grows")}, want
    assert [d.detail["growing"] for d in live.values() if d.scope == "pipeline"] == [["origin/access.log"]]

    end = _local(case, "2026-03-11T11:00")
    for got in _history_and_restart(store, case, end):
        assert {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in got} == want, [d.to_json() for d in got]


def test_file_growth_ignores_rotation_truncation_and_the_grace_period() -> None:
    """``HeartbeatLog.grew``: a larger size under the same inode after ``since`` is growth; a new inode
    (rotation) or a smaller size (copytruncate) is not, nor growth before ``since``."""
    from forumpulse.detectors.traffic import HeartbeatLog
    t0 = datetime(2026, 3, 11, 10, tzinfo=UTC)
    ms = int(t0.timestamp() * 1000)

    def log(*beats: tuple[int, int, int]) -> HeartbeatLog:  # (seconds after t0, size, inode)
        samples = [(ms + sec * 1000, size, ino) for sec, size, ino in beats]
        return HeartbeatLog(t0, [("h/a.log", samples[0][0], samples[-1][0])], 120,
                            lambda src, lo, hi: [b for b in samples if lo <= b[0] <= hi])

    end = t0 + timedelta(minutes=5)
    assert log((60, 100, 1), (120, 200, 1), (180, 300, 1)).grew("h/a.log", t0, end)  # growing in two minutes
    assert not log((60, 100, 1), (120, 200, 1), (180, 200, 1)).grew("h/a.log", t0, end)  # one late write only
    assert not log((60, 100, 1), (120, 100, 1)).grew("h/a.log", t0, end)          # idle: same size
    assert not log((60, 900, 1), (120, 50, 2), (180, 50, 2)).grew("h/a.log", t0, end)  # rotated: new inode
    assert not log((60, 900, 1), (120, 0, 1), (180, 0, 1)).grew("h/a.log", t0, end)    # truncated in place
    assert log((60, 900, 1), (120, 0, 1), (180, 40, 1), (240, 80, 1)).grew("h/a.log", t0, end)  # ... written again
    assert not log((60, 100, 1), (120, 200, 1), (180, 300, 1), (240, 300, 1)).grew(    # grew before `since` only
        "h/a.log", t0 + timedelta(seconds=180), end)
    assert not log((60, 100, 1), (120, 200, 1), (180, 300, 1), (1500, 300, 1)).grew(   # longer ago than the window
        "h/a.log", t0, t0 + timedelta(minutes=30))
    assert log((60, 100, 1), (120, 200, 1), (180, 300, 1)).growing(t0, end) == ["h/a.log"]
    host = HeartbeatLog(t0, [("h/", ms, ms + 50_000)], 120, lambda src, lo, hi: [])  # host heartbeats: no size
    assert not host.grew("h/", t0, end) and host.growing(t0, end) == []


def _three_ways(store: Any, case: dict[str, Any], lines_off: tuple[str, str], beats_off: tuple[str, str] | None,
                log_from: str | None = None, size_at: Callable[[datetime], int] | None = None,
                health: dict[str, Any] | None = None, also: Callable[[datetime], None] | None = None,
                ) -> list[set[tuple[Any, ...]]]:
    """Live every minute (at :30) 09:50-11:10, then history over 09:00-11:10 and a live detector started at
    11:10 (its first run catches up): the detections of each since 09:00 as (kind, scope, start, end, reason,
    liveness).  Lines stop in ``lines_off``; heartbeats in ``beats_off``; the heartbeat log holds the heartbeats
    from ``log_from`` on (the upgrade to migration 0008), with the file's size ``size_at(heartbeat time)``;
    ``also(heartbeat time)`` writes more heartbeats each minute (listeners, other sources)."""
    name = case["site"]["name"]
    store.insert("requests", build_requests(case))
    settings = _settings([case])
    if health:
        settings = settings.model_copy(update={"detectors": {"traffic": {"thresholds": {"health": health}}}})

    def inside(t: datetime, span: tuple[str, str] | None) -> bool:
        return span is not None and _local(case, span[0]) <= t < _local(case, span[1])

    det = TrafficDetector(settings, sites=[name])
    live: dict[str, Detection] = {}
    t = _local(case, "2026-03-11T09:50:30")
    last_line = t
    end = _local(case, "2026-03-11T11:10:30")
    while t <= end:
        if not inside(t - timedelta(seconds=2), lines_off):
            last_line = t - timedelta(seconds=2)
        hb = t - timedelta(seconds=5)
        if not inside(hb, beats_off):
            if log_from is None or hb >= _local(case, log_from):
                _beat_log(store, name, hb, *((size_at(hb), 9) if size_at else (0, 0)))
            _beat(store, name, last_line, hb)
        if also is not None:
            also(hb)
        for d in det.run_once(store, t):
            if d.start >= _local(case, "2026-03-11T09:00"):
                live[d.id] = d
        t += timedelta(minutes=1)
    hist = detect_history(store, _local(case, "2026-03-11T09:00"), end.replace(second=0), settings,
                          sites=[name])
    restarted = TrafficDetector(settings, sites=[name]).run_once(store, end)

    def key(d: Detection) -> tuple[Any, ...]:
        return (d.kind, d.scope, d.start, d.end, d.detail.get("reason"), d.detail.get("liveness"))

    return [{key(d) for d in got if d.start >= _local(case, "2026-03-11T09:00")}
            for got in (live.values(), hist, restarted)]


def test_heartbeats_stopping_inside_a_silence_are_judged_alike_live_in_history_and_after_a_restart(
        store: Any) -> None:
    """Lines stop at 10:00; the heartbeats stop too at 10:20:40 (from a review): live reports an ``outage``
    from 10:00, then a ``pipeline_gap`` from 10:20.  History and a restarted live run used to lose the outage (its
    zero minutes were blocked by the source gap found later and back-dated) and to judge the first minute of a
    live catch-up with the wall clock's heartbeats (liveness unknown)."""
    case = {**DOWN, "site": {"name": "case-hb-stop", "timezone": "UTC"},
            "events": [{"kind": "gap", "from": "2026-03-11T10:00", "to": "2026-03-11T10:50"}]}
    live, hist, restarted = _three_ways(store, case, ("2026-03-11T10:00", "2026-03-11T10:50:30"),
                                        ("2026-03-11T10:20:40", "2026-03-11T10:50:30"))
    kinds = {(k[0], k[1]) for k in live}
    assert ("outage", "site") in kinds and ("pipeline_gap", "pipeline") in kinds, live
    assert hist == live, (sorted(hist), sorted(live))
    assert restarted == live, (sorted(restarted), sorted(live))


def test_a_log_begun_during_an_outage_does_not_turn_it_into_a_known_gap(store: Any) -> None:
    """The heartbeat log starts at 10:20:20 (the upgrade), inside an outage live saw with heartbeats all along
    (from a review): the heartbeats just before the log's first row were fresh, so history must not read the
    minutes after the log began as "no heartbeat" (a ``pipeline_gap`` with known liveness, which would then be
    written next to the live outage)."""
    case = {**DOWN, "site": {"name": "case-log-begins", "timezone": "UTC"},
            "events": [{"kind": "gap", "from": "2026-03-11T10:00", "to": "2026-03-11T10:50"}]}
    live, hist, restarted = _three_ways(store, case, ("2026-03-11T10:00", "2026-03-11T10:50:30"), None,
                                        log_from="2026-03-11T10:20:20")
    assert [k for k in live if k[0] == "outage"] and not [k for k in live if k[0] == "pipeline_gap"], live
    for got in (hist, restarted):
        assert not [k for k in got if k[0] == "pipeline_gap" and k[5] != "unknown"], sorted(got)


def test_the_heartbeat_log_measurement_runs_and_finds_every_growing_file() -> None:
    """``python -m forumpulse.detectors.bench_heartbeat_log`` (quoted in docs/detectors.md), at a tiny size: every
    source alive at every minute it samples after its first heartbeat, and every (growing) file found growing."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "forumpulse.detectors.bench_heartbeat_log", "--sources", "3",
                          "--days", "2"], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "3 sources x 2 days = 8,640 log rows" in out, out
    # 288 sampled minutes x 3 sources, less the first minute (its heartbeats come 5 s after it)
    assert "(861 source-minutes alive)" in out and "growth of 3 sources" in out, out


def test_a_single_late_write_during_an_outage_is_no_stuck_shipper(store: Any) -> None:
    """Lines stop 10:00-10:40 while the shipper heartbeats; the file grows once, by 20 kB at 10:05 (a buffered
    log flushed when the server was restarted, a hung request logged at its timeout) and never again (from a
    review: one write used to turn the outage into a ``pipeline_gap``).  An outage, live, in history and after a
    restart; a file that keeps growing is the stuck shipper (the test above)."""
    case = {**DOWN, "site": {"name": "case-one-write", "timezone": "UTC"}}
    flush = _local(case, "2026-03-11T10:05")
    live, hist, restarted = _three_ways(store, case, ("2026-03-11T10:00", "2026-03-11T10:40:30"), None,
                                        size_at=lambda t: 1_000_000 + (20_000 if t >= flush else 0))
    for got in (live, hist, restarted):
        assert [k for k in got if k[:2] == ("outage", "site")], sorted(got)
        assert not [k for k in got if k[0] == "pipeline_gap"], sorted(got)


def test_a_stuck_shipper_gap_stays_a_gap_when_the_file_stops_growing(store: Any) -> None:
    """Lines stop at 10:00 while the file keeps growing until 10:20, then stays the same size (from a review):
    the site's ``pipeline_gap`` ("files grow") stays open until lines return -- zeros are not fed into it as an
    outage once the growth is out of the window, even when no source gap blocks them any more."""
    case = {**DOWN, "site": {"name": "case-stuck-then-flat", "timezone": "UTC"}}
    flat = _local(case, "2026-03-11T10:20")
    live, hist, restarted = _three_ways(
        store, case, ("2026-03-11T10:00", "2026-03-11T10:50:30"), None,
        size_at=lambda t: 1_000_000 + 3_000 * int((min(t, flat) - _local(case, "2026-03-11T09:00")).total_seconds()
                                                  // 60),
        health={"gap_blinds_site_hours": 0.1})
    for got in (live, hist, restarted):
        assert ("pipeline_gap", "pipeline") in {k[:2] for k in got}, sorted(got)
        assert not [k for k in got if k[:2] == ("outage", "site")], sorted(got)


BACK = {"site": {"name": "case-back", "timezone": "UTC"}, "start": "2026-03-01", "days": 11, "per_minute": 20,
        "weekend_factor": 1.0, "events": [{"kind": "gap", "from": "2026-03-11T10:00", "to": "2026-03-11T12:00"}]}


def test_a_pipeline_gap_closes_when_the_heartbeats_return_not_when_lines_do(store: Any) -> None:
    """The collector is down 10:00-10:40 (no lines, no heartbeats): a ``pipeline_gap``.  From 10:40 the shippers
    heartbeat again but the site sends no line until 12:00 -- the pipeline is back, what is missing is the site's
    traffic (the outage path).  Before the fix the gap stayed open, "no lines and no heartbeats", until 12:00
    (a user trial saw it open for many minutes after the heartbeats had returned)."""
    name = BACK["site"]["name"]
    store.insert("requests", build_requests(BACK))
    det = TrafficDetector(_settings([BACK]), sites=[name])
    seen: dict[str, Detection] = {}
    t = _local(BACK, "2026-03-11T09:50:30")
    last_line = _local(BACK, "2026-03-11T09:59:59")
    while t <= _local(BACK, "2026-03-11T12:10:30"):
        if t < _local(BACK, "2026-03-11T10:00:00") or t >= _local(BACK, "2026-03-11T10:40:00"):
            line = last_line if t < _local(BACK, "2026-03-11T12:00:30") else t - timedelta(seconds=2)
            _beat(store, name, min(line, t), t - timedelta(seconds=5))
        for d in det.run_once(store, t):
            if d.start >= _local(BACK, "2026-03-11T09:00"):
                seen[d.id] = d
        t += timedelta(minutes=1)
    gaps = [d for d in seen.values() if d.kind == "pipeline_gap" and d.scope == "pipeline"]
    assert len(gaps) == 1, [d.to_json() for d in seen.values()]
    [g] = gaps
    assert g.state == "closed" and g.detail.get("closed_by") == "heartbeats", g.to_json()
    assert _local(BACK, "2026-03-11T10:38") <= g.end <= _local(BACK, "2026-03-11T10:42"), g.to_json()
    # the source's own gap closes with it (it stayed open until 11:59 and kept the site's minutes out of the model)
    [sg] = [d for d in seen.values() if d.kind == "pipeline_gap" and d.scope.startswith("source:")]
    assert sg.detail.get("closed_by") == "heartbeats" and sg.end is not None, sg.to_json()
    assert sg.end <= _local(BACK, "2026-03-11T10:42"), sg.to_json()
    # the silence after it, with the shippers alive, is the site's: an outage from about when the gap ended
    outages = [d for d in seen.values() if d.kind == "outage"]
    assert outages and all(d.start >= g.end for d in outages), "\n".join(d.to_json() for d in seen.values())


def test_an_error_storm_turning_into_silence_is_an_outage_when_its_down_minutes_add_up(store: Any) -> None:
    """503s 10:00-10:03, then no lines 10:03-10:40 while the shipper heartbeats (user trial 33).  The silent
    minutes of a site that is down are zeros at once: the outage is reported when its 10 down minutes add up
    (10:10), not ``gap_min_minutes`` into the silence (10:13) as before -- live, and in history and after a
    restart (the heartbeat log) the same detections, reported at the same minute."""
    case = {**DOWN, "site": {"name": "case-storm-silence", "timezone": "UTC"},
            "events": [{"kind": "status", "from": "2026-03-11T10:00", "to": "2026-03-11T10:03", "status": 503},
                       {"kind": "gap", "from": "2026-03-11T10:03", "to": "2026-03-11T10:40"}]}
    store.insert("requests", build_requests(case))
    live, first_seen = _live_minute_by_minute(store, case, ("2026-03-11T10:03", "2026-03-11T10:40"))
    [outage] = [d for d in live.values() if d.kind == "outage"]
    assert outage.start == _local(case, "2026-03-11T10:00")
    assert first_seen[outage.id] <= _local(case, "2026-03-11T10:11:30"), first_seen[outage.id]
    assert not [d for d in live.values() if d.kind == "pipeline_gap"], [d.to_json() for d in live.values()]

    end = _local(case, "2026-03-11T11:00")
    want = {(d.kind, d.scope, d.start, d.end) for d in live.values()}
    for got in _history_and_restart(store, case, end):
        assert {(d.kind, d.scope, d.start, d.end) for d in got} == want, [d.to_json() for d in got]
        [o] = [d for d in got if d.kind == "outage"]
        assert o.detail["_reported"] <= _local(case, "2026-03-11T10:10"), o.detail["_reported"]


def test_an_error_storm_then_a_stuck_shipper_is_a_pipeline_gap_from_the_silences_first_minute(store: Any) -> None:
    """503s 10:00-10:03, then no lines while the shipper heartbeats and its file keeps growing: the zeros fed at
    once (the site was down) stop when the growth shows, and the ``pipeline_gap`` begins at the silence's first
    minute, live, in history and after a restart; the few zeros fed do not make an outage."""
    case = {**DOWN, "site": {"name": "case-storm-stuck", "timezone": "UTC"},
            "events": [{"kind": "status", "from": "2026-03-11T10:00", "to": "2026-03-11T10:03", "status": 503},
                       {"kind": "gap", "from": "2026-03-11T10:03", "to": "2026-03-11T10:40"}]}
    store.insert("requests", build_requests(case))
    live, _ = _live_minute_by_minute(store, case, ("2026-03-11T10:03", "2026-03-11T10:40"), growing=True)
    want = {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in live.values()}
    silent = _local(case, "2026-03-11T10:03")
    assert ("pipeline_gap", "pipeline", silent, "no lines while log files grow") in want, want
    assert not [w for w in want if w[0] == "outage"], want
    end = _local(case, "2026-03-11T11:00")
    for got in _history_and_restart(store, case, end):
        assert {(d.kind, d.scope, d.start, d.detail.get("reason")) for d in got} == want, [d.to_json() for d in got]


def test_heartbeats_stopping_after_an_error_storm_make_a_gap_after_the_minutes_judged_alive(store: Any) -> None:
    """503s 10:00-10:03, no lines after; the heartbeats stop at 10:06:40.  The silent minutes fed as zeros while
    the heartbeats were fresh stay the site's; the ``pipeline_gap`` (no lines and no heartbeats) begins after
    them, not at the silence's first minute -- live, in history and after a restart alike; and no outage (3
    error minutes and 4 silent ones are not 10)."""
    case = {**DOWN, "site": {"name": "case-storm-hb-stop", "timezone": "UTC"},
            "events": [{"kind": "status", "from": "2026-03-11T10:00", "to": "2026-03-11T10:03", "status": 503},
                       {"kind": "gap", "from": "2026-03-11T10:03", "to": "2026-03-11T10:50"}]}
    live, hist, restarted = _three_ways(store, case, ("2026-03-11T10:03", "2026-03-11T10:50:30"),
                                        ("2026-03-11T10:06:40", "2026-03-11T10:50:30"))
    gaps = [k for k in live if k[:2] == ("pipeline_gap", "pipeline")]
    assert len(gaps) == 1 and _local(case, "2026-03-11T10:06") <= gaps[0][2] <= _local(case, "2026-03-11T10:08"), live
    assert gaps[0][4] == "no lines and no heartbeats" and not [k for k in live if k[0] == "outage"], live
    assert hist == live, (sorted(hist), sorted(live))
    assert restarted == live, (sorted(restarted), sorted(live))


def _listener_beat(store: Any, collector: str, hb: datetime, label: str = "syslog:5514", site: str = "*") -> None:
    """A collector's listener heartbeat (no lines) in ``source_liveness`` and in the heartbeat log, as the consumer
    writes it for ``syslog-ng/heartbeat.sh``'s ``<name>:<port>`` rows."""
    _beat(store, site, datetime(1970, 1, 1, tzinfo=UTC), hb, host=collector, file=label, lines=0)
    _beat_log(store, site, hb, host=collector, file=label)


@pytest.mark.parametrize(("down_at", "reason", "liveness"), [
    (None, "source silent, its listener up", "quiet"),
    ("2026-03-11T10:03", "source silent, no heartbeat", None),
], ids=["listeners-up", "one-collector-died"])
def test_a_silent_network_sender_whose_listener_is_up_is_a_quiet_gap_live_in_history_and_after_a_restart(
        store: Any, down_at: str | None, reason: str, liveness: str | None) -> None:
    """The site logs to a file (heartbeats of its own) and through syslog (program ``apache``, no heartbeats:
    a network sender, received by the ``syslog:5514`` listeners of collectors ``coll-a`` and ``coll-b``).
    ``apache`` falls silent 10:00-10:40 while its rate said lines were due: a source ``pipeline_gap``.  Left open
    at stop 34 (checked by user trial 35): the gap said "no heartbeat" while ``GET /fp/sources`` said ``quiet``
    (the listener heartbeats: idle or gone).
    Now, while every listener that was up at its last line still is, the gap says so (``quiet``, the listeners
    named); a collector that died meanwhile (``coll-b`` from 10:03) leaves the old reason, as ``source_status``
    calls the sender ``dead`` then.  Live, history and a restarted live run agree."""
    name = f"case-quiet-sender-{'up' if down_at is None else 'died'}"
    case = {**DOWN, "site": {"name": name, "timezone": "UTC"},
            "sources": [{"file": "access.log", "share": 0.5}, {"file": "apache", "share": 0.5}],
            "events": [{"kind": "source_gap", "source": "apache", "from": "2026-03-11T10:00",
                        "to": "2026-03-11T10:40"}]}

    def listeners(hb: datetime) -> None:
        _listener_beat(store, "coll-a", hb)
        if down_at is None or hb < _local(case, down_at):
            _listener_beat(store, "coll-b", hb)

    live, hist, restarted = _three_ways(store, case, ("2026-03-11T23:00", "2026-03-11T23:01"), None,
                                        also=listeners)
    gaps = {k for k in live if k[1] == "source:origin/apache"}
    start, end = _local(case, "2026-03-11T10:00"), _local(case, "2026-03-11T10:39")
    assert gaps == {("pipeline_gap", "source:origin/apache", start, end, reason, liveness)}, sorted(live)
    assert not [k for k in live if k[1] == "source:origin/access.log"], sorted(live)
    assert hist == live, (sorted(hist), sorted(live))
    assert restarted == live, (sorted(restarted), sorted(live))
    stored = store.query_rows(f"SELECT detail FROM detections FINAL WHERE site = '{name}' "
                              "AND scope = 'source:origin/apache'")
    assert [json.loads(str(r[0])).get("listeners") for r in stored] == [
        ["coll-a syslog:5514", "coll-b syslog:5514"] if liveness else None], stored


def test_which_listeners_vouch_for_a_silent_source() -> None:
    """``SourceGapDetector``'s quiet rule picks the listeners as ``source_status`` does (``consumer._covering``):
    a raw TCP/UDP sender by its listener's label (the site's or ``*``), a syslog program by every ``*`` listener;
    never a followed file (a path), a source or host that ever heartbeated (``heartbeating``: judged by its own
    heartbeats), nor another site's listener."""
    from forumpulse.detectors.traffic import (
        LISTENER_KEY,
        SourceGapDetector,
        listener_key,
        load_rules,
        parse_listener_key,
    )
    gaps = SourceGapDetector(load_rules(), "forum")
    tcp_site, tcp_other = listener_key("forum", "coll", "tcp:5140"), listener_key("shop", "coll", "tcp:5140")
    sys_any, udp_any = listener_key("*", "coll", "syslog:5514"), listener_key("*", "coll", "udp:5141")
    fresh = {tcp_site, tcp_other, sys_any, udp_any, "web9/"}
    assert gaps._cover("10.0.0.7/tcp:5140", fresh) == {tcp_site}
    assert gaps._cover("10.0.0.7/udp:5141", fresh) == {udp_any}
    assert gaps._cover("10.0.0.7/tcp:6000", fresh) == set()        # no listener of that label is up
    assert gaps._cover("web1/apache", fresh) == {sys_any, udp_any}  # syslog: every multi-site listener
    assert gaps._cover("web1//var/log/apache2/access.log", fresh) == set()  # a followed file: its own heartbeats
    gaps.heartbeating = {"web2/nginx", "web3/"}
    assert gaps._cover("web2/nginx", fresh) == set() and gaps._cover("web3/apache", fresh) == set()
    assert gaps._cover("web1/apache", {"web1/access.log", "web9/"}) == set()  # no listener at all
    # the same choice as the status page's (consumer._covering; one rule, contracts.covering_listeners, reached
    # through each side's own rows: the detector's listener keys, the consumer's source_liveness rows)
    from forumpulse.pipeline.consumer import _covering, _Row
    rows = [_Row(*parse_listener_key(k), 0, 1) for k in fresh if k.startswith(LISTENER_KEY)]
    gaps.heartbeating = set()
    for src in ("10.0.0.7/tcp:5140", "10.0.0.7/udp:5141", "10.0.0.7/tcp:6000", "web1/apache",
                "web1//var/log/apache2/access.log"):
        host, _, file = src.partition("/")
        want = {listener_key(x.site, x.host, x.file) for x in _covering(_Row("forum", host, file, 1, 0), rows)}
        assert gaps._cover(src, fresh) == want, src


@pytest.mark.parametrize(("source", "listener_site", "label"), [
    ("tcp:5140", "own", "tcp:5140"),
    ("apache", "*", "syslog:5514"),
], ids=["raw-tcp-listener-of-the-site", "syslog-listener-of-every-site"])
def test_a_site_heard_only_through_network_senders_falls_silent_as_a_pipeline_gap_whatever_its_listener(
        store: Any, source: str, listener_site: str, label: str) -> None:
    """Every line of the site comes from one network sender (no heartbeats of its own), received by collector
    ``coll``; the sender falls silent 10:00-10:40 while the listener heartbeats.  A listener's heartbeats say
    nothing of the site (``sources_only``): the silence is a ``pipeline_gap`` of the site, live, in history and
    after a restart, with the sender's own gap saying its listener is up.  Left open at stop 35: a raw listener
    of the site itself (``tcp:5140`` for this site, not ``*``) was read as one of the site's sources, fresh, so
    live runs fed the silence as zeros on the outage path (no site gap), while a syslog sender's (``*``
    listener) was a gap; and history and a restart, with no heartbeat of the site's own in the log, called
    liveness ``unknown``."""
    name = f"case-net-only-{'raw' if listener_site == 'own' else 'syslog'}"
    case = {**DOWN, "site": {"name": name, "timezone": "UTC"}, "sources": [{"file": source, "share": 1.0}]}
    site = name if listener_site == "own" else "*"
    live, hist, restarted = _three_ways(store, case, ("2026-03-11T10:00", "2026-03-11T10:40"),
                                        ("2026-03-01T00:00", "2026-03-12T00:00"),
                                        also=lambda hb: _listener_beat(store, "coll", hb, label, site))
    assert not [k for k in live if k[0] in ("outage", "dip")], sorted(live)
    site_gaps = [k for k in live if k[0] == "pipeline_gap" and not k[1].startswith("source:")]
    assert len(site_gaps) == 1 and site_gaps[0][2] == _local(case, "2026-03-11T10:00"), sorted(live)
    assert site_gaps[0][4:] == ("no lines and no heartbeats", None), sorted(live)
    assert {k[4:] for k in live if k[1] == f"source:origin/{source}"} == {
        ("source silent, its listener up", "quiet")}, sorted(live)
    assert hist == live, (sorted(hist), sorted(live))
    assert restarted == live, (sorted(restarted), sorted(live))
