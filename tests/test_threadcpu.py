"""The bench's per-thread CPU split: a short command's last work is counted (its exit report), by thread kind."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from forumpulse.pipeline.bench import run_measured

# A thread named like a chDB pool thread burns 0.3 CPU-s and stays alive; the process exits as soon as the burn
# ends, so the /proc sampler (every 0.1 s) cannot have seen all of it: only the exit report has.
CHILD = textwrap.dedent("""
    import threading, time, sys
    from pathlib import Path
    from forumpulse.pipeline.threadcpu import report_at_exit_if_asked
    report_at_exit_if_asked()
    done = threading.Event()
    def work():
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("ThreadPool")
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:
            pass
        done.set()
        threading.Event().wait()
    threading.Thread(target=work, daemon=True).start()
    done.wait()
    sys.exit(0)
""")


def test_exit_report_counts_the_last_work_of_a_short_command(tmp_path: Path) -> None:
    m = run_measured([sys.executable, "-c", CHILD], log_dir=tmp_path)
    assert m.rc == 0, m.err
    t = m.threads_cpu_s
    assert t.get("chDB", 0.0) >= 0.28, t  # all 0.3 s (end to end; what the report adds: the test below)
    assert sum(t.values()) <= m.cpu_s + 0.05, (t, m.cpu_s)
    assert not list(tmp_path.glob("child-*")), "the measurement's files are removed"



def test_the_exit_report_adds_only_what_the_samples_missed(tmp_path: Path) -> None:
    import json

    from forumpulse.pipeline.bench import _add_exit_report

    report = tmp_path / "r.json"
    report.write_text(json.dumps({"pid": 7, "main": "forumpulse", "threads": {
        "7": ["forumpulse", 2.0],      # sampled at 1.5: +0.5 interpreter
        "8": ["ThreadPool", 0.75],     # never sampled (started after the last sample): +0.75 chDB
        "9": ["MergeMutate", 0.25],    # sampled at exactly this value: +0
    }}))
    seen = {(7, 7): 1.5, (7, 9): 0.25, (7, 10): 3.0}  # tid 10 ended before the exit: its samples stand
    by_kind = {"interpreter": 1.5, "chDB merges": 0.25, "chDB": 3.0}
    _add_exit_report(report, seen, by_kind)
    assert by_kind == {"interpreter": 2.0, "chDB merges": 0.25, "chDB": 3.75}
    assert seen[(7, 8)] == 0.75
    _add_exit_report(tmp_path / "absent.json", seen, by_kind)  # a command that wrote none: nothing changes
    assert by_kind == {"interpreter": 2.0, "chDB merges": 0.25, "chDB": 3.75}


def test_the_report_is_registered_once_and_not_passed_to_child_processes(tmp_path: Path,
                                                                         monkeypatch: Any) -> None:
    import atexit
    import os

    from forumpulse.pipeline import threadcpu

    registered: list[tuple[Any, ...]] = []
    monkeypatch.setattr(atexit, "register", lambda *a: registered.append(a))
    monkeypatch.setenv(threadcpu.ENV, str(tmp_path / "out.json"))
    threadcpu.report_at_exit_if_asked()
    threadcpu.report_at_exit_if_asked()  # a command's main and the consumer both ask: one report
    assert registered == [(threadcpu._write, str(tmp_path / "out.json"))]
    assert threadcpu.ENV not in os.environ  # a forumpulse process started from here does not overwrite it
