"""``detect series`` tells the user how it reads their file (ops trial, stop 29): rows with extra fields are read,
not the whole file refused; a change of row spacing, a ``--step`` the rows disagree with, the switch to generic
mode, a too-short series, empty values, rows out of order and timestamps without an offset are noted on stderr;
a score held under the alarm never prints as the alarm."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from forumpulse.detectors.calendar import SiteCalendar
from forumpulse.detectors.series import (
    ScoreParams,
    anomaly_scores,
    detect_series_command,
    read_series_csv,
    series_events,
    series_notes,
)

T0 = datetime(2024, 3, 4, tzinfo=UTC)


def _daily_counts(days: int, step_min: int = 5, seed: int = 3) -> tuple[list[datetime], np.ndarray]:
    rng = np.random.default_rng(seed)
    n = days * 1440 // step_min
    ts = [T0 + timedelta(minutes=step_min * i) for i in range(n)]
    phase = np.arange(n) * step_min / 1440 * 2 * math.pi
    return ts, rng.poisson(100 + 60 * np.sin(phase)).astype(float)


def _write(path: Path, ts: list[datetime], x: np.ndarray) -> None:
    path.write_text("timestamp,value\n" + "".join(f"{t.isoformat()},{int(v)}\n" for t, v in zip(ts, x, strict=True)))


def test_a_row_with_extra_fields_is_read_and_noted(tmp_path: Path) -> None:
    f = tmp_path / "r.csv"
    f.write_text("2024-01-01T00:00Z,5\n2024-01-01T00:05Z,6,extra\n2024-01-01T00:10Z,7\n")
    notes: list[str] = []
    ts, vals = read_series_csv(str(f), notes)
    assert list(vals) == [5.0, 6.0, 7.0] and len(ts) == 3
    assert notes == ["1 row(s) have more fields than the first row: only their timestamp,value is read "
                     "(first: '2024-01-01T00:05Z,6,extra')"]


def test_input_changes_are_noted(tmp_path: Path) -> None:
    f = tmp_path / "n.csv"
    f.write_text("ts,v\n2024-01-01T00:10,1\n2024-01-01T00:00+01:00,\n2024-01-01T00:05Z,NaN\n2024-01-01T00:20Z,4\n")
    notes: list[str] = []
    ts, _ = read_series_csv(str(f), notes)
    assert "2 value(s) are empty or NaN and count as missing" in notes
    assert "1 timestamp(s) have no UTC offset and are read as UTC" in notes
    assert "1 row(s) are earlier than the row before them: rows are read in time order" in notes
    assert ts == sorted(ts) and ts[0] == datetime(2023, 12, 31, 23, 0, tzinfo=UTC)


def test_a_change_of_row_spacing_is_noted_and_the_right_step_finds_the_outage() -> None:
    ts1 = [T0 + timedelta(minutes=i) for i in range(150)]
    ts2 = [ts1[-1] + timedelta(minutes=5 * (i + 1)) for i in range(14 * 288)]
    ts = ts1 + ts2
    rng = np.random.default_rng(1)
    x = rng.poisson(100, len(ts)).astype(float)
    x[150:] *= 5  # the same traffic per minute in 5-minute rows
    x[150 + 10 * 288 + 100:150 + 10 * 288 + 124] = 0  # two hours down on day 11
    notes = series_notes(ts, x, None, "auto", 30)
    assert len(notes) == 1 and "mostly 300 s apart, not the row step of 60 s" in notes[0]
    assert notes[0].startswith(f"rows from {ts2[0].isoformat().replace('+00:00', 'Z')} on")
    blind = [d for d in series_events(ts, x) if d.kind == "outage"]
    found = [d for d in series_events(ts, x, step=300) if d.kind == "outage"]
    assert not blind and len(found) == 1  # what the note is for
    assert series_notes(ts2, x[150:], None, "auto", 30) == []  # a regular series: no note
    assert series_notes(ts2, x[150:], 60, "auto", 30) == [
        "--step 60: the first 100 rows are 300 s apart; the results use 60 s (each row is then followed by 4 "
        "missing steps, read as no data): leave --step out to use 300 s"]


def test_mode_switch_and_short_series_are_noted() -> None:
    ts, x = _daily_counts(3)
    x[50] = 100.5
    notes = series_notes(ts, x, None, "auto", 30)
    assert notes == ["row 51 (2024-03-04T04:10:00Z) is not a non-negative integer (100.5): generic mode (the "
                     "anomaly score) from that row on, instead of the count detectors"]
    assert series_notes(ts, x, None, "counts", 30) == []
    assert series_notes(ts[:20], x[:20], None, "generic", 30)[0].startswith("only 20 row(s) with a value")
    assert series_notes(ts[:200], np.round(x[:200]), None, "auto", 30) == [
        "the series covers less than a day: the count detectors need a previous day of the same kind as a "
        "baseline, so they report nothing"]


def test_held_back_scores_never_print_as_the_alarm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ts, x = _daily_counts(10)
    drop = 8 * 288 + 168
    x[drop:drop + 24] = 0
    f = tmp_path / "d.csv"
    _write(f, ts, x)
    raw = anomaly_scores(x, ScoreParams(), ts)
    held = np.flatnonzero(raw == np.nextafter(0.5, 0.0))
    assert len(held), "the series must have a score held under the alarm after an alarm"
    detect_series_command(input=str(f), scores=True)
    printed = [float(line.rsplit(",", 1)[1]) for line in capsys.readouterr().out.splitlines()[1:]]
    assert len(printed) == len(x)
    assert all(printed[i] == 0.499999 for i in held)
    assert sum(p >= 0.5 for p in printed) == int((raw >= 0.5).sum())


def test_country_codes_are_not_case_sensitive() -> None:
    assert SiteCalendar("us").is_holiday(datetime(2024, 7, 4).date())
    assert SiteCalendar(" my ").holiday_name(datetime(2024, 2, 10).date())


def test_review_edge_cases_of_the_notes(tmp_path: Path) -> None:
    """Review: a date-only timestamp has no offset (its "-04" is the day); a row shorter than the widest gets the
    empty-value note, not "None is not a number"; a missing first value is data, not a header; jitter of a
    second around a 60 s step is no change of spacing."""
    f = tmp_path / "d.csv"
    f.write_text("2024-03-04,5\n2024-03-05,6\n")
    notes: list[str] = []
    read_series_csv(str(f), notes)
    assert notes == ["2 timestamp(s) have no UTC offset and are read as UTC"]
    f.write_text("2024-01-01T00:00Z,5\n2024-01-01T00:05Z,6,x\n2024-01-01T00:10Z\n")
    notes = []
    ts, vals = read_series_csv(str(f), notes)
    assert len(ts) == 3 and np.isnan(vals[2])
    assert "1 value(s) are empty or NaN and count as missing" in notes and not any("None" in n for n in notes)
    f.write_text("2024-01-01T00:00Z,NA\n2024-01-01T00:05Z,6\n")
    ts, vals = read_series_csv(str(f))
    assert len(ts) == 2 and np.isnan(vals[0])
    rng = np.random.default_rng(0)
    jitter = [T0]
    for _ in range(400):
        jitter.append(jitter[-1] + timedelta(seconds=int(rng.integers(59, 62))))
    assert not [n for n in series_notes(jitter, np.ones(len(jitter)), None, "counts", 30) if "apart" in n]
    assert any("apart" in n for n in series_notes(jitter[:150] + [jitter[149] + timedelta(minutes=5 * k)
                                                                  for k in range(1, 250)],
                                                  np.ones(399), None, "counts", 30))


def test_a_block_of_two_spacings_does_not_crash_the_notes(tmp_path: Path) -> None:
    """Review: 60 s rows then 120 s rows put a block half and half; its median (90 s) is no row's step, and the
    note crashed looking for it.  Compact ISO times with an offset are not called offset-less."""
    ts = [T0 + timedelta(seconds=60 * i) for i in range(151)]
    ts += [ts[-1] + timedelta(seconds=120 * (i + 1)) for i in range(300)]
    notes = series_notes(ts, np.ones(len(ts)), None, "counts", 30)
    assert any("mostly 120 s apart, not the row step of 60 s" in n for n in notes), notes
    f = tmp_path / "c.csv"
    f.write_text("20240304T100000Z,5\n2024-03-04T1001+0100,6\n")
    got: list[str] = []
    read_series_csv(str(f), got)
    assert not any("offset" in n for n in got), got


@pytest.mark.parametrize("stamp", ["10/03/2024 00:00", "10.03.2024 00:00", "3-10-24 00:00", "00:00 10/03/2024",
                                   "Sun 10/03/2024 00:00"])
def test_numeric_dates_of_unknown_day_month_order_are_refused(tmp_path: Path, stamp: str) -> None:
    """10/03/2024 was read as 3 October and 13/03/2024 as 13 March in the same file, re-sorting the series with
    only a note about rows out of order (user trial 40): such dates are refused, naming the row and the remedy."""
    p = tmp_path / "dmy.csv"
    p.write_text(f"2024-03-09T23:00Z,1\n{stamp},2\n")
    with pytest.raises(ValueError, match=r"row 2: .* day and month order cannot be known .* ISO 8601"):
        read_series_csv(str(p))
    p.write_text("2024-03-09T23:00Z,1\n10 Mar 2024 00:00,2\n20240310T0100Z,3\n2024-03-10 10:03:00,4\n")
    ts, _ = read_series_csv(str(p))  # unambiguous forms still read
    assert [t.day for t in ts] == [9, 10, 10, 10]


def test_series_reads_standard_input(tmp_path: Path) -> None:
    """``--input -`` reads standard input, as ``ingest -`` does (it failed: "No such file or directory: '-'",
    user trial 40); the same scores as the file."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("forumpulse")
    ts, x = _daily_counts(3)
    p = tmp_path / "s.csv"
    _write(p, ts, x)
    from_file = subprocess.run([str(exe), "detect", "series", "--input", str(p), "--scores"], capture_output=True,
                               text=True, timeout=120)
    piped = subprocess.run([str(exe), "detect", "series", "--input", "-", "--scores"], input=p.read_text(),
                           capture_output=True, text=True, timeout=120)
    assert from_file.returncode == piped.returncode == 0, piped.stderr
    assert piped.stdout == from_file.stdout and len(piped.stdout.splitlines()) == len(ts) + 1
    assert piped.stderr == from_file.stderr.replace(str(p), "<stdin>")


def test_timestamp_errors_say_what_is_wrong(tmp_path: Path) -> None:
    """An epoch number among ISO dates and swapped columns were both "'…' is not a timestamp" (user trial 40)."""
    cases = {"2024-03-01T00:00Z,1\n1709251380,2\n": "mixes epoch numbers with dates (row 1: '2024-03-01T00:00Z')",
             "value,timestamp\n5,2024-03-01T00:00Z\n6,2024-03-01T00:05Z\n": "the columns look swapped",
             "foo,1\nbar,2\n": "'foo' is not a timestamp (2 such row(s))"}
    for i, (text, want) in enumerate(cases.items()):
        p = tmp_path / f"c{i}.csv"
        p.write_text(text)
        with pytest.raises(ValueError) as err:
            read_series_csv(str(p))
        assert want in str(err.value), str(err.value)
    assert "swapped" not in str(err.value) and "mixes" not in str(err.value)
