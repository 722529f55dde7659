"""deploy/port_open.sh, the "does something listen on this port" test of deploy/kafka/kafka.sh and deploy/stack.sh.

User trial 35: a restart on port 39192 (inside Linux's ephemeral range) printed "kafka started" and then "broker not
reachable": the start-up wait probed by connecting, a probe to a port nothing listened on connected to itself (TCP
simultaneous open: its own source port was the port probed), and the leftover socket kept the broker from binding.
The test now reads the kernel's table of listening sockets and never connects."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _port_open(port: int, proc_net: Path | None = None) -> bool:
    env = {**os.environ, "FP_PROC_NET": str(proc_net)} if proc_net else None
    r = subprocess.run(["bash", "-c", f'. "{ROOT}/deploy/port_open.sh" && port_open {port}'], check=False,
                       capture_output=True, text=True, timeout=30, env=env)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode == 0


def _listener(family: socket.AddressFamily, host: str) -> socket.socket:
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((host, 0))
    s.listen(8)
    s.settimeout(0.5)
    return s


def test_a_listening_port_is_open_and_is_not_connected_to() -> None:
    accepted: list[object] = []
    with _listener(socket.AF_INET, "127.0.0.1") as srv:
        port = srv.getsockname()[1]
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                accepted.append(conn)
                conn.close()

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        try:
            assert _port_open(port)
        finally:
            stop.set()
            t.join(5)
    assert accepted == []  # read from /proc, not probed: a probe can connect to itself on an ephemeral port
    assert not _port_open(port)  # closed now


def test_an_ipv6_listener_counts_and_a_connected_socket_does_not() -> None:
    with _listener(socket.AF_INET6, "::1") as srv6:
        assert _port_open(srv6.getsockname()[1])
    # a socket connected to itself (what a probe of a free ephemeral port can become) holds the port, not a listener
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.connect(("127.0.0.1", port))
        assert s.getpeername() == s.getsockname()
        assert not _port_open(port)


def test_a_kernel_without_ipv6_tables_still_answers(tmp_path: Path) -> None:
    """No ``tcp6`` table (a kernel booted without IPv6): mawk, Debian's awk, gives up on a file it cannot open,
    which made every port read as closed (found in review before it shipped)."""
    with _listener(socket.AF_INET, "127.0.0.1") as srv:
        port = srv.getsockname()[1]
        (tmp_path / "tcp").write_text(Path("/proc/net/tcp").read_text())
        assert _port_open(port, tmp_path)
    assert not (tmp_path / "tcp6").exists()
