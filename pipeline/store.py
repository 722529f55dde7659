"""One small store interface, two backends: embedded chDB (default) and a ClickHouse server (clickhouse-connect).

Both run the same SQL.  Inserts are columnar (Arrow tables), never row-by-row text.

``open_store(url)`` accepts:

* ``chdb:PATH`` — the real ClickHouse engine in this process, data under ``PATH`` (default ``chdb:./data/chdb``).
  Only ONE process may open a chDB folder.  We hold an exclusive ``flock`` on ``PATH/.forumpulse.lock`` for the
  life of the store, so a second process gets :class:`StoreBusy` naming the owner pid and what to do, instead of
  chDB's opaque "Error initializing EmbeddedServer".  chDB also serves only ONE folder per process; stores on
  the same folder in one process share the engine (see :class:`ChdbStore`).  Inside the owning process stores
  may be shared by several threads (queries are serialised by a lock).
* ``clickhouse://user:pass@host:8123/db`` (``clickhouses://`` for TLS) — a ClickHouse server over HTTP.

Guarantees: ``insert`` either stores the whole Arrow table as one block or raises; with ``dedup_token`` a
replayed identical insert is stored once (tables carry ``non_replicated_deduplication_window``; dependent
materialized views are deduplicated too).  ``insert`` does not retry: callers that must not lose data
(the consumer) retry with backoff and keep the same token.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import pyarrow as pa

DEFAULT_STORE = "chdb:./data/chdb"
DEFAULT_DATABASE = "forumpulse"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "schemas" / "migrations"
BASELINE_DIR = MIGRATIONS_DIR.parent / "baseline"

_INSERT_SETTINGS = {
    "insert_deduplicate": 1,
    "deduplicate_blocks_in_dependent_materialized_views": 1,
    # the rollup views of one insert run side by side instead of one after the other: measured 1.6x faster
    # inserts into `requests` (5 views, 100k-row blocks); same rows, same deduplication
    "parallel_view_processing": 1,
    # no JIT compilation of the insert's expressions and aggregates: for the first inserts of a process it costs
    # more than it saves (0.35 CPU-s over the first ten 100k-row inserts with all views), and over forty inserts
    # it made no difference either way (ClickHouse ProfileEvents, side by side)
    "compile_expressions": 0,
    "compile_aggregate_expressions": 0,
}
# Inserts into `requests` only: its materialized views write AggregatingMergeTree rollups already grouped by their
# key (GROUP BY in every view), so merging equal keys inside the inserted block finds nothing to merge and only
# costs (~0.45 CPU-s per 1M rows); rollup queries aggregate across parts anyway.  Tables with ReplacingMergeTree
# semantics keep the default.
# `requests` is partitioned by day (0006): a block of a quiet site's archive can span more than the default 100
# days; every day becomes its own part, which is what daily partitions mean (0 = no limit)
_REQUESTS_INSERT_SETTINGS = {**_INSERT_SETTINGS, "optimize_on_insert": 0, "max_partitions_per_insert_block": 0}



def sql_string(s: str) -> str:
    """``s`` as a ClickHouse string literal (backslash and quote escaped), for the few statements built by hand."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"

class StoreError(RuntimeError):
    """The store refused or failed an operation."""


class StoreBusy(StoreError):
    """The chDB folder is owned by another process."""


class StoreUnavailable(StoreError):
    """The server cannot be reached (retry later; nothing was written)."""


class StoreLocationError(StoreError):
    """The store's URL or folder cannot be used (unknown scheme, a path that is a file, no permission, no store
    there for a command that only reads)."""


class Store(Protocol):
    url: str
    database: str

    def command(self, sql: str) -> None: ...

    def query_rows(self, sql: str) -> list[tuple[Any, ...]]: ...

    def query_arrow(self, sql: str) -> pa.Table: ...

    def insert(self, table: str, data: pa.Table, dedup_token: str | None = None) -> None: ...

    def close(self) -> None: ...


def _settings_clause(settings: dict[str, Any]) -> str:
    parts = []
    for k, v in settings.items():
        if not re.fullmatch(r"[a-z_0-9]+", k):
            raise ValueError(f"bad setting name {k!r}")
        parts.append(f"{k} = " + (str(v) if isinstance(v, int) else "'" + str(v).replace("'", "\\'") + "'"))
    return " SETTINGS " + ", ".join(parts) if parts else ""


def chdb_foreign_holder(path: str | Path) -> str | None:
    """The pid of another process holding the chDB / ClickHouse data folder ``path`` open: the engine keeps an
    ``flock`` on ``PATH/status``, whose text starts ``PID: N``.  None when the folder is free or held by this
    process.  A forumpulse process holds it too: check ``PATH/.forumpulse.lock`` first to tell one from a plain
    ``chdb.session.Session`` or ``clickhouse-local --path``."""
    status = Path(path) / "status"
    if not status.is_file():
        return None
    try:
        with open(status, "a+") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                m = re.search(r"PID:\s*(\d+)", fh.read())
                pid = m.group(1) if m else "unknown"
                return None if pid == str(os.getpid()) else pid
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except OSError:
        return None
    return None


class _ChdbEngine:
    """The one chDB session of this process for one data folder, shared by every ChdbStore on that folder."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.refs = 0
        self.lock = threading.RLock()
        self.current_db: str | None = None
        self._lockfile = open(Path(path) / ".forumpulse.lock", "a+")  # noqa: SIM115 - held for life
        try:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lockfile.seek(0)
            owner = self._lockfile.read().strip() or "unknown"
            self._lockfile.close()
            raise StoreBusy(
                f"the chDB data folder {path} is in use by another process (pid {owner}). chDB lets only one "
                "process open a folder: stop that process, send the work to it (the owner process `forumpulse run` "
                "serves an HTTP API and a ClickHouse-compatible endpoint), or use --store clickhouse://... "
                "pointing at it or at a ClickHouse server."
            ) from None
        self._lockfile.seek(0)
        self._lockfile.truncate()
        self._lockfile.write(str(os.getpid()))
        self._lockfile.flush()
        from chdb import session as chs

        try:
            self.sess = chs.Session(path)
        except Exception as exc:  # chDB raises a bare RuntimeError here
            self._release()
            other = chdb_foreign_holder(path)
            if other is not None:  # chDB's own words were "Cannot lock file .../status ... (BAD_ARGUMENTS)"
                raise StoreBusy(
                    f"the chDB data folder {path} is open in another process (pid {other}) that is not forumpulse "
                    "(a chdb session or clickhouse-local): chDB lets only one process open a folder; stop it "
                    "first, or work on a copy of the folder") from exc
            raise StoreBusy(f"chDB could not open {path}: {exc}") from exc

    def _release(self) -> None:
        fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
        self._lockfile.close()

    def close(self) -> None:  # called by ChdbStore.close, which holds self.lock
        try:
            self.sess.close()
        finally:
            self._release()


_ENGINES: dict[str, _ChdbEngine] = {}
_ENGINES_LOCK = threading.Lock()


class ChdbStore:
    """Embedded ClickHouse engine (chDB) on ``path``, using ``database``.

    chDB serves ONE data folder per process (a second folder fails inside chDB), and one process per folder (we
    hold a flock).  Several ChdbStore objects on the same folder in one process share one engine (reference
    counted; queries serialised by a lock), each with its own database — tests isolate by database, not folder.
    """

    def __init__(self, path: str, database: str = DEFAULT_DATABASE) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", database):
            raise ValueError(f"bad database name {database!r}")
        self.path = str(Path(path).resolve())
        self.url = f"chdb:{path}"
        self.database = database
        try:
            Path(self.path).mkdir(parents=True, exist_ok=True)
            if not os.access(self.path, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as exc:
            raise StoreLocationError(f"cannot use {self.path} as a chDB data folder: {exc.strerror or exc}") from None
        with _ENGINES_LOCK:
            eng = _ENGINES.get(self.path)
            if eng is None:
                if _ENGINES:
                    other = next(iter(_ENGINES))
                    raise StoreError(
                        f"chDB serves one data folder per process and {other} is open here; close it before opening "
                        f"{self.path} (in tests use the `store` fixture of tests/conftest.py: one folder per test "
                        "session, a fresh database per test)"
                    )
                eng = _ENGINES[self.path] = _ChdbEngine(self.path)
            eng.refs += 1
        self._eng = eng
        self._closed = False
        with eng.lock:
            eng.sess.query(f"CREATE DATABASE IF NOT EXISTS {database}")

    def _use(self) -> None:
        if self._closed:
            raise StoreError("store is closed")
        if self._eng.current_db != self.database:
            self._eng.sess.query(f"USE {self.database}")
            self._eng.current_db = self.database

    def exclusive(self) -> Any:
        """A context manager holding the engine for a series of statements (every ChdbStore on this folder, in
        any thread, waits until it is left; re-entrant for the holding thread, also through other databases'
        ChdbStore objects on the folder).  Keep such sections short: inserts and queries wait."""
        return self._eng.lock

    def _run(self, sql: str, fmt: str = "CSV") -> Any:
        with self._eng.lock:
            self._use()
            try:
                return self._eng.sess.query(sql, fmt)
            except Exception as exc:
                raise StoreError(f"{exc}\nSQL: {sql[:2000]}") from exc

    def command(self, sql: str) -> None:
        self._run(sql)

    def query_arrow(self, sql: str) -> pa.Table:
        # the Arrow IPC file read here, not by chDB's "ArrowTable" helper: that one imports pandas (~0.5 s of
        # every command's start-up) only to check that it is installed
        res = self._run(sql, "Arrow")
        if len(res) == 0:
            return pa.table({})
        return pa.ipc.open_file(pa.py_buffer(res.get_memview().view())).read_all()

    def query_rows(self, sql: str) -> list[tuple[Any, ...]]:
        """Rows as tuples.  A String column holding bytes that are not UTF-8 (quarantined raw lines) comes back
        as ``bytes`` for the whole column; select ``hex(col)`` for a stable type."""
        t = self.query_arrow(sql)
        cols = [_pylist(c) for c in t.columns]
        return list(zip(*cols, strict=True)) if cols else []

    def query_format(self, sql: str, fmt: str) -> bytes:
        """Run ``sql`` and return the result serialised in ClickHouse output format ``fmt`` (e.g. TSV, JSON)."""
        res = self._run(sql, fmt)
        return bytes(res.bytes()) if hasattr(res, "bytes") else bytes(res)

    def insert(self, table: str, data: pa.Table, dedup_token: str | None = None) -> None:
        if data.num_rows == 0:
            return
        if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9.]*", table):
            raise ValueError(f"bad table name {table!r}")
        data = _without_computed(self, table, data)
        settings: dict[str, Any] = dict(_REQUESTS_INSERT_SETTINGS if table == "requests" else _INSERT_SETTINGS)
        if dedup_token:
            settings["insert_deduplication_token"] = dedup_token
        cols = ", ".join(f"`{c}`" for c in data.column_names)
        # chDB's Python() table function reads the local variable named in the SQL.
        fp_insert_data = data  # noqa: F841
        with self._eng.lock:
            self._use()
            try:
                self._eng.sess.query(
                    f"INSERT INTO {table} ({cols}) SELECT {cols} FROM Python(fp_insert_data)"
                    + _settings_clause(settings)
                )
            except Exception as exc:
                raise StoreError(f"insert into {table} failed: {exc}") from exc

    def duplicated_blocks(self) -> int:
        """How many inserted blocks this process's engine has dropped as duplicates so far (ClickHouse's
        ``DuplicatedInsertedBlocks`` event; a deduplicated block also counts for its views).  Compare the value
        before and after an insert made by the only writer to see whether it was deduplicated."""
        rows = self.query_rows("SELECT value FROM system.events WHERE event = 'DuplicatedInsertedBlocks'")
        return int(rows[0][0]) if rows else 0

    def close(self) -> None:
        # first the engine lock (a statement or an exclusive() section under way in another thread finishes:
        # never closed in the middle of a rollup rebuild), then the registry's -- the order every path takes
        with self._eng.lock, _ENGINES_LOCK:
            if self._closed:
                return
            self._closed = True
            self._eng.refs -= 1
            if self._eng.refs == 0:
                _ENGINES.pop(self._eng.path, None)
                self._eng.close()


_COMPUTED: dict[tuple[str, str, str], frozenset[str]] = {}


def _without_computed(store: Store, table: str, data: pa.Table) -> pa.Table:
    """``data`` without the columns ``table`` computes itself (ALIAS): e.g. ``requests.path``, derived from ``url``.
    Which columns those are is read once per store, database and table."""
    key = (store.url, store.database, table)
    computed = _COMPUTED.get(key)
    if computed is None:
        name = table.split(".")[-1]
        rows = store.query_rows(
            "SELECT name FROM system.columns WHERE database = currentDatabase() "
            f"AND table = '{name}' AND default_kind = 'ALIAS'")
        computed = _COMPUTED[key] = frozenset(r[0] for r in rows)
    drop = [c for c in data.column_names if c in computed]
    return data.drop_columns(drop) if drop else data


def _pylist(col: pa.ChunkedArray) -> list[Any]:
    try:
        return col.to_pylist()
    except UnicodeDecodeError:
        return col.cast(pa.binary()).to_pylist()


class _DriverNoise(logging.Filter):
    """Drops what clickhouse-connect and its HTTP pool log about a failing request before they raise: every
    store error raised here carries the same text, so a store away (the owner's unban sync asks every 10 s) printed
    "Unexpected Http Driver Exception" and urllib3's "Retrying (...)" lines beside our one warning (user trial
    43: 16 of 28 log lines in 30 s).  Other messages of those libraries pass."""

    DROPPED = ("Unexpected Http Driver Exception", "Retrying (")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.DROPPED)


_DRIVER_NOISE = _DriverNoise()
#: the loggers that print those lines (clickhouse-connect's sync HTTP backend and client; urllib3's pool;
#: tests/test_chhttp.py checks the backend's name against the installed driver)
_NOISY_LOGGERS = ("clickhouse_connect.driver._backend.http_sync", "clickhouse_connect.driver.httpclient",
                  "urllib3.connectionpool")


def _driver_text(exc: BaseException) -> str:
    """clickhouse-connect's error text with its cause first (``[Errno 111] Connection refused: ...``) and without
    the request's query string (~250 characters of settings) or urllib3's object reprs: log lines show the
    first 200 characters, and stopped mid-URL (user trial 43)."""
    text = re.sub(r"(url: /)\?\S*", r"\1?...", str(exc))
    text = re.sub(r"<urllib3\.[\w.]+ object at 0x[0-9a-f]+>: ", "", text)
    cause = re.search(r"\[Errno -?\d+\] [^'\")\n]+", text)  # the socket's own words, first
    return f"{cause.group(0)}: {text}" if cause and not text.startswith(cause.group(0)) else text


def quiet_driver_noise() -> None:
    """Install :class:`_DriverNoise` on the loggers that print it (idempotent)."""
    for name in _NOISY_LOGGERS:
        lg = logging.getLogger(name)
        if _DRIVER_NOISE not in lg.filters:
            lg.addFilter(_DRIVER_NOISE)


class ClickHouseStore:
    """A ClickHouse server (or the owner process's compatible endpoint) through clickhouse-connect over HTTP."""

    def __init__(self, url: str) -> None:
        import clickhouse_connect

        quiet_driver_noise()
        u = urlparse(url)
        self.url = url
        self.database = (u.path or "").strip("/") or DEFAULT_DATABASE
        secure = u.scheme == "clickhouses"
        # clickhouse-connect logs "Unexpected Http Driver Exception" at ERROR before raising; the error raised here
        # says it all, and the bare line printed above it read as a second, unexplained failure (user trial 40)
        quiet = logging.getLogger("clickhouse_connect")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            admin = clickhouse_connect.get_client(
                host=u.hostname or "127.0.0.1",
                port=u.port or (8443 if secure else 8123),
                username=unquote(u.username or "default"),
                password=unquote(u.password or ""),
                secure=secure,
                autogenerate_session_id=False,
            )
            admin.command(f"CREATE DATABASE IF NOT EXISTS {self.database}")
            admin.close()
            self._client = clickhouse_connect.get_client(
                host=u.hostname or "127.0.0.1",
                port=u.port or (8443 if secure else 8123),
                username=unquote(u.username or "default"),
                password=unquote(u.password or ""),
                database=self.database,
                secure=secure,
                autogenerate_session_id=False,
            )
        except Exception as exc:
            raise StoreUnavailable(f"cannot reach ClickHouse at {u.hostname}:{u.port}: {_driver_text(exc)}") from exc
        finally:
            quiet.setLevel(level)

    def command(self, sql: str) -> None:
        try:
            self._client.command(sql)
        except Exception as exc:
            raise StoreError(f"{_driver_text(exc)}\nSQL: {sql[:2000]}") from exc

    def query_arrow(self, sql: str) -> pa.Table:
        try:
            return self._client.query_arrow(sql, use_strings=True)
        except Exception as exc:
            raise StoreError(f"{_driver_text(exc)}\nSQL: {sql[:2000]}") from exc

    def query_rows(self, sql: str) -> list[tuple[Any, ...]]:
        try:
            return [tuple(r) for r in self._client.query(sql).result_rows]
        except Exception as exc:
            raise StoreError(f"{_driver_text(exc)}\nSQL: {sql[:2000]}") from exc

    def insert(self, table: str, data: pa.Table, dedup_token: str | None = None) -> None:
        if data.num_rows == 0:
            return
        data = _without_computed(self, table, data)
        settings: dict[str, Any] = dict(_REQUESTS_INSERT_SETTINGS if table == "requests" else _INSERT_SETTINGS)
        if dedup_token:
            settings["insert_deduplication_token"] = dedup_token
        try:
            self._client.insert_arrow(table, data, settings=settings)
        except Exception as exc:
            raise StoreError(f"insert into {table} failed: {_driver_text(exc)}") from exc

    def close(self) -> None:
        self._client.close()


def open_store(url: str = DEFAULT_STORE, database: str | None = None, *, existing: bool = False) -> Store:
    """Open ``chdb:PATH`` (optionally ``chdb:PATH?database=NAME``) or ``clickhouse[s]://user:pass@host:port/db``;
    ``database`` overrides the URL's database (created on a server when missing).

    ``existing``: for commands that only read what was stored (detections over history, reports): a chDB folder
    that does not exist is an error instead of a new empty store (a mistyped path must not create folders), and
    so is a store without the forumpulse tables.

    Raises StoreBusy (folder owned by another process), StoreUnavailable (server down), StoreLocationError (bad
    URL or folder; no store there with ``existing``), StoreError.
    """
    from forumpulse.pipeline.config import check_store_url, mask_url

    try:
        check_store_url(url)
    except ValueError as exc:
        raise StoreLocationError(str(exc)) from None
    st: Store
    if url.startswith("chdb:"):
        path, _, q = url[len("chdb:"):].partition("?database=")
        if existing and not (Path(path) / "metadata").is_dir():  # checked before chDB writes anything there
            raise StoreLocationError(f"no chDB store at {path} (nothing was ingested there): check --store or "
                                     "store.url")
        st = ChdbStore(path, database or q or DEFAULT_DATABASE)
    else:
        if database:  # another database on the same server (e.g. a scratch database next to the store's)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", database):
                raise StoreLocationError(f"bad database name {database!r}")
            url = urlparse(url)._replace(path="/" + database).geturl()
        st = ClickHouseStore(url)
    if existing:
        try:
            found = st.query_rows("SELECT count() FROM system.tables WHERE database = currentDatabase() "
                                  "AND name IN ('requests', 'site_minute', 'detections')")[0][0]
            # the tables in another database of the same server or folder (a URL naming `default`: user trial 35)
            elsewhere = [str(r[0]) for r in st.query_rows(
                "SELECT database FROM system.tables WHERE name IN ('requests', 'site_minute', 'detections') "
                "GROUP BY database HAVING count() = 3 ORDER BY database")] if int(found) < 3 else []
        except BaseException:
            st.close()
            raise
        if int(found) < 3:
            where = mask_url(url)
            st.close()
            how = ("chdb:PATH?database=NAME" if url.startswith("chdb:") else
                   f"clickhouse://HOST:PORT/NAME; no path = {DEFAULT_DATABASE}")
            hint = (f"; database {', '.join(elsewhere)} there {'has' if len(elsewhere) == 1 else 'have'} them "
                    f"({how})" if elsewhere else "")
            raise StoreLocationError(f"{where} has no forumpulse tables (nothing was ingested there){hint}: check "
                                     "--store or store.url, or run `forumpulse db migrate` / `forumpulse ingest`")
    return st


# --------------------------------------------------------------------------------------------- migrations


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    out = []
    for p in sorted(directory.glob("*.sql")):
        m = re.match(r"(\d{4})_(.+)\.sql$", p.name)
        if not m:
            raise ValueError(f"migration file {p.name} must be named NNNN_name.sql")
        out.append(Migration(int(m.group(1)), m.group(2), p.read_text()))
    versions = [m.version for m in out]
    if len(set(versions)) != len(versions):
        raise ValueError("two migration files share a version number")
    return out


#: a line ``--@only-if <query>`` right before a statement makes it conditional: :func:`migrate` runs the statement
#: only when the query's first value is 1/true.  Migrations that move data (a table rebuilt with a new partition
#: key) use it to stay idempotent: every step checks the state it expects, so a migration interrupted half-way
#: can be run again from its first statement.
GUARD = "--@only-if "


def split_statements(sql: str) -> list[str]:
    """Split a migration into statements: strips ``--`` comment lines (``--@only-if`` guards stay with the
    statement that follows them), splits on ``;`` at line ends."""
    body = "\n".join(line for line in sql.splitlines()
                     if not line.lstrip().startswith("--") or line.lstrip().startswith(GUARD))
    return [s.strip() for s in re.split(r";\s*(?:\n|$)", body) if s.strip()]


def guarded(stmt: str) -> tuple[str | None, str]:
    """``(guard query or None, statement without its guard line)``."""
    guard: str | None = None
    rest = []
    for line in stmt.splitlines():
        if line.lstrip().startswith(GUARD):
            guard = line.lstrip()[len(GUARD):].strip()
        else:
            rest.append(line)
    return guard, "\n".join(rest).strip()


DEFAULT_PARAMS = {"raw_ttl_days": 90, "rollup_ttl_days": 730, "quarantine_ttl_days": 30, "stats_ttl_days": 30}
_TTL_PLACEHOLDER = re.compile(r"\{(raw|rollup|quarantine|stats)_ttl:([^{}]+)\}")


def render(m: Migration, params: dict[str, Any] | None = None) -> list[str]:
    """Statements of ``m`` with retention placeholders filled (``*_ttl_days`` = 0 means no TTL)."""
    values = {**DEFAULT_PARAMS, **(params or {})}

    def ttl(match: re.Match[str]) -> str:
        days = int(values[f"{match.group(1)}_ttl_days"])
        return f"TTL {match.group(2)} + INTERVAL {days} DAY" if days > 0 else ""

    return [_TTL_PLACEHOLDER.sub(ttl, s) for s in split_statements(m.text)]


_CREATE_TABLE = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)", re.I)
_TTL_DAYS = re.compile(r"\bTTL\b.*?toIntervalDay\((\d+)\)", re.S)


@dataclass(frozen=True)
class RetentionChange:
    """A table whose TTL differs from the configured retention: ``current_days`` -> ``wanted_days`` (0 = keep
    forever, no TTL); ``expr`` is the row time the TTL counts from."""

    table: str
    current_days: int
    wanted_days: int
    expr: str

    def statement(self) -> str:
        if self.wanted_days <= 0:
            return f"ALTER TABLE {self.table} REMOVE TTL"
        return f"ALTER TABLE {self.table} MODIFY TTL {self.expr} + INTERVAL {self.wanted_days} DAY"


def retention_targets() -> dict[str, tuple[str, str]]:
    """table -> (retention kind: raw / rollup / quarantine / stats, TTL expression) for every table whose
    retention comes from the configuration (a ``{kind_ttl:EXPR}`` placeholder in its CREATE TABLE); the last
    migration that creates a table wins."""
    out: dict[str, tuple[str, str]] = {}
    for m in load_migrations():
        for stmt in split_statements(m.text):
            created = _CREATE_TABLE.search(stmt)
            ttl = _TTL_PLACEHOLDER.search(stmt)
            if created and ttl:
                out[created.group(1)] = (ttl.group(1), ttl.group(2).strip())
    return out


def table_ttl_days(store: Store) -> dict[str, int]:
    """Each MergeTree table's TTL in days as the database has it (0 = none)."""
    # MergeTree tables only: on a cluster `requests` is a Distributed table over the shards' local tables, whose
    # TTL this does not see (then the configuration is all there is to go by)
    rows = store.query_rows("SELECT name, engine_full FROM system.tables WHERE database = currentDatabase() "
                            "AND engine LIKE '%MergeTree'")
    return {str(name): int(m.group(1)) if (m := _TTL_DAYS.search(str(full))) else 0 for name, full in rows}


def retention_changes(store: Store, params: dict[str, Any] | None = None) -> list[RetentionChange]:
    """Tables of the store whose TTL is not the configured retention (``params`` as for :func:`migrate`).

    Migrations create tables with the retention configured at that time and never change it afterwards: a
    later change of ``retention.*`` takes effect only through :func:`apply_retention` (``forumpulse db migrate
    --apply-retention``), never implicitly -- a command run with another configuration (or none) must not
    shorten the retention of a store that keeps archives."""
    values = {**DEFAULT_PARAMS, **(params or {})}
    have = table_ttl_days(store)
    out = []
    for table, (kind, expr) in sorted(retention_targets().items()):
        wanted = int(values[f"{kind}_ttl_days"])
        if table in have and have[table] != max(wanted, 0):
            out.append(RetentionChange(table, have[table], max(wanted, 0), expr))
    return out


def apply_retention(store: Store, params: dict[str, Any] | None = None) -> list[RetentionChange]:
    """Change every table's TTL to the configured retention; returns what changed.  Idempotent.  A shorter TTL
    removes the rows past it (at once for the parts ClickHouse rewrites, else at their next merge); a longer one
    or none keeps what is still stored (rows already removed do not come back)."""
    changes = retention_changes(store, params)
    for c in changes:
        store.command(c.statement())
    return changes


def migrate_in_background(store: Store, params: dict[str, Any] | None = None) -> Future[list[Migration]]:
    """:func:`migrate` on a thread of its own, started now; the future holds what ran, or the error.

    For commands that have other start-up work to do meanwhile (``forumpulse ingest`` imports and builds its
    parsers while a new store's tables are created; chDB releases the GIL while it works).  The caller must
    wait for the future before it closes ``store`` (closing chDB under a running query is not safe) and before
    it writes to the store."""
    fut: Future[list[Migration]] = Future()

    def run() -> None:
        try:
            fut.set_result(migrate(store, params))
        except BaseException as exc:  # handed to whoever waits
            fut.set_exception(exc)

    threading.Thread(target=run, name="forumpulse-migrate", daemon=True).start()
    return fut


def load_baseline(directory: Path = BASELINE_DIR) -> Migration | None:
    """The schema baseline for new databases (``schemas/baseline/NNNN_baseline.sql``, the highest ``NNNN``): the
    schema that migrations ``0001``..``NNNN`` build, as one file.  Its ``version`` is the last migration it
    covers.  ``None`` when there is none."""
    found = []
    for p in directory.glob("*.sql"):
        m = re.match(r"(\d{4})_baseline\.sql$", p.name)
        if not m:
            raise ValueError(f"baseline file {p.name} must be named NNNN_baseline.sql")
        found.append(Migration(int(m.group(1)), "baseline", p.read_text()))
    return max(found, key=lambda b: b.version) if found else None


def migrate(store: Store, params: dict[str, Any] | None = None, *, baseline: bool = True) -> list[Migration]:
    """Apply every migration not yet recorded in ``schema_migrations``.  Idempotent; returns what ran.

    A database with no table yet gets the schema baseline (:func:`load_baseline`) instead of the migrations it
    covers, which are then recorded with their own checksums: the same schema in fewer statements (tests check
    that both ways build identical tables and views).  Migrations after the baseline apply as usual.  Any
    other database, including one where a baseline was interrupted, takes the migrations one by one (every
    statement is idempotent).  ``baseline=False`` always takes the migrations.

    A recorded migration whose file changed since (checksum differs) is an error: write a new migration
    instead of editing an applied one.
    """
    store.command(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version UInt32, name String, checksum String, "
        "applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = MergeTree ORDER BY version"
    )
    done = {int(v): c for v, c in store.query_rows("SELECT version, checksum FROM schema_migrations")}
    migrations = load_migrations()
    ran = []
    base = load_baseline() if baseline and not done else None
    if base is not None and store.query_rows(
            "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name != 'schema_migrations'"
    )[0][0] == 0:
        covered = [m for m in migrations if m.version <= base.version]
        if [m.version for m in covered] != list(range(1, base.version + 1)):
            raise StoreError(f"the schema baseline covers 0001-{base.version:04d}, but the migrations found are "
                             f"{[m.version for m in covered]}")
        for stmt in render(base, params):
            store.command(stmt)
        store.command("INSERT INTO schema_migrations (version, name, checksum) VALUES "
                      + ", ".join(f"({m.version}, '{m.name}', '{m.checksum}')" for m in covered))
        done = {m.version: m.checksum for m in covered}
        ran.extend(covered)
    for m in migrations:
        if m.version in done:
            if done[m.version] != m.checksum:
                raise StoreError(
                    f"migration {m.version:04d}_{m.name} was changed after it was applied "
                    f"(checksum {done[m.version]} recorded, {m.checksum} now): add a new migration instead"
                )
            continue
        for stmt in render(m, params):
            guard, sql = guarded(stmt)
            if guard is not None:
                rows = store.query_rows(guard)
                if not rows or str(rows[0][0]).lower() not in ("1", "true"):
                    continue
            store.command(sql)
        store.command(
            f"INSERT INTO schema_migrations (version, name, checksum) VALUES ({m.version}, '{m.name}', '{m.checksum}')"
        )
        ran.append(m)
    return ran
