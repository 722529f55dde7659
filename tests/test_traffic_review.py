"""Traffic-detector behaviours found by review (each failed before its fix):

* a silence in the night trough, where the site normally has fewer than ``gap_min_expected`` requests, is not
  a pipeline gap in a live run either (the end-of-range path opened one that history never reported, and the
  open row then stayed in ``detections``);
* a history run over a shorter range does not overwrite an event the store already has closed (by a run over
  more data) with this run's truncated, still-open view.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from forumpulse.detectors.traffic import LIVE_CLOCK_SKEW_S, TrafficDetector, detect_history, partition_state
from test_traffic_cases import _local, _settings, build_requests

QUIET = {"site": {"name": "case-night", "timezone": "Europe/Berlin"}, "start": "2026-03-01", "days": 11,
         "per_minute": 1, "weekend_factor": 1.0, "events": [{"kind": "gap", "from": "2026-03-11T03:00",
                                                              "to": "2026-03-11T03:15"}]}


def test_a_quiet_night_silence_is_no_gap_live_or_in_history(store: Any) -> None:
    store.insert("requests", build_requests(QUIET))
    settings = _settings([QUIET])
    name = QUIET["site"]["name"]
    # history over the night: nothing (the normal night has too few requests for a silence to mean anything)
    hist = detect_history(store, _local(QUIET, "2026-03-10T00:00"), _local(QUIET, "2026-03-11T06:00"), settings,
                          sites=[name])
    night = _local(QUIET, "2026-03-11T00:00")
    assert [d for d in hist if d.kind == "pipeline_gap" and d.start >= night] == []
    # live, minute by minute through the silence and after it: the same
    live = TrafficDetector(settings, sites=[name])
    seen = []
    t = _local(QUIET, "2026-03-11T02:50")
    while t <= _local(QUIET, "2026-03-11T03:40"):
        # (the first call warms up on the days before and reports what it finds there: not this night)
        seen += [d for d in live.run_once(store, t) if d.kind == "pipeline_gap" and d.start >= night]
        t += timedelta(minutes=1)
    assert seen == [], [(d.scope, d.start, d.state) for d in seen]
    rows = store.query_rows(f"SELECT count() FROM detections FINAL WHERE site = '{name}' AND kind = 'pipeline_gap' "
                            f"AND start_ts >= toDateTime('{night:%Y-%m-%d %H:%M:%S}', 'UTC')")
    assert rows[0][0] == 0


SPIKE = {"site": {"name": "case-rerun", "timezone": "America/New_York", "country": "US"}, "start": "2026-03-01",
         "days": 14, "per_minute": 8, "weekend_factor": 1.0,
         "events": [{"kind": "factor", "from": "2026-03-12T10:00", "to": "2026-03-12T13:00", "factor": 4}]}


def _stored(store: Any, det_id: str) -> tuple[str, Any]:
    r = store.query_rows(f"SELECT state, end_ts FROM detections FINAL WHERE id = '{det_id}'")
    return str(r[0][0]), r[0][1]


def test_a_shorter_history_run_does_not_reopen_a_closed_event(store: Any) -> None:
    store.insert("requests", build_requests(SPIKE))
    settings = _settings([SPIKE])
    name = SPIKE["site"]["name"]
    full = detect_history(store, _local(SPIKE, "2026-03-12T00:00"), _local(SPIKE, "2026-03-14T00:00"), settings,
                          sites=[name])
    spikes = [d for d in full if d.kind == "spike"]
    assert spikes and spikes[0].state == "closed", [(d.kind, d.state) for d in full]
    sid = spikes[0].id
    # the same data, a range that ends while the spike is still going on: it prints the spike open ...
    short = detect_history(store, _local(SPIKE, "2026-03-12T00:00"), _local(SPIKE, "2026-03-12T11:30"), settings,
                           sites=[name])
    assert any(d.id == sid and d.state == "open" for d in short)
    # ... but the store keeps what the run over more data knew: closed, with its end
    state, end = _stored(store, sid)
    assert state == "closed" and end is not None
    stored_end = datetime.fromtimestamp(end, UTC) if isinstance(end, int | float) else end.replace(tzinfo=UTC)
    assert stored_end == next(d for d in full if d.id == sid).end


LAG = {"site": {"name": "case-lag", "timezone": "UTC"}, "start": "2026-03-01", "days": 11, "per_minute": 20,
       "weekend_factor": 1.0, "events": []}


def _liveness(store: Any, name: str, line: datetime, hb: datetime) -> None:
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    store.insert("source_liveness", pa.table({
        "site": [name], "origin_host": ["origin"], "origin_file": ["access.log"],
        "last_line_ts": pa.array([line], ts), "last_heartbeat_ts": pa.array([hb], ts),
        "lines": pa.array([1], pa.uint64()), "updated_at": pa.array([datetime.now(UTC)], ts)}))


def test_a_loader_running_behind_holds_live_detection_back_instead_of_reading_zeros(store: Any) -> None:
    import pyarrow.compute as pc

    rows = build_requests(LAG)
    name = LAG["site"]["name"]
    cut = _local(LAG, "2026-03-11T10:00")
    late = pc.greater_equal(rows.column("ts"), cut)
    store.insert("requests", rows.filter(pc.invert(late)))  # the loader has loaded up to 10:00 ...
    _liveness(store, name, cut - timedelta(seconds=2), cut - timedelta(seconds=1))
    det = TrafficDetector(_settings([LAG]), sites=[name])
    det.run_once(store, _local(LAG, "2026-03-11T10:06"))  # ... while the clock says 10:06
    rt = det.sites[name]
    assert rt.cursor == _local(LAG, "2026-03-11T09:59"), rt.cursor  # not past the watermark
    # the loader catches up: the minutes 09:59 .. 10:05 are fed with their real counts, not as zeros
    store.insert("requests", rows.filter(late))
    _liveness(store, name, _local(LAG, "2026-03-11T10:06:30"), _local(LAG, "2026-03-11T10:06:40"))
    dets = det.run_once(store, _local(LAG, "2026-03-11T10:07"))
    assert rt.cursor == _local(LAG, "2026-03-11T10:06")
    day = rt.seasonal.days[_local(LAG, "2026-03-11T00:00").date()]
    fed = day[599:606].tolist()  # 09:59 .. 10:05 UTC
    real = [float(r[1]) for r in store.query_rows(
        f"SELECT minute, sum(pageviews) FROM site_minute WHERE site = '{name}' AND minute >= "
        "toDateTime('2026-03-11 09:59:00', 'UTC') AND minute < toDateTime('2026-03-11 10:06:00', 'UTC') "
        "GROUP BY minute ORDER BY minute")]
    assert len(real) == 7 and sum(real) > 0
    assert fed == real, (fed, real)  # the minutes' real traffic, not zeros
    assert [d for d in dets if d.kind in ("dip", "outage", "pipeline_gap")] == []


def test_a_quiet_file_of_a_heartbeating_host_does_not_hold_the_site_back(store: Any) -> None:
    import pyarrow as pa

    case = {**LAG, "site": {"name": "case-hosthb", "timezone": "UTC"}}
    store.insert("requests", build_requests(case))
    name = case["site"]["name"]
    now = _local(case, "2026-03-11T10:06")
    ts = pa.timestamp("ms", tz="UTC")
    quiet = now - timedelta(minutes=8)  # the file's last line and own heartbeat: 8 minutes ago (within the gap)
    store.insert("source_liveness", pa.table({
        "site": [name, "*"], "origin_host": ["origin", "origin"], "origin_file": ["access.log", ""],
        "last_line_ts": pa.array([quiet, datetime(1970, 1, 1, tzinfo=UTC)], ts),
        "last_heartbeat_ts": pa.array([quiet, now - timedelta(seconds=5)], ts),  # the host's MARK is fresh
        "lines": pa.array([1, 0], pa.uint64()), "updated_at": pa.array([datetime.now(UTC)] * 2, ts)}))
    det = TrafficDetector(_settings([case]), sites=[name])
    det.run_once(store, now)
    assert det.sites[name].cursor == now - timedelta(minutes=1)  # not held 8 minutes back by the quiet file


@pytest.mark.parametrize(("beat", "line", "loader", "cursor"), [
    # quiet since 09:50, its heartbeat (a 20-minute MARK) at 10:01:30: before the fix held there till 10:11
    ("10:01:30", "09:50", True, "10:05"),
    ("10:01:30", "09:50", False, "10:01"),    # no loader reports (ingest): a late loader looks the same, held
    ("10:05:40", "09:50", True, "10:05"),     # a fresh heartbeat holds as before (at 10:05:40: nothing to wait)
    ("10:01:30", "10:03:30", True, "10:03"),  # lines after its heartbeat: still held at its latest line
])
def test_a_quiet_source_with_slow_heartbeats_does_not_pin_the_watermark(store: Any, beat: str, line: str,
                                                                         loader: bool, cursor: str) -> None:
    """A source heartbeating more slowly than heartbeat_fresh_seconds, quiet at its last heartbeat, with the Kafka
    loader caught up on every partition: nothing of it waits to be loaded (from a review)."""
    store.insert("requests", build_requests(PART))
    name = PART["site"]["name"]
    _liveness(store, name, _local(PART, f"2026-03-11T{line}"), _local(PART, f"2026-03-11T{beat}"))
    if loader:
        _progress(store, [(0, _NOW - timedelta(seconds=2), 0, True, _NOW - timedelta(seconds=3))])
    det = TrafficDetector(_settings([PART]), sites=[name])
    det.run_once(store, _NOW)
    assert det.sites[name].cursor == _local(PART, f"2026-03-11T{cursor}"), det.sites[name].cursor


def _progress(store: Any, rows: list[tuple[int, datetime, int, bool, datetime]]) -> None:
    """``consumer_progress`` rows: (partition, loaded_ts, lag, active, updated_at)."""
    import pyarrow as pa
    from forumpulse.pipeline.consumer import PROGRESS_SCHEMA

    store.insert("consumer_progress", pa.Table.from_pylist([
        {"group_id": "g", "topic": "weblogs.raw", "partition": p, "loaded_ts": loaded, "next_offset": 1, "lag": lag,
         "active": active, "instance": "i", "updated_at": upd} for p, loaded, lag, active, upd in rows],
        schema=PROGRESS_SCHEMA))


PART = {**LAG, "site": {"name": "case-partition", "timezone": "UTC"}, "start": "2026-03-10", "days": 2, "per_minute": 2}
_NOW = datetime(2026, 3, 11, 10, 6, tzinfo=UTC)


@pytest.mark.parametrize(("rows", "cursor"), [
    # partition 1 behind: held at the newest message stored from it (10:00:58 -> the minutes before 10:00)
    ([(0, _NOW - timedelta(seconds=3), 0, True, _NOW - timedelta(seconds=4)),
      (1, datetime(2026, 3, 11, 10, 0, 58, tzinfo=UTC), 420, True, _NOW - timedelta(seconds=4))], "10:00"),
    # behind with an unknown lag (-1: the broker not answering): held the same way
    ([(1, datetime(2026, 3, 11, 10, 2, 30, tzinfo=UTC), -1, True, _NOW - timedelta(seconds=4))], "10:02"),
    # caught up but its owner's last report is 2 minutes old (stuck or killed): held at that report
    ([(0, _NOW - timedelta(minutes=2), 0, True, _NOW - timedelta(minutes=2))], "10:04"),
    # the newest row counts: behind earlier, caught up now
    ([(1, datetime(2026, 3, 11, 10, 0, 58, tzinfo=UTC), 420, True, _NOW - timedelta(seconds=20)),
      (1, _NOW - timedelta(seconds=2), 0, True, _NOW - timedelta(seconds=3))], "10:05"),
    # its owner exited cleanly while behind (a rolling restart; the next owner has not reported): still held
    ([(0, datetime(2026, 3, 11, 10, 0, 58, tzinfo=UTC), 420, False, _NOW - timedelta(seconds=3))], "10:00"),
    # the newest message's Kafka time is ahead of the clock (a producer's clock): held at the report instead
    ([(1, datetime(2026, 3, 11, 10, 30, tzinfo=UTC), 420, True, datetime(2026, 3, 11, 10, 3, 30, tzinfo=UTC))],
     "10:03"),
    # the consumer's clock is 7 minutes ahead: 2 minutes behind by its clock -> held 2 minutes before now
    ([(1, datetime(2026, 3, 11, 10, 11, tzinfo=UTC), 420, True, datetime(2026, 3, 11, 10, 13, tzinfo=UTC))],
     "10:04"),
    # caught up and reporting, released caught up by a clean exit, reported more than gap_min_minutes ago, or more
    # than gap_min_minutes behind: not waited for (the sources' watermark alone: their newest heartbeat, 10:05:57)
    ([(0, _NOW - timedelta(seconds=2), 0, True, _NOW - timedelta(seconds=3))], "10:05"),
    ([(0, datetime(2026, 3, 11, 10, 0, 58, tzinfo=UTC), 0, False, _NOW - timedelta(seconds=3))], "10:05"),
    ([(0, datetime(2026, 3, 11, 9, 50, tzinfo=UTC), 420, True, _NOW - timedelta(minutes=11))], "10:05"),
    ([(0, datetime(2026, 3, 11, 9, 50, tzinfo=UTC), 420, True, _NOW - timedelta(seconds=3))], "10:05"),
], ids=["behind", "lag-unknown", "stale-report", "newest-row", "released-behind", "future-kafka-time", "consumer-clock-ahead",
        "caught-up",
        "released", "gone", "far-behind"])
def test_a_partition_behind_holds_live_detection_back(store: Any, rows: list[Any], cursor: str) -> None:
    """The sources are fresh (their latest lines came through the partitions that are current), yet a partition
    behind means minutes not fully loaded: the detectors wait for it (``consumer_progress``, migration 0007)."""
    store.insert("requests", build_requests(PART))
    name = PART["site"]["name"]
    _liveness(store, name, _NOW - timedelta(seconds=5), _NOW - timedelta(seconds=3))
    _progress(store, rows)
    det = TrafficDetector(_settings([PART]), sites=[name])
    det.run_once(store, _NOW)
    assert det.sites[name].cursor == _local(PART, f"2026-03-11T{cursor}"), det.sites[name].cursor


def test_a_progress_report_is_stale_only_past_the_clock_skew_allowed() -> None:
    """A report carries the consumer's clock: one up to LIVE_CLOCK_SKEW_S behind the detector's clock is not yet
    "not reporting" (which would hold every site back by the skew)."""
    now, stale = 1_000_000_000, 30.0
    edge = now - int((stale + LIVE_CLOCK_SKEW_S) * 1000)
    assert partition_state(edge, 0, True, edge, now, stale, 10) == ("caught up", None)
    assert partition_state(edge - 1, 0, True, edge - 1, now, stale, 10) == ("not reporting", edge - 1)
    # behind, with a Kafka time within the skew ahead: held at it; beyond: at the report (never lifted)
    ahead = now + int(LIVE_CLOCK_SKEW_S * 1000)
    assert partition_state(ahead, 5, True, now - 10, now, stale, 10) == ("behind", ahead)
    assert partition_state(ahead + 1, 5, True, now - 10, now, stale, 10) == ("behind", now - 10)
    assert partition_state(ahead + 1, 5, True, now + 10, now, stale, 10) == ("behind", now)
    # the consumer's clock 5 minutes ahead (it clamps Kafka times to it): 60 s behind by its own clock
    five = 300_000
    assert partition_state(now + five - 60_000, 5, True, now + five, now, stale, 10) == ("behind", now - 60_000)
