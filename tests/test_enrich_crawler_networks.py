"""Crawlers known by their address (``pipeline/rules/crawler_networks.yaml``): requests logged without a user agent
(squid's native format, ``-`` in a combined line) from a crawler's published network are that crawler; a user
agent, when there is one, still decides alone.  The fast path and the per-line reference path agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from forumpulse.pipeline.config import Settings, load_settings
from forumpulse.pipeline.enrich import CrawlerNetworks, Enricher, RulesError
from forumpulse.pipeline.process import Processor, SourceContext
from test_fastpath import run_both

BUILTIN = CrawlerNetworks()
CASES = [(e.name, a, True) for e in BUILTIN.doc.crawlers for a in e.cases.in_] + \
        [(e.name, a, False) for e in BUILTIN.doc.crawlers for a in e.cases.out]


def test_every_crawler_has_cases_on_both_sides() -> None:
    for e in BUILTIN.doc.crawlers:
        assert e.source.startswith("https://"), e.name
        assert e.cases.in_ and e.cases.out, f"{e.name}: fixture cases on both sides of its networks"


@pytest.mark.parametrize(("name", "address", "inside"), CASES, ids=lambda v: str(v))
def test_fixture_cases(name: str, address: str, inside: bool) -> None:
    got = BUILTIN.name_of(address)
    assert got == (name if inside else None), (address, got)
    assert BUILTIN.name_of(address) == got  # cached answer is the same


def test_ipv4_mapped_and_non_addresses() -> None:
    assert BUILTIN.name_of("::ffff:66.249.66.1") == "Googlebot"
    for text in (None, "", "crawl-66-249-66-1.googlebot.com", "66.249.66", "66.249.66.1/32", "2001:4860:4801:zz::1"):
        assert BUILTIN.name_of(text) is None


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "nets.yaml"
    p.write_text(body)
    return p


def test_bad_files_are_rules_errors(tmp_path: Path) -> None:
    with pytest.raises(RulesError, match="bad network"):
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [10.0.0.1/8]}]\n"))
    with pytest.raises(RulesError, match="overlaps a network of"):
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [10.0.0.0/8]}, "
                                         "{name: b, networks: [10.1.0.0/16]}]\n"))
    with pytest.raises(RulesError, match="overlaps"):
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: ['2001:db8::/32']}, "
                                         "{name: b, networks: ['2001:db8:1::/48']}]\n"))
    with pytest.raises(RulesError, match=r"a \(10\.0\.0\.0 - 10\.0\.255\.255\)"):  # same start, the larger second
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [10.0.0.0/16]}, "
                                         "{name: b, networks: [10.0.0.0/8]}]\n"))
    with pytest.raises(RulesError, match="as an IPv4 network"):  # would never match: mapped addresses go to IPv4
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: ['::ffff:10.0.0.0/104']}]\n"))
    with pytest.raises(RulesError, match="pattern"):  # unknown key
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [], pattern: x}]\n"))
    # the same crawler may list a network inside another of its own
    ok = CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [10.0.0.0/8, 10.1.0.0/16]}, "
                                          "{name: b, networks: [11.0.0.0/16]}]\n"))
    assert [ok.name_of(x) for x in ("10.1.2.3", "10.5.0.1", "10.255.255.255", "11.0.0.1", "11.1.0.0")] == \
        ["a", "a", "a", "b", None]
    with pytest.raises(RulesError, match="overlaps a network of"):  # not only next to the enclosing network
        CrawlerNetworks(_write(tmp_path, "version: 1\ncrawlers: [{name: a, networks: [10.0.0.0/8, 10.1.0.0/16]}, "
                                         "{name: b, networks: [10.2.0.0/16]}]\n"))


def test_derive_uses_the_address_only_without_a_user_agent() -> None:
    e = Enricher(load_settings())
    browser = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36"
    assert e.derive("forum", "GET", "/t/1", "", None, None, "66.249.66.1")[3:] == (True, "Googlebot")
    assert e.derive("forum", "GET", "/t/1", "", None, "", "157.55.39.9")[3:] == (True, "bingbot")
    assert e.derive("forum", "GET", "/t/1", "", None, None, "192.0.2.1")[3:] == (False, None)
    assert e.derive("forum", "GET", "/t/1", "", None, None)[3:] == (False, None)  # no address given
    assert e.derive("forum", "GET", "/t/1", "", None, browser, "66.249.66.1")[3:] == (False, None)  # the UA decides
    assert e.empty_user_agents == 4
    off = Enricher(Settings(bots={"by_address": False}))
    assert off.networks is None
    assert off.derive("forum", "GET", "/t/1", "", None, None, "66.249.66.1")[3:] == (False, None)


def test_networks_file_replaces_the_builtin(tmp_path: Path) -> None:
    p = _write(tmp_path, "version: 1\ncrawlers: [{name: ourbot, networks: [203.0.113.0/24]}]\n")
    e = Enricher(Settings(bots={"networks_file": str(p)}))
    assert e.address_bot("203.0.113.7") == "ourbot"
    assert e.address_bot("66.249.66.1") is None


SQUID = [
    b"1700000000.100     12 66.249.66.1 TCP_MISS/200 5120 GET http://forum.example.com/t/1 - DIRECT/10.0.0.5 text/html\n",
    b"1700000001.200     15 198.51.100.7 TCP_MISS/200 4100 GET http://forum.example.com/t/2 - DIRECT/10.0.0.5 text/html\n",
    b"1700000002.300      9 157.55.39.44 TCP_HIT/200 900 GET http://forum.example.com/t/3 - NONE/- text/html\n",
    b"1700000003.400     11 66.249.66.1 TCP_MISS/200 5120 GET http://forum.example.com/t/4 - DIRECT/10.0.0.5 text/html\n",
    # 13.67.10.17 is in bingbot's 13.67.10.16/28; truncated to /24 (13.67.10.0) it would not be
    b"1700000004.500     10 13.67.10.17 TCP_MISS/200 700 GET http://forum.example.com/t/5 - DIRECT/10.0.0.5 text/html\n",
    b"1700000005.600     10 13.67.10.1 TCP_MISS/200 700 GET http://forum.example.com/t/6 - DIRECT/10.0.0.5 text/html\n",
]
COMBINED = [
    b'66.249.66.1 - - [14/Nov/2023:22:13:20 +0000] "GET /t/1 HTTP/1.1" 200 512 "-" "-"\n',
    b'66.249.66.1 - - [14/Nov/2023:22:13:21 +0000] "GET /t/2 HTTP/1.1" 200 512 "-" '
    b'"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)"\n',
    b'66.249.66.1 - - [14/Nov/2023:22:13:22 +0000] "GET /t/3 HTTP/1.1" 200 512 "-" '
    b'"Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0"\n',
    b'198.51.100.7 - - [14/Nov/2023:22:13:23 +0000] "GET /t/4 HTTP/1.1" 200 512 "-" "-"\n',
    b'157.55.39.44 - - [14/Nov/2023:22:13:24 +0000] "GET /t/5 HTTP/1.1" 200 512 "-" ""\n',
    b'2001:4860:4801:10::1 - - [14/Nov/2023:22:13:25 +0000] "GET /t/6 HTTP/1.1" 200 512 "-" "-"\n',
    b'crawl-66-249-66-1.googlebot.com - - [14/Nov/2023:22:13:26 +0000] "GET /t/7 HTTP/1.1" 200 512 "-" "-"\n',
    b'::ffff:157.55.39.44 - - [14/Nov/2023:22:13:27 +0000] "GET /t/8 HTTP/1.1" 200 512 "-" "-"\n',
]


def _settings(**bots: object) -> Settings:
    s = load_settings()
    s.retention.raw_days = 0
    for k, v in bots.items():
        setattr(s.bots, k, v)
    return s


@pytest.mark.parametrize("privacy", ["keep", "truncate", "pseudonymize"])
@pytest.mark.parametrize(("fmt", "lines", "want"), [
    ("squid", SQUID, [(True, "Googlebot"), (False, None), (True, "bingbot"), (True, "Googlebot"), (True, "bingbot"),
                      (False, None)]),
    ("combined", COMBINED, [(True, "Googlebot"), (True, "Googlebot"), (False, None), (False, None),
                            (True, "bingbot"), (True, "Googlebot"), (False, None), (True, "bingbot")]),
])
def test_fast_and_reference_paths_name_crawlers_by_address(fmt: str, lines: list[bytes], want: list[tuple[bool, str | None]],
                                                           privacy: str) -> None:
    s = _settings()
    s.privacy.client_ip = privacy  # type: ignore[assignment]
    if privacy == "pseudonymize":
        from pydantic import SecretStr

        s.privacy.pseudonym_key = SecretStr("test-key-crawlers")
    fast_p, ref_p = Processor(s), Processor(s)
    fast, _ = run_both(fast_p, ref_p, lines, SourceContext(site="forum", origin_host="p1", origin_file="a.log", format=fmt))
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == len(lines)  # the fast path did the work
    t = fast.requests
    assert list(zip(t.column("is_bot").to_pylist(), t.column("bot_name").to_pylist(), strict=True)) == want
    if privacy != "keep":  # the look-up used the real address, not the stored one
        assert t.column("client_ip").to_pylist() != fast.stream.column("client_ip").to_pylist()


@pytest.mark.parametrize(("fmt", "lines"), [("squid", SQUID), ("combined", COMBINED)])
def test_by_address_off_keeps_ua_less_lines_human(fmt: str, lines: list[bytes]) -> None:
    s = _settings(by_address=False)
    fast_p, ref_p = Processor(s), Processor(s)
    fast, _ = run_both(fast_p, ref_p, lines, SourceContext(site="forum", origin_host="p1", origin_file="a.log", format=fmt))
    names = fast.requests.column("bot_name").to_pylist()
    assert "bingbot" not in names and (fmt == "combined") == ("Googlebot" in names)  # only the UA-named line


def _edge_addresses() -> list[str]:
    """Addresses at and next to the ends of every built-in IPv4 network, and a few others."""
    import ipaddress

    out = ["198.51.100.7", "10.0.0.1"]
    for e in BUILTIN.doc.crawlers:
        for cidr in e.networks:
            net = ipaddress.ip_network(cidr)
            if net.version != 4:
                continue
            lo, hi = int(net.network_address), int(net.broadcast_address)
            out += [str(ipaddress.IPv4Address(v)) for v in (lo - 1, lo, (lo + hi) // 2, hi, hi + 1)]
    return out


@pytest.mark.parametrize("fmt", ["squid", "combined"])
def test_network_edges_agree_between_paths_and_with_the_lookup(fmt: str) -> None:
    addrs = _edge_addresses()
    if fmt == "squid":
        lines = [f"{1700000000 + i}.100 12 {a} TCP_MISS/200 5120 GET http://forum.example.com/t/{i} - DIRECT/10.0.0.5 "
                 "text/html\n".encode() for i, a in enumerate(addrs)]
    else:
        lines = [f'{a} - - [14/Nov/2023:22:13:20 +0000] "GET /t/{i} HTTP/1.1" 200 512 "-" "-"\n'.encode()
                 for i, a in enumerate(addrs)]
    s = _settings()
    fast_p, ref_p = Processor(s), Processor(s)
    fast, _ = run_both(fast_p, ref_p, lines, SourceContext(site="forum", origin_host="p1", origin_file="a.log", format=fmt))
    assert fast_p._fast is not None and fast_p._fast.last_fast_rows == len(lines)
    got = fast.requests.column("bot_name").to_pylist()
    want = [BUILTIN.name_of(a) for a in addrs]
    assert got == want
    assert sum(w is not None for w in want) > len(addrs) // 2  # the edges inside really are inside


def test_published_json_lists_are_read_as_networks(tmp_path: Path) -> None:
    """An operator can point the rules at the lists as Google and Microsoft publish them (refreshed by a cron job)."""
    import json

    (tmp_path / "googlebot.json").write_text(json.dumps({"creationTime": "2026-11-20T00:00:00", "prefixes": [
        {"ipv4Prefix": "66.249.64.0/27"}, {"ipv6Prefix": "2001:4860:4801:10::/64"}]}))
    p = _write(tmp_path, "version: 1\ncrawlers:\n  - {name: Googlebot, prefixes_json: [googlebot.json],"
                         " networks: [192.178.4.0/27]}\n")
    nets = CrawlerNetworks(p)
    assert [nets.name_of(a) for a in ("66.249.64.31", "66.249.64.32", "2001:4860:4801:10::9", "192.178.4.1")] == \
        ["Googlebot", None, "Googlebot", "Googlebot"]
    for body, match in (("{", "not a published crawler list"), ('{"prefixes": [{"x": 1}]}', "no ipv4Prefix"),
                        ('{"prefixes": []}', "no prefixes"), ('{"creationTime": "x"}', "prefixes")):
        (tmp_path / "googlebot.json").write_text(body)
        with pytest.raises(RulesError, match=match):
            CrawlerNetworks(p)
    (tmp_path / "googlebot.json").unlink()
    with pytest.raises(RulesError, match=r"googlebot\.json"):
        CrawlerNetworks(p)
