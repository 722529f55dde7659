"""deploy/bootstrap-python.sh: what `make` runs before creating .venv on a fresh Debian machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[1] / "deploy" / "bootstrap-python.sh"


def test_nothing_to_do_when_python_can_create_a_venv() -> None:
    r = subprocess.run(["bash", str(SCRIPT), sys.executable], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr


def test_a_python_without_venv_and_no_apt_get_is_a_clear_error(tmp_path: Path) -> None:
    # a python3 whose venv module is missing (as on a fresh Debian), and a PATH without apt-get
    fake = tmp_path / "python3"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": str(tmp_path)}  # bash runs by absolute path; the script finds no apt-get
    r = subprocess.run(["/bin/bash", str(SCRIPT), str(fake)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 1
    assert "python3-venv" in r.stderr
