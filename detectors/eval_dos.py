"""Evaluation of the DoS detector: ``python -m forumpulse.detectors.eval_dos [--data DIR] [--out FILE.md]``.

Parts (each prints a table; all go to ``--out`` as markdown):

1. CrowdSec hub test cases whose scenario is a flood, probe, scan or bad-request pattern: which sources we
   flag, next to the alerts CrowdSec expects.
2. secrepo logs: the real 2018-12-15 scan must be flagged as scan/probe; the other days must ban no crawler and
   no normal client (every decision is listed for inspection).
3. Simulated floods on a synthetic forum background (humans with page+asset loads, NAT gateways with many
   users, crawlers, allowlisted monitoring): recall, false bans, detection delay in stream time; and the same
   traffic through a fail2ban-style per-IP jail (maxretry/findtime 300/300 s and 100/10 s) for comparison.

The ``synth_*`` generators are also used by the tests.  Data default: ``../shared/data`` next to the project
root (override with ``--data`` or ``$FORUMPULSE_SHARED_DATA``); the script says clearly when it is absent.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import sys
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from forumpulse.detectors.dos import Batch, CrawlerVerifier, DecisionManager, DosDetector, parse_file
from forumpulse.detectors.dos_rules import DosConfig, load_rules
from forumpulse.pipeline.record import ParsedLine

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = Path(os.environ.get("FORUMPULSE_SHARED_DATA", ROOT.parent / "shared" / "data"))

BROWSERS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/{v}.1 Safari/605.1.15",
    "Mozilla/5.0 (X11; Linux x86_64; rv:{v}.0) Gecko/20100101 Firefox/{v}.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_{v} like Mac OS X) AppleWebKit/605.1.15 Mobile/15E148",
    "Mozilla/5.0 (Linux; Android 14; SM-S{v}) AppleWebKit/537.36 Chrome/120.0 Mobile Safari/537.36",
]
GOOGLEBOT = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"


def rec(ts: int, ip: str, path: str = "/", query: str = "", status: int = 200, ua: str = "Mozilla/5.0",
        method: str = "GET") -> ParsedLine:
    """One ParsedLine with the fields the detector reads (others empty)."""
    url = path + ("?" + query if query else "")
    return ParsedLine(ts, ip, None, None, None, method, url, path, query, "HTTP/1.1", status, 100, None, ua,
                      None, None, None, None, None, None)


def synth_humans(rng: np.random.Generator, t0: int, seconds: int, n_clients: int, prefix: str = "100.64",
                 pages_per_min: float = 2.0) -> list[ParsedLine]:
    """Independent visitors: each page view = 1 html + 0-2 XHR + 8-25 static assets within ~1.5 s."""
    out: list[ParsedLine] = []
    for c in range(n_clients):
        ip = f"{prefix}.{c // 250}.{c % 250 + 1}"
        ua = BROWSERS[c % len(BROWSERS)].format(v=100 + c % 30)
        out += _visits(rng, t0, seconds, ip, ua, pages_per_min)
    return out


def _visits(rng: np.random.Generator, t0: int, seconds: int, ip: str, ua: str, pages_per_min: float,
            ) -> list[ParsedLine]:
    out = []
    n = rng.poisson(pages_per_min * seconds / 60)
    for t in np.sort(rng.integers(0, seconds * 1000, n)):
        base = t0 + int(t)
        topic = int(rng.integers(1, 5000))
        out.append(rec(base, ip, f"/t/topic-{topic}", ua=ua))
        for j in range(int(rng.integers(0, 3))):
            out.append(rec(base + 200 + 50 * j, ip, f"/t/{topic}/posts.json", ua=ua))
        for j in range(int(rng.integers(8, 26))):
            out.append(rec(base + 100 + int(rng.integers(0, 1400)), ip, f"/assets/app-{j}.js" if j % 2 else
                           f"/uploads/img{topic % 97}-{j}.png", ua=ua))
    return out


def synth_nat(rng: np.random.Generator, t0: int, seconds: int, ip: str, users: int,
              pages_per_min: float = 3.0) -> list[ParsedLine]:
    """One address, many users (carrier NAT / office proxy): ``users`` browsers behind ``ip``."""
    out = []
    for u in range(users):
        out += _visits(rng, t0, seconds, ip, BROWSERS[u % len(BROWSERS)].format(v=90 + u), pages_per_min)
    return out


def synth_crawler(rng: np.random.Generator, t0: int, seconds: int, ip: str, rate: float,
                  ua: str = GOOGLEBOT, missing_share: float = 0.2) -> list[ParsedLine]:
    """A crawler at ``rate`` req/s over old and new URLs (a share of them 404)."""
    n = int(rate * seconds)
    ts = np.sort(rng.integers(0, seconds * 1000, n))
    return [rec(t0 + int(t), ip, f"/t/old-{int(rng.integers(1, 10**6))}",
                status=404 if rng.random() < missing_share else 200, ua=ua) for t in ts]


def synth_flood(t0: int, ip: str, rate: float, seconds: float, path: str = "/search",
                ua: str = "Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0", query: str = "q=x") -> list[ParsedLine]:
    """A single-client flood at ``rate`` req/s, evenly spaced, starting at t0."""
    n = int(rate * seconds)
    return [rec(t0 + int(i * 1000 / rate), ip, path, query, ua=ua) for i in range(n)]


def ordered(records: Iterable[ParsedLine]) -> list[ParsedLine]:
    return sorted(records, key=lambda r: r.ts)


def run_detector(records: list[ParsedLine], cfg: DosConfig | None = None, batch_lines: int = 20_000,
                 verifier: CrawlerVerifier | None = None) -> DosDetector:
    """Replay records through a detector built from ``cfg`` (its rules file and rule_overrides included)."""
    cfg = cfg or DosConfig(crawlers={"verify": "ua"})
    mgr = DecisionManager(cfg, verifier=verifier)
    det = DosDetector(load_rules(cfg.rules_file, cfg.rule_overrides), mgr)
    for i in range(0, len(records), batch_lines):
        det.process(Batch.from_records(records[i:i + batch_lines]))
    return det


def fail2ban_jail(records: Iterable[ParsedLine], maxretry: int, findtime_s: int) -> dict[str, int]:
    """fail2ban-style per-IP jail: ban when ``maxretry`` lines fall within ``findtime_s``; returns ip -> ban ms."""
    hist: dict[str, deque[int]] = defaultdict(deque)
    banned: dict[str, int] = {}
    for r in records:
        if r.client_ip is None or r.client_ip in banned:
            continue
        h = hist[r.client_ip]
        h.append(r.ts)
        while h and h[0] <= r.ts - findtime_s * 1000:
            h.popleft()
        if len(h) >= maxretry:
            banned[r.client_ip] = r.ts
    return banned


# --------------------------------------------------------------------------------------------- parts


FLOOD_SCENARIOS = ("http-dos", "probing", "scan", "sensitive", "path-traversal", "sqli", "xss", "malformed",
                   "invalid-http", "bad-user-agent", "crawl-non_statics", "admin-interface", "w00t",
                   "backdoor", "req_limit", "technology-probing", "wordpress-scan")


def stand_in(ip: str | None) -> str | None:
    """A routable stand-in for a loopback address (never banned: ``dos.NEVER_BAN``), keeping the prefix structure
    (``127.a.b.c`` -> ``100.(64 + a % 64).b.c``, ``::1`` -> ``2001:db8:ffff::1``); other values unchanged.  The
    CrowdSec hub's test logs attack from loopback; replaying them unchanged would judge only the refusal."""
    if ip is None:
        return None
    try:
        a = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped  # ::ffff:127.0.0.1 (not loopback to ipaddress on Python 3.11)
    if not a.is_loopback:
        return ip
    if a.version == 4:
        p = a.packed  # 127.a.b.c, a < 64 in every hub case (100.64.0.0/10 has 22 bits, loopback 24)
        return f"100.{64 + p[1] % 64}.{p[2]}.{p[3]}"
    return "2001:db8:ffff::1"


def crowdsec_cases(data: Path) -> tuple[list[str], list[list[str]]]:
    """The hub cases, loopback attackers replayed from :func:`stand_in` addresses (decisions shown under the
    address the case names)."""
    base = data / "crowdsec_hub_tests"
    summary = json.loads((base / "SUMMARY.json").read_text())
    rows = []
    for t in summary:
        exp = t["expected"].get("alerts") or []
        scen = " ".join(a["scenario"] for a in exp) + " " + t["test"]
        if not any(k in scen for k in FLOOD_SCENARIOS) and exp:
            continue
        if t["log_type"] not in ("nginx", "apache2"):
            continue
        log = base / "tests" / t["test"] / t["log_file"]
        if not log.is_file():
            continue
        recs = list(parse_file(str(log), "auto"))
        back = {stand_in(r.client_ip): r.client_ip for r in recs if stand_in(r.client_ip) != r.client_ip}
        det = run_detector([r._replace(client_ip=stand_in(r.client_ip)) for r in recs])
        decided = [(back.get(d.value, d.value), d.reason) for d in det.manager.decisions]
        ours = sorted({f"{v} ({reason})" for v, reason in decided})
        expected = sorted({f"{s} ({a['scenario'].split('/')[-1]})" for a in exp for s in a["sources"]})
        exp_ips = {s for a in exp for s in a["sources"]}
        got_ips = {v for v, _ in decided}
        verdict = ("match" if exp_ips == got_ips else "partial" if exp_ips & got_ips else
                   "missed" if exp_ips else "false flag" if got_ips else "match (none)")
        rows.append([t["test"], "<br>".join(expected) or "none", "<br>".join(ours) or "none", verdict])
    return ["case", "CrowdSec expects", "forumpulse decides", "verdict"], rows


def secrepo(data: Path) -> tuple[list[str], list[list[str]]]:
    base = data / "access_logs" / "secrepo"
    rows = []
    for f in sorted(base.glob("*.log*")):
        recs = ordered(parse_file(str(f), "combined"))
        det = run_detector(recs)
        per_ip: dict[str, list[ParsedLine]] = defaultdict(list)
        for r in recs:
            per_ip[r.client_ip or ""].append(r)
        for d in det.manager.decisions:
            rs = per_ip.get(d.value, [])
            n404 = sum(1 for r in rs if r.status == 404)
            ua = (rs[0].user_agent or "-")[:60] if rs else "-"
            rows.append([f.name, d.value, d.reason, d.to_json()["decided_at"], f"{len(rs)} req, {n404} 404", ua])
        if not det.manager.decisions:
            rows.append([f.name, "-", "no decision", "", f"{len(recs)} lines", ""])
    return ["log", "value", "reason", "decided_at", "client's lines", "user agent"], rows


@dataclass
class SimResult:
    rows: list[list[str]]
    recall: float
    false_bans: int
    max_delay_s: float


def simulation(seed: int = 7) -> SimResult:
    rng = np.random.default_rng(seed)
    t0 = 1_700_000_000_000
    dur = 900
    recs = synth_humans(rng, t0, dur, 400)
    recs += synth_nat(rng, t0, dur, "100.70.0.1", users=120, pages_per_min=2.0)
    recs += synth_nat(rng, t0, dur, "100.70.0.2", users=40, pages_per_min=4.0)
    recs += synth_crawler(rng, t0, dur, "66.249.66.1", rate=3.0)
    recs += synth_crawler(rng, t0, dur, "203.0.113.9", rate=25.0, ua="uptime-monitor/1.0", missing_share=0)
    attackers: dict[str, int] = {}
    for i, rate in enumerate([20, 25, 40, 100, 400]):
        ip, start = f"198.51.100.{i + 1}", t0 + (60 + 150 * i) * 1000 + 337
        attackers[ip] = start
        recs += synth_flood(start, ip, rate, 30)
    # a random-UA flood and a cache-busting flood
    attackers["198.51.100.50"] = t0 + 500_000
    recs += [rec(t0 + 500_000 + i * 40, "198.51.100.50", "/", ua=BROWSERS[i % 5].format(v=i)) for i in range(750)]
    attackers["198.51.100.51"] = t0 + 600_000
    recs += [rec(t0 + 600_000 + i * 30, "198.51.100.51", "/", str(10**8 + i * 7919)) for i in range(1000)]
    recs = ordered(recs)
    cfg = DosConfig(crawlers={"verify": "ua"}, allowlist=["203.0.113.0/24"])
    det = run_detector(recs, cfg)
    decided = {d.value: d for d in det.manager.decisions}
    caught = {ip: (decided[ip].decided_at - s) / 1000 for ip, s in attackers.items() if ip in decided}
    false = [v for v in decided if v not in attackers]
    rows = []
    jails = {"fail2ban 300/300s": fail2ban_jail(recs, 300, 300), "fail2ban 100/10s": fail2ban_jail(recs, 100, 10)}
    all_ips = {r.client_ip for r in recs}
    rows.append(["forumpulse dos", f"{len(caught)}/{len(attackers)}", str(len(false)),
                 f"{max(caught.values(), default=float('nan')):.2f}",
                 f"{np.median(list(caught.values())) if caught else float('nan'):.2f}", ", ".join(false) or "-"])
    for name, jail in jails.items():
        c = {ip: (jail[ip] - s) / 1000 for ip, s in attackers.items() if ip in jail}
        f = [ip for ip in jail if ip not in attackers]
        rows.append([name, f"{len(c)}/{len(attackers)}", str(len(f)), f"{max(c.values(), default=float('nan')):.2f}",
                     f"{np.median(list(c.values())) if c else float('nan'):.2f}", ", ".join(f) or "-"])
    rows.append([f"(traffic: {len(recs)} lines, {len(all_ips)} addresses)", "", "", "", "", ""])
    return SimResult(rows, len(caught) / len(attackers), len(false), max(caught.values(), default=float("inf")))


def bench_columns(lines: int = 1_000_000, seed: int = 5) -> dict[str, np.ndarray]:
    """Synthetic forum traffic as columns (20k clients, 5k topics, assets, 2% 404s, 1% SQLi probes)."""
    rng = np.random.default_rng(seed)
    t0 = 1_700_000_000_000
    ts = np.sort(t0 + rng.integers(0, lines * 5, lines))  # ~200 lines/s of stream time per ... x5 ms
    client = rng.integers(0, 20_000, lines)
    ip = np.array([f"100.{64 + i // 65_000}.{(i // 250) % 256}.{i % 250 + 1}" for i in range(20_000)], dtype=object)[client]
    topic = rng.integers(1, 5000, lines)
    kind = rng.random(lines)
    paths = np.where(kind < 0.6, np.array([f"/assets/app-{i % 40}.js" for i in range(5000)], dtype=object)[topic],
                     np.array([f"/t/topic-{i}" for i in range(5000)], dtype=object)[topic])
    query = np.where(rng.random(lines) < 0.01, "q=union+select+1", "").astype(object)
    status = np.where(rng.random(lines) < 0.02, 404, 200)
    ua = np.array([b.format(v=v) for b in BROWSERS for v in range(100, 140)], dtype=object)[client % 200]
    return {"ts": ts, "client_ip": ip, "method": np.full(lines, "GET", dtype=object), "path": paths,
            "query": query, "status": status, "user_agent": ua}


def _load_module(path: str) -> Any:
    """A detector module from a file (e.g. ``git show 5f2c296:detectors/dos.py > /tmp/dos_old.py``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("forumpulse_dos_compare", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def bench(lines: int = 1_000_000, batch: int = 100_000, seed: int = 5, module: Any = None,
          arrow: bool = False) -> float:
    """Detector throughput (lines/s) on synthetic forum traffic (:func:`bench_columns`).

    ``arrow=False``: ``process`` alone on prebuilt batches; ``arrow=True``: ``process(Batch.from_arrow(t))`` on
    Arrow tables, conversion included (what the live feed and ``make bench`` do).  ``module``: another
    implementation of ``forumpulse.detectors.dos`` to measure (default: the current one).  Parsing is never
    included."""
    import time

    import pyarrow as pa

    m = module if module is not None else sys.modules[DosDetector.__module__]
    cols = bench_columns(lines, seed)
    det = m.DosDetector(manager=m.DecisionManager(DosConfig(crawlers={"verify": "off"})))
    if arrow:
        tbl = pa.table({k: pa.array(v) for k, v in cols.items()})
        tables = [tbl.slice(i, batch) for i in range(0, lines, batch)]
        start = time.perf_counter()
        for t in tables:
            det.process(m.Batch.from_arrow(t))
        return lines / (time.perf_counter() - start)
    batches = [m.Batch.from_columns({k: v[i:i + batch] for k, v in cols.items()}) for i in range(0, lines, batch)]
    start = time.perf_counter()
    for b in batches:
        det.process(b)
    return lines / (time.perf_counter() - start)


def demo_eval(workdir: Path, weeks: int = 4, lines_per_day: int = 60_000, seed: int = 7,
              batch_ms: int = 86_400_000) -> tuple[list[list[str]], dict[str, Any]]:
    """The ``make demo`` simulation (same defaults) through ingest and a DoS replay in log-time order (one day
    per batch, as the demo does), scored per address against the simulator's own plan: which addresses of each
    flood were banned, and every ban of an address that belongs to no attack (false bans; the election surge
    is real users).  Needs chDB (in-process); writes under ``workdir``."""
    import shutil

    import yaml
    from forumpulse.detectors.dos import build_detector
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.ingest import ingest_paths
    from forumpulse.pipeline.simulate import SimConfig, _Plan, simulate, truth_config
    from forumpulse.pipeline.store import open_store

    folder = Path(workdir) / "dos-demo-eval"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "logs").mkdir(parents=True)
    cfg = SimConfig(out=folder / "logs", days=7 * weeks, lines_per_day=lines_per_day, seed=seed)
    sim = simulate(cfg)
    truth = json.loads(sim.truth_path.read_text())
    plan = _Plan(cfg)  # the same deterministic plan: the addresses behind every scenario
    attack: dict[str, set[str]] = {}
    for scn in plan.scenarios:
        if scn.kind in ("flood_ip", "flood_prefix", "flood_distributed", "scan"):
            attack[scn.id] = set(plan.site.client_strs[scn.client_off: scn.client_off + scn.n_clients])
    settings_path = folder / "forumpulse.yaml"
    settings_path.write_text(yaml.safe_dump({"store": {"url": f"chdb:{folder / 'chdb'}"},
                                             **truth_config(truth, folder / "logs")}, sort_keys=False))
    settings = load_settings(settings_path)
    store = open_store(settings.store.url)
    try:
        ingest_paths(store, settings, [str(folder / "logs" / x["file"]) for x in truth["sources"]])
        det = build_detector()
        for h in range(truth["start_ms"] // batch_ms, truth["end_ms"] // batch_ms + 1):
            tbl = store.query_arrow(
                "SELECT ts, client AS client_ip, method, path, query, status, user_agent, is_static FROM requests "
                f"WHERE ts >= fromUnixTimestamp64Milli({h * batch_ms}) "
                f"AND ts < fromUnixTimestamp64Milli({(h + 1) * batch_ms}) ORDER BY ts")
            if tbl.num_rows:
                det.process(Batch.from_arrow(tbl))
    finally:
        store.close()
    import ipaddress

    bans = [d for d in det.manager.decisions if d.action == "ban"]

    def owner(value: str) -> str | None:
        for sid, ips in attack.items():
            if value in ips:
                return sid
            if "/" in value and any(ipaddress.ip_address(i) in ipaddress.ip_network(value) for i in ips):
                return sid
        return None

    rows: list[list[str]] = []
    for sid, ips in attack.items():
        mine = [d for d in bans if owner(d.value) == sid]
        covered = {i for i in ips if any(d.value == i or ("/" in d.value and ipaddress.ip_address(i) in
                                                         ipaddress.ip_network(d.value)) for d in mine)}
        enforced = [d for d in mine if d.mode == "enforce"]
        reasons = sorted({d.reason for d in mine})
        first = min((d.decided_at for d in mine), default=None)
        scn = next(x for x in truth["scenarios"] if x["id"] == sid)
        delay = f"{(first - scn['start_ms']) / 1000:.0f}" if first is not None else "-"
        rows.append([sid, str(len(ips)), f"{len(covered)} ({100 * len(covered) / max(len(ips), 1):.1f}%)",
                     str(len(mine)), str(len(enforced)), delay, ", ".join(reasons) or "-"])
    false = [d for d in bans if owner(d.value) is None]
    ev = next((x for x in truth["scenarios"] if x["kind"] == "event"), None)
    in_event = [d for d in false if ev is not None and ev["start_ms"] <= d.decided_at <= ev["end_ms"]]
    true_n = len(bans) - len(false)
    rows.append(["(false bans: no attack)", "", "", str(len(false)), str(sum(d.mode == "enforce" for d in false)),
                 "", ", ".join(sorted({f"{d.reason}:{d.value}" for d in false}))[:300] or "-"])
    summary = {"bans": len(bans), "true": true_n, "false": len(false), "false_in_election": len(in_event),
               "precision": true_n / max(len(bans), 1), "lines": det.stats["lines"],
               "distributed": next((r for r in rows if r[0].startswith("flood_distributed")), None)}
    return rows, summary


def _md(title: str, head: list[str], rows: list[list[str]]) -> str:
    out = [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--out", default=None, help="write the tables as markdown to this file")
    ap.add_argument("--bench", action="store_true", help="only measure detector throughput (lines/s)")
    ap.add_argument("--compare", metavar="DOS_PY", default=None,
                    help="with --bench: also measure this older dos.py, interleaved in the same process")
    ap.add_argument("--rounds", type=int, default=1, help="with --bench: rounds (the best of each is reported)")
    ap.add_argument("--demo", metavar="WORKDIR", default=None,
                    help="score the DoS replay of the `make demo` simulation per address (needs chDB; slow)")
    ap.add_argument("--demo-batch-s", type=int, default=86_400,
                    help="with --demo: stream seconds per replay batch (the demo uses a day)")
    a = ap.parse_args(argv)
    if a.demo:
        rows, summ = demo_eval(Path(a.demo), batch_ms=a.demo_batch_s * 1000)
        print(_md("DoS decisions on the demo simulation, per address vs the simulator's plan",
                  ["scenario", "addresses", "addresses banned", "bans", "enforced", "first ban s after start",
                   "rules"], rows))
        print(json.dumps({k: v for k, v in summ.items() if k != "distributed"}))
        return 0
    if a.bench:
        impls: list[tuple[str, Any]] = [("current", None)]
        if a.compare:
            impls.append((f"compare ({a.compare})", _load_module(a.compare)))
        best: dict[tuple[str, str, int], float] = {}
        for _ in range(max(a.rounds, 1)):
            for arrow in (False, True):
                for size in (20_000, 100_000):
                    for name, mod in impls:
                        key = (name, "from_arrow + process" if arrow else "process", size)
                        best[key] = max(best.get(key, 0.0), bench(batch=size, module=mod, arrow=arrow))
        for (name, what, size), v in best.items():
            print(f"{name:>10}: {what}, batches of {size}: {v:,.0f} lines/s")
        if a.compare:
            for (name, what, size), v in best.items():
                if name == "current":
                    old = best[(impls[1][0], what, size)]
                    print(f"speed-up {what}, batches of {size}: {v / old:.2f}x")
        return 0
    data = Path(a.data)
    parts: list[str] = ["# DoS detector evaluation\n"]
    if not data.is_dir():
        print(f"shared data folder {data} is absent: the CrowdSec and secrepo parts are skipped "
              "(pass --data DIR or set FORUMPULSE_SHARED_DATA); running the simulation only", file=sys.stderr)
    else:
        parts.append(_md("CrowdSec hub cases (flood/probe/scan/bad-request scenarios)", *crowdsec_cases(data))
                     + "\nThe hub's logs attack from loopback, which forumpulse never bans: those lines are replayed "
                     "from 100.64.0.0/10 (`::1` from 2001:db8:ffff::1) and decisions shown under the case's "
                     "address.\n")
        parts.append(_md("secrepo real logs (every decision listed)", *secrepo(data)))
    sim = simulation()
    parts.append(_md("Simulated floods (15 min forum background, 7 attackers, 2 NATs, 2 crawlers, 1 allowlisted "
                     "monitor)", ["detector", "attackers caught", "false bans", "max delay s", "median delay s",
                                  "falsely banned"], sim.rows))
    text = "\n".join(parts)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["crowdsec_cases", "fail2ban_jail", "main", "rec", "run_detector", "stand_in", "synth_crawler",
           "synth_flood", "synth_humans", "synth_nat"]
