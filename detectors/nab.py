"""Numenta Anomaly Benchmark (NAB v1.0) scorer, written from the published rules.

Rules (numenta/NAB ``nab/sweeper.py``, ``nab/runner.py``; summarised in ``NAB_SCORING_CONSTANTS.json``):

* probation: the first ``min(floor(0.15·n), 0.15·5000)`` rows of a file are ignored (no TP, FP or window);
* a window's rows carry ``f(y)·tpWeight/f(-1)`` with ``y = -(right - i + 1)/width`` (earliest row scores most),
  ``f(y) = 2·sigmoid(-5y) - 1`` (``-1`` when ``y > 3``);
* a row outside windows carries ``-fpWeight`` before the first window and ``f(|i - prevRight|/(prevWidth-1))·fpWeight``
  after one;
* at a threshold ``T`` the detections are the rows with ``score >= T``; a file's score is the sum of its FP rows'
  weights plus, per window, the best detection's weight or ``-fnWeight`` when the window has no detection;
* normalised score ``100·(S - S_null)/(S_perfect - S_null)`` with ``S_null = -fnWeight·N`` and
  ``S_perfect = tpWeight·N`` over the ``N`` windows of the scored files;
* the threshold is optimised per profile over the whole corpus.  NAB uses a local search (``nab/optimizer.py``);
  :func:`optimise_threshold` sweeps every distinct score exactly, so its optimum is never below NAB's.

Guarantees: pure functions of (timestamps, scores, windows, profile); verified in ``tests/test_nab_scorer.py`` by
reproducing the published ``relativeEntropy`` per-file scores and TP/TN/FP/FN counts from its raw output.
Misuse: window limits must be row timestamps of the file (as in NAB's label files); limits that fall between rows
are snapped inwards (first row at/after the start, last row at/before the end).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

PROBATION_PERCENT = 0.15
PROFILES: dict[str, dict[str, float]] = {
    "standard": {"tpWeight": 1.0, "fnWeight": 1.0, "fpWeight": 0.11, "tnWeight": 1.0},
    "reward_low_FP_rate": {"tpWeight": 1.0, "fnWeight": 1.0, "fpWeight": 0.22, "tnWeight": 1.0},
    "reward_low_FN_rate": {"tpWeight": 1.0, "fnWeight": 2.0, "fpWeight": 0.11, "tnWeight": 1.0},
}

FloatArray = npt.NDArray[np.float64]


def scaled_sigmoid(y: float) -> float:
    """NAB's ``scaledSigmoid``: ``2·sigmoid(-5y) - 1``, and ``-1`` for ``y > 3``."""
    if y > 3.0:
        return -1.0
    return 2.0 / (1.0 + math.exp(5.0 * y)) - 1.0


def probation_rows(n: int, percent: float = PROBATION_PERCENT) -> float:
    """Rows ``i < probation_rows(n)`` are ignored (NAB ``_getProbationaryLength``)."""
    return min(math.floor(percent * n), percent * 5000)


@dataclass(frozen=True)
class RowWeights:
    """Per-row scoring data of one file for one profile.

    ``weight[i]``: what a detection at row i is worth; ``window[i]``: window index, ``-1`` outside windows,
    ``-2`` in probation.  ``n_windows`` counts the windows that have at least one non-probation row.
    """

    weight: FloatArray
    window: npt.NDArray[np.int64]
    n_windows: int
    fn_weight: float


def window_indices(timestamps: Sequence[np.datetime64] | npt.NDArray[np.datetime64],
                   windows: Iterable[Sequence[str]]) -> list[tuple[int, int]]:
    """Row index limits (inclusive) of each ``[start, end]`` window given as timestamp strings."""
    ts = np.asarray(timestamps, dtype="datetime64[ms]")
    out = []
    for start, end in windows:
        lo = int(np.searchsorted(ts, np.datetime64(start.replace(" ", "T"), "ms"), side="left"))
        hi = int(np.searchsorted(ts, np.datetime64(end.replace(" ", "T"), "ms"), side="right")) - 1
        if hi >= lo:
            out.append((lo, hi))
    return out


def row_weights(n: int, limits: Sequence[tuple[int, int]], profile: str = "standard") -> RowWeights:
    """Scoring weights of every row of an ``n``-row file with windows at row ``limits`` (sorted, inclusive)."""
    cost = PROFILES[profile]
    tp, fp = cost["tpWeight"], cost["fpWeight"]
    max_tp = scaled_sigmoid(-1.0)
    weight = np.empty(n, dtype=np.float64)
    window = np.full(n, -1, dtype=np.int64)
    prev_right: int | None = None
    prev_width = 0.0
    cursor = 0
    for w, (lo, hi) in enumerate(sorted(limits)):
        width = float(hi - lo + 1)
        for i in range(cursor, lo):  # rows before this window
            weight[i] = -fp if prev_right is None else scaled_sigmoid(abs(prev_right - i) / (prev_width - 1)) * fp
        for i in range(lo, hi + 1):
            weight[i] = scaled_sigmoid(-(hi - i + 1) / width) * tp / max_tp
            window[i] = w
        prev_right, prev_width, cursor = hi, width, hi + 1
    for i in range(cursor, n):
        weight[i] = -fp if prev_right is None else scaled_sigmoid(abs(prev_right - i) / (prev_width - 1)) * fp
    prob = probation_rows(n)
    idx = np.arange(n)
    weight[idx < prob] = 0.0
    window[idx < prob] = -2
    n_windows = len({int(x) for x in window[window >= 0]})
    return RowWeights(weight, window, n_windows, cost["fnWeight"])


@dataclass(frozen=True)
class FileScore:
    score: float
    tp: int
    tn: int
    fp: int
    fn: int
    total: int


def score_file(scores: npt.ArrayLike, rw: RowWeights, threshold: float) -> FileScore:
    """Raw NAB score and counts of one file at ``threshold`` (detection = ``score >= threshold``)."""
    s = np.asarray(scores, dtype=np.float64)
    det = s >= threshold
    scored = rw.window != -2
    in_win = rw.window >= 0
    fp_rows = det & scored & ~in_win
    total = float(rw.weight[fp_rows].sum())
    for w in np.unique(rw.window[in_win]):
        hit = det & (rw.window == w)
        total += float(rw.weight[hit].max()) if hit.any() else -rw.fn_weight
    tp = int((det & in_win).sum())
    fp = int(fp_rows.sum())
    return FileScore(total, tp, int((~det & scored & ~in_win).sum()), fp, int((~det & in_win).sum()), len(s))


def null_and_perfect(n_windows: int, profile: str) -> tuple[float, float]:
    cost = PROFILES[profile]
    return -cost["fnWeight"] * n_windows, cost["tpWeight"] * n_windows


def normalise(raw: float, n_windows: int, profile: str) -> float:
    """``100·(S - S_null)/(S_perfect - S_null)``; 0 for a set without windows."""
    null, perfect = null_and_perfect(n_windows, profile)
    return 0.0 if perfect == null else 100.0 * (raw - null) / (perfect - null)


def optimise_threshold(files: Sequence[tuple[npt.ArrayLike, RowWeights]]) -> tuple[float, float]:
    """Exact threshold sweep over a corpus: returns ``(threshold, raw corpus score)`` maximising the score.

    Every distinct score is a candidate (detections = ``score >= T``); ties keep the highest threshold.
    O(n log n) in the total number of rows.
    """
    all_s: list[FloatArray] = []
    all_w: list[FloatArray] = []
    all_k: list[npt.NDArray[np.int64]] = []
    base = 0.0
    offset = 0
    for scores, rw in files:
        s = np.asarray(scores, dtype=np.float64)
        keep = rw.window != -2
        k = rw.window[keep].copy()
        k[k >= 0] += offset
        offset += int(rw.window.max(initial=-1)) + 1
        all_s.append(s[keep])
        all_w.append(rw.weight[keep])
        all_k.append(k)
        base -= rw.fn_weight * rw.n_windows
    s = np.concatenate(all_s) if all_s else np.empty(0)
    w = np.concatenate(all_w) if all_w else np.empty(0)
    k = np.concatenate(all_k) if all_k else np.empty(0, dtype=np.int64)
    order = np.argsort(-s, kind="stable")
    s, w, k = s[order], w[order], k[order]
    best_t, best = math.inf, base  # threshold above every score: no detections = null score
    current = base
    win_best: dict[int, float] = {}
    fn_default = files[0][1].fn_weight if files else 1.0
    sl, wl, kl = s.tolist(), w.tolist(), k.tolist()
    n = len(sl)
    for i in range(n):
        wi, ki = wl[i], kl[i]
        if ki < 0:
            current += wi
        else:
            old = win_best.get(ki, -fn_default)
            if wi > old:
                win_best[ki] = wi
                current += wi - old
        if (i == n - 1 or sl[i + 1] != sl[i]) and current > best:
            best, best_t = current, sl[i]
    return best_t, best


def load_windows(path: str | Path) -> dict[str, list[list[str]]]:
    """NAB ``combined_windows.json``: relative file path → list of ``[start, end]`` timestamp strings."""
    data: dict[str, list[list[str]]] = json.loads(Path(path).read_text())
    return data


@dataclass(frozen=True)
class CorpusResult:
    profile: str
    threshold: float
    raw: float
    normalised: float
    n_windows: int
    per_file: Mapping[str, FileScore]


def score_corpus(files: Mapping[str, tuple[npt.ArrayLike, RowWeights]], profile: str,
                 threshold: float | None = None) -> CorpusResult:
    """Score a corpus at ``threshold`` (or at the exact optimum when ``None``).  Weights must be for ``profile``."""
    if threshold is None:
        threshold, _ = optimise_threshold(list(files.values()))
    per = {name: score_file(s, rw, threshold) for name, (s, rw) in files.items()}
    raw = sum(f.score for f in per.values())
    n_win = sum(rw.n_windows for _, rw in files.values())
    return CorpusResult(profile, threshold, raw, normalise(raw, n_win, profile), n_win, per)
