"""Rollup traffic detectors on the fixture cases of detectors/rules/traffic_cases/ (known answers).

Each case describes synthetic forum traffic (seeded Poisson counts, daily and weekly shape, in the site's time
zone) plus injected events; the rows go into `requests` of a real chDB store, the materialized views build the
rollups, and the detectors run over them (history mode, or `run_once` at `now` for live cases).  Rows come from
one log source (origin/access.log) unless the case lists `sources` (file and share of the rows); a `source_gap`
event removes one file's rows in its range.  `reply_fraction` turns that share of the background topic rows into
replies; a `topic` event with `page_kind` (topic_view / reply) or `clients` (that many distinct addresses, 0 = a
new one per row) gets rows of its own.  Expectations: `detail_min` / `detail_max` / `detail_eq` (dotted paths into
`detail`, e.g. `by_measure.replies.magnitude`) and `detail_has` (a list in `detail` holds the value);
`expected_min` / `expected_max` bound the detection's `expected`.
"""

from __future__ import annotations

import math
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from forumpulse.detectors.series import Detection
from forumpulse.detectors.traffic import TrafficDetector, detect_history
from forumpulse.pipeline.config import HolidayPeriod, Settings, SiteConfig, TopicGroup
from forumpulse.pipeline.store import migrate, open_store

CASES_DIR = Path(__file__).resolve().parent.parent / "detectors" / "rules" / "traffic_cases"
CASES = sorted(CASES_DIR.glob("*.yaml"))


def _load(p: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(p.read_text())
    return data


def _local(case: dict[str, Any], s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=ZoneInfo(case["site"]["timezone"])).astimezone(UTC)


def _shape(local_hour: np.ndarray) -> np.ndarray:
    """Night trough, evening peak (1.0 at 21h, 0.25 at 4h)."""
    return 0.625 + 0.375 * np.cos((local_hour - 21.0) / 24.0 * 2 * np.pi)


def _ramp(ev: dict[str, Any], n: int, factor: float) -> np.ndarray | float:
    """An event's factor over its ``n`` minutes: constant, or with ``ramp: true`` rising (or falling) linearly from 1
    at ``from`` to ``factor`` at ``to`` (a slow creep)."""
    return 1.0 + (factor - 1.0) * np.arange(1, n + 1) / n if ev.get("ramp") else factor


def build_requests(case: dict[str, Any]) -> pa.Table:
    """The case's `requests` rows (one Arrow table)."""
    tz = ZoneInfo(case["site"]["timezone"])
    rng = np.random.default_rng(zlib.crc32(case["site"]["name"].encode()))
    t0 = _local(case, case["start"] + "T00:00")
    minutes = np.array([t0 + timedelta(minutes=i) for i in range(case["days"] * 1440)])
    local = [m.astimezone(tz) for m in minutes]
    hour = np.array([lt.hour + lt.minute / 60 for lt in local])
    weekend = np.array([lt.weekday() >= 5 for lt in local])
    lam = case["per_minute"] * _shape(hour) * np.where(weekend, case.get("weekend_factor", 1.0), 1.0)
    status = np.full(len(minutes), 200)
    keep = np.ones(len(minutes), dtype=bool)
    extra_topic: list[tuple[int, int, int]] = []  # (minute index, topic, views)
    own_topic: list[tuple[dict[str, Any], int, int]] = []  # topic events with their own page kind / clients
    rate_factor: dict[str, np.ndarray] = {u: np.ones(len(minutes)) for u in case.get("upstreams", [])}
    latency = np.ones(len(minutes))
    for ev in case.get("events", []):
        lo = int((_local(case, ev["from"]) - t0).total_seconds() // 60)
        hi = int((_local(case, ev["to"]) - t0).total_seconds() // 60)
        if ev["kind"] == "factor":
            lam[lo:hi] *= ev["factor"]
        elif ev["kind"] == "status":
            status[lo:hi] = ev["status"]
        elif ev["kind"] == "gap":
            keep[lo:hi] = False
        elif ev["kind"] == "topic" and ("page_kind" in ev or "clients" in ev):
            own_topic.append((ev, lo, hi))
        elif ev["kind"] == "topic":
            extra_topic += [(i, ev["topic_id"], ev["per_minute"]) for i in range(lo, hi)]
        elif ev["kind"] == "transfer":
            rate_factor[ev["upstream"]][lo:hi] *= _ramp(ev, hi - lo, ev["rate_factor"])
        elif ev["kind"] == "latency":
            latency[lo:hi] *= _ramp(ev, hi - lo, ev["factor"])
    if "latency_daily" in case or "latency_weekend_factor" in case:  # ordinary seasonality of response times
        amp = float(case.get("latency_daily", 0.0))
        latency *= (1.0 - amp / 2 + amp * _shape(hour)) * np.where(weekend, case.get("latency_weekend_factor", 1.0), 1.0)
    counts = rng.poisson(lam) * keep
    idx = np.repeat(np.arange(len(minutes)), counts)
    n = len(idx)
    base_ms = np.array([int(m.timestamp() * 1000) for m in minutes], dtype=np.int64)
    ts = base_ms[idx] + rng.integers(0, 60_000, n)
    topic = np.where(rng.random(n) < 0.5, rng.zipf(1.6, n) % 300 + 1, 0)
    page_kind = np.where(topic > 0, "topic_view", "forum")
    if case.get("reply_fraction"):  # background posts: this share of the topic rows are replies
        page_kind = np.where((topic > 0) & (rng.random(n) < case["reply_fraction"]), "reply", page_kind)
    cols: dict[str, Any] = {
        "ts": ts, "client_ip": [f"::ffff:10.{(i >> 8) & 255}.{i & 255}.7" for i in rng.integers(0, 60000, n)],
        "status": status[idx], "bytes": rng.integers(500, 40_000, n), "topic_id": topic,
        "page_kind": page_kind, "upstream": [case.get("small_upstream", "")] * n,
        "elapsed_ms": (list(case["elapsed_ms"] * latency[idx] * rng.lognormal(0.0, 0.3, n)) if "elapsed_ms" in case
                       else [None] * n),
    }
    parts = [cols]
    if extra_topic:
        ti = np.repeat([e[0] for e in extra_topic], [e[2] for e in extra_topic])
        tt = np.repeat([e[1] for e in extra_topic], [e[2] for e in extra_topic])
        m = len(ti)
        parts.append({"ts": base_ms[ti] + rng.integers(0, 60_000, m),
                      "client_ip": [f"::ffff:10.99.{(i >> 8) & 255}.{i & 255}" for i in rng.integers(0, 60000, m)],
                      "status": np.full(m, 200), "bytes": np.full(m, 20_000), "topic_id": tt,
                      "page_kind": ["topic_view"] * m, "upstream": [""] * m, "elapsed_ms": [None] * m})
    for u, factor in rate_factor.items():
        per = case.get("large_per_minute", 0)
        every = case.get("large_every_minutes", 1)  # sparse large responses: one every N minutes
        li = np.repeat(np.arange(len(minutes)), per)
        li = li[li % every == 0]
        m = len(li)
        size = np.full(m, 2_000_000)
        rate = 700e6 * factor[li] * rng.uniform(0.9, 1.1, m)  # bytes per second
        parts.append({"ts": base_ms[li] + rng.integers(0, 60_000, m), "client_ip": ["::ffff:10.50.0.1"] * m,
                      "status": np.full(m, 200), "bytes": size, "topic_id": np.zeros(m, dtype=np.int64),
                      "page_kind": ["other"] * m, "upstream": [u] * m,
                      "elapsed_ms": list(size / rate * 1000.0)})
    for k, (ev, lo, hi) in enumerate(own_topic):
        # a topic event with its own rows: `page_kind` (topic_view / reply) and `clients` (that many distinct
        # addresses, e.g. one regular reader or the few posters of a heated thread; default: a new one per row)
        ev_rng = np.random.default_rng(zlib.crc32(f"{case['site']['name']}/{k}".encode()))
        ti = np.repeat(np.arange(lo, hi), ev["per_minute"])
        m = len(ti)
        who = ev_rng.integers(0, ev["clients"], m) if ev.get("clients") else ev_rng.integers(0, 1 << 16, m)
        parts.append({"ts": base_ms[ti] + ev_rng.integers(0, 60_000, m),
                      "client_ip": [f"::ffff:10.{100 + k}.{(i >> 8) & 255}.{i & 255}" for i in who],
                      "status": np.full(m, 200), "bytes": np.full(m, 20_000),
                      "topic_id": np.full(m, ev["topic_id"]), "page_kind": [ev.get("page_kind", "topic_view")] * m,
                      "upstream": [""] * m, "elapsed_ms": [None] * m})
    # log sources: origin/access.log unless the case splits the rows over several files (drawn from a generator of
    # its own, so the other cases' rows do not move); a `source_gap` event drops one file's rows in its range
    files = [np.full(len(p["ts"]), "access.log", dtype=object) for p in parts]
    if case.get("sources"):
        src_rng = np.random.default_rng(zlib.crc32(case["site"]["name"].encode()) + 1)
        names = np.array([s["file"] for s in case["sources"]], dtype=object)
        shares = np.array([float(s["share"]) for s in case["sources"]])
        files = [src_rng.choice(names, size=len(p["ts"]), p=shares / shares.sum()) for p in parts]
    tables = []
    for p, f in zip(parts, files, strict=True):
        m = len(p["ts"])
        tables.append(pa.table({
            "ts": pa.array(np.asarray(p["ts"], dtype=np.int64), pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
            "site": [case["site"]["name"]] * m, "origin_host": ["origin"] * m, "origin_file": list(f),
            "source_format": ["combined"] * m, "client_ip": p["client_ip"], "method": ["GET"] * m,
            "url": ["/x"] * m, "path": ["/x"] * m, "status": pa.array(np.asarray(p["status"]), pa.uint16()),
            "bytes": pa.array(np.asarray(p["bytes"]), pa.uint64()),
            "elapsed_ms": pa.array(p["elapsed_ms"], pa.float32()), "upstream": p["upstream"],
            "topic_id": pa.array(np.asarray(p["topic_id"]), pa.uint64()), "page_kind": p["page_kind"],
            "is_static": [False] * m, "is_bot": [False] * m,
        }))
    out = pa.concat_tables(tables)
    for ev in case.get("events", []):
        if ev["kind"] == "source_gap":
            lo, hi = (pa.scalar(_local(case, ev[k]), pa.timestamp("ms", tz="UTC")) for k in ("from", "to"))
            inside = pc.and_(pc.greater_equal(out["ts"], lo), pc.less(out["ts"], hi))
            out = out.filter(pc.invert(pc.and_(inside, pc.equal(out["origin_file"], ev["source"]))))
    return out


def heartbeat_log_rows(case: dict[str, Any], host: str = "origin", file: str = "access.log") -> pa.Table:
    """``source_heartbeat_minute`` rows (migration 0008) for the case's ``heartbeat_log`` spans: a heartbeat every
    ``every_s`` seconds in ``[from, to)`` reporting the file's size (growing by ``grow_bytes_per_s``, default 0:
    the size does not change) and inode 1, folded per minute as the consumer folds them (earliest, latest).  A
    span's ``site`` / ``host`` / ``file`` (default: the case's site, ``host``, ``file``) name another heartbeat
    source: a collector's listener (``{site: "*", host: coll, file: "syslog:5514"}``: no size)."""
    from forumpulse.pipeline.consumer import heartbeat_log_table

    spans: dict[tuple[str, str, str, int], list[tuple[int, int, int]]] = {}
    sizes: dict[tuple[str, str, str], int] = {}
    for sp in case["heartbeat_log"]:
        key = (sp.get("site", case["site"]["name"]), sp.get("host", host), sp.get("file", file))
        listener = ":" in key[2]
        size = sizes.get(key, 1_000_000)
        t = int(_local(case, sp["from"]).timestamp() * 1000)
        end = int(_local(case, sp["to"]).timestamp() * 1000)
        while t < end:
            beat = (t, 0, 0) if listener else (t, size, 1)
            span = spans.setdefault((*key, t - t % 60_000), [beat, beat])
            span[0], span[1] = min(span[0], beat), max(span[1], beat)
            t += int(sp["every_s"] * 1000)
            size += int(sp.get("grow_bytes_per_s", 0) * sp["every_s"])
        sizes[key] = size
    return heartbeat_log_table([(*k[:3], k[3], lo, hi) for k, (lo, hi) in spans.items()])


def _settings(cases: list[dict[str, Any]]) -> Settings:
    sites = [SiteConfig(name=c["site"]["name"], timezone=c["site"]["timezone"], country=c["site"].get("country"),
                        holiday_periods=[HolidayPeriod(**p) for p in c["site"].get("holiday_periods", [])])
             for c in cases]
    groups = [TopicGroup(name=g, site=c["site"]["name"], topic_ids=ids)
              for c in cases for g, ids in (c.get("groups") or {}).items()]
    return Settings(sites=sites, topics={"groups": groups})


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Any:
    cases = [_load(p) for p in CASES]
    store = open_store(f"chdb:{tmp_path_factory.mktemp('traffic_cases')}")
    migrate(store, {"raw_ttl_days": 0, "rollup_ttl_days": 0})
    for c in cases:
        store.insert("requests", build_requests(c))
        if c.get("heartbeat_log"):
            store.insert("source_heartbeat_minute", heartbeat_log_rows(c))
    yield store, cases
    store.close()


def _matches(det: Detection, rule: dict[str, Any], case: dict[str, Any]) -> bool:
    if det.kind != rule["kind"]:
        return False
    if "label" in rule and det.label != rule["label"]:
        return False
    if "scope" in rule and det.scope != rule["scope"]:
        return False
    if "scope_not" in rule and det.scope in rule["scope_not"]:
        return False
    if "start_from" in rule and det.start < _local(case, rule["start_from"]):
        return False
    if not rule.get("expected_min", -math.inf) <= det.expected <= rule.get("expected_max", math.inf):
        return False
    if any(float(_detail(det, k) or 0) < v for k, v in (rule.get("detail_min") or {}).items()):
        return False
    if any(float(_detail(det, k) or 0) > v for k, v in (rule.get("detail_max") or {}).items()):
        return False
    if any(_detail(det, k) != v for k, v in (rule.get("detail_eq") or {}).items()):
        return False
    if any(v not in (_detail(det, k) or []) for k, v in (rule.get("detail_has") or {}).items()):
        return False
    if "end_from" in rule and (det.end is None or det.end < _local(case, rule["end_from"])):
        return False
    if "end_to" in rule and (det.end is None or det.end > _local(case, rule["end_to"])):
        return False
    return not ("start_to" in rule and det.start > _local(case, rule["start_to"]))


def _detail(det: Detection, key: str) -> Any:
    """``det.detail`` at a dotted path (``by_measure.replies.magnitude``); None when absent."""
    value: Any = det.detail
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _check(dets: list[Detection], case: dict[str, Any], expect: list[dict[str, Any]],
           forbid: list[dict[str, Any]], only: bool) -> None:
    shown = "\n".join(d.to_json() for d in dets)
    for rule in expect:
        assert any(_matches(d, rule, case) for d in dets), f"expected {rule} in:\n{shown}"
    for rule in forbid:
        assert not any(_matches(d, rule, case) for d in dets), f"forbidden {rule} in:\n{shown}"
    if only:
        extra = [d for d in dets if not any(_matches(d, r, case) for r in expect)]
        assert not extra, "unexpected detections:\n" + "\n".join(d.to_json() for d in extra)


def test_every_rule_has_cases() -> None:
    rules = {_load(p)["rule"] for p in CASES}
    assert {"site", "health", "topic", "transfer", "latency"} <= rules


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case(loaded: Any, path: Path) -> None:
    store, cases = loaded
    case = _load(path)
    settings = _settings(cases)
    if case.get("mode") == "live":
        _run_live(store, case, settings)
        return
    dets = [d for d in detect_history(store, _local(case, case["detect"]["from"] + "T00:00"),
                                      _local(case, case["detect"]["to"] + "T00:00"), settings,
                                      sites=[case["site"]["name"]])
            if d.site == case["site"]["name"]]
    _check(dets, case, case.get("expect", []), case.get("forbid", []), case.get("only_expected", False))
    stored = store.query_rows(
        f"SELECT count(), uniqExact(id) FROM detections FINAL WHERE site = '{case['site']['name']}'")
    assert stored[0][0] == stored[0][1] >= len(case.get("expect", []))


def _run_live(store: Any, case: dict[str, Any], settings: Settings) -> None:
    now = _local(case, case["now"])
    name = case["site"]["name"]
    # the fresh heartbeat comes from the file itself, from its host (origin_file '': every file of the host) or
    # from syslog-ng's MARK (site '*': the host in every site); all three say "alive"
    for variant, hb, exp_key, forbid_key in (("fresh", case["heartbeat"], "expect", "forbid"),
                                              ("host", case["heartbeat"], "expect", "forbid"),
                                              ("mark", case["heartbeat"], "expect", "forbid"),
                                              ("stale", case["stale_heartbeat"], "expect_stale", "forbid_stale")):
        store.command(f"ALTER TABLE source_liveness DELETE WHERE site IN ('{name}', '*') SETTINGS mutations_sync = 1")
        hb_ts = _local(case, hb)
        line_ts = _local(case, "2026-03-11T09:59")
        rows = [(name, "access.log", line_ts, hb_ts if variant in ("fresh", "stale") else _local(case, case["stale_heartbeat"]))]
        if variant in ("host", "mark"):
            rows.append((name if variant == "host" else "*", "", datetime(1970, 1, 1, tzinfo=UTC), hb_ts))
        store.insert("source_liveness", pa.table({
            "site": [r[0] for r in rows], "origin_host": ["origin"] * len(rows), "origin_file": [r[1] for r in rows],
            "last_line_ts": pa.array([r[2] for r in rows], pa.timestamp("ms", tz="UTC")),
            "last_heartbeat_ts": pa.array([r[3] for r in rows], pa.timestamp("ms", tz="UTC")),
            "lines": pa.array([1] * len(rows), pa.uint64()),
            "updated_at": pa.array([datetime.now(UTC)] * len(rows), pa.timestamp("ms", tz="UTC"))}))
        det = TrafficDetector(settings, sites=[name])
        dets = [d for d in det.run_once(store, now) if d.site == name]
        _check(dets, case, case[exp_key], case.get(forbid_key, []), False)
        # a second call at the same minute adds nothing new
        assert [d for d in det.run_once(store, now) if d.site == name] == [], variant
