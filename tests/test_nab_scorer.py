"""The NAB scorer reproduces the published relativeEntropy per-file scores from its raw output."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from forumpulse.detectors import nab

FIX = Path(__file__).parent / "fixtures" / "nab"
RAW = sorted((FIX / "relativeEntropy").glob("*/relativeEntropy_*.csv"))
WINDOWS = nab.load_windows(FIX / "combined_windows.json")


def _published(profile: str) -> dict[str, dict[str, str]]:
    with open(FIX / "relativeEntropy" / f"relativeEntropy_{profile}_scores.csv") as fh:
        return {r["File"]: r for r in csv.DictReader(fh) if r["File"]}


def _load(path: Path) -> tuple[str, pd.DataFrame]:
    name = f"{path.parent.name}/{path.name.removeprefix('relativeEntropy_')}"
    return name, pd.read_csv(path)


def test_fixture_set_is_complete() -> None:
    assert len(RAW) == 5, "expected five raw relativeEntropy outputs in tests/fixtures/nab"


@pytest.mark.parametrize(("path", "profile"), list(itertools.product(RAW, nab.PROFILES)),
                         ids=lambda x: x.name if isinstance(x, Path) else x)
def test_reproduces_published_file_score(path: Path, profile: str) -> None:
    name, df = _load(path)
    pub = _published(profile)[name]
    ts = pd.to_datetime(df["timestamp"]).to_numpy()
    rw = nab.row_weights(len(df), nab.window_indices(ts, WINDOWS[name]), profile)
    got = nab.score_file(df["anomaly_score"].to_numpy(), rw, float(pub["Threshold"]))
    assert got.score == pytest.approx(float(pub["Score"]), abs=1e-9)
    assert (got.tp, got.tn, got.fp, got.fn, got.total) == tuple(
        int(pub[k]) for k in ("TP", "TN", "FP", "FN", "Total_Count"))
    # NAB's S(t) column of the same profile sums to the file score.
    assert df[f"S(t)_{profile}"].sum() == pytest.approx(got.score, abs=1e-6)


def test_null_baseline_counts_every_window() -> None:
    n_windows = sum(len(v) for v in WINDOWS.values())
    with open(FIX / "null_standard_scores.csv") as fh:
        totals = next(r for r in csv.DictReader(fh) if r["Detector"] == "Totals")
    assert nab.null_and_perfect(n_windows, "standard")[0] == pytest.approx(float(totals["Score"]))


def test_subset_normalisation_matches_published_realtweets() -> None:
    with open(FIX / "ARTime_standard_scores.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["File"].startswith("realTweets/")]
    raw = sum(float(r["Score"]) for r in rows)
    n_windows = sum(len(WINDOWS[r["File"]]) for r in rows)
    assert round(nab.normalise(raw, n_windows, "standard"), 1) == 81.8  # REFERENCE.md anchor


def test_sigmoid_edges() -> None:
    assert nab.scaled_sigmoid(-1.0) == pytest.approx(0.98661, abs=1e-5)
    assert nab.scaled_sigmoid(0.0) == 0.0
    assert nab.scaled_sigmoid(3.5) == -1.0


def test_optimiser_matches_brute_force() -> None:
    rng = np.random.default_rng(7)
    files = []
    for n in (400, 700, 1000):
        lo = int(rng.integers(n // 3, n - 60))
        rw = nab.row_weights(n, [(lo, lo + 40)], "standard")
        files.append((np.round(rng.random(n), 2), rw))
    t, best = nab.optimise_threshold(files)
    cands = np.unique(np.concatenate([s for s, _ in files]))
    brute = max(sum(nab.score_file(s, rw, c).score for s, rw in files) for c in cands)
    assert best == pytest.approx(brute)
    assert sum(nab.score_file(s, rw, t).score for s, rw in files) == pytest.approx(best)
