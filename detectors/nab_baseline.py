"""A published NAB detector, re-implemented here, to measure what NAB's protocol gives away.

NAB's runner hands every detector the **whole file's minimum and maximum** (and its length) before the first
row (``AnomalyDetector.__init__`` in NAB's ``nab/detectors/base.py`` sets ``inputMin`` / ``inputMax`` from the
file).  The published leaders use them: HTM sizes its encoder from them, CAD OSE, Relative Entropy and ARTime
quantise on that range, ARTime and CAD OSE also take the file's length.  Issue #4 asks for a *streaming* score —
row t may use rows <= t only — so our detector cannot know a file's range in advance.  How much that is worth
on NAB is measured here on the published detector whose per-row raw output our NAB data holds: **Relative
Entropy** (Wang et al., "Statistical techniques for online anomaly detection in data centers", 2011, as run in
NAB: 5 bins, a window of 52 rows, the chi-squared 0.99 point with 4 degrees of freedom; a window that agrees
with a stored hypothesis is normal — NAB's "seen often enough" count of 1 is below every count after an agreement,
so that rule never fires and is left out here).

:func:`relative_entropy_scores` given ``value_range`` = the file's (min, max) reproduces NAB's published
``relativeEntropy`` raw output row for row (``tests/test_nab_baseline.py``: five files in the fixtures; all
365,558 rows of NAB v1.0 in the evaluation).  Without it, the range is the running minimum and maximum of the rows
seen so far — the same detector, streaming.  The evaluation (``--only nab``) scores both.

Guarantees: deterministic; pure (no state between calls); without ``value_range`` streaming (the score of row t
does not change when rows after t are removed or altered).  With ``value_range`` it is *not* streaming whenever
the range comes from the file itself — that is the point.  Scores are 0.0 or 1.0 (the detector is binary).
Not a product detector: nothing in the pipeline uses it.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats

BINS = 5
WINDOW = 52
# NAB's threshold: the 0.99 point of chi-squared with BINS - 1 degrees of freedom.
THRESHOLD = float(stats.chi2.isf(0.01, BINS - 1))


def _bins(values: npt.NDArray[np.float64], lo: float, step: float) -> npt.NDArray[np.int64]:
    # ceil((v - lo) / step) runs 0..BINS; a histogram of unit bins over [0, BINS] (NAB's) puts k in bin k and
    # BINS, the file's maximum, in the last bin.
    k = np.ceil((values - lo) / step)
    return np.clip(k, 0, BINS - 1).astype(np.int64)


def relative_entropy_scores(values: npt.ArrayLike, value_range: tuple[float, float] | None = None
                            ) -> npt.NDArray[np.float64]:
    """One score per row, 0.0 or 1.0.

    ``value_range=(lo, hi)``: quantise every window on that fixed range (NAB's protocol passes the file's own
    min and max).  ``None``: quantise the window ending at row t on the min and max of rows <= t (streaming).
    Rows before the first full window, and rows while the range is a single value, score 0."""
    v = np.asarray(values, dtype=np.float64)
    n = len(v)
    out = np.zeros(n)
    if value_range is None:
        lows = np.minimum.accumulate(v) if n else v
        highs = np.maximum.accumulate(v) if n else v
    hyps = np.empty((0, BINS))
    counts: npt.NDArray[np.int64] | None = None
    cur: tuple[float, float] | None = None
    for t in range(WINDOW - 1, n):
        lo, hi = (float(lows[t]), float(highs[t])) if value_range is None else value_range
        step = (hi - lo) / BINS
        if step == 0.0:
            continue
        if counts is None or cur != (lo, hi):
            # (Re)count the whole window: first window, or the running range moved.
            counts = np.bincount(_bins(v[t + 1 - WINDOW:t + 1], lo, step), minlength=BINS)
            cur = (lo, hi)
        else:
            counts[_bins(v[t - WINDOW:t - WINDOW + 1], lo, step)[0]] -= 1
            counts[_bins(v[t:t + 1], lo, step)[0]] += 1
        p = counts / WINDOW
        if not len(hyps):
            hyps = p[None, :].copy()
            continue
        stat = 2 * WINDOW * _kl_rows(p, hyps)
        if not (stat < THRESHOLD).any():
            # every stored hypothesis rejected: anomalous, and the window becomes a hypothesis
            out[t] = 1.0
            hyps = np.vstack([hyps, p])
    return out


def _kl_rows(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """KL(p || q_i) for every row q_i (natural log); inf where q_i is 0 on a bin p uses."""
    used = p > 0
    pu, qu = p[used], q[:, used]
    with np.errstate(divide="ignore"):
        terms = pu * np.log(pu / qu)
    kl = terms.sum(axis=1)
    kl[(qu == 0).any(axis=1)] = math.inf
    return np.asarray(kl, dtype=np.float64)
