"""Migration 0006 rebuilds `requests` with daily partitions: rows and rollups survive, the views keep firing, and
an upgrade interrupted at any step completes when run again (`--@only-if` guards)."""

from __future__ import annotations

import pytest
from forumpulse.pipeline.store import guarded, load_migrations, migrate, render
from test_schema import _rows

PARAMS = {"raw_ttl_days": 0, "rollup_ttl_days": 0}
BASE = 1_700_000_000_000  # 2023-11-14


def _partition_key(st) -> str:
    return str(st.query_rows("SELECT partition_key FROM system.tables WHERE database = currentDatabase() "
                             "AND name = 'requests'")[0][0])


def _state(st) -> tuple[object, ...]:
    return (st.query_rows("SELECT count(), sum(bytes), uniqExact(url) FROM requests")[0],
            st.query_rows("SELECT sum(requests), uniqMerge(visitors) FROM site_minute")[0],
            st.query_rows("SELECT sum(views) FROM topic_minute")[0])


def _store_before_0006(st, monkeypatch) -> None:
    import forumpulse.pipeline.store as store_module

    every = load_migrations()
    monkeypatch.setattr(store_module, "load_migrations", lambda: [m for m in every if m.version < 6])
    migrate(st, PARAMS)
    monkeypatch.setattr(store_module, "load_migrations", lambda: every)
    for i in range(3):  # three days of history
        st.insert("requests", _rows(500, BASE + i * 86_400_000, step_ms=60_000), dedup_token=f"old-{i}")
    assert _partition_key(st) == "toYYYYMM(ts)"


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4])
def test_upgrade_keeps_rows_and_rollups_and_survives_an_interruption(empty_store, monkeypatch, stop_after):
    st = empty_store
    _store_before_0006(st, monkeypatch)
    before = _state(st)
    (m6,) = [m for m in load_migrations() if m.version == 6]
    # an earlier attempt ran the first `stop_after` statements and died
    for stmt in render(m6, PARAMS)[:stop_after]:
        _, sql = guarded(stmt)
        st.command(sql)
    assert [m.version for m in migrate(st, PARAMS)] == [6]
    assert _partition_key(st) == "toYYYYMMDD(ts)"
    assert _state(st) == before
    tables = {r[0] for r in st.query_rows("SELECT name FROM system.tables WHERE database = currentDatabase()")}
    assert "requests_by_day" not in tables
    # the views follow the new table: a new block reaches the rollups once
    st.insert("requests", _rows(200, BASE + 3 * 86_400_000, step_ms=60_000), dedup_token="new-1")
    st.insert("requests", _rows(200, BASE + 3 * 86_400_000, step_ms=60_000), dedup_token="new-1")
    after = _state(st)
    assert after[0][0] == before[0][0] + 200 and after[1][0] == before[1][0] + 200
    parts = st.query_rows("SELECT uniqExact(partition) FROM system.parts WHERE database = currentDatabase() "
                          "AND table = 'requests' AND active")
    days = st.query_rows("SELECT uniqExact(toYYYYMMDD(ts)) FROM requests")
    assert parts == days and days[0][0] >= 4  # one partition per day
