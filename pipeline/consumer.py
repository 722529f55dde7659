"""The live loader: Kafka ``weblogs.raw`` → process → store, with an exactly-once *effect* on every table (see
Guarantees for the one case a rollup needs ``db check-rollups --repair``, and for the deduplication window that
bounds it).

``forumpulse consume`` runs one :class:`LiveConsumer` (a confluent-kafka group member); the owner process
(``forumpulse run --consume``) hosts one next to the engine.  Several consumers scale out in one group, each
writing to a ClickHouse server or to the owner's ClickHouse-compatible endpoint.

How a batch is loaded (per Kafka partition, offsets ``first..last``, at most ``batch_lines`` messages; a partial
batch is loaded once its oldest message waited ``max_wait_s``, default 0.3 s, or 10x that while the consumer is
behind — Kafka already holds the rest of a full batch — so a backlog loads in large batches — and while the store
is busy with the batch in flight: an insert into ``requests`` costs about the same whatever its size (its
materialized views), so partial batches grow while they wait instead of queueing up behind a slow store):

1. messages are split by source (envelope, :mod:`forumpulse.pipeline.contracts`; :func:`~forumpulse.pipeline.contracts.split_values` does it
   for the whole batch at once), each source's lines go through the pure
   :class:`~forumpulse.pipeline.process.Processor`; heartbeats update liveness; values that are not envelopes go
   to the dead-letter topic;
2. the range is recorded in ``consumer_batches`` (migrations 0002, 0004) with the partition's Kafka *topic ID*
   — *before* any row is inserted;
3. ``requests`` and ``quarantine`` are inserted as one block each with ``insert_deduplication_token =
   fp1:<topic>:<topic_id>:<partition>:<first>-<last>:<table>`` (ClickHouse deduplicates the block in the table
   and in every materialized view fed by it);
4. quarantined lines and bad envelopes are produced to the dead-letter topic and every one of them must be
   acknowledged by the broker (delivery reports, not ``flush()``'s count); then the offset ``last+1`` is
   committed synchronously; then detector hooks see the batch's ``stream`` table.  A dead letter the broker
   refused (topic missing, message too large, not authorized, timed out) is produced again with backoff,
   forever (counted in ``forumpulse_dead_letter_delivery_failures``, an error logged after
   ``dead_letter_error_after`` attempts): a batch is never committed past an undelivered dead letter.

Steps 2–3 run in one insert thread while the consumer thread polls and processes the next batch (one batch in
flight; ``pipeline_inserts=False`` does them inline); step 4 of batch k happens before batch k+1 is submitted, so
commits keep batch order, and a failed insert is retried by the consumer thread with the backoff below.

After a crash (kill -9 at any point), a rebalance or a store outage, the next owner of the partition reads the
recorded ranges of the same topic ID at or after its committed offset and cuts its first batches at exactly
those offsets: same blocks, same tokens, stored once (a recorded range whose first messages retention deleted
meanwhile is replayed with the messages left, under the recorded range's offsets and tokens: dropped as the
duplicate it is).  The topic ID (Kafka's UUID of the topic, new whenever a
topic is deleted and created again or the broker's data is wiped) keeps a recreated log, whose offsets restart
at 0, from replaying the old log's ranges and tokens (its blocks would be dropped as duplicates).  Ranges of the
same topic ID that lie beyond the partition's high watermark (a truncated log: unclean leader election, lost
broker data) are refused: the partition is not loaded, an error is logged and
``forumpulse_replay_plan_conflicts{action="refused"}`` counts it.  Ranges recorded before topic IDs (empty
``topic_id``) are replayed with their old tokens only while they clearly belong to the current log.  Quarantine
rows take ``ingested_at`` from the newest Kafka timestamp of the batch (not the wall clock), so a replayed block
is identical.

Guarantees (within the deduplication window, below): every message of the topic ends as exactly one row of ``requests`` or ``quarantine`` or one
dead-letter message (bad envelope) or one heartbeat; rollups count each line once, except that a store process
killed while ClickHouse commits one insert's parts table by table can leave one rollup without that block (the
replay is deduplicated everywhere): every replayed batch logs the hours to check with ``forumpulse db
check-rollups`` (:mod:`forumpulse.pipeline.rollup_check`), whose ``--repair`` rebuilds them from ``requests``, and
tells ``replay_listeners`` -- the owner of an embedded store audits those hours by itself once settled
(``RollupAuditor``, ``store.rollup_audit``).
Limit of the deduplication itself: ClickHouse recognises a replayed block only while the stored one is among
the table's last ``non_replicated_deduplication_window`` (1000) blocks -- parts: an insert into ``requests`` makes
one per day it spans -- inserted by any writer; each table (and each rollup) counts its own.  A replay soon after
a crash or rebalance is well inside it.  A replay after a long gap while other partitions, consumers or ingests
keep inserting into the same tables, or a backlog of batches that span many days each (a 30-day batch is 30
parts), can push the uncommitted batch's blocks out of the window: the replay is then stored a second time (its
lines counted twice in ``requests`` and the rollups), and no check reports it.  A larger window (``ALTER TABLE …
MODIFY SETTING non_replicated_deduplication_window = N``) widens the margin at the cost of more block hashes
kept and checked per insert.
At-least-once (not exactly-once) for side channels: the dead-letter topic (a replayed batch is dead-lettered again; match on
``fp-source``), ``pipeline_stats``, ``source_liveness.lines`` (approximate) and
detector hooks may see a replayed batch twice.  ``consumer_progress`` (every stats interval, one row per owned
partition: the newest Kafka time stored and committed, the lag) is what the live detectors wait on; a failed write
is retried at the next interval.  ``source_heartbeat_minute`` (migration 0008; every stats interval, one row per
source and minute with heartbeats, their earliest and latest ``ts=`` with the file's size and inode) lets history
runs judge past silences as live runs did; idempotent (min/max), a failed write is kept for the next interval, a
killed consumer loses the last interval's rows.

Backpressure: a store error (server down, owner restarting, insert refused) pauses every assigned partition and
retries the same batch with exponential backoff (``backoff_max_s``), forever, while still polling Kafka so the
group membership stays alive; memory is bounded by ``batch_lines + min(batch_lines, poll_messages)`` per
assigned partition (a partition whose buffer holds that many is paused) plus one batch in flight plus librdkafka's fetch queue
(``queued.max.messages.kbytes``).  Nothing is dropped.

Rebalances: static membership (``instance_id`` → ``group.instance.id``) lets a restarted consumer take its
partitions back at once; ``session_timeout_ms`` (default 6 s, the broker minimum) bounds how long a dead member
stalls its partitions.  On revocation buffered, uncommitted messages are dropped (the next owner re-reads them).

Limits (documented, not hidden): a consumer that is *frozen* (SIGSTOP, a debugger) past its session timeout and
then resumes may insert one batch the new owner has cut differently (Kafka offers no fencing for an external
store without transactions); kill -9 and crashes are safe.  A slow insert is no such freeze: the wait for it
polls (partitions paused) once it has run ``keepalive_after_s``, so the group membership is kept.  Different
consumer groups must not load the same topic into the same database.  A topic deleted and created again while a
consumer reads it: librdkafka keeps each partition's position; a new log shorter than that is read from its
start (offsets go back: the partition starts over as a new log, counted in ``forumpulse_log_restarts``), but of a
longer one the client skips the messages below the old position — stop the consumers before recreating a topic
(a restarted consumer reads the new log from its start: the group's offsets are deleted with the topic).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import signal
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import pyarrow as pa
import typer
from forumpulse.pipeline.config import Settings, load_settings, mask_url
from forumpulse.pipeline.contracts import (
    LISTENER_LABEL_RE,
    Beat,
    covering_listeners,
    file_grew,
    heartbeat_file_state,
    heartbeat_time_ms,
    split_values,
)
from forumpulse.pipeline.kafka_client import BrokerLink, client_config
from forumpulse.pipeline.metrics import PipelineMetrics, stats_table
from forumpulse.pipeline.runtime import error_line
from forumpulse.pipeline.sources import retired_after, retired_sources
from forumpulse.pipeline.store import Store, StoreError, StoreLocationError, migrate, open_store
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("forumpulse.consumer")

BATCHES_SCHEMA = pa.schema([
    ("group_id", pa.string()), ("topic", pa.string()), ("partition", pa.uint32()),
    ("first_offset", pa.uint64()), ("last_offset", pa.uint64()), ("messages", pa.uint32()),
    ("instance", pa.string()), ("created_at", pa.timestamp("ms", tz="UTC")),
    ("topic_id", pa.string()),  # migration 0004; "" = unknown (a broker without topic IDs, or rows from before)
])
LIVENESS_SCHEMA = pa.schema([
    ("site", pa.string()), ("origin_host", pa.string()), ("origin_file", pa.string()),
    ("last_line_ts", pa.timestamp("ms", tz="UTC")), ("last_heartbeat_ts", pa.timestamp("ms", tz="UTC")),
    ("lines", pa.uint64()), ("updated_at", pa.timestamp("ms", tz="UTC")),
])
PROGRESS_SCHEMA = pa.schema([  # migration 0007
    ("group_id", pa.string()), ("topic", pa.string()), ("partition", pa.uint32()),
    ("loaded_ts", pa.timestamp("ms", tz="UTC")), ("next_offset", pa.uint64()), ("lag", pa.int64()),
    ("active", pa.bool_()), ("instance", pa.string()), ("updated_at", pa.timestamp("ms", tz="UTC")),
])
#: ``source_heartbeat_minute`` leaves out a heartbeat whose ``ts=`` is further than this from its Kafka time (a
#: shipper clock far off, ``ts=0``): the log's first row tells the detectors from when it can answer for liveness
HEARTBEAT_LOG_MAX_SKEW_MS = 7 * 86_400_000
#: pending heartbeat-log rows kept while the store refuses them (the oldest minutes go first beyond this)
HEARTBEAT_LOG_MAX_PENDING = 200_000
#: a heartbeat as the log keeps it: (time, file size, inode); size and inode 0 when it carries none
BEAT_TYPE = pa.struct([("ts", pa.timestamp("ms", tz="UTC")), ("size", pa.uint64()), ("inode", pa.uint64())])
HEARTBEAT_LOG_SCHEMA = pa.schema([  # migration 0008
    ("site", pa.string()), ("origin_host", pa.string()), ("origin_file", pa.string()),
    ("minute", pa.timestamp("s", tz="UTC")), ("first_beat", BEAT_TYPE), ("last_beat", BEAT_TYPE),
])


def heartbeat_log_table(rows: Sequence[tuple[str, str, str, int, tuple[int, int, int], tuple[int, int, int]]]
                        ) -> pa.Table:
    """``source_heartbeat_minute`` rows from ``(site, origin_host, origin_file, minute ms, earliest, latest)``,
    each heartbeat ``(ms, file size, inode)``."""
    def beats(vals: list[tuple[int, int, int]]) -> pa.StructArray:
        return pa.StructArray.from_arrays(
            [pa.array([b[0] for b in vals], pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
             pa.array([b[1] for b in vals], pa.uint64()), pa.array([b[2] for b in vals], pa.uint64())],
            fields=list(BEAT_TYPE))

    return pa.table({
        "site": [r[0] for r in rows], "origin_host": [r[1] for r in rows], "origin_file": [r[2] for r in rows],
        "minute": pa.array([r[3] // 1000 for r in rows], pa.int64()).cast(pa.timestamp("s", tz="UTC")),
        "first_beat": beats([r[4] for r in rows]), "last_beat": beats([r[5] for r in rows])},
        schema=HEARTBEAT_LOG_SCHEMA)


@dataclass(frozen=True)
class BatchInfo:
    """What a hook learns about a batch besides its rows."""

    topic: str
    partition: int
    first_offset: int
    last_offset: int
    replay: bool


#: A detector hook: called after a batch is committed with the batch's ``stream`` table (real client addresses,
#: ``requests`` columns + ``query``).  Runs on the consumer thread: keep it fast (hand off to a queue for heavy
#: work).  Exceptions are logged and counted, never stop loading.  May see a replayed batch twice.
StreamHook = Callable[[pa.Table, BatchInfo], None]


@dataclass
class ConsumerOptions:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str = "weblogs.raw"
    dead_letter_topic: str | None = "weblogs.raw.dlq"
    group_id: str = "forumpulse-loader"
    instance_id: str | None = None
    batch_lines: int = 20_000
    #: a partition's batch is loaded when it has ``batch_lines`` messages or its oldest is this old (freshness)
    max_wait_s: float = 0.3
    poll_messages: int = 10_000
    session_timeout_ms: int = 6_000
    max_poll_interval_ms: int = 300_000
    #: an insert still running after this many seconds is waited for while polling (group membership kept)
    keepalive_after_s: float = 5.0
    #: librdkafka's prefetch queue: it fills while a batch is processed and inserted (65 MB ~ 200k lines)
    queued_max_kbytes: int = 65_536
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    stats_interval_s: float = 10.0
    liveness_interval_s: float = 2.0
    dead_letter_quarantined: bool = True
    #: extra librdkafka settings of the dead-letter producer (e.g. ``message.timeout.ms``)
    dead_letter_config: dict[str, Any] = field(default_factory=dict)
    #: failed delivery attempts of one batch's dead letters before each further retry logs an error
    dead_letter_error_after: int = 5
    #: insert batch k in a thread while batch k+1 is polled and processed (one batch in flight)
    pipeline_inserts: bool = True
    kafka_config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> ConsumerOptions:
        k = settings.kafka
        base: dict[str, Any] = {
            "bootstrap_servers": k.bootstrap_servers, "topic": k.raw_topic, "dead_letter_topic": k.dead_letter_topic,
            "group_id": k.group_id, "batch_lines": min(settings.ingest.batch_lines, 50_000),
            "queued_max_kbytes": k.consumer_queue_kbytes,
        }
        base.update({key: v for key, v in overrides.items() if v is not None})
        return cls(**base)


def _is_fatal(err: Any) -> bool:
    """A consumer error after which this consumer instance can do nothing more (librdkafka: fatal).  A message
    may carry it as code ``_FATAL`` without the fatal flag (e.g. "static consumer fenced by other consumer with
    same group.instance.id"): polling on would wait forever, so it ends the loader (the supervisor restarts it;
    nothing is lost: uncommitted batches are replayed and deduplicated)."""
    from confluent_kafka import KafkaError

    return bool(err.fatal()) or err.code() == KafkaError._FATAL


class _Revoked(Exception):
    """The partition being flushed was revoked while we waited (or we are stopping while the batch cannot
    finish): abandon the batch, uncommitted (the next owner replays it)."""


class _Part:
    __slots__ = ("first_seen", "msgs", "plan", "topic_id")

    def __init__(self) -> None:
        self.msgs: list[Any] = []
        #: recorded ranges to replay: (first, last, topic_id the range was recorded with); None = not loaded yet
        self.plan: deque[tuple[int, int, str]] | None = None
        self.first_seen = 0.0
        self.topic_id = ""  # the Kafka topic ID of the log being read (set with the plan)


@dataclass(eq=False)
class _Batch:
    """One batch between processing and commit (see :meth:`LiveConsumer._flush`)."""

    key: tuple[str, int]
    msgs: list[Any]
    replay: bool
    first: int
    last: int
    topic_id: str
    token: str
    t0: float
    intent: pa.Table | None = None
    requests: pa.Table | None = None
    quarantine: pa.Table | None = None
    stream_parts: list[pa.Table] = field(default_factory=list)
    dlq: list[tuple[int, str, str]] = field(default_factory=list)
    line_ts: dict[tuple[bytes, bytes, bytes], int] = field(default_factory=dict)
    line_n: dict[tuple[bytes, bytes, bytes], int] = field(default_factory=dict)
    heartbeats: dict[tuple[bytes, bytes, bytes], int] = field(default_factory=dict)
    #: (source, minute in ms) -> [earliest, latest] heartbeat (ms, size, inode) in it (``source_heartbeat_minute``)
    hb_minutes: dict[tuple[tuple[bytes, bytes, bytes], int], list[tuple[int, int, int]]] = field(default_factory=dict)
    hb_n: int = 0
    bad_n: int = 0
    read: int = 0
    loaded: int = 0
    quarantined: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    newest: int | None = None
    kafka_ts: int = 0  # the newest Kafka timestamp of the batch's messages (ms)
    stored: int = 0  # store steps done (intent, requests, quarantine)
    revoked: bool = False
    future: Future[BaseException | None] | None = None


def _sql_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def batch_token(topic: str, topic_id: str, partition: int, first: int, last: int) -> str:
    """The insert deduplication token of a batch (``:<table>`` is appended per table).

    ``topic_id`` is the Kafka topic ID of the log the offsets belong to; ``""`` (ranges recorded before topic IDs,
    a broker without them) gives the token those ranges were stored with."""
    if topic_id:
        return f"fp1:{topic}:{topic_id}:{partition}:{first}-{last}"
    return f"fp1:{topic}:{partition}:{first}-{last}"


class _ConsumerMetrics:
    """Consumer metrics beyond :class:`PipelineMetrics`, in the same registry (created once per registry)."""

    def __init__(self, r: CollectorRegistry) -> None:
        p = "forumpulse_"
        self.dlq_failures = Counter(
            p + "dead_letter_delivery_failures",
            "dead-letter messages the broker did not accept (error = librdkafka error name: topic missing, "
            "message too large, not authorized, timed out); their batch stays uncommitted and they are produced "
            "again", ["error"], registry=r)
        self.dlq_waiting = Gauge(
            p + "dead_letter_waiting",
            "1 while a batch's offset commit waits for its dead-letter messages to be delivered (loading stalls)",
            registry=r)
        self.plan_conflicts = Counter(
            p + "replay_plan_conflicts",
            "recorded batch ranges that do not fit the partition's current log (beyond its high watermark, or "
            "recorded without a topic ID for a log that was recreated); action=refused: the partition is not "
            "loaded (log truncated, see the error log), action=ignored: ranges without a topic ID not replayed",
            ["action"], registry=r)
        self.log_restarts = Counter(
            p + "log_restarts",
            "times a partition's offsets went back while it was assigned (its log recreated or truncated under a "
            "running consumer): what was read from the old log is dropped uncommitted and the new log is read "
            "like a new assignment (topic ID asked again)", registry=r)
        self.refused = Gauge(
            p + "partitions_refused",
            "assigned partitions not loaded because their recorded ranges lie beyond the log's end (log truncated)",
            registry=r)


_EXTRA_METRICS: weakref.WeakKeyDictionary[CollectorRegistry, _ConsumerMetrics] = weakref.WeakKeyDictionary()
_EXTRA_LOCK = threading.Lock()


def _consumer_metrics(metrics: PipelineMetrics) -> _ConsumerMetrics:
    with _EXTRA_LOCK:
        m = _EXTRA_METRICS.get(metrics.registry)
        if m is None:
            m = _EXTRA_METRICS[metrics.registry] = _ConsumerMetrics(metrics.registry)
        return m


_PENDING: Any = object()  # a dead letter whose delivery report has not arrived yet


def _delivery_report(results: list[Any], i: int, err: Any, _msg: Any) -> None:
    results[i] = err


def _error_name(err: Any) -> str:
    try:
        return str(err.name())
    except Exception:
        return type(err).__name__


class LiveConsumer:
    """One Kafka group member loading into ``store``.  Call :meth:`run`; :meth:`stop` (any thread) ends it.

    Misuse: one LiveConsumer per thread (the Processor and the Kafka client are not shared); do not give two
    live consumers the same ``instance_id`` (Kafka fences the older one).
    """

    def __init__(self, settings: Settings, store: Store, options: ConsumerOptions | None = None,
                 hooks: Sequence[StreamHook] = (), metrics: PipelineMetrics | None = None,
                 processor: Any = None) -> None:
        from forumpulse.pipeline.process import Processor

        self.settings = settings
        self.store = store
        self.opt = options or ConsumerOptions.from_settings(settings)
        self.instance = self.opt.instance_id or f"{socket.gethostname()}-{os.getpid()}"
        self.hooks = list(hooks)
        #: called with (first ts, last ts) of every replayed batch's requests (the owner's RollupAuditor)
        self.replay_listeners: list[Callable[[datetime, datetime], None]] = []
        self.metrics = metrics or PipelineMetrics("consumer", self.instance)
        #: whether the consumer reaches its brokers (librdkafka's statistics and errors): /fp/health, and the
        #: gauge forumpulse_kafka_reachable
        self.broker = BrokerLink()
        Gauge("forumpulse_kafka_reachable", "1 when the loader's Kafka client has a broker connection up, 0 when "
              "none (all brokers down), NaN until it knows", registry=self.metrics.registry
              ).set_function(self.broker.gauge_value)
        self.processor = processor or Processor(settings)
        self._stop = threading.Event()
        self._parts: dict[tuple[str, int], _Part] = {}
        self._paused: set[tuple[str, int]] = set()
        self._global_pause = False
        self._buffered = 0
        self._flushing: tuple[str, int] | None = None
        self._flush_revoked = False
        self._next_offset: dict[tuple[str, int], int] = {}
        #: per owned partition: the newest Kafka timestamp (ms) stored and committed in this assignment, and the
        #: (lag, position) found by the last :meth:`_compute_lag` -- written to ``consumer_progress``
        self._loaded_ts: dict[tuple[str, int], int] = {}
        self._part_lag: dict[tuple[str, int], tuple[int, int]] = {}
        self._seen: dict[tuple[str, int], int] = {}  # newest offset received per partition in this assignment
        self._liveness: dict[tuple[str, str, str], list[int]] = {}  # key -> [last_line_ms, last_hb_ms, lines]
        self._liveness_dirty: set[tuple[str, str, str]] = set()
        self._liveness_loaded = False
        #: (source, minute ms) -> [earliest, latest heartbeat] not yet written to ``source_heartbeat_minute``
        self._hb_log: dict[tuple[tuple[bytes, bytes, bytes], int], list[tuple[int, int, int]]] = {}
        self._last_message = time.monotonic()
        self._consumer: Any = None
        self._producer: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: _Batch | None = None
        self._admin: Any = None
        self._topic_ids: dict[str, str] = {}
        #: partitions whose batch was left uncommitted while stopping: nothing after it may be committed
        self._abandoned: set[tuple[str, int]] = set()
        #: partitions not loaded (recorded ranges beyond the log's end), with the reason
        self._refused: dict[tuple[str, int], str] = {}
        self.extra = _consumer_metrics(self.metrics)
        self.hook_errors = 0
        self.dead_letter_failures = 0

    # ------------------------------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _kafka_config(self) -> dict[str, Any]:
        o = self.opt
        conf: dict[str, Any] = {
            "bootstrap.servers": o.bootstrap_servers,
            "group.id": o.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": o.session_timeout_ms,
            "heartbeat.interval.ms": max(500, o.session_timeout_ms // 3),
            "max.poll.interval.ms": o.max_poll_interval_ms,
            "queued.max.messages.kbytes": o.queued_max_kbytes,
            "client.id": f"forumpulse-consumer-{self.instance}",
        }
        if o.instance_id:
            conf["group.instance.id"] = o.instance_id
        conf.update(self.broker.config())
        return client_config(conf, o.kafka_config)

    def run(self, idle_exit_s: float | None = None) -> dict[str, Any]:
        """Consume until :meth:`stop` (or, with ``idle_exit_s``, until caught up and idle that long).

        Returns the metrics summary.  On stop, full and timed-out batches are flushed and committed; a partial
        replay batch, and a batch whose store writes or dead letters keep failing, are left for the next owner
        (not committed, nor anything after them in their partition).
        """
        from confluent_kafka import Consumer
        from confluent_kafka.admin import AdminClient

        self._consumer = Consumer(self._kafka_config())
        self._admin = AdminClient(self._client_config())
        if self.opt.dead_letter_topic:
            self._producer = self._new_producer()
        self._consumer.subscribe([self.opt.topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                 on_lost=self._on_revoke)
        next_stats = time.monotonic() + self.opt.stats_interval_s
        next_live = time.monotonic() + self.opt.liveness_interval_s
        self._last_message = time.monotonic()
        if self.opt.pipeline_inserts:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="fp-insert")
        try:
            while not self._stop.is_set():
                self._poll(self._poll_timeout())
                self._flush_ready(force=False)
                if self._inflight is not None and self._inflight.future is not None and self._inflight.future.done():
                    self._finish_inflight()
                now = time.monotonic()
                if now >= next_live:
                    self._write_liveness()
                    next_live = now + self.opt.liveness_interval_s
                if now >= next_stats:
                    self._write_heartbeat_log()
                    self._write_stats()
                    next_stats = now + self.opt.stats_interval_s
                if idle_exit_s is not None and self._idle_and_caught_up(idle_exit_s):
                    log.info("caught up and idle for %.1f s: exiting", idle_exit_s)
                    break
            self._finish_inflight()
            self._flush_ready(force=True)
            self._finish_inflight()
            self._write_liveness()
            self._write_heartbeat_log()
            self._write_stats(final=True)
        finally:
            if self._pool is not None:  # a batch still in flight (an error above): let its insert end, uncommitted
                self._pool.shutdown(wait=True)
                self._pool = None
            self._inflight = None
            refused = len(self._refused)  # closing revokes every partition
            with contextlib.suppress(Exception):
                self._consumer.close()
            if self._producer is not None:
                self._producer.flush(10)
            self.extra.dlq_waiting.set(0)
        return {**self.metrics.summary(), "dead_letter_failures": self.dead_letter_failures,
                "partitions_refused": refused}

    def _client_config(self) -> dict[str, Any]:
        """Connection settings shared by the dead-letter producer and the admin client (topic IDs)."""
        return client_config({"bootstrap.servers": self.opt.bootstrap_servers},
                             {k: v for k, v in self.opt.kafka_config.items()
                              if k.startswith("security") or k.startswith("sasl") or k.startswith("ssl")})

    def _new_producer(self) -> Any:
        from confluent_kafka import Producer

        return Producer({**self._client_config(), "linger.ms": 20, "compression.type": "lz4",
                         "enable.idempotence": True, **self.opt.dead_letter_config})

    # ------------------------------------------------------------------------------------------ kafka side

    def _poll_timeout(self) -> float:
        """How long the next ``consume()`` may block.  It returns early only once ``poll_messages`` are there, so
        while a batch waits (or one is in flight) this is short: a batch's age is checked at least every 50 ms."""
        if self._buffered or self._inflight is not None:
            return 0.05
        return min(0.1, self.opt.max_wait_s)

    def _poll(self, timeout: float) -> None:
        started = time.monotonic()
        msgs = self._consumer.consume(num_messages=self.opt.poll_messages, timeout=timeout)
        if not msgs:
            return
        self._last_message = time.monotonic()
        parts = self._parts
        now = started  # a message may have waited in librdkafka's queue since the call began: age it from there
        errors = [m for m in msgs if m.error() is not None]
        if errors:
            for m in errors:
                err = m.error()
                if _is_fatal(err):
                    from confluent_kafka import KafkaException

                    raise KafkaException(err)
                log.warning("kafka: %s", err)
            msgs = [m for m in msgs if m.error() is None]
        # messages come in runs of one partition (one fetch response each): cut the runs with numpy and move
        # each as one list slice (we subscribe to one topic: a run's first message names it)
        pn = np.fromiter((m.partition() for m in msgs), dtype=np.int64, count=len(msgs))
        offs = np.fromiter((m.offset() for m in msgs), dtype=np.int64, count=len(msgs))
        cuts = [0, *(np.flatnonzero(pn[1:] != pn[:-1]) + 1).tolist(), len(msgs)]
        added = 0
        seen = self._seen
        restarted: list[tuple[str, int]] = []
        for a, z in itertools.pairwise(cuts):
            if a == z:
                continue
            key = (msgs[a].topic(), int(pn[a]))
            # offsets only grow within an assignment (our one seek, _seek_past_seen, goes forward past the last
            # offset seen): if they go back, the log was recreated (deleted and created again, broker data
            # replaced) or truncated while we read it
            last_off = int(offs[z - 1])
            if offs[a] <= seen.get(key, -1) or (z - a > 1 and bool((offs[a + 1:z] <= offs[a:z - 1]).any())):
                a = self._log_restarted(key, msgs, a, z)
                restarted.append(key)
            seen[key] = last_off
            p = parts.get(key)
            if p is None:  # a message for a partition we were not told about (should not happen): take it
                p = parts[key] = _Part()
            if not p.msgs:
                p.first_seen = now
            p.msgs.extend(msgs[a:z])
            added += z - a
        self._buffered += added
        self.metrics.set_buffered(self._buffered)
        if restarted:
            self._seek_past_seen(restarted)
        self._pause_full()

    def _seek_past_seen(self, keys: list[tuple[str, int]]) -> None:
        """Seek each partition to the offset after the last message it gave us.  After its log restarted (offsets
        went back), librdkafka keeps the old log's position as the partition's application position (it only
        moves forward): a pause and resume would then fetch from there, out of range, reset to the start and
        read the new log again and again, never committing its last partial batch (seen in a CI run).  A seek
        sets the position; messages librdkafka already fetched beyond it are fetched again."""
        from confluent_kafka import TopicPartition

        for topic, partition in keys:
            try:
                self._consumer.seek(TopicPartition(topic, partition, self._seen[(topic, partition)] + 1))
            except Exception as exc:  # not assigned any more (a rebalance): its next owner starts from a commit
                log.warning("%s/%d: seek after the log restart failed: %s", topic, partition, exc)

    def _log_restarted(self, key: tuple[str, int], msgs: list[Any], a: int, z: int) -> int:
        """The partition's offsets went back at some message of ``msgs[a:z]``: its log was recreated or
        truncated while assigned (librdkafka keeps the position across a topic deleted and created again; a
        shorter new log is then read from its start).  What was read before is dropped and not committed (the
        batch in flight included), and the partition starts over like a new assignment from the first message of
        the new log: its topic ID asked again, its recorded ranges read and checked.  Returns that message's
        index."""
        prev = self._seen.get(key, -1)
        i = a
        while i < z and msgs[i].offset() > prev:
            prev = msgs[i].offset()
            i += 1
        if i == z:  # cannot happen (offsets grew after all): nothing to do
            return a
        log.warning("%s/%s: offsets went back from %d to %d: the log was recreated (or truncated) while read; "
                    "reading it as a new log (%d message(s) read from the old one not loaded)", key[0], key[1],
                    prev, msgs[i].offset(), len(self._parts[key].msgs) if key in self._parts else 0)
        self.extra.log_restarts.inc()
        old = self._parts.get(key)
        if old is not None:
            self._buffered -= len(old.msgs)
        self._parts[key] = _Part()
        if self._inflight is not None and self._inflight.key == key:
            self._inflight.revoked = True  # its offsets belong to the old log: not committed
        if self._flushing == key:
            self._flush_revoked = True
        self._topic_ids.pop(key[0], None)
        self._next_offset.pop(key, None)
        self._loaded_ts.pop(key, None)  # the old log's times say nothing of the new one
        self._abandoned.discard(key)
        self._refused.pop(key, None)
        self.extra.refused.set(len(self._refused))
        return i

    def _cap(self, p: _Part) -> int:
        cap = self.opt.batch_lines
        if p.plan:
            first, last, _tid = p.plan[0]
            cap = max(cap, last - first + 1)
        return cap

    def _pause_at(self, p: _Part) -> int:
        cap = self._cap(p)
        return cap + min(cap, self.opt.poll_messages)

    def _pause_full(self) -> None:
        from confluent_kafka import TopicPartition

        # cap + one poll (at most 2 x cap): a partition that just filled a batch is flushed right after this poll;
        # pausing it would make librdkafka drop its prefetched messages and fetch them again after the resume
        to_pause = [k for k, p in self._parts.items() if k not in self._paused and len(p.msgs) >= self._pause_at(p)]
        if to_pause:
            self._consumer.pause([TopicPartition(t, n) for t, n in to_pause])
            self._paused.update(to_pause)
            self.metrics.paused.set(1)

    def _resume_drained(self) -> None:
        from confluent_kafka import TopicPartition

        if self._global_pause:
            return
        ready = [k for k in self._paused if k in self._parts and k not in self._refused
                 and len(self._parts[k].msgs) < self._pause_at(self._parts[k])]
        ready += [k for k in self._paused if k not in self._parts]
        if ready:
            with contextlib.suppress(Exception):
                self._consumer.resume([TopicPartition(t, n) for t, n in ready if (t, n) in self._parts])
            self._paused.difference_update(ready)
        if not self._paused:
            self.metrics.paused.set(0)

    def _pause_all(self) -> None:
        from confluent_kafka import TopicPartition

        self._global_pause = True
        self.metrics.paused.set(1)
        keys = list(self._parts)
        if keys:
            with contextlib.suppress(Exception):
                self._consumer.pause([TopicPartition(t, n) for t, n in keys])
            self._paused.update(keys)

    def _resume_all(self) -> None:
        self._global_pause = False
        self._resume_drained()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.metrics.rebalances.labels("assign").inc(len(partitions))
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._parts[key] = _Part()
            self._paused.discard(key)
            self._abandoned.discard(key)
            self._refused.pop(key, None)
            self._seen.pop(key, None)
        self.extra.refused.set(len(self._refused))
        log.info("assigned %s", [f"{tp.topic}/{tp.partition}" for tp in partitions])
        # the topic ID of the log we are about to read, asked before its first fetch (a topic deleted and created
        # again later revokes and assigns the partitions again, which asks again); on failure it is asked (with
        # retries) before the partition's first batch
        for topic in {tp.topic for tp in partitions}:
            self._topic_ids.pop(topic, None)
            try:
                self._topic_ids[topic] = self._describe_topic_id(topic, 5.0)
            except Exception as exc:
                log.warning("topic ID of %s not known yet (asked again before its first batch): %s", topic, exc)
        consumer.assign(partitions)
        if self._global_pause and partitions:  # the store is down: do not start fetching the new partitions
            self._paused.update((tp.topic, tp.partition) for tp in partitions)
            with contextlib.suppress(Exception):
                consumer.pause(partitions)
        elif partitions:
            # librdkafka keeps a partition's pause flag across its revocation and a new assignment to the same
            # consumer: a partition paused for a full buffer when the group lost it (a broker restart expires the
            # session) would come back paused and never fetch again, with no error (seen in
            # tests/test_live_consumer_kafka_outage.py).  A new assignment starts fetching.
            consumer.resume(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.metrics.rebalances.labels("revoke").inc(len(partitions))
        inf = self._inflight
        if inf is not None and inf.key in {(tp.topic, tp.partition) for tp in partitions}:
            # let its insert end (no write of ours after the partition is gone); it is not committed: the next
            # owner replays the recorded range and the store deduplicates it
            if inf.future is not None:
                inf.future.result()
            inf.revoked = True
        for tp in partitions:
            key = (tp.topic, tp.partition)
            p = self._parts.pop(key, None)
            if p is not None:
                self._buffered -= len(p.msgs)
            self._paused.discard(key)
            self._next_offset.pop(key, None)
            self._loaded_ts.pop(key, None)
            self._part_lag.pop(key, None)
            self._abandoned.discard(key)
            self._refused.pop(key, None)
            self._seen.pop(key, None)
            if self._flushing == key:
                self._flush_revoked = True
        self.extra.refused.set(len(self._refused))
        self.metrics.set_buffered(self._buffered)
        log.info("revoked %s", [f"{tp.topic}/{tp.partition}" for tp in partitions])

    def _idle_and_caught_up(self, idle_s: float) -> bool:
        if self._buffered or self._inflight is not None or time.monotonic() - self._last_message < idle_s:
            return False
        assignment = self._consumer.assignment()
        if not assignment:
            return False
        lag = self._compute_lag(assignment)
        return lag == 0

    def _compute_lag(self, assignment: list[Any] | None = None) -> int:
        assignment = assignment if assignment is not None else self._consumer.assignment()
        total = 0
        self._part_lag.clear()
        for tp in assignment:
            try:
                # cached: the high watermark arrives with every fetch response (a broker round trip costs ~0.4 s)
                _low, high = self._consumer.get_watermark_offsets(tp, cached=True)
                if high < 0:
                    _low, high = self._consumer.get_watermark_offsets(tp, timeout=2.0, cached=False)
            except Exception:
                return -1
            pos = self._next_offset.get((tp.topic, tp.partition))
            if pos is None:
                committed = self._consumer.committed([tp], timeout=5.0)[0].offset
                pos = committed if committed >= 0 else _low
            total += max(0, high - pos)
            self._part_lag[(tp.topic, tp.partition)] = (max(0, high - pos), pos)
        self.metrics.set_lag(total)
        return total

    # ------------------------------------------------------------------------------------------ batching

    def _describe_topic_id(self, topic: str, timeout: float) -> str:
        """The Kafka topic ID of ``topic`` (base64, as Kafka prints it), or "" when the broker has none."""
        from confluent_kafka import TopicCollection

        if self._admin is None:
            raise RuntimeError("no admin client (the consumer is not running)")
        fut = self._admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)[topic]
        tid = fut.result(timeout + 5).topic_id
        if tid is None or (tid.get_most_significant_bits() == 0 and tid.get_least_significant_bits() == 0):
            return ""  # a broker older than topic IDs (Kafka < 2.8)
        return str(tid)

    def _topic_id(self, key: tuple[str, int]) -> str:
        """The topic ID of the partition's log, asked (with retries) unless known since the assignment."""
        from confluent_kafka import KafkaException

        topic = key[0]
        if topic not in self._topic_ids:
            self._topic_ids[topic] = self._with_retry(lambda: self._describe_topic_id(topic, 10.0), key,
                                                      errors=(KafkaException, TimeoutError),
                                                      what="topic ID of " + topic)
        return self._topic_ids[topic]

    def _high_watermark(self, key: tuple[str, int]) -> int | None:
        from confluent_kafka import TopicPartition

        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), timeout=5.0, cached=False)
        except Exception as exc:
            log.warning("high watermark of %s/%s not known (%s): recorded ranges not checked against it", *key, exc)
            return None
        return int(high) if high >= 0 else None

    def _load_plan(self, key: tuple[str, int], p: _Part) -> None:
        """Read the recorded ranges to replay (see the module docstring): those of this log's topic ID at or
        after the first buffered offset, checked against the log's end; ranges recorded without a topic ID only
        while they clearly belong to this log.  Raises _Revoked when the partition is refused."""
        topic, partition = key
        start = p.msgs[0].offset()
        self._flushing = key
        self._flush_revoked = False
        try:
            tid = self._topic_id(key)
            sql = (
                "SELECT first_offset, last_offset, topic_id FROM consumer_batches FINAL WHERE group_id = "
                f"{_sql_str(self.opt.group_id)} AND topic = {_sql_str(topic)} AND partition = {partition} "
                f"AND topic_id IN ({_sql_str(tid)}, '') AND last_offset >= {start} ORDER BY first_offset"
            )
            rows = self._with_retry(lambda: self.store.query_rows(sql), key)
        finally:
            self._flushing = None
        own = [(int(a), int(b), tid) for a, b, t in rows if t == tid]
        legacy = [(int(a), int(b), "") for a, b, t in rows if t != tid]  # recorded before topic IDs
        high = self._high_watermark(key) if rows else None
        if high is not None:  # the log holds at least what we already read from it
            high = max(high, p.msgs[-1].offset() + 1)
        if own and high is not None and max(r[1] for r in own) >= high:
            self._refuse(key, p, tid, max(r[1] for r in own), high)
            raise _Revoked()
        if legacy:
            legacy = self._legacy_ranges(key, start, legacy, high, tid)
            legacy = [r for r in legacy if not any(r[0] <= o[1] and o[0] <= r[1] for o in own)]
        p.topic_id = tid
        p.plan = deque(sorted(own + legacy))
        if p.plan:
            log.info("replay plan for %s/%s (topic ID %s) from offset %d: %d batch(es) %s", topic, partition,
                     tid or "-", start, len(p.plan), [r[:2] for r in list(p.plan)[:5]])

    def _legacy_ranges(self, key: tuple[str, int], start: int, legacy: list[tuple[int, int, str]],
                       high: int | None, tid: str) -> list[tuple[int, int, str]]:
        """Ranges recorded without a topic ID (before migration 0004), replayed with the tokens they were stored
        with only when they belong to this log: the group's committed offset is where reading started (a
        recreated topic loses its committed offsets) and every range ends below the log's end.  Otherwise they
        are ignored: this log's batches carry its topic ID in their tokens and cannot collide with them."""
        from confluent_kafka import TopicPartition

        reason = None
        last = max(r[1] for r in legacy)
        if high is None:
            reason = "the log's end offset is unknown"
        elif last >= high:
            reason = f"they reach offset {last}, beyond the log's end ({high})"
        else:
            try:
                committed = int(self._consumer.committed([TopicPartition(*key)], timeout=10.0)[0].offset)
            except Exception as exc:
                committed, reason = -1, f"the committed offset is not known ({exc})"
            if reason is None and committed != start:
                reason = (f"reading started at offset {start}, not at a committed offset of the group "
                          f"({committed if committed >= 0 else 'none'})")
        if reason is None:
            return legacy
        self.extra.plan_conflicts.labels("ignored").inc(len(legacy))
        log.warning("%s/%s: %d batch range(s) recorded without a topic ID are not replayed (topic recreated or "
                    "broker data replaced?): %s; this log's batches carry its topic ID %s in their tokens",
                    key[0], key[1], len(legacy), reason, tid)
        return []

    def _refuse(self, key: tuple[str, int], p: _Part, tid: str, last: int, high: int) -> None:
        """Stop loading a partition whose recorded ranges reach beyond its log's end (see _load_plan)."""
        from confluent_kafka import TopicPartition

        topic, partition = key
        reason = (
            f"{topic}/{partition}: batches up to offset {last} were loaded from this log (topic ID {tid or '-'}, "
            f"group {self.opt.group_id}), but the log now ends at offset {high}: it was truncated (unclean leader "
            "election, lost broker data).  New messages at the offsets already loaded would reuse their insert "
            "deduplication tokens and be dropped, so this partition is NOT loaded.  To load it anyway, delete the "
            f"ranges at or beyond {high} (ALTER TABLE consumer_batches DELETE WHERE group_id = "
            f"{_sql_str(self.opt.group_id)} AND topic = {_sql_str(topic)} AND partition = {partition} AND "
            f"last_offset >= {high}) and restart the consumer; new batches that happen to cover exactly the same "
            "offsets as a loaded one can still be dropped (recreating the topic avoids that)"
        )
        log.error("%s", reason)
        self.extra.plan_conflicts.labels("refused").inc()
        self._refused[key] = reason
        self.extra.refused.set(len(self._refused))
        self._buffered -= len(p.msgs)
        p.msgs.clear()
        self.metrics.set_buffered(self._buffered)
        with contextlib.suppress(Exception):
            self._consumer.pause([TopicPartition(topic, partition)])
        self._paused.add(key)

    def _store_idle(self) -> bool:
        return self._inflight is None or self._inflight.future is None or self._inflight.future.done()

    def _rest_waiting(self, key: tuple[str, int], last: int, have: int) -> bool:
        """Whether the partition's high watermark (cached from fetch responses, no broker round trip) is at least
        a full batch beyond ``last``."""
        from confluent_kafka import TopicPartition

        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
        except Exception:
            return False
        return bool(high - (last + 1) >= self.opt.batch_lines - have)

    def _cut(self, key: tuple[str, int], p: _Part, now: float, force: bool) -> tuple[int, bool] | None:
        """How many buffered messages form the next batch (and whether it is a replay), or None to wait."""
        msgs = p.msgs
        if not msgs:
            return None
        plan = p.plan
        assert plan is not None
        first_off = msgs[0].offset()
        while plan and plan[0][1] < first_off:
            plan.popleft()
        if plan:
            pf, pl, _tid = plan[0]
            if pf > first_off:  # messages before the recorded range: a fresh batch that ends just before it
                n = 0
                while n < len(msgs) and msgs[n].offset() < pf:
                    n += 1
                return min(n, self.opt.batch_lines), False
            if msgs[-1].offset() >= pl:
                n = 0
                while n < len(msgs) and msgs[n].offset() <= pl:
                    n += 1
                return n, True
            return None  # wait for the rest of the recorded range (never flush a partial replay)
        if len(msgs) >= self.opt.batch_lines:
            return self.opt.batch_lines, False
        age = now - p.first_seen
        if force or age >= 10 * self.opt.max_wait_s:
            return len(msgs), False
        # old enough, unless the store is still busy with the batch in flight (an insert costs about the same
        # whatever its size, so partial batches grow while the store is busy instead of queueing behind it:
        # group commit), or Kafka already holds the rest of a full batch (the consumer is behind)
        if (age >= self.opt.max_wait_s and self._store_idle()
                and not self._rest_waiting(key, msgs[-1].offset(), len(msgs))):
            return len(msgs), False
        return None

    def _flush_ready(self, force: bool) -> None:
        progressed = True
        while progressed and not (self._stop.is_set() and not force):
            progressed = False
            for key in list(self._parts):
                p = self._parts.get(key)
                if p is None or not p.msgs:
                    continue
                if key in self._refused:  # not loaded (paused): drop what was fetched before the pause
                    self._buffered -= len(p.msgs)
                    p.msgs.clear()
                    self.metrics.set_buffered(self._buffered)
                    continue
                if key in self._abandoned:  # a batch was left uncommitted (stopping): nothing after it
                    continue
                if p.plan is None:
                    try:
                        self._load_plan(key, p)
                    except _Revoked:
                        continue
                cut = self._cut(key, p, time.monotonic(), force)
                if cut is None or cut[0] == 0:
                    continue
                n, replay = cut
                batch = p.msgs[:n]
                assert p.plan is not None
                tid = p.plan[0][2] if replay else p.topic_id
                recorded = (p.plan[0][0], p.plan[0][1]) if replay else None
                try:
                    self._flush(key, batch, replay, tid, recorded)
                except _Revoked:
                    log.info("partition %s/%s revoked during its batch: left for the next owner", *key)
                    continue
                p2 = self._parts.get(key)
                if p2 is p:
                    del p.msgs[:n]
                    self._buffered -= n
                    if replay and p.plan:
                        p.plan.popleft()
                    p.first_seen = time.monotonic()
                    progressed = True
                self.metrics.set_buffered(self._buffered)
            self._resume_drained()
            if self._stop.is_set() and not force:
                break

    # ------------------------------------------------------------------------------------------ one batch

    def _with_retry(self, fn: Callable[[], Any], key: tuple[str, int] | None,
                    errors: tuple[type[BaseException], ...] = (StoreError,), what: str = "store") -> Any:
        delay = self.opt.backoff_initial_s
        paused_here = False
        failures, since = 0, time.monotonic()
        try:
            while True:
                try:
                    out = fn()
                    if failures:  # said once it works again (user trial 43: only the failures were logged)
                        log.info("%s answers again after %d failed attempt(s) over %.0f s", what, failures,
                                 time.monotonic() - since)
                    return out
                except errors as exc:
                    failures += 1
                    if isinstance(exc, StoreError):
                        self.metrics.record_store_error()
                    log.warning("%s error (retrying in %.1f s): %s", what, delay, error_line(exc, 300))
                    if not paused_here:
                        self._pause_all()
                        paused_here = True
                    self._flushing = key
                    deadline = time.monotonic() + delay
                    while time.monotonic() < deadline:
                        # keep the group membership alive; paused partitions deliver nothing new
                        self._poll(min(0.2, max(0.0, deadline - time.monotonic())))
                        if key is not None and self._flush_revoked:
                            raise _Revoked() from None
                        if self._stop.is_set():  # shutting down: leave the batch uncommitted (replayed later)
                            raise _Revoked() from None
                    delay = min(self.opt.backoff_max_s, delay * 2)
        finally:
            if paused_here:
                self._resume_all()

    def _flush(self, key: tuple[str, int], msgs: list[Any], replay: bool, topic_id: str,
               recorded: tuple[int, int] | None = None) -> None:
        """Load one batch: process it here, then store it (in the insert thread, one batch in flight) and commit.

        The previous in-flight batch is finished (stored, dead letters flushed, committed) before this one is
        submitted, so commits stay in batch order; this batch's intent and rows are written by the insert thread
        in that order (intent first).  Processing batch k+1 overlaps the insert of batch k."""
        t0 = time.perf_counter()
        part = self._parts.get(key)
        b = self._prepare(key, msgs, replay, t0, topic_id, recorded)
        self._finish_inflight()  # may poll (store retries): the partition may be revoked meanwhile
        if self._parts.get(key) is not part or key in self._abandoned or key in self._refused:
            raise _Revoked()
        if self._pool is None:
            self._finish(b, self._store_batch(b))
            return
        self._inflight = b
        b.future = self._pool.submit(self._store_batch, b)

    def _prepare(self, key: tuple[str, int], msgs: list[Any], replay: bool, t0: float,
                 topic_id: str = "", recorded: tuple[int, int] | None = None) -> _Batch:
        """The pure part of a batch: split envelopes by source, process each source's lines (no store I/O).

        ``recorded`` is a replay's recorded range ``(first, last)``: the batch's range, token and intent are that
        range's even when retention deleted its first messages meanwhile (``msgs`` then starts later), so the
        replay's blocks carry the stored blocks' tokens."""
        from forumpulse.pipeline.process import SourceContext

        topic, partition = key
        first, last = recorded if recorded is not None else (msgs[0].offset(), msgs[-1].offset())
        token = batch_token(topic, topic_id, partition, first, last)
        b = _Batch(key, msgs, replay, first, last, topic_id, token, t0)
        values = [m.value() for m in msgs]
        tss = np.fromiter((m.timestamp()[1] for m in msgs), dtype=np.int64, count=len(msgs))
        batch_ts = max(0, int(tss.max()))
        # the Kafka time is the producer's clock (CreateTime): one ahead of ours is clamped to ours, so a skewed
        # producer cannot make a partition look loaded beyond now (consumer_progress.loaded_ts)
        b.kafka_ts = min(batch_ts, int(time.time() * 1000))
        sb = split_values(values, blocks=True)
        b.bad_n = len(sb.bad)
        b.hb_n = len(sb.heartbeats)
        for i, src, hline in sb.heartbeats:
            hts = heartbeat_time_ms(hline, int(tss[i]))
            if hts > b.heartbeats.get(src, 0):
                b.heartbeats[src] = hts
            if abs(hts - int(tss[i])) > HEARTBEAT_LOG_MAX_SKEW_MS:
                continue  # a shipper clock far off (or ts=0): kept out of the log, whose first row dates it
            beat = (hts, *heartbeat_file_state(hline))
            span = b.hb_minutes.setdefault((src, hts - hts % 60_000), [beat, beat])
            span[0], span[1] = min(span[0], beat), max(span[1], beat)
        for (site_b, host_b, file_b, _fmt), (pos, _lines) in sb.groups.items():
            src = (site_b, host_b, file_b)
            b.line_n[src] = b.line_n.get(src, 0) + len(pos)
            ts = int(tss[pos].max())
            if ts > b.line_ts.get(src, 0):
                b.line_ts[src] = ts

        req_parts, q_parts = [], []
        src_ref = f"kafka:{topic}/{partition}"
        for (site, host, file, fmt), (idx, lines) in sb.groups.items():
            ctx = SourceContext(site=site.decode("utf-8", "backslashreplace"),
                                origin_host=host.decode("utf-8", "backslashreplace"),
                                origin_file=file.decode("utf-8", "backslashreplace"),
                                format=fmt.decode("utf-8", "backslashreplace"))
            pb = self.processor.process(lines, ctx, line_no_base=0, source_ref=src_ref)
            b.read += pb.read
            b.loaded += pb.loaded
            b.quarantined += pb.quarantined
            for k, v in pb.by_reason.items():
                b.by_reason[k] = b.by_reason.get(k, 0) + v
            if pb.newest_ts is not None:
                nts = _ts_ms(pb.newest_ts)
                b.newest = nts if b.newest is None or nts > b.newest else b.newest
            if pb.requests.num_rows:
                req_parts.append(pb.requests)
                b.stream_parts.append(pb.stream)
            if pb.quarantine.num_rows:
                q = pb.quarantine
                positions = idx[q.column("line_no").to_numpy()].tolist()
                offsets = pa.array([msgs[j].offset() for j in positions], pa.uint64())
                q = q.set_column(q.schema.get_field_index("line_no"), "line_no", offsets)
                q = q.set_column(q.schema.get_field_index("ingested_at"), "ingested_at",
                                 pa.array([batch_ts] * q.num_rows, pa.timestamp("ms", tz="UTC")))
                q_parts.append(q)
                if self.opt.dead_letter_quarantined:
                    for j, reason, detail in zip(positions, q.column("reason").to_pylist(),
                                                 q.column("detail").to_pylist(), strict=True):
                        b.dlq.append((j, reason, detail))
        for j in sb.bad:
            b.dlq.append((j, "bad_envelope", "not a weblogs.raw v1 envelope"))
        b.intent = pa.Table.from_pylist([{
            "group_id": self.opt.group_id, "topic": topic, "partition": partition, "first_offset": first,
            "last_offset": last, "messages": len(msgs), "instance": self.instance,
            "created_at": int(time.time() * 1000), "topic_id": topic_id,
        }], schema=BATCHES_SCHEMA)
        b.requests = pa.concat_tables(req_parts) if req_parts else None
        b.quarantine = pa.concat_tables(q_parts) if q_parts else None
        return b

    def _store_batch(self, b: _Batch, start: int = 0) -> BaseException | None:
        """Write the batch's intent, then its rows (each with its token), from step ``start`` on.  Runs in the
        insert thread; returns the exception instead of raising (the consumer thread decides: retry or die)."""
        steps = [("consumer_batches", b.intent, ":batch"), ("requests", b.requests, ":requests"),
                 ("quarantine", b.quarantine, ":quarantine")]
        try:
            for i in range(start, len(steps)):
                table, data, suffix = steps[i]
                if data is not None:
                    self.store.insert(table, data, dedup_token=b.token + suffix)
                b.stored = i + 1
        except BaseException as exc:  # handed to the consumer thread
            return exc
        return None

    def _finish_inflight(self) -> None:
        """Wait for the batch in flight (if any) and finish it: retry a failed store, dead letters, commit."""
        b = self._inflight
        if b is None:
            return
        assert b.future is not None
        self._await_insert(b)
        self._inflight = None
        self._finish(b, b.future.result())

    def _await_insert(self, b: _Batch) -> None:
        """Wait for ``b``'s insert; one still running after ``keepalive_after_s`` is waited for while polling
        with every partition paused, as store retries do.  Without polling, an insert longer than
        ``max.poll.interval.ms`` (a busy chDB engine lock, a slow server: clickhouse-connect's read timeout is the
        same 300 s) made librdkafka leave the group: the commit failed, and the batch prepared meanwhile was
        stored by this consumer while its successor cut the same offsets differently (stored twice).  A
        revocation while waiting marks ``b`` revoked (``_on_revoke``): it is then not committed."""
        assert b.future is not None
        done, _ = wait([b.future], timeout=self.opt.keepalive_after_s)
        if done:
            return
        self.metrics.record_slow_insert()
        self._pause_all()
        try:
            while not b.future.done():
                self._poll(0.2)  # keeps the group membership; paused partitions deliver nothing new
        finally:
            self._resume_all()

    def _finish(self, b: _Batch, exc: BaseException | None) -> None:
        key = b.key
        topic, partition = key
        self._flushing = key
        self._flush_revoked = b.revoked
        try:
            if exc is not None:
                if not isinstance(exc, StoreError):
                    raise exc
                self.metrics.record_store_error()
                log.warning("store error (retrying): %s", error_line(exc, 300))
                if b.revoked:
                    raise _Revoked()

                def again() -> None:
                    e = self._store_batch(b, b.stored)
                    if e is not None:
                        raise e

                self._with_retry(again, key)
            if b.revoked or key in self._abandoned:
                raise _Revoked()
            if b.dlq:
                self._dead_letter(b)
            self._commit(topic, partition, b.last)
            self._next_offset[key] = b.last + 1
            self._loaded_ts[key] = max(self._loaded_ts.get(key, 0), b.kafka_ts)
        except _Revoked:
            if self._flush_revoked or key not in self._parts:
                log.info("partition %s/%s revoked during its batch: left for the next owner", *key)
            else:  # stopping while the batch could not finish: no later batch of the partition may be committed
                self._abandoned.add(key)
                log.warning("%s/%s: batch %d-%d left uncommitted (stopping); the next run replays it", topic,
                            partition, b.first, b.last)
            return
        finally:
            self._flushing = None

        if b.replay:
            self._advise_rollup_check(b)
        # side channels (at-least-once): liveness, metrics, hooks
        for src, ts in b.line_ts.items():
            self._touch_liveness(src, line_ms=ts, n=b.line_n[src])
        for src, ts in b.heartbeats.items():
            self._touch_liveness(src, hb_ms=ts)
        for (src, minute), (lo, hi) in b.hb_minutes.items():
            span = self._hb_log.setdefault((src, minute), [lo, hi])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
        if b.hb_n:
            self.metrics.record_heartbeats(b.hb_n)
        self.metrics.record_batch(b.read + b.bad_n, b.loaded, b.quarantined, b.by_reason,
                                  time.perf_counter() - b.t0, b.newest, b.replay)
        if b.stream_parts and self.hooks:
            stream = pa.concat_tables(b.stream_parts)
            info = BatchInfo(topic, partition, b.first, b.last, b.replay)
            for hook in self.hooks:
                try:
                    hook(stream, info)
                except Exception:
                    self.hook_errors += 1
                    log.exception("stream hook %r failed", hook)

    def _advise_rollup_check(self, b: _Batch) -> None:
        """A replayed batch was recorded but not committed by an earlier owner: if that process was killed while
        its insert committed the tables' parts one by one, one rollup may lack the block even though the replay
        was deduplicated everywhere.  Say which hours to check (``forumpulse db check-rollups``)."""
        if b.requests is None or b.requests.num_rows == 0 or "ts" not in b.requests.column_names:
            return
        import pyarrow.compute as pc

        mm = pc.min_max(b.requests.column("ts"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        if lo is None or hi is None:
            return
        fmt = "%Y-%m-%dT%H:00"
        for listener in self.replay_listeners:
            try:
                listener(lo, hi)
            except Exception:
                log.exception("replay listener %r failed", listener)
        log.warning("%s/%d: batch %d-%d was replayed (its earlier insert was not committed: a crash or a revoke). "
                    "If that process was killed mid-insert one rollup can lack the block; check with `forumpulse db "
                    "check-rollups --from %s --to %s` (add --repair to rebuild from requests)", b.key[0], b.key[1],
                    b.first, b.last, lo.strftime(fmt), (hi + timedelta(hours=1)).strftime(fmt))

    def _dead_letter(self, b: _Batch) -> None:
        """Produce the batch's dead letters and return once the broker acknowledged every one of them.

        ``flush()`` alone does not say that: a message the broker refused (topic missing, message too large, not
        authorized, timed out) leaves the queue too.  Each message gets a delivery report; refused ones are
        produced again with backoff, forever (an error is logged after ``dead_letter_error_after`` attempts),
        while the consumer keeps polling (paused) to stay in the group.  Raises _Revoked when the partition is
        revoked, or when stopping while a dead letter is undelivered: the batch then stays uncommitted."""
        if self._producer is None or not self.opt.dead_letter_topic:
            return
        topic, partition = b.key
        todo: list[tuple[Any, Any, list[tuple[str, bytes]], str]] = []
        for j, reason, detail in b.dlq:
            m = b.msgs[j]
            headers = [("fp-reason", reason.encode()), ("fp-detail", detail.encode("utf-8", "replace")[:1000]),
                       ("fp-source", f"{topic}/{partition}/{m.offset()}".encode())]
            todo.append((m.value(), m.key(), headers, reason))
        delay = self.opt.backoff_initial_s
        attempt = 0
        paused = False
        next_error_log = 0.0
        try:
            while True:
                results = self._dlq_send(todo)
                started = next_note = time.monotonic()
                while any(r is _PENDING for r in results):
                    self._producer.flush(0.2)  # serves the delivery reports
                    now = time.monotonic()
                    if now - started < 1.0:
                        continue
                    # slow (a topic the broker does not know is only given up after
                    # topic.metadata.propagation.max.ms, 30 s): stay in the group, notice revocation and stop
                    if not paused:
                        self._pause_all()
                        self.extra.dlq_waiting.set(1)
                        paused = True
                    self._poll(0)
                    if self._flush_revoked:
                        raise _Revoked()
                    if self._stop.is_set() and now - started >= 5.0:
                        log.warning("%s/%s: stopping with dead letters of batch %d-%d undelivered: left "
                                    "uncommitted", topic, partition, b.first, b.last)
                        raise _Revoked()
                    if now >= next_note + 10:
                        next_note = now
                        log.warning("%s/%s: %d dead letter(s) of batch %d-%d not acknowledged after %.0f s "
                                    "(the batch is not committed until they are)", topic, partition,
                                    sum(r is _PENDING for r in results), b.first, b.last, now - started)
                failed = []
                for rec, err in zip(todo, results, strict=True):
                    if err is None:
                        self.metrics.record_dead_letter(rec[3])
                    else:
                        failed.append(rec)
                        self.extra.dlq_failures.labels(_error_name(err)).inc()
                if not failed:
                    return
                attempt += 1
                self.dead_letter_failures += len(failed)
                errors = sorted({str(err) for err in results if err is not None})
                what = (f"{len(failed)} of {len(todo)} dead letter(s) of {topic}/{partition} batch "
                        f"{b.first}-{b.last} not delivered to {self.opt.dead_letter_topic} (attempt {attempt}): "
                        f"{'; '.join(errors)[:500]}")
                now = time.monotonic()
                if attempt < self.opt.dead_letter_error_after:
                    log.warning("%s; retrying in %.1f s (the batch stays uncommitted)", what, delay)
                elif now >= next_error_log:
                    next_error_log = now + 30
                    log.error("%s; the batch and every later one of the partition stay uncommitted and loading is "
                              "stalled until the dead-letter topic accepts them (does it exist? message size, "
                              "ACLs?); retrying every %.1f s", what, delay)
                # a new producer for the next attempt: one that was told the topic does not exist refuses it
                # until its next metadata refresh (minutes), and a fatal error ends a producer for good
                with contextlib.suppress(Exception):
                    self._producer.purge()
                self._producer = self._new_producer()
                if not paused:
                    self._pause_all()
                    self.extra.dlq_waiting.set(1)
                    paused = True
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline:
                    self._poll(min(0.2, max(0.0, deadline - time.monotonic())))
                    if self._flush_revoked:
                        raise _Revoked()
                    if self._stop.is_set():
                        log.warning("%s/%s: stopping with dead letters of batch %d-%d undelivered: left "
                                    "uncommitted", topic, partition, b.first, b.last)
                        raise _Revoked()
                delay = min(self.opt.backoff_max_s, delay * 2)
                todo = failed
        finally:
            if paused:
                self.extra.dlq_waiting.set(0)
                self._resume_all()

    def _dlq_send(self, todo: list[tuple[Any, Any, list[tuple[str, bytes]], str]]) -> list[Any]:
        """Produce ``todo`` to the dead-letter topic; returns one slot per message, filled with its delivery
        report's error (None = delivered) or, for a message refused at once, the exception's error."""
        from confluent_kafka import KafkaException

        results: list[Any] = [_PENDING] * len(todo)
        for i, (value, mkey, headers, _reason) in enumerate(todo):
            while True:
                try:
                    self._producer.produce(self.opt.dead_letter_topic, value=value, key=mkey, headers=headers,
                                           on_delivery=functools.partial(_delivery_report, results, i))
                    break
                except BufferError:
                    self._producer.poll(0.1)
                except KafkaException as exc:  # refused before sending (message too large, fatal error ...)
                    results[i] = exc.args[0] if exc.args else exc
                    break
        return results

    def _commit(self, topic: str, partition: int, last: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        if self._flush_revoked or (topic, partition) in self._abandoned:
            raise _Revoked()
        try:
            self._consumer.commit(offsets=[TopicPartition(topic, partition, last + 1)], asynchronous=False)
        except KafkaException as exc:
            # rebalance in progress / fenced: the rows are stored with their token; the next owner replays the
            # recorded range and the store deduplicates it
            self.metrics.record_commit_failure()
            log.warning("offset commit for %s/%d failed (the batch will be replayed): %s", topic, partition, exc)

    # ------------------------------------------------------------------------------------------ liveness, stats

    def _touch_liveness(self, src: tuple[bytes, bytes, bytes], line_ms: int | None = None, hb_ms: int | None = None,
                        n: int = 0) -> None:
        key = tuple(x.decode("utf-8", "backslashreplace") for x in src)
        st = self._liveness.setdefault(key, [0, 0, 0])  # type: ignore[arg-type]
        if line_ms is not None and line_ms > st[0]:
            st[0] = line_ms
        if hb_ms is not None and hb_ms > st[1]:
            st[1] = hb_ms
        st[2] += n
        self._liveness_dirty.add(key)  # type: ignore[arg-type]

    def _write_heartbeat_log(self) -> None:
        """Append the heartbeat minutes seen since the last write to ``source_heartbeat_minute`` (migration 0008:
        what lets a history run judge a past silence as a live run did).  Idempotent: a row written twice (a
        replay, a retry after an ambiguous error) folds into the same minimum and maximum.  A failed write keeps
        the rows for the next interval (at most :data:`HEARTBEAT_LOG_MAX_PENDING`, oldest dropped first).  Not
        at-least-once: the rows are written after the batch's offsets are committed, so a killed consumer loses
        the last stats interval's (10 s) -- shorter than ``heartbeat_fresh_seconds``, so no minute reads as
        without heartbeats for that alone."""
        if not self._hb_log:
            return
        pending, self._hb_log = self._hb_log, {}
        rows = [(*(x.decode("utf-8", "backslashreplace") for x in src), minute, lo, hi)
                for (src, minute), (lo, hi) in pending.items()]
        try:
            self.store.insert("source_heartbeat_minute", heartbeat_log_table(rows))  # type: ignore[arg-type]
        except StoreError as exc:  # a side channel, as liveness: kept (merged with newer minutes) for the next write
            for key, (lo, hi) in pending.items():
                span = self._hb_log.setdefault(key, [lo, hi])
                span[0], span[1] = min(span[0], lo), max(span[1], hi)
            if len(self._hb_log) > HEARTBEAT_LOG_MAX_PENDING:  # a store refusing for hours: bounded memory
                for key in sorted(self._hb_log, key=lambda k: k[1])[:len(self._hb_log) - HEARTBEAT_LOG_MAX_PENDING]:
                    del self._hb_log[key]
            self.metrics.record_store_error()
            log.warning("heartbeat log write failed (will retry): %s", error_line(exc))

    def _write_liveness(self) -> None:
        if not self._liveness_dirty:
            return
        try:
            if not self._liveness_loaded:
                # merge with what other consumers (and earlier runs) recorded, so the newest evidence wins
                for site, host, file, ll, lh, n in self.store.query_rows(
                    "SELECT site, origin_host, origin_file, toUnixTimestamp64Milli(max(last_line_ts)), "
                    "toUnixTimestamp64Milli(max(last_heartbeat_ts)), max(lines) FROM source_liveness "
                    "GROUP BY site, origin_host, origin_file"
                ):
                    st = self._liveness.setdefault((site, host, file), [0, 0, 0])
                    st[0] = max(st[0], int(ll))
                    st[1] = max(st[1], int(lh))
                    st[2] += int(n)
                self._liveness_loaded = True
            now = int(time.time() * 1000)
            rows = [{"site": k[0], "origin_host": k[1], "origin_file": k[2], "last_line_ts": v[0],
                     "last_heartbeat_ts": v[1], "lines": v[2], "updated_at": now}
                    for k, v in self._liveness.items() if k in self._liveness_dirty]
            self.store.insert("source_liveness", pa.Table.from_pylist(rows, schema=LIVENESS_SCHEMA))
            self._liveness_dirty.clear()
        except StoreError as exc:  # liveness is a side channel: retried at the next interval
            self.metrics.record_store_error()
            log.warning("liveness write failed (will retry): %s", error_line(exc))

    def _write_stats(self, final: bool = False) -> None:
        lag = -1
        with contextlib.suppress(Exception):
            lag = self._compute_lag()
        row = self.metrics.stats_row()
        try:
            self.store.insert("pipeline_stats", stats_table([row]))
        except StoreError as exc:
            self.metrics.record_store_error()
            log.warning("pipeline_stats write failed: %s", error_line(exc))
        self._write_progress(lag >= 0, final)

    def _write_progress(self, lag_known: bool, final: bool) -> None:
        """One ``consumer_progress`` row per owned partition (see migration 0007): the newest Kafka timestamp
        stored and committed (no later than this consumer's clock), the lag and position from the last
        :meth:`_compute_lag` (-1 when it failed), ``active`` false on the final write of a clean exit (the partition is released; its next owner writes its
        own rows).  A partition behind its high watermark with nothing stored yet in this assignment is not
        written: its previous owner's row (older, so the detectors hold back to it) stands.  A side channel like
        liveness: a failed write is retried at the next interval."""
        now = int(time.time() * 1000)
        rows = []
        for key in self._parts:
            if key in self._refused:
                continue
            lag, pos = self._part_lag.get(key, (-1, -1)) if lag_known else (-1, -1)
            # _loaded_ts and _next_offset are set, and dropped, together (a log restart drops both): the time
            # written is that of next_offset - 1
            loaded = self._loaded_ts.get(key, 0)
            if lag != 0 and loaded == 0:
                continue
            rows.append({"group_id": self.opt.group_id, "topic": key[0], "partition": key[1], "loaded_ts": loaded,
                         "next_offset": max(0, self._next_offset.get(key, pos)), "lag": lag, "active": not final,
                         "instance": self.instance, "updated_at": now})
        if not rows:
            return
        try:
            self.store.insert("consumer_progress", pa.Table.from_pylist(rows, schema=PROGRESS_SCHEMA))
        except StoreError as exc:
            self.metrics.record_store_error()
            log.warning("consumer_progress write failed (will retry): %s", error_line(exc))


# ---------------------------------------------------------------------------------------------- envelope split


def _ts_ms(v: Any) -> int:
    if isinstance(v, int):
        return v
    if hasattr(v, "timestamp"):
        return int(v.timestamp() * 1000)
    return int(v)


# ---------------------------------------------------------------------------------------------- liveness view


@dataclass(frozen=True)
class SourceStatus:
    site: str
    origin_host: str
    origin_file: str
    state: str  # "live" | "stuck" | "silent" | "quiet" | "dead" | "retired"
    last_line_s_ago: float | None
    last_heartbeat_s_ago: float | None  # the source's own heartbeat (its row, or its host's): never a listener's
    listener: str | None = None  # "<collector host> <listener>" covering a source without heartbeats of its own
    listener_heartbeat_s_ago: float | None = None


@dataclass(frozen=True)
class ListenerStatus:
    site: str  # the listener's site; "*" = sites come from each message (syslog tags)
    collector: str  # origin_host of the collector that runs the listener
    listener: str  # "tcp:5140", "udp:5140", "syslog:5514", ...
    state: str  # "up" (a heartbeat within heartbeat_timeout_s) | "down"
    last_heartbeat_s_ago: float
    sources: int  # sources it covers (senders without heartbeats of their own)


@dataclass(frozen=True)
class _Row:
    site: str
    host: str
    file: str
    line_ms: int
    hb_ms: int


#: ``stuck``: heartbeats say the source's file grew (same inode, larger size, in two different minutes) within
#: the last STUCK_WINDOW_S and later than STUCK_GRACE_S after its last line arrived (the traffic detectors'
#: ``health.stuck_grace_seconds`` and ``gap_min_minutes``, same defaults)
STUCK_GRACE_S = 120.0
STUCK_WINDOW_S = 600.0
#: a listener whose last heartbeat is more than this before a heartbeat-less sender's last line was down when the
#: line came and did not receive it (three heartbeats at the collector's default 10-s interval, ``FP_HEARTBEAT_S``
#: / ``fp_heartbeat_interval``): after a port change the old port's row does not judge the senders heard since
#: (user trial 34: a sender 57 s after the change).  With a longer interval, a line that came within it before a
#: collector died may be judged by the other listeners
LISTENER_GRACE_S = 30.0


def _recent_beats(store: Store, since_s: float) -> dict[tuple[str, str, str], list[Beat]]:
    """The file heartbeats logged since ``since_s`` (``source_heartbeat_minute``: each minute's first and last),
    per (site, origin_host, origin_file), in time order."""
    out: dict[tuple[str, str, str], list[Beat]] = {}
    for site, host, file, f_ms, f_size, f_ino, l_ms, l_size, l_ino in store.query_rows(
            "SELECT site, origin_host, origin_file, toUnixTimestamp64Milli(tupleElement(min(first_beat), 1)), "
            "tupleElement(min(first_beat), 2), tupleElement(min(first_beat), 3), "
            "toUnixTimestamp64Milli(tupleElement(max(last_beat), 1)), tupleElement(max(last_beat), 2), "
            "tupleElement(max(last_beat), 3) FROM source_heartbeat_minute "
            f"WHERE minute >= toDateTime({int(since_s) // 60 * 60}, 'UTC') AND origin_file NOT IN ('', '-') "
            "GROUP BY site, origin_host, origin_file, minute ORDER BY minute"):
        beats = out.setdefault((str(site), str(host), str(file)), [])
        for b in ((int(f_ms), int(f_size), int(f_ino)), (int(l_ms), int(l_size), int(l_ino))):
            if not beats or beats[-1] != b:
                beats.append(b)
    return out


def _liveness_rows(store: Store) -> list[_Row]:
    return [_Row(str(site), str(host), str(file), int(ll), int(lh)) for site, host, file, ll, lh in store.query_rows(
        "SELECT site, origin_host, origin_file, toUnixTimestamp64Milli(max(last_line_ts)), "
        "toUnixTimestamp64Milli(max(last_heartbeat_ts)) FROM source_liveness GROUP BY site, origin_host, origin_file"
    )]


def _is_listener(r: _Row) -> bool:
    """A network listener's heartbeat row (never a source: listeners receive lines under the senders' hosts)."""
    return r.line_ms == 0 and r.hb_ms > 0 and LISTENER_LABEL_RE.fullmatch(r.file) is not None


def _is_host_heartbeat(r: _Row) -> bool:
    """A heartbeat for every file of its host (``origin_file`` empty; ``site`` ``*`` = every site of the host)."""
    return r.file in ("", "-")


def _covering(src: _Row, listeners: list[_Row]) -> list[_Row]:
    """The listeners that may have received ``src`` (a source that never sent a heartbeat of its own):
    :func:`forumpulse.pipeline.contracts.covering_listeners`, the rule the source gap detector shares."""
    return covering_listeners(src.site, src.file, listeners, lambda x: (x.site, x.file))


def _classify(rows: list[_Row], now: float, quiet_after_s: float, heartbeat_timeout_s: float,
              beats: dict[tuple[str, str, str], list[Beat]] | None = None,
              retired: dict[tuple[str, str, str], int] | None = None,
              ) -> tuple[list[SourceStatus], list[ListenerStatus]]:
    listeners = [r for r in rows if _is_listener(r)]
    host_hb: dict[tuple[str, str], int] = {}
    for r in rows:
        if _is_host_heartbeat(r):
            host_hb[(r.site, r.host)] = max(host_hb.get((r.site, r.host), 0), r.hb_ms)
    covered: dict[tuple[str, str, str], int] = {}
    out = []
    now_ms = round(now * 1000)
    for r in rows:
        if _is_listener(r) or (_is_host_heartbeat(r) and r.line_ms == 0):
            continue  # listener and host-level heartbeat rows are folded into the sources they cover
        hb = max(r.hb_ms, host_hb.get((r.site, r.host), 0), host_hb.get(("*", r.host), 0))
        line_ago = now - r.line_ms / 1000 if r.line_ms > 0 else None
        hb_ago = now - hb / 1000 if hb > 0 else None
        via: _Row | None = None
        if retired_after(r.line_ms, (retired or {}).get((r.site, r.host, r.file), 0), now_ms):  # nothing since
            out.append(SourceStatus(r.site, r.host, r.file, "retired", line_ago, hb_ago))
            continue
        if hb == 0:  # no heartbeat of its own, ever: a network sender (or a file whose heartbeats never came)
            cover = _covering(r, listeners)
            if r.line_ms > 0:  # a listener down before the sender's last line did not receive it (a retired
                # collector or an old port: listener rows never expire, and would make every sender dead for good)
                cover = [x for x in cover if x.hb_ms >= r.line_ms - round(LISTENER_GRACE_S * 1000)]
            # quiet only while EVERY listener that may have received it is up: judged by the oldest (a sender
            # of a collector that died is not vouched for by another collector with the same listener label)
            via = min(cover, key=lambda x: (x.hb_ms, x.host, x.file, x.site)) if cover else None
            for x in cover:
                covered[(x.site, x.host, x.file)] = covered.get((x.site, x.host, x.file), 0) + 1
        via_ago = now - via.hb_ms / 1000 if via is not None else None
        if line_ago is not None and line_ago <= quiet_after_s:
            state = "live"
        elif hb_ago is not None and hb_ago <= heartbeat_timeout_s:
            own = (beats or {}).get((r.site, r.host, r.file))
            lo = max(now_ms - round(STUCK_WINDOW_S * 1000), r.line_ms + round(STUCK_GRACE_S * 1000) if r.line_ms else 0)
            state = "stuck" if own and file_grew(own, lo, now_ms) else "silent"
        elif via_ago is not None and via_ago <= heartbeat_timeout_s:
            state = "quiet"  # idle or gone, cannot tell: the listener that receives it is up
        else:
            state = "dead"
        out.append(SourceStatus(r.site, r.host, r.file, state, line_ago, hb_ago,
                                f"{via.host} {via.file}" if via is not None else None, via_ago))
    lst = [ListenerStatus(x.site, x.host, x.file, "up" if now - x.hb_ms / 1000 <= heartbeat_timeout_s else "down",
                          now - x.hb_ms / 1000, covered.get((x.site, x.host, x.file), 0)) for x in listeners]
    return (sorted(out, key=lambda s: (s.site, s.origin_host, s.origin_file)),
            sorted(lst, key=lambda s: (s.collector, s.listener, s.site)))


def source_status(store: Store, now: float | None = None, quiet_after_s: float = 300.0,
                  heartbeat_timeout_s: float = 180.0) -> list[SourceStatus]:
    """Classify every source recorded in ``source_liveness``.

    ``live``: a line arrived within ``quiet_after_s``.  ``silent``: no recent line, but the source (or its host,
    via a heartbeat with an empty ``origin_file``; site ``*`` = every site of the host) sent a heartbeat within
    ``heartbeat_timeout_s`` — the source is up and simply has no traffic.  ``stuck``: the same, but its own
    heartbeats say its file keeps growing (:func:`forumpulse.pipeline.contracts.file_grew` over the last
    ``STUCK_WINDOW_S``, from ``STUCK_GRACE_S`` after its last line): lines are written and not shipped — a broken
    tail, a shipper that stopped reading the file while its heartbeat program still runs.  The heartbeats' times
    are the shipper's clock, the window's end is ``now`` (the owner's): a shipper clock running minutes ahead
    hides its newest heartbeats from the test (NTP on the collectors).  ``quiet``: no recent line and the
    source never sent a heartbeat of its own (a network sender: raw TCP/UDP, or syslog without forwarded
    heartbeats), but the listener that receives it heartbeats — the sender is idle *or* gone, forumpulse cannot
    tell which (``listener`` names it).  ``dead``: none of these — the source, its host, the collector or the
    transport is down.  A source that ever sent heartbeats is judged by them alone (``silent``/``dead``), as
    every followed file is.  ``retired``: ops retired it (:mod:`forumpulse.pipeline.sources`, migration 0011) and
    it has sent no line since -- before every other state; it covers no listener.

    Listener heartbeat rows (``origin_file`` = ``tcp:5140``, ``syslog:5514``…, no lines) and host-level
    heartbeat rows are not sources: they are folded into the sources they cover (see :func:`listener_status`).
    Line times are Kafka message timestamps (arrival), heartbeat times the heartbeat's own ``ts=`` (else its
    Kafka timestamp); never log timestamps.
    """
    now = time.time() if now is None else now
    return _classify(_liveness_rows(store), now, quiet_after_s, heartbeat_timeout_s,
                     _recent_beats(store, now - STUCK_WINDOW_S), retired_sources(store))[0]


def listener_status(store: Store, now: float | None = None, quiet_after_s: float = 300.0,
                    heartbeat_timeout_s: float = 180.0) -> list[ListenerStatus]:
    """The collectors' network listeners seen in heartbeats: ``up``/``down`` and how many sources each covers."""
    now = time.time() if now is None else now
    return _classify(_liveness_rows(store), now, quiet_after_s, heartbeat_timeout_s,
                     retired=retired_sources(store))[1]


# ---------------------------------------------------------------------------------------------- command


def open_store_waiting(url: str, stop: threading.Event, database: str | None = None, migrate_params: dict[str, Any] | None = None,
                       backoff_max_s: float = 5.0) -> Store:
    """Open (and migrate) the store, retrying with backoff while it is unavailable (the owner restarting)."""
    delay = 0.2
    while True:
        try:
            st = open_store(url, database=database) if database else open_store(url)
            if migrate_params is not None:
                migrate(st, migrate_params)
            return st
        except StoreLocationError:
            raise  # a URL or folder that cannot be used does not get better by waiting
        except StoreError as exc:
            if stop.is_set():
                raise
            log.warning("store %s not available (retrying in %.1f s): %s", mask_url(url), delay,
                        error_line(exc))
            stop.wait(delay)
            delay = min(backoff_max_s, delay * 2)


def consume_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML configuration file (default: "
                                                "$FORUMPULSE_CONFIG, else built-in defaults)")] = None,
    store: Annotated[str | None, typer.Option(help="chdb:PATH (this process owns it) or clickhouse://... (a "
                                              "server or the owner's endpoint; waited for while unavailable)")]
    = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: from the "
                                                  "configuration)")] = None,
    topic: Annotated[str | None, typer.Option(help="topic to load (default weblogs.raw)")] = None,
    dead_letter_topic: Annotated[str | None, typer.Option(help="topic for bad envelopes and quarantined lines "
                                                          "(default weblogs.raw.dlq)")] = None,
    group: Annotated[str | None, typer.Option(help="consumer group (default forumpulse-loader); run several "
                                              "consumers in one group to share the partitions")] = None,
    instance_id: Annotated[str | None, typer.Option(help="static group member id, Kafka group.instance.id (a "
                                                    "restart within the session timeout keeps its partitions)")]
    = None,
    batch_lines: Annotated[int | None, typer.Option(help="lines per partition batch (one insert each)")] = None,
    max_wait: Annotated[float | None, typer.Option(help="seconds a partial batch may wait before it is loaded "
                                                   "(freshness)")] = None,
    metrics_port: Annotated[int | None, typer.Option(help="serve Prometheus /metrics on this port")] = None,
    idle_exit: Annotated[float | None, typer.Option(help="stop once caught up and idle for this many seconds "
                                                    "(batch loads, tests)")] = None,
    dead_letter: Annotated[bool, typer.Option("--dead-letter/--no-dead-letter",
                                              help="send bad envelopes and quarantined lines to the dead-letter "
                                                   "topic; without it quarantined lines are only in the quarantine "
                                                   "table and messages that are not envelopes are not kept")] = True,
) -> None:
    """Load Kafka weblogs.raw into the store until SIGTERM/SIGINT, exactly once in effect: every line becomes a
    row of `requests` or `quarantine` once, rollups included, through crashes, restarts and rebalances.

    Offsets are committed only after the insert (and the dead letters) succeeded; a replay after a crash cuts
    the same batches and is deduplicated by the store.  Prints one JSON summary line on exit.
    """
    from forumpulse.pipeline.threadcpu import report_at_exit_if_asked

    report_at_exit_if_asked()  # `make bench` only (FP_THREAD_CPU_OUT): every thread's CPU seconds at exit
    no_dead_letter = not dead_letter
    from forumpulse.pipeline.runtime import start_service

    start_service(log)
    settings = load_settings(config)
    url = store or settings.store.url
    stop = threading.Event()
    holder: dict[str, LiveConsumer] = {}

    def _signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: finishing the current batches", signum)
        stop.set()
        c = holder.get("c")
        if c is not None:
            c.stop()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    st = open_store_waiting(url, stop, migrate_params=settings.retention.migration_params())
    opts = ConsumerOptions.from_settings(
        settings, bootstrap_servers=bootstrap, topic=topic, dead_letter_topic=dead_letter_topic, group_id=group,
        instance_id=instance_id,
        batch_lines=batch_lines, max_wait_s=max_wait,
    )
    if no_dead_letter:
        opts.dead_letter_topic = None
    consumer = LiveConsumer(settings, st, opts)
    from forumpulse.pipeline.rollup_check import start_auditor

    # the owner of an embedded store checks (and rebuilds) the hours of the batches it replays once settled
    audit = start_auditor(settings.store.rollup_audit, st, url, stop)
    if audit is not None:
        consumer.replay_listeners.append(audit[0].advise)
        consumer.metrics.registry.register(audit[0])
    holder["c"] = consumer
    if stop.is_set():
        consumer.stop()
    if metrics_port is not None:
        consumer.metrics.serve(metrics_port)
    try:
        summary = consumer.run(idle_exit_s=idle_exit)
    finally:
        stop.set()
        if audit is not None:
            audit[1].join(60)  # an audit pass under way finishes before the store closes
        st.close()
    print(json.dumps({"consumer": consumer.instance, **summary}), flush=True)


if __name__ == "__main__":  # `python -m forumpulse.pipeline.consumer ...` (tests, before CLI wiring)
    import typer

    typer.run(consume_command)
