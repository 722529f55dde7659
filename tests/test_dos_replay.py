"""``forumpulse detect dos`` (the offline replay): its summary says what was not judged, and results do not
depend on how the replay cuts its batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXE = Path(sys.executable).with_name("forumpulse")
COMBINED = '198.51.100.7 - - [01/Mar/2024:12:00:{s:02d} +0000] "GET /t/{i} HTTP/1.1" 200 1234 "-" "Mozilla/5.0"'
HOSTS = 'host{i}.example.net - - [01/Jul/1995:00:00:{s:02d} -0400] "GET /shuttle/ HTTP/1.0" 200 786'


def _replay(tmp_path: Path, text: str, fmt: str) -> tuple[subprocess.CompletedProcess[str], dict[str, object]]:
    (tmp_path / "x.log").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(EXE), "detect", "dos", "-i", "x.log", "-f", fmt], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    summary = next(json.loads(x)["summary"] for x in r.stderr.splitlines() if x.startswith('{"summary"'))
    return r, summary


@pytest.mark.parametrize(("line", "fmt", "counts", "warning"), [
    (COMBINED, "squid", {"lines": 0, "unparsed": 40, "ignored": 0},
     "warning: none of the 40 lines parsed as format 'squid': nothing was judged; check --format"),
    (HOSTS, "common", {"lines": 40, "unparsed": 0, "ignored": 40},
     "warning: none of the 40 parsed lines has a client IP address"),
])
def test_a_replay_that_judges_nothing_says_why(tmp_path: Path, line: str, fmt: str, counts: dict[str, int],
                                               warning: str) -> None:
    r, summary = _replay(tmp_path, "".join(line.format(i=i, s=i % 60) + "\n" for i in range(40)), fmt)
    assert r.returncode == 0, r.stderr
    assert {k: summary[k] for k in counts} == counts
    assert warning in r.stderr and "Traceback" not in r.stderr


def test_a_replay_of_good_lines_warns_nothing(tmp_path: Path) -> None:
    r, summary = _replay(tmp_path, "".join(COMBINED.format(i=i, s=i % 60) + "\n" for i in range(40)), "combined")
    assert summary["ignored"] == 0 and summary["lines"] == 40
    assert "warning" not in r.stderr, r.stderr
