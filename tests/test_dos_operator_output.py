"""Operator-facing output: no stray driver warning before the one-line store error, LAPI's ``GET /v1/decisions``
without a filter, and a replay's ``created_at`` in stream time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from forumpulse.detectors.decision_api import DecisionApiServer, DecisionRegistry
from forumpulse.detectors.dos import Decision

EXE = Path(sys.executable).with_name("forumpulse")
T0 = 1_760_000_000.0


def _ban(value: str) -> Decision:
    at = int(T0 * 1000)
    return Decision(id=f"ban-{value}", created_at=at, decided_at=at, first_seen=at, expires_at=at + 600_000,
                    site="forum", action="ban", value=value, scope="range" if "/" in value else "ip",
                    reason="client_flood", duration_s=600, mode="enforce", origin="forumpulse", evidence={})


def test_decisions_without_a_filter_are_every_active_decision_as_lapi_answers() -> None:
    """CrowdSec's GetDecision runs the query with the request's filters: none -> every active decision (JSON
    null when there is none).  forumpulse answered null whatever it held."""
    reg = DecisionRegistry(clock=lambda: T0 + 10)
    api = DecisionApiServer(reg, "k9", "127.0.0.1", 0).start()

    def get(path: str) -> object:
        req = urllib.request.Request(f"http://127.0.0.1:{api.port}{path}", headers={"X-Api-Key": "k9"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read())

    try:
        assert get("/v1/decisions") is None
        reg.ban(_ban("198.51.100.7"))
        reg.ban(_ban("203.0.113.0/24"))
        got = get("/v1/decisions")
        assert isinstance(got, list) and sorted(d["value"] for d in got) == ["198.51.100.7", "203.0.113.0/24"]
        assert [d["value"] for d in get("/v1/decisions?ip=203.0.113.9")] == ["203.0.113.0/24"]  # type: ignore[union-attr]
        assert get("/v1/decisions?ip=192.0.2.1") is None
    finally:
        api.stop()


def test_no_driver_warning_before_the_store_in_use_message(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom forumpulse.pipeline.store import "
                               f"open_store\ns = open_store('chdb:{tmp_path / 'st'}')\nprint('open', flush=True)\n"
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
        for cmd in (["detect", "decisions"], ["detect", "unban", "198.51.100.7"]):
            r = subprocess.run([str(EXE), *cmd, "--store", f"chdb:{tmp_path / 'st'}", "--owner",
                                "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120, env=env)
            assert r.returncode == 3, r.stderr
            assert "Unexpected Http Driver Exception" not in r.stderr
            assert r.stderr.strip().startswith("error: the chDB data folder") and "No owner answers" in r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_replay_created_at_is_stream_time(tmp_path: Path) -> None:
    """build_detector's docstring: a replay of old logs stamps created_at with stream time, so its bans are not
    in force today.  detect dos printed the wall clock."""
    line = '198.51.100.7 - - [01/Mar/2024:12:00:{s:02d} +0000] "GET /search.php HTTP/1.1" 200 1 "-" "Mozilla/5.0"'
    (tmp_path / "f.log").write_text("".join(line.format(s=i // 25) + "\n" for i in range(75)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(EXE), "detect", "dos", "-i", "f.log", "-f", "combined"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env=env)
    d = json.loads(r.stdout.splitlines()[0])
    assert d["created_at"] == d["decided_at"] == "2024-03-01T12:00:01.000Z", d
