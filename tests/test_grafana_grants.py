"""The read-only Grafana user (deploy/clickhouse/grafana_user.sql) can read every table the dashboards query.

A table a panel reads but the role is not granted makes that panel fail with ACCESS_DENIED under ``grafana_ro`` on
a ClickHouse server -- invisible on chDB, which has no users.  The tables are taken from the committed dashboards'
SQL (``FROM`` / ``JOIN`` targets that are not a ``WITH name AS (...)`` of the same query nor an ``ARRAY JOIN``)
and compared with the grants; every granted table must also exist in the migrated schema (a typo would grant
nothing).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forumpulse.pipeline.store import migrate, open_store

ROOT = Path(__file__).resolve().parent.parent
GRANTS = ROOT / "deploy" / "clickhouse" / "grafana_user.sql"
DASHBOARDS = sorted((ROOT / "dashboards").glob("forumpulse-*.json"))


def _queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("rawSql", "query") and isinstance(v, str):
                yield v
            else:
                yield from _queries(v)
    elif isinstance(node, list):
        for x in node:
            yield from _queries(x)


def tables_read(sql: str) -> set[str]:
    ctes = set(re.findall(r"\b(\w+)\s+AS\s*\(", sql, re.I))
    # ARRAY JOIN unfolds a column, not a table
    names = {m.group(1) for m in re.finditer(r"\b(?<!ARRAY )(?:FROM|JOIN)\s+([A-Za-z_][\w.]*)", sql, re.I)}
    return {n.removeprefix("forumpulse.") for n in names if n not in ctes}


_GRANT = re.compile(r"^GRANT SELECT(?:\(([\w,\s]+)\))?\s+ON forumpulse\.(\w+) TO forumpulse_grafana_reader;", re.M)


def granted() -> set[str]:
    return {m.group(2) for m in _GRANT.finditer(GRANTS.read_text())}


def granted_columns() -> dict[str, set[str]]:
    """Tables granted column by column, with their columns."""
    return {m.group(2): {c.strip() for c in m.group(1).split(",")} for m in _GRANT.finditer(GRANTS.read_text())
            if m.group(1)}


def test_raw_lines_and_evidence_are_not_granted_and_no_panel_needs_them(tmp_path: Path) -> None:
    """Quarantined raw lines (addresses, session tokens) and a decision's evidence (other clients' addresses,
    sample requests) are not readable through grafana_ro; every column a panel names of those tables is."""
    cols = granted_columns()
    assert {"quarantine", "decisions"} <= set(cols)
    assert not cols["quarantine"] & {"raw", "detail", "source_ref"} and "evidence" not in cols["decisions"]
    st = open_store(f"chdb:{tmp_path / 'chdb'}")
    try:
        migrate(st)
        schema = {t: {r[0] for r in st.query_rows(
            f"SELECT name FROM system.columns WHERE database = currentDatabase() AND table = '{t}'")} for t in cols}
    finally:
        st.close()
    for t, have in cols.items():
        assert have <= schema[t], (t, sorted(have - schema[t]))  # a typo would grant nothing
    for path in DASHBOARDS:
        for sql in _queries(json.loads(path.read_text())):
            for t in tables_read(sql) & set(cols):
                named = {c for c in schema[t] if re.search(rf"\b{c}\b", sql)}
                assert named <= cols[t], (path.name, t, sorted(named - cols[t]))


def test_table_extraction_sees_ctes_and_joins() -> None:
    sql = ("WITH lv AS (SELECT 1 FROM site_minute) SELECT * FROM lv JOIN forumpulse.topic_titles t ON 1 FROM ($__x)"
           " ARRAY JOIN cover AS c")
    assert tables_read(sql) == {"site_minute", "topic_titles"}


def test_every_dashboard_table_is_granted_to_grafana_ro() -> None:
    assert len(DASHBOARDS) >= 2
    used: dict[str, set[str]] = {}
    for path in DASHBOARDS:
        for sql in _queries(json.loads(path.read_text())):
            for t in tables_read(sql):
                used.setdefault(t, set()).add(path.name)
    assert {"site_minute", "topic_hour", "prefix_hour"} <= set(used)  # the extraction found the usual tables
    missing = {t: sorted(files) for t, files in used.items() if not t.startswith("system.") and t not in granted()}
    assert not missing, f"tables read by dashboards but not granted in {GRANTS.name}: {missing}"


def test_every_granted_table_exists_in_the_schema(tmp_path: Path) -> None:
    st = open_store(f"chdb:{tmp_path / 'chdb'}")
    try:
        migrate(st)
        tables = {r[0] for r in st.query_rows("SELECT name FROM system.tables WHERE database = currentDatabase()")}
    finally:
        st.close()
    assert granted() and not granted() - tables, sorted(granted() - tables)
