"""Process-wide runtime tuning for the long batch jobs (``forumpulse ingest``) and the long-running processes.

:func:`tune_allocator` keeps freed memory in the process instead of handing it back to the kernel after every
chunk.  Ingestion allocates and frees buffers of tens of MiB per chunk (the file block, its lines, the Arrow
columns); by default glibc serves those with fresh ``mmap`` pages, which the kernel must fault in and zero on
every use.  Measured on the 1M-line simulated log: system CPU time of the processing roughly halved.  The price
is a resident set that stays near its peak until exit, which a batch job does not mind; long-running services
should not call it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os


def error_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of ``exc``'s message, at most ``limit`` characters, for a log line; an exception without a
    message (``TimeoutError()``, or a wrapper of one such as ``StoreError``) by that type's name.
    ``str(exc).splitlines()[0]`` raised IndexError there, inside the handler that was logging the error."""
    lines = str(exc).splitlines()
    if lines and lines[0].strip():
        return lines[0][:limit]
    # a wrapper whose message starts with its cause's empty text (StoreError(f"{exc}\nSQL: ...")): the cause's type
    cause = exc.__cause__ or exc.__context__
    return type(cause if cause is not None and not str(cause).strip() else exc).__name__[:limit]


_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


def tune_allocator() -> bool:
    """Ask glibc to serve allocations up to 32 MiB from the heap and keep up to 256 MiB of freed heap; make
    pyarrow allocate from jemalloc and keep dirty pages for 10 s.  Returns whether glibc accepted (False elsewhere, harmless)."""
    ok = False
    name = ctypes.util.find_library("c")
    if name:
        try:
            libc = ctypes.CDLL(name)
            ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)) \
                and bool(libc.mallopt(_M_TOP_PAD, 256 << 20))
        except (OSError, AttributeError):
            ok = False
    use_jemalloc()
    return ok


def use_jemalloc() -> bool:
    """Make pyarrow allocate from jemalloc, keeping freed pages for 10 s.  Returns False (and changes nothing)
    for a pyarrow built without jemalloc.

    Arrow's default pool is mimalloc in current wheels; jemalloc with a 10 s decay reuses the buffers of the
    previous chunk instead of faulting fresh pages in: the parse step of the 1M-line simulated log took 5.5-5.7
    CPU-s against 6.2-6.3 with mimalloc (alternating runs, same code).  Safe for long-running processes (the
    consumer): memory is returned to the kernel 10 s after it was freed."""
    try:
        import pyarrow as pa

        pa.set_memory_pool(pa.jemalloc_memory_pool())
        pa.jemalloc_set_decay_ms(10_000)
    except Exception:
        return False
    return True


#: allocations of container objects between two young-generation collections (CPython's default: 700)
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Run CPython's cyclic garbage collector less often, and never over what exists now (modules, rules).

    The fast path creates tens of thousands of short-lived tuples per chunk (one per distinct request, referer,
    user agent); with the default thresholds they trigger a full collection every ~70k allocations, and each
    full collection walks every tracked object of the process (~80k after start-up: pyarrow, pandas, pydantic,
    the rules), holding the GIL: measured on 900k simulated combined lines in one thread, 6 full collections
    took 0.22 s of 2.1 s.  With a young-generation threshold of 20,000: 0.02 s (tests/test_runtime.py checks
    the setting; ``make bench`` the effect).  The processing makes almost no reference cycles, so memory held
    by cyclic garbage stays small.  Safe for long-running processes; call it once, after the imports.
    """
    gc.freeze()  # what start-up made lives for the whole process: keep it out of every later collection
    _g0, g1, g2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, g1, g2)


def start_service(log: logging.Logger) -> None:
    """The start of a long-running process (``forumpulse consume``, the owner): logging at
    ``$FORUMPULSE_LOG_LEVEL`` (INFO), :func:`use_jemalloc`, :func:`tune_gc` (after the imports made so far), and
    one log line saying whether the parser's compiled byte loops are in use (``unavailable: ...`` says why: the
    numpy path is used then).  ``log``: the process's logger."""
    logging.basicConfig(level=os.environ.get("FORUMPULSE_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    use_jemalloc()
    tune_gc()
    from forumpulse.pipeline import native

    log.info("parser byte loops: %s", native.status())


class _Refuse:
    """A meta-path finder that refuses some top-level modules (and their submodules)."""

    def __init__(self, names: tuple[str, ...], why: str) -> None:
        self.names = names
        self.why = why

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".", 1)[0] in self.names:
            raise ImportError(f"{name} is not loaded in this process: {self.why}", name=name)
        return None


def without_modules(*names: str, why: str) -> None:
    """Make ``import`` of the top-level modules ``names`` (and their submodules) raise ``ImportError`` with ``why``
    for the rest of the process; modules already imported are not affected.  For batch commands that never use
    them and would otherwise pay for an import a library makes on its own.

    ``forumpulse ingest`` uses it for pandas: pyarrow imports pandas (when installed) the first time it converts
    anything (``pa.array``, even of a NumPy array), only to ask whether the input is a pandas object, and ingest
    never hands it one.  Measured here: the import is 0.15-0.2 s of each run's start-up (5 alternating runs on a
    1,000-line file: 1.17-1.24 s with pandas, 1.03-1.08 s without, one run equal), about 4% of a 1M-line ingest;
    the stored rows are the same.  Not for processes that run detectors or reports: they use pandas.
    """
    import sys

    sys.meta_path.insert(0, _Refuse(tuple(names), why))
