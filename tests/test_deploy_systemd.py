"""deploy/systemd units: structure, `systemd-analyze verify`, and the shell command lines they run.

* every unit parses (sections, ``Key=value`` lines, repeated keys kept) and has what its kind needs: services run
  an existing absolute binary as User=forumpulse (the collector as root), long-running ones restart;
* the owner loads, the detectors unit (detectors + decision service) runs ``--dos --traffic`` in its own process
  on another port, and only there (two DoS detectors would decide twice);
* ``systemd-analyze verify`` accepts every unit (paths mapped onto this checkout; template instantiated);
* the ``/bin/sh -c`` command lines, unescaped the way systemd does (``$$`` -> ``$``, ``%%`` -> ``%``, ``%i``/``%H``),
  run against a recording stand-in for ``forumpulse`` produce the intended arguments;
* every forumpulse subcommand and option used exists in the CLI.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/forumpulse/.venv/bin/forumpulse"
CLI = ROOT / ".venv" / "bin" / "forumpulse"


class Unit:
    """A unit file: section -> key -> values (systemd allows repeated keys, e.g. EnvironmentFile)."""

    def __init__(self, path: Path) -> None:
        self.sections: dict[str, dict[str, list[str]]] = {}
        current: dict[str, list[str]] | None = None
        for no, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            m = re.fullmatch(r"\[([A-Za-z]+)\]", line)
            if m:
                assert m.group(1) not in self.sections, f"{path.name}:{no}: section [{m.group(1)}] twice"
                current = self.sections[m.group(1)] = {}
                continue
            assert current is not None, f"{path.name}:{no}: key outside a section"
            key, sep, value = line.partition("=")
            assert sep and re.fullmatch(r"[A-Za-z]+", key), f"{path.name}:{no}: not Key=value: {raw!r}"
            current.setdefault(key, []).append(value)

    def get(self, section: str, key: str, fallback: str | None = None) -> str | None:
        values = self.sections.get(section, {}).get(key)
        return values[-1] if values else fallback

    def all(self, section: str, key: str) -> list[str]:
        return self.sections.get(section, {}).get(key, [])


def _parse(path: Path) -> Unit:
    return Unit(path)


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
        svc = {k: v[-1] for k, v in cp.sections["Service"].items()}
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
            assert "FORUMPULSE_CONFIG=/etc/forumpulse/forumpulse.yaml" in cp.all("Service", "Environment"), path.name
            assert INSTALLED in svc["ExecStart"], path.name
            if not oneshot:  # a bad configuration fails the unit's start, with `key: reason` in the journal
                assert f"{INSTALLED} config check" in " ".join(cp.all("Service", "ExecStartPre")), path.name


def _argv(unit: str) -> list[str]:
    value = _parse(UNITS / unit).get("Service", "ExecStart")
    assert value
    return _exec_argv(value)


def _opt(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_owner_loads_and_detectors_run_in_their_own_process() -> None:
    owner, det = _argv("forumpulse-owner.service"), _argv("forumpulse-detectors.service")
    assert owner[1:2] == ["run"] and "--consume" in owner
    assert "--dos" not in owner and "--traffic" not in owner
    assert det[1:2] == ["run"] and {"--dos", "--traffic"} <= set(det) and "--consume" not in det
    assert _opt(owner, "--port") != _opt(det, "--port")
    assert _opt(owner, "--host") == _opt(det, "--host") == "127.0.0.1"
    assert _opt(owner, "--password-env") == "FORUMPULSE_OWNER_PASSWORD"
    # the owner's clients read the client env file (the owner's endpoint URL) after the shared one
    for unit in ("forumpulse-detectors.service", "forumpulse-consumer@.service"):
        assert _parse(UNITS / unit).all("Service", "EnvironmentFile") == [
            "/etc/forumpulse/forumpulse.env", "-/etc/forumpulse/clients.env"], unit
    assert _parse(UNITS / "forumpulse-owner.service").all("Service", "EnvironmentFile") == [
        "/etc/forumpulse/forumpulse.env"]


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = shutil.which("systemd-analyze")
    if exe is None:  # the structural test above still runs; say clearly what was not checked
        pytest.fail("systemd-analyze not found (apt-get install systemd): units were only checked structurally")
    for path in _units("service"):
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
    argv = _argv(unit)
    assert argv[:2] == ["/bin/sh", "-c"], argv
    script = _systemd_unescape(argv[2], instance).replace(INSTALLED, str(fake))
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines()


def test_consumer_instances_get_distinct_ids_and_metrics_ports(tmp_path: Path) -> None:
    a = _run_exec("forumpulse-consumer@.service", tmp_path, "1")
    b = _run_exec("forumpulse-consumer@.service", tmp_path, "2")
    host = socket.gethostname()
    assert a == ["consume", "--instance-id", f"{host}-1", "--metrics-port", "9101"]
    assert b == ["consume", "--instance-id", f"{host}-2", "--metrics-port", "9102"]


def test_forumpulse_commands_and_options_exist() -> None:
    assert CLI.exists(), f"{CLI} missing: run `make install` first"
    for path in _units("service"):
        for value in _parse(path).all("Service", "ExecStart") + _parse(path).all("Service", "ExecStartPre"):
            if INSTALLED not in value:
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


def test_collector_file_limit_and_writable_native_cache() -> None:
    """The collector follows up to fp_max_files files (plus sockets): systemd's default soft limit of 1024 open
    files is too few.  Units with ProtectSystem=strict and a read-only home get a writable cache directory for the
    native scanner (pipeline/native: $XDG_CACHE_HOME/forumpulse)."""
    collector = _parse(UNITS / "forumpulse-syslog-ng.service")
    conf = (ROOT / "syslog-ng" / "forumpulse.conf").read_text()
    max_files = int(re.search(r'^@define fp_max_files "(\d+)"$', conf, re.M).group(1))  # type: ignore[union-attr]
    assert int(collector.get("Service", "LimitNOFILE") or 0) >= 4 * max_files
    for path in sorted(UNITS.glob("*.service")):
        unit = _parse(path)
        if unit.get("Service", "ProtectSystem") != "strict":
            continue
        writable = unit.all("Service", "ReadWritePaths")
        if any(w.split() and w.split()[0] == "/var/lib/forumpulse" for w in writable):
            continue  # the home (~/.cache) is writable
        assert unit.get("Service", "CacheDirectory") == "forumpulse", path.name
        env = dict(e.split("=", 1) for v in unit.all("Service", "Environment") for e in shlex.split(v))
        assert env.get("XDG_CACHE_HOME") == "/var/cache/forumpulse", path.name


def test_the_dos_spool_is_writable_where_detection_runs() -> None:
    """A unit that runs ``--dos`` under ProtectSystem=strict may write its spool (decisions the store had not taken
    at a stop, detectors.live.spool_dir relative to WorkingDirectory): otherwise they are lost at every owner
    restart the detectors' store (the owner's endpoint) goes through."""
    from forumpulse.pipeline.live_detect import LiveConfig

    checked = 0
    for path in sorted(UNITS.glob("*.service")):
        unit = _parse(path)
        if "--dos" not in (unit.get("Service", "ExecStart") or ""):
            continue
        spool = Path(unit.get("Service", "WorkingDirectory") or "/") / LiveConfig().spool_dir
        writable = [Path("/var/lib") / d for v in unit.all("Service", "StateDirectory") for d in v.split()]
        writable += [Path(w.lstrip("-")) for v in unit.all("Service", "ReadWritePaths") for w in v.split()]
        assert unit.get("Service", "ProtectSystem") != "strict" or any(
            spool == w or w in spool.parents for w in writable), (path.name, spool, writable)
        checked += 1
    assert checked >= 1
