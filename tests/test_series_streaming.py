"""``detect series`` keeps its streaming guarantee when later rows differ (row step, integer-ness), emits valid JSON
that meets the ``weblogs.events`` v1 schema, and reads CSVs with a stable sort."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from forumpulse.detectors.series import (
    DECIDE_ROWS,
    Detection,
    ScoreParams,
    anomaly_scores,
    detect_series_command,
    read_series_csv,
    score_events,
    series_events,
    series_periods,
)

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "contracts" / "weblogs.events.v1.schema.json"
T0 = datetime(2026, 1, 5, tzinfo=UTC)


def _no_constant(name: str) -> float:
    raise ValueError(f"not JSON: {name}")


def _strict_lines(out: str) -> list[dict]:
    """Every line parsed as strict JSON (NaN / Infinity rejected) and valid against the events v1 schema."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    events = []
    for line in out.splitlines():
        e = json.loads(line, parse_constant=_no_constant)
        validator.validate(e)
        events.append(e)
    return events


def _daily_5min(days: int = 10, seed: int = 7, shift: bool = True) -> tuple[list[datetime], np.ndarray]:
    """5-minute series with a strong daily cycle (the day model is what scores it) and a level shift on day 8."""
    n = 288 * days
    ts = [T0 + timedelta(minutes=5 * i) for i in range(n)]
    t = np.arange(n)
    x = 100 + 60 * np.sin(2 * np.pi * t / 288) + np.random.default_rng(seed).normal(0, 4, n)
    if shift:
        x[8 * 288 + 100: 8 * 288 + 130] += 80
    return ts, x


def _later_rows(ts: list[datetime], x: np.ndarray, rows: int = 4000, seed: int = 8) -> tuple[list[datetime], np.ndarray]:
    """``rows`` more rows at 7-minute steps after ``ts`` (more rows than the prefix: the whole-file median step
    would be 7 minutes, which divides no day)."""
    more = [ts[-1] + timedelta(minutes=7 * (i + 1)) for i in range(rows)]
    return ts + more, np.concatenate([x, 100 + np.random.default_rng(seed).normal(0, 4, rows)])


def test_later_rows_at_another_step_do_not_change_earlier_scores() -> None:
    ts, x = _daily_5min()
    cut = len(ts)
    full_ts, full_x = _later_rows(ts, x)
    prefix = anomaly_scores(x, None, ts)
    assert prefix.max() >= ScoreParams().alarm  # the day-8 shift alarms: the comparison is not vacuous
    np.testing.assert_array_equal(anomaly_scores(full_x, None, full_ts)[:cut], prefix)
    assert series_periods(full_ts) == series_periods(ts) == (300, [288, 2016])
    # an explicit step gives the same scores as the decided one
    np.testing.assert_array_equal(anomaly_scores(x, None, ts, step=300), prefix)


def test_running_step_decision_is_streaming_inside_the_decision_rows() -> None:
    """A daily cycle sampled every 6 h for 40 rows, then every 7 h (which divides no day, and becomes the most
    frequent step at row 80): every truncation gives the same scores as the full run.  Not vacuous: rows 61-79
    score differently under the final (7 h) step, i.e. the step in force there is the one known at that row."""
    steps = [6 * 3600] * 40 + [7 * 3600] * 160
    ts = [T0 + timedelta(seconds=int(s)) for s in np.concatenate([[0], np.cumsum(steps)])]
    hours = np.array([t.hour for t in ts])
    x = 100 + 60 * np.sin(2 * np.pi * hours / 24) + np.random.default_rng(4).normal(0, 4, len(ts))
    full = anomaly_scores(x, None, ts)
    for cut in (2, 30, 41, 62, 70, 79, 80, 81, DECIDE_ROWS - 1, DECIDE_ROWS, DECIDE_ROWS + 1, 150):
        np.testing.assert_array_equal(anomaly_scores(x[:cut], None, ts[:cut]), full[:cut])
    frozen = anomaly_scores(x, None, ts, step=7 * 3600)
    assert np.any(full[61:80] != frozen[61:80])
    assert series_periods(ts) == (7 * 3600, [24])
    assert series_periods(ts[:60]) == (6 * 3600, [4, 28])


def _counts_5min(days: int = 10, seed: int = 5) -> tuple[list[datetime], np.ndarray]:
    """Requests per 5 minutes (Poisson, daily cycle) with a 5x surge on day 9 from 12:00 to 14:00 UTC."""
    n = 288 * days
    ts = [T0 + timedelta(minutes=5 * i) for i in range(n)]
    hours = np.array([t.hour for t in ts])
    lam = 5 * 20 * (0.625 + 0.375 * np.cos((hours - 21) / 24 * 2 * np.pi))
    x = np.random.default_rng(seed).poisson(lam).astype(float)
    x[9 * 288 + 144: 9 * 288 + 168] *= 5
    return ts, x


def test_later_rows_do_not_change_earlier_events() -> None:
    """An integer series with a spike; then 4,000 rows at 7-minute steps and one row with value 0.5.  The events
    that start before the later rows are the prefix's own events, unchanged (before the fix the 7-minute rows
    moved the whole-file step and the 0.5 turned the series generic: the spike became an ``anomaly``)."""
    ts, x = _counts_5min()
    cut = len(ts)
    full_ts, full_x = _later_rows(ts, x)
    full_x = np.round(np.abs(full_x))
    full_x[cut + 10] = 0.5
    prefix = series_events(ts, x)
    assert [d.kind for d in prefix] == ["spike"] and all(d.state == "closed" for d in prefix)
    full = [d for d in series_events(full_ts, full_x) if d.start < ts[-1]]
    assert [d.to_json() for d in full] == [d.to_json() for d in prefix]
    # generic mode: the same holds for anomaly events
    gts, gx = _daily_5min()
    g_full_ts, g_full_x = _later_rows(gts, gx)
    g_prefix = series_events(gts, gx, mode="generic")
    assert g_prefix and {d.kind for d in g_prefix} == {"anomaly"}
    g_full = [d for d in series_events(g_full_ts, g_full_x, mode="generic") if d.start <= gts[-1]]
    assert [d.to_json() for d in g_full] == [d.to_json() for d in g_prefix]


def test_cli_events_and_scores_unchanged_by_later_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ts, x = _counts_5min()
    full_ts, full_x = _later_rows(ts, x)
    full_x = np.round(np.abs(full_x))
    full_x[len(ts) + 10] = 0.5
    out: dict[str, list[str]] = {}
    for name, (tt, xx) in {"prefix": (ts, x), "full": (full_ts, full_x)}.items():
        f = tmp_path / f"{name}.csv"
        f.write_text("timestamp,value\n" + "".join(f"{t.isoformat()},{float(v)!r}\n" for t, v in zip(tt, xx, strict=True)))
        detect_series_command(input=str(f))
        out[name] = capsys.readouterr().out.splitlines()
        detect_series_command(input=str(f), scores=True)
        out[name + "_scores"] = capsys.readouterr().out.splitlines()
    assert [json.loads(e)["kind"] for e in out["prefix"]] == ["spike"]
    assert out["full"][: len(out["prefix"])] == out["prefix"]
    assert all(json.loads(e)["start"] > json.loads(out["prefix"][-1])["start"] for e in out["full"][1:])
    assert out["full_scores"][: len(out["prefix_scores"])] == out["prefix_scores"]


def test_auto_mode_switches_to_generic_at_an_early_non_integer() -> None:
    """A non-integer among the first DECIDE_ROWS values makes the series generic from its row on (rows before
    are counts, which raise nothing here); a non-integer after them does not change the mode."""
    ts, x = _daily_5min()
    xi = np.round(x)
    early = xi.copy()
    early[DECIDE_ROWS - 1] += 0.5
    assert {d.kind for d in series_events(ts, early)} == {"anomaly"}
    late = xi.copy()
    late[DECIDE_ROWS] += 0.5
    assert "anomaly" not in {d.kind for d in series_events(ts, late)}
    with pytest.raises(ValueError):
        series_events(ts, xi, mode="count")


def test_generic_events_are_strict_json_with_a_real_expectation(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every line parses with NaN/Infinity rejected and meets the schema (``expected`` a number); ``expected`` is
    the model's: near the normal level for a level shift, near the daily peak for a missing daily peak."""
    ts, x = _daily_5min()
    rows = [f"{t.isoformat()},{float(v)!r}\n" for t, v in zip(ts, x, strict=True)]
    rows[500] = f"{ts[500].isoformat()},\n"  # a missing value and a non-finite one: both "missing"
    rows[501] = f"{ts[501].isoformat()},inf\n"
    f = tmp_path / "g.csv"
    f.write_text("timestamp,value\n" + "".join(rows))
    detect_series_command(input=str(f), mode="generic")
    events = _strict_lines(capsys.readouterr().out)
    at = {f"{t:%Y-%m-%dT%H:%M:%SZ}": i for i, t in enumerate(ts)}
    shift = [e for e in events if 8 * 288 + 100 <= at[e["start"]] <= 8 * 288 + 105]
    assert len(shift) == 1, events
    e = shift[0]
    want = 100 + 60 * np.sin(2 * np.pi * at[e["start"]] / 288)  # the day model's expectation at that row
    assert abs(e["expected"] - want) < 15 and e["observed"] - e["expected"] > 50, e
    # a missing daily peak: the seasonal prediction is the expectation, not the (lower) observed level
    _, y = _daily_5min(shift=False)
    start = 9 * 288 + 40
    y[start: start + 90] = 100 + np.random.default_rng(3).normal(0, 4, 90)
    dets = series_events(ts, y, mode="generic")
    late = [d for d in dets if d.start >= ts[start]]
    assert late and late[0].start <= ts[start + 12], [d.to_json() for d in late]
    assert late[0].expected - late[0].observed > 30, late[0].to_json()
    _strict_lines("\n".join(d.to_json() for d in dets))


def test_score_events_never_emit_nan() -> None:
    """An alarm on a row whose value is missing: ``observed`` is the value the scorer carried forward and
    ``expected`` a finite number, with or without the scorer's expectations."""
    ts = [T0 + timedelta(minutes=i) for i in range(5)]
    values = np.array([1.0, 2.0, 3.0, np.nan, 5.0])
    score = np.array([0.0, 0.0, 0.0, 0.9, 0.0])
    for exp in (None, np.array([np.nan] * 5)):
        (d,) = score_events(ts, score, values, 0.5, expected=exp)
        assert d.observed == 3.0 and np.isfinite(d.expected)
        _strict_lines(d.to_json())
    assert score_events(ts, score, values, 0.5, first=4) == []


def test_read_series_csv_keeps_the_last_duplicate(tmp_path: Path) -> None:
    """Out-of-order rows with every timestamp three times: the last row of the file wins (stable sort)."""
    rng = np.random.default_rng(1)
    stamps = pd.date_range("2026-01-05", periods=2000, freq="1min")
    order = np.concatenate([rng.permutation(2000) for _ in range(3)])
    lines = [f"{stamps[k].isoformat()},{line_no}\n" for line_no, k in enumerate(order)]
    f = tmp_path / "dup.csv"
    f.write_text("timestamp,value\n" + "".join(lines))
    ts, vals = read_series_csv(str(f))
    last = {int(k): float(line_no) for line_no, k in enumerate(order)}
    assert len(ts) == 2000 and ts == sorted(ts)
    np.testing.assert_array_equal(vals, [last[k] for k in range(2000)])


def test_detection_json_has_no_nan_for_generic_rows() -> None:
    d = Detection("anomaly", "series", T0, T0, T0, 1.0, 2.0, 0.7, "unexplained", state="closed")
    assert _strict_lines(d.to_json())[0]["expected"] == 2.0


def test_read_series_csv_says_what_it_leaves_out(tmp_path: Path) -> None:
    """Extra columns and infinite values are noted (not silently dropped); epoch seconds mixed with epoch
    milliseconds are refused naming a row of each."""
    f = tmp_path / "x.csv"
    f.write_text("time,count,host\n1709251200,5,a\n1709251260,inf,a\n1709251320,-inf,b\n1709251380,7,b\n")
    notes: list[str] = []
    ts, vals = read_series_csv(str(f), notes)
    assert len(ts) == 4 and np.isnan(vals[1]) and np.isnan(vals[2]) and vals[3] == 7.0
    assert notes == ["1 column(s) after timestamp,value are ignored", "2 value(s) are infinite and count as missing"]
    f.write_text("1709251200,5\n1709251260000,6\n")
    with pytest.raises(ValueError, match=r"mix epoch seconds \(row 1: '1709251200'\) and milliseconds "
                                         r"\(row 2: '1709251260000'\): use one unit"):
        read_series_csv(str(f))


def test_an_alarm_after_the_row_that_caused_it_points_at_that_row() -> None:
    """The score's trailing means put the alarm a row after a lone spike; the event reported that ordinary row,
    with observed == expected (user trial 40).  It now points at the spike (start, peak, observed, expected) and
    says when the alarm came; an alarm on the most deviant row itself has no ``alarm_at``; the event uses rows up
    to the alarm row only."""
    rng = np.random.default_rng(5)
    n = 3000
    ts = [T0 + timedelta(minutes=5 * i) for i in range(n)]
    x = 50 + 10 * np.sin(np.arange(n) * 2 * np.pi / 288) + rng.normal(0, 0.5, n)
    k = 2800
    x[k] = 500.0
    dets = series_events(ts, x, mode="generic")
    (d,) = [d for d in dets if ts[k] <= d.end <= ts[k + 5]]
    assert d.start == d.peak_ts == ts[k] and d.observed == 500.0 and d.expected < 100, d.to_json()
    assert d.end is not None and d.end > d.start and d.detail["alarm_at"] == d.end.strftime("%Y-%m-%dT%H:%M:%SZ")
    cut = ts.index(d.end) + 1
    (again,) = [e for e in series_events(ts[:cut], x[:cut], mode="generic") if e.end == d.end]
    assert again.to_json() == d.to_json()
    score = np.zeros(6)
    score[4] = 0.9
    (same_row,) = score_events(ts[:6], score, np.array([1.0, 1, 1, 1, 9, 1]), 0.5)
    assert same_row.start == ts[4] and same_row.observed == 9.0 and same_row.detail == {}
    # two alarms close together (a suppression under 4 rows) never point at the same row: one id each (a review)
    score = np.array([0.0, 0, 0, 0, 0, 0.9, 0.9, 0])
    two = score_events(ts[:8], score, np.array([1.0, 1, 1, 1, 9, 1, 1, 1]), 0.5)
    assert len(two) == 2 and len({d.id for d in two}) == 2 and two[0].start == ts[4] and two[1].start == ts[6]
