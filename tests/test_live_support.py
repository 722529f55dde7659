"""Support for the live consumer/owner tests (no tests here): seeded stream generation, subprocess helpers and
exact table comparison between a consumer-loaded database and a reference database loaded in one go.

The stream is synthetic but shaped like a forum's traffic: combined and combined+%D lines (vBulletin/phpBB topic
URLs, static files, crawlers), a few malformed lines (truncated, garbage), heartbeats for one quiet source and a few
values that are not envelopes.  Everything derives from one seed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forumpulse.pipeline.contracts import build_envelope, build_heartbeat

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

SOURCES = [  # (site, origin_host, origin_file, format)
    ("forum", "web1", "/var/log/apache2/access.log", "combined"),
    ("forum", "web2", "/var/log/apache2/access.log", "combined_d"),
    ("forum", "proxy1", "/var/log/nginx/forum.log", "auto"),
]
_UAS = [
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Mobile/15E148",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
    "Mozilla/5.0 (X11; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
    "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
]
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _clf_time(t: float) -> str:
    tm = time.gmtime(t)
    return f"{tm.tm_mday:02d}/{_MONTHS[tm.tm_mon - 1]}/{tm.tm_year}:{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000"


def make_line(rng: random.Random, t: float, fmt: str) -> str:
    ip = (f"10.{rng.randrange(4)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" if rng.random() < 0.7
          else f"2001:db8::{rng.randrange(1, 4000):x}")
    r = rng.random()
    if r < 0.45:
        url = f"/showthread.php?t={rng.randrange(1, 400)}&page={rng.randrange(1, 4)}"
    elif r < 0.6:
        url = f"/viewtopic.php?f=2&t={rng.randrange(1, 300)}"
    elif r < 0.85:
        url = f"/static/{rng.choice(['app.js', 'style.css', 'logo.png'])}?v={rng.randrange(9)}"
    else:
        url = rng.choice(["/", "/forumdisplay.php?f=3", "/search.php?do=getnew", "/index.php"])
    method = "POST" if rng.random() < 0.03 else "GET"
    status = rng.choice([200] * 12 + [304, 404, 500, 301])
    size = rng.randrange(200, 400_000)
    ua = rng.choice(_UAS)
    line = (f'{ip} - - [{_clf_time(t)}] "{method} {url} HTTP/1.1" {status} {size} '
            f'"https://forum.example/" "{ua}"')
    if fmt == "combined_d":
        line += f" {rng.randrange(300, 3_000_000)}"
    return line


@dataclass(frozen=True)
class Msg:
    key: bytes | None
    value: bytes


def stream(n_lines: int, seed: int, start: float = 1_700_000_000.0, span_s: float = 3 * 3600) -> Iterator[Msg]:
    """``n_lines`` messages: access lines (≈0.5% malformed), every 2000th a heartbeat of the quiet source
    ``forum/web3``, every 5000th a value that is not an envelope."""
    rng = random.Random(seed)
    for i in range(n_lines):
        t = start + span_s * i / n_lines
        if i % 2000 == 1999:
            yield Msg(None, build_heartbeat("forum", "web3", "/var/log/apache2/access.log", f"hb {i}"))
            continue
        if i % 5000 == 4999:
            yield Msg(b"x", f"garbage value {i}".encode())
            continue
        site, host, file, fmt = SOURCES[rng.randrange(len(SOURCES))]
        line = make_line(rng, t, fmt)
        r = rng.random()
        if r < 0.003:
            line = line[: rng.randrange(5, 40)]
        elif r < 0.005:
            line = "GET garbage " + str(rng.random())
        yield Msg(line.split(" ", 1)[0].encode(), build_envelope(site, host, file, fmt, line))


def produce(bootstrap: str, topic: str, msgs: Iterator[Msg] | list[Msg], rate: float | None = None) -> int:
    """Produce and flush; with ``rate`` (messages/s) paced in slices of 2000 messages.

    Raises unless every message was acknowledged. The flush waits as long as librdkafka keeps a message
    (``message.timeout.ms``, 300 s): a test that stops the broker under a running producer must wait for its
    restart, which on a loaded 2-core machine took longer than the 60 s this once waited (CI, stop 35).
    """
    from confluent_kafka import KafkaError, Producer

    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4",
                  "enable.idempotence": True, "queue.buffering.max.messages": 500_000,
                  "message.timeout.ms": 300_000, "on_delivery": delivered})
    n = 0
    t0 = time.monotonic()
    for m in msgs:
        while True:
            try:
                p.produce(topic, value=m.value, key=m.key)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        if rate and n % 2000 == 0:
            p.poll(0)
            ahead = n / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    left = p.flush(330)
    if left or failed:
        raise RuntimeError(f"{left} messages not delivered to {topic}, {len(failed)} failed: {failed[:3]}")
    return n


def create_topics(bootstrap: str, partitions: int = 4, raw: str = "weblogs.raw", dlq: str = "weblogs.raw.dlq") -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futs = admin.create_topics([NewTopic(raw, partitions, 1), NewTopic(dlq, 1, 1)])
    for f in futs.values():
        f.result(30)


def topic_count(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fp-test-count", "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10)
    total = 0
    for p in md.topics[topic].partitions:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        total += hi - lo
    c.close()
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_config(path: Path, bootstrap: str, store: str, batch_lines: int = 100_000) -> Path:
    import yaml

    path.write_text(yaml.safe_dump({
        "store": {"url": store},
        "kafka": {"bootstrap_servers": bootstrap},
        "retention": {"raw_days": 0, "rollup_days": 0, "quarantine_days": 0, "stats_days": 0},
        "ingest": {"batch_lines": batch_lines},
    }))
    return path


def consumer_cmd(config: Path, *args: str) -> list[str]:
    return [PY, "-m", "forumpulse.pipeline.consumer", "--config", str(config), *args]


def owner_cmd(config: Path, *args: str) -> list[str]:
    return [PY, "-m", "forumpulse.pipeline.owner", "--config", str(config), *args]


def spawn(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FORUMPULSE_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
    env.pop("FORUMPULSE_CONFIG", None)
    f = open(log, "ab")  # noqa: SIM115 - owned by the child
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def wait_http(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before serving: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=1) as r:
                if r.read() == b"Ok.\n":
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"port {port} not serving after {timeout} s: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def last_json(log: Path) -> dict[str, Any]:
    for line in reversed(log.read_text().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise AssertionError(f"no JSON summary in {log}: {log.read_text()[-3000:]}")


# ------------------------------------------------------------------------------------------------ comparison

ROLLUPS = ("site_minute", "topic_minute", "client_minute", "prefix_minute", "transfer_minute", "topic_hour",
           "prefix_hour")


def _table_query(store: Any, db: str, table: str) -> str:
    cols = store.query_rows(
        f"SELECT name, type FROM system.columns WHERE database = '{db}' AND table = '{table}' ORDER BY position")
    keys, aggs = [], []
    for name, typ in cols:
        if typ.startswith("SimpleAggregateFunction(sum, Float"):
            aggs.append(f"round(sum(`{name}`), 1)")
        elif typ.startswith("SimpleAggregateFunction(sum"):
            aggs.append(f"sum(`{name}`)")
        elif typ.startswith("AggregateFunction(uniq"):
            aggs.append(f"uniqMerge(`{name}`)")
        elif typ.startswith("AggregateFunction(quantilesTDigest"):
            aggs.append(f"length(quantilesTDigestMerge(0.5)(`{name}`))")  # state present; values are approximate
        else:
            keys.append(f"`{name}`")
    return f"SELECT {', '.join(keys + aggs)} FROM {db}.{table} GROUP BY {', '.join(keys)}"


def differences(store: Any, db: str, ref: str) -> dict[str, Any]:
    """Per table: rows in ``db`` not in ``ref`` and vice versa (0/0 = identical); plus row counts."""
    out: dict[str, Any] = {}
    req = ("SELECT ts, site, origin_host, origin_file, source_format, client_ip, url, status, bytes, elapsed_ms, "
           "topic_id, is_bot, is_static, count() AS n FROM {db}.requests GROUP BY ALL")
    qua = "SELECT site, origin_host, origin_file, reason, raw, count() AS n FROM {db}.quarantine GROUP BY ALL"
    queries = {"requests": req, "quarantine": qua}
    for t in ROLLUPS:
        queries[t] = _table_query(store, db, t).replace(f"FROM {db}.", "FROM {db}.")
    for t, q in queries.items():
        a, b = q.format(db=db), q.format(db=ref)
        extra = store.query_rows(f"SELECT count() FROM ({a} EXCEPT ALL {b})")[0][0]
        missing = store.query_rows(f"SELECT count() FROM ({b} EXCEPT ALL {a})")[0][0]
        out[t] = (int(extra), int(missing))
    out["counts"] = {t: int(store.query_rows(f"SELECT count() FROM {db}.{t}")[0][0]) for t in ("requests", "quarantine")}
    out["ref_counts"] = {t: int(store.query_rows(f"SELECT count() FROM {ref}.{t}")[0][0])
                         for t in ("requests", "quarantine")}
    return out


def reference_diff(store: Any, chdb_path: Any, settings: Any, msgs: list[Msg]) -> dict[str, Any]:
    """:func:`differences` between ``store`` and a reference database on the same chDB folder, loaded with every
    message's line processed once (:func:`load_reference`)."""
    from forumpulse.pipeline.store import migrate, open_store

    ref = open_store(f"chdb:{chdb_path}", database=store.database + "_ref")
    try:
        migrate(ref, NO_TTL_PARAMS)
        load_reference(ref, settings, msgs)
        return differences(store, store.database, ref.database)
    finally:
        ref.close()


def assert_same_as_reference(diff: dict[str, Any]) -> None:
    """Every table (requests, quarantine, each rollup) holds exactly what the reference holds."""
    tables = {k: v for k, v in diff.items() if isinstance(v, tuple)}
    assert all(v == (0, 0) for v in tables.values()), f"tables differ (extra, missing): {tables}"
    assert diff["counts"] == diff["ref_counts"], diff


def load_reference(store: Any, settings: Any, msgs: list[Msg], chunk: int = 50_000) -> None:
    """Process every line once (no Kafka) and insert it into ``store`` (reference database)."""
    from forumpulse.pipeline.contracts import HEARTBEAT_FORMAT, split_envelope
    from forumpulse.pipeline.process import Processor, SourceContext

    proc = Processor(settings)
    groups: dict[tuple[str, str, str, str], list[bytes]] = {}
    for m in msgs:
        e = split_envelope(m.value)
        if e is None or e.format == HEARTBEAT_FORMAT:
            continue
        groups.setdefault((e.site, e.origin_host, e.origin_file, e.format), []).append(e.line)
    for (site, host, file, fmt), lines in groups.items():
        for i in range(0, len(lines), chunk):
            pb = proc.process(lines[i:i + chunk], SourceContext(site, host, file, fmt))
            if pb.requests.num_rows:
                store.insert("requests", pb.requests)
            if pb.quarantine.num_rows:
                store.insert("quarantine", pb.quarantine)



NO_TTL_PARAMS = {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0}
