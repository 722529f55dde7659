"""Kafka itself goes away under a running consumer (real broker, real chDB engine owned by the consumer).

The broker is stopped mid-stream, twice: once cleanly (SIGTERM) and once killed (SIGKILL, as a crashed or
power-cut broker), each time for longer than the consumer's poll and commit timeouts.  The consumer must wait for
it — not exit, not skip — and after each return read on from where it was: the tables equal a reference loaded
once from the same lines without Kafka (exact, see test_live_support.differences), and the group's committed
offsets reach the end of every partition.  A commit that failed while the broker was down is counted, and the
batch it belonged to is covered by the next commit or replayed under its token (never loaded twice).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from live_stack import committed_offsets, kafka_broker
from test_live_consumer import _assert_exact, _expected_lines, _owner, _verify
from test_live_support import (
    Msg,
    consumer_cmd,
    create_topics,
    free_port,
    last_json,
    produce,
    spawn,
    stop,
    stream,
    write_config,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 4
OUTAGE_S = 15  # longer than the consumer's 5-10 s commit / committed() timeouts


def _reachable(port: int) -> float | None:
    """``forumpulse_kafka_reachable`` of the loader's /metrics, None when it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("forumpulse_kafka_reachable "):
            return float(line.split()[1])
    return None


def _end_offsets(bootstrap: str, topic: str) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-end-offsets"})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)]
    finally:
        c.close()


FENCED = "fenced by other consumer with same group.instance.id"


class Supervised:
    """The loader as systemd runs it (``Restart=always``): when it ends on the one fatal Kafka error a broker
    restart can cause -- its static membership fenced by its own earlier member -- it is started again (at most
    twice).  Any other exit is a failure.  Nothing may be lost either way: that is what the test asserts."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.cmd, self.log, self.restarts = cmd, log, 0
        self.since = log.stat().st_size if log.exists() else 0  # this process's part of the (appended) log
        self.proc = spawn(cmd, log)

    def alive(self) -> bool:
        if self.proc.poll() is None:
            return True
        own = self.log.read_bytes()[self.since:].decode(errors="replace")
        if self.proc.returncode != 0 and FENCED in own and self.restarts < 2:
            self.restarts += 1
            self.since = self.log.stat().st_size
            self.proc = spawn(self.cmd, self.log)
            return True
        return False


def _wait_committed(bootstrap: str, topic: str, target: int, proc, log: Path, timeout: float = 240) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        ok = proc.alive() if isinstance(proc, Supervised) else proc.poll() is None
        current = proc.proc if isinstance(proc, Supervised) else proc
        assert ok, f"consumer exited ({current.returncode}): {log.read_text()[-3000:]}"
        offs = committed_offsets(bootstrap, "forumpulse-loader", topic, PARTITIONS)
        if sum(max(o, 0) for o in offs) >= target:
            return offs
        assert time.monotonic() < deadline, f"committed {offs}, want {target}: {log.read_text()[-3000:]}"
        time.sleep(1)


def test_kafka_stopped_and_killed_under_a_running_consumer_loses_nothing(tmp_path: Path) -> None:
    topic, dlq = "kout.raw", "kout.dlq"
    msgs = list(stream(60_000, seed=17))
    parts = [msgs[:20_000], msgs[20_000:40_000], msgs[40_000:]]
    with kafka_broker(tmp_path / "kafka", create_topics=False) as broker:
        create_topics(broker.bootstrap, PARTITIONS, topic, dlq)
        config = write_config(tmp_path / "fp.yaml", broker.bootstrap, f"chdb:{tmp_path / 'chdb'}")
        log = tmp_path / "consumer.log"
        mport = free_port()
        sup = Supervised(consumer_cmd(config, "--topic", topic, "--dead-letter-topic", dlq, "--instance-id", "kout",
                                      "--batch-lines", "3000", "--max-wait", "0.5", "--metrics-port", str(mport)), log)
        seen_down = seen_up_again = 0
        try:
            sent = 0
            for i, (part, kill) in enumerate(zip(parts, (False, True, None), strict=True)):
                errors: list[BaseException] = []

                def producing(part: list[Msg] = part, errors: list[BaseException] = errors) -> None:
                    try:
                        produce(broker.bootstrap, topic, part, 4_000.0)
                    except BaseException as e:  # surfaced below: a thread's exception is otherwise only printed
                        errors.append(e)

                producer = threading.Thread(target=producing, daemon=True)
                producer.start()
                if kill is not None:
                    # mid-part, with batches in the consumer's buffers and lines still being produced, the broker
                    # goes away (the producer keeps its lines and retries; the consumer must wait)
                    _wait_committed(broker.bootstrap, topic, sent + 5_000, sup, log)
                    broker.stop(kill=kill)
                    until = time.monotonic() + OUTAGE_S
                    while time.monotonic() < until:  # the loader says it reaches no broker (gauge 0)
                        seen_down += _reachable(mport) == 0.0
                        time.sleep(1)
                    assert sup.proc.poll() is None, f"consumer exited with Kafka down ({i}): {log.read_text()[-3000:]}"
                    broker.start()
                producer.join(400)  # produce() waits up to 330 s for the restarted broker's acknowledgements
                assert not producer.is_alive() and not errors, errors
                sent += len(part)
                _wait_committed(broker.bootstrap, topic, sent, sup, log)
                if kill is not None:
                    deadline = time.monotonic() + 30
                    while _reachable(mport) != 1.0 and time.monotonic() < deadline:
                        time.sleep(0.5)
                    seen_up_again += _reachable(mport) == 1.0
            assert _end_offsets(broker.bootstrap, topic) == committed_offsets(
                broker.bootstrap, "forumpulse-loader", topic, PARTITIONS)
            assert stop(sup.proc) == 0, log.read_text()[-3000:]
            summary = last_json(log)
            # the tables are exact: read through the engine's endpoint once the consumer has released the folder
            port = free_port()
            owner = _owner(tmp_path, config, port, "kout")
            try:
                diff = _verify(port, config, msgs, "kout")
            finally:
                assert stop(owner) == 0
        finally:
            stop(sup.proc)
    assert summary["store_errors"] == 0, summary
    assert seen_down >= 2 and seen_up_again == 2, (seen_down, seen_up_again)  # forumpulse_kafka_reachable
    _assert_exact(diff, _expected_lines(msgs))
    # the outages were seen and logged, folded: librdkafka's own default logs ~20 refused connections a second
    text = log.read_text(errors="replace")
    refused = [x for x in text.splitlines() if "Connection refused" in x]
    assert 1 <= len(refused) <= 12, refused[:20]
    # each outage outlived the group session: the partitions were revoked and assigned again (twice, then the stop)
    assert text.count("forumpulse.consumer: revoked [") >= 3 and text.count("forumpulse.consumer: assigned [") >= 3
