"""SeasonalDetector event lifecycle (from a review of the live traffic detection): an event superseded by an
outage is closed, not dropped; per-day state is pruned once no reference can read it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from forumpulse.detectors.series import Detection, SeasonalDetector
from forumpulse.detectors.traffic import load_rules, seasonal_params

T0 = datetime(2026, 3, 2, tzinfo=UTC)  # a Monday
DAY = 1440


def _run(det: SeasonalDetector, values: list[float] | np.ndarray, t0: datetime = T0) -> list[Detection]:
    out: list[Detection] = []
    for i, v in enumerate(values):
        out += [Detection(**{**d.__dict__, "detail": dict(d.detail)}) for d in det.update(t0 + timedelta(minutes=i),
                                                                                           float(v))]
    return out


def _spike_then_outage(days: int = 8) -> np.ndarray:
    x = np.full(days * DAY, 100.0)
    s = (days - 1) * DAY + 12 * 60
    x[s:s + 40] = 500.0   # a spike (the site overloaded) ...
    x[s + 40:s + 120] = 0.0  # ... then it falls over: outage
    return x


def test_a_spike_superseded_by_an_outage_is_closed_where_the_outage_begins() -> None:
    """Before the fix the open spike was popped from ``open`` without a closing state: its last emitted (stored,
    published) state stayed ``open`` with no end for good."""
    det = SeasonalDetector("UTC", None, seasonal_params(load_rules(), rollup=True), scope="site", site="forum")
    out = _run(det, _spike_then_outage())
    last = {d.id: d for d in out}
    spikes = [d for d in last.values() if d.kind == "spike"]
    outages = [d for d in last.values() if d.kind == "outage"]
    assert len(spikes) == 1 and len(outages) == 1, [d.to_json() for d in out]
    spike, outage = spikes[0], outages[0]
    assert spike.state == "closed" and spike.end == outage.start, spike.to_json()
    assert spike.detail.get("closed_by") == "outage"
    assert spike.start < outage.start
    # the closing state is emitted before the outage opens, with the spike's id
    kinds = [(d.kind, d.state) for d in out if d.id in (spike.id, outage.id)]
    assert kinds.index(("spike", "closed")) < kinds.index(("outage", "open"))
    assert not det.open and all(d.state == "closed" for d in last.values())


def test_per_day_state_is_pruned_without_changing_what_is_detected() -> None:
    """Before the fix every local day's arrays (days, clean, ref, excluded) were kept for good (~13 MB per
    site-year).  Days no reference lookup can reach are dropped; the detections are the same as unpruned."""
    days = 60
    t = np.arange(days * DAY)
    rng = np.random.default_rng(5)
    x = rng.poisson(60 + 40 * np.sin(2 * np.pi * (t % DAY) / DAY)).astype(float)
    for day, factor in ((5, 4.0), (50, 4.0)):  # spikes (kept out of later baselines)
        s = day * DAY + 14 * 60
        x[s:s + 60] *= factor
    x[55 * DAY + 600:55 * DAY + 700] = 0.0  # an outage
    params = seasonal_params(load_rules(), rollup=True)

    pruned = SeasonalDetector("UTC", None, params, scope="site", site="forum")
    kept = SeasonalDetector("UTC", None, params, scope="site", site="forum")
    kept.keep_days = 10_000
    a = [d.to_json() for d in _run(pruned, x)]
    b = [d.to_json() for d in _run(kept, x)]
    assert a == b and any('"outage"' in j for j in a) and any('"spike"' in j for j in a)
    assert len(kept.days) == days
    for per_day in (pruned.days, pruned.clean, pruned.ref, pruned.excluded):
        assert len(per_day) == pruned.keep_days + 1, len(per_day)
    assert min(pruned.days) == (T0 + timedelta(days=days - 1 - pruned.keep_days)).date()
    edge = T0 + timedelta(days=days - 1 - pruned.keep_days)
    assert all(c.end is not None and c.end >= edge for c in pruned.closed)
    assert len(pruned._unref_done) <= 2


def test_an_outage_on_a_quiet_day_ends_when_the_site_is_back_at_that_days_level() -> None:
    """A holiday (here: a day at 35% of the usual traffic from midnight) with an outage 10:00-13:00: the outage
    ends at 13:00, when the site answers at the day's own level again.  It waited for half of a normal day's
    traffic, so it stayed open for the rest of the quiet day (trial 31: 2-2.6 h on Chinese New Year)."""
    days = 15
    x = np.full(days * DAY, 100.0)
    q = (days - 1) * DAY
    x[q:] = 35.0
    x[q + 600:q + 780] = 0.0
    det = SeasonalDetector("UTC", None, seasonal_params(load_rules(), rollup=True), scope="site", site="forum")
    out = _run(det, x)
    outages = [d for d in {d.id: d for d in out}.values() if d.kind == "outage"]
    assert len(outages) == 1, [d.to_json() for d in out]
    o = outages[0]
    t = T0 + timedelta(minutes=q)
    assert o.start == t + timedelta(hours=10) and o.state == "closed", o.to_json()
    assert o.end == t + timedelta(hours=13), o.to_json()


def _closing_minute(det: SeasonalDetector, values: np.ndarray, kind: str) -> dict[str, int]:
    """Detection id -> the minute (index into ``values``, NaN = no row) at which its closed state was emitted."""
    closed: dict[str, int] = {}
    for i, v in enumerate(values):
        if np.isnan(v):
            continue
        for d in det.update(T0 + timedelta(minutes=int(i)), float(v)):
            if d.kind == kind and d.state == "closed":
                closed.setdefault(d.id, i)
    return closed


@pytest.mark.parametrize("before", ["outage", "silence"])
def test_an_earlier_outage_or_silence_is_no_quiet_day_for_the_next_outage(before: str) -> None:
    """An ordinary day: the hours before a second outage held an earlier outage (or a stretch with no rows).  Those
    minutes are not the site's level: the second outage is back when the site reaches half of its usual traffic,
    not when it answers at 40% of it (the earlier outage counted as quiet traffic lowered the bar to a third)."""
    days = 8
    x = np.full(days * DAY, 100.0)
    q = (days - 1) * DAY
    x[q + 600:q + 660] = 0.0 if before == "outage" else np.nan  # 10:00-11:00
    x[q + 750:q + 840] = 0.0   # the second outage, 12:30-14:00
    x[q + 840:q + 885] = 40.0  # answers at 40% until 14:45
    det = SeasonalDetector("UTC", None, seasonal_params(load_rules(), rollup=True), scope="site", site="forum")
    closed = _closing_minute(det, x, "outage")
    assert len(closed) == (2 if before == "outage" else 1), closed
    assert max(closed.values()) >= q + 885, f"closed at minute {max(closed.values()) - q} of the day"


def test_an_outage_into_a_day_kind_without_references_closes_when_the_site_is_back() -> None:
    """A new site's first weekend has no reference day of its kind: an outage from Friday 23:30 to Saturday 00:30
    stayed open until Monday (the close compared with an expectation that did not exist), and the whole weekend was
    kept out of the baselines as outage minutes, so the next weekend had no reference either (found by a review).
    Without an expectation the site is back after 15 up minutes in a row."""
    det = SeasonalDetector("UTC", None, seasonal_params(load_rules(), rollup=True), site="new")
    x = np.full(15 * DAY, 20.0)
    down_from = 4 * DAY + 23 * 60 + 30  # Friday 6 March 23:30
    x[down_from:down_from + 60] = 0.0
    got = [d for d in _run(det, x) if d.kind == "outage"]
    first = T0 + timedelta(minutes=down_from)
    closed = [d for d in got if d.state == "closed"]
    assert {d.id for d in got} == {closed[0].id} and len(closed) == 1
    assert closed[0].start == first and closed[0].end == first + timedelta(minutes=60)
    assert closed[0].detail["minutes"] == 60
    sat = T0 + timedelta(days=5)
    assert int(det.excluded[sat.date()].sum()) < 60  # the outage's minutes and its recovery, not the day
    value, refs = det.expected(T0 + timedelta(days=12, hours=12), 30)  # the second Saturday is judged
    assert refs == 2 and value == pytest.approx(600.0)


def test_a_spike_ends_after_its_last_elevated_minute_not_when_its_window_clears() -> None:
    """A 15-minute flood (06:00-06:14) was reported until about 06:44: the 30-minute trailing window says the
    spike is over up to 30 minutes after the traffic was (user trial 40: a 12-minute flood read as "40 min").  It
    ends the minute after its last minute at spike_ratio x its busiest reference; the start and the id are
    unchanged."""
    det = SeasonalDetector("UTC", None, seasonal_params(load_rules(), rollup=True), site="f")
    x = np.random.default_rng(2).poisson(100, 9 * DAY).astype(float)
    flood = 8 * DAY + 6 * 60
    x[flood:flood + 15] += 1500.0
    spikes = [d for d in _run(det, x) if d.kind == "spike"]
    closed = [d for d in spikes if d.state == "closed"]
    assert len(closed) == 1 and len({d.id for d in spikes}) == 1
    t = T0 + timedelta(minutes=flood)
    assert t <= closed[0].start <= t + timedelta(minutes=2)
    assert closed[0].end == t + timedelta(minutes=15), closed[0].to_json()
