"""A documented subset of ClickHouse's HTTP interface, answered by the embedded engine (chDB) of the owner process.

Why: chDB cannot listen on a port and only one process may open a data folder.  The owner process
(``forumpulse run``) owns the store and serves this endpoint, so clickhouse-connect (and therefore
``ClickHouseStore`` / ``--store clickhouse://127.0.0.1:8123/forumpulse``), curl, and — as far as the subset
reaches — Grafana's ClickHouse plugin in HTTP mode can use an embedded deployment exactly as they use a server.

The subset (everything else is answered with a ClickHouse-style error, never silently misread):

* ``GET /ping`` and ``GET /`` without a query → ``Ok.``; ``GET /replicas_status`` → ``Ok.``.
* ``GET`` or ``POST /?query=SQL``; with ``POST`` the body is appended to the query (separated by a newline),
  except for ``INSERT … FORMAT <fmt>`` where the body is the data.  ``POST /`` with only a body: the body is the
  query; for ``INSERT … FORMAT <fmt>`` the data starts after the first newline following the format name.
* ``GET`` is readonly, as in ClickHouse (``readonly=2``): ``SELECT``, ``WITH … SELECT``, ``SHOW``,
  ``DESCRIBE``/``DESC``, ``EXISTS``, ``EXPLAIN`` (and ``SET``) run; anything else — DDL, DML, ``INTO OUTFILE`` —
  is answered ``Code: 164 … method GET implies readonly`` (HTTP 403).  The ``readonly`` parameter (1 or 2) does
  the same for ``POST``, ``allow_ddl=0`` refuses DDL (``Code: 392``).  The statement is classified by a lexer that
  reads comments, strings and heredocs as ClickHouse does; one statement per request (chDB would run
  ``SELECT 1; DROP TABLE t`` as two: refused, ``Code: 62``).  The engine also gets ``readonly`` for that query.
* ``database`` (parameter or ``X-ClickHouse-Database`` header) selects the current database for the request.
* ``default_format`` (parameter or ``X-ClickHouse-Format`` header) is the output format when the query has no
  ``FORMAT`` clause; default ``TabSeparated``.  Every output format of the engine works (``Native``, ``Arrow``,
  ``ArrowStream``, ``JSON*``, ``CSV*``, ``TSV*``, ``Parquet`` …).
* Any other parameter is a setting for that query only: it is sent as the query's own ``SETTINGS`` clause
  (``… [FORMAT f] SETTINGS k = v``; for ``INSERT`` before the data), never as ``SET`` on the engine session that
  the owner's loading shares — a ``SET readonly = 1`` there could not be undone.  The query's own ``SETTINGS``
  win, as in ClickHouse.  Statements without a ``SETTINGS`` clause in their grammar (``SYSTEM …``,
  ``CREATE FUNCTION …``, ``GRANT …``) run without the request's settings.  ``SET …`` and ``USE …`` statements are
  accepted and change nothing beyond the request (ClickHouse's HTTP without a session).  Transport
  parameters that mean nothing here are accepted and ignored: ``query_id`` (echoed back), ``session_id``,
  ``session_timeout``, ``session_check``, ``compress``, ``decompress``, ``client_protocol_version``,
  ``wait_end_of_query``, ``buffer_size``, ``user``/``password`` (checked, see below), ``param_*`` (query
  parameters — rejected: not supported).
* Inserts with data: ``INSERT INTO t [(cols)] [SETTINGS …] FORMAT <fmt>`` in any input format the engine reads
  (``Native`` as clickhouse-connect's ``insert`` sends, ``Arrow`` as its ``insert_arrow`` sends, TSV/CSV/JSON…).
  Settings such as ``insert_deduplication_token`` apply (block deduplication works exactly as in the store).
* A request body must arrive whole: one shorter than its ``Content-Length``, or a chunked body that ends before
  its last (0-size) chunk or holds a malformed chunk, is refused (HTTP 400, ``Code: 33 … CANNOT_READ_ALL_DATA``,
  ``Code: 3 … UNEXPECTED_END_OF_FILE`` or ``Code: 246 … CORRUPTED_DATA``, as ClickHouse names them) and nothing
  runs — never the part that arrived, which an insert would store under the request's deduplication token.
* Request bodies may be compressed with ``Content-Encoding`` ``gzip``, ``deflate``, ``lz4`` (LZ4 frame, as
  clickhouse-connect sends) or ``zstd``; responses are compressed only when the client asks with
  ``enable_http_compression=1`` and an ``Accept-Encoding`` we support (``zstd``, ``lz4``, ``gzip``, ``deflate``).
* Responses carry ``X-ClickHouse-Query-Id``, ``X-ClickHouse-Format``, ``X-ClickHouse-Timezone`` (UTC),
  ``X-ClickHouse-Server-Display-Name`` and ``X-ClickHouse-Summary``; errors are HTTP 500 (404 unknown table,
  400 syntax, 401/403 auth, 403 readonly) with body ``Code: N. DB::Exception: …`` and ``X-ClickHouse-Exception-Code``.
* Authentication: when the server is given a password, every request must carry it (``X-ClickHouse-Key``,
  HTTP Basic, or the ``password`` parameter); the user name is not checked.  Bind to 127.0.0.1 (the default)
  unless the port is protected otherwise: over ``POST`` the endpoint can run any SQL, DDL included.

Not supported (documented, answered with an error): sessions (temporary tables across requests), query
parameters (``{name:Type}`` with ``param_*``), ``decompress=1`` (ClickHouse's internal block compression),
external data (multipart ``_data``), progress headers (``send_progress_in_http_headers`` is ignored), HTTPS.

Misuse: do not point several writers at one owner and expect more throughput than one engine gives — the engine
session is serialised (queries take turns); it is an integration surface, not a load balancer.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hmac
import itertools
import json
import os
import re
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, NoReturn
from urllib.parse import parse_qsl, urlsplit

#: parameters that are transport options, not settings (accepted, ignored unless used below)
TRANSPORT_PARAMS = frozenset({
    "query", "database", "default_format", "query_id", "session_id", "session_timeout", "session_check",
    "compress", "decompress", "client_protocol_version", "wait_end_of_query", "buffer_size", "user", "password",
    "enable_http_compression", "http_zlib_compression_level", "send_progress_in_http_headers",
    "http_headers_progress_interval_ms", "quota_key", "role", "http_response_buffer_size",
})
_INSERT_FORMAT = re.compile(
    r"^\s*INSERT\s+INTO\s+(?P<target>.+?)\s+FORMAT\s+(?P<fmt>[A-Za-z0-9_]+)", re.IGNORECASE | re.DOTALL
)
_SETTINGS_TAIL = re.compile(r"^(?P<head>.*?)\s+SETTINGS\s+(?P<settings>.+)$", re.IGNORECASE | re.DOTALL)
_SETTING_NAME = re.compile(r"^[A-Za-z_][A-Za-z_0-9]*$")
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_CODE = re.compile(r"Code:\s*(\d+)")
_CODE_62 = re.compile(r"Code:\s*62\b")
_MAX_BODY = 1 << 31

#: An extra route: (method, path) -> handler(request) returning (status, content_type, body bytes).
Route = Callable[["RequestInfo"], tuple[int, str, bytes]]


class ChError(Exception):
    """An error answered ClickHouse-style (``Code: N. DB::Exception: …``)."""

    def __init__(self, code: int, message: str, status: int = 500, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.headers = headers or {}  # more response headers (a 405's Allow)


class RequestInfo:
    """What an extra route handler sees: method, path, query parameters, headers and the (decoded) body."""

    def __init__(self, method: str, path: str, params: dict[str, str], headers: Any, body: bytes) -> None:
        self.method = method
        self.path = path
        self.params = params
        self.headers = headers
        self.body = body


class EngineGateway:
    """Runs SQL on the owner's embedded store with per-request database and settings.

    Uses the store's session and lock directly (``ChdbStore._sess`` / ``_lock``), so requests are serialised
    with the owner's own queries and inserts.  Temporary files for inserts live in a private directory.

    Nothing a request does may stick to the shared session: settings travel as a query-level ``SETTINGS``
    clause (never ``SET``), ``SET``/``USE`` statements are no-ops (see :class:`_Statement`), and the current
    database is switched only through ``eng.current_db``, which the owner's store also uses.
    """

    def __init__(self, store: Any) -> None:
        eng = getattr(store, "_eng", None)
        if eng is None or not hasattr(eng, "sess") or not hasattr(eng, "lock"):
            raise TypeError("the ClickHouse HTTP endpoint serves an embedded chdb: store only")
        self.store = store
        self._eng = eng
        self.default_database: str = store.database
        self.tmpdir = tempfile.mkdtemp(prefix="fp-chhttp-")

    @contextlib.contextmanager
    def _context(self, database: str | None) -> Iterator[Any]:
        eng = self._eng
        with eng.lock:
            if getattr(self.store, "_closed", False):
                raise ChError(210, "the store is closed (owner shutting down)", 503)
            db = database or self.default_database
            if not _SETTING_NAME.match(db):
                raise ChError(81, f"Database {db} does not exist. (UNKNOWN_DATABASE)", 404)
            sess = eng.sess
            if eng.current_db != db:
                try:
                    sess.query(f"USE `{db}`")
                except Exception as exc:
                    raise _engine_error(exc) from None
                eng.current_db = db
            yield sess

    def execute(self, stmt: _Statement, fmt: str, database: str | None, settings: dict[str, str],
                readonly: int = 0) -> tuple[bytes, dict[str, Any]]:
        """Run ``stmt`` with ``settings`` for this query only; ``readonly`` (1/2) is passed to the engine too, as a
        second line of defence behind the statement check of :func:`_check_access`."""
        sql, appended_at = stmt.with_settings(fmt, settings, {"readonly": str(readonly)} if readonly else None)
        with self._context(database) as sess:
            try:
                res = sess.query(sql, fmt)
            except Exception as exc:
                err = _engine_error(exc)
                # A statement kind that takes no trailing SETTINGS clause (SYSTEM …, CREATE FUNCTION …): the parser
                # failed inside the clause we appended, so nothing ran; run it as sent (without the request's
                # settings, which mean nothing to such statements).  Never for a readonly request.
                if readonly or appended_at is None or not _failed_in_clause(str(exc), sql, appended_at):
                    raise err from None
                try:
                    res = sess.query(stmt.sql, fmt)
                except Exception as exc2:
                    raise _engine_error(exc2) from None
        data = res.bytes() if res is not None else b""
        summary = {"read_rows": str(_safe(res, "rows_read")), "read_bytes": str(_safe(res, "bytes_read")),
                   "written_rows": "0", "written_bytes": "0", "total_rows_to_read": "0",
                   "result_rows": "0", "result_bytes": str(len(data)),
                   "elapsed_ns": str(int(float(_safe(res, "elapsed")) * 1e9))}
        return data or b"", summary

    def insert(self, target: str, fmt: str, data: bytes, database: str | None, settings: dict[str, str]) -> dict[str, Any]:
        """``INSERT INTO target FORMAT fmt`` with ``data``; settings inside ``target`` (``… SETTINGS k=v``) are merged
        with ``settings`` (the request's), the query's own winning as in ClickHouse."""
        _check_single_target(target)
        m = _SETTINGS_TAIL.match(target)
        if m:
            target = m.group("head")
            settings = {**settings, **_parse_settings_clause(m.group("settings"))}  # the query's own win
        fd, path = tempfile.mkstemp(dir=self.tmpdir, suffix="." + fmt.lower())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            clause = ""
            if settings:
                clause = " SETTINGS " + ", ".join(f"{k} = {_literal(v)}" for k, v in settings.items())
            sql = f"INSERT INTO {target} FROM INFILE '{path}'{clause} FORMAT {fmt}"
            with self._context(database) as sess:
                try:
                    sess.query(sql)
                except Exception as exc:
                    raise _engine_error(exc) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return {"read_rows": "0", "read_bytes": "0", "written_rows": "0", "written_bytes": str(len(data)),
                "total_rows_to_read": "0", "result_rows": "0", "result_bytes": "0"}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            for name in os.listdir(self.tmpdir):
                os.unlink(os.path.join(self.tmpdir, name))
            os.rmdir(self.tmpdir)


# --- statements: a lexer faithful to ClickHouse's (src/Parsers/Lexer.cpp) where it matters -------------------
#
# The endpoint must know what a request's SQL is before the engine runs it: GET (and ``readonly``) allow reads
# only, one request is one statement (chDB itself would run ``SELECT 1; DROP TABLE t`` as two), ``SET``/``USE``
# must not reach the shared session, and per-request settings become a query-level ``SETTINGS`` clause that has
# to be placed where the grammar takes it.  Comments, string literals, quoted identifiers and heredocs are
# recognised exactly as ClickHouse does (nested ``/* */``, ``--``, ``//``, ``# ``/``#!``, ``'…''…'``, ``\\'``,
# ``$tag$…$tag$``, numbers with exponents such as ``1e-5``), so no statement can hide inside what the check
# takes for a comment or a string.  Anything the lexer cannot read is refused as a syntax error.

_WORD_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGITS = frozenset("0123456789")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_WS_RE = re.compile(r"[ \t\n\r\f\v]+")
_QUOTED_RE = {q: re.compile(q + "[^" + q + r"\\]*+(?:(?:\\[\s\S]|" + q + q + ")[^" + q + r"\\]*+)*+" + q)
              for q in ("'", '"', "`")}
_TWO_CHAR_OPS = ("->", "==", "!=", "<=", "<>", ">=", "::", "||", "@@", "\\G")
_ONE_CHAR_OPS = frozenset("{},+-*/%=<>?:|@")
#: statement keywords: the first one at the top level of a ``WITH …``/``FROM …`` statement says what it is
_STATEMENT_WORDS = frozenset({
    "SELECT", "INSERT", "UPDATE", "DELETE", "ALTER", "CREATE", "DROP", "TRUNCATE", "OPTIMIZE", "SYSTEM", "RENAME",
    "EXCHANGE", "ATTACH", "DETACH", "UNDROP", "KILL", "GRANT", "REVOKE", "SET", "USE", "BACKUP", "RESTORE",
    "EXPLAIN", "SHOW", "DESCRIBE", "DESC", "EXISTS", "CHECK", "MOVE", "WATCH",
})
#: what GET and ``readonly`` allow (ClickHouse's readonly: reads; ``SET`` too with readonly=2)
READ_VERBS = frozenset({"SELECT", "SHOW", "DESCRIBE", "DESC", "EXISTS", "EXPLAIN"})
#: what ``allow_ddl=0`` refuses
DDL_VERBS = frozenset({"CREATE", "ALTER", "DROP", "RENAME", "EXCHANGE", "TRUNCATE", "ATTACH", "DETACH", "UNDROP"})
#: statements whose grammar has no trailing ``SETTINGS`` clause: they run without the request's settings
_NO_CLAUSE_VERBS = frozenset({"SYSTEM", "GRANT", "REVOKE", "BEGIN", "START", "COMMIT", "ROLLBACK", "BACKUP",
                              "RESTORE", "SET", "USE"})
_ACCESS_ENTITIES = frozenset({"USER", "ROLE", "QUOTA", "ROW", "POLICY", "SETTINGS", "PROFILE", "FUNCTION",
                              "NAMED", "WORKLOAD", "RESOURCE"})
_KNOWN_VERBS = _STATEMENT_WORDS | _NO_CLAUSE_VERBS | {"WITH", "FROM"}
_INSERT_MARKERS = frozenset({"VALUES", "FORMAT", "SELECT", "WITH", "SETTINGS"})
_POSITION = re.compile(r"failed at position (\d+)")


class _Tok(NamedTuple):
    kind: str  # word, qident, string, number, open, close, semi, dot, op, error
    start: int
    end: int
    depth: int  # bracket depth outside the token


def _is_number_separator(sql: str, i: int) -> bool:
    # ClickHouse accepts ``_`` only between digits; accepting it anywhere in a number can only make this lexer
    # read *more* of a number (e.g. an exponent sign ClickHouse leaves as a minus), i.e. see more tokens, never fewer.
    return sql[i] == "_"


def _lex_number(sql: str, pos: int, after_dot: bool) -> tuple[str, int]:
    n = len(sql)
    if after_dot:  # chained tuple access x.1.1: a plain integer only
        j = pos + 1
        while j < n and (sql[j] in _DIGITS or _is_number_separator(sql, j)):
            j += 1
    else:
        j = pos
        hexm = False
        if j + 2 < n and sql[j] == "0" and sql[j + 1] in "xXbB":
            if sql[j + 1] in "xX" and sql[j + 2] in _HEX_DIGITS:
                hexm = True
                j += 2
            elif sql[j + 1] in "bB" and sql[j + 2] in "01":
                j += 2
            else:
                j += 1
        else:
            j += 1
        digits = _HEX_DIGITS if hexm else _DIGITS
        while j < n and (sql[j] in digits or _is_number_separator(sql, j)):
            j += 1
        if j < n and sql[j] == ".":
            j += 1
            while j < n and (sql[j] in digits or _is_number_separator(sql, j)):
                j += 1
        if j + 1 < n and sql[j] in ("pP" if hexm else "eE"):
            j += 1
            if j + 1 < n and sql[j] in "+-":
                j += 1
            while j < n and (sql[j] in _DIGITS or _is_number_separator(sql, j)):
                j += 1
    if j < n and sql[j] in _WORD_CHARS:  # 1identifier
        while j < n and sql[j] in _WORD_CHARS:
            j += 1
        if any(ch not in _WORD_CHARS and ch != "$" for ch in sql[pos:j]):
            return "error", j
        return "word", j
    return "number", j


def _lex(sql: str) -> Iterator[_Tok]:
    """Significant tokens of ``sql`` (no whitespace, no comments); an ``error`` token ends the stream."""
    n = len(sql)
    pos = 0
    depth = 0
    prev = ""
    while pos < n:
        c = sql[pos]
        start = pos
        if c in " \t\n\r\f\v":
            m = _WS_RE.match(sql, pos)
            assert m is not None
            pos = m.end()
            continue
        if sql.startswith(("--", "//", "# ", "#!"), pos):
            nl = sql.find("\n", pos)
            pos = n if nl < 0 else nl
            continue
        if sql.startswith("/*", pos):  # nested, as in ClickHouse
            level = 1
            pos += 2
            while level and pos + 2 <= n:
                if sql.startswith("/*", pos):
                    level += 1
                    pos += 2
                elif sql.startswith("*/", pos):
                    level -= 1
                    pos += 2
                else:
                    pos += 1
            if level:
                yield _Tok("error", start, n, depth)
                return
            continue
        kind = "op"
        if c in "'\"`":
            m = _QUOTED_RE[c].match(sql, pos)
            if m is None:
                yield _Tok("error", start, n, depth)
                return
            kind, pos = ("string" if c == "'" else "qident"), m.end()
        elif c in _DIGITS:
            kind, pos = _lex_number(sql, pos, prev == "dot")
        elif c == ".":
            if pos > 0 and (pos + 1 >= n or sql[pos + 1] not in _DIGITS or prev in ("close", "word", "qident", "number")):
                kind, pos = "dot", pos + 1
            else:
                j = pos + 1
                while j < n and (sql[j] in _DIGITS or _is_number_separator(sql, j)):
                    j += 1
                if j + 1 < n and sql[j] in "eE":
                    j += 1
                    if j + 1 < n and sql[j] in "+-":
                        j += 1
                    while j < n and (sql[j] in _DIGITS or _is_number_separator(sql, j)):
                        j += 1
                kind, pos = "number", j
        elif c == "$" and (heredoc := _heredoc_end(sql, pos)) is not None:
            kind, pos = "string", heredoc
        elif c == "$" and (pos + 1 == n or sql[pos + 1] not in _WORD_CHARS):
            pos += 1
        elif c in "xXbB" and pos + 2 < n and sql[pos + 1] == "'":
            j = pos + 2
            allowed = _HEX_DIGITS if c in "xX" else frozenset("01")
            while j < n and sql[j] in allowed:
                j += 1
            if j >= n or sql[j] != "'":
                yield _Tok("error", start, n, depth)
                return
            kind, pos = "string", j + 1
        elif c in _WORD_CHARS or c == "$":
            j = pos + 1
            while j < n and (sql[j] in _WORD_CHARS or sql[j] == "$"):
                j += 1
            kind, pos = "word", j
        elif c in "([":
            kind, pos = "open", pos + 1
        elif c in ")]":
            depth = max(depth - 1, 0)
            kind, pos = "close", pos + 1
        elif c == ";":
            kind, pos = "semi", pos + 1
        elif sql.startswith(_TWO_CHAR_OPS, pos):
            pos += 2
        elif c in _ONE_CHAR_OPS:
            pos += 1
        elif not c.isascii() and c.isspace():  # ClickHouse skips Unicode whitespace too
            pos += 1
            continue
        else:  # '!', '#x', '\\' without G, other characters: ClickHouse's lexer fails here too
            yield _Tok("error", start, start + 1, depth)
            return
        yield _Tok(kind, start, pos, depth)
        prev = kind
        if kind == "open":
            depth += 1


def _heredoc_end(sql: str, pos: int) -> int | None:
    """End of the heredoc ``$tag$…$tag$`` starting at ``pos``, if there is one (ClickHouse: any tag, even ``$$``)."""
    j = sql.find("$", pos + 1)
    if j < 0:
        return None
    tag = sql[pos:j + 1]
    k = sql.find(tag, j + 1)
    return None if k < 0 else k + len(tag)


def _syntax_error(sql: str, tok: _Tok) -> ChError:
    near = sql[tok.start:tok.start + 40]
    return ChError(62, f"Code: 62. DB::Exception: Syntax error: failed at position {tok.start + 1} ({near!r}): "
                   "unrecognized token, or an unclosed string, quoted identifier or comment. (SYNTAX_ERROR)", 400)


class _Statement:
    """One SQL statement, lexed: what it is (``verb``) and where a ``SETTINGS`` clause goes.

    Raises :class:`ChError` for an empty query, more than one statement, or text the lexer cannot read.  For
    ``INSERT … FORMAT f`` the data after the format name is not lexed (it is data up to the end of the query).
    """

    def __init__(self, sql: str) -> None:
        self.sql = sql
        toks: list[_Tok] = []
        first = ""
        verb = ""
        verb_idx = -1
        with_depth = -1
        marker = -1  # INSERT: index of the first top-level VALUES/FORMAT/SELECT/WITH/SETTINGS
        lexer = _lex(sql)
        for t in lexer:
            if t.kind == "error":
                raise _syntax_error(sql, t)
            if t.kind == "semi":
                for rest in lexer:
                    if rest.kind == "error":
                        raise _syntax_error(sql, rest)
                    if rest.kind != "semi":
                        raise ChError(62, "Code: 62. DB::Exception: Multi-statements are not allowed: send one "
                                      "statement per request. (SYNTAX_ERROR)", 400)
                break
            toks.append(t)
            i = len(toks) - 1
            word = sql[t.start:t.end].upper() if t.kind == "word" else ""
            if not first:
                if t.kind == "open":
                    continue
                first = word or t.kind
                if first in ("WITH", "FROM"):  # WITH … SELECT/INSERT; ClickHouse's FROM t SELECT …
                    with_depth = t.depth
                else:
                    verb, verb_idx = first, i
            elif not verb and word in _STATEMENT_WORDS and t.depth == with_depth:
                verb, verb_idx = word, i
            elif verb == "INSERT" and marker < 0 and word in _INSERT_MARKERS and t.depth == toks[verb_idx].depth \
                    and toks[i - 1].kind != "dot":
                marker = i
            elif verb == "INSERT" and marker == i - 1 and sql[toks[marker].start:toks[marker].end].upper() == "FORMAT":
                break  # INSERT … FORMAT name: what follows is data
        if not toks or not first:
            raise ChError(62, "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)", 400)
        self.toks = toks
        self.first = first
        self.verb = verb or first
        self.verb_idx = verb_idx
        self.insert_marker = marker

    def _word(self, i: int) -> str:
        t = self.toks[i]
        return self.sql[t.start:t.end].upper() if t.kind == "word" else ""

    @property
    def is_read(self) -> bool:
        """A statement GET / ``readonly`` may run: SELECT, WITH … SELECT, SHOW, DESCRIBE, EXISTS, EXPLAIN — and not
        one writing a file (``INTO OUTFILE``) or naming INSERT anywhere (chDB accepts ``WITH … INSERT``)."""
        if self.verb not in READ_VERBS:
            return False
        words = [self._word(i) for i in range(len(self.toks))]
        if "INSERT" in words:
            return False
        return not any(a == "INTO" and b == "OUTFILE" for a, b in itertools.pairwise(words))

    @property
    def takes_no_clause(self) -> bool:
        if self.verb in _NO_CLAUSE_VERBS or self.verb_idx < 0:
            return True
        if self.verb in ("CREATE", "ALTER", "DROP", "ATTACH"):  # CREATE [OR REPLACE] USER/ROLE/FUNCTION/…
            for i in range(self.verb_idx + 1, min(self.verb_idx + 4, len(self.toks))):
                w = self._word(i)
                if w not in ("OR", "REPLACE"):
                    return w in _ACCESS_ENTITIES
        return False

    def with_settings(self, fmt: str, settings: dict[str, str], forced: dict[str, str] | None = None,
                      ) -> tuple[str, int | None]:
        """The statement with ``settings`` as a query-level ``SETTINGS`` clause (they apply to this query only;
        the statement's own ``SETTINGS`` take precedence, as in ClickHouse) and ``forced`` after the statement's
        own; and the offset where an appended clause begins (None when nothing was appended at the end)."""
        sql = self.sql
        forced = forced or {}
        if not (settings or forced) or self.takes_no_clause:
            return sql, None
        pairs = ", ".join(f"{k} = {_literal(v)}" for k, v in {**settings, **forced}.items())
        toks = self.toks
        if self.verb == "INSERT":
            if self.insert_marker < 0:
                return sql, None
            t = toks[self.insert_marker]
            if self._word(self.insert_marker) == "SETTINGS":
                return f"{sql[:t.end]} {pairs},{sql[t.end:]}", None
            return f"{sql[:t.start]}SETTINGS {pairs} {sql[t.start:]}", None
        end = toks[-1].end
        top = [i for i, t in enumerate(toks) if t.depth == 0]
        if self.verb in ("DELETE", "UPDATE"):  # lightweight DELETE/UPDATE: a trailing SETTINGS, no FORMAT
            own = [i for i in top if self._word(i) == "SETTINGS"]
            if own:
                t = toks[own[-1]]
                return f"{sql[:t.end]} {pairs},{sql[t.end:]}", None
            return f"{sql[:end]}\nSETTINGS {pairs}", end
        # a query with output: [… FORMAT f [SETTINGS …]] — a clause after FORMAT is the query's, never a table's
        for k, i in enumerate(top):
            nxt = top[k + 1] if k + 1 < len(top) else -1
            if self._word(i) == "FORMAT" and nxt == i + 1 and toks[nxt].kind in ("word", "qident"):
                after = top[k + 2] if k + 2 < len(top) else -1
                if after < 0 and nxt == len(toks) - 1:
                    return f"{sql[:end]}\nSETTINGS {pairs}", end
                if after == nxt + 1 and self._word(after) == "SETTINGS":  # … FORMAT f SETTINGS own: ours, own, forced
                    t = toks[after]
                    ours = "".join(f" {k} = {_literal(v)}," for k, v in settings.items())
                    tail = "".join(f", {k} = {_literal(v)}" for k, v in forced.items())
                    return f"{sql[:t.end]}{ours}{sql[t.end:end]}{tail}{sql[end:]}", None
        return f"{sql[:end]}\nFORMAT {fmt}\nSETTINGS {pairs}", end


def _check_access(stmt: _Statement, readonly: int, allow_ddl: bool, via_get: bool) -> None:
    """ClickHouse's ``readonly`` (GET implies 2: reads, and settings may change) and ``allow_ddl``, decided here
    from the statement — never by ``SET readonly`` on the shared session, which could not be undone."""
    if readonly:
        if stmt.is_read or (stmt.first == "SET" and readonly == 2) or stmt.first == "USE":
            return
        if stmt.first == "SET":
            raise ChError(164, "Code: 164. DB::Exception: Cannot modify settings in readonly mode. (READONLY)", 403)
        if stmt.verb not in _KNOWN_VERBS:  # not a statement at all (ClickHouse fails parsing it before checking)
            near = stmt.sql[stmt.toks[0].start:stmt.toks[0].start + 40]
            raise ChError(62, f"Code: 62. DB::Exception: Syntax error: failed at position {stmt.toks[0].start + 1} "
                          f"({near!r}): expected a statement; a readonly request runs only SELECT, WITH … SELECT, "
                          "SHOW, DESCRIBE, EXISTS, EXPLAIN. (SYNTAX_ERROR)", 400)
        if via_get:
            raise ChError(164, "Code: 164. DB::Exception: Cannot execute query in readonly mode. For queries over "
                          "HTTP, method GET implies readonly. You should use method POST for modifying queries. "
                          "(READONLY)", 403)
        raise ChError(164, "Code: 164. DB::Exception: default: Cannot execute query in readonly mode. (READONLY)", 403)
    if not allow_ddl and stmt.verb in DDL_VERBS:
        raise ChError(392, "Code: 392. DB::Exception: Cannot execute query. DDL queries are prohibited for the user "
                      "default. (QUERY_IS_PROHIBITED)", 403)


def _check_single_target(target: str) -> None:
    """The table part of ``INSERT INTO <target> FORMAT f`` (the body is the data) must not smuggle a statement."""
    for t in _lex(target):
        if t.kind == "error":
            raise _syntax_error(target, t)
        if t.kind == "semi":
            raise ChError(62, "Code: 62. DB::Exception: Multi-statements are not allowed: send one statement per "
                          "request. (SYNTAX_ERROR)", 400)


def _failed_in_clause(message: str, sql: str, appended_at: int) -> bool:
    """Did the engine's syntax error point into the clause appended at ``appended_at``?"""
    m = _POSITION.search(message)
    if not m or _CODE_62.search(message) is None:
        return False
    return int(m.group(1)) - 1 >= len(sql[:appended_at].encode("utf-8", "surrogateescape"))


def _readonly_level(value: str | None, via_get: bool) -> int:
    """``readonly`` of a request: 0, 1 or 2 (GET: at least 2, as ClickHouse sets it)."""
    v = (value or "0").strip().lower()
    level = 0 if v in ("0", "false", "") else 2 if v == "2" else 1
    return 2 if via_get and level == 0 else level


def _safe(res: Any, attr: str) -> Any:
    try:
        return getattr(res, attr)()
    except Exception:
        return 0


def _literal(v: str) -> str:
    if re.fullmatch(r"-?\d+(\.\d+)?", v):
        return v
    return "'" + v.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _parse_settings_clause(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in re.findall(r"([A-Za-z_][A-Za-z_0-9]*)\s*=\s*('(?:[^'\\]|\\.)*'|[^,\s]+)", text):
        k, v = part
        out[k] = v[1:-1].replace("\\'", "'").replace("\\\\", "\\") if v.startswith("'") else v
    return out


def _engine_error(exc: Exception) -> ChError:
    text = str(exc).strip()
    m = _CODE.search(text)
    code = int(m.group(1)) if m else 1002
    status = 500
    if code in (60, 81):  # UNKNOWN_TABLE, UNKNOWN_DATABASE
        status = 404
    elif code in (62, 47, 46, 27, 36, 53, 6, 26, 72, 117, 115):  # syntax / bad arguments / parse / unknown setting
        status = 400
    elif code in (164, 392, 497):  # READONLY, QUERY_IS_PROHIBITED, ACCESS_DENIED
        status = 403
    if not text.startswith("Code:"):
        text = f"Code: {code}. DB::Exception: {text}"
    prefix = f"Code: {code}. DB::Exception: "
    while text.startswith(prefix + prefix):  # the engine's message already carried it
        text = text[len(prefix):]
    return ChError(code, text, status)


def _decode_body(body: bytes, encoding: str | None) -> bytes:
    enc = (encoding or "").strip().lower()
    if not enc or enc == "identity":
        return body
    if enc == "gzip":
        return gzip.decompress(body)
    if enc == "deflate":
        return zlib.decompress(body)
    if enc == "lz4":
        import lz4.frame

        return bytes(lz4.frame.decompress(body))
    if enc == "zstd":
        from backports import zstd

        return bytes(zstd.decompress(body))
    raise ChError(1002, f"Code: 1002. DB::Exception: unsupported Content-Encoding {enc!r}", 400)


def _encode_body(body: bytes, accept: str | None) -> tuple[bytes, str | None]:
    offered = [a.split(";")[0].strip().lower() for a in (accept or "").split(",") if a.strip()]
    for enc in ("zstd", "lz4", "gzip", "deflate"):
        if enc in offered:
            if enc == "zstd":
                from backports import zstd

                return bytes(zstd.compress(body)), enc
            if enc == "lz4":
                import lz4.frame

                return bytes(lz4.frame.compress(body)), enc
            if enc == "gzip":
                return gzip.compress(body, 1), enc
            return zlib.compress(body, 1), enc
    return body, None


_CONTENT_TYPES = {
    "JSON": "application/json; charset=UTF-8", "JSONCompact": "application/json; charset=UTF-8",
    "JSONEachRow": "application/x-ndjson; charset=UTF-8", "CSV": "text/csv; charset=UTF-8; header=absent",
    "CSVWithNames": "text/csv; charset=UTF-8; header=present",
}


class _Handler(BaseHTTPRequestHandler):
    server: ClickHouseHTTPServer
    protocol_version = "HTTP/1.1"
    server_version = "forumpulse-chhttp"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default; the owner logs summaries
        if self.server.access_log is not None:
            self.server.access_log(format % args)

    def do_GET(self) -> None:
        self._handle(read_body=False)

    def do_POST(self) -> None:
        self._handle(read_body=True)

    def do_HEAD(self) -> None:
        self._send(200, "text/plain; charset=UTF-8", b"", {})

    def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self) -> bytes:
        """The whole request body, or a ClickHouse-style error: a body shorter than its ``Content-Length``, a
        chunked body that ends before its last (0-size) chunk or has a malformed chunk are refused, as ClickHouse
        refuses them -- never run as the part that arrived (an insert would store it, under the request's
        ``insert_deduplication_token``, and drop the client's retry of the whole body as a duplicate)."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while True:
                line = self.rfile.readline(1024)
                if not line.endswith(b"\n"):
                    self._bad_body(3, "Unexpected end of file while reading chunk header of HTTP chunked data "
                                   "(UNEXPECTED_END_OF_FILE)" if len(line) < 1024 else
                                   "Chunk header of HTTP chunked data too long (CORRUPTED_DATA)")
                size_text = line.split(b";")[0].strip()
                if not _CHUNK_SIZE.fullmatch(size_text):
                    self._bad_body(246, "Unexpected data instead of HTTP chunk header (CORRUPTED_DATA)")
                size = int(size_text, 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    break
                total += size
                if total > _MAX_BODY:
                    self._too_large()
                data = self.rfile.read(size)
                if len(data) != size:
                    self._bad_body(3, f"Unexpected end of file while reading HTTP chunked data: got {len(data)} "
                                   f"of {size} bytes of a chunk (UNEXPECTED_END_OF_FILE)")
                chunks.append(data)
                if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    self._bad_body(246, "Unexpected data after an HTTP chunk: expected CRLF (CORRUPTED_DATA)")
            return b"".join(chunks)
        length = (self.headers.get("Content-Length") or "").strip()
        if not length:
            return b""
        if not length.isdigit():
            self._bad_body(27, f"Cannot parse Content-Length {length[:40]!r} (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")
        n = int(length)
        if n > _MAX_BODY:
            self._too_large()
        data = self.rfile.read(n) if n else b""
        if len(data) != n:
            self._bad_body(33, f"Unexpected EOF, got {len(data)} of {n} bytes: the HTTP request body ended "
                           "before its Content-Length (CANNOT_READ_ALL_DATA)")
        return data

    def _too_large(self) -> NoReturn:
        """Refuse a body over the limit without reading it, and close the connection (its unread rest must not
        be parsed as a next request)."""
        self.close_connection = True
        raise ChError(1002, "Code: 1002. DB::Exception: request body too large", 413)

    def _bad_body(self, code: int, message: str) -> NoReturn:
        """Refuse a request whose body did not arrive whole (nothing runs) and close the connection: where the
        body ended is unknown, so the rest of the stream cannot be read as a next request."""
        self.close_connection = True
        raise ChError(code, f"Code: {code}. DB::Exception: {message}", 400)

    def _handle(self, read_body: bool) -> None:
        query_id = ""
        try:
            split = urlsplit(self.path)
            params = dict(parse_qsl(split.query, keep_blank_values=True))
            query_id = params.get("query_id") or self.headers.get("X-ClickHouse-Query-Id") or str(uuid.uuid4())
            body = _decode_body(self._read_body(), self.headers.get("Content-Encoding")) if read_body else b""
            route = self.server.routes.get((self.command, split.path))
            if route is not None:
                status, ctype, out = route(RequestInfo(self.command, split.path, params, self.headers, body))
                self._send(status, ctype, out, {})
                return
            if split.path in ("/ping", "/replicas_status") or (split.path == "/" and "query" not in params and not body):
                self._send(200, "text/plain; charset=UTF-8", b"Ok.\n", {})
                return
            if split.path not in ("/", "/query"):
                allowed = sorted(m for m, p in self.server.routes if p == split.path)
                if allowed:  # a route of the owner's, asked with another method (GET /fp/unban)
                    raise ChError(1002, f"Code: 1002. DB::Exception: {split.path} takes {' or '.join(allowed)}, "
                                  f"not {self.command}", 405, {"Allow": ", ".join(allowed)})
                raise ChError(1002, f"Code: 1002. DB::Exception: no handler for {split.path}", 404)
            self._authenticate(params)
            self._run(params, body, query_id)
        except ChError as exc:
            msg = str(exc)
            if not msg.startswith("Code:"):
                msg = f"Code: {exc.code}. DB::Exception: {msg}"
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client gone mid-upload
                self._send(exc.status, "text/plain; charset=UTF-8", (msg + "\n").encode(),
                           {**exc.headers, "X-ClickHouse-Exception-Code": str(exc.code),
                            "X-ClickHouse-Query-Id": query_id})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:  # a bug here must still answer the client, not hang it
            self._send(500, "text/plain; charset=UTF-8", f"Code: 1001. DB::Exception: {exc!r}\n".encode(),
                       {"X-ClickHouse-Exception-Code": "1001", "X-ClickHouse-Query-Id": query_id})

    def _authenticate(self, params: dict[str, str]) -> None:
        want = self.server.password
        if not want:
            return
        given = self.headers.get("X-ClickHouse-Key") or params.get("password")
        auth = self.headers.get("Authorization", "")
        if given is None and auth.startswith("Basic "):
            try:
                given = base64.b64decode(auth[6:]).decode().split(":", 1)[1]
            except Exception:
                given = None
        if given is None:
            raise ChError(194, "Code: 194. DB::Exception: password required (REQUIRED_PASSWORD)", 401)
        if not hmac.compare_digest(given.encode(), want.encode()):
            raise ChError(516, "Code: 516. DB::Exception: default: Authentication failed (AUTHENTICATION_FAILED)", 403)

    def _run(self, params: dict[str, str], body: bytes, query_id: str) -> None:
        if any(k.startswith("param_") for k in params):
            raise ChError(1002, "Code: 1002. DB::Exception: query parameters (param_*) are not supported by this "
                          "endpoint: inline the values", 400)
        if params.get("decompress") in ("1", "true"):
            raise ChError(1002, "Code: 1002. DB::Exception: decompress=1 (native block compression) is not "
                          "supported: use Content-Encoding", 400)
        database = params.get("database") or self.headers.get("X-ClickHouse-Database") or None
        fmt = params.get("default_format") or self.headers.get("X-ClickHouse-Format") or "TabSeparated"
        settings = {k: v for k, v in params.items() if k not in TRANSPORT_PARAMS}
        for k in settings:
            if not _SETTING_NAME.match(k):
                raise ChError(115, f"Code: 115. DB::Exception: Unknown setting {k} (UNKNOWN_SETTING)", 400)
        # access control is decided here, per statement; it never reaches the shared session (see _check_access)
        via_get = self.command == "GET"
        readonly = _readonly_level(settings.pop("readonly", None), via_get)
        allow_ddl = settings.pop("allow_ddl", "1").strip().lower() not in ("0", "false")
        qparam = params.get("query")
        gw = self.server.gateway
        if gw is None:
            raise ChError(48, "Code: 48. DB::Exception: this owner stores into a ClickHouse server: query that "
                          "server directly (NOT_IMPLEMENTED)", 501)
        t0 = time.perf_counter()
        if qparam is not None:
            m = _INSERT_FORMAT.match(qparam)
            if m and body:
                _check_access(_Statement(qparam), readonly, allow_ddl, via_get)
                summary = gw.insert(m.group("target"), m.group("fmt"), body, database, settings)
                out = b""
            else:
                sql = qparam + ("\n" + body.decode("utf-8", "replace") if body else "")
                out, summary = self._query(sql, fmt, database, settings, readonly, allow_ddl)
        else:
            text = body.decode("utf-8", "surrogateescape")
            m = _INSERT_FORMAT.match(text)
            if m:
                rest = body[len(text[: m.end()].encode("utf-8", "surrogateescape")):]
                nl = rest.find(b"\n")
                data = rest[nl + 1:] if nl >= 0 and not rest[:nl].strip() else rest.lstrip(b" \t")
                if not data:
                    raise ChError(108, "Code: 108. DB::Exception: No data to insert (NO_DATA_TO_INSERT)", 400)
                _check_access(_Statement(text[: m.end()]), readonly, allow_ddl, via_get)
                summary = gw.insert(m.group("target"), m.group("fmt"), data, database, settings)
                out = b""
            elif not text.strip():
                raise ChError(62, "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)", 400)
            else:
                out, summary = self._query(text, fmt, database, settings, readonly, allow_ddl)
        summary["elapsed_ns"] = str(int((time.perf_counter() - t0) * 1e9))
        headers = {
            "X-ClickHouse-Query-Id": query_id,
            "X-ClickHouse-Format": fmt,
            "X-ClickHouse-Timezone": "UTC",
            "X-ClickHouse-Server-Display-Name": self.server.display_name,
            "X-ClickHouse-Summary": json.dumps(summary, separators=(",", ":")),
        }
        if params.get("enable_http_compression") in ("1", "true") and out:
            out, enc = _encode_body(out, self.headers.get("Accept-Encoding"))
            if enc:
                headers["Content-Encoding"] = enc
        self._send(200, _CONTENT_TYPES.get(fmt, "text/plain; charset=UTF-8") if fmt[:5] != "Arrow" and fmt not in (
            "Native", "Parquet", "RowBinary") else "application/octet-stream", out, headers)

    def _query(self, sql: str, fmt: str, database: str | None, settings: dict[str, str], readonly: int,
               allow_ddl: bool) -> tuple[bytes, dict[str, Any]]:
        if not re.fullmatch(r"[A-Za-z0-9_]+", fmt):
            raise ChError(73, f"Code: 73. DB::Exception: Unknown format {fmt} (UNKNOWN_FORMAT)", 400)
        stmt = _Statement(sql)
        _check_access(stmt, readonly, allow_ddl, self.command == "GET")
        if stmt.first in ("SET", "USE"):
            # without sessions these change nothing beyond the request (as over ClickHouse's HTTP without
            # session_id); run on the shared engine session they would stick to every later query
            return b"", {"read_rows": "0", "read_bytes": "0", "written_rows": "0", "written_bytes": "0",
                         "total_rows_to_read": "0", "result_rows": "0", "result_bytes": "0"}
        assert self.server.gateway is not None
        return self.server.gateway.execute(stmt, fmt, database, settings, readonly)


class ClickHouseHTTPServer(ThreadingHTTPServer):
    """The endpoint.  ``serve_forever()`` in a thread (see :func:`start_server`); ``shutdown()`` to stop."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, store: Any, host: str = "127.0.0.1", port: int = 8123, *, password: str | None = None,
                 display_name: str = "forumpulse-owner", routes: dict[tuple[str, str], Route] | None = None,
                 access_log: Callable[[str], None] | None = None) -> None:
        #: None when the owner's store is a ClickHouse server (query it directly; only extra routes are served)
        self.gateway: EngineGateway | None = EngineGateway(store) if hasattr(store, "_eng") else None
        self.password = password
        self.display_name = display_name
        self.routes: dict[tuple[str, str], Route] = dict(routes or {})
        self.access_log = access_log
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def server_close(self) -> None:
        super().server_close()
        if self.gateway is not None:
            self.gateway.close()


def start_server(store: Any, host: str = "127.0.0.1", port: int = 8123, **kwargs: Any) -> ClickHouseHTTPServer:
    """Start the endpoint on ``host:port`` (``port=0`` picks a free port, see ``server.port``) in a daemon thread."""
    srv = ClickHouseHTTPServer(store, host, port, **kwargs)
    threading.Thread(target=srv.serve_forever, name="chhttp", daemon=True).start()
    return srv
