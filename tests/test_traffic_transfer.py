"""TransferDetector's evidence rule (rules v3) on hand-made windows: binomial tail of a low median, runs of low
windows, the lower-tail share q estimated from the baseline."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from forumpulse.detectors.traffic import TransferDetector, load_rules
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
