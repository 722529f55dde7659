"""Benchmark: file -> chDB ingestion (``forumpulse ingest``) side by side with GoAccess on the same file, same run.

Usage::

    .venv/bin/python -m forumpulse.pipeline.bench_ingest [FILE] [--make-from SAMPLE --repeat 100]
        [--format combined] [--workers 1,2] [--skip-stages] [--json OUT]

``FILE`` defaults to ``/tmp/elastic1m.log``; when it does not exist it is built by repeating ``--make-from``
(default: the Elastic ``apache_logs`` sample in /work/shared) ``--repeat`` times.

What is measured (wall clock, each in its own process where it matters, load average printed before and after):

* ``goaccess --log-format=COMBINED FILE -o OUT.json`` (parse + aggregate; GoAccess uses ~1 core);
* ``forumpulse ingest --format F FILE --store chdb:FRESH`` as a subprocess (the command users run; its default
  worker count), plus in-process ``ingest_paths(..., workers=N)`` for each ``--workers`` value, each into a fresh
  chDB folder (one folder per process: the in-process runs use one subprocess each);
* stages (unless ``--skip-stages``): ``Processor.process`` (fast path) and ``process_reference`` on the first
  100k lines, and the chDB insert alone (requests + its materialized views) of those processed rows.

Prints one line per measurement and the ratio ``forumpulse lines/s / goaccess lines/s``.  Figures are noisy on
a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_FILE = "/tmp/elastic1m.log"
DEFAULT_SAMPLE = "/work/shared/data/access_logs/elastic_examples/apache_logs"


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _count_lines(path: Path) -> int:
    n = 0
    last = b"\n"
    with open(path, "rb") as fh:
        while True:
            block = fh.read(1 << 24)
            if not block:
                break
            n += block.count(b"\n")
            last = block[-1:]
    return n + (0 if last == b"\n" else 1)


def make_file(path: Path, sample: Path, repeat: int) -> None:
    data = sample.read_bytes()
    if not data.endswith(b"\n"):
        data += b"\n"
    with open(path, "wb") as fh:
        for _ in range(repeat):
            fh.write(data)


def run_goaccess(path: Path, tmp: Path) -> float:
    exe = shutil.which("goaccess")
    if exe is None:
        raise SystemExit("goaccess is not installed (apt-get install goaccess)")
    t = time.perf_counter()
    subprocess.run([exe, "--log-format=COMBINED", str(path), "-o", str(tmp / "goaccess.json")], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def run_cli(path: Path, fmt: str, tmp: Path) -> float:
    exe = Path(sys.executable).with_name("forumpulse")
    store = tmp / "cli_store"
    store.mkdir()
    cfg = tmp / "bench.yaml"
    cfg.write_text("retention:\n  raw_days: 0\n  rollup_days: 0\n  quarantine_days: 0\n")
    t = time.perf_counter()
    subprocess.run([str(exe), "ingest", "--format", fmt, "--config", str(cfg), "--store", f"chdb:{store}",
                    str(path)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


_CHILD = r"""
import json, sys, time
from forumpulse.pipeline.config import load_settings
from forumpulse.pipeline.ingest import ingest_paths
from forumpulse.pipeline.store import open_store
path, fmt, store_dir, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = load_settings()
s.retention.raw_days = 0; s.retention.rollup_days = 0; s.retention.quarantine_days = 0
st = open_store("chdb:" + store_dir)
t = time.perf_counter()
[c] = ingest_paths(st, s, [path], fmt=fmt, workers=workers)
dt = time.perf_counter() - t
rows = int(st.query_rows("SELECT count() FROM requests")[0][0])
st.close()
print(json.dumps({"seconds": dt, "read": c.read, "loaded": c.loaded, "quarantined": c.quarantined, "rows": rows}))
"""


def run_inproc(path: Path, fmt: str, tmp: Path, workers: int) -> dict[str, float]:
    store = tmp / f"store_w{workers}"
    store.mkdir()
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), fmt, str(store), str(workers)], check=True,
                         capture_output=True, text=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rows"] != res["loaded"] or res["read"] != res["loaded"] + res["quarantined"]:
        raise SystemExit(f"count mismatch: {res}")
    return res


_STAGES = r"""
import json, sys, time
import pyarrow as pa
from forumpulse.pipeline.config import load_settings
from forumpulse.pipeline.process import Processor, SourceContext
from forumpulse.pipeline.store import open_store, migrate
path, fmt, store_dir = sys.argv[1], sys.argv[2], sys.argv[3]
lines = []
with open(path, "rb") as fh:
    for line in fh:
        lines.append(line)
        if len(lines) >= 100_000:
            break
s = load_settings()
ctx = SourceContext(format=fmt)
p = Processor(s)
p.process(lines[:20_000], ctx)  # warm caches as a long-running worker has them
t = time.perf_counter(); b = p.process(lines, ctx); fast = time.perf_counter() - t
r = Processor(s); r.process_reference(lines[:20_000], ctx)
t = time.perf_counter(); ref = r.process_reference(lines, ctx); slow = time.perf_counter() - t
same = b.requests.equals(ref.requests) and b.stream.equals(ref.stream)
st = open_store("chdb:" + store_dir)
migrate(st, {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0})
st.insert("requests", b.requests)
t = time.perf_counter()
for k in range(3):
    st.insert("requests", b.requests, dedup_token=f"bench-{k}")
ins = (time.perf_counter() - t) / 3
st.close()
print(json.dumps({"lines": len(lines), "fast_s": fast, "ref_s": slow, "insert_s": ins, "identical": same}))
"""


def run_stages(path: Path, fmt: str, tmp: Path) -> dict[str, float]:
    store = tmp / "stages_store"
    store.mkdir()
    out = subprocess.run([sys.executable, "-c", _STAGES, str(path), fmt, str(store)], check=True,
                         capture_output=True, text=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", nargs="?", default=DEFAULT_FILE)
    ap.add_argument("--make-from", default=DEFAULT_SAMPLE)
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--format", default="combined")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts for in-process runs")
    ap.add_argument("--skip-stages", action="store_true")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--json", help="write the results as JSON to this file")
    a = ap.parse_args(argv)
    path = Path(a.file)
    if not path.exists():
        make_file(path, Path(a.make_from), a.repeat)
    n = _count_lines(path)
    results: dict[str, object] = {"file": str(path), "lines": n, "format": a.format, "cpus": os.cpu_count(),
                                  "load_before": _load()}
    print(f"file {path}: {n} lines, {path.stat().st_size / 1e6:.0f} MB; load average {_load()}")
    with tempfile.TemporaryDirectory(prefix="fp-bench-") as d:
        tmp = Path(d)
        g = run_goaccess(path, tmp)
        results["goaccess_s"] = g
        print(f"goaccess           {g:7.2f} s  {n / g:10,.0f} lines/s   (load {_load()})")
        if not a.skip_cli:
            c = run_cli(path, a.format, tmp)
            results["cli_s"] = c
            print(f"forumpulse ingest  {c:7.2f} s  {n / c:10,.0f} lines/s   ratio {g / c:4.2f}x goaccess  "
                  f"(load {_load()})")
        for w in [int(x) for x in a.workers.split(",") if x]:
            r = run_inproc(path, a.format, tmp, w)
            results[f"ingest_paths_w{w}"] = r
            print(f"ingest_paths w={w}   {r['seconds']:7.2f} s  {n / r['seconds']:10,.0f} lines/s   ratio "
                  f"{g / r['seconds']:4.2f}x goaccess  loaded {int(r['loaded'])} quarantined "
                  f"{int(r['quarantined'])}  (load {_load()})")
        g2 = run_goaccess(path, tmp)
        results["goaccess2_s"] = g2
        print(f"goaccess (again)   {g2:7.2f} s  {n / g2:10,.0f} lines/s   (load {_load()})")
        if not a.skip_stages:
            s = run_stages(path, a.format, tmp)
            results["stages"] = s
            m = s["lines"]
            print(f"stage Processor.process (fast)     {m / s['fast_s']:10,.0f} lines/s  (one process, warm caches)")
            print(f"stage Processor.process_reference  {m / s['ref_s']:10,.0f} lines/s  identical={s['identical']}")
            print(f"stage chDB insert requests + MVs   {m / s['insert_s']:10,.0f} rows/s")
    results["load_after"] = _load()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
