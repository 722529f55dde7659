"""Contextual novelty (``detectors/novelty.py``, rules v7): repeated patterns stop being novel, new shapes and a
cycle that does not happen score, streaming, determinism, calibration on noise, and its place in the series
score."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
from forumpulse.detectors.novelty import NoveltyParams, day_phases, novelty_scores, raw_novelty
from forumpulse.detectors.series import (
    ScoreParams,
    _epoch_seconds,
    _row_steps,
    _suppress,
    anomaly_scores,
    novelty_params,
)
from forumpulse.detectors.traffic import load_rules, score_params


def _phases(ts: pd.DatetimeIndex, buckets: int = 48) -> np.ndarray:
    sec = _epoch_seconds(ts)
    return day_phases(sec, _row_steps(sec), buckets)


def _sawtooth(cycles: int, period: int = 20) -> np.ndarray:
    return np.tile(np.arange(period, dtype=float), cycles)


def test_a_repeated_pattern_stops_being_novel() -> None:
    x = _sawtooth(30)
    r = raw_novelty(x, NoveltyParams(phase_buckets=0))
    assert r[1:20].max() > 0.5  # the first cycle is all new
    assert r[60:].max() == 0.0  # from the third cycle on every context is familiar
    s = novelty_scores(x, NoveltyParams(phase_buckets=0))
    assert s.max() < 0.5


def test_a_new_shape_inside_the_known_range_scores_high_and_early() -> None:
    """After 150 sawtooth cycles (0..7 upwards, one level per value) one cycle runs downwards through the same
    range: no value is new, but every transition is."""
    x = _sawtooth(200, period=8)
    start = 150 * 8
    x[start: start + 8] = x[start: start + 8][::-1]
    s = novelty_scores(x, NoveltyParams(phase_buckets=0))
    hits = np.flatnonzero(s >= 0.5)
    assert len(hits) > 0 and start <= hits[0] <= start + 3, hits
    assert not np.any(hits < start)


def test_a_value_beyond_the_range_is_a_new_level() -> None:
    x = np.concatenate([_sawtooth(40), [60.0], _sawtooth(5)])
    r = raw_novelty(x, NoveltyParams(phase_buckets=0))
    assert r[800] == 1.0  # level and both of its contexts never seen
    assert r[700:800].max() == 0.0


def test_a_cycle_that_does_not_happen_is_novel_only_with_the_time_of_day() -> None:
    """A daily cycle (5-min rows) whose peak does not come on day 10: the values stay at the daily mean, a level
    seen every day (twice) -- new only as "this level at this time of day"."""
    n = 288 * 12
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    t = np.arange(n)
    x = 100 + 60 * np.sin(2 * np.pi * t / 288) + np.random.default_rng(2).normal(0, 3, n)
    start = 10 * 288 + 40
    x[start: start + 100] = 100 + np.random.default_rng(3).normal(0, 3, 100)
    p = NoveltyParams()
    with_time = novelty_scores(x, p, _phases(ts))
    without = novelty_scores(x, replace(p, phase_buckets=0))
    hits = np.flatnonzero(with_time[3 * 288:] >= 0.5) + 3 * 288
    assert len(hits) > 0 and start <= hits[0] <= start + 30, hits
    assert not np.any(hits < start)  # the normal days (after the first three) raise nothing
    assert without[start: start + 100].max() < 0.5


def test_streaming_prefix_and_determinism() -> None:
    n = 288 * 8
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    x = 50 + 20 * np.sin(2 * np.pi * np.arange(n) / 288) + np.random.default_rng(9).normal(0, 0.5, n)
    x[6 * 288 + 10: 6 * 288 + 40] += 35
    x[300:310] = np.nan  # missing values are carried forward
    ph = _phases(ts)
    full = novelty_scores(x, None, ph)
    assert full.max() >= 0.5  # not vacuous
    np.testing.assert_array_equal(novelty_scores(x, None, ph), full)
    for cut in (31, 305, 2000, 6 * 288 + 12):
        np.testing.assert_array_equal(novelty_scores(x[:cut], None, _phases(ts[:cut])), full[:cut])
        np.testing.assert_array_equal(anomaly_scores(x[:cut], None, ts[:cut]), anomaly_scores(x, None, ts)[:cut])


def test_noise_raises_few_novelty_alarms() -> None:
    n = 20_000
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    ph = _phases(ts)
    for seed in (3, 4, 5):
        s = novelty_scores(100 + np.random.default_rng(seed).normal(0, 5, n), None, ph)
        assert int((_suppress(s, 0.5, 150) >= 0.5).sum()) <= 1


def test_time_of_day_buckets() -> None:
    sec = np.array([0, 1800, 3600, 86400 + 5400], dtype=np.int64)
    np.testing.assert_array_equal(day_phases(sec, np.full(4, 300), 48), [0, 1, 2, 3])
    np.testing.assert_array_equal(day_phases(sec, np.full(4, 3600), 48), [0, 0, 1, 1])  # hourly rows: 24 buckets
    np.testing.assert_array_equal(day_phases(sec, np.full(4, 7 * 3600), 48), [-1] * 4)  # divides no day
    np.testing.assert_array_equal(day_phases(sec, np.zeros(4, dtype=np.int64), 48), [-1] * 4)  # no step yet


def test_novelty_only_adds_evidence_to_the_series_score() -> None:
    """Before suppression the score is the larger of the anomaly likelihood and the novelty score; with
    ``novelty_levels: 0`` it is the rules-v6 score."""
    n = 288 * 6
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    x = 100 + 30 * np.sin(2 * np.pi * np.arange(n) / 288) + np.random.default_rng(1).normal(0, 3, n)
    x[5 * 288:] = x[5 * 288:][::-1]  # the last day runs backwards
    on = anomaly_scores(x, replace(ScoreParams(), suppress=0), ts)
    off = anomaly_scores(x, replace(ScoreParams(), suppress=0, novelty_levels=0), ts)
    nov = novelty_scores(x, novelty_params(ScoreParams()), _phases(ts))
    assert np.all(on >= off)
    np.testing.assert_allclose(on[30:], np.maximum(off, nov)[30:])
    assert np.any(on > off)


def test_shipped_novelty_parameters() -> None:
    p = score_params(load_rules())
    assert p.novelty_levels == 8
    assert novelty_params(p) == NoveltyParams()  # the module's defaults are the shipped rules
