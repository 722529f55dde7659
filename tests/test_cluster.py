"""The cluster schema is generated from the migrations, parses in the real ClickHouse parser, and is complete."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
from forumpulse.pipeline.cluster import SHARDING_KEYS, cluster_sql, cluster_statements
from forumpulse.pipeline.store import load_migrations, render

ROOT = Path(__file__).resolve().parent.parent


def single_node_objects() -> tuple[list[str], list[str]]:
    tables, views = [], []
    for m in load_migrations():
        for s in render(m):
            if mt := re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", s):
                tables.append(mt.group(1))
            elif mv := re.match(r"CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)", s):
                views.append(mv.group(1))
    return tables, views


def replacing_keys() -> dict[str, str]:
    """ReplacingMergeTree tables of the migrations -> the columns of their ORDER BY, as cityHash64(...)."""
    out = {}
    for m in load_migrations():
        for s in render(m):
            t = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)\s*\(.*\)\s*ENGINE\s*=\s*ReplacingMergeTree\b.*?"
                         r"ORDER BY \(?([\w, ]+)\)?", s, re.S)
            if t:
                out[t.group(1)] = f"cityHash64({', '.join(c.strip() for c in t.group(2).split(','))})"
    return out


def test_replacing_tables_keep_every_row_of_a_key_on_one_shard():
    """FINAL runs per shard: a ReplacingMergeTree spread with rand() returned one row per shard holding a key --
    the states of one detection, several of them stale.  Each is sharded by its sorting key instead."""
    keys = replacing_keys()
    assert {"detections", "source_liveness", "consumer_progress", "source_retired", "decisions_published"} <= set(keys)
    text = cluster_sql("c1", "fp")
    for t, key in keys.items():
        assert f"ENGINE = Distributed(c1, fp, {t}_local, {key})" in text, t
    assert "detections_local, cityHash64(site, kind, id))" in text


def test_every_statement_parses_in_clickhouse(store):
    stmts = cluster_statements("c1", "fp")
    # formatQuery runs ClickHouse's own parser; the DDL travels as data (braces in {shard} are not parameters)
    fp_ddl = pa.table({"q": stmts})  # noqa: F841 - read by chDB's Python() table function
    formatted = store.query_rows("SELECT formatQuery(q) FROM Python(fp_ddl)")
    assert len(formatted) == len(stmts)


def test_every_table_is_replicated_and_distributed_and_views_stay_local():
    tables, views = single_node_objects()
    text = cluster_sql("c1", "fp")
    for t in tables:
        assert re.search(rf"CREATE TABLE IF NOT EXISTS fp\.{t}_local ON CLUSTER c1\n\(.*?\)\nENGINE = Replicated\w*MergeTree\("
                         rf"'/clickhouse/tables/{{shard}}/fp/{t}_local', '{{replica}}'", text, re.S), t
        key = SHARDING_KEYS.get(t) or replacing_keys().get(t, "rand()")
        assert f"CREATE TABLE IF NOT EXISTS fp.{t} ON CLUSTER c1 AS fp.{t}_local\nENGINE = Distributed(c1, fp, {t}_local, {key})" in text
    for v in views:
        m = re.search(rf"CREATE MATERIALIZED VIEW IF NOT EXISTS fp\.{v} ON CLUSTER c1 TO fp\.(\w+) AS(.*?)(;|$)", text, re.S)
        assert m, v
        assert m.group(1).endswith("_local")
        sources = re.findall(r"\bFROM ([\w.]+)", m.group(2))
        assert sources and all(re.fullmatch(r"fp\.\w+_local", x) for x in sources), (v, sources)
    # the cascaded hourly topic rollup reads the shard's minute rollup
    assert re.search(r"VIEW IF NOT EXISTS fp\.topic_hour_mv ON CLUSTER c1 TO fp\.topic_hour_local AS.*?FROM fp\.topic_minute_local",
                     text, re.S)
    assert "non_replicated_deduplication_window" not in text
    # engine parameters survive replication (ReplacingMergeTree keeps its version column)
    assert re.search(r"ReplicatedReplacingMergeTree\('/clickhouse/tables/\{shard\}/fp/detections_local', '\{replica\}', updated_at\)", text)


def test_committed_example_is_current():
    committed = (ROOT / "schemas" / "cluster" / "forum_cluster.sql").read_text()
    assert committed == cluster_sql("forum_cluster", "forumpulse"), "regenerate: forumpulse db cluster-ddl > schemas/cluster/forum_cluster.sql"


def test_later_alters_reach_shards_and_distributed_tables_and_backfills_are_left_out():
    alters = [s for m in load_migrations() for s in render(m) if s.startswith("ALTER TABLE ")]
    assert alters, "migration 0003 alters requests"
    text = cluster_sql("c1", "fp")
    for a in alters:
        table, change = re.match(r"ALTER TABLE (\w+) (.*)$", a, re.S).groups()
        if change.startswith("MODIFY SETTING non_replicated_deduplication_window"):  # 0013: replicated tables
            assert f"ALTER TABLE fp.{table}" not in text  # deduplicate by default; Distributed has no such setting
            continue
        assert f"ALTER TABLE fp.{table}_local ON CLUSTER c1 {change}" in text
        assert f"ALTER TABLE fp.{table} ON CLUSTER c1 {change}" in text
    assert "INSERT INTO" not in text and "TRUNCATE" not in text
