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
* ``database`` (parameter or ``X-ClickHouse-Database`` header) selects the current database for the request.
* ``default_format`` (parameter or ``X-ClickHouse-Format`` header) is the output format when the query has no
  ``FORMAT`` clause; default ``TabSeparated``.  Every output format of the engine works (``Native``, ``Arrow``,
  ``ArrowStream``, ``JSON*``, ``CSV*``, ``TSV*``, ``Parquet`` …).
* Any other parameter is a setting for that query (``SET k = v`` before it and ``SET k = DEFAULT`` after it;
  requests are serialised on the one engine session, so settings never leak between requests).  Transport
  parameters that mean nothing here are accepted and ignored: ``query_id`` (echoed back), ``session_id``,
  ``session_timeout``, ``session_check``, ``compress``, ``decompress``, ``client_protocol_version``,
  ``wait_end_of_query``, ``buffer_size``, ``user``/``password`` (checked, see below), ``param_*`` (query
  parameters — rejected: not supported).
* Inserts with data: ``INSERT INTO t [(cols)] [SETTINGS …] FORMAT <fmt>`` in any input format the engine reads
  (``Native`` as clickhouse-connect's ``insert`` sends, ``Arrow`` as its ``insert_arrow`` sends, TSV/CSV/JSON…).
  Settings such as ``insert_deduplication_token`` apply (block deduplication works exactly as in the store).
* Request bodies may be compressed with ``Content-Encoding`` ``gzip``, ``deflate``, ``lz4`` (LZ4 frame, as
  clickhouse-connect sends) or ``zstd``; responses are compressed only when the client asks with
  ``enable_http_compression=1`` and an ``Accept-Encoding`` we support (``zstd``, ``lz4``, ``gzip``, ``deflate``).
* Responses carry ``X-ClickHouse-Query-Id``, ``X-ClickHouse-Format``, ``X-ClickHouse-Timezone`` (UTC),
  ``X-ClickHouse-Server-Display-Name`` and ``X-ClickHouse-Summary``; errors are HTTP 500 (404 unknown table,
  400 syntax, 401/403 auth) with body ``Code: N. DB::Exception: …`` and ``X-ClickHouse-Exception-Code``.
* Authentication: when the server is given a password, every request must carry it (``X-ClickHouse-Key``,
  HTTP Basic, or the ``password`` parameter); the user name is not checked.  Bind to 127.0.0.1 (the default)
  unless the port is protected otherwise: the endpoint can run any SQL, DDL included.

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
from typing import Any
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
_CODE = re.compile(r"Code:\s*(\d+)")
_MAX_BODY = 1 << 31

#: An extra route: (method, path) -> handler(request) returning (status, content_type, body bytes).
Route = Callable[["RequestInfo"], tuple[int, str, bytes]]


class ChError(Exception):
    """An error answered ClickHouse-style (``Code: N. DB::Exception: …``)."""

    def __init__(self, code: int, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


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
    def _context(self, database: str | None, settings: dict[str, str]) -> Iterator[Any]:
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
            applied: list[str] = []
            try:
                for k, v in settings.items():
                    try:
                        sess.query(f"SET {k} = {_literal(v)}")
                    except Exception as exc:
                        raise _engine_error(exc) from None
                    applied.append(k)
                yield sess
            finally:
                for k in applied:
                    with contextlib.suppress(Exception):
                        sess.query(f"SET {k} = DEFAULT")

    def execute(self, sql: str, fmt: str, database: str | None, settings: dict[str, str]) -> tuple[bytes, dict[str, Any]]:
        with self._context(database, settings) as sess:
            try:
                res = sess.query(sql, fmt)
            except Exception as exc:
                raise _engine_error(exc) from None
        data = res.bytes() if res is not None else b""
        summary = {"read_rows": str(_safe(res, "rows_read")), "read_bytes": str(_safe(res, "bytes_read")),
                   "written_rows": "0", "written_bytes": "0", "total_rows_to_read": "0",
                   "result_rows": "0", "result_bytes": str(len(data)),
                   "elapsed_ns": str(int(float(_safe(res, "elapsed")) * 1e9))}
        return data or b"", summary

    def insert(self, target: str, fmt: str, data: bytes, database: str | None, settings: dict[str, str]) -> dict[str, Any]:
        """``INSERT INTO target FORMAT fmt`` with ``data``; settings inside ``target`` (``… SETTINGS k=v``) are merged."""
        m = _SETTINGS_TAIL.match(target)
        if m:
            target = m.group("head")
            settings = {**_parse_settings_clause(m.group("settings")), **settings}
        fd, path = tempfile.mkstemp(dir=self.tmpdir, suffix="." + fmt.lower())
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            clause = ""
            if settings:
                clause = " SETTINGS " + ", ".join(f"{k} = {_literal(v)}" for k, v in settings.items())
            sql = f"INSERT INTO {target} FROM INFILE '{path}'{clause} FORMAT {fmt}"
            with self._context(database, {}) as sess:
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
    elif code in (62, 47, 46, 27, 36, 53, 6, 26, 72, 117):  # syntax / bad arguments / parse errors
        status = 400
    if not text.startswith("Code:"):
        text = f"Code: {code}. DB::Exception: {text}"
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
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
                total += size
                if total > _MAX_BODY:
                    raise ChError(1002, "Code: 1002. DB::Exception: request body too large", 413)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        if n > _MAX_BODY:
            raise ChError(1002, "Code: 1002. DB::Exception: request body too large", 413)
        return self.rfile.read(n) if n else b""

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
                raise ChError(1002, f"Code: 1002. DB::Exception: no handler for {split.path}", 404)
            self._authenticate(params)
            self._run(params, body, query_id)
        except ChError as exc:
            msg = str(exc)
            if not msg.startswith("Code:"):
                msg = f"Code: {exc.code}. DB::Exception: {msg}"
            self._send(exc.status, "text/plain; charset=UTF-8", (msg + "\n").encode(),
                       {"X-ClickHouse-Exception-Code": str(exc.code), "X-ClickHouse-Query-Id": query_id})
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
        qparam = params.get("query")
        gw = self.server.gateway
        if gw is None:
            raise ChError(48, "Code: 48. DB::Exception: this owner stores into a ClickHouse server: query that "
                          "server directly (NOT_IMPLEMENTED)", 501)
        t0 = time.perf_counter()
        if qparam is not None:
            m = _INSERT_FORMAT.match(qparam)
            if m and body:
                summary = gw.insert(m.group("target"), m.group("fmt"), body, database, settings)
                out = b""
            else:
                sql = qparam + ("\n" + body.decode("utf-8", "replace") if body else "")
                out, summary = self._query(sql, fmt, database, settings)
        else:
            text = body.decode("utf-8", "surrogateescape")
            m = _INSERT_FORMAT.match(text)
            if m:
                rest = body[len(text[: m.end()].encode("utf-8", "surrogateescape")):]
                nl = rest.find(b"\n")
                data = rest[nl + 1:] if nl >= 0 and not rest[:nl].strip() else rest.lstrip(b" \t")
                if not data:
                    raise ChError(108, "Code: 108. DB::Exception: No data to insert (NO_DATA_TO_INSERT)", 400)
                summary = gw.insert(m.group("target"), m.group("fmt"), data, database, settings)
                out = b""
            elif not text.strip():
                raise ChError(62, "Code: 62. DB::Exception: Empty query. (SYNTAX_ERROR)", 400)
            else:
                out, summary = self._query(text, fmt, database, settings)
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

    def _query(self, sql: str, fmt: str, database: str | None, settings: dict[str, str]) -> tuple[bytes, dict[str, Any]]:
        if not re.fullmatch(r"[A-Za-z0-9_]+", fmt):
            raise ChError(73, f"Code: 73. DB::Exception: Unknown format {fmt} (UNKNOWN_FORMAT)", 400)
        assert self.server.gateway is not None
        return self.server.gateway.execute(sql, fmt, database, settings)


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
