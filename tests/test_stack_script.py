"""deploy/stack.sh (`make up | status | down`) on free ports in a temporary folder: the real Kafka, the real
syslog-ng and the owner process come up, lines appended to a watched vhost log and sent to the raw TCP port become
exactly those rows, `status` reads the owner's own /fp/health, and `down` stops everything it started."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from live_stack import ensure_kafka_installed, ensure_syslogng_installed, free_ports, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.syslogng]
ROOT = Path(__file__).parents[1]


def _line(i: int, tag: str) -> str:
    ts = datetime.now(UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
    return (f'198.51.100.{i % 50 + 1} - - [{ts}] "GET /threads/stack-test.{7000 + i % 3}/?{tag}={i} HTTP/1.1" 200 '
            f'{100 + i} "-" "Mozilla/5.0 (X11; Linux x86_64) stacktest"')


def _query(port: int, sql: str) -> list[list[object]]:
    url = f"http://127.0.0.1:{port}/?" + urllib.parse.urlencode({"database": "forumpulse",
                                                                 "default_format": "JSONCompact"})
    with urllib.request.urlopen(urllib.request.Request(url, data=sql.encode()), timeout=30) as r:
        return json.loads(r.read())["data"]  # type: ignore[no-any-return]


def _stack(cmd: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "deploy" / "stack.sh"), cmd], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_up_status_down_and_appended_lines_become_exactly_those_rows(tmp_path: Path) -> None:
    ensure_kafka_installed()
    ensure_syslogng_installed()
    kp, kcp, http, raw, s3164, s5424 = free_ports(6)
    run = tmp_path / "run"
    env = {**os.environ, "FP_STACK_DIR": str(run), "FP_KAFKA_PORT": str(kp), "FP_KAFKA_CONTROLLER_PORT": str(kcp),
           "FP_HTTP_PORT": str(http), "FP_RAW_TCP_PORT": str(raw), "FP_SYSLOG_PORT": str(s3164),
           "FP_SYSLOG5424_PORT": str(s5424), "FP_HEARTBEAT_S": "2", "FP_RAW_SITE": "raw.example.org",
           "FP_RAW_FORMAT": "nginx_combined"}
    try:
        up = _stack("up", env, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "owner started" in up.stdout
        pid = int((run / "owner.pid").read_text())
        # the store URL `up` prints for other commands (the owner holds the folder); a history run uses it below
        url = up.stdout.split("other commands: --store ", 1)[1].split()[0]
        assert url == f"clickhouse://default@127.0.0.1:{http}/forumpulse", up.stdout
        assert f"detect decisions / detect unban: --owner http://127.0.0.1:{http}" in up.stdout
        fp = Path(__file__).resolve().parents[1] / ".venv" / "bin" / "forumpulse"
        st = _stack("status", env)
        assert st.returncode == 0, st.stdout + st.stderr
        assert f'"pid": {pid}' in st.stdout and '"status": "ok"' in st.stdout
        # a fresh shell without the FP_* ports: status looks where `up` started the stack (run/stack.env)
        bare = {k: v for k, v in env.items() if k not in ("FP_HTTP_PORT", "FP_KAFKA_PORT", "FP_KAFKA_CONTROLLER_PORT")}
        st = _stack("status", bare)
        assert st.returncode == 0 and f'"pid": {pid}' in st.stdout, st.stdout + st.stderr

        vhosts = run / "logs" / "vhosts"
        vhosts.mkdir(parents=True, exist_ok=True)
        from_file = [_line(i, "file") for i in range(300)]
        with (vhosts / "forum.example.org.access.log").open("a") as f:
            f.writelines(x + "\n" for x in from_file)
        from_tcp = [_line(i, "tcp") for i in range(120)]
        with socket.create_connection(("127.0.0.1", raw)) as s:
            s.sendall("".join(x + "\n" for x in from_tcp).encode())
        want = len(from_file) + len(from_tcp)

        def landed() -> bool:
            return int(_query(http, "SELECT count() FROM requests")[0][0]) >= want  # type: ignore[call-overload]

        wait_until(landed, 180, every_s=1.0, what=f"{want} rows through syslog-ng -> Kafka -> owner")
        time.sleep(2)  # anything extra (a double) would land by now
        rows = _query(http, "SELECT site, origin_file, url, bytes, source_format FROM requests")
        assert len(rows) == want
        assert int(_query(http, "SELECT count() FROM quarantine")[0][0]) == 0  # type: ignore[call-overload]
        got_file = sorted(str(r[2]) for r in rows if str(r[1]).endswith("forum.example.org.access.log"))
        got_tcp = sorted(str(r[2]) for r in rows if str(r[1]) == f"tcp:{raw}")
        assert got_file == sorted(x.split('"')[1].split()[1] for x in from_file)
        assert got_tcp == sorted(x.split('"')[1].split()[1] for x in from_tcp)
        assert {r[0] for r in rows if str(r[1]).endswith(".access.log")} == {"forum.example.org"}
        assert {r[0] for r in rows if str(r[1]) == f"tcp:{raw}"} == {"raw.example.org"}  # FP_RAW_SITE
        # FP_RAW_FORMAT: the raw lines are parsed as the format it names (the vhost files keep theirs)
        assert {r[4] for r in rows if str(r[1]) == f"tcp:{raw}"} == {"nginx_combined"}
        assert "nginx_combined" not in {r[4] for r in rows if str(r[1]).endswith(".access.log")}
        # a history run through that URL (no --from: the last day) reads the rows just loaded: both sites' data
        hist = subprocess.run([str(fp), "detect", "history", "--dry-run", "--store", url],
                              capture_output=True, text=True, timeout=300)
        assert hist.returncode == 0, hist.stdout + hist.stderr
        assert "forum.example.org" in hist.stdout + hist.stderr and "raw.example.org" in hist.stdout + hist.stderr, (
            hist.stdout + hist.stderr)
        # ops retire the raw sender through the same URL (a write through the owner): the owner's /fp/sources then
        # shows it retired (until it sends again, as it does below)
        [[sender]] = _query(http, f"SELECT any(origin_host) FROM requests WHERE origin_file = 'tcp:{raw}'")
        ret = subprocess.run([str(fp), "sources", "retire", f"{sender}/tcp:{raw}", "--site", "raw.example.org",
                              "--store", url], capture_output=True, text=True, timeout=300)
        assert ret.returncode == 0, ret.stdout + ret.stderr

        def raw_state() -> str | None:  # (the consumer writes liveness rows every stats interval)
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/fp/sources", timeout=10) as r:
                return {(s["site"], s["origin_file"]): s["state"] for s in json.loads(r.read())}.get(
                    ("raw.example.org", f"tcp:{raw}"))

        wait_until(lambda: raw_state() is not None, 60, every_s=1.0, what="the raw sender on /fp/sources")
        assert raw_state() == "retired"
        topics = dict(_query(http, "SELECT topic_id, count() FROM requests GROUP BY topic_id"))  # type: ignore[arg-type]
        assert set(map(int, topics)) == {7000, 7001, 7002}
        # status lists the sources (the vhost file is live: lines just now) and the owner runs the detectors
        st = _stack("status", env)
        assert st.returncode == 0, st.stdout + st.stderr
        src = [ln.split() for ln in st.stdout.split("== sources", 1)[1].splitlines()[1:] if ".access.log" in ln]
        assert any(x[0] == "live" and x[3].endswith("forum.example.org.access.log") for x in src), st.stdout
        assert "== DoS decisions in force" in st.stdout and "   (none)" in st.stdout.split("== DoS", 1)[1], st.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/fp/decisions", timeout=10) as r:  # served by --dos
            assert r.status == 200 and json.loads(r.read()) == []
        # the DoS feed reads the stack's own broker (with --bootstrap it went to 127.0.0.1:9092 before).  It starts
        # at the topic's end when it joins (feed_start: latest), which on a loaded machine can be after the lines
        # above: a line is sent at every poll until it judges some
        sent = [0]

        def dos_judged() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10) as r:
                body = r.read().decode()
            got = [float(ln.split()[1]) for ln in body.splitlines() if ln.startswith("forumpulse_dos_lines_total ")]
            if got and got[0] > 0:
                return True
            with socket.create_connection(("127.0.0.1", raw)) as s:
                s.sendall((_line(sent[0], "dos") + "\n").encode())
            sent[0] += 1
            return False

        wait_until(dos_judged, 180, every_s=1.0, what="lines judged by the owner's DoS feed")
    finally:
        down = _stack("down", env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "owner stopped" in down.stdout
    after = _stack("status", env)
    assert after.returncode != 0 and "owner not running" in after.stdout


def _left_running(marker: str, wait_s: float = 3.0) -> list[str]:
    """Command lines of processes (other than this one) that mention ``marker``, after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit() and int(d.name) != os.getpid():
                with contextlib.suppress(OSError):
                    cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    if marker in cmd:
                        found.append(cmd)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_pid_files_naming_an_unrelated_process_are_neither_trusted_nor_killed(tmp_path: Path) -> None:
    """After a reboot a recorded pid may belong to another process: `status` must not report it as ours, `down`
    (kafka.sh stop, syslogng.sh stop, the owner) must not kill it; a real instance is still recognised and stopped."""
    from live_stack import ensure_syslogng_installed, forumpulse_defines

    run = tmp_path / "run"
    (run / "kafka").mkdir(parents=True)
    (run / "syslog-ng").mkdir()
    other = subprocess.Popen(["sleep", "300"])
    try:
        for pidf in (run / "kafka" / "kafka.pid", run / "syslog-ng" / "syslog-ng.pid", run / "owner.pid"):
            pidf.write_text(f"{other.pid}\n")
        env = {**os.environ, "FP_STACK_DIR": str(run)}
        kafka = subprocess.run(["bash", str(ROOT / "deploy" / "kafka" / "kafka.sh"), "status", "--dir",
                                str(run / "kafka")], capture_output=True, text=True, timeout=60)
        assert kafka.returncode != 0, kafka.stdout
        sng_sh = ["bash", str(ROOT / "deploy" / "syslog-ng" / "syslogng.sh")]
        sng = subprocess.run([*sng_sh, "status", "--dir", str(run / "syslog-ng")], capture_output=True, text=True,
                             timeout=60)
        assert sng.returncode != 0, sng.stdout
        down = _stack("down", env, timeout=120)
        time.sleep(0.3)
        assert other.poll() is None, f"an unrelated process was killed: {down.stdout}{down.stderr}"
        assert "not running" in down.stdout, down.stdout
    finally:
        other.kill()
        other.wait()

    # a real syslog-ng of this dir is recognised (status 0) and stopped
    ensure_syslogng_installed()
    (nokafka,) = free_ports(1)  # nothing listens there: no message leaves this test
    defines = forumpulse_defines(tmp_path / "logs", fp_kafka_bootstrap=f"127.0.0.1:{nokafka}",
                                 fp_state_dir=str(tmp_path / "state"))
    d = run / "syslog-ng"
    args = [a for k, v in defines.items() for a in ("--define", f"{k}={v}")]
    start = subprocess.run([*sng_sh, "start", "--dir", str(d), "--config", str(ROOT / "syslog-ng" / "forumpulse.conf"),
                            *args], capture_output=True, text=True, timeout=60)
    pid = int((d / "syslog-ng.pid").read_text()) if (d / "syslog-ng.pid").exists() else 0
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert "started" in start.stdout, start.stdout  # the unrelated pid recorded before did not block the start
        st = subprocess.run([*sng_sh, "status", "--dir", str(d)], capture_output=True, text=True, timeout=60)
        assert st.returncode == 0, st.stdout + st.stderr
        # start again: the same configuration is "already running"; another one is refused, not silently dropped
        conf_before = (d / "syslog-ng.conf").read_text()
        again = subprocess.run([*sng_sh, "start", "--dir", str(d), "--config",
                                str(ROOT / "syslog-ng" / "forumpulse.conf"), *args], capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 0 and "already running" in again.stdout, again.stdout + again.stderr
        other_args = [*args, "--define", "fp_heartbeat_interval=7"]
        changed = subprocess.run([*sng_sh, "start", "--dir", str(d), "--config",
                                  str(ROOT / "syslog-ng" / "forumpulse.conf"), *other_args], capture_output=True,
                                 text=True, timeout=60)
        assert changed.returncode == 1 and "the new one was NOT applied" in changed.stderr, changed.stdout
        assert (d / "syslog-ng.conf").read_text().strip() == conf_before.strip()  # what runs, still on disk
        # --timeout 5: without a broker syslog-ng would wait 60 s (flush-timeout-on-shutdown) before exiting
        stop = subprocess.run([*sng_sh, "stop", "--dir", str(d), "--timeout", "5"], capture_output=True, text=True,
                              timeout=120)
        assert f"syslog-ng stopped (pid {pid})" in stop.stdout, stop.stdout + stop.stderr
        # its heartbeat program (interval 3600 here) does not outlive it, also when the stop had to SIGKILL it
        assert _left_running(str(tmp_path)) == [], "syslog-ng's program() children outlived it"
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 0)
                os.kill(pid, 9)
