"""Synthetic forum traffic with known answers, shared by the dashboard and report tests (no tests here).

Everything is generated from a seeded RNG as plain Python rows; the tests compute expected panel answers from
these rows (independently of the SQL under test) and load them into chDB through the store (``requests``
feeds the rollup MVs).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

SITE = "forum"
T0 = datetime(2024, 3, 10, 0, 0, tzinfo=UTC)
TOPICS = {101: "Election results thread", 102: "Polling station queues", 103: "Derby match day",
          104: "Transfer rumours", 105: "Garden pests", 106: "Site feedback"}
GROUPS = {"election": (101, 102), "sports": (103, 104)}
EVENT_TOPIC = 101
FLOOD_CLIENT = "192.0.2.66"

REQ_DEFAULTS: dict[str, Any] = {
    "site": SITE, "origin_host": "web1", "origin_file": "/var/log/nginx/access.log", "source_format": "nginx_combined",
    "client_host": "", "ident": "", "user": "", "method": "GET", "protocol": "HTTP/1.1", "status": 200, "bytes": 1000,
    "referer": "", "user_agent": "Mozilla/5.0", "elapsed_ms": None, "cache_result": "", "hierarchy": "",
    "upstream": "", "content_type": "text/html", "vhost": "forum.example.org", "topic_id": 0, "page_kind": "other",
    "is_static": False, "is_bot": False, "bot_name": "",
}


@dataclass
class Traffic:
    rows: list[dict[str, Any]] = field(default_factory=list)
    minutes: int = 180

    @property
    def t_end(self) -> datetime:
        return T0 + timedelta(minutes=self.minutes)


def _ts(minute: float) -> datetime:
    return T0 + timedelta(seconds=round(minute * 60, 3))


def make_traffic(minutes: int = 180, event_start: int = 60, event_peak: int = 80, event_width: float = 8.0,
                 event_height: float = 40.0, seed: int = 7, flood: bool = True) -> Traffic:
    """Background human + bot traffic on six topics, a surge on topic 101 peaking at ``event_peak``, a flood
    client (minutes 30–39), a 5xx burst (120–124) and slow responses (150–159)."""
    rnd = random.Random(seed)
    tr = Traffic(minutes=minutes)
    humans = [f"198.51.100.{i}" for i in range(1, 41)] + ["2001:db8::1", "2001:db8::2", "2001:db8::3"]
    fans = [f"203.0.113.{i}" for i in range(1, 31)]
    weights = [3, 2, 3, 2, 1, 1]
    refs = ["", "https://forum.example.org/", "https://www.google.com/"]

    def add(minute: int, **kw: Any) -> None:
        row = dict(REQ_DEFAULTS)
        row.update(kw)
        row["ts"] = _ts(minute + rnd.random() * 0.98)
        if row["elapsed_ms"] is None and row["origin_host"] == "web1":
            slow = 150 <= (minute % 1440) < 160
            row["elapsed_ms"] = float(rnd.randint(400, 900) if slow else rnd.randint(20, 80))
        path = row.get("path") or (f"/t/{row['topic_id']}" if row["topic_id"] else "/")
        row["path"] = path
        row["url"] = path
        tr.rows.append(row)

    for m in range(minutes):
        for _ in range(10 + m % 7):
            client = rnd.choice(humans)
            host = "web1" if rnd.random() < 0.7 else "web2"
            r = rnd.random()
            status = 500 if 120 <= m % 1440 < 125 and r < 0.3 else (404 if r < 0.05 else (304 if r < 0.12 else 200))
            if r < 0.15:
                big = rnd.random() < 0.4
                add(m, client_ip=client, origin_host=host, page_kind="static", is_static=True, path="/static/app.js",
                    bytes=rnd.randint(200_000, 3_000_000) if big else rnd.randint(500, 5000), status=status,
                    content_type="application/javascript")
                continue
            topic = rnd.choices(list(TOPICS), weights)[0]
            kind = "reply" if r > 0.85 else "topic_view"
            add(m, client_ip=client, origin_host=host, topic_id=topic, page_kind=kind,
                method="POST" if kind == "reply" else "GET", status=status, bytes=rnd.randint(2000, 60000),
                referer=rnd.choice(refs))
        for _ in range(2):
            add(m, client_ip="66.249.66.1", topic_id=rnd.choice(list(TOPICS)), page_kind="topic_view", is_bot=True,
                bot_name="Googlebot", user_agent="Googlebot/2.1", bytes=rnd.randint(2000, 20000))
        if m % 20 == 0:
            add(m, client_ip="::", client_host="crawler.example.net", page_kind="forum", path="/f/2")
        if m >= event_start:
            extra = round(event_height * math.exp(-(((m - event_peak) / event_width) ** 2)))
            for k in range(extra):
                kind = "reply" if k % 9 == 8 else "topic_view"
                add(m, client_ip=rnd.choice(fans), topic_id=EVENT_TOPIC, page_kind=kind,
                    method="POST" if kind == "reply" else "GET", referer="https://news.example.com/story",
                    bytes=rnd.randint(2000, 60000))
        if flood and 30 <= m < 40:
            for k in range(50):
                add(m, client_ip=FLOOD_CLIENT, page_kind="search", path="/search", status=429 if k % 2 else 200,
                    user_agent="python-requests/2.31", bytes=300)
    return tr


def requests_table(rows: list[dict[str, Any]]) -> pa.Table:
    cols = ["ts", "client_ip", *REQ_DEFAULTS, "url", "path"]
    data: dict[str, list[Any]] = {c: [] for c in cols}
    for r in rows:
        for c in cols:
            data[c].append(r[c])
    types = {"ts": pa.timestamp("ms", tz="UTC"), "status": pa.uint16(), "bytes": pa.uint64(),
             "elapsed_ms": pa.float32(), "topic_id": pa.uint64(), "is_static": pa.bool_(), "is_bot": pa.bool_()}
    return pa.table({c: pa.array(v, type=types.get(c, pa.string())) for c, v in data.items()})


def load_requests(store: Any, rows: list[dict[str, Any]], batch: int = 5000) -> None:
    # client_ip is IPv6 in the table: insert the text form of IPv4 as IPv4-mapped (the store contract).
    for i in range(0, len(rows), batch):
        part = [dict(r, client_ip=mapped(r["client_ip"])) for r in rows[i : i + batch]]
        store.insert("requests", requests_table(part), dedup_token=f"fixture-{i}")


def mapped(ip: str) -> str:
    return ip if ":" in ip else f"::ffff:{ip}"


def ts_table(rows: list[dict[str, Any]], ts_cols: tuple[str, ...], types: dict[str, pa.DataType] | None = None) -> pa.Table:
    types = dict(types or {})
    for c in ts_cols:
        types[c] = pa.timestamp("ms", tz="UTC")
    cols = list(rows[0])
    return pa.table({c: pa.array([r[c] for r in rows], type=types.get(c)) for c in cols})


def detections_rows(t0: datetime = T0) -> list[list[dict[str, Any]]]:
    """Two insert batches (separate parts): the first has stale states that FINAL must hide."""
    def det(i: str, kind: str, scope: str, s: int, e: int | None, p: int, state: str, upd: int, label: str,
            obs: float, exp: float, score: float) -> dict[str, Any]:
        return {"id": i, "kind": kind, "site": SITE, "scope": scope, "start_ts": t0 + timedelta(minutes=s),
                "end_ts": None if e is None else t0 + timedelta(minutes=e), "peak_ts": t0 + timedelta(minutes=p),
                "observed": obs, "expected": exp, "score": score, "label": label, "state": state, "detail": "{}",
                "updated_at": t0 + timedelta(minutes=upd)}

    first = [
        det("det-topic-101", "topic_surge", f"topic:{EVENT_TOPIC}", 62, None, 70, "open", 70, "surge", 0.2, 0.05, 3.1),
        det("det-old", "site_spike", "site", -2000, -1990, -1995, "closed", -1980, "spike", 900, 300, 5.0),
    ]
    second = [
        det("det-topic-101", "topic_surge", f"topic:{EVENT_TOPIC}", 62, 98, 80, "closed", 100, "surge", 0.41, 0.05, 7.5),
        det("det-group-election", "group_surge", "group:election", 65, 95, 80, "closed", 100, "surge", 0.45, 0.12, 6.2),
    ]
    return [first, second]
