"""CAD OSE re-implemented (``detectors/nab_cad_ose.py``): with the file's range in advance, as NAB's runner gives
it, it reproduces NAB's published ``contextOSE`` raw scores and per-file scores; without it, it is streaming."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest
from forumpulse.detectors import nab, nab_cad_ose
from forumpulse.detectors.nab_cad_ose import (
    STREAMING_REST_PERIOD,
    cad_ose_rebinned_scores,
    cad_ose_scores,
    nab_cad_ose_scores,
    nab_rest_period,
    py2_dict_order,
    py2_tuple_hash,
)

FIXTURES = Path(__file__).parent / "fixtures"
NAME = "realTraffic/occupancy_6005.csv"
DATA = FIXTURES / "nab" / "relativeEntropy" / "realTraffic" / "relativeEntropy_occupancy_6005.csv"
SCORES = FIXTURES / "nab_cad_ose"

# NAB's published raw output, results/contextOSE/realTraffic/contextOSE_occupancy_6005.csv (NAB commit 3a3fe451),
# printed there with 12 significant digits: row -> anomaly_score.
PUBLISHED_ROWS = {
    172: "0", 173: "0.34706122449", 178: "0.205992509363", 206: "0.38298245614", 249: "0.664957264957",
    258: "0.384212018141", 261: "0.889679031328", 262: "0", 333: "0.311591478697", 343: "0.274336283186",
    2259: "0.3359375", 2262: "0.739315448659", 2270: "0.657029857398", 2274: "0.836460855529", 2275: "0",
    2346: "0.25023923445", 2379: "0.277347114556",
}
# results/contextOSE/realAWSCloudwatch/contextOSE_ec2_cpu_utilization_53ea38.csv: rows where the order in which
# potential contexts are made (Python 2's dict order) shows.
EC2 = SCORES / "ec2_cpu_utilization_53ea38.csv"
PUBLISHED_EC2_ROWS = {969: "0.205882352941", 970: "0.171698113208", 977: "0.22206959707"}


@pytest.fixture(scope="module")
def series() -> pd.DataFrame:
    return pd.read_csv(DATA, usecols=["timestamp", "value"])


@pytest.fixture(scope="module")
def nab_scores(series: pd.DataFrame) -> npt.NDArray[np.float64]:
    return nab_cad_ose_scores(series["value"].to_numpy(dtype=float))


def test_fixtures_present() -> None:
    assert DATA.is_file() and EC2.is_file()
    assert len(sorted(SCORES.glob("contextOSE_*_scores.csv"))) == 3


def test_range_in_advance_reproduces_published_raw_scores(nab_scores: npt.NDArray[np.float64]) -> None:
    assert len(nab_scores) == 2380
    assert {row: f"{nab_scores[row]:.12g}" for row in PUBLISHED_ROWS} == PUBLISHED_ROWS
    # NAB's rest period for 2,380 rows: floor(0.15 * 2380) / 5 = 71.4 -> the first 71 rows report 0
    assert nab_rest_period(2380) == pytest.approx(71.4)
    assert not nab_scores[:71].any()
    assert ((nab_scores >= 0) & (nab_scores <= 1)).all()


def _ec2_prefix() -> npt.NDArray[np.float64]:
    """The first 1,000 rows of ec2_cpu_utilization_53ea38 as NAB scores them (the detector is causal once the
    range and rest period are fixed, so a prefix run on the whole file's range scores as the whole file)."""
    v = pd.read_csv(EC2)["value"].to_numpy(dtype=float)
    return cad_ose_scores(v[:1000], (float(v.min()), float(v.max())), rest_period=nab_rest_period(len(v)))


def test_python2_details_decide_published_rows(series: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {row: f"{s:.12g}" for row, s in zip(PUBLISHED_EC2_ROWS, _ec2_prefix()[list(PUBLISHED_EC2_ROWS)],
                                                   strict=True)} == PUBLISHED_EC2_ROWS
    v = series["value"].to_numpy(dtype=float)
    rows = [173, 178, 206, 249, 261]
    head = cad_ose_scores(v[:300], (float(v.min()), float(v.max())), rest_period=nab_rest_period(len(v)))
    assert [f"{head[r]:.12g}" for r in rows] == [PUBLISHED_ROWS[r] for r in rows]
    # insertion order instead of Python 2's dict order: the published rows of ec2_cpu_utilization_53ea38 change
    monkeypatch.setattr(nab_cad_ose, "py2_dict_order", lambda keys: list(keys))
    assert [f"{s:.12g}" for s in _ec2_prefix()[list(PUBLISHED_EC2_ROWS)]] != list(PUBLISHED_EC2_ROWS.values())
    monkeypatch.undo()
    # Python 3's tuple hash instead of Python 2's: ties between neurons go another way, occupancy_6005 changes
    monkeypatch.setattr(nab_cad_ose, "py2_tuple_hash", lambda facts: hash(tuple(facts)))
    other = cad_ose_scores(v[:300], (float(v.min()), float(v.max())), rest_period=nab_rest_period(len(v)))
    assert [f"{other[r]:.12g}" for r in rows] != [PUBLISHED_ROWS[r] for r in rows]


@pytest.mark.parametrize("profile", list(nab.PROFILES))
def test_range_in_advance_reproduces_published_file_score(profile: str, series: pd.DataFrame,
                                                          nab_scores: npt.NDArray[np.float64]) -> None:
    published = pd.read_csv(SCORES / f"contextOSE_{profile}_scores.csv").set_index("File").loc[NAME]
    windows = nab.load_windows(FIXTURES / "nab" / "combined_windows.json")[NAME]
    ts = pd.to_datetime(series["timestamp"]).to_numpy()
    rw = nab.row_weights(len(ts), nab.window_indices(ts, windows), profile)
    got = nab.score_file(nab_scores, rw, float(published["Threshold"]))
    assert (got.tp, got.tn, got.fp, got.fn) == (published["TP"], published["TN"], published["FP"], published["FN"])
    assert got.score == pytest.approx(float(published["Score"]), abs=1e-9)
    assert got.tp + got.fp >= 1  # the file has detections at NAB's threshold: the check can fail


def test_streaming_mode_uses_only_rows_up_to_t(series: pd.DataFrame) -> None:
    v = series["value"].to_numpy(dtype=float)[:500]
    full = cad_ose_scores(v)
    assert full[int(STREAMING_REST_PERIOD):].any()
    for cut in (160, 420):
        assert np.array_equal(cad_ose_scores(v[:cut]), full[:cut])
        for fill in (v.max() * 10 + 1, v.min() - 5):  # later rows far outside the range seen so far
            altered = v.copy()
            altered[cut:] = fill
            assert np.array_equal(cad_ose_scores(altered)[:cut], full[:cut])
    assert not full[:int(STREAMING_REST_PERIOD)].any()


def test_rebinned_streaming_mode(series: pd.DataFrame) -> None:
    """Row t scores as NAB's protocol scores the last row of the file made of rows <= t (rest period fixed)."""
    v = series["value"].to_numpy(dtype=float)[:260]
    rest = 40.0
    s = cad_ose_rebinned_scores(v, rest_period=rest)
    for t in (45, 120, 180, 259):
        prefix = v[:t + 1]
        assert s[t] == cad_ose_scores(prefix, (float(prefix.min()), float(prefix.max())), rest_period=rest)[t]
    assert s[int(rest):].any()
    assert not np.array_equal(s, cad_ose_scores(v, rest_period=rest))  # re-binning changes scores
    altered = v.copy()
    altered[200:] = v.max() * 3
    assert np.array_equal(cad_ose_rebinned_scores(altered, rest_period=rest)[:200], s[:200])


def test_range_in_advance_is_the_look_ahead(series: pd.DataFrame, nab_scores: npt.NDArray[np.float64]) -> None:
    """With a fixed range the detector is causal (a prefix scores as in the whole file); what it knows in advance
    is the range: quantised on the first half's own range, the first half scores differently."""
    v = series["value"].to_numpy(dtype=float)
    half = len(v) // 2
    rest = nab_rest_period(len(v))
    whole_range = (float(v.min()), float(v.max()))
    assert np.array_equal(cad_ose_scores(v[:half], whole_range, rest_period=rest), nab_scores[:half])
    own_range = (float(v[:half].min()), float(v[:half].max()))
    assert own_range != whole_range
    assert not np.array_equal(cad_ose_scores(v[:half], own_range, rest_period=rest), nab_scores[:half])


def test_edge_cases() -> None:
    assert cad_ose_scores([]).shape == (0,)
    assert cad_ose_rebinned_scores([]).shape == (0,)
    assert nab_cad_ose_scores([]).shape == (0,)
    # A flat series (a zero range counts as 7: every row is level 0) has one context, id 0, which the original
    # never updates (it compares ids with False): nothing is ever selected, so every row after the rest period
    # scores (1 - 0 + 0) / 2.  Row 1 made the first context (raw 1.0): rows up to 1 + 9 report 0.
    flat = nab_cad_ose_scores(np.full(300, 2.5))
    assert not flat[:11].any() and (flat[11:] == 0.5).all()
    with pytest.raises(ValueError, match="below the encoding range"):
        cad_ose_scores([1.0, 0.5], (1.0, 2.0))
    rng = np.random.default_rng(7)
    v = np.concatenate([np.tile([0.0, 1.0, 2.0, 3.0], 150), rng.uniform(0, 3, 40)])
    s = cad_ose_scores(v, (0.0, 3.0), rest_period=30)
    assert not s[:30].any()
    assert ((s >= 0) & (s <= 1)).all()
    # a learnt cycle stops surprising it; the noise that follows does
    assert s[400:600].max() < 0.5 < s[600:].max()


def test_python2_hash_and_dict_order() -> None:
    # CPython 2.7 (64-bit) values: hash(()) and hash((1, 2))
    assert py2_tuple_hash(()) == 3527539
    assert py2_tuple_hash((1, 2)) == 3713081631934410656
    assert py2_tuple_hash((2**31 + 5, 3)) != py2_tuple_hash((3, 2**31 + 5))
    # small int keys of a CPython 2 dict: slot order, collisions probe on (8 slots until the 6th key)
    assert py2_dict_order([8, 0]) == [8, 0]
    assert py2_dict_order([0, 8]) == [0, 8]
    assert py2_dict_order([3, 1, 2]) == [1, 2, 3]
    assert py2_dict_order(list(range(12, 0, -1))) == list(range(1, 13))


def test_evaluation_protocol_part_checks_the_published_file_scores(tmp_path: Path, series: pd.DataFrame) -> None:
    """``make eval``'s CAD OSE part on a one-file NAB layout: the NAB-protocol run is checked against the published
    per-file scores (0 of 3 differ), and a changed published score is counted (the check can fail)."""
    import json

    from forumpulse.detectors.evaluate import CAD_MODES, cad_ose_protocol_part

    (tmp_path / "data" / "realTraffic").mkdir(parents=True)
    series.to_csv(tmp_path / "data" / NAME, index=False)
    windows = json.loads((FIXTURES / "nab" / "combined_windows.json").read_text())
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "combined_windows.json").write_text(json.dumps({NAME: windows[NAME]}))
    (tmp_path / "results" / "contextOSE").mkdir(parents=True)
    for profile in nab.PROFILES:
        name = f"contextOSE_{profile}_scores.csv"
        (tmp_path / "results" / "contextOSE" / name).write_text((SCORES / name).read_text())
    run = cad_ose_protocol_part(tmp_path, workers=1)
    assert run is not None and run.detector == "CAD OSE" and run.modes == CAD_MODES[:2]
    assert "0 of 3 file-profile pairs differ" in run.check, run.check
    assert {m for m, _, _ in run.scores} == set(CAD_MODES[:2]) and run.rows == len(series)
    pub = SCORES / "contextOSE_standard_scores.csv"
    df = pd.read_csv(pub)
    df.loc[df["File"] == NAME, "Score"] += 0.5
    df.to_csv(tmp_path / "results" / "contextOSE" / pub.name, index=False)
    again = cad_ose_protocol_part(tmp_path, workers=1)
    assert again is not None and "1 of 3 file-profile pairs differ" in again.check
