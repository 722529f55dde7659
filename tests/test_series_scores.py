"""Generic streaming score (``anomaly_scores``): seasonal models by timestamp, streaming with absent rows,
calibration on noise, and the development corpus helpers used to choose its parameters."""

from __future__ import annotations

import numpy as np
import pandas as pd
from forumpulse.detectors import nab
from forumpulse.detectors.evaluate import _nab_limits, score_dev, synthetic_series
from forumpulse.detectors.series import ScoreParams, _lag_rows, anomaly_scores, series_periods
from forumpulse.detectors.traffic import load_rules, score_params


def _daily(days: int = 12, seed: int = 11) -> tuple[pd.DatetimeIndex, np.ndarray]:
    n = 288 * days
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    t = np.arange(n)
    x = 100 + 60 * np.sin(2 * np.pi * t / 288) + np.random.default_rng(seed).normal(0, 4, n)
    return ts, x


def test_periods_from_the_row_step() -> None:
    ts5 = pd.date_range("2026-01-05", periods=10, freq="5min")
    assert series_periods(ts5) == (300, [288, 2016])
    assert series_periods(pd.date_range("2026-01-05", periods=10, freq="1h")) == (3600, [24, 168])
    assert series_periods(pd.date_range("2026-01-05", periods=10, freq="7min")) == (420, [1440])  # divides a week only
    assert series_periods(None) == (0, [])
    assert series_periods(ts5[:1]) == (0, [])


def test_seasonal_lags_follow_time_not_rows() -> None:
    sec = np.array([0, 300, 600, 1200, 1500], dtype=np.int64)  # the row at 900 s is absent
    np.testing.assert_array_equal(_lag_rows(sec, 600), [-1, -1, 0, 2, -1])
    np.testing.assert_array_equal(_lag_rows(sec, 300), [-1, 0, 1, -1, 3])


def test_missing_daily_peak_is_found_only_with_the_seasonal_model() -> None:
    ts, x = _daily()
    start = 9 * 288 + 40
    x[start: start + 90] = 100 + np.random.default_rng(3).normal(0, 4, 90)  # the daily peak does not happen
    p = ScoreParams()
    with_ts = np.flatnonzero(anomaly_scores(x, p, ts) >= p.alarm)
    without = np.flatnonzero(anomaly_scores(x, p) >= p.alarm)
    assert len(with_ts) >= 1 and start <= with_ts[0] <= start + 12, with_ts
    assert not np.any(with_ts < start), with_ts  # the normal days raise no alarm
    assert not np.any((without >= start) & (without < start + 90)), without  # the raw level alone cannot see it


def test_streaming_with_timestamps_and_absent_rows() -> None:
    ts, x = _daily(days=10, seed=5)
    x[8 * 288 + 100: 8 * 288 + 160] += 80
    keep = np.ones(len(x), dtype=bool)
    keep[5 * 288 + 10: 5 * 288 + 70] = False  # absent rows: lags must stay in phase
    ts, x = ts[keep], x[keep]
    full = anomaly_scores(x, None, ts)
    assert full.max() <= 1.0 and full.min() >= 0.0 and full.max() >= 0.5
    for cut in (700, 5 * 288 + 11, 8 * 288 + 50, 8 * 288 + 105):
        np.testing.assert_array_equal(anomaly_scores(x[:cut], None, ts[:cut]), full[:cut])


def test_noise_with_timestamps_raises_few_alarms() -> None:
    n = 20_000
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    p = ScoreParams()
    for seed in (3, 4):
        s = anomaly_scores(100 + np.random.default_rng(seed).normal(0, 5, n), p, ts)
        assert int((s >= p.alarm).sum()) <= 2


def test_shipped_parameters_are_the_rules_file() -> None:
    assert score_params(load_rules()) == ScoreParams()


def test_nab_style_windows() -> None:
    ts = pd.date_range("2026-01-05", periods=1000, freq="5min").to_numpy()
    assert _nab_limits(ts, [ts[500]]) == [(450, 550)]
    assert _nab_limits(ts, [ts[300], ts[320]]) == [(275, 345)]  # overlapping windows merge
    assert _nab_limits(ts, []) == []


def test_dev_corpus_scores_are_deterministic_and_above_null() -> None:
    corpus = dict(list(synthetic_series(count=8).items()))
    a = score_dev(corpus, ScoreParams())
    b = score_dev(corpus, ScoreParams())
    assert a == b
    assert set(a) == set(nab.PROFILES)
    assert all(v[0] > 0.0 for v in a.values()), a  # better than detecting nothing


def test_cli_scores_use_the_timestamps(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """``detect series --scores`` prints what the NAB evaluation scores: the seasonal models see the timestamps
    (a missing daily peak alarms, which the raw model alone cannot see)."""
    from forumpulse.detectors.series import detect_series_command

    ts, x = _daily()
    start = 9 * 288 + 40
    x[start: start + 90] = 100 + np.random.default_rng(3).normal(0, 4, 90)
    f = tmp_path / "s.csv"
    f.write_text("timestamp,value\n" + "".join(f"{t.isoformat()}Z,{float(v)!r}\n" for t, v in zip(ts, x, strict=True)))
    detect_series_command(input=str(f), scores=True)
    got = np.array([float(line.rsplit(",", 1)[1]) for line in capsys.readouterr().out.splitlines()[1:]])
    want = anomaly_scores(x, score_params(load_rules()), ts)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert got[start: start + 12].max() >= 0.5


def test_score_likelihood_layer_quiets_benign_bursts() -> None:
    """Poisson counts with a benign 3-row burst every ~120 rows (crawler-like): the likelihood layer over the
    score (``score_window``) raises fewer alarms than the same scorer without it, and a later 10x level shift
    that lasts is still found within a few rows (at most 3 rows after the scorer without the layer)."""
    from dataclasses import replace

    rng = np.random.default_rng(21)
    n = 8000
    x = rng.poisson(5, n).astype(float)
    for s0 in range(200, n - 10, 120):
        s = s0 + int(rng.integers(0, 40))
        x[s: s + 3] += rng.uniform(20, 60, 3)
    x[7000:] = rng.poisson(50, n - 7000)
    ts = pd.date_range("2026-01-05", periods=n, freq="5min")
    p = score_params(load_rules())
    assert p.score_window > 0
    on = anomaly_scores(x, p, ts)
    off = anomaly_scores(x, replace(p, score_window=0), ts)
    alarms_on = np.flatnonzero(on[:7000] >= p.alarm)
    alarms_off = np.flatnonzero(off[:7000] >= p.alarm)
    assert len(alarms_on) < len(alarms_off), (len(alarms_on), len(alarms_off))
    q = replace(p, suppress=0)  # delay of the shift itself, whatever an earlier burst's alarm suppresses
    on, off = anomaly_scores(x, q, ts), anomaly_scores(x, replace(q, score_window=0), ts)
    first_on = 7000 + int(np.argmax(on[7000:] >= p.alarm))
    first_off = 7000 + int(np.argmax(off[7000:] >= p.alarm))
    assert on[first_on] >= p.alarm and first_on <= min(first_off + 3, 7010), (first_on, first_off)
