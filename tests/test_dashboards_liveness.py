"""The ops dashboard's "Source liveness" and "Collector listeners" panels agree with ``source_status`` /
``listener_status`` (``GET /fp/sources`` / ``GET /fp/listeners``) on the same store.

The panels classify ``source_liveness`` in SQL at the end of the dashboard range: ``live`` / ``silent`` /
``quiet`` / ``dead``; listener heartbeat rows (``tcp:5140``, ``syslog:5514``…, no lines) and host-level heartbeat
rows (empty ``origin_file``) are not sources; a host heartbeat of site ``*`` (a forwarded syslog-ng MARK) counts
for every site of that host (docs/architecture.md, "Liveness").  The SQL is taken from the committed dashboard
JSON, rendered with the Grafana ClickHouse plugin's macros and run on the real schema (chDB).
"""

from __future__ import annotations

import inspect
import json
import random
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from forumpulse.dashboards import build
from forumpulse.dashboards import panels as panels_mod
from forumpulse.dashboards.macros import QueryContext, TemplateVar, render_query
from forumpulse.pipeline.consumer import LIVENESS_SCHEMA, listener_status, source_status
from forumpulse.pipeline.store import Store

NOW = 1_800_000_000  # the dashboard range ends here (whole seconds, as $__toTime)
SOURCES_PANEL, LISTENERS_PANEL = "Source liveness", "Collector listeners"
Row = tuple[str, str, str, float | None, float | None]  # site, host, file, line age s, heartbeat age s (None = never)


def _panel_sql(title: str) -> str:
    ops = json.loads((Path(build.__file__).resolve().parent / "forumpulse-ops.json").read_text())
    (sql,) = [p["targets"][0]["rawSql"] for p in ops["panels"] if p["title"] == title]
    return str(sql)


def _insert(store: Store, rows: list[Row], now: float = NOW) -> None:
    def ms(age: float | None) -> int:
        return 0 if age is None else round((now - age) * 1000)

    store.insert("source_liveness", pa.Table.from_pylist([
        {"site": s, "origin_host": h, "origin_file": f, "last_line_ts": ms(la), "last_heartbeat_ts": ms(ha),
         "lines": 0 if la is None else 10, "updated_at": int(now * 1000)} for s, h, f, la, ha in rows
    ], schema=LIVENESS_SCHEMA))


def _run(store: Store, sql: str, site: str, now: int = NOW) -> list[dict[str, Any]]:
    ctx = QueryContext(datetime.fromtimestamp(now - 6 * 3600, UTC), datetime.fromtimestamp(now, UTC), 60_000)
    return store.query_arrow(render_query(sql, ctx, {"site": TemplateVar("site", site)})).to_pylist()


def _close(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) < 1e-6)


def assert_sources_agree(store: Store, site: str, now: int = NOW) -> list[dict[str, Any]]:
    """The panel's rows for ``site`` = source_status's sources of that site: same set, states, ages, listener."""
    got = _run(store, _panel_sql(SOURCES_PANEL), site, now)
    want = {(s.origin_host, s.origin_file): s for s in source_status(store, now=float(now)) if s.site == site}
    assert {(r["origin_host"], r["origin_file"]) for r in got} == set(want), "panel lists other sources"
    for r in got:
        s = want[(r["origin_host"], r["origin_file"])]
        assert r["status"] == s.state, (site, r, s)
        assert _close(r["line_age_s"], s.last_line_s_ago), (r, s)
        assert _close(r["heartbeat_age_s"], s.last_heartbeat_s_ago), (r, s)
        assert _close(r["listener_heartbeat_age_s"], s.listener_heartbeat_s_ago), (r, s)
        assert (r["listener"] is None) == (s.listener is None), (r, s)
    order = ["dead", "quiet", "silent", "live"]
    assert [order.index(r["status"]) for r in got] == sorted(order.index(r["status"]) for r in got)
    return got


def assert_listeners_agree(store: Store, site: str, now: int = NOW) -> list[dict[str, Any]]:
    got = _run(store, _panel_sql(LISTENERS_PANEL), site, now)
    want = {(x.site, x.collector, x.listener): x for x in listener_status(store, now=float(now))
            if x.site in (site, "*")}
    assert {(r["listener_site"], r["collector"], r["listener"]) for r in got} == set(want)
    for r in got:
        x = want[(r["listener_site"], r["collector"], r["listener"])]
        assert (r["status"], r["sources"]) == (x.state, x.sources), (r, x)
        assert _close(r["heartbeat_age_s"], x.last_heartbeat_s_ago), (r, x)
    return got


def test_thresholds_are_source_status_defaults() -> None:
    defaults = inspect.signature(source_status).parameters
    listener_timeout = inspect.signature(listener_status).parameters["heartbeat_timeout_s"].default
    assert (defaults["quiet_after_s"].default, defaults["heartbeat_timeout_s"].default, listener_timeout) == (
        panels_mod.LIVE_WITHIN_S, panels_mod.HEARTBEAT_TIMEOUT_S, panels_mod.HEARTBEAT_TIMEOUT_S)


COLLECTOR: list[Row] = [
    ("forum", "coll1", "/var/log/apache2/vhosts/forum.access.log", 3600, 5),  # followed file, idle
    ("forum", "coll1", "tcp:5140", None, 5),                                  # raw TCP listener for forum
    ("*", "coll1", "syslog:5514", None, 6),                                   # syslog listener, every site
]


def test_listener_quiet_forwarded_and_dead_sources(store: Store) -> None:
    _insert(store, [
        *COLLECTOR,
        ("forum", "10.0.0.5", "tcp:5140", 3600, None),         # raw sender, idle: quiet (its listener is up)
        ("forum", "10.0.0.6", "tcp:5140", 10, None),           # raw sender, busy: live
        ("forum", "10.0.0.9", "udp:5141", 3600, None),         # raw sender on a port nobody heartbeats: dead
        ("forum", "web7", "forum/combined", 3600, None),       # syslog sender forwarding MARKs (site *): silent
        ("*", "web7", "", None, 8),
        ("forum", "web8", "forum/combined", 3600, None),       # syslog sender without heartbeats: quiet
        ("board", "web8", "board/combined", 3600, None),
        ("board", "web8", "", None, 9),                        # web8's heartbeats for site board only
        ("forum", "web9", "forum/combined", 3600, None),       # forwarded heartbeats once, then stopped: dead
        ("*", "web9", "", None, 3000),
        ("forum", "coll1", "/var/log/apache2/vhosts/gone.access.log", 3600, 3000),  # deleted file: dead
        ("forum", "coll2", "/var/log/apache2/vhosts/forum.access.log", 3600, None),  # file, never heartbeats: dead
        ("board", "coll3", "tcp:5140", None, 4),               # another site's listener covers no forum sender
    ])
    got = assert_sources_agree(store, "forum")
    assert {(r["origin_host"], r["origin_file"]): r["status"] for r in got} == {
        ("coll1", "/var/log/apache2/vhosts/forum.access.log"): "silent",
        ("10.0.0.5", "tcp:5140"): "quiet",
        ("10.0.0.6", "tcp:5140"): "live",
        ("10.0.0.9", "udp:5141"): "dead",
        ("web7", "forum/combined"): "silent",
        ("web8", "forum/combined"): "quiet",
        ("web9", "forum/combined"): "dead",
        ("coll1", "/var/log/apache2/vhosts/gone.access.log"): "dead",
        ("coll2", "/var/log/apache2/vhosts/forum.access.log"): "dead",
    }, "listener and host heartbeat rows are not sources; the four states as source_status gives them"
    by = {r["origin_host"] + " " + r["origin_file"]: r for r in got}
    assert by["10.0.0.5 tcp:5140"]["listener"] == "coll1 tcp:5140"
    assert by["web8 forum/combined"]["listener"] == "coll1 syslog:5514"
    assert by["web7 forum/combined"]["heartbeat_age_s"] == 8 and by["web7 forum/combined"]["listener"] is None
    assert by["coll2 /var/log/apache2/vhosts/forum.access.log"]["listener"] is None
    assert {r["status"] for r in assert_sources_agree(store, "board")} == {"silent"}
    listeners = assert_listeners_agree(store, "forum")
    assert {(r["collector"], r["listener"]): (r["status"], r["sources"]) for r in listeners} == {
        ("coll1", "tcp:5140"): ("up", 2), ("coll1", "syslog:5514"): ("up", 1)}
    assert {r["collector"] for r in assert_listeners_agree(store, "board")} == {"coll1", "coll3"}


def test_senders_are_dead_once_their_listener_stops(store: Store) -> None:
    _insert(store, [("forum", "coll1", "tcp:5140", None, 3600), ("*", "coll1", "syslog:5514", None, 3600),
                    ("forum", "10.0.0.5", "tcp:5140", 7200, None), ("forum", "web8", "forum/combined", 7200, None)])
    assert {r["status"] for r in assert_sources_agree(store, "forum")} == {"dead"}
    assert {r["status"] for r in assert_listeners_agree(store, "forum")} == {"down"}
    # and at an earlier end of range, while the listeners were still heartbeating, the same rows were quiet
    earlier = NOW - 3600 + 60
    assert {r["status"] for r in assert_sources_agree(store, "forum", earlier)} == {"quiet"}
    assert {r["status"] for r in assert_listeners_agree(store, "forum", earlier)} == {"up"}


SITES = ("forum", "board", "*")
HOSTS = ("coll1", "coll2", "web1", "web2", "10.0.0.5")
FILES = ("", "-", "tcp:5140", "udp:5140", "syslog:5514", "syslog5424:5515", "forum/combined", "board/squid",
         "/var/log/a.log", "/var/log/b.log", "x:y", "tcp:123456")
#: ages around the thresholds (300 s for lines, 180 s for heartbeats), exactly on them, and never (None)
AGES = (None, None, 1, 5, 179.999, 180, 180.001, 299.999, 300, 300.001, 900, 3600)


@pytest.mark.parametrize("seed", range(6))
def test_random_liveness_tables_agree(store: Store, seed: int) -> None:
    """Random rows (several consumers' rows per source, listeners, host heartbeats of one site or ``*``, ages on the
    thresholds): for every site and several ends of range, the panels give what source_status/listener_status do."""
    rng = random.Random(seed)
    keys = {(rng.choice(SITES), rng.choice(HOSTS), rng.choice(FILES)) for _ in range(80)}

    def row(site: str, host: str, file: str) -> Row:
        label = ":" in file and not file.startswith("/")
        line = None if label and rng.random() < 0.5 else rng.choice(AGES)  # listeners have no lines
        hb = None if file not in ("", "-") and rng.random() < 0.6 else rng.choice(AGES)  # senders no heartbeats
        return site, host, file, line, hb

    rows: list[Row] = [row(*k) for k in sorted(keys)]
    rows = [r for r in rows if r[3] is not None or r[4] is not None]
    # and senders without heartbeats next to up listeners, so that every state occurs
    # (a label no random row uses: a sender is quiet only while every listener that may receive it is up)
    rows += [*COLLECTOR, ("forum", "10.9.9.9", "tcp:5140", 900, None), ("forum", "web9", "forum/x", 3600, None),
             ("forum", "collq", "tcp:6514", None, 5), ("forum", "10.9.9.8", "tcp:6514", 900, None)]
    # listener rows get distinct heartbeat times, so "the oldest covering listener" is one listener
    rows = [(s, h, f, la, ha + i / 1000 if la is None and ha is not None else ha)
            for i, (s, h, f, la, ha) in enumerate(rows)]
    _insert(store, rows)
    _insert(store, [(s, h, f, rng.choice(AGES), rng.choice(AGES)) for s, h, f, *_ in rng.sample(rows, len(rows) // 4)])
    for now in (NOW, NOW + 1, NOW + 120, NOW - 60):
        for site in ("forum", "board"):
            assert_sources_agree(store, site, now)
            assert_listeners_agree(store, site, now)
    assert {s.state for s in source_status(store, now=float(NOW))} == {"live", "silent", "quiet", "dead"}


def test_empty_table_gives_empty_panels(store: Store) -> None:
    assert _run(store, _panel_sql(SOURCES_PANEL), "forum") == []
    assert _run(store, _panel_sql(LISTENERS_PANEL), "forum") == []
