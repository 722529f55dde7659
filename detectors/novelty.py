"""Contextual novelty of a series: how much of the current *context* (the quantised value and its recent
trajectory) has never been seen before.

Idea (published as the "contextual anomaly detector" family, e.g. CAD OSE in NAB; written here from the idea, not
from any detector's source): map each row's value to a discrete level on a grid, and call the last ``k`` levels
(``k = 1 .. orders``) the row's contexts.  A context seen before is familiar; a context never seen before is new.
The raw novelty of row ``t`` is the share of its contexts that are new, after which they are remembered.  A
repeated pattern (a daily cycle, a plateau, a regular sawtooth) stops being novel once it has been seen; a new
shape — a level never reached, a known level reached by a never-seen path, a cycle that does not happen — is
novel at its first rows, i.e. early, which is what NAB's scoring rewards.

The grid: level width ``(hi - lo) / levels`` from the range ``[lo, hi]`` of the rows before ``t`` (expanding, so
the grid never uses a later row); a value outside that range gets a level outside ``0 .. levels - 1`` (a value far
beyond anything seen is a level never seen).  With timestamps whose row step divides a day, contexts of the last
``1 .. phase_orders`` levels also carry the time of day (``phase_buckets`` buckets per UTC day, or one per row when
rows are longer): "level 2 at 17:00" is new on a day whose peak does not come, even if level 2 is common at night.
(Tried on the development corpus and not kept: a frozen grid after 300 / 1000 rows, contexts of quantised
row-to-row changes, "familiar" only after 2-5 sightings, separate likelihoods for plain and time-of-day contexts.)

The raw novelty is turned into a score by the same "anomaly likelihood" as the rest of
:mod:`forumpulse.detectors.series`: the ``short``-row mean of the novelty against the mean / std (floored at
``sd_floor``) of that mean over the previous ``window`` rows, Gaussian upper tail, reported as
``min(1, -log10(p)/10)``.  A series that is novel all the time (white noise on a fine grid) must become *more*
novel than usual to score; a regular series scores as soon as something new appears.

Streaming: row ``t`` uses rows ``<= t`` only; deterministic (no randomness).  O(n · orders) dictionary look-ups.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class NoveltyParams:
    """Defaults = the shipped ``series.novelty_*`` rules (v7)."""

    levels: int = 8           # grid levels over the range seen so far
    orders: int = 2           # contexts of the last 1 .. orders levels
    window: int = 2000        # rows of history of the averaged novelty for its tail probability
    short: int = 3            # rows of novelty averaged
    sd_floor: float = 0.1     # floor of the std of the averaged-novelty history
    min_history: int = 30     # rows before any score is non-zero
    phase_buckets: int = 48   # > 0 (with phases given): contexts also carry the time of day in this many buckets
    phase_orders: int = 2     # ... for the last 1 .. phase_orders levels


#: a range narrower than this share of the values' magnitude is no range: a constant 4.2 that read 4.2000001 once
#: (float rounding) made a grid 1e-8 wide on which every later row was a new context, a full alarm (user trial 40)
REL_WIDTH = 1e-6


class _Grid:
    """Expanding grid: ``levels`` levels over the range of the values seen so far; :meth:`level` places a value
    on the grid of the values *before* it (beyond the range: levels outside ``0 .. levels - 1``), then widens."""

    def __init__(self, levels: int) -> None:
        self.levels = levels
        self.lo = self.hi = float("nan")

    def level(self, v: float) -> int | None:
        """Level of ``v`` (``None`` while the grid has no width: a range under ``REL_WIDTH`` of the values'
        magnitude is float rounding, not a range), then ``v`` joins the range."""
        out: int | None = None
        width = (self.hi - self.lo) / self.levels
        if width * self.levels > REL_WIDTH * max(abs(self.lo), abs(self.hi)):  # False while NaN or 0
            out = math.floor((v - self.lo) / width)
            if out == self.levels and v <= self.hi:
                out = self.levels - 1  # the maximum itself is on the grid
        self.lo = v if math.isnan(self.lo) else min(self.lo, v)
        self.hi = v if math.isnan(self.hi) else max(self.hi, v)
        return out


def raw_novelty(values: npt.ArrayLike, p: NoveltyParams | None = None,
                phases: npt.NDArray[np.int64] | None = None) -> FloatArray:
    """Share of row ``t``'s contexts never seen before row ``t`` (module docstring); 0 while the grid has no width.
    Missing values are carried forward (a missing value is no evidence)."""
    p = p or NoveltyParams()
    x = pd.Series(np.asarray(values, dtype=np.float64)).ffill().fillna(0.0).to_numpy()
    n = len(x)
    out = np.zeros(n)
    seen: set[tuple[int, ...]] = set()
    grid = _Grid(p.levels)
    keep = max(p.orders, p.phase_orders, 1)
    recent: list[int] = []
    for i in range(n):
        s = grid.level(float(x[i]))
        if s is None:
            continue
        recent = [*recent, s][-keep:]
        ctxs = [(0, *recent[-k:]) for k in range(1, min(p.orders, len(recent)) + 1)]
        if phases is not None and phases[i] >= 0:
            ctxs += [(1, int(phases[i]), *recent[-k:]) for k in range(1, min(p.phase_orders, len(recent)) + 1)]
        if ctxs:
            new = 0
            for ctx in ctxs:
                if ctx not in seen:
                    new += 1
                    seen.add(ctx)
            out[i] = new / len(ctxs)
    return out


def trailing_tail_p(r: pd.Series, window: int, short: int, sd_floor: float, min_history: int) -> FloatArray:
    """Gaussian upper-tail probability of the ``short``-row mean of ``r`` against the mean / std (floored at
    ``sd_floor``) of that mean over the previous ``window`` rows; 1 while fewer than ``min_history`` rows of
    history exist.  The one "anomaly likelihood" step of the generic score: :mod:`forumpulse.detectors.series`
    uses it for its surprises and for the layer over its score, this module for the novelty."""
    from scipy.special import ndtr  # scipy ships with statsmodels (a pinned dependency)

    a = r.rolling(short, min_periods=1).mean()
    h = a.shift(1)
    mu = h.rolling(window, min_periods=min_history).mean()
    sd = h.rolling(window, min_periods=min_history).std()
    z = ((a - mu) / np.maximum(sd.fillna(sd_floor), sd_floor)).to_numpy()
    return np.asarray(ndtr(-np.nan_to_num(z, nan=-np.inf)), dtype=np.float64)


def likelihood(r: FloatArray, window: int, short: int, sd_floor: float, min_history: int) -> FloatArray:
    """``min(1, -log10(p)/10)`` of :func:`trailing_tail_p`; 0 for the first ``min_history`` rows."""
    pv = trailing_tail_p(pd.Series(r), window, short, sd_floor, min_history)
    out = np.clip(-np.log10(np.maximum(pv, 1e-300)) / 10.0, 0.0, 1.0)
    out[:min_history] = 0.0
    return np.asarray(out, dtype=np.float64)


def day_phases(sec: npt.NDArray[np.int64], steps: npt.NDArray[np.int64], buckets: int) -> npt.NDArray[np.int64]:
    """Time-of-day bucket of each row: ``buckets`` per UTC day, or one per row step when the step is longer (hourly
    rows: 24); ``-1`` where the row step in force does not divide a day (no time of day to learn)."""
    safe = np.maximum(steps, 1)
    size = np.maximum(86400 // max(buckets, 1), safe)
    ok = (steps > 0) & (86400 % safe == 0)
    return np.where(ok, (sec % 86400) // size, -1).astype(np.int64)


def novelty_scores(values: npt.ArrayLike, p: NoveltyParams | None = None,
                   phases: npt.NDArray[np.int64] | None = None) -> FloatArray:
    """Per-row novelty score in ``[0, 1]`` (likelihood of the raw novelty, module docstring); streaming."""
    p = p or NoveltyParams()
    return likelihood(raw_novelty(values, p, phases if p.phase_buckets > 0 else None), p.window, p.short,
                      p.sd_floor, p.min_history)
