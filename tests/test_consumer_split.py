"""The consumer's batch envelope splitter (:func:`forumpulse.pipeline.contracts.split_values`) against the
per-message definition (:func:`forumpulse.pipeline.contracts.split_raw`) on arbitrary and tricky values."""

from __future__ import annotations

import pytest
from forumpulse.pipeline import contracts
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.contracts import (
    HEARTBEAT_FORMAT,
    build_envelope,
    build_heartbeat,
    split_raw,
    split_values,
)
from forumpulse.pipeline.fastpath import BlockLines
from forumpulse.pipeline.process import Processor, SourceContext
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


def _check(values: list[bytes | None], blocks: bool = False) -> int:
    """split_values against the per-message reference; returns how many groups came as blocks."""
    sb = split_values(values, blocks=blocks)
    groups, hbs, bad = _reference(values)
    assert sb.bad == bad
    assert sb.heartbeats == hbs
    assert list(sb.groups) == list(groups)  # same keys in the same (first appearance) order
    n_blocks = 0
    for k, (pos, lines) in sb.groups.items():
        assert pos.tolist() == groups[k][0]
        if isinstance(lines, BlockLines):
            assert blocks
            n_blocks += 1
            # a block is the same lines, each followed by "\n", and only when that is lossless
            assert [x[:-1] for x in lines] == groups[k][1]
            assert all(x.endswith(b"\n") and x.count(b"\n") == 1 for x in lines)
            assert not any(x.endswith(b"\r") for x in groups[k][1])
            assert lines.data == b"".join(x + b"\n" for x in groups[k][1])
        else:
            assert lines == groups[k][1]
    return n_blocks


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
@given(st.lists(_value(), max_size=40), st.booleans())
def test_split_values_equals_split_raw_per_message(values: list[bytes | None], blocks: bool) -> None:
    _check(values, blocks)


@settings(max_examples=150, deadline=None)
@given(st.lists(_value(), max_size=40), st.booleans(), st.integers(0, 3))
def test_split_values_prefix_loop_and_numpy_rest_agree(values: list[bytes | None], blocks: bool, rounds: int,
                                                       ) -> None:
    """However many prefixes the Arrow loop takes before the numpy splitter gets the rest, the split is the same."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contracts, "PREFIX_ROUNDS", rounds)
        _check(values, blocks)


_SETTINGS = Settings()
_PROCS = [Processor(_SETTINGS), Processor(_SETTINGS)]
_access_line = st.sampled_from([
    b'10.0.0.1 - - [10/Oct/2023:13:55:36 +0800] "GET /threads/a.12/ HTTP/1.1" 200 512 "-" "curl/8"',
    b'2001:db8::1 - bob [10/Oct/2023:13:55:37 +0800] "POST /posts HTTP/2.0" 302 - "https://x/t/1" "Mozilla/5.0"',
    b'10.0.0.2 - - [10/Oct/2023:13:55:38 +0800] "GET /t/slug/77 HTTP/1.1" 200 9 "-" "Googlebot/2.1"',
    b'host.example - - [10/Oct/2023:13:55:39 +0800] "GET / HTTP/1.0" 200 1 "-" "-"\r',
    b'10.0.0.3 - - [10/Oct/2023:13:55:40 +0800] "GET /index.php?topic=5.0 HTTP/1.1" 200 5 "-" "x"\n',
    b"1700000000.123    45 10.0.0.4 TCP_MISS/200 1234 GET http://f.example/t/9 - HIER_DIRECT/10.1.1.1 text/html",
    b"not an access line", b"", b"\xff\xfe broken", b'10.0.0.5 - - [10/Oct/2023:13:55:41 +0800] "GET /a\tb HTTP/1.1" 200 5',
])


@settings(max_examples=60, deadline=None)
@given(st.lists(_access_line, min_size=1, max_size=30), st.sampled_from(["combined", "squid", "auto", "common"]))
def test_processing_a_block_equals_processing_the_list(lines: list[bytes], fmt: str) -> None:
    """The consumer processes a group's block: the same requests, stream and quarantine as processing the lines
    split_raw gives."""
    values = [b"fp1\tforum\tweb1\t/var/log/a.log\t" + fmt.encode() + b"\t" + x for x in lines]  # "\n" too
    ref_lines = [split_raw(v)[4] for v in values]  # type: ignore[index]
    sb = split_values(values, blocks=True)
    ((_pos, got),) = sb.groups.values()
    if not any(x.endswith((b"\r", b"\n")) for x in lines):  # lossless as a block: it must come as one
        assert isinstance(got, BlockLines)
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="/var/log/a.log", format=fmt)
    want = _PROCS[0].process(ref_lines, ctx, source_ref="t")
    out = _PROCS[1].process(got, ctx, source_ref="t")
    assert out.requests.equals(want.requests)
    assert out.stream.equals(want.stream)
    assert out.quarantine.drop_columns(["ingested_at"]).equals(want.quarantine.drop_columns(["ingested_at"]))
    assert (out.read, out.loaded, out.quarantined, out.by_reason) == (want.read, want.loaded, want.quarantined,
                                                                       want.by_reason)


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
    # as blocks: every group but the one holding the "\r\n" line (a block cannot carry it) and the "auto"
    # groups that mix the "-" and "auto" spellings; the same when the numpy splitter does all the work (a batch
    # with more sources than PREFIX_ROUNDS)
    n_blocks = _check(values, blocks=True)
    assert n_blocks >= 3
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contracts, "PREFIX_ROUNDS", 0)
        assert _check(values, blocks=True) == n_blocks
    sb = split_values(values)
    # "-" and "auto" formats land in one group per source, in input order
    pos, _ = sb.groups[(b"forum", b"web0", b"/var/log/a.log", b"auto")]
    assert pos.tolist() == sorted(pos.tolist()) and len(pos) > 100
    assert sum(len(p) for p, _ in sb.groups.values()) + len(sb.heartbeats) + len(sb.bad) == len(values)


def test_split_values_empty_and_all_bad() -> None:
    assert split_values([]).groups == {}
    sb = split_values([None, b"", b"\t\t\t\t\t"])
    assert sb.bad == [0, 1, 2] and not sb.groups and not sb.heartbeats
