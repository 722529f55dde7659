"""``deploy/syslog-ng/syslogng.sh render``: the heartbeat command.

syslog-ng runs ``program()`` sources again as soon as they exit; one whose command does not exist is forked many
times a second with nothing in its log, and no heartbeat is ever sent (every source then reads as dead).  So the
render defaults ``fp_heartbeat_cmd`` to the ``heartbeat.sh`` next to the template and refuses a command that is not
an executable file.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SH = ROOT / "deploy" / "syslog-ng" / "syslogng.sh"
TEMPLATE = ROOT / "syslog-ng" / "forumpulse.conf"


def _render(tmp: Path, config: Path, *defines: str) -> subprocess.CompletedProcess[str]:
    assert shutil.which("syslog-ng"), "syslog-ng not found: apt-get install syslog-ng-core syslog-ng-mod-rdkafka"
    args = ["bash", str(SH), "render", "--config", str(config), "--dir", str(tmp / "out")]
    for d in defines:
        args += ["--define", d]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def _define(conf: Path, name: str) -> str:
    for line in conf.read_text().splitlines():
        parts = line.split(None, 2)
        if parts[:2] == ["@define", name]:
            return parts[2].strip('"')
    raise AssertionError(f"no @define {name}")


def test_the_heartbeat_next_to_the_template_is_the_default(tmp_path: Path) -> None:
    r = _render(tmp_path, TEMPLATE)
    assert r.returncode == 0, r.stderr
    assert _define(Path(r.stdout.strip()), "fp_heartbeat_cmd") == str(ROOT / "syslog-ng" / "heartbeat.sh")


def test_an_explicit_heartbeat_command_is_kept(tmp_path: Path) -> None:
    hb = tmp_path / "hb.sh"
    hb.write_text("#!/bin/sh\nsleep 1000\n")
    hb.chmod(0o755)
    r = _render(tmp_path, TEMPLATE, f"fp_heartbeat_cmd={hb}")
    assert r.returncode == 0, r.stderr
    assert _define(Path(r.stdout.strip()), "fp_heartbeat_cmd") == str(hb)


def test_a_heartbeat_command_that_cannot_run_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "forumpulse.conf"  # a template copied alone: its default path is not installed here
    shutil.copy(TEMPLATE, copy)
    r = _render(tmp_path, copy)
    assert r.returncode != 0
    assert "fp_heartbeat_cmd is not an executable file: /usr/share/forumpulse/syslog-ng/heartbeat.sh" in r.stderr
    assert not (tmp_path / "out" / "syslog-ng.conf").exists()
    r = _render(tmp_path, TEMPLATE, f"fp_heartbeat_cmd={tmp_path / 'missing.sh'}")
    assert r.returncode != 0 and "missing.sh" in r.stderr
