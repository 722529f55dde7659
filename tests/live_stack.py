"""Real Kafka and syslog-ng for tests: context managers around ``deploy/kafka/kafka.sh`` and
``deploy/syslog-ng/syslogng.sh``.

Use::

    from live_stack import kafka_broker, syslog_ng, FORUMPULSE_CONF

    with kafka_broker(tmp_path / "kafka") as broker:            # free ports, topics created (4 raw partitions)
        with syslog_ng(tmp_path / "sng", FORUMPULSE_CONF, broker.syslog_defines()) as sng:
            ...
            sng.stats()                                          # syslog-ng-ctl stats as a list of StatRow
        broker.stop(); broker.start()                            # outage tests: same ports, same data

Guarantees: every process started here is stopped when the ``with`` block ends (also on failure); ports are
picked free on 127.0.0.1 at entry and kept across ``stop()``/``start()``.  A missing tool (java, Kafka jars,
syslog-ng) raises :class:`StackError` with the fix, never a skip.  Kafka jars are fetched on first use with
``deploy/kafka/install.sh`` (cached; needs Maven Central).  Pytest fixtures ``kafka`` (module scope) and
``kafka_fn`` (function scope) are defined at the bottom; import ``kafka_fixture`` / ``kafka_fn_fixture`` into a
test module (``from live_stack import kafka_fixture as kafka_fixture``) to use them.

Misuse: the same directory must not be used by two brokers at once; ``start()`` on a running broker is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "deploy" / "kafka" / "kafka.sh"
KAFKA_INSTALL = REPO / "deploy" / "kafka" / "install.sh"
KAFKA_LIBS = REPO / "deploy" / "kafka" / "libs"
SYSLOGNG_SH = REPO / "deploy" / "syslog-ng" / "syslogng.sh"
SYSLOGNG_DIR = REPO / "syslog-ng"
FORUMPULSE_CONF = SYSLOGNG_DIR / "forumpulse.conf"
HEARTBEAT_SH = SYSLOGNG_DIR / "heartbeat.sh"
TOPICS = ("weblogs.raw", "weblogs.raw.dlq", "weblogs.events", "weblogs.decisions")


class StackError(RuntimeError):
    """A real component could not be installed, started or stopped (message says what and how to fix)."""


def _run(args: Sequence[str | os.PathLike[str]], timeout: float = 180) -> str:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise StackError(f"{' '.join(map(str, args))} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that are free on 127.0.0.1 right now (bound together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ensure_kafka_installed() -> None:
    """Fetch the pinned Kafka jars if missing; raise StackError with the fix when java/mvn is absent."""
    if shutil.which("java") is None:
        raise StackError("java not found: run `bash deploy/install-system-deps.sh` (openjdk-17-jre-headless)")
    _run(["bash", KAFKA_INSTALL], timeout=600)


def ensure_syslogng_installed() -> None:
    if shutil.which("syslog-ng") is None or shutil.which("syslog-ng-ctl") is None:
        raise StackError("syslog-ng not found: run `bash deploy/install-system-deps.sh` "
                         "(syslog-ng-core, syslog-ng-mod-rdkafka)")
    if not list(Path("/usr/lib/syslog-ng").glob("*/libkafka.so")):
        raise StackError("syslog-ng kafka-c() module missing: apt-get install syslog-ng-mod-rdkafka")


class Message(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


@dataclass
class Broker:
    """A single-node KRaft broker under ``dir`` on 127.0.0.1 (see deploy/kafka/kafka.sh)."""

    dir: Path
    port: int
    controller_port: int
    partitions: int = 4

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 90) -> None:
        """Start (or restart after stop()) on the same ports and data; returns once the port accepts."""
        _run(["bash", KAFKA_SH, "start", "--dir", self.dir, "--port", self.port,
              "--controller-port", self.controller_port, "--timeout", int(timeout)], timeout=timeout + 60)

    def stop(self, kill: bool = False) -> None:
        """SIGTERM and wait (SIGKILL after 30 s); ``kill=True`` sends SIGKILL at once (crash simulation)."""
        _run(["bash", KAFKA_SH, "stop", "--dir", self.dir, *(["--kill"] if kill else [])], timeout=120)

    def is_running(self) -> bool:
        return subprocess.run(["bash", str(KAFKA_SH), "status", "--dir", str(self.dir)],
                              capture_output=True, check=False).returncode == 0

    def create_topics(self, partitions: int | None = None) -> None:
        """Create weblogs.raw (``partitions``), weblogs.raw.dlq, weblogs.events, weblogs.decisions (idempotent)."""
        _run(["bash", KAFKA_SH, "topics", "--dir", self.dir, "--partitions", partitions or self.partitions])

    def create_topic(self, name: str, partitions: int = 4) -> str:
        """Create one extra topic (e.g. one per test, so tests sharing a broker do not see each other's data)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for fut in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                                       operation_timeout=30).values():
            fut.result()
        wait_until(lambda: name in admin.list_topics(timeout=10).topics, 30, what=f"topic {name}")
        return name

    def log_tail(self, lines: int = 40) -> str:
        log = self.dir / "kafka.log"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""

    def watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        """{partition: (low, high)} of ``topic``."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "live-stack-probe",
                      "enable.auto.commit": False})
        try:
            md = c.list_topics(topic, timeout=15)
            return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=15)
                    for p in sorted(md.topics[topic].partitions)}
        finally:
            c.close()

    def count(self, topic: str) -> int:
        return sum(hi - lo for lo, hi in self.watermarks(topic).values())

    def read_all(self, topic: str, expected: int | None = None, idle_s: float = 3.0,
                 timeout_s: float = 120.0) -> list[Message]:
        """Every message of ``topic`` from the beginning, in per-partition order.

        Reads until the high watermarks (taken when the count is reached or ``expected`` is None) are consumed,
        or ``timeout_s`` passes.  With ``expected``, keeps polling until the topic holds at least that many
        messages, then stops once nothing new has arrived for ``idle_s`` (so extra messages would be seen).
        """
        from confluent_kafka import Consumer, TopicPartition

        deadline = time.monotonic() + timeout_s
        if expected is not None:
            while self.count(topic) < expected and time.monotonic() < deadline:
                time.sleep(0.5)
            last, stable_since = -1, time.monotonic()
            while time.monotonic() < deadline:
                n = self.count(topic)
                if n != last:
                    last, stable_since = n, time.monotonic()
                elif time.monotonic() - stable_since >= idle_s:
                    break
                time.sleep(0.3)
        marks = self.watermarks(topic)
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"live-stack-read-{time.monotonic_ns()}",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"})
        out: list[Message] = []
        try:
            c.assign([TopicPartition(topic, p, lo) for p, (lo, _hi) in marks.items()])
            todo = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
            while todo and time.monotonic() < deadline:
                for m in c.consume(num_messages=10000, timeout=1.0):
                    if m.error():
                        raise StackError(f"consume error: {m.error()}")
                    out.append(Message(m.topic(), m.partition(), m.offset(), m.key(), m.value()))
                    if m.offset() + 1 >= todo.get(m.partition(), 0):
                        todo.pop(m.partition(), None)
        finally:
            c.close()
        out.sort(key=lambda m: (m.partition, m.offset))
        return out

    def syslog_defines(self, topic: str = "weblogs.raw") -> dict[str, str]:
        """The defines pointing our syslog-ng config at this broker."""
        return {"fp_kafka_bootstrap": self.bootstrap, "fp_topic": topic}


@contextlib.contextmanager
def kafka_broker(tmp_path: Path, port: int | None = None, controller_port: int | None = None,
                 partitions: int = 4, create_topics: bool = True) -> Iterator[Broker]:
    """Start a broker under ``tmp_path`` (free ports unless given), create the topics, stop it at exit."""
    ensure_kafka_installed()
    ports = free_ports(2)
    broker = Broker(Path(tmp_path), port or ports[0], controller_port or ports[1], partitions)
    broker.dir.mkdir(parents=True, exist_ok=True)
    try:
        broker.start()
        if create_topics:
            broker.create_topics()
        yield broker
    finally:
        broker.stop()


class StatRow(NamedTuple):
    source_name: str
    source_id: str
    source_instance: str
    state: str
    type: str
    number: int


@dataclass
class SyslogNg:
    """syslog-ng running ``config`` (a template with @define lines) under ``dir`` (see syslogng.sh)."""

    dir: Path
    config: Path
    defines: dict[str, str] = field(default_factory=dict)

    def _define_args(self) -> list[str]:
        return [a for k, v in self.defines.items() for a in ("--define", f"{k}={v}")]

    def start(self) -> None:
        _run(["bash", SYSLOGNG_SH, "start", "--dir", self.dir, "--config", self.config, *self._define_args()],
             timeout=60)

    def stop(self, kill: bool = False) -> None:
        _run(["bash", SYSLOGNG_SH, "stop", "--dir", self.dir, *(["--kill"] if kill else [])], timeout=120)

    def is_running(self) -> bool:
        return subprocess.run(["bash", str(SYSLOGNG_SH), "status", "--dir", str(self.dir)],
                              capture_output=True, check=False).returncode == 0

    def stats(self) -> list[StatRow]:
        """``syslog-ng-ctl stats`` rows (SourceName;SourceId;SourceInstance;State;Type;Number)."""
        rows = []
        for line in _run(["bash", SYSLOGNG_SH, "stats", "--dir", self.dir]).splitlines()[1:]:
            parts = line.split(";")
            if len(parts) == 6 and parts[5].lstrip("-").isdigit():
                rows.append(StatRow(*parts[:5], int(parts[5])))
        return rows

    def stat(self, source_name: str, type_: str, source_id: str | None = None) -> int:
        """Sum of ``Number`` over rows with that SourceName/Type (and SourceId when given)."""
        return sum(r.number for r in self.stats()
                   if r.source_name == source_name and r.type == type_
                   and (source_id is None or r.source_id == source_id))

    def log_text(self) -> str:
        log = self.dir / "syslog-ng.log"
        return log.read_text(errors="replace") if log.exists() else ""


def forumpulse_defines(base: Path, broker: Broker | None = None, heartbeat_s: int = 3600,
                       **overrides: Any) -> dict[str, str]:
    """Defines for syslog-ng/forumpulse.conf with every path under ``base`` and every port free.

    Followed dirs: ``base/squid`` (access.log) and ``base/vhosts`` (recursive ``*access.log``); ports in
    ``fp_raw_tcp_port`` / ``fp_raw_udp_port`` / ``fp_syslog_port`` / ``fp_syslog5424_port``.  Heartbeats every
    ``heartbeat_s`` seconds (default: effectively off).  ``overrides`` win.
    """
    tcp, syslog_port, syslog5424 = free_ports(3)
    (base / "squid").mkdir(parents=True, exist_ok=True)
    (base / "vhosts").mkdir(parents=True, exist_ok=True)
    d = {
        "fp_squid_dir": str(base / "squid"),
        "fp_vhost_dir": str(base / "vhosts"),
        "fp_raw_tcp_port": str(tcp),
        "fp_raw_udp_port": str(tcp),
        "fp_syslog_port": str(syslog_port),
        "fp_syslog5424_port": str(syslog5424),
        "fp_heartbeat_cmd": str(HEARTBEAT_SH),
        "fp_heartbeat_interval": str(heartbeat_s),
        "fp_origin_host": "testhost",
    }
    if broker is not None:
        d.update(broker.syslog_defines())
    d.update({k: str(v) for k, v in overrides.items()})
    return d


@contextlib.contextmanager
def syslog_ng(tmp_path: Path, config: Path | str = FORUMPULSE_CONF,
              defines: Mapping[str, str] | None = None) -> Iterator[SyslogNg]:
    """Start syslog-ng with ``config`` + ``defines`` under ``tmp_path``; stop it (SIGTERM) at exit."""
    ensure_syslogng_installed()
    sng = SyslogNg(Path(tmp_path), Path(config), dict(defines or {}))
    sng.dir.mkdir(parents=True, exist_ok=True)
    try:
        sng.start()
        yield sng
    finally:
        sng.stop()


def wait_until(pred: Any, timeout_s: float = 60.0, every_s: float = 0.2, what: str = "condition") -> None:
    """Poll ``pred()`` until truthy; raise AssertionError naming ``what`` after ``timeout_s`` (not a timing test:
    the timeout only bounds a hang)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(every_s)


@pytest.fixture(scope="module", name="kafka")
def kafka_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker (topics created) shared by a test module."""
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker


@pytest.fixture(name="kafka_fn")
def kafka_fn_fixture(tmp_path: Path) -> Iterator[Broker]:
    """A broker of its own for one test (outage tests stop/start it)."""
    with kafka_broker(tmp_path / "kafka") as broker:
        yield broker


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The offsets ``group`` committed on partitions ``0..partitions-1`` of ``topic`` (negative: none)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for _ in range(30):  # a fresh broker answers NOT_COORDINATOR while it loads its offsets topic
            try:
                return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(partitions)],
                                                        timeout=15)]
            except KafkaException:
                time.sleep(0.5)
        raise AssertionError(f"committed offsets of {group} not readable")
    finally:
        c.close()
