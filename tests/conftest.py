"""Shared test fixtures.  Tests run against the real engines: chDB (ClickHouse in-process), Kafka, syslog-ng."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from forumpulse.pipeline.config import Settings, load_settings
from forumpulse.pipeline.store import Store, migrate, open_store

FIXTURES = Path(__file__).parent / "fixtures"

# Tests never read a developer's config file or environment overrides.
for _k in list(os.environ):
    if _k.startswith("FORUMPULSE_"):
        del os.environ[_k]


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    """Default settings with retention off (fixture logs are old; TTL would drop them on insert), and the DoS
    spool in a folder of the test's own (the default, ``data/spool`` under the working directory, is the
    checkout's)."""
    s = load_settings()
    s.detectors = {"live": {"spool_dir": str(tmp_path_factory.mktemp("spool"))}}
    s.retention.raw_days = 0
    s.retention.rollup_days = 0
    s.retention.quarantine_days = 0
    return s


NO_TTL = {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0}
_counter = iter(range(1, 10**9))


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one chDB data folder of this test process (chDB serves one folder per process)."""
    return tmp_path_factory.mktemp("chdb")


def _fresh(chdb_path: Path, migrated: bool) -> Store:
    st = open_store(f"chdb:{chdb_path}", database=f"t{next(_counter)}")
    if migrated:
        migrate(st, NO_TTL)
    return st


def _drop(chdb_path: Path, st: Store) -> None:
    """Drop a test's database when it is done (the store may have been closed by the test).  Every database left
    in the session's one chDB folder made the next ones slower to create and use (~30 tables each: a fresh
    migrated store took 1 s with 20 databases left, 5.8 s with 120), so each test's set-up cost grew with the
    number of tests run before it."""
    db = getattr(st, "database", None)
    if db is None:
        st.close()
        return
    try:
        st.command(f"DROP DATABASE IF EXISTS {db} SYNC")
    except Exception:  # closed by the test: open it again to drop it
        again = open_store(f"chdb:{chdb_path}", database=db)
        try:
            again.command(f"DROP DATABASE IF EXISTS {db} SYNC")
        finally:
            again.close()
    st.close()


@pytest.fixture
def store(chdb_path: Path) -> Iterator[Store]:
    """A fresh, migrated database (retention off) in the session's chDB folder, for one test."""
    st = _fresh(chdb_path, True)
    yield st
    _drop(chdb_path, st)


@pytest.fixture
def empty_store(chdb_path: Path) -> Iterator[Store]:
    """A fresh database with no tables, for migration tests."""
    st = _fresh(chdb_path, False)
    yield st
    _drop(chdb_path, st)


@pytest.fixture(scope="module")
def module_store(chdb_path: Path) -> Iterator[Store]:
    """A migrated database shared by one test module."""
    st = _fresh(chdb_path, True)
    yield st
    _drop(chdb_path, st)
