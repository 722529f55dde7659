"""Series mode (``detect series``), from an ops trial (stop 29): a lasting level change is at most two events that
close (``new_level``, then ``after_new_level`` on the other kind of day), never an event open for good or a dip
re-opened every weekend; an outage ends where the traffic came back, its recovery minutes left out."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from forumpulse.detectors.series import SeasonalParams, series_events

T0 = datetime(2024, 3, 4, tzinfo=UTC)  # a Monday


def _counter(days: int, seed: int = 5) -> tuple[list[datetime], np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    n = days * 288
    ts = [T0 + timedelta(minutes=5 * i) for i in range(n)]
    hour = np.arange(n) * 5 / 60 % 24
    weekend = np.array([t.weekday() >= 5 for t in ts])
    mean = (200 + 150 * np.sin((hour - 6) / 24 * 2 * math.pi)) * np.where(weekend, 0.6, 1.0)
    return ts, mean, rng


@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_a_lasting_level_change_closes_and_is_learnt(factor: float) -> None:
    ts, mean, rng = _counter(28)
    shift = 14 * 288 + 9 * 12  # Monday of week 3, 09:00
    mean = mean.copy()
    mean[shift:] *= factor
    x = rng.poisson(mean).astype(float)
    kind = "spike" if factor > 1 else "dip"
    events = [d for d in series_events(ts, x) if d.kind == kind]
    assert events, "the change itself must be reported"
    assert all(d.state == "closed" for d in events), [d.to_json() for d in events]
    first = events[0]
    assert first.start >= ts[shift] and first.detail.get("closed_by") == "new_level"
    assert first.end is not None and first.end - first.start == timedelta(hours=24)
    assert len(events) <= 2 and all(d.detail.get("after_new_level") for d in events[1:])
    # without the rule the first event stays open to the end of the data (what the trial found)
    old = [d for d in series_events(ts, x, seasonal=SeasonalParams(new_level_hours=0)) if d.kind == kind]
    assert any(d.state == "open" for d in old) or len(old) > 2


def test_an_outage_ends_where_the_traffic_came_back() -> None:
    ts, mean, rng = _counter(10)
    x = rng.poisson(mean).astype(float)
    down = 8 * 288 + 14 * 12  # Tuesday 14:00, two hours at zero
    x[down:down + 24] = 0
    outages = [d for d in series_events(ts, x) if d.kind == "outage"]
    assert len(outages) == 1
    o = outages[0]
    assert o.start == ts[down] and o.end == ts[down + 24]  # 16:00: the first minute back
    assert o.observed == 0.0 and o.detail["minutes"] == 120 and o.expected > 0
    assert not any(k.startswith("_") for k in json.loads(o.to_json())["detail"])


def _minutes(days: int, seed: int = 9) -> tuple[list[datetime], np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    n = days * 1440
    ts = [T0 + timedelta(minutes=i) for i in range(n)]
    hour = np.arange(n) / 60 % 24
    weekend = np.array([t.weekday() >= 5 for t in ts])
    return ts, (40 + 30 * np.sin((hour - 6) / 24 * 2 * math.pi)) * np.where(weekend, 0.6, 1.0), rng


def test_bursts_on_top_of_a_new_level_are_ordinary_events() -> None:
    """Review: a burst on a workday after a workday shift must be kept out of the baselines as before, so the
    same burst the next evening is found again (the first form flagged every event of the week)."""
    ts, mean, rng = _minutes(21)
    shift = 14 * 1440 + 9 * 60  # Monday 09:00
    mean = mean.copy()
    mean[shift:] *= 3
    for day in (17, 18):  # Thursday and Friday, 20:00-21:00, x4 on the new level
        mean[day * 1440 + 20 * 60:day * 1440 + 21 * 60] *= 4
    x = rng.poisson(mean).astype(float)
    spikes = [d for d in series_events(ts, x) if d.kind == "spike"]
    assert spikes[0].detail.get("closed_by") == "new_level"
    for day in (17, 18):
        found = [d for d in spikes if ts[day * 1440 + 20 * 60] <= d.start <= ts[day * 1440 + 21 * 60]]
        assert len(found) == 1 and not found[0].detail.get("after_new_level"), [d.to_json() for d in spikes]


@pytest.mark.parametrize("factor", [3.0, 0.3])
def test_a_friday_shift_is_learnt_within_a_few_events(factor: float) -> None:
    ts, mean, rng = _minutes(28, seed=2)
    shift = 18 * 1440 + 14 * 60  # Friday 14:00
    mean = mean.copy()
    mean[shift:] *= factor
    x = rng.poisson(mean).astype(float)
    kind = "spike" if factor > 1 else "dip"
    events = [d for d in series_events(ts, x) if d.kind == kind]
    assert events and all(d.state == "closed" for d in events)
    assert events[0].detail.get("closed_by") == "new_level"
    assert 1 <= len(events) <= 3 and all(d.detail.get("after_new_level") for d in events[1:])
    assert events[-1].end is not None and events[-1].end < ts[shift] + timedelta(days=4)


def _outage_minutes(pattern: list[tuple[int, int, bool]]) -> tuple[list[datetime], np.ndarray]:
    """Nine days at 50 per minute (fed minute by minute), then ``pattern``: (first, last minute offset from day
    nine 10:00, fed?) spans at zero -- others at 50; unfed spans are absent (no data)."""
    base = 8 * 1440 + 10 * 60
    ts, x = [], []
    skip: set[int] = set()
    zero: set[int] = set()
    for a, b, fed in pattern:
        (zero if fed else skip).update(range(base + a, base + b + 1))
    for i in range(10 * 1440):
        if i in skip:
            continue
        ts.append(T0 + timedelta(minutes=i))
        x.append(0.0 if i in zero else 50.0)
    return ts, np.asarray(x)


def test_an_up_flicker_inside_an_outage_is_part_of_it() -> None:
    p = SeasonalParams(outage_min_minutes=10)
    ts, x = _outage_minutes([(0, 39, True), (43, 79, True)])  # 3 minutes up at 10:40-10:42
    o = [d for d in series_events(ts, x, seasonal=p) if d.kind == "outage"]
    assert len(o) == 1 and o[0].end == T0 + timedelta(days=8, hours=11, minutes=20)
    assert o[0].observed == 150.0 and o[0].detail["minutes"] == 80  # the flicker's 3 x 50 counted


def test_an_outage_closed_by_no_data_and_reopened_carries_nothing_stale() -> None:
    """Review: an outage that closes, re-opens (same id, within merge_minutes), is closed by a stretch without
    data while up minutes are pending, and re-opens again never shows what an earlier close said."""
    from forumpulse.detectors.series import SeasonalDetector

    p = SeasonalParams(outage_min_minutes=10, merge_minutes=60)
    # 10:00 down 30 min, back 15 (closes), down 25 (re-opens), 3 up minutes pending, 16 min no data, down 15
    ts, x = _outage_minutes([(0, 29, True), (45, 69, True), (73, 88, False), (89, 103, True)])
    det = SeasonalDetector("UTC", None, p, "series")
    states: list[dict] = []
    for t, v in zip(ts, x, strict=True):
        states += [json.loads(d.to_json()) for d in det.update(t, float(v)) if d.kind == "outage"]
    states += [json.loads(d.to_json()) for d in det.finish() if d.kind == "outage"]
    assert len({s["id"] for s in states}) == 1, states
    closes = [s for s in states if s["state"] == "closed"]
    assert closes[0]["end"] == "2024-03-12T10:30:00Z" and closes[0]["detail"]["minutes"] == 30
    no_data = next(s for s in closes if s["detail"].get("closed_by") == "no_data")
    assert no_data["end"] == "2024-03-12T11:09:00Z" and no_data["detail"]["minutes"] == 70  # not the up minutes
    for s in states:
        if s["state"] == "open":
            assert "closed_by" not in s["detail"] and "minutes" not in s["detail"], s
    assert closes[-1]["end"] >= "2024-03-12T11:44:00Z" and "closed_by" not in closes[-1]["detail"]


def test_an_outage_closed_by_no_data_right_after_it_opened_keeps_its_minutes() -> None:
    """Review: 10 minutes down (the confirmation), then no data: the outage ends at its last down minute, not at
    its start (it read 'minutes: 1')."""
    ts, x = _outage_minutes([(0, 9, True), (10, 40, False)])
    o = [d for d in series_events(ts, x, seasonal=SeasonalParams(outage_min_minutes=10)) if d.kind == "outage"]
    assert len(o) == 1 and o[0].detail["closed_by"] == "no_data"
    assert o[0].end == T0 + timedelta(days=8, hours=10, minutes=9) and o[0].detail["minutes"] == 10
