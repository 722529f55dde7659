"""Dashboards as code: structure of the committed JSON, and every panel's SQL run on chDB with known answers.

Each panel's rawSql goes through the plugin's semantics (forumpulse.dashboards.macros: variables, then macros)
and runs on the real schema (migration 0001) filled with synthetic traffic; the expected answer is computed here
from the Python rows, not from SQL.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent))
import test_dashboards_fixture as fx
from forumpulse.dashboards import build
from forumpulse.dashboards import panels as panels_mod
from forumpulse.dashboards.macros import QueryContext, TemplateVar, render_query
from forumpulse.pipeline.consumer import PROGRESS_SCHEMA, listener_status, source_status
from forumpulse.pipeline.store import migrate, open_store

DASH_DIR = Path(build.__file__).resolve().parent
T0, T1 = fx.T0, fx.T0 + timedelta(minutes=180)
NOW = T1  # the dashboard range ends here


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("forumpulse-*.json"))}


# ---------------------------------------------------------------------------------------------- structure


def test_committed_json_is_fresh() -> None:
    fresh = build.render_all()
    assert sorted(fresh) == sorted(f"{k}.json" for k in load_dashboards())
    for name, text in fresh.items():
        assert (DASH_DIR / name).read_text() == text, f"{name} is stale: run python -m forumpulse.dashboards.build"


def test_check_mode_detects_stale(tmp_path: Path) -> None:
    assert build.main(["--out", str(tmp_path), "--check"]) == 1
    assert build.main(["--out", str(tmp_path)]) == 0
    assert build.main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "forumpulse-ops.json").write_text("{}")
    assert build.main(["--out", str(tmp_path), "--check"]) == 1


def _provisioned_uid() -> str:
    doc = yaml.safe_load((DASH_DIR / "provisioning/datasources/forumpulse-clickhouse.yaml").read_text())
    (ds,) = doc["datasources"]
    assert ds["type"] == "grafana-clickhouse-datasource"
    for key in ("host", "port", "protocol", "username", "defaultDatabase", "secure"):
        assert key in ds["jsonData"], key
    assert ds["secureJsonData"]["password"].startswith("${"), "password must come from the environment"
    return str(ds["uid"])


def _walk_datasources(node: Any) -> list[dict[str, Any]]:
    out = []
    if isinstance(node, dict):
        if isinstance(node.get("datasource"), dict):
            out.append(node["datasource"])
        for v in node.values():
            out += _walk_datasources(v)
    elif isinstance(node, list):
        for v in node:
            out += _walk_datasources(v)
    return out


def test_structure() -> None:
    uid = _provisioned_uid()
    prov = yaml.safe_load((DASH_DIR / "provisioning/dashboards/forumpulse.yaml").read_text())
    assert prov["providers"][0]["type"] == "file"
    dashes = load_dashboards()
    assert set(dashes) == {"forumpulse-ops", "forumpulse-topics"}
    for name, d in dashes.items():
        assert d["uid"] == name
        # Grafana's "Default" zone: the viewer's profile, team or org preference, else the browser's (an ops team
        # in Kuala Lumpur reads its own hours; the daily report uses the site's zone).  "browser" would override a
        # preference, "utc" every viewer's hours; the SQL works on UTC epoch times either way
        assert d["timezone"] == "", (name, d.get("timezone"))
        refs = _walk_datasources(d)
        assert refs, name
        for ref in refs:
            if ref.get("type") == "grafana":
                continue
            assert ref == {"type": "grafana-clickhouse-datasource", "uid": uid}, (name, ref)
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), f"duplicate panel ids in {name}"
        cells: dict[tuple[int, int], int] = {}
        for p in d["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["w"] > 0 and g["h"] > 0 and g["x"] + g["w"] <= 24, (name, p["title"], g)
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panel {p['id']} overlaps panel {cells[(x, y)]}"
                    cells[(x, y)] = p["id"]
            (t,) = p["targets"]
            assert t["editorType"] == "sql" and t["rawSql"].strip()
            assert t["format"] == (0 if p["type"] == "timeseries" else 1), p["title"]
            # the plugin's QueryType enum (src/types/queryBuilder.ts) is lower case: 'timeseries', not 'timeSeries'
            assert t["queryType"] == ("timeseries" if t["format"] == 0 else "table"), p["title"]
            assert "FROM requests" not in t["rawSql"], "panels must read rollups, not raw requests"
        anns = [a for a in d["annotations"]["list"] if a.get("builtIn") != 1]
        assert len(anns) == 1 and "detections FINAL" in anns[0]["target"]["rawSql"]
        link_panels = [p for p in d["panels"] if p.get("fieldConfig", {}).get("defaults", {}).get("links")]
        if name == "forumpulse-topics":
            assert any("var-topic=${__data.fields.topic_id}" in lk["url"]
                       for p in link_panels for lk in p["fieldConfig"]["defaults"]["links"])


# ---------------------------------------------------------------------------------------------- data


def _progress(part: int, loaded_age: float | None, lag: int, active: bool, report_age: float,
              instance: str = "c1") -> dict[str, Any]:
    return {"group_id": "forumpulse-loader", "topic": "weblogs.raw", "partition": part,
            "loaded_ts": NOW - timedelta(seconds=loaded_age) if loaded_age is not None else datetime(1970, 1, 1, tzinfo=UTC),
            "next_offset": 100, "lag": lag, "active": active, "instance": instance,
            "updated_at": NOW - timedelta(seconds=report_age)}


#: consumer_progress rows (migration 0007): partition -> its reports (the newest counts)
PROGRESS_ROWS = [
    _progress(0, 2, 0, True, 3),                  # caught up
    _progress(1, 95, 420, True, 4),               # behind by 91 s at its report
    _progress(2, 120, 0, True, 120),              # caught up at a report 2 minutes old: not reporting
    _progress(3, 900, 420, True, 5),              # far behind (15 minutes)
    _progress(4, 40, 3, True, 40, "c0"), _progress(4, 5, 0, False, 6),  # released by a clean exit (newest)
    _progress(5, 1000, 0, True, 1000),            # gone
    _progress(6, None, 0, True, 20, "c0"),        # caught up, nothing stored in this assignment (an idle partition)
    _progress(7, 50, -1, True, 8),                # lag unknown (the broker not answering): behind
    _progress(8, 30, 12, False, 7),               # its consumer exited cleanly behind (a rolling restart): behind
    _progress(9, 45, 0, True, 45),                # caught up at a report 45 s old: within the clock skew allowed
]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    store = open_store(f"chdb:{tmp_path_factory.mktemp('dash_chdb')}")
    migrate(store, {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0})
    tr = fx.make_traffic()
    fx.load_requests(store, tr.rows)
    # quarantine: 2 truncated lines per minute in 10..19, 1 bad_timestamp in minute 50
    q = [{"ingested_at": T0 + timedelta(minutes=m, seconds=s), "site": fx.SITE, "origin_host": "web1",
          "origin_file": "a.log", "source_format": "combined", "reason": r, "detail": "", "raw": "x", "line_no": 1,
          "source_ref": ""}
         for m in range(10, 20) for s, r in ((5, "truncated"), (35, "truncated"))]
    q.append(dict(q[0], ingested_at=T0 + timedelta(minutes=50, seconds=1), reason="bad_timestamp"))
    store.insert("quarantine", fx.ts_table(q, ("ingested_at",), {"line_no": pa.uint64()}))
    stats = [{"ts": T0 + timedelta(minutes=m, seconds=s), "component": "consumer", "instance": "c1", "lines_in": 100,
              "loaded": 100, "quarantined": 0, "batch_latency_ms": 5.0, "lag": (m * 7 + s) % 500 + (4000 if m == 90 else 0),
              "freshness_s": float((m % 13) + s / 10)} for m in range(180) for s in (0, 30)]
    store.insert("pipeline_stats", fx.ts_table(stats, ("ts",), {"lines_in": pa.uint64(), "loaded": pa.uint64(),
                                                               "quarantined": pa.uint64(), "lag": pa.int64()}))

    def live(host: str, line_age: int, hb_age: int, lines: int, upd: int) -> dict[str, Any]:
        return {"site": fx.SITE, "origin_host": host, "origin_file": "/var/log/access.log",
                "last_line_ts": NOW - timedelta(seconds=line_age), "last_heartbeat_ts": NOW - timedelta(seconds=hb_age),
                "lines": lines, "updated_at": NOW - timedelta(seconds=upd)}

    lt = ("last_line_ts", "last_heartbeat_ts", "updated_at")
    store.insert("source_liveness", fx.ts_table([live("web1", 4000, 4000, 5, 4000)], lt, {"lines": pa.uint64()}))
    store.insert("source_liveness", fx.ts_table([live("web1", 30, 10, 9000, 5), live("web2", 900, 20, 700, 5),
                                                 live("web3", 3600, 3600, 50, 5)], lt, {"lines": pa.uint64()}))
    never = datetime(1970, 1, 1, tzinfo=UTC)
    net = [  # the collector's listener heartbeats, a raw TCP sender, a syslog sender forwarding MARKs (site *)
        dict(live("coll1", 0, 5, 0, 5), origin_file="tcp:5140", last_line_ts=never),
        dict(live("coll1", 0, 6, 0, 5), site="*", origin_file="syslog:5514", last_line_ts=never),
        dict(live("10.0.0.5", 3600, 0, 40, 5), origin_file="tcp:5140", last_heartbeat_ts=never),
        dict(live("web7", 3600, 0, 30, 5), origin_file="forum/combined", last_heartbeat_ts=never),
        dict(live("web7", 0, 8, 0, 5), site="*", origin_file="", last_line_ts=never),
    ]
    store.insert("source_liveness", fx.ts_table(net, lt, {"lines": pa.uint64()}))
    store.insert("consumer_progress", pa.Table.from_pylist(PROGRESS_ROWS, schema=PROGRESS_SCHEMA))
    titles = [{"site": fx.SITE, "topic_id": k, "title": v, "forum": "news" if k < 103 else "misc",
               "updated_at": T0} for k, v in fx.TOPICS.items()]
    store.insert("topic_titles", fx.ts_table([dict(titles[0], title="Old title", updated_at=T0 - timedelta(days=1))],
                                             ("updated_at",), {"topic_id": pa.uint64()}))
    store.insert("topic_titles", fx.ts_table(titles, ("updated_at",), {"topic_id": pa.uint64()}))
    groups = [{"site": fx.SITE, "group_name": g, "topic_id": t, "updated_at": T0}
              for g, ts in fx.GROUPS.items() for t in ts]
    store.insert("topic_groups", fx.ts_table(groups, ("updated_at",), {"topic_id": pa.uint64()}))
    for batch in fx.detections_rows():
        store.insert("detections", fx.ts_table(batch, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    dec = [
        ("d1", 10, 60 * 60, "ban", "192.0.2.10"),         # expired at minute 70: recent only
        ("d2", 36, 4 * 3600, "ban", fx.FLOOD_CLIENT),     # active at the end of range
        ("d3", -600, 48 * 3600, "ban", "198.18.0.0/24"),  # decided before the range, still active
        ("d4", 100, 600, "log", "203.0.113.9"),           # not a ban
    ]
    drows = [{"id": i, "created_at": T0 + timedelta(minutes=m), "decided_at": T0 + timedelta(minutes=m),
              "first_seen": T0 + timedelta(minutes=m - 1), "expires_at": T0 + timedelta(minutes=m, seconds=dur),
              "site": fx.SITE, "action": act, "value": v, "scope": "range" if "/" in v else "ip", "reason": "flood",
              "duration_s": dur, "mode": "enforce", "origin": "forumpulse", "evidence": "{}"} for i, m, dur, act, v in dec]
    store.insert("decisions", fx.ts_table(drows, ("created_at", "decided_at", "first_seen", "expires_at"),
                                          {"duration_s": pa.uint32()}))
    # the decisions topic confirmed d2 only
    store.insert("decisions_published", pa.table({"topic": ["weblogs.decisions"], "id": ["d2"],
                                                  "published_at": pa.array([T1], pa.timestamp("ms", tz="UTC"))}))
    yield store, tr, q, stats, dec
    store.close()


def variables(metric: str = "views", topic: str = "101", groups: tuple[str, ...] = ("election", "sports")) -> dict[str, TemplateVar]:
    return {"site": TemplateVar("site", fx.SITE), "metric": TemplateVar("metric", metric),
            "topic": TemplateVar("topic", topic), "group": TemplateVar("group", list(groups))}


def run(store: Any, sql: str, interval_s: int = 60, **kw: Any) -> list[dict[str, Any]]:
    rendered = render_query(sql, QueryContext(T0, T1, interval_s * 1000), variables(**kw))
    t = store.query_arrow(rendered)
    return [dict(zip(t.column_names, r, strict=True)) for r in zip(*[c.to_pylist() for c in t.columns], strict=True)] if t.num_columns else []


def minute_of(t: datetime | int) -> int:
    if isinstance(t, int):  # chDB returns DateTime columns as epoch seconds in Arrow
        t = datetime.fromtimestamp(t, UTC)
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return int((t - T0).total_seconds() // 60)


def by_minute(rows: list[dict[str, Any]], pred: Callable[[dict[str, Any]], bool] = lambda r: True) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        if pred(r):
            out[minute_of(r["ts"])].append(r)
    return out


def series(res: list[dict[str, Any]], col: str) -> dict[int, float]:
    return {minute_of(r["time"]): r[col] for r in res}


def approx_dict(got: dict[Any, float], want: dict[Any, float], tol: float = 1e-6) -> None:
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))[:10]
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=tol, abs=tol), (k, got[k], want[k])


def is_human_topic_kind(r: dict[str, Any], kind: str) -> bool:
    return not r["is_bot"] and r["page_kind"] == kind


def visitor(r: dict[str, Any]) -> str:
    return fx.mapped(r["client_ip"])


# ----------------------------------------------------------------------------------------- panel checks

CHECKS: dict[str, Callable[[Any, str], None]] = {}


def check(title: str) -> Callable[[Callable[[Any, str], None]], Callable[[Any, str], None]]:
    def deco(f: Callable[[Any, str], None]) -> Callable[[Any, str], None]:
        CHECKS[title] = f
        return f
    return deco


@check("Requests per second")
def _rps(w: Any, sql: str) -> None:
    store, tr = w[0], w[1]
    bm = by_minute(tr.rows)
    approx_dict(series(run(store, sql), "requests_per_s"), {m: len(v) / 60 for m, v in bm.items()})
    five: Counter[int] = Counter()
    for m, v in bm.items():
        five[m // 5 * 5] += len(v)
    approx_dict(series(run(store, sql, interval_s=300), "requests_per_s"), {m: c / 300 for m, c in five.items()})
    assert max(series(run(store, sql), "requests_per_s").items(), key=lambda kv: kv[1])[0] in range(30, 40)


@check("Bytes per second")
def _bps(w: Any, sql: str) -> None:
    approx_dict(series(run(w[0], sql), "bytes_per_s"),
                {m: sum(r["bytes"] for r in v) / 60 for m, v in by_minute(w[1].rows).items()})


def status_class(s: int) -> str:
    return "no_status" if s < 100 else f"s{s // 100}xx"


@check("Status mix (requests per interval)")
def _status(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    for cls in ("s2xx", "s3xx", "s4xx", "s5xx"):
        want = {m: float(sum(status_class(r["status"]) == cls for r in v)) for m, v in by_minute(w[1].rows).items()}
        approx_dict({k: float(v) for k, v in series(res, cls).items()}, want)
    assert sum(series(res, "s5xx").values()) > 0


@check("Error ratio")
def _err(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    bm = by_minute(w[1].rows)
    approx_dict(series(res, "server_error_ratio"), {m: sum(r["status"] >= 500 for r in v) / len(v) for m, v in bm.items()})
    approx_dict(series(res, "client_error_ratio"),
                {m: sum(400 <= r["status"] < 500 for r in v) / len(v) for m, v in bm.items()})
    assert {m for m, v in series(res, "server_error_ratio").items() if v > 0} <= set(range(120, 125))


@check("Top clients")
def _top_clients(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    cnt: Counter[str] = Counter()
    for r in w[1].rows:
        cnt["(hostname clients)" if r["client_host"] else r["client_ip"]] += 1
    want = sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[:25]
    assert res[0]["client"] == fx.FLOOD_CLIENT
    assert [(r["client"], r["requests_total"]) for r in res] == want
    flood = res[0]
    assert flood["errors_4xx"] == 250 and flood["bot_requests_total"] == 0
    assert flood["avg_rps"] == pytest.approx(round(500 / (180 * 60), 3))


@check("Top prefixes")
def _top_prefixes(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    reqs: Counter[str] = Counter()
    clients: dict[str, set[str]] = defaultdict(set)
    for r in w[1].rows:
        if r["client_host"]:
            continue
        ip = r["client_ip"]
        net = ip.rsplit(".", 1)[0] + ".0/24" if ":" not in ip else "2001:db8::/64"
        reqs[net] += 1
        clients[net].add(ip)
    want = sorted(reqs.items(), key=lambda kv: (-kv[1], kv[0]))
    assert [(r["network"], r["requests_total"]) for r in res] == want
    assert {r["network"]: r["distinct_clients"] for r in res} == {k: len(v) for k, v in clients.items()}


@check("Active bans (at end of range)")
def _bans(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    want = [v for _i, m, dur, act, v in sorted(w[4], key=lambda d: -d[1])
            if act == "ban" and T0 + timedelta(minutes=m) <= T1 < T0 + timedelta(minutes=m, seconds=dur)]
    assert [r["value"] for r in res] == want == [fx.FLOOD_CLIENT, "198.18.0.0/24"]
    assert res[0]["remaining_s"] == 36 * 60 + 4 * 3600 - 180 * 60


@check("Recent decisions")
def _recent(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    want = [(v, act) for _i, m, _d, act, v in sorted(w[4], key=lambda d: -d[1]) if 0 <= m <= 180]
    assert [(r["value"], r["action"]) for r in res] == want
    assert {r["value"]: bool(r["kafka_confirmed"]) for r in res} == {
        "203.0.113.9": False, fx.FLOOD_CLIENT: True, "192.0.2.10": False}


@check("Quarantined lines per second")
def _quar(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    want: Counter[tuple[int, str]] = Counter((minute_of(r["ingested_at"]), r["reason"]) for r in w[2])
    got = {(minute_of(r["time"]), r["reason"]): r["lines_per_s"] for r in res}
    approx_dict(got, {k: v / 60 for k, v in want.items()})


def _stats_check(w: Any, sql: str, col: str, key: str) -> None:
    res = run(w[0], sql)
    want: dict[int, float] = {}
    for s in w[3]:
        m = minute_of(s["ts"])
        want[m] = max(want.get(m, float("-inf")), float(s[key]))
    assert {r["consumer"] for r in res} == {"consumer/c1"}
    approx_dict({minute_of(r["time"]): float(r[col]) for r in res}, want)


@check("Pipeline lag (messages)")
def _lag(w: Any, sql: str) -> None:
    _stats_check(w, sql, "lag", "lag")
    res = run(w[0], sql)
    assert minute_of(max(res, key=lambda r: r["lag"])["time"]) == 90


@check("Freshness (seconds behind the log)")
def _fresh(w: Any, sql: str) -> None:
    _stats_check(w, sql, "freshness_s", "freshness_s")


@check("Source liveness")
def _liveness(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    got = {(r["origin_host"], r["origin_file"]): (r["status"], r["lines"], r["line_age_s"], r["listener"]) for r in res}
    f = "/var/log/access.log"
    assert got == {("web1", f): ("live", 9000, 30, None), ("web2", f): ("silent", 700, 900, None),
                   ("web3", f): ("dead", 50, 3600, None), ("10.0.0.5", "tcp:5140"): ("quiet", 40, 3600, "coll1 tcp:5140"),
                   ("web7", "forum/combined"): ("silent", 30, 3600, None)}, \
        "listener and host heartbeat rows are not sources; states as source_status gives them"
    want = {(s.origin_host, s.origin_file): s.state for s in source_status(w[0], now=NOW.timestamp()) if s.site == fx.SITE}
    assert {k: v[0] for k, v in got.items()} == want


@check("Collector listeners")
def _listeners(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    got = {(r["listener_site"], r["collector"], r["listener"]): (r["status"], r["heartbeat_age_s"], r["sources"])
           for r in res}
    assert got == {(fx.SITE, "coll1", "tcp:5140"): ("up", 5, 1), ("*", "coll1", "syslog:5514"): ("up", 6, 0)}
    want = {(x.site, x.collector, x.listener): (x.state, x.last_heartbeat_s_ago, x.sources)
            for x in listener_status(w[0], now=NOW.timestamp())}
    assert got == want


def _quartiles(vals: list[float]) -> tuple[float, float]:
    q = statistics.quantiles(sorted(vals), n=4, method="inclusive")
    return q[0], q[2]


@check("Kafka partitions: loading")
def _partitions(w: Any, sql: str) -> None:
    from forumpulse.detectors.traffic import LIVE_CLOCK_SKEW_S, load_rules, partition_state

    res = run(w[0], sql)
    got = {r["partition"]: (r["status"], r["owner"], r["lag_messages"], r["behind_s"], r["report_age_s"])
           for r in res}
    assert got == {0: ("caught up", "c1", 0, 0, 3), 1: ("behind", "c1", 420, 91, 4),
                   2: ("not reporting", "c1", 0, 0, 120), 3: ("far behind", "c1", 420, 895, 5),
                   4: ("released", "c1", 0, 0, 6), 5: ("gone", "c1", 0, 0, 1000),
                   6: ("caught up", "c0", 0, 0, 20), 7: ("behind", "c1", -1, 42, 8),
                   8: ("behind", "c1", 12, 23, 7), 9: ("caught up", "c1", 0, 0, 45)}
    assert [r["partition"] for r in res] == [3, 1, 7, 8, 2, 5, 0, 6, 9, 4]  # worst first
    assert [r["newest_loaded"] is None for r in res if r["partition"] in (0, 6)] == [False, True]
    # the same states as the live detectors' watermark rule, with the shipped thresholds
    health = load_rules()["health"]
    assert 60 * health["gap_min_minutes"] == panels_mod.PROGRESS_GAP_S
    assert health["progress_stale_seconds"] == panels_mod.PROGRESS_STALE_S
    assert LIVE_CLOCK_SKEW_S == panels_mod.PROGRESS_SKEW_S
    now_ms = int(NOW.timestamp() * 1000)
    newest = {}
    for r in PROGRESS_ROWS:
        if r["partition"] not in newest or r["updated_at"] > newest[r["partition"]]["updated_at"]:
            newest[r["partition"]] = r
    want = {p: partition_state(int(r["loaded_ts"].timestamp() * 1000), r["lag"], r["active"],
                               int(r["updated_at"].timestamp() * 1000), now_ms, health["progress_stale_seconds"],
                               health["gap_min_minutes"])[0] for p, r in newest.items()}
    assert {p: v[0] for p, v in got.items()} == want


@check("Response time percentiles")
def _latency(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    bm = by_minute(w[1].rows, lambda r: r["elapsed_ms"] is not None)
    assert set(series(res, "p50_ms")) == set(bm)
    for r in res:
        vals = [x["elapsed_ms"] for x in bm[minute_of(r["time"])]]
        lo, hi = _quartiles(vals)
        assert lo - 1e-3 <= r["p50_ms"] <= hi + 1e-3, (r, lo, hi)
        assert r["p50_ms"] <= r["p95_ms"] + 1e-3 <= r["p99_ms"] + 2e-3
        assert min(vals) - 1e-3 <= r["p99_ms"] <= max(vals) + 1e-3
    slow = [r["p50_ms"] for r in res if 150 <= minute_of(r["time"]) < 160]
    assert len(slow) == 10 and min(slow) >= 400 and max(v for m, v in series(res, "p50_ms").items() if not 150 <= m < 160) <= 80


@check("Transfer rate percentiles (responses >= 100 kB)")
def _rate(w: Any, sql: str) -> None:
    res = run(w[0], sql, interval_s=3600)
    hours: dict[int, list[float]] = defaultdict(list)
    for r in w[1].rows:
        if r["elapsed_ms"] and r["bytes"] >= 102400:
            hours[minute_of(r["ts"]) // 60 * 60].append(r["bytes"] * 1000 / r["elapsed_ms"])
    assert set(series(res, "p50_Bps")) == set(hours)
    for r in res:
        lo, hi = _quartiles(hours[minute_of(r["time"])])
        assert lo * 0.999 <= r["p50_Bps"] <= hi * 1.001
        assert r["p05_Bps"] <= r["p50_Bps"] <= r["p95_Bps"]


def topic_metric(rows: list[dict[str, Any]], metric: str) -> float:
    if metric == "visitors":
        return float(len({visitor(r) for r in rows if not r["is_bot"]}))
    kind = "reply" if metric == "replies" else "topic_view"
    return float(sum(is_human_topic_kind(r, kind) for r in rows))


def site_total(rows: list[dict[str, Any]], metric: str) -> float:
    if metric == "visitors":
        return float(len({visitor(r) for r in rows if not r["is_bot"]}))
    return topic_metric(rows, metric)


def label(t: int) -> str:
    return f"#{t} {fx.TOPICS[t]}"


def expected_topic_series(tr: fx.Traffic, metric: str, share: bool) -> dict[tuple[int, str], float]:
    out = {}
    for m, v in by_minute(tr.rows).items():
        total = site_total(v, metric)
        for t in fx.TOPICS:
            tv = [r for r in v if r["topic_id"] == t]
            if not tv:
                continue
            val = topic_metric(tv, metric)
            if share:
                if total > 0:
                    out[(m, label(t))] = round(100 * val / total, 4)
            else:
                out[(m, label(t))] = val
    return out


@check("Top topics: $metric (stacked)")
def _topics_abs(w: Any, sql: str) -> None:
    for metric in ("views", "replies", "visitors"):
        res = run(w[0], sql, metric=metric)
        got = {(minute_of(r["time"]), r["topic"]): r["value"] for r in res}
        approx_dict(got, expected_topic_series(w[1], metric, share=False))


@check("Top topics: share of forum $metric (%)")
def _topics_share(w: Any, sql: str) -> None:
    for metric in ("views", "replies", "visitors"):
        res = run(w[0], sql, metric=metric)
        got = {(minute_of(r["time"]), r["topic"]): r["share_pct"] for r in res}
        approx_dict(got, expected_topic_series(w[1], metric, share=True), tol=1e-4)
    res = run(w[0], sql, metric="views")
    peak = max((r for r in res if r["topic"] == label(fx.EVENT_TOPIC)), key=lambda r: r["share_pct"])
    assert 70 <= minute_of(peak["time"]) <= 90 and peak["share_pct"] > 50


def expected_group(tr: fx.Traffic, metric: str, share: bool, groups: tuple[str, ...]) -> dict[tuple[int, str], float]:
    out = {}
    for m, v in by_minute(tr.rows).items():
        total = site_total(v, metric)
        for g in groups:
            gv = [r for r in v if r["topic_id"] in fx.GROUPS[g]]
            if not gv:
                continue
            val = topic_metric(gv, metric)
            if share:
                if total > 0:
                    out[(m, g)] = round(100 * val / total, 4)
            else:
                out[(m, g)] = val
    return out


@check("Topic groups: $metric (stacked)")
def _groups_abs(w: Any, sql: str) -> None:
    for metric in ("views", "replies", "visitors"):
        res = run(w[0], sql, metric=metric)
        got = {(minute_of(r["time"]), r["topic_group"]): r["value"] for r in res}
        approx_dict(got, expected_group(w[1], metric, False, ("election", "sports")))
    one = run(w[0], sql, groups=("sports",))
    assert {r["topic_group"] for r in one} == {"sports"}


@check("Topic groups: share of forum $metric (%)")
def _groups_share(w: Any, sql: str) -> None:
    for metric in ("views", "replies", "visitors"):
        res = run(w[0], sql, metric=metric)
        got = {(minute_of(r["time"]), r["topic_group"]): r["share_pct"] for r in res}
        approx_dict(got, expected_group(w[1], metric, True, ("election", "sports")), tol=1e-4)
    # the event group's relative share at its peak minute equals the fixture's value
    want = expected_group(w[1], "views", True, ("election",))
    peak_m, peak_v = max(((m, v) for (m, _g), v in want.items()), key=lambda kv: (kv[1], -kv[0]))
    res = run(w[0], sql, metric="views", groups=("election",))
    top = max(res, key=lambda r: (r["share_pct"], -minute_of(r["time"])))
    assert (minute_of(top["time"]), top["share_pct"]) == (peak_m, pytest.approx(peak_v, abs=1e-4))
    assert 70 <= peak_m <= 90


@check("Top topics")
def _top_topics(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    rows = w[1].rows
    total_views = sum(is_human_topic_kind(r, "topic_view") for r in rows)
    want = []
    for t in fx.TOPICS:
        tv = [r for r in rows if r["topic_id"] == t]
        per_min = Counter(minute_of(r["ts"]) for r in tv if is_human_topic_kind(r, "topic_view"))
        views = sum(per_min.values())
        want.append({"topic_id": t, "title": fx.TOPICS[t], "views": views,
                     "replies": sum(is_human_topic_kind(r, "reply") for r in tv),
                     "visitors": len({visitor(r) for r in tv if not r["is_bot"]}),
                     "bot_views": sum(r["is_bot"] for r in tv),
                     "views_share_pct": round(100 * views / total_views, 2),
                     "peak_views": max(per_min.values()),
                     "peak_minutes": {m for m, c in per_min.items() if c == max(per_min.values())}})
    want.sort(key=lambda d: (-d["views"], d["topic_id"]))
    assert [r["topic_id"] for r in res] == [d["topic_id"] for d in want]
    assert res[0]["topic_id"] == fx.EVENT_TOPIC
    for got, exp in zip(res, want, strict=True):
        peaks = exp.pop("peak_minutes")
        assert minute_of(got["peak_minute"]) in peaks
        for k, v in exp.items():
            assert got[k] == pytest.approx(v), (k, got, exp)


@check("Selected topic: activity")
def _topic_activity(w: Any, sql: str) -> None:
    res = run(w[0], sql, topic="101")
    bm = by_minute(w[1].rows, lambda r: r["topic_id"] == 101)
    approx_dict({m: float(v) for m, v in series(res, "views").items()},
                {m: topic_metric(v, "views") for m, v in bm.items()})
    approx_dict({m: float(v) for m, v in series(res, "replies").items()},
                {m: topic_metric(v, "replies") for m, v in bm.items()})
    approx_dict({m: float(v) for m, v in series(res, "visitors").items()},
                {m: topic_metric(v, "visitors") for m, v in bm.items()})
    approx_dict({m: float(v) for m, v in series(res, "bot_views").items()},
                {m: float(sum(r["is_bot"] for r in v)) for m, v in bm.items()})
    other = run(w[0], sql, topic="105")
    assert sum(r["views"] for r in other) < sum(r["views"] for r in res)


@check("Selected topic: share of forum traffic (%)")
def _topic_share(w: Any, sql: str) -> None:
    res = run(w[0], sql, topic="101")
    bm = by_minute(w[1].rows)
    for r in res:
        v = bm[minute_of(r["time"])]
        tv = [x for x in v if x["topic_id"] == 101]
        for metric, col in (("views", "views_share_pct"), ("replies", "replies_share_pct"), ("visitors", "visitors_share_pct")):
            exp = round(100 * topic_metric(tv, metric) / max(site_total(v, metric), 1), 4)
            assert r[col] == pytest.approx(exp, abs=1e-4), (metric, minute_of(r["time"]))
    assert len(res) == len(by_minute(w[1].rows, lambda r: r["topic_id"] == 101))


@check("Humans vs bots (requests per interval)")
def _humans_bots(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    bm = by_minute(w[1].rows)
    approx_dict({m: float(v) for m, v in series(res, "bot_requests_n").items()},
                {m: float(sum(r["is_bot"] for r in v)) for m, v in bm.items()})
    approx_dict({m: float(v) for m, v in series(res, "human_requests").items()},
                {m: float(sum(not r["is_bot"] for r in v)) for m, v in bm.items()})
    approx_dict({m: float(v) for m, v in series(res, "human_pageviews").items()},
                {m: float(sum(not r["is_bot"] and not r["is_static"] for r in v)) for m, v in bm.items()})


@check("Detected events")
def _events(w: Any, sql: str) -> None:
    res = run(w[0], sql)
    assert [r["id"] for r in res] == ["det-group-election", "det-topic-101"]
    topic = res[1]
    assert (topic["state"], topic["observed"], topic["topic_id"]) == ("closed", 0.41, 101)
    assert topic["link_from_ms"] == int((T0 + timedelta(minutes=62 - 60)).timestamp() * 1000)
    assert topic["link_to_ms"] == int((T0 + timedelta(minutes=98 + 60)).timestamp() * 1000)
    assert res[0]["topic_id"] == 0


def test_every_panel_has_a_checked_answer(world: Any) -> None:
    seen = []
    for name, d in load_dashboards().items():
        for p in d["panels"]:
            title = p["title"]
            assert title in CHECKS, f"{name}: panel {title!r} has no checked answer in tests/test_dashboards.py"
            CHECKS[title](world, p["targets"][0]["rawSql"])
            seen.append(title)
    assert sorted(seen) == sorted(CHECKS), "a check exists for a panel that is gone"


def test_annotations_and_variables(world: Any) -> None:
    store = world[0]
    for d in load_dashboards().values():
        (ann,) = [a for a in d["annotations"]["list"] if a.get("builtIn") != 1]
        res = run(store, ann["target"]["rawSql"])
        assert [r["text"] for r in res] == ["topic_surge topic:101: surge (score 7.5)",
                                            "group_surge group:election: surge (score 6.2)"]
        assert minute_of(res[0]["timeEnd"]) == 98 and res[0]["tags"] == ["topic_surge", "surge"]
        tvars = {v["name"]: v for v in d["templating"]["list"]}
        assert [r["site"] for r in run(store, tvars["site"]["query"])] == [fx.SITE]
    tvars = {v["name"]: v for v in load_dashboards()["forumpulse-topics"]["templating"]["list"]}
    assert [r["group_name"] for r in run(store, tvars["group"]["query"])] == sorted(fx.GROUPS)
    topics = run(store, tvars["topic"]["query"])
    assert [(r["topic_id"], r["label"]) for r in topics] == [(t, label(t)) for t in sorted(fx.TOPICS)]
    assert tvars["group"]["multi"] and tvars["group"]["includeAll"]
    assert tvars["metric"]["query"].split(",") == ["views", "replies", "visitors"]


# ------------------------------------------------------------------------------- hourly rollup = minute rollup

HOURLY_PANELS = {"Top topics: $metric (stacked)", "Top topics: share of forum $metric (%)",
                 "Topic groups: $metric (stacked)", "Topic groups: share of forum $metric (%)", "Top topics",
                 "Selected topic: activity", "Selected topic: share of forum traffic (%)", "Top prefixes"}
#: each hourly rollup and the same hours computed from its minute rollup
HOUR_EQUALS_MINUTES = [
    ("topic_id, {h}, sum(views), sum(replies), sum(bot_views), uniqMerge(visitors)", "topic_id"),
    ("prefix, prefix_len, {h}, sum(requests), uniqMerge(clients)", "prefix, prefix_len"),
]


def _sorted_rows(store: Any, sql: str, ctx: QueryContext, vs: dict[str, TemplateVar]) -> list[tuple[Any, ...]]:
    return sorted(store.query_rows(render_query(sql, ctx, vs)), key=repr)


def test_hourly_path_gives_the_minute_paths_numbers(world: Any) -> None:
    """Topic and top-prefix panels read whole hours from the hourly rollups (migration 0003) and the
    range edges from the minute rollups; the same query reading minute rollups only (panels.minute_path) must give
    the same rows, for ranges aligned and not aligned to hours, shorter than an hour, and bucket intervals below, at
    and above an hour."""
    store = world[0]
    panels = {p["title"]: p["targets"][0]["rawSql"] for d in load_dashboards().values() for p in d["panels"]
              if "_hour " in p["targets"][0]["rawSql"]}
    assert set(panels) == HOURLY_PANELS
    ranges = [(T0, T1), (T0 + timedelta(minutes=7), T1 - timedelta(minutes=13)),
              (T0 + timedelta(minutes=30, seconds=17), T0 + timedelta(minutes=150, seconds=41)),
              (T0 + timedelta(minutes=61), T0 + timedelta(minutes=119)), (T0 + timedelta(minutes=65), T0 + timedelta(minutes=80))]
    hour_rows = (f"SELECT count() FROM topic_hour WHERE site = 'forum' AND hour >= {panels_mod.HOUR_FROM} "
                 f"AND hour < {panels_mod.HOUR_TO}")
    used_hours = 0
    for title, sql in sorted(panels.items()):
        assert panels_mod.minute_path(sql) != sql
        metrics = ("views", "replies", "visitors") if "$metric" in sql or "${metric" in sql else ("views",)
        for metric in metrics:
            vs = variables(metric=metric)
            for f, t in ranges:
                for interval_s in (60, 3600, 7200):
                    ctx = QueryContext(f, t, interval_s * 1000)
                    hourly = _sorted_rows(store, sql, ctx, vs)
                    minutely = _sorted_rows(store, panels_mod.minute_path(sql), ctx, vs)
                    assert hourly == minutely, (title, metric, f, t, interval_s)
                    assert hourly or (t - f) < timedelta(minutes=20), (title, metric, f, t, interval_s)
                used_hours += store.query_rows(render_query(hour_rows, QueryContext(f, t), vs))[0][0]
    assert used_hours > 0  # the aligned ranges do read hours from topic_hour
    # and each hourly rollup holds exactly its minute rollup's hours
    for cols, key in HOUR_EQUALS_MINUTES:
        kind = cols.split(",")[0].split("_")[0]
        hourly = store.query_rows(f"SELECT {cols.format(h='hour AS h')} FROM {kind}_hour GROUP BY {key}, h ORDER BY {key}, h")
        minutely = store.query_rows(f"SELECT {cols.format(h='toStartOfHour(minute) AS h')} FROM {kind}_minute "
                                    f"GROUP BY {key}, h ORDER BY {key}, h")
        assert hourly == minutely and len(hourly) > 3, kind


# --------------------------------------------------------------------------- variables cannot leave their literal

#: values a viewer can put in the URL (?var-site=...) or an API call: Grafana's singlequote escapes ' as \' and
#: leaves backslashes, which ClickHouse reads as escapes
HOSTILE = [
    "\\' OR 1=1 --",
    "\\' AND 0 GROUP BY time UNION ALL SELECT toDateTime(0) AS time, toFloat64(count()) FROM system.tables --",
    "' OR '1'='1",
    "forum\\",
    "\\",
    "forum' OR site != '",
    "%27) OR (1=1",
    "$$ OR 1=1 $$",
    "forum\n-- x",
    "{forum}",
]


def _run_vars(store: Any, sql: str, vs: dict[str, TemplateVar]) -> list[str]:
    rendered = render_query(sql, QueryContext(T0, T1, 60_000), vs)
    return sorted(repr(r) for r in store.query_rows(rendered))


def _all_queries() -> list[tuple[str, str]]:
    out = []
    for name, d in load_dashboards().items():
        out += [(f"{name}: {p['title']}", p["targets"][0]["rawSql"]) for p in d["panels"]]
        out += [(f"{name}: variable {v['name']}", v["query"]) for v in d["templating"]["list"] if v["type"] == "query"]
        out += [(f"{name}: annotation", a["target"]["rawSql"]) for a in d["annotations"]["list"] if "target" in a]
    return out


def _uses(sql: str, var: str) -> bool:
    return f"${{{var}" in sql or f"${var}" in sql or f"[[{var}" in sql


@pytest.mark.parametrize("var", ["site", "topic", "metric", "group"])
def test_hostile_variable_values_stay_inside_their_literal(world: Any, var: str) -> None:
    """Every query of both dashboards, with each hostile value in one variable: it runs (no syntax error from a
    broken literal) and gives exactly the rows of a harmless value that matches nothing -- no other site's rows,
    no system table, no widened filter."""
    store = world[0]
    harmless: str | list[str] = ["nosuch"] if var == "group" else "nosuch"
    checked = 0
    for title, sql in _all_queries():
        if not _uses(sql, var):
            continue
        base = variables()
        want = _run_vars(store, sql, {**base, var: TemplateVar(var, harmless)})
        for evil in HOSTILE:
            value: str | list[str] = ["nosuch", evil] if var == "group" else evil
            got = _run_vars(store, sql, {**base, var: TemplateVar(var, value)})
            assert got == want, (title, evil)
        checked += 1
    assert checked >= {"site": 25, "topic": 2, "metric": 4, "group": 2}[var], checked
    # and a hostile value is not merely "no rows": the queries did return data for the real value
    if var == "site":
        assert _run_vars(store, panels_mod.OPS_PANELS[0].sql, variables())


@pytest.mark.parametrize("value", ["forum", "it's \"quoted\" \\ back\\'slash", "50% + café ✓", "", "a\n-- b",
                                   "$$x$$", "%41"])
def test_variable_values_arrive_exactly(world: Any, value: str) -> None:
    """Percent-encoded by Grafana, decoded by ClickHouse: the SQL sees the very string selected."""
    store = world[0]
    vs = {"site": TemplateVar("site", value), "metric": TemplateVar("metric", value),
          "group": TemplateVar("group", [value, "sports"]), "topic": TemplateVar("topic", value)}
    sql = (f"SELECT {panels_mod.SITE_VALUE} AS s, {panels_mod.METRIC} AS m, {panels_mod.GROUP_VALUES} AS g, "
           f"{panels_mod.TOPIC} AS t")
    ((s, m, g, t),) = store.query_rows(render_query(sql, QueryContext(T0, T1), vs))
    assert (s, m, list(g), t) == (value, value, [value, "sports"], None)
    ((t,),) = store.query_rows(render_query(f"SELECT {panels_mod.TOPIC}", QueryContext(T0, T1),
                                            {"topic": TemplateVar("topic", "101")}))
    assert t == 101


def test_only_the_topic_variable_takes_custom_values() -> None:
    for d in load_dashboards().values():
        for v in d["templating"]["list"]:
            assert v["allowCustomValue"] is (v["name"] == "topic"), (d["uid"], v["name"])


@pytest.mark.parametrize("topic", ["", "not-a-number"])
def test_selected_topic_panels_without_a_topic_show_no_data(world: Any, topic: str) -> None:
    """No topic selected (no topic_titles rows: the variable is empty): no data, not a parse error."""
    sqls = [s.sql for s in panels_mod.TOPIC_PANELS if s.title.startswith("Selected topic")]
    assert len(sqls) == 2
    for sql in sqls:
        assert run(world[0], sql, topic=topic) == []


# ---------------------------------------------------------------------------- hourly rollups on a :30 server

@pytest.mark.parametrize("tz", ["Asia/Kolkata", "Asia/Kathmandu"])
def test_hourly_path_in_a_half_hour_time_zone(world: Any, tz: str) -> None:
    """A ClickHouse server (session) in a :30 / :45 zone: the hourly+minute stitching of the topic and prefix panels
    gives the numbers a UTC server gives from the minute rollup alone (hours are UTC hours in the rollups)."""
    store = world[0]
    panels = {p["title"]: p["targets"][0]["rawSql"] for d in load_dashboards().values() for p in d["panels"]
              if "_hour " in p["targets"][0]["rawSql"]}
    assert set(panels) == HOURLY_PANELS
    ranges = [(T0 + timedelta(minutes=10), T0 + timedelta(minutes=170)),
              (T0 + timedelta(minutes=30, seconds=17), T0 + timedelta(minutes=150, seconds=41))]
    for title, sql in sorted(panels.items()):
        for f, t in ranges:
            for interval_s in (60, 3600):
                ctx = QueryContext(f, t, interval_s * 1000)
                vs = variables()
                zoned = sorted(store.query_rows(render_query(sql, ctx, vs) + f" SETTINGS session_timezone = '{tz}'"),
                               key=repr)
                assert zoned == _sorted_rows(store, panels_mod.minute_path(sql), ctx, vs), (title, f, t, interval_s)


# -------------------------------------------------------------------------------- partial buckets of rate panels

def test_rate_panels_divide_a_cut_interval_by_the_seconds_it_covers(world: Any) -> None:
    """A range that starts and ends inside 10-minute intervals (ending "now", mid-minute): each interval's rate is
    its requests over the seconds of the whole minutes it holds inside the range -- not over 600 s, which drew
    the first and last intervals as drops."""
    store, tr = world[0], world[1]
    f, t = T0 + timedelta(minutes=3, seconds=20), T0 + timedelta(minutes=122, seconds=40)
    minutes = range(4, 122)  # whole minutes inside [f, t]: 00:04 .. 02:01 (02:02 is under way at t)
    ctx = QueryContext(f, t, 600_000)
    sqls = {s.title: s.sql for s in panels_mod.OPS_PANELS}
    for title, col, value in (("Requests per second", "requests_per_s", lambda r: 1),
                              ("Bytes per second", "bytes_per_s", lambda r: r["bytes"])):
        num: Counter[int] = Counter()
        secs: Counter[int] = Counter()
        for m in minutes:
            secs[m // 10 * 10] += 60
        for r in tr.rows:
            m = minute_of(r["ts"])
            if m in minutes:
                num[m // 10 * 10] += value(r)
        res = store.query_arrow(render_query(sqls[title], ctx, variables()))
        got = dict(zip((minute_of(x) for x in res.column("time").to_pylist()), res.column(col).to_pylist(), strict=True))
        approx_dict(got, {b: num[b] / secs[b] for b in num})
        assert secs[0] == 360 and secs[120] == 120  # the cut intervals
    # quarantined lines carry their own timestamps: an interval is clamped to the range in seconds
    f2, t2 = T0 + timedelta(minutes=12, seconds=30), T0 + timedelta(minutes=17, seconds=50)
    res = run_ctx(store, sqls["Quarantined lines per second"], QueryContext(f2, t2, 600_000))
    lines = [q for q in world[2] if f2 <= q["ingested_at"] <= t2]
    assert {(minute_of(r["time"]), r["reason"]): r["lines_per_s"] for r in res} == {
        (10, "truncated"): pytest.approx(len(lines) / (t2 - f2).total_seconds())}


def run_ctx(store: Any, sql: str, ctx: QueryContext) -> list[dict[str, Any]]:
    t = store.query_arrow(render_query(sql, ctx, variables()))
    return [dict(zip(t.column_names, r, strict=True)) for r in zip(*[c.to_pylist() for c in t.columns], strict=True)]
