"""`forumpulse db check-rollups`: every rollup compared with what `requests` implies, and rebuilt with --repair.

The loss it exists for (a process killed while ClickHouse commits one INSERT's parts table by table leaves one
rollup without the block; the replay is then deduplicated everywhere) cannot be produced on demand, so these tests
make the same damage by hand: one rollup loses a block's rows (or gets them twice) while `requests` and the other
rollups keep them."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from forumpulse.pipeline.bench import simulated_file, write_settings
from forumpulse.pipeline.rollup_check import HOUR_ROLLUPS, MINUTE_ROLLUPS, check_rollups
from forumpulse.pipeline.store import open_store

EXE = Path(sys.executable).with_name("forumpulse")


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A chDB store with 20,000 simulated lines ingested (no retention: every row kept)."""
    work = tmp_path_factory.mktemp("rc")
    log = simulated_file(work, 20_000)
    cfg = write_settings(work / "fp.yaml", f"chdb:{work / 'st'}")
    p = subprocess.run([str(EXE), "ingest", "-c", str(cfg), "--format", "combined", str(log)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return work, cfg


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)  # chDB links metadata/<db> to its store folder
    (dst / ".forumpulse.lock").unlink(missing_ok=True)
    return dst


def _check(path: Path, repair: bool = False, **kw: Any) -> Any:
    url = f"chdb:{path}"
    st = open_store(url)
    try:
        start = kw.get("start", datetime(2000, 1, 1, tzinfo=UTC))
        end = kw.get("end", datetime.now(UTC) + timedelta(days=1))
        return check_rollups(st, start, end, repair=repair, open_scratch=lambda db: open_store(url, database=db))
    finally:
        st.close()


def _busiest_hour(path: Path, table: str = "topic_minute") -> datetime:
    st = open_store(f"chdb:{path}")
    try:
        h = st.query_rows(f"SELECT toUnixTimestamp(toStartOfHour(minute)) AS h FROM {table} GROUP BY h "
                          "ORDER BY count() DESC, h LIMIT 1")[0][0]
    finally:
        st.close()
    return datetime.fromtimestamp(int(h), UTC)


def _damage(path: Path, sql: str) -> None:
    st = open_store(f"chdb:{path}")
    try:
        st.command(sql)
    finally:
        st.close()


def test_an_intact_store_has_no_differences(loaded: tuple[Path, Path], tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    res = _check(st_path)
    assert res.requests > 19_000
    assert set(res.differences) == set(MINUTE_ROLLUPS) | set(HOUR_ROLLUPS)
    assert res.ok and res.hours == [] and not res.repaired
    # the scratch database is gone again
    st = open_store(f"chdb:{st_path}")
    try:
        assert not st.query_rows("SELECT name FROM system.databases WHERE name LIKE '%rollup_check%'")
    finally:
        st.close()


def test_a_block_lost_by_one_rollup_is_found_in_its_hour_and_rebuilt(loaded: tuple[Path, Path],
                                                                     tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    hour = _busiest_hour(st_path)
    # topic_minute loses a block's rows of one minute; topic_hour (fed at insert time) still has them
    minute = hour + timedelta(minutes=17)
    _damage(st_path, "ALTER TABLE topic_minute DELETE WHERE minute = toDateTime("
                     f"'{minute:%Y-%m-%d %H:%M:%S}', 'UTC') SETTINGS mutations_sync = 2")
    res = _check(st_path)
    assert not res.ok
    assert res.differences["topic_minute"][1] > 0  # keys missing
    assert all(v == (0, 0) for t, v in res.differences.items() if t != "topic_minute"), res.differences
    assert res.hours == [f"{hour:%Y-%m-%d %H:%M:%S}"]
    fixed = _check(st_path, repair=True)
    assert fixed.repaired and not fixed.ok  # it reports what it found, then rebuilds
    again = _check(st_path)
    assert again.ok, again.differences


def test_a_block_stored_twice_in_one_rollup_is_found_and_rebuilt(loaded: tuple[Path, Path], tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    hour = _busiest_hour(st_path)
    _damage(st_path, "INSERT INTO site_minute SELECT * FROM site_minute WHERE minute = toDateTime("
                     f"'{hour + timedelta(minutes=5):%Y-%m-%d %H:%M:%S}', 'UTC') SETTINGS insert_deduplicate = 0")
    res = _check(st_path, repair=True)
    assert res.differences["site_minute"][0] > 0 and res.repaired
    assert _check(st_path).ok


def test_hours_requests_no_longer_holds_are_not_compared(loaded: tuple[Path, Path], tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    st = open_store(f"chdb:{st_path}")
    try:
        first = datetime.fromtimestamp(int(st.query_rows("SELECT toUnixTimestamp(toStartOfHour(min(ts))) "
                                                         "FROM requests")[0][0]), UTC)
    finally:
        st.close()
    # raw retention dropped the first three hours of requests; their rollups stay
    cut = first + timedelta(hours=3)
    _damage(st_path, f"ALTER TABLE requests DELETE WHERE ts < toDateTime64('{cut:%Y-%m-%d %H:%M:%S}', 3, 'UTC') "
                     "SETTINGS mutations_sync = 2")
    res = _check(st_path)
    assert res.ok, res.differences  # the rollups of the dropped hours are not taken for differences
    assert res.start == cut + timedelta(hours=1) and "retention.raw_days" in res.note


def test_cli_exit_codes_and_repair(loaded: tuple[Path, Path], tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    cfg = loaded[1]
    hour = _busiest_hour(st_path)
    _damage(st_path, "ALTER TABLE client_minute DELETE WHERE minute = toDateTime("
                     f"'{hour + timedelta(minutes=30):%Y-%m-%d %H:%M:%S}', 'UTC') SETTINGS mutations_sync = 2")
    args = [str(EXE), "db", "check-rollups", "-c", str(cfg), "--store", f"chdb:{st_path}",
            "--from", f"{hour:%Y-%m-%dT%H:%M}", "--to", f"{hour + timedelta(hours=2):%Y-%m-%dT%H:%M}"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "client_minute    DIFFERENT" in p.stdout and "--repair" in p.stderr
    p = subprocess.run([*args, "--repair"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "repaired" in p.stdout, p.stdout + p.stderr
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "DIFFERENT" not in p.stdout, p.stdout + p.stderr
    bad = subprocess.run([*args[:7], "--from", "yesterday"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not an ISO date" in bad.stderr
