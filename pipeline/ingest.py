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
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pyarrow.compute as pc
from forumpulse.pipeline.config import Settings, SourceConfig
from forumpulse.pipeline.process import Processor, SourceContext
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


def ingest_stream(
    store: Store,
    processor: Processor,
    fh: BinaryIO,
    ctx: SourceContext,
    *,
    batch_lines: int = 100_000,
    on_progress: Callable[[int], None] | None = None,
    name: str | None = None,
) -> FileCounts:
    counts = FileCounts(name=name or ctx.origin_file)
    retention_days = processor.settings.retention.raw_days
    t0 = time.perf_counter()
    line_no = 0
    for chunk in _chunks(fh, batch_lines):
        nbytes = sum(map(len, chunk))
        counts.read += len(chunk)
        counts.bytes_read += nbytes
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{ctx.site}\0{ctx.origin_host}\0{ctx.origin_file}\0{ctx.format}\0{line_no}\0".encode())
        for line in chunk:
            digest.update(line)
        token = digest.hexdigest()
        batch = processor.process(chunk, ctx, line_no_base=line_no, source_ref=f"file:{ctx.origin_file}")
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
) -> list[FileCounts]:
    """Ingest every path (``-`` = stdin) in order.  ``on_file(name, size)`` may return a progress callback."""
    ensure_schema(store, settings)
    processor = Processor(settings)
    results = []
    for path in paths:
        ctx = context_for(path, settings, fmt, site, origin_host)
        if path == "-":
            cb = on_file("stdin", 0) if on_file else None
            results.append(ingest_stream(store, processor, sys.stdin.buffer, ctx,
                                         batch_lines=settings.ingest.batch_lines, on_progress=cb, name="stdin"))
            continue
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        cb = on_file(path, p.stat().st_size) if on_file else None
        opener = _open_maybe_compressed(p)
        with opener as fh:
            results.append(ingest_stream(store, processor, fh, ctx, batch_lines=settings.ingest.batch_lines,
                                         on_progress=cb, name=path))
    return results


def _open_maybe_compressed(p: Path) -> BinaryIO:
    if p.suffix == ".gz":
        import gzip

        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")
