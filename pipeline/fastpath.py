"""Vectorised processing of a chunk of raw lines: the fast path behind :meth:`Processor.process`.

The per-line path (:meth:`forumpulse.pipeline.process.Processor.process_reference`) costs ~10 µs per line in
Python.  This module does the same work per *chunk* with Arrow compute kernels (C++, RE2) and calls the exact
reference functions (timestamp, client, request-line, privacy, enrichment) once per *distinct* value instead of
once per line.

How a chunk is processed (:meth:`FastPath.run`):

1. the raw lines (``bytes``, trailing newline included) are one buffer with line offsets (no per-line copies);
   lines that are not valid UTF-8 or longer than ``max_line_bytes`` are left to the reference path;
2. one RE2 regex per format (:class:`SplitPlan`, built from the same tokens as the format's own ``fast`` regex)
   accepts a line only if it is a *subset* match: the format's strict regex matches it, the quoted fields hold
   no ``"`` and the unquoted fields hold no whitespace (except the one space inside ``[10/Oct/2000:13:55:36
   -0700]``).  For such a line the k-th quote / the k-th space of a segment *is* a field boundary, so field
   bounds come from the sorted positions of ``"`` and `` `` in the buffer (numpy) and fields become
   ``string_view`` arrays pointing into the buffer (no copy);
3. fields are converted column-wise: numbers straight from the bytes (at most 12 digits; longer ones go to the
   reference), ``-`` fields as validity bitmaps, the rest through :func:`pyarrow.compute.dictionary_encode` and
   one call of the reference converter per *distinct* value (timestamps, clients, request lines, referers,
   user agents, privacy scrubbing and the enrichment repeat a lot);
4. every line that was not accepted, or whose value did not convert (a ``Drop`` on the reference path, an
   over-long number), goes through the reference per-line code, so drops, reasons, details and lenient
   parsing are exactly the reference's;
5. both parts are merged back into input order and laid out as ``pa.array`` lays out the reference's columns.

Guarantee: :meth:`FastPath.run` returns tables equal to :meth:`Processor.process_reference` on the same input
(same schema, values and Arrow IPC bytes; ``quarantine.ingested_at`` is the wall clock in both); tests/test_fastpath*.py check this on every fixture
log and on generated lines.  It relies on ``Enricher.derive`` being the composition of a page part (method,
path, query, content type) and a bot part (``BotDetector.detect`` of the user agent), as documented there; the
response status's rule for ``topic_view``/``reply`` (``enrich.status_page_kind``) is applied afterwards on the
assembled rows (``enrich.status_page_kinds`` in :meth:`FastPath._merge`), never in the per-request-line cache.

Formats: every preset (native ``squid`` lines without header columns and with only spaces between columns:
:meth:`FastPath.convert_squid`), ``auto`` (the preset state machine of ``AutoParser`` is replayed: runs of lines
the current preset accepts are vectorised, every other line goes through the parser itself, so its state after
the call is the reference's), and custom ``apache:``/``nginx:`` specs built from supported directives
(:func:`plan_for_spec` returns ``None`` otherwise and the reference path is used).

Input: a list of ``bytes`` lines (:meth:`Processor.process`) or one block of bytes split after every ``\\n``
(:class:`BlockLines`, :meth:`Processor.process_block`, no per-line objects at all).

Misuse: the fast path only takes ``bytes`` lines (``str`` lines use the reference path); it is not
thread-safe (it uses the processor's caches and parser).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from forumpulse.pipeline import native
from forumpulse.pipeline.enrich import REFERER_TOPIC, status_page_kinds
from forumpulse.pipeline.formats import PRESETS, compile_spec
from forumpulse.pipeline.formats import _values as V
from forumpulse.pipeline.formats.compiler import (
    CLIENT,
    FLOAT,
    FORWARDED_RX,
    LIST,
    LIST_RX,
    NUM,
    SQUID_SS,
    STR,
    TIME_CLF,
    TIME_RAW,
    WORD,
    Tok,
    _field_rx,
    build_regexes,
    tokenize_apache,
    tokenize_nginx,
)
from forumpulse.pipeline.privacy import BoundedCache
from forumpulse.pipeline.record import Drop
from forumpulse.pipeline.tables import STREAM_SCHEMA

if TYPE_CHECKING:
    from forumpulse.pipeline.process import ProcessedBatch, Processor, SourceContext

__all__ = ["BlockLines", "FastPath", "SplitPlan", "plan_for_spec"]

# Python re.ASCII \s is exactly these six characters (RE2's \s lacks \v), so classes are spelled out.
_WS = r"\t\n\x0b\x0c\r "
_SLOTS_OK = {
    "ignore", "time", "client_a", "client_c", "client_h", "ident", "user", "request", "status_final", "status",
    "status_orig", "bytes_body", "bytes_total", "el_us", "el_ms", "el_s", "referer", "user_agent", "upstream",
    "content_type", "vhost_v", "vhost_V", "vhost_host", "vhost_sn", "squid_ss",
    # X-Forwarded-For: read only for a site with trusted proxies (:func:`_forwarded`); a format with the header
    # but no peer field goes to the reference path for such a site (Processor.process)
    "forwarded",
}
#: H1's fast bodies that can hold neither whitespace nor a quote, kept as they are (RE2 reads them alike).
_SAFE_BODIES = {
    r"\d+|-": r"\d+|-",
    r"\d+(?:\.\d+)?|-": r"\d+(?:\.\d+)?|-",
    r"\d{4}-[\d:T.+Z-]+|-": r"\d{4}-[\d:T.+Z-]+|-",
    r"[A-Za-z_0-9]+:[A-Za-z_0-9]+|-": r"[A-Za-z_0-9]+:[A-Za-z_0-9]+|-",
}
_SAFE_CHARS = set("0123456789-.:+TZ_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_RE2_SPECIAL = set("\\.+*?()|[]{}^$")


def _re2_escape(text: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


@dataclass
class _Field:
    """Where one needed field sits after splitting: quote segment, piece range, literal prefix/suffix, and the
    literals separating it from earlier fields of the same piece (split on their first occurrence)."""

    group: int
    segment: int
    quoted: bool
    piece: int = 0
    two_pieces: bool = False
    prefix: str = ""
    suffix: str = ""
    before: tuple[str, ...] = ()  # literals between the piece start (after prefix) and this field
    after: str = ""  # literal that follows this field inside the piece ("" when the field ends the piece)
    last: bool = False  # the field ends the line (strip the newline)


@dataclass
class SplitPlan:
    """Vectorised extraction recipe of one format (see the module docstring)."""

    name: str
    regex: str  # RE2, anchored, no groups
    n_segments: int
    pieces: dict[int, int]  # even segment -> number of space-separated pieces (only for segments we split)
    fields: dict[int, _Field]  # group index -> location
    toks: list[Tok]
    slots: dict[str, list[int]]
    time_kind: str  # clf | iso | epoch
    kinds: dict[int, str]  # group index -> field kind
    squid: bool = False  # native squid: tokens split on runs of spaces (see FastPath.convert_squid)
    #: the regex as a native scanner program (``None``: RE2 and numpy positions; see forumpulse.pipeline.native)
    prog: native.Program | None = None


def _tokens_for(spec: str) -> list[Tok] | None:
    kind, _, body = spec.partition(":")
    if kind == "apache":
        return tokenize_apache(body)
    if kind == "nginx":
        return tokenize_nginx(body)
    if kind == "squid" and body == "combined":
        from forumpulse.pipeline.formats.squid import COMBINED_LOGFORMAT

        toks = tokenize_apache(COMBINED_LOGFORMAT)
        toks.append(Tok(literal=" "))
        toks.append(Tok(slot="squid_ss", kind=SQUID_SS))
        return toks
    return None


def _restricted_body(toks: list[Tok], i: int, quoted: bool) -> str | None:
    """RE2 body accepting a subset of the format's fast body: no quote, no whitespace (one space in a CLF time)."""
    t = toks[i]
    body = _field_rx(toks, i, "fast")
    if quoted:
        return body if body in (r'[^"]*', r'-|[^"]*') else None
    if t.kind == TIME_CLF and body == r"\[[^\]]*\]|-":
        return rf'\[[^\]"{_WS}]* [^\]"{_WS}]*\]'
    if t.kind == TIME_RAW and t.ts_kind == "clf" and body == r"[^\]]*":
        return rf'[^\]"{_WS}]* [^\]"{_WS}]*'
    cond = ""
    if body.startswith("-|"):
        cond, body = "-|", body[2:]
    if body in _SAFE_BODIES:
        return cond + _SAFE_BODIES[body]
    if body in (r"\S+", r"\S*"):
        return cond + rf'[^"{_WS}]' + body[-1]
    if body in (LIST_RX, FORWARDED_RX):  # one value: a line with a list takes the reference path
        return cond + rf'[^"{_WS},]+'
    m = re.fullmatch(r"\[\^\\s(\\?.)\]\+", body)
    if m:  # [^\s<stop>]+
        return cond + rf'[^"{_WS}{m.group(1)}]+'
    return None


def plan_time_two(body: str) -> bool:
    """A restricted CLF time body: one space inside, so it spans two space-separated pieces."""
    return body.endswith(rf'* [^\]"{_WS}]*\]') or body.endswith(rf'* [^\]"{_WS}]*')


def _can_contain(body: str, c: str) -> bool:
    """Whether a restricted body may match a text containing character ``c``."""
    if body.startswith("-|"):
        return c == "-" or _can_contain(body[2:], c)
    if body in _SAFE_BODIES.values():
        return c in _SAFE_CHARS
    m = re.fullmatch(r"\[\^(.*)\][*+]", body)
    if m:
        excluded = m.group(1).replace(_WS, "\t\n\x0b\x0c\r ").replace("\\", "")
        return c not in excluded
    return True


def _first(slots: dict[str, list[int]], *names: str) -> int | None:
    for n in names:
        if n in slots:
            return slots[n][0]
    return None


def _time_kind(toks: list[Tok]) -> str | None:
    times = [t for t in toks if t.literal is None and t.slot == "time"]
    if len(times) != 1:
        return None
    t = times[0]
    if t.kind == TIME_CLF:
        return "clf"
    if t.kind == TIME_RAW and t.ts_kind in ("clf", "iso", "epoch"):
        return t.ts_kind
    return None


def plan_for_spec(spec: str, name: str) -> SplitPlan | None:
    """The split plan of a format spec, or ``None`` when the format has something the fast path does not
    handle (the reference path is used then; results are the same either way)."""
    try:
        toks = _tokens_for(spec)
    except Exception:
        return None
    if not toks:
        return None
    try:
        if build_regexes(toks)[0].pattern != compile_spec(spec).fast.pattern:
            return None  # the parser was built differently from what this module knows: stay on the reference
    except Exception:
        return None
    if _time_kind(toks) is None:
        return None
    for t in toks:
        if t.literal is not None:
            lit = t.literal
            if not lit.isascii() or any(c.isspace() and c != " " for c in lit):
                return None
        elif t.slot not in _SLOTS_OK or t.kind not in (WORD, STR, NUM, FLOAT, CLIENT, TIME_CLF, TIME_RAW, SQUID_SS, LIST):
            return None
    # slots -> group indices (every supported token has exactly one group), ranked as the compiler does
    slots: dict[str, list[int]] = {}
    ranks: dict[int, int] = {}
    gi = 0
    tok_of: dict[int, int] = {}
    for ti, t in enumerate(toks):
        if t.literal is None:
            slots.setdefault(t.slot, []).append(gi)
            ranks[gi] = t.rank
            tok_of[gi] = ti
            gi += 1
    for lst in slots.values():
        lst.sort(key=lambda k: ranks[k])
    needed = {g for g in (
        _first(slots, "time"), _first(slots, "client_a", "client_c", "client_h"), _first(slots, "ident"),
        _first(slots, "user"), _first(slots, "request"), _first(slots, "status_final", "status", "status_orig"),
        _first(slots, "bytes_body", "bytes_total"),
        _first(slots, "el_us", "el_ms", "el_s"),
        _first(slots, "referer"), _first(slots, "user_agent"), _first(slots, "upstream"),
        _first(slots, "content_type"), _first(slots, "vhost_v", "vhost_V", "vhost_host", "vhost_sn"),
        _first(slots, "squid_ss"), _first(slots, "forwarded"),
    ) if g is not None}

    # Walk the tokens: split literals on '"' into segments, even segments on ' ' into pieces.
    rx: list[str] = ["^"]
    fields: dict[int, _Field] = {}
    bodies: dict[int, str] = {}
    segment = 0
    piece = 0
    pending: list[str] = []  # literal text seen in the current piece since its start / the last field
    piece_fields: list[_Field] = []  # fields of the current piece (unquoted segments)
    quote_field: int | None = None  # group of the field filling the current odd segment
    pieces: dict[int, int] = {}
    in_quotes = False
    ends: dict[int, tuple[int, int]] = {}  # group -> (segment, last piece) for unquoted fields

    def close_piece() -> None:
        nonlocal pending, piece_fields
        if piece_fields:
            piece_fields[-1].suffix = "".join(pending)
        pending = []
        piece_fields = []

    gi = 0
    for ti, t in enumerate(toks):
        if t.literal is not None:
            rx.append(_re2_escape(t.literal))
            for k, part in enumerate(t.literal.split('"')):
                if k > 0:  # a quote: the segment changes
                    if in_quotes:
                        if pending or quote_field is None:
                            return None  # literal text inside the quotes, or empty quotes: not supported
                        pending = []
                    else:
                        close_piece()
                        pieces[segment] = piece + 1
                    segment += 1
                    piece = 0
                    in_quotes = not in_quotes
                    quote_field = None
                if not part:
                    continue
                if in_quotes:
                    pending.append(part)
                    continue
                for j, sub in enumerate(part.split(" ")):
                    if j > 0:
                        close_piece()
                        piece += 1
                    if sub:
                        pending.append(sub)
            continue
        g = gi
        gi += 1
        body = _restricted_body(toks, ti, in_quotes)
        if body is None:
            return None
        bodies[g] = body
        rx.append("(?:" + body + ")")
        if in_quotes:
            if pending or quote_field is not None:
                return None
            quote_field = g
            fields[g] = _Field(g, segment, True)
            continue
        is_time2 = t.kind in (TIME_CLF, TIME_RAW) and plan_time_two(body)
        if piece_fields:
            prev = piece_fields[-1]
            sep = "".join(pending)
            if not sep or is_time2 or prev.two_pieces or _can_contain(bodies[prev.group], sep[0]):
                return None  # adjacent fields, or a separator the previous field may contain
            prev.after = sep
            f = _Field(g, segment, False, piece, prefix=piece_fields[0].prefix, before=(*prev.before, sep))
        else:
            f = _Field(g, segment, False, piece, two_pieces=is_time2, prefix="".join(pending))
        pending = []
        fields[g] = f
        piece_fields.append(f)
        if is_time2:  # the field ends in the next piece, which must hold nothing else but a suffix
            piece += 1
        ends[g] = (segment, piece)
    if in_quotes:
        return None
    close_piece()
    pieces[segment] = piece + 1
    rx.append(r"(?:\r\n|\n)?$")
    for g, (seg, pc_end) in ends.items():  # fields in the line's last piece carry the newline
        if seg == segment and pc_end == piece:
            fields[g].last = True
    tk = _time_kind(toks)
    assert tk is not None
    kinds = {g: toks[ti].kind for g, ti in tok_of.items()}
    plan = SplitPlan(name, "".join(rx), segment + 1, pieces, {g: fields[g] for g in needed}, toks, slots, tk, kinds)
    try:
        pc.match_substring_regex(pa.array([""]), plan.regex)
    except Exception:
        return None
    return plan


_T = rf"[^{_WS}]"
#: The subset of ``formats.squid.FAST`` taken by the fast path: the same tokens, only spaces between them, no
#: header columns (9 or 10 tokens).  For such a line the groups of FAST are the space-separated tokens.
SQUID_RE2 = (rf"^ *\d+\.\d{{1,6}} +-?\d+ +{_T}+ +[A-Za-z0-9_]+/\d{{1,3}} +(?:\d+|-) +{_T}+ +{_T}+ +{_T}+"
             rf" +[A-Za-z0-9_]+/{_T}+(?: +{_T}*)? *(?:\r\n|\n)?$")


def squid_plan(name: str) -> SplitPlan | None:
    """The plan of native squid lines, or ``None`` when the squid parser is not the one this module knows."""
    from forumpulse.pipeline.formats import squid

    if squid.FAST.pattern != (r" *(\d+)\.(\d{1,6}) +(-?\d+) +(\S+) +([A-Za-z0-9_]+)/(\d{1,3}) +(\d+|-) +(\S+) +(\S+)"
                              r" +(\S+) +([A-Za-z0-9_]+)/(\S+)(?: +(\S*))?(?: +\[(.*)\] +\[(.*)\])? *"):
        return None
    return SplitPlan(name, SQUID_RE2, 1, {}, {}, [], {}, "epoch", {}, squid=True)


# ----------------------------------------------------------------------------------------------- helpers

_NULL_STR = pa.scalar(None, pa.string())


def _dict(arr: pa.Array) -> tuple[list[Any], pa.Array]:
    d = pc.dictionary_encode(arr)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    return d.dictionary.to_pylist(), d.indices


# a dotted quad exactly as ``ipaddress.IPv4Address`` accepts it (decimal octets 0-255, no leading zeros)
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RE = rf"^(?:{_OCTET}\.){{3}}{_OCTET}$"


def _clients(view: pa.Array) -> tuple[pa.Array, pa.Array, np.ndarray | None, pa.Array, pa.Array]:
    """Client fields of a column of logged client texts: ``(real_ip, client_host, bad, ip_dict, idx)``.

    Same values as :func:`V.classify_client` per distinct text, but plain IPv4 addresses (nearly every client in
    real logs) are recognised by one vectorised regex over the distinct values; only the others (IPv6, bracketed
    or zoned forms, hostnames, garbage) go through Python.  ``bad`` marks rows whose text is neither an IP nor a
    hostname (``None`` when there is none).  ``real_ip == ip_dict.take(idx)``: callers that map each distinct IP
    once (privacy) use the pair."""
    d = pc.dictionary_encode(view)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    dic = d.dictionary.cast(pa.string())
    idx = d.indices
    v4 = np.asarray(pc.match_substring_regex(dic, _IPV4_RE).to_numpy(zero_copy_only=False), dtype=bool)
    other = np.flatnonzero(~v4)
    if len(other) == 0:
        return dic.take(idx), pa.nulls(len(idx), pa.string()), None, dic, idx
    res = [_safe(V.classify_client, u) for u in dic.take(pa.array(other)).to_pylist()]
    pos = np.full(len(dic), len(other), dtype=np.int64)
    pos[other] = np.arange(len(other))
    ip_other = pa.array([r[0] if r else None for r in res] + [None], type=pa.string()).take(pa.array(pos))
    ip_dict = pc.if_else(pa.array(v4), dic, ip_other)
    host_dict = pa.array([r[1] if r else None for r in res] + [None], type=pa.string()).take(pa.array(pos))
    bad_dict = np.zeros(len(dic), dtype=bool)
    bad_dict[other] = [r is None for r in res]
    bad = bad_dict[idx.to_numpy()] if bad_dict.any() else None
    return ip_dict.take(idx), host_dict.take(idx), bad, ip_dict, idx


def _forwarded(real_ip: pa.Array, chost: pa.Array, ip_dict: pa.Array, idx: pa.Array, xff: pa.Array,
               trusted: V.TrustedProxies) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    """:func:`_clients`' ``(real_ip, client_host, ip_dict, idx)`` after the reference converter's rule for a site
    with trusted proxies: a row whose peer is one of them gets :func:`V.forwarded_client` of its peer and
    logged ``X-Forwarded-For`` (called once per distinct pair) and no host."""
    peers = ip_dict.to_pylist()
    tr = np.array([u is not None and u in trusted for u in peers] + [False], dtype=bool)
    pidx = np.asarray(idx.fill_null(len(peers)))
    rows = np.flatnonzero(tr[pidx])
    if len(rows) == 0:
        return real_ip, chost, ip_dict, idx
    xd = pc.dictionary_encode(xff)
    if isinstance(xd, pa.ChunkedArray):
        xd = xd.combine_chunks()
    xtexts = xd.dictionary.cast(pa.string()).to_pylist()
    xidx = np.asarray(xd.indices.fill_null(len(xtexts)))
    xtexts.append(None)
    pair = pidx[rows].astype(np.int64) * (len(xtexts) + 1) + xidx[rows]
    uniq, inv = np.unique(pair, return_inverse=True)
    got = [V.forwarded_client(peers[int(k) // (len(xtexts) + 1)], xtexts[int(k) % (len(xtexts) + 1)], trusted)
           for k in uniq]
    mask = np.zeros(len(real_ip), dtype=bool)
    mask[rows] = True  # rows is sorted, so replace_with_mask fills them in this order
    real = pc.replace_with_mask(real_ip, pa.array(mask), pa.array(got, pa.string()).take(pa.array(inv)))
    host = pc.replace_with_mask(chost, pa.array(mask), pa.nulls(len(rows), pa.string()))
    d = pc.dictionary_encode(real)
    return real, host, d.dictionary, d.indices


def _stored_hosts(p: Processor, chost: pa.Array) -> pa.Array:
    """``client_host`` as stored: :meth:`Privacy.store_host` per distinct name when the privacy mode changes
    clients (a column of nulls, the common case, is returned as is)."""
    if not p._ip_changes or chost.null_count == len(chost):
        return chost
    uniq, idx = _dict(chost)
    return _take([p.privacy.store_host(h) for h in uniq], pa.string(), idx)


_CLF_DIGITS = np.array([0, 1, 7, 8, 9, 10, 12, 13, 15, 16, 18, 19, 22, 23, 24, 25])
_CLF_SEPS = {2: ord("/"), 6: ord("/"), 11: ord(":"), 14: ord(":"), 17: ord(":"), 20: ord(" ")}


def _clf_column(view: pa.Array) -> pa.Array:
    """``int64`` UTC milliseconds of a column of CLF timestamps, equal value for value to
    :func:`V.clf_timestamps_ms` (null where it gives ``None``).

    Distinct texts of the common shape ``dd/Mon/yyyy:HH:MM:SS +hhmm`` (26 bytes, or 28 in brackets) are checked
    and converted as NumPy columns, and the date-and-zone part once per distinct day and zone through the same
    Python arithmetic; every other text (fractions, odd brackets, other digits) goes to ``clf_timestamps_ms``."""
    d = pc.dictionary_encode(view)
    if isinstance(d, pa.ChunkedArray):
        d = d.combine_chunks()
    dic = d.dictionary.cast(pa.string())
    n = len(dic)
    out = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    lens = np.asarray(pc.binary_length(dic).to_numpy(zero_copy_only=False), dtype=np.int64)
    offs = np.frombuffer(dic.buffers()[1], dtype=np.int32, count=n + 1, offset=dic.offset * 4).astype(np.int64)
    data = np.frombuffer(dic.buffers()[2], dtype=np.uint8) if dic.buffers()[2] is not None else np.zeros(0, np.uint8)
    start = offs[:-1].copy()
    cand = lens == 26
    if n and data.size:
        bracket = (lens == 28) & (data[np.minimum(start, data.size - 1)] == ord("["))
        bracket &= data[np.minimum(start + 27, data.size - 1)] == ord("]")
        start[bracket] += 1
        cand |= bracket
    rows = np.flatnonzero(cand)
    handled = np.zeros(n, dtype=bool)
    if len(rows):
        w = data[start[rows][:, None] + np.arange(26)[None, :]].astype(np.int64)
        dig = w[:, _CLF_DIGITS] - 48
        shape = ((dig >= 0) & (dig <= 9)).all(axis=1)
        for k, c in _CLF_SEPS.items():
            shape &= w[:, k] == c
        shape &= (w[:, 21] == ord("+")) | (w[:, 21] == ord("-"))
        letters = w[:, 3:6] | 0x20
        shape &= ((letters >= ord("a")) & (letters <= ord("z"))).all(axis=1)
        rows, w = rows[shape], w[shape]
        hh = (w[:, 12] - 48) * 10 + w[:, 13] - 48
        mm = (w[:, 15] - 48) * 10 + w[:, 16] - 48
        ss = (w[:, 18] - 48) * 10 + w[:, 19] - 48
        in_day = (hh <= 23) & (mm <= 59) & (ss <= 60)
        handled[rows[~in_day]] = True  # out-of-range time of day: None, as the reference
        rows, w, hh, mm, ss = rows[in_day], w[in_day], hh[in_day], mm[in_day], ss[in_day]
        key_cols = np.concatenate([w[:, :11], w[:, 20:26]], axis=1).astype(np.uint8)
        keys, inv = np.unique(np.ascontiguousarray(key_cols).view(np.dtype((np.void, 17))).ravel(),
                              return_inverse=True)
        base = np.zeros(len(keys), dtype=np.int64)
        base_ok = np.zeros(len(keys), dtype=bool)
        exact = np.zeros(len(keys), dtype=bool)
        for i, kb in enumerate(keys):
            t = bytes(kb).decode("ascii")  # dd/Mon/yyyy + " +hhmm"
            month = V.MONTHS.get(t[3:6].lower())
            off = int(t[13:15]) * 60 + int(t[15:17])
            b = None if month is None else V.civil_to_ms(int(t[7:11]), month, int(t[0:2]), 0, 0, 0, 0,
                                                        -off if t[12] == "-" else off)
            if b is None and month is not None:
                exact[i] = True  # midnight out of range, the time of day may be in: the exact path decides
            elif b is not None:
                base[i], base_ok[i] = b, True
        inv = inv.ravel()
        ms = base[inv] + (hh * 3600 + mm * 60 + ss) * 1000
        ok = base_ok[inv] & (ms >= V.TS_MIN_MS) & (ms <= V.TS_MAX_MS)
        out[rows[ok]] = ms[ok]
        valid[rows[ok]] = True
        handled[rows[~exact[inv]]] = True
    rest = np.flatnonzero(~handled)
    if len(rest):
        vals = V.clf_timestamps_ms(dic.take(pa.array(rest)).to_pylist())
        for j, v in zip(rest.tolist(), vals, strict=True):
            if v is not None:
                out[j], valid[j] = v, True
    return pa.array(out, mask=~valid).take(d.indices)


def _dash_null(arr: pa.Array) -> pa.Array:
    return pc.if_else(pc.equal(arr, "-"), _NULL_STR, arr)


def _take(values: list[Any], typ: pa.DataType, idx: pa.Array) -> pa.Array:
    return pa.array(values, type=typ).take(idx)


def _address_bots(enr: Any, ip_dict: pa.Array | None, ip_idx: pa.Array | None, is_bot: pa.Array,
                  bot_name: pa.Array, rows: np.ndarray | None = None) -> tuple[pa.Array, pa.Array]:
    """``(is_bot, bot_name)`` with the UA-less ``rows`` (all rows when ``None``) named by address, as
    :meth:`Enricher.derive` does one line at a time: a row whose client address is in a crawler's published
    network is that crawler (:class:`~forumpulse.pipeline.enrich.CrawlerNetworks`; dotted quads in one vectorised
    search, other addresses one :meth:`Enricher.address_bot` call per distinct text)."""
    nets = enr.networks
    if nets is None or ip_dict is None or ip_idx is None or len(ip_dict) == 0:
        return is_bot, bot_name
    idx_np = np.asarray(ip_idx)
    want = np.unique(idx_np[rows]) if rows is not None else np.arange(len(ip_dict))  # distinct addresses asked
    code = np.full(len(ip_dict), -1, dtype=np.int64)  # per distinct address: index into nets.names, -1 = none
    texts = ip_dict.take(pa.array(want))
    v4 = np.asarray(pc.fill_null(pc.match_substring_regex(texts, _IPV4_RE), False).to_numpy(zero_copy_only=False),
                    dtype=bool)
    if v4.any():  # dotted quads exactly as ipaddress reads them
        octets = np.asarray(pc.list_flatten(pc.split_pattern(texts.filter(pa.array(v4)), ".")).cast(pa.int64())
                            .to_numpy(), dtype=np.int64).reshape(-1, 4)
        code[want[v4]] = nets.codes_of_ipv4((octets[:, 0] << 24) | (octets[:, 1] << 16) | (octets[:, 2] << 8)
                                            | octets[:, 3])
    if not v4.all():
        for j, text in zip(want[~v4].tolist(), texts.filter(pa.array(~v4)).to_pylist(), strict=True):
            name = enr.address_bot(text)  # IPv6, IPv4-mapped, no address
            if name is not None:
                code[j] = nets.names.index(name)
    if rows is None:
        row_code = code[idx_np]
    else:  # rows with a user agent keep what it said
        row_code = np.full(len(idx_np), -1, dtype=np.int64)
        row_code[rows] = code[idx_np[rows]]
    found = row_code >= 0
    if not found.any():
        return is_bot, bot_name
    mask = pa.array(found)
    by_addr = pa.array(nets.names, pa.string()).take(pa.array(np.maximum(row_code, 0)))
    return pc.or_(is_bot, mask), pc.if_else(mask, by_addr, bot_name)


class BlockLines(Sequence[bytes]):
    """The lines of a block of bytes, split after every ``\\n`` (as ``readlines`` splits a file); a last line
    without a newline counts.  ``block[i]`` is the line with its newline, made on demand."""

    def __init__(self, data: bytes, offsets: np.ndarray | None = None) -> None:
        """``offsets`` (line starts plus the end, int64) may be given when known; they must be exactly the
        positions after every ``\n`` (the caller checked: :func:`~forumpulse.pipeline.contracts.split_values`)."""
        self.data = data
        if offsets is not None:
            self.offsets = offsets
            return
        sc = native.scanner()
        nl = sc.newline_ends(data) if sc is not None else np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1
        ends = nl if (not data or data.endswith(b"\n")) else np.append(nl, len(data))
        self.offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        self.offsets[1:] = ends

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.data[self.offsets[i]:self.offsets[i + 1]]


_KEEP = (np.arange(12)[None, :] < np.arange(13)[:, None]).astype(np.uint8)  # row k: k ones, then zeros


class _Chunk:
    """One chunk's bytes: ``data`` (the joined lines, newlines kept, padded), line offsets, and lazily the
    string array of the lines and the sorted positions of a byte value."""

    def __init__(self, data: bytes, offs: np.ndarray, valid: np.ndarray) -> None:
        self.n = len(offs) - 1
        self.size = len(data)
        # the chunk's own bytes, not a copy: the Arrow views and the native scanner read inside them only
        self.data = pa.py_buffer(data)
        self.buf = np.frombuffer(self.data, dtype=np.uint8)
        self._win: np.ndarray | None = None  # 12-byte windows over a zero-padded copy, made on first use
        self.offs = offs
        self.valid = valid
        self._pos: dict[int, np.ndarray] = {}
        self._arr: pa.Array | None = None
        self._tok: tuple[np.ndarray, np.ndarray] | None = None
        #: native scanner, and per plan regex the separator rows of its accepted lines (see FastPath.accept)
        self.sc = native.scanner()
        self.seps: dict[str, np.ndarray] = {}

    @property
    def arr(self) -> pa.Array:
        if self._arr is None:
            self._arr = pa.StringArray.from_buffers(self.n, pa.py_buffer(self.offs.astype(np.int32)), self.data)
        return self._arr

    def positions(self, byte: int) -> np.ndarray:
        p = self._pos.get(byte)
        if p is None:
            p = self._pos[byte] = np.flatnonzero(self.buf[:self.size] == byte)
        return p

    def tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """Starts and (exclusive) ends of runs of bytes other than space, CR and LF, over the whole chunk."""
        if self._tok is None:
            b = self.buf[:self.size]
            sep = np.ones(self.size + 2, dtype=bool)
            sep[1:-1] = (b == 32) | (b == 10) | (b == 13)
            edge = sep[:-1] != sep[1:]  # edge[i]: between byte i-1 and byte i (in buffer positions)
            pos = np.flatnonzero(edge)
            self._tok = (pos[0::2], pos[1::2])
        return self._tok

    def window(self, a: np.ndarray) -> np.ndarray:
        """``(n, 12)`` bytes starting at each position of ``a`` (past the data: zero padding)."""
        if self._win is None:
            # 12-byte windows starting at every byte: one gather copies a value's first 12 bytes.  Only the
            # numpy path and squid's time fractions use them, so the padded copy (a chunk's size) is made only
            # then: with the native scanner a combined chunk never pays for it
            padded = np.zeros(self.size + 16, dtype=np.uint8)
            padded[:self.size] = self.buf
            self._win = np.ndarray(shape=(self.size + 4,), dtype="V12", buffer=padded, strides=(1,))
        return self._win[a].view(np.uint8).reshape(len(a), 12)

    def views(self, a: np.ndarray, z: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        """A ``string_view`` array of ``data[a[i]:z[i]]`` (no copy of long values); null where ``valid`` is
        False."""
        n = len(a)
        bitmap = None
        if valid is not None and not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        if self.sc is not None:
            v = self.sc.views(self.data.address, a, z)
            return pa.Array.from_buffers(pa.string_view(), n, [bitmap, pa.py_buffer(v), self.data])
        ln = (z - a).astype(np.int32)
        v = np.empty((n, 16), dtype=np.uint8)
        v[:, 4:] = self.window(a)  # the first 12 bytes (inline values, prefixes)
        short = ln < 12
        if short.any():
            v[short, 4:] *= _KEEP[ln[short]]  # zero the bytes after a short value
        v32 = v.view(np.int32)
        v32[:, 0] = ln
        long_ = ln > 12
        if long_.any():
            v32[long_, 2] = 0
            v32[long_, 3] = a[long_]
        return pa.Array.from_buffers(pa.string_view(), n, [bitmap, pa.py_buffer(v), self.data])


class _Fields:
    """Field boundaries of accepted rows, materialised on demand as Arrow arrays or numbers."""

    def __init__(self, chunk: _Chunk, bounds: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        self.chunk = chunk
        self.bounds = bounds

    def view(self, k: int) -> pa.Array:
        return self.chunk.views(*self.bounds[k])

    def string(self, k: int) -> pa.Array:
        return self.view(k).cast(pa.string())

    def dash_null(self, k: int) -> pa.Array:
        """The field as a string array, null where it is ``-``."""
        a, z = self.bounds[k]
        dash = ((z - a) == 1) & (self.chunk.buf[a] == 45)
        if dash.all():
            return pa.nulls(len(a), pa.string())
        return self.chunk.views(a, z, ~dash).cast(pa.string())

    def uint(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A ``\\d+|-`` field as ``(value, is_dash, too_long)``; values of up to 12 digits are exact (the
        regex guarantees ASCII digits), longer ones are flagged ``too_long`` and left to the reference path."""
        a, z = self.bounds[k]
        if self.chunk.sc is not None:
            return self.chunk.sc.uint(self.chunk.data.address, a, z)
        ln = z - a
        w = self.chunk.window(a)
        dash = (ln == 1) & (w[:, 0] == 45)
        too_long = ln > 12
        vals = np.zeros(len(a), dtype=np.int64)
        top = int(ln.max()) if len(ln) else 0
        for j in range(min(top, 12)):  # Horner over the digit columns, each row up to its own length
            active = ln > j
            if dash.any():
                active &= ~dash
            vals = np.where(active, vals * 10 + (w[:, j].astype(np.int64) - 48), vals)
        return vals, dash, too_long


@dataclass
class _Cols:
    """Columns of accepted rows (same length) plus the mask of rows whose values converted."""

    ok: np.ndarray
    cols: dict[str, pa.Array]
    real_ip: pa.Array


class FastPath:
    """Vectorised processing for one :class:`Processor` (shares its parsers, enricher and privacy caches)."""

    def __init__(self, processor: Processor) -> None:
        self.p = processor
        self._plans: dict[str, SplitPlan | None] = {}
        #: lines of the last :meth:`run` that took the fast path (for tests and benchmarks)
        self.last_fast_rows = 0
        # request line (+ content type) of a site -> its request fields and page attribution, across chunks: forum
        # traffic repeats (about 3 in 4 distinct requests of a 100k-line chunk were seen in earlier chunks of the
        # simulated log).  Values are pure functions of the key and the processor's fixed rules.
        self._requests: BoundedCache[tuple[str, str, str | None], tuple[str, str, str, str, str, int, str, bool]] = \
            BoundedCache(100_000)
        self._ref_batch: list[tuple[list[tuple[object, ...]], list[str | None],
                                    list[tuple[int, bytes, Drop, str]], int | None]] = []

    def plan(self, spec: str) -> SplitPlan | None:
        if spec not in self._plans:
            if (spec in PRESETS and PRESETS[spec] == "squid:native") or spec == "squid:native":
                self._plans[spec] = squid_plan(spec if spec in PRESETS else "custom")
            elif spec in PRESETS:
                self._plans[spec] = plan_for_spec(PRESETS[spec], spec)
            elif spec == "auto" or ":" not in spec:
                self._plans[spec] = None
            else:
                self._plans[spec] = plan_for_spec(spec, "custom")
            plan = self._plans[spec]
            if plan is not None and not plan.squid:
                prog = native.program_for(plan.regex)
                if prog is not None and len(prog.quotes) == plan.n_segments - 1 and all(
                        len(prog.spaces.get(sg, ())) == cnt - 1 for sg, cnt in plan.pieces.items()):
                    plan.prog = prog
        return self._plans[spec]

    def supports(self, spec: str) -> bool:
        return spec == "auto" or self.plan(spec) is not None

    # -------------------------------------------------------------------------------------- input

    def lines_array(self, lines: Sequence[bytes], invalid: np.ndarray | None = None) -> _Chunk | None:
        """All lines as one buffer (newlines kept), or ``None`` when a line is not ``bytes``.  Lines that are
        not valid UTF-8 or longer than ``max_line_bytes`` are marked invalid (they take the reference path)."""
        n = len(lines)
        try:
            buf = b"".join(lines)
        except TypeError:
            return None
        lens = np.fromiter(map(len, lines), dtype=np.int64, count=n)
        valid = lens <= self.p.max_line_bytes
        if invalid is not None:
            valid &= ~invalid
        try:
            buf.decode("utf-8")
        except UnicodeDecodeError:
            for i, raw in enumerate(lines):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError:
                    valid[i] = False
            buf = b"".join(raw if ok else b"" for raw, ok in zip(lines, valid, strict=True))
            lens[~valid] = 0
        offs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        if offs[-1] >= 2**31 - 16:
            return None
        return _Chunk(buf, offs, valid)

    def block_chunk(self, block: BlockLines) -> _Chunk | None:
        """The chunk of a block of lines (no per-line objects are made)."""
        offs = block.offsets
        lens = np.diff(offs)
        valid = lens <= self.p.max_line_bytes
        data = block.data
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            keep = []
            for i in range(len(block)):
                try:
                    block[i].decode("utf-8")
                    keep.append(True)
                except UnicodeDecodeError:
                    keep.append(False)
            return self.lines_array([block[i] if k else b"" for i, k in enumerate(keep)], invalid=~np.array(keep))
        if offs[-1] >= 2**31 - 16:
            return None
        return _Chunk(data, offs, valid)

    # -------------------------------------------------------------------------------------- extraction

    def extract(self, plan: SplitPlan, chunk: _Chunk, rows: np.ndarray) -> _Fields:
        """Field text (``string_view`` arrays over the chunk's buffer, no copy) per needed group, for ``rows``
        (positions of lines that all match ``plan.regex``).  Boundaries come from the positions of quotes and
        spaces: an accepted line has exactly ``n_segments - 1`` quotes and, in each unquoted segment, exactly
        ``pieces - 1`` spaces, so the k-th quote/space after the line's (segment's) start is a field boundary."""
        b = chunk.buf
        starts = chunk.offs[rows]
        ends = chunk.offs[rows + 1]
        # the line end without its newline ("\n" or "\r\n": the regex allowed nothing else after the format)
        nl = b[ends - 1] == 10
        ends = ends - nl
        ends = ends - (nl & (b[ends - 1] == 13))
        seg_bounds: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        seps = chunk.seps.get(plan.regex)
        prog = plan.prog
        if seps is not None and prog is not None:  # separators recorded by the native scanner
            srow = seps[rows]
            last_seg = plan.n_segments - 1

            def seg(k: int) -> tuple[np.ndarray, np.ndarray]:
                if k not in seg_bounds:
                    a = starts if k == 0 else srow[:, prog.quotes[k - 1]] + 1
                    z = ends if k == last_seg else srow[:, prog.quotes[k]]
                    seg_bounds[k] = (a, z)
                return seg_bounds[k]
        elif plan.n_segments > 1:
            qpos = chunk.positions(34)
            qi = np.searchsorted(qpos, starts)

            def seg(k: int) -> tuple[np.ndarray, np.ndarray]:
                if k not in seg_bounds:
                    a = starts if k == 0 else qpos[qi + (k - 1)] + 1
                    z = ends if k == plan.n_segments - 1 else qpos[qi + k]
                    seg_bounds[k] = (a, z)
                return seg_bounds[k]
        else:
            seg_bounds[0] = (starts, ends)

            def seg(k: int) -> tuple[np.ndarray, np.ndarray]:
                return seg_bounds[k]

        piece_bounds: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        space_idx: dict[int, np.ndarray] = {}

        def piece(k_seg: int, k: int) -> tuple[np.ndarray, np.ndarray]:
            key = (k_seg, k)
            if key not in piece_bounds:
                a, z = seg(k_seg)
                cnt = plan.pieces[k_seg]
                if cnt > 1 and seps is not None and prog is not None:
                    sp = prog.spaces[k_seg]
                    a = a if k == 0 else srow[:, sp[k - 1]] + 1
                    z = z if k == cnt - 1 else srow[:, sp[k]]
                elif cnt > 1:
                    spos = chunk.positions(32)
                    if k_seg not in space_idx:
                        space_idx[k_seg] = np.searchsorted(spos, a)
                    si = space_idx[k_seg]
                    a = a if k == 0 else spos[si + (k - 1)] + 1
                    z = z if k == cnt - 1 else spos[si + k]
                piece_bounds[key] = (a, z)
            return piece_bounds[key]

        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for g, f in sorted(plan.fields.items()):
            if f.quoted:
                a, z = seg(f.segment)
            else:
                a, _ = piece(f.segment, f.piece)
                _, z = piece(f.segment, f.piece + (1 if f.two_pieces else 0))
                a = a + len(f.prefix)
                z = z - len(f.suffix)
                for lit in f.before:  # the field starts after the first occurrence of each separator
                    a = chunk.positions(ord(lit[0]))[np.searchsorted(chunk.positions(ord(lit[0])), a)] + len(lit)
                if f.after:
                    cpos = chunk.positions(ord(f.after[0]))
                    z = cpos[np.searchsorted(cpos, a)]
            out[g] = (a, z)
        return _Fields(chunk, out)

    # -------------------------------------------------------------------------------------- conversion

    def convert(self, plan: SplitPlan, g: _Fields, n: int, site: str) -> _Cols:
        """Record columns (``STREAM_SCHEMA`` order minus context) for ``n`` accepted rows; ``ok`` marks rows
        whose values converted exactly as the reference converter would (others go to the reference path)."""
        p = self.p
        slots = plan.slots
        ok = np.ones(n, dtype=bool)
        cols: dict[str, pa.Array] = {}
        none_str = pa.nulls(n, pa.string())

        # time
        ti = _first(slots, "time")
        assert ti is not None
        fn = {"clf": V.clf_timestamp_ms, "iso": V.iso_timestamp_ms, "epoch": V.epoch_seconds_ms}[plan.time_kind]
        if plan.time_kind == "clf":
            ts = _clf_column(g.view(ti))  # the same values as clf_timestamp_ms, as columns
        else:
            uniq, idx = _dict(g.view(ti))
            ts = _take([_safe(fn, u) for u in uniq], pa.int64(), idx)
        ok &= ~np.asarray(ts.is_null().to_numpy(zero_copy_only=False))
        cols["ts"] = ts

        # client
        ci = _first(slots, "client_a", "client_c", "client_h")
        ip_dict: pa.Array | None = None
        ip_idx: pa.Array | None = None
        if ci is None:
            real_ip, chost = none_str, none_str
        else:
            real_ip, chost, bad, ip_dict, idx = _clients(g.view(ci))
            xi = _first(slots, "forwarded")
            trusted = p.trusted(site)
            if xi is not None and trusted:
                real_ip, chost, ip_dict, idx = _forwarded(real_ip, chost, ip_dict, idx, g.view(xi), trusted)
            ip_idx = idx
            if bad is not None:
                ok &= ~bad
            if p._ip_changes:
                uips = ip_dict.to_pylist()
                cols["client_ip"] = _take([p.privacy.store_ip(u) for u in uips], pa.string(), idx)
        if "client_ip" not in cols:
            cols["client_ip"] = real_ip
        cols["client_host"] = _stored_hosts(p, chost)
        k = _first(slots, "ident")
        cols["ident"] = g.dash_null(k) if k is not None else none_str
        k = _first(slots, "user")
        cols["user"] = g.dash_null(k) if k is not None else none_str  # '""' cannot occur (no quotes accepted)

        # content type (needed by the page part of derive)
        k = _first(slots, "content_type")
        ctype = None
        if k is not None:
            ctype = pc.if_else(pc.is_in(g.string(k), pa.array(["-", ":", ""])), _NULL_STR, g.string(k))
        cols_ct = ctype if ctype is not None else none_str

        # request line -> method, url, path, query, protocol, and the page part of the enrichment
        ri = _first(slots, "request")
        req = (g.string(ri) if ctype is not None else g.view(ri)) if ri is not None else pa.array([""] * n, pa.string())
        if ctype is not None:
            key = pc.binary_join_element_wise(req, pc.fill_null(ctype, "\x00"), "\x00\x01")
            combos, cidx = _dict(key)
            reqs_u = [c.rsplit("\x00\x01", 1) for c in combos]
            pairs = [(r, None if c == "\x00" else c) for r, c in reqs_u]
        else:
            uniq, cidx = _dict(req)
            pairs = [(r, None) for r in uniq]
        enr = p.enricher
        saved = enr.empty_user_agents
        cache = self._requests
        young = cache.young
        req_vals: list[tuple[str, str, str, str, str, int, str, bool]] = []
        for r, ct in pairs:
            key = (site, r, ct)
            v = young.get(key) or cache.get(key)
            if v is None:
                if ri is None:
                    m_, u_, pa_, q_, pr_ = "", "", "", "", ""
                else:
                    m_, u_, pa_, q_, pr_ = V.request_fields(r)
                q_ = p.privacy.scrub_query(q_) if q_ else q_
                topic_id, kind, is_static, _b, _n = enr.derive(site, m_, pa_, q_, ct, None)
                v = (m_, p.privacy.scrub_url(u_), pa_, q_, pr_, topic_id or 0, kind, is_static)
                cache.put(key, v)
            req_vals.append(v)
        enr.empty_user_agents = saved
        methods, urls, paths, queries, protos, topics, kinds, statics = (
            (list(c) for c in zip(*req_vals, strict=True)) if req_vals else ([], [], [], [], [], [], [], []))
        # requests whose topic is the referring page's (REFERER_TOPIC): 0 here, resolved per row with the referer
        from_referer = [i for i, t in enumerate(topics) if t == REFERER_TOPIC]
        for i in from_referer:
            topics[i] = 0
        cols["method"] = _take(methods, pa.string(), cidx)
        cols["url"] = _take(urls, pa.string(), cidx)
        cols["path"] = _take(paths, pa.string(), cidx)
        cols["protocol"] = _take(protos, pa.string(), cidx)
        cols["topic_id"] = _take(topics, pa.uint64(), cidx)
        cols["page_kind"] = _take(kinds, pa.string(), cidx)
        cols["is_static"] = _take(statics, pa.bool_(), cidx)
        cols["query"] = _take(queries, pa.string(), cidx)

        # status (few distinct values): exactly the converter's rule
        si = _first(slots, "status_final", "status", "status_orig")
        if si is None:
            cols["status"] = pa.array(np.zeros(n, dtype=np.uint16))
        else:
            vals, _dash, too_long = g.uint(si)  # '-' is 0 already
            bad = too_long | (vals > 999)
            ok &= ~bad
            cols["status"] = pa.array(np.where(bad, 0, vals).astype(np.uint16))

        # bytes: digits or '-' (regex), at most 18 digits here (< 2**62); longer ones go to the reference
        bi = _first(slots, "bytes_body", "bytes_total")
        if bi is None:
            cols["bytes"] = pa.array(np.zeros(n, dtype=np.uint64))
        else:
            vals, _dash, too_long = g.uint(bi)  # at most 12 digits here (< 2**62); longer: reference path
            ok &= ~too_long
            cols["bytes"] = pa.array(np.where(too_long, 0, vals).astype(np.uint64))

        # elapsed
        el = None
        for name, scale, div in (("el_us", 1.0, 1000.0), ("el_ms", 1.0, 1.0), ("el_s", 1000.0, 1.0)):
            if name in slots and plan.kinds[slots[name][0]] == NUM:
                vals, dash, too_long = g.uint(slots[name][0])
                ok &= ~too_long
                fv = vals.astype(np.float64)
                fv = fv * scale / div if div != 1.0 else fv * scale
                el = pa.array(np.where(dash | too_long, 0.0, fv).astype(np.float32), mask=dash | too_long)
                break
            if name in slots:
                e = g.string(slots[name][0])
                too_long = pc.greater(pc.binary_length(e), 30).to_numpy(zero_copy_only=False)
                ok &= ~too_long
                dash = pc.or_(pc.equal(e, "-"), pc.greater(pc.binary_length(e), 30))
                vals = pc.cast(pc.if_else(dash, "0", e), pa.float64()).to_numpy(zero_copy_only=False)
                vals = vals * scale / div if div != 1.0 else vals * scale
                el = pa.array(vals.astype(np.float32), mask=dash.to_numpy(zero_copy_only=False))
                break
        cols["elapsed_ms"] = el if el is not None else pa.nulls(n, pa.float32())

        # referer (scrubbed per distinct value), user agent + bot part of derive per distinct UA
        k = _first(slots, "referer")
        if k is not None:
            uniq, idx = _dict(g.view(k))
            cols["referer"] = _take([None if r == "-" else p.privacy.scrub_referer(r) for r in uniq],
                                    pa.string(), idx)
            if from_referer:
                rows = np.flatnonzero(np.isin(np.asarray(cidx), from_referer))
                if len(rows):
                    refs, inv = np.unique(np.asarray(idx)[rows], return_inverse=True)  # per distinct referer
                    found = np.array([enr.topic_from_referer(site, None if uniq[j] == "-" else uniq[j]) or 0
                                      for j in refs.tolist()], dtype=np.uint64)
                    topic_np = np.array(cols["topic_id"].to_numpy(zero_copy_only=False), dtype=np.uint64)
                    topic_np[rows] = found[inv]
                    cols["topic_id"] = pa.array(topic_np)
        else:
            cols["referer"] = none_str
        k = _first(slots, "user_agent")
        if k is not None:
            uniq, idx = _dict(g.view(k))
            uas = [None if u == "-" else u for u in uniq]
            bots = [enr.bots.detect(u) if u else (False, None) for u in uas]
            cols["user_agent"] = _take(uas, pa.string(), idx)
            cols["is_bot"] = _take([b[0] for b in bots], pa.bool_(), idx)
            cols["bot_name"] = _take([b[1] for b in bots], pa.string(), idx)
            no_ua = np.array([not u for u in uas], dtype=bool)
            if no_ua.any():
                cols["is_bot"], cols["bot_name"] = _address_bots(
                    enr, ip_dict, ip_idx, cols["is_bot"], cols["bot_name"], np.flatnonzero(no_ua[np.asarray(idx)]))
        else:
            cols["user_agent"] = none_str
            cols["is_bot"], cols["bot_name"] = _address_bots(enr, ip_dict, ip_idx, pa.array(np.zeros(n, dtype=bool)),
                                                             none_str)

        # squid %Ss:%Sh
        k = _first(slots, "squid_ss")
        if k is not None:
            uniq, idx = _dict(g.view(k))
            parts = [(None, None) if s == "-" else (s.partition(":")[0], s.partition(":")[2]) for s in uniq]
            cols["cache_result"] = _take([x[0] for x in parts], pa.string(), idx)
            cols["hierarchy"] = _take([x[1] for x in parts], pa.string(), idx)
        else:
            cols["cache_result"] = cols["hierarchy"] = none_str
        k = _first(slots, "upstream")
        cols["upstream"] = g.dash_null(k) if k is not None else none_str
        cols["content_type"] = cols_ct
        k = _first(slots, "vhost_v", "vhost_V", "vhost_host", "vhost_sn")
        cols["vhost"] = g.dash_null(k) if k is not None else none_str
        return _Cols(ok, cols, real_ip)

    # -------------------------------------------------------------------------------------- driver

    def run(self, lines: Sequence[bytes] | BlockLines, ctx: SourceContext, line_no_base: int,
            source_ref: str) -> ProcessedBatch | None:
        """Process a chunk; same result as ``Processor.process_reference(lines, ctx, ...)``.  ``None`` when the
        chunk cannot take the fast path (a line is not ``bytes``)."""
        p = self.p
        n = len(lines)
        chunk = self.block_chunk(lines) if isinstance(lines, BlockLines) else self.lines_array(lines)
        if chunk is None:
            return None
        parts: list[tuple[np.ndarray, str, _Cols]] = []  # (positions, source_format, columns) of fast rows
        ref_pos: list[int] = []
        if ctx.format == "auto":
            parser = p.parser("auto", ctx.site)  # the object reference_rows advances (per trusted proxies)
            order = getattr(parser, "_order", None)
            if order is None or not hasattr(parser, "_last"):  # not the AutoParser this module knows
                return p.process_reference(lines, ctx, line_no_base, source_ref)
            cache: dict[int, tuple[np.ndarray, np.ndarray, _Cols | None]] = {}
            runs: dict[int, list[tuple[int, int]]] = {}
            i = 0
            while i < n:
                s = parser._last
                if s not in cache:
                    cache[s] = self._ok_rows(order[s][0], chunk, ctx.site, auto=True)
                _pos, not_ok, _cols = cache[s]
                j = first_false_after(not_ok, i)
                j = n if j < 0 else j
                if j > i:
                    runs.setdefault(s, []).append((i, j))
                if j < n:
                    ref_pos.append(j)
                    self._ref_batch.append(p.reference_rows(ctx, [(j, lines[j])]))
                i = j + 1
            for s, rs in runs.items():
                pos, _not_ok, cols = cache[s]
                assert cols is not None
                in_run = np.zeros(n, dtype=bool)
                for a, b in rs:
                    in_run[a:b] = True
                sel = in_run[pos]
                parts.append((pos[sel], order[s][0], _select(cols, sel)))
        else:
            plan = self.plan(ctx.format)
            name = getattr(p.parser(ctx.format), "name", ctx.format)
            pos, not_ok, cols = self._ok_rows(ctx.format, chunk, ctx.site, auto=False)
            if cols is not None and len(pos):
                parts.append((pos, name, cols))
            ref_pos = not_ok.tolist()
            if ref_pos:
                self._ref_batch.append(p.reference_rows(ctx, ((i, lines[i]) for i in ref_pos)))
            assert plan is not None
        return self._merge(parts, ref_pos, n, ctx, line_no_base, source_ref)

    def _ok_rows(self, spec: str, chunk: _Chunk, site: str,
                 auto: bool) -> tuple[np.ndarray, np.ndarray, _Cols | None]:
        """Positions of rows the fast path converts for ``spec``, sorted positions of all other rows, and the
        converted columns (rows of ``pos`` only)."""
        n = chunk.n
        plan = self.plan(spec)
        if plan is None:
            return np.zeros(0, dtype=np.int64), np.arange(n), None
        acc = self.accept(plan, chunk, auto)
        if not acc.any():
            return np.zeros(0, dtype=np.int64), np.arange(n), None
        pos, cols = self.rows(plan, chunk, acc, site)
        if not cols.ok.all():
            keep = cols.ok
            acc[pos[~keep]] = False
            pos = pos[keep]
            cols = _select(cols, keep)
        return pos, np.flatnonzero(~acc), cols

    def _merge(self, parts: list[tuple[np.ndarray, str, _Cols]], ref_pos: list[int], n: int, ctx: SourceContext,
               line_no_base: int, source_ref: str) -> ProcessedBatch:
        p = self.p
        rows: list[tuple[object, ...]] = []
        real_ips: list[str | None] = []
        bad: list[tuple[int, bytes, Drop, str]] = []
        newest: int | None = None
        for r_rows, r_ips, r_bad, r_newest in self._ref_batch:
            rows += r_rows
            real_ips += r_ips
            bad += r_bad
            if r_newest is not None and (newest is None or r_newest > newest):
                newest = r_newest
        self._ref_batch = []
        self.last_fast_rows = sum(len(part[0]) for part in parts)
        bad_set = {b[0] for b in bad}
        ref_loaded = np.array([i for i in ref_pos if i not in bad_set], dtype=np.int64)
        ctx_cols = {"site": ctx.site, "origin_host": ctx.origin_host, "origin_file": ctx.origin_file}
        tables: list[pa.Table] = []
        ips: list[pa.Array] = []
        positions: list[np.ndarray] = []
        enr = p.enricher
        for pos, name, cols in parts:
            m = len(pos)
            zeros = pa.array(np.zeros(m, dtype=np.int32))
            fmt = pa.array([name], pa.string()).take(zeros)
            # the status rule of the page kind, on the assembled rows (the per-request-line cache has no status)
            kinds = status_page_kinds(cols.cols["page_kind"], cols.cols["status"])
            tables.append(build_table(m, ctx_cols, fmt, {**cols.cols, "page_kind": kinds}, zeros))
            ips.append(cols.real_ip)
            positions.append(pos)
            ua = cols.cols["user_agent"]
            enr.empty_user_agents += m - int(pc.sum(pc.greater(pc.binary_length(ua), 0)).as_py() or 0)
            mx = pc.max(cols.cols["ts"]).as_py()
            if mx is not None and (newest is None or mx > newest):
                newest = mx
        if rows:
            tables.append(_rows_table(rows))
            ips.append(pa.array(real_ips, pa.string()))
            positions.append(ref_loaded)
        if not tables:
            full = STREAM_SCHEMA.empty_table()
            real: pa.Array = pa.array([], pa.string())
        elif len(tables) == 1 and (len(positions[0]) < 2 or bool(np.all(np.diff(positions[0]) > 0))):
            full = tables[0]
            real = ips[0]
        else:
            order = pa.array(np.argsort(np.concatenate(positions), kind="stable"))
            full = pa.concat_tables(tables).take(order)
            real = pa.concat_arrays(ips).take(order)
        if isinstance(real, pa.ChunkedArray):
            real = _single(real)
        return p.assemble(_canonical_table(full), _canonical(real), bad, newest, n, ctx, line_no_base,
                          source_ref)

    def accept(self, plan: SplitPlan, chunk: _Chunk, auto: bool) -> np.ndarray:
        """Lines the plan's regex accepts (and that are valid UTF-8, not too long)."""
        if plan.prog is not None and chunk.sc is not None:
            m, seps = chunk.sc.match(plan.prog, chunk.data.address, chunk.offs, chunk.valid)
            chunk.seps[plan.regex] = seps
        else:
            m = pc.match_substring_regex(chunk.arr, plan.regex).to_numpy(zero_copy_only=False)
        m &= chunk.valid
        if chunk.n and len(chunk.buf):  # a line opening with a byte order mark: the reference drops the mark
            starts = chunk.offs[:-1]
            lead = chunk.buf[np.minimum(starts, len(chunk.buf) - 1)] == 0xEF
            if lead.any():
                for i in np.flatnonzero(lead):
                    if bytes(chunk.buf[starts[i]:starts[i] + 3]) == b"\xef\xbb\xbf":
                        m[i] = False
        if plan.squid and chunk.n > 1:
            # Tokens are found across the whole buffer (convert_squid), so a line's first token must not be the
            # tail of one that began earlier: the byte just before the line's start must be a "\n".  That byte
            # belongs to the last non-empty line before (empty / blanked lines add no bytes); a line starting
            # at offset 0 has nothing before it (only empty lines precede it) and needs no check -- reading
            # ``buf[-1]`` there raised IndexError on an empty buffer and otherwise read the buffer's last byte
            starts = chunk.offs[1:-1]
            inner = np.flatnonzero(starts > 0)
            m[inner + 1] &= chunk.buf[starts[inner] - 1] == 10
        if auto:  # AutoParser takes a line's current preset only while len(line) * 4 <= max_line_bytes
            m &= np.diff(chunk.offs) * 4 <= self.p.max_line_bytes
        return m

    def rows(self, plan: SplitPlan, chunk: _Chunk, mask: np.ndarray, site: str) -> tuple[np.ndarray, _Cols]:
        """Convert the rows selected by ``mask``; returns their positions and columns (``ok`` marks those that
        converted)."""
        pos = np.flatnonzero(mask)
        if plan.squid:
            return pos, self.convert_squid(chunk, pos, site)
        g = self.extract(plan, chunk, pos)
        return pos, self.convert(plan, g, len(pos), site)

    # -------------------------------------------------------------------------------------- squid native

    def convert_squid(self, chunk: _Chunk, rows: np.ndarray, site: str) -> _Cols:
        """Native squid lines accepted by :data:`SQUID_RE2` (9 or 10 space-separated tokens, no headers): the
        same values as ``formats.squid._convert`` (tokens split on runs of spaces, the first ``.`` / ``/``)."""
        p = self.p
        n = len(rows)
        b = chunk.buf
        starts = chunk.offs[rows]
        ends = chunk.offs[rows + 1]
        ts_, te_ = chunk.tokens()
        k0 = np.searchsorted(ts_, starts)
        stripped = ends - (b[ends - 1] == 10)
        stripped = stripped - (b[stripped - 1] == 13) * (b[ends - 1] == 10)
        tok = [(ts_[k0 + j], np.minimum(te_[k0 + j], stripped)) for j in range(9)]
        k9 = np.minimum(k0 + 9, len(ts_) - 1)
        has_ct = (k0 + 9 < len(ts_)) & (ts_[k9] < ends)
        ok = np.ones(n, dtype=bool)
        g = _Fields(chunk, {})
        # time: sec.frac -> sec * 1000 + first three fraction digits (padded with zeros)
        a, z = tok[0]
        dots = chunk.positions(46)
        dot = dots[np.searchsorted(dots, a)]
        g.bounds[0] = (a, dot)
        sec, _, long_sec = g.uint(0)
        w = chunk.window(dot + 1).astype(np.int64) - 48
        flen = z - dot - 1
        frac = w[:, 0] * 100 + np.where(flen > 1, w[:, 1], 0) * 10 + np.where(flen > 2, w[:, 2], 0)
        ts = sec * 1000 + frac
        ok &= ~long_sec & (ts >= V.TS_MIN_MS) & (ts <= V.TS_MAX_MS)
        cols: dict[str, pa.Array] = {"ts": pa.array(np.where(ok, ts, 0))}
        # elapsed: -?\d+; a negative value (even -0) is left to the reference converter
        g.bounds[1] = tok[1]
        neg = b[tok[1][0]] == 45
        el, _, long_el = g.uint(1)
        ok &= ~neg & ~long_el
        cols["elapsed_ms"] = pa.array(np.where(ok, el, 0).astype(np.float64).astype(np.float32))
        # client
        g.bounds[2] = tok[2]
        real_ip, chost, bad, ip_dict, idx = _clients(g.view(2))
        ip_idx = idx
        cols["client_host"] = _stored_hosts(p, chost)
        if bad is not None:
            ok &= ~bad
        if p._ip_changes:
            cols["client_ip"] = _take([p.privacy.store_ip(u) if u is not None else None for u in ip_dict.to_pylist()],
                                      pa.string(), idx)
        else:
            cols["client_ip"] = real_ip
        # code/status
        g.bounds[3] = tok[3]
        uniq, idx = _dict(g.view(3))
        cs = [u.partition("/") for u in uniq]
        cols["cache_result"] = _take([c[0] for c in cs], pa.string(), idx)
        cols["status"] = _take([int(c[2]) for c in cs], pa.uint16(), idx)
        # bytes
        g.bounds[4] = tok[4]
        nb, _, long_b = g.uint(4)
        ok &= ~long_b
        cols["bytes"] = pa.array(np.where(long_b, 0, nb).astype(np.uint64))
        # user, hierarchy/peer
        g.bounds[7] = tok[7]
        cols["user"] = g.dash_null(7)
        g.bounds[8] = tok[8]
        uniq, idx = _dict(g.view(8))
        hp = [u.partition("/") for u in uniq]
        cols["hierarchy"] = _take([h[0] for h in hp], pa.string(), idx)
        cols["upstream"] = _take([None if h[2] == "-" else h[2] for h in hp], pa.string(), idx)
        # content type (absent: None) and method + url -> path/query, scrubbing, page part of derive
        g.bounds[9] = (np.where(has_ct, ts_[k9], starts), np.where(has_ct, np.minimum(te_[k9], stripped), starts))
        ctv = g.string(9)
        g.bounds[5], g.bounds[6] = tok[5], tok[6]
        key = pc.binary_join_element_wise(g.string(5), g.string(6), ctv, "\x00\x01")
        combos, cidx = _dict(key)
        enr = p.enricher
        saved = enr.empty_user_agents
        out: dict[str, list[Any]] = {k: [] for k in ("method", "url", "path", "query", "topic_id", "page_kind",
                                                     "is_static", "content_type")}
        for c in combos:
            m_, u_, ct = c.split("\x00\x01")
            ct_ = None if ct in ("-", ":", "") else ct
            path, query = V.split_url(u_, True)
            query = p.privacy.scrub_query(query) if query else query
            topic_id, kind, is_static, _b, _n = enr.derive(site, m_, path, query, ct_, None)
            if topic_id == REFERER_TOPIC:
                topic_id = None  # squid logs no referer
            for k, v in (("method", m_), ("url", p.privacy.scrub_url(u_)), ("path", path), ("query", query),
                         ("topic_id", topic_id or 0), ("page_kind", kind), ("is_static", is_static),
                         ("content_type", ct_)):
                out[k].append(v)
        enr.empty_user_agents = saved
        types = {"topic_id": pa.uint64(), "is_static": pa.bool_()}
        for k, vals in out.items():
            cols[k] = _take(vals, types.get(k, pa.string()), cidx)
        none_str = pa.nulls(n, pa.string())
        for k in ("ident", "referer", "user_agent", "bot_name", "vhost"):
            cols[k] = none_str
        cols["protocol"] = _take([""], pa.string(), pa.array(np.zeros(n, dtype=np.int32)))
        cols["is_bot"], cols["bot_name"] = _address_bots(enr, ip_dict, ip_idx, pa.array(np.zeros(n, dtype=bool)),
                                                         none_str)  # squid logs no user agent
        return _Cols(ok, cols, real_ip)


def _safe(fn: Callable[[Any], Any], v: Any) -> Any:
    try:
        return fn(v)
    except Exception:  # the reference path will produce the same Drop (or parser-error Drop) for this line
        return None


def _canonical(a: pa.Array) -> pa.Array:
    """The same values laid out as ``pa.array(list_of_values)`` lays them out (no validity bitmap without nulls;
    empty strings / zeros under nulls), so the fast path's Arrow buffers equal the reference's byte for byte."""
    bufs = a.buffers()
    if a.offset != 0:
        a = pa.concat_arrays([a])  # a zero-offset copy
        bufs = a.buffers()
    if a.null_count == 0:
        if bufs[0] is None:
            return a
        return pa.Array.from_buffers(a.type, len(a), [None, *bufs[1:]])
    if pa.types.is_string(a.type):
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=len(a) + 1)
        size = 0 if bufs[2] is None else bufs[2].size
        if offs[0] == 0 and size == offs[-1]:
            nulls = ~a.is_valid().to_numpy(zero_copy_only=False)
            if not np.diff(offs)[nulls].any():
                return a  # already laid out as the reference lays it out
        filled = pc.fill_null(a, "")
    elif pa.types.is_floating(a.type) or pa.types.is_integer(a.type):
        filled = pc.fill_null(a, 0)
    else:
        return a
    fb = filled.buffers()
    return pa.Array.from_buffers(a.type, len(a), [bufs[0], *fb[1:]], null_count=a.null_count)


def _single(c: pa.ChunkedArray) -> pa.Array:
    """One contiguous array (``combine_chunks`` copies even a single chunk)."""
    return c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()


def _canonical_table(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays([_canonical(_single(c)) for c in t.columns], schema=t.schema)


def _select(cols: _Cols, keep: np.ndarray) -> _Cols:
    mask = pa.array(keep)
    return _Cols(cols.ok[keep], {k: v.filter(mask) for k, v in cols.cols.items()}, cols.real_ip.filter(mask))


def _rows_table(rows: list[tuple[object, ...]]) -> pa.Table:
    from forumpulse.pipeline.process import _to_table

    return _to_table(rows, STREAM_SCHEMA.names, STREAM_SCHEMA)


def build_table(n: int, ctx_cols: dict[str, str], fmt: pa.Array, cols: dict[str, pa.Array],
                zeros: pa.Array) -> pa.Table:
    """A ``STREAM_SCHEMA`` table from converted columns (context columns repeated)."""
    arrays = []
    for f in STREAM_SCHEMA:
        if f.name in ctx_cols:
            arrays.append(pa.array([ctx_cols[f.name]], f.type).take(zeros))
        elif f.name == "source_format":
            arrays.append(fmt)
        elif f.name == "ts":
            arrays.append(cols["ts"].cast(pa.timestamp("ms", tz="UTC")))
        else:
            a = cols[f.name]
            arrays.append(a if a.type == f.type else a.cast(f.type))
    return pa.Table.from_arrays(arrays, schema=STREAM_SCHEMA)


def first_false_after(false_pos: np.ndarray, i: int) -> int:
    """Index of the first ``False`` position ``>= i`` given the sorted positions of falses (or ``-1``)."""
    k = int(np.searchsorted(false_pos, i))
    return int(false_pos[k]) if k < len(false_pos) else -1
