"""TransferDetector's evidence rule (rules v3) on hand-made windows: binomial tail of a low median, runs of low
windows, the lower-tail share q estimated from the baseline."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from forumpulse.detectors.traffic import TransferDetector, detections_table, load_rules
from scipy.stats import binom

T0 = datetime(2026, 3, 2, tzinfo=UTC)
KEY = ("transfer_regression", "proxy|10.0.0.5|ge10m")


def _feed(det: TransferDetector, windows: list[tuple[int, float, float]]) -> list[tuple[int, dict[str, object]]]:
    """Feed (n, median, q05) windows one after the other; returns (window index, detail) of each opening."""
    out = []
    for i, (n, med, q05) in enumerate(windows):
        for d in det.update("transfer_regression", T0 + timedelta(minutes=15 * (i + 1)),
                            [("proxy", "10.0.0.5", "ge10m", n, med, q05)]):
            if d.state == "open":
                out.append((i, dict(d.detail)))
    return out


def test_one_low_window_of_three_is_no_regression_three_in_a_row_are() -> None:
    rules = load_rules()
    base = [(3, 500e6, 400e6)] * 20
    det = TransferDetector(rules, "s")
    assert _feed(det, [*base, (3, 100e6, 90e6), (3, 500e6, 400e6)]) == []  # one low window, then normal: reset
    det = TransferDetector(rules, "s")
    opened = _feed(det, [*base, (3, 100e6, 90e6), (3, 100e6, 90e6), (3, 100e6, 90e6)])
    assert [i for i, _ in opened] == [22]  # the third low window: (7.25e-3)^3 <= 1e-6, two are not (5e-5)
    want = 3 * math.log10(float(binom.sf(1, 3, 0.05)))
    assert abs(float(opened[0][1]["log10_p"]) - round(want, 2)) < 1e-9
    assert opened[0][1]["requests_in_run"] == 9


def test_one_window_of_many_responses_is_enough() -> None:
    det = TransferDetector(load_rules(), "s")
    opened = _feed(det, [*[(40, 500e6, 400e6)] * 20, (20, 100e6, 90e6)])
    assert [i for i, _ in opened] == [20]  # P(X >= 10 | 20, 5%) = 1e-8


def test_wide_baseline_raises_the_tail_share() -> None:
    """A class whose 5% quantile sits at 0.3x its median (wide rates) makes each low response less surprising:
    q is the log-normal lower tail at half the median (> 5%), and the same three low windows are not enough."""
    rules = load_rules()
    det = TransferDetector(rules, "s")
    _feed(det, [(40, 500e6, 150e6)] * 20)
    q = det.tail_share(KEY)
    sigma = math.log(1 / 0.3) / 1.6449
    assert abs(q - 0.5 * math.erfc(math.log(2.0) / sigma / math.sqrt(2))) < 1e-12
    assert q > 0.15
    assert _feed(det, [(3, 100e6, 90e6)] * 3) == []
    narrow = TransferDetector(rules, "s")
    _feed(narrow, [(40, 500e6, 400e6)] * 20)
    assert narrow.tail_share(KEY) == float(rules["transfer"]["tail_share"])


# ------------------------------------------------------------------------------------------ creep (rules v5)

LAT = ("latency_regression", "origin|10.0.0.11|lt100k")


def _p95(i: int, weekend_factor: float = 1.0) -> float:
    """A calm p95 (ms) of window ``i`` (15-minute windows from Monday T0): a daily cycle 0.8x-1.2x, a weekend
    factor, a little deterministic jitter."""
    t = T0 + timedelta(minutes=15 * i)
    day = 1.0 + 0.2 * math.sin(2 * math.pi * (t.hour * 60 + t.minute) / 1440)
    wk = weekend_factor if t.weekday() >= 5 else 1.0
    return 120.0 * day * wk * (1.0 + 0.03 * math.sin(i * 1.7))


def _feed_latency(det: TransferDetector, values: list[float]) -> list[tuple[int, str, dict[str, object]]]:
    """Feed one p95 per 15-minute window (100 responses each); returns (window index, state, detail) of every
    latency detection emitted."""
    out = []
    for i, v in enumerate(values):
        for d in det.update("latency_regression", T0 + timedelta(minutes=15 * (i + 1)),
                            [("origin", "10.0.0.11", "lt100k", 100, v)]):
            out.append((i, d.state, dict(d.detail)))
    return out


def test_slow_latency_creep_is_found_against_the_anchored_reference() -> None:
    """p95 creeps up 2x over three days (~26% a day): every window is only a few % over the trailing 24-hour
    median, so the short-term rule never fires; against the reference 2-9 days back the creep is found about two
    days in, once, with trigger ``creep``."""
    day = 96
    calm = [_p95(i) for i in range(10 * day)]
    ramp = [_p95(10 * day + i) * (1.0 + i / (3 * day)) for i in range(3 * day)]
    hold = [_p95(13 * day + i) * 2.0 for i in range(2 * day)]
    got = _feed_latency(TransferDetector(load_rules(), "s"), calm + ramp + hold)
    opened = [(i, d) for i, state, d in got if state == "open"]
    assert len(opened) == 1, got
    i, detail = opened[0]
    assert detail["trigger"] == "creep"
    assert 10 * day + 1.5 * day <= i <= 13 * day, (i - 10 * day) / day  # found within the creep, ~2 days in
    assert float(detail["ratio"]) >= 1.5  # type: ignore[arg-type]


def test_daily_and_weekly_cycles_are_no_creep() -> None:
    """Three weeks of a daily cycle and 1.6x weekends: the creep level is a whole day and a weekend is compared
    with the same hours a week back, so nothing opens."""
    values = [_p95(i, weekend_factor=1.6) for i in range(21 * 96)]
    assert _feed_latency(TransferDetector(load_rules(), "s"), values) == []


def test_creep_reference_is_frozen_while_open_and_recovery_closes_it() -> None:
    """Once open, the reference is the one at opening: a regression that stays at 2x for ten days stays open
    (a sliding reference would have absorbed it within a week); back to normal, it closes."""
    day = 96
    calm = [_p95(i) for i in range(10 * day)]
    ramp = [_p95(10 * day + i) * (1.0 + i / (3 * day)) for i in range(3 * day)]
    hold = [_p95(13 * day + i) * 2.0 for i in range(10 * day)]
    back = [_p95(23 * day + i) for i in range(2 * day)]
    det = TransferDetector(load_rules(), "s")
    ends = []
    for i, v in enumerate(calm + ramp + hold + back):
        for d in det.update("latency_regression", T0 + timedelta(minutes=15 * (i + 1)),
                            [("origin", "10.0.0.11", "lt100k", 100, v)]):
            ends.append((i, d.state, d.end))
    states = [(i, state) for i, state, _ in ends]
    assert [s for _, s in states].count("open") >= 1 and states[-1][1] == "closed", states
    closed_at = states[-1][0]
    assert 23 * day < closed_at <= 24 * day + day // 2, (closed_at - 23 * day) / day
    # closed when the day's median came back (about half a day later), it ended where the windows came back: at
    # the end of the last window at 2x (window 23 * day - 1 ends at 23 days after T0)
    assert ends[-1][2] == T0 + timedelta(days=23), ends[-1]
    assert all(s == "open" for i, s in states if i < 23 * day)


def test_the_worst_window_of_an_open_regression_rests_on_enough_responses() -> None:
    """Open (20 responses at 1/5 of the rate), a window with one response at 1/100 does not become the regression's
    worst rate (``observed``): a single slow transfer says nothing of the upstream (user trial 30); a window with as
    many responses does."""
    det = TransferDetector(load_rules(), "s")
    seen = []
    windows = [*[(40, 500e6, 400e6)] * 20, (20, 100e6, 90e6), (1, 5e6, 5e6), (3, 90e6, 80e6), (25, 80e6, 70e6)]
    for i, (n, med, q05) in enumerate(windows):
        seen += [(i, d.observed, dict(d.detail)) for d in det.update(
            "transfer_regression", T0 + timedelta(minutes=15 * (i + 1)), [("proxy", "10.0.0.5", "ge10m", n, med, q05)])]
    (d,) = det.open.values()
    assert seen[0][0] == 20 and d.observed == 80e6 and d.detail["requests"] == 25, (d.observed, d.detail)
    assert d.peak_ts == T0 + timedelta(minutes=15 * 24)


def test_a_zero_latency_baseline_gives_json_without_infinity() -> None:
    """A cache host logging 0 ms (squid hits, nginx ``0.000``) has a p95 baseline of 0: a regression to 120 ms
    had ``"ratio": Infinity`` in its JSON line and in ``detections.detail``, which strict JSON readers refuse
    (found by a review).  The ratio is null there, the score 1."""
    td = TransferDetector(load_rules(), "forum")
    t0 = datetime(2026, 3, 2, tzinfo=UTC)
    out = []
    for i in range(40):
        p95 = 0.0 if i < 30 else 120.0
        out += list(td.update("latency_regression", t0 + timedelta(minutes=15 * (i + 1)),
                              [("cache1", "", "lt10k", 500, p95)]))
    assert out and out[0].kind == "latency_regression" and out[0].expected == 0.0

    line = _strict_json(out[0].to_json())
    assert line["detail"]["ratio"] is None and line["score"] == 1.0
    assert _strict_json(detections_table(out[:1], t0).column("detail")[0].as_py())["ratio"] is None
    with pytest.raises(ValueError, match="Infinity"):  # the check itself refuses what was written before
        _strict_json(json.dumps({"ratio": math.inf}))


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)
