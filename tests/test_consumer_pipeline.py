"""The consumer's insert thread (one batch in flight) with the real Kafka broker and the real engine (chDB):
store errors raised *inside* the insert thread — on the intent, the ``requests`` block or the ``quarantine``
block — are retried by the consumer thread from the failed step, and every table still equals a reference load;
the recorded batch ranges tile each partition without gaps or overlaps and the committed offsets reach the end.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer
from forumpulse.pipeline.store import Store, StoreError
from live_stack import Broker, kafka_broker
from test_live_support import assert_same_as_reference, create_topics, produce, reference_diff, stream


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with kafka_broker(tmp_path_factory.mktemp("kafka"), create_topics=False) as b:
        yield b


class FlakyStore:
    """Store proxy: inserts into the tables in ``fail`` raise StoreError on their listed call numbers (1-based,
    counted per table) before reaching the store."""

    def __init__(self, inner: Store, fail: dict[str, set[int]]) -> None:
        self.inner = inner
        self.fail = fail
        self.calls: dict[str, int] = {}
        self.failed = 0
        self.url = inner.url
        self.database = inner.database

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def insert(self, table: str, data: Any, dedup_token: str | None = None) -> None:
        n = self.calls[table] = self.calls.get(table, 0) + 1
        if n in self.fail.get(table, set()):
            self.failed += 1
            raise StoreError(f"injected failure of insert {n} into {table}")
        self.inner.insert(table, data, dedup_token=dedup_token)


def test_store_errors_in_the_insert_thread_are_retried_exactly(broker: Broker, store: Store, settings: Settings,
                                                               chdb_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    topic = "pipe.raw"
    create_topics(broker.bootstrap, 2, topic, "pipe.dlq")
    msgs = list(stream(24_000, seed=11))
    produce(broker.bootstrap, topic, msgs)
    flaky = FlakyStore(store, {"consumer_batches": {2, 5}, "requests": {1, 3, 4}, "quarantine": {2}})
    opts = ConsumerOptions(bootstrap_servers=broker.bootstrap, topic=topic, dead_letter_topic=None,
                           group_id="g-pipe", instance_id="p1", batch_lines=3000, max_wait_s=0.3,
                           stats_interval_s=1.0, backoff_initial_s=0.01, backoff_max_s=0.05, pipeline_inserts=True)
    c = LiveConsumer(settings, flaky, opts)
    with caplog.at_level(logging.INFO, logger="forumpulse"):
        summary = c.run(idle_exit_s=2)
    assert flaky.failed == 6 and summary["store_errors"] >= 6
    # each retried write says when the store took it (user trial 43: only the failures were logged)
    back = [r.getMessage() for r in caplog.records if "answers again after" in r.getMessage()]
    assert back and all(m.startswith("store answers again after ") for m in back), back
    assert summary["lag"] == 0
    diff = reference_diff(store, chdb_path, settings, msgs)
    assert_same_as_reference(diff)
    # recorded ranges tile every partition from 0 to its end, each range once
    rows = store.query_rows("SELECT partition, first_offset, last_offset FROM consumer_batches FINAL "
                            "WHERE group_id = 'g-pipe' ORDER BY partition, first_offset")
    ends: dict[int, int] = {}
    for part, first, last in rows:
        assert first == ends.get(part, 0), (part, first, ends)
        assert last >= first
        ends[part] = last + 1
    assert sum(ends.values()) == len(msgs)
