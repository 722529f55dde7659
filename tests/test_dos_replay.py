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


T0_MS = 1_709_294_400_000  # 2024-03-01T12:00:00Z


def _flood(ip: str, start_s: float, seconds: float, rate: float = 25.0) -> list:
    from forumpulse.detectors.eval_dos import rec

    return [rec(T0_MS + int((start_s + i / rate) * 1000), ip, "/search.php") for i in range(int(rate * seconds))]


def _background(seconds: int) -> list:
    from forumpulse.detectors.eval_dos import rec

    return [rec(T0_MS + t * 1000, "203.0.113.10", f"/viewtopic.php?t={t % 7}") for t in range(seconds)]


def _decide(records: list, batch_lines: int, **cfg: object) -> list[tuple[str, str, str, int, int, int]]:
    from forumpulse.detectors.dos import DecisionManager, DosDetector, detect_records
    from forumpulse.detectors.dos_rules import DosConfig
    from forumpulse.detectors.eval_dos import ordered

    det = DosDetector(manager=DecisionManager(DosConfig(crawlers={"verify": "off"}, **cfg)))  # type: ignore[arg-type]
    return [(d.value, d.reason, d.mode, (d.decided_at - T0_MS) // 1000, d.duration_s, d.evidence["offence"])
            for d in detect_records(ordered(records), det, batch_lines=batch_lines)]


def test_a_repeat_offence_after_the_ban_expired_is_decided_whatever_the_batch_size() -> None:
    """198.51.100.7 floods at t=10 s and again at t=1000 s: a second ban (offence 2, 4x as long) -- the replay's
    50,000-line batches used to make one decision per address, rule and batch, so only 100-line batches saw it."""
    records = _flood("198.51.100.7", 10, 3) + _flood("198.51.100.7", 1000, 3) + _background(1100)
    want = [("198.51.100.7", "client_flood", "enforce", 11, 600, 1),
            ("198.51.100.7", "client_flood", "enforce", 1001, 2400, 2)]
    for batch_lines in (50_000, 100, 7):
        assert _decide(records, batch_lines) == want, batch_lines


def test_breaker_held_offenders_are_banned_in_a_later_minute_whatever_the_batch_size() -> None:
    """max_bans_per_minute 3, six addresses flooding at 20-26 s and again at 70-76 s: 3 bans and 3 breaker
    records in the first minute, the 3 held back banned in the next (one batch used to lose them)."""
    records = [r for k in range(6) for start in (20, 70) for r in _flood(f"198.51.100.{20 + k}", start + k, 3)]
    records += _background(200)
    got = {n: _decide(records, n, max_bans_per_minute=3) for n in (50_000, 100, 7)}
    assert got[50_000] == got[100] == got[7]
    modes = [(v, m, at // 60) for v, _, m, at, _, _ in got[50_000]]
    assert modes == [(f"198.51.100.{20 + k}", "enforce" if k < 3 else "breaker", 0) for k in range(6)] + [
        (f"198.51.100.{20 + k}", "enforce", 1) for k in range(3, 6)]


def test_a_flood_that_outlasts_its_ban_is_banned_again_when_the_ban_ends() -> None:
    """A flood going on for 1,500 s in one batch: banned at once, and again the second its 600 s ban ended (as
    live batches do), not when the next batch starts."""
    got = _decide(_flood("198.51.100.9", 0, 1500, rate=22.0), 50_000)
    assert [(at, dur, off) for _, _, _, at, dur, off in got] == [(1, 600, 1), (602, 2400, 2)]
