"""Cluster variant of the schema, generated from the same migrations (never written by hand).

For a ClickHouse cluster every table ``T`` of the migrations becomes:

* ``T_local``: the same columns on every shard, engine ``Replicated<Engine>`` (Keeper path
  ``/clickhouse/tables/{shard}/<db>/T_local``, replica ``{replica}``), created ``ON CLUSTER``;
* ``T``: a ``Distributed`` table over ``T_local`` with the same name the single-node schema uses, so every query
  (dashboards, detectors, reports) runs unchanged.

``requests`` is sharded by ``cityHash64(client_ip)``: all lines of one client land on one shard, so per-client
and (for IPv4 /24 mostly) per-prefix questions are answered shard-locally, and the materialized views — created on
every shard, reading ``requests_local`` and writing the rollups' ``_local`` tables — keep per-client rollups
local.  Topic share is a sum over shards anyway (``sum``/``uniqMerge`` over the Distributed rollups are exact).

Deduplication: replicated tables deduplicate insert blocks by default (``insert_deduplication_token`` works as on
one node), so the single-node ``non_replicated_deduplication_window`` setting is dropped (and a later migration
setting it, 0013, is left out).

Later migrations: ``ALTER TABLE T …`` becomes the same ALTER ``ON CLUSTER`` on ``T_local`` and on ``T``; data
backfills (``INSERT INTO`` / ``TRUNCATE TABLE`` of a new rollup, e.g. 0003's ``topic_hour``) are left out — a
cluster created from this DDL has no rows to backfill; to upgrade a cluster in place, run them once per shard on
the ``_local`` tables.

Misuse to avoid: insert into ``T`` (Distributed) or into ``T_local`` on a shard chosen by the same key — never
both; and do not create the single-node schema on a cluster.
"""

from __future__ import annotations

import re
from typing import Any

from forumpulse.pipeline.store import guarded, load_migrations, render

#: sharding keys by table; a ReplacingMergeTree table not named here is sharded by the hash of its sorting key
#: (:func:`sharding_key`), every other one is spread with rand() (small, query-only tables)
SHARDING_KEYS = {
    "requests": "cityHash64(client_ip)",
    "client_minute": "cityHash64(client_ip)",
    "prefix_minute": "cityHash64(prefix)",
    "prefix_hour": "cityHash64(prefix)",
    "quarantine": "cityHash64(raw)",
    # a block of decisions inserted again (a spool file after a crash, an unchanged retry) splits across shards as
    # the first time, so each shard's replicated table recognises its part by the insert token (with rand() a
    # re-insert split differently and a shard that got none of it the first time took its part twice)
    "decisions": "cityHash64(value)",
}

_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\s*\n?\((.*)\)\s*ENGINE\s*=\s*(\w+)(\(([^)]*)\))?(.*)$", re.S)
_CREATE_MV = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS(.*)$", re.S)
_ALTER = re.compile(r"^ALTER TABLE (\w+) (.*)$", re.S)
_DROP_VIEW = re.compile(r"^DROP VIEW IF EXISTS (\w+)$")
#: a table re-created with another engine clause (0006: an empty `requests` by day): CREATE b AS a ENGINE ...,
#: EXCHANGE TABLES a AND b, DROP b.  A cluster created from zero simply creates `a` with b's engine clause.
_CREATE_AS = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+) AS (\w+)\s*\n?ENGINE\s*=\s*(\w+)(\(([^)]*)\))?(.*)$", re.S)
_EXCHANGE = re.compile(r"^EXCHANGE TABLES (\w+) AND (\w+)$")
_DROP_TABLE = re.compile(r"^DROP TABLE IF EXISTS (\w+)$")

#: data statements of a migration (backfills of a new rollup from existing rows): nothing to backfill on a cluster
#: created from zero, so the generated DDL leaves them out (an in-place cluster upgrade runs them per shard on the
#: ``_local`` tables, once).
_BACKFILL = re.compile(r"^(INSERT INTO|TRUNCATE TABLE) ")


_ORDER_BY = re.compile(r"\bORDER BY\s+(\([^)]*\)|[\w.]+)")


def sharding_key(name: str, engine: str, rest: str) -> str:
    """The Distributed table's sharding key for table ``name`` (``engine``; ``rest``: the clause after it).

    A ReplacingMergeTree keeps one row per sorting key only among rows of one shard: spread with rand(), the
    states of one detection (one source, one partition's progress ...) land on several shards, and ``FINAL``
    over the Distributed table -- which runs per shard -- returns each shard's latest, i.e. several rows, some
    stale.  So such a table is sharded by the hash of its sorting key: every row of one key on one shard."""
    if name in SHARDING_KEYS:
        return SHARDING_KEYS[name]
    if engine == "ReplacingMergeTree":
        m = _ORDER_BY.search(rest)
        if m is None:
            raise ValueError(f"{name}: a ReplacingMergeTree without ORDER BY")
        return f"cityHash64({m.group(1).strip().removeprefix('(').removesuffix(')')})"
    return "rand()"


def _replicated(engine: str, args: str | None, db: str, table: str) -> str:
    path = f"'/clickhouse/tables/{{shard}}/{db}/{table}', '{{replica}}'"
    inner = f", {args}" if args and args.strip() else ""
    return f"Replicated{engine}({path}{inner})"


def cluster_statements(cluster: str, database: str, params: dict[str, Any] | None = None) -> list[str]:
    """DDL statements, in order, that create the forumpulse schema on ``cluster`` in ``database``."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", cluster) or not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", database):
        raise ValueError("cluster and database must be plain identifiers")
    out = [f"CREATE DATABASE IF NOT EXISTS {database} ON CLUSTER {cluster}"]
    tables: list[str] = []
    created: dict[str, tuple[int, str]] = {}  # table -> (index in out of its _local CREATE, its columns)
    rebuilt: dict[str, tuple[str, str, str | None, str]] = {}  # new table -> (table it replaces, engine clause)

    def create_local(name: str, columns: str, engine: str, args: str | None, rest: str) -> str:
        # replicated tables deduplicate by their own window: the setting is for plain MergeTree only
        rest = re.sub(r"(SETTINGS )non_replicated_deduplication_window = \d+, ", r"\1", rest)
        rest = re.sub(r"\n?SETTINGS non_replicated_deduplication_window = \d+", "", rest)
        local = f"{name}_local"
        return (f"CREATE TABLE IF NOT EXISTS {database}.{local} ON CLUSTER {cluster}\n({columns})\n"
                f"ENGINE = {_replicated(engine, args, database, local)}{rest.rstrip()}")

    for m in load_migrations():
        for guarded_stmt in render(m, params):
            _, stmt = guarded(guarded_stmt)  # guards check a single node's state; a new cluster has none
            t = _CREATE_TABLE.match(stmt)
            if t:
                name, columns, engine, _, args, rest = t.groups()
                created[name] = (len(out), columns)
                out.append(create_local(name, columns, engine, args, rest))
                local = f"{name}_local"
                key = sharding_key(name, engine, rest)
                out.append(
                    f"CREATE TABLE IF NOT EXISTS {database}.{name} ON CLUSTER {cluster} AS {database}.{local}\n"
                    f"ENGINE = Distributed({cluster}, {database}, {local}, {key})"
                )
                tables.append(name)
                continue
            v = _CREATE_MV.match(stmt)
            if v:
                name, target, select = v.groups()
                select = re.sub(r"\bFROM (\w+)\b", lambda mm: f"FROM {database}.{mm.group(1)}_local"
                                if mm.group(1) in tables else mm.group(0), select)
                out.append(
                    f"CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{name} ON CLUSTER {cluster} "
                    f"TO {database}.{target}_local AS{select}"
                )
                continue
            a = _ALTER.match(stmt)
            if a and a.group(1) in tables:
                name, change = a.groups()
                if re.fullmatch(r"MODIFY SETTING non_replicated_deduplication_window = \d+;?\s*", change):
                    continue  # replicated tables deduplicate by default (and a Distributed one has no such setting)
                for tbl in (f"{name}_local", name):  # the shards' tables, then the Distributed one over them
                    out.append(f"ALTER TABLE {database}.{tbl} ON CLUSTER {cluster} {change}")
                continue
            c = _CREATE_AS.match(stmt)
            if c and c.group(2) in created:
                rebuilt[c.group(1)] = (c.group(2), c.group(3), c.group(5), c.group(6))
                continue
            x = _EXCHANGE.match(stmt)
            if x and x.group(2) in rebuilt and rebuilt[x.group(2)][0] == x.group(1):
                old_name, engine, args, rest = rebuilt[x.group(2)]
                idx, columns = created[old_name]
                out[idx] = create_local(old_name, columns, engine, args, rest)
                continue
            dt = _DROP_TABLE.match(stmt)
            if dt and dt.group(1) in rebuilt:
                continue
            d = _DROP_VIEW.match(stmt)
            if d:  # a view replaced by a later migration: dropped and created again on every node
                out.append(f"DROP VIEW IF EXISTS {database}.{d.group(1)} ON CLUSTER {cluster}")
                continue
            if _BACKFILL.match(stmt):
                continue
            raise ValueError(f"migration {m.version:04d}: statement the cluster generator does not know:\n{stmt[:300]}")
    out.append(
        f"CREATE TABLE IF NOT EXISTS {database}.schema_migrations ON CLUSTER {cluster} (version UInt32, name String, "
        "checksum String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        f"ENGINE = ReplicatedMergeTree('/clickhouse/tables/{{shard}}/{database}/schema_migrations', '{{replica}}') "
        "ORDER BY version"
    )
    return out


def cluster_sql(cluster: str, database: str, params: dict[str, Any] | None = None) -> str:
    header = (
        f"-- forumpulse schema for ClickHouse cluster '{cluster}', database '{database}'.\n"
        "-- GENERATED by `forumpulse db cluster-ddl` from schemas/migrations: do not edit.\n\n"
    )
    return header + ";\n\n".join(cluster_statements(cluster, database, params)) + ";\n"
