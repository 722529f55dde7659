"""deploy/forwarders: the syslog-ng forwarder snippet and the Apache / squid examples.

* the snippet, included from a minimal main config, passes ``syslog-ng --syntax-only`` (own -R/-p/-c files);
* run for real (syslog-ng 3.38 as a plain process) against a TCP listener, it sends each appended access line
  unchanged as one RFC5424 frame with octet counting, APP-NAME ``<site>/<format>`` and this host's name — the
  shape the central syslog-ng (``s_fp_syslog5424``) turns into site, format and origin_host;
* the Apache LogFormat in the example is the ``combined_d`` preset, and its sample line parses with it.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FWD = ROOT / "deploy" / "forwarders"
SNIPPET = FWD / "syslog-ng-forwarder.conf"


def _syslog_ng() -> str:
    exe = shutil.which("syslog-ng")
    assert exe, "syslog-ng not found: apt-get install syslog-ng-core (3.38)"
    return exe


def _render(tmp_path: Path, **defines: str) -> Path:
    text = SNIPPET.read_text()
    for k, v in defines.items():
        text, n = re.subn(rf'^@define {k} "[^"]*"$', f'@define {k} "{v}"', text, flags=re.M)
        assert n == 1, f"snippet has no @define {k}"
    snippet = tmp_path / "forumpulse-forwarder.conf"
    snippet.write_text(text)
    main = tmp_path / "syslog-ng.conf"
    main.write_text(f'@version: 3.38\noptions {{ stats-freq(0); }};\n@include "{snippet}"\n')
    return main


def test_snippet_passes_syntax_only(tmp_path: Path) -> None:
    main = _render(tmp_path)
    r = subprocess.run([_syslog_ng(), "--syntax-only", "-f", str(main), "-R", str(tmp_path / "persist"),
                        "-p", str(tmp_path / "pid"), "-c", str(tmp_path / "ctl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_snippet_names_do_not_clash() -> None:
    text = SNIPPET.read_text()
    defined = re.findall(r"^(?:source|destination|parser|rewrite|filter)\s+(\w+)", text, re.M)
    assert defined and all(n.split("_", 1)[1].startswith("fpfwd") for n in defined), defined
    assert all(k.startswith("fpfwd_") for k in re.findall(r"^@define (\w+)", text, re.M))
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    assert code.count("flags(flow-control)") == code.count("log {") == 2


def _start(conf: Path, d: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen([_syslog_ng(), "-F", "--no-caps", "-e", "-f", str(conf), "-R", str(d / f"{name}.persist"),
                             "-p", str(d / f"{name}.pid"), "-c", str(d / f"{name}.ctl")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def _wait_lines(path: Path, n: int, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            got = path.read_text().splitlines()
            if len(got) >= n:
                return got
        time.sleep(0.2)
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.syslogng
def test_forwarder_to_a_syslog_receiver_keeps_lines_tags_and_host(tmp_path: Path) -> None:
    """Forwarder -> a syslog-ng 3.38 `syslog()` TCP source with the central options (keep-hostname(yes))."""
    web, squid, state = tmp_path / "web", tmp_path / "squid", tmp_path / "state"
    for d in (web, squid, state):
        d.mkdir()
    lines = [
        '203.0.113.9 - - [22/Nov/2026:03:00:00 +0000] "GET /threads/x.12/ HTTP/1.1" 200 512 "-" "Mozilla/5.0" 1234',
        '2001:db8::7 - - [22/Nov/2026:03:00:01 +0000] "GET /t/a%20b?x=1 HTTP/1.1" 404 0 "-" "curl/8.0 (x|y)" 99',
    ]
    squid_line = ("1795319437.366    120 198.51.100.4 TCP_MISS/200 1024 GET http://example.org/a b - "
                  "HIER_DIRECT/93.184.216.34 text/html")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "received.txt"
    receiver = tmp_path / "receiver.conf"
    receiver.write_text(
        '@version: 3.38\noptions { stats-freq(0); keep-hostname(yes); chain-hostnames(no); };\n'
        f'source s {{ syslog(ip("127.0.0.1") port({port}) transport(tcp) log-msg-size(262144)); }};\n'
        f'destination d {{ file("{out}" template("${{PROGRAM}}\\t${{HOST}}\\t${{MSG}}\\n")); }};\n'
        "log { source(s); destination(d); };\n")
    main = _render(tmp_path, fpfwd_collector="127.0.0.1", fpfwd_port=str(port), fpfwd_state_dir=str(state),
                   fpfwd_web_dir=str(web), fpfwd_web_tag="forum.example.org/combined_d", fpfwd_squid_dir=str(squid),
                   fpfwd_squid_tag="proxy/squid", fpfwd_origin_host="web7")
    (web / "forum.example.org.access.log").write_text("")
    (squid / "access.log").write_text("")
    rx = _start(receiver, tmp_path, "receiver")
    logs = ""
    try:
        time.sleep(0.5)
        fwd = _start(main, tmp_path, "forwarder")
        try:
            time.sleep(1.5)  # the poll monitor has seen the empty files: lines appended now are new data
            with open(web / "forum.example.org.access.log", "a") as fh:
                fh.write("\n".join(lines) + "\n")
            with open(squid / "access.log", "a") as fh:
                fh.write(squid_line + "\n")
            got = _wait_lines(out, 3, timeout=20)
        finally:
            logs += _stop(fwd)
    finally:
        logs += _stop(rx)
    rows = [ln.split("\t", 2) for ln in got]
    assert len(rows) == 3, (got, logs)
    assert [r[2] for r in rows if r[0] == "forum.example.org/combined_d"] == lines
    assert [r[2] for r in rows if r[0] == "proxy/squid"] == [squid_line]
    assert {r[1] for r in rows} == {"web7"}
    # the central config's tag pattern splits both program names into site and format
    central = (ROOT / "syslog-ng" / "forumpulse.conf").read_text()
    pattern = re.search(r'template\("\$\{PROGRAM\}"\)[^;]*?patterns\("([^"]+)"\)', central, re.S)
    assert pattern, "central tag pattern not found"
    tag_rx = pattern.group(1).replace("(?<", "(?P<")
    for app in ("forum.example.org/combined_d", "proxy/squid"):
        m = re.match(tag_rx, app)
        assert m and f"{m.group('site')}/{m.group('format')}" == app, app


def test_apache_example_uses_a_forumpulse_preset() -> None:
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.formats import PRESETS
    from forumpulse.pipeline.process import Processor, SourceContext

    text = (FWD / "apache-forumpulse.conf").read_text()
    fmt = re.search(r'^LogFormat "(.+)" forumpulse_combined_d$', text, re.M)
    assert fmt, "LogFormat line not found"
    logformat = fmt.group(1).replace('\\"', '"')
    assert "apache:" + logformat == PRESETS["combined_d"]
    assert re.search(r"^CustomLog \S+ forumpulse_combined_d$", text, re.M)
    line = b'203.0.113.9 - - [22/Nov/2026:03:00:00 +0000] "GET /threads/x.12/ HTTP/1.1" 200 512 "-" "Mozilla/5.0" 1234'
    batch = Processor(Settings()).process([line], SourceContext(site="forum", origin_host="web1",
                                                                 origin_file="a.log", format="combined_d"))
    assert batch.requests.num_rows == 1 and batch.requests.column("status").to_pylist() == [200]


def test_apache_behind_proxy_example_has_the_nginx_main_shape() -> None:
    """The commented LogFormat for Apache behind a proxy parses as the preset it names, the header included: a
    line through a trusted proxy gets its client from the header under both specs."""
    from forumpulse.pipeline.formats import TrustedProxies, get_parser

    text = (FWD / "apache-forumpulse.conf").read_text()
    fmt = re.search(r'^#LogFormat "(.+)" forumpulse_nginx_main$', text, re.M)
    assert fmt, "behind-proxy LogFormat not found"
    spec = "apache:" + fmt.group(1).replace('\\"', '"')
    line = ('10.0.0.5 - - [22/Nov/2026:03:00:00 +0000] "GET /threads/x.12/ HTTP/1.1" 200 512 "-" "Mozilla/5.0" '
            '"1.1.1.1, 203.0.113.9"')
    trusted = TrustedProxies(["10.0.0.5"])
    a, b = get_parser(spec, trusted=trusted).parse(line), get_parser("nginx_main", trusted=trusted).parse(line)
    assert a == b and a.client_ip == "203.0.113.9"  # type: ignore[union-attr]
    assert re.search(r"^#CustomLog \S+ forumpulse_nginx_main$", text, re.M)


def test_squid_example_uses_the_native_format() -> None:
    text = (FWD / "squid-forumpulse.conf").read_text()
    assert re.search(r"^access_log daemon:/var/log/squid/access.log squid$", text, re.M)
    assert re.search(r"^#access_log udp://\S+:5140 squid$", text, re.M)
    assert os.path.basename("/var/log/squid/access.log") == "access.log"  # matches fpfwd_squid_pattern default
    assert '@define fpfwd_squid_pattern "access.log"' in SNIPPET.read_text()


def _collector_source(name: str, **overrides: str) -> str:
    """A source block of the collector (syslog-ng/forumpulse.conf) verbatim, its `define` references replaced by
    the template's @define values (or ``overrides``)."""
    central = (ROOT / "syslog-ng" / "forumpulse.conf").read_text()
    defines = dict(re.findall(r'^@define (\w+) "([^"]*)"$', central, re.M)) | overrides
    m = re.search(rf"^source {name} \{{\n.*?^\}};\n", central, re.M | re.S)
    assert m, f"source {name} not found in syslog-ng/forumpulse.conf"
    return re.sub(r"`(\w+)`", lambda r: defines[r.group(1)], m.group(0))


def _collector_5424_receiver(tmp_path: Path) -> tuple[int, Path, Path]:
    """A receiver config holding the collector's RFC5424 source verbatim, on a free port, writing each message
    to ``received.txt``: (port, output file, config file)."""
    from live_stack import free_ports

    port = free_ports(1)[0]
    out = tmp_path / "received.txt"
    receiver = tmp_path / "receiver.conf"
    receiver.write_text(
        '@version: 3.38\noptions { stats-freq(0); keep-hostname(yes); chain-hostnames(no); use-dns(no); };\n'
        + _collector_source("s_fp_syslog5424", fp_listen_ip="127.0.0.1", fp_syslog5424_port=str(port))
        + f'destination d {{ file("{out}" template("${{MSG}}\\n")); }};\n'
        "log { source(s_fp_syslog5424); destination(d); flags(flow-control); };\n")
    return port, out, receiver


@pytest.mark.syslogng
def test_a_line_of_the_forwarders_maximum_size_does_not_cut_the_connection(tmp_path: Path) -> None:
    """A line of ``fpfwd_log_msg_size`` bytes becomes a frame of that size plus the RFC5424 header.  The collector's
    RFC5424 source (verbatim from syslog-ng/forumpulse.conf) must take it: with log-msg-size() equal to the
    forwarder's, 3.38 logged 'Incoming frame larger than log_msg_size()', closed the connection, and the long
    line and the line after it were lost while the forwarder counted them written."""
    web, squid, state = tmp_path / "web", tmp_path / "squid", tmp_path / "state"
    for d in (web, squid, state):
        d.mkdir()
    port, out, receiver = _collector_5424_receiver(tmp_path)
    main = _render(tmp_path, fpfwd_collector="127.0.0.1", fpfwd_port=str(port), fpfwd_state_dir=str(state),
                   fpfwd_web_dir=str(web), fpfwd_squid_dir=str(squid),
                   fpfwd_origin_host="a-rather-long-host-name-of-a-web-server.example.org")
    size = int(re.search(r'^@define fpfwd_log_msg_size "(\d+)"$', SNIPPET.read_text(), re.M).group(1))  # type: ignore[union-attr]
    before = '203.0.113.9 - - [22/Nov/2026:03:00:00 +0000] "GET /before HTTP/1.1" 200 512 "-" "x" 1'
    long_line = '203.0.113.9 - - [22/Nov/2026:03:00:01 +0000] "GET /' + "a" * size
    long_line = long_line[:size]  # exactly the forwarder's maximum: one message, not split
    after = '203.0.113.9 - - [22/Nov/2026:03:00:02 +0000] "GET /after HTTP/1.1" 200 512 "-" "x" 1'
    (web / "forum.example.org.access.log").write_text("")
    rx = _start(receiver, tmp_path, "receiver")
    logs = ""
    try:
        time.sleep(0.5)
        fwd = _start(main, tmp_path, "forwarder")
        try:
            time.sleep(1.5)  # the poll monitor has seen the empty file: lines appended now are new data
            with open(web / "forum.example.org.access.log", "a") as fh:
                fh.write(f"{before}\n{long_line}\n{after}\n")
            got = _wait_lines(out, 3, timeout=20)
        finally:
            logs += _stop(fwd)
    finally:
        logs += _stop(rx)
    assert "larger than log_msg_size" not in logs, logs[-2000:]
    assert got == [before, long_line, after], ([len(g) for g in got], logs[-2000:])


@pytest.mark.syslogng
def test_an_oversized_rfc5424_frame_is_trimmed_and_the_next_frame_arrives(tmp_path: Path) -> None:
    """A frame over the collector's limit (another sender, a bigger fpfwd_log_msg_size) is trimmed
    (trim-large-messages), and the connection stays up for the frames after it."""
    port, out, receiver = _collector_5424_receiver(tmp_path)

    def frame(msg: str) -> bytes:
        b = f"<14>1 2026-11-29T00:00:00Z web7 forum.example.org/combined - - - {msg}".encode()
        return str(len(b)).encode() + b" " + b

    rx = _start(receiver, tmp_path, "receiver")
    try:
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port)) as c:
            c.sendall(frame("x" * 400_000) + frame("after"))
            got = _wait_lines(out, 2, timeout=20)
    finally:
        logs = _stop(rx)
    assert len(got) == 2 and got[1] == "after", ([len(g) for g in got], logs[-2000:])
    assert 262_144 <= len(got[0]) < 400_000 and set(got[0]) == {"x"}


def test_apache_piped_logger_sends_a_long_line_as_one_message(tmp_path: Path) -> None:
    """The example's piped logger, run as written (collector replaced by a local listener): util-linux logger
    splits lines over --size bytes (1024 by default) into separate messages; a 5,000-byte line must arrive whole."""
    import shlex
    import threading

    logger = shutil.which("logger")
    if not logger:
        pytest.skip("util-linux logger not installed")
    text = (FWD / "apache-forumpulse.conf").read_text()
    m = re.search(r'^#CustomLog "\|(/usr/bin/logger [^"]+)" forumpulse_combined_d$', text, re.M)
    assert m, "piped logger example not found"
    argv = shlex.split(m.group(1))
    size = int(argv[argv.index("--size") + 1])
    central = (ROOT / "syslog-ng" / "forumpulse.conf").read_text()
    assert size == int(re.search(r'^@define fp_log_msg_size "(\d+)"$', central, re.M).group(1))  # type: ignore[union-attr]
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    srv.settimeout(20)
    port = srv.getsockname()[1]
    argv[0] = logger
    argv[argv.index("-n") + 1] = "127.0.0.1"
    argv[argv.index("-P") + 1] = str(port)
    received = bytearray()

    def accept() -> None:
        conn, _ = srv.accept()
        with conn:
            while chunk := conn.recv(65536):
                received.extend(chunk)

    t = threading.Thread(target=accept)
    t.start()
    try:
        line = "203.0.113.9 - - [22/Nov/2026:03:00:00 +0000] \"GET /" + "a" * 5000 + " HTTP/1.1\" 200 1 \"-\" \"x\" 7"
        subprocess.run(argv, input=line + "\n", text=True, check=True, timeout=20)
        t.join(timeout=20)
    finally:
        srv.close()
    frames = [f for f in bytes(received).split(b"\n") if f]
    assert len(frames) == 1 and frames[0].endswith(line.encode()), [len(f) for f in frames]
