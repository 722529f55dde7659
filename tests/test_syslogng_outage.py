"""Kafka stopped for ~30 s while access lines keep being written (file tail and TCP): after Kafka is back,
every line is in the topic exactly once (flow-control + reliable disk buffer + librdkafka retrying forever)."""

from __future__ import annotations

import collections
import socket
import threading
import time
from pathlib import Path

import pytest
from live_stack import Broker, forumpulse_defines, syslog_ng, wait_until
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
