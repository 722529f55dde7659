"""Monitoring-style families for the development corpus of the generic series score (``evaluate --only dev
--dev-monitoring``): generic shapes common in operations data, generated here from seeds and written from first
principles (not modelled on any NAB file).  Each family makes series with labelled anomaly starts (NAB-style
windows, :func:`forumpulse.detectors.evaluate._nab_limits`) and, in most families, *benign* events that are not
labelled and must not alarm: isolated spikes, self-exciting bursts, slow drifts.

Families (``FAMILIES``):

* ``cpu`` — server CPU %: daily cycle, AR(1) noise, benign 1–2-row spikes; anomalies: a regime change (level and
  noise change for good) or saturation (stuck near 100% for 50–300 rows).
* ``latency`` — log-normal response time with a heavy tail (rare slow rows are benign); anomalies: the median
  doubles for 100–500 rows, or a persistent 1.6× step.
* ``hawkes`` — bursty event counts (a discretised self-exciting process: each event raises the next rows' rate,
  so bursts come from nowhere and fade); anomalies: an outage (rate to 5% for 60–400 rows) or a sustained surge
  (base rate 4× for 200–600 rows).
* ``negbin`` — over-dispersed counts (negative binomial, dispersion 4–10) with a daily cycle; anomalies: the day's
  peak does not come, a drop to zero (30–200 rows), a step to half the level.
* ``sawtooth`` — a periodic job (disk or queue filling up, emptied every P rows); anomalies: the job stops (the
  level keeps rising past its usual maximum), or its period halves / doubles.
* ``cron`` — a periodic spike on a flat noisy base (an hourly batch job); anomalies: the spikes stop, or their
  period changes.
* ``drift`` — a slowly drifting level (benign: a random walk of the trend); anomalies: an abrupt step (4–8× the
  row-to-row noise) or a short burst.
* ``variance`` — stationary noise whose variance changes: 3× wider for good, or 3× narrower for good.
* ``spiky`` — a signal with frequent benign single-row spikes (2–6 per 1000 rows, 6–12 σ); anomalies: a sustained
  level shift (3–5 σ) or a slow bump over 50–150 rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Rng = np.random.Generator
#: family -> generator(rng, rows, row step in seconds) -> (values, anomaly start rows)
Maker = Callable[[Rng, int, int], tuple[FloatArray, list[int]]]


def _starts(rng: Rng, n: int, k: int, gap: int = 600) -> list[int]:
    """``k`` anomaly starts after the first 30% of the rows (NAB's probation is 15%), ``gap`` rows apart."""
    out: list[int] = []
    lo, hi = int(0.3 * n), n - 300
    for _ in range(200):
        if len(out) == k:
            break
        s = int(rng.integers(lo, hi))
        if all(abs(s - o) >= gap for o in out):
            out.append(s)
    return sorted(out)


def _ar1(rng: Rng, n: int, phi: float, sd: float) -> FloatArray:
    e = rng.normal(0.0, sd, n)
    out = np.empty(n)
    acc = 0.0
    for i in range(n):
        acc = phi * acc + e[i]
        out[i] = acc
    return out


def _daily(n: int, step: int) -> FloatArray:
    t = np.arange(n)
    return np.asarray(np.sin(2 * np.pi * t * step / 86400.0 - np.pi / 2), dtype=np.float64)


def _cpu(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    x = 35 + 15 * _daily(n, step) + _ar1(rng, n, 0.7, 3.0)
    for s in rng.choice(n, size=max(1, n // 700), replace=False):  # benign spikes (a deploy, a GC pause)
        x[s: s + int(rng.integers(1, 3))] += rng.uniform(20, 40)
    starts = _starts(rng, n, int(rng.integers(1, 3)))
    for s in starts:
        if rng.random() < 0.5:
            x[s:] += rng.uniform(12, 20) * rng.choice([-1, 1]) + _ar1(rng, n - s, 0.7, 3.0)
        else:
            m = int(rng.integers(50, 300))
            x[s: s + m] = 97 + rng.normal(0, 1.0, len(x[s: s + m]))
    return np.clip(x, 0, 100), starts


def _latency(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    med = np.full(n, 120.0) * (1 + 0.15 * _daily(n, step))
    starts = _starts(rng, n, int(rng.integers(1, 3)))
    for s in starts:
        if rng.random() < 0.5:
            med[s: s + int(rng.integers(100, 500))] *= 2.0
        else:
            med[s:] *= 1.6
    x = med * np.exp(rng.normal(0, 0.25, n))
    tail = rng.random(n) < 0.01  # benign slow rows
    x[tail] *= rng.uniform(2, 5, int(tail.sum()))
    return x, starts


def _hawkes(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    mu = (4 + 2 * _daily(n, step)).clip(0.5)
    starts = _starts(rng, n, int(rng.integers(1, 3)))
    for s in starts:
        if rng.random() < 0.5:
            mu[s: s + int(rng.integers(60, 400))] *= 0.05
        else:
            mu[s: s + int(rng.integers(200, 600))] *= 4.0
    alpha, decay = 0.15, 0.7  # branching ratio alpha / (1 - decay) = 0.5: bursts fade
    x = np.zeros(n)
    exc = 0.0
    for i in range(n):
        x[i] = rng.poisson(min(mu[i] + exc, 500.0))
        shock = rng.uniform(10, 40) if rng.random() < 0.004 else 0.0  # a burst from outside (benign)
        exc = decay * exc + alpha * x[i] + shock
    return x, starts


def _negbin(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    day = 86400 // step
    mean = 20 * (1 + 0.7 * _daily(n, step))
    starts = _starts(rng, n, int(rng.integers(1, 3)), gap=day + 100)
    for j, s in enumerate(starts):
        u = rng.random()
        if u < 0.4:  # the day's peak does not come: a third of the day's level over its middle half
            s = (s // day) * day + day // 4
            starts[j] = s
            mean[s: s + day // 2] = 20 * 0.3
        elif u < 0.7:
            mean[s: s + int(rng.integers(30, 200))] = 0.0
        else:
            mean[s:] *= 0.5
    r = float(rng.uniform(4, 10))
    p = r / (r + np.maximum(mean, 1e-9))
    x = np.where(mean > 0, rng.negative_binomial(r, p), 0).astype(float)
    return x, starts


def _sawtooth(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    period = int(rng.integers(48, 200))
    slope = rng.uniform(0.5, 2.0)
    x = np.zeros(n)
    (s,) = _starts(rng, n, 1)
    kind = int(rng.integers(3))  # 0: the job stops at s; 1 / 2: its period halves / doubles
    acc, since = 10.0, 0
    for i in range(n):
        p_now = period if (i < s or kind == 0) else (period // 2 if kind == 1 else period * 2)
        stopped = kind == 0 and i >= s
        since += 1
        if since >= p_now and not stopped:
            acc, since = 10.0, 0
        acc += slope
        x[i] = acc
    x += rng.normal(0, slope, n)
    # label where the change shows: the job's first run due at or after s (runs at rows = period - 1 mod period)
    first = s + (period - 1 - s) % period
    return x, [min(first, n - 250)]


def _cron(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    period = int(rng.choice([12, 24, 36, 72]))
    width = int(rng.integers(1, 4))
    x = 20 + rng.normal(0, 2, n)
    (s,) = _starts(rng, n, 1)
    kind = int(rng.integers(3))
    t = 0
    while t < n and not (kind == 0 and t >= s):  # kind 0: the job stops at s; 1 / 2: its period halves / doubles
        x[t: t + width] += 30 + rng.normal(0, 3)
        t += period if t < s or kind == 0 else (period // 2 if kind == 1 else period * 2)
    first = s + (-s) % period  # the first run due at or after s
    return x, [min(first, n - 250)]


def _drift(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    trend = np.cumsum(np.cumsum(rng.normal(0, 0.0001, n)))  # benign: a smooth random drift
    x = 100 + trend + rng.normal(0, 1.0, n)
    starts = _starts(rng, n, int(rng.integers(1, 3)))
    for s in starts:
        if rng.random() < 0.6:
            x[s:] += rng.uniform(4, 8) * 1.4 * rng.choice([-1, 1])
        else:
            x[s: s + int(rng.integers(3, 12))] += rng.uniform(6, 12) * 1.4
    return x, starts


def _variance(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    sd = np.full(n, 2.0)
    (s,) = _starts(rng, n, 1)
    sd[s:] *= 3.0 if rng.random() < 0.6 else 1 / 3
    return 50 + 5 * _daily(n, step) + rng.normal(0, 1, n) * sd, [s]


def _spiky(rng: Rng, n: int, step: int) -> tuple[FloatArray, list[int]]:
    x = 30 + 6 * _daily(n, step) + rng.normal(0, 1.5, n)
    k = int(n * rng.uniform(0.002, 0.006))
    idx = rng.choice(n, size=k, replace=False)
    x[idx] += rng.uniform(6, 12, k) * 1.5 * rng.choice([-1, 1], k)
    starts = _starts(rng, n, int(rng.integers(1, 3)))
    for s in starts:
        if rng.random() < 0.5:
            x[s:] += rng.uniform(3, 5) * 1.5 * rng.choice([-1, 1])
        else:
            m = int(rng.integers(50, 150))
            seg = len(x[s: s + m])
            x[s: s + seg] += rng.uniform(4, 7) * 1.5 * np.sin(np.pi * np.arange(seg) / seg)
    return x, starts


FAMILIES: dict[str, Maker] = {
    "cpu": _cpu, "latency": _latency, "hawkes": _hawkes, "negbin": _negbin, "sawtooth": _sawtooth,
    "cron": _cron, "drift": _drift, "variance": _variance, "spiky": _spiky,
}


def monitoring_series(seed: int = 11, per_family: int = 6) -> dict[str, tuple[Any, FloatArray, list[int]]]:
    """``name -> (timestamps, values, anomaly start rows)``: ``per_family`` series of every family, 4,000–8,000
    rows at 5 minutes (every third at 1 minute, every fifth at 10 minutes), deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    out: dict[str, tuple[Any, FloatArray, list[int]]] = {}
    for fam, make in FAMILIES.items():
        for j in range(per_family):
            step = 60 if j % 3 == 2 else (600 if j % 5 == 4 else 300)
            n = int(rng.integers(4000, 8000))
            x, starts = make(rng, n, step)
            ts = np.datetime64("2021-03-01T00:00") + np.arange(n) * np.timedelta64(step, "s")
            out[f"monitoring/{fam}_{j}"] = (ts, np.asarray(x, dtype=np.float64), sorted(starts))
    return out
