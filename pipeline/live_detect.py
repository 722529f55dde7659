"""Detectors in the live path: DoS decisions within wall-clock seconds, traffic detections every minute.

Owner services (``forumpulse run --dos --traffic``, see :func:`live_services`):

* **DoS** (:class:`LiveDos`): one :class:`~forumpulse.detectors.dos.DosDetector` per owner process.  Decisions go
  to the ``decisions`` table (StoreSink, flushed after every batch), to Kafka ``weblogs.decisions`` (KafkaSink),
  to the actions configured in ``actions`` (nftables / ipset / webhook, :func:`build_actions`), and to a
  :class:`~forumpulse.detectors.decision_api.DecisionRegistry` that a
  :class:`~forumpulse.detectors.decision_api.DecisionApiServer` serves to CrowdSec bouncers when
  ``actions.decision_api.enabled`` (the API key comes from the config file or
  ``FORUMPULSE_ACTIONS__DECISION_API__API_KEY``; there is no default).  Routes on the owner's port:
  ``POST /fp/unban?value=V`` (manual unban) and ``GET /fp/decisions`` (active decisions).

  Where the lines come from (``detectors.live.dos_source``):

  - ``feed`` (default): :class:`DosFeed`, a separate light consumer group (``forumpulse-dos``) reading
    ``weblogs.raw`` itself in small batches (``feed_max_wait_s``, default 0.2 s).  Latency is bounded by that
    wait, not by the loader's large batches, and detection keeps running while the store is down (the loader
    pauses then).  Cost: every line is parsed twice (loader and feed), about one extra Processor pass.
  - ``loader``: :class:`DosHook` on the loader's stream hooks (``--consume`` required).  No second parse, but
    decisions wait for the loader's batch (``max_wait_s``, default 0.3 s, plus the store insert) and stop while
    the store is unavailable.  Small loader waits mean many small inserts, which ClickHouse handles badly.

  Prefix and distributed rules need every partition in one detector: run ``--dos`` in one process only (the
  feed logs a warning when its group member is not assigned all partitions of the topic).

* **Traffic** (:class:`TrafficService`): :meth:`TrafficDetector.run_once` right away (it warms its baselines
  from the rollups) and then every ``traffic_interval_s`` a few seconds after the minute; detections go to the
  ``detections`` table and, when Kafka is in use, to ``weblogs.events`` (:class:`EventsPublisher`: a detection
  leaves the detector's outbox only once Kafka confirmed its delivery; otherwise it is logged, counted and sent
  again at the next run).

Metrics (the owner's ``GET /metrics``, read at scrape time; :class:`DosCollector`, :class:`TrafficCollector`):
``forumpulse_dos_lines_total`` / ``_batches_total`` (judged), ``forumpulse_dos_decisions_total{action,reason,
scope,mode}``, ``forumpulse_dos_refused_total{reason}`` (not decided: allowlist, crawler, already banned,
loopback, ...), ``forumpulse_dos_action_errors_total``, ``forumpulse_dos_webhook_failures_total`` (background
deliveries that failed after their retries), ``forumpulse_dos_active_bans``, ``forumpulse_dos_restored_total``,
``forumpulse_dos_unspooled_total`` (decisions the store had not taken at shutdown, loaded at start from
``detectors.live.spool_dir``), ``forumpulse_dos_republished_total`` (decisions the topic never confirmed,
published again at start) /
``_published_record_errors_total`` (failed attempts to write confirmations to ``decisions_published``),
``forumpulse_dos_firewall_checks_total`` / ``_firewall_check_errors_total`` (``firewall_check_s``),
``forumpulse_dos_feed_errors_total``, ``forumpulse_dos_feed_replayed_total``,
``forumpulse_dos_crawler_lookup_failures_total`` (DNS without an answer: a claimed crawler not verified),
``forumpulse_dos_sink_errors_total{sink}`` / ``_sink_retrying{sink}`` (decisions not yet taken by the store or
confirmed by Kafka, emitted again) / ``_sink_dropped_total{sink}``; ``forumpulse_traffic_runs_total``
/ ``_run_errors_total`` / ``_detections_total`` / ``_publish_failures_total`` (events not confirmed by Kafka,
retried) / ``_events_waiting`` (queued without a report), ``forumpulse_traffic_last_run_timestamp_seconds`` and
``forumpulse_traffic_minutes_judged_behind_seconds{site}`` (wall clock minus the end of the last complete minute
the detectors judged: the live watermark holding them back for a source or partition behind shows here).

CLI functions for the integrator: :func:`unban_command` (``forumpulse detect unban VALUE``) and
:func:`decisions_command` (``forumpulse detect decisions``), in :mod:`forumpulse.detectors.dos_cli`.

Guarantees: one lock serialises detection, unban and listing (DecisionManager is not thread-safe); errors in
a batch, a sink or the traffic run are logged and counted, never stop the owner.  Active bans are restored
from the ``decisions`` table at start (wall-clock expiry: ``created_at + duration_s``), so a restarted owner
keeps serving them to bouncers and deduplicating repeat offenders.  At-least-once: a replayed Kafka range can
repeat a decision (the manager suppresses repeats of an active ban).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NoReturn

import pyarrow as pa
from forumpulse.pipeline.config import Settings, register_section_validator
from forumpulse.pipeline.consumer import BatchInfo, _sql_str
from forumpulse.pipeline.kafka_client import client_config
from forumpulse.pipeline.runtime import error_line
from pydantic import BaseModel, ConfigDict, Field, field_validator

log = logging.getLogger("forumpulse.live_detect")


# ---------------------------------------------------------------------------------------------- config


class LiveConfig(BaseModel):
    """Section ``detectors.live``."""

    model_config = ConfigDict(extra="forbid")
    dos_source: Literal["feed", "loader"] = Field(
        "feed", description="feed: own consumer group with small batches (low latency, parses twice); "
        "loader: hook on the loader's batches (needs --consume; latency = loader max_wait + insert)")
    feed_group: str = Field("forumpulse-dos", description="consumer group of the DoS feed")
    feed_max_wait_s: float = Field(0.2, gt=0, le=10, description="longest wait for a feed batch")
    feed_batch_lines: int = Field(20_000, ge=1, description="most lines per feed batch")
    feed_start: Literal["latest", "earliest"] = Field(
        "latest", description="where a feed group without committed offsets starts (latest: judge only new lines)")
    publish_decisions: bool = Field(True, description="publish decisions on kafka.decisions_topic (also when "
                                    "actions.kafka is true)")
    publish_events: bool = Field(True, description="publish traffic detections on kafka.events_topic")
    spool_dir: str = Field(
        "data/spool", description="decisions the store had not taken when the owner stopped (store away) are "
        "written here as JSON lines and loaded into it at the next start (relative: to the working directory)")
    traffic_interval_s: float = Field(60.0, ge=1, description="seconds between traffic detector runs")

    @field_validator("spool_dir")
    @classmethod
    def _spool_dir_named(cls, v: str) -> str:
        if not v.strip():  # Path("") is the working directory: spool files would land wherever the owner runs
            raise ValueError("empty: name a folder (the default is data/spool)")
        return v

    traffic_offset_s: float = Field(5.0, ge=0, le=59, description="run this many seconds after the minute")
    firewall_check_s: float = Field(
        10.0, ge=0, description="seconds between checks that the nftables/ipset sets still hold every ban in force "
        "(a firewall reload or flush removes them; the check puts them back); 0: only at the next ban or unban.  "
        "A check costs ~20-50 ms with 1,000 bans held, ~0.2 s with 10,000, ~1 s with 50,000 (docs/dos.md)")


class _LiveSection(BaseModel):
    model_config = ConfigDict(extra="allow")
    live: LiveConfig = Field(default_factory=LiveConfig)


def _validate_live(v: Any) -> Any:
    return _LiveSection.model_validate(v or {})


register_section_validator("detectors", _validate_live)


def live_config(settings: Settings) -> LiveConfig:
    return LiveConfig.model_validate(settings.detectors.get("live", {}) or {})


def normalize_value(value: str) -> str:
    """The decision value as detectors and registries key it: an address, or a CIDR for ranges.

    Raises ValueError for anything that is not an address or network (a whole family is refused).
    """
    from forumpulse.detectors.dos import canonical_value

    return canonical_value(value)


def spool_state(spool_dir: str | Path) -> tuple[str | None, int]:
    """``(problem, waiting)`` of a ``detectors.live.spool_dir``, read without changing anything (``forumpulse
    config check``): why no spool file could be written there (a file in the way, a folder that cannot be
    created or written), else None; and how many spooled files wait for the next owner start."""
    path = Path(spool_dir)
    if path.exists() and not path.is_dir():
        return "not a folder", 0
    probe = path
    while not probe.exists():  # the folder is created when missing: its nearest existing parent must allow it
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"cannot be created ({probe} is not a folder)", 0
    if not os.access(probe, os.W_OK | os.X_OK):
        return ("not writable" if probe == path else f"cannot be created ({probe} is not writable)"), 0
    try:
        waiting = sum(1 for _ in path.glob("decisions-*.jsonl")) if path.is_dir() else 0
    except OSError as exc:
        return f"unreadable: {exc}", 0
    return None, waiting


def _iso_ms(ms: Any) -> str:
    """Epoch milliseconds as a UTC ISO time for a log line (``?`` when not a number)."""
    try:
        return datetime.fromtimestamp(int(ms) / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


# ---------------------------------------------------------------------------------------------- decisions


def _decision_from_row(row: Sequence[Any]) -> Any:
    from forumpulse.detectors.dos import Decision

    (id_, created, decided, first, expires, site, action, value, scope, reason, duration, mode, origin,
     evidence) = row
    try:
        ev = json.loads(evidence) if evidence else {}
    except ValueError:
        ev = {"raw": evidence}
    return Decision(id=str(id_), created_at=int(created), decided_at=int(decided), first_seen=int(first),
                    expires_at=int(expires), site=str(site), action=str(action), value=str(value),
                    scope=str(scope), reason=str(reason), duration_s=int(duration), mode=str(mode),
                    origin=str(origin), evidence=ev)


def _latest_per_value(where: str = "") -> str:
    """SELECT of the latest ``decisions`` row per value (among rows matching ``where``, an SQL condition), in
    :func:`_decision_from_row`'s order, ending in ``GROUP BY value``: add ``HAVING``/``ORDER BY`` after it.  Rows
    of one value in the same millisecond: the unban is the latest (deterministic; a ban and its lifting written
    together end lifted)."""
    by = "(created_at, action = 'unban')"
    return (f"SELECT argMax(id, {by}) AS last_id, toUnixTimestamp64Milli(max(created_at)) AS last_ms, "
            f"argMax(toUnixTimestamp64Milli(decided_at), {by}), argMax(toUnixTimestamp64Milli(first_seen), {by}), "
            f"argMax(toUnixTimestamp64Milli(expires_at), {by}), argMax(site, {by}), "
            f"argMax(action, {by}) AS last_action, value, argMax(scope, {by}), argMax(reason, {by}), "
            f"argMax(duration_s, {by}) AS dur, argMax(mode, {by}), argMax(origin, {by}), "
            f"argMax(evidence, {by}) FROM decisions {f'WHERE {where} ' if where else ''}GROUP BY value")


#: newest first; equal times: the unban first (it is the later word, as in :func:`_latest_per_value`), then by
#: value, so that merging spellings (:func:`_by_canonical_value`) does not depend on the engine's tie order
_NEWEST_FIRST = "ORDER BY last_ms DESC, last_action = 'unban' DESC, value"


def active_from_store(store: Any, now: float | None = None, latest: list[Any] | None = None) -> list[Any]:
    """Bans still in force by the wall clock (``created_at + duration_s > now``) whose latest row per value is
    a ban (a later unban ends it), newest first, as :class:`~forumpulse.detectors.dos.Decision` objects.
    ``latest``: :func:`latest_words` already read at ``now``, else read here: one way to decide, so a later
    unban under another spelling of the address ends the ban whichever path asks (an earlier query that left
    unbans out kept such a ban; from a review)."""
    now_ms = int((time.time() if now is None else now) * 1000)
    if latest is None:
        latest = latest_words(store, 0, now_ms / 1000)
    return [d for d in latest if d.action == "ban" and d.created_at + d.duration_s * 1000 > now_ms]


def latest_words(store: Any, keep_unbans_s: float, now: float | None = None) -> list[Any]:
    """Per value (keyed canonically, as :func:`active_from_store`), the latest ``decisions`` row when it is a ban
    still in force, or an unban within ``keep_unbans_s`` or the longest ban in the table (an unban of a ban that
    could still be in force), newest first.  What a starting owner reads once for :func:`unpublished_from_store`
    and :func:`active_from_store` (``latest=``).  Store errors are raised."""
    now_ms = int((time.time() if now is None else now) * 1000)
    # an unban matters while the ban it lifted would still be in force: bans made under longer durations than
    # today's rules give count too (from a review)
    [[longest]] = store.query_rows("SELECT max(duration_s) FROM decisions WHERE action = 'ban'")
    since_ms = now_ms - int(max(keep_unbans_s, int(longest or 0)) * 1000)
    # the latest word per canonical value first, then (unpublished_from_store) what the topic confirmed: the
    # other order let an older ban under one spelling stand in for a confirmed unban under another (from a
    # review).  Rows older than the window cannot be a latest word that matters (a ban in force, created after
    # now - its duration >= since_ms, or an unban within the window)
    recent = _latest_per_value(f"toUnixTimestamp64Milli(created_at) >= {since_ms}")
    return _by_canonical_value(store, [_decision_from_row(r) for r in store.query_rows(
        f"{recent} HAVING (last_action = 'ban' AND last_ms + dur * 1000 > {now_ms}) OR "
        f"(last_action = 'unban' AND last_ms >= {since_ms}) {_NEWEST_FIRST}")])


def unpublished_from_store(store: Any, topic: str, keep_unbans_s: float, now: float | None = None,
                           latest: list[Any] | None = None) -> list[Any]:
    """The decisions a restarted owner publishes again on ``topic``, oldest first: per value (keyed canonically,
    as :func:`active_from_store`), the latest row -- a ban still in force, or an unban while a ban of that value
    would still be in force without it (looked for within ``keep_unbans_s`` or the longest ban in the table) --
    when ``decisions_published`` (migration 0012) has no confirmation of it for ``topic``.
    Only the latest word per value: an older ban whose unban was delivered, or an older unban followed by a new
    ban, is never sent again (it would undo what came after it).  ``latest``: :func:`latest_words` already read
    (same ``keep_unbans_s`` and ``now``), else read here.  Store errors are raised (a store without the table:
    ``forumpulse db migrate``)."""
    now_ms = int((time.time() if now is None else now) * 1000)
    if latest is None:
        latest = latest_words(store, keep_unbans_s, now_ms / 1000)
    # an unban matters only while a ban of its value would still be in force (a 10-minute ban lifted a week
    # ago needs no unban on the topic; user trial 42)
    unexpired = unexpired_ban_values(store, now_ms / 1000) if any(d.action == "unban" for d in latest) else set()
    latest = [d for d in latest if d.action == "ban" or d.value in unexpired]
    confirmed = published_ids(store, topic, [d.id for d in latest])
    return [d for d in latest if d.id not in confirmed][::-1]


def unexpired_ban_values(store: Any, now: float | None = None) -> set[str]:
    """The values (canonical) of every ban row whose duration has not run out at ``now``, lifted or not: an unban
    of one of them is still worth sending (:func:`unpublished_from_store`; ``detect unban``'s ``pending``)."""
    from forumpulse.detectors.dos import canonical_value

    now_ms = int((time.time() if now is None else now) * 1000)
    out: set[str] = set()
    for (v,) in store.query_rows(
            "SELECT DISTINCT value FROM decisions WHERE action = 'ban' AND "
            f"toUnixTimestamp64Milli(created_at) + toInt64(duration_s) * 1000 > {now_ms}"):
        try:
            out.add(canonical_value(str(v)))
        except ValueError:
            out.add(str(v))
    return out


def published_ids(store: Any, topic: str, ids: Sequence[str]) -> set[str]:
    """Those of ``ids`` whose delivery ``topic`` confirmed (``decisions_published``, migration 0012).  Store
    errors are raised (a store without the table: ``forumpulse db migrate``)."""
    out: set[str] = set()
    for i in range(0, len(ids), 1000):  # ids as literals, not an IN subquery: on a cluster both tables are
        chunk = ", ".join(_sql_str(x) for x in ids[i:i + 1000])  # Distributed (double-distributed IN)
        out.update(str(x) for (x,) in store.query_rows(
            f"SELECT DISTINCT id FROM decisions_published WHERE topic = {_sql_str(topic)} AND id IN ({chunk})"))
    return out


def with_published(views: list[dict[str, Any]], store: Any, topic: str | None) -> list[dict[str, Any]]:
    """:func:`decision_view` objects with ``published``: whether ``topic`` confirmed the decision (a firewall
    host or process reading it has it), ``None`` when that is unknown (the store failed, or has no
    ``decisions_published``); unchanged when ``topic`` is None (decisions are not published)."""
    if topic is None or not views:
        return views
    try:
        done: set[str] | None = published_ids(store, topic, [str(v["id"]) for v in views])
    except Exception as exc:
        log.warning("could not read which decisions %s confirmed: %s", topic, error_line(exc))
        done = None
    return [{**v, "published": None if done is None else v["id"] in done} for v in views]


def _by_canonical_value(store: Any, held: list[Any]) -> list[Any]:
    """Rows written before values were canonical (``::ffff:1.2.3.4``, upper-case or uncompressed IPv6) keyed
    as now (``dos.canonical_value``): a ban under an old spelling is over once a later row (an unban, or a newer
    ban) exists under the canonical one, and one value is held once (the newest).  Values that are not addresses
    are left as they are (the restore refuses them)."""
    from dataclasses import replace

    from forumpulse.detectors.dos import canonical_value

    canon: dict[str, str] = {}
    for d in held:
        try:
            c = canonical_value(d.value)
        except ValueError:
            continue
        if c != d.value:
            canon[d.value] = c
    if not canon:
        return held
    # the newest row under *any* spelling of each canonical value, among rows newer than the oldest held one
    # (only those can end it): comparing with the canonical spelling alone missed an unban written under a
    # second old spelling (ban '2001:DB8::1', unban '2001:0db8::1'; from a review)
    since = min(d.created_at for d in held if d.value in canon)
    latest: dict[str, int] = {}
    for v, t in store.query_rows(
            "SELECT value, toUnixTimestamp64Milli(max(created_at)) FROM decisions "
            f"WHERE toUnixTimestamp64Milli(created_at) > {int(since)} GROUP BY value"):
        try:
            c = canonical_value(str(v))
        except ValueError:
            continue
        latest[c] = max(latest.get(c, -1), int(t))
    out, seen = [], set()
    for d in held:  # newest first
        c = canon.get(d.value, d.value)
        if c in seen or (d.value in canon and latest.get(c, -1) > d.created_at):
            continue
        seen.add(c)
        out.append(replace(d, value=c) if c != d.value else d)
    return out


def _refused(value: str) -> str | None:
    """Why a stored ban of ``value`` is neither restored nor published again: ``invalid`` (not an address or
    network), a :func:`~forumpulse.detectors.dos.never_ban_reason` (loopback, link-local, ...), else None."""
    from forumpulse.detectors.dos import canonical_network, never_ban_reason

    try:
        net = canonical_network(value)
    except ValueError:
        return "invalid"
    return never_ban_reason(net)


def decision_view(d: Any, now: float | None = None) -> dict[str, Any]:
    """The JSON object ``GET /fp/decisions`` and ``forumpulse detect decisions`` print for one active ban."""
    now = time.time() if now is None else now
    left = max(0, int(d.created_at / 1000 + d.duration_s - now))
    out = d.to_json()
    out["remaining_s"] = left
    return dict(out)


class _FailureLog:
    """When a call that keeps failing is worth a log line: its first failure, then at most once per ``every_s``
    (with :attr:`count` and :meth:`for_s`), and its first success after (:meth:`recovered`)."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.count = 0
        self.since = self._logged = 0.0

    def failed(self) -> bool:
        """Count a failure; whether to log it."""
        t = time.monotonic()
        self.count += 1
        if self.count == 1:
            self.since = self._logged = t
            return True
        if t - self._logged >= self.every_s:
            self._logged = t
            return True
        return False

    def for_s(self) -> float:
        return time.monotonic() - self.since

    def recovered(self) -> tuple[int, float] | None:
        """``(failures, seconds)`` when this success ends a run of failures (reset), else None."""
        if not self.count:
            return None
        out = (self.count, self.for_s())
        self.count = 0
        return out


class _GuardedSink:
    """Wraps a sink so one failing flush (store or Kafka away) is logged and counted instead of stopping
    detection; the failed decisions are kept and emitted again with the next flush, up to ``keep`` of them (the
    oldest beyond are dropped, counted in :attr:`dropped` and logged).  What failed is what the sink says: an
    exception with ``undelivered`` (:class:`~forumpulse.detectors.dos.UndeliveredError`: Kafka's delivery
    reports), else the sink's whole ``buf`` (StoreSink drops its buffer on a failed insert)."""

    def __init__(self, inner: Any, name: str, keep: int = 10_000,
                 spool: Callable[[list[Any]], str] | None = None) -> None:
        self.inner, self.name, self.keep, self.spool = inner, name, keep, spool
        self.errors = 0
        self.dropped = 0
        self._retry: list[Any] = []
        self._failing = _FailureLog(self.FAILURE_LOG_EVERY_S)

    @property
    def retrying(self) -> int:
        """Decisions waiting to be emitted again."""
        return len(self._retry)

    def emit(self, decision: Any) -> None:
        try:
            self.inner.emit(decision)
        except Exception as exc:
            self.errors += 1
            self._keep([decision])
            log.warning("decision sink %s: emit failed: %s", self.name, exc)

    def _keep(self, failed: list[Any], before: bool = False) -> None:
        kept = failed + self._retry if before else self._retry + failed
        over = len(kept) - self.keep
        if over > 0:
            self.dropped += over
            log.error("decision sink %s: %d decision(s) dropped, more than %d waiting to be emitted again",
                      self.name, over, self.keep)
            kept = kept[over:]
        self._retry = kept

    #: a sink failing flush after flush (the store away: a flush follows every feed batch, ~4 a second) is
    #: logged when it starts failing, then at most once per this many seconds, and once when it works again
    #: (user trial 43: 328 warnings in 81 s for one pending decision)
    FAILURE_LOG_EVERY_S = 60.0

    def _settle(self, call: Callable[[], None], pending: list[Any]) -> None:
        try:
            call()
        except Exception as exc:
            self.errors += 1
            lost = getattr(exc, "undelivered", None)
            self._keep(pending if lost is None else list(lost), before=True)
            if self._failing.failed():
                if self._failing.count == 1:
                    log.warning("decision sink %s: flush failed (%d kept for retry): %s", self.name,
                                len(self._retry), error_line(exc))
                else:
                    log.warning("decision sink %s: flush still failing (%d kept for retry; failing for %.0f s, %d "
                                "attempt(s)): %s", self.name, len(self._retry), self._failing.for_s(),
                                self._failing.count, error_line(exc))
        else:
            back = self._failing.recovered()
            if back is not None:
                log.info("decision sink %s: flushed again (it failed %d time(s) over %.0f s)", self.name, *back)

    def flush(self) -> None:
        retry, self._retry = self._retry, []
        for i, d in enumerate(retry):
            try:
                self.inner.emit(d)
            except Exception:
                self._retry = retry[i:] + self._retry
                break
        buf = getattr(self.inner, "buf", None)
        self._settle(self.inner.flush, list(buf) if isinstance(buf, list) else [])

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.flush()
        buf = getattr(self.inner, "buf", None)
        self._settle(self.inner.close, list(buf) if isinstance(buf, list) else [])
        if self._retry and self.spool is not None:
            try:
                where = self.spool(self._retry)
            except Exception as exc:
                # named one by one: they are in no table and no file (from user trial 42: lost without a trace)
                log.error("decision sink %s: %d decision(s) not emitted at shutdown and not spooled (%s); they "
                          "are not in the decisions table: %s", self.name, len(self._retry), exc,
                          "; ".join(f"{getattr(d, 'action', '?')} {getattr(d, 'value', '?')} id "
                                    f"{getattr(d, 'id', '?')} until {_iso_ms(getattr(d, 'expires_at', None))}"
                                    for d in self._retry[:50]) + (" ..." if len(self._retry) > 50 else ""))
                self._retry = []
            else:
                log.warning("decision sink %s: %d decision(s) not emitted at shutdown, spooled to %s (loaded at "
                            "the next start)", self.name, len(self._retry), where)
                self._retry = []
        if self._retry:
            log.error("decision sink %s: %d decision(s) not emitted at shutdown (%s)", self.name, len(self._retry),
                      "the next owner start publishes again what the topic never confirmed" if self.name == "kafka"
                      else "they are in the decisions table when the store took them")


class LiveDos:
    """The owner's DoS detector with its sinks, actions and decision registry; thread-safe entry points.

    ``actions`` replaces what ``Settings.actions`` would build (tests and benchmarks pass e.g. an
    ``NftablesAction(netns=...)``); the registry is always added.  ``kafka_producer``: an existing
    confluent-kafka Producer for the KafkaSink (else one is made when publishing is on).
    """

    def __init__(self, settings: Settings, store: Any, actions: Sequence[Any] | None = None,
                 publish: bool | None = None, restore: bool = True, clock: Callable[[], float] = time.time,
                 kafka_producer: Any = None) -> None:
        from forumpulse.detectors.actions import build_actions
        from forumpulse.detectors.decision_api import DecisionRegistry
        from forumpulse.detectors.dos import (
            DecisionManager,
            DosDetector,
            JsonLinesSink,
            KafkaSink,
            StoreSink,
            published_recorder,
            site_proxies,
        )
        from forumpulse.detectors.dos_rules import ActionsConfig, DosConfig, load_rules

        self.settings = settings
        self.store = store
        self.clock = clock
        self.cfg = DosConfig.model_validate(settings.detectors.get("dos", {}) or {})
        self.actions_cfg = ActionsConfig.model_validate(settings.actions or {})
        self.live = live_config(settings)
        rules = load_rules(self.cfg.rules_file, self.cfg.rule_overrides)
        # deletions are kept as long as a ban can last: a bouncer that missed one still gets it at its next poll
        longest = max([self.cfg.escalation.max_duration_s, *(r.duration_s for r in rules.rules)])
        self.registry = DecisionRegistry(clock=clock, keep_deleted_s=longest)
        acts = [self.registry, *(build_actions(self.actions_cfg) if actions is None else actions)]  # in memory: first
        self.spool_dir = Path(self.live.spool_dir)
        # what the store has not taken at shutdown (a ClickHouse server away) is spooled, loaded at the next start
        self.sinks: list[_GuardedSink] = [_GuardedSink(StoreSink(store, flush_every=1_000_000), "store",
                                                       spool=self._spool)]
        if publish is None:
            publish = self.live.publish_decisions or self.actions_cfg.kafka
        if publish:
            # a short wait per flush: flushes run under the detection lock (a batch, an unban), and a broker
            # away held each for 10 s (an unban took ~23 s, user trial 41); what is still queued is reported
            # by a later flush (KafkaSink)
            # each confirmed decision is recorded (decisions_published), so a restart publishes again only
            # what the topic never confirmed (republish)
            self.sinks.append(_GuardedSink(KafkaSink(
                settings.kafka.bootstrap_servers, settings.kafka.decisions_topic, producer=kafka_producer,
                # at shutdown 3 s, not 10: what is still unconfirmed is published at the next start anyway
                # (a stop with the broker away took ~19 s; user trial 42)
                flush_timeout_s=0.5, close_timeout_s=3.0,
                on_delivered=published_recorder(store, settings.kafka.decisions_topic, clock)), "kafka"))
        if self.actions_cfg.jsonl_path:
            try:
                jsonl = JsonLinesSink(self.actions_cfg.jsonl_path)
            except OSError as exc:  # named by its key: "[Errno 2] No such file" alone did not say which file
                raise OSError(exc.errno, f"actions.jsonl_path {self.actions_cfg.jsonl_path}: {exc.strerror} (config "
                              "check says what is wrong with it)") from exc
            self.sinks.append(_GuardedSink(jsonl, "jsonl"))
        self.manager = DecisionManager(self.cfg, sinks=self.sinks, actions=acts, wall_clock=clock,
                                       networks_file=settings.bots.networks_file,
                                       trusted_proxies=site_proxies(settings))
        self.detector = DosDetector(rules, self.manager)
        self.lock = threading.RLock()
        self.batches = 0
        self.errors = 0
        self.restored = 0
        self.firewall_checks = 0
        self.firewall_check_errors = 0
        self.warmed_prefixes = 0
        self.republished = 0
        self.unspooled = 0
        self._unbans_from_ms = self._unbans_seen_ms = int(clock() * 1000)  # sync_store_unbans: rows after this
        self._query_failing: dict[str, _FailureLog] = {}
        if restore:
            # spooled decisions first (into the table: republish and restore then see them); then what the topic
            # never confirmed: restore() may lift a ban (a trusted proxy), and that unban must follow the ban on
            # the topic, not precede it (from a review)
            self.check_spool_dir()
            self.load_spool()
            latest = self._latest_words()  # read once for both (a full GROUP BY of the table each)
            self.republish(latest)
            self.restore(latest)
            self.warm_prefixes()

    def _latest_words(self) -> list[Any] | Exception:
        """:func:`latest_words` at this moment, or the store's error (:meth:`republish` and :meth:`restore` log
        it; neither asks the store away again: one timeout at start, not three)."""
        try:
            return latest_words(self.store, self.registry.keep_deleted_s, self.clock())
        except Exception as exc:
            return exc

    # -- the spool: decisions the store had not taken at shutdown ------------------------------------------
    def _spool(self, decisions: list[Any]) -> str:
        """Write ``decisions`` to a new file of :attr:`spool_dir` (complete or absent: written aside, renamed;
        the name is unique: time, then a random part)."""
        import uuid

        from forumpulse.detectors.dos import JsonLinesSink

        self.spool_dir.mkdir(parents=True, exist_ok=True)
        path = self.spool_dir / f"decisions-{int(time.time() * 1000):013d}-{uuid.uuid4().hex[:12]}.jsonl"
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "x", encoding="utf-8") as f:
                out = JsonLinesSink(f)
                for d in decisions:
                    out.emit(d)
                out.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        with contextlib.suppress(OSError):  # the rename itself survives a power cut
            fd = os.open(self.spool_dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return str(path.absolute())

    def check_spool_dir(self) -> bool:
        """Whether :attr:`spool_dir` can take a spool file (created when missing); logged at start when not, so
        an unwritable folder shows before a stop needs it (user trial 42)."""
        try:
            self.spool_dir.mkdir(parents=True, exist_ok=True)
            ok = os.access(self.spool_dir, os.W_OK | os.X_OK)
        except OSError as exc:  # said as config check says it ("not a folder"), else the OS error
            ok, why = False, spool_state(self.spool_dir)[0] or str(exc)
        else:
            why = "not writable"
        if not ok:
            log.error("detectors.live.spool_dir %s: %s; decisions the store has not taken when this process stops "
                      "would be lost", self.spool_dir.absolute(), why)
        return ok

    def load_spool(self) -> int:
        """Insert the decisions spooled at earlier shutdowns (:attr:`spool_dir`, ``decisions-*.jsonl``, oldest
        first) into the ``decisions`` table, removing each file once the store took it.  A file is claimed
        first (renamed ``*.loading-<pid>``): two owners sharing the folder never load one file both.  When the
        store refuses (still away) the file goes back and the rest wait too, for the next start; a file that
        cannot be read now (permissions, I/O) stays; one whose lines do not parse is renamed ``*.bad`` and
        logged.  A crash between the insert and the removal loads that file again: it lands once (one block,
        the same insert token; migration 0013), unless more than the deduplication window's 1,000 parts were
        inserted in between.  Never raises (logged).  Returns the decisions
        loaded (also :attr:`unspooled`)."""
        from forumpulse.detectors.dos import StoreSink, decision_from_json

        loaded = 0
        try:
            if self.spool_dir.is_dir():
                self._unclaim_stale()
            paths = sorted(self.spool_dir.glob("decisions-*.jsonl")) if self.spool_dir.is_dir() else []
        except OSError as exc:
            log.error("spool %s unreadable: %s", self.spool_dir, exc)
            paths = []
        for path in paths:
            claimed = path.with_name(f"{path.name}.loading-{os.getpid()}")
            try:
                os.replace(path, claimed)
            except FileNotFoundError:
                continue  # another owner took it
            except OSError as exc:  # the folder not writable: it could neither be claimed nor removed once loaded
                log.error("spooled decisions %s not loaded: cannot claim it (%s); make %s writable for this "
                          "process", path.absolute(), exc, self.spool_dir.absolute())
                continue
            try:
                with open(claimed, encoding="utf-8") as f:
                    lines = [line for line in f if line.strip()]
            except OSError as exc:
                log.error("spooled decisions %s unreadable now (%s): kept for the next start", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(claimed, path)
                continue
            try:
                ds = [decision_from_json(json.loads(line)) for line in lines]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                log.error("spooled decisions %s malformed (%s): renamed to .bad, not loaded", path, exc)
                with contextlib.suppress(OSError):
                    os.replace(claimed, path.with_suffix(".bad"))
                continue
            try:
                sink = StoreSink(self.store, flush_every=1_000_000)
                for d in ds:
                    sink.emit(d)
                sink.flush()
            except Exception as exc:
                log.warning("spooled decisions %s not loaded (the store: %s); kept with the rest for the next "
                            "start", path, error_line(exc))
                with contextlib.suppress(OSError):
                    os.replace(claimed, path)
                break  # the store is away: one timeout, not one per file
            claimed.unlink(missing_ok=True)
            loaded += len(ds)
            log.warning("loaded %d decision(s) spooled at an earlier shutdown (%s) into the decisions table",
                        len(ds), path.name)
        self.unspooled += loaded
        return loaded

    def _unclaim_stale(self) -> None:
        """Put back files an owner claimed and did not finish (it crashed between the claim and the removal):
        claimed by this process id before this start, or by a process that is gone."""
        for claimed in self.spool_dir.glob("decisions-*.jsonl.loading-*"):
            try:
                pid = int(claimed.name.rsplit("-", 1)[1])
            except ValueError:
                continue
            if pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    continue  # that owner is still loading it
                except ProcessLookupError:
                    pass
                except OSError:
                    continue  # alive, another user's
            with contextlib.suppress(OSError):
                os.replace(claimed, claimed.with_name(claimed.name.rsplit(".loading-", 1)[0]))
                log.warning("spooled decisions %s: an earlier load did not finish; loading it again", claimed.name)

    def _kafka_sink(self) -> _GuardedSink | None:
        return next((s for s in self.sinks if s.name == "kafka"), None)

    def republish(self, latest: list[Any] | Exception | None = None) -> int:
        """Publish again, on the Kafka sink (when publishing), the decisions the topic never confirmed
        (:func:`unpublished_from_store`: the latest word per value, a ban in force or an unban while a ban of its
        value would still be in force; never a ban :meth:`restore` refuses): a decision still queued in the
        producer when the last owner stopped or was killed (the broker away) reached the table but not the
        consumers of ``weblogs.decisions``.  They go through the
        guarded sink (kept and sent again while the broker stays away) with their original ids and times; the
        first start after migration 0012 publishes every such decision once more (no confirmations recorded
        yet).  At least once: consumers must take a decision id twice.  Store errors are logged; nothing is
        sent then.  ``latest``: :meth:`_latest_words` read at start (shared with :meth:`restore`; its error is
        logged as the store's).  Returns how many were queued (also :attr:`republished`)."""
        kafka = self._kafka_sink()
        if kafka is None:
            return 0
        try:
            if isinstance(latest, Exception):
                raise latest
            again = unpublished_from_store(self.store, kafka.inner.topic, self.registry.keep_deleted_s,
                                           self.clock(), latest=latest)
        except Exception as exc:
            log.warning("could not read which decisions %s has not confirmed (none published again): %s",
                        kafka.inner.topic, error_line(exc))
            return 0
        # a ban restore refuses (loopback, link-local, not an address: rows of a version that made them) is not
        # sent either: firewall hosts would ban what the owner itself never bans (from a review)
        again = [d for d in again if d.action != "ban" or _refused(d.value) is None]
        if not again:
            return 0
        with self.lock:
            for d in again:
                kafka.emit(d)
            kafka.flush()
        self.republished += len(again)
        log.warning("published again on %s: %d decision(s) it never confirmed (%d ban(s), %d unban(s))",
                    kafka.inner.topic, len(again), sum(d.action == "ban" for d in again),
                    sum(d.action == "unban" for d in again))
        return len(again)

    def warm_prefixes(self) -> int:
        """Teach the detector's prefix baselines the last ``prefix_baseline.forget_after_s`` (24 h) of the store's
        ``prefix_minute`` rollup, so a restarted owner does not judge every range as never seen (a busy carrier
        NAT /24 would look like a surge once the warm-up ends).  Skipped when no prefix rule scales by the
        baseline, and when privacy rewrites stored addresses so that their /24 (/64) is not the client's
        (``pseudonymize``, or ``truncate`` to less than /24 or /64).  A range with a ban decision (any mode) learns
        nothing up to that ban's end, as on the live path.  The rollup counts static files too: the rates err
        upwards.  Failures are logged; detection starts unwarmed.  Returns the prefixes learned."""
        from forumpulse.detectors.dos import prefix_of

        priv = self.settings.privacy
        if not self.detector.has_prefix_scale or priv.client_ip == "pseudonymize" or (
                priv.client_ip == "truncate" and (priv.truncate_ipv4_prefix < 24 or priv.truncate_ipv6_prefix < 64)):
            return 0
        pb = self.detector.rules.prefix_baseline
        now_min = int(self.clock()) // 60
        since = now_min - max(pb.forget_after_s // 60, 1)
        rows = self._query(
            "SELECT IPv6NumToString(prefix), intDiv(toUnixTimestamp(minute), 60) AS m, sum(requests) AS n "
            f"FROM prefix_minute WHERE minute >= toDateTime({since * 60}, 'UTC') "
            f"AND minute < toDateTime({now_min * 60}, 'UTC') GROUP BY prefix, prefix_len, minute "
            f"HAVING n >= {int(pb.min_requests_per_minute)} ORDER BY m", "warm the prefix baselines from prefix_minute")
        # a range decided against (any mode: observe, or enforced at the edge, lets its flood reach the logs)
        # teaches nothing up to its ban's end, as on the live path
        flagged = self._query(
            "SELECT value, max(toUnixTimestamp64Milli(expires_at)) FROM decisions WHERE action = 'ban' AND "
            f"scope = 'range' AND expires_at >= toDateTime64({since * 60}, 3, 'UTC') GROUP BY value",
            "read range decisions for the prefix baselines")
        if rows is None or flagged is None:
            return 0
        with self.lock:
            for value, until_ms in flagged:
                self.detector.prefix_rates.taint(str(value), int(until_ms) // 1000)
            # prefix_of maps the rollup's IPv4-mapped /120 starts (::ffff:a.b.c.0) to a.b.c.0/24, as live lines
            self.warmed_prefixes = self.detector.warm_prefix_rates(
                (prefix_of(str(p)), int(m), int(n)) for p, m, n in rows)
        if self.warmed_prefixes:
            log.info("prefix baselines: %d range(s) learned from the last %d h of prefix_minute",
                     self.warmed_prefixes, (now_min - since) // 60)
        return self.warmed_prefixes

    # -- state ----------------------------------------------------------------------------------------
    def restore(self, latest: list[Any] | Exception | None = None) -> int:
        """Put bans still in force (``decisions`` table, wall clock) back into the manager and the registry, and
        re-apply them, with the time they have left, to the actions that hold kernel state lost on a reboot
        (``reapply_on_restore``: nftables, ipset; re-adding is idempotent).  Webhooks are not called again: their
        receivers were told when the ban was made.  Action errors are logged and counted, never fatal.  A row
        is keyed by its canonical value (as a new decision is); one the manager would refuse now (loopback,
        unspecified, link-local, multicast -- written by a version that banned them -- or not an address) is
        not restored, served to bouncers or re-applied: it is logged and counted in ``manager.suppressed``.  A
        ban of a trusted proxy (made before ``sites[].trusted_proxies`` listed it) is lifted: an unban goes to
        the store, the decision stream (bouncers) and every action, so no firewall set keeps it.  ``latest``: as
        :meth:`republish`."""
        try:
            if isinstance(latest, Exception):
                raise latest
            active = active_from_store(self.store, self.clock(), latest=latest)
        except Exception as exc:
            log.warning("could not restore active decisions: %s", error_line(exc))
            return 0
        try:  # the registry first: bans in force and the deletions a bouncer's cursor from before may lack
            self.registry.load_store(self.store)
        except Exception as exc:
            log.warning("could not rebuild the decision stream from the store: %s", error_line(exc))
        from dataclasses import replace

        from forumpulse.detectors.dos import canonical_network, net_value

        with self.lock:
            for d in active:
                if d.mode != "enforce":
                    continue
                refused = _refused(d.value)
                if refused is not None:
                    self.manager.suppressed[refused] += 1
                    if refused == "invalid":
                        log.warning("not restoring decision %s: %r is not a ban value", d.id, d.value)
                    else:
                        log.warning("not restoring the ban of %s (%s, never banned)", d.value, refused)
                    continue
                value = net_value(canonical_network(d.value))
                if self.manager.overlaps(value, self.manager.proxies):  # banned before it was listed: lift it
                    self.manager.suppressed["trusted_proxy"] += 1
                    self.manager.active[value] = d if value == d.value else replace(d, value=value)
                    self.manager.unban(value, reason="trusted_proxy")  # store, decision stream, firewall actions
                    log.warning("lifted the ban of %s at start: a trusted proxy (sites[].trusted_proxies)", value)
                    continue
                if value in self.manager.active:
                    continue
                if value != d.value:
                    d = replace(d, value=value)
                self.manager.active[d.value] = d
                left = int(d.created_at / 1000 + d.duration_s - self.clock())
                if left > 0:
                    again = replace(d, duration_s=left)
                    self.registry.ban(again)
                    for a in self.manager.actions:
                        if getattr(a, "reapply_on_restore", False):
                            try:
                                a.ban(again)
                            except Exception as exc:
                                self.manager.action_errors += 1
                                log.warning("could not re-apply %s to %s: %s", d.value, getattr(a, "name", a),
                                            error_line(exc))
                self.restored += 1
            self.manager.flush()  # an unban restore made (a trusted proxy) reaches the table and Kafka now
        if self.restored:
            log.info("restored %d active decision(s) from the decisions table", self.restored)
        return self.restored

    # -- entry points -----------------------------------------------------------------------------------
    def process_stream(self, stream: pa.Table) -> list[Any]:
        """Judge one batch of stream rows (``Processor`` ``stream`` table); returns the decisions made."""
        from forumpulse.detectors.dos import Batch

        if stream.num_rows == 0:
            return []
        batch = Batch.from_arrow(stream)
        with self.lock:
            try:
                made = self.detector.process(batch)
            finally:
                self.manager.flush()  # sinks: table insert + Kafka flush right away (decisions are rare)
            self.batches += 1
        for d in made:
            log.info("dos decision: %s %s %s (%s, %ds, %s)", d.action, d.scope, d.value, d.reason, d.duration_s,
                     d.mode)
        return made

    def unban(self, value: str, reason: str = "manual") -> dict[str, Any]:
        """Lift a ban: every sink, action and the registry get an ``unban`` decision (even when this process
        does not hold the ban, e.g. one made before a restart that expired in memory: the set element and the
        bouncers are cleaned anyway).  Raises ValueError for a value that is not an address/network."""
        from forumpulse.detectors.dos import Decision

        v = normalize_value(value)
        with self.lock:
            u = self.manager.unban(v, reason=reason)
            self._untaint(v)
            held = u is not None
            if u is None:
                import uuid

                now = int(self.clock() * 1000)
                net = ipaddress.ip_network(v)
                u = Decision(id=uuid.uuid4().hex, created_at=now, decided_at=now, first_seen=now, expires_at=now,
                             site=self.cfg.site, action="unban", value=v,
                             scope="ip" if net.prefixlen == net.max_prefixlen else "range", reason=reason,
                             duration_s=0, mode="enforce", origin="forumpulse", evidence={"ban_id": None})
                # the same fan-out (and counts) as DecisionManager.unban for a ban this process does not hold
                self.manager.dispatch(u)
            self.manager.flush()
        # logged as bans are (user trial 43: a ban lifted through /fp/unban left no line in the owner's log)
        log.info("dos decision: unban %s %s (%s, %s)", u.scope, v, reason,
                 "a ban in force lifted" if held else "no ban held here: sinks and actions cleaned anyway")
        return {"unbanned": v, "held": held, "decision": u.to_json()}

    def _untaint(self, value: str) -> None:
        """A lifted ban lets its address (or range) teach its baseline again at once: the ban had stopped the
        learning until its original expiry, so a NAT banned by mistake kept its old rate (from a review)."""
        self.detector.baseline.tainted.pop(value, None)
        self.detector.prefix_rates.tainted.pop(value, None)

    def sync_store_unbans(self) -> int:
        """Lift the bans this process holds that an ``unban`` row written since the last call (or since start)
        ended -- ``forumpulse detect unban`` without an owner writes only the store and the actions; the
        periodic firewall check would otherwise put the element back, and the decision API would keep serving
        it.  The unban goes through the manager (a second unban row and message, reason as stored).  Returns
        the bans lifted; store errors are logged."""
        now_ms = int(self.clock() * 1000)
        since = self._unbans_seen_ms
        rows = self._query(
            "SELECT value, toUnixTimestamp64Milli(max(created_at)), argMax(reason, created_at) FROM decisions "
            f"WHERE action = 'unban' AND created_at > fromUnixTimestamp64Milli({since}, 'UTC') GROUP BY value",
            "read unbans from the store")
        if rows is None:
            return 0
        lifted = 0
        with self.lock:
            for value, at, reason in rows:
                held = self.manager.active.get(str(value))
                if held is not None and held.created_at < int(at):
                    self.manager.unban(str(value), reason=str(reason) or "manual")
                    self._untaint(str(value))
                    lifted += 1
                elif held is None:  # an expired ban's value: its next ban is a first offence again too
                    self.manager.forget(str(value))
                    self._untaint(str(value))
            self.manager.flush()
        # the next call reads from 2 minutes before this one (rows written late, or by a clock behind, are still
        # seen; one read twice finds its ban already lifted), never from before the start
        self._unbans_seen_ms = max(self._unbans_from_ms, now_ms - 120_000)
        if lifted:
            log.info("lifted %d ban(s) unbanned on the store directly", lifted)
        return lifted

    def check_firewall(self) -> int:
        """Make every kernel-state action (nftables, ipset: ``ensure()``) hold its table, sets, rules and every
        ban it recorded still in force -- what a firewall reload or ``nft flush`` took away is put back.  Runs
        outside the detection lock (the actions lock themselves).  Returns the number of actions that failed
        (logged, counted in ``firewall_check_errors``)."""
        self.sync_store_unbans()  # a ban lifted on the store directly must not be put back
        failed = 0
        for a in list(self.manager.actions):
            ensure = getattr(a, "ensure", None)
            if not (getattr(a, "reapply_on_restore", False) and callable(ensure)):
                continue
            try:
                ensure()
            except Exception as exc:
                failed += 1
                log.warning("firewall check of %s failed: %s", getattr(a, "name", a),
                            error_line(exc))
        self.firewall_checks += 1
        self.firewall_check_errors += failed
        return failed

    #: a side query failing again and again (the store away: the unban sync runs every firewall check) is
    #: logged when it starts failing, then at most once per this many seconds, and once when it answers again
    QUERY_FAILURE_LOG_EVERY_S = 300.0

    def _query(self, sql: str, what: str) -> list[Any] | None:
        """Rows of a side query (warm start, unban sync); None, logged, when the store fails (repeats of a
        failure logged at most every :attr:`QUERY_FAILURE_LOG_EVERY_S`, with their count)."""
        failing = self._query_failing.setdefault(what, _FailureLog(self.QUERY_FAILURE_LOG_EVERY_S))
        try:
            rows = list(self.store.query_rows(sql))
        except Exception as exc:
            if failing.failed():
                log.warning("could not %s: %s%s", what, error_line(exc), "" if failing.count == 1 else
                            f" (failing for {failing.for_s():.0f} s, {failing.count} attempt(s))")
            return None
        back = failing.recovered()
        if back is not None:
            log.info("the store answers again: %s works (failed %d time(s) over %.0f s)", what, *back)
        return rows

    def _in_force(self, now: float) -> list[Any]:
        """Bans the manager holds that are in force by the wall clock (it expires its own only when a candidate
        arrives)."""
        return [d for d in list(self.manager.active.values()) if d.created_at / 1000 + d.duration_s > now]

    def active(self) -> list[dict[str, Any]]:
        """Bans in force, newest first (:func:`decision_view`), with ``published`` when decisions go to Kafka
        (:func:`with_published`)."""
        now = self.clock()
        with self.lock:
            ds = self._in_force(now)
        kafka = self._kafka_sink()
        return with_published([decision_view(d, now) for d in sorted(ds, key=lambda d: -d.created_at)], self.store,
                              kafka.inner.topic if kafka is not None else None)

    def active_count(self) -> int:
        """Enforced bans in force by the wall clock (an observe decision blocks nothing; read without the
        detection lock: a scrape never waits for a batch)."""
        return sum(1 for d in self._in_force(self.clock()) if d.mode == "enforce")

    def close(self) -> None:
        with self.lock:
            for s in self.sinks:
                s.close()

    # -- owner routes -----------------------------------------------------------------------------------
    def routes(self, password: str | None = None) -> dict[tuple[str, str], Any]:
        def authorized(req: Any) -> bool:
            if not password:
                return True
            import base64
            import hmac

            given = req.headers.get("X-ClickHouse-Key") or req.params.get("password")
            auth = req.headers.get("Authorization", "")
            if given is None and auth.startswith("Basic "):
                with contextlib.suppress(Exception):
                    given = base64.b64decode(auth[6:]).decode().split(":", 1)[1]
            return given is not None and hmac.compare_digest(given.encode(), password.encode())

        def unban(req: Any) -> tuple[int, str, bytes]:
            if not authorized(req):
                return 403, "application/json", b'{"error": "password required"}'
            value = req.params.get("value", "")
            if not value and req.body:
                with contextlib.suppress(ValueError):
                    value = str(json.loads(req.body).get("value", ""))
            try:
                out = self.unban(value, reason=req.params.get("reason", "manual") or "manual")
            except ValueError as exc:
                return 400, "application/json", json.dumps({"error": str(exc)}).encode()
            return 200, "application/json", json.dumps(out).encode()

        def decisions(req: Any) -> tuple[int, str, bytes]:
            if not authorized(req):
                return 403, "application/json", b'{"error": "password required"}'
            return 200, "application/json", json.dumps(self.active()).encode()

        return {("POST", "/fp/unban"): unban, ("GET", "/fp/decisions"): decisions}


class DosHook:
    """A consumer :data:`~forumpulse.pipeline.consumer.StreamHook` feeding a :class:`LiveDos`."""

    def __init__(self, live: LiveDos) -> None:
        self.live = live

    def __call__(self, stream: pa.Table, info: BatchInfo) -> None:
        self.live.process_stream(stream)


# ---------------------------------------------------------------------------------------------- feed


class DosFeed:
    """A light consumer group on ``weblogs.raw`` for detection only: small batches, nothing stored.

    Each ``consume(num_messages=batch_lines, timeout=max_wait_s)`` call is one batch: envelopes are split by
    source and parsed by the same :class:`~forumpulse.pipeline.process.Processor` as the loader, and the
    ``stream`` rows go to ``hook`` (a :class:`DosHook`).  Heartbeats and values that are not envelopes are
    skipped (the loader dead-letters them).  Offsets are committed automatically (every second), so a
    restarted :meth:`run` (the owner restarts it after an error, with the same detector) or a rebalance
    re-reads what came after the last commit: messages below the next offset this feed already gave its hook
    are skipped (counted in ``replayed``), so the detector never counts a line twice -- a client just under a
    threshold would be banned by its own replayed lines.  A partition whose log ends before that offset when it
    is assigned (recreated or truncated) starts afresh, and so does one whose offsets go back once new messages
    came after the assignment (a log reset while assigned).  Limit: a log recreated and refilled past the old
    offset before the partition is assigned again looks like a replay until it passes that offset.  A new
    ``DosFeed`` (a new process) has a new detector and starts from the committed offsets.
    """

    def __init__(self, settings: Settings, hook: Callable[[pa.Table, BatchInfo], None], stop: threading.Event,
                 bootstrap_servers: str | None = None, topic: str | None = None, options: LiveConfig | None = None,
                 kafka_config: dict[str, Any] | None = None) -> None:
        from forumpulse.pipeline.process import Processor

        self.settings = settings
        self.hook = hook
        self.stop = stop
        self.opt = options or live_config(settings)
        self.bootstrap = bootstrap_servers or settings.kafka.bootstrap_servers
        self.topic = topic or settings.kafka.raw_topic
        self.kafka_config = dict(kafka_config or {})
        self.processor = Processor(settings)
        self.lines = 0
        self.batches = 0
        self.errors = 0
        self.replayed = 0  # messages skipped because this feed's hook already had them
        self.assigned = threading.Event()
        self._fed: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset not yet given to the hook
        #: assigned, no new message yet: offsets below _fed are a replay
        self._replaying: set[tuple[str, int]] = set()

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._replaying.add(key)  # a replay can only begin at an assignment (restart, rebalance)
            if key in self._fed:
                try:
                    _low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
                except Exception:
                    continue
                if high < self._fed[key]:
                    log.warning("dos feed: %s/%d now ends at offset %d, before %d already judged: the log was "
                                "recreated or truncated; judging it from the start", *key, high, self._fed[key])
                    del self._fed[key]
        try:
            total = len(consumer.list_topics(self.topic, timeout=5).topics[self.topic].partitions)
        except Exception:
            total = -1
        if 0 < len(partitions) < total:
            log.warning("dos feed got %d of %d partitions of %s: prefix and distributed rules need all of them "
                        "(run --dos in one process)", len(partitions), total, self.topic)
        self.assigned.set()

    def stream_of(self, msgs: Sequence[Any]) -> pa.Table | None:
        from forumpulse.pipeline.contracts import split_values
        from forumpulse.pipeline.process import SourceContext

        groups = split_values([m.value() for m in msgs if m.error() is None]).groups  # heartbeats/bad left out
        parts = []
        for (site, host, file, fmt), (_pos, lines) in groups.items():
            d = [x.decode("utf-8", "backslashreplace") for x in (site, host, file, fmt)]
            pb = self.processor.process(lines, SourceContext(site=d[0], origin_host=d[1], origin_file=d[2],
                                                             format=d[3]), source_ref="dos-feed")
            if pb.stream.num_rows:
                parts.append(pb.stream)
        if not parts:
            return None
        return pa.concat_tables(parts, promote_options="default")

    def run(self) -> None:
        from confluent_kafka import Consumer, KafkaException

        c = Consumer(client_config({
            "bootstrap.servers": self.bootstrap, "group.id": self.opt.feed_group,
            "auto.offset.reset": self.opt.feed_start, "enable.auto.commit": True,
            "auto.commit.interval.ms": 1000, "session.timeout.ms": 6000, "fetch.wait.max.ms": 100,
            "client.id": "forumpulse-dos-feed"}, self.kafka_config))
        c.subscribe([self.topic], on_assign=self._on_assign)
        try:
            while not self.stop.is_set():
                msgs = c.consume(num_messages=self.opt.feed_batch_lines, timeout=self.opt.feed_max_wait_s)
                if not msgs:
                    continue
                for m in msgs:  # a fatal error first, before any offset of the batch counts as judged
                    err = m.error()
                    if err is not None and err.fatal():
                        raise KafkaException(err)
                fresh = []
                for m in msgs:
                    if m.error() is not None:
                        continue
                    key, off = (str(m.topic()), int(m.partition() or 0)), int(m.offset() or 0)
                    if off < self._fed.get(key, -1):
                        if key in self._replaying:
                            self.replayed += 1
                            continue
                        # offsets went back while assigned, past the replay: the log was reset (truncated,
                        # recreated; librdkafka's offset reset) -- these are new messages
                        log.warning("dos feed: %s/%d went back from offset %d to %d while assigned: the log was "
                                    "reset; judging it from there", *key, self._fed[key], off)
                    self._replaying.discard(key)
                    self._fed[key] = off + 1
                    fresh.append(m)
                if not fresh:
                    continue
                msgs = fresh
                try:
                    stream = self.stream_of(msgs)
                    if stream is not None:
                        self.lines += stream.num_rows
                        self.hook(stream, BatchInfo(self.topic, -1, msgs[0].offset() or 0, msgs[-1].offset() or 0, False))
                    self.batches += 1
                except Exception:
                    self.errors += 1
                    log.exception("dos feed batch failed (skipped)")
        finally:
            with contextlib.suppress(Exception):
                c.close()


# ---------------------------------------------------------------------------------------------- traffic


class TrafficService:
    """Runs :meth:`TrafficDetector.run_once` now and then every ``interval_s`` (``offset_s`` after the minute).

    ``producer``: ``callable(topic, key, value)`` for ``weblogs.events`` (None: table only).  ``clock`` gives
    the wall time (epoch seconds) passed to ``run_once``.
    """

    def __init__(self, settings: Settings, store: Any, producer: Callable[[str, bytes, bytes], None] | None = None,
                 interval_s: float | None = None, offset_s: float | None = None,
                 clock: Callable[[], float] = time.time, flush: Callable[[], Any] | None = None) -> None:
        from forumpulse.detectors.traffic import TrafficDetector

        live = live_config(settings)
        self.store = store
        self.detector = TrafficDetector(settings, producer=producer)
        self.interval_s = live.traffic_interval_s if interval_s is None else interval_s
        self.offset_s = live.traffic_offset_s if offset_s is None else offset_s
        self.clock = clock
        self.flush = flush
        self.runs = 0
        self.errors = 0
        self.emitted = 0
        self.last_run = 0.0  # wall time of the last run (epoch s)
        self.run_started = 0.0  # clock() when the run under way began (0 between runs)

    @property
    def publish_failures(self) -> int:
        """Detections whose ``weblogs.events`` delivery was not confirmed (kept and retried), 0 without Kafka."""
        return int(getattr(self.detector.producer, "failures", 0))

    def tick(self) -> list[Any]:
        """One run at ``clock()``; returns the detections it published (errors are logged, counted, re-raised).
        :attr:`emitted` counts the detection states the run stored -- published or not, also those of a run that
        failed for some sites."""
        self.run_started = self.clock()
        now = datetime.fromtimestamp(self.run_started, UTC)
        stored = getattr(self.detector, "stored_total", 0)
        try:
            dets = self.detector.run_once(self.store, now)
        except Exception:
            self.errors += 1
            raise
        finally:
            self.runs += 1
            self.last_run = now.timestamp()
            self.run_started = 0.0
            if self.flush is not None:
                with contextlib.suppress(Exception):
                    self.flush()
            # what was found and stored, published or not (counting only what Kafka confirmed hid every
            # detection while the broker was away: a user trial saw 12 stored and the metric at 0)
            new = getattr(self.detector, "stored_total", 0) - stored
            self.emitted += new
            if new:
                log.info("traffic detectors: %d detection(s) stored at %s", new, now.isoformat(timespec="seconds"))
        return list(dets)

    def _next_delay(self, now: float | None = None) -> float:
        """Seconds to the next run: with a whole number of minutes, ``offset_s`` after the next minute boundary
        that is a multiple of the interval (every 2 minutes: at :00, :02, ...; every 5: :00, :05, ...), so runs
        stay aligned to complete minutes; else simply ``interval_s``."""
        now = self.clock() if now is None else now
        if self.interval_s % 60 == 0:
            step = int(self.interval_s)
            nxt = (now // step + 1) * step + self.offset_s
            if nxt - step > now:  # still before this interval's run (now is inside the offset)
                nxt -= step
            return max(1.0, nxt - now)
        return self.interval_s

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("traffic detectors failed (next run in %.0f s)", self.interval_s)
            stop.wait(self._next_delay())


# ---------------------------------------------------------------------------------------------- metrics


class DosCollector:
    """prometheus-client collector reading a :class:`LiveDos` (and its feed, when any) at scrape time.  Counters
    are the detector's own (reset when the owner restarts, as Prometheus counters may)."""

    def __init__(self, live: LiveDos, handles: LiveHandles | None = None) -> None:
        self.live, self.handles = live, handles

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        live, m = self.live, self.live.manager
        yield CounterMetricFamily("forumpulse_dos_lines", "access lines judged by the live DoS detector",
                                  value=live.detector.stats.get("lines", 0))
        yield CounterMetricFamily("forumpulse_dos_batches", "batches judged by the live DoS detector",
                                  value=live.batches)
        made = CounterMetricFamily("forumpulse_dos_decisions", "decisions dispatched (bans and unbans)",
                                   labels=["action", "reason", "scope", "mode"])
        for (action, reason, scope, mode), n in sorted(dict(m.made).items()):
            made.add_metric([action, reason, scope, mode], n)
        yield made
        refused = CounterMetricFamily("forumpulse_dos_refused", "candidates not decided, by reason (allowlist, "
                                      "trusted_proxy, verified crawler, already banned, loopback, ...)", labels=["reason"])
        for reason, n in sorted(dict(m.suppressed).items()):
            refused.add_metric([reason], n)
        yield refused
        yield CounterMetricFamily("forumpulse_dos_action_errors", "firewall/webhook actions that raised",
                                  value=m.action_errors)
        yield CounterMetricFamily("forumpulse_dos_webhook_failures", "webhook deliveries that failed after their "
                                  "retries (background delivery)",
                                  value=sum(int(getattr(a, "failed", 0)) for a in m.actions))
        yield GaugeMetricFamily("forumpulse_dos_active_bans", "enforced bans in force (wall clock) held by the "
                                "manager (observe decisions are not counted)",
                                value=live.active_count())
        yield CounterMetricFamily("forumpulse_dos_restored", "bans restored from the decisions table at start",
                                  value=live.restored)
        yield CounterMetricFamily("forumpulse_dos_unspooled", "decisions the store had not taken at an earlier "
                                  "shutdown, loaded from the spool at start", value=live.unspooled)
        yield CounterMetricFamily("forumpulse_dos_republished", "decisions published again on the decisions "
                                  "topic at start: the topic never confirmed them", value=live.republished)
        kafka = live._kafka_sink()
        yield CounterMetricFamily("forumpulse_dos_published_record_errors", "attempts to record confirmed "
                                  "decisions in decisions_published that failed (retried at the next flush; else "
                                  "published again at start)",
                                  value=int(getattr(kafka.inner if kafka else None, "record_errors", 0)))
        yield CounterMetricFamily("forumpulse_dos_firewall_checks", "periodic checks that the firewall sets hold "
                                  "every ban in force", value=live.firewall_checks)
        yield CounterMetricFamily("forumpulse_dos_firewall_check_errors", "firewall actions whose periodic check "
                                  "failed", value=live.firewall_check_errors)
        yield CounterMetricFamily("forumpulse_dos_crawler_lookup_failures", "crawler verifications whose DNS "
                                  "lookup got no answer (counted as not verified: a real crawler can be banned "
                                  "while DNS fails)", value=int(getattr(m.verifier, "lookup_failures", 0)))
        errs = CounterMetricFamily("forumpulse_dos_sink_errors", "decision sink emits/flushes that failed (store "
                                   "or Kafka away; the decisions are kept and emitted again)", labels=["sink"])
        waiting = GaugeMetricFamily("forumpulse_dos_sink_retrying", "decisions a sink failed to take, waiting to "
                                    "be emitted again", labels=["sink"])
        dropped = CounterMetricFamily("forumpulse_dos_sink_dropped", "decisions dropped by a sink: more were "
                                      "waiting to be emitted again than it keeps", labels=["sink"])
        for sink in live.sinks:
            errs.add_metric([sink.name], sink.errors)
            waiting.add_metric([sink.name], sink.retrying + int(getattr(sink.inner, "waiting", 0)))
            dropped.add_metric([sink.name], sink.dropped)
        yield from (errs, waiting, dropped)
        feed = self.handles.feed if self.handles is not None else None
        if feed is not None:
            yield CounterMetricFamily("forumpulse_dos_feed_errors", "DoS feed batches that failed",
                                      value=feed.errors)
            yield CounterMetricFamily("forumpulse_dos_feed_replayed", "messages re-read by the DoS feed after a "
                                      "restart or rebalance and skipped (its detector already had them)",
                                      value=feed.replayed)


class TrafficCollector:
    """prometheus-client collector reading a :class:`TrafficService` at scrape time."""

    def __init__(self, svc: TrafficService) -> None:
        self.svc = svc

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        svc = self.svc
        yield CounterMetricFamily("forumpulse_traffic_runs", "traffic detector runs", value=svc.runs)
        yield CounterMetricFamily("forumpulse_traffic_run_errors", "traffic detector runs that failed",
                                  value=svc.errors)
        yield CounterMetricFamily("forumpulse_traffic_detections", "detection states stored (every state change; "
                                  "published or not: forumpulse_traffic_publish_failures_total counts those not)",
                                  value=svc.emitted)
        yield CounterMetricFamily("forumpulse_traffic_publish_failures", "detections whose delivery to the events "
                                  "topic was not confirmed (kept and retried at the next run)",
                                  value=svc.publish_failures)
        yield GaugeMetricFamily("forumpulse_traffic_events_waiting", "events messages queued for Kafka without a "
                                "delivery report yet (a broker away; each detection state is queued once)",
                                value=int(getattr(svc.detector.producer, "waiting", 0)))
        yield GaugeMetricFamily("forumpulse_traffic_last_run_timestamp_seconds", "wall time of the last run",
                                value=svc.last_run)
        # a run under way is no stuck thread: the first one warms the baselines on history_days of rollups and
        # took 2-4 min for a 1M-lines/day forum (user trial 32, where the documented staleness alert fired)
        yield GaugeMetricFamily("forumpulse_traffic_run_in_progress_seconds",
                                "seconds the traffic detector run under way has taken so far (0 between runs; the "
                                "first run warms the baselines and can take minutes)",
                                value=max(0.0, svc.clock() - svc.run_started) if svc.run_started else 0.0)
        behind = GaugeMetricFamily("forumpulse_traffic_minutes_judged_behind_seconds",
                                   "wall clock minus the end of the last complete minute judged, per site",
                                   labels=["site"])
        now = svc.clock()
        for name, rt in sorted(dict(svc.detector.sites).items()):
            if rt.cursor is not None:
                behind.add_metric([name], round(now - rt.cursor.timestamp(), 3))
        yield behind


# ---------------------------------------------------------------------------------------------- owner services


_PENDING = object()


class EventsPublisher:
    """The ``producer`` hook of :class:`~forumpulse.detectors.traffic.TrafficDetector` for ``weblogs.events``,
    with delivery confirmation: each call queues one message with a delivery callback; :meth:`confirm` (called
    by the detector after handing over a flush's detections) flushes for up to ``timeout_s`` and returns the keys
    whose every message of that flush Kafka acknowledged.  The detector keeps the others in its outbox and hands
    them again at the next run (at least once: one still queued may be delivered late, a duplicate with the same
    key and state).  Messages not confirmed are counted in :attr:`failures` and logged.

    A detection handed again in the same state while its earlier message still waits in the producer's queue
    (no delivery report yet: a broker away) is not queued again: that message's report answers for it.  Before,
    every run queued each pending detection once more: a broker away for an hour grew the queue by some sixty
    copies of each at the one-minute interval (from a review).  :attr:`waiting` counts the messages without a
    report."""

    def __init__(self, producer: Any, timeout_s: float = 10.0) -> None:
        self.producer = producer
        self.timeout_s = timeout_s
        self._batch: list[tuple[bytes, list[Any]]] = []  # key, [delivery error, None (delivered) or _PENDING]
        self._queued: dict[bytes, tuple[bytes, list[Any]]] = {}  # key -> (value, box) of its last message
        self.delivered = 0
        self.failures = 0
        self.requeues_saved = 0

    @property
    def waiting(self) -> int:
        """Messages handed to the producer without a delivery report yet."""
        return sum(1 for _, box in self._queued.values() if box[0] is _PENDING)

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        last = self._queued.get(key)
        if last is not None and last[0] == value and last[1][0] is _PENDING:
            self._batch.append((key, last[1]))  # still queued in this state: its report answers
            self.requeues_saved += 1
            return
        box: list[Any] = [_PENDING]

        def done(err: Any, _msg: Any) -> None:
            box[0] = err

        self.producer.produce(topic, key=key, value=value, on_delivery=done)
        self._batch.append((key, box))  # only once handed over: a produce() that raised leaves nothing pending
        self._queued[key] = (value, box)
        self.producer.poll(0)

    def confirm(self) -> set[bytes]:
        batch, self._batch = self._batch, []
        if not batch:
            return set()
        left: Any = None
        try:
            left = self.producer.flush(self.timeout_s)
        except Exception as exc:  # an unconfirmed delivery is retried, whatever went wrong
            left = f"flush failed: {type(exc).__name__}: {exc}"
        ok: set[bytes] = set()
        bad: set[bytes] = set()
        reasons: dict[str, int] = {}
        for key, box in batch:
            if box[0] is None:
                ok.add(key)
                continue
            bad.add(key)
            why = "no delivery report" if box[0] is _PENDING else str(box[0])
            reasons[why] = reasons.get(why, 0) + 1
        # a reported message leaves the queue's record (an error: the next hand-over queues it again)
        self._queued = {k: q for k, q in self._queued.items() if q[1][0] is _PENDING}
        failed = sum(reasons.values())
        self.delivered += len(batch) - failed
        if failed:
            self.failures += failed
            log.warning("traffic events: %d of %d message(s) not confirmed by Kafka (%s; still queued: %s); the "
                        "detections stay in the outbox and are sent again at the next run", failed, len(batch),
                        "; ".join(f"{n} x {w}" for w, n in sorted(reasons.items())), left)
        return ok - bad


def _kafka_producer(bootstrap: str) -> Any:
    from confluent_kafka import Producer

    return Producer(client_config({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20}))


@dataclass
class LiveHandles:
    """What the services built (for tests and benchmarks): set once the owner has started."""

    dos: LiveDos | None = None
    feed: DosFeed | None = None
    api: Any = None
    traffic: TrafficService | None = None


def _fail_start(ctx: Any, live: LiveDos, message: str) -> NoReturn:
    """The DoS service cannot start: stop what it built, tell the owner's other services to stop, close the
    store, and exit with status 1 and ``message`` on one line.

    The store is closed here because the owner does not shut down when a service fails in ``Owner.start``
    (pipeline/owner.py), and a chDB session still open when the interpreter exits crashed the process (status
    139, a segfault in chDB's teardown) after the error.  Closing twice is harmless (``Store.close`` is
    idempotent)."""
    ctx.stop.set()
    for t in list(getattr(ctx, "threads", [])):  # services started before this one
        t.join(10)
    with contextlib.suppress(Exception):
        live.close()
    with contextlib.suppress(Exception):
        ctx.store.close()
    raise SystemExit(f"error: {message}")


def dos_service(actions: Sequence[Any] | None = None, handles: LiveHandles | None = None) -> Callable[[Any], None]:
    """An owner service running live DoS detection (see the module doc).  ``actions`` overrides the configured
    ones (e.g. ``[NftablesAction(netns=...)]``).  With ``detectors.dos.enabled: false`` it starts nothing (no
    detector, feed, hook, actions, decision API, owner routes or firewall check) and logs one warning saying so;
    ``forumpulse detect unban`` / ``decisions`` then work on the store directly (the owner answers 404)."""

    def service(ctx: Any) -> None:
        from forumpulse.detectors.decision_api import DecisionApiServer
        from forumpulse.detectors.dos_rules import DosConfig

        if not DosConfig.model_validate(ctx.settings.detectors.get("dos", {}) or {}).enabled:
            # off means off: no detector, no decisions, no actions, no decision API, no firewall upkeep
            log.warning("DoS detection is off (detectors.dos.enabled: false): --dos starts nothing -- no decisions, "
                        "no firewall sets, no decision API; bans already in nftables/ipset expire on their own "
                        "timeouts (lift one with `forumpulse detect unban`)")
            return
        live = LiveDos(ctx.settings, ctx.store, actions=actions)
        h = handles if handles is not None else LiveHandles()
        h.dos = live
        api_cfg = live.actions_cfg.decision_api
        if api_cfg.enabled:  # the config refuses a bad listen address and an enabled API without a key
            host, port = api_cfg.address()
            try:
                h.api = DecisionApiServer(live.registry, api_cfg.keys(), host, port).start()
            except OSError as exc:  # the port is in use, the address is not this host's, a name does not resolve
                _fail_start(ctx, live, f"the decision API cannot listen on {api_cfg.listen} "
                            f"(actions.decision_api.listen): {exc.strerror or exc}; free the port or choose "
                            "another address")
            shown = f"[{host}]" if ":" in host else host
            log.info("decision stream (CrowdSec bouncers) on http://%s:%d/v1/decisions/stream", shown, h.api.port)
        ctx.routes.update(live.routes(getattr(ctx, "password", None)))
        if hasattr(ctx, "collectors"):
            ctx.collectors.append(DosCollector(live, h))
        hook = DosHook(live)
        threads: list[threading.Thread] = []
        every = live.live.firewall_check_s
        if every > 0:  # also picks up unbans written on the store directly (the decision API serves bans too)

            def check_firewall() -> None:
                while not ctx.stop.wait(every):
                    live.check_firewall()

            threads.append(threading.Thread(target=check_firewall, name="dos-firewall-check", daemon=True))
        if live.live.dos_source == "loader":
            if not getattr(ctx, "consume", True):
                raise SystemExit("detectors.live.dos_source=loader needs --consume (or use the default feed)")
            ctx.hooks.append(hook)
        else:
            h.feed = DosFeed(ctx.settings, hook, ctx.stop)

            def run_feed() -> None:
                assert h.feed is not None
                delay = 1.0
                while not ctx.stop.is_set():
                    try:
                        h.feed.run()
                    except Exception:
                        log.exception("dos feed stopped; restarting in %.0f s", delay)
                        ctx.stop.wait(delay)
                        delay = min(30.0, delay * 2)

            threads.append(threading.Thread(target=run_feed, name="dos-feed", daemon=True))

        def closer() -> None:
            ctx.stop.wait()
            for t in threads:
                t.join(30)
            live.close()
            if h.api is not None:
                h.api.stop()

        for t in threads:
            t.start()
        closer_t = threading.Thread(target=closer, name="dos-close", daemon=True)
        closer_t.start()
        ctx.threads.extend([*threads, closer_t])

    return service


def traffic_service(publish: bool | None = None, handles: LiveHandles | None = None,
                    clock: Callable[[], float] = time.time) -> Callable[[Any], None]:
    """An owner service running the traffic detectors every minute (see :class:`TrafficService`).
    ``publish``: produce to ``kafka.events_topic`` (default ``detectors.live.publish_events``)."""

    def service(ctx: Any) -> None:
        live = live_config(ctx.settings)
        pub = live.publish_events if publish is None else publish
        # a detection leaves the detector's outbox only once Kafka confirmed its delivery (EventsPublisher)
        publisher = EventsPublisher(_kafka_producer(ctx.settings.kafka.bootstrap_servers)) if pub else None
        svc = TrafficService(ctx.settings, ctx.store, publisher, clock=clock)
        if handles is not None:
            handles.traffic = svc
        if hasattr(ctx, "collectors"):
            ctx.collectors.append(TrafficCollector(svc))
        t = threading.Thread(target=svc.run, args=(ctx.stop,), name="traffic-detectors", daemon=True)
        t.start()
        ctx.threads.append(t)

    return service


def live_services(dos: bool = False, traffic: bool = False, actions: Sequence[Any] | None = None,
                  handles: LiveHandles | None = None) -> list[Callable[[Any], None]]:
    """The owner services for ``forumpulse run --dos --traffic``."""
    out: list[Callable[[Any], None]] = []
    if dos:
        out.append(dos_service(actions, handles))
    if traffic:
        out.append(traffic_service(handles=handles))
    return out


# ---------------------------------------------------------------------------------------------- owner client


class OwnerNoAnswer(RuntimeError):
    """The owner took the request but did not answer within the timeout: it may still carry it out, so a
    caller must not do the same work directly (an unban sent twice: two webhooks; the store is the owner's)."""


def owner_request(owner_url: str, method: str, path: str, params: dict[str, str] | None = None,
                  password: str | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    """Call an owner route; returns (status, parsed JSON).  Raises OSError when nothing listens (no owner: the
    caller may work directly) and :class:`OwnerNoAnswer` when the owner took the request and did not answer
    within ``timeout`` seconds (before, that too fell back to working directly, user trial 41)."""
    import urllib.error
    import urllib.parse
    import urllib.request

    url = owner_url.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if password:
        req.add_header("X-ClickHouse-Key", password)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return int(r.status), json.loads(r.read() or b"null")
    except TimeoutError as exc:  # connected and sent, the answer late (a connect timeout comes as URLError)
        raise OwnerNoAnswer(f"the owner at {owner_url} took the request and did not answer within {timeout:g} s") \
            from exc
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return int(exc.code), json.loads(body or b"null")
        except ValueError:
            return int(exc.code), {"error": body.decode("utf-8", "replace")[:500]}


__all__ = ["DosCollector", "DosFeed", "DosHook", "EventsPublisher", "LiveConfig", "LiveDos", "LiveHandles", "OwnerNoAnswer",
           "TrafficCollector", "TrafficService", "active_from_store",
           "decision_view", "dos_service", "latest_words", "live_config", "live_services", "normalize_value",
           "owner_request", "spool_state", "traffic_service", "unexpired_ban_values"]
