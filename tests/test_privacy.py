"""Privacy: query/URL/referer scrubbing and client-address storage modes."""

from __future__ import annotations

import ipaddress

import pytest
from forumpulse.pipeline.config import DEFAULT_STRIP_PARAMS, PrivacyConfig
from forumpulse.pipeline.privacy import BoundedCache, Privacy
from hypothesis import given, settings
from hypothesis import strategies as st

P = Privacy(PrivacyConfig())


@pytest.mark.parametrize(("query", "expected"), [
    ("a=1&s=2&b=3", "a=1&b=3"),
    ("s=0123abcd", ""),
    ("s=2&b=3", "b=3"),
    ("a=1&s=2", "a=1"),
    ("topic=1.0;PHPSESSID=abc;start=5", "topic=1.0;start=5"),
    ("a=1&_xfToken=1700000000%2Cabc&s=ff&q=x", "a=1&q=x"),
    ("sid&x=1", "x=1"),
    ("ss=1&S=2&s_x=3&xs=4", "ss=1&S=2&s_x=3&xs=4"),   # names compare exactly
    ("q=s%3D1&b=s", "q=s%3D1&b=s"),                    # only names, never values
    ("a=1&&s=2&&b", "a=1&&&b"),
    ("", ""),
])
def test_scrub_query(query: str, expected: str) -> None:
    assert P.scrub_query(query) == expected


@pytest.mark.parametrize(("url", "expected"), [
    ("/threads/a.1/?s=abc", "/threads/a.1/"),
    ("/threads/a.1/page-2?s=abc&x=1#post-5", "/threads/a.1/page-2?x=1#post-5"),
    ("http://example.org/x?token=t&q=1", "http://example.org/x?q=1"),
    ("/index.php?topic=5.0;PHPSESSID=deadbeef", "/index.php?topic=5.0"),
    ("/plain", "/plain"),
    ("/with space?sid=1 2&k=v", "/with space?k=v"),
])
def test_scrub_url_and_referer(url: str, expected: str) -> None:
    assert P.scrub_url(url) == expected
    assert P.scrub_referer(url) == expected
    assert P.scrub_referer(None) is None


def test_configured_names_are_case_sensitive_and_empty_list_disables() -> None:
    p = Privacy(PrivacyConfig(strip_params=["Token"]))
    assert p.scrub_query("Token=1&token=2") == "token=2"
    assert Privacy(PrivacyConfig(strip_params=[])).scrub_url("/x?s=1") == "/x?s=1"


NAMES = st.sampled_from([*DEFAULT_STRIP_PARAMS, "a", "b", "t", "topic", "S", "sidx", "", "q"])
VALUES = st.text(alphabet=st.characters(exclude_characters="&;#", exclude_categories=["Cs"]), max_size=8)
PARAM = st.one_of(st.tuples(NAMES, VALUES).map(lambda kv: f"{kv[0]}={kv[1]}"), NAMES)
QUERY = st.tuples(st.lists(PARAM, max_size=6), st.lists(st.sampled_from("&;"), min_size=6, max_size=6)).map(
    lambda ps: "".join(p + (ps[1][i] if i < len(ps[0]) - 1 else "") for i, p in enumerate(ps[0])))


@settings(max_examples=300, deadline=None)
@given(QUERY)
def test_scrub_is_idempotent_and_removes_exactly_the_listed_names(query: str) -> None:
    out = P.scrub_query(query)
    assert P.scrub_query(out) == out
    names = set(DEFAULT_STRIP_PARAMS)
    kept = [p for p in query.replace(";", "&").split("&") if p.partition("=")[0] not in names] if query else []
    got = out.replace(";", "&").split("&") if out else []
    if kept == [""]:
        kept = []
    assert got == kept or (not out and all(k == "" for k in kept))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), QUERY)
def test_urls_without_listed_params_are_untouched(path: str, query: str) -> None:
    path = path.replace("?", "")
    names = set(DEFAULT_STRIP_PARAMS)
    parts = query.replace(";", "&").split("&")
    url = f"{path}?{query}"
    if not any(p.partition("=")[0] in names for p in parts):
        assert P.scrub_url(url) == url
        assert P.scrub_url(path) == path
    else:
        assert P.scrub_url(P.scrub_url(url)) == P.scrub_url(url)
        assert P.scrub_url(url).startswith(path)


def test_store_ip_keep_and_truncate() -> None:
    assert P.store_ip("203.0.113.77") == "203.0.113.77"
    assert P.store_ip(None) is None
    t = Privacy(PrivacyConfig(client_ip="truncate"))
    assert t.store_ip("203.0.113.77") == "203.0.113.0"
    assert t.store_ip("::ffff:203.0.113.77") == "203.0.113.0"
    assert t.store_ip("2001:db8:1:2:3:4:5:6") == "2001:db8:1::"
    assert t.store_ip("not-an-ip") is None
    assert t.store_ip(None) is None
    t16 = Privacy(PrivacyConfig(client_ip="truncate", truncate_ipv4_prefix=16, truncate_ipv6_prefix=64))
    assert t16.store_ip("203.0.113.77") == "203.0.0.0"
    assert t16.store_ip("2001:db8:1:2:3:4:5:6") == "2001:db8:1:2::"


@pytest.mark.parametrize("v6_prefix", [48, 64, 128])
def test_truncate_6to4_and_teredo_by_their_embedded_ipv4(v6_prefix: int) -> None:
    """A 6to4 address's /48 is 2002: + the whole IPv4 address, and Teredo carries the client's IPv4 (obfuscated) in
    its last 32 bits: both are truncated as that IPv4 address is, never stored with more than its /24."""
    t = Privacy(PrivacyConfig(client_ip="truncate", truncate_ipv6_prefix=v6_prefix))
    assert t.store_ip("2002:cb00:7105::1") == "203.0.113.0"  # 6to4 of 203.0.113.5
    assert t.store_ip("2002:cb00:714d:12:34::5") == "203.0.113.0"
    # RFC 4380's example: server 65.54.227.120, client 192.0.2.45 behind NAT port 40000
    assert t.store_ip("2001:0:4136:e378:8000:63bf:3fff:fdd2") == "192.0.2.0"
    t16 = Privacy(PrivacyConfig(client_ip="truncate", truncate_ipv4_prefix=16, truncate_ipv6_prefix=v6_prefix))
    assert t16.store_ip("2002:cb00:7105::1") == "203.0.0.0"
    # other IPv6 addresses keep the IPv6 prefix (2001:db8::/32 is not Teredo: 2001:0::/32 is)
    assert t.store_ip("2001:db8:1:2:3:4:5:6") == str(ipaddress.ip_network(f"2001:db8:1:2:3:4:5:6/{v6_prefix}",
                                                                           strict=False).network_address)


def _pseudo(key: str) -> Privacy:
    return Privacy(PrivacyConfig(client_ip="pseudonymize", pseudonym_key=key))


def test_pseudonymize_properties() -> None:
    a, b = _pseudo("key-one"), _pseudo("key-two")
    ula = ipaddress.ip_network("fd00::/8")
    for ip in ("203.0.113.77", "2001:db8::1", "10.0.0.1"):
        out = a.store_ip(ip)
        assert out is not None and ipaddress.ip_address(out) in ula
        assert out == _pseudo("key-one").store_ip(ip)       # same key, same input -> same output
        assert out != b.store_ip(ip)                          # another key -> another output
        assert ip not in out
    # family is marked: fd04::/16 for IPv4, fd06::/16 for IPv6; mapped IPv4 is the same client as IPv4
    assert ipaddress.ip_address(a.store_ip("203.0.113.77") or "") in ipaddress.ip_network("fd04::/16")
    assert ipaddress.ip_address(a.store_ip("2001:db8::1") or "") in ipaddress.ip_network("fd06::/16")
    assert a.store_ip("::ffff:203.0.113.77") == a.store_ip("203.0.113.77")
    # one /24 -> one pseudonymous /64 with distinct hosts; another /24 -> another /64
    same24 = {ipaddress.ip_network(f"{a.store_ip(f'203.0.113.{i}')}/64", strict=False) for i in range(256)}
    hosts = {a.store_ip(f"203.0.113.{i}") for i in range(256)}
    assert len(same24) == 1 and len(hosts) == 256
    assert ipaddress.ip_network(f"{a.store_ip('203.0.114.1')}/64", strict=False) not in same24
    # one /64 -> one /64
    v6 = {ipaddress.ip_network(f"{a.store_ip(f'2001:db8:0:1::{i:x}')}/64", strict=False) for i in range(50)}
    assert len(v6) == 1
    assert a.store_ip("bogus") is None and a.store_ip(None) is None


def test_pseudonymize_without_key_is_refused() -> None:
    with pytest.raises(ValueError, match="pseudonym_key"):
        Privacy(PrivacyConfig(client_ip="pseudonymize"))
    with pytest.raises(ValueError, match="pseudonym_key"):
        Privacy(PrivacyConfig(client_ip="pseudonymize", pseudonym_key=""))


def test_bounded_cache() -> None:
    c: BoundedCache[int, int] = BoundedCache(3)
    for i in range(10):
        c.put(i, i * 2)
    assert len(c) <= 6
    assert c.get(9) == 18 and c.get(0) is None
    with pytest.raises(ValueError):
        BoundedCache(0)


def test_store_host_per_mode() -> None:
    assert P.store_host("dialup-42.isp.example.net") == "dialup-42.isp.example.net"
    t = Privacy(PrivacyConfig(client_ip="truncate"))
    assert t.store_host("dialup-42.isp.Example.NET") == "example.net"
    assert t.store_host("ppp7.example.net.") == "example.net"
    assert t.store_host("alice-pc.lan") is None  # two labels name a host, not a network
    assert t.store_host("localhost") is None and t.store_host(None) is None
    a, b = _pseudo("key-one"), _pseudo("key-two")
    out = a.store_host("dialup-42.example.net")
    assert out is not None and out.startswith("anon-") and len(out) == 21 and "example" not in out
    assert out == a.store_host("DIALUP-42.example.net") != b.store_host("dialup-42.example.net")
    assert a.store_host(None) is None


@pytest.mark.parametrize("mode", ["keep", "truncate", "pseudonymize"])
def test_hostname_clients_are_stored_under_the_privacy_mode_on_both_paths(mode: str) -> None:
    """The stored ``client_host`` follows the mode, identically on the vectorised and the per-line path."""
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.process import Processor, SourceContext

    s = Settings(privacy=PrivacyConfig(client_ip=mode, pseudonym_key="k" * 32 if mode == "pseudonymize" else None))
    lines = [f'{c} - - [01/Jul/1995:00:00:0{i} -0400] "GET /x.html HTTP/1.0" 200 10 "-" "Mozilla/5.0"\n'.encode()
             for i, c in enumerate(["dialup-42.isp.example.net", "203.0.113.9", "ppp7.example.org", "fe80::1%eth0"])]
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="a.log", format="combined")
    proc = Processor(s)
    fast = proc.process(lines, ctx).requests.to_pydict()
    ref = Processor(s).process_reference(lines, ctx).requests.to_pydict()
    assert fast["client_host"] == ref["client_host"] and fast["client_ip"] == ref["client_ip"]
    want = Privacy(s.privacy)
    assert fast["client_host"] == [want.store_host("dialup-42.isp.example.net"), None,
                                   want.store_host("ppp7.example.org"), None]
    assert fast["client_ip"][3] == want.store_ip("fe80::1")  # the zone is dropped before storage
    if mode != "keep":
        assert not any("dialup-42" in (h or "") for h in fast["client_host"])
