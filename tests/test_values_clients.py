"""Client address classification: the C pre-check (inet_pton) and the vectorised IPv4 test give exactly what
``ipaddress`` decides, on fuzzed texts and on the awkward forms real logs hold."""

from __future__ import annotations

import ipaddress

import pyarrow as pa
from forumpulse.pipeline.fastpath import _clients
from forumpulse.pipeline.formats import _values as V
from hypothesis import given, settings
from hypothesis import strategies as st


def by_ipaddress(text: str) -> tuple[str | None, str | None] | None:
    """The classification with ``ipaddress`` alone (the rule classify_client documents)."""
    t = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.ip_address(t.split("%", 1)[0] if ":" in t else t)
        return (t.split("%", 1)[0], None)  # the zone of a link-local IPv6 address is dropped
    except ValueError:
        return None


AWKWARD = ["1.2.3.4", "01.2.3.4", "1.2.3.04", "256.1.1.1", "1.2.3", "1.2.3.4.5", "0.0.0.0", "255.255.255.255",
           "::", "::1", "[::1]", "fe80::1%eth0", "[fe80::1%25eth0]", "::ffff:1.2.3.4", "::ffff:1.2.3.04",
           "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "12345::", "::g", "a.b.example", "host-1", "-", "",
           "1.2.3.4 ", "１.2.3.4", "1.2.3.4\n", "[1.2.3.4]", ":::", "1::2::3", "::1.2.3.4.5"]

texts = st.one_of(
    st.text(alphabet="0123456789abcdefABCDEF:.%[]", max_size=45),
    st.builds(lambda n: str(ipaddress.IPv6Address(n)), st.integers(0, 2**128 - 1)),
    st.builds(lambda n: str(ipaddress.IPv4Address(n)), st.integers(0, 2**32 - 1)),
    st.sampled_from(AWKWARD),
)


@settings(deadline=None, max_examples=3000)
@given(texts)
def test_ip_texts_are_classified_as_ipaddress_decides(text):
    got = V.classify_client(text)
    want = by_ipaddress(text)
    if want is not None:
        assert got == want
    else:  # not an IP: a hostname or bad, never an IP
        assert got is None or got[0] is None


@settings(deadline=None, max_examples=300)
@given(st.lists(texts, min_size=1, max_size=60))
def test_vectorised_client_column_equals_classify_client_per_value(values):
    real_ip, host, bad, ip_dict, idx = _clients(pa.array(values, pa.string()).cast(pa.string_view()))
    want = [V.classify_client(v) for v in values]
    assert real_ip.to_pylist() == [w[0] if w else None for w in want]
    assert host.to_pylist() == [w[1] if w else None for w in want]
    assert ip_dict.take(idx).to_pylist() == real_ip.to_pylist()
    want_bad = [w is None for w in want]
    assert (bad.tolist() if bad is not None else [False] * len(values)) == want_bad


def test_awkward_forms():
    assert V.classify_client("[::1]") == ("::1", None)
    assert V.classify_client("fe80::1%eth0") == ("fe80::1", None)
    assert V.classify_client("[fe80::1%25eth0]") == ("fe80::1", None)
    assert V.classify_client("01.2.3.4") != ("01.2.3.4", None)  # leading zeros: not an IPv4 address
    assert V.classify_client("a.b.example") == (None, "a.b.example")
    assert V.classify_client("1.2.3.4 ") is None
