"""Retention changes reach existing tables only through `db migrate --apply-retention`, and an archive that
was dropped by the old TTL loads once the retention allows it (nothing is lost to deduplication).

Tables are created with the retention configured at the time; a later `retention.*` never changes them
implicitly (a command run without the configuration must not shorten a store that keeps archives).  `ingest`
counts expired rows against the table's real TTL and says when the configuration differs; a block whose rows are
all past the TTL is not inserted, so its deduplication token is still free when the same file is ingested again
after the retention was changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from forumpulse.pipeline.store import (
    apply_retention,
    migrate,
    open_store,
    retention_changes,
    retention_targets,
    table_ttl_days,
)

EXE = Path(sys.executable).with_name("forumpulse")


def test_targets_cover_every_configured_table() -> None:
    t = retention_targets()
    assert t["requests"] == ("raw", "toDateTime(ts)") and t["quarantine"][0] == "quarantine"
    assert {k for k, (kind, _) in t.items() if kind == "rollup"} >= {"site_minute", "topic_minute", "topic_hour"}


def test_changes_are_reported_then_applied_idempotently(tmp_path: Path) -> None:
    st = open_store(f"chdb:{tmp_path / 'st'}")
    try:
        migrate(st)  # defaults: raw 90, rollups 730
        assert retention_changes(st) == []
        assert table_ttl_days(st)["requests"] == 90
        want = {"raw_ttl_days": 0, "rollup_ttl_days": 400}
        changes = {c.table: (c.current_days, c.wanted_days) for c in retention_changes(st, want)}
        assert changes["requests"] == (90, 0) and changes["site_minute"] == (730, 400)
        assert "quarantine" not in changes  # unchanged kinds stay
        assert table_ttl_days(st)["requests"] == 90  # reporting changed nothing
        applied = apply_retention(st, want)
        assert {c.table for c in applied} == set(changes)
        ttl = table_ttl_days(st)
        assert ttl["requests"] == 0 and ttl["site_minute"] == 400 and ttl["quarantine"] == 30
        assert retention_changes(st, want) == [] and apply_retention(st, want) == []
        migrate(st)  # a later migrate with other (default) parameters does not undo it
        assert table_ttl_days(st)["requests"] == 0
    finally:
        st.close()


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=180, cwd=cwd)


def _counts(path: Path) -> tuple[int, int]:
    st = open_store(f"chdb:{path}")
    try:
        return (int(st.query_rows("SELECT count() FROM requests")[0][0]),
                int(st.query_rows("SELECT count() FROM quarantine")[0][0]))
    finally:
        st.close()


def test_archive_dropped_by_the_old_ttl_loads_after_apply_retention(tmp_path: Path) -> None:
    log = tmp_path / "archive.log"
    log.write_text("".join(f'1.2.3.4 - - [01/Feb/2024:10:00:0{i} +0000] "GET /t/1 HTTP/1.1" 200 10 "-" "Mozilla/5.0"\n'
                           for i in range(5)) + "not a log line\n")
    st = tmp_path / "st"
    r = _run("ingest", "--store", f"chdb:{st}", "-f", "combined", str(log), cwd=tmp_path)
    assert r.returncode == 0 and "5 of the loaded rows are older than retention.raw_days" in r.stderr, r.stderr
    assert "loaded 5 (of which 5 past retention, not kept)  quarantined 1" in r.stdout, r.stdout  # user trial 40
    assert _counts(st) == (0, 1)
    cfg = tmp_path / "keep.yaml"
    cfg.write_text(f"store:\n  url: chdb:{st}\nretention:\n  raw_days: 0\n  rollup_days: 0\n")
    # the configuration alone does not change the table, and ingest says so instead of claiming the rows stored
    r = _run("ingest", "-c", str(cfg), "-f", "combined", str(log), cwd=tmp_path)
    assert r.returncode == 0
    assert "requests keeps rows 90 days (its TTL) but retention.raw_days says forever" in r.stderr
    assert "5 of the loaded rows are older" in r.stderr
    assert _counts(st) == (0, 1)
    r = _run("db", "migrate", "-c", str(cfg), cwd=tmp_path)
    assert "warning: requests keeps rows 90 days but the configuration says forever" in r.stderr
    r = _run("db", "migrate", "-c", str(cfg), "--apply-retention", cwd=tmp_path)
    assert r.returncode == 0 and "retention: requests now keeps rows forever (was 90 days)" in r.stdout
    r = _run("ingest", "-c", str(cfg), "-f", "combined", str(log), cwd=tmp_path)
    assert r.returncode == 0 and "older than" not in r.stderr and "keeps rows" not in r.stderr, r.stderr
    assert _counts(st) == (5, 1)  # the archive is stored; the quarantined line is not doubled
    r = _run("ingest", "-c", str(cfg), "-f", "combined", str(log), cwd=tmp_path)
    assert _counts(st) == (5, 1)  # and a further re-ingest stores nothing twice


def test_rows_past_the_raw_ttl_but_not_the_rollups_still_feed_the_rollups(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    when = datetime.now(UTC) - timedelta(days=200)  # past raw (90 days), inside the rollups (730 days)
    stamp = when.strftime("%d/%b/%Y:%H:%M:%S +0000")
    log = tmp_path / "old.log"
    log.write_text("".join(f'1.2.3.4 - - [{stamp}] "GET /t/{i} HTTP/1.1" 200 10 "-" "Mozilla/5.0"\n'
                           for i in range(30)))
    st = tmp_path / "st"
    r = _run("ingest", "--store", f"chdb:{st}", "-f", "combined", str(log), cwd=tmp_path)
    assert r.returncode == 0 and "30 of the loaded rows are older than retention.raw_days" in r.stderr
    s = open_store(f"chdb:{st}")
    try:
        assert int(s.query_rows("SELECT count() FROM requests")[0][0]) == 0
        assert int(s.query_rows("SELECT sum(requests) FROM site_minute")[0][0]) == 30  # the rollups have them
    finally:
        s.close()
