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
