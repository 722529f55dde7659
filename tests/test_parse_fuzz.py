"""Property tests (hypothesis, no deadlines): no str crashes a parser; records rendered into each format parse
back to the same fields."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from forumpulse.pipeline.formats import PRESETS, get_parser
from forumpulse.pipeline.record import DROP_REASONS, Drop, ParsedLine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SPECS = [*PRESETS, "auto",
         'apache:%a %{%Y-%m-%d %H:%M:%S %z}t [%{msec_frac}t] %s "%m" "%U%q" %D %400r %{X}i',
         'nginx:$remote_addr [$time_iso8601] "$request" $status $request_time $upstream_addr "$http_user_agent"']
PARSERS = [get_parser(s, max_line_bytes=4096) for s in SPECS]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLE = ('127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /t/1?p=2 HTTP/1.1" 200 2326 "http://r/" "UA 1" '
          'TCP_MISS:HIER_DIRECT')


def _check(line: str) -> None:
    for p in PARSERS:
        r = p.parse(line)
        assert isinstance(r, (ParsedLine, Drop))
        if isinstance(r, Drop):
            assert r.reason in DROP_REASONS
            assert "parser error" not in r.detail, (p.name, line, r)


@FUZZ
@given(st.text())
def test_no_str_crashes(line: str) -> None:
    _check(line)


@FUZZ
@given(st.integers(0, len(SAMPLE)), st.integers(0, len(SAMPLE)), st.text(max_size=20))
def test_mutated_real_lines_never_crash(i: int, j: int, junk: str) -> None:
    a, b = sorted((i, j))
    _check(SAMPLE[:a] + junk + SAMPLE[b:])
    _check(SAMPLE[:a])  # every prefix


_tok = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126, exclude_characters='"\\'), min_size=1,
               max_size=12).filter(lambda s: s != "-")
_seg = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-._~%", min_size=1, max_size=10)
_ts = st.integers(0, 2_000_000_000).map(lambda s: s * 1000)
_ua = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), min_size=1,
              max_size=30).filter(lambda s: s != "-")


@st.composite
def records(draw: st.DrawFn) -> dict:
    ip = draw(st.one_of(st.ip_addresses(v=4).map(str), st.ip_addresses(v=6).map(str),
                        st.from_regex(r"[a-z][a-z0-9-]{0,8}(\.[a-z][a-z0-9-]{0,8}){1,3}", fullmatch=True)))
    path = "/" + "/".join(draw(st.lists(_seg, max_size=4)))
    query = draw(st.one_of(st.just(""), st.lists(_seg, min_size=1, max_size=3).map("&".join)))
    return {
        "ts": draw(_ts), "client": ip, "user": draw(st.one_of(st.none(), _tok)),
        "method": draw(st.sampled_from(["GET", "POST", "HEAD", "PUT", "PROPFIND", "M-SEARCH"])),
        "path": path, "query": query, "protocol": draw(st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0"])),
        "status": draw(st.integers(100, 599)), "bytes": draw(st.integers(0, 10**12)),
        "referer": draw(st.one_of(st.none(), _ua)), "ua": draw(st.one_of(st.none(), _ua)),
        "elapsed_us": draw(st.integers(0, 10**9)), "vhost": draw(st.from_regex(r"[a-z]{1,8}\.example", fullmatch=True)),
        "cache": draw(st.sampled_from(["TCP_MISS", "TCP_HIT", "TCP_DENIED"])),
        "hier": draw(st.sampled_from(["HIER_DIRECT", "HIER_NONE", "TIMEOUT_FIRST_UP_PARENT"])),
        "peer": draw(st.one_of(st.none(), st.ip_addresses(v=4).map(str))),
        "ctype": draw(st.one_of(st.none(), st.sampled_from(["text/html", "image/png"]))),
        "tz": draw(st.integers(-12 * 60, 14 * 60)),
    }


def _clf(ts: int, tz: int) -> str:
    dt = datetime.fromtimestamp(ts / 1000, timezone(timedelta(minutes=tz)))
    return dt.strftime("%d/%b/%Y:%H:%M:%S %z")


def _d(v: str | None) -> str:
    return "-" if v is None else v


def render(fmt: str, r: dict) -> str:
    url = r["path"] + ("?" + r["query"] if r["query"] else "")
    req = f'{r["method"]} {url} {r["protocol"]}'
    if fmt == "squid":
        url = f"http://{r['vhost']}{url}"
        return (f"{r['ts'] // 1000:9d}.{r['ts'] % 1000:03d} {r['elapsed_us'] // 1000:6d} {r['client']} "
                f"{r['cache']}/{r['status']:03d} {r['bytes']} {r['method']} {url} {_d(r['user'])} "
                f"{r['hier']}/{_d(r['peer'])} {_d(r['ctype'])}")
    common = f'{r["client"]} - {_d(r["user"])} [{_clf(r["ts"], r["tz"])}] "{req}" {r["status"]} {r["bytes"]}'
    combined = common + f' "{_d(r["referer"])}" "{_d(r["ua"])}"'
    return {
        "common": common, "combined": combined, "nginx_combined": combined,
        "combined_d": combined + f" {r['elapsed_us']}",
        "vhost_combined": f"{r['vhost']}:443 " + combined,
        "nginx_main": combined + ' "-"',
        "squid_combined": combined + f" {r['cache']}:{r['hier']}",
    }[fmt]


@settings(max_examples=150, deadline=None)
@given(records())
def test_round_trip_every_preset(r: dict) -> None:
    for fmt in PRESETS:
        line = render(fmt, r)
        for p in (get_parser(fmt), get_parser("auto")):
            got = p.parse(line)
            assert isinstance(got, ParsedLine), (fmt, line, got)
            is_ip = ":" in r["client"] or r["client"].replace(".", "").isdigit()
            assert (got.client_ip, got.client_host) == ((r["client"], None) if is_ip else (None, r["client"]))
            assert (got.method, got.path, got.query, got.status, got.bytes) == (
                r["method"], r["path"], r["query"], r["status"], r["bytes"])
            if fmt == "squid":
                assert got.ts == r["ts"]
                assert (got.cache_result, got.hierarchy, got.upstream, got.content_type, got.user) == (
                    r["cache"], r["hier"], r["peer"], r["ctype"], r["user"])
                assert got.elapsed_ms == float(r["elapsed_us"] // 1000)
                continue
            assert got.ts == r["ts"] // 1000 * 1000
            assert (got.protocol, got.user) == (r["protocol"], r["user"])
            if fmt != "common":
                assert (got.referer, got.user_agent) == (r["referer"], r["ua"])
            if fmt == "combined_d":
                assert got.elapsed_ms == r["elapsed_us"] / 1000
            if fmt == "vhost_combined":
                assert got.vhost == r["vhost"]
            if fmt == "squid_combined":
                assert (got.cache_result, got.hierarchy) == (r["cache"], r["hier"])
