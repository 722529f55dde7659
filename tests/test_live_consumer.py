"""The live loader against the real stack (real Kafka broker, real ClickHouse engine in chDB), seeded:

* kill -9 of the consumer subprocess (which owns the engine) 10 times during a 200k-line stream: every table exact;
* the store (the owner's ClickHouse-compatible endpoint) goes away for a while: the consumer waits, resumes, loses
  nothing, and its buffers stay bounded;
* two consumers in one group, one leaves mid-stream: exact.

"Exact" = the consumer-loaded database equals a reference database loaded once from the same lines without Kafka:
``requests`` and ``quarantine`` as multisets, every rollup's sums per key (see test_live_support.differences).
"""

from __future__ import annotations

import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from forumpulse.pipeline.config import load_settings
from forumpulse.pipeline.rollup_check import check_rollups
from forumpulse.pipeline.store import ClickHouseStore, migrate, open_store
from live_stack import Broker, kafka_broker
from test_live_support import (
    NO_TTL_PARAMS,
    PY,
    assert_same_as_reference,
    consumer_cmd,
    create_topics,
    differences,
    free_port,
    last_json,
    load_reference,
    owner_cmd,
    produce,
    spawn,
    stop,
    stream,
    wait_http,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka"), create_topics=False) as b:
        yield b


def _owner(tmp: Path, config: Path, port: int, tag: str) -> Any:
    log = tmp / f"owner-{tag}.log"
    proc = spawn(owner_cmd(config, "--port", str(port)), log)
    wait_http(port, proc, log)
    return proc


def _count(port: int) -> int:
    cs = ClickHouseStore(f"clickhouse://default@127.0.0.1:{port}/forumpulse")
    try:
        return int(cs.query_rows("SELECT (SELECT count() FROM requests) + (SELECT count() FROM quarantine)")[0][0])
    finally:
        cs.close()


def _verify(port: int, config: Path, msgs: list[Any], tag: str) -> dict[str, Any]:
    """Load the reference through the owner's endpoint into database ``ref_<tag>`` and compare."""
    ref = ClickHouseStore(f"clickhouse://default@127.0.0.1:{port}/ref_{tag}")
    try:
        migrate(ref, NO_TTL_PARAMS)
        load_reference(ref, load_settings(config), msgs)
        diff = differences(ref, "forumpulse", f"ref_{tag}")
        dup = ref.query_rows("SELECT count() - uniqExact(source_ref, line_no) FROM forumpulse.quarantine")[0][0]
        diff["duplicate_quarantine_offsets"] = int(dup)
        return diff
    finally:
        ref.close()


def _assert_exact(diff: dict[str, Any], expected_lines: int) -> None:
    assert_same_as_reference(diff)
    assert sum(diff["counts"].values()) == expected_lines
    assert diff["counts"]["quarantine"] > 0 and diff["duplicate_quarantine_offsets"] == 0


def _expected_lines(msgs: list[Any]) -> int:
    from forumpulse.pipeline.contracts import HEARTBEAT_FORMAT, split_envelope

    n = 0
    for m in msgs:
        e = split_envelope(m.value)
        n += e is not None and e.format != HEARTBEAT_FORMAT
    return n


def test_kill_9_ten_times_during_a_200k_stream_is_exact_after_the_rollup_check(broker: Broker, tmp_path: Path) -> None:
    rng = random.Random(20261122)
    topic, dlq = "kill.raw", "kill.dlq"
    create_topics(broker.bootstrap, 4, topic, dlq)
    msgs = list(stream(200_000, seed=7))
    db = tmp_path / "chdb"
    config = write_config(tmp_path / "fp.yaml", broker.bootstrap, f"chdb:{db}")
    args = ["--topic", topic, "--dead-letter-topic", dlq, "--instance-id", "killme", "--batch-lines", "4000", "--max-wait", "0.5"]
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topic, msgs, 12_000.0), daemon=True)
    producer.start()
    kills = 0
    log = tmp_path / "consumer.log"
    while kills < 10:
        proc = spawn(consumer_cmd(config, *args), log)
        time.sleep(rng.uniform(3.0, 6.5))  # python + chDB start take ~2-3 s; kills land in loading
        assert proc.poll() is None, f"consumer exited early: {log.read_text()[-3000:]}"
        proc.kill()
        proc.wait()
        kills += 1
    producer.join(300)
    assert not producer.is_alive()
    proc = spawn(consumer_cmd(config, *args, "--idle-exit", "3"), log)
    assert proc.wait(600) == 0, log.read_text()[-3000:]
    summary = last_json(log)
    assert summary["store_errors"] == 0
    # the kills must have exercised the replay path: a restarted consumer found batches recorded (intent written)
    # but not committed, and reloaded them with their tokens; exact tables below then prove the dedup worked
    replayed = [int(n) for n in re.findall(r"replay plan for \S+ \(topic ID \S+\) from offset \d+: (\d+) batch",
                                             log.read_text(errors="replace"))]
    assert replayed and sum(replayed) >= 1, "no kill landed between a batch's intent and its commit"
    port = free_port()
    owner = _owner(tmp_path, config, port, "kill")
    try:
        url = f"clickhouse://default@127.0.0.1:{port}/forumpulse"
        batches = ClickHouseStore(url).query_rows("SELECT count() FROM consumer_batches FINAL")[0][0]
        assert batches >= 200_000 // 4000
        # a kill while ClickHouse commits one insert's parts table by table can leave one rollup without that
        # block (the replay is deduplicated everywhere; seen once in CI, and with ClickHouse alone in a harness:
        # tests/repro/mv_dedup_kill9.py).  What such a kill did there: a block taken from one or two
        # rollups, usually in the hours the loader named for its replayed batches (a hint, not a complete list);
        # `db check-rollups --repair` (here through the owner's ClickHouse endpoint) rebuilds them from requests.
        # requests and quarantine are never touched by it: their exactness below is the loader's.
        advised: set[str] = set()
        for a, b in re.findall(r"check-rollups --from (\S+) --to (\S+)`", log.read_text(errors="replace")):
            h, end = datetime.fromisoformat(a), datetime.fromisoformat(b)
            while h < end:
                advised.add(f"{h:%Y-%m-%d %H:%M:%S}")
                h += timedelta(hours=1)
        assert advised, "the loader named no hours for its replayed batches"
        st = ClickHouseStore(url)
        try:
            found = check_rollups(st, datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC),
                                  open_scratch=lambda db: open_store(url, database=db))
        finally:
            st.close()
        print("rollups after the kills:", found.differences, found.hours)  # kept in the test log
        # kept in the log, not asserted: the loader's hours are a hint (a loss seen after a kill during the
        # engine's start, with no insert in flight, would lie outside them)
        print("hours not named by the loader:", sorted(set(found.hours) - advised))
        assert found.raw_incomplete == []  # requests holds at least what every rollup counted
        fix = subprocess.run([PY, "-m", "forumpulse.pipeline.cli", "db", "check-rollups", "-c", str(config),
                              "--store", url, "--from", "2000-01-01", "--to", "2100-01-01", "--repair"],
                             capture_output=True, text=True, timeout=600, check=False)
        assert fix.returncode == 0, fix.stdout + fix.stderr
        assert ("repaired" in fix.stdout) == (not found.ok), fix.stdout
        assert found.ok or "checked again: every rollup the same" in fix.stdout, fix.stdout
        diff = _verify(port, config, msgs, "kill")
    finally:
        assert stop(owner) == 0
    _assert_exact(diff, _expected_lines(msgs))


def test_store_outage_consumer_waits_and_resumes_with_bounded_memory(broker: Broker, tmp_path: Path) -> None:
    topic, dlq = "outage.raw", "outage.dlq"
    create_topics(broker.bootstrap, 4, topic, dlq)
    msgs = list(stream(80_000, seed=11))
    db = tmp_path / "chdb"
    port = free_port()
    config = write_config(tmp_path / "fp.yaml", broker.bootstrap, f"chdb:{db}")
    cconfig = write_config(tmp_path / "fc.yaml", broker.bootstrap, f"clickhouse://default@127.0.0.1:{port}/forumpulse")
    owner = _owner(tmp_path, config, port, "outage1")
    log = tmp_path / "consumer.log"
    batch = 3000
    consumer = spawn(consumer_cmd(cconfig, "--topic", topic, "--dead-letter-topic", dlq, "--instance-id", "out1", "--batch-lines", str(batch),
                                  "--max-wait", "0.5"), log)
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topic, msgs, 8_000.0), daemon=True)
    producer.start()
    try:
        deadline = time.monotonic() + 120
        while _count(port) < 10_000:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        assert stop(owner) == 0  # the store goes away mid-stream ...
        time.sleep(8)
        assert consumer.poll() is None, log.read_text()[-3000:]
        owner = _owner(tmp_path, config, port, "outage2")  # ... and comes back on the same port
        producer.join(300)
        expected = _expected_lines(msgs)
        deadline = time.monotonic() + 300
        while _count(port) < expected:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert consumer.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        assert stop(consumer) == 0
        summary = last_json(log)
        assert summary["store_errors"] > 0, "the outage was not noticed"
        # bounded: at most one batch per partition (4) plus one poll's worth of messages
        assert 0 < summary["max_buffered"] <= 4 * batch + 10_000, summary
        diff = _verify(port, config, msgs, "outage")
    finally:
        stop(consumer)
        stop(owner)
    _assert_exact(diff, expected)


def test_two_consumers_one_leaves_mid_stream_exact(broker: Broker, tmp_path: Path) -> None:
    topic, dlq = "pair.raw", "pair.dlq"
    create_topics(broker.bootstrap, 4, topic, dlq)
    msgs = list(stream(80_000, seed=13))
    db = tmp_path / "chdb"
    port = free_port()
    config = write_config(tmp_path / "fp.yaml", broker.bootstrap, f"chdb:{db}")
    cconfig = write_config(tmp_path / "fc.yaml", broker.bootstrap, f"clickhouse://default@127.0.0.1:{port}/forumpulse")
    owner = _owner(tmp_path, config, port, "pair")
    logs = [tmp_path / "c1.log", tmp_path / "c2.log"]
    common = ["--topic", topic, "--dead-letter-topic", dlq, "--batch-lines", "3000", "--max-wait", "0.5"]
    c1 = spawn(consumer_cmd(cconfig, *common, "--instance-id", "pair1"), logs[0])
    c2 = spawn(consumer_cmd(cconfig, *common, "--instance-id", "pair2"), logs[1])
    producer = threading.Thread(target=produce, args=(broker.bootstrap, topic, msgs, 8_000.0), daemon=True)
    producer.start()
    try:
        # both members must hold partitions before the second leaves: the second one's join can come a
        # heartbeat (2 s) after the first has formed the group alone and loaded the backlog, so wait for its
        # assignment, then for 6,000 more rows (once, in CI, the first member had loaded 20,000 rows before the
        # second was assigned anything)
        deadline = time.monotonic() + 120
        while "forumpulse.consumer: assigned [" not in logs[1].read_text(errors="replace"):
            assert time.monotonic() < deadline and c2.poll() is None, logs[1].read_text()[-3000:]
            time.sleep(0.2)
        target = min(max(20_000, _count(port) + 6_000), _expected_lines(msgs))
        while _count(port) < target:
            assert time.monotonic() < deadline, logs[1].read_text()[-3000:]
            time.sleep(0.5)
        assert stop(c2) == 0  # graceful leave mid-stream: its batches are flushed and committed
        s2 = last_json(logs[1])
        assert s2["lines_in"] > 0, "the second consumer never got partitions"
        producer.join(300)
        expected = _expected_lines(msgs)
        deadline = time.monotonic() + 300
        while _count(port) < expected:
            assert time.monotonic() < deadline, logs[0].read_text()[-3000:]
            time.sleep(1)
        assert stop(c1) == 0
        s1 = last_json(logs[0])
        diff = _verify(port, config, msgs, "pair")
    finally:
        stop(c1)
        stop(c2)
        stop(owner)
    _assert_exact(diff, expected)
    assert s1["lines_in"] > 0
