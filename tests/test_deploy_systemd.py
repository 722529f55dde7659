"""deploy/systemd units: structure, `systemd-analyze verify`, and the shell command lines they run.

* every unit parses (configparser, no interpolation) and has what its kind needs: services run an existing
  absolute binary as User=forumpulse (the collector as root), long-running ones restart, timers name a service;
* ``systemd-analyze verify`` accepts every unit (paths mapped onto this checkout; template instantiated);
* the ``/bin/sh -c`` command lines, unescaped the way systemd does (``$$`` -> ``$``, ``%%`` -> ``%``, ``%i``/``%H``),
  run against a recording stand-in for ``forumpulse`` produce the intended arguments;
* every forumpulse subcommand and option used exists in the CLI.
"""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import socket
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/forumpulse/.venv/bin/forumpulse"
CLI = ROOT / ".venv" / "bin" / "forumpulse"


def _parse(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(path.read_text(), source=str(path))
    return cp


def _units(suffix: str) -> list[Path]:
    found = sorted(UNITS.glob(f"*.{suffix}"))
    assert found, f"no *.{suffix} in {UNITS}"
    return found


def _exec_argv(value: str) -> list[str]:
    return shlex.split(value.lstrip("-@+!:"))


def test_services_structure() -> None:
    names = {p.name for p in _units("service")}
    assert {"forumpulse-owner.service", "forumpulse-consumer@.service", "forumpulse-detectors.service",
            "forumpulse-syslog-ng.service"} <= names
    for path in _units("service"):
        cp = _parse(path)
        assert cp.get("Unit", "Description"), path.name
        svc = cp["Service"]
        argv = _exec_argv(svc["ExecStart"])
        exe = argv[0]
        assert exe.startswith("/"), f"{path.name}: ExecStart must be an absolute path"
        real = str(CLI) if exe == INSTALLED else exe
        assert os.access(real, os.X_OK), f"{path.name}: {real} is not executable here"
        oneshot = svc.get("Type") == "oneshot"
        if not oneshot:
            assert svc.get("Restart") in ("always", "on-failure"), path.name
            assert cp.get("Install", "WantedBy") == "multi-user.target", path.name
        if path.name != "forumpulse-syslog-ng.service":
            assert svc.get("User") == "forumpulse" and svc.get("Group") == "forumpulse", path.name
            assert svc.get("NoNewPrivileges") == "yes" and svc.get("ProtectSystem") == "strict", path.name
            assert svc.get("Environment") == "FORUMPULSE_CONFIG=/etc/forumpulse/forumpulse.yaml", path.name
            assert INSTALLED in svc["ExecStart"], path.name


def test_timer_points_at_an_existing_oneshot_service() -> None:
    for path in _units("timer"):
        cp = _parse(path)
        assert cp.get("Timer", "OnUnitActiveSec")
        target = path.with_suffix(".service")
        assert target.exists(), f"{path.name} has no {target.name}"
        assert _parse(target).get("Service", "Type") == "oneshot"
        assert cp.get("Install", "WantedBy") == "timers.target"


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("systemd-analyze")
    if exe is None:  # the structural test above still runs; say clearly what was not checked
        pytest.fail("systemd-analyze not found (apt-get install systemd): units were only checked structurally")
    for path in [*_units("service"), *_units("timer")]:
        name = path.name.replace("@.", "@1.")
        (tmp_path / name).write_text(path.read_text().replace(INSTALLED, str(CLI)))
    units = sorted(str(p) for p in tmp_path.iterdir())
    r = subprocess.run([exe, "verify", *units], capture_output=True, text=True, timeout=120)
    ours = [ln for ln in (r.stdout + r.stderr).splitlines() if "forumpulse" in ln]
    assert r.returncode == 0 and not ours, r.stdout + r.stderr


def _systemd_unescape(cmd: str, instance: str) -> str:
    spec = {"%": "%", "i": instance, "H": socket.gethostname()}

    def one(m: re.Match[str]) -> str:
        assert m.group(1) in spec, f"unexpected specifier %{m.group(1)}"
        return spec[m.group(1)]

    return re.sub(r"%(.)", one, cmd).replace("$$", "$")


def _run_exec(unit: str, tmp_path: Path, instance: str = "1") -> list[str]:
    """Run the unit's /bin/sh -c ExecStart with `forumpulse` replaced by a recorder; return its argv."""
    log = tmp_path / "argv"
    fake = tmp_path / "forumpulse"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done > "{log}"\n')
    fake.chmod(0o755)
    argv = _exec_argv(_parse(UNITS / unit).get("Service", "ExecStart"))
    assert argv[:2] == ["/bin/sh", "-c"], argv
    script = _systemd_unescape(argv[2], instance).replace(INSTALLED, str(fake))
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def test_detectors_command_line_passes_a_window_start(tmp_path: Path) -> None:
    args = _run_exec("forumpulse-detectors.service", tmp_path)
    assert args[:3] == ["detect", "history", "--from"], args
    start = datetime.fromisoformat(args[3]).replace(tzinfo=UTC)
    ago = datetime.now(UTC) - start
    assert timedelta(hours=47, minutes=59) < ago < timedelta(hours=48, minutes=5), args[3]


def test_consumer_instances_get_distinct_ids_and_metrics_ports(tmp_path: Path) -> None:
    a = _run_exec("forumpulse-consumer@.service", tmp_path, "1")
    b = _run_exec("forumpulse-consumer@.service", tmp_path, "2")
    host = socket.gethostname()
    assert a == ["consume", "--instance-id", f"{host}-1", "--metrics-port", "9101"]
    assert b == ["consume", "--instance-id", f"{host}-2", "--metrics-port", "9102"]


def test_forumpulse_commands_and_options_exist() -> None:
    assert CLI.exists(), f"{CLI} missing: run `make install` first"
    for path in _units("service"):
        for key in ("ExecStart", "ExecStartPre"):
            value = _parse(path).get("Service", key, fallback=None)
            if not value or "forumpulse" not in value or INSTALLED not in value:
                continue
            tail = value.split(INSTALLED, 1)[1]
            words = re.findall(r"[^\s'\"]+", tail)
            sub = [w for w in words[:3] if re.fullmatch(r"[a-z]+", w)]
            opts = [w for w in words if w.startswith("--")]
            r = subprocess.run([str(CLI), *sub, "--help"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "COLUMNS": "200"})
            assert r.returncode == 0, f"{path.name}: forumpulse {' '.join(sub)}: {r.stderr[-300:]}"
            for opt in opts:
                assert opt in r.stdout, f"{path.name}: forumpulse {' '.join(sub)} has no {opt}"
