"""Presets, custom Apache/nginx formats, squid native, auto-detection and real-log robustness."""

from __future__ import annotations

from pathlib import Path

import pytest
from forumpulse.pipeline.formats import PRESETS, get_parser, parse_lines
from forumpulse.pipeline.record import Drop, ParsedLine

COMBINED = ('127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /t/123?page=2 HTTP/1.1" 200 2326 '
            '"http://example.com/" "Mozilla/5.0"')
TS = 971211336000  # 2000-10-10T20:55:36Z


def ok(spec: str, line: str) -> ParsedLine:
    r = get_parser(spec).parse(line)
    assert isinstance(r, ParsedLine), r
    return r


def drop(spec: str, line: str) -> str:
    r = get_parser(spec).parse(line)
    assert isinstance(r, Drop), r
    assert "parser error" not in r.detail
    return r.reason


def test_presets_exist() -> None:
    for name in ("common", "combined", "vhost_combined", "combined_d", "nginx_combined", "squid", "squid_combined"):
        assert name in PRESETS
        assert get_parser(name).name == name


def test_combined_fields() -> None:
    r = ok("combined", COMBINED)
    assert r == ParsedLine(TS, "127.0.0.1", None, None, "frank", "GET", "/t/123?page=2", "/t/123", "page=2",
                           "HTTP/1.1", 200, 2326, "http://example.com/", "Mozilla/5.0", None, None, None, None,
                           None, None)


def test_combined_d_and_vhost() -> None:
    r = ok("combined_d", COMBINED + " 1500")
    assert r.elapsed_ms == 1.5
    r = ok("vhost_combined", "forum.example:443 " + COMBINED)
    assert r.vhost == "forum.example" and r.client_ip == "127.0.0.1"


def test_nginx_combined_and_custom_nginx() -> None:
    assert ok("nginx_combined", COMBINED).status == 200
    spec = ('nginx:$remote_addr [$time_iso8601] $host "$request" $status $bytes_sent $request_time '
            '$upstream_addr "$http_user_agent"')
    r = ok(spec, '2001:db8::1 [2024-01-02T03:04:05+01:00] f.example "POST /x HTTP/2.0" 201 99 0.250 '
                 '10.0.0.2:8080 "curl/8"')
    assert (r.ts, r.client_ip, r.vhost, r.method, r.status, r.bytes, r.elapsed_ms, r.upstream, r.user_agent) == (
        1704161045000, "2001:db8::1", "f.example", "POST", 201, 99, 250.0, "10.0.0.2:8080", "curl/8")
    r = ok("nginx:$msec $remote_addr $request_method $request_uri $status", "1700000000.123 1.2.3.4 GET /a?b=1 404")
    assert (r.ts, r.path, r.query, r.status, r.upstream) == (1700000000123, "/a", "b=1", 404, None)


def test_nginx_upstream_variables_may_hold_lists() -> None:
    """nginx writes one value per upstream server it tried (", ") and per upstream group after an internal
    redirect (" : "): a line with a retried request is a normal line, not quarantined."""
    spec = ('nginx:$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
            '"$http_user_agent" $request_time $upstream_response_time $upstream_addr $upstream_status $host')
    head = '203.0.113.5 - - [10/Mar/2024:14:02:11 +0100] "GET /t/1 HTTP/1.1" 200 5123 "-" "Mozilla/5.0" 0.523 '
    r = ok(spec, head + "0.500, 0.020 10.0.0.1:80, 10.0.0.2:80 502, 200 forum.example.org")
    assert (r.status, r.elapsed_ms, r.upstream, r.vhost) == (200, 523.0, "10.0.0.1:80, 10.0.0.2:80",
                                                             "forum.example.org")
    r = ok(spec, head + "0.020 : 0.001 10.0.0.1:80 : unix:/run/php.sock 200 : 404 forum.example.org")
    assert (r.upstream, r.vhost) == ("10.0.0.1:80 : unix:/run/php.sock", "forum.example.org")
    r = ok(spec, head + "- - - forum.example.org")
    assert (r.upstream, r.vhost) == (None, "forum.example.org")


def test_a_long_line_of_upstream_lists_that_fails_does_not_hang_the_parser() -> None:
    """A damaged line with a long run of " : " list items used to make the regexes backtrack on every way of
    splitting it between the list fields (8 s for a 20 kB line, minutes at the 64 kB limit; from a review).  Not a
    speed target: a subprocess that must finish at all within a generous bound."""
    import subprocess
    import sys

    code = ("from forumpulse.pipeline.formats import get_parser\n"
            "spec = ('nginx:$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent '\n"
            "        '\"$http_referer\" \"$http_user_agent\" $request_time $upstream_response_time $upstream_addr '\n"
            "        '$upstream_status $host')\n"
            "head = '203.0.113.5 - - [10/Mar/2024:14:02:11 +0100] \"GET /t/1 HTTP/1.1\" 200 5123 \"-\" \"M\" 0.5 '\n"
            "r = get_parser(spec, max_line_bytes=1 << 20).parse(head + ' : '.join(['0.001'] * 12000) + ' a\\tb')\n"
            "print(type(r).__name__, getattr(r, 'reason', ''))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("Drop"), r.stdout + r.stderr


def test_apache_directives() -> None:
    fmt = 'apache:%a %{%Y-%m-%d %H:%M:%S}t.%{msec_frac}t %m %U%q %H %>s %B %{ms}T %v %{Content-Type}o %X %{foo}n'
    r = ok(fmt, "10.1.2.3 2019-05-05 20:49:14.690 GET /a/b?x=1 HTTP/1.0 302 10 42 v.example text/html + zz")
    assert (r.ts, r.method, r.url, r.path, r.query, r.protocol, r.status, r.bytes, r.elapsed_ms, r.vhost,
            r.content_type) == (1557089354690, "GET", "/a/b?x=1", "/a/b", "x=1", "HTTP/1.0", 302, 10, 42.0,
                                "v.example", "text/html")
    r = ok('apache:%h %t "%r" %s %>s %b %T %% %{us}T', '1.2.3.4 [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" '
                                                   '301 200 - 2 % 2100000')
    assert (r.status, r.bytes, r.elapsed_ms) == (200, 0, 2100.0)


def test_apache_balancer_worker_is_the_upstream() -> None:
    """An Apache reverse proxy logs the backend mod_proxy_balancer chose with %{BALANCER_WORKER_NAME}e: it is the
    upstream the transfer and latency detectors key on ("-" when the request was not proxied); another environment
    variable is not."""
    fmt = 'apache:%a %t "%r" %>s %B %D "%{BALANCER_WORKER_NAME}e" "%{HTTPS}e"'
    r = ok(fmt, '10.1.2.3 [10/Oct/2000:13:55:36 -0700] "GET /t/1 HTTP/1.1" 200 5000000 812000 '
                '"http://10.0.0.5:8080" "on"')
    assert (r.upstream, r.elapsed_ms, r.bytes) == ("http://10.0.0.5:8080", 812.0, 5000000)
    r = ok(fmt, '10.1.2.3 [10/Oct/2000:13:55:36 -0700] "GET /static/a.css HTTP/1.1" 200 10 90 "-" "on"')
    assert r.upstream is None
    assert ok('apache:%a %t "%r" %>s %B "%{HTTPS}e"',
              '10.1.2.3 [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 200 1 "on"').upstream is None


def test_apache_custom_time_usec_and_epoch() -> None:
    r = ok("apache:%h %{sec}t %>s", "1.2.3.4 1700000000 200")
    assert r.ts == 1700000000000
    r = ok("apache:%h %{usec}t %>s", "1.2.3.4 1700000000123456 200")
    assert r.ts == 1700000000123
    r = ok("apache:%h %{%d/%b/%Y:%H:%M:%S}t.%{usec_frac}t%{%z}t %>s", "1.2.3.4 06/May/2019:12:09:43.123456-0400 200")
    assert r.ts == 1557158983123


def test_squid_native() -> None:
    line = "979992041.366    502 192.168.1.160 TCP_IMS_HIT/304 216 GET http://example.com/home2.html?a=b - NONE/- text/html"
    r = ok("squid", line)
    assert (r.ts, r.elapsed_ms, r.client_ip, r.cache_result, r.status, r.bytes, r.method, r.url, r.path, r.query,
            r.user, r.hierarchy, r.upstream, r.content_type, r.protocol) == (
        979992041366, 502.0, "192.168.1.160", "TCP_IMS_HIT", 304, 216, "GET", "http://example.com/home2.html?a=b",
        "/home2.html", "a=b", None, "NONE", None, "text/html", "")


@pytest.mark.parametrize(("tail", "ctype"), [(" -", None), (" :", None), ("", None), (" ", None),
                                              (" image/png", "image/png")])
def test_squid_content_types(tail: str, ctype: str | None) -> None:
    r = ok("squid", "1677971734.079   1234 1.2.3.4 TCP_MISS/000 0 GET http://h/x - HIER_DIRECT/1.2.3.4" + tail)
    assert r.content_type == ctype and r.status == 0


def test_squid_url_with_spaces_timeout_and_mime_headers() -> None:
    line = ("1677971734.079      5 ::1 TCP_MISS/200 39 GET http://h/a b c alice TIMEOUT_FIRST_UP_PARENT/p.example "
            "text/plain [Host: h\\r\\nAccept: */*] [HTTP/1.1 200 OK\\r\\n]")
    r = ok("squid", line)
    assert (r.url, r.path, r.user, r.hierarchy, r.upstream, r.content_type, r.client_ip) == (
        "http://h/a b c", "/a b c", "alice", "TIMEOUT_FIRST_UP_PARENT", "p.example", "text/plain", "::1")


def test_squid_combined() -> None:
    r = ok("squid_combined", COMBINED + " TCP_MISS:HIER_DIRECT")
    assert (r.cache_result, r.hierarchy, r.status) == ("TCP_MISS", "HIER_DIRECT", 200)


def test_auto_detects_and_caches() -> None:
    p = get_parser("auto")
    squid = "1677971734.079   1234 1.2.3.4 TCP_TUNNEL/200 39 CONNECT h:443 - HIER_DIRECT/1.2.3.4 -"
    cases = [(COMBINED, "combined"), (squid, "squid"), (COMBINED + " 7", "combined_d"),
             (COMBINED + " TCP_HIT:HIER_NONE", "squid_combined"), ("v.example:80 " + COMBINED, "vhost_combined"),
             ('1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.0" 200 5', "common"),
             (COMBINED + ' "10.0.0.1"', "nginx_main")]
    for line, name in cases:
        r = p.parse(line)
        assert isinstance(r, ParsedLine), (line, r)
        assert p.last_format == name
    assert p.parse("").reason == "empty_line"


@pytest.mark.parametrize("line", [
    '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /a?q=\\"x\\" HTTP/1.1" 200 5 "-" "UA \\"quoted\\""',
    '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "GET /a?q="x" HTTP/1.1" 200 5 "-" "U"A"',
])
def test_escaped_and_unescaped_quotes(line: str) -> None:
    r = ok("combined", line)
    assert r.method == "GET" and r.protocol == "HTTP/1.1" and r.path == "/a" and r.status == 200


def test_binary_request_http09_dashes_ipv6_hostnames() -> None:
    r = ok("combined", '1.2.3.4 - - [17/Oct/2023:05:57:49 +1100] "\\x16\\x03\\x01\\x01 \\x02" 400 - "-" "-"')
    assert (r.method, r.url, r.path, r.protocol, r.bytes, r.referer, r.user_agent) == (
        "", "\\x16\\x03\\x01\\x01 \\x02", "", "", 0, None, None)
    r = ok("common", 'host.example.org - - [10/Oct/2000:13:55:36 -0700] "GET /" - -')
    assert (r.client_ip, r.client_host, r.method, r.url, r.protocol, r.status, r.bytes) == (
        None, "host.example.org", "GET", "/", "", 0, 0)
    r = ok("common", '2001:db8::7 - - [10/Oct/2000:13:55:36 -0700] "GET http://h.example:8080/p?x HTTP/1.1" 200 1')
    assert (r.client_ip, r.path, r.query) == ("2001:db8::7", "/p", "x")
    assert ok("common", '1.2.3.4 - - [10/Oct/2000:13:55:36 -0700] "" 400 0').url == ""


def test_named_drops() -> None:
    assert drop("combined", "") == "empty_line"
    assert drop("combined", "   \n") == "empty_line"
    assert drop("combined", COMBINED[:60]) == "truncated"
    assert drop("combined", COMBINED[:-3]) == "truncated"  # cut inside the last quoted field
    assert drop("combined", COMBINED[:-3] + '\\"x') == "truncated"  # ... after an escaped quote in it
    # a complete line with more fields after the last quoted one is not a cut line (it was called "truncated")
    assert drop("combined", COMBINED + " 0.050 0.048 forum.example.org") == "no_format_matched"
    assert drop("combined", "hello world") in ("truncated", "no_format_matched")
    assert drop("combined", "no such format here at all, sorry!") == "no_format_matched"
    assert drop("combined", COMBINED.replace("Oct", "Okt")) == "bad_timestamp"
    assert drop("combined", COMBINED.replace("127.0.0.1", "1.2.3.4.5:x")) == "bad_client"
    assert drop("combined", COMBINED.replace(" 200 ", " 2000 ")) == "bad_number"
    assert drop("auto", "[Wed Oct 11 14:32:52.123 2000] [core:error] [pid 1] [client 1.2.3.4:5] AH0: x") == "not_access_log"
    assert drop("auto", '2021/04/01 13:02:31 [error] 31#31: *1 open() "/x" failed, client: 1.2.3.4') == "not_access_log"
    assert get_parser("combined", max_line_bytes=100).parse(COMBINED + "x" * 100).reason == "line_too_long"


def test_long_url_and_newline() -> None:
    url = "/t/" + "a" * 20000
    r = ok("combined", COMBINED.replace("/t/123?page=2", url) + "\r\n")
    assert r.path == url and r.user_agent == "Mozilla/5.0"


def test_misuse_raises() -> None:
    with pytest.raises(ValueError):
        get_parser("no_such_preset")
    with pytest.raises(ValueError):
        get_parser("apache:%h %>s")  # no timestamp directive
    with pytest.raises(ValueError):
        get_parser("iis:whatever")


def test_parse_lines() -> None:
    out = list(parse_lines([COMBINED, "", COMBINED], "combined"))
    assert [type(r).__name__ for r in out] == ["ParsedLine", "Drop", "ParsedLine"]


def test_trailing_blank_after_the_last_field_is_tolerated():
    """secrepo-style lines end with a space after the user agent; they are records, not truncated lines."""
    line = ('77.75.78.160 - - [15/Dec/2018:02:18:31 -0800] "GET /robots.txt HTTP/1.1" 200 334 "-" '
            '"Mozilla/5.0 (compatible; SeznamBot/3.2)" ')
    for spec in ("combined", "auto"):
        rec = get_parser(spec).parse(line)
        assert isinstance(rec, ParsedLine), (spec, rec)
        assert rec.user_agent == "Mozilla/5.0 (compatible; SeznamBot/3.2)"
    # squid's empty last column (content type) still parses as None with its separator space kept
    sq = get_parser("squid").parse("1677971734.080  1234 1.2.3.4 TCP_TUNNEL/200 39 CONNECT domain.xyz:443 - HIER_DIRECT/1.2.3.4 ")
    assert isinstance(sq, ParsedLine) and sq.content_type is None


def test_default_settings_load_a_line_as_long_as_the_collector_passes() -> None:
    """syslog-ng passes lines up to fp_log_msg_size (256 KiB); the default max_line_bytes must not quarantine
    what the collector delivered (a 100 KB URL, as in tests/test_syslogng_kafka.py)."""
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.process import Processor, SourceContext

    conf = (Path(__file__).parents[1] / "syslog-ng" / "forumpulse.conf").read_text()
    assert '@define fp_log_msg_size "262144"' in conf
    assert Settings().ingest.max_line_bytes >= 262144
    url = "/search/?q=" + "a" * 100_000
    line = f'203.0.113.5 - - [22/Jan/2024:10:00:00 +0800] "GET {url} HTTP/1.1" 200 5 "-" "Mozilla/5.0"\n'.encode()
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="a.log", format="combined")
    b = Processor(Settings()).process([line], ctx)
    assert b.requests.num_rows == 1 and b.quarantine.num_rows == 0
    assert b.requests.column("url")[0].as_py() == url
