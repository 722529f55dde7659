"""Relative Entropy re-implemented (``detectors/nab_baseline.py``): it reproduces NAB's published raw output when
given the file's range in advance, as NAB's runner gives it, and is streaming without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from forumpulse.detectors.nab_baseline import WINDOW, relative_entropy_scores

RAW = sorted((Path(__file__).parent / "fixtures" / "nab" / "relativeEntropy").glob("*/relativeEntropy_*.csv"))


def test_fixture_files_present() -> None:
    assert len(RAW) == 5


@pytest.mark.parametrize("path", RAW, ids=lambda p: p.name)
def test_file_range_in_advance_reproduces_the_published_raw_output(path: Path) -> None:
    df = pd.read_csv(path)
    v = df["value"].to_numpy(dtype=float)
    published = df["anomaly_score"].to_numpy(dtype=float)
    ours = relative_entropy_scores(v, (float(v.min()), float(v.max())))
    assert len(ours) == len(published)
    assert np.array_equal(ours, published), f"{int((ours != published).sum())} rows differ"


@pytest.mark.parametrize("path", RAW, ids=lambda p: p.name)
def test_streaming_mode_uses_only_rows_up_to_t(path: Path) -> None:
    v = pd.read_csv(path)["value"].to_numpy(dtype=float)
    full = relative_entropy_scores(v)
    for cut in (WINDOW + 5, len(v) // 3, len(v) // 2):
        assert np.array_equal(relative_entropy_scores(v[:cut]), full[:cut])
        # rows after the cut replaced by anything: rows before it unchanged
        altered = v.copy()
        altered[cut:] = v.max() * 10 + 1
        assert np.array_equal(relative_entropy_scores(altered)[:cut], full[:cut])


def test_range_in_advance_is_look_ahead() -> None:
    """What the protocol check measures: with the whole file's range, early rows' scores depend on later rows;
    on at least one fixture file the scores of its first half change when the second half is cut off."""
    changed = 0
    for path in RAW:
        v = pd.read_csv(path)["value"].to_numpy(dtype=float)
        half = len(v) // 2
        whole = relative_entropy_scores(v, (float(v.min()), float(v.max())))[:half]
        cut = relative_entropy_scores(v[:half], (float(v[:half].min()), float(v[:half].max())))
        changed += int(not np.array_equal(whole, cut))
    assert changed >= 1


def test_binary_scores_and_edge_cases() -> None:
    assert relative_entropy_scores([]).shape == (0,)
    assert not relative_entropy_scores(np.full(200, 3.0)).any()  # one value: no range, nothing scored
    assert not relative_entropy_scores(np.arange(WINDOW - 1, dtype=float)).any()  # no full window yet
    rng = np.random.default_rng(4)
    v = np.concatenate([rng.normal(0, 1, 600), rng.normal(8, 1, 300)])
    s = relative_entropy_scores(v, (float(v.min()), float(v.max())))
    assert set(np.unique(s)) <= {0.0, 1.0}
    # the new level is a distribution no hypothesis holds: an alarm within a window of the change
    assert s[600:600 + WINDOW].any()
    assert not s[WINDOW:550].all()
