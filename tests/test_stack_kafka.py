"""deploy/kafka/kafka.sh with the real broker: topics, no auto-creation, data survives stop/start and kill -9."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from live_stack import KAFKA_SH, TOPICS, Broker, kafka_broker
from live_stack import kafka_fixture as kafka_fixture  # the `kafka` fixture

pytestmark = pytest.mark.kafka


def _produce(broker: Broker, topic: str, items: list[tuple[bytes, bytes]]) -> None:
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for k, v in items:
        p.produce(topic, value=v, key=k)
    assert p.flush(60) == 0


def test_topics_created_with_partitions_and_no_auto_create(kafka: Broker) -> None:
    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=15)
    for t in TOPICS:
        assert t in md.topics, f"{t} missing"
    assert len(md.topics["weblogs.raw"].partitions) == kafka.partitions
    assert len(md.topics["weblogs.raw.dlq"].partitions) == 1
    # auto.create.topics.enable=false: producing to an unknown topic must fail, not create it
    p = Producer({"bootstrap.servers": kafka.bootstrap, "message.timeout.ms": 3000})
    errors: list[object] = []
    p.produce("no.such.topic", b"x", on_delivery=lambda err, _m: errors.append(err))
    p.flush(10)
    assert errors and errors[0] is not None
    assert "no.such.topic" not in AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(timeout=15).topics


def test_topics_command_is_idempotent(kafka: Broker) -> None:
    out = subprocess.run(["bash", str(KAFKA_SH), "topics", "--dir", str(kafka.dir)], capture_output=True,
                         text=True, check=True).stdout
    assert all(f"exists  {t}" in out for t in TOPICS), out


def test_same_key_same_partition_and_readback(kafka: Broker) -> None:
    items = [(f"10.0.0.{i % 7}".encode(), f"line {i}".encode()) for i in range(700)]
    before = kafka.count("weblogs.events")
    _produce(kafka, "weblogs.events", items)  # 1 partition: order is total
    got = kafka.read_all("weblogs.events", expected=before + 700, idle_s=0.5)
    assert [m.value for m in got[before:]] == [v for _, v in items]
    _produce(kafka, "weblogs.raw", items)
    raw = kafka.read_all("weblogs.raw", expected=700, idle_s=0.5)
    parts: dict[bytes, set[int]] = {}
    for m in raw:
        assert m.key is not None
        parts.setdefault(m.key, set()).add(m.partition)
    assert len(raw) == 700 and all(len(p) == 1 for p in parts.values())


def test_restart_and_kill9_keep_data(tmp_path: Path) -> None:
    with kafka_broker(tmp_path / "k", partitions=2) as broker:
        _produce(broker, "weblogs.raw", [(b"a", b"before-restart")] * 50)
        broker.stop()
        assert not broker.is_running()
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": broker.bootstrap, "socket.timeout.ms": 1000}).list_topics(timeout=2)
        broker.start()
        assert broker.is_running()
        _produce(broker, "weblogs.raw", [(b"b", b"after-restart")] * 50)
        broker.stop(kill=True)  # crash: acknowledged (acks=all, single replica) messages are on disk
        broker.start()
        vals = [m.value for m in broker.read_all("weblogs.raw", expected=100, idle_s=0.5)]
        assert vals.count(b"before-restart") == 50 and vals.count(b"after-restart") == 50
        # format happened once: the cluster id is unchanged across restarts
        assert (broker.dir / "cluster.id").read_text().strip() in (broker.dir / "data" / "meta.properties").read_text()


def test_start_fails_clearly_when_port_taken(tmp_path: Path, kafka: Broker) -> None:
    proc = subprocess.run(["bash", str(KAFKA_SH), "start", "--dir", str(tmp_path / "k2"), "--port", str(kafka.port),
                           "--controller-port", "1"], capture_output=True, text=True, check=False)
    assert proc.returncode != 0
    assert f"127.0.0.1:{kafka.port} is already in use" in proc.stderr
