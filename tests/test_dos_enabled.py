"""``detectors.dos.enabled: false`` does what an operator expects: the live service starts nothing and says so;
the offline replay (``forumpulse detect dos``) still runs and notes that the live service is off."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from forumpulse.pipeline.config import load_settings
from forumpulse.pipeline.live_detect import LiveHandles, dos_service

EXE = Path(sys.executable).with_name("forumpulse")


def _line(t: int, ip: str = "198.51.100.7") -> str:
    return f'{ip} - - [01/Mar/2024:12:00:{t // 25:02d} +0000] "GET /search.php HTTP/1.1" 200 1234 "-" "Mozilla/5.0"'


def test_disabled_dos_service_starts_nothing_and_says_so(monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("FORUMPULSE_DETECTORS__DOS__ENABLED", "false")
    settings = load_settings(None)
    ctx = SimpleNamespace(settings=settings, store=None, routes={}, hooks=[], threads=[], collectors=[],
                          stop=threading.Event(), consume=True, password=None)
    handles = LiveHandles()
    with caplog.at_level(logging.WARNING, logger="forumpulse.live_detect"):
        dos_service(handles=handles)(ctx)
    assert handles.dos is None and handles.feed is None and handles.api is None
    assert ctx.routes == {} and ctx.hooks == [] and ctx.threads == [] and ctx.collectors == []
    assert any("detectors.dos.enabled: false" in r.getMessage() for r in caplog.records), caplog.text


def test_replay_with_dos_disabled_notes_it_and_still_replays(tmp_path: Path) -> None:
    (tmp_path / "flood.log").write_text("\n".join(_line(i) for i in range(75)) + "\n")
    (tmp_path / "fp.yaml").write_text("detectors:\n  dos:\n    enabled: false\n")
    r = subprocess.run([str(EXE), "detect", "dos", "-i", "flood.log", "-f", "combined", "-c", "fp.yaml"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: detectors.dos.enabled is false" in r.stderr and "Traceback" not in r.stderr
    assert '"reason": "client_flood"' in r.stdout
