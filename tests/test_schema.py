"""Schema migrations apply from zero on the real engine, are idempotent, and match what the code writes."""

from __future__ import annotations

import subprocess
import sys
import time

import pyarrow as pa
import pytest
from forumpulse.detectors.traffic import RUNS_SCHEMA
from forumpulse.pipeline.consumer import (
    BATCHES_SCHEMA,
    BEAT_TYPE,
    HEARTBEAT_LOG_SCHEMA,
    LIVENESS_SCHEMA,
    PROGRESS_SCHEMA,
)
from forumpulse.pipeline.sources import RETIRED_SCHEMA
from forumpulse.pipeline.store import (
    Migration,
    StoreError,
    load_migrations,
    migrate,
    open_store,
    render,
)
from forumpulse.pipeline.tables import DERIVED_IN_STORE, PUBLISHED_SCHEMA, QUARANTINE_SCHEMA, REQUESTS_SCHEMA

EXPECTED_TABLES = {
    "requests", "quarantine", "site_minute", "topic_minute", "topic_hour", "client_minute", "prefix_minute",
    "prefix_hour", "transfer_minute",
    "detections", "decisions", "pipeline_stats", "source_liveness", "topic_titles", "topic_groups",
    "consumer_batches", "consumer_progress", "source_heartbeat_minute", "ingest_files", "detection_runs",
    "source_retired", "decisions_published", "schema_migrations",
}

# Arrow type written by the code -> ClickHouse column type the schema must have.
CH_TYPE = {
    pa.timestamp("ms", tz="UTC"): {"DateTime64(3, 'UTC')"},
    pa.timestamp("s", tz="UTC"): {"DateTime('UTC')"},
    BEAT_TYPE: {f"SimpleAggregateFunction({f}, Tuple(DateTime64(3, 'UTC'), UInt64, UInt64))" for f in ("min", "max")},
    pa.string(): {"String", "LowCardinality(String)", "IPv6"},
    pa.binary(): {"String"},
    pa.uint16(): {"UInt16"},
    pa.uint32(): {"UInt32"},
    pa.uint64(): {"UInt64"},
    pa.int64(): {"Int64"},
    pa.float32(): {"Nullable(Float32)"},
    pa.bool_(): {"Bool"},
}


def test_migrations_apply_from_zero_and_are_idempotent(empty_store):
    st = empty_store
    if True:
        ran = migrate(st)
        assert [m.version for m in ran] == [m.version for m in load_migrations()]
        tables = {r[0] for r in st.query_rows("SHOW TABLES")}
        assert tables >= EXPECTED_TABLES
        assert migrate(st) == []  # second run applies nothing
        recorded = st.query_rows("SELECT version, checksum FROM schema_migrations ORDER BY version")
        assert [(int(v), c) for v, c in recorded] == [(m.version, m.checksum) for m in load_migrations()]


@pytest.mark.parametrize(("table", "schema"), [
    ("requests", REQUESTS_SCHEMA), ("quarantine", QUARANTINE_SCHEMA), ("consumer_batches", BATCHES_SCHEMA),
    ("source_liveness", LIVENESS_SCHEMA), ("consumer_progress", PROGRESS_SCHEMA),
    ("source_heartbeat_minute", HEARTBEAT_LOG_SCHEMA), ("detection_runs", RUNS_SCHEMA),
    ("source_retired", RETIRED_SCHEMA), ("decisions_published", PUBLISHED_SCHEMA)])
def test_tables_match_what_the_code_writes(module_store, table, schema):
    cols = {n: t for n, t in module_store.query_rows(
        f"SELECT name, type FROM system.columns WHERE database = currentDatabase() AND table = '{table}' "
        "AND default_kind != 'ALIAS'")}
    stored = set(schema.names) - (set(DERIVED_IN_STORE) if table == "requests" else set())
    assert stored == set(cols), f"{table}: code writes {sorted(stored)}, table has {sorted(cols)}"
    for f in schema:
        if f.name in stored:
            assert cols[f.name] in CH_TYPE[f.type], f"{table}.{f.name}: code writes {f.type}, table has {cols[f.name]}"
    aliases = {n for (n,) in module_store.query_rows(
        f"SELECT name FROM system.columns WHERE database = currentDatabase() AND table = '{table}' "
        "AND default_kind = 'ALIAS'")}
    if table == "requests":
        assert set(DERIVED_IN_STORE) <= aliases


def test_changed_applied_migration_is_refused(store, monkeypatch):
    edited = [Migration(m.version, m.name, m.text + "\n-- edited") for m in load_migrations()]
    monkeypatch.setattr("forumpulse.pipeline.store.load_migrations", lambda: edited)
    with pytest.raises(StoreError, match="changed after it was applied"):
        migrate(store)


def test_retention_placeholders_render():
    m = load_migrations()[0]
    def requests_ddl(params: dict[str, int]) -> str:
        return next(s for s in render(m, params) if s.startswith("CREATE TABLE IF NOT EXISTS requests"))

    with_ttl, without = requests_ddl({"raw_ttl_days": 7}), requests_ddl({"raw_ttl_days": 0})
    assert "TTL toDateTime(ts) + INTERVAL 7 DAY" in with_ttl
    assert "TTL" not in without
    assert "_ttl:" not in with_ttl and "_ttl:" not in without


def _rows(n: int, base_ms: int, step_ms: int = 1000) -> pa.Table:
    return pa.table({
        "ts": pa.array([base_ms + i * step_ms for i in range(n)], pa.timestamp("ms", tz="UTC")),
        "site": ["f"] * n,
        "client_ip": [f"10.0.{i % 3}.{i % 7}" for i in range(n)],
        "url": [f"/threads/x.{i % 4}/" for i in range(n)],
        "path": [f"/threads/x.{i % 4}/" for i in range(n)],
        "status": pa.array([200] * n, pa.uint16()),
        "bytes": pa.array([100] * n, pa.uint64()),
        "topic_id": pa.array([i % 4 for i in range(n)], pa.uint64()),
        "page_kind": ["topic_view"] * n,
        "is_static": [False] * n,
        "is_bot": [False] * n,
    })


def test_replayed_block_is_stored_once_in_table_and_every_rollup(module_store):
    st = module_store
    st.command("TRUNCATE TABLE requests")
    for t in ("site_minute", "topic_minute", "topic_hour", "client_minute", "prefix_minute", "prefix_hour"):
        st.command(f"TRUNCATE TABLE {t}")
    now = int(time.time() * 1000)
    block = _rows(500, now)
    st.insert("requests", block, dedup_token="batch-1")
    st.insert("requests", block, dedup_token="batch-1")  # replay after a crash
    st.insert("requests", _rows(10, now), dedup_token="batch-2")
    assert st.query_rows("SELECT count() FROM requests") == [(510,)]
    assert st.query_rows("SELECT sum(requests) FROM site_minute") == [(510,)]
    assert st.query_rows("SELECT sum(requests) FROM client_minute") == [(510,)]
    assert st.query_rows("SELECT sum(requests) FROM prefix_minute") == [(510,)]
    topic_views = st.query_rows("SELECT sum(views) FROM topic_minute")[0][0]
    assert topic_views == st.query_rows("SELECT count() FROM requests WHERE topic_id != 0")[0][0]
    # the cascades (X_minute -> X_hour) drop the replayed block too
    assert st.query_rows("SELECT sum(views) FROM topic_hour")[0][0] == topic_views
    assert st.query_rows("SELECT sum(requests) FROM prefix_hour") == [(510,)]


_HOURLY = [  # (kind, columns with {h}, key)
    ("topic", "topic_id, {h}, sum(views), sum(replies), sum(bot_views), uniqMerge(visitors)", "topic_id"),
    ("prefix", "prefix, prefix_len, {h}, sum(requests), uniqMerge(clients)", "prefix, prefix_len"),
]
HOURLY_FROM_MINUTES = "SELECT * FROM (" + " UNION ALL ".join(
    f"SELECT '{k}', toString(tuple({c.format(h='toStartOfHour(minute) AS h')})) FROM {k}_minute GROUP BY {key}, h"
    for k, c, key in _HOURLY) + ") ORDER BY 1, 2"
HOURLY = "SELECT * FROM (" + " UNION ALL ".join(
    f"SELECT '{k}', toString(tuple({c.format(h='hour AS h')})) FROM {k}_hour GROUP BY {key}, h"
    for k, c, key in _HOURLY) + ") ORDER BY 1, 2"


def test_upgrade_to_0003_backfills_hourly_rollups_once_and_keeps_requests(empty_store):
    st = empty_store
    params = {"raw_ttl_days": 0, "rollup_ttl_days": 0}
    older = [m for m in load_migrations() if m.version < 3]
    (m3,) = [m for m in load_migrations() if m.version == 3]
    for m in older:  # a store as it was before 0003, holding history
        for stmt in render(m, params):
            st.command(stmt)
    base = 1_700_000_000_000
    for i in range(4):  # 4 blocks over ~5 hours: one (topic, minute) row can come from several blocks
        st.insert("requests", _rows(700, base + i * 997, step_ms=26_000), dedup_token=f"old-{i}")
    before = st.query_rows("SELECT url, referer, count() FROM requests GROUP BY url, referer ORDER BY url")
    want = st.query_rows(HOURLY_FROM_MINUTES)
    assert {k for k, _ in want} == {"topic", "prefix"} and len(want) >= 3 * 5
    views = "SELECT sum(views) FROM topic_hour"

    stmts = render(m3, params)
    for stmt in stmts:
        st.command(stmt)
    assert st.query_rows(HOURLY) == want
    for stmt in stmts:  # a failed migration is re-run from its first statement: still counted once
        st.command(stmt)
    assert st.query_rows(HOURLY) == want
    assert st.query_rows(views) == [(2800 * 3 // 4,)]  # topics 1..3 of 0..3
    assert st.query_rows("SELECT (SELECT count() FROM topic_hour) + (SELECT count() FROM prefix_hour)") == [(len(want),)]

    types = dict(st.query_rows("SELECT name, type FROM system.columns WHERE database = currentDatabase() "
                               "AND table = 'requests' AND name IN ('url', 'referer')"))
    assert types == {"url": "LowCardinality(String)", "referer": "LowCardinality(String)"}
    assert st.query_rows("SELECT url, referer, count() FROM requests GROUP BY url, referer ORDER BY url") == before

    # new inserts reach topic_hour through the cascade, and the pipeline's Arrow strings still insert
    st.insert("requests", _rows(300, base + 3 * 3_600_000, step_ms=7_000), dedup_token="new-1")
    st.insert("requests", _rows(300, base + 3 * 3_600_000, step_ms=7_000), dedup_token="new-1")
    assert st.query_rows(HOURLY) == st.query_rows(HOURLY_FROM_MINUTES)
    assert st.query_rows(views) == [((2800 + 300) * 3 // 4,)]


def test_second_process_gets_a_clear_busy_error(store, chdb_path):
    code = (
        "import sys\nfrom forumpulse.pipeline.store import open_store, StoreBusy\n"
        f"try:\n    open_store('chdb:{chdb_path}')\nexcept StoreBusy as e:\n    print(e); sys.exit(7)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 7, r.stderr
    assert "in use by another process" in r.stdout and "forumpulse run" in r.stdout


def test_second_folder_in_one_process_is_refused_clearly(store, tmp_path):
    with pytest.raises(StoreError, match="one data folder per process"):
        open_store(f"chdb:{tmp_path}")


def test_stores_on_one_folder_share_the_engine_with_separate_databases(chdb_path):
    a = open_store(f"chdb:{chdb_path}", database="share_a")
    b = open_store(f"chdb:{chdb_path}", database="share_b")
    try:
        a.command("CREATE TABLE IF NOT EXISTS x (v UInt8) ENGINE = Memory")
        b.command("CREATE TABLE IF NOT EXISTS x (v UInt8) ENGINE = Memory")
        a.command("INSERT INTO x VALUES (1)")
        assert a.query_rows("SELECT count() FROM x") == [(1,)]
        assert b.query_rows("SELECT count() FROM x") == [(0,)]
    finally:
        a.close()
        b.close()


def test_derived_path_and_query_equal_the_parsers(store, settings):
    """requests.path / requests.query are computed from the stored url: they must equal what the parser and the
    privacy filter produced for every kind of request target (origin form, absolute squid URLs, CONNECT,
    HTTP/0.9, binary garbage, session parameters)."""
    from pathlib import Path

    from forumpulse.pipeline.process import Processor, SourceContext

    fix = Path(__file__).parent / "fixtures"
    sources = [
        (fix / "ingest" / "mixed.log", "combined"),
        (fix / "parse" / "NASA_access_log_Aug95.partial_damaged.log", "common"),
        (fix / "conformance" / "plaso_squid_access.log", "squid"),  # absolute URLs, CONNECT, IPv6
        (fix / "conformance" / "plaso_apache_access.log", "auto"),
    ]
    extra = [
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET http://Example.com:3128/a/b?x=1&s=abc&y=2 HTTP/1.1" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET HTTP://h?q=/x HTTP/1.1" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET https://h HTTP/1.1" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "CONNECT h.example:443 HTTP/1.1" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET /" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "\\x16\\x03\\x01?x" 400 0 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET /t/x?a=1?b=2&sid=9 HTTP/1.1" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET ftp://h/p/?PHPSESSID=1 HTTP/1.0" 200 1 "-" "-"',
        '10.0.0.1 - - [12/Mar/2026:20:01:02 +0000] "GET *?x HTTP/1.1" 200 1 "-" "-"',
    ]
    proc = Processor(settings)
    expected: list[tuple[str, str, str]] = []
    for i, (path, fmt) in enumerate([*sources, (None, "combined")]):
        lines = path.read_bytes().splitlines() if path else [x.encode() for x in extra]
        batch = proc.process(lines, SourceContext(format=fmt, origin_file=f"f{i}"))
        store.insert("requests", batch.requests)
        s = batch.stream
        expected += zip(s.column("url").to_pylist(), s.column("path").to_pylist(), s.column("query").to_pylist(),
                        strict=True)
    got = store.query_rows("SELECT url, path, query FROM requests")
    assert len(expected) > 1800
    assert sorted(got) == sorted(expected)


def test_migrate_in_background_hands_over_what_ran_and_the_error(empty_store):
    from forumpulse.pipeline.store import migrate_in_background

    fut = migrate_in_background(empty_store, {"raw_ttl_days": 0, "rollup_ttl_days": 0})
    assert [m.version for m in fut.result(timeout=120)] == [m.version for m in load_migrations()]
    assert migrate_in_background(empty_store).result(timeout=120) == []

    class Refusing:
        def command(self, sql: str) -> None:
            raise StoreError("Code: 243. NOT_ENOUGH_SPACE")

    failed = migrate_in_background(Refusing())  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="NOT_ENOUGH_SPACE"):
        failed.result(timeout=60)
