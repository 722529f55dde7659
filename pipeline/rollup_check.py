"""Check the rollup tables against ``requests`` over a time range, and rebuild them from it (``forumpulse db
check-rollups [--repair]``).

Why: every rollup (``site_minute``, ``topic_minute``, ... and the hourly ``topic_hour``, ``prefix_hour`` fed from
the minute tables) is written by a materialized view in the same INSERT as the ``requests`` block, and a replayed
block is deduplicated in every table by its token.  That makes retries after an *error* exact.  A process killed
(kill -9, OOM, power) while its INSERT commits the parts of the different tables can still leave one rollup
without the block while ``requests`` and the other rollups have it: the replay is then deduplicated everywhere
and the gap stays.  It was seen once in CI (``topic_minute``, one batch).  A harness with ClickHouse alone, without
forumpulse (a source table, five views each feeding an hourly view, token-deduplicated inserts under 30 kills per
run) lost such blocks in 2 of 6 runs; the committed script ``tests/repro/mv_dedup_kill9.py`` (run by hand, not a
test) has not reproduced it so far (0 of 4 runs): the loss is rare, and its exact trigger is not pinned down.

How: the rows of ``requests`` in the range (whole hours) are copied into a scratch database with the same schema
(``<database>_rollup_check_<unix time>_<pid>_<random>``, one per run, dropped with ``SYNC`` afterwards; one left
behind by a killed run is dropped by the next run once it is a day old, see :func:`drop_stale_scratch`), whose views compute every
rollup from them afresh; each rollup is compared key by key (sums exactly, ``uniq`` states by their count; t-digest
states are not compared, the sums of the same rows are).  With ``repair``, the rows of the hours that differ are
replaced by the recomputed ones, table by table; an hourly rollup is rebuilt through its minute rollup's view.

Guarantees and limits: read-only without ``repair``.  The range is clamped to the hours ``requests`` surely holds
completely (:func:`_complete_from`: a day after the raw retention's cut, and a day after the oldest raw row when
rollups reach further back), and inside it an hour where ``site_minute`` and ``client_minute`` (each counts every
request) both counted more requests than ``requests`` still holds (raw rows dropped in the middle of the history:
a retention that was shorter when that archive was loaded) is *not compared* and never repaired -- it is listed
in :attr:`RollupCheck.raw_incomplete` -- because a kill can only take a block away from a rollup, never add one.
So a repair does not rebuild a rollup from a partial hour, with one exception the rule cannot see: an hour that
lost raw rows *and*, in a kill, a larger block of ``site_minute`` or ``client_minute`` (that rollup then counts
fewer than ``requests``) is compared, reported, and a repair would rebuild every rollup of it from the partial
rows, losing what the raw retention dropped (both losses in one hour have not been seen; check the hours a
repair would touch first, without ``--repair``).  ``repair`` must not run while anything writes the same hours: stop the consumers first (also an owner's
``--consume``: its endpoint stays writable), or repair only hours no longer written (the CLI's default end is the
start of the current hour).  Not atomic: while it runs an hour being rebuilt is missing from its rollup, and a run
that fails midway is mended by running it again.  The scratch views are today's: hours stored before a
migration changed a view (0005 counts hostname clients apart) are reported as different, and a repair recounts
them the new way.  Works on the single-node schema (not on a cluster's Distributed tables).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from forumpulse.pipeline.runtime import error_line

log = logging.getLogger("forumpulse.rollup_check")

#: rollups fed from ``requests`` (minute) and those fed from a minute rollup (hour), with their time column
MINUTE_ROLLUPS = ("site_minute", "topic_minute", "client_minute", "prefix_minute", "transfer_minute")
HOUR_ROLLUPS = ("topic_hour", "prefix_hour")
TIME_COLUMN = {**{t: "minute" for t in MINUTE_ROLLUPS}, **{t: "hour" for t in HOUR_ROLLUPS}}
#: a scratch database older than this was left by a run that was killed (a check of months takes minutes)
STALE_SCRATCH_AGE = timedelta(days=1)
#: the scratch database gets no TTL: rows of any age stay until they are compared
_NO_TTL = {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0}


@dataclass
class RollupCheck:
    """What :func:`check_rollups` compared and found."""

    start: datetime  #: first hour compared (UTC)
    end: datetime  #: end of the range (UTC, exclusive)
    requests: int  #: rows of ``requests`` in the range
    #: per rollup: (keys only in the table or with other values, keys only in the recomputed rollup)
    differences: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: the hours (UTC, ISO) holding a difference, over every rollup
    hours: list[str] = field(default_factory=list)
    repaired: bool = False
    note: str = ""  #: why the range was clamped or empty
    #: hours (UTC, ISO) not compared: the rollups counted more requests there than ``requests`` still holds
    raw_incomplete: list[str] = field(default_factory=list)
    #: scratch databases of earlier runs that were killed before dropping theirs, dropped by this run
    stale_dropped: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v == (0, 0) for v in self.differences.values())


def _ts(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ts_iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat()


def _hour_floor(dt: datetime) -> datetime:
    return dt.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _canonical(store: Any, db: str, table: str, where: str) -> tuple[str, list[str]]:
    """A query giving one row per key of ``db.table`` (merged states made comparable) and the key columns."""
    cols = store.query_rows(
        f"SELECT name, type FROM system.columns WHERE database = '{db}' AND table = '{table}' ORDER BY position")
    keys: list[str] = []
    aggs: list[str] = []
    for name, typ in cols:
        if typ.startswith("SimpleAggregateFunction(sum, Float"):
            aggs.append(f"round(sum(`{name}`), 3) AS `{name}`")
        elif typ.startswith("SimpleAggregateFunction("):
            fn = typ[len("SimpleAggregateFunction("):].split(",", 1)[0]
            aggs.append(f"{fn}(`{name}`) AS `{name}`")
        elif typ.startswith("AggregateFunction(uniq"):
            aggs.append(f"uniqMerge(`{name}`) AS `{name}`")
        elif typ.startswith("AggregateFunction("):
            continue  # approximate states (t-digest) merge differently by part: the sums of the same rows decide
        else:
            keys.append(f"`{name}`")
    sql = f"SELECT {', '.join(keys + aggs)} FROM {db}.{table} WHERE {where} GROUP BY {', '.join(keys)}"
    return sql, keys


def _complete_from(store: Any, oldest_raw: datetime) -> tuple[datetime, str]:
    """The first hour whose raw rows ``requests`` surely still holds completely, and why.

    Raw rows go before rollups (``retention.raw_days``): rows past the table's raw TTL may be gone or half gone
    (TTL merges reach parts at different times), so the range starts a day after the TTL's cut.  Rollups older than
    the oldest raw row are evidence of such deletions even without a TTL now (a retention changed later): then the
    day after the oldest raw row is the start.  A repair never rebuilds a rollup from a partial hour."""
    from forumpulse.pipeline.store import table_ttl_days

    limit, why = _hour_floor(oldest_raw), "the first stored hour"
    ttl = table_ttl_days(store).get("requests", 0)
    if ttl:
        cut = _hour_floor(datetime.now(UTC) - timedelta(days=ttl)) + timedelta(days=1)
        if cut > limit:
            limit, why = cut, f"a day after the raw retention's cut ({ttl} days): older raw rows may be gone"
    rollups_from = store.query_rows("SELECT toUnixTimestamp(min(minute)), count() FROM site_minute")[0]
    if rollups_from[1] and int(rollups_from[0]) < int(oldest_raw.timestamp()) // 60 * 60:
        after = _hour_floor(oldest_raw) + timedelta(days=1)
        if after > limit:
            limit, why = after, ("a day after the oldest raw row: rollups reach further back, so raw rows were "
                                 "dropped (retention.raw_days) and the hours next to the oldest may be partial")
    return limit, why


def check_rollups(store: Any, start: datetime, end: datetime, *, repair: bool = False,
                  open_scratch: Any = None) -> RollupCheck:
    """Compare (and with ``repair`` rebuild) every rollup over ``[start, end)`` widened to whole hours.

    ``open_scratch(database)`` opens a store on the same engine or server for another database (the CLI passes
    ``open_store(url, database=...)``).  The scratch database is dropped before returning, also on errors."""
    from forumpulse.pipeline.store import migrate

    start = _hour_floor(start)
    end = _hour_floor(end) + (timedelta(hours=1) if end != _hour_floor(end) else timedelta(0))
    db = store.database
    note = ""
    engines = dict(store.query_rows("SELECT name, engine FROM system.tables WHERE database = currentDatabase() "
                                    "AND name = 'requests'"))
    if engines.get("requests") != "MergeTree":
        raise ValueError(f"{db}.requests is a {engines.get('requests') or 'missing'} table: check-rollups works on "
                         "the single-node schema (on a cluster, run it against each shard's local tables)")
    stale = drop_stale_scratch(store, db)
    oldest = store.query_rows("SELECT toUnixTimestamp(min(ts)), count() FROM requests")[0]
    if not oldest[1]:
        return RollupCheck(start, end, 0, note="requests is empty: nothing to compare", stale_dropped=stale)
    limit, why = _complete_from(store, datetime.fromtimestamp(int(oldest[0]), UTC))
    if start < limit:
        note = f"started at {_ts(limit)} UTC: {why}"
        start = limit
    if start >= end:
        return RollupCheck(start, end, 0, note=note or "empty range", stale_dropped=stale)
    # concurrent runs never share one; the time lets a later run tell one left behind by a killed run
    scratch_name = f"{db}_rollup_check_{int(datetime.now(UTC).timestamp())}_{os.getpid()}_{secrets.token_hex(3)}"
    scratch = open_scratch(scratch_name)
    try:
        migrate(scratch, _NO_TTL)
        rng = f"ts >= toDateTime64('{_ts(start)}', 3, 'UTC') AND ts < toDateTime64('{_ts(end)}', 3, 'UTC')"
        n = int(store.query_rows(f"SELECT count() FROM {db}.requests WHERE {rng}")[0][0])
        # the scratch views compute every rollup from the copied rows (no deduplication: a plain copy)
        store.command(f"INSERT INTO {scratch_name}.requests SELECT * FROM {db}.requests WHERE {rng} "
                      "SETTINGS insert_deduplicate = 0, parallel_view_processing = 1, "
                      "max_partitions_per_insert_block = 0")
        res = RollupCheck(start, end, n, note=note, stale_dropped=stale)
        skip = _raw_incomplete_hours(store, db, start, end)
        res.raw_incomplete = sorted(skip)
        hours: set[str] = set()
        per_table: dict[str, set[str]] = {}
        for table in (*MINUTE_ROLLUPS, *HOUR_ROLLUPS):
            col = TIME_COLUMN[table]
            where = f"`{col}` >= toDateTime('{_ts(start)}', 'UTC') AND `{col}` < toDateTime('{_ts(end)}', 'UTC')"
            mine, _keys = _canonical(store, db, table, where)
            ref, _ = _canonical(store, scratch_name, table, where)
            hour = f"formatDateTime(toStartOfHour(`{col}`), '%F %T', 'UTC')"
            extra = [(str(h), int(c)) for h, c in store.query_rows(
                f"SELECT {hour}, count() FROM ({mine} EXCEPT ALL {ref}) GROUP BY 1") if str(h) not in skip]
            missing = [(str(h), int(c)) for h, c in store.query_rows(
                f"SELECT {hour}, count() FROM ({ref} EXCEPT ALL {mine}) GROUP BY 1") if str(h) not in skip]
            res.differences[table] = (sum(c for _h, c in extra), sum(c for _h, c in missing))
            per_table[table] = {h for h, _c in (*extra, *missing)}
            hours.update(per_table[table])
        res.hours = sorted(hours)
        if repair and not res.ok:
            _replace(store, db, scratch_name, per_table)
            res.repaired = True
        return res
    finally:
        scratch.close()
        # SYNC: an Atomic database's dropped tables would otherwise keep their data on disk for minutes (a second
        # copy of the range's raw rows), and a short-lived chDB process may never get to remove it
        store.command(f"DROP DATABASE IF EXISTS {scratch_name} SYNC")


def drop_stale_scratch(store: Any, db: str, now: datetime | None = None) -> list[str]:
    """Drop the scratch databases of ``db`` that earlier runs left behind (killed before their ``finally``): a
    name ``<db>_rollup_check_<unix time>_<pid>_<random>`` whose time is :data:`STALE_SCRATCH_AGE` old, or a name
    of the earlier form ``<db>_rollup_check_<pid>_<random>`` whose tables were created that long ago.  A younger
    one may belong to a run still going and is left alone, as is a name of neither form.  Limit: a run that
    takes longer than :data:`STALE_SCRATCH_AGE` (checks of months take minutes) would be dropped by another run
    and fail.  Returns the names dropped."""
    prefix = f"{db}_rollup_check_"
    literal = prefix.replace("\\", "\\\\").replace("'", "\\'")
    now = now or datetime.now(UTC)
    created = {str(name): int(t) for name, t in store.query_rows(
        "SELECT database, toUnixTimestamp(max(metadata_modification_time)) FROM system.tables "
        f"WHERE startsWith(database, '{literal}') GROUP BY database")}
    dropped = []
    for (name,) in store.query_rows(f"SELECT name FROM system.databases WHERE startsWith(name, '{literal}')"):
        name = str(name)
        parts = name[len(prefix):].split("_")
        if len(parts) == 3 and parts[0].isdigit() and len(parts[0]) <= 12:  # longer: no time (would overflow)
            born = int(parts[0])
        elif len(parts) == 2 and parts[0].isdigit() and name in created:
            born = created[name]  # the earlier form: no time in the name, its tables' creation time
        else:
            continue  # not a name this code makes, or an earlier-form one without tables: not ours to judge
        if now - datetime.fromtimestamp(born, UTC) < STALE_SCRATCH_AGE:
            continue  # may be a run still going
        log.warning("dropping %s: a scratch database left by a check-rollups run that did not finish", name)
        store.command(f"DROP DATABASE IF EXISTS `{name.replace('`', '``')}` SYNC")
        dropped.append(name)
    return dropped


def _raw_incomplete_hours(store: Any, db: str, start: datetime, end: datetime) -> set[str]:
    """Hours of ``[start, end)`` where both rollups that count every request once (``site_minute``,
    ``client_minute``) counted more requests than ``requests`` still holds: raw rows were dropped there, so the
    rollups cannot be recomputed from them.  (A kill takes a block away from a rollup and never adds one; one rollup
    alone with more rows than ``requests`` is that rollup's error, compared and repaired as usual.)"""
    hour = "formatDateTime(toStartOfHour({c}), '%F %T', 'UTC')"
    lo, hi = _ts(start), _ts(end)
    raw = dict(store.query_rows(
        f"SELECT {hour.format(c='ts')} AS h, count() FROM {db}.requests "
        f"WHERE ts >= toDateTime64('{lo}', 3, 'UTC') AND ts < toDateTime64('{hi}', 3, 'UTC') GROUP BY h"))
    over: list[set[str]] = []
    for table in ("site_minute", "client_minute"):
        counted = store.query_rows(
            f"SELECT {hour.format(c='minute')} AS h, sum(requests) FROM {db}.{table} "
            f"WHERE minute >= toDateTime('{lo}', 'UTC') AND minute < toDateTime('{hi}', 'UTC') GROUP BY h")
        over.append({str(h) for h, c in counted if int(c) > int(raw.get(h, 0))})
    return over[0] & over[1]


#: the hourly rollups and the minute rollup whose view feeds each
HOUR_SOURCES = {"topic_hour": "topic_minute", "prefix_hour": "prefix_minute"}


def _replace(store: Any, db: str, scratch: str, per_table: dict[str, set[str]]) -> None:
    """Replace the rows of the hours that differ by the scratch database's, table by table.  An hourly rollup is
    fed by its minute rollup's view: for an hour where either differs, the hourly rows are deleted first and the
    minute rows replaced, whose insert then recomputes the hourly ones (never counted twice; until the insert the
    hour is missing, and a run that fails in between is mended by running it again)."""
    todo = {t: set(h) for t, h in per_table.items() if h}
    for hour_table, source in HOUR_SOURCES.items():
        both = todo.pop(hour_table, set()) | todo.get(source, set())
        if both:
            todo[source] = both
            _delete(store, db, hour_table, both)
    for table, hours in todo.items():
        _delete(store, db, table, hours)
        col = TIME_COLUMN[table]
        for batch in _batches(hours):
            store.command(f"INSERT INTO {db}.{table} SELECT * FROM {scratch}.{table} WHERE "
                          f"{_in_hours(col, batch)} SETTINGS insert_deduplicate = 0")
        log.warning("rollup %s rebuilt from requests for %d hour(s): %s", table, len(hours),
                    ", ".join(sorted(hours)[:6]) + (" ..." if len(hours) > 6 else ""))


#: hours per statement (an IN list of ~40 bytes each stays far below ClickHouse's 256 KiB max_query_size)
HOURS_PER_STATEMENT = 500


def _batches(hours: set[str]) -> list[list[str]]:
    ordered = sorted(hours)
    return [ordered[i:i + HOURS_PER_STATEMENT] for i in range(0, len(ordered), HOURS_PER_STATEMENT)]


def _in_hours(col: str, hours: list[str]) -> str:
    listed = ", ".join(f"toDateTime('{h}', 'UTC')" for h in hours)
    return f"toStartOfHour(`{col}`) IN ({listed})"


def _delete(store: Any, db: str, table: str, hours: set[str]) -> None:
    for batch in _batches(hours):
        store.command(f"ALTER TABLE {db}.{table} DELETE WHERE {_in_hours(TIME_COLUMN[table], batch)} "
                      "SETTINGS mutations_sync = 2")


# ---------------------------------------------------------------------------------------------- audit


class RollupAuditor:
    """Checks (and repairs) by itself the hours a replayed batch touched -- the follow-up the loader's log line
    asks for -- inside the process that owns the store (``forumpulse run --consume``).

    The loader calls :meth:`advise` for every batch it replays (a batch an earlier owner recorded but did not
    commit: a crash, a kill or a revoke).  :meth:`run_once` (the owner calls it every ``interval_s``) takes the
    advised hours that have *settled* -- ended ``settle_s`` ago by the wall clock, and no partition of
    ``consumer_progress`` reported in the last 10 minutes is still behind them (lag not 0 with its newest loaded
    Kafka time before the hour's end + ``settle_s``) -- and runs :func:`check_rollups` over each run of
    consecutive hours (at most :data:`AUDIT_HOURS_PER_PASS` per check).  Each check, its repair and the check after
    it run inside ``store.exclusive()`` (chDB: the engine lock), so no insert lands between the copy of
    ``requests``, the comparison and the rebuild (inserts and queries wait meanwhile: about a second for a forum's
    hour).  A difference is checked a second time before it counts; with ``repair`` the hours that still differ
    are rebuilt from ``requests`` and checked again.  Results are logged (a warning for every difference, with the
    command to run by hand when not repaired) and counted (:meth:`collect`, Prometheus).

    Guarantees and limits: hours whose raw rows are gone are never rebuilt (:func:`check_rollups`).  Advice is
    kept in ``state_path`` (below); without one it lives in memory and an owner that restarts before an advised
    hour was audited forgets it (the loader's log line still names it).  Only for a store with ``exclusive()`` (chDB, where one process owns the folder): on a server other
    writers could insert between the copy and the rebuild, and two loaders could repair one hour at once
    (:func:`start_auditor` does not start one there).  ``stop`` (an Event) ends a pass between checks, never
    inside one.  Advised hours later than an hour ahead of the clock are ignored (a line stamped in the future must
    not push real hours out of the bounded list).  Store errors are logged and the hours retried at the next
    call.

    Advice survives a restart when ``state_path`` is given (:func:`start_auditor`: a JSON file in the chDB folder,
    one per database): every change of the pending hours is written there (a temporary file renamed over it, so a
    kill leaves the old list or the new one), and a new auditor starts from it.  An owner killed again before an
    advised hour was audited -- the replayed batch is committed by then and never replayed again -- still audits
    it.  A file that cannot be read is moved aside (``.unreadable``) with a warning, and the auditor starts empty;
    one that cannot be written is logged and counted as an error (the hours stay pending in memory)."""

    def __init__(self, store: Any, open_scratch: Any, *, settle_s: float = 3600.0, repair: bool = True,
                 max_hours: int = 24 * 7, clock: Any = None, stop: Any = None,
                 state_path: str | os.PathLike[str] | None = None) -> None:
        self.store = store
        self.open_scratch = open_scratch
        self.settle_s = settle_s
        self.repair = repair
        self.max_hours = max_hours
        self.clock = clock or time.time
        self.stop = stop
        self._lock = threading.Lock()
        self.pending: set[datetime] = set()  #: advised hours (UTC) not audited yet
        #: hours by result: same, repaired, different (not repaired, or still different after the repair),
        #: not_compared (raw rows gone, or before what requests holds); errors: check runs that failed
        self.counts: dict[str, int] = {"same": 0, "repaired": 0, "different": 0, "not_compared": 0}
        self.errors = 0
        self.state_path = Path(state_path) if state_path is not None else None
        self._saved: frozenset[datetime] = frozenset()
        if self.state_path is not None:
            self.pending = self._load(self.state_path)
            self._saved = frozenset(self.pending)
            if self.pending:
                log.info("rollup audit: %d advised hour(s) from before the restart still to audit (%s .. %s UTC)",
                         len(self.pending), _ts(min(self.pending)), _ts(max(self.pending)))

    @staticmethod
    def _load(path: Path) -> set[datetime]:
        try:
            raw = path.read_text()
        except FileNotFoundError:
            return set()
        except OSError as exc:  # unreadable (permissions, I/O): the owner still starts, the file is left alone
            log.warning("rollup audit: advised hours in %s could not be read (%s); starting with none (check "
                        "the hours it names with `forumpulse db check-rollups`)", path, exc)
            return set()
        try:
            doc = json.loads(raw)
            return {datetime.fromisoformat(h).astimezone(UTC) for h in doc["pending_hours"]}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            aside = path.with_name(path.name + ".unreadable")
            try:
                os.replace(path, aside)
            except OSError as mv:
                aside = Path(f"{path} (not moved: {mv.strerror})")
            log.warning("rollup audit: advised hours in %s could not be read (%s); moved to %s, starting with "
                        "none (check the hours it names with `forumpulse db check-rollups`)", path, exc, aside)
            return set()

    def _save(self) -> None:
        """Write the pending hours to ``state_path`` when they changed (atomic: temporary file, fsync, rename)."""
        if self.state_path is None:
            return
        with self._lock:
            now = frozenset(self.pending)
            if now == self._saved:
                return
            doc = {"version": 1, "pending_hours": [_ts_iso(h) for h in sorted(now)]}
            tmp = self.state_path.with_name(self.state_path.name + ".tmp")
            try:
                with open(tmp, "w") as f:
                    json.dump(doc, f)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.state_path)
            except OSError as exc:
                self.errors += 1
                log.warning("rollup audit: could not save the advised hours to %s (%s); they stay pending in "
                            "memory", self.state_path, exc)
                return
            self._saved = now

    def advise(self, lo: datetime, hi: datetime) -> None:
        """Hours ``[floor(lo), hi]`` (UTC datetimes) may lack a replayed block in one rollup.  Thread-safe."""
        lo, hi = (x if x.tzinfo else x.replace(tzinfo=UTC) for x in (lo, hi))  # naive: UTC, not local time
        hi = min(hi, datetime.fromtimestamp(self.clock(), UTC) + timedelta(hours=1))
        if hi < lo:
            return  # the whole batch stamped in the future: nothing an audit could settle
        first, last = _hour_floor(lo), _hour_floor(hi)
        first = max(first, last - timedelta(hours=self.max_hours))  # a batch spanning weeks (an archive): its last week
        with self._lock:
            self.pending.update(_hours(first, last + timedelta(hours=1)))
        self._save()

    def _settled(self, hours: list[datetime]) -> list[datetime]:
        now = datetime.fromtimestamp(self.clock(), UTC)
        ripe = [h for h in hours if h + timedelta(hours=1, seconds=self.settle_s) <= now]
        if not ripe:
            return []
        try:
            rows = self.store.query_rows(
                "SELECT toUnixTimestamp64Milli(min(loaded_ts)), count() FROM consumer_progress FINAL "
                "WHERE active AND lag != 0 AND updated_at >= "
                f"fromUnixTimestamp64Milli(toInt64({int(self.clock() * 1000) - 600_000}), 'UTC')")
        except Exception as exc:  # a store hiccup postpones the audit
            log.warning("rollup audit: could not read consumer_progress (%s); retrying later",
                        error_line(exc))
            return []
        behind_ms, n = rows[0] if rows else (0, 0)
        if int(n):
            limit = datetime.fromtimestamp(int(behind_ms) / 1000, UTC) - timedelta(seconds=self.settle_s)
            ripe = [h for h in ripe if h + timedelta(hours=1) <= limit]
        return ripe

    def run_once(self) -> int:
        """Audit the settled advised hours; returns how many hours were audited (0: nothing settled)."""
        if self.stop is not None and self.stop.is_set():
            return 0
        with self._lock:
            hours = sorted(self.pending)
        ripe = self._settled(hours)
        done = 0
        for start, end in _runs(ripe, AUDIT_HOURS_PER_PASS):
            if self.stop is not None and self.stop.is_set():
                break  # shutting down: the rest stays pending (between checks, never inside one)
            try:
                res = self._audit(start, end)
            except Exception as exc:  # logged, counted, retried at the next call
                self.errors += 1
                log.warning("rollup audit of %s .. %s UTC failed (retrying later): %s", _ts(start), _ts(end),
                            error_line(exc, 300))
                continue
            with self._lock:
                self.pending.difference_update(_hours(start, end))
            self._save()
            done += int((end - start) / timedelta(hours=1))
            self._count(res, start, end)
        return done

    def _audit(self, start: datetime, end: datetime) -> tuple[RollupCheck, RollupCheck | None]:
        with self.store.exclusive():  # nothing inserted between the copy, the comparison and the rebuild
            first = check_rollups(self.store, start, end, open_scratch=self.open_scratch)
            if first.ok:
                return first, None
            again = check_rollups(self.store, start, end, open_scratch=self.open_scratch, repair=self.repair)
            after = check_rollups(self.store, start, end, open_scratch=self.open_scratch) if again.repaired else None
            return again, after

    def _count(self, res: tuple[RollupCheck, RollupCheck | None], start: datetime, end: datetime) -> None:
        check, after = res
        all_hours = {_ts(h) for h in _hours(start, end)}
        # check_rollups starts later where requests may not hold every raw row, and holds none at all when empty
        compared = {_ts(h) for h in _hours(check.start, check.end)} if check.requests else set()
        differing = set(check.hours)
        skipped = ((all_hours - compared) | set(check.raw_incomplete)) - differing
        still = set(after.hours) if after is not None else differing  # after: the check following a repair
        repaired = differing - still
        self.counts["not_compared"] += len(skipped)
        self.counts["repaired"] += len(repaired)
        self.counts["different"] += len(still)
        self.counts["same"] += len(all_hours - skipped - repaired - still)
        span = f"{_ts(start)} .. {_ts(end)} UTC"
        if repaired:
            log.warning("rollup audit %s: rebuilt from requests the hour(s) a replayed batch left incomplete in a "
                        "rollup: %s", span, ", ".join(sorted(repaired)))
        if still:
            log.warning("rollup audit %s: rollups differ from requests in hour(s) %s%s; run `forumpulse db "
                        "check-rollups --from %s --to %s --repair` with the loader stopped", span,
                        ", ".join(sorted(still)), "" if not check.repaired else " even after a repair",
                        start.strftime("%Y-%m-%dT%H:00"), end.strftime("%Y-%m-%dT%H:00"))
        if not repaired and not still:
            log.info("rollup audit %s: rollups match requests%s", span,
                     f" ({len(skipped)} hour(s) not compared: {check.note or 'raw rows gone'})" if skipped else "")

    def collect(self) -> Any:
        """Prometheus metric families (the owner's ``/metrics``)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        c = CounterMetricFamily("forumpulse_rollup_audit_hours", "hours the owner audited after a replayed batch, "
                                "by result (same, repaired, different, not_compared)", labels=["result"])
        for k, v in self.counts.items():
            c.add_metric([k], v)
        yield c
        yield CounterMetricFamily("forumpulse_rollup_audit_errors", "audit runs that failed (retried)",
                                  value=self.errors)
        with self._lock:
            n = len(self.pending)
        yield GaugeMetricFamily("forumpulse_rollup_audit_pending_hours", "advised hours waiting to settle or retry",
                                value=n)


def _hours(start: datetime, end: datetime) -> list[datetime]:
    out, h = [], start
    while h < end:
        out.append(h)
        h += timedelta(hours=1)
    return out


#: hours per check of an audit pass: each check holds the engine (inserts wait) while it copies and compares
AUDIT_HOURS_PER_PASS = 3


def _runs(hours: list[datetime], most: int) -> list[tuple[datetime, datetime]]:
    """Sorted hours as runs of consecutive hours ``[start, end)``, each at most ``most`` hours long."""
    out: list[tuple[datetime, datetime]] = []
    for h in sorted(hours):
        if out and out[-1][1] == h and out[-1][1] - out[-1][0] < timedelta(hours=most):
            out[-1] = (out[-1][0], h + timedelta(hours=1))
        else:
            out.append((h, h + timedelta(hours=1)))
    return out


def start_auditor(cfg: Any, store: Any, url: str, stop: Any) -> tuple[RollupAuditor, Any] | None:
    """The auditor of the process that owns ``store`` (``cfg``: ``Settings.store.rollup_audit``) and its thread,
    started: a pass every ``cfg.interval_s`` until ``stop`` (a threading.Event) is set.  None when disabled, and
    for a ClickHouse server (``url`` not ``chdb:``): there several loaders may replay batches of the same hours, and
    two repairs of one hour at once would count it twice -- run ``forumpulse db check-rollups`` there instead.
    Advised hours are kept in ``forumpulse_rollup_audit.<database>.json`` in the chDB folder (survive a restart)."""
    if not cfg.enabled or not url.startswith("chdb:") or not hasattr(store, "exclusive"):
        return None
    from forumpulse.pipeline.store import open_store

    state = Path(store.path) / f"forumpulse_rollup_audit.{store.database}.json"
    aud = RollupAuditor(store, lambda db: open_store(url, database=db), settle_s=cfg.settle_s, repair=cfg.repair,
                        stop=stop, state_path=state)

    def loop() -> None:
        while not stop.wait(cfg.interval_s):
            try:
                aud.run_once()
            except Exception:  # never stops the process; run_once logs its own store errors
                log.exception("rollup audit pass failed")

    t = threading.Thread(target=loop, name="rollup-audit", daemon=True)
    t.start()
    return aud, t
