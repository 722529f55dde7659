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
* the block-based loop proposed for ``ingest.py`` (:func:`proposed_ingest`) for each ``--proposed`` count;
* stages (unless ``--skip-stages``): ``Processor.process`` (fast path), ``process_block`` and
  ``process_reference`` on the first 100k lines, and the chDB insert alone (requests + its materialized views)
  of those processed rows: wall and CPU seconds (``time.process_time``), best of 3.

CPU seconds of every subprocess (with its workers) are printed too: on a loaded machine they are the steadier
figure (GoAccess's CPU seconds vs ours tell how far apart the work is, whatever the load).

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

DEFAULT_FILE = "/tmp/elastic1m.log"
DEFAULT_SAMPLE = "/work/shared/data/access_logs/elastic_examples/apache_logs"


def _cpu_children() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


_LAST_CPU: list[float] = [0.0]


def _timed(cmd: list[str], **kw: object) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run a command; wall seconds, and its CPU seconds (itself and its children) in ``_LAST_CPU[0]``."""
    c0 = _cpu_children()
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]
    dt = time.perf_counter() - t
    _LAST_CPU[0] = _cpu_children() - c0
    return dt, out


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
    dt, _ = _timed([exe, "--log-format=COMBINED", str(path), "-o", str(tmp / "goaccess.json")],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dt


def run_cli(path: Path, fmt: str, tmp: Path) -> float:
    exe = Path(sys.executable).with_name("forumpulse")
    store = tmp / "cli_store"
    store.mkdir()
    cfg = tmp / "bench.yaml"
    cfg.write_text("retention:\n  raw_days: 0\n  rollup_days: 0\n  quarantine_days: 0\n")
    dt, _ = _timed([str(exe), "ingest", "--format", fmt, "--config", str(cfg), "--store", f"chdb:{store}",
                    str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dt


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


# ---------------------------------------------------------------- block-based loop (a proposal for ingest.py)

_PROTO_WORKER: object = None


def _proto_init(settings_json: str) -> None:
    global _PROTO_WORKER
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.process import Processor

    _PROTO_WORKER = Processor(Settings.model_validate_json(settings_json))


def _proto_work(data: bytes, ctx: object, line_no: int, ref: str) -> object:
    return _PROTO_WORKER.process_block(data, ctx, line_no_base=line_no, source_ref=ref)  # type: ignore[attr-defined]


def block_chunks(fh: BinaryIO, lines_per_chunk: int, read_bytes: int = 32 << 20) -> Iterator[bytes]:
    """Raw chunks of ``lines_per_chunk`` lines (the last one shorter), cut at newlines, no per-line objects."""
    import numpy as np

    rest = b""
    while True:
        block = fh.read(read_bytes)
        data = rest + block
        if not block:
            if data:
                yield data
            return
        nl = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        start = 0
        k = lines_per_chunk - 1
        while k < len(nl):
            end = int(nl[k]) + 1
            yield data[start:end]
            start = end
            k += lines_per_chunk
        rest = data[start:]


def proposed_ingest(path: str, fmt: str, store_dir: str, workers: int) -> dict[str, float]:
    """What ``ingest_stream`` would do with blocks: the pool starts first (its ~1.5 s start overlaps chDB's),
    the reader hands raw 100k-line blocks to workers (``Processor.process_block``: no readlines, no pickling of
    100k ``bytes`` objects), the dedup token hashes the block in one call (same digest as per-line updates).
    ``workers=0``: one processing thread in this process instead of worker processes (no start-up, no pickling;
    processing of the next block overlaps the insert of the previous one)."""
    import hashlib
    import multiprocessing
    import socket
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.process import SourceContext
    from forumpulse.pipeline.store import migrate, open_store

    s = load_settings()
    s.retention.raw_days = 0
    s.retention.rollup_days = 0
    s.retention.quarantine_days = 0
    t0 = time.perf_counter()
    ex: Any
    if workers > 0:
        ex = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_proto_init,
                                 initargs=(s.model_dump_json(),))
        for _ in range(workers):  # start the workers now, without waiting: their start overlaps chDB's
            ex.submit(len, b"")
        work: Any = _proto_work
    else:  # one processing thread in this process: Arrow, numpy and chDB release the GIL, nothing is pickled
        from concurrent.futures import ThreadPoolExecutor

        from forumpulse.pipeline.process import Processor

        proc = Processor(s)
        ex = ThreadPoolExecutor(1)

        def work(data: bytes, ctx: SourceContext, line_no: int, ref: str) -> object:
            return proc.process_block(data, ctx, line_no_base=line_no, source_ref=ref)
    st = open_store("chdb:" + store_dir)
    migrate(st, s.retention.migration_params())
    ctx = SourceContext(site=s.sites[0].name, origin_host=socket.gethostname(), origin_file=path, format=fmt)
    ref = f"file:{path}"
    read = loaded = quarantined = 0
    pending: deque[tuple[bytes, int, object]] = deque()

    def drain(item: tuple[bytes, int, object]) -> None:
        nonlocal loaded, quarantined
        data, line_no, fut = item
        batch = fut.result()  # type: ignore[attr-defined]
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{ctx.site}\0{ctx.origin_host}\0{ctx.origin_file}\0{ctx.format}\0{line_no}\0".encode())
        digest.update(data)
        token = digest.hexdigest()
        st.insert("requests", batch.requests, dedup_token=f"req-{token}")
        st.insert("quarantine", batch.quarantine, dedup_token=f"qua-{token}")
        loaded += batch.requests.num_rows
        quarantined += batch.quarantine.num_rows

    line_no = 0
    with open(path, "rb") as fh:
        for data in block_chunks(fh, s.ingest.batch_lines):
            n = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)
            read += n
            pending.append((data, line_no, ex.submit(work, data, ctx, line_no, ref)))
            line_no += n
            if len(pending) >= 2 * max(workers, 1):
                drain(pending.popleft())
    while pending:
        drain(pending.popleft())
    dt = time.perf_counter() - t0
    ex.shutdown()
    rows = int(st.query_rows("SELECT count() FROM requests")[0][0])
    st.close()
    return {"seconds": dt, "read": read, "loaded": loaded, "quarantined": quarantined, "rows": rows}


def run_proposed(path: Path, fmt: str, tmp: Path, workers: int) -> dict[str, float]:
    store = tmp / f"proto_w{workers}"
    store.mkdir()
    code = ("import json, sys; from forumpulse.pipeline.bench_ingest import proposed_ingest; "
            "print(json.dumps(proposed_ingest(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))")
    _, out = _timed([sys.executable, "-c", code, str(path), fmt, str(store), str(workers)],
                    capture_output=True, text=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    res["cpu_s"] = _LAST_CPU[0]
    if res["rows"] != res["loaded"] or res["read"] != res["loaded"] + res["quarantined"]:
        raise SystemExit(f"count mismatch: {res}")
    return res


def run_inproc(path: Path, fmt: str, tmp: Path, workers: int) -> dict[str, float]:
    store = tmp / f"store_w{workers}"
    store.mkdir()
    _, out = _timed([sys.executable, "-c", _CHILD, str(path), fmt, str(store), str(workers)],
                    capture_output=True, text=True)
    res: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    res["cpu_s"] = _LAST_CPU[0]
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
block = b"".join(lines)
p.process(lines, ctx)  # warm caches as a long-running worker has them
def best(fn):
    w, c = [], []
    for _ in range(3):
        t, u = time.perf_counter(), time.process_time()
        out = fn()
        w.append(time.perf_counter() - t); c.append(time.process_time() - u)
    return out, min(w), min(c)
b, fast, fast_cpu = best(lambda: p.process(lines, ctx))
_, blk, blk_cpu = best(lambda: p.process_block(block, ctx))
r = Processor(s); r.process_reference(lines, ctx)
ref, slow, slow_cpu = best(lambda: r.process_reference(lines, ctx))
same = b.requests.equals(ref.requests) and b.stream.equals(ref.stream)
st = open_store("chdb:" + store_dir)
migrate(st, {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0})
st.insert("requests", b.requests)
k = iter(range(100))
_, ins, ins_cpu = best(lambda: st.insert("requests", b.requests, dedup_token=f"bench-{next(k)}"))
st.close()
print(json.dumps({"lines": len(lines), "fast_s": fast, "fast_cpu": fast_cpu, "block_s": blk, "block_cpu": blk_cpu,
                  "ref_s": slow, "ref_cpu": slow_cpu, "insert_s": ins, "insert_cpu": ins_cpu, "identical": same}))
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
    ap.add_argument("--proposed", default="1,2",
                    help="worker counts for the block-based loop proposed for ingest.py, 0 = one thread in the "
                         "main process (empty: skip)")
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
        results["goaccess_cpu"] = _LAST_CPU[0]
        print(f"goaccess           {g:7.2f} s  {n / g:10,.0f} lines/s   cpu {_LAST_CPU[0]:6.2f} s  (load {_load()})")
        if not a.skip_cli:
            c = run_cli(path, a.format, tmp)
            results["cli_s"] = c
            results["cli_cpu"] = _LAST_CPU[0]
            print(f"forumpulse ingest  {c:7.2f} s  {n / c:10,.0f} lines/s   cpu {_LAST_CPU[0]:6.2f} s  ratio "
                  f"{g / c:4.2f}x goaccess  (load {_load()})")
        for w in [int(x) for x in a.workers.split(",") if x]:
            r = run_inproc(path, a.format, tmp, w)
            results[f"ingest_paths_w{w}"] = r
            print(f"ingest_paths w={w}   {r['seconds']:7.2f} s  {n / r['seconds']:10,.0f} lines/s   cpu "
                  f"{r['cpu_s']:6.2f} s  ratio "
                  f"{g / r['seconds']:4.2f}x goaccess  loaded {int(r['loaded'])} quarantined "
                  f"{int(r['quarantined'])}  (load {_load()})")
        for w in [int(x) for x in a.proposed.split(",") if x]:
            r = run_proposed(path, a.format, tmp, w)
            results[f"proposed_w{w}"] = r
            print(f"block loop w={w}     {r['seconds']:7.2f} s  {n / r['seconds']:10,.0f} lines/s   cpu "
                  f"{r['cpu_s']:6.2f} s  ratio "
                  f"{g / r['seconds']:4.2f}x goaccess  loaded {int(r['loaded'])} quarantined "
                  f"{int(r['quarantined'])}  (load {_load()})")
        g2 = run_goaccess(path, tmp)
        results["goaccess2_s"] = g2
        print(f"goaccess (again)   {g2:7.2f} s  {n / g2:10,.0f} lines/s   cpu {_LAST_CPU[0]:6.2f} s  "
              f"(load {_load()})")
        if not a.skip_stages:
            s = run_stages(path, a.format, tmp)
            results["stages"] = s
            m = s["lines"]
            for label, key in (("Processor.process (fast path)", "fast"), ("Processor.process_block", "block"),
                               ("Processor.process_reference", "ref"), ("chDB insert requests + 5 MVs", "insert")):
                print(f"stage {label:32s} {m / s[key + '_s']:10,.0f} /s wall  {m / s[key + '_cpu']:10,.0f} /s per "
                      f"CPU-second  (100k lines, best of 3, warm caches)")
            print(f"stage tables identical to the reference: {s['identical']}")
    results["load_after"] = _load()
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
