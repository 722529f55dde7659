"""The vectorised fast path gives the same tables as the per-line reference path (``process_reference``).

Compared: ``requests`` and ``stream`` (``pa.Table.equals`` and the Arrow IPC bytes), ``quarantine`` (all columns
but the wall-clock ``ingested_at``), counts, reasons, ``newest_ts``, the enricher's empty-UA counter and, for
``auto``, the parser's preset state after the call (it carries over to the next call).  Every comparison also
checks that the fast path really handled lines (``FastPath.last_fast_rows``), so a silent fall-back to the
reference could not make these tests pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute
import pytest
from forumpulse.pipeline.config import Settings, load_settings
from forumpulse.pipeline.fastpath import plan_for_spec, squid_plan
from forumpulse.pipeline.formats import PRESETS
from forumpulse.pipeline.process import ProcessedBatch, Processor, SourceContext

FIX = Path(__file__).parent / "fixtures"
FIXTURE_LOGS = [
    FIX / "fastpath" / "elastic_apache_1000.log",
    FIX / "ingest" / "mixed.log",
    FIX / "parse" / "NASA_access_log_Aug95.partial_damaged.log",
    FIX / "conformance" / "plaso_apache_access.log",
    FIX / "conformance" / "plaso_squid_access.log",
    *sorted((FIX / "dos").glob("*.log")),
]
FORMATS = [*PRESETS, "auto"]
#: formats the fast path must take
FAST_FORMATS = list(PRESETS)


def _settings(mode: str = "keep") -> Settings:
    s = load_settings()
    s.retention.raw_days = 0
    s.privacy.client_ip = mode  # type: ignore[assignment]
    if mode == "pseudonymize":
        from pydantic import SecretStr

        s.privacy.pseudonym_key = SecretStr("test-key-fastpath")
    return s


def _ipc(t: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue().to_pybytes()


def assert_same(fast: ProcessedBatch, ref: ProcessedBatch) -> None:
    assert fast.requests.schema == ref.requests.schema
    assert fast.requests.equals(ref.requests), _first_diff(fast.requests, ref.requests)
    assert fast.stream.equals(ref.stream), _first_diff(fast.stream, ref.stream)
    assert _ipc(fast.requests) == _ipc(ref.requests), "same values but different Arrow bytes"
    fq, rq = (b.quarantine.drop_columns(["ingested_at"]) for b in (fast, ref))
    assert fq.equals(rq), _first_diff(fq, rq)
    assert (fast.read, fast.loaded, fast.quarantined) == (ref.read, ref.loaded, ref.quarantined)
    assert fast.by_reason == ref.by_reason
    assert fast.newest_ts == ref.newest_ts


def _first_diff(a: pa.Table, b: pa.Table) -> str:
    if a.num_rows != b.num_rows:
        return f"rows {a.num_rows} != {b.num_rows}"
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        for i, (u, v) in enumerate(zip(x, y, strict=True)):
            if u != v:
                return f"column {name} row {i}: fast {u!r} reference {v!r}"
    return "tables differ (types or chunking)"


def run_both(fast_p: Processor, ref_p: Processor, lines: list[bytes], ctx: SourceContext,
             base: int = 0) -> tuple[ProcessedBatch, ProcessedBatch]:
    fast = fast_p.process(lines, ctx, line_no_base=base, source_ref="t")
    ref = ref_p.process_reference(lines, ctx, line_no_base=base, source_ref="t")
    assert_same(fast, ref)
    assert fast_p.enricher.empty_user_agents == ref_p.enricher.empty_user_agents
    if ctx.format == "auto":
        assert fast_p.parser("auto")._last == ref_p.parser("auto")._last  # type: ignore[attr-defined]
    return fast, ref


@pytest.fixture(scope="module")
def pair() -> tuple[Processor, Processor]:
    s = _settings()
    return Processor(s), Processor(s)


def test_every_preset_has_a_plan_and_its_regex_compiles_in_re2():
    for name in FAST_FORMATS:
        plan = squid_plan(name) if PRESETS[name] == "squid:native" else plan_for_spec(PRESETS[name], name)
        assert plan is not None, name
        pa.compute.match_substring_regex(pa.array(["x"]), plan.regex)


@pytest.mark.parametrize("path", FIXTURE_LOGS, ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", FORMATS)
def test_fixture_logs_give_identical_tables(pair, path, fmt):
    fast_p, ref_p = pair
    lines = path.read_bytes().splitlines(keepends=True)
    assert lines, f"fixture missing or empty: {path}"
    ctx = SourceContext(site="forum", origin_host="web1", origin_file=path.name, format=fmt)
    run_both(fast_p, ref_p, lines, ctx, base=7)
    if fmt in ("combined", "auto", "nginx_combined") and path.name.startswith("elastic"):
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows > 900
    if fmt in ("squid", "auto") and path.name == "plaso_squid_access.log":
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows >= 5


@pytest.mark.parametrize("fmt", ["vhost_combined", "combined", "auto", "squid"])
def test_a_byte_order_mark_gives_the_same_rows_on_both_paths(pair, fmt):
    """A file's first line may open with a UTF-8 byte order mark: the reference drops it (decode_line), so the fast
    path must not take that line (a vhost-first format stored the vhost with the mark; from a review)."""
    fast_p, ref_p = pair
    vc = (b'forum.example.org:443 203.0.113.5 - - [10/Mar/2024:14:02:11 +0000] "GET /t/1 HTTP/1.1" 200 10 "-" '
          b'"Mozilla/5.0"\n')
    lines = {"vhost_combined": vc, "combined": vc.split(b" ", 1)[1], "auto": vc,
             "squid": b"1710079331.123    42 203.0.113.5 TCP_MISS/200 1024 GET http://f.example/t/1 - "
                      b"HIER_DIRECT/10.0.0.1 text/html\n"}[fmt]
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="b.log", format=fmt)
    fast, _ref = run_both(fast_p, ref_p, [b"\xef\xbb\xbf" + lines] + [lines] * 40, ctx)
    assert fast.quarantine.num_rows == 0 and fast.requests.num_rows == 41


def test_nginx_upstream_lists_take_the_fast_path_with_the_reference_results(pair):
    fast_p, ref_p = pair
    fmt = ('nginx:$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
           '"$http_user_agent" $request_time $upstream_response_time $upstream_addr $upstream_status $host')
    head = '203.0.113.5 - - [10/Mar/2024:14:02:11 +0100] "GET /t/1 HTTP/1.1" 200 5123 "-" "Mozilla/5.0" 0.523 '
    tails = ["0.500, 0.020 10.0.0.1:80, 10.0.0.2:80 502, 200 f.example", "0.020 10.0.0.1:80 200 f.example",
             "0.020 : 0.001 10.0.0.1:80 : unix:/run/php.sock 200 : 404 f.example", "- - - f.example"]
    lines = [(head + t + "\n").encode() for t in tails] * 50
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="n.log", format=fmt)
    run_both(fast_p, ref_p, lines, ctx, base=0)
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 100  # the lists take the reference path


@pytest.mark.parametrize("mode", ["truncate", "pseudonymize"])
def test_privacy_modes_keep_real_addresses_in_the_stream_only(mode):
    s = _settings(mode)
    fast_p, ref_p = Processor(s), Processor(s)
    lines = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes().splitlines(keepends=True)
    lines += (FIX / "ingest" / "mixed.log").read_bytes().splitlines(keepends=True)
    fast, _ = run_both(fast_p, ref_p, lines, SourceContext(format="combined"))
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows > 900
    stored = fast.requests.column("client_ip").to_pylist()
    real = fast.stream.column("client_ip").to_pylist()
    assert stored != real and real[0] == "83.149.9.216"


def test_chunks_carry_auto_state_like_the_reference(pair):
    fast_p, ref_p = pair
    combined = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes().splitlines(keepends=True)[:50]
    squid = (FIX / "conformance" / "plaso_squid_access.log").read_bytes().splitlines(keepends=True)
    nasa = (FIX / "parse" / "NASA_access_log_Aug95.partial_damaged.log").read_bytes().splitlines(keepends=True)
    seq = combined[:20] + squid + combined[20:] + nasa[:200] + combined[:5]
    ctx = SourceContext(format="auto")
    for i in range(0, len(seq), 37):
        run_both(fast_p, ref_p, seq[i:i + 37], ctx, base=i)


def test_str_lines_and_crlf_and_invalid_utf8(pair):
    fast_p, ref_p = pair
    base = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes().splitlines(keepends=False)[:30]
    lines = [b + b"\r\n" for b in base[:10]] + [b + b"\r" for b in base[10:13]] + [b + b"\n\n" for b in base[13:15]]
    lines += [base[15][:40] + b"\xff\xfe" + base[15][40:] + b"\n", base[16]]  # invalid UTF-8, no newline
    ctx = SourceContext(format="combined")
    run_both(fast_p, ref_p, lines, ctx)
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 10 + 1
    text = [x.decode("utf-8", "backslashreplace") for x in lines]
    fast = fast_p.process(text, ctx)  # str lines: reference path, same answer
    ref = ref_p.process_reference(text, ctx)
    assert_same(fast, ref)


def test_over_long_lines_and_numbers_take_the_reference_path():
    s = _settings()
    s.ingest.max_line_bytes = 300
    fast_p, ref_p = Processor(s), Processor(s)
    ok = b'1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /x HTTP/1.1" 200 12 "-" "curl/8"\n'
    lines = [
        ok,
        ok.replace(b"/x", b"/" + b"a" * 400),  # line_too_long
        ok.replace(b"/x", b"/" + b"a" * 60),  # fine for a fixed format, too long for auto's fast branch
        ok.replace(b" 200 ", b" 1234 "),  # status > 999
        ok.replace(b" 12 ", b" " + b"9" * 19 + b" "),  # bytes > 2**62
        ok.replace(b" 12 ", b" " + b"9" * 18 + b" "),  # 18 digits: still fine
        ok.replace(b"Oct", b"Foo"),  # bad timestamp
        ok.replace(b"1.2.3.4", b"1.2.3.4.5.6:::"),  # bad client
    ]
    for fmt in ("combined", "auto"):
        run_both(fast_p, ref_p, lines, SourceContext(format=fmt))


def _conformance_custom_specs() -> list[tuple[str, list[bytes]]]:
    out: dict[str, list[bytes]] = {}
    for line in (FIX / "conformance" / "apachelogs_cases.jsonl").read_text().splitlines():
        case = json.loads(line)
        fmt = case.get("apache_logformat")
        if fmt:
            out.setdefault("apache:" + fmt, []).append(case["line"].encode("utf-8", "surrogateescape"))
    return sorted(out.items())


def test_conformance_cases_with_their_own_logformats(pair):
    fast_p, ref_p = pair
    specs = _conformance_custom_specs()
    assert len(specs) > 5
    planned = 0
    for spec, lines in specs:
        try:
            run_both(fast_p, ref_p, lines, SourceContext(format=spec))
        except ValueError:  # a LogFormat the parser itself rejects (no time directive): reference raises too
            with pytest.raises(ValueError):
                ref_p.process_reference(lines, SourceContext(format=spec))
            continue
        planned += fast_p._fast is not None and fast_p._fast.plan(spec) is not None
    assert planned >= 3


def test_conformance_lines_of_every_source_in_every_format(pair):
    fast_p, ref_p = pair
    lines: list[bytes] = []
    for f in sorted((FIX / "conformance").glob("*.jsonl")):
        for row in f.read_text().splitlines():
            lines.append(json.loads(row)["line"].encode("utf-8", "surrogateescape") + b"\n")
    assert len(lines) > 200
    for fmt in FORMATS:
        run_both(fast_p, ref_p, lines, SourceContext(format=fmt))


@pytest.mark.parametrize("mode", ["keep", "truncate"])
def test_block_input_and_pickled_batches_are_the_same(mode):
    import pickle

    s = _settings(mode)
    fast_p, ref_p = Processor(s), Processor(s)
    data = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes()[:50_000]
    data += (FIX / "ingest" / "mixed.log").read_bytes() + b"no newline at the end"
    lines = data.split(b"\n")
    lines = [x + b"\n" for x in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    ctx = SourceContext(format="combined")
    block = fast_p.process_block(data, ctx, line_no_base=3, source_ref="t")
    ref = ref_p.process_reference(lines, ctx, line_no_base=3, source_ref="t")
    assert_same(block, ref)
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows > 100
    again = pickle.loads(pickle.dumps(block))
    assert_same(again, ref)
    assert again.stream.schema == ref.stream.schema
    assert fast_p.process_block(b"", ctx).read == 0


def test_block_chunks_cut_at_newlines_into_fixed_line_counts():
    import io

    from forumpulse.pipeline.bench_ingest import block_chunks

    data = b"".join(b"line %d\n" % i for i in range(1000)) + b"last without newline"
    chunks = list(block_chunks(io.BytesIO(data), 64, read_bytes=300))
    assert b"".join(chunks) == data
    counts = [c.count(b"\n") for c in chunks]
    assert counts[:-1] == [64] * (len(chunks) - 1)
    assert all(c.endswith(b"\n") for c in chunks[:-1])
    assert chunks[-1].endswith(b"last without newline")


@pytest.mark.parametrize("fmt", ["combined", "auto"])
def test_quarantined_raw_loses_exactly_one_line_end(pair, fmt):
    """A quarantined line's ``raw`` is the line without one trailing ``\\n`` or ``\\r\\n`` -- the documented line
    end (``decode_line``, ``split_raw``) -- and nothing more: a lone ``\\r``, a second ``\\r`` or ``\\n`` are the
    line's own bytes; the same on the fast path (a list and a block) and on the reference path."""
    fast_p, ref_p = pair
    ok = b'1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /x HTTP/1.1" 200 12 "-" "curl/8"\n'
    cases = [(b"garbage line\r", b"garbage line\r"), (b"another bad one\r\r", b"another bad one\r\r"),
             (b"x\r\r\n", b"x\r"), (b"y\n\n", b"y\n"), (b"z\r\n", b"z"), (b"w\n", b"w"), (b"\r", b"\r"),
             (b"v", b"v"), (b"u\n\r\n", b"u\n")]
    lines = [ok] + [c[0] for c in cases]
    ctx = SourceContext(format=fmt)
    fast, _ref = run_both(fast_p, ref_p, lines, ctx)
    if fmt == "combined":  # the fast path ran (auto may leave so few good lines to the reference path)
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows >= 1
    assert fast.quarantine.column("raw").to_pylist() == [c[1] for c in cases]
    # a block (lines split after every "\n", the file readers' input) keeps the same rule
    block_lines = [b"bad\r\n", b"bad\r\r\n", b"bad\r"]
    block = fast_p.process_block(b"".join([ok, *block_lines]), ctx)
    assert block.quarantine.column("raw").to_pylist() == [b"bad", b"bad\r", b"bad\r"]


SQUID_LINE = (b"1677971735.123  567 192.168.1.100 TCP_MISS/200 5432 GET http://example.com/index.html user1"
              b" HIER_DIRECT/93.184.216.34 text/html")


@pytest.mark.parametrize("fmt", ["squid", "auto"])
def test_chunks_of_only_empty_lines_in_squid_format(pair, fmt):
    """Squid tokens are found across the whole buffer, so a squid line is taken only when the byte before its
    start is a ``\\n``.  A line at offset 0 behind empty lines has no byte before it: the check read
    ``buf[-1]`` -- an IndexError when every line is empty (a consumer batch of such lines failed), else the
    buffer's last byte, which sent a good line to the reference path when the chunk did not end in ``\\n``."""
    fast_p, ref_p = pair
    for lines in ([b"", b""], [b"", b"", b""], [b"", b"\n"]):
        run_both(fast_p, ref_p, lines, SourceContext(format=fmt))


def test_squid_line_after_empty_lines_takes_the_fast_path(pair):
    """The same line at offset 0 in a chunk that does not end in ``\\n``: the fast path takes it (it read the
    chunk's last byte and left the line to the reference -- same values, but a silent fall-back).  Format
    ``squid`` only: under ``auto`` the first line's path depends on the parser state left by earlier calls."""
    fast_p, ref_p = pair
    fmt = "squid"
    for lines in ([b"", SQUID_LINE], [b"", b"", SQUID_LINE + b"\n", b"trailing junk"]):
        fast, _ = run_both(fast_p, ref_p, lines, SourceContext(format=fmt))
        assert fast.loaded == 1
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 1, lines
    # still refused when an earlier line left an unfinished token, also across empty and blanked lines
    for lines in ([b"1677971734.079", b"", SQUID_LINE], [b"junk", b"bad \xff utf-8\n", b"", SQUID_LINE + b"\n"]):
        run_both(fast_p, ref_p, lines, SourceContext(format=fmt))
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 0, lines


@pytest.mark.parametrize("engines", [["xenforo"], ["invision"]])
def test_index_php_routes_after_a_bare_index_php_on_both_paths(engines):
    """A bare ``/index.php`` (or ``/index.php?foo=1``) before ``/index.php?<route>``: the enricher cached the bare
    page's ``other`` by path and gave it to every later route on the reference path, while the fast path (cached
    per request line) classified the route -- the paths differed and the topic views were lost."""
    s = _settings()
    s.sites = Settings(sites=[{"name": "f", "engines": engines}]).sites
    route = "threads/hello.123/" if engines == ["xenforo"] else "/topic/123-hello/"

    def line(req: str) -> bytes:
        return (f'203.0.113.5 - - [14/Nov/2023:22:13:27 +0000] "GET {req} HTTP/1.1" 200 512 "-" '
                f'"Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"\n').encode()

    lines = [line(f"/index.php?{route}"), line("/index.php"), line("/index.php?foo=1"), line(f"/index.php?{route}"),
             line(f"/forum/index.php?{route}&s=1")]
    fast_p, ref_p = Processor(s), Processor(s)
    ctx = SourceContext(site="f", format="combined")
    for _ in range(2):  # second batch: warm caches on both paths
        _, ref = run_both(fast_p, ref_p, lines, ctx)
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows == len(lines)
        assert ref.requests.column("topic_id").to_pylist() == [123, 0, 0, 123, 123]
        assert ref.requests.column("page_kind").to_pylist() == ["topic_view", "other", "other", "topic_view",
                                                               "topic_view"]


def test_reply_forms_and_head_requests_are_classified_alike_on_both_paths():
    """Reply forms (GET) are ``other``, their submissions (POST) replies, and a HEAD or OPTIONS of a topic is not a
    view -- on the fast path as on the reference path (the method is part of the request line both cache by)."""
    s = _settings()

    def line(req: str) -> bytes:
        return (f'203.0.113.5 - - [14/Nov/2023:22:13:27 +0000] "{req} HTTP/1.1" 200 512 "-" '
                f'"Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"\n').encode()

    reqs = ["GET /posting.php?mode=reply&f=2&t=123", "POST /posting.php?mode=reply&f=2&t=123",
            "GET /index.php?action=post;topic=7.0", "POST /index.php?action=post2;topic=7.0",
            "HEAD /threads/a.9/", "GET /threads/a.9/", "OPTIONS /threads/a.9/", "HEAD /viewtopic.php?t=5"]
    fast_p, ref_p = Processor(s), Processor(s)
    _, ref = run_both(fast_p, ref_p, [line(r) for r in reqs], SourceContext(format="combined"))
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == len(reqs)
    assert ref.requests.column("page_kind").to_pylist() == ["other", "reply", "other", "reply", "other", "topic_view",
                                                            "other", "other"]
    assert ref.requests.column("topic_id").to_pylist() == [123, 123, 7, 7, 9, 9, 9, 5]


#: (method, request target, status, expected page_kind): topic views count only for 2xx / 304 (a redirect, a 404 or
#: a 5xx of a topic URL is ``other``), replies below 400 (POST-redirect-GET 302/303 stay replies); an unknown
#: status (``-``: 0) keeps the kind; the topic is kept in every case
_STATUS_CASES = [
    ("GET", "/threads/a.9/", "200", "topic_view"), ("GET", "/threads/a.9/", "304", "topic_view"),
    ("GET", "/threads/a.9/", "301", "other"), ("GET", "/threads/a.9/", "302", "other"),
    ("GET", "/threads/a.9/", "404", "other"), ("GET", "/threads/a.9/", "500", "other"),
    ("GET", "/threads/a.9/", "206", "topic_view"), ("GET", "/threads/a.9/", "-", "topic_view"),
    ("GET", "/viewtopic.php?t=5", "404", "other"), ("GET", "/viewtopic.php?t=5", "200", "topic_view"),
    ("POST", "/threads/a.9/add-reply", "200", "reply"), ("POST", "/threads/a.9/add-reply", "302", "reply"),
    ("POST", "/threads/a.9/add-reply", "303", "reply"), ("POST", "/threads/a.9/add-reply", "403", "other"),
    ("POST", "/threads/a.9/add-reply", "500", "other"), ("POST", "/threads/a.9/add-reply", "-", "reply"),
    ("POST", "/posting.php?mode=reply&f=2&t=5", "403", "other"),
    ("POST", "/posting.php?mode=reply&f=2&t=5", "302", "reply"),
    ("GET", "/forums/news.2/", "404", "forum"), ("GET", "/threads/a.9/", "200", "topic_view"),
]


@pytest.mark.parametrize("fmt", ["combined", "auto", "squid"])
def test_topic_views_and_replies_depend_on_the_status_alike_on_both_paths(fmt):
    """A redirect (XenForo /threads/123 -> /threads/slug.123/), 404 or 5xx of a topic URL is not a topic view and a
    failed POST is not a reply -- on the fast path (cached per request line, status applied on the rows) exactly as
    on the reference path; the same request line with several statuses in one batch, warm caches on a second."""

    def line(method: str, target: str, status: str) -> bytes:
        if fmt == "squid":
            st = "0" if status == "-" else status
            return (f"1700000000.123    120 203.0.113.5 TCP_MISS/{st} 512 {method} http://forum.example{target} - "
                    f"HIER_DIRECT/198.51.100.7 text/html\n").encode()
        return (f'203.0.113.5 - - [14/Nov/2023:22:13:27 +0000] "{method} {target} HTTP/1.1" {status} 512 "-" '
                f'"Mozilla/5.0 (X11; Linux x86_64; rv:125.0) Gecko/20100101 Firefox/125.0"\n').encode()

    lines = [line(m, t, st) for m, t, st, _ in _STATUS_CASES]
    fast_p, ref_p = Processor(_settings()), Processor(_settings())
    ctx = SourceContext(format=fmt)
    for _ in range(2):
        _, ref = run_both(fast_p, ref_p, lines, ctx)
        # (auto: the first line of the first batch picks the preset on the reference path)
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows >= len(lines) - (fmt == "auto")
        assert ref.requests.column("page_kind").to_pylist() == [k for *_, k in _STATUS_CASES]
        topics = ref.requests.column("topic_id").to_pylist()
        assert topics == [9 if "a.9" in t else 5 if "t=5" in t else 0 for _, t, _, _ in _STATUS_CASES]


def test_apache_balancer_worker_takes_the_fast_path_with_the_reference_results(pair):
    """%{BALANCER_WORKER_NAME}e (an Apache reverse proxy's backend) fills ``upstream`` on both paths alike."""
    fast_p, ref_p = pair
    fmt = 'apache:%a %t "%r" %>s %B %D "%{BALANCER_WORKER_NAME}e"'
    lines = [b'203.0.113.5 [10/Mar/2024:14:02:11 +0100] "GET /t/1 HTTP/1.1" 200 5000000 812000 '
             b'"http://10.0.0.5:8080"\n',
             b'203.0.113.6 [10/Mar/2024:14:02:12 +0100] "GET /a.css HTTP/1.1" 200 10 90 "-"\n'] * 50
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="p.log", format=fmt)
    fast, _ = run_both(fast_p, ref_p, lines, ctx, base=0)
    assert fast.requests.column("upstream").to_pylist()[:2] == ["http://10.0.0.5:8080", None]
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 100
