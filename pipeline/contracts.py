"""The ``weblogs.raw`` v1 envelope: split and build Kafka message values cheaply (no JSON on the hot path).

Contract (documented in ``schemas/contracts/weblogs.raw.v1.md``; syslog-ng templates write it):

    value = b"fp1\\t<site>\\t<origin_host>\\t<origin_file>\\t<format>\\t<raw line>"
    key   = client address (first field of the line; squid: third column) or empty

* The first five fields never contain a tab; the raw line is everything after the fifth tab and may contain
  tabs.  A trailing ``\\n`` / ``\\r\\n`` is not part of the line.
* ``format`` is a parser spec (preset name, ``apache:…``, ``nginx:…`` or ``auto``); ``-`` means ``auto``.
* Heartbeats: ``format`` = :data:`HEARTBEAT_FORMAT` (``-heartbeat-``); the line part is space-separated
  ``k=v`` (``ts=<unix seconds>`` when the heartbeat was made, ``size=``, ``inode=``); the message says "this
  source is alive" and is never parsed as an access line (:func:`heartbeat_time_ms` reads ``ts``).

Guarantees: :func:`split_envelope` never raises on arbitrary bytes — a value that is not a v1 envelope returns
``None`` (the consumer sends it to the dead-letter topic); :func:`build_envelope` refuses fields that would
break the framing (tabs or newlines in the first five fields) instead of producing an unsplittable value.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ENVELOPE_V1 = b"fp1"
HEARTBEAT_FORMAT = "-heartbeat-"
_HEARTBEAT_B = HEARTBEAT_FORMAT.encode()


class Envelope(NamedTuple):
    site: str
    origin_host: str
    origin_file: str
    format: str
    line: bytes

    @property
    def is_heartbeat(self) -> bool:
        return self.format == HEARTBEAT_FORMAT


def split_raw(value: bytes) -> tuple[bytes, bytes, bytes, bytes, bytes] | None:
    """Fast path: ``(site, origin_host, origin_file, format, line)`` as bytes, or ``None`` if not an fp1 value.

    The consumer groups lines by the four context fields without decoding them per message.
    """
    parts = value.split(b"\t", 5)
    if len(parts) != 6 or parts[0] != ENVELOPE_V1:
        return None
    return parts[1], parts[2], parts[3], parts[4] if parts[4] not in (b"-", b"") else b"auto", _strip_nl(parts[5])


def _strip_nl(line: bytes) -> bytes:
    """``line`` without one trailing ``\n`` / ``\r\n`` (the envelope's line never carries it)."""
    if line.endswith(b"\n"):
        return line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return line


def _prefix_of(value: bytes | None) -> bytes | None:
    """The envelope prefix ``fp1<TAB>site<TAB>host<TAB>file<TAB>format<TAB>`` of ``value``, or ``None``."""
    if value is None:
        return None
    parts = value.split(b"\t", 5)
    if len(parts) != 6 or parts[0] != ENVELOPE_V1:
        return None
    return value[:len(value) - len(parts[5])]


def is_heartbeat_format(fmt: bytes) -> bool:
    return fmt == _HEARTBEAT_B


def split_envelope(value: bytes) -> Envelope | None:
    """Decode one value; ``None`` when it is not a v1 envelope (wrong marker or fewer than six fields)."""
    r = split_raw(value)
    if r is None:
        return None
    site, host, file, fmt, line = r
    dec = _dec
    return Envelope(dec(site), dec(host), dec(file), dec(fmt), line)


def _dec(b: bytes) -> str:
    return b.decode("utf-8", "backslashreplace")


def build_envelope(site: str, origin_host: str, origin_file: str, fmt: str, line: bytes | str) -> bytes:
    """Encode one value.  Raises ``ValueError`` if a context field contains a tab or newline, or ``line`` a newline."""
    fields = (site, origin_host, origin_file, fmt or "auto")
    for f in fields:
        if "\t" in f or "\n" in f or "\r" in f:
            raise ValueError(f"envelope field {f!r} contains a tab or newline")
    raw = line.encode("utf-8", "surrogateescape") if isinstance(line, str) else line
    if b"\n" in raw:
        raise ValueError("an envelope carries exactly one line (the line contains a newline)")
    return b"\t".join((ENVELOPE_V1, *(f.encode() for f in fields), raw))


def build_heartbeat(site: str, origin_host: str, origin_file: str = "", text: str | None = None) -> bytes:
    """A heartbeat value for a source (``origin_file`` empty = every file of the host); ``text`` defaults to
    ``ts=<now>``."""
    import time

    return build_envelope(site, origin_host, origin_file, HEARTBEAT_FORMAT,
                          f"ts={int(time.time())}" if text is None else text)


def heartbeat_time_ms(line: bytes, fallback_ms: int) -> int:
    """When a heartbeat was made: its ``ts=<unix seconds>`` field in ms (heartbeats buffered during a Kafka outage
    arrive late, so the Kafka timestamp would overstate liveness), else ``fallback_ms``."""
    for part in line.split():
        if part.startswith(b"ts="):
            try:
                return int(float(part[3:]) * 1000)
            except ValueError:
                return fallback_ms
    return fallback_ms


def heartbeat_file_state(line: bytes) -> tuple[int, int]:
    """The followed file's ``size=`` (bytes) and ``inode=`` a file heartbeat reports (``syslog-ng/heartbeat.sh``);
    0 for a field that is absent or not a number (host heartbeats, MARKs and listener heartbeats have none).  A
    file that grows while none of its lines arrive is being written but not read: a stuck shipper, not an idle
    site (the traffic detectors' ``pipeline_gap``)."""
    size = inode = 0
    for part in line.split():
        if part.startswith(b"size=") and part[5:].isdigit():
            size = int(part[5:])
        elif part.startswith(b"inode=") and part[6:].isdigit():
            inode = int(part[6:])
    return size, inode


#: ``origin_file`` of a network listener's heartbeat (``syslog-ng/heartbeat.sh``: ``<name>:<port>``, e.g.
#: ``tcp:5140``, ``udp:5140``, ``syslog:5514``, ``syslog5424:5515``).  Raw TCP/UDP lines carry the same label as
#: their ``origin_file`` (with the sender's address as ``origin_host``); syslog lines carry their program/tag.
#: Used by ``source_status`` (consumer) and the source gap detector (detectors/traffic.py) alike.
LISTENER_LABEL_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*:[0-9]{1,5}")

_L = TypeVar("_L")


def covering_listeners(site: str, label: str, listeners: Iterable[_L],
                       where: Callable[[_L], tuple[str, str]]) -> list[_L]:
    """The listeners that may receive a source of ``site`` whose ``origin_file`` is ``label``, for a source that
    never sent a heartbeat of its own; ``where(listener)`` gives a listener's (site, label).

    Raw TCP/UDP lines: the listener whose label is the source's ``origin_file`` (same site, or ``*``).  Syslog
    lines (program/tag as ``origin_file``): every multi-site listener (site ``*``: the syslog ports) -- a syslog
    message does not say which port it came through.  A path (``/...``) is a followed file: it needs heartbeats
    of its own and no listener covers it.  The one rule for ``source_status`` (consumer) and the source gap
    detector (detectors/traffic.py): the status page and a ``pipeline_gap`` must agree on who vouches for a
    sender.  Order is kept."""
    ls = list(listeners)
    exact = [x for x in ls if where(x)[1] == label and where(x)[0] in (site, "*")]
    if exact or label.startswith("/") or LISTENER_LABEL_RE.fullmatch(label):
        return exact
    return [x for x in ls if where(x)[0] == "*"]


#: A file heartbeat as logged in ``source_heartbeat_minute``: (epoch ms of its ``ts=``, ``size=``, ``inode=``);
#: size and inode 0 when it has none.
Beat = tuple[int, int, int]


def file_grew(beats: Sequence[Beat], lo_ms: int, hi_ms: int) -> bool:
    """Whether a followed file kept growing between ``lo_ms`` and ``hi_ms``: two consecutive heartbeats in that
    range (``beats`` in time order) under the same inode with a larger size, in at least two different minutes
    -- lines were written there that should have arrived, and not as a single late write (a buffered log flushed
    once, a hung request logged when it timed out).  A rotation (new inode) or a truncation (smaller size) is
    no growth; heartbeats without a size (host heartbeats, MARKs) never grow.  The one rule behind the traffic
    detectors' stuck-shipper ``pipeline_gap``, ``source_status``'s ``stuck`` and the dashboards' source table
    (which states it in SQL, tested against this)."""
    i = bisect.bisect_left(beats, (lo_ms, -1, -1))
    prev: Beat | None = None
    minutes: set[int] = set()
    while i < len(beats) and beats[i][0] <= hi_ms:
        cur = beats[i]
        if prev is not None and cur[2] == prev[2] and cur[1] > prev[1]:
            minutes.add(cur[0] // 60_000)
            if len(minutes) >= 2:
                return True
        prev = cur
        i += 1
    return False


@dataclass
class SplitBatch:
    """A batch of envelope values split by source, without a Python call per value beyond one slice per line.

    ``groups``: ``(site, origin_host, origin_file, format)`` (bytes, ``-``/empty format already ``auto``) →
    ``(positions, lines)`` in input order; ``heartbeats``: ``(position, source, line)``; ``bad``: positions of
    values that are not v1 envelopes.  Every position appears in exactly one of the three.
    """

    groups: dict[tuple[bytes, bytes, bytes, bytes], tuple[np.ndarray, list[bytes]]]
    heartbeats: list[tuple[int, tuple[bytes, bytes, bytes], bytes]]
    bad: list[int]


def split_values(values: Sequence[bytes | None], blocks: bool = False) -> SplitBatch:
    """Split a batch of ``weblogs.raw`` values exactly as :func:`~forumpulse.pipeline.contracts.split_raw` splits
    each one (same fields, same line, same trailing ``\\n``/``\\r\\n`` removal; ``None`` is not an envelope).
    Tests compare it with ``split_raw`` on arbitrary bytes.

    A batch holds few sources (prefixes ``fp1<TAB>site<TAB>host<TAB>file<TAB>format<TAB>``), so they are found
    one at a time: the first value not yet placed gives a prefix and one Arrow ``starts_with`` over the batch
    finds every value with it (no Python work per value).  After :data:`PREFIX_ROUNDS` prefixes, the rest goes
    through :func:`_split_generic` (numpy over every byte); its sources become blocks too when each has one
    prefix.

    ``blocks=True``: a group's lines come as one :class:`~forumpulse.pipeline.fastpath.BlockLines` (every line
    followed by ``\\n`` in one buffer, cut by an Arrow kernel: no Python object per line) wherever that is the
    same input to :meth:`~forumpulse.pipeline.process.Processor.process` as the list — no line of the group
    holds a ``\\n`` or ends with ``\\r`` (:func:`~forumpulse.pipeline.process.decode_line` would strip those),
    and the group has one prefix spelling — else the list, as without it.  ``block[i]`` is then
    ``line + b"\\n"``.
    """
    n = len(values)
    if n == 0:
        return SplitBatch({}, [], [])
    arr = _binary_array(values)
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    dbuf = arr.buffers()[2]
    raw = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None and dbuf.size else np.zeros(1, np.uint8)
    ends = offs[1:]
    todo = np.ones(n, dtype=bool)
    found: list[tuple[bytes, np.ndarray]] = []  # (prefix, positions) in order of first appearance
    bad: list[int] = []
    rounds = 0
    while rounds < PREFIX_ROUNDS:
        first = int(np.argmax(todo))
        if not todo[first]:
            break
        rounds += 1
        prefix = _prefix_of(values[first])
        if prefix is None:
            bad.append(first)
            todo[first] = False
            continue
        hit = pc.fill_null(pc.starts_with(arr, pattern=prefix), False).to_numpy(zero_copy_only=False)
        pos = np.flatnonzero(todo & hit)
        todo[pos] = False
        found.append((prefix, pos))
    rest = np.flatnonzero(todo)
    sb = _split_generic([values[i] for i in rest.tolist()]) if len(rest) else SplitBatch({}, [], [])

    keyed: dict[tuple[bytes, bytes, bytes, bytes], list[tuple[bytes | None, np.ndarray, list[bytes] | None]]] = {}
    heartbeats = [(int(rest[i]), src, line) for i, src, line in sb.heartbeats]
    for prefix, pos in found:
        _fp1, site, host, file, fmt, _ = prefix.split(b"\t")
        if fmt in (b"-", b""):
            fmt = b"auto"
        if fmt == _HEARTBEAT_B:
            heartbeats += [(i, (site, host, file), _line_of(values[i], len(prefix))) for i in pos.tolist()]
            continue
        keyed.setdefault((site, host, file, fmt), []).append((prefix, pos, None))
    for key, (gpos, glines) in sb.groups.items():
        gp = rest[gpos]
        # a source of the numpy splitter's share keeps the block form when all its values share one prefix
        one = _one_prefix(arr, values, gp) if blocks and key not in keyed else None
        keyed.setdefault(key, []).append((one, gp, None if one is not None else glines))
    firsts = {key: min(int(p[0]) for _, p, _ in parts) for key, parts in keyed.items()}
    # (prefix, positions, lines): lines is None where the prefix gives them
    groups: dict[tuple[bytes, bytes, bytes, bytes], tuple[np.ndarray, Any]] = {}
    for key in sorted(keyed, key=firsts.__getitem__):
        parts = keyed[key]
        only = parts[0][0] if len(parts) == 1 else None
        if only is not None:
            pos = parts[0][1]
            block = _block(arr, raw, ends, pos, len(only)) if blocks else None
            groups[key] = (pos, block if block is not None
                           else [_line_of(values[i], len(only)) for i in pos.tolist()])
            continue
        pieces = [(pos, lines if lines is not None else [_line_of(values[i], len(pr or b"")) for i in pos.tolist()])
                  for pr, pos, lines in parts]
        allpos = np.concatenate([p for p, _ in pieces])
        alllines = [x for _, lines in pieces for x in lines]
        order = np.argsort(allpos, kind="stable")
        groups[key] = (allpos[order], [alllines[k] for k in order.tolist()])
    heartbeats.sort()
    bad = sorted(bad + rest[sb.bad].tolist())
    return SplitBatch(groups, heartbeats, bad)


def _one_prefix(arr: pa.Array, values: Sequence[bytes | None], pos: np.ndarray) -> bytes | None:
    """The envelope prefix of ``values[pos[0]]`` when every value at ``pos`` starts with it, else ``None``."""
    prefix = _prefix_of(values[int(pos[0])])
    if prefix is None:
        return None
    part = arr if len(pos) == len(arr) else arr.take(pa.array(pos))
    return prefix if bool(pc.all(pc.starts_with(part, pattern=prefix)).as_py()) else None


def _binary_array(values: Sequence[bytes | None]) -> pa.Array:
    """``values`` as a large_binary array (``None`` = null): one join and one length pass when there is no
    ``None`` (2x ``pa.array`` on a batch of log lines)."""
    try:
        data = b"".join(values)  # type: ignore[arg-type]
    except TypeError:  # a None (or not bytes): the general conversion
        return pa.array(values, pa.large_binary())
    offs = np.zeros(len(values) + 1, dtype=np.int64)
    lens = map(len, values)  # type: ignore[arg-type]  # no None: the join took them all
    np.cumsum(np.fromiter(lens, dtype=np.int64, count=len(values)), out=offs[1:])
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(values),
                                            [None, pa.py_buffer(offs), pa.py_buffer(data)])


#: prefixes found one by one (one Arrow pass each) before the numpy splitter takes the rest of a batch.  A pass
#: per source is cheaper than the numpy splitter up to hundreds of sources in a 50k batch (30 sources: 22 vs 72 ms,
#: 150: 55 vs 103 ms, 600: 173 vs 180 ms, measured here)
PREFIX_ROUNDS = 256


def _line_of(value: bytes | None, prefix_len: int) -> bytes:
    assert value is not None  # values that matched a prefix
    return _strip_nl(value[prefix_len:])


def _block(arr: pa.Array, raw: np.ndarray, ends: np.ndarray, pos: np.ndarray, prefix_len: int) -> Any:
    """The lines of values ``pos`` of ``arr`` (all with the same prefix of ``prefix_len`` bytes) as one block,
    each line followed by ``\\n``; ``None`` when a line ends with ``\\n`` or ``\\r`` or holds a ``\\n``."""
    from forumpulse.pipeline.fastpath import BlockLines

    if len(pos) == 0:
        return None
    last = raw[ends[pos] - 1]  # a value is longer than its prefix or its last byte is the prefix's tab
    if bool(np.any((last == 10) | (last == 13))):
        return None
    part = arr if len(pos) == len(arr) else arr.take(pa.array(pos))
    # every value's prefix replaced by "\n": "\nline1\nline2...", then the first "\n" moved to the end
    nl_lines = pc.binary_replace_slice(part, 0, prefix_len, b"\n")
    o = np.frombuffer(nl_lines.buffers()[1], dtype=np.int64, count=len(nl_lines) + 1, offset=nl_lines.offset * 8)
    buf = nl_lines.buffers()[2]
    assert buf is not None  # every value has its "\n"
    data = b"".join((memoryview(buf)[int(o[0]) + 1:int(o[-1])], b"\n"))  # one copy
    if data.count(b"\n") != len(pos):  # a line holds a "\n" of its own
        return None
    return BlockLines(data, o - o[0])  # line i: its "\n"-prefixed value, the "\n" moved behind it


def _split_generic(values: Sequence[bytes | None]) -> SplitBatch:
    """:func:`split_values` for any batch: the 5th tab of every value is found with numpy over the whole batch
    and the distinct prefixes are dictionary-encoded by Arrow (used for what the prefix loop leaves)."""
    n = len(values)
    if n == 0:
        return SplitBatch({}, [], [])
    arr = _binary_array(values)
    offs = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    dbuf = arr.buffers()[2]
    raw = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None and dbuf.size else np.zeros(0, np.uint8)
    data = np.zeros(len(raw) + 8, np.uint8)  # padded: reads past a value's end stay in bounds
    data[:len(raw)] = raw
    starts, ends = offs[:-1], offs[1:]
    tabs = np.flatnonzero(raw == 9)
    nt = len(tabs)
    ok = ends - starts >= 8  # "fp1" + 5 tabs at least
    if nt >= 5:
        k = np.searchsorted(tabs, starts)
        k1 = np.minimum(k, nt - 1)
        k5 = np.minimum(k + 4, nt - 1)
        t5 = tabs[k5]
        ok &= (k + 4 < nt) & (t5 < ends) & (tabs[k1] == starts + 3)
        ok &= (data[starts] == 0x66) & (data[starts + 1] == 0x70) & (data[starts + 2] == 0x31)  # b"fp1"
    else:
        t5 = starts
        ok[:] = False
    bad = np.flatnonzero(~ok).tolist()
    okp = np.flatnonzero(ok)
    groups: dict[tuple[bytes, bytes, bytes, bytes], tuple[np.ndarray, list[bytes]]] = {}
    heartbeats: list[tuple[int, tuple[bytes, bytes, bytes], bytes]] = []
    if not len(okp):
        return SplitBatch(groups, heartbeats, bad)
    s_ok = starts[okp]
    e_ok = ends[okp]
    line_lo = t5[okp] + 1  # absolute start of the line
    plen = line_lo - s_ok
    # trailing "\n" / "\r\n" of the line part (split_raw removes one of them)
    ll = e_ok - line_lo
    nl = (ll >= 1) & (data[e_ok - 1] == 10)
    crnl = nl & (ll >= 2) & (data[e_ok - 2] == 13)
    line_hi = e_ok - nl - crnl
    # distinct prefixes: gather them into one binary array and dictionary-encode it
    cum = np.zeros(len(okp) + 1, np.int64)
    np.cumsum(plen, out=cum[1:])
    gidx = np.repeat(s_ok - cum[:-1], plen) + np.arange(int(cum[-1]), dtype=np.int64)
    parr = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(okp),
                                            [None, pa.py_buffer(cum), pa.py_buffer(data[gidx].tobytes())])
    enc = parr.dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    prefixes = enc.dictionary.to_pylist()
    rel_lo = (plen).tolist()
    rel_hi = (line_hi - s_ok).tolist()
    okl = okp.tolist()
    by_key: dict[tuple[bytes, bytes, bytes, bytes], list[int]] = {}
    for code, prefix in enumerate(prefixes):
        _fp1, site, host, file, fmt, _ = prefix.split(b"\t")
        if fmt in (b"-", b""):
            fmt = b"auto"
        if fmt == _HEARTBEAT_B:
            for j in np.flatnonzero(codes == code).tolist():
                i = okl[j]
                heartbeats.append((i, (site, host, file), values[i][rel_lo[j]:rel_hi[j]]))
            continue
        by_key.setdefault((site, host, file, fmt), []).append(code)
    single = len(prefixes) == 1
    for key, codes_k in by_key.items():
        sel = np.arange(len(okp)) if single else np.flatnonzero(np.isin(codes, codes_k))
        sl = sel.tolist()
        lines = [values[okl[j]][rel_lo[j]:rel_hi[j]] for j in sl]
        groups[key] = (okp[sel], lines)
    heartbeats.sort()
    return SplitBatch(groups, heartbeats, bad)
