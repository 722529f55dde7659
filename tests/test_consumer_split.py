"""The consumer's batch envelope splitter (:func:`forumpulse.pipeline.contracts.split_values`) against the
per-message definition (:func:`forumpulse.pipeline.contracts.split_raw`) on arbitrary and tricky values."""

from __future__ import annotations

from forumpulse.pipeline.contracts import (
    HEARTBEAT_FORMAT,
    build_envelope,
    build_heartbeat,
    split_raw,
    split_values,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def _reference(values: list[bytes | None]) -> tuple[dict, list, list]:
    groups: dict = {}
    hbs: list = []
    bad: list = []
    for i, v in enumerate(values):
        r = split_raw(v or b"") if v is not None else None
        if r is None:
            bad.append(i)
            continue
        if r[3] == HEARTBEAT_FORMAT.encode():
            hbs.append((i, (r[0], r[1], r[2]), r[4]))
            continue
        g = groups.setdefault(r[:4], ([], []))
        g[0].append(i)
        g[1].append(r[4])
    return groups, hbs, bad


def _check(values: list[bytes | None]) -> None:
    sb = split_values(values)
    groups, hbs, bad = _reference(values)
    assert sb.bad == bad
    assert sb.heartbeats == hbs
    assert list(sb.groups) == list(groups)  # same keys in the same (first appearance) order
    for k, (pos, lines) in sb.groups.items():
        assert pos.tolist() == groups[k][0]
        assert lines == groups[k][1]


_field = st.sampled_from([b"forum", b"", b"web1", b"-", b"a\xffb", b"fp1", b"combined", b"auto",
                          HEARTBEAT_FORMAT.encode()])
_line = st.binary(max_size=40) | st.sampled_from([b"", b"\n", b"\r\n", b"x\r", b"x\r\n", b"x\n\n", b"a\tb\tc",
                                                   b"\r", b"1.2.3.4 - - [x] \"GET / HTTP/1.1\" 200 5\r\n"])


@st.composite
def _value(draw: st.DrawFn) -> bytes | None:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return None
    if kind == 1:
        return draw(st.binary(max_size=30))
    if kind == 2:  # near misses of the marker / field count
        return draw(st.sampled_from([b"fp1", b"fp1\t", b"fp1\ta\tb\tc\td", b"fp2\ta\tb\tc\td\tl", b"FP1\ta\tb\tc\td\tl",
                                     b"xfp1\ta\tb\tc\td\tl", b"fp1\t\t\t\t\t", b"fp1 a\tb\tc\td\te\tf"]))
    fields = [draw(_field) for _ in range(4)]
    return b"\t".join([b"fp1", *fields, draw(_line)])


@settings(max_examples=300, deadline=None)
@given(st.lists(_value(), max_size=40))
def test_split_values_equals_split_raw_per_message(values: list[bytes | None]) -> None:
    _check(values)


def test_split_values_on_a_realistic_mixed_batch() -> None:
    values: list[bytes | None] = []
    for i in range(3000):
        site = [b"forum", b"proxy", b"news"][i % 3].decode()
        if i % 97 == 0:
            values.append(build_heartbeat(site, "web3", "/var/log/a.log", f"ts={1700000000 + i}"))
        elif i % 211 == 0:
            values.append(f"garbage {i}".encode())
        else:
            fmt = ["combined", "-", "auto", "squid"][i % 4]
            values.append(build_envelope(site, f"web{i % 2}", "/var/log/a.log", fmt,
                                         f'10.0.0.{i % 250} - - [x] "GET /t/{i} HTTP/1.1" 200 {i}'))
    values[5] = values[5] + b"\r\n"  # type: ignore[operator]
    values[7] = None
    _check(values)
    sb = split_values(values)
    # "-" and "auto" formats land in one group per source, in input order
    pos, _ = sb.groups[(b"forum", b"web0", b"/var/log/a.log", b"auto")]
    assert pos.tolist() == sorted(pos.tolist()) and len(pos) > 100
    assert sum(len(p) for p, _ in sb.groups.values()) + len(sb.heartbeats) + len(sb.bad) == len(values)


def test_split_values_empty_and_all_bad() -> None:
    assert split_values([]).groups == {}
    sb = split_values([None, b"", b"\t\t\t\t\t"])
    assert sb.bad == [0, 1, 2] and not sb.groups and not sb.heartbeats
