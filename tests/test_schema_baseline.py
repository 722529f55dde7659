"""The schema baseline (schemas/baseline/) builds exactly what the migrations it covers build, on the real engine.

A new database gets the baseline; every other database takes the migrations one by one.  If the two ever differ,
a new store would not be the store an upgraded one is, so every table and view is compared, statement by
statement, for several retention settings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from forumpulse.pipeline.store import (
    Migration,
    Store,
    StoreError,
    load_baseline,
    load_migrations,
    migrate,
    open_store,
    render,
)

_n = iter(range(1, 10**9))

PARAMS = [
    {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0},
    None,  # the defaults (every TTL on)
    {"raw_ttl_days": 7, "rollup_ttl_days": 0, "quarantine_ttl_days": 3, "stats_ttl_days": 1},
]


@pytest.fixture
def new_db(chdb_path: Path) -> Iterator[Callable[[], Store]]:
    """Makes new, empty databases in the session's chDB folder (closed after the test)."""
    stores: list[Store] = []

    def make() -> Store:
        st = open_store(f"chdb:{chdb_path}", database=f"b{next(_n)}")
        stores.append(st)
        return st

    yield make
    for st in stores:
        st.close()


def schema_of(st: Store) -> dict[str, tuple[str, ...]]:
    """Every table and view of the database: its CREATE statement (database name and UUIDs taken out), and its
    columns with type, default, codec and position."""
    out: dict[str, tuple[str, ...]] = {}
    for name, engine, create in st.query_rows(
            "SELECT name, engine, create_table_query FROM system.tables WHERE database = currentDatabase()"):
        create = create.replace(f"{st.database}.", "DB.")
        create = re.sub(r" UUID '[0-9a-f-]+'", "", create)
        cols = st.query_rows(
            "SELECT name, type, default_kind, default_expression, compression_codec, position FROM system.columns "
            f"WHERE database = currentDatabase() AND table = '{name}' ORDER BY position")
        out[name] = (engine, create, *(repr(c) for c in cols))
    return out


def test_the_baseline_covers_every_migration_it_names():
    base = load_baseline()
    assert base is not None
    versions = [m.version for m in load_migrations()]
    assert versions[:base.version] == list(range(1, base.version + 1))


@pytest.mark.parametrize("params", PARAMS, ids=["no-ttl", "defaults", "mixed"])
def test_a_new_database_from_the_baseline_equals_one_from_the_migrations(new_db, params):
    chain, baseline = new_db(), new_db()
    ran_chain = migrate(chain, params, baseline=False)
    ran_base = migrate(baseline, params)
    assert [m.version for m in ran_base] == [m.version for m in ran_chain] == [m.version for m in load_migrations()]
    a, b = schema_of(chain), schema_of(baseline)
    assert sorted(a) == sorted(b)
    assert len(a) >= 24  # 16 tables, 7 views and schema_migrations
    for name in a:
        assert a[name] == b[name], name
    recorded = "SELECT version, name, checksum FROM schema_migrations ORDER BY version"
    assert chain.query_rows(recorded) == baseline.query_rows(recorded)
    assert migrate(baseline, params) == []  # recorded: nothing runs again


def _counting(st: Store) -> list[int]:
    n = [0]
    orig = st.command

    def counted(sql: str) -> None:
        n[0] += 1
        orig(sql)

    st.command = counted  # type: ignore[method-assign]
    return n


def test_the_baseline_runs_far_fewer_statements(new_db):
    chain, baseline = new_db(), new_db()
    n_chain, n_base = _counting(chain), _counting(baseline)
    migrate(chain, None, baseline=False)
    migrate(baseline, None)
    # schema_migrations, the baseline's statements, one INSERT of the records; then each later migration's
    # statements and its record
    base = load_baseline()
    assert base is not None
    later = [m for m in load_migrations() if m.version > base.version]
    assert n_base[0] == 1 + len(render(base, None)) + 1 + sum(len(render(m, None)) + 1 for m in later)
    assert n_base[0] < 0.6 * n_chain[0], (n_base, n_chain)


def test_an_interrupted_baseline_is_completed_by_the_migrations(new_db):
    """A baseline cut half-way (the process killed) leaves tables but no record: the next run takes the
    migrations, which complete it into the same schema."""
    params = PARAMS[0]
    full, cut = new_db(), new_db()
    migrate(full, params, baseline=False)
    stmts = render(load_baseline(), params)  # type: ignore[arg-type]
    for stmt in stmts[: len(stmts) // 2]:
        cut.command(stmt)
    ran = migrate(cut, params)
    assert [m.version for m in ran] == [m.version for m in load_migrations()]
    assert schema_of(cut) == schema_of(full)


def test_a_database_with_a_table_of_its_own_takes_the_migrations(new_db):
    mine = "CREATE TABLE mine (x UInt8) ENGINE = MergeTree ORDER BY x"
    st, ref = new_db(), new_db()
    st.command(mine)
    ref.command(mine)
    n_st, n_ref = _counting(st), _counting(ref)
    migrate(st, PARAMS[0])
    migrate(ref, PARAMS[0], baseline=False)
    assert n_st[0] == n_ref[0]  # statement for statement the migrations, not the baseline
    assert schema_of(st) == schema_of(ref)


def test_a_baseline_that_does_not_match_the_migrations_is_refused(new_db, monkeypatch):
    st = new_db()
    monkeypatch.setattr("forumpulse.pipeline.store.load_migrations",
                        lambda: [m for m in load_migrations() if m.version != 2])
    with pytest.raises(StoreError, match="baseline covers"):
        migrate(st)


def test_baseline_files_must_be_named_by_the_version_they_cover(tmp_path):
    (tmp_path / "0003_baseline.sql").write_text("SELECT 1;\n")
    (tmp_path / "0005_baseline.sql").write_text("SELECT 2;\n")
    assert load_baseline(tmp_path) == Migration(5, "baseline", "SELECT 2;\n")
    assert load_baseline(tmp_path / "none") is None
    (tmp_path / "baseline.sql").write_text("")
    with pytest.raises(ValueError, match=r"NNNN_baseline\.sql"):
        load_baseline(tmp_path)
