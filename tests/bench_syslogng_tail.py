"""Benchmark (not a test): syslog-ng file tail -> Kafka rate with the shipped config (reliable disk buffer,
flow-control, lz4, idempotent producer), broker on the same machine.

    .venv/bin/python tests/bench_syslogng_tail.py [LINES=1000000] [--tcp] [--config PATH] [define=value ...]

Writes LINES combined lines (~200 B) to a vhost file, starts syslog-ng, and reports lines/s from syslog-ng start
until the topic holds all LINES (polled every 0.2 s), and syslog-ng's CPU seconds (all its threads, librdkafka's
included).  --tcp also sends LINES over the raw TCP listener.  --config runs another configuration (e.g. a copy
of syslog-ng/forumpulse.conf without its disk-buffer() block) with the same defines.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forumpulse.pipeline.bench import proc_cpu_s
from live_stack import FORUMPULSE_CONF, forumpulse_defines, kafka_broker, syslog_ng


def line(i: int) -> str:
    return (f'10.{i % 200}.{(i // 200) % 250}.{i % 7 + 1} - - [10/Oct/2023:13:55:{i % 60:02d} +0000] '
            f'"GET /t/some-topic-title/{i % 5000}?page={i % 9} HTTP/1.1" 200 {i % 90000} '
            f'"https://forum.example.org/" "Mozilla/5.0 (X11; Linux x86_64; rv:118.0) Gecko/20100101 Firefox/118.0"\n')


def wait_count(broker, topic: str, n: int) -> float:  # type: ignore[no-untyped-def]
    while broker.count(topic) < n:
        time.sleep(0.2)
    return time.monotonic()


def main() -> None:
    n = int(next((a for a in sys.argv[1:] if a.isdigit()), 1_000_000))
    conf = sys.argv[sys.argv.index("--config") + 1] if "--config" in sys.argv else str(FORUMPULSE_CONF)
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        with kafka_broker(tmp / "kafka") as broker:
            extra = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
            d = forumpulse_defines(tmp / "logs", broker, **extra)
            f = tmp / "logs" / "vhosts" / "bench.example.org.access.log"
            with f.open("w") as out:
                for a in range(0, n, 100_000):
                    out.write("".join(line(i) for i in range(a, min(n, a + 100_000))))
            size = f.stat().st_size
            t0 = time.monotonic()
            with syslog_ng(tmp / "sng", config=conf, defines=d) as sng:
                t1 = wait_count(broker, "weblogs.raw", n)
                cpu = proc_cpu_s(f"/proc/{(sng.dir / 'syslog-ng.pid').read_text().strip()}/stat")
                print(f"file tail -> Kafka: {n:,} lines ({size / 1e6:.0f} MB) in {t1 - t0:.1f} s = "
                      f"{n / (t1 - t0):,.0f} lines/s; syslog-ng CPU {cpu:.1f} s; "
                      f"dropped={sng.stat('dst.kafka', 'dropped')}")
                if "--tcp" in sys.argv:
                    base = broker.count("weblogs.raw")
                    t0 = time.monotonic()
                    with socket.create_connection(("127.0.0.1", int(d["fp_raw_tcp_port"]))) as s:
                        for a in range(0, n, 50_000):
                            s.sendall("".join(line(i) for i in range(a, min(n, a + 50_000))).encode())
                    t1 = wait_count(broker, "weblogs.raw", base + n)
                    print(f"raw TCP -> Kafka:   {n:,} lines in {t1 - t0:.1f} s = {n / (t1 - t0):,.0f} lines/s")


if __name__ == "__main__":
    main()
