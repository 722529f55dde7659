"""``make bench``: forumpulse measured side by side with its peers, written to BENCHMARKS.md (issue #8).

Run::

    .venv/bin/python -m forumpulse.pipeline.bench                       # everything, full sizes (20-40 min)
    .venv/bin/python -m forumpulse.pipeline.bench --sections ingest,dos --sizes 1000000 --scale 1000000
    .venv/bin/python -m forumpulse.pipeline.bench --help

Sections (``--sections``, comma separated, default all):

* ``ingest``   file -> parse + attribute -> chDB (``forumpulse ingest`` as a child process) vs ``goaccess`` on the
  same simulated combined file (``--sizes``), plus the scaling series (``--scale``, 1M lines per simulated day);
* ``consumer`` pre-filled Kafka topic -> LiveConsumer -> chDB vs a bare confluent-kafka batched read of the topic;
* ``e2e``      file -> syslog-ng -> Kafka -> owner process (consumer inside) -> rows queryable over its HTTP
  endpoint, vs syslog-ng's own rate into Kafka in the same run; then p50/p95 freshness under a paced writer;
* ``dos``      DoS detector alone on the parsed 1st ``--sizes`` file vs ``fail2ban-regex`` on the same file;
* ``storage``  bytes per row on disk per table (system.parts after OPTIMIZE FINAL) and vs the raw log bytes,
  plus the costliest ``requests`` columns;
* ``queries``  every dashboard panel / variable / annotation query (24 h and 7 d ranges) and the traffic
  detector's queries over the largest ``--scale`` store: p50/p95 ms.

Every heavy step runs in a child process so that its peak RSS is known (``ru_maxrss`` from ``wait4``: the
largest single process of the child's tree); Kafka, syslog-ng and the owner are read from ``/proc/PID/status``
(``VmHWM``) before they stop.  Every figure with a peer is reported as a ratio measured in the same run.

Guarantees: a section that fails is reported as failed in BENCHMARKS.md (with the error) and the others still
run; every process started here is stopped at the end; the work folder (``--workdir``, default a temporary
folder under /tmp) is removed unless ``--keep``.  Needs the repository checkout (Kafka/syslog-ng helpers live in
``tests/live_stack.py``), ``goaccess``, ``fail2ban-regex``, java + the Kafka jars and syslog-ng (``make
system-deps``).  Misuse: do not point ``--workdir`` at a folder holding anything else (it is emptied).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from forumpulse.pipeline.threadcpu import ENV as THREAD_CPU_ENV

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
DEPLOY = REPO / "deploy" / "bench"
PY = sys.executable
RESULT_PREFIX = "BENCH_RESULT "
GNU_TIME = "/usr/bin/time" if Path("/usr/bin/time").exists() else None
SECTIONS = ("ingest", "consumer", "e2e", "dos", "storage", "queries")
LINES_PER_DAY = 1_000_000
TARGETS = {
    "ingest_vs_goaccess": 4.0, "consumer_vs_bare": 0.60, "e2e_vs_syslogng": 0.50, "e2e_lines_s": 80_000,
    "freshness_p95_s": 2.0, "dos_lines_s": 200_000, "requests_bytes_per_row": 16.0, "raw_vs_requests": 12.0,
    "query_p95_ms": 300.0,
}


# ------------------------------------------------------------------------------------------------ helpers


@dataclass
class Measured:
    """A finished child process: wall seconds, exit code, peak RSS (KiB, largest process of its tree)."""

    cmd: list[str]
    seconds: float
    rc: int
    max_rss_kb: int
    out: str
    err: str
    #: user + system CPU seconds of the command (all its threads; children it waited for included)
    cpu_s: float = 0.0
    #: CPU seconds by kind of thread (:func:`thread_kind`), sampled from /proc every 0.1 s while it ran (by a
    #: thread of this process) and, for forumpulse commands, completed by the command's own report of every live
    #: thread at its exit (:mod:`forumpulse.pipeline.threadcpu`): a thread that ended between two samples lost up
    #: to 0.1 s, so the sum is at most ``cpu_s``
    threads_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def rss_mb(self) -> float:
        return self.max_rss_kb / 1024

    def result(self) -> dict[str, Any]:
        """The JSON object an ``--internal`` child printed (raises with its stderr when it failed)."""
        for line in reversed(self.out.splitlines()):
            if line.startswith(RESULT_PREFIX):
                return dict(json.loads(line[len(RESULT_PREFIX):]))
        raise RuntimeError(f"{shell(self.cmd)} failed (rc={self.rc}):\n{self.err[-4000:]}\n{self.out[-2000:]}")


def shell(cmd: list[str]) -> str:
    import shlex

    return " ".join(shlex.quote(str(c)) for c in cmd)


def run_measured(cmd: Sequence[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None,
                 log_dir: Path | None = None, check: bool = True) -> Measured:
    """Run ``cmd`` to completion; wall time from spawn to exit and ``ru_maxrss`` from ``wait4``."""
    log_dir = log_dir or Path(tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    stamp = f"{os.getpid()}-{time.monotonic_ns()}"
    out_p, err_p = log_dir / f"child-{stamp}.out", log_dir / f"child-{stamp}.err"
    rss_p = log_dir / f"child-{stamp}.rss"
    exit_p = log_dir / f"child-{stamp}.threads"  # written at exit by forumpulse commands (threadcpu)
    # GNU time reports the peak RSS of the command itself; ru_maxrss from our own wait4 would include this
    # (larger) process's pages at fork time, which Linux keeps across exec.
    wrap = [GNU_TIME, "-q", "-f", "%M %U %S", "-o", str(rss_p)] if GNU_TIME else []
    with out_p.open("wb") as fo, err_p.open("wb") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen([*wrap, *(str(c) for c in cmd)], stdout=fo, stderr=fe, cwd=cwd,
                             env={**os.environ, THREAD_CPU_ENV: str(exit_p), **(env or {})})
        seen: dict[tuple[int, int], float] = {}
        by_kind: dict[str, float] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_until, args=(p.pid, seen, by_kind, stop), daemon=True)
        sampler.start()
        _, status, ru = os.wait4(p.pid, 0)  # blocking: the wall time ends at the exit itself
        secs = time.perf_counter() - t0
        stop.set()
        sampler.join()
        _add_exit_report(exit_p, seen, by_kind)
        p.returncode = os.waitstatus_to_exitcode(status)
    rss = int(ru.ru_maxrss)
    cpu = ru.ru_utime + ru.ru_stime
    if GNU_TIME:
        with contextlib.suppress(OSError, ValueError, IndexError):
            f_rss, f_user, f_sys = rss_p.read_text().strip().splitlines()[-1].split()
            rss, cpu = int(f_rss), float(f_user) + float(f_sys)
    m = Measured([str(c) for c in cmd], secs, p.returncode, rss,
                 out_p.read_text(errors="replace"), err_p.read_text(errors="replace"), cpu,
                 {k: round(v, 2) for k, v in by_kind.items()})
    for f in (out_p, err_p, rss_p, exit_p):
        f.unlink(missing_ok=True)
    if check and m.rc != 0:
        raise RuntimeError(f"{shell(m.cmd)} failed (rc={m.rc}):\n{m.err[-4000:]}\n{m.out[-2000:]}")
    return m


def vm_hwm_kb(pid: int | None) -> int | None:
    """Peak RSS (``VmHWM``, KiB) of a running process, None when it is gone."""
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def thread_kind(comm: str, main_comm: str) -> str:
    """What a thread of a measured process is, from its name: Python threads keep the name of the process's main
    thread, librdkafka names its own ``rdk:*``, chDB (ClickHouse) names its pools (``MergeMutate`` = background
    merges)."""
    if comm == main_comm:
        return "interpreter"
    if comm.startswith("rdk:"):
        return "librdkafka"
    if comm.startswith("MergeMutate"):
        return "chDB merges"
    return "chDB"


def _add_exit_report(path: Path, seen: dict[tuple[int, int], float], by_kind: dict[str, float]) -> None:
    """Add what each thread named in a command's exit report (:mod:`forumpulse.pipeline.threadcpu`) used since
    the sampler last saw it: the work of a short command's last tenth of a second (its final insert)."""
    try:
        doc = json.loads(path.read_text())
        pid, main_comm, threads = int(doc["pid"]), str(doc["main"]), dict(doc["threads"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a forumpulse command, or it did not exit normally: the samples stand alone
    for tid, (comm, cpu) in threads.items():
        key = (pid, int(tid))
        delta = float(cpu) - seen.get(key, 0.0)
        if delta > 0:
            kind = thread_kind(str(comm), main_comm)
            by_kind[kind] = by_kind.get(kind, 0.0) + delta
            seen[key] = float(cpu)


def proc_cpu_s(stat_path: str) -> float:
    """User + system CPU seconds from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` file."""
    f = Path(stat_path).read_text().rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _sample_until(root: int, seen: dict[tuple[int, int], float], by_kind: dict[str, float],
                  stop: threading.Event) -> None:
    while not stop.wait(0.1):
        _sample_threads(root, seen, by_kind)


def _sample_threads(root: int, seen: dict[tuple[int, int], float], by_kind: dict[str, float]) -> None:
    """Add the CPU seconds every thread of ``root``'s descendants (``root`` is the GNU time wrapper or the command
    itself) used since the previous sample to ``by_kind``, under the kind its name has now: chDB's pool threads
    take the name of the job they run (``MergeMutate``, ``QueryPipelineEx``) and ``ThreadPool`` when idle.
    ``seen`` keeps each (pid, tid)'s CPU seconds at the previous sample."""
    stack, first = [root], True
    while stack:
        pid = stack.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
            main_comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if not (first and GNU_TIME):  # the wrapper's own (idle) thread is not the command's
            for tid in tids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                    now = proc_cpu_s(f"/proc/{pid}/task/{tid}/stat")
                    key = (pid, int(tid))
                    kind = thread_kind(comm, main_comm)
                    by_kind[kind] = by_kind.get(kind, 0.0) + now - seen.get(key, 0.0)
                    seen[key] = now
        first = False
        for tid in tids:
            with contextlib.suppress(OSError, ValueError):
                stack.extend(int(c) for c in Path(f"/proc/{pid}/task/{tid}/children").read_text().split())


def pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def percentile(values: list[float], q: float) -> float:
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


def internal(name: str, args: dict[str, Any], log_dir: Path, cwd: Path | None = None) -> tuple[dict[str, Any], Measured]:
    """Run ``--internal name`` in a child process; return its JSON result and the measurement."""
    m = run_measured([PY, "-m", "forumpulse.pipeline.bench", "--internal", name, "--args", json.dumps(args)],
                     cwd=cwd or REPO, log_dir=log_dir, check=False, env={"FP_BENCH_CHILD": "1"})
    return m.result(), m


def emit(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)


def _live_stack() -> Any:
    """tests/live_stack.py (Kafka and syslog-ng process helpers; repository checkout only)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    import live_stack

    return live_stack


def forumpulse_exe() -> list[str]:
    exe = Path(PY).parent / "forumpulse"
    return [str(exe)] if exe.exists() else [PY, "-c", "from forumpulse.pipeline.cli import main; main()"]


def count_lines(path: Path) -> int:
    n = 0
    with path.open("rb") as fh:
        while chunk := fh.read(16 << 20):
            n += chunk.count(b"\n")
    return n


# ------------------------------------------------------------------------------------------------ data


def simulated_file(work: Path, lines: int) -> Path:
    """A combined-format log of ``lines`` lines (1M per simulated day, pure background, seed 1); cached."""
    from forumpulse.pipeline.simulate import SimConfig, SourceSpec, simulate

    out = work / f"sim-{lines}"
    f = out / "web1.log"
    meta = out / "meta.json"
    if f.exists() and meta.exists():
        return f
    if os.environ.get("FP_BENCH_CHILD") != "1":  # simulate in a child: numpy/pyarrow stay out of the parent
        internal("simulate", {"work": str(work), "lines": lines}, work)
        return f
    days = max(1, -(-lines // LINES_PER_DAY))
    simulate(SimConfig(out=out, days=days, lines=lines, sources=(SourceSpec("web1", "combined"),), scenarios=()))
    meta.write_text(json.dumps({"lines": count_lines(f), "bytes": f.stat().st_size, "days": days}))
    return f


def file_meta(f: Path) -> dict[str, Any]:
    return dict(json.loads((f.parent / "meta.json").read_text()))


def write_settings(path: Path, store: str, bootstrap: str | None = None, batch_lines: int | None = None) -> Path:
    """A config file with retention off (simulated timestamps are old) and the given store/broker; batching is
    the shipped default unless ``batch_lines`` is given."""
    import yaml

    doc: dict[str, Any] = {
        "store": {"url": store},
        "retention": {"raw_days": 0, "rollup_days": 0, "quarantine_days": 0, "stats_days": 0},
    }
    if batch_lines is not None:
        doc["ingest"] = {"batch_lines": batch_lines}
    if bootstrap:
        doc["kafka"] = {"bootstrap_servers": bootstrap}
    path.write_text(yaml.safe_dump(doc))
    return path


# ------------------------------------------------------------------------------------------------ children


def child_count(a: dict[str, Any]) -> dict[str, Any]:
    from forumpulse.pipeline.store import open_store

    store = open_store(a["store"])
    try:
        r = store.query_rows("SELECT (SELECT count() FROM requests), (SELECT count() FROM quarantine)")[0]
        return {"requests": int(r[0]), "quarantine": int(r[1])}
    finally:
        store.close()


def child_dos(a: dict[str, Any]) -> dict[str, Any]:
    """DosDetector alone over the parsed rows of a store (time of ``process(Batch.from_arrow(slice))``).

    The headline figure uses batches of ``batch`` (default 100k); ``lines_s_by_batch`` adds 20k-line batches
    (the live feed's largest).  ``compare``: path of another ``detectors/dos.py`` (e.g. an older commit's,
    from ``git show REV:detectors/dos.py``) measured in the same process on the same table, interleaved, so
    the before/after ratio is not skewed by a busy machine; the best of ``rounds`` runs counts."""
    import importlib.util

    from forumpulse.detectors import dos as current
    from forumpulse.detectors.dos_rules import DosConfig
    from forumpulse.pipeline.store import open_store

    store = open_store(a["store"])
    try:
        tbl = store.query_arrow("SELECT ts, client AS client_ip, method, path, query, status, user_agent, is_static "
                                "FROM requests ORDER BY ts")
    finally:
        store.close()
    impls: dict[str, Any] = {"current": current}
    if a.get("compare"):
        spec = importlib.util.spec_from_file_location("forumpulse_dos_compare", a["compare"])
        assert spec is not None and spec.loader is not None, a["compare"]
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        impls["compare"] = mod

    def one(m: Any, batch: int) -> tuple[float, int]:
        det = m.DosDetector(manager=m.DecisionManager(DosConfig(crawlers={"verify": "off"})))
        decisions = 0
        t0 = time.perf_counter()
        for off in range(0, tbl.num_rows, batch):
            decisions += len(det.process(m.Batch.from_arrow(tbl.slice(off, batch))))
        return time.perf_counter() - t0, decisions

    batch = int(a.get("batch", 100_000))
    sizes = sorted({batch, 20_000}, reverse=True)
    best: dict[str, dict[int, float]] = {k: {} for k in impls}
    dec: dict[str, dict[int, int]] = {k: {} for k in impls}
    for _ in range(max(int(a.get("rounds", 1)), 1)):
        for size in sizes:
            for name, m in impls.items():
                secs, n = one(m, size)
                best[name][size] = min(best[name].get(size, float("inf")), secs)
                dec[name][size] = n
    secs = best["current"][batch]
    out: dict[str, Any] = {"lines": tbl.num_rows, "seconds": secs, "lines_s": tbl.num_rows / secs, "batch": batch,
                           "decisions": dec["current"][batch],
                           "lines_s_by_batch": {str(k): tbl.num_rows / v for k, v in best["current"].items()}}
    if "compare" in impls:
        out["compare"] = {"module": a["compare"],
                          "lines_s_by_batch": {str(k): tbl.num_rows / v for k, v in best["compare"].items()},
                          "decisions_by_batch": {str(k): v for k, v in dec["compare"].items()},
                          "speedup_by_batch": {str(k): best["compare"][k] / best["current"][k] for k in sizes}}
    return out


class _TimingStore:
    """A Store proxy recording the duration of every query (for the detector queries)."""

    def __init__(self, store: Any) -> None:
        self._s = store
        self.times: dict[str, list[float]] = {}

    def _rec(self, sql: str, fn: Callable[[str], Any]) -> Any:
        t0 = time.perf_counter()
        r = fn(sql)
        shape = re.sub(r"'[^']*'|\b\d+\b", "?", " ".join(sql.split()))[:160]
        self.times.setdefault(shape, []).append((time.perf_counter() - t0) * 1000)
        return r

    def query_rows(self, sql: str) -> Any:
        return self._rec(sql, self._s.query_rows)

    def query_arrow(self, sql: str) -> Any:
        return self._rec(sql, self._s.query_arrow)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


def child_analyze(a: dict[str, Any]) -> dict[str, Any]:
    """Storage (after OPTIMIZE FINAL) and query latency over one store."""
    from forumpulse.pipeline.store import open_store

    store = open_store(a["store"])
    out: dict[str, Any] = {}
    try:
        if a.get("storage", True):
            out["storage"] = _storage(store, int(a["raw_bytes"]))
        if a.get("queries", True):
            out["queries"] = _queries(store, int(a.get("repeat", 9)))
            out["detector_queries"] = _detector_queries(store, int(a.get("detector_minutes", 30)))
    finally:
        store.close()
    return out


def _storage(store: Any, raw_bytes: int) -> dict[str, Any]:
    tables = ["requests", "quarantine", "site_minute", "topic_minute", "topic_hour", "client_minute", "prefix_minute",
              "prefix_hour", "transfer_minute"]
    t0 = time.perf_counter()
    for t in tables:
        store.command(f"OPTIMIZE TABLE {t} FINAL")
    optimize_s = time.perf_counter() - t0
    rows = {}
    for name, n_rows, on_disk, comp, uncomp in store.query_rows(
            "SELECT table, sum(rows), sum(bytes_on_disk), sum(data_compressed_bytes), sum(data_uncompressed_bytes) "
            "FROM system.parts WHERE active AND database = currentDatabase() GROUP BY table"):
        rows[str(name)] = {"rows": int(n_rows), "bytes_on_disk": int(on_disk), "compressed": int(comp),
                           "uncompressed": int(uncomp)}
    columns = [
        {"column": str(c), "type": str(t), "compressed": int(cb), "uncompressed": int(ub)}
        for c, t, cb, ub in store.query_rows(
            "SELECT column, any(type), sum(column_data_compressed_bytes) AS c, sum(column_data_uncompressed_bytes) "
            "FROM system.parts_columns WHERE active AND database = currentDatabase() AND table = 'requests' "
            "GROUP BY column ORDER BY c DESC")
    ]
    return {"tables": {t: rows.get(t, {"rows": 0, "bytes_on_disk": 0, "compressed": 0, "uncompressed": 0})
                       for t in tables},
            "raw_bytes": raw_bytes, "columns": columns, "optimize_s": optimize_s, "proposal": _proposal(store)}


#: schema changes proposed for ``requests`` (measured by copying the same rows into a variant table):
#: (description, regex on SHOW CREATE TABLE, replacement)
PROPOSAL: list[tuple[str, str, str]] = [
    ("`url` LowCardinality(String) (forum URLs repeat: a few % distinct per part)",
     r"`url` String CODEC\(ZSTD\(\d+\)\)", "`url` LowCardinality(String) CODEC(ZSTD(3))"),
    ("`referer` LowCardinality(String)",
     r"`referer` String CODEC\(ZSTD\(\d+\)\)", "`referer` LowCardinality(String) CODEC(ZSTD(3))"),
    ("`path` derived: ALIAS if(startsWith(url, '/'), cutQueryString(url), path(url)) (the parser's path is the "
     "path part of url)",
     r"`path` String CODEC\(ZSTD\(\d+\)\)",
     "`path` String ALIAS if(startsWith(url, '/'), cutQueryString(url), path(url))"),
    ("`ts` CODEC(Delta, ZSTD(3)) instead of DoubleDelta (ts is not monotonic inside the ORDER BY)",
     r"`ts` DateTime64\(3, 'UTC'\) CODEC\(DoubleDelta, ZSTD\(\d+\)\)",
     "`ts` DateTime64(3, 'UTC') CODEC(Delta, ZSTD(3))"),
]


def _proposal(store: Any) -> dict[str, Any] | None:
    """Copy ``requests`` into a variant with :data:`PROPOSAL` applied; bytes/row before and after, and whether
    the derived ``path`` equals the stored one on every row.  ``None`` when the schema already has every
    proposed change (migration 0003 made url/referer LowCardinality)."""
    ddl = str(store.query_rows("SHOW CREATE TABLE requests")[0][0])
    applied = []
    for desc, pat, rep in PROPOSAL:
        ddl, n = re.subn(pat, rep, ddl)
        if n:
            applied.append(desc)
    if not applied:
        return None
    ddl = re.sub(r"CREATE TABLE (\S+\.)?requests\b", "CREATE TABLE requests_proposed", ddl, count=1)
    ddl = re.sub(r"\n\s*TTL [^\n]*", "", ddl)
    store.command("DROP TABLE IF EXISTS requests_proposed")
    store.command(ddl)
    try:
        cols = [str(r[0]) for r in store.query_rows(
            "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = 'requests_proposed' "
            "AND default_kind NOT IN ('ALIAS', 'MATERIALIZED') ORDER BY position")]
        names = ", ".join(f"`{c}`" for c in cols)
        store.command(f"INSERT INTO requests_proposed ({names}) SELECT {names} FROM requests")
        store.command("OPTIMIZE TABLE requests_proposed FINAL")
        size = {}
        for t in ("requests", "requests_proposed"):
            r = store.query_rows("SELECT sum(rows), sum(bytes_on_disk) FROM system.parts WHERE active AND "
                                 f"database = currentDatabase() AND table = '{t}'")[0]
            size[t] = {"rows": int(r[0]), "bytes_on_disk": int(r[1])}
        path_diff = int(store.query_rows(
            "SELECT countIf(path != if(startsWith(url, '/'), cutQueryString(url), path(url))) FROM requests")[0][0]
            ) if any(a.startswith("`path`") for a in applied) else None
        cols_after = {str(c): int(b) for c, b in store.query_rows(
            "SELECT column, sum(column_data_compressed_bytes) FROM system.parts_columns WHERE active AND "
            "database = currentDatabase() AND table = 'requests_proposed' GROUP BY column")}
        return {"applied": applied, "before": size["requests"], "after": size["requests_proposed"],
                "path_mismatches": path_diff, "columns_after": cols_after}
    finally:
        store.command("DROP TABLE IF EXISTS requests_proposed")


def _data_end(store: Any) -> datetime:
    """End of the last complete minute in the rollups (UTC)."""
    secs = store.query_rows("SELECT toUnixTimestamp(max(minute)), count() FROM site_minute")[0]
    if not secs[1]:
        raise RuntimeError("site_minute is empty: nothing to query")
    return datetime.fromtimestamp(int(secs[0]) + 60, UTC)


def _queries(store: Any, repeat: int) -> list[dict[str, Any]]:
    from forumpulse.dashboards.macros import QueryContext, TemplateVar, render_query
    from forumpulse.dashboards.panels import ANNOTATION_SQL, all_specs, sql_variables

    end = _data_end(store)
    site = str(store.query_rows("SELECT site FROM site_minute GROUP BY site ORDER BY count() DESC LIMIT 1")[0][0])
    top = store.query_rows("SELECT topic_id FROM topic_minute WHERE topic_id > 0 GROUP BY topic_id "
                           "ORDER BY sum(views) DESC LIMIT 1")
    topic = str(top[0][0]) if top else "1"
    groups = [str(r[0]) for r in store.query_rows("SELECT DISTINCT group_name FROM topic_groups")] or ["none"]
    variables = {"site": TemplateVar("site", site), "metric": TemplateVar("metric", "views"),
                 "topic": TemplateVar("topic", topic),
                 "group": TemplateVar("group", groups, is_all=True, all_options=groups)}
    items: list[tuple[str, str]] = []
    for dash, specs in all_specs().items():
        items += [(f"{dash} / {s.title}", s.sql) for s in specs]
    items += [(f"variable {k}", v) for k, v in sql_variables().items()]
    items.append(("annotations", ANNOTATION_SQL))
    out = []
    for rng_name, span in (("24h", timedelta(hours=24)), ("7d", timedelta(days=7))):
        interval_ms = max(60_000, int(span.total_seconds() * 1000 / 1000) // 60_000 * 60_000)
        ctx = QueryContext(end - span, end, interval_ms)
        for name, sql in items:
            rendered = render_query(sql, ctx, variables)
            store.query_rows(rendered)  # warm-up (first run reads from disk)
            ms = []
            rows = 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                rows = len(store.query_rows(rendered))
                ms.append((time.perf_counter() - t0) * 1000)
            out.append({"query": name, "range": rng_name, "p50_ms": percentile(ms, 50), "p95_ms": percentile(ms, 95),
                        "runs": repeat, "rows": rows})
    return out


def _detector_queries(store: Any, minutes: int) -> list[dict[str, Any]]:
    """The traffic detector as it runs live: one warm-up call (baselines from history), then one call per
    minute for ``minutes`` minutes at the end of the data; every query it makes is timed."""
    from forumpulse.detectors.traffic import TrafficDetector

    end = _data_end(store)
    proxy = _TimingStore(store)
    det = TrafficDetector(out=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    start = end - timedelta(minutes=minutes)
    det.run_once(proxy, now=start)
    warm = {k: list(v) for k, v in proxy.times.items()}
    proxy.times.clear()
    for i in range(1, minutes + 1):
        det.run_once(proxy, now=start + timedelta(minutes=i))
    out = [{"query": k, "phase": "per minute", "calls": len(v), "p50_ms": percentile(v, 50),
            "p95_ms": percentile(v, 95)} for k, v in sorted(proxy.times.items())]
    out += [{"query": k, "phase": "warm-up", "calls": len(v), "p50_ms": percentile(v, 50),
             "p95_ms": percentile(v, 95)} for k, v in sorted(warm.items())]
    return out


def bare_read(bootstrap: str, topic: str, n: int, timeout_s: float = 600) -> tuple[int, int, float]:
    """The consumer's ceiling: one confluent-kafka consumer reads ``n`` messages of ``topic`` from the start in
    batches of 10,000 and sums their value lengths.  Returns (messages, value bytes, seconds from the first
    batch to the last)."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bare", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got = nbytes = 0
    t_first: float | None = None
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        msgs = c.consume(num_messages=10_000, timeout=1.0)
        if msgs and t_first is None:
            t_first = time.perf_counter()
        for m in msgs:
            if m.error() is None:
                got += 1
                nbytes += len(m.value() or b"")
    seconds = time.perf_counter() - (t_first or time.perf_counter())
    c.close()
    return got, nbytes, seconds


def child_consumer(a: dict[str, Any]) -> dict[str, Any]:
    """Pre-fill a topic with the file's lines as envelopes; bare batched read; then ``forumpulse consume``
    (child process, measured) loads it into a fresh chDB store."""
    from confluent_kafka import Producer
    from forumpulse.pipeline.contracts import build_envelope

    ls = _live_stack()
    work = Path(a["work"])
    n_want = int(a["lines"])
    src = Path(a["file"])
    with ls.kafka_broker(work / "kafka", create_topics=False) as broker:
        broker.create_topic("bench.raw", int(a.get("partitions", 4)))
        broker.create_topic("bench.dlq", 1)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "compression.type": "lz4",
                      "enable.idempotence": True, "queue.buffering.max.messages": 500_000})
        n = 0
        t0 = time.perf_counter()
        with src.open("rb") as fh:
            for raw in fh:
                if n >= n_want:
                    break
                line = raw.rstrip(b"\n")
                value = build_envelope("forum", "web1", "/var/log/apache2/access.log", "combined", line)
                key = line.split(b" ", 1)[0]
                while True:
                    try:
                        p.produce("bench.raw", value=value, key=key)
                        break
                    except BufferError:
                        p.poll(0.05)
                n += 1
        if p.flush(120):
            raise RuntimeError("messages left undelivered")
        produce_s = time.perf_counter() - t0
        got, nbytes, bare_s = bare_read(broker.bootstrap, "bench.raw", n)
        cfg = write_settings(work / "consumer.yaml", f"chdb:{work}/chdb", broker.bootstrap)
        idle = 2.0
        cm = run_measured([PY, "-m", "forumpulse.pipeline.consumer", "--config", cfg, "--topic", "bench.raw",
                          "--dead-letter-topic", "bench.dlq", "--group", "fp-bench", "--instance-id", "bench",
                          "--batch-lines", str(a.get("batch_lines", 50_000)), "--idle-exit", str(idle)],
                         cwd=REPO, log_dir=work)
        summary: dict[str, Any] = next((json.loads(x) for x in reversed(cm.out.splitlines()) if x.startswith("{")),
                                       {})
        # start-up (interpreter, imports, chDB open, migrations) measured alone on an empty store
        m0 = run_measured([PY, "-c", "import sys; from forumpulse.pipeline.config import load_settings; "
                           "from forumpulse.pipeline.store import open_store, migrate; "
                           "import forumpulse.pipeline.consumer; "
                           f"s = open_store('chdb:{work}/chdb-empty'); migrate(s, {{'raw_ttl_days': 0}}); s.close()"],
                          cwd=REPO, log_dir=work)
        kafka_rss = vm_hwm_kb(pid_file(broker.dir / "kafka.pid"))
    counts = child_count({"store": f"chdb:{work}/chdb"})
    load_s = max(cm.seconds - idle - m0.seconds, 1e-9)
    return {"messages": n, "avg_value_bytes": nbytes / max(got, 1), "produce_msg_s": n / produce_s,
            "bare_read": got, "bare_s": bare_s, "bare_msg_s": got / bare_s if bare_s > 0 else 0.0,
            "consumer_wall_s": cm.seconds, "startup_s": m0.seconds, "idle_exit_s": idle, "load_s": load_s,
            "consumer_lines_s": n / load_s, "consumer_lines_s_with_startup": n / max(cm.seconds - idle, 1e-9),
            "consumer_rss_kb": cm.max_rss_kb, "kafka_rss_kb": kafka_rss, "rows": counts, "summary": summary,
            "consumer_cpu_s": cm.cpu_s, "consumer_threads_cpu_s": cm.threads_cpu_s}


def _http_count(port: int) -> int:
    q = urllib.parse.quote("SELECT (SELECT count() FROM requests) + (SELECT count() FROM quarantine)")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/?query={q}", timeout=10) as r:
        return int(r.read().decode().strip())


def child_e2e(a: dict[str, Any]) -> dict[str, Any]:
    """file -> syslog-ng -> Kafka -> owner (``forumpulse run --consume``) -> rows counted over HTTP.

    For side-by-side comparisons (not used by ``make bench``): ``owner_cmd`` replaces the owner command (before
    ``--config``), ``sng_defines`` overrides syslog-ng defines (e.g. ``fp_follow_freq``)."""
    ls = _live_stack()
    work = Path(a["work"])
    n = int(a["lines"])
    src = Path(a["file"])
    rate = float(a.get("fresh_rate", 20_000))
    fresh_s = float(a.get("fresh_seconds", 20))
    res: dict[str, Any] = {"lines": n, "fresh_rate": rate, "fresh_seconds": fresh_s}
    with src.open("rb") as fh:
        lines = [x for _, x in zip(range(n + int(rate * fresh_s)), fh, strict=False)]
    if len(lines) < n + int(rate * fresh_s):
        raise RuntimeError(f"{src} has {len(lines)} lines, need {n + int(rate * fresh_s)}")
    with ls.kafka_broker(work / "kafka") as broker:
        port = ls.free_ports(1)[0]
        cfg = write_settings(work / "owner.yaml", f"chdb:{work}/chdb", broker.bootstrap)
        log = work / "owner.log"
        with log.open("ab") as lf:
            owner_cmd = list(a.get("owner_cmd") or [PY, "-m", "forumpulse.pipeline.owner"])
            owner = subprocess.Popen([*owner_cmd, "--config", str(cfg), "--port", str(port),
                                      "--consume", "--instance-id", "bench"], stdout=lf, stderr=subprocess.STDOUT,
                                     cwd=REPO, env={**os.environ, "FORUMPULSE_LOG_LEVEL": "WARNING"})
        try:
            ls.wait_until(lambda: _owner_ready(port, owner), 120, what=f"owner on port {port} ({log})")
            defines = ls.forumpulse_defines(work / "logs", broker, **dict(a.get("sng_defines") or {}))
            target = work / "logs" / "vhosts" / "bench.example.org.access.log"
            with target.open("wb") as out:
                out.writelines(lines[:n])
            base = _http_count(port)
            t0 = time.monotonic()
            with ls.syslog_ng(work / "sng", defines=defines) as sng:
                t_kafka = t_rows = None
                deadline = t0 + max(600.0, n / 5_000)
                while (t_kafka is None or t_rows is None) and time.monotonic() < deadline:
                    if t_kafka is None and broker.count("weblogs.raw") >= n:
                        t_kafka = time.monotonic()
                    if t_rows is None and _http_count(port) - base >= n:
                        t_rows = time.monotonic()
                    time.sleep(0.1)
                if t_kafka is None or t_rows is None:
                    raise RuntimeError(f"timed out: kafka={broker.count('weblogs.raw')} rows={_http_count(port)}")
                res.update({"syslogng_s": t_kafka - t0, "syslogng_lines_s": n / (t_kafka - t0),
                            "e2e_s": t_rows - t0, "e2e_lines_s": n / (t_rows - t0),
                            "syslogng_dropped": sng.stat("dst.kafka", "dropped")})
                res.update(_freshness(port, target, lines[n:], rate, fresh_s))
                res["syslogng_rss_kb"] = vm_hwm_kb(pid_file(sng.dir / "syslog-ng.pid"))
            res["kafka_rss_kb"] = vm_hwm_kb(pid_file(broker.dir / "kafka.pid"))
        finally:
            res["owner_rss_kb"] = vm_hwm_kb(owner.pid)
            owner.send_signal(signal.SIGTERM)
            try:
                owner.wait(120)
            except subprocess.TimeoutExpired:
                owner.kill()
                owner.wait()
    return res


def _owner_ready(port: int, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"owner exited with {proc.returncode} before serving")
    try:
        _http_count(port)
        return True
    except OSError:
        return False


def _freshness(port: int, target: Path, lines: list[bytes], rate: float, seconds: float) -> dict[str, Any]:
    """Paced writer (slices of 1/20 s) appending to the followed file; a poller counts rows every 50 ms.
    Freshness of a slice = first poll that sees the count reach the slice's end − time the slice was written."""
    base = _http_count(port)
    per = max(1, int(rate / 20))
    written: list[tuple[float, int]] = []  # (monotonic time written, cumulative lines)
    seen: list[tuple[float, int]] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            seen.append((time.monotonic(), _http_count(port) - base))
            time.sleep(0.05)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    total = min(len(lines), int(rate * seconds))
    t0 = time.monotonic()
    with target.open("ab", buffering=0) as fh:
        for i in range(0, total, per):
            chunk = lines[i:i + per]
            fh.write(b"".join(chunk))
            written.append((time.monotonic(), i + len(chunk)))
            ahead = (i + len(chunk)) / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    offered_s = time.monotonic() - t0
    deadline = time.monotonic() + 120
    while (not seen or seen[-1][1] < total) and time.monotonic() < deadline:
        time.sleep(0.1)
    done.set()
    th.join()
    lat = []
    j = 0
    for tw, cum in written:
        while j < len(seen) and (seen[j][1] < cum or seen[j][0] < tw):
            j += 1
        if j == len(seen):
            break
        lat.append(seen[j][0] - tw)
    return {"fresh_lines": total, "fresh_offered_lines_s": total / offered_s, "fresh_slices": len(written),
            "fresh_measured": len(lat), "fresh_p50_s": percentile(lat, 50), "fresh_p95_s": percentile(lat, 95),
            "fresh_max_s": max(lat) if lat else float("nan"), "poll_interval_s": 0.05}


def child_simulate(a: dict[str, Any]) -> dict[str, Any]:
    f = simulated_file(Path(a["work"]), int(a["lines"]))
    return file_meta(f)


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "simulate": child_simulate, "count": child_count, "dos": child_dos, "analyze": child_analyze, "consumer": child_consumer, "e2e": child_e2e,
}


# ------------------------------------------------------------------------------------------------ sections


@dataclass
class Run:
    work: Path
    sizes: list[int]
    scale: list[int]
    sections: list[str]
    consumer_lines: int
    e2e_lines: int
    fresh_rate: float
    fresh_seconds: float
    repeat: int
    keep_files: bool
    pairs: int = 3
    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    stores: dict[int, Path] = field(default_factory=dict)

    def log(self, msg: str) -> None:
        print(f"[bench {datetime.now(UTC):%H:%M:%S}] {msg}", flush=True)

    def section(self, name: str, fn: Callable[[], None]) -> None:
        self.log(f"section {name}")
        try:
            fn()
        except Exception as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}"[:3000]
            self.log(f"section {name} FAILED: {exc}\n{traceback.format_exc()}")

    def ingest_one(self, n: int, peer: bool) -> dict[str, Any]:
        """``forumpulse ingest`` of the simulated ``n``-line file into a new chDB folder, next to GoAccess on the
        same file (``peer``).  For the smallest compared size, ``pairs`` alternating pairs (GoAccess, then
        forumpulse) are run and the row is the pair with the median ratio (every pair is kept in ``pairs``): one
        pair on this shared machine varies by +-10%.  Each run writes a folder of its own (deleting a store just
        before a run costs ~10% more CPU in ext4's inode allocator); the others are removed afterwards."""
        f = simulated_file(self.work, n)
        meta = file_meta(f)
        pairs = self.pairs if peer and n == min(self.sizes) else 1
        cfg = write_settings(self.work / "ingest.yaml", "chdb:unused")
        runs: list[dict[str, Any]] = []
        for i in range(max(1, pairs)):
            row: dict[str, Any] = {"lines": meta["lines"], "bytes": meta["bytes"], "days": meta["days"]}
            if peer:
                out = self.work / "goaccess.json"
                gcmd = ["goaccess", "--log-format=COMBINED", "--no-global-config", str(f), "-o", str(out)]
                if i == 0:
                    self.commands.append(shell(gcmd))
                self.log(f"goaccess {n:,} lines" + (f" (pair {i + 1} of {pairs})" if pairs > 1 else ""))
                g = run_measured(gcmd, log_dir=self.work)
                doc = json.loads(out.read_text())
                row["goaccess"] = {"seconds": g.seconds, "lines_s": meta["lines"] / g.seconds, "rss_kb": g.max_rss_kb,
                                   "cpu_s": g.cpu_s, "total_requests": doc.get("general", {}).get("total_requests")}
                out.unlink()
            store = self.work / f"store-{n}" / f"run-{i}"
            shutil.rmtree(store, ignore_errors=True)  # a leftover of an earlier bench in a kept work folder
            cmd = [*forumpulse_exe(), "ingest", "--config", str(cfg), "--store", f"chdb:{store}", "--format",
                   "combined", str(f)]
            if i == 0:
                self.commands.append(shell(cmd))
            self.log(f"ingest {n:,} lines" + (f" (pair {i + 1} of {pairs})" if pairs > 1 else ""))
            m = run_measured(cmd, log_dir=self.work, env={"COLUMNS": "200"})
            counts, _ = internal("count", {"store": f"chdb:{store}"}, self.work)
            row.update({"seconds": m.seconds, "lines_s": meta["lines"] / m.seconds, "rss_kb": m.max_rss_kb,
                        "cpu_s": m.cpu_s, "threads_cpu_s": m.threads_cpu_s, "rows": counts, "store": str(store)})
            if counts["requests"] + counts["quarantine"] != meta["lines"]:
                row["error"] = f"stored {counts} for {meta['lines']} lines"
            if peer:
                row["ratio"] = row["lines_s"] / row["goaccess"]["lines_s"]
            runs.append(row)
        chosen = sorted(runs, key=lambda r: r.get("ratio", 0.0))[len(runs) // 2] if peer else runs[0]
        for r in runs:
            if r is not chosen:
                shutil.rmtree(r["store"], ignore_errors=True)
        self.stores[n] = Path(chosen["store"])
        row = dict(chosen)
        if len(runs) > 1:
            row["pairs"] = [{"seconds": r["seconds"], "goaccess_seconds": r["goaccess"]["seconds"],
                             "ratio": r["ratio"]} for r in runs]
            errors = [r["error"] for r in runs if "error" in r]
            if errors:
                row["error"] = "; ".join(errors)
        return row

    def run_ingest(self) -> None:
        rows: dict[int, dict[str, Any]] = {int(k): v for k, v in self.results.get("ingest", {}).items()}
        for n in sorted(set(self.sizes) | set(self.scale)):
            rows[n] = self.ingest_one(n, peer=n in self.sizes)
            self.results["ingest"] = {str(k): v for k, v in rows.items()}
            self._drop(n)
        self.section("ingest stages", self.run_stages)

    def run_stages(self) -> None:
        """Where ingest time goes, with Hperf's ``bench_ingest.run_stages`` (first 100k lines of the smallest
        file: fast path, per-line reference path, chDB insert alone)."""
        from forumpulse.pipeline import bench_ingest

        d = self.work / "stages"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        f = simulated_file(self.work, min(self.sizes))
        self.commands.append(f"{PY} -c 'from forumpulse.pipeline.bench_ingest import run_stages; "
                             f"print(run_stages(Path(\"{f}\"), \"combined\", Path(\"{d}\")))'")
        self.results["ingest_stages"] = dict(bench_ingest.run_stages(f, "combined", d))
        shutil.rmtree(d, ignore_errors=True)

    def _drop(self, n: int) -> None:
        """Free disk: keep the smallest file/store (dos, consumer, e2e) and the query store."""
        if self.keep_files or n in (min(self.sizes), self.query_size()):
            return
        shutil.rmtree(self.work / f"sim-{n}", ignore_errors=True)
        shutil.rmtree(self.stores.pop(n, self.work / "none"), ignore_errors=True)

    def query_size(self) -> int:
        return max(self.scale or self.sizes)

    def ensure_store(self, n: int) -> Path:
        if n not in self.stores:
            self.results.setdefault("ingest", {})[str(n)] = self.ingest_one(n, peer=n in self.sizes)
        return self.stores[n]

    def run_dos(self) -> None:
        n = min(self.sizes)
        store = self.ensure_store(n)
        f = simulated_file(self.work, n)
        args: dict[str, Any] = {"store": f"chdb:{store}"}
        compare = os.environ.get("FORUMPULSE_BENCH_DOS_COMPARE")  # an older dos.py, measured side by side
        if compare:
            args.update(compare=compare, rounds=2)
        res, m = internal("dos", args, self.work)
        res["rss_kb"] = m.max_rss_kb
        filt = DEPLOY / "fail2ban-http-get-dos.conf"
        fcmd = ["fail2ban-regex", "--raw", "--print-no-missed", str(f), str(filt)]
        self.commands.append(shell(fcmd))
        self.log(f"fail2ban-regex {n:,} lines")
        g = run_measured(fcmd, log_dir=self.work)
        mt = re.search(r"Lines: (\d+) lines, (\d+) ignored, (\d+) matched, (\d+) missed", g.out)
        if not mt:
            raise RuntimeError(f"fail2ban-regex printed no summary:\n{g.out[-2000:]}")
        lines = int(mt.group(1))
        res["fail2ban"] = {"lines": lines, "matched": int(mt.group(3)), "seconds": g.seconds,
                           "lines_s": lines / g.seconds, "rss_kb": g.max_rss_kb}
        res["ratio"] = res["lines_s"] / res["fail2ban"]["lines_s"]
        self.results["dos"] = res

    def run_analyze(self, storage: bool, queries: bool) -> None:
        n = self.query_size()
        store = self.ensure_store(n)
        meta = file_meta(simulated_file(self.work, n)) if (self.work / f"sim-{n}" / "meta.json").exists() else None
        raw = meta["bytes"] if meta else int(self.results["ingest"][str(n)]["bytes"])
        self.log(f"analyze store of {n:,} lines (storage={storage}, queries={queries})")
        res, m = internal("analyze", {"store": f"chdb:{store}", "raw_bytes": raw, "storage": storage,
                                      "queries": queries, "repeat": self.repeat}, self.work)
        res["lines"] = n
        res["rss_kb"] = m.max_rss_kb
        self.results["analyze"] = res

    def run_consumer(self) -> None:
        f = simulated_file(self.work, max(min(self.sizes), self.consumer_lines))
        d = self.work / "consumer"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        res, _ = internal("consumer", {"work": str(d), "file": str(f), "lines": self.consumer_lines}, self.work)
        self.results["consumer"] = res
        shutil.rmtree(d, ignore_errors=True)

    def run_e2e(self) -> None:
        need = self.e2e_lines + int(self.fresh_rate * self.fresh_seconds)
        f = simulated_file(self.work, max(min(self.sizes), need))
        d = self.work / "e2e"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir()
        res, _ = internal("e2e", {"work": str(d), "file": str(f), "lines": self.e2e_lines,
                                  "fresh_rate": self.fresh_rate, "fresh_seconds": self.fresh_seconds}, self.work)
        self.results["e2e"] = res
        shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ report


def _cmd_version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        text = (p.stdout or p.stderr).strip().splitlines()
        return text[0].strip() if text else "?"
    except OSError:
        return "not installed"


def machine() -> dict[str, Any]:
    mem_kb = next((int(x.split()[1]) for x in Path("/proc/meminfo").read_text().splitlines()
                   if x.startswith("MemTotal:")), 0)
    cpu = next((x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), platform.machine())
    return {"nproc": os.cpu_count(), "cpu": cpu, "ram_gb": round(mem_kb / 1024 / 1024, 1),
            "kernel": platform.release(), "os": _os_name()}


def _os_name() -> str:
    try:
        return next(x.split("=", 1)[1].strip('"') for x in Path("/etc/os-release").read_text().splitlines()
                    if x.startswith("PRETTY_NAME="))
    except (OSError, StopIteration):
        return platform.platform()


def versions() -> dict[str, str]:
    libs = _cmd_version([PY, "-c", "import chdb, confluent_kafka as c; print(chdb.__version__, c.version()[0], "
                                   "c.libversion()[0])"]).split()
    libs += ["?"] * (3 - len(libs))
    git = _cmd_version(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    kafka_jar = sorted((REPO / "deploy" / "kafka" / "libs").glob("kafka_2.13-*.jar"))
    return {
        "forumpulse": f"{git}{' (with uncommitted changes by other helpers)' if dirty else ''}",
        "python": platform.python_version(), "chdb": libs[0],
        "confluent-kafka": f"{libs[1]} (librdkafka {libs[2]})",
        "goaccess": _cmd_version(["goaccess", "--version"]),
        "fail2ban": _cmd_version(["fail2ban-client", "--version"]),
        "syslog-ng": _cmd_version(["syslog-ng", "--version"]),
        "kafka": kafka_jar[-1].stem if kafka_jar else "jars not installed",
        "java": _cmd_version(["java", "-version"]),
    }


def _f(x: Any, digits: int = 0) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float) and x != x:
        return "n/a"
    return f"{x:,.{digits}f}" if isinstance(x, int | float) else str(x)


def _mb(kb: Any) -> str:
    return "n/a" if not kb else f"{kb / 1024:,.0f} MB"


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(run: Run, info: dict[str, Any]) -> str:
    r = run.results
    out: list[str] = ["# forumpulse benchmarks", "",
                      "Generated by `make bench` (`python -m forumpulse.pipeline.bench`); do not edit by hand. "
                      "Figures are from one run on a shared machine: compare the ratios (peer measured in the same "
                      "run, same input), not absolute numbers across machines.", ""]
    m = info["machine"]
    out += ["## Machine", "",
            f"- {m['nproc']} cores ({m['cpu']}), {m['ram_gb']} GB RAM, {m['os']}, kernel {m['kernel']}",
            f"- load average before: {info['load_before']}; after: {info['load_after']}",
            f"- run: {info['started']} → {info['finished']} ({info['minutes']:.1f} min); arguments: "
            f"`{info['argv']}`", *([f"- merged: {info['merged']}"] if info.get("merged") else []),
            "", "## Versions", ""]
    out += [f"- {k}: {v}" for k, v in info["versions"].items()]
    out += ["", "## Summary against targets", "", "| figure | ours | peer | ratio | target | verdict |",
            "|---|---|---|---|---|---|"]
    out += _summary_rows(r)
    out += [""]
    if "ingest" in r:
        out += _ingest_md(r["ingest"])
    if "ingest_stages" in r:
        out += _stages_md(r["ingest_stages"])
    if "consumer" in r:
        out += _consumer_md(r["consumer"])
    if "e2e" in r:
        out += _e2e_md(r["e2e"])
    if "dos" in r:
        out += _dos_md(r["dos"])
    if "analyze" in r and "storage" in r["analyze"]:
        out += _storage_md(r["analyze"])
    if "analyze" in r and "queries" in r["analyze"]:
        out += _queries_md(r["analyze"])
    out += _memory_md(r)
    if run.errors:
        out += ["## Failed sections", ""]
        out += [f"- **{k}**: `{v.splitlines()[0][:400]}`" for k, v in run.errors.items()]
        out += [""]
    out += ["## Commands", "", "Simulated input: `forumpulse.pipeline.simulate.simulate(SimConfig(out, days=ceil(N/1M),"
            " lines=N, sources=(SourceSpec('web1', 'combined'),), scenarios=()))` (pure background, seed 1, "
            "1M lines per simulated day).", "", "```"]
    out += [f"{PY} -m forumpulse.pipeline.bench {info['argv']}", *run.commands, "```", ""]
    return "\n".join(out)


def _summary_rows(r: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    for n, x in sorted(r.get("ingest", {}).items(), key=lambda kv: int(kv[0])):
        if "goaccess" in x:
            rows.append(f"| file → chDB, {int(n):,} lines | {_f(x['lines_s'])} lines/s | GoAccess "
                        f"{_f(x['goaccess']['lines_s'])} lines/s | {x['ratio']:.2f}× | ≥ 4× | "
                        f"{_verdict(x['ratio'] >= 4)} |")
    if "consumer" in r:
        c = r["consumer"]
        ratio = c["consumer_lines_s"] / c["bare_msg_s"]
        rows.append(f"| Kafka → chDB consumer | {_f(c['consumer_lines_s'])} lines/s | bare confluent-kafka read "
                    f"{_f(c['bare_msg_s'])} msg/s | {ratio:.0%} | ≥ 60% | {_verdict(ratio >= 0.6)} |")
    if "e2e" in r:
        e = r["e2e"]
        ratio = e["e2e_lines_s"] / e["syslogng_lines_s"]
        rows.append(f"| file → syslog-ng → Kafka → rows queryable | {_f(e['e2e_lines_s'])} lines/s | syslog-ng → "
                    f"Kafka {_f(e['syslogng_lines_s'])} lines/s | {ratio:.0%} | ≥ 50% and ≥ 80,000 lines/s | "
                    f"{_verdict(ratio >= 0.5 and e['e2e_lines_s'] >= 80_000)} |")
        rows.append(f"| freshness p95 at {_f(e['fresh_offered_lines_s'])} lines/s offered | "
                    f"{_f(e['fresh_p95_s'], 2)} s (p50 {_f(e['fresh_p50_s'], 2)} s) | | | ≤ 2 s | "
                    f"{_verdict(e['fresh_p95_s'] <= 2)} |")
    if "dos" in r:
        d = r["dos"]
        rows.append(f"| DoS detector alone | {_f(d['lines_s'])} lines/s | fail2ban-regex {_f(d['fail2ban']['lines_s'])}"
                    f" lines/s | {d['ratio']:.1f}× | ≥ 200,000 lines/s | {_verdict(d['lines_s'] >= 200_000)} |")
    a = r.get("analyze", {})
    if "storage" in a:
        st = a["storage"]
        req = st["tables"]["requests"]
        bpr = req["bytes_on_disk"] / max(req["rows"], 1)
        comp = st["raw_bytes"] / max(req["bytes_on_disk"], 1)
        rows.append(f"| `requests` on disk | {bpr:.1f} B/row | raw log {st['raw_bytes'] / max(req['rows'], 1):.0f} "
                    f"B/line | {comp:.1f}× smaller | ≤ 16 B/row and ≥ 12× | {_verdict(bpr <= 16 and comp >= 12)} |")
    if "queries" in a:
        worst = max(a["queries"], key=lambda q: q["p95_ms"])
        rows.append(f"| dashboard queries over {a['lines']:,} rows | worst p95 {worst['p95_ms']:.0f} ms "
                    f"({worst['query']}, {worst['range']}) | | | ≤ 300 ms | {_verdict(worst['p95_ms'] <= 300)} |")
    ing = [(int(n), x) for n, x in r.get("ingest", {}).items()]
    if len(ing) >= 2:
        ing.sort()
        first, last = ing[0][1]["lines_s"], ing[-1][1]["lines_s"]
        ok = last >= 0.8 * first
        rows.append(f"| scaling {ing[0][0]:,} → {ing[-1][0]:,} lines | {_f(last)} lines/s at the largest | "
                    f"{_f(first)} lines/s at the smallest | {last / first:.2f} | linear (rate within 20%) | "
                    f"{_verdict(ok)} |")
    return rows


def _ingest_md(ing: dict[str, Any]) -> list[str]:
    out = ["## File → parse + attribute → chDB, vs GoAccess (and scaling)", "",
           "`forumpulse ingest` wall time from process start to exit (interpreter, chDB start-up and migrations "
           "included); GoAccess 1.7 parses and aggregates the same file into a JSON report. Rows stored are checked "
           "(requests + quarantine = lines).", "",
           "CPU s is user + system time of all the process's threads (GoAccess 1.7 parses on one thread; "
           "forumpulse parses on two threads while chDB inserts on its own): the wall-clock ratio is the target, "
           "the CPU columns show how much of it is parallelism.", "",
           "| lines | days | file | forumpulse s | CPU s | lines/s | peak RSS | GoAccess s | CPU s | GoAccess lines/s "
           "| GoAccess RSS | ratio | rows stored |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _n, x in sorted(ing.items(), key=lambda kv: int(kv[0])):
        g = x.get("goaccess")
        out.append(f"| {x['lines']:,} | {x['days']} | {x['bytes'] / 1e9:.2f} GB | {x['seconds']:.1f} | "
                   f"{_cpu(x)} | {_f(x['lines_s'])} | {_mb(x['rss_kb'])} | {_f(g['seconds'], 1) if g else ''} | "
                   f"{_cpu(g) if g else ''} | {_f(g['lines_s']) if g else ''} | {_mb(g['rss_kb']) if g else ''} | "
                   f"{_ratio(x) if g else ''} | {x['rows']['requests']:,} + {x['rows']['quarantine']:,} "
                   f"quarantined{' — ' + x['error'] if 'error' in x else ''} |")
    for n, x in sorted(ing.items(), key=lambda kv: int(kv[0])):
        if x.get("pairs"):
            out += ["", f"{int(n):,} lines, {len(x['pairs'])} alternating pairs (GoAccess, then forumpulse into a new "
                    "folder; the table shows the pair with the median ratio): " + "; ".join(
                        f"{p['goaccess_seconds']:.2f} s / {p['seconds']:.2f} s = {p['ratio']:.2f}×" for p in x["pairs"])
                    + "."]
    split = [f"{int(n):,} lines: {_threads(x['threads_cpu_s'])}" for n, x in sorted(ing.items(), key=lambda kv: int(kv[0]))
             if x.get("threads_cpu_s")]
    if split:
        out += ["", "forumpulse CPU s by kind of thread (sampled from /proc every 0.1 s; interpreter = parsing, "
                "reading and Python glue; chDB = inserts with their views; chDB merges = background merges): "
                + "; ".join(split) + "."]
    pts = sorted((int(n), x) for n, x in ing.items())
    if len(pts) >= 2:
        out += ["", "Scaling (cost per line relative to the smallest run; linear cost = 1.00): " + ", ".join(
            f"{n:,}: {(x['seconds'] / n) / (pts[0][1]['seconds'] / pts[0][0]):.2f}" for n, x in pts)]
    return [*out, ""]


def _stages_md(st: dict[str, Any]) -> list[str]:
    n = st["lines"]
    return ["Ingest stages (`forumpulse.pipeline.bench_ingest.run_stages`, first "
            f"{n:,} lines of the smallest file, one process): parse + attribute, fast path "
            f"**{_f(n / st['fast_s'])} lines/s**; per-line reference path {_f(n / st['ref_s'])} lines/s "
            f"(identical output: {st['identical']}); chDB insert alone (requests + materialized views) "
            f"{_f(n / st['insert_s'])} rows/s.", ""]


def _cpu(x: dict[str, Any]) -> str:
    return f"{x['cpu_s']:.1f}" if "cpu_s" in x else "–"  # runs merged from before CPU time was recorded


def _threads(t: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f} s" for k, v in sorted(t.items(), key=lambda kv: -kv[1]) if v >= 0.05)


def _ratio(x: dict[str, Any]) -> str:
    return f"{x['ratio']:.2f}×"


def _consumer_md(c: dict[str, Any]) -> list[str]:
    return ["## Kafka (pre-filled topic) → consumer → chDB, vs a bare confluent-kafka read", "",
            f"{c['messages']:,} envelopes (avg {c['avg_value_bytes']:.0f} B, lz4, 4 partitions) produced at "
            f"{_f(c['produce_msg_s'])} msg/s. Bare read: one confluent-kafka consumer, batched `consume(10000)`, "
            f"value length summed: {_f(c['bare_msg_s'])} msg/s ({c['bare_s']:.1f} s). Our consumer: "
            f"`python -m forumpulse.pipeline.consumer --idle-exit 2` in its own process (parse, attribute, insert "
            f"with dedup tokens, commit offsets) in {c['consumer_wall_s']:.1f} s wall; minus the idle exit and "
            f"start-up ({c['startup_s']:.1f} s, measured alone: interpreter + imports + chDB open + migrations) "
            f"= {c['load_s']:.1f} s → **{_f(c['consumer_lines_s'])} lines/s** "
            f"({c['consumer_lines_s'] / c['bare_msg_s']:.0%} of the bare read; "
            f"{_f(c['consumer_lines_s_with_startup'])} lines/s counting start-up). "
            f"Rows stored: {c['rows']['requests']:,} + {c['rows']['quarantine']:,} quarantined. "
            f"Peak RSS: consumer {_mb(c['consumer_rss_kb'])}, Kafka {_mb(c['kafka_rss_kb'])}."
            + (f" Consumer CPU {c['consumer_cpu_s']:.1f} s (start-up and idle exit included); by kind of thread "
               f"(sampled every 0.1 s): {_threads(c['consumer_threads_cpu_s'])}."
               if c.get("consumer_threads_cpu_s") else ""), ""]


def _e2e_md(e: dict[str, Any]) -> list[str]:
    return ["## End to end: file → syslog-ng → Kafka → owner process → rows queryable", "",
            f"{e['lines']:,} lines written to a followed vhost file before syslog-ng starts (shipped "
            "`syslog-ng/forumpulse.conf`: flow-control, reliable disk buffer, lz4); the owner process "
            "(`python -m forumpulse.pipeline.owner --consume`, chDB embedded) loads them; rows are counted over its "
            "ClickHouse HTTP endpoint every 0.1 s. All on the same 2 cores.", "",
            f"- syslog-ng → Kafka (all lines in the topic): {e['syslogng_s']:.1f} s = "
            f"**{_f(e['syslogng_lines_s'])} lines/s** (dropped: {e['syslogng_dropped']})",
            f"- rows queryable: {e['e2e_s']:.1f} s = **{_f(e['e2e_lines_s'])} lines/s** "
            f"({e['e2e_lines_s'] / e['syslogng_lines_s']:.0%} of syslog-ng's rate in the same run)",
            f"- freshness: paced writer appending {e['fresh_lines']:,} lines in slices of 1/20 s at "
            f"{_f(e['fresh_offered_lines_s'])} lines/s; freshness of a slice = first count poll (every "
            f"{e['poll_interval_s']} s) that includes it − time it was written: **p50 {_f(e['fresh_p50_s'], 2)} s, "
            f"p95 {_f(e['fresh_p95_s'], 2)} s**, max {_f(e['fresh_max_s'], 2)} s ({e['fresh_measured']} of "
            f"{e['fresh_slices']} slices)",
            f"- peak RSS: owner {_mb(e['owner_rss_kb'])}, syslog-ng {_mb(e['syslogng_rss_kb'])}, "
            f"Kafka {_mb(e['kafka_rss_kb'])}", ""]


def _dos_md(d: dict[str, Any]) -> list[str]:
    f = d["fail2ban"]
    return ["## DoS detector alone vs fail2ban-regex (same file)", "",
            f"- ours: `DosDetector.process(Batch.from_arrow(slice))` over the {d['lines']:,} parsed rows of the file "
            f"(batches of {d['batch']:,}, one process, conversion included, parsing not): {d['seconds']:.1f} s = "
            f"**{_f(d['lines_s'])} lines/s** ({d['decisions']} decisions)",
            f"- fail2ban-regex with `deploy/bench/fail2ban-http-get-dos.conf` (HOST + date match on every line; "
            f"counting per IP is not even included): {f['lines']:,} lines ({f['matched']:,} matched) in "
            f"{f['seconds']:.1f} s = **{_f(f['lines_s'])} lines/s**, peak RSS {_mb(f['rss_kb'])}",
            f"- ratio: **{d['ratio']:.1f}×**", ""]


def _times(a: float, b: float) -> str:
    return f"{a / b:,.0f}×" if b else "–"


def _storage_md(a: dict[str, Any]) -> list[str]:
    st = a["storage"]
    req_rows = max(st["tables"]["requests"]["rows"], 1)
    out = [f"## Storage ({a['lines']:,} simulated lines, after OPTIMIZE FINAL, {st['optimize_s']:.0f} s)", "",
           f"Raw log: {st['raw_bytes'] / 1e9:.2f} GB ({st['raw_bytes'] / req_rows:.0f} B/line).", "",
           "| table | rows | on disk | bytes/row | per raw line | raw log / table |", "|---|---|---|---|---|---|"]
    for t, x in st["tables"].items():
        out.append(f"| `{t}` | {x['rows']:,} | {x['bytes_on_disk'] / 1e6:,.1f} MB | "
                   f"{x['bytes_on_disk'] / max(x['rows'], 1):.1f} | {x['bytes_on_disk'] / req_rows:.2f} | "
                   f"{_times(st['raw_bytes'], x['bytes_on_disk'])} |")
    out += ["", "Costliest `requests` columns (system.columns, compressed):", "",
            "| column | type | compressed | bytes/row | ratio |", "|---|---|---|---|---|"]
    pr = st.get("proposal")
    if pr:
        b = pr["before"]["bytes_on_disk"] / max(pr["before"]["rows"], 1)
        a_ = pr["after"]["bytes_on_disk"] / max(pr["after"]["rows"], 1)
        out_p = [f"Proposed `requests` schema changes, measured by copying the same {pr['after']['rows']:,} rows into "
                 f"a variant table (OPTIMIZE FINAL): **{b:.1f} → {a_:.1f} B/row** "
                 f"(raw log / table {_times(st['raw_bytes'], pr['before']['bytes_on_disk'])} → "
                 f"{_times(st['raw_bytes'], pr['after']['bytes_on_disk'])})"
                 + ("" if pr["path_mismatches"] is None else
                    f"; derived `path` differs from the stored one on {pr['path_mismatches']:,} rows")
                 + ". Changes (those the current schema does not have yet):", ""]
        out_p += [f"- {x}" for x in pr["applied"]]
        out_p += ["", "| column | before B/row | after B/row |", "|---|---|---|"]
        before_cols = {c["column"]: c["compressed"] for c in st["columns"]}
        for c in sorted(before_cols, key=lambda k: -before_cols[k])[:8]:
            out_p.append(f"| `{c}` | {before_cols[c] / req_rows:.2f} | "
                         f"{pr['columns_after'].get(c, 0) / max(pr['after']['rows'], 1):.2f} |")
        out_p.append("")
    else:
        out_p = []
    if not any(c["compressed"] for c in st["columns"]):
        out += ["| (compact parts only: no per-column sizes at this size) | | | | |"]
    for c in [c for c in st["columns"] if c["compressed"]][:12]:
        out.append(f"| `{c['column']}` | `{c['type']}` | {c['compressed'] / 1e6:,.1f} MB | "
                   f"{c['compressed'] / req_rows:.2f} | {c['uncompressed'] / max(c['compressed'], 1):.1f}× |")
    return [*out, "", *out_p]


def _queries_md(a: dict[str, Any]) -> list[str]:
    q = a["queries"]
    out = [f"## Queries over {a['lines']:,} rows (30 days × 1M lines/day when run with the default --scale)", "",
           f"Every dashboard panel, variable and annotation query rendered with the Grafana plugin's macros for the "
           f"last 24 h / 7 d of data, run {q[0]['runs'] if q else 0} times after one warm-up in the same process "
           "(chDB embedded):", "", "| query | range | p50 ms | p95 ms | rows |", "|---|---|---|---|---|"]
    out += [f"| {x['query']} | {x['range']} | {x['p50_ms']:.1f} | {x['p95_ms']:.1f} | {x['rows']} |" for x in q]
    dq = a.get("detector_queries", [])
    if dq:
        out += ["", "Traffic detector queries (`TrafficDetector.run_once`: one warm-up call loading the baselines, "
                "then one call per minute at the end of the data):", "", "| query (numbers/strings as ?) | phase | "
                "calls | p50 ms | p95 ms |", "|---|---|---|---|---|"]
        out += [f"| `{x['query']}` | {x['phase']} | {x['calls']} | {x['p50_ms']:.1f} | {x['p95_ms']:.1f} |"
                for x in dq]
    return [*out, ""]


def _memory_md(r: dict[str, Any]) -> list[str]:
    rows = []
    for n, x in sorted(r.get("ingest", {}).items(), key=lambda kv: int(kv[0])):
        rows.append(f"| ingest ({int(n):,} lines) | {_mb(x['rss_kb'])} |")
        if "goaccess" in x:
            rows.append(f"| goaccess ({int(n):,} lines) | {_mb(x['goaccess']['rss_kb'])} |")
    if "consumer" in r:
        rows += [f"| consumer (pre-filled topic) | {_mb(r['consumer']['consumer_rss_kb'])} |",
                 f"| Kafka broker (consumer run) | {_mb(r['consumer']['kafka_rss_kb'])} |"]
    if "e2e" in r:
        e = r["e2e"]
        rows += [f"| owner (consume + HTTP endpoint, e2e run) | {_mb(e['owner_rss_kb'])} |",
                 f"| syslog-ng (e2e run) | {_mb(e['syslogng_rss_kb'])} |",
                 f"| Kafka broker (e2e run) | {_mb(e['kafka_rss_kb'])} |"]
    if "dos" in r:
        rows += [f"| DoS detector process | {_mb(r['dos']['rss_kb'])} |",
                 f"| fail2ban-regex | {_mb(r['dos']['fail2ban']['rss_kb'])} |"]
    if "analyze" in r:
        rows.append(f"| storage/query process | {_mb(r['analyze']['rss_kb'])} |")
    if not rows:
        return []
    return ["## Memory (peak RSS)", "", "Child processes: GNU time `%M` (peak RSS of the command's own process); "
            "Kafka, syslog-ng and the owner: `VmHWM` before stopping.", "", "| process | peak RSS |", "|---|---|",
            *rows, ""]


# ------------------------------------------------------------------------------------------------ main


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m forumpulse.pipeline.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--sizes", default="1000000,10000000", help="ingest sizes compared with GoAccess (lines)")
    ap.add_argument("--scale", default="1000000,10000000,30000000",
                    help="scaling series (lines); the largest is also the storage/query dataset")
    ap.add_argument("--consumer-lines", type=int, default=1_000_000)
    ap.add_argument("--e2e-lines", type=int, default=1_000_000)
    ap.add_argument("--fresh-rate", type=float, default=20_000, help="paced writer rate for freshness (lines/s)")
    ap.add_argument("--fresh-seconds", type=float, default=20)
    ap.add_argument("--repeat", type=int, default=9, help="runs per query (after one warm-up)")
    ap.add_argument("--pairs", type=int, default=3,
                    help="alternating GoAccess / forumpulse pairs for the smallest compared size (median ratio)")
    ap.add_argument("--workdir", type=Path, default=None, help="work folder (default: a new one under /tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (simulated files, stores)")
    ap.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results as JSON")
    ap.add_argument("--merge", type=Path, default=None,
                    help="a --json file of an earlier run: its results are kept for what this run does not redo "
                         "(ingest sizes merge one by one); the report says so")
    ap.add_argument("--internal", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--args", default="{}", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.internal:
        emit(CHILDREN[a.internal](json.loads(a.args)))
        return 0
    sections = [s.strip() for s in a.sections.split(",") if s.strip()]
    bad = set(sections) - set(SECTIONS)
    if bad:
        raise SystemExit(f"unknown sections {sorted(bad)}; choose from {', '.join(SECTIONS)}")
    work = a.workdir or Path(tempfile.mkdtemp(prefix="fp-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    run = Run(work=work, sizes=_ints(a.sizes), scale=_ints(a.scale) if "ingest" in sections or "storage" in sections
              or "queries" in sections else [], sections=sections, consumer_lines=a.consumer_lines,
              e2e_lines=a.e2e_lines, fresh_rate=a.fresh_rate, fresh_seconds=a.fresh_seconds, repeat=a.repeat,
              keep_files=a.keep, pairs=a.pairs)
    if not run.sizes:
        raise SystemExit("--sizes needs at least one size")
    started = datetime.now(UTC)
    info: dict[str, Any] = {"machine": machine(), "load_before": _load(), "started": f"{started:%Y-%m-%d %H:%M} UTC",
                            "argv": " ".join(argv if argv is not None else sys.argv[1:]), "versions": versions()}
    if a.merge:
        prev = json.loads(a.merge.read_text())
        run.results = prev["results"]
        run.errors = {k: v for k, v in prev["errors"].items() if not any(k.startswith(x) for x in sections)}
        run.commands = [f"# merged from the run of {prev['info']['started']}:", *prev.get("commands", [])]
        info["merged"] = (f"results not redone here come from the run of {prev['info']['started']} "
                          f"(load before {prev['info']['load_before']}, after {prev['info']['load_after']})")
    run.log(f"work folder {work}; sections {sections}")
    try:
        if "ingest" in sections:
            run.section("ingest", run.run_ingest)
        if "dos" in sections:
            run.section("dos", run.run_dos)
        if "storage" in sections or "queries" in sections:
            run.section("storage/queries", lambda: run.run_analyze("storage" in sections, "queries" in sections))
        if "consumer" in sections:
            run.section("consumer", run.run_consumer)
        if "e2e" in sections:
            run.section("e2e", run.run_e2e)
    finally:
        finished = datetime.now(UTC)
        info.update({"load_after": _load(), "finished": f"{finished:%Y-%m-%d %H:%M} UTC",
                     "minutes": (finished - started).total_seconds() / 60})
        text = render(run, info)
        a.out.write_text(text)
        if a.json:
            a.json.write_text(json.dumps({"info": info, "results": run.results, "errors": run.errors,
                                          "commands": run.commands}, indent=1, default=str))
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        run.log(f"wrote {a.out}")
    print(text)
    return 1 if run.errors else 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    raise SystemExit(main())
