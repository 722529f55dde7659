"""Migration 0006: a store whose `requests` is empty gets it partitioned by day (every new store); a store that
already holds rows keeps monthly partitions and every row.  The views follow the exchanged table, a block spanning
many days is one part per day and is still deduplicated as a whole (table and rollups), and an upgrade interrupted
at any step completes when run again (`--@only-if` guards)."""

from __future__ import annotations

import pytest
from forumpulse.pipeline.store import guarded, load_migrations, migrate, render
from test_schema import _rows

PARAMS = {"raw_ttl_days": 0, "rollup_ttl_days": 0}
BASE = 1_700_000_000_000  # 2023-11-14
DAY = 86_400_000


def _partition_key(st) -> str:
    return str(st.query_rows("SELECT partition_key FROM system.tables WHERE database = currentDatabase() "
                             "AND name = 'requests'")[0][0])


def _tables(st) -> set[str]:
    return {r[0] for r in st.query_rows("SELECT name FROM system.tables WHERE database = currentDatabase()")}


def _state(st) -> tuple[object, ...]:
    return (st.query_rows("SELECT count(), sum(bytes), uniqExact(url) FROM requests")[0],
            st.query_rows("SELECT sum(requests), uniqMerge(visitors) FROM site_minute")[0],
            st.query_rows("SELECT sum(views) FROM topic_minute")[0])


def _from_6() -> list[int]:
    """What migrating a store made before 0006 applies: 0006 and every later migration."""
    return [m.version for m in load_migrations() if m.version >= 6]


def _before_0006(st, monkeypatch, days_of_rows: int) -> None:
    import forumpulse.pipeline.store as store_module

    every = load_migrations()
    monkeypatch.setattr(store_module, "load_migrations", lambda: [m for m in every if m.version < 6])
    migrate(st, PARAMS, baseline=False)  # a store made before the baseline covered 0006
    monkeypatch.setattr(store_module, "load_migrations", lambda: every)
    for i in range(days_of_rows):
        st.insert("requests", _rows(500, BASE + i * DAY, step_ms=60_000), dedup_token=f"old-{i}")
    assert _partition_key(st) == "toYYYYMM(ts)"


def test_a_new_store_has_requests_by_day(store):
    assert _partition_key(store) == "toYYYYMMDD(ts)"
    assert "requests_by_day" not in _tables(store)


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4, 5])
def test_empty_store_upgrade_survives_an_interruption_and_the_views_follow(empty_store, monkeypatch, stop_after):
    st = empty_store
    _before_0006(st, monkeypatch, 0)
    (m6,) = [m for m in load_migrations() if m.version == 6]
    for stmt in render(m6, PARAMS)[:stop_after]:  # an earlier attempt ran the first statements and died
        guard, sql = guarded(stmt)
        if guard is None or str(st.query_rows(guard)[0][0]).lower() in ("1", "true"):
            st.command(sql)
    assert [m.version for m in migrate(st, PARAMS)] == _from_6()
    assert _partition_key(st) == "toYYYYMMDD(ts)"
    assert "requests_by_day" not in _tables(st)
    st.insert("requests", _rows(200, BASE, step_ms=60_000), dedup_token="new-1")
    assert _state(st)[0][0] == 200 and _state(st)[1][0] == 200  # the rollups are fed by the new table


def test_a_store_with_rows_keeps_them_and_its_monthly_partitions(empty_store, monkeypatch):
    st = empty_store
    _before_0006(st, monkeypatch, 3)
    before = _state(st)
    assert [m.version for m in migrate(st, PARAMS)] == _from_6()
    assert _partition_key(st) == "toYYYYMM(ts)" and _state(st) == before
    assert "requests_by_day" not in _tables(st)


def test_a_block_over_many_days_is_one_part_per_day_and_deduplicated_whole(store):
    """A quiet site's archive: one 250-row block over 250 days (more than max_partitions_per_insert_block's
    default 100), inserted twice with one token (a re-ingest or a replay): stored once, rollups too."""
    block = _rows(250, BASE, step_ms=DAY)
    store.insert("requests", block, dedup_token="archive-1")
    first = _state(store)
    store.insert("requests", block, dedup_token="archive-1")
    views = sum(1 for i in range(250) if i % 4)  # topic 0 is no topic
    assert _state(store) == first and first[0][0] == 250 and first[1][0] == 250 and first[2][0] == views
    parts = store.query_rows("SELECT uniqExact(partition) FROM system.parts WHERE database = currentDatabase() "
                             "AND table = 'requests' AND active")[0][0]
    assert parts == 250
    store.insert("requests", _rows(5, BASE, step_ms=DAY), dedup_token="archive-2")  # another block: stored
    assert _state(store)[0][0] == 255


def test_two_concurrent_runs_that_exchanged_twice_are_repaired(empty_store, monkeypatch):
    """Consumers starting together on a new server: both passed the exchange guard and both exchanged, which put
    the monthly table back; the rest of the migration puts the daily one in place and drops the empty monthly."""
    st = empty_store
    _before_0006(st, monkeypatch, 0)
    (m6,) = [m for m in load_migrations() if m.version == 6]
    steps = [guarded(x) for x in render(m6, PARAMS)]
    st.command(steps[0][1])  # CREATE requests_by_day (daily)
    st.command(steps[1][1])  # process A exchanges
    st.command(steps[1][1])  # process B, past the same guard, exchanges back
    assert _partition_key(st) == "toYYYYMM(ts)"
    for guard, sql in steps[2:]:  # process A goes on with the rest, as the runner does
        if guard is None or str(st.query_rows(guard)[0][0]).lower() in ("1", "true"):
            st.command(sql)
    assert _partition_key(st) == "toYYYYMMDD(ts)" and "requests_by_day" not in _tables(st)
    assert [m.version for m in migrate(st, PARAMS)] == _from_6()  # B's run of the whole migration changes nothing
    assert _partition_key(st) == "toYYYYMMDD(ts)" and "requests_by_day" not in _tables(st)
