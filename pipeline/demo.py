"""``forumpulse demo``: the main job end to end on the embedded default, with no servers.

simulate weeks of forum traffic (ground truth beside it) → ingest every file into chDB under ``DATA/demo/chdb``
→ load topic titles and groups → run the traffic detectors over the whole range and replay the DoS detector over
the logs in stream time → print a summary (top topics and their share, traffic per day, quarantine, detections
next to the ground truth) → write an event report for the biggest topic surge.

The demo writes ``DATA/demo/forumpulse.yaml`` so every other command can be pointed at the same store afterwards
(``forumpulse detect --config data/demo/forumpulse.yaml ...``, ``forumpulse report event --config data/demo/forumpulse.yaml ...``).  A re-run starts from an empty store.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from forumpulse.pipeline.config import Settings, load_settings
from forumpulse.pipeline.store import StoreBusy, chdb_foreign_holder
from rich.console import Console
from rich.table import Table


def _demo_settings(folder: Path, truth: dict[str, Any]) -> tuple[Path, Settings]:
    from forumpulse.pipeline.simulate import truth_config

    cfg = {"store": {"url": f"chdb:{folder / 'chdb'}"}, **truth_config(truth, folder / "logs")}
    path = folder / "forumpulse.yaml"
    path.write_text("# written by `forumpulse demo`: the demo's store, sources, site and topic groups\n"
                    + yaml.safe_dump(cfg, sort_keys=False))
    return path, load_settings(path)


_DEMO_LOCKS: list[Any] = []


def _refuse_if_open(chdb_folder: Path) -> None:
    """StoreBusy when another process holds the chDB folder's lock (the demo deletes the folder)."""
    lock = chdb_folder / ".forumpulse.lock"
    if lock.exists():  # a forumpulse process first (it holds the engine's lock too)
        with open(lock, "a+") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                owner = fh.read().strip() or "unknown"
                raise StoreBusy(f"the demo's store {chdb_folder} is open in another process (pid {owner}); the "
                                "demo starts afresh by deleting it: stop that process first, or use --data DIR"
                                ) from None
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    other = chdb_foreign_holder(chdb_folder)  # a chdb session / clickhouse-local, without forumpulse's lock
    if other is not None:
        raise StoreBusy(f"the demo's store {chdb_folder} is open in another process (pid {other}, not forumpulse: "
                        "a chdb session or clickhouse-local); the demo starts afresh by deleting it: stop that "
                        "process first, or use --data DIR")


def run_demo(data_dir: Path, weeks: int = 4, lines_per_day: int = 60_000, seed: int = 7,
             console: Console | None = None) -> dict[str, Any]:
    """Run the demo; returns the figures it printed (used by the tests)."""
    from forumpulse.pipeline.simulate import SimConfig, simulate

    con = console or Console(width=None if Console().is_terminal else 130)
    t_all = time.perf_counter()
    folder = Path(data_dir) / "demo"
    Path(data_dir).mkdir(parents=True, exist_ok=True)
    # One demo per data folder at a time (held until this process ends), and never wipe a store another
    # process has open (`forumpulse run` serving the demo's store, a report being written from it).
    guard = open(Path(data_dir) / ".demo.lock", "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(guard.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        guard.close()
        raise StoreBusy(f"another `forumpulse demo` is running in {data_dir}: wait for it, or use --data DIR") from None
    _DEMO_LOCKS.append(guard)
    _refuse_if_open(folder / "chdb")
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "logs").mkdir(parents=True)

    con.rule("[bold]1/5 simulate forum traffic")
    with con.status(f"simulating {weeks} weeks at ~{lines_per_day:,} lines/day ..."):
        sim = simulate(SimConfig(out=folder / "logs", days=7 * weeks, lines_per_day=lines_per_day, seed=seed))
    truth = json.loads(sim.truth_path.read_text())
    con.print(f"{sim.total_lines:,} lines in {len(sim.files)} files ({', '.join(f'{k} {v:,}' for k, v in sim.files.items())}) "
              f"in {sim.seconds:.1f} s; scenarios: {', '.join(s['kind'] for s in truth['scenarios'])}")
    cfg_path, settings = _demo_settings(folder, truth)

    from forumpulse.pipeline.ingest import file_progress, ingest_paths
    from forumpulse.pipeline.store import open_store

    store = open_store(settings.store.url)
    try:
        con.rule("[bold]2/5 ingest into chDB (the real ClickHouse engine, in-process)")
        with file_progress(con) as on_file:
            counts = ingest_paths(store, settings, [str(folder / "logs" / s["file"]) for s in truth["sources"]],
                                  on_file=on_file)
        for c in counts:
            con.print(f"{Path(c.name).name}: read {c.read:,}  loaded {c.loaded:,}  quarantined {c.quarantined:,}  "
                      f"{c.rate:,.0f} lines/s")
        _load_titles(store, settings)

        con.rule("[bold]3/5 traffic detectors (topic surges, spikes, dips, outages, gaps, transfer regressions)")
        start = datetime.fromtimestamp(truth["start_ms"] / 1000, UTC)
        end = datetime.fromtimestamp(truth["end_ms"] / 1000, UTC)
        from forumpulse.detectors.traffic import detect_history

        with con.status("running the traffic detectors over the whole range ..."):
            t_det = time.perf_counter()
            detections = detect_history(store, start + timedelta(days=7), end, settings)
        kinds = Counter(d.kind for d in detections)
        con.print(f"{len(detections)} detections over {(end - start - timedelta(days=7)).days} days (7 more for the "
                  f"baselines) in {time.perf_counter() - t_det:.0f} s: "
                  + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none"))

        con.rule("[bold]4/5 DoS detector replayed over the logs in stream time")
        decisions = _replay_dos(store, truth, con)

        con.rule("[bold]5/5 summary")
        figures = _summary(store, settings, truth, counts, detections, decisions, con)

        report_path = None
        surges = [d for d in detections if d.kind == "topic_surge"]
        if surges:
            from forumpulse.dashboards.report import generate_event_report

            top = max(surges, key=lambda d: d.score)
            report_path = generate_event_report(store, event_id=top.id, out_dir=folder / "report",
                                                site=truth["site"], own_hosts=settings.site(truth["site"]).hosts,
                                                tz=settings.site(truth["site"]).timezone)
    finally:
        store.close()
    con.rule()
    if report_path:
        con.print(f"event report: [bold]{report_path}[/bold] (open it in a browser)")
    con.print(f"store: {settings.store.url}   config: {cfg_path}   (e.g. .venv/bin/forumpulse report daily "
              f"-c {cfg_path} --day {(end - timedelta(days=3)).date()} --out {folder / 'daily'})")
    con.print(f"demo finished in {time.perf_counter() - t_all:.0f} s")
    figures["report"] = str(report_path) if report_path else None
    return figures


def _load_titles(store: Any, settings: Settings) -> None:
    from forumpulse.pipeline.enrich import load_configured_titles

    load_configured_titles(store, settings)


def _replay_dos(store: Any, truth: dict[str, Any], con: Console) -> list[Any]:
    """Replay the loaded rows, all sources merged in log-time order, day by day through the DoS detector."""
    from forumpulse.detectors.dos import Batch, StoreSink, build_detector

    sink = StoreSink(store)
    clock = {"now": truth["start_ms"] / 1000}
    # decisions are stamped in stream time: a replay of 2024's logs has no ban in force today (`detect decisions`
    # lists bans by created_at + duration against the wall clock, and an owner restores those at start)
    det = build_detector(sinks=[sink], wall_clock=lambda: clock["now"])
    decisions: list[Any] = []
    t0 = time.perf_counter()
    hour = 24 * 3600_000  # one day of rows per batch: the detector works best on large batches
    with con.status("replaying the stored requests in log-time order ..."):
        for h in range(truth["start_ms"] // hour, truth["end_ms"] // hour + 1):
            clock["now"] = (h + 1) * hour / 1000  # the end of the day being replayed
            tbl = store.query_arrow(
                "SELECT ts, client AS client_ip, method, path, query, status, user_agent, is_static FROM requests "
                f"WHERE ts >= fromUnixTimestamp64Milli({h * hour}) AND ts < fromUnixTimestamp64Milli({(h + 1) * hour}) "
                "ORDER BY ts")
            if tbl.num_rows:
                decisions += det.process(Batch.from_arrow(tbl))
        det.manager.flush()
    sink.flush()
    secs = time.perf_counter() - t0
    con.print(f"{det.stats['lines']:,} lines in {secs:.1f} s ({det.stats['lines'] / max(secs, 1e-9):,.0f} lines/s "
              f"including the queries), {len(decisions)} decisions")
    return decisions


def _summary(store: Any, settings: Settings, truth: dict[str, Any], counts: list[Any], detections: list[Any],
             decisions: list[Any], con: Console) -> dict[str, Any]:
    site = truth["site"]
    tz = truth["timezone"]
    top = store.query_rows(
        f"""SELECT t.topic_id, any(tt.title) AS title, sum(t.views) AS v, sum(t.replies) AS r,
                   round(100 * v / (SELECT sum(views) FROM topic_minute WHERE site = '{site}'), 2) AS share
            FROM topic_minute t LEFT JOIN (SELECT topic_id, argMax(title, updated_at) AS title FROM topic_titles
                                           WHERE site = '{site}' GROUP BY topic_id) tt ON tt.topic_id = t.topic_id
            WHERE t.site = '{site}' GROUP BY t.topic_id ORDER BY v DESC LIMIT 10""")
    tab = Table(title="top topics (human views, whole period)")
    for c in ("topic", "title", "views", "replies", "share %"):
        tab.add_column(c, justify="right" if c in ("views", "replies", "share %", "topic") else "left")
    for tid, title, v, r, share in top:
        tab.add_row(str(tid), (title or "")[:60], f"{v:,}", f"{r:,}", f"{share:.2f}")
    con.print(tab)

    days = store.query_rows(
        f"""SELECT toDate(minute, '{tz}') AS d, sum(requests), sum(pageviews), sum(topic_views), sum(replies),
                   sum(status_5xx), sum(bot_requests)
            FROM site_minute WHERE site = '{site}' GROUP BY d ORDER BY d""")
    tab = Table(title=f"traffic per day ({tz})")
    for c in ("day", "requests", "pageviews", "topic views", "replies", "5xx", "bots"):
        tab.add_column(c, justify="right")
    for d, *vals in days:
        tab.add_row(str(d), *(f"{v:,}" for v in vals))
    con.print(tab)

    q = store.query_rows("SELECT reason, count() FROM quarantine GROUP BY reason ORDER BY count() DESC")
    read = sum(c.read for c in counts)
    con.print(f"quarantined lines: {sum(n for _, n in q):,} of {read:,} read"
              + (" (" + ", ".join(f"{r}={n}" for r, n in q) + ")" if q else ""))

    tab = Table(title="detections (traffic)")
    for c in ("kind", "label", "scope", "start (UTC)", "end", "observed", "expected", "score"):
        tab.add_column(c)
    for d in sorted(detections, key=lambda d: d.start):
        tab.add_row(d.kind, d.label, d.scope, d.start.strftime("%Y-%m-%d %H:%M"),
                    d.end.strftime("%m-%d %H:%M") if d.end else "open", f"{d.observed:.3g}", f"{d.expected:.3g}",
                    f"{d.score:.2f}")
    con.print(tab)

    tab = Table(title="DoS decisions (replay, no firewall applied)")
    for c in ("value", "scope", "reason", "decided at (log time)", "duration"):
        tab.add_column(c)
    for d in decisions[:20]:
        j = d.to_json()
        tab.add_row(str(j["value"]), str(j["scope"]), str(j["reason"]), str(j["decided_at"]), f"{j['duration_s']} s")
    con.print(tab)
    if len(decisions) > 20:
        con.print(f"... and {len(decisions) - 20} more decisions")

    tab = Table(title="ground truth (simulator) vs what was found")
    tab.add_column("scenario")
    tab.add_column("window (UTC)")
    tab.add_column("found")
    found_any = 0
    for s in truth["scenarios"]:
        hit = _matches(s, detections, decisions)
        found_any += bool(hit)
        tab.add_row(s["id"], f"{s['start'][:16]} - {s['end'][:16]}", hit or "[red]not found[/red]")
    con.print(tab)
    return {"lines": read, "loaded": sum(c.loaded for c in counts), "quarantined": sum(c.quarantined for c in counts),
            "detections": len(detections), "decisions": len(decisions), "scenarios": len(truth["scenarios"]),
            "scenarios_found": found_any, "top_topic": top[0][0] if top else None}


_KIND_MATCH = {
    "event": ("topic_surge",), "holiday": ("dip",), "outage": ("dip", "outage"), "pipeline_gap": ("pipeline_gap",),
    "transfer_collapse": ("transfer_regression", "transfer"),
}


def _matches(s: dict[str, Any], detections: list[Any], decisions: list[Any]) -> str:
    """A short description of what found scenario ``s`` (detections overlapping its window), or ''."""
    a, b = s["start_ms"], s["end_ms"]
    kinds = _KIND_MATCH.get(s["kind"])
    if kinds:
        for d in detections:
            st = d.start.timestamp() * 1000
            en = (d.end or d.peak_ts).timestamp() * 1000
            if any(d.kind.startswith(k) for k in kinds) and st <= b and en >= a - 3600_000:
                return f"{d.kind}/{d.label} {d.scope} at {d.start:%m-%d %H:%M}"
        return ""
    for dec in decisions:
        j = dec.to_json()
        decided = datetime.fromisoformat(str(j["decided_at"]).replace("Z", "+00:00")).timestamp() * 1000
        if a - 60_000 <= decided <= b:
            return f"{j['reason']} {j['value']} at {str(j['decided_at'])[11:19]}"
    return ""
