"""A forum behind its own reverse proxy (squid in front of Apache, a load balancer in front of nginx).

The origin server logs the proxy's address as the client.  With ``sites[].trusted_proxies`` the client comes
from the ``X-Forwarded-For`` the format logs, walked from the right like Apache's mod_remoteip / nginx's realip
module; without it the header is never believed (any client can send one).  The DoS detector never bans a
trusted proxy: a ban there would cut every visitor off.
"""

from __future__ import annotations

import ipaddress
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pytest
from forumpulse.detectors.dos import (
    Batch,
    DecisionManager,
    DosDetector,
    build_detector,
    parse_file,
)
from forumpulse.detectors.dos_rules import DosConfig, load_rules
from forumpulse.detectors.eval_dos import ordered, synth_flood, synth_humans
from forumpulse.pipeline.config import ConfigError, Settings, SiteConfig, load_settings
from forumpulse.pipeline.fastpath import plan_for_spec
from forumpulse.pipeline.formats import PRESETS, TrustedProxies, get_parser
from forumpulse.pipeline.formats._values import forwarded_client
from forumpulse.pipeline.process import Processor, SourceContext
from forumpulse.pipeline.record import ParsedLine

PROXIES = TrustedProxies(["10.0.0.0/24", "192.0.2.64/26", "2001:db8:f::/48"])
T0 = 1_700_000_000_000


@pytest.mark.parametrize(("peer", "xff", "want"), [
    # the peer is not one of ours: the header is the client's to forge, the peer is the client
    ("198.51.100.7", "203.0.113.9", "198.51.100.7"),
    # squid at 10.0.0.5 appended the address it saw
    ("10.0.0.5", "203.0.113.9", "203.0.113.9"),
    # a client-sent (forged) item left of what our proxy appended is not believed
    ("10.0.0.5", "1.1.1.1, 203.0.113.9", "203.0.113.9"),
    # two of our proxies in a row (a CDN edge range, then squid): both skipped
    ("10.0.0.5", "203.0.113.9, 192.0.2.70", "203.0.113.9"),
    # a proxy that wrote "unknown" (squid forwarded_for off): the walk stops at the last proxy
    ("10.0.0.5", "203.0.113.9, unknown", "10.0.0.5"),
    # no header (the proxy's own health check): the proxy is the client
    ("10.0.0.5", "-", "10.0.0.5"),
    ("10.0.0.5", None, "10.0.0.5"),
    # every address is ours: the leftmost
    ("10.0.0.5", "10.0.0.7", "10.0.0.7"),
    # ports written by some load balancers, IPv6 with and without brackets
    ("10.0.0.5", "203.0.113.9:51234", "203.0.113.9"),
    ("10.0.0.5", "[2001:db8::7]:443", "2001:db8::7"),
    ("2001:db8:f::1", "2001:db8::7, 2001:db8:f::2", "2001:db8::7"),
    # a dual-stack socket logs an IPv4 proxy as ::ffff:a.b.c.d
    ("::ffff:10.0.0.5", "203.0.113.9", "203.0.113.9"),
    # a format that logs the header instead of the peer: its last item is the proxy's word
    (None, "1.1.1.1, 203.0.113.9", "203.0.113.9"),
    (None, "203.0.113.9, 10.0.0.5", "203.0.113.9"),
    (None, "-", None),
    (None, "unknown", None),
])
def test_client_is_the_first_untrusted_address_from_the_right(peer, xff, want):
    assert forwarded_client(peer, xff, PROXIES) == want


def test_without_trusted_proxies_the_header_never_replaces_a_peer():
    assert forwarded_client("10.0.0.5", "203.0.113.9") == "10.0.0.5"
    assert forwarded_client(None, "1.1.1.1, 203.0.113.9") == "203.0.113.9"


def test_config_normalises_and_refuses_bad_proxy_entries():
    assert SiteConfig(trusted_proxies=["10.0.0.5", "10.0.1.7/24"]).trusted_proxies == ["10.0.0.5/32", "10.0.1.0/24"]
    # an IPv4-mapped spelling is the IPv4 proxy (peers are compared, and bans refused, as IPv4)
    assert SiteConfig(trusted_proxies=["::ffff:10.0.0.5", "::ffff:10.0.0.0/120"]).trusted_proxies == [
        "10.0.0.5/32", "10.0.0.0/24"]
    with pytest.raises(ValueError, match=r"not an address or CIDR: 'squid\.local'"):
        SiteConfig(trusted_proxies=["squid.local"])
    for wide in ("0.0.0.0/0", "10.0.0.0/7", "::/0", "2001:db8::/31"):  # any client could name any address
        with pytest.raises(ValueError, match="too wide"):
            SiteConfig(trusted_proxies=[wide])


def test_config_file_error_names_the_key(tmp_path: Path):
    f = tmp_path / "c.yaml"
    f.write_text("sites:\n  - name: forum\n    trusted_proxies: [10.0.0.300]\n")
    with pytest.raises(ConfigError, match=r"sites\.0\.trusted_proxies"):
        load_settings(f)


NGINX = ('10.0.0.5 - - [10/Oct/2023:13:55:36 +0000] "GET /threads/a.42/ HTTP/1.1" 200 512 "-" '
         '"Mozilla/5.0 (X11; Linux x86_64) Firefox/118.0" "{xff}"\n')
APACHE_XFF = '{xff} - - [10/Oct/2023:13:55:36 +0000] "GET /threads/a.42/ HTTP/1.1" 200 512 "-" "Mozilla/5.0"\n'
APACHE_XFF_SPEC = 'apache:%{X-Forwarded-For}i %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"'


def test_parsers_read_the_header_only_for_trusted_peers():
    line = NGINX.format(xff="1.1.1.1, 203.0.113.9")
    assert get_parser("nginx_main").parse(line).client_ip == "10.0.0.5"  # type: ignore[union-attr]
    assert get_parser("nginx_main", trusted=PROXIES).parse(line).client_ip == "203.0.113.9"  # type: ignore[union-attr]
    assert get_parser("auto", trusted=PROXIES).parse(line).client_ip == "203.0.113.9"  # type: ignore[union-attr]
    # the header logged instead of the peer (unquoted, a list with ", "): believed only with trusted proxies
    p = get_parser(APACHE_XFF_SPEC, trusted=PROXIES)
    r = p.parse(APACHE_XFF.format(xff="1.1.1.1, 203.0.113.9"))
    assert isinstance(r, ParsedLine) and (r.client_ip, r.path, r.status) == ("203.0.113.9", "/threads/a.42/", 200)
    r = p.parse(APACHE_XFF.format(xff="-"))
    assert isinstance(r, ParsedLine) and r.client_ip is None
    r = get_parser(APACHE_XFF_SPEC).parse(APACHE_XFF.format(xff="1.1.1.1, 203.0.113.9"))
    assert isinstance(r, ParsedLine) and r.client_ip is None and r.path == "/threads/a.42/"


@pytest.mark.parametrize("where", ["last", "middle"])
def test_an_unquoted_header_the_client_wrote_never_makes_its_line_unparseable(where):
    """The header's left part is the client's: commas without a space, empty items, (at the end) spaces must
    not get the line quarantined -- a quarantined line is invisible to the DoS detector.  With or without
    trusted proxies; the client is then the peer or, behind a proxy, the item the proxy appended."""
    spec = ('apache:%a %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" %{X-Forwarded-For}i' if where == "last"
            else 'apache:%a %{X-Forwarded-For}i %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"')
    sent = ["1.1.1.1,2.2.2.2", ", x", "a,,b", "1.1.1.1, 2.2.2.2", "-"] + (["x y", "1.1.1.1 ,junk"]
                                                                           if where == "last" else [])
    for trusted, want in ((TrustedProxies(), "10.0.0.5"), (PROXIES, "6.6.6.6")):
        p = get_parser(spec, trusted=trusted)
        for x in sent:
            xff = x + ", 6.6.6.6"
            line = (f'10.0.0.5 - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA" {xff}'
                    if where == "last" else
                    f'10.0.0.5 {xff} - - [10/Oct/2023:13:55:36 +0000] "GET / HTTP/1.1" 200 5 "-" "UA"')
            r = p.parse(line)
            assert isinstance(r, ParsedLine) and r.client_ip == want and r.status == 200, (x, r)


def test_formats_without_the_header_share_one_compiled_form():
    from forumpulse.pipeline.formats import compile_spec

    assert compile_spec(PRESETS["combined"], trusted=PROXIES) is compile_spec(PRESETS["combined"])
    assert compile_spec(PRESETS["nginx_main"], trusted=PROXIES) is not compile_spec(PRESETS["nginx_main"])


def _settings(proxies: list[str]) -> Settings:
    s = load_settings()
    s.sites = [SiteConfig(name="forum", trusted_proxies=proxies)]
    s.privacy.client_ip = "keep"  # type: ignore[assignment]
    return s


@pytest.mark.parametrize("fmt", ["nginx_main", "auto"])
def test_processor_takes_the_client_from_the_header_behind_a_trusted_proxy(fmt):
    xffs = ["203.0.113.9", "1.1.1.1, 203.0.113.10", "-", "198.51.100.1, 10.0.0.9"]
    lines = [NGINX.format(xff=x).encode() for x in xffs] * 50
    ctx = SourceContext(site="forum", origin_host="web1", format=fmt)
    behind = Processor(_settings(["10.0.0.0/24"]))
    got = behind.process(lines, ctx)
    want = ["203.0.113.9", "203.0.113.10", "10.0.0.5", "198.51.100.1"] * 50
    assert got.stream.column("client_ip").to_pylist() == want
    assert got.requests.column("client_ip").to_pylist() == want
    assert got.loaded == len(lines)
    # a site without trusted proxies keeps the peer, on the fast path and the reference path alike
    plain = Processor(_settings([]))
    for b in (plain.process(lines, ctx), plain.process_reference(lines, ctx)):
        assert set(b.stream.column("client_ip").to_pylist()) == {"10.0.0.5"}
    # another site of the same processor is not affected by this site's proxies
    other = behind.process(lines, SourceContext(site="other", format=fmt))
    assert set(other.stream.column("client_ip").to_pylist()) == {"10.0.0.5"}


def test_header_instead_of_peer_is_read_behind_trusted_proxies_only_and_both_paths_agree():
    assert plan_for_spec(APACHE_XFF_SPEC, "custom") is not None  # the fast path serves sites without proxies
    assert plan_for_spec(PRESETS["nginx_main"], "nginx_main") is not None
    lines = [APACHE_XFF.format(xff=x).encode() for x in ("203.0.113.9", "1.1.1.1, 203.0.113.10", "-")]
    ctx = SourceContext(format=APACHE_XFF_SPEC)
    for proxies, want in (([], [None, None, None]), (["10.0.0.0/24"], ["203.0.113.9", "203.0.113.10", None])):
        p = Processor(_settings(proxies))
        fast, ref = p.process(lines, ctx), p.process_reference(lines, ctx)
        assert fast.stream.column("client_ip").to_pylist() == want
        assert fast.stream.equals(ref.stream)


def _flood_through_proxy() -> list[ParsedLine]:
    rng = np.random.default_rng(5)
    return ordered(synth_humans(rng, T0, 300, 20) + synth_flood(T0 + 60_000, "10.0.0.5", 60, 30)
                   + synth_flood(T0 + 120_000, "198.51.100.7", 60, 10))


def _run(records: list[ParsedLine], mgr: DecisionManager) -> DosDetector:
    det = DosDetector(load_rules(mgr.cfg.rules_file, mgr.cfg.rule_overrides), mgr)
    for i in range(0, len(records), 5000):
        det.process(Batch.from_records(records[i:i + 5000]))
    return det


def test_dos_never_bans_a_trusted_proxy_nor_a_range_holding_one():
    cfg = DosConfig(crawlers={"verify": "off"})  # type: ignore[arg-type]
    recs = _flood_through_proxy()
    unprotected = _run(recs, DecisionManager(cfg))
    assert "10.0.0.5" in {d.value for d in unprotected.manager.decisions}  # the test would see a proxy ban
    det = _run(recs, DecisionManager(cfg, trusted_proxies=["10.0.0.5/32"]))
    values = {d.value for d in det.manager.decisions}
    assert "198.51.100.7" in values  # a real flood is still banned
    assert not any(ipaddress.ip_network(v, strict=False).overlaps(ipaddress.ip_network("10.0.0.5/32"))
                   for v in values)
    assert det.manager.suppressed["trusted_proxy"] >= 1


def test_replay_reads_the_sites_trusted_proxies(tmp_path: Path):
    conf = tmp_path / "c.yaml"
    conf.write_text(textwrap.dedent("""\
        sites:
          - name: forum
            trusted_proxies: [10.0.0.5]
        detectors:
          dos:
            crawlers: {verify: "off"}
        """))
    det = build_detector(str(conf))
    assert det.manager.proxies == [ipaddress.ip_network("10.0.0.5/32")]
    log = tmp_path / "access.log"
    log.write_text("".join(NGINX.format(xff=x) for x in ("203.0.113.9", "-")))
    site = load_settings(conf).sites[0]
    assert [r.client_ip for r in parse_file(str(log), "nginx_main", site.timezone, site.trusted_proxies)] == [
        "203.0.113.9", "10.0.0.5"]
    assert [r.client_ip for r in parse_file(str(log), "nginx_main")] == ["10.0.0.5", "10.0.0.5"]


def _xff_lines(rng: np.random.Generator, n: int) -> list[bytes]:
    """nginx_main lines through several proxies and none: trusted and untrusted peers (IPv4, IPv6, mapped),
    headers forged, absent, empty, with ports, ``unknown``, lists -- and UA-less Googlebot behind the proxy."""
    peers = ["10.0.0.5", "10.0.0.9", "198.51.100.7", "2001:db8:f::1", "::ffff:10.0.0.5", "192.0.2.70"]
    xffs = ["203.0.113.9", "1.1.1.1, 203.0.113.9", "-", "", "unknown", "203.0.113.9, unknown",
            "203.0.113.9:4711", "[2001:db8::7]:443", "2001:db8::7, 2001:db8:f::2", "66.249.66.1",
            "10.0.0.7", "203.0.113.9, 192.0.2.70", "garbage here"]
    uas = ["Mozilla/5.0 (X11; Linux x86_64) Firefox/118.0", "-"]
    out = []
    for i in range(n):
        peer, xff, ua = peers[rng.integers(len(peers))], xffs[rng.integers(len(xffs))], uas[rng.integers(2)]
        out.append(f'{peer} - - [10/Oct/2023:13:{i // 60 % 60:02d}:{i % 60:02d} +0000] "GET /threads/a.{i % 7}/ '
                   f'HTTP/1.1" 200 {100 + i} "-" "{ua}" "{xff}"\n'.encode())
    return out


@pytest.mark.parametrize("privacy", ["keep", "pseudonymize"])
@pytest.mark.parametrize("fmt", ["nginx_main", "auto",
                                 'apache:%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" "%{X-Forwarded-For}i"'])
def test_fast_path_reads_the_header_exactly_as_the_reference(fmt, privacy):
    from pydantic import SecretStr
    from test_fastpath import assert_same

    def proc() -> Processor:
        s = _settings(["10.0.0.0/24", "192.0.2.64/26", "2001:db8:f::/48"])
        s.privacy.client_ip = privacy  # type: ignore[assignment]
        s.privacy.pseudonym_key = SecretStr("test-key-xff")
        return Processor(s)

    lines = _xff_lines(np.random.default_rng(7), 3000)
    ctx = SourceContext(site="forum", origin_host="web1", format=fmt)
    fast_p, ref_p = proc(), proc()
    fast, ref = fast_p.process(lines, ctx), ref_p.process_reference(lines, ctx)
    assert_same(fast, ref)
    assert fast.loaded == len(lines)
    ips = fast.stream.column("client_ip").to_pylist()
    assert "203.0.113.9" in ips and "198.51.100.7" in ips and "2001:db8::7" in ips
    assert "1.1.1.1" not in ips  # a forged item is never the client
    if privacy == "keep":  # Googlebot's address behind the proxy names the UA-less rows
        bots = fast.requests.filter(pa.compute.equal(fast.requests.column("client_ip"), "66.249.66.1"))
        assert bots.num_rows and set(bots.column("bot_name").to_pylist()) >= {"Googlebot"}


@pytest.mark.parametrize("proxies", [[], ["10.0.0.0/24"]])
def test_fast_path_agrees_on_an_unquoted_header_between_fields(proxies):
    from test_fastpath import assert_same

    spec = 'apache:%h %{X-Forwarded-For}i %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"'
    rng = np.random.default_rng(3)
    xffs = ["203.0.113.9", "1.1.1.1, 203.0.113.9", "1.1.1.1,203.0.113.9", "-", ", 203.0.113.9", "unknown",
            "[2001:db8::7]:443", "a,,b"]
    lines = [f'{["10.0.0.5", "198.51.100.7"][rng.integers(2)]} {xffs[rng.integers(len(xffs))]} - - '
             f'[10/Oct/2023:13:55:{i % 60:02d} +0000] "GET /t/{i % 9} HTTP/1.1" 200 {i} "-" "UA/1"\n'.encode()
             for i in range(2000)]
    ctx = SourceContext(site="forum", format=spec)
    fast, ref = Processor(_settings(proxies)).process(lines, ctx), Processor(_settings(proxies)).process_reference(
        lines, ctx)
    assert_same(fast, ref)
    assert fast.loaded == len(lines)
    ips = set(fast.stream.column("client_ip").to_pylist())
    assert ips == ({"10.0.0.5", "198.51.100.7"} if not proxies else
                   {"203.0.113.9", "198.51.100.7", "10.0.0.5", "2001:db8::7"}), ips
