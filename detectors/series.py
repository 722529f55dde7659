"""Streaming anomaly scoring and seasonal event detection for one time series.

Two layers, both *streaming*: whatever is computed for row ``t`` uses rows ``<= t`` only (checked in
``tests/test_series_detector.py`` by truncating the input and comparing, and in ``tests/test_series_streaming.py``
by appending rows at another step or with non-integer values); the row step and the ``auto`` mode are decided on
the first ``DECIDE_ROWS`` rows as they arrive, then frozen.

1. :func:`anomaly_scores` — a generic per-row anomaly score in ``[0, 1]`` for any numeric series (CPU, latency,
   tweet counts...).  Robust level and step deviations against a trailing median/MAD, turned into a tail
   probability against the trailing distribution of those deviations (an "anomaly likelihood"), mapped to
   ``min(1, -log10(p)/10)``; after an alarm (score >= ``alarm``) the score is capped just below ``alarm`` for
   ``suppress`` rows so one incident raises one alarm.  Since rules v7 the row's score (before suppression) is the
   larger of that and the contextual novelty score of :mod:`forumpulse.detectors.novelty` (share of the row's
   quantised-level contexts, with and without the time of day, never seen before, as an anomaly likelihood), which
   sees shape changes inside the usual range.  Since rules v8 one more model is a *learned period*
   (:func:`_learned_period`: ``x[t - L]`` at the lag that predicted the last ``long_window`` rows best, re-learnt
   continuously), which makes a periodic job's resets expected and re-learns its new period after a change.  This is
   what ``--scores`` prints and what NAB scores.
2. :class:`SeasonalDetector` — events on a *count* series (requests per minute) against a seasonal baseline in
   the site's time zone: the same time of day on the previous ``baseline_days`` days of the same day type
   (workday / weekend-or-holiday, from :mod:`forumpulse.detectors.calendar`), median per bucket, so earlier
   anomalies do not move it.  Emits ``spike``, ``dip`` (labelled ``holiday`` on calendar holidays / holiday
   periods, else ``unexplained``) and ``outage`` (rows present with ~zero traffic while the series is alive).
   Rows that are *absent* are "no data": never a dip (the caller reports pipeline gaps separately).

Parameters come from ``detectors/rules/traffic.yaml`` (section ``series`` and ``site``); they were chosen on the
NASA-1995 trace and the simulator, not fitted to NAB.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt
import pandas as pd
import typer
from forumpulse.detectors.novelty import NoveltyParams, day_phases, novelty_scores, trailing_tail_p

FloatArray = npt.NDArray[np.float64]


# ------------------------------------------------------------------------------------------------ detections


@dataclass
class Detection:
    """One event, printed as a JSON line and stored in the ``detections`` table.

    ``id`` is stable across updates of the same event (site, kind, scope, start), so the ReplacingMergeTree
    keeps the latest state.  ``end`` is ``None`` while the event is open.
    """

    kind: str
    scope: str
    start: datetime
    end: datetime | None
    peak_ts: datetime
    observed: float
    expected: float
    score: float
    label: str
    detail: dict[str, Any] = field(default_factory=dict)
    site: str = ""
    state: str = "open"

    @property
    def id(self) -> str:
        key = f"{self.site}|{self.kind}|{self.scope}|{self.start.isoformat()}"
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        d = asdict(self)
        out = {
            "id": self.id, "kind": self.kind, "site": self.site, "scope": self.scope,
            "start": _iso(self.start), "end": _iso(self.end) if self.end else None, "peak_ts": _iso(self.peak_ts),
            "observed": round(self.observed, 4), "expected": round(self.expected, 4),
            "score": round(self.score, 4), "label": self.label, "state": self.state,
            "detail": {k: v for k, v in d["detail"].items() if not k.startswith("_")},
        }
        return json.dumps(json_safe(out), sort_keys=False, default=str, allow_nan=False)


def json_safe(x: Any) -> Any:
    """``x`` with every NaN or infinite float (in dicts, lists and tuples) replaced by None: JSON has no such
    numbers, and ``json.dumps`` would write ``NaN`` / ``Infinity``, which strict readers (ClickHouse's JSON
    functions, jq, Kafka consumers in other languages) refuse."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [json_safe(v) for v in x]
    return x


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------- generic anomaly score


@dataclass(frozen=True)
class ScoreParams:
    long_window: int = 200      # rows of history for robust levels/scales (median, MAD, error medians)
    short_window: int = 3       # rows averaged for the level deviation
    likelihood_window: int = 1000  # rows of history of each averaged surprise for its tail probability
    likelihood_short: int = 5   # rows averaged before the tail probability
    min_history: int = 30       # rows before any score is non-zero
    alarm: float = 0.5          # shipped threshold: score = -log10(p)/10, 0.5 is p = 1e-5
    suppress: int = 150         # rows after an alarm during which the score stays below `alarm`
    surprise_cap: float = 50.0  # each normalised error is capped here (one huge outlier must not blind 1000 rows)
    sd_floor: float = 0.5       # floor of the std of the averaged surprise history (in robust-z units)
    seasonal_cycles: int = 3    # seasonal-naive predictor: median of the same phase in the last N periods
    seasonal_min_cycles: int = 2  # periods of history before a seasonal predictor counts
    combine: str = "min"        # "min": Bonferroni minimum of the raw and the best seasonal model; "select": best only
    seasonal_gain: float = 0.5  # a seasonal model is used when its trailing error is under this × the raw model's
    score_window: int = 2000    # likelihood layer over the score itself: rows of score history (0 = layer off)
    score_short: int = 5        # ... rows of score averaged before its tail probability
    score_sd_floor: float = 0.05  # ... floor of the std of the averaged-score history (score units)
    # contextual novelty (rules v7, :mod:`forumpulse.detectors.novelty`); the row's score is the larger of the two
    novelty_levels: int = 8     # grid levels of the novelty detector (0 = off)
    novelty_orders: int = 2     # contexts of the last 1 .. N levels
    novelty_phase_buckets: int = 48  # with timestamps: contexts also carry the time of day (buckets per day, 0 = no)
    novelty_phase_orders: int = 2    # ... for the last 1 .. N levels
    novelty_window: int = 2000  # rows of history of the averaged novelty for its tail probability
    novelty_short: int = 3      # rows of novelty averaged
    novelty_sd_floor: float = 0.1  # floor of the std of the averaged-novelty history
    # learned period (rules v8, :func:`_learned_period`): seasonal-naive x[t - L] at the lag L (rows) that predicted
    # the last long_window rows best, used *instead of* the other models where its trailing error is the lowest
    period_min_lag: int = 10    # shortest lag tried; a period counts when its error is under seasonal_gain x this lag's
    period_max_lag: int = 400   # longest lag tried (0 = no learned period, the v7 score)


def _epoch_seconds(timestamps: Sequence[Any] | np.ndarray) -> npt.NDArray[np.int64]:
    t = pd.to_datetime(pd.Series(list(timestamps)), utc=True).astype("datetime64[ns, UTC]")  # unit-independent
    return np.asarray(t.astype("int64").to_numpy() // 10**9, dtype=np.int64)


DECIDE_ROWS = 100
"""The row step and the ``auto`` mode of :func:`series_events` are decided from the first ``DECIDE_ROWS`` rows: row
``t`` uses what rows ``<= t`` say (a running decision), frozen from row ``DECIDE_ROWS - 1`` on, so later rows never
change an earlier score or event (streaming)."""


def _row_steps(sec: npt.NDArray[np.int64], rows: int = DECIDE_ROWS) -> npt.NDArray[np.int64]:
    """Row step (seconds) in force at each row: the most frequent positive step between consecutive rows ``<= t``
    (ties: the smaller; gaps and jitter do not move it), frozen after the first ``rows`` rows; 0 while no positive
    step has been seen."""
    n = len(sec)
    out = np.zeros(n, dtype=np.int64)
    counts: dict[int, int] = {}
    cur = 0
    for i in range(1, min(n, rows)):
        s = int(sec[i] - sec[i - 1])
        if s > 0:
            c = counts[s] = counts.get(s, 0) + 1
            best = counts.get(cur, 0)
            if c > best or (c == best and s < cur):
                cur = s
        out[i] = cur
    out[min(n, rows):] = cur
    return out


_SPANS = (86400, 7 * 86400)  # seasonal periods in seconds: one day, one week


def _periods(step: int) -> list[int]:
    """Periods in rows (one day, one week) of a row step: when the step divides them and a period has >= 4 rows."""
    return [span // step for span in _SPANS if step > 0 and span % step == 0 and span // step >= 4]


def series_periods(timestamps: Sequence[Any] | np.ndarray | None) -> tuple[int, list[int]]:
    """``(step seconds, [periods in rows])`` of ``timestamps``: the step is the most frequent positive row step
    among the first ``DECIDE_ROWS`` rows (what :func:`anomaly_scores` uses from that row on); the periods are one
    day and one week, when the step divides them and a period has at least 4 rows.  ``(0, [])`` without
    timestamps or with fewer than two rows."""
    if timestamps is None or len(timestamps) < 2:
        return 0, []
    step = int(_row_steps(_epoch_seconds(timestamps[:DECIDE_ROWS]))[-1])
    return step, _periods(step)


def _lag_rows(sec: npt.NDArray[np.int64], lag_seconds: int) -> npt.NDArray[np.int64]:
    """Row index whose timestamp is exactly ``sec[i] - lag_seconds`` (``-1`` when that row is absent): seasonal
    lags by time, so absent rows (gaps) never shift the phase."""
    want = sec - lag_seconds
    idx = np.searchsorted(sec, want, side="left")
    idx_c = np.minimum(idx, len(sec) - 1)
    return np.where((idx < len(sec)) & (sec[idx_c] == want), idx_c, -1)


def _robust_surprise(err: pd.Series, p: ScoreParams, floor: pd.Series | float = 1e-9) -> pd.Series:
    """|err| over 1.4826 × its trailing median (rows before t), floored (at ``floor``, and 1e-9), capped at
    ``surprise_cap``."""
    e = err.abs()
    med = e.shift(1).rolling(p.long_window, min_periods=p.min_history).median()
    mean = e.shift(1).rolling(p.long_window, min_periods=p.min_history).mean()
    scale = np.maximum(1.4826 * med, 0.5 * mean)
    scale = np.maximum(np.maximum(scale, floor), 1e-9)
    return (e / scale).clip(upper=p.surprise_cap)


def _tail_p(r: pd.Series, p: ScoreParams) -> FloatArray:
    """Anomaly likelihood of one surprise series: the ``likelihood_short``-row mean against the mean/std of the
    same mean over the previous ``likelihood_window`` rows (Gaussian tail), 1 where history is short."""
    pv = trailing_tail_p(r, p.likelihood_window, p.likelihood_short, p.sd_floor, p.min_history)
    pv[np.isnan(r.to_numpy())] = 1.0
    return pv


#: a step smaller than this share of the series' level is no surprise, however flat the series was: a constant
#: 4.2 that read 4.2000001 once (float rounding) scored 1.0, the full alarm (user trial 40)
STEP_REL_FLOOR = 1e-6


def _model_p(y: pd.Series, p: ScoreParams, magnitude: pd.Series | None = None) -> FloatArray:
    """Tail probability of one model's residual series ``y`` (NaN = model not active yet): Bonferroni minimum of
    the level surprise (``short_window`` mean vs trailing ``long_window`` median/MAD) and the step surprise
    (|Δy| vs its trailing median, whose scale is at least ``STEP_REL_FLOOR`` × ``magnitude``, the series'
    trailing median; ``y``'s own when not given)."""
    hist = y.shift(p.short_window)
    med = hist.rolling(p.long_window, min_periods=p.min_history).median()
    mad = (hist - med).abs().rolling(p.long_window, min_periods=p.min_history).median()
    spread = (y.rolling(p.long_window, min_periods=2).max() - y.rolling(p.long_window, min_periods=2).min()).shift(1)
    floor = 1e-3 * spread.fillna(0.0) + 1e-9 + 1e-4 * med.abs()
    scale = np.maximum(1.4826 * mad, floor)
    level = ((y.rolling(p.short_window, min_periods=1).mean() - med).abs() / scale).clip(upper=p.surprise_cap)
    mag = (magnitude if magnitude is not None else med).abs().fillna(0.0)
    step = _robust_surprise(y.diff(), p, STEP_REL_FLOOR * mag)
    pv = np.minimum(1.0, 2.0 * np.minimum(_tail_p(level, p), _tail_p(step, p)))
    pv[np.isnan(y.to_numpy())] = 1.0
    return pv


def anomaly_scores(values: Sequence[float] | FloatArray, params: ScoreParams | None = None,
                   timestamps: Sequence[Any] | np.ndarray | None = None, step: int | None = None) -> FloatArray:
    """Per-row anomaly score in ``[0, 1]``; row ``t`` depends on rows ``<= t`` only.

    Models of the series: the raw values, and — when ``timestamps`` give a row step that divides a day — the
    residuals of seasonal-naive predictors at one day and one week (median of the same phase in the last
    ``seasonal_cycles`` periods, by timestamp so absent rows never shift the phase; active after
    ``seasonal_min_cycles`` periods).  The row step is ``step`` (seconds) when given, else decided from the first
    ``DECIDE_ROWS`` rows (:func:`_row_steps`: the most frequent step so far, frozen after those rows).  Each
    model's residual gets a level and a step surprise (|error| over a trailing robust scale, capped at
    ``surprise_cap``), each turned into an anomaly likelihood (the ``likelihood_short``-row mean against the
    mean/std of that mean over the previous ``likelihood_window`` rows, Gaussian tail).  Row ``t`` uses the model
    with the lowest trailing mean absolute error (a seasonal model only when its error is under ``seasonal_gain``
    × the raw model's), reported as ``min(1, -log10(p)/10)``; with ``period_max_lag > 0`` (rules v8) the learned
    period (:func:`_learned_period`) replaces them where its trailing error is the lowest; after an alarm
    (``>= alarm``) the score is capped just below it for ``suppress`` rows.  With ``novelty_levels > 0`` (rules
    v7) the score before suppression is the larger of that and
    :func:`forumpulse.detectors.novelty.novelty_scores` (time-of-day contexts from the same row step).  NaN values
    are carried forward (a missing value is not evidence).  O(n log w) with pandas rolling windows plus O(n)
    passes, and O(n) per lag for the learned period."""
    return _scores(values, params, timestamps, step, False)[0]


def _scores(values: Sequence[float] | FloatArray, params: ScoreParams | None,
            timestamps: Sequence[Any] | np.ndarray | None, step: int | None,
            want_expected: bool) -> tuple[FloatArray, FloatArray]:
    """:func:`anomaly_scores` and, when ``want_expected``, each row's expected value (streaming as well): the
    prediction of the model in use at that row (lowest trailing error) — a seasonal-naive prediction, or the raw
    model's level (median of the ``long_window`` rows before the last ``short_window``; before those exist, the
    median of all earlier rows, or the value itself on the first row).  Without ``want_expected`` the second array
    is empty."""
    p = params or ScoreParams()
    arr = np.array(values, dtype=np.float64)
    arr[~np.isfinite(arr)] = np.nan  # inf is no more a measurement than NaN: missing
    finite = np.flatnonzero(~np.isnan(arr))
    lead = int(finite[0]) if len(finite) else len(arr)
    if lead > 0:
        # rows before the first value carry no evidence: score 0, no expectation; the model starts at the first
        # value (filling them with 0 made the first real value look like a jump from zero)
        ts_tail = None if timestamps is None or len(timestamps) < len(arr) else timestamps[lead:]
        sc, ex = (_scores(arr[lead:], p, ts_tail, step, want_expected) if lead < len(arr)
                  else (np.zeros(0), np.zeros(0)))
        return (np.concatenate([np.zeros(lead), sc]),
                np.concatenate([np.full(lead, np.nan), ex]) if want_expected else np.zeros(0))
    x = pd.Series(arr).ffill()
    n = len(x)
    if n == 0:
        return np.zeros(0), np.zeros(0)
    pv = _model_p(x, p)
    magnitude = x.shift(p.short_window).rolling(p.long_window, min_periods=p.min_history).median()
    expected = np.zeros(0)
    if want_expected:
        level = x.shift(p.short_window).rolling(p.long_window, min_periods=p.min_history).median()
        level = level.fillna(x.shift(1).expanding().median())
        expected = level.fillna(x).to_numpy(dtype=np.float64)
    phases: npt.NDArray[np.int64] | None = None
    xv: FloatArray = np.asarray(x.to_numpy(), dtype=np.float64)
    lvl = x.shift(1).rolling(p.long_window, min_periods=p.min_history).median()
    err0 = (x - lvl).abs().shift(1).rolling(p.long_window, min_periods=p.min_history).mean().to_numpy()
    best_err = np.where(np.isnan(err0), np.inf, err0 * p.seasonal_gain)
    if timestamps is not None and len(timestamps) >= 2:
        sec = _epoch_seconds(timestamps)
        steps = np.full(n, int(step), dtype=np.int64) if step else _row_steps(sec)
        if p.novelty_levels > 0 and p.novelty_phase_buckets > 0:
            phases = day_phases(sec, steps, p.novelty_phase_buckets)
        safe = np.maximum(steps, 1)
        for span in _SPANS:
            # the row's step decides whether this period exists at that row (lags are by time: k × span)
            valid = (steps > 0) & (span % safe == 0) & (span // safe >= 4)
            if not valid.any():
                continue
            cols = []
            for k in range(1, p.seasonal_cycles + 1):
                li = _lag_rows(sec, k * span)
                cols.append(np.where(li >= 0, xv[np.maximum(li, 0)], np.nan))
            lagged = np.vstack(cols)
            have = (~np.isnan(lagged)).sum(axis=0)
            ok = (have >= p.seasonal_min_cycles) & valid
            if not ok.any():
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                pred = np.nanmedian(lagged, axis=0)
            resid = pd.Series(np.where(ok, xv - pred, np.nan))
            err = resid.abs().shift(1).rolling(p.long_window, min_periods=p.min_history).mean().to_numpy()
            err = np.where(np.isnan(err), np.inf, err)
            use = err < best_err
            if use.any():
                if p.combine == "min":
                    pm = _model_p(resid, p, magnitude)
                    pv = np.where(use, np.minimum(pv, pm) * 2, pv)
                else:
                    pv = np.where(use, _model_p(resid, p, magnitude), pv)
                if want_expected:
                    expected = np.where(use, pred, expected)
                best_err = np.where(use, err, best_err)
    if p.period_max_lag > 0:
        pred = _learned_period(xv, p)
        resid = pd.Series(xv - pred)  # NaN where no period counts
        err = resid.abs().shift(1).rolling(p.long_window, min_periods=p.min_history).mean().to_numpy()
        # only where it has a prediction: after a value that breaks its pattern it has none for a while, and
        # being 'in use' there with no residual (p = 1) hid every other model's evidence (stop 40, from the
        # event of user trial 40: expected was NaN on the rows after a lone spike)
        use = (np.where(np.isnan(err), np.inf, err) < best_err) & ~np.isnan(pred)
        if use.any():
            # the learned period replaces the other models where it is the best: it is what re-learns a new period
            pv = np.where(use, _model_p(resid, p, magnitude), pv)
            if want_expected:
                expected = np.where(use, pred, expected)
    # evidence on the score scale; below 0 where the Bonferroni factors make p > 1 (calm rows), capped at 1
    score = np.minimum(-np.log10(np.maximum(pv, 1e-300)) / 10.0, 1.0)
    score[: p.min_history] = 0.0
    if p.score_window > 0:
        score = np.minimum(score, _score_likelihood(score, p))
    score = np.clip(score, 0.0, 1.0)
    if p.novelty_levels > 0:
        score = np.maximum(score, novelty_scores(xv, novelty_params(p), phases))
    score[: p.min_history] = 0.0
    return _suppress(score, p.alarm, p.suppress), expected


def _learned_period(xv: FloatArray, p: ScoreParams) -> FloatArray:
    """Prediction of the learned-period model at each row, NaN where it has none (rules v8): ``x[t - L]`` with ``L``
    the lag in ``period_min_lag .. period_max_lag`` rows whose error ``|x - x[t - L]|`` had the lowest mean over the
    ``long_window`` rows before ``t`` (ties: the shorter lag), kept only where that error is under
    ``seasonal_gain`` × the error at ``period_min_lag`` — a repeating shape (a job's sawtooth), not a merely smooth
    series, whose error only grows with the lag.  Streaming: row ``t`` uses rows ``< t`` to choose and row ``t - L``
    to predict.  After a period change the new lag takes over once it has predicted ``long_window`` rows better.
    O(n × lags) with rolling sums."""
    n, w = len(xv), p.long_window
    best = np.full(n, np.inf)
    pred = np.full(n, np.nan)
    short = np.full(n, np.inf)
    first = max(1, p.period_min_lag)
    for lag in range(first, min(p.period_max_lag, n - w - 1) + 1):
        # windowed sums of the errors of rows lag .. n-1; a rolling sum (compensated, values leave the window),
        # not differences of one running total: after one huge value (a wrapped counter) those would be rounding
        # noise for the rest of the series
        r = pd.Series(np.abs(xv[lag:] - xv[:-lag])).rolling(w).sum().to_numpy()
        err = np.full(n, np.inf)
        err[lag + w:] = r[w - 1:n - lag - 1] / w  # mean error of rows t-w .. t-1
        if lag == first:
            short = err
        better = err < best
        best = np.where(better, err, best)
        pred[lag:] = np.where(better[lag:], xv[:-lag], pred[lag:])
    return np.where(best < p.seasonal_gain * short, pred, np.nan)


def novelty_params(p: ScoreParams) -> NoveltyParams:
    """The :class:`forumpulse.detectors.novelty.NoveltyParams` of ``p`` (its ``novelty_*`` fields)."""
    return NoveltyParams(levels=p.novelty_levels, orders=p.novelty_orders, window=p.novelty_window,
                         short=p.novelty_short, sd_floor=p.novelty_sd_floor, min_history=p.min_history,
                         phase_buckets=p.novelty_phase_buckets, phase_orders=p.novelty_phase_orders)


def _score_likelihood(score: FloatArray, p: ScoreParams) -> FloatArray:
    """Anomaly likelihood of the score itself (Numenta's layer over a raw score): the ``score_short``-row mean
    against the mean/std (floored at ``score_sd_floor``) of that mean over the previous ``score_window`` rows,
    Gaussian tail, on the same ``-log10(p)/10`` scale (``score`` unclipped below: calm rows count as calm).  A series whose scores are often high (bursty counts)
    must exceed its own usual level to alarm; a calm series alarms as before (one or two rows later at most)."""
    pv = trailing_tail_p(pd.Series(score), p.score_window, p.score_short, p.score_sd_floor, p.min_history)
    return np.asarray(np.clip(-np.log10(np.maximum(pv, 1e-300)) / 10.0, 0.0, 1.0), dtype=np.float64)


def _suppress(score: FloatArray, alarm: float, rows: int) -> FloatArray:
    out = score.copy()
    cap = np.nextafter(alarm, 0.0)
    until = -1
    for i in range(len(out)):
        if i <= until:
            if out[i] >= alarm:
                out[i] = cap
        elif out[i] >= alarm:
            until = i + rows
    return out


#: an alarm row's event points at the most deviant of the rows up to this many before it (the score's trailing
#: means make an alarm come a row or two after the row that caused it)
EVENT_LOOKBACK_ROWS = 4


def score_events(ts: Sequence[datetime], score: FloatArray, values: FloatArray, alarm: float,
                 scope: str = "series", expected: FloatArray | None = None, first: int = 0,
                 lookback: int = EVENT_LOOKBACK_ROWS) -> list[Detection]:
    """Alarms of :func:`anomaly_scores` at rows ``>= first`` as ``anomaly`` detections (one per alarm row).

    The score's trailing means put an alarm a row or two after the row that caused it, so the event points at
    the row among the alarm row and the ``lookback`` before it (not before ``first``) whose value is furthest from
    its expectation: ``start`` / ``peak_ts`` / ``observed`` / ``expected`` are that row's, ``end`` and
    ``detail.alarm_at`` the alarm row's (``detail.alarm_at`` only when they differ).  Streaming: the event uses
    rows up to the alarm row only.  Before, an alarm on the row after a spike reported that ordinary row, often
    with ``observed == expected`` (user trial 40).  ``observed`` is the value the scorer saw (missing values
    carried forward); ``expected`` is the scorer's expectation (:func:`_scores`) where it has one, else the
    median of the earlier rows — always a finite number."""
    seen = pd.Series(np.asarray(values, dtype=np.float64)).ffill().fillna(0.0)
    fallback = seen.shift(1).expanding().median().fillna(seen).to_numpy(dtype=np.float64)
    if expected is None:
        exp_all = fallback
    else:
        exp_all = np.asarray(expected, dtype=np.float64)
        exp_all = np.where(np.isfinite(exp_all), exp_all, fallback)
    obs_all = seen.to_numpy(dtype=np.float64)
    dev = np.abs(obs_all - exp_all)
    out = []
    prev = first - 1  # the previous alarm row: two alarms never point at the same row (same start, same id)
    for i in np.flatnonzero(score >= alarm):
        i = int(i)
        if i < first:
            continue
        lo = max(first, prev + 1, i - lookback)
        prev = i
        j = lo + int(np.argmax(dev[lo:i + 1]))
        if dev[j] <= dev[i]:
            j = i  # ties go to the alarm row
        detail = {} if j == i else {"alarm_at": _iso(ts[i])}
        out.append(Detection("anomaly", scope, ts[j], ts[i], ts[j], float(obs_all[j]), float(exp_all[j]),
                             float(score[i]), "unexplained", detail, state="closed"))
    return out


# ------------------------------------------------------------------------------------- seasonal event detector


@dataclass(frozen=True)
class SeasonalParams:
    bucket_minutes: int = 30        # trailing window evaluated every step (spikes)
    dip_bucket_minutes: int = 180   # trailing window for dips
    baseline_days: int = 4          # previous same-type days whose median is the baseline
    min_baseline_days: int = 1
    exclude_events: bool = True     # minutes of reported spikes / unexplained dips stay out of future baselines
    spike_ratio: float = 2.0        # observed / expected
    spike_z: float = 8.0            # (observed - expected) / sqrt(expected), Poisson-like excess
    spike_min_excess: float = 50.0  # absolute excess over the trailing window
    spike_confirm_minutes: int = 15  # the spike condition (and a current 5-minute elevation) must hold this long
    dip_ratio: float = 0.4          # unexplained dips: observed / expected at most this
    holiday_dip_ratio: float = 0.85  # on holidays: at most this to report a holiday dip
    dip_z: float = 8.0
    dip_min_loss: float = 0.05      # unexplained dips: traffic missing in the window >= this share of a normal day
    outage_fraction: float = 0.05   # minute below this fraction of its expectation counts as "down"
    outage_min_minutes: int = 60
    merge_minutes: int = 60         # a new event within this long after the previous one (same kind) continues it
    end_ratio: float = 0.5          # an event ends when the deviation falls below this share of its threshold
    new_level_hours: float = 24.0   # a spike / unexplained dip open this long is the site's new level (0 = never)


DayKind = str  # "workday" | "offday"


#: an open spike (dip) is reported again when its ratio to the expectation has grown (shrunk) by this factor
#: since it was last reported, so the stored and published peak follows the event without a row per minute
PEAK_STEP = 1.25


#: an open outage's pending recovery (the run of up minutes since it was last down, and their counts), in ``detail``
_RECOVERY = ("_up_since", "_up_obs", "_up_exp")


#: reference days are searched at most this many days back (:meth:`SeasonalDetector._find_reference_days`)
REFERENCE_DAYS_BACK = 42


class SeasonalDetector:
    """Streaming events on a per-minute count series (see module docstring).

    Feed minutes in time order with :meth:`update` (absent minutes are simply not fed: no data).  ``calendar``
    answers ``is_holiday(date)`` / ``holiday_name(date)`` / ``is_offday(date)`` in the site's time zone.
    Detections are yielded when opened, when their peak grows, and when closed (same ``id`` each time).

    Memory is bounded: when a new local day starts, the per-day arrays (``days``, ``clean``, ``ref``,
    ``excluded``) and caches of days older than :attr:`keep_days` (what a reference lookup, the day before a
    reference and the windows over midnight can still read) are dropped, with the closed events that ended before
    them.  Nothing the detector reads is dropped, so its output does not depend on it.
    """

    keep_days = REFERENCE_DAYS_BACK + 3

    def __init__(self, tz: str = "UTC", calendar: Any = None, params: SeasonalParams | None = None,
                 scope: str = "site", site: str = "") -> None:
        from forumpulse.detectors.calendar import SiteCalendar

        self.tz = ZoneInfo(tz)
        self.cal = calendar if calendar is not None else SiteCalendar(None)
        self.p = params or SeasonalParams()
        self.scope = scope
        self.site = site
        # per local day: minute-of-day -> count (NaN = no data / excluded from baselines)
        self.days: dict[date, FloatArray] = {}
        self.excluded: dict[date, npt.NDArray[np.bool_]] = {}  # minutes kept out of baselines (outages)
        self.clean: dict[date, FloatArray] = {}  # counts with excluded minutes as NaN
        # what the baselines read: ``clean`` without the minutes of reported spikes and unexplained dips (rules v5),
        # so one anomalous day (last week's election night) does not raise / lower the bounds of the days after it
        self.ref: dict[date, FloatArray] = {}
        self._unref_done: dict[str, datetime] = {}  # event id -> last minute marked in ``ref``
        self._recent_closed: dict[str, Detection] = {}
        # kind -> (when its last event closed as a new level, where that event began)
        self._new_level_at: dict[str, tuple[datetime, datetime]] = {}
        self._kinds: dict[date, DayKind] = {}
        self._spike_run = 0
        self._refs: dict[tuple[date, DayKind], list[date]] = {}
        self._day_totals: dict[tuple[date, DayKind | None], float] = {}
        self.open: dict[str, Detection] = {}
        self.closed: list[Detection] = []
        self._down_run: list[datetime] = []
        self._last_ts: datetime | None = None
        self._gaps: dict[date, tuple[int, int] | None] = {}  # local minutes that do not exist, per day (DST)

    # -- baseline -------------------------------------------------------------------------------------
    def _day_kind(self, d: date) -> DayKind:
        k = self._kinds.get(d)
        if k is None:
            k = self._kinds[d] = "offday" if self.cal.is_offday(d) else "workday"
        return k

    def _reference_days(self, d: date, kind: DayKind) -> list[date]:
        key = (d, kind)
        if key not in self._refs:
            self._refs[key] = self._find_reference_days(d, kind)
        return self._refs[key]

    def _find_reference_days(self, d: date, kind: DayKind) -> list[date]:
        out = []
        for back in range(1, REFERENCE_DAYS_BACK + 1):
            c = d - timedelta(days=back)
            if c in self.days and self._day_kind(c) == kind and not self.cal.is_holiday(c):
                out.append(c)
                if len(out) == self.p.baseline_days:
                    break
        return out

    def expected(self, local: datetime, minutes: int, kind: DayKind | None = None) -> tuple[float, int]:
        """Expected count over the ``minutes`` ending at ``local`` (inclusive), and how many days it used."""
        sums = self._reference_sums(local, minutes, kind)
        return (float(np.median(sums)), len(sums)) if sums else (math.nan, 0)

    def _reference_sums(self, local: datetime, minutes: int, kind: DayKind | None = None) -> list[float]:
        d = local.date()
        refs = self._reference_days(d, kind or self._day_kind(d))
        if len(refs) < self.p.min_baseline_days:
            return []
        # the observed window is elapsed minutes (see _observed): the references cover the same local clock
        # minutes, i.e. reach back as far and leave out the minutes that did not exist that day (or the day before)
        on_day, on_prev = self._window_clock(d, local.hour * 60 + local.minute, minutes)
        sums = []
        for r in refs:
            arr = self.ref[r]
            seg = arr[on_day]
            missing = self._missing_at(r, on_day)
            if len(on_prev):  # window spans midnight: the same clock minutes of the day before that ref
                rp = r - timedelta(days=1)
                if rp in self.days:
                    seg = np.concatenate([self.ref[rp][on_prev], seg])
                    missing += self._missing_at(rp, on_prev)
            valid = seg[~np.isnan(seg)]
            # minutes of a spring-forward hour do not exist: they are no missing data (a window over them is
            # judged on the minutes it has, scaled to the window)
            if len(valid) and len(valid) >= 0.8 * (minutes - missing):  # none: no word from this day (a window
                sums.append(float(valid.mean()) * minutes)  # inside a skipped hour was NaN, with a warning)
        return sums

    def _day_expected(self, d: date, kind: DayKind | None = None) -> float:
        """Expected whole-day count of ``d`` (median of its reference days' totals), cached per day; ``inf``
        without reference days (no materiality can be shown)."""
        key = (d, kind)
        if key not in self._day_totals:
            local = datetime.combine(d, datetime.min.time()).replace(hour=23, minute=59, tzinfo=self.tz)
            exp, n = self.expected(local, 1440, kind)
            self._day_totals[key] = exp if n else math.inf
        return self._day_totals[key]

    def _clock_gap(self, d: date) -> tuple[int, int] | None:
        """The local minutes ``[a, b)`` of ``d`` that do not exist (a spring-forward day: 02:00-02:59 in Berlin,
        00:00-00:59 in Santiago, 23:00-23:59 on a Saturday in Nuuk), or None on a day without such a gap; cached
        per day.  (One range per day: a day the zone skipped whole is ``(0, 1440)``.)"""
        if d not in self._gaps:
            self._gaps[d] = None
            midnight = datetime.combine(d, datetime.min.time()).replace(tzinfo=self.tz)
            nxt = datetime.combine(d + timedelta(days=1), datetime.min.time()).replace(tzinfo=self.tz)
            length = int((nxt.astimezone(UTC) - midnight.astimezone(UTC)).total_seconds()) // 60
            if length < 1440:
                t, seen = midnight.astimezone(UTC), np.zeros(1440, dtype=bool)
                for _ in range(max(length, 0)):
                    loc = t.astimezone(self.tz)
                    seen[loc.hour * 60 + loc.minute] = True
                    t += timedelta(minutes=1)
                missing = np.flatnonzero(~seen)
                if len(missing):
                    self._gaps[d] = (int(missing[0]), int(missing[-1]) + 1)
        return self._gaps[d]

    def _missing_at(self, d: date, idx: slice | npt.NDArray[np.int64]) -> int:
        """How many of the local clock minutes ``idx`` (a slice or minute indices) do not exist on ``d``."""
        gap = self._clock_gap(d)
        if gap is None:
            return 0
        if isinstance(idx, slice):
            return max(0, min(idx.stop, gap[1]) - max(idx.start, gap[0]))
        return int(((idx >= gap[0]) & (idx < gap[1])).sum())

    def _window_clock(self, d: date, end: int, minutes: int
                      ) -> tuple[slice | npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The local clock minutes of the ``minutes`` *elapsed* minutes ending at clock minute ``end`` of ``d``
        (inclusive): those on ``d`` (a slice on an ordinary day) and those on the day before (its last existing
        minutes, empty unless the window spans midnight).  Minutes that do not exist (a spring-forward gap on
        either day) are stepped over, so the window reaches back as far as that much time does."""
        lo = end - minutes + 1
        prev = d - timedelta(days=1)
        gap = self._clock_gap(d)
        if gap is None and (lo >= 0 or self._clock_gap(prev) is None):
            return slice(max(lo, 0), end + 1), np.arange(1440 + min(lo, 0), 1440, dtype=np.int64)
        day = self._existing(d)
        day = day[day <= end][-minutes:]
        k = minutes - len(day)
        return day, (self._existing(prev)[-k:] if k > 0 else np.zeros(0, dtype=np.int64))

    def _existing(self, d: date) -> npt.NDArray[np.int64]:
        """The local clock minutes of ``d`` that exist (all 1440 but a spring-forward gap's)."""
        m = np.arange(1440, dtype=np.int64)
        gap = self._clock_gap(d)
        return m if gap is None else m[(m < gap[0]) | (m >= gap[1])]

    def _observed(self, local: datetime, minutes: int, raw: bool = False) -> tuple[float, int]:
        """The count of the ``minutes`` *elapsed* minutes ending at ``local`` (inclusive) and how many of them
        have data: on a spring-forward day (or the day after one whose gap ends it) the window reaches back over
        the local minutes that do not exist."""
        seg = self._window(self.days if raw else self.clean, local, minutes)
        valid = seg[~np.isnan(seg)]
        return float(valid.sum()), len(valid)

    def _window(self, per_day: dict[date, npt.NDArray[Any]], local: datetime, minutes: int) -> npt.NDArray[Any]:
        """The values of a per-day minute array (``days``, ``clean``, ``excluded``) over the ``minutes`` elapsed
        minutes ending at ``local`` (inclusive), oldest first, as :meth:`_window_clock` picks them."""
        d = local.date()
        on_day, on_prev = self._window_clock(d, local.hour * 60 + local.minute, minutes)
        seg = per_day[d][on_day]
        prev = d - timedelta(days=1)
        if len(on_prev) and prev in per_day:
            seg = np.concatenate([per_day[prev][on_prev], seg])
        return seg

    # -- streaming ------------------------------------------------------------------------------------
    def update(self, ts: datetime, count: float) -> Iterator[Detection]:
        """Feed one minute (UTC-aware ``ts``); yields detections opened/updated/closed at this minute."""
        if self._last_ts is not None and ts <= self._last_ts:
            raise ValueError(f"minutes must be fed in increasing time order ({ts} after {self._last_ts})")
        local = ts.astimezone(self.tz)
        d = local.date()
        if d not in self.days:
            self._prune(d)
            self.days[d] = np.full(1440, np.nan)
            self.excluded[d] = np.zeros(1440, dtype=bool)
            self.clean[d] = np.full(1440, np.nan)
            self.ref[d] = np.full(1440, np.nan)
        idx = local.hour * 60 + local.minute
        self.days[d][idx] = count
        self.clean[d][idx] = count
        self.ref[d][idx] = count
        gap = self._last_ts is not None and (ts - self._last_ts) > timedelta(minutes=self.p.outage_min_minutes)
        self._last_ts = ts
        if gap:  # no data: close whatever was open at the last seen minute, never call it a dip
            yield from self._close_all(ts, "no_data")
            # and what was building up before the gap is not evidence after it (a confirmation must be unbroken)
            self._down_run, self._spike_run = [], 0
        yield from self._outage(ts, local, count)
        if "outage" in self.open:
            self.excluded[d][idx] = True  # keep outage minutes out of future baselines
            self.clean[d][idx] = np.nan
            self.ref[d][idx] = np.nan
            return
        yield from self._spike(ts, local)
        yield from self._dip(ts, local)
        if self.p.exclude_events:
            # the minutes of a reported spike (from its back-dated start) or unexplained dip stay out of future
            # baselines, as outages do: last week's election night must not mask the same hours of the days after;
            # except in the week after a new level (see _new_level): then they are that level seen on another kind
            # of day
            spike = self.open.get("spike")
            if spike is not None and not spike.detail.get("after_new_level"):
                self._unref(spike, ts, self.p.bucket_minutes)
            dip = self.open.get("dip")
            if dip is not None and dip.label == "unexplained" and not dip.detail.get("after_new_level"):
                self._unref(dip, ts, self.p.dip_bucket_minutes)

    def _prune(self, today: date) -> None:
        """Drop what no lookup from ``today`` on can read: per-day arrays and caches of days before
        ``today - keep_days`` (references reach :data:`REFERENCE_DAYS_BACK` days back, plus the day before a
        reference for a window over midnight), closed events that ended before them, and the ``ref`` marks of
        events that are neither open nor able to continue (the latest closed of each kind)."""
        cutoff = today - timedelta(days=self.keep_days)
        for per_day in (self.days, self.excluded, self.clean, self.ref, self._kinds, self._gaps):
            for k in [k for k in per_day if k < cutoff]:
                del per_day[k]
        for rkey in [k for k in self._refs if k[0] < cutoff]:
            del self._refs[rkey]
        for tkey in [k for k in self._day_totals if k[0] < cutoff]:
            del self._day_totals[tkey]
        edge = datetime.combine(cutoff, datetime.min.time()).replace(tzinfo=self.tz)
        self.closed = [c for c in self.closed if c.end is None or c.end >= edge
                       or c in self._recent_closed.values()]
        live = {d.id for d in self.open.values()} | {d.id for d in self._recent_closed.values()}
        self._unref_done = {k: v for k, v in self._unref_done.items() if k in live}

    def _unref(self, det: Detection, ts: datetime, window: int) -> None:
        """Mark the minutes of ``det`` -- from the first minute of the trailing ``window`` that opened it (the
        anomaly was already in it), or from the last minute marked -- to ``ts`` as no data for future baselines
        (``ref``); the detector's own view of the current window (``clean``) is unchanged."""
        first = det.start - timedelta(minutes=window - 1)
        self._set_ref(max(first, self._unref_done.get(det.id, first - timedelta(minutes=1)) + timedelta(minutes=1)),
                      ts, restore=False)
        self._unref_done[det.id] = ts

    def _set_ref(self, first: datetime, last: datetime, restore: bool) -> None:
        """The minutes ``first..last`` of ``ref`` (what baselines read): no data (``restore=False``, an event's
        minutes) or ``clean`` again (``restore=True``, a new level's minutes given back; outage minutes stay NaN
        there)."""
        m = first
        while m <= last:
            loc = m.astimezone(self.tz)
            d = loc.date()
            arr = self.ref.get(d)
            if arr is not None:
                i = loc.hour * 60 + loc.minute
                arr[i] = self.clean[d][i] if restore else np.nan
            m += timedelta(minutes=1)

    def close_open(self, reason: str, at: datetime) -> list[Detection]:
        """Close every open event where it was last seen, and by ``at`` (``detail.closed_by = reason``): the
        series ended there for good (a site whose every log source ops retired, ``at`` the minute before the
        retirement: minutes fed after it, before the retirement was known, are not the event's).  Fed again
        later, it goes on as after any stretch of no data."""
        return list(self._close_all(self._last_ts or at, reason, at))

    def _close_all(self, ts: datetime, reason: str, by: datetime | None = None) -> Iterator[Detection]:
        for k in list(self.open):
            det = self.open.pop(k)
            det.end = self._last_seen_end(det)
            if by is not None:
                det.end = max(det.start, min(det.end, by))
            det.state = "closed"
            det.detail["closed_by"] = reason
            if k == "outage":  # up minutes pending at the last seen minute: not part of it (its end is _last)
                for key in _RECOVERY:
                    det.detail.pop(key, None)
                det.detail["minutes"] = int((det.end - det.start).total_seconds() // 60) + 1
            self.closed.append(det)
            yield det

    def _last_seen_end(self, det: Detection) -> datetime:
        return det.detail.pop("_last", det.peak_ts)

    @property
    def down(self) -> bool:
        """The last minutes fed were down (an outage is being confirmed) or an outage is open."""
        return bool(self._down_run) or "outage" in self.open

    def _outage(self, ts: datetime, local: datetime, count: float) -> Iterator[Detection]:
        exp, n = self.expected(local, 1)
        if n == 0 and "outage" not in self.open:
            self._down_run = []  # a minute that cannot be judged breaks the run of down minutes
            return
        down = count <= self.p.outage_fraction * (exp if not math.isnan(exp) else 0.0) or count == 0
        if "outage" in self.open:
            det = self.open["outage"]
            recent = self._observed(local, 15, raw=True)[0]
            exp15, _ = self.expected(local, 15)
            e = 0.0 if math.isnan(exp) else exp
            # back when the last 15 minutes reach half of what was expected, scaled by the level the site had in the
            # hours before the outage when that was lower (a holiday: at 0.35x a workday's traffic the site stayed
            # "down" for hours after it answered again, and the holiday dip went unreported: trial 31)
            # with no reference day for this time (a new site's first weekend: no day of its kind yet) there is
            # nothing to compare with: back after 15 minutes in a row that are up (it stayed open until the first
            # workday, and every minute of that weekend was kept out of the baselines, so the next weekend had no
            # reference either: found by a review)
            up_since = det.detail.get("_up_since")
            if math.isnan(exp15):
                back_up = up_since is not None and ts - up_since >= timedelta(minutes=14)
            else:
                back_up = recent >= 0.5 * exp15 * det.detail.get("_level", 1.0)
            if not down and back_up:
                # it ends where the traffic came back: the minutes of the run of up minutes that led here are the
                # recovery, not the outage (observed / expected leave them out)
                back = det.detail.get("_up_since", ts)
                for key in _RECOVERY:
                    det.detail.pop(key, None)
                det.detail["minutes"] = int((back - det.start).total_seconds() // 60)
                closed = self._close("outage", ts)
                closed.end = back
                yield closed
            elif down:
                # a minute still down: an up minute or a few before it were a flicker, part of the outage
                det.observed += det.detail.pop("_up_obs", 0.0) + count
                det.expected += det.detail.pop("_up_exp", 0.0) + e
                det.detail.pop("_up_since", None)
                det.detail["_last"] = ts
            else:
                det.detail.setdefault("_up_since", ts)
                det.detail["_up_obs"] = det.detail.get("_up_obs", 0.0) + count
                det.detail["_up_exp"] = det.detail.get("_up_exp", 0.0) + e
            return
        if down and not math.isnan(exp) and exp >= 1.0:
            self._down_run.append(ts)
        else:
            self._down_run = []
        if len(self._down_run) >= self.p.outage_min_minutes:
            start = self._down_run[0]
            obs, _ = self._observed(local, len(self._down_run))
            e, _ = self.expected(local, len(self._down_run))
            # what was open (a dip, a spike) is superseded by the outage: it closes where the outage begins (its
            # closing state is emitted, same id, so the store and the events topic get its end)
            for k in ("dip", "spike"):
                prev = self.open.pop(k, None)
                if prev is not None:
                    prev.detail.pop("_last", None)
                    prev.end, prev.state = max(prev.start, start), "closed"
                    prev.detail["closed_by"] = "outage"
                    self.closed.append(prev)
                    yield prev
            det = Detection("outage", self.scope, start, None, start, obs, e, 1.0, "outage",
                            {"down_minutes": len(self._down_run)}, site=self.site)
            for t in self._down_run:  # the minutes that confirmed it are outage minutes too: out of baselines
                lt = t.astimezone(self.tz)
                if lt.date() in self.excluded:
                    i = lt.hour * 60 + lt.minute
                    self.excluded[lt.date()][i] = True
                    self.clean[lt.date()][i] = self.ref[lt.date()][i] = np.nan
            self._down_run = []
            opened = self._open("outage", det, start)
            opened.detail["_last"] = ts  # the last minute seen down (a no-data close right away ends here)
            opened.detail.setdefault("_level", self._level_before(start))
            yield opened

    def _level_before(self, start: datetime) -> float:
        """The site's traffic in the ``dip_bucket_minutes`` before ``start`` as a share of its expectation, in
        ``[0.2, 1]``: what "back" means for an outage that began on a quiet day.  Judged on the minutes of that
        window that have data and were not in an outage (an earlier outage, or a silence, in those hours is not a
        quiet day: it made a second outage close at a third of the site's level); 1 without a baseline or with
        fewer than a sixth of the window judged."""
        local = (start - timedelta(minutes=1)).astimezone(self.tz)
        m = self.p.dip_bucket_minutes
        exp, n = self.expected(local, m)
        if not n or math.isnan(exp) or exp <= 0:
            return 1.0
        vals, out = self._window(self.days, local, m), self._window(self.excluded, local, m)
        keep = ~np.isnan(vals) & ~out
        if int(keep.sum()) < m / 6:
            return 1.0
        return min(1.0, max(0.2, float(vals[keep].mean()) * m / exp))

    def _open(self, kind: str, det: Detection, ts: datetime) -> Detection:
        """Open ``det`` unless the previous event of this kind ended less than ``merge_minutes`` ago: then that
        one continues (same id)."""
        prev = self._recent_closed.get(kind)
        # only an event of the same label continues: a holiday dip that closed at the end of the holiday must
        # not be reopened by the unexplained dip of the next day (it would close again at once, every minute)
        if (prev is not None and prev.end is not None and prev.label == det.label
                and ts - prev.end <= timedelta(minutes=self.p.merge_minutes)):
            prev.end, prev.state = None, "open"
            # what its close said (and an outage's pending recovery) no longer holds
            for key in ("closed_by", "minutes", *_RECOVERY):
                prev.detail.pop(key, None)
            if prev in self.closed:
                self.closed.remove(prev)
            det = prev
        if kind in ("spike", "dip") and self._unlearnt_shift(kind, ts):
            det.detail["after_new_level"] = True
        else:
            det.detail.pop("after_new_level", None)
        self.open[kind] = det
        return det

    def _unlearnt_shift(self, kind: str, ts: datetime) -> bool:
        """Whether a new level of this kind began less than a week before ``ts`` and none of the reference days
        of ``ts``'s window has seen it yet at this clock time (a shift that began on a Monday morning is new to
        the first Saturday, and to the next Monday before 09:00 when it began on a Friday at 14:00)."""
        shift = self._new_level_at.get(kind)
        if shift is None or ts - shift[0] > timedelta(days=7):
            return False
        local = ts.astimezone(self.tz)
        began = shift[1].astimezone(self.tz)
        for r in self._reference_days(local.date(), self._day_kind(local.date())):
            if datetime.combine(r, local.timetz()) >= began:
                return False
        return True

    def _close(self, kind: str, ts: datetime) -> Detection:
        det = self.open.pop(kind)
        det.end, det.state = ts, "closed"
        det.detail.pop("_last", None)
        self.closed.append(det)
        self._recent_closed[kind] = det
        return det

    def _is_new_level(self, det: Detection, ts: datetime) -> bool:
        return self.p.new_level_hours > 0 and ts - det.start >= timedelta(hours=self.p.new_level_hours)

    def _new_level(self, kind: str, ts: datetime, ratio: float, window: int) -> Detection:
        """Close a spike (an unexplained dip) that has held ``new_level_hours``: the site's traffic has moved to a
        new level, not had an event.  Its minutes, kept out of the baselines while it was an event
        (``exclude_events``), are given back, so the baselines learn the new level (reference days are the last
        ``baseline_days`` of the same kind: a shift that began on a workday is learnt on workdays at once and on
        weekends after its first weekend); a later event of this kind is a new one, not this one continued.
        For the week after, an event of this kind that opens where no reference day has seen the new level yet (a
        weekend after a shift on a workday; the hours of a Monday before the time a Friday shift began) is marked
        ``detail.after_new_level`` and its minutes are not kept out of the baselines: it is most likely the same
        shift, and the next day of that kind learns it (:meth:`_unlearnt_shift`).  Other events of the week are
        ordinary.  Without this an open event kept its minutes out of every baseline and never closed, and a
        shift re-opened on every weekend day for weeks."""
        det = self.open[kind]
        det.detail["closed_by"] = "new_level"
        det.detail["level_ratio"] = round(ratio, 3)  # the traffic against the old expectation when closed
        closed = self._close(kind, ts)
        self._recent_closed.pop(kind, None)
        self._new_level_at[kind] = (ts, closed.start)
        self._set_ref(closed.start - timedelta(minutes=window - 1), ts, restore=True)
        self._unref_done.pop(closed.id, None)
        self._day_totals.clear()  # whole-day expectations read the baselines given back
        return closed

    def _spike(self, ts: datetime, local: datetime) -> Iterator[Detection]:
        m = self.p.bucket_minutes
        obs, have = self._observed(local, m)
        refs = self._reference_sums(local, m)
        if not refs or have < 0.8 * m:
            self._spike_run = 0  # a window that cannot be judged breaks the confirmation run
            return
        exp = max(float(np.median(refs)), 1.0)
        bound = max(max(refs), 1.0)  # conservative: above every recent same-type day
        ratio = obs / exp
        z = (obs - bound) / math.sqrt(bound)
        hit = (obs / bound >= self.p.spike_ratio and z >= self.p.spike_z
               and obs - bound >= self.p.spike_min_excess)
        det = self.open.get("spike")
        score = min(1.0, max(z, 0.0) / (2 * self.p.spike_z))
        if det is None:
            if hit:  # the elevation must be current, not a short burst still inside the trailing window
                obs5, have5 = self._observed(local, 5)
                refs5 = self._reference_sums(local, 5)
                hit = bool(refs5) and have5 >= 4 and obs5 >= self.p.spike_ratio * max(max(refs5), 1.0)
            self._spike_run = self._spike_run + 1 if hit else 0
            if self._spike_run >= self.p.spike_confirm_minutes:
                start = ts - timedelta(minutes=self._spike_run - 1)
                new = Detection("spike", self.scope, start, None, ts, obs, exp, score, "spike",
                                {"ratio": round(ratio, 3), "window_minutes": m, "confirmed_at": _iso(ts),
                                 "_emitted_ratio": ratio}, site=self.site)
                self._spike_run = 0
                opened = self._open("spike", new, start)
                opened.detail["_hot"] = ts  # its last 5 minutes are at spike_ratio: just checked
                yield opened
            return
        det.detail["_last"] = ts
        # the last minute whose 5-minute window is still over the end threshold: the spike ends shortly after it
        # when the trailing window says it is over (that window lags the traffic by up to its 30 minutes: a
        # 12-minute flood read as 40 minutes long, user trial 40)
        obs5, have5 = self._observed(local, 5)
        refs5 = self._reference_sums(local, 5)
        if have5 >= 4 and refs5 and obs5 >= self._end_level * max(max(refs5), 1.0):
            det.detail["_hot"] = ts
        if ratio > det.observed / max(det.expected, 1.0):
            det.observed, det.expected, det.peak_ts = obs, exp, ts
            det.score = max(det.score, score)
            det.detail["ratio"] = round(ratio, 3)
        if obs / bound < self._end_level:
            hot = det.detail.pop("_hot", None)
            closed = self._close("spike", ts)
            if hot is not None:
                # the minute after its last elevated minute: within the last elevated 5-minute window, the last
                # minute at spike_ratio on its own (a flood's last minute), else that window's end
                end = hot + timedelta(minutes=1)
                for back in range(5):
                    if self._minute_hot(hot - timedelta(minutes=back)):
                        end = hot - timedelta(minutes=back - 1)
                        break
                closed.end = max(closed.start, min(ts, end))
            yield closed
        elif self._is_new_level(det, ts):
            yield self._new_level("spike", ts, ratio, m)
        elif ratio >= PEAK_STEP * det.detail.get("_emitted_ratio", math.inf):
            det.detail["_emitted_ratio"] = ratio
            yield det  # grown by a quarter since last reported: the stored and published peak follows

    @property
    def _end_level(self) -> float:
        """A spike is over when its window is under this multiple of its busiest reference (1.5 at the shipped
        spike_ratio 2 and end_ratio 0.5)."""
        return 1.0 + (self.p.spike_ratio - 1.0) * self.p.end_ratio

    def _minute_hot(self, ts: datetime) -> bool:
        """The minute ``ts`` on its own is at ``spike_ratio`` x its busiest reference day's same minute."""
        local = ts.astimezone(self.tz)
        obs1, have1 = self._observed(local, 1)
        refs1 = self._reference_sums(local, 1)
        return bool(have1 and refs1 and obs1 >= self.p.spike_ratio * max(max(refs1), 1.0))

    def _dip(self, ts: datetime, local: datetime) -> Iterator[Detection]:
        m = self.p.dip_bucket_minutes
        d = local.date()
        holiday = self.cal.is_holiday(d)
        obs, have = self._observed(local, m)
        # on a holiday, "expected" is what a normal day of that weekday kind would have been
        kind = "workday" if holiday and self.cal.is_weekday_workday(d) else None
        refs = self._reference_sums(local, m, kind)
        det = self.open.get("dip")
        if not refs or have < 0.8 * m:
            return
        exp = float(np.median(refs))
        bound = min(refs)  # conservative: below every recent same-type day
        if bound < 1.0:
            return
        obs_scaled = obs * m / have
        ratio = obs_scaled / exp
        z = (bound - obs_scaled) / math.sqrt(bound)
        limit = self.p.holiday_dip_ratio if holiday else self.p.dip_ratio
        hit = obs_scaled / bound <= limit and z >= self.p.dip_z
        if det is None:
            if hit and not holiday:  # materiality: an unexplained dip must cost a share of a normal day
                hit = exp - obs_scaled >= self.p.dip_min_loss * self._day_expected(d, kind)
            if hit:
                label = "holiday" if holiday else "unexplained"
                detail: dict[str, Any] = {"ratio": round(ratio, 3), "window_minutes": m, "_emitted_ratio": ratio}
                if holiday:
                    detail["holiday"] = self.cal.holiday_name(d)
                new = Detection("dip", self.scope, ts, None, ts, obs_scaled, exp,
                                min(1.0, (1 - ratio) / (1 - limit) / 2), label, detail, site=self.site)
                yield self._open("dip", new, ts)
            return
        det.detail["_last"] = ts
        if ratio < det.observed / max(det.expected, 1.0):
            det.observed, det.expected, det.peak_ts = obs_scaled, exp, ts
            det.detail["ratio"] = round(ratio, 3)
        end_limit = 1.0 - (1.0 - limit) * self.p.end_ratio
        if obs_scaled / bound > end_limit or (det.label == "holiday" and not holiday):
            yield self._close("dip", ts)
        elif det.label == "unexplained" and self._is_new_level(det, ts):
            yield self._new_level("dip", ts, ratio, m)
        elif ratio * PEAK_STEP < det.detail.get("_emitted_ratio", 0.0):  # (a dip at 0 stays reported once)
            det.detail["_emitted_ratio"] = ratio
            yield det  # deepened by a quarter since last reported

    def finish(self) -> Iterator[Detection]:
        """Close nothing, report still-open events as they are (``state`` = ``open``)."""
        for det in self.open.values():
            det.detail.pop("_last", None)
            yield det


def run_seasonal(ts: Sequence[datetime], counts: Sequence[float], tz: str, calendar: Any = None,
                 params: SeasonalParams | None = None, scope: str = "site", site: str = "") -> list[Detection]:
    """Run :class:`SeasonalDetector` over a whole series; returns the final state of every event."""
    det = SeasonalDetector(tz, calendar, params, scope, site)
    latest: dict[str, Detection] = {}
    for t, c in zip(ts, counts, strict=True):
        for d in det.update(t, float(c)):
            latest[d.id] = d
    for d in det.finish():
        latest[d.id] = d
    return sorted(latest.values(), key=lambda d: d.start)


# ------------------------------------------------------------------------------------------------ CLI


def read_series_csv(path: str, notes: list[str] | None = None) -> tuple[list[datetime], FloatArray]:
    """``timestamp,value`` CSV (``-``: standard input; header optional; more columns ignored).  Timestamps are ISO 8601 (naive = UTC) or
    epoch seconds (milliseconds when above 1e11).  Rows are sorted by time (stable sort); duplicate timestamps
    keep the last row of the file.  Values that are not finite numbers are missing.  Absent rows mean "no data".

    Raises ValueError naming the file (and the row, for a timestamp that cannot be read).  ``notes`` (if given)
    receives one line per thing a user should know about the input: values that were not numbers, empty, NaN or
    infinite, duplicate timestamps, rows out of time order, timestamps without an offset, extra columns or extra
    fields on some rows."""
    longer: list[list[str]] = []

    def _longer(fields: list[str]) -> list[str]:
        longer.append(fields)
        return fields[:2]  # the extra fields are ignored, as a whole extra column is

    src: Any = path
    if path == "-":  # standard input, as `ingest -` reads it (read once: the file may be read twice below)
        src = io.StringIO(sys.stdin.read())
        path = "<stdin>"
    try:
        try:
            df = pd.read_csv(src, header=None, dtype=str, skip_blank_lines=True, keep_default_na=False)
        except pd.errors.ParserError as exc:
            if "Expected" not in str(exc):
                raise
            if isinstance(src, io.StringIO):
                src.seek(0)
            # some row has more fields than the first: read again, keeping timestamp,value of those rows
            df = pd.read_csv(src, header=None, dtype=str, skip_blank_lines=True, keep_default_na=False,
                             engine="python", on_bad_lines=_longer)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{path}: the file is empty (expected timestamp,value rows)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    except pd.errors.ParserError as exc:
        raise ValueError(f"{path}: not a CSV of timestamp,value rows ({' '.join(str(exc).split())})") from None
    df = df.fillna("")  # rows shorter than the widest (python engine): their missing fields are empty
    if longer and notes is not None:
        notes.append(f"{len(longer)} row(s) have more fields than the first row: only their timestamp,value is "
                     f"read (first: {','.join(longer[0])!r})")
    if df.shape[1] < 2:
        raise ValueError(f"{path}: expected two columns timestamp,value (comma-separated), found {df.shape[1]}")
    first = str(df.iloc[0, 1])
    header = 0
    try:
        float(first)
    except ValueError:
        if first.strip().lower() not in ("", "nan", "na"):  # a missing first value is data, not a header
            df, header = df.iloc[1:], 1  # header row
    if df.empty:
        raise ValueError(f"{path}: no rows after the header")
    if df.shape[1] > 2 and notes is not None:
        notes.append(f"{df.shape[1] - 2} column(s) after timestamp,value are ignored")
    col = df.iloc[:, 0].str.strip()
    # epoch seconds (9-10 digits: 1973-2286) or milliseconds (13 digits); other digit strings (20240101,
    # 202401011200) are compact dates, left to the date parser
    secs, millis = col.str.fullmatch(r"\d{9,10}(\.\d+)?"), col.str.fullmatch(r"\d{13}")
    if secs.all() or millis.all():
        nums = pd.to_numeric(col)
        ts = pd.to_datetime(nums, unit="ms" if millis.all() else "s", utc=True)
    elif (secs | millis).all():  # both units: which is which cannot be guessed row by row safely
        i, j = int(np.flatnonzero(secs.to_numpy())[0]), int(np.flatnonzero(millis.to_numpy())[0])
        raise ValueError(f"{path}: the timestamps mix epoch seconds (row {i + 1 + header}: {col.iloc[i]!r}) and "
                         f"milliseconds (row {j + 1 + header}: {col.iloc[j]!r}): use one unit")
    else:
        # 10/03/2024, 10.03.2024, 10-03-24: day-first or month-first cannot be known (the date parser read
        # 10/03 as 3 October and 13/03 as 13 March in one file, re-sorting the series without a word: user trial 40)
        # anywhere in the field ("00:00 10/03/2024", "Sun 10/03/2024": a review), not in ISO's 2024-03-10
        numeric_dmy = col.str.contains(r"(?<![\d/.\-])\d{1,2}[/.\-]\d{1,2}[/.\-]\d{2,4}(?![\d/.\-])", regex=True)
        if numeric_dmy.any():
            i = int(np.flatnonzero(numeric_dmy.to_numpy())[0])
            raise ValueError(f"{path}: row {i + 1 + header}: {col.iloc[i]!r} is a numeric date whose day and month "
                             f"order cannot be known ({int(numeric_dmy.sum())} such row(s)): write ISO 8601 "
                             "(2024-03-10T00:00, with an offset such as +08:00 or Z) or epoch seconds")
        ts = pd.to_datetime(col, utc=True, format="mixed", errors="coerce")
        bad = np.flatnonzero(ts.isna().to_numpy())
        if len(bad):
            i = int(bad[0])
            why = ""
            if (secs | millis).iloc[i]:  # an epoch number among dates: say so (user trial 40)
                j = int(np.flatnonzero(~(secs | millis).to_numpy())[0])
                why = (f": the file mixes epoch numbers with dates (row {j + 1 + header}: {col.iloc[j]!r}); "
                       "use one form")
            elif len(bad) == len(col) and pd.to_datetime(df.iloc[:, 1].str.strip(), utc=True, format="mixed",
                                                         errors="coerce").notna().all():
                why = ": the columns look swapped (they are timestamp,value, in that order)"
            raise ValueError(f"{path}: row {i + 1 + header}: {col.iloc[i]!r} is not a timestamp "
                             f"({len(bad)} such row(s)){why}")
        # an offset follows a time of day ("2024-03-04" ends in "-04" but has none)
        naive = int((~col.str.contains(r"(?:\d:\d\d(?::\d\d)?|T\d{4}(?:\d\d)?)(?:[.,]\d+)?\s*"
                                       r"(?:Z|UTC|GMT|[+-]\d\d(?::?\d\d)?)$", case=False, regex=True)).sum())
        if naive and notes is not None:
            notes.append(f"{naive} timestamp(s) have no UTC offset and are read as UTC")
    raw = df.iloc[:, 1].str.strip()
    vals = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    if notes is not None:
        words = np.flatnonzero(np.isnan(vals) & (raw != "").to_numpy() & ~raw.str.lower().isin(["nan", "na"]).to_numpy())
        if len(words):
            i = int(words[0])
            notes.append(f"{len(words)} value(s) are not numbers and count as missing (first: row {i + 1 + header}, "
                         f"{raw.iloc[i]!r})")
        blank = int((np.isnan(vals) & ((raw == "") | raw.str.lower().isin(["nan", "na"])).to_numpy()).sum())
        if blank:
            notes.append(f"{blank} value(s) are empty or NaN and count as missing")
    infinite = int(np.isinf(vals).sum())
    if infinite and notes is not None:
        notes.append(f"{infinite} value(s) are infinite and count as missing")
    vals[~np.isfinite(vals)] = np.nan
    index = pd.DatetimeIndex(ts)
    earlier = int((np.diff(index.to_numpy(dtype='datetime64[ns]').astype(np.int64)) < 0).sum()) if len(index) > 1 else 0
    if earlier and notes is not None:
        notes.append(f"{earlier} row(s) are earlier than the row before them: rows are read in time order")
    s = pd.Series(vals, index=index).sort_index(kind="stable")
    dup = int(s.index.duplicated(keep="last").sum())
    if dup and notes is not None:
        notes.append(f"{dup} row(s) repeat an earlier timestamp: the last row of each timestamp is used")
    s = s[~s.index.duplicated(keep="last")]
    return [t.to_pydatetime() for t in s.index], s.to_numpy(dtype=np.float64)


def series_notes(ts: Sequence[datetime], values: FloatArray, step: int | None, mode: str,
                 min_history: int) -> list[str]:
    """What a user of ``detect series`` should know about how the series will be read (stderr notes; reading only,
    the events and scores do not depend on it): rows whose spacing is not the row step in force (each row is
    read as covering one step: a series that turns from 1-minute to 5-minute rows would count a fifth of its
    traffic, and no outage would be found), a ``--step`` the rows disagree with, the switch of ``auto`` to
    generic mode, and a series too short to judge."""
    out: list[str] = []
    n = len(ts)
    finite = int(np.isfinite(values).sum())
    if finite < min_history:
        out.append(f"only {finite} row(s) with a value: the score stays 0 before {min_history}, and the count "
                   "detectors need a previous day of the same kind as a baseline")
    elif n and ts[-1] - ts[0] < timedelta(days=1) and mode != "generic":
        out.append("the series covers less than a day: the count detectors need a previous day of the same kind "
                   "as a baseline, so they report nothing")
    if n < 3:
        return out
    sec = _epoch_seconds(ts)
    steps = np.diff(sec)
    decided = int(_row_steps(sec)[-1])
    used = int(step) if step else decided
    if step and decided and step != decided:
        # what it does to the results, said (a --step 60 on 300 s rows lost a 3-hour outage with only the
        # spacing noted: user trial 40)
        out.append(f"--step {step}: the first {min(n, DECIDE_ROWS)} rows are {decided} s apart; the results use "
                   f"{step} s " + (f"(each row is then followed by {decided // step - 1} missing steps, read as no "
                                  "data)" if step < decided and decided % step == 0 else "(a different phase and "
                                  "window for every detector)") + f": leave --step out to use {decided} s")
    elif used > 0:
        block = DECIDE_ROWS
        for b in range(0, len(steps), block):
            chunk = steps[b:b + block]
            chunk = chunk[chunk > 0]
            if len(chunk) < block // 2:
                continue
            # the step most rows are within 10% of (jitter of 59 / 60 / 61 s is no change of spacing)
            cands = np.unique(chunk)
            near = [int((np.abs(chunk - c) <= 0.1 * c).sum()) for c in cands]
            common = int(cands[int(np.argmax(near))])
            if abs(common - used) > 0.1 * used:
                first = b + int(np.flatnonzero(np.abs(steps[b:b + block] - common) <= 0.1 * common)[0])
                out.append(f"rows from {_iso(ts[first + 1])} on are mostly {common} s apart, not the row step of "
                           f"{used} s: every row is read as one {used}-s step (pass --step {common} if that is the "
                           "series' real step, or split the file where the spacing changes)")
                break
    if mode == "auto":
        k = _generic_from(np.asarray(values, dtype=np.float64))
        if k < n:
            out.append(f"row {k + 1} ({_iso(ts[k])}) is not a non-negative integer ({float(values[k])!r}): generic mode "
                       "(the anomaly score) from that row on, instead of the count detectors")
    return out


MODES = ("auto", "counts", "generic")


def _generic_from(values: FloatArray, rows: int = DECIDE_ROWS) -> int:
    """First row of ``generic`` mode under ``auto``: the first of the first ``rows`` finite values that is negative
    or not an integer; ``len(values)`` when those are all non-negative integers (counts, frozen)."""
    seen = 0
    for i, v in enumerate(values):
        if math.isnan(v):
            continue
        if v < 0 or v != round(v):
            return i
        seen += 1
        if seen >= rows:
            break
    return len(values)


def _count_events(ts: Sequence[datetime], values: FloatArray, steps: npt.NDArray[np.int64], tz: str,
                  calendar: Any, params: SeasonalParams | None, scope: str, abandon: bool) -> list[Detection]:
    """:class:`SeasonalDetector` over a count series: row ``t``'s value is spread over the minutes its interval
    ``[t, t + steps[t])`` overlaps (``steps`` in seconds: the row step in force at ``t``), in proportion to the
    overlap, so rows shorter than a minute (30 s) are summed into their minutes and rows not on a minute boundary
    are split between two.  A minute is fed once no later row can add to it (when a row of a later minute
    arrives, or at the end): streaming, minute by minute.  Minutes no row covers are absent (no data).
    ``abandon``: the series leaves counts mode after these rows; open events are closed."""
    det = SeasonalDetector(tz, calendar, params, scope)
    latest: dict[str, Detection] = {}
    last: datetime | None = None
    pending: dict[datetime, float] = {}  # minute -> count gathered so far (not fed yet)
    one = timedelta(minutes=1)

    def feed_before(limit: datetime | None) -> None:
        nonlocal last
        for m in sorted(k for k in pending if limit is None or k < limit):
            count = pending.pop(m)
            for d in det.update(m, count):
                latest[d.id] = d
            last = m

    for i, (t, v) in enumerate(zip(ts, values, strict=True)):
        if np.isnan(v):
            continue
        step_s = max(1, int(steps[i]))
        first = t.replace(second=0, microsecond=0)
        feed_before(first)  # rows are in time order: nothing later adds to the minutes before this row's
        end = t + timedelta(seconds=step_s)
        m = first
        while m < end:
            overlap = (min(m + one, end) - max(m, t)).total_seconds()
            if overlap > 0:
                pending[m] = pending.get(m, 0.0) + float(v) * overlap / step_s
            m += one
    feed_before(None)
    if abandon and last is not None:
        for d in det._close_all(last, "mode_switch"):
            latest[d.id] = d
    for d in det.finish():
        latest[d.id] = d
    return sorted(latest.values(), key=lambda d: d.start)


def series_events(ts: Sequence[datetime], values: FloatArray, tz: str = "UTC", calendar: Any = None,
                  seasonal: SeasonalParams | None = None, score: ScoreParams | None = None,
                  mode: str = "auto", scope: str = "series", step: int | None = None) -> list[Detection]:
    """Events of a series: ``counts`` mode runs :class:`SeasonalDetector` (each row's value spread evenly over
    the minutes of its row step); ``generic`` mode reports the alarms of :func:`anomaly_scores`.  ``auto`` is
    ``counts`` while the finite values are non-negative integers, decided on the first ``DECIDE_ROWS`` of them
    and then frozen: a non-integer among them switches to ``generic`` from its row on (events still open in
    counts mode are closed, ``closed_by`` = ``mode_switch``); a later one does not change the mode.  ``step``
    (seconds) overrides the row step decided from the first ``DECIDE_ROWS`` rows.  Streaming: events at row
    ``t`` use rows ``<= t`` only."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    vals = np.asarray(values, dtype=np.float64)
    n = len(vals)
    switch = _generic_from(vals) if mode == "auto" else (n if mode == "counts" else 0)  # first row in generic mode
    out: list[Detection] = []
    if switch > 0 and len(ts) >= 2:
        steps = np.full(n, int(step), dtype=np.int64) if step else _row_steps(_epoch_seconds(ts))
        steps[0] = steps[1]  # the first row takes the first step
        out += _count_events(ts[:switch], vals[:switch], steps[:switch], tz, calendar, seasonal, scope, switch < n)
    if switch < n:
        p = score or ScoreParams()
        sc, expected = _scores(vals, p, ts if len(ts) > 1 else None, step, True)
        out += score_events(ts, sc, vals, p.alarm, scope, expected, first=switch)
    return out


def detect_series_command(
    input: Annotated[str, typer.Option("--input", help="CSV timestamp,value (rows absent = no data); - reads standard input")],
    scores: Annotated[bool, typer.Option("--scores", help="print a per-row anomaly score in [0,1] instead")] = False,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA time zone for seasonality and holidays")] = "UTC",
    country: Annotated[str | None, typer.Option("--country", help="holiday calendar country, e.g. US, MY")] = None,
    mode: Annotated[str, typer.Option("--mode", help="auto | counts | generic (auto: decided on the first "
                                                   f"{DECIDE_ROWS} values)")] = "auto",
    rules_file: Annotated[str | None, typer.Option("--rules", help="traffic.yaml replacement")] = None,
    step: Annotated[int | None, typer.Option("--step", min=1, help="row step in seconds (default: the most frequent "
                                             f"step of the first {DECIDE_ROWS} rows)")] = None,
) -> None:
    """forumpulse detect series --input CSV [--scores]: events (JSON lines) or per-row scores of one series.
    Streaming: what is printed for row t uses rows <= t only."""
    import sys
    from zoneinfo import ZoneInfo

    from forumpulse.detectors.calendar import SiteCalendar
    from forumpulse.detectors.traffic import load_rules, score_params, seasonal_params
    from forumpulse.pipeline.cli import check_inputs

    if mode not in MODES:
        raise typer.BadParameter(f"must be one of {', '.join(MODES)}", param_hint="--mode")
    try:
        ZoneInfo(timezone)
    except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        raise typer.BadParameter(f"unknown time zone {timezone!r} (an IANA name, e.g. Europe/Berlin)",
                                 param_hint="--timezone") from None
    try:
        calendar = SiteCalendar(country)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--country") from None
    check_inputs([input], None)
    try:
        rules = load_rules(rules_file)
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {exc.filename}: {exc.strerror}", param_hint="--rules") from None
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--rules") from None
    notes: list[str] = []
    try:
        ts, vals = read_series_csv(input, notes)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    notes += series_notes(ts, vals, step, "generic" if scores else mode, score_params(rules).min_history)
    for note in notes:
        print(f"note: {'<stdin>' if input == '-' else input}: {note}", file=sys.stderr)
    if scores:
        sc = anomaly_scores(vals, score_params(rules), ts if len(ts) > 1 else None, step)  # as in the NAB evaluation
        print("timestamp,value,score")
        for t, v, s in zip(ts, vals, sc, strict=True):
            # floored, not rounded: a score held under the alarm (0.4999999...) must not print as 0.500000
            print(f"{_iso(t)},{'' if np.isnan(v) else repr(float(v))},{math.floor(s * 1e6) / 1e6:.6f}")
        return
    for d in series_events(ts, vals, timezone, calendar, seasonal_params(rules), score_params(rules),
                           mode, step=step):
        print(d.to_json())
