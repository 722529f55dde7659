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
