"""Kafka stopped for ~30 s while access lines keep being written (file tail and TCP): after Kafka is back,
every line is in the topic exactly once (flow-control + reliable disk buffer + librdkafka retrying forever)."""

from __future__ import annotations

import collections
import socket
import threading
import time
from pathlib import Path

import pytest
from live_stack import Broker, forumpulse_defines, free_ports, kafka_broker, syslog_ng, wait_until
from live_stack import kafka_fn_fixture as kafka_fn_fixture  # the `kafka_fn` fixture

pytestmark = [pytest.mark.kafka, pytest.mark.syslogng, pytest.mark.slow]
OUTAGE_S = 30


def line(i: int, tag: str) -> str:
    return f'172.16.{i % 40}.{i % 7} - - [10/Oct/2023:13:55:36 +0000] "GET /{tag}/{i} HTTP/1.1" 200 {i} "-" "ua"'


def test_kafka_outage_loses_nothing(kafka_fn: Broker, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    d = forumpulse_defines(logs, kafka_fn)
    f = logs / "vhosts" / "outage.example.org.access.log"
    written = {"file": 0, "tcp": 0}
    stop = threading.Event()

    def writer() -> None:  # ~2,000 file lines/s and ~1,000 TCP lines/s for the whole test
        with f.open("a") as out, socket.create_connection(("127.0.0.1", int(d["fp_raw_tcp_port"]))) as sock:
            while not stop.is_set():
                a, b = written["file"], written["file"] + 200
                out.writelines(line(i, "F") + "\n" for i in range(a, b))
                out.flush()
                written["file"] = b
                a, b = written["tcp"], written["tcp"] + 100
                sock.sendall("".join(line(i, "T") + "\n" for i in range(a, b)).encode())
                written["tcp"] = b
                time.sleep(0.1)

    with syslog_ng(tmp_path / "sng", defines=d) as sng:
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        try:
            wait_until(lambda: kafka_fn.count("weblogs.raw") > 1000, 60, what="first lines in Kafka")
            kafka_fn.stop()
            before_outage = written["file"]
            time.sleep(OUTAGE_S)  # the outage itself (not an assertion)
            assert written["file"] > before_outage, "writer stalled during the outage"
            assert sng.is_running()
            kafka_fn.start()
            time.sleep(3)
        finally:
            stop.set()
            t.join(30)
        total = written["file"] + written["tcp"]
        wait_until(lambda: kafka_fn.count("weblogs.raw") >= total, 180, what=f"{total} lines after the outage")
        msgs = kafka_fn.read_all("weblogs.raw", idle_s=3.0)
        assert sng.stat("dst.kafka", "dropped") == 0
    counts: dict[str, collections.Counter[int]] = {"F": collections.Counter(), "T": collections.Counter()}
    for m in msgs:
        raw = m.value.decode().split("\t", 5)[5]
        for tag in ("F", "T"):
            if f"/{tag}/" in raw:
                counts[tag][int(raw.split(f"/{tag}/", 1)[1].split()[0])] += 1
    for tag, n in (("F", written["file"]), ("T", written["tcp"])):
        missing = sorted(set(range(n)) - set(counts[tag]))
        doubled = [i for i, c in counts[tag].items() if c > 1]
        assert not missing, f"{tag}: {len(missing)} of {n} lost, e.g. {missing[:5]}"
        assert not doubled, f"{tag}: {len(doubled)} doubled, e.g. {doubled[:5]}"
        assert set(counts[tag]) == set(range(n))


def _fill_files(vhosts: Path, files: int, lines: int) -> int:
    for k in range(files):
        with (vhosts / f"full{k}.example.org.access.log").open("w") as out:
            out.writelines(line(i, f"V{k}") + "\n" for i in range(lines))
    return files * lines


def _buffer_bytes(sng_dir: Path) -> int:
    return sum(p.stat().st_size for p in (sng_dir / "state").glob("*.rqf"))


FULL_FILES, FULL_LINES = 4, 30_000
# a disk buffer that Kafka's absence fills within seconds: 8 MiB, librdkafka's memory queue 1,000 messages
FULL_BUFFER = {"fp_disk_buf_size": str(8 << 20), "fp_rdkafka_queue": "1000"}


def test_a_full_disk_buffer_stops_the_sources_and_loses_nothing(kafka_fn: Broker, tmp_path: Path) -> None:
    """Kafka away until the reliable disk buffer is full: with its reserve (fp_mem_buf_size) sized by the rule in
    forumpulse.conf ((1 KiB + the line) x the sources' windows: 4 vhost files x 1,000 lines here), the files wait
    and every line arrives exactly once when Kafka is back.  Meanwhile the refused messages are retried once a
    second (poll-timeout(1000)): with poll-timeout(100) 3.38 retried without a pause, ~100% CPU and ~1.3M "Queue
    full" log lines in 10 s.  The control (next test) shows what a small reserve does."""
    logs = tmp_path / "logs"
    d = forumpulse_defines(logs, kafka_fn, fp_mem_buf_size=str(5 << 20), **FULL_BUFFER)
    kafka_fn.stop()
    total = _fill_files(logs / "vhosts", FULL_FILES, FULL_LINES)
    with syslog_ng(tmp_path / "sng", defines=d) as sng:
        # in the reserve (free space < 5 MiB), and the sources stopped: the buffer no longer grows
        wait_until(lambda: _buffer_bytes(sng.dir) > 3 << 20, 120, what="the disk buffer in its reserve")
        sizes = [-1, _buffer_bytes(sng.dir)]

        def stopped() -> bool:
            time.sleep(2)
            sizes.append(_buffer_bytes(sng.dir))
            return sizes[-1] == sizes[-2]

        wait_until(stopped, 120, what="the sources stopped by flow-control")
        before = sng.log_text().count("Queue full")
        time.sleep(10)  # a window to count retries in (not a timing assertion)
        retries = sng.log_text().count("Queue full") - before
        assert retries < 200, f"{retries} 'Queue full' retries in 10 s: the kafka destination spins"
        assert "dropping message" not in sng.log_text()
        kafka_fn.start()
        wait_until(lambda: kafka_fn.count("weblogs.raw") >= total, 240, what=f"{total} lines after the outage")
        counts = [-1, kafka_fn.count("weblogs.raw")]

        def settled() -> bool:  # the topic also holds the files' heartbeats: wait until nothing more comes
            time.sleep(3)
            counts.append(kafka_fn.count("weblogs.raw"))
            return counts[-1] == counts[-2]

        wait_until(settled, 240, what="the topic settled")
        msgs = kafka_fn.read_all("weblogs.raw", idle_s=3.0)
        assert sng.stat("dst.kafka", "dropped") == 0
        assert "dropping message" not in sng.log_text()
    envelopes = [m.value.decode().split("\t", 5) for m in msgs]
    seen = collections.Counter(e[5] for e in envelopes if e[4] != "-heartbeat-")
    want = {line(i, f"V{k}") for k in range(FULL_FILES) for i in range(FULL_LINES)}
    assert set(seen) == want, f"{len(want - set(seen))} of {total} lost"
    assert max(seen.values()) == 1, f"{sum(c > 1 for c in seen.values())} doubled"


def test_control_a_reserve_smaller_than_the_windows_drops_lines(tmp_path: Path) -> None:
    """The control of the test above: the same files and buffer with a 1 MiB reserve (smaller than 4 x 1,000 lines
    of windows) drop lines once the buffer is full -- what the shipped 16 MiB reserve did with ~25 busy files or
    three forwarder connections (10,000-line windows each)."""
    logs = tmp_path / "logs"
    (closed,) = free_ports(1)
    d = forumpulse_defines(logs, fp_kafka_bootstrap=f"127.0.0.1:{closed}", fp_mem_buf_size=str(1 << 20),
                           **FULL_BUFFER)
    _fill_files(logs / "vhosts", FULL_FILES, FULL_LINES)
    with syslog_ng(tmp_path / "sng", defines=d) as sng:
        try:
            wait_until(lambda: "dropping message" in sng.log_text(), 120, what="a full buffer dropping lines")
        finally:
            sng.stop(kill=True)  # a SIGTERM would wait flush-timeout-on-shutdown (60 s) for the absent Kafka


def test_lines_read_before_the_topic_exists_wait_for_it(tmp_path: Path) -> None:
    """The collector started before its topic was created (brokers have auto.create.topics.enable=false): its lines
    wait for the topic like for an absent broker (topic.metadata.propagation.max.ms 1 h) and arrive once it is
    created.  With librdkafka's default (30 s) the 100 early lines and the heartbeats were failed by librdkafka
    after syslog-ng had counted them written: lost, with nothing but a debug-level log line (measured on 3.38.1)."""
    with kafka_broker(tmp_path / "k") as broker:
        d = forumpulse_defines(tmp_path / "logs", broker, fp_topic="late.topic")
        f = tmp_path / "logs" / "vhosts" / "late.example.org.access.log"
        with syslog_ng(tmp_path / "sng", defines=d) as sng:
            f.write_text("".join(line(i, "early") + "\n" for i in range(100)))
            time.sleep(45)  # longer than librdkafka's default propagation wait (not a timing assertion)
            broker.create_topic("late.topic", 1)
            with f.open("a") as out:
                out.writelines(line(i, "late") + "\n" for i in range(100))

            def arrived() -> list[str]:
                return [m.value.decode().split("\t", 5)[5] for m in broker.read_all("late.topic", idle_s=1.0)]

            wait_until(lambda: sum("/late/" in v for v in arrived()) >= 100, 120, what="the late lines")
            got = arrived()
            assert sorted(v for v in got if "/early/" in v) == sorted(line(i, "early") for i in range(100))
            assert sng.stat("dst.kafka", "dropped") == 0
