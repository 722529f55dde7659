"""Batch ingestion of log files (or stdin) into the store: the embedded default path, and backfill of archives.

Counting: ``read`` is counted by the reader (lines as split from the file, a last line without newline included),
``loaded`` and ``quarantined`` by what was inserted.  ``read == loaded + quarantined`` is checked per file; a
mismatch is an error, never a silent loss.

Idempotence: every insert carries a deduplication token derived from the chunk's bytes and its source, so
re-ingesting the same file (within ClickHouse's deduplication window: the last 1,000 blocks per table) stores
nothing twice, rollups included.  For larger replays, the Kafka consumer's offset-based tokens are the tool.

Retention: rows older than ``retention.raw_days`` (by their own timestamp) are dropped by the table TTL on
insert; they are counted as ``expired`` and reported, so an archive backfill never loses lines silently
(set ``retention.raw_days: 0`` to keep everything).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow.compute as pc
from forumpulse.pipeline.config import Settings, SourceConfig
from forumpulse.pipeline.process import ProcessedBatch, Processor, SourceContext
from forumpulse.pipeline.store import Store, migrate

READ_CHUNK_BYTES = 16 << 20


@dataclass
class FileCounts:
    name: str
    read: int = 0
    loaded: int = 0
    quarantined: int = 0
    expired: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0


def ensure_schema(store: Store, settings: Settings) -> None:
    """Apply pending migrations (idempotent) with the configured retention."""
    migrate(store, settings.retention.migration_params())


def context_for(path: str, settings: Settings, fmt: str | None, site: str | None, origin_host: str | None) -> SourceContext:
    """Source context for a file: explicit options win, then the first configured source whose ``paths`` glob
    matches, then defaults (first configured site, this host's name, ``auto`` format)."""
    src: SourceConfig | None = None
    for s in settings.sources:
        if any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(os.path.abspath(path), g) for g in s.paths):
            src = s
            break
    return SourceContext(
        site=site or (src.site if src else settings.sites[0].name),
        origin_host=origin_host or (src.origin_host if src and src.origin_host else socket.gethostname()),
        origin_file=path if path != "-" else "stdin",
        format=fmt or (src.format if src else "auto"),
    )


def _chunks(fh: BinaryIO, max_lines: int) -> Iterator[list[bytes]]:
    pending: list[bytes] = []
    while True:
        block = fh.readlines(READ_CHUNK_BYTES)
        if not block:
            break
        pending.extend(block)
        while len(pending) >= max_lines:
            yield pending[:max_lines]
            del pending[:max_lines]
    if pending:
        yield pending


_WORKER: Processor | None = None


def _worker_init(settings_json: str) -> None:
    global _WORKER
    from forumpulse.pipeline.config import Settings

    _WORKER = Processor(Settings.model_validate_json(settings_json))


def _worker_process(chunk: list[bytes], ctx: SourceContext, line_no: int, source_ref: str) -> ProcessedBatch:
    assert _WORKER is not None
    return _WORKER.process(chunk, ctx, line_no_base=line_no, source_ref=source_ref)


class _Pool:
    """Processes chunks in worker processes, results in submission order, at most ``2 * workers`` in flight.

    Workers are *spawned* (never forked: the parent runs the chDB engine's threads).  With ``workers <= 1`` the
    chunks are processed inline.  Either way the output is identical (processing is a pure function).
    """

    def __init__(self, processor: Processor, workers: int) -> None:
        self.processor = processor
        self.workers = workers
        self._ex: Any = None

    def map(self, items: Iterator[tuple[list[bytes], SourceContext, int, str]]) -> Iterator[tuple[list[bytes], ProcessedBatch]]:
        if self.workers <= 1:
            for chunk, ctx, line_no, ref in items:
                yield chunk, self.processor.process(chunk, ctx, line_no_base=line_no, source_ref=ref)
            return
        if self._ex is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._ex = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                initargs=(self.processor.settings.model_dump_json(),),
            )
        pending: deque[tuple[list[bytes], Any]] = deque()
        for chunk, ctx, line_no, ref in items:
            pending.append((chunk, self._ex.submit(_worker_process, chunk, ctx, line_no, ref)))
            if len(pending) >= 2 * self.workers:
                c, fut = pending.popleft()
                yield c, fut.result()
        while pending:
            c, fut = pending.popleft()
            yield c, fut.result()

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)
            self._ex = None


def ingest_stream(
    store: Store,
    processor: Processor,
    fh: BinaryIO,
    ctx: SourceContext,
    *,
    batch_lines: int = 100_000,
    on_progress: Callable[[int], None] | None = None,
    name: str | None = None,
    pool: _Pool | None = None,
) -> FileCounts:
    counts = FileCounts(name=name or ctx.origin_file)
    retention_days = processor.settings.retention.raw_days
    t0 = time.perf_counter()
    source_ref = f"file:{ctx.origin_file}"

    def numbered() -> Iterator[tuple[list[bytes], SourceContext, int, str]]:
        line_no = 0
        for chunk in _chunks(fh, batch_lines):
            counts.read += len(chunk)  # counted by the reader, independently of what processing returns
            yield chunk, ctx, line_no, source_ref
            line_no += len(chunk)

    line_no = 0
    for chunk, batch in (pool or _Pool(processor, 1)).map(numbered()):
        nbytes = sum(map(len, chunk))
        counts.bytes_read += nbytes
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{ctx.site}\0{ctx.origin_host}\0{ctx.origin_file}\0{ctx.format}\0{line_no}\0".encode())
        for line in chunk:
            digest.update(line)
        token = digest.hexdigest()
        store.insert("requests", batch.requests, dedup_token=f"req-{token}")
        store.insert("quarantine", batch.quarantine, dedup_token=f"qua-{token}")
        counts.loaded += batch.requests.num_rows
        counts.quarantined += batch.quarantine.num_rows
        counts.by_reason.update(batch.by_reason)
        if retention_days > 0 and batch.requests.num_rows:
            cutoff = (time.time() - retention_days * 86400) * 1000
            ts_ms = pc.cast(batch.requests.column("ts"), "int64")
            counts.expired += int(pc.sum(pc.less(ts_ms, cutoff)).as_py() or 0)
        line_no += len(chunk)
        if on_progress:
            on_progress(nbytes)
    counts.seconds = time.perf_counter() - t0
    if counts.read != counts.loaded + counts.quarantined:
        raise RuntimeError(
            f"{counts.name}: {counts.read} lines read but {counts.loaded} loaded + {counts.quarantined} quarantined"
        )
    return counts


def ingest_paths(
    store: Store,
    settings: Settings,
    paths: list[str],
    *,
    fmt: str | None = None,
    site: str | None = None,
    origin_host: str | None = None,
    on_file: Callable[[str, int], Callable[[int], None] | None] | None = None,
    workers: int | None = None,
) -> list[FileCounts]:
    """Ingest every path (``-`` = stdin) in order.  ``on_file(name, size)`` may return a progress callback.

    ``workers``: processes that parse and attribute (default: one per core when there is more than one chunk
    of work, else inline).  Output is the same for any number of workers.
    """
    ensure_schema(store, settings)
    processor = Processor(settings)
    if workers is None:
        total = sum(Path(p).stat().st_size for p in paths if p != "-" and Path(p).is_file())
        workers = (os.cpu_count() or 1) if total > 32 << 20 or "-" in paths else 1
    pool = _Pool(processor, workers)
    try:
        return _ingest_each(store, settings, processor, pool, paths, fmt, site, origin_host, on_file)
    finally:
        pool.close()


def _ingest_each(
    store: Store,
    settings: Settings,
    processor: Processor,
    pool: _Pool,
    paths: list[str],
    fmt: str | None,
    site: str | None,
    origin_host: str | None,
    on_file: Callable[[str, int], Callable[[int], None] | None] | None,
) -> list[FileCounts]:
    results = []
    for path in paths:
        ctx = context_for(path, settings, fmt, site, origin_host)
        if path == "-":
            cb = on_file("stdin", 0) if on_file else None
            results.append(ingest_stream(store, processor, sys.stdin.buffer, ctx, pool=pool,
                                         batch_lines=settings.ingest.batch_lines, on_progress=cb, name="stdin"))
            continue
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        cb = on_file(path, p.stat().st_size) if on_file else None
        opener = _open_maybe_compressed(p)
        with opener as fh:
            results.append(ingest_stream(store, processor, fh, ctx, batch_lines=settings.ingest.batch_lines,
                                         on_progress=cb, name=path, pool=pool))
    return results


def _open_maybe_compressed(p: Path) -> BinaryIO:
    if p.suffix == ".gz":
        import gzip

        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")


@contextmanager
def file_progress(console: Any = None) -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """A rich progress display with one bar per file; yields the ``on_file`` callback of :func:`ingest_paths`."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=console) as progress:

        def on_file(name: str, size: int) -> Callable[[int], None]:
            task = progress.add_task(Path(name).name, total=size or None)
            return lambda n: progress.advance(task, n)

        yield on_file

