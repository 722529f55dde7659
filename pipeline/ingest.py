"""Batch ingestion of log files (or stdin) into the store: the embedded default path, and backfill of archives.

Counting: ``read`` is counted by the reader (lines as split from the file, a last line without newline included),
``loaded`` and ``quarantined`` by what was inserted.  ``read == loaded + quarantined`` is checked per file; a
mismatch is an error, never a silent loss.

Idempotence, in two layers:

* the file ledger (table ``ingest_files``, migration 0009): after each insert block is stored, the input's totals
  at its end (bytes, lines, SHA-256) are recorded under the hash of the file's first line.  A later ingest of a
  file that starts with the same bytes -- the same file again, under any path spelling, grown since, renamed by
  logrotate, compressed, or a rerun after a crash or a store error -- skips the longest recorded prefix it holds
  and reads only what follows (:attr:`FileCounts.skipped`).  Keyed by site, origin host and format: the same
  content under another format is read again (and the command warns that its lines are now stored twice).  A
  last line without newline is recorded twice, with it (used while the file still ends there) and up to the
  newline before it (used once the line was completed: the whole line is read, its early half stays where it
  went, usually quarantined as ``truncated``); a cut ``.gz`` is recorded only up to its last newline.  Blocks
  left out for retention end the checkpoints of that file; stdin is not recorded.
* every insert carries a deduplication token derived from the site, origin host, format, first line number and
  the SHA-256 of the input up to the end of the block (not the file's name): a block whose ledger row was not
  written (a crash between the two) is stored once when the same input is read again, within ClickHouse's
  deduplication window (the last 1,000 parts per table, one per day of each insert block), rollups included.
  For larger replays, the Kafka consumer's offset-based tokens are the tool.

Not covered: a copy cut short (a ``.gz`` still being written) of a file loaded further before re-stores what it
holds past its last recorded checkpoint (at most one insert block, ``ingest.batch_lines``), as does a crash
between a block's insert and its ledger row followed by growth of the file; content loaded by a version without
the ledger; on a cluster, the ledger row goes through a Distributed table (asynchronous by default): an ingest
of the same file started within seconds may not see it yet (its blocks are still deduplicated by their tokens).

Retention: rows older than ``retention.raw_days`` (by their own timestamp) are dropped by the table TTL on
insert; they are counted as ``expired`` and reported, so an archive backfill never loses lines silently
(set ``retention.raw_days: 0`` to keep everything).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import pyarrow.compute as pc
from forumpulse.pipeline.config import Settings, SourceConfig
from forumpulse.pipeline.process import ProcessedBatch, Processor, SourceContext
from forumpulse.pipeline.store import Store, migrate, migrate_in_background, sql_string

if TYPE_CHECKING:
    from concurrent.futures import Future

READ_CHUNK_BYTES = 16 << 20
#: most lines one parse step takes (the file loader gathers chunks into insert blocks of ``batch_lines``)
PARSE_CHUNK_LINES = 100_000


@dataclass
class FileCounts:
    name: str
    read: int = 0
    loaded: int = 0
    quarantined: int = 0
    expired: int = 0
    #: rows of blocks the store already held (the same file ingested before): deduplicated, not stored again;
    #: counted with chDB only (a ClickHouse server's counter is shared by every client)
    already_stored: int = 0
    #: set when the input ended abnormally (a ``.gz`` cut short): what was read before is loaded and counted
    error: str | None = None
    by_reason: Counter[str] = field(default_factory=Counter)
    bytes_read: int = 0
    seconds: float = 0.0
    #: lines at the start of the file that an earlier ingest loaded (the file ledger): not read again
    skipped: int = 0
    #: that earlier ingest: its file name and time, for the note
    skipped_from: str = ""
    #: the same first bytes were loaded before under another format (these lines are now stored twice)
    other_format: str = ""
    #: insert blocks left out because every row was past retention (the ledger's checkpoints of the file end before the first)
    blocks_past_retention: int = 0

    @property
    def rate(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0


def ensure_schema(store: Store, settings: Settings) -> None:
    """Apply pending migrations (idempotent) with the configured retention."""
    migrate(store, settings.retention.migration_params())


#: a rotated file's suffix: logrotate's ``.1`` .. and ``dateext`` (``-20260101``, ``-2026010112``, ``-2026-01-01``)
_ROTATED = re.compile(r"(?:\.\d{1,3}|-\d{8}|-\d{10}|-\d{4}-\d{2}-\d{2})$")


def source_file(path: str) -> str:
    """The log source a file belongs to, as syslog-ng names the file it tails: its absolute path (symlinks not
    resolved), without a compression suffix and a rotation suffix (``access.log.2.gz``, ``access.log-20260101``
    -> ``access.log``).  So a backfill by a relative path, the rotated archives and the live lines after them are
    one source: with a name per file, each file fell silent where its lines end -- a pipeline_gap that never
    closed, and the site detectors not fed for a day after it (user trial 32).  The file itself is named in
    quarantine references and in the ingest ledger."""
    p = os.path.abspath(path)
    for ext in COMPRESSED:
        if p.endswith(ext):
            p = p[: -len(ext)]
            break
    return _ROTATED.sub("", p) or p


def context_for(path: str, settings: Settings, fmt: str | None, site: str | None, origin_host: str | None) -> SourceContext:
    """Source context for a file: explicit options win, then the first configured source whose ``paths`` glob
    matches, then defaults (first configured site, this host's name, ``auto`` format).  ``origin_file`` is the
    file's :func:`source_file`, whatever the working directory."""
    src: SourceConfig | None = None
    for s in settings.sources:
        if any(fnmatch.fnmatch(path, g) or fnmatch.fnmatch(os.path.abspath(path), g) for g in s.paths):
            src = s
            break
    return SourceContext(
        site=site or (src.site if src else settings.sites[0].name),
        origin_host=origin_host or (src.origin_host if src and src.origin_host else socket.gethostname()),
        origin_file=source_file(path) if path != "-" else "stdin",
        format=fmt or (src.format if src else "auto"),
    )


def _chunks(fh: BinaryIO, max_lines: int, read_bytes: int = READ_CHUNK_BYTES) -> Iterator[tuple[bytes, int]]:
    """Raw blocks of at most ``max_lines`` lines, cut after a newline (a last line without one included), with
    the number of lines each holds as counted here by the reader: no per-line objects are made.

    Cuts are found by the native scanner (one ``memchr`` per line, without the GIL: the 1M-line 278 MB file in
    0.015 CPU-s), or without it with ``count`` / ``find`` (no per-byte arrays, but holding the GIL: 0.09-0.10
    CPU-s for the same file): a window sized by the average line length seen so far is counted, then the last few
    newlines are walked one by one.  Both give the same positions (tests/test_ingest.py).  The input is read into one
    reused buffer (``readinto`` where the reader has it) and each block is copied out of it once: reading and
    cutting 278 MB took 0.45-0.62 CPU-s with fresh ``bytes`` per read (the remainder concatenated to every read,
    ~130k page faults) and a fraction of that this way.  Where the cuts fall depends on the data alone, so a
    file gives the same blocks (and dedup tokens) however it is read."""
    from forumpulse.pipeline import native

    sc = native.scanner()
    buf = bytearray(read_bytes)
    filled = 0  # bytes of buf holding data; buf[:filled] = the unread rest, then what the last read added
    readinto = getattr(fh, "readinto", None)
    avg = 256.0  # bytes per line, refined as blocks are cut

    def cut(start: int) -> int:
        if sc is not None:  # one memchr per line in C, the GIL released: same positions
            return sc.after_nth_newline(buf, start, max_lines, filled)
        return _after_nth_newline(buf, start, max_lines, avg, filled)

    while True:
        if len(buf) - filled < read_bytes:
            buf.extend(bytes(filled + read_bytes - len(buf)))  # grows only while a block does not fit
        with memoryview(buf) as mv:
            if readinto is not None:
                got = readinto(mv[filled:filled + read_bytes])
            else:  # e.g. the damage-tolerant .gz reader
                block = fh.read(read_bytes)
                got = len(block)
                mv[filled:filled + got] = block
            if not got:
                if filled:
                    tail = bytes(mv[:filled])
                    yield tail, tail.count(b"\n") + (0 if tail.endswith(b"\n") else 1)
                return
            filled += got
            start = 0
            while (end := cut(start)) > 0:
                avg = (end - start) / max_lines
                yield bytes(mv[start:end]), max_lines
                start = end
            mv[:filled - start] = mv[start:filled]  # keep the rest at the front (less than a block)
            filled -= start


def _after_nth_newline(data: bytes | bytearray, start: int, n: int, avg: float, size: int | None = None) -> int:
    """The position just after the ``n``-th newline at or after ``start`` in ``data[:size]``, or -1 if there are
    fewer."""
    pos, left = start, n
    size = len(data) if size is None else size
    while left > 32:
        window = min(size, pos + max(1, int(left * avg * 0.9)))  # aim just short of the target
        c = data.count(b"\n", pos, window)
        if c >= left:  # overshot: retry with a smaller window
            avg *= 0.5
            continue
        pos, left = window, left - c
        if window == size:
            return -1
    for _ in range(left):
        k = data.find(b"\n", pos, size)
        if k < 0:
            return -1
        pos = k + 1
    return pos


_WORKER: Processor | None = None


def _worker_init(settings_json: str) -> None:
    global _WORKER
    from forumpulse.pipeline.config import Settings

    _WORKER = Processor(Settings.model_validate_json(settings_json))


def _worker_process(chunk: bytes, ctx: SourceContext, line_no: int, source_ref: str) -> ProcessedBatch:
    assert _WORKER is not None
    return _WORKER.process_block(chunk, ctx, line_no_base=line_no, source_ref=source_ref)


class _Pool:
    """Processes chunks in worker processes or threads, results in submission order, a bounded number in flight.

    * ``workers > 1``: that many *spawned* processes (never forked: the parent runs the chDB engine's threads),
      started at once so their start-up overlaps chDB's; at most ``2 * workers`` chunks in flight.
    * else ``threads > 1``: that many threads in this process, each with its own :class:`Processor` (a processor
      is not thread-safe).  The fast path spends most of its time in Arrow and NumPy kernels that release the
      GIL (regex extraction, byte scans, takes), so two threads overlap well on two cores without paying for
      pickling; at most ``threads + 1`` chunks in flight.
    * else inline, on the caller's processor.

    The output is identical in every mode (processing is a pure function; tests compare the modes).
    """

    def __init__(self, processor: Processor, workers: int, threads: int = 1) -> None:
        self.processor = processor
        self.workers = workers
        self.threads = threads if workers <= 1 else 1
        self._ex: Any = None
        self._local: Any = None

    def start(self) -> None:
        if self._ex is not None:
            return
        if self.workers > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self._ex = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_init,
                initargs=(self.processor.settings.model_dump_json(),),
            )
            for _ in range(self.workers):  # start now, without waiting
                self._ex.submit(len, b"")
        elif self.threads > 1:
            import threading
            from concurrent.futures import ThreadPoolExecutor

            self._local = threading.local()
            self._ex = ThreadPoolExecutor(self.threads, thread_name_prefix="forumpulse-parse")

    def _thread_process(self, chunk: bytes, ctx: SourceContext, line_no: int, ref: str) -> ProcessedBatch:
        proc = getattr(self._local, "processor", None)
        if proc is None:
            proc = self._local.processor = Processor(self.processor.settings)
        return proc.process_block(chunk, ctx, line_no_base=line_no, source_ref=ref)

    def map(self, items: Iterator[tuple[bytes, SourceContext, int, str]]) -> Iterator[tuple[bytes, ProcessedBatch]]:
        if self.workers <= 1 and self.threads <= 1:
            for chunk, ctx, line_no, ref in items:
                yield chunk, self.processor.process_block(chunk, ctx, line_no_base=line_no, source_ref=ref)
            return
        self.start()
        fn: Callable[[bytes, SourceContext, int, str], ProcessedBatch]
        if self.workers > 1:
            fn, ahead = _worker_process, 2 * self.workers
        else:
            fn, ahead = self._thread_process, self.threads + 1
        pending: deque[tuple[bytes, Any]] = deque()
        for chunk, ctx, line_no, ref in items:
            pending.append((chunk, self._ex.submit(fn, chunk, ctx, line_no, ref)))
            if len(pending) >= ahead:
                c, fut = pending.popleft()
                yield c, fut.result()
        while pending:
            c, fut = pending.popleft()
            yield c, fut.result()

    def close(self) -> None:
        if self._ex is not None:
            self._ex.shutdown(cancel_futures=True)
            self._ex = None


class _Inserter:
    """Runs inserts on one background thread, one at a time and in submission order, while the caller processes
    the next chunk (chDB and the ClickHouse client release the GIL while the server works: measured 1.5x faster
    ingestion on 2 cores).  At most one insert waits behind the running one, so memory stays bounded at three
    processed chunks.  The first insert error is raised in the caller (by the next ``submit`` or on leaving the
    ``with`` block) and nothing after it is inserted; leaving the block waits for every submitted insert."""

    def __init__(self) -> None:
        import queue
        import threading

        self._q: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="forumpulse-inserter", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._q.get()) is not None:
            if self._error is None:
                try:
                    item[0](*item[1])
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self._raise()
        self._q.put((fn, args))

    def __enter__(self) -> _Inserter:
        return self

    def __exit__(self, *exc: object) -> None:
        self._q.put(None)
        self._thread.join()
        if exc[0] is None:
            self._raise()


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
    schema_ready: Callable[[], object] | None = None,
    first_line: int = 0,
    running: Any = None,
    first_byte: int = 0,
    checkpoint: Callable[[int, int, str], None] | None = None,
    damaged: Callable[[], bool] | None = None,
) -> FileCounts:
    """Ingest one stream.  ``schema_ready`` (if given) is called before every insert, on the insert thread, and
    must return once the store's tables exist (it re-raises a failed migration): parsing of the first chunks
    overlaps the migrations.

    ``running``: a ``hashlib.sha256`` object holding the bytes before this stream (a file's skipped prefix, see
    the module docstring), updated with every byte read here; ``first_line`` / ``first_byte``: how many lines and
    bytes those were.  ``checkpoint(bytes, lines, sha256)`` is called on the insert thread after each block is
    stored, with the input's totals and hash at its end (the file ledger), until a block is left out for
    retention; when ``damaged()`` says the input ended abnormally, the last one stops at the last newline (the
    cut line is read again from an intact copy)."""
    counts = FileCounts(name=name or ctx.origin_file)
    retention_days = processor.settings.retention.raw_days
    rollup_days = processor.settings.retention.rollup_days
    # a block is left out only when its rows are past the raw TTL AND the rollups' (the rollups are fed by the
    # insert into requests: skipping it would lose them too); 0 = forever
    skip_days = max(retention_days, rollup_days) if retention_days > 0 and rollup_days > 0 else 0
    t0 = time.perf_counter()
    source_ref = f"file:{os.path.abspath(name) if name and name != 'stdin' else ctx.origin_file}"
    running = running if running is not None else hashlib.sha256()

    starts: deque[int] = deque()

    # parse chunks of at most PARSE_CHUNK_LINES (the pipeline fills fast), inserts of ``batch_lines`` rows: an
    # insert into `requests` and its views costs a lot per block (1M rows: 3.2 CPU-s in 100k-row blocks, 1.8 in
    # 250k-row blocks, measured here), so chunks are gathered into blocks of about ``batch_lines`` rows
    per_block = -(-batch_lines // PARSE_CHUNK_LINES)
    chunk_lines = -(-batch_lines // per_block)

    def numbered() -> Iterator[tuple[bytes, SourceContext, int, str]]:
        line_no = first_line
        for chunk, n in _chunks(fh, chunk_lines):
            counts.read += n  # counted by the reader, independently of what processing returns
            starts.append(line_no)
            yield chunk, ctx, line_no, source_ref
            line_no += n

    def load(batch: ProcessedBatch, token: str, all_expired: bool,
             marks_: tuple[tuple[int, int, str], ...] = ()) -> None:  # on the inserter thread, in order
        if schema_ready is not None:
            schema_ready()
        dup: Callable[[], int] | None = getattr(store, "duplicated_blocks", None)  # chDB: the only writer
        if not all_expired:
            # A block whose rows are all past the TTLs of requests and of the rollups is not inserted (they would
            # drop it at once): its dedup token stays unused, so after `db migrate --apply-retention` the same
            # file loads it.  A block with any row the rollups keep is inserted (its raw rows past the raw TTL
            # are dropped, their rollups kept; a re-ingest of that block is deduplicated).
            before = dup() if dup is not None and batch.requests.num_rows else None
            store.insert("requests", batch.requests, dedup_token=f"req-{token}")
            if before is not None and dup is not None and dup() > before:
                counts.already_stored += batch.requests.num_rows
        before = dup() if dup is not None and batch.quarantine.num_rows else None
        store.insert("quarantine", batch.quarantine, dedup_token=f"qua-{token}")
        if before is not None and dup is not None and dup() > before:
            counts.already_stored += batch.quarantine.num_rows
        counts.loaded += batch.requests.num_rows
        counts.quarantined += batch.quarantine.num_rows
        counts.by_reason.update(batch.by_reason)
        if checkpoint is not None:
            for m in marks_:
                if m[0] > 0:
                    checkpoint(*m)

    pending: list[ProcessedBatch] = []  # processed chunks of the next insert block
    end_bytes, end_lines = first_byte, first_line  # the input's totals at the end of the last chunk taken
    # the same at the last newline when the last chunk ended without one (the input's last, unterminated line)
    open_tail: tuple[int, int, Any] | None = None
    block_digest = hashlib.sha256()  # the block's dedup token: its chunks' digests
    block_rows = block_gone = 0  # request rows of the block, and how many are past every TTL (raw and rollups)

    def submit(last: bool = False) -> None:
        nonlocal pending, block_digest, block_rows, block_gone
        if not pending:
            return
        gone = 0 < block_rows == block_gone
        if gone:
            counts.blocks_past_retention += 1
        mark: tuple[tuple[int, int, str], ...] = ()
        if checkpoint is not None and not counts.blocks_past_retention:  # none from the first block left out on
            mark = ((end_bytes, end_lines, running.hexdigest()),)
            if last and open_tail is not None:
                # the last line has no newline: a checkpoint at the newline before it too (used once the line is
                # completed), and none past it when the input was cut (the line is read whole from a good copy)
                at_nl = (open_tail[0], open_tail[1], open_tail[2].hexdigest())
                mark = (at_nl,) if damaged is not None and damaged() else (at_nl, *mark)
        inserter.submit(load, _concat(pending), block_digest.hexdigest()[:32], gone, mark)
        pending, block_digest = [], hashlib.sha256()
        block_rows = block_gone = 0

    with _Inserter() as inserter:
        for chunk, batch in (pool or _Pool(processor, 1)).map(numbered()):
            line_no = starts.popleft()
            nbytes = len(chunk)
            counts.bytes_read += nbytes
            if not chunk.endswith(b"\n") and checkpoint is not None:  # the input's last line, unterminated
                cut = chunk.rfind(b"\n") + 1
                at_nl = running.copy()
                at_nl.update(chunk[:cut])
                open_tail = (end_bytes + cut, line_no + batch.read - 1, at_nl)
            end_bytes, end_lines = end_bytes + nbytes, line_no + batch.read
            # the input's hash up to here (hardware-accelerated SHA-256: 2x blake2b here), one pass over the data
            # for the tokens and the ledger; the file's name is not part of it (another spelling, a rotated copy)
            running.update(chunk)
            digest = hashlib.sha256(f"{ctx.site}\0{ctx.origin_host}\0{ctx.format}\0{line_no}\0".encode())
            digest.update(running.copy().digest())
            block_digest.update(digest.digest())
            pending.append(batch)
            block_rows += batch.requests.num_rows
            if retention_days > 0 and batch.requests.num_rows:
                now = time.time()
                ts_ms = pc.cast(batch.requests.column("ts"), "int64")
                counts.expired += int(pc.sum(pc.less(ts_ms, (now - retention_days * 86400) * 1000)).as_py() or 0)
                if skip_days:
                    block_gone += int(pc.sum(pc.less(ts_ms, (now - skip_days * 86400) * 1000)).as_py() or 0)
            if len(pending) >= per_block:
                submit()
            if on_progress:
                on_progress(nbytes)
        submit(last=True)
    counts.seconds = time.perf_counter() - t0
    if counts.read != counts.loaded + counts.quarantined:
        raise RuntimeError(
            f"{counts.name}: {counts.read} lines read but {counts.loaded} loaded + {counts.quarantined} quarantined"
        )
    return counts


def _concat(batches: list[ProcessedBatch]) -> ProcessedBatch:
    """One insert block of consecutive chunks: their rows in order (tables concatenated without copying), their
    counts summed."""
    if len(batches) == 1:
        return batches[0]
    import pyarrow as pa

    by_reason: Counter[str] = Counter()
    for b in batches:
        by_reason.update(b.by_reason)
    return ProcessedBatch(
        requests=pa.concat_tables([b.requests for b in batches]),
        quarantine=pa.concat_tables([b.quarantine for b in batches]),
        stream=pa.concat_tables([b.stream for b in batches]), read=sum(b.read for b in batches),
        loaded=sum(b.loaded for b in batches), quarantined=sum(b.quarantined for b in batches),
        by_reason=dict(by_reason))


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
    threads: int | None = None,
    schema: Future[Any] | None = None,
) -> list[FileCounts]:
    """Ingest every path (``-`` = stdin) in order.  ``on_file(name, size)`` may return a progress callback.

    ``schema``: the store's migrations already running (:func:`~forumpulse.pipeline.store.migrate_in_background`
    with the configured retention); without it they are started here.  Either way parsing starts at once and
    the first insert waits for them; they have ended (or failed) when this returns.

    ``workers``: processes that parse and attribute.  Default: none on machines with 2 cores or fewer (the
    chDB insert needs the other core, and spawning/pickling costs more than it gains: measured with
    ``python -m forumpulse.pipeline.bench_ingest``), else one per core but one for inputs over 32 MiB.
    ``threads``: parse threads in this process when there are no worker processes (default 2: the fast path's
    Arrow/NumPy kernels release the GIL; ``1`` = inline).  Output is the same for any number of either.
    """
    processor = Processor(settings)
    if workers is None:
        cores = os.cpu_count() or 1
        total = sum(Path(p).stat().st_size for p in paths if p != "-" and Path(p).is_file())
        workers = cores - 1 if cores > 2 and (total > 32 << 20 or "-" in paths) else 1
    pool = _Pool(processor, workers, 2 if threads is None else threads)
    pool.start()
    from concurrent.futures import wait

    # while the first chunks are parsed
    migrated = schema or migrate_in_background(store, settings.retention.migration_params())
    try:
        results = _ingest_each(store, settings, processor, pool, paths, fmt, site, origin_host, on_file,
                               migrated.result)
    finally:
        pool.close()
        wait([migrated])  # the migration has ended whatever happened here
    migrated.result()  # its error, also for inputs with nothing to insert
    return results


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
    schema_ready: Callable[[], object] | None = None,
) -> list[FileCounts]:
    results = []
    for path in paths:
        ctx = context_for(path, settings, fmt, site, origin_host)
        if path == "-":
            cb = on_file("stdin", 0) if on_file else None
            results.append(ingest_stream(store, processor, sys.stdin.buffer, ctx, pool=pool,
                                         batch_lines=settings.ingest.batch_lines, on_progress=cb, name="stdin",
                                         schema_ready=schema_ready))
            continue
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{path}: no such file")
        # progress counts decompressed bytes: a .gz has no known total (its size on disk is not comparable)
        cb = on_file(path, 0 if p.suffix in COMPRESSED else p.stat().st_size) if on_file else None
        head, prior = _ledger_lookup(store, p, ctx)
        skip = _known_prefix(p, ctx, prior)
        with _open_maybe_compressed(p) as fh:
            if skip.bytes:
                _skip_bytes(fh, skip.bytes)
                if cb:
                    cb(skip.bytes)
            def checkpoint(nbytes: int, lines: int, sha: str, head: str = head, ctx: SourceContext = ctx,
                           file: str = os.path.abspath(path)) -> None:
                _ledger_record(store, ctx, head, nbytes, lines, sha, file)

            def damaged(fh: Any = fh) -> bool:
                return getattr(fh, "damaged", None) is not None

            c = ingest_stream(store, processor, fh, ctx, batch_lines=settings.ingest.batch_lines, on_progress=cb,
                              name=path, pool=pool, schema_ready=schema_ready, first_line=skip.lines,
                              running=skip.running, first_byte=skip.bytes, checkpoint=checkpoint if head else None,
                              damaged=damaged)
            c.error = getattr(fh, "damaged", None)
        c.skipped, c.skipped_from, c.other_format = skip.lines, skip.source, skip.other_format
        results.append(c)
    return results


# ------------------------------------------------------------------------------------------------ file ledger
#: the ledger's key is the hash of a file's first line, or of its first HEAD_BYTES bytes when that line is longer
HEAD_BYTES = 4096


@dataclass
class _Prior:
    """One row of ``ingest_files``: a load of ``prefix_bytes`` bytes / ``prefix_lines`` lines with that hash."""

    format: str
    prefix_bytes: int
    prefix_lines: int
    prefix_sha256: str
    origin_file: str
    ingested_at: str


@dataclass
class _Skip:
    bytes: int = 0
    lines: int = 0
    running: Any = field(default_factory=hashlib.sha256)  # the hash of the skipped bytes, to be continued
    source: str = ""
    other_format: str = ""


def _ledger_lookup(store: Store, p: Path, ctx: SourceContext) -> tuple[str, list[_Prior]]:
    """The file's head hash ('' for an empty file) and the ledger's rows for it (any format).  A store whose
    ``ingest_files`` does not exist yet (its migration still running on a new store, or about to be added to an
    older one) has none."""
    with _open_maybe_compressed(p) as fh:
        first = fh.read(HEAD_BYTES)
    if not first:
        return "", []
    nl = first.find(b"\n")
    head = hashlib.sha256(first[:nl + 1] if nl >= 0 else first).hexdigest()
    if not int(store.query_rows("EXISTS TABLE ingest_files")[0][0]):
        return head, []
    rows = store.query_rows(
        "SELECT format, prefix_bytes, prefix_lines, prefix_sha256, origin_file, "
        "formatDateTime(ingested_at, '%Y-%m-%d %H:%i UTC') FROM ingest_files "
        f"WHERE site = {sql_string(ctx.site)} AND origin_host = {sql_string(ctx.origin_host)} "
        f"AND head_sha256 = {sql_string(head)} "
        "ORDER BY prefix_bytes, ingested_at")
    return head, [_Prior(str(f), int(b), int(n), str(h), str(o), str(t)) for f, b, n, h, o, t in rows]


def _known_prefix(p: Path, ctx: SourceContext, prior: list[_Prior]) -> _Skip:
    """The longest recorded prefix, in this format, that the file still starts with (its bytes hashed again:
    content decides, not the name).  A prefix ending inside a line (a last line without newline when it was
    loaded) counts only while the file ends there too: once the line was completed, the prefix at the newline
    before it is taken and the line read again.  Also notes a prefix recorded under another format only."""
    skip = _Skip()
    if not prior:
        return skip
    # per recorded length: the hash there, the hash object (to continue), whether a newline ends it, more follows
    at: dict[int, tuple[str, Any, bool, bool]] = {}
    h, pos, last = hashlib.sha256(), 0, b"\n"
    with _open_maybe_compressed(p) as fh:
        for size in sorted({r.prefix_bytes for r in prior}):
            while pos < size:
                piece = fh.read(min(1 << 20, size - pos))
                if not piece:
                    break
                h.update(piece)
                pos += len(piece)
                last = piece[-1:]
            if pos < size:
                break  # the file is shorter than this (and every longer) prefix
            nxt = fh.read(1)
            at[size] = (h.hexdigest(), h.copy(), last == b"\n", bool(nxt))
            if nxt:
                h.update(nxt)
                pos += 1
                last = nxt
    other = ""
    for r in prior:
        got = at.get(r.prefix_bytes)
        if got is None or got[0] != r.prefix_sha256 or not (got[2] or not got[3]):
            continue
        if r.format == ctx.format:
            if r.prefix_bytes > skip.bytes:
                skip = _Skip(r.prefix_bytes, r.prefix_lines, got[1].copy(), f"{r.origin_file}, {r.ingested_at}")
        else:
            other = f"{r.format} ({r.origin_file}, {r.ingested_at}, {r.prefix_lines:,} lines)"
    if not skip.bytes:
        skip.other_format = other
    return skip


def _skip_bytes(fh: BinaryIO, n: int) -> None:
    if hasattr(fh, "seek") and not isinstance(fh, GzipTolerant):
        fh.seek(n)
        return
    while n > 0:
        piece = fh.read(min(1 << 20, n))
        if not piece:
            raise RuntimeError("the file became shorter while it was being read")
        n -= len(piece)


def _ledger_record(store: Store, ctx: SourceContext, head: str, nbytes: int, lines: int, sha: str,
                   file: str) -> None:
    import pyarrow as pa

    store.insert("ingest_files", pa.table({
        "site": [ctx.site], "origin_host": [ctx.origin_host], "format": [ctx.format], "head_sha256": [head],
        "prefix_bytes": pa.array([nbytes], pa.uint64()), "prefix_lines": pa.array([lines], pa.uint64()),
        "prefix_sha256": [sha], "origin_file": [file],
        "ingested_at": pa.array([int(time.time() * 1000)], pa.timestamp("ms", tz="UTC"))}))



class GzipTolerant:
    """A binary reader of a compressed file (``.gz``, ``.bz2``, ``.xz``) that survives a damaged or cut-short
    stream: reading stops at the last byte that could be decompressed, and :attr:`damaged` says why (``None`` for
    an intact file).  Nothing read before the damage is lost: data is taken one decompressed piece at a time
    (``read1``), so an error does not discard what the same ``read`` call had already gathered.  The cut line, if
    any, is the last line (without newline) and is parsed or quarantined like any other."""

    def __init__(self, path: Path) -> None:
        import bz2
        import gzip
        import lzma

        if path.suffix == ".bz2":
            self._f: Any = bz2.open(path, "rb")  # noqa: SIM115 - closed by close() / __exit__
        elif path.suffix in (".xz", ".lzma"):
            self._f = lzma.open(path, "rb")  # noqa: SIM115
        else:
            self._f = gzip.open(path, "rb")  # noqa: SIM115
        self.damaged: str | None = None

    def read(self, n: int = -1) -> bytes:
        import lzma
        import zlib

        if self.damaged is not None:
            return b""
        parts: list[bytes] = []
        got = 0
        try:
            while n < 0 or got < n:
                piece = self._f.read1(-1 if n < 0 else n - got)
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
        except (EOFError, OSError, zlib.error, lzma.LZMAError) as exc:  # gzip.BadGzipFile is an OSError
            self.damaged = (f"the compressed stream is damaged or cut short ({type(exc).__name__}: {exc}); "
                            "the lines before that point were read")
        return b"".join(parts)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> GzipTolerant:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: file name endings read through a decompressor (anything else is read as it is)
COMPRESSED = (".gz", ".bz2", ".xz", ".lzma")


def _open_maybe_compressed(p: Path) -> BinaryIO:
    if p.suffix in COMPRESSED:
        return GzipTolerant(p)  # type: ignore[return-value]
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

