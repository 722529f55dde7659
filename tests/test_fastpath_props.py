"""Property tests: on generated lines (valid records rendered in each fast-path format, plus mutations) the fast
path gives exactly the reference path's tables (see tests/test_fastpath.py for what is compared)."""

from __future__ import annotations

import pytest
from forumpulse.pipeline.process import Processor, SourceContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fastpath import _settings, run_both

MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

clients = st.one_of(
    st.builds(lambda a, b, c, d: f"{a}.{b}.{c}.{d}", *[st.integers(0, 255)] * 4),
    st.sampled_from(["2001:db8::1", "::1", "::ffff:10.0.0.1", "fe80::1%eth0", "[2001:db8::7]", "host.example.org",
                     "pm9.j51.com", "-", "1.2.3.4.5", "bad_client!", "ünï.example", "10.0.0.256"]),
)
words = st.one_of(st.just("-"), st.sampled_from(["bob", "frank", '""', "a:b", "x-y_z", "é"]))
times = st.one_of(
    st.builds(lambda d, m, y, hh, mm, ss, sign, oh: f"[{d:02d}/{m}/{y}:{hh:02d}:{mm:02d}:{ss:02d} {sign}{oh:04d}]",
              st.integers(1, 31), st.sampled_from(MONTHS), st.integers(1995, 2030), st.integers(0, 23),
              st.integers(0, 59), st.integers(0, 60), st.sampled_from("+-"), st.sampled_from([0, 100, 530, 1200])),
    st.sampled_from(["[10/Foo/2000:13:55:36 -0700]", "[31/Feb/2021:00:00:00 +0000]", "-",
                     "[10/Oct/2000:13:55:36.123 -0700]", "[10/Oct/2000:13:55:36 -07:00]", "[1/Oct/2000:1:2:3 +0000]"]),
)
paths = st.sampled_from([
    "/", "/threads/election-night-live.4411/", "/threads/election-night-live.4411/page-3", "/t/some-topic/456",
    "/t/456/posts.json", "/viewtopic.php?t=12&sid=abc", "/viewtopic.php?p=77", "/index.php?topic=5.0;PHPSESSID=x",
    "/showthread.php?123-slug", "/forums/news.2/", "/css/site.css?v=3", "/images/a%20b.png", "/search?q=a&s=1",
    "/posting.php?mode=reply&t=9", "/a?token=1&x=2#frag", "/login", "/pageview", "/favicon.ico",
])
requests = st.one_of(
    st.builds(lambda m, p, v: f"{m} {p} {v}", st.sampled_from(["GET", "POST", "HEAD", "PROPFIND", "get"]), paths,
              st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0"])),
    st.builds(lambda m, p: f"{m} {p}", st.sampled_from(["GET", "POST"]), paths),
    st.sampled_from(["-", "", "CONNECT example.com:443 HTTP/1.1", "GET http://proxy.example:3128/a?b=1 HTTP/1.1",
                     "\\x16\\x03\\x01\\x00", "GET /a  HTTP/1.1", "OPTIONS * HTTP/1.1", "HELP"]),
)
statuses = st.sampled_from(["200", "304", "404", "500", "-", "000", "1234", "99999999999999999999999", "007"])
sizes = st.one_of(st.integers(0, 10**7).map(str), st.sampled_from(["-", "0", "9" * 18, "9" * 19, "1" * 40]))
referers = st.one_of(st.just("-"), st.builds(lambda p: "https://forum.example" + p, paths),
                     st.sampled_from(["", "android-app://x", "http://a.example/?s=1&sid=2"]))
agents = st.sampled_from([
    "-", "", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "curl/8.1.2", "python-requests/2.31",
    "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)", "Ünïcode-Agent/1.0", "   ",
])
micros = st.one_of(st.integers(0, 10**9).map(str), st.sampled_from(["-", "1" * 31, "0"]))
vhosts = st.sampled_from(["forum.example", "-", "www.example.org", "a_b"])
ports = st.sampled_from(["80", "443", "-"])
ctypes = st.sampled_from(["text/html", "-", ":", "", "image/png", "text/css; charset=utf-8", "application/json"])
ss = st.sampled_from(["TCP_MISS:HIER_DIRECT", "TCP_HIT:HIER_NONE", "-", "TCP_DENIED:HIER_NONE"])
squid_times = st.one_of(st.builds(lambda s, f: f"{s}.{f}", st.integers(0, 5 * 10**9), st.sampled_from(
    ["079", "1", "12", "123456", "000", "1234567"])), st.sampled_from(["-", "99999999999999.1", "1.", ".5"]))
squid_urls = st.one_of(st.builds(lambda p: "http://forum.example" + p, paths), paths,
                       st.sampled_from(["domain.xyz:443", "ftp://f.example/x", "a b", "-", "*"]))
squid_peers = st.sampled_from(["HIER_DIRECT/93.184.216.34", "NONE/-", "TIMEOUT_FIRST_PARENT_MISS/10.0.0.1", "X/"])
pads = st.sampled_from([" ", "  ", "   ", "\t"])


@st.composite
def record(draw: st.DrawFn) -> dict[str, str]:
    return {
        "h": draw(clients), "l": draw(words), "u": draw(words), "t": draw(times), "r": draw(requests),
        "s": draw(statuses), "b": draw(sizes), "ref": draw(referers), "ua": draw(agents), "D": draw(micros),
        "v": draw(vhosts), "p": draw(ports), "ct": draw(ctypes), "ss": draw(ss),
        "st": draw(squid_times), "su": draw(squid_urls), "sp": draw(squid_peers), "pad": draw(pads),
        "el": draw(st.sampled_from(["0", "1234", "-5", "-0", "99999999999999", "12"])),
        "tail": draw(st.sampled_from(["", " ", "  ", " text/html", " -", " :", " [a] [b]", " text/html [Host: x] [y]"])),
    }


def _nginx_time(t: str) -> str:
    return t[1:-1] if t.startswith("[") else t


CT_SPEC = 'apache:%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" "%{Content-Type}o" %{ms}T'
NGINX_SPEC = ('nginx:$host $remote_addr - $remote_user [$time_local] "$request" $status $bytes_sent '
              '"$http_referer" "$http_user_agent" $request_time $upstream_addr')
def _squid(d: dict[str, str]) -> str:
    code = d["ss"].split(":")[0] if d["ss"] != "-" else "NONE"
    fields = [d["st"], d["el"], d["h"], f"{code}/{d['s'][:3]}", d["b"], d["r"].split(" ")[0] or "GET", d["su"],
              d["u"], d["sp"]]
    return " " * (len(d["pad"]) - 1) + d["pad"].join(fields) + d["tail"]


RENDER = {
    "squid": _squid,
    "common": lambda d: f'{d["h"]} {d["l"]} {d["u"]} {d["t"]} "{d["r"]}" {d["s"]} {d["b"]}',
    "combined": lambda d: f'{d["h"]} {d["l"]} {d["u"]} {d["t"]} "{d["r"]}" {d["s"]} {d["b"]} "{d["ref"]}" "{d["ua"]}"',
    "combined_d": lambda d: RENDER["combined"](d) + f' {d["D"]}',
    "vhost_combined": lambda d: f'{d["v"]}:{d["p"]} ' + RENDER["combined"](d),
    "nginx_combined": lambda d: (f'{d["h"]} - {d["u"]} [{_nginx_time(d["t"])}] "{d["r"]}" {d["s"]} {d["b"]} '
                                 f'"{d["ref"]}" "{d["ua"]}"'),
    "nginx_main": lambda d: RENDER["nginx_combined"](d) + f' "{d["h"]}, 10.0.0.1"',
    "squid_combined": lambda d: RENDER["combined"](d) + f' {d["ss"]}',
    CT_SPEC: lambda d: RENDER["combined"](d) + f' "{d["ct"]}" {d["D"][:6]}',
    NGINX_SPEC: lambda d: (f'{d["v"]} ' + RENDER["nginx_combined"](d) + f' {d["D"][:4]}.{d["D"][-3:]} '
                   f'{"-" if d["p"] == "-" else "10.0.0.9:" + d["p"]}'),
}
FORMATS = list(RENDER)
INSERTS = [" ", '"', "\t", "\x0b", "\x0c", "\r", "\n", "\\", "[", "]", ":", "-", "é", "\x00", "\x85", "\u2028", "9"]


@st.composite
def line(draw: st.DrawFn, fmt: str) -> bytes:
    text = RENDER[fmt](draw(record()))
    kind = draw(st.sampled_from(["plain"] * 6 + ["insert", "delete", "truncate", "ending", "bytes"]))
    if kind == "insert":
        i = draw(st.integers(0, len(text)))
        text = text[:i] + draw(st.sampled_from(INSERTS)) + text[i:]
    elif kind == "delete" and text:
        i = draw(st.integers(0, len(text) - 1))
        text = text[:i] + text[i + 1:]
    elif kind == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    raw = text.encode("utf-8")
    if kind == "bytes":
        i = draw(st.integers(0, len(raw)))
        raw = raw[:i] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xe2\x80", b"\xed\xa0\x80"])) + raw[i:]
    ending = draw(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n", b"", b"\r", b"\n\n", b" \n"])) if kind in (
        "plain", "ending") else b"\n"
    return raw + ending


@pytest.fixture(scope="module")
def procs() -> dict[str, tuple[Processor, Processor]]:
    s = _settings()
    return {"keep": (Processor(s), Processor(s))}


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_lines_in_each_format(procs, fmt, data):
    fast_p, ref_p = procs["keep"]
    lines = data.draw(st.lists(line(fmt), min_size=1, max_size=30))
    run_both(fast_p, ref_p, lines, SourceContext(site="forum", origin_host="h", origin_file="f", format=fmt))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_mixed_formats_under_auto(procs, data):
    fast_p, ref_p = procs["keep"]
    fmts = data.draw(st.lists(st.sampled_from(FORMATS[:7]), min_size=1, max_size=3))
    lines = data.draw(st.lists(st.one_of(*[line(f) for f in fmts]), min_size=1, max_size=40))
    run_both(fast_p, ref_p, lines, SourceContext(format="auto"))


def test_generated_lines_really_take_the_fast_path(procs):
    """Guard against a vacuous pass: valid generated lines of every format are handled by the fast path."""
    fast_p, ref_p = procs["keep"]
    d = {"h": "10.1.2.3", "l": "-", "u": "bob", "t": "[10/Oct/2000:13:55:36 -0700]", "r": "GET /t/x/45 HTTP/1.1",
         "s": "200", "b": "512", "ref": "-", "ua": "curl/8.1.2", "D": "1234", "v": "forum.example", "p": "443",
         "ct": "text/html", "ss": "TCP_MISS:HIER_DIRECT", "st": "1677971735.123", "su": "http://f.example/t/x/45",
         "sp": "HIER_DIRECT/93.184.216.34", "pad": "  ", "el": "567", "tail": " text/html"}
    for fmt in FORMATS:
        lines = [RENDER[fmt](d).encode() + b"\n"] * 5
        run_both(fast_p, ref_p, lines, SourceContext(format=fmt))
        assert fast_p._fast is not None and fast_p._fast.last_fast_rows == 5, fmt
