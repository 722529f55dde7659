"""Every thread's CPU seconds at this process's exit, for ``make bench`` (:mod:`forumpulse.pipeline.bench`).

The bench samples ``/proc/<pid>/task/*`` every 0.1 s while a command runs, so CPU a thread used after the last
sample is not attributed (a short ``forumpulse ingest`` does its one insert, with its views, in its last tenth of
a second).  When the environment names a file in ``FP_THREAD_CPU_OUT``, the process writes, at normal interpreter
exit (``atexit``: after ``sys.exit`` too, not after ``os._exit`` or a signal), one JSON object there:
``{"pid": <pid>, "main": <main thread name>, "threads": {<tid>: [<name>, <CPU seconds>]}}``.  Without the variable nothing
happens.  Reads only this process's ``/proc`` files; never raises.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
from pathlib import Path

ENV = "FP_THREAD_CPU_OUT"


def snapshot() -> dict[str, object]:
    """Name and CPU seconds (user + system) of every live thread of this process."""
    tick = os.sysconf("SC_CLK_TCK")
    threads: dict[str, list[object]] = {}
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            f = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            threads[tid] = [comm, (int(f[11]) + int(f[12])) / tick]
    return {"main": Path("/proc/self/comm").read_text().strip(), "threads": threads}


def _write(path: str) -> None:
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps({"pid": os.getpid(), **snapshot()}))


def report_at_exit_if_asked() -> None:
    """Register the exit report when ``FP_THREAD_CPU_OUT`` is set (call early in a command's main; calling it again
    does nothing).  The variable is taken out of this process's environment, so a forumpulse process it starts
    does not write over the same file."""
    path = os.environ.pop(ENV, None)
    if path:
        atexit.register(_write, path)
