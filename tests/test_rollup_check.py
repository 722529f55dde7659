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


def test_an_hourly_rollup_missing_a_block_is_rebuilt_through_its_minute_rollup(loaded: tuple[Path, Path],
                                                                               tmp_path: Path) -> None:
    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    hour = _busiest_hour(st_path)
    _damage(st_path, f"ALTER TABLE topic_hour DELETE WHERE hour = toDateTime('{hour:%Y-%m-%d %H:%M:%S}', 'UTC') "
                     "SETTINGS mutations_sync = 2")
    res = _check(st_path, repair=True)
    assert res.differences["topic_hour"][1] > 0 and res.differences["topic_minute"] == (0, 0)
    assert res.repaired and _check(st_path).ok


def _hand_store(tmp_path: Path, days: int, step_minutes: int = 10) -> Path:
    """A chDB store of a small hand-written log: one line every ``step_minutes`` over ``days`` days."""
    start = datetime(2025, 3, 1, tzinfo=UTC)
    n = days * 24 * 60 // step_minutes
    lines = [f'192.0.2.{i % 200 + 1} - - [{start + timedelta(minutes=i * step_minutes):%d/%b/%Y:%H:%M:%S +0000}] '
             f'"GET /threads/t.{i % 7 + 1}/ HTTP/1.1" 200 {1000 + i} "-" "Mozilla/5.0 (X11; Linux x86_64)"'
             for i in range(n)]
    log = tmp_path / "hand.log"
    log.write_text("\n".join(lines) + "\n")
    cfg = write_settings(tmp_path / "fp.yaml", f"chdb:{tmp_path / 'st'}")
    p = subprocess.run([str(EXE), "ingest", "-c", str(cfg), "--format", "combined", str(log)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return tmp_path / "st"


def _site_requests(path: Path) -> int:
    st = open_store(f"chdb:{path}")
    try:
        return int(st.query_rows("SELECT sum(requests) FROM site_minute")[0][0])
    finally:
        st.close()


@pytest.mark.parametrize("cut_minutes", [180, 200], ids=["on_the_hour", "mid_hour"])
def test_hours_requests_may_no_longer_hold_are_never_compared_nor_rebuilt(tmp_path: Path, cut_minutes: int) -> None:
    st_path = _hand_store(tmp_path, days=4)
    first = datetime(2025, 3, 1, tzinfo=UTC)
    total = _site_requests(st_path)
    # raw retention dropped the oldest raw rows (on the hour, or halfway through one); their rollups stay
    cut = first + timedelta(minutes=cut_minutes)
    _damage(st_path, f"ALTER TABLE requests DELETE WHERE ts < toDateTime64('{cut:%Y-%m-%d %H:%M:%S}', 3, 'UTC') "
                     "SETTINGS mutations_sync = 2")
    res = _check(st_path, repair=True)
    assert res.ok and not res.repaired, res.differences  # the dropped hours are not taken for differences
    assert res.start == _hour(cut) + timedelta(days=1) and "retention.raw_days" in res.note
    assert res.requests == (4 * 24 * 60 - (_hour(cut) + timedelta(days=1) - first).total_seconds() / 60) // 10
    assert res.requests > 0 and res.raw_incomplete == []
    assert _site_requests(st_path) == total  # no rollup row lost


def test_raw_rows_dropped_inside_the_history_are_not_compared_nor_rebuilt(tmp_path: Path) -> None:
    """A stretch in the middle whose raw rows are gone but whose rollups stay (an archive loaded while the raw
    retention was shorter, older and newer ones loaded after it was lengthened): those hours are listed as
    raw-incomplete and left alone, while a real loss in another hour is still found and rebuilt."""
    st_path = _hand_store(tmp_path, days=3)
    total = _site_requests(st_path)
    gap = datetime(2025, 3, 2, 5, tzinfo=UTC)
    _damage(st_path, f"ALTER TABLE requests DELETE WHERE ts >= toDateTime64('{gap:%Y-%m-%d %H:%M:%S}', 3, 'UTC') "
                     f"AND ts < toDateTime64('{gap + timedelta(hours=3):%Y-%m-%d %H:%M:%S}', 3, 'UTC') "
                     "SETTINGS mutations_sync = 2")
    lost = datetime(2025, 3, 2, 14, 20, tzinfo=UTC)  # and topic_minute loses one minute's block elsewhere
    _damage(st_path, f"ALTER TABLE topic_minute DELETE WHERE minute = toDateTime('{lost:%Y-%m-%d %H:%M:%S}', 'UTC') "
                     "SETTINGS mutations_sync = 2")
    res = _check(st_path, repair=True)
    assert res.raw_incomplete == [f"{gap + timedelta(hours=h):%Y-%m-%d %H:%M:%S}" for h in range(3)]
    assert res.hours == ["2025-03-02 14:00:00"] and res.repaired, res
    assert res.differences["topic_minute"][1] > 0
    assert all(v == (0, 0) for t, v in res.differences.items() if t != "topic_minute"), res.differences
    assert _site_requests(st_path) == total  # the raw-incomplete hours kept their rollups
    again = _check(st_path)
    assert again.ok and again.raw_incomplete == res.raw_incomplete


def test_repairs_of_many_hours_go_in_batches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More hours than one statement takes (the IN list stays under max_query_size) are all rebuilt."""
    import forumpulse.pipeline.rollup_check as rc

    monkeypatch.setattr(rc, "HOURS_PER_STATEMENT", 7)
    st_path = _hand_store(tmp_path, days=2)
    _damage(st_path, "ALTER TABLE client_minute DELETE WHERE toMinute(minute) = 30 SETTINGS mutations_sync = 2")
    res = _check(st_path, repair=True)
    assert res.repaired and len(res.hours) == 48 and res.differences["client_minute"][1] >= 48
    assert _check(st_path).ok


def _hour(dt: datetime) -> datetime:
    return dt.replace(minute=0, second=0, microsecond=0)


def test_the_raw_retention_cut_bounds_the_range(tmp_path: Path) -> None:
    from forumpulse.pipeline.rollup_check import _complete_from
    from forumpulse.pipeline.store import migrate

    st = open_store(f"chdb:{tmp_path / 'st'}")
    try:
        migrate(st, {"raw_ttl_days": 30})
        limit, why = _complete_from(st, datetime.now(UTC) - timedelta(days=60))
        want = _hour(datetime.now(UTC) - timedelta(days=30)) + timedelta(days=1)
        assert abs((limit - want).total_seconds()) <= 3600 and "30 days" in why
        recent = _hour(datetime.now(UTC) - timedelta(days=2))
        assert _complete_from(st, recent)[0] == recent  # newer raw rows are all there
    finally:
        st.close()


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
    assert p.returncode == 0, p.stdout + p.stderr
    assert "repaired: 1 hour(s) of 1 rollup(s)" in p.stdout and "checked again: every rollup the same" in p.stdout
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "DIFFERENT" not in p.stdout, p.stdout + p.stderr
    # a mistyped folder is an error, not a new empty store
    typo = subprocess.run([*args[:6], f"chdb:{tmp_path / 'nope'}", *args[7:]], capture_output=True, text=True,
                          timeout=60)
    assert typo.returncode == 2 and "no chDB store" in typo.stderr and not (tmp_path / "nope").exists()
    bad = subprocess.run([*args[:7], "--from", "yesterday"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "not an ISO date" in bad.stderr


def test_through_a_clickhouse_endpoint_the_scratch_database_is_its_own(loaded: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    """The same check and repair over HTTP (the owner process's ClickHouse-compatible endpoint, as a server): the
    scratch database is a database of its own on the server, and the store's database is left as it was."""
    from test_live_support import free_port, owner_cmd, spawn, stop, wait_http, write_config

    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    hour = _busiest_hour(st_path)
    _damage(st_path, "ALTER TABLE prefix_minute DELETE WHERE minute = toDateTime("
                     f"'{hour + timedelta(minutes=10):%Y-%m-%d %H:%M:%S}', 'UTC') SETTINGS mutations_sync = 2")
    port = free_port()
    cfg = write_config(tmp_path / "owner.yaml", "127.0.0.1:1", f"chdb:{st_path}")
    log = tmp_path / "owner.log"
    owner = spawn(owner_cmd(cfg, "--port", str(port)), log)
    try:
        wait_http(port, owner, log)
        url = f"clickhouse://default@127.0.0.1:{port}/forumpulse"
        args = [str(EXE), "db", "check-rollups", "--store", url, "--from", f"{hour:%Y-%m-%dT%H:%M}",
                "--to", f"{hour + timedelta(hours=1):%Y-%m-%dT%H:%M}"]
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert p.returncode == 1 and "prefix_minute    DIFFERENT" in p.stdout, p.stdout + p.stderr
        p = subprocess.run([*args, "--repair"], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "repaired" in p.stdout, p.stdout + p.stderr
        p = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0 and "DIFFERENT" not in p.stdout, p.stdout + p.stderr
        from forumpulse.pipeline.store import ClickHouseStore

        cs = ClickHouseStore(url)
        try:
            dbs = {r[0] for r in cs.query_rows("SELECT name FROM system.databases")}
            tables = {r[0] for r in cs.query_rows("SELECT name FROM system.tables WHERE database = 'forumpulse'")}
        finally:
            cs.close()
        assert not [d for d in dbs if "rollup_check" in d] and {"requests", "prefix_hour"} <= tables
    finally:
        assert stop(owner) == 0


def test_a_quiet_site_spanning_more_than_100_days_is_checked(tmp_path: Path) -> None:
    """requests is partitioned by day: copying 150 days of a quiet site is one insert of 150 partitions."""
    res = _check(_hand_store(tmp_path, days=150, step_minutes=1440))
    assert res.requests == 150 and res.ok, res


def test_a_scratch_database_left_by_a_killed_run_is_dropped_by_the_next_run_once_a_day_old(
        loaded: tuple[Path, Path], tmp_path: Path) -> None:
    """A run killed before its ``finally`` leaves its scratch database (a copy of the range's raw rows).  The next
    run drops one whose name says it is over a day old, and one of the earlier name form (no time) whose tables
    are that old (their metadata files' time, set back here); a younger one of either form may be a run still
    going and stays, and so does a name this code does not make."""
    import os

    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    now = int(datetime.now(UTC).timestamp())
    names = {"old": f"forumpulse_rollup_check_{now - 2 * 86400}_4242_abcdef",
             "legacy_old": "forumpulse_rollup_check_4242_abcdef",
             "young": f"forumpulse_rollup_check_{now - 600}_4343_fedcba",
             "legacy_young": "forumpulse_rollup_check_4343_fedcba",
             "other": "forumpulse_rollup_check_by_hand"}
    st = open_store(f"chdb:{st_path}")
    try:
        names = {k: n.replace("forumpulse", st.database, 1) for k, n in names.items()}
        for name in names.values():
            st.command(f"CREATE DATABASE `{name}`")
            st.command(f"CREATE TABLE `{name}`.requests (x UInt8) ENGINE = MergeTree ORDER BY x")
        meta = Path(st.query_rows(f"SELECT metadata_path FROM system.tables WHERE database = "
                                  f"'{names['legacy_old']}'")[0][0])
    finally:
        st.close()
    meta = meta if meta.is_absolute() else st_path / meta
    os.utime(meta, (now - 2 * 86400, now - 2 * 86400))
    res = _check(st_path)
    assert res.ok and sorted(res.stale_dropped) == sorted([names["old"], names["legacy_old"]])
    st = open_store(f"chdb:{st_path}")
    try:
        left = {r[0] for r in st.query_rows("SELECT name FROM system.databases WHERE name LIKE '%rollup_check%'")}
    finally:
        st.close()
    assert left == {names["young"], names["legacy_young"], names["other"]}


# ------------------------------------------------------------------ the owner's audit of replayed batches


class _Clock:
    def __init__(self, t: datetime) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t.timestamp()


def _progress(st: Any, loaded: datetime, lag: int, updated: datetime) -> None:
    import pyarrow as pa
    from forumpulse.pipeline.consumer import PROGRESS_SCHEMA

    st.insert("consumer_progress", pa.Table.from_pylist([{
        "group_id": "g", "topic": "weblogs.raw", "partition": 0, "loaded_ts": loaded, "next_offset": 10,
        "lag": lag, "active": True, "instance": "i", "updated_at": updated}], schema=PROGRESS_SCHEMA))


@pytest.mark.parametrize("repair", [True, False])
def test_the_owner_audits_a_replayed_batchs_hours_once_they_settled(loaded: tuple[Path, Path], tmp_path: Path,
                                                                   repair: bool) -> None:
    """RollupAuditor (``store.rollup_audit``): the hours of a replayed batch are checked only once they ended
    ``settle_s`` ago and no partition is behind them; a lost block is then rebuilt (``repair``) or reported and
    counted, the intact neighbour hour counts as ``same``; nothing is left pending."""
    from forumpulse.pipeline.rollup_check import RollupAuditor

    st_path = _copy(loaded[0] / "st", tmp_path / "st")
    hour = _busiest_hour(st_path)
    minute = hour + timedelta(minutes=17)
    _damage(st_path, "ALTER TABLE topic_minute DELETE WHERE minute = toDateTime("
                     f"'{minute:%Y-%m-%d %H:%M:%S}', 'UTC') SETTINGS mutations_sync = 2")
    url = f"chdb:{st_path}"
    st = open_store(url)
    try:
        clock = _Clock(hour + timedelta(minutes=90))
        aud = RollupAuditor(st, lambda db: open_store(url, database=db), settle_s=3600, repair=repair, clock=clock)
        aud.advise(minute, hour + timedelta(minutes=65))
        assert sorted(aud.pending) == [hour, hour + timedelta(hours=1)]
        assert aud.run_once() == 0 and len(aud.pending) == 2  # neither hour ended an hour ago
        clock.t = hour + timedelta(hours=4)
        # a partition behind (reported 1 min ago), loaded up to +2:30: less the settle time, +1:30 -- the first
        # hour (ends +1:00) is ripe, the second (ends +2:00) waits
        _progress(st, hour + timedelta(hours=2, minutes=30), lag=500, updated=clock.t - timedelta(minutes=1))
        assert aud.run_once() == 1 and list(aud.pending) == [hour + timedelta(hours=1)]
        _progress(st, hour + timedelta(hours=3, minutes=1), lag=0, updated=clock.t - timedelta(seconds=5))
        assert aud.run_once() == 1 and aud.pending == set()
        want = {"same": 1, "repaired": 1, "different": 0, "not_compared": 0} if repair else \
            {"same": 1, "repaired": 0, "different": 1, "not_compared": 0}
        assert aud.counts == want and aud.errors == 0
        fams = {f.name: f for f in aud.collect()}
        got = {s.labels["result"]: s.value for s in fams["forumpulse_rollup_audit_hours"].samples
               if s.name.endswith("_total")}
        assert got == want and fams["forumpulse_rollup_audit_pending_hours"].samples[0].value == 0
        assert aud.run_once() == 0  # audited hours are not audited again
    finally:
        st.close()
    assert _check(st_path).ok is repair  # rebuilt, or left as it was (reported)


def test_audit_advice_is_bounded_and_passes_are_short(tmp_path: Path) -> None:
    """Advice stamped in the future is cut at an hour ahead of the clock (it must not push real hours out of
    the bounded list); a run of hours is audited a few hours per check (each holds the engine); a set stop
    ends a pass before its next check."""
    import threading

    from forumpulse.pipeline.rollup_check import AUDIT_HOURS_PER_PASS, RollupAuditor, _runs

    now = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    stop = threading.Event()
    aud = RollupAuditor(None, None, clock=_Clock(now), stop=stop)
    aud.advise(datetime(2026, 3, 1, 10, 5, tzinfo=UTC), datetime(2099, 1, 1, tzinfo=UTC))
    assert sorted(aud.pending) == [datetime(2026, 3, 1, h, tzinfo=UTC) for h in (10, 11, 12, 13)]
    aud.advise(datetime(2098, 1, 1, tzinfo=UTC), datetime(2099, 1, 1, tzinfo=UTC))  # all in the future
    assert len(aud.pending) == 4
    hours = [datetime(2026, 3, 1, tzinfo=UTC) + timedelta(hours=h) for h in (0, 1, 2, 3, 4, 6, 7)]
    runs = _runs(hours, AUDIT_HOURS_PER_PASS)
    assert [(a.hour, b.hour) for a, b in runs] == [(0, 3), (3, 5), (6, 8)]
    stop.set()
    aud.clock = _Clock(now + timedelta(days=1))
    assert aud.run_once() == 0 and len(aud.pending) == 4  # stopped: nothing audited (store not even touched)


def test_advised_hours_survive_a_restart_of_the_owner(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """With ``state_path`` (the owner's: a file in the chDB folder) an auditor killed before an advised hour
    settled leaves it to the next one -- the replayed batch is committed by then and never advised again; an
    audited hour leaves the file; a file that cannot be read is moved aside with a warning, never silently
    dropped, and the auditor starts empty."""
    import json
    import logging
    import threading

    from forumpulse.pipeline.rollup_check import RollupAuditor

    now = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
    state = tmp_path / "forumpulse_rollup_audit.forumpulse.json"
    first = RollupAuditor(None, None, clock=_Clock(now), state_path=state)
    assert first.pending == set() and not state.exists()
    first.advise(datetime(2026, 3, 1, 10, 5, tzinfo=UTC), datetime(2026, 3, 1, 11, 40, tzinfo=UTC))
    assert json.loads(state.read_text())["pending_hours"] == ["2026-03-01T10:00:00+00:00",
                                                              "2026-03-01T11:00:00+00:00"]
    del first  # killed: nothing else written
    second = RollupAuditor(None, None, clock=_Clock(now), state_path=state)
    assert sorted(second.pending) == [datetime(2026, 3, 1, h, tzinfo=UTC) for h in (10, 11)]

    audited: list[tuple[datetime, datetime]] = []
    second._settled = lambda hours: [h for h in hours if h.hour == 10]  # type: ignore[method-assign]
    second._audit = lambda s, e: audited.append((s, e)) or (_Result(), None)  # type: ignore[method-assign,assignment,func-returns-value]
    second._count = lambda res, s, e: None  # type: ignore[method-assign]
    assert second.run_once() == 1 and audited == [(datetime(2026, 3, 1, 10, tzinfo=UTC),
                                                   datetime(2026, 3, 1, 11, tzinfo=UTC))]
    third = RollupAuditor(None, None, clock=_Clock(now), stop=threading.Event(), state_path=state)
    assert sorted(third.pending) == [datetime(2026, 3, 1, 11, tzinfo=UTC)]

    state.write_text('{"pending_hours": ["not a time"]}')
    with caplog.at_level(logging.WARNING, logger="forumpulse.rollup_check"):
        fourth = RollupAuditor(None, None, clock=_Clock(now), state_path=state)
    assert fourth.pending == set() and not state.exists()
    assert (tmp_path / (state.name + ".unreadable")).read_text() == '{"pending_hours": ["not a time"]}'
    assert "could not be read" in caplog.text
    # a file the owner cannot read (permissions, I/O) never stops it: warned, left where it is, none advised
    state.mkdir()  # reading a directory raises IsADirectoryError, an OSError like EACCES
    assert RollupAuditor(None, None, clock=_Clock(now), state_path=state).pending == set() and state.is_dir()


class _Result:
    ok = True


def test_a_chdb_stores_exclusive_section_holds_other_threads_statements(store: Any) -> None:
    """What the audit relies on: while one thread is inside ``exclusive()`` (its own statements run, also
    nested), another thread's statement waits until it leaves."""
    import threading
    import time

    order: list[str] = []
    with store.exclusive():
        t = threading.Thread(target=lambda: (store.query_rows("SELECT 1"), order.append("other")))
        t.start()
        assert store.query_rows("SELECT 2") == [(2,)]  # re-entrant for the holder
        time.sleep(0.3)
        order.append("holder done")
    t.join(10)
    assert order == ["holder done", "other"]


def test_closing_a_chdb_store_waits_for_another_threads_exclusive_section(chdb_path: Path) -> None:
    """The owner's shutdown closes the store while an audit may be rebuilding a rollup: the close waits until
    the section is left (a rebuild is never cut between its delete and its insert), also when the section
    opens a store of its own (the scratch database) -- no deadlock between the two locks."""
    import threading
    import time

    from forumpulse.pipeline.store import open_store

    url = f"chdb:{chdb_path}"
    main = open_store(url, database="fp_close_wait")
    events: list[str] = []
    entered = threading.Event()

    def section() -> None:
        with main.exclusive():
            entered.set()
            scratch = open_store(url, database="fp_close_wait_scratch")
            time.sleep(0.3)
            scratch.command("DROP DATABASE IF EXISTS fp_close_wait_scratch SYNC")
            scratch.close()
            main.command("DROP DATABASE IF EXISTS fp_close_wait SYNC")
            events.append("section done")

    t = threading.Thread(target=section)
    t.start()
    assert entered.wait(10)
    main.close()
    events.append("closed")
    t.join(10)
    assert events == ["section done", "closed"]
