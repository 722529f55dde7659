"""The learned period of the generic score (rules v8, ``_learned_period`` in ``detectors/series.py``).

A periodic job (a queue filling up, emptied every P rows) made the v7 score alarm at every second reset, before
and after a real change, because a sparse large step is always in the Gaussian tail of its likelihood.  The learned
period predicts ``x[t - L]`` at the lag that predicted the last ``long_window`` rows best: the resets become
expected, the change of period is found at its first displaced reset, the new period is re-learnt, and an anomaly
on top of the re-learnt period still alarms at once.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from forumpulse.detectors.series import ScoreParams, _learned_period, anomaly_scores

CHANGE = 3000


def _job(seed: int, n: int = 5000, before: int = 120, after: int = 60) -> np.ndarray:
    """A sawtooth emptied every ``before`` rows, every ``after`` rows from row CHANGE on, slope 1, noise sd 1."""
    x = np.zeros(n)
    acc, since = 10.0, 0
    for i in range(n):
        since += 1
        if since >= (before if i < CHANGE else after):
            acc, since = 10.0, 0
        acc += 1.0
        x[i] = acc
    return x + np.random.default_rng(seed).normal(0, 1.0, n)


def _alarms(x: np.ndarray, p: ScoreParams) -> np.ndarray:
    return np.flatnonzero(anomaly_scores(x, p) >= p.alarm)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_resets_of_a_periodic_job_are_expected(seed: int) -> None:
    p = ScoreParams()
    x = _job(seed)
    calm = slice(400, CHANGE)  # after the first period has been learnt, before the change
    v7 = _alarms(x, replace(p, period_max_lag=0))
    assert np.count_nonzero((v7 >= calm.start) & (v7 < calm.stop)) >= 5  # v7: every second reset alarms
    v8 = _alarms(x, p)
    assert not np.any((v8 >= calm.start) & (v8 < calm.stop)), v8


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_period_change_is_found_then_relearnt(seed: int) -> None:
    p = ScoreParams()
    a = _alarms(_job(seed), p)
    assert np.any((a >= CHANGE) & (a <= CHANGE + 2 * 60 + 5)), a  # the first displaced resets
    assert not np.any(a >= CHANGE + 200), a  # the new period is normal once re-learnt


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_anomaly_on_a_relearnt_period_still_alarms(seed: int) -> None:
    p = ScoreParams()
    x = _job(seed)
    x[4500:4520] += 60  # the queue does not drain for 20 rows
    a = _alarms(x, p)
    assert np.any((a >= 4500) & (a <= 4505)), a


def test_learned_period_needs_a_repeating_shape() -> None:
    p = ScoreParams()
    rng = np.random.default_rng(5)
    t = np.arange(5000)
    for x in (rng.normal(0, 1, 5000),                                     # noise
              np.cumsum(rng.normal(0, 1, 5000)),                          # random walk
              100 + 50 * np.sin(2 * np.pi * t / 2000) + rng.normal(0, 1, 5000)):  # period beyond the longest lag
        assert np.isnan(_learned_period(x, p)).all()
    x = _job(1)
    pred = _learned_period(x, p)
    first = p.period_min_lag + p.long_window  # the shortest lag's error needs a full window
    assert np.isnan(pred[:first]).all()
    err = np.abs(x - pred)
    assert np.nanmax(err[400:CHANGE]) < 10 and np.nanmax(err[CHANGE + 400:]) < 10  # the resets are predicted
    assert np.isnan(_learned_period(x, replace(p, period_max_lag=0))).all()


def test_learned_period_is_streaming() -> None:
    p = ScoreParams()
    x = _job(2)
    full = _learned_period(x, p)
    for m in (250, 700, CHANGE + 100, 3333):
        np.testing.assert_array_equal(_learned_period(x[:m], p), full[:m])
    s = anomaly_scores(x, p)
    np.testing.assert_array_equal(anomaly_scores(x[:CHANGE + 100], p), s[:CHANGE + 100])


def test_the_learned_period_is_not_in_use_where_it_has_no_prediction() -> None:
    """After a value that breaks the sawtooth the learned period has no prediction for a while; it stayed "in
    use" there with no residual (p = 1, expectation NaN), hiding the other models' evidence (stop 40: the rows
    after a lone spike had no expectation in a user trial).  Every row with history has an expectation now."""
    from forumpulse.detectors.series import _scores

    n, k = 3000, 2800
    x = 50 + 10 * np.sin(np.arange(n) * 2 * np.pi / 288) + np.random.default_rng(5).normal(0, 0.5, n)
    x[k] = 500.0
    p = ScoreParams()
    assert np.isnan(_learned_period(x, p)[k + 1:k + 10]).any()  # the situation the test is about
    _, expected = _scores(x, p, None, None, True)
    assert np.isfinite(expected[p.min_history:]).all(), np.flatnonzero(~np.isfinite(expected))[:10]
