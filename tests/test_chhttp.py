"""The ClickHouse HTTP subset served from the embedded engine: clickhouse-connect (ClickHouseStore), raw HTTP (curl's
view), inserts with deduplication tokens reaching the rollups, compression, errors, authentication."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from forumpulse.pipeline.chhttp import ClickHouseHTTPServer, start_server
from forumpulse.pipeline.store import ClickHouseStore, Store, migrate

NO_TTL = {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0}


@pytest.fixture
def server(store: Store) -> Iterator[ClickHouseHTTPServer]:
    srv = start_server(store, port=0)
    yield srv
    srv.shutdown()
    srv.server_close()


def _http(srv: ClickHouseHTTPServer, params: dict[str, str] | None = None, body: bytes | None = None,
          headers: dict[str, str] | None = None, path: str = "/") -> tuple[int, bytes, Any]:
    url = f"http://127.0.0.1:{srv.port}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


def test_ping_and_get_query_in_default_and_named_formats(server: ClickHouseHTTPServer, store: Store) -> None:
    assert _http(server, path="/ping")[1] == b"Ok.\n"
    status, body, headers = _http(server, {"query": "SELECT number, number * 2 FROM numbers(3)"})
    assert status == 200 and body == b"0\t0\n1\t2\n2\t4\n"
    assert headers["X-ClickHouse-Timezone"] == "UTC" and "X-ClickHouse-Query-Id" in headers
    status, body, _ = _http(server, {"query": "SELECT 7 AS x", "default_format": "JSONEachRow"})
    assert json.loads(body) == {"x": 7}
    status, body, _ = _http(server, {"query": "SELECT 'a' AS s FORMAT CSV"})
    assert body == b'"a"\n'
    # the default database is the store's: its tables resolve unqualified
    status, body, _ = _http(server, {"query": "SELECT count() FROM requests"})
    assert status == 200 and body == b"0\n"
    status, body, _ = _http(server, {"query": "SELECT currentDatabase()", "database": "system"})
    assert body == b"system\n"
    status, body, _ = _http(server, {"query": "SELECT currentDatabase()"})
    assert body == store.database.encode() + b"\n"


def test_settings_apply_per_request_only(server: ClickHouseHTTPServer) -> None:
    _, body, _ = _http(server, {"query": "SELECT getSetting('max_block_size')", "max_block_size": "1234"})
    assert body == b"1234\n"
    _, body, _ = _http(server, {"query": "SELECT getSetting('max_block_size')"})
    assert body != b"1234\n"


def test_post_body_inline_insert_and_gzip(server: ClickHouseHTTPServer, store: Store) -> None:
    store.command("CREATE TABLE kv (k UInt32, v String) ENGINE = MergeTree ORDER BY k "
                  "SETTINGS non_replicated_deduplication_window = 100")
    status, _, _ = _http(server, body=b"INSERT INTO kv FORMAT TabSeparated\n1\ta\n2\tb\n")
    assert status == 200
    status, _, _ = _http(server, {"query": "INSERT INTO kv FORMAT CSV"}, body=gzip.compress(b'3,"c"\n'),
                         headers={"Content-Encoding": "gzip"})
    assert status == 200
    _, body, _ = _http(server, body=b"SELECT k, v FROM kv ORDER BY k FORMAT TSV")
    assert body == b"1\ta\n2\tb\n3\tc\n"
    # a repeated insert with the same token is stored once
    for _ in range(2):
        assert _http(server, {"query": "INSERT INTO kv FORMAT TSV", "insert_deduplication_token": "t1"},
                     body=b"9\tz\n")[0] == 200
    assert store.query_rows("SELECT count() FROM kv WHERE k = 9") == [(1,)]
    _, body, headers = _http(server, {"query": "SELECT k FROM kv ORDER BY k", "enable_http_compression": "1"},
                             headers={"Accept-Encoding": "gzip"})
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == b"1\n2\n3\n9\n"


def test_errors_are_clickhouse_style(server: ClickHouseHTTPServer) -> None:
    status, body, headers = _http(server, {"query": "SELECT * FROM no_such_table"})
    assert status == 404 and body.startswith(b"Code: 60.") and headers["X-ClickHouse-Exception-Code"] == "60"
    status, body, _ = _http(server, {"query": "SELEC 1"})
    assert status == 400 and body.startswith(b"Code: 62.")
    status, body, _ = _http(server, {"query": "SELECT {x:UInt8}", "param_x": "1"})
    assert status == 400 and b"not supported" in body
    # an unknown setting inside the query is the client's error, said once (it was a 500 with the prefix twice)
    status, body, _ = _http(server, {"query": "SELECT 1 SETTINGS no_such_setting_here = 1"})
    assert status == 400 and body.startswith(b"Code: 115. DB::Exception: ") and body.count(b"DB::Exception") == 1, body


def test_password_required_when_configured(store: Store) -> None:
    srv = start_server(store, port=0, password="s3cret")
    try:
        assert _http(srv, {"query": "SELECT 1"})[0] == 401
        assert _http(srv, {"query": "SELECT 1"}, headers={"X-ClickHouse-Key": "nope"})[0] == 403
        assert _http(srv, {"query": "SELECT 1"}, headers={"X-ClickHouse-Key": "s3cret"})[1] == b"1\n"
    finally:
        srv.shutdown()
        srv.server_close()


def test_clickhouse_connect_store_backend_against_the_engine(server: ClickHouseHTTPServer, store: Store) -> None:
    """ClickHouseStore (what production uses against a server) migrates, inserts Arrow with tokens, and the
    materialized views deduplicate a replayed block — through this endpoint."""
    db = store.database + "_cc"
    cs = ClickHouseStore(f"clickhouse://default@127.0.0.1:{server.port}/{db}")
    try:
        ran = migrate(cs, NO_TTL)
        assert [m.version for m in ran][:1] == [1]
        from forumpulse.pipeline.tables import REQUESTS_SCHEMA

        rows = []
        for i in range(50):
            rows.append({c.name: None for c in REQUESTS_SCHEMA} | {
                "ts": 1_700_000_000_000 + i * 1000, "site": "forum", "origin_host": "h", "origin_file": "f",
                "source_format": "combined", "client_ip": f"10.0.0.{i % 7}" if i % 2 else f"2001:db8::{i}",
                "client_host": "", "ident": "", "user": "", "method": "GET", "url": f"/t/{i}", "path": f"/t/{i}",
                "protocol": "HTTP/1.1", "status": 200, "bytes": 100 + i, "referer": "", "user_agent": "ua",
                "elapsed_ms": 1.5, "cache_result": "", "hierarchy": "", "upstream": "", "content_type": "",
                "vhost": "", "topic_id": i % 5, "page_kind": "topic_view", "is_static": False, "is_bot": False,
                "bot_name": ""})
        table = pa.Table.from_pylist(rows, schema=REQUESTS_SCHEMA)
        cs.insert("requests", table, dedup_token="batch-1")
        cs.insert("requests", table, dedup_token="batch-1")
        assert cs.query_rows("SELECT count(), sum(bytes) FROM requests") == [(50, sum(100 + i for i in range(50)))]
        assert cs.query_rows("SELECT sum(requests) FROM site_minute") == [(50,)]
        assert cs.query_rows("SELECT sum(requests) FROM client_minute") == [(50,)]
        assert cs.query_rows("SELECT sum(requests) FROM transfer_minute") == [(50,)]
        assert cs.query_rows("SELECT sum(views) FROM topic_minute") == [(40,)]
        # IPv4 stored IPv4-mapped, as with the embedded insert
        assert cs.query_rows("SELECT count() FROM requests WHERE client = '10.0.0.1'")[0][0] > 0
        at = cs.query_arrow("SELECT site, count() AS n FROM requests GROUP BY site")
        assert at.to_pylist() == [{"site": "forum", "n": 50}]
        # clickhouse-connect's default (Native) insert path and query path
        cl = cs._client
        cl.command("CREATE TABLE nat (a UInt32, s String, ip IPv6) ENGINE = MergeTree ORDER BY a")
        cl.insert("nat", [[1, "x", "::1"], [2, "y", "10.1.2.3"]], column_names=["a", "s", "ip"])
        assert [tuple(r) for r in cl.query("SELECT a, s, toString(ip) FROM nat ORDER BY a").result_rows] == [
            (1, "x", "::1"), (2, "y", "::ffff:10.1.2.3")]
        assert list(cl.query_df("SELECT a FROM nat ORDER BY a")["a"]) == [1, 2]
    finally:
        cs.close()


def _kv(store: Store, rows: str = "(1, 'a'), (2, 'b')") -> None:
    store.command("CREATE TABLE kv (k UInt32, v String) ENGINE = MergeTree ORDER BY k")
    store.command(f"INSERT INTO kv VALUES {rows}")


def _engine_readonly(store: Store) -> list[tuple[Any, ...]]:
    """readonly and current database of the one engine session, as the owner's own queries see them."""
    return store.query_rows("SELECT getSetting('readonly'), currentDatabase()")


def test_readonly_never_sticks_to_the_shared_engine_session(server: ClickHouseHTTPServer, store: Store) -> None:
    """A request's readonly (and SET/USE statements) must not outlive the request: the engine session is shared
    with the owner's loading, and ``SET readonly = 1`` on it could never be undone."""
    _kv(store)
    assert _http(server, {"query": "SELECT 1", "readonly": "1"})[:2] == (200, b"1\n")
    # the audit's reproduction: afterwards the owner's inserts failed with Code 164 until a restart
    assert _engine_readonly(store) == [(0, store.database)]
    store.insert("kv", pa.table({"k": pa.array([3], pa.uint32()), "v": ["owner"]}))
    assert _http(server, {"query": "INSERT INTO kv FORMAT TSV"}, body=b"4\tpost\n")[0] == 200
    store.command("DELETE FROM kv WHERE k > 2")
    # a POST readonly=1 reads, but refuses every write, inline or with a body, with ClickHouse's READONLY
    assert _http(server, {"query": "SELECT count() FROM kv", "readonly": "1"}, body=b"")[:2] == (200, b"2\n")
    for params, body in [({"query": "INSERT INTO kv VALUES (3, 'c')", "readonly": "1"}, b""),
                         ({"query": "INSERT INTO kv FORMAT TSV", "readonly": "1"}, b"4\td\n"),
                         ({"readonly": "1"}, b"INSERT INTO kv FORMAT TSV\n5\te\n"),
                         ({"query": "WITH 6 AS x INSERT INTO kv SELECT x, 'f'", "readonly": "1"}, b""),
                         ({"query": "DROP TABLE kv", "readonly": "2"}, b""),
                         ({"query": "SET max_threads = 1", "readonly": "1"}, b"")]:
        status, out, headers = _http(server, params, body=body)
        assert (status, headers["X-ClickHouse-Exception-Code"]) == (403, "164"), (params, out)
        assert out.startswith(b"Code: 164.") and b"readonly mode" in out
    # statements that would change the session are no-ops, as over ClickHouse's HTTP without a session
    for q in ("SET readonly = 1", "SET max_block_size = 1234", "USE system"):
        assert _http(server, {"query": q}, body=b"")[:2] == (200, b"")
    # …as is a second statement smuggled behind a first one (chDB itself would run both)
    for q in ("SELECT 1; SET readonly = 1", "SELECT 1;\nUSE system", "INSERT INTO kv VALUES (7, 'g'); SET readonly = 1"):
        status, out, _ = _http(server, {"query": q}, body=b"")
        assert status == 400 and out.startswith(b"Code: 62.") and b"Multi-statements" in out, q
    status, out, _ = _http(server, {"query": "INSERT INTO kv; SET readonly = 1; INSERT INTO kv FORMAT TSV"},
                           body=b"8\th\n")
    assert status == 400 and b"Multi-statements" in out
    assert _engine_readonly(store) == [(0, store.database)]
    # the owner keeps loading, and so do POST inserts
    store.insert("kv", pa.table({"k": pa.array([10], pa.uint32()), "v": ["owner"]}))
    assert _http(server, {"query": "INSERT INTO kv FORMAT TSV"}, body=b"11\tpost\n")[0] == 200
    assert _http(server, {"query": "INSERT INTO kv VALUES (12, 'inline')"}, body=b"")[0] == 200
    assert store.query_rows("SELECT k FROM kv ORDER BY k") == [(1,), (2,), (10,), (11,), (12,)]
    assert _http(server, {"query": "SELECT getSetting('readonly'), getSetting('max_block_size') = 1234"},
                 body=b"")[1] == b"0\t0\n"
    # GET runs with readonly=2 in the engine too (for that query only); a query cannot lower it
    assert _http(server, {"query": "SELECT getSetting('readonly')"})[1] == b"2\n"
    status, out, _ = _http(server, {"query": "SELECT count() FROM kv SETTINGS readonly = 0"})
    assert status == 403 and out.startswith(b"Code: 164.")
    assert _engine_readonly(store) == [(0, store.database)]
    # allow_ddl=0 refuses DDL, again without touching the session
    status, out, headers = _http(server, {"query": "CREATE TABLE nope (a UInt8) ENGINE = Memory", "allow_ddl": "0"},
                                 body=b"")
    assert status == 403 and headers["X-ClickHouse-Exception-Code"] == "392"
    assert _http(server, {"query": "CREATE TABLE yes (a UInt8) ENGINE = Memory"}, body=b"")[0] == 200
    assert store.query_rows("SELECT name FROM system.tables WHERE database = currentDatabase() "
                            "AND name IN ('nope', 'yes')") == [("yes",)]


GET_WRITES = [
    "DROP TABLE kv", "drop table kv", "  \n\tDROP TABLE kv", "/* a read */ DROP TABLE kv", "-- SELECT\nDROP TABLE kv",
    "/* nested /* comment */ SELECT */ DROP TABLE kv", "# SELECT\nDROP TABLE kv", "(DROP TABLE kv)",
    "DROP TABLE IF EXISTS kv", "TRUNCATE TABLE kv", "truncate kv", "INSERT INTO kv VALUES (9, 'x')",
    "insert into kv format TSV\n9\tx\n", "/* SELECT */ INSERT INTO kv VALUES (9, 'x')", "-- c\ninsert into kv select 9, 'x'",
    "WITH 9 AS n INSERT INTO kv SELECT n, 'x'", "CREATE TABLE made (a UInt8) ENGINE = Memory",
    "create table made engine = Memory as select 1 as a", "ALTER TABLE kv DELETE WHERE 1",
    "alter table kv add column z UInt8", "ALTER TABLE kv DROP COLUMN v", "RENAME TABLE kv TO kv2",
    "DELETE FROM kv WHERE 1", "OPTIMIZE TABLE kv FINAL", "SYSTEM DROP MARK CACHE", "DETACH TABLE kv",
    "SELECT * FROM kv INTO OUTFILE '{outfile}'", "select 1 into   outfile '{outfile}' format TSV",
    "KILL QUERY WHERE 1", "CREATE FUNCTION made_f AS (x) -> x", "FROM kv SELECT k INTO OUTFILE '{outfile}'",
]


def test_get_refuses_what_is_not_a_read(server: ClickHouseHTTPServer, store: Store, tmp_path: Any) -> None:
    """GET implies readonly (ClickHouse: readonly=2): DDL, DML and file writes are refused with READONLY and the
    data is unharmed — however the statement is dressed (case, whitespace, comments, parentheses, WITH)."""
    _kv(store)
    tables = store.query_rows("SHOW TABLES")
    outfile = tmp_path / "out.tsv"
    for sql in GET_WRITES:
        status, out, headers = _http(server, {"query": sql.format(outfile=outfile)})
        assert status == 403 and headers["X-ClickHouse-Exception-Code"] == "164", (sql, out)
        assert out.startswith(b"Code: 164. DB::Exception: Cannot execute query in readonly mode. For queries over "
                              b"HTTP, method GET implies readonly. You should use method POST for modifying queries")
        assert store.query_rows("SELECT k, v FROM kv ORDER BY k") == [(1, "a"), (2, "b")], sql
        assert store.query_rows("DESCRIBE TABLE kv")[:2] == [("k", "UInt32", "", "", "", "", ""),
                                                             ("v", "String", "", "", "", "", "")], sql
        assert len(store.query_rows("DESCRIBE TABLE kv")) == 2, sql
        assert store.query_rows("SHOW TABLES") == tables, sql
        assert not outfile.exists(), sql
    assert store.query_rows("SELECT count() FROM system.functions WHERE name = 'made_f'") == [(0,)]
    # the same statements over POST are not refused for being writes
    assert _http(server, {"query": "TRUNCATE TABLE kv"}, body=b"")[0] == 200
    assert store.query_rows("SELECT count() FROM kv") == [(0,)]


def test_get_runs_reads_however_written(server: ClickHouseHTTPServer, store: Store) -> None:
    _kv(store)
    tables = store.query_rows("SHOW TABLES")
    cases = {
        "SELECT k FROM kv ORDER BY k": b"1\n2\n",
        "  select k from kv order by k": b"1\n2\n",
        "/* dashboard */ SELECT count() FROM kv -- trailing": b"2\n",
        "-- panel\nselect count() from kv;": b"2\n",
        "(SELECT 1) UNION ALL (SELECT 2)": b"1\n2\n",
        "with n as (select count() as c from kv) select c from n": b"2\n",
        "FROM kv SELECT max(k)": b"2\n",
        "SELECT 'DROP TABLE kv; --' AS s": b"DROP TABLE kv; --\n",
        "SELECT 1 /* ; DROP TABLE kv */": b"1\n",
        "SELECT $$; DROP TABLE kv$$": b"; DROP TABLE kv\n",
        "SHOW TABLES": "".join(f"{t}\n" for (t,) in tables).encode(),
        "DESCRIBE TABLE kv": b"k\tUInt32\t\t\t\t\t\nv\tString\t\t\t\t\t\n",
        "desc kv": b"k\tUInt32\t\t\t\t\t\nv\tString\t\t\t\t\t\n",
        "EXISTS TABLE kv": b"1\n",
        "exists nope": b"0\n",
        "SELECT k FROM kv ORDER BY k FORMAT CSV": b"1\n2\n",
        "SELECT getSetting('max_threads') SETTINGS max_threads = 5": b"5\n",
        "SET max_threads = 1": b"",  # readonly=2: settings may change (a no-op without sessions)
    }
    unordered = {"(SELECT 1) UNION ALL (SELECT 2)"}  # UNION ALL branches run side by side: any row order
    for sql, want in cases.items():
        status, out, _ = _http(server, {"query": sql, "max_threads": "3"})
        if sql in unordered:
            out, want = b"".join(sorted(out.splitlines(keepends=True))), b"".join(sorted(want.splitlines(keepends=True)))
        assert (status, out) == (200, want), sql
    assert b"ReadFromMergeTree" in _http(server, {"query": "EXPLAIN SELECT * FROM kv"})[1]
    _, out, _ = _http(server, {"query": "SELECT k FROM kv ORDER BY k", "default_format": "JSONEachRow",
                               "max_block_size": "1"})
    assert [json.loads(x) for x in out.splitlines()] == [{"k": 1}, {"k": 2}]
    # a syntax error is still a syntax error; a second statement is refused before anything runs
    assert _http(server, {"query": "SELEC 1"})[0] == 400
    for q in ("SELECT 1; DROP TABLE kv", "SELECT 1 -- x\n; DROP TABLE kv", "SELECT 1e--5 ;DROP TABLE kv"):
        status, out, _ = _http(server, {"query": q})
        assert status == 400 and b"Multi-statements" in out, q
    assert store.query_rows("SELECT count() FROM kv") == [(2,)]


def test_settings_reach_every_statement_kind_for_that_query_only(server: ClickHouseHTTPServer, store: Store) -> None:
    """Request settings travel as the query's own SETTINGS clause, placed where each statement's grammar takes it
    (a CREATE TABLE's storage SETTINGS stay the table's)."""
    _kv(store)
    post = {"max_block_size": "4321", "max_threads": "1"}
    assert _http(server, {"query": "INSERT INTO kv (k, v) VALUES (getSetting('max_block_size'), 'values')", **post},
                 body=b"")[0] == 200
    assert _http(server, {"query": "INSERT INTO kv SELECT getSetting('max_block_size') + 1, 'select'", **post},
                 body=b"")[0] == 200
    assert store.query_rows("SELECT k, v FROM kv WHERE k > 4000 ORDER BY k") == [(4321, "values"), (4322, "select")]
    assert _http(server, {"query": "SELECT getSetting('max_block_size')", **post}, body=b"")[1] == b"4321\n"
    assert _http(server, {"query": "SELECT getSetting('max_block_size')"}, body=b"")[1] != b"4321\n"
    for q in ("CREATE TABLE t2 (a UInt8) ENGINE = MergeTree ORDER BY a",
              "CREATE TABLE t3 (a UInt8) ENGINE = MergeTree ORDER BY a SETTINGS index_granularity = 64",
              "ALTER TABLE t2 ADD COLUMN b UInt8", "DELETE FROM kv WHERE k = 4322", "SYSTEM FLUSH LOGS",
              "CHECK GRANT SELECT ON kv", "OPTIMIZE TABLE kv FINAL", "DROP TABLE t3"):
        status, out, _ = _http(server, {"query": q, **post}, body=b"")
        assert status == 200, (q, out)
    create = store.query_rows("SHOW CREATE TABLE t2")[0][0]
    assert "max_threads" not in create and "max_block_size" not in create and "`b` UInt8" in create
    assert store.query_rows("SELECT count() FROM kv WHERE k = 4322") == [(0,)]
    assert _engine_readonly(store) == [(0, store.database)]


def _raw(srv: ClickHouseHTTPServer, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is and end the upload (the client's half of the connection closes: a client that died
    mid-upload); the status and the response body."""
    import socket

    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def _chunked(*chunks: bytes, last: bool = True) -> bytes:
    return b"".join(b"%x\r\n" % len(c) + c + b"\r\n" for c in chunks) + (b"0\r\n\r\n" if last else b"")


def test_a_body_that_did_not_arrive_whole_is_refused_and_inserts_nothing(server: ClickHouseHTTPServer,
                                                                         store: Store) -> None:
    """A body shorter than its Content-Length, or a chunked body ending before its 0-chunk (or with a short or
    malformed chunk), is an error as in ClickHouse -- nothing stored: were the part that arrived stored under the
    request's insert_deduplication_token, the client's retry of the whole body would be dropped as a duplicate."""
    store.command("CREATE TABLE n (x UInt32) ENGINE = MergeTree ORDER BY x "
                  "SETTINGS non_replicated_deduplication_window = 100")
    full = b"".join(b"%d\n" % i for i in range(1000))
    part = full[:2000]  # cut at a line boundary: the part alone is a valid TSV body

    def post(token: str, head: bytes, body: bytes) -> tuple[int, bytes]:
        return _raw(server, b"POST /?query=INSERT%20INTO%20n%20FORMAT%20TSV&insert_deduplication_token=" +
                    token.encode() + b" HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + body)

    def count() -> int:
        return int(store.query_rows("SELECT count() FROM n")[0][0])

    status, out = post("a", b"Content-Length: %d\r\n" % len(full), part)
    assert status == 400 and out.startswith(b"Code: 33. DB::Exception: Unexpected EOF, got 2000 of 3890 bytes")
    assert count() == 0
    assert post("a", b"Content-Length: %d\r\n" % len(full), full)[0] == 200  # the retry is stored in full
    assert count() == 1000
    for token, body, code in (
        ("b", _chunked(part, last=False), b"Code: 3."),  # the connection dropped before the 0-chunk
        ("c", _chunked(part, last=False)[:-1], b"Code: 246."),  # ... inside a chunk's CRLF
        ("d", b"%x\r\n" % len(full) + part, b"Code: 3."),  # ... inside a chunk
        ("e", b"%x\r\n" % len(part) + part[:10], b"Code: 3."),
        ("f", _chunked(part)[:7], b"Code: 3."),  # inside the first chunk-size line
        ("g", b"zz\r\n" + part + b"\r\n0\r\n\r\n", b"Code: 246."),  # malformed chunk sizes: not a 500
        ("h", b"+7d0\r\n" + part + b"\r\n0\r\n\r\n", b"Code: 246."),
        ("i", b"\r\n" + _chunked(part), b"Code: 246."),
    ):
        status, out = post(token, b"Transfer-Encoding: chunked\r\n", body)
        assert status == 400 and out.startswith(code), (token, out)
        assert count() == 1000, token
    # a whole chunked body (extensions, trailers) is read as before; the full retry of "b" is not a duplicate
    body = b"7d0;ext=1\r\n" + part + b"\r\n" + _chunked(full[2000:])[:-2] + b"X-Trailer: 1\r\n\r\n"
    assert post("b", b"Transfer-Encoding: chunked\r\n", body)[0] == 200
    assert count() == 2000
    assert post("j", b"Content-Length: x1\r\n", full)[0] == 400 and count() == 2000


def test_a_body_over_the_limit_closes_the_connection(server: ClickHouseHTTPServer) -> None:
    """A body over the limit is refused unread (413) and the connection closed: its bytes are never parsed as a
    next request on a keep-alive connection (here they spell one, which must not be answered)."""
    import socket

    sneaked = b"GET /?query=SELECT%20424242 HTTP/1.1\r\nHost: x\r\n\r\n"
    for head in (b"Content-Length: %d\r\n" % ((1 << 31) + 1),
                 b"Transfer-Encoding: chunked\r\n"):
        body = sneaked if head.startswith(b"Content") else b"%x\r\n" % ((1 << 31) + 1) + sneaked
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
            s.sendall(b"POST /?query=INSERT%20INTO%20x%20FORMAT%20TSV HTTP/1.1\r\nHost: x\r\n" + head +
                      b"\r\n" + body)
            out = b""
            while chunk := s.recv(65536):  # the server closes: no timeout waiting for a second answer
                out += chunk
        assert out.startswith(b"HTTP/1.1 413") and out.count(b"HTTP/1.1 ") == 1 and b"424242" not in out, head


def test_the_querys_own_settings_win_over_the_requests(server: ClickHouseHTTPServer, store: Store) -> None:
    """As in ClickHouse (URL parameters are the request's settings; the query's SETTINGS clause is applied after
    them): for an INSERT with data and for a query."""
    store.command("CREATE TABLE s (x UInt32) ENGINE = MergeTree ORDER BY x "
                  "SETTINGS non_replicated_deduplication_window = 100")
    for url_token in ("u1", "u2"):  # the same token in the query, different ones in the URL: stored once
        q = "INSERT INTO s SETTINGS insert_deduplication_token = '{}' FORMAT TSV"
        assert _http(server, {"query": q.format("q1"), "insert_deduplication_token": url_token},
                     body=b"1\n")[0] == 200  # the query in the URL, the data in the body
        assert _http(server, {"insert_deduplication_token": url_token},
                     body=f"{q.format('q2')}\n2\n".encode())[0] == 200  # query and data in the body
    assert store.query_rows("SELECT x, count() FROM s GROUP BY x ORDER BY x") == [(1, 1), (2, 1)]
    _, out, _ = _http(server, {"query": "SELECT getSetting('max_block_size') SETTINGS max_block_size = 111",
                               "max_block_size": "222"})
    assert out == b"111\n"


def test_a_store_gone_away_raises_one_error_without_the_drivers_log_lines(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The server stops answering after the store was opened (a ClickHouse restart; user trial 43: the owner's
    unban sync every 10 s): each query raises StoreError with the cause, and neither clickhouse-connect's
    "Unexpected Http Driver Exception" nor urllib3's "Retrying (...)" is logged beside it; other warnings of
    those libraries still are."""
    import logging

    import clickhouse_connect.driver._backend.http_sync as http_sync
    from forumpulse.pipeline.store import _NOISY_LOGGERS, StoreError

    assert http_sync.logger.name in _NOISY_LOGGERS  # the driver still logs under the name the filter is on
    srv = start_server(store, port=0)
    cs = ClickHouseStore(f"clickhouse://default@127.0.0.1:{srv.port}/{store.database}")
    assert cs.query_rows("SELECT 1") == [(1,)]
    srv.shutdown()
    srv.server_close()
    cs._client.http.clear()  # type: ignore[attr-defined]  # its kept-alive connection would still be served
    caplog.set_level(logging.DEBUG)
    from forumpulse.pipeline.runtime import error_line

    for _ in range(3):
        with pytest.raises(StoreError, match=r"(?i)connection|refused") as err:
            cs.query_rows("SELECT 1")
    # the cause within a log line's 200 characters: the request's query string and urllib3 reprs are cut out
    assert "Connection refused" in error_line(err.value), error_line(err.value)
    assert "date_time_input_format" not in str(err.value) and "object at 0x" not in str(err.value)
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "Unexpected Http Driver Exception" in m or m.startswith("Retrying (")], said
    logging.getLogger("urllib3.connectionpool").warning("Connection pool is full, discarding connection: x")
    assert "Connection pool is full" in caplog.text
