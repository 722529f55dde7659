"""Streaming DoS and abuse detection in stream time (log timestamps), vectorised per batch.

Data flow: columnar :class:`Batch` (from ParsedLine records, an Arrow table or numpy columns) ->
:class:`DosDetector.process` evaluates every rule of ``rules/dos.yaml`` over sliding windows of whole seconds
(state carried between batches, so batch boundaries never hide a flood) -> :class:`Candidate` ->
:class:`DecisionManager` applies the false-ban controls (allowlist, verified crawlers, active-ban dedupe,
observe mode, circuit breaker), escalation for repeat offenders, and hands :class:`Decision` objects to the
sinks (``decisions`` table, JSON lines, Kafka) and the actions (nftables, ipset, webhook, decision API).

Guarantees: the same input in the same order gives the same decisions (no wall clock in detection; wall time is
only ``created_at``).  Batch size does not hide decisions: every second in which a rule holds for a key is
offered to the manager again once its answer can change (a ban ended, a later minute has breaker budget), so a
large replay batch loses no repeat offence and no offender the breaker held back (what still differs between
long and short batches -- the crowd guard's 10 s measure, the swarm crowd test's look-ahead -- is in
docs/dos.md).  Lines arriving late (older than the current window) still count in their own second as
long as that second is inside the carried window.  Lines without ``client_ip`` are ignored.
Misuse: one detector instance must see *all* lines of the clients it judges (prefix and distributed rules need
every partition) -- see docs/dos.md for scaling beyond one process.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import ipaddress
import json
import logging
import re
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from forumpulse.detectors.dos_rules import DosConfig, Rule, RuleFilter, RuleSet, load_rules
from forumpulse.pipeline.record import ParsedLine
from forumpulse.pipeline.runtime import error_line

if TYPE_CHECKING:
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.enrich import CrawlerNetworks

log = logging.getLogger(__name__)


def _typer_option(default: Any, *names: str, help: str = "") -> Any:
    """typer.Option when typer is importable (it is a dependency); keeps this module importable without it."""
    try:
        import typer
    except ImportError:  # pragma: no cover
        return default
    return typer.Option(default, *names, help=help)

_BIG = np.int64(1 << 34)  # key code * _BIG + second: seconds since the epoch fit in 34 bits until year 2514
_COLUMNS = ("ts", "client_ip", "method", "path", "query", "status", "user_agent")


# --------------------------------------------------------------------------------------------- batch

_STR_COLUMNS = ("client_ip", "method", "path", "query", "user_agent")


def _encode_arrow(col: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of an Arrow string column (chunked or not, dictionary or not); nulls become ''."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    if not pa.types.is_string(col.type):
        col = col.cast(pa.string())  # large_string, string_view
    if col.null_count:
        col = pc.fill_null(col, "")
    d = col.dictionary_encode()
    idx = d.indices.to_numpy(zero_copy_only=False)
    return idx, d.dictionary.to_numpy(zero_copy_only=False)


def _encode_objects(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a sequence of str/None (None -> ''); other objects are encoded by their str()."""
    import pyarrow as pa

    try:
        return _encode_arrow(pa.array(values, type=pa.string(), from_pandas=True))
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        arr = pd.Series(list(values), dtype=object).fillna("").astype(str).to_numpy(dtype=object)
        return _encode_arrow(pa.array(arr, type=pa.string()))


def _canonical_ips(codes: np.ndarray, uniques: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a client-address column with each address in one spelling: IPv6 in RFC 5952 form
    (lower case, zeros compressed) and an IPv4-mapped IPv6 address as its IPv4 address.  One client written two
    ways (``::ffff:198.51.100.9`` by a dual-stack listener, ``198.51.100.9`` by another; ``2001:DB8::1`` and
    ``2001:db8:0::1``) split every per-client counter and stayed under the flood threshold (user trial 41).
    Values that are not addresses are left as they are.  Work is per distinct value: dotted IPv4 is skipped in
    Arrow, the rest parsed once and remembered across batches (:data:`_CANON`, bounded)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not len(uniques):
        return codes, uniques
    arr = pa.array(uniques, type=pa.string())
    other = np.flatnonzero(~pc.match_substring_regex(arr, _V4_ARROW).to_numpy(zero_copy_only=False))
    if not len(other):
        return codes, uniques
    if len(_CANON) > _CANON_MAX:
        _CANON.clear()
    known = _CANON
    changed: dict[int, str] = {}
    for i in other.tolist():
        u = uniques[i]
        c = known.get(u)
        if c is None:
            c = known[u] = _canonical_ip(u)
        if c != u:
            changed[i] = c
    if not changed:
        return codes, uniques
    # each changed entry points at the entry already spelled canonically, else at the first changed entry of its
    # spelling, which takes that spelling (the dictionary may keep unused entries: Batch.raw_codes)
    at = pc.index_in(pa.array(list(changed.values()), type=pa.string()), value_set=arr).to_pylist()
    remap = np.arange(len(uniques), dtype=np.int64)
    out = np.asarray(uniques, dtype=object).copy()
    first: dict[str, int] = {}
    for (i, c), j in zip(changed.items(), at, strict=True):
        if j is None:
            j = first.setdefault(c, i)
            out[j] = c
        remap[i] = j
    return remap[codes], out


def _canonical_ip(u: str) -> str:
    """One value that is not a dotted IPv4 address, in :func:`_canonical_ips`' spelling (itself when it is no
    address)."""
    if ":" not in u:
        return u
    try:
        if "%" in u:
            raise ValueError(u)  # scoped: the careful path
        b = socket.inet_pton(socket.AF_INET6, u)
        return socket.inet_ntop(socket.AF_INET, b[12:]) if b[:12] == _MAPPED else socket.inet_ntop(socket.AF_INET6, b)
    except (OSError, ValueError):
        try:
            c = canonical_value(u)
        except ValueError:
            return u
        return u if "/" in c else c  # a network is not a client address


#: client-address spellings already worked out (value -> canonical), across batches; cleared when it passes
#: :data:`_CANON_MAX` entries (a dict read and written under the GIL: safe for the owner's threads)
_CANON: dict[str, str] = {}
_CANON_MAX = 200_000
_MAPPED = bytes(10) + b"\xff\xff"


def _np(col: Any) -> np.ndarray:
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        return col.to_numpy()
    return np.asarray(col.to_numpy(zero_copy_only=False))


class Batch:
    """Columnar lines: ``ts`` int64 ms UTC, ``status`` int64, optional ``is_static`` bool, and the string columns
    ``client_ip``, ``method``, ``path``, ``query``, ``user_agent`` ('' for None).

    String columns are held dictionary-encoded (codes into a small array of distinct values), so the detector
    never materialises one Python string per line: :meth:`from_arrow` encodes in Arrow (C++), and
    :meth:`codes` gives first-appearance-ordered codes (the order ``pandas.factorize`` would give on the
    decoded column).  The attributes ``client_ip`` etc. decode the whole column on first use (for evidence and
    compatibility); they are object arrays.  ``Batch(ts, client_ip, method, path, query, status, user_agent,
    is_static=None)`` with object arrays still works.  Client addresses are held in one spelling each
    (:func:`_canonical_ips`: IPv6 compressed lower case, IPv4-mapped as IPv4), so rules count a client once.
    ``is_static`` is the enricher's flag; when absent the rules' ``static`` pattern decides.  Batches are
    immutable in use: do not assign to the columns.
    """

    def __init__(self, ts: Any, client_ip: Any = None, method: Any = None, path: Any = None, query: Any = None,
                 status: Any = None, user_agent: Any = None, is_static: Any = None, *,
                 encoded: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
                 ips_canonical: bool = False) -> None:
        self.ts = np.asarray(ts, dtype=np.int64)
        self.status = np.asarray(status, dtype=np.int64)
        self.is_static = None if is_static is None else np.asarray(is_static, dtype=bool)
        if encoded is None:
            given = dict(zip(_STR_COLUMNS, (client_ip, method, path, query, user_agent), strict=True))
            encoded = {k: _encode_objects(v) for k, v in given.items()}
        if not ips_canonical:
            encoded = {**encoded, "client_ip": _canonical_ips(*encoded["client_ip"])}
        self._enc = encoded
        self._norm: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._dec: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.ts)

    def raw_codes(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes, dictionary) as stored: the dictionary may hold values no line uses, in any order."""
        return self._enc[name]

    def codes(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(codes int64, uniques object array): uniques in order of first appearance, each used by a line."""
        if name not in self._norm:
            c, d = self._enc[name]
            fc, first = pd.factorize(c, sort=False)
            self._norm[name] = (fc.astype(np.int64, copy=False), np.asarray(d[first], dtype=object))
        return self._norm[name]

    def column(self, name: str) -> np.ndarray:
        """The decoded object array of a string column (cached)."""
        if name not in self._dec:
            c, d = self._enc[name]
            self._dec[name] = np.asarray(d, dtype=object)[c]
        return self._dec[name]

    def value(self, name: str, i: int) -> str:
        c, d = self._enc[name]
        return str(d[c[i]])

    client_ip = property(lambda self: self.column("client_ip"))
    method = property(lambda self: self.column("method"))
    path = property(lambda self: self.column("path"))
    query = property(lambda self: self.column("query"))
    user_agent = property(lambda self: self.column("user_agent"))

    @classmethod
    def from_columns(cls, cols: dict[str, Any]) -> Batch:
        st = cols.get("is_static")
        return cls(cols["ts"], status=cols["status"], is_static=st,
                   encoded={c: _encode_objects(cols[c]) for c in _STR_COLUMNS})

    @classmethod
    def from_records(cls, records: Sequence[ParsedLine]) -> Batch:
        return cls.from_columns({c: [getattr(r, c) for r in records] for c in _COLUMNS})

    @classmethod
    def from_arrow(cls, table: Any) -> Batch:
        """From an Arrow table with (at least) the columns ts (timestamp or int64 ms), client_ip, method, path,
        query, status, user_agent and optionally is_static.  String columns are encoded in Arrow."""
        import pyarrow as pa
        import pyarrow.compute as pc

        ts = table.column("ts")
        if pa.types.is_timestamp(ts.type):
            ts = pc.cast(pc.cast(ts, pa.timestamp("ms", tz=ts.type.tz), safe=False), pa.int64())
        st = _np(table.column("is_static")) if "is_static" in table.column_names else None
        return cls(_np(ts), status=_np(table.column("status")), is_static=st,
                   encoded={c: _encode_arrow(table.column(c)) for c in _STR_COLUMNS})

    def take(self, idx: np.ndarray) -> Batch:
        return Batch(self.ts[idx], status=self.status[idx],
                     is_static=None if self.is_static is None else self.is_static[idx],
                     encoded={k: (c[idx], d) for k, (c, d) in self._enc.items()}, ips_canonical=True)

# --------------------------------------------------------------------------------------------- helpers


_V4 = re.compile(r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?:\.(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3}")


def prefix_of(ip: str) -> str:
    """IPv4 -> its /24, IPv6 -> its /64 (IPv4-mapped IPv6 counts as IPv4).  Raises ValueError on non-IPs."""
    if _V4.fullmatch(ip):
        return ip.rpartition(".")[0] + ".0/24"
    a = ipaddress.ip_address(ip)
    if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
        a = a.ipv4_mapped
    n = 24 if a.version == 4 else 64
    return str(ipaddress.ip_network(f"{a}/{n}", strict=False))


_V4_ARROW = "^" + _V4.pattern + "$"
_PLAIN = r"^[\x20-\x7e]*$"  # printable ASCII: Python re and RE2 agree on these patterns for such text


class _PrefixCache:
    """Prefix (/24, /64) of many address strings at once: IPv4 in Arrow, others via :func:`prefix_of` with a
    bounded cache carried across batches ('' for values that are not addresses)."""

    def __init__(self, max_entries: int = 200_000) -> None:
        self.max_entries = max_entries
        self.cache: dict[str, str] = {}

    def __call__(self, uniques: np.ndarray) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not len(uniques):
            return np.empty(0, dtype=object)
        arr = pa.array(uniques, type=pa.string())
        v4 = pc.match_substring_regex(arr, _V4_ARROW).to_numpy(zero_copy_only=False)
        out = pc.replace_substring_regex(arr, r"\.[0-9]+$", ".0/24").to_numpy(zero_copy_only=False)
        out = np.asarray(out, dtype=object)
        other = np.flatnonzero(~v4)
        if len(other):
            if len(self.cache) > self.max_entries:
                self.cache.clear()
            c = self.cache
            for i in other.tolist():
                u = uniques[i]
                p = c.get(u)
                if p is None:
                    try:
                        if "." in u or "%" in u:  # IPv4-mapped / embedded IPv4, scoped: the careful path
                            raise ValueError(u)
                        b = socket.inet_pton(socket.AF_INET6, u)  # /64: same text as ipaddress (RFC 5952)
                        p = socket.inet_ntop(socket.AF_INET6, b[:8] + bytes(8)) + "/64"
                    except (OSError, ValueError):
                        try:
                            p = prefix_of(u)
                        except ValueError:
                            p = ""
                    c[u] = p
                out[i] = p
        return out


def pattern_hits(rx: re.Pattern[str], uniques: np.ndarray, prepared: tuple[Any, np.ndarray] | None = None,
                 ) -> np.ndarray:
    """``rx.search(u) is not None`` for every value: printable-ASCII values in Arrow's RE2 (one C++ pass), the
    rest (and every value when RE2 cannot compile the pattern) with Python's ``re``, so results equal re's.
    ``prepared``: :func:`prepare_values` of ``uniques`` (reused across patterns on the same values)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(uniques)
    if n == 0:
        return np.zeros(0, dtype=bool)
    arr, plain = prepared if prepared is not None else prepare_values(uniques)
    try:
        hit = np.asarray(pc.match_substring_regex(arr, rx.pattern).to_numpy(zero_copy_only=False), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return np.fromiter((rx.search(u) is not None for u in uniques), dtype=bool, count=n)
    for i in np.flatnonzero(~plain).tolist():
        hit[i] = rx.search(uniques[i]) is not None
    return hit


def _points(res: pd.DataFrame) -> np.ndarray:
    """(key, sec) rows of a window result as query points (key * _BIG + sec)."""
    return res["key"].to_numpy(dtype=np.int64) * _BIG + res["sec"].to_numpy(dtype=np.int64)


def prepare_values(uniques: np.ndarray) -> tuple[Any, np.ndarray]:
    """(Arrow array of the values, mask of the printable-ASCII ones) for :func:`pattern_hits`."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(uniques, type=pa.string())
    return arr, np.asarray(pc.match_substring_regex(arr, _PLAIN).to_numpy(zero_copy_only=False), dtype=bool)


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def ms_of_iso(text: str) -> int:
    """Milliseconds since the epoch of an :func:`iso_ms` string (or any ISO 8601 time with an offset)."""
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        raise ValueError(f"no time zone in {text!r}")
    return round(t.timestamp() * 1000)


def _factorize(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    codes, uniques = pd.factorize(a, sort=False)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


_INDEX_CACHE: list[tuple[np.ndarray, pd.Index]] = []


def _index(uniques: np.ndarray) -> pd.Index:
    """A pandas Index over an array of distinct values, reused while the same array object is in use (several
    windows map their carried keys onto one batch's uniques: the hash table is built once)."""
    for arr, ix in _INDEX_CACHE:
        if arr is uniques:
            return ix
    ix = pd.Index(uniques)
    _INDEX_CACHE.append((uniques, ix))
    if len(_INDEX_CACHE) > 8:
        del _INDEX_CACHE[0]
    return ix


class _Keys:
    """Maps carried (string) keys and batch codes into one integer space for a window update."""

    def __init__(self, uniques: np.ndarray, carried: np.ndarray) -> None:
        idx = _index(uniques).get_indexer(pd.Index(carried)) if len(carried) else np.empty(0, dtype=np.int64)
        missing = carried[idx < 0] if len(carried) else carried
        extra, _ = (np.unique(missing), None) if len(missing) else (np.empty(0, dtype=object), None)
        self.table = np.concatenate([uniques, extra.astype(object)]) if len(extra) else uniques
        self.carried_codes = idx.astype(np.int64)
        if len(extra):
            pos = pd.Index(extra).get_indexer(pd.Index(carried[idx < 0]))
            self.carried_codes[idx < 0] = len(uniques) + pos


class _CountWindow:
    """Per-key request counts over the last ``w`` whole seconds, carried across batches.

    The carried tail is (key, second, count, first ts) of the last ``w`` seconds, as numpy arrays."""

    def __init__(self, w: int) -> None:
        self.w = w
        self.t_key = np.empty(0, dtype=object)
        self.t_sec = np.empty(0, dtype=np.int64)
        self.t_n = np.empty(0, dtype=np.int64)
        self.t0 = np.empty(0, dtype=np.int64)

    @property
    def tail(self) -> pd.DataFrame:
        return pd.DataFrame({"key": self.t_key, "sec": self.t_sec, "n": self.t_n, "t0": self.t0})

    def update(self, codes: np.ndarray, uniques: np.ndarray, secs: np.ndarray, ts: np.ndarray,
               watermark_sec: int, min_win: float = 0) -> tuple[pd.DataFrame, np.ndarray]:
        """Returns (rows of (key, sec) touched by this batch with n, win, first_ts, only where
        win >= ``min_win``; key table)."""
        keys = _Keys(uniques, self.t_key)
        old_c = keys.carried_codes * _BIG + self.t_sec
        allc = np.concatenate([codes * _BIG + secs, old_c])
        alln = np.concatenate([np.ones(len(codes), dtype=np.int64), self.t_n])
        allt = np.concatenate([ts, self.t0])
        new = np.concatenate([np.ones(len(codes), dtype=np.int8), np.zeros(len(old_c), dtype=np.int8)])
        o = np.argsort(allc, kind="stable")
        cs = allc[o]
        starts = np.flatnonzero(np.concatenate([[True], cs[1:] != cs[:-1]])) if len(cs) else np.empty(0, np.int64)
        c = cs[starts]
        n = np.add.reduceat(alln[o], starts) if len(cs) else alln
        t0 = np.minimum.reduceat(allt[o], starts) if len(cs) else allt
        newm = (np.maximum.reduceat(new[o], starts) if len(cs) else new).astype(bool)
        cum = np.cumsum(n)
        lo = np.searchsorted(c, c - self.w + 1, side="left")
        before = np.where(lo > 0, cum[np.maximum(lo - 1, 0)], 0)
        win = cum - before
        key = c // _BIG
        sec = c % _BIG
        keep = sec > watermark_sec - self.w
        self.t_key, self.t_sec, self.t_n, self.t0 = keys.table[key[keep]], sec[keep], n[keep], t0[keep]
        m = newm & (win >= min_win) if min_win > 0 else newm
        out = pd.DataFrame({"key": key[m], "sec": sec[m], "n": n[m], "win": win[m], "first_ts": t0[lo[m]]})
        return out, keys.table


class _DistinctWindow:
    """Per-key number of distinct values over the last ``w`` whole seconds, carried across batches.

    The carried state is the (key, value, second) sightings of the last ``w`` seconds.  Counts are computed
    only for the (key, second) points asked for (``query``): rules ask only where the request count of the
    same window already reaches their threshold (distinct values never exceed requests), so most of a batch
    costs one filter, not a sort.
    """

    def __init__(self, w: int) -> None:
        self.w = w
        self.tail = pd.DataFrame({"key": pd.Series(dtype=object), "val": pd.Series(dtype=object),
                                  "sec": pd.Series(dtype=np.int64)})

    def update(self, codes: np.ndarray, uniques: np.ndarray, vcodes: np.ndarray, vuniques: np.ndarray,
               secs: np.ndarray, watermark_sec: int,
               query: np.ndarray | None = None) -> tuple[pd.DataFrame, np.ndarray]:
        """Add a batch's sightings; return (key, sec, distinct) for ``query`` (key code * _BIG + second, key
        codes of this batch; default: every (key, second) the batch touches) and the key table."""
        new_q = np.unique(codes * _BIG + secs) if query is None else np.unique(np.asarray(query, dtype=np.int64))
        tail = self.tail
        out = self._count(codes, uniques, vcodes, vuniques, secs, new_q, tail)
        # carry the sightings of the last w seconds (deduplicated per batch part)
        lo = watermark_sec - self.w
        bsel = np.flatnonzero(secs > lo)
        if len(bsel):
            nv = np.int64(max(len(vuniques), 1))
            comb = (codes[bsel] * nv + vcodes[bsel]) * np.int64(self.w) + (secs[bsel] - lo - 1)
            _, first = np.unique(comb, return_index=True)
            bsel = bsel[first]
        keep_t = tail["sec"].to_numpy(dtype=np.int64) > lo
        parts = [tail[keep_t]] if keep_t.any() else []
        if len(bsel):
            parts.append(pd.DataFrame({"key": uniques[codes[bsel]], "val": vuniques[vcodes[bsel]],
                                       "sec": secs[bsel].astype(np.int64)}))
        self.tail = pd.concat(parts, ignore_index=True) if len(parts) > 1 else (
            parts[0].reset_index(drop=True) if parts else tail.iloc[:0])
        return out, uniques

    def _count(self, codes: np.ndarray, uniques: np.ndarray, vcodes: np.ndarray, vuniques: np.ndarray,
               secs: np.ndarray, new_q: np.ndarray, tail: pd.DataFrame) -> pd.DataFrame:
        if not len(new_q):
            return pd.DataFrame({"key": np.empty(0, np.int64), "sec": np.empty(0, np.int64),
                                 "distinct": np.empty(0, np.int64)})
        qk = np.unique(new_q // _BIG)
        bm = np.isin(codes, qk)
        t_idx = _index(uniques).get_indexer(pd.Index(tail["key"].to_numpy(dtype=object))) if len(tail) else \
            np.empty(0, dtype=np.int64)
        tm = np.isin(t_idx, qk) if len(t_idx) else np.zeros(0, dtype=bool)
        vals = _Keys(vuniques, tail["val"].to_numpy(dtype=object)[tm]) if tm.any() else None
        nv = np.int64(max(len(vals.table) if vals is not None else len(vuniques), 1))
        k = codes[bm]
        v = vcodes[bm]
        s = secs[bm]
        if vals is not None:
            k = np.concatenate([k, t_idx[tm]])
            v = np.concatenate([v, vals.carried_codes])
            s = np.concatenate([s, tail["sec"].to_numpy(dtype=np.int64)[tm]])
        pair = k * nv + v
        o = np.lexsort((s, pair))
        pr, sc = pair[o], s[o]
        if len(pr) > 1:
            uniq = np.ones(len(pr), dtype=bool)
            uniq[1:] = (pr[1:] != pr[:-1]) | (sc[1:] != sc[:-1])
            pr, sc = pr[uniq], sc[uniq]
        # intervals of "alive" seconds per (key, value): a sighting at s keeps the value in windows ending
        # s .. s+w-1; consecutive sightings at most w apart merge.
        start = np.ones(len(pr), dtype=bool)
        end = np.ones(len(pr), dtype=bool)
        if len(pr) > 1:
            cont = (pr[1:] == pr[:-1]) & (sc[1:] - sc[:-1] <= self.w)
            start[1:] = ~cont
            end[:-1] = ~cont
        kk = pr // nv
        ev_c = np.concatenate([kk[start] * _BIG + sc[start], kk[end] * _BIG + sc[end] + self.w])
        ev_d = np.concatenate([np.ones(int(start.sum()), dtype=np.int64), -np.ones(int(end.sum()), dtype=np.int64)])
        order = np.argsort(ev_c, kind="stable")
        ev_c, cum = ev_c[order], np.cumsum(ev_d[order])
        pos = np.searchsorted(ev_c, new_q, side="right")
        dist = np.where(pos > 0, cum[np.maximum(pos - 1, 0)], 0) if len(ev_c) else np.zeros(len(new_q), np.int64)
        return pd.DataFrame({"key": new_q // _BIG, "sec": new_q % _BIG, "distinct": dist})


class _Baseline:
    """Learned per-address rate (EWMA of completed minutes) and number of users (distinct busy UAs)."""

    def __init__(self, rules: RuleSet) -> None:
        self.cfg = rules.baseline
        self.rate: dict[str, float] = {}
        self.users: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self.tainted: dict[str, int] = {}
        self.pending = pd.DataFrame({"ip": pd.Series(dtype=object), "minute": pd.Series(dtype=np.int64),
                                     "ua": pd.Series(dtype=object), "n": pd.Series(dtype=np.int64)})
        self._last_prune = 0

    def update(self, ip: tuple[np.ndarray, np.ndarray], ua: tuple[np.ndarray, np.ndarray], rows: np.ndarray,
               secs: np.ndarray, watermark_sec: int) -> None:
        """Learn from the lines ``rows`` (bool mask) of a batch; ``ip``/``ua`` are (codes, uniques) pairs.

        Minutes complete within this batch are counted on integer codes only (strings just for the busy
        addresses); the open minute and minutes that earlier batches left pending go through ``pending``.
        Per address, minutes are learned in time order (the EWMA depends on it)."""
        ipc, ipu = ip
        uac, uau = ua
        wm = watermark_sec // 60
        nua = np.int64(max(len(uau), 1))
        minute = secs[rows] // 60
        m0 = int(minute.min()) if len(minute) else 0
        span = np.int64(int(minute.max()) - m0 + 1) if len(minute) else np.int64(1)
        kc, first = pd.factorize((ipc[rows] * nua + uac[rows]) * span + (minute - m0), sort=False)
        n = np.bincount(kc, minlength=len(first)).astype(np.int64)
        pair, mins = first // span, first % span + m0
        g_ip, g_ua = pair // nua, pair % nua
        pend_mins = self.pending["minute"].unique() if len(self.pending) else np.empty(0, np.int64)
        slow = (mins >= wm) | np.isin(mins, pend_mins)
        cur = pd.DataFrame({"ip": ipu[g_ip[slow]], "minute": mins[slow].astype(np.int64), "ua": uau[g_ua[slow]],
                            "n": n[slow]})
        allr = pd.concat([self.pending, cur], ignore_index=True) if len(self.pending) else cur
        g = allr.groupby(["ip", "minute", "ua"], sort=False)["n"].sum().reset_index()
        done = g[g["minute"] < wm]
        self.pending = g[g["minute"] >= wm]
        c = self.cfg
        floor = c.min_requests_per_user * c.users_per_unit
        if len(done):
            # only addresses busy enough to ever raise a threshold are learned (keeps this O(busy addresses))
            per = done.groupby(["ip", "minute"], sort=False)["n"].sum()
            per = per[per >= floor]
            if len(per):
                busy = done[done["n"] >= c.min_requests_per_user].groupby(["ip", "minute"]).size()
                users = busy.reindex(per.index, fill_value=0)
                self._learn(per.index.get_level_values(0).tolist(), per.index.get_level_values(1).tolist(),
                            per.tolist(), users.tolist())
        fast = np.flatnonzero(~slow)
        if len(fast):
            pk, pfirst = pd.factorize(g_ip[fast] * span + (mins[fast] - m0), sort=False)
            total = np.bincount(pk, weights=n[fast], minlength=len(pfirst))
            nusers = np.bincount(pk, weights=(n[fast] >= c.min_requests_per_user), minlength=len(pfirst))
            sel = np.flatnonzero(total >= floor)
            if len(sel):
                self._learn(ipu[pfirst[sel] // span].tolist(), (pfirst[sel] % span + m0).tolist(),
                            total[sel].astype(np.int64).tolist(), nusers[sel].astype(np.int64).tolist())
        if watermark_sec - self._last_prune > 600:
            self._last_prune = watermark_sec
            old = [k for k, v in self.seen.items() if v < watermark_sec - self.cfg.forget_after_s]
            for k in old:
                self.rate.pop(k, None), self.users.pop(k, None), self.seen.pop(k, None)
            self.tainted = {k: v for k, v in self.tainted.items() if v >= watermark_sec - self.cfg.forget_after_s}

    def _learn(self, ips: list[Any], mins: list[Any], totals: list[Any], users: list[Any]) -> None:
        a = self.cfg.alpha
        for addr, minute, total, u in zip(ips, mins, totals, users, strict=True):
            if self.tainted.get(addr, -1) >= minute * 60:
                continue
            r = total / 60.0
            self.rate[addr] = a * r + (1 - a) * self.rate.get(addr, r)
            self.users[addr] = a * u + (1 - a) * self.users.get(addr, u)
            self.seen[addr] = minute * 60

    def taint(self, addr: str, until_sec: int) -> None:
        """Stop learning from ``addr`` (it was decided against) so an attack never raises its own threshold."""
        self.tainted[addr] = max(self.tainted.get(addr, 0), until_sec)

    def scale(self, addr: str, base_rate_per_s: float) -> float:
        c = self.cfg
        by_rate = c.headroom * self.rate.get(addr, 0.0) / base_rate_per_s if base_rate_per_s > 0 else 1.0
        by_users = self.users.get(addr, 0.0) / c.users_per_unit
        return float(min(c.max_scale, max(1.0, by_rate, by_users)))


class _PathRates:
    """Learned requests per minute of each busy target (EWMA over completed minutes; minutes with fewer than
    ``floor`` requests count as 0).  Targets under a swarm watch are not learned from (a swarm never raises
    its own baseline).

    ``decay=False`` (prefix baselines): quiet minutes teach nothing and the learned rate is kept as it is
    until the target has had no minute learned for ``forget_after_min`` (a range that is busy by day and quiet
    by night keeps its daytime rate overnight)."""

    def __init__(self, alpha: float, floor: int = 5, forget_after_min: int = 24 * 60, decay: bool = True,
                 keep_last: bool = False) -> None:
        self.alpha = alpha
        self.floor = floor
        self.forget_after_min = forget_after_min
        self.decay = decay
        #: with ``keep_last``: the counts of every target in the latest minute learned (``last_minute``), also
        #: those under ``floor`` -- what the crowd guard compares with the minute under way
        self.keep_last = keep_last
        self.last_minute = -1
        self.last_counts: dict[str, int] = {}
        self.rate: dict[str, tuple[float, int]] = {}  # target -> (EWMA requests/min, last learned minute)
        self.pending: dict[tuple[str, int], int] = {}
        self.pending_minutes: dict[int, int] = {}  # minute -> number of pending keys of that minute
        self.tainted: dict[str, int] = {}  # target -> last tainted second
        self._last_prune = 0

    def per_minute(self, target: str, minute: int) -> float:
        r = self.rate.get(target)
        if r is None:
            return 0.0
        if not self.decay:
            return r[0] if minute - r[1] <= self.forget_after_min else 0.0
        gap = max(minute - r[1] - 1, 0)
        return r[0] * (1 - self.alpha) ** gap

    def learn(self, target: str, minute: int, count: int) -> bool:
        """Learn one completed minute's count of ``target`` (minutes in order); False when it teaches nothing
        (under ``floor``, the target tainted then, or that minute or a later one already learned)."""
        if count < self.floor or self.tainted.get(target, -1) >= minute * 60:
            return False
        known = self.rate.get(target)
        if known is not None and minute <= known[1]:
            return False  # learned already (a replay, late lines, a warm start's minute): once per minute
        prev = self.per_minute(target, minute)
        a = self.alpha
        self.rate[target] = (a * count + (1 - a) * prev if target in self.rate else float(count), minute)
        return True

    def taint(self, target: str, until_sec: int) -> None:
        """Learn nothing from ``target`` up to ``until_sec`` (it is banned or under watch)."""
        self.tainted[target] = max(self.tainted.get(target, 0), until_sec)

    def update(self, codes: np.ndarray, uniques: np.ndarray, secs: np.ndarray, watermark_sec: int) -> None:
        """Count a batch's requests per (target, minute); learn the minutes before the watermark's."""
        wm = watermark_sec // 60
        if len(codes):
            minute = secs // 60
            m0 = int(minute.min())
            span = np.int64(int(minute.max()) - m0 + 1)
            kc, first = pd.factorize(codes * span + (minute - m0), sort=False)
            n = np.bincount(kc, minlength=len(first))
            fm = first % span + m0
            # Python work only for groups that can matter: busy ones, the open minute, and minutes pending
            sel = (n >= self.floor) | (fm >= wm) | np.isin(fm, list(self.pending_minutes))
            pend, pm = self.pending, self.pending_minutes
            for f, c in zip(first[sel].tolist(), n[sel].tolist(), strict=True):
                k = (str(uniques[f // span]), int(f % span) + m0)
                was = pend.get(k)
                if was is None:
                    pend[k] = int(c)
                    pm[k[1]] = pm.get(k[1], 0) + 1
                else:
                    pend[k] = was + int(c)
        done = sorted((k for k in self.pending if k[1] < wm), key=lambda k: k[1]) if any(
            m < wm for m in self.pending_minutes) else []
        for m in [m for m in self.pending_minutes if m < wm]:
            del self.pending_minutes[m]
        if self.keep_last and done and done[-1][1] > self.last_minute:
            self.last_minute = done[-1][1]
            self.last_counts = {}
        for k in done:
            c = self.pending.pop(k)
            self.learn(k[0], k[1], c)
            if k[1] == self.last_minute and self.keep_last:  # late lines of that minute add to it
                self.last_counts[k[0]] = self.last_counts.get(k[0], 0) + c
        if watermark_sec - self._last_prune > 3600:
            self._last_prune = watermark_sec
            self.rate = {t: r for t, r in self.rate.items() if r[1] >= wm - self.forget_after_min}
            self.tainted = {t: v for t, v in self.tainted.items() if v >= watermark_sec - 86_400}


@dataclass
class _SwarmWatch:
    """A target under a suspected swarm: its clients' request counts since ``start_sec``."""

    target: str
    start_sec: int
    until_sec: int
    trigger: dict[str, Any]
    trigger_ms: int
    clients: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        {"t": pd.Series(dtype=np.int64), "st": pd.Series(dtype=np.int64), "oth": pd.Series(dtype=np.int64)}))
    decided: set[str] = field(default_factory=set)
    crowd: bool = False


# --------------------------------------------------------------------------------------------- crawlers

#: Crawlers that publish reverse-DNS verification: UA regex -> accepted host name suffixes.
CRAWLER_DOMAINS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # not .googleusercontent.com: Google Cloud customers' machines have reverse names there (*.bc.googleusercontent
    # .com) that resolve back, so any cloud VM sending a Googlebot user agent would pass
    (r"Googlebot|Google-InspectionTool|GoogleOther|AdsBot-Google|Mediapartners-Google|APIs-Google",
     (".googlebot.com", ".google.com")),
    (r"bingbot|BingPreview|msnbot|adidxbot", (".search.msn.com",)),
    (r"Applebot", (".applebot.apple.com",)),
    (r"YandexBot|YandexImages|YandexMobileBot|Yandex", (".yandex.ru", ".yandex.net", ".yandex.com")),
    (r"Baiduspider", (".baidu.com", ".baidu.jp")),
    (r"DuckDuckBot", (".duckduckgo.com",)),
    (r"SeznamBot", (".seznam.cz",)),
    (r"Slurp", (".crawl.yahoo.net",)),
    (r"PetalBot", (".petalsearch.com", ".aspiegel.com")),
    (r"facebookexternalhit|meta-externalagent", (".facebook.com", ".fbsv.net")),
)


class Resolver(Protocol):
    def reverse(self, ip: str) -> list[str]: ...

    def forward(self, host: str) -> list[str]: ...


class LookupFailed(RuntimeError):
    """A DNS lookup got no answer (timeout, server failure): unlike "no such name", it says nothing of the
    address.  A :class:`Resolver` may raise it; :class:`CrawlerVerifier` counts and logs it."""


#: no-answer errors of gethostbyaddr (h_errno) and getaddrinfo: "no such name" is an answer, these are not
_HERR_NO_ANSWER = {2, 3}  # TRY_AGAIN, NO_RECOVERY
_GAI_NO_ANSWER = {socket.EAI_AGAIN, socket.EAI_FAIL}


class SocketResolver:
    """System resolver with a timeout per lookup (lookups run in a small thread pool).  "No such name" is an
    empty answer; a lookup that got no answer (timeout, a server failure) raises :class:`LookupFailed`."""

    def __init__(self, timeout_s: float = 2.0) -> None:
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fp-dns")

    def _ask(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._pool.submit(call, *args).result(timeout=self.timeout_s)
        except TimeoutError:
            raise LookupFailed(f"no answer within {self.timeout_s:g} s") from None
        except socket.gaierror as exc:
            if exc.errno in _GAI_NO_ANSWER:
                raise LookupFailed(str(exc)) from None
            return None
        except socket.herror as exc:
            if exc.errno in _HERR_NO_ANSWER:
                raise LookupFailed(str(exc)) from None
            return None
        except OSError:
            return None

    def reverse(self, ip: str) -> list[str]:
        got = self._ask(socket.gethostbyaddr, ip)
        return [got[0], *got[1]] if got else []

    def forward(self, host: str) -> list[str]:
        infos = self._ask(socket.getaddrinfo, host, None)
        return sorted({str(i[4][0]) for i in infos or ()})


class CrawlerVerifier:
    """Is (ip, user agent) a verified search-engine crawler?  Cached per ip for ``cache_ttl_s`` (wall time).

    ``mode='dns'``: the UA names a known crawler AND the reverse name of ip ends in that crawler's domain AND
    that name resolves forward to ip.  ``mode='ua'``: the UA match alone (spoofable: use only when DNS is not
    available).  ``mode='off'``: never.  With ``networks`` (a
    :class:`~forumpulse.pipeline.enrich.CrawlerNetworks`), a client *without* any user agent (squid's native log
    has none) is verified when its address is in a crawler's published network and, in ``dns`` mode, its
    forward-confirmed reverse name ends in that crawler's own ``dns_suffixes`` (``.googlebot.com``, not Google's
    other fetchers, which anyone can point at a site); in ``ua`` mode the network alone decides.  A client with a
    user agent is judged by it as above.
    """

    def __init__(self, mode: str = "dns", resolver: Resolver | None = None, cache_ttl_s: int = 3600,
                 clock: Callable[[], float] = time.monotonic, networks: CrawlerNetworks | None = None) -> None:
        self.mode = mode
        self.networks = networks
        self.resolver = resolver if resolver is not None else SocketResolver()
        self.ttl = cache_ttl_s
        self.clock = clock
        self.rx = [(re.compile(p), d) for p, d in CRAWLER_DOMAINS]
        self.cache: dict[tuple[str, Any], tuple[float, bool]] = {}
        self.lookups = 0
        self.lookup_failures = 0
        self._warned_at: float | None = None

    def crawler_for(self, ua: str) -> int | None:
        for i, (rx, _) in enumerate(self.rx):
            if rx.search(ua):
                return i
        return None

    def verified(self, ip: str, user_agents: Iterable[str]) -> bool:
        if self.mode == "off":
            return False
        uas = [ua for ua in user_agents if ua]
        if not uas:
            nets = self.networks
            if nets is None or (name := nets.name_of(ip)) is None:
                return False
            suffixes = nets.dns_suffixes(name)
            return self.mode == "ua" or not suffixes or self._confirmed(ip, ("net", name), suffixes)
        idx = {i for ua in uas if (i := self.crawler_for(ua)) is not None}
        if not idx:
            return False
        if self.mode == "ua":
            return True
        return any(self._dns(ip, i) for i in idx)

    def _dns(self, ip: str, i: int) -> bool:
        return self._confirmed(ip, i, self.rx[i][1])

    def _confirmed(self, ip: str, key: Any, suffixes: tuple[str, ...]) -> bool:
        """Forward-confirmed reverse DNS of ``ip`` ends in one of ``suffixes`` (cached per ``(ip, key)``)."""
        now = self.clock()
        hit = self.cache.get((ip, key))
        if hit and now - hit[0] < self.ttl:
            return hit[1]
        self.lookups += 1
        ok = False
        try:
            for name in self.resolver.reverse(ip):
                name = name.rstrip(".").lower()
                if name.endswith(suffixes) and ip in self.resolver.forward(name):
                    ok = True
                    break
        except LookupFailed as exc:
            # not verified (a claimed crawler is not taken at its word), but said: a real crawler can be banned
            # while DNS fails, and nothing told (user trial 41).  Asked again after LOOKUP_RETRY_S, not the TTL.
            self.lookup_failures += 1
            self.cache[(ip, key)] = (now - self.ttl + LOOKUP_RETRY_S, False)
            if self._warned_at is None or now - self._warned_at >= 60:
                self._warned_at = now
                log.warning("crawler verification (crawlers.verify: dns): a DNS lookup for %s got no answer (%s); "
                            "it counts as not verified, so a real crawler can be banned while DNS fails (%d "
                            "lookup(s) failed so far; forumpulse_dos_crawler_lookup_failures_total)", ip, exc,
                            self.lookup_failures)
            return False
        self.cache[(ip, key)] = (now, ok)
        return ok


#: seconds before a crawler verification whose DNS lookup got no answer is asked again
LOOKUP_RETRY_S = 60.0


# --------------------------------------------------------------------------------------------- decisions


_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


def canonical_network(value: str) -> _Net:
    """The one network object a decision value stands for (address = /32 or /128); raises ValueError.

    IPv4-mapped IPv6 (``::ffff:1.2.3.4``) becomes IPv4, IPv6 is compressed and lower case (RFC 5952, via
    :mod:`ipaddress`), host bits of a CIDR are cleared.  Refused: anything that is not an address or network, a
    whole address family (``/0``), and scoped IPv6 (``fe80::1%eth0``: a zone id names an interface of the host
    that logged it, and no firewall set can hold it).
    """
    if not isinstance(value, str):
        raise ValueError(f"not an IP address or network: {value!r}")
    v = value.strip()
    if "%" in v:
        raise ValueError(f"scoped IPv6 address (zone id after %) is not a ban value: {value!r}")
    try:
        net = ipaddress.ip_network(v, strict=False)
    except ValueError:
        raise ValueError(f"not an IP address or network: {value!r}") from None
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen == 128 and net.network_address.ipv4_mapped:
        net = ipaddress.ip_network(str(net.network_address.ipv4_mapped))
    if net.prefixlen == 0:
        raise ValueError(f"{value.strip()!r} is a whole address family: never a ban value (so nothing to ban or unban)")
    return net


def site_proxies(settings: Settings) -> list[str]:
    """Every site's trusted proxies (``sites[].trusted_proxies``): the DoS detector never bans them."""
    return sorted({n for site in settings.sites for n in site.trusted_proxies})


def net_value(net: _Net) -> str:
    """A network as a decision value: the bare address for a /32 or /128, else the CIDR."""
    return str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)


def canonical_value(value: str) -> str:
    """``value`` as every structure keys it (manager, registry, actions, unban): an address, or a CIDR for a
    range.  Same result as ``forumpulse.pipeline.live_detect.normalize_value``; raises ValueError."""
    return net_value(canonical_network(value))


#: Never banned, whatever the configuration (allowlist or not): a ban could cut the host off from itself or
#: its own network, and no remote client sends from these.  A range overlapping one of them is refused too.
NEVER_BAN: tuple[tuple[str, _Net], ...] = tuple((r, ipaddress.ip_network(n)) for r, n in (
    ("unspecified", "0.0.0.0/8"), ("unspecified", "::/128"),
    ("loopback", "127.0.0.0/8"), ("loopback", "::1/128"),
    ("link_local", "169.254.0.0/16"), ("link_local", "fe80::/10"),
    ("multicast", "224.0.0.0/4"), ("multicast", "ff00::/8"),
))


def never_ban_reason(net: _Net) -> str | None:
    """The reason ``net`` must never be banned (``loopback``, ``unspecified``, ``link_local``, ``multicast``),
    or None.  ``net`` must be canonical (:func:`canonical_network`: IPv4-mapped already IPv4)."""
    for reason, n in NEVER_BAN:
        if net.version == n.version and (net.subnet_of(n) or n.subnet_of(net)):  # type: ignore[arg-type]
            return reason
    return None



@dataclass
class Candidate:
    rule: str
    value: str
    scope: str
    decided_at: int
    first_seen: int
    duration_s: int
    evidence: dict[str, Any]
    user_agents: list[str] = field(default_factory=list)
    #: scope ``range`` only: the range's busiest addresses in the window (3 to 10) with their user agents; the
    #: range is not banned when they are verified crawlers (DecisionManager._crawler_range)
    members: list[tuple[str, list[str]]] = field(default_factory=list)
    breaker_group: str = ""  # non-empty: counted against its own per-minute budget (breaker_limit)
    breaker_limit: int | None = None


@dataclass
class Decision:
    """One row of the ``decisions`` table (times in ms UTC).  ``action`` is ``ban`` or ``unban``."""

    id: str
    created_at: int
    decided_at: int
    first_seen: int
    expires_at: int
    site: str
    action: str
    value: str
    scope: str
    reason: str
    duration_s: int
    mode: str
    origin: str
    evidence: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The replay output object (``forumpulse detect dos``) and the Kafka/JSON-lines payload."""
        return {
            "id": self.id, "action": self.action, "value": self.value, "scope": self.scope, "reason": self.reason,
            "decided_at": iso_ms(self.decided_at), "first_seen": iso_ms(self.first_seen),
            "expires_at": iso_ms(self.expires_at), "duration_s": self.duration_s, "mode": self.mode,
            "site": self.site, "origin": self.origin, "created_at": iso_ms(self.created_at),
            "evidence": self.evidence,
        }


def decision_from_json(obj: dict[str, Any]) -> Decision:
    """The :class:`Decision` of a :meth:`Decision.to_json` object (a JSON-lines sink's line, a Kafka payload,
    the owner's spool).  Raises KeyError / ValueError / TypeError on a malformed object."""
    return Decision(id=str(obj["id"]), created_at=ms_of_iso(obj["created_at"]), decided_at=ms_of_iso(obj["decided_at"]),
                    first_seen=ms_of_iso(obj["first_seen"]), expires_at=ms_of_iso(obj["expires_at"]),
                    site=str(obj["site"]), action=str(obj["action"]), value=str(obj["value"]),
                    scope=str(obj["scope"]), reason=str(obj["reason"]), duration_s=int(obj["duration_s"]),
                    mode=str(obj["mode"]), origin=str(obj["origin"]), evidence=dict(obj.get("evidence") or {}))


class DecisionSink(Protocol):
    def emit(self, decision: Decision) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class Action(Protocol):
    """An enforcement point.  Must validate ``value`` itself (never trust it to be an address)."""

    name: str

    def ban(self, decision: Decision) -> None: ...

    def unban(self, decision: Decision) -> None: ...


class DecisionManager:
    """False-ban controls, TTL/escalation, circuit breaker, observe mode; fans decisions out.

    Times are stream time (ms).  ``submit`` returns the Decision it made or None (not an address, never banned,
    allowlisted, verified crawler, already banned, a repeat of a breaker decision); every None is counted by
    reason in ``suppressed``.  Candidate values are made canonical on entry (:func:`canonical_value`), so the
    active bans, offences, sinks, actions and ``unban`` all key one address the same way.  Action failures are
    logged and counted in ``action_errors``; they never stop detection.

    Memory: ``decisions`` keeps the newest ``keep_decisions`` (``decisions_made`` counts all); offences older
    than ``escalation.window_s`` are pruned; ``active`` holds only bans in force.
    """

    def __init__(self, config: DosConfig | None = None, sinks: Sequence[DecisionSink] = (),
                 actions: Sequence[Action] = (), verifier: CrawlerVerifier | None = None,
                 wall_clock: Callable[[], float] = time.time, networks_file: str | None = None,
                 keep_decisions: int = 100_000, trusted_proxies: Sequence[str] = ()) -> None:
        """``networks_file``: the crawler networks (``Settings.bots.networks_file``) for the default verifier; the
        built-in ``pipeline/rules/crawler_networks.yaml`` when ``None``.  ``keep_decisions``: how many of the
        newest decisions ``decisions`` keeps in memory (the sinks get every one).  ``trusted_proxies``: the
        sites' own proxies (``sites[].trusted_proxies``, :func:`site_proxies`), never banned -- a ban would cut
        every visitor behind them off; counted as ``suppressed["trusted_proxy"]``."""
        self.cfg = config or DosConfig()
        self.sinks = list(sinks)
        self.actions = list(actions)
        for a in self.actions:  # a webhook's retries must not hold up detection or the other actions
            bg = getattr(a, "deliver_in_background", None)
            if callable(bg):
                bg()
        if verifier is None:
            from forumpulse.pipeline.enrich import CrawlerNetworks

            use = self.cfg.crawlers.networks and self.cfg.crawlers.verify != "off"
            nets = CrawlerNetworks(networks_file) if use else None
            verifier = CrawlerVerifier(self.cfg.crawlers.verify, cache_ttl_s=self.cfg.crawlers.cache_ttl_s,
                                       networks=nets)
        self.verifier = verifier
        self.wall = wall_clock
        self.allow = [ipaddress.ip_network(n) for n in self.cfg.allowlist]
        self.proxies = [ipaddress.ip_network(n, strict=False) for n in trusted_proxies]
        self._proxy_warned: set[str] = set()
        self.active: dict[str, Decision] = {}
        self.offences: dict[str, deque[int]] = {}
        self.minute_bans: dict[int, int] = {}
        self.group_minute_bans: dict[str, dict[int, int]] = {}
        self.decisions: deque[Decision] = deque(maxlen=max(1, keep_decisions))
        self.decisions_made = 0
        #: (action, reason, scope, mode) -> decisions dispatched (bans and unbans; the Prometheus counter)
        self.made: dict[tuple[str, str, str, str], int] = {}
        #: value -> stream minute until which a repeat over budget is not recorded again (its last breaker
        #: decision's minute + the minutes the ban would have lasted)
        self.breaker_seen: dict[str, int] = {}
        self._breaker_warned: set[tuple[str, int]] = set()  # (breaker group, stream minute) already logged
        self._prune_offences_at = 1024
        self._prune_breaker_at = 10_000
        self.suppressed: dict[str, int] = {"allowlist": 0, "trusted_proxy": 0, "crawler": 0, "active": 0,
                                           "active_range": 0, "invalid": 0,
                                           "breaker_repeat": 0, **{r: 0 for r, _ in NEVER_BAN}}
        self.action_errors = 0
        #: stream time (ms) of the candidate being judged: ``stream_clock`` reads it
        self.stream_ms = 0

    def stream_clock(self) -> float:
        """A ``wall_clock`` for replays: the stream time of the decision being made, in seconds (so a replay's
        ``created_at`` equals its ``decided_at`` and its bans are not in force today)."""
        return self.stream_ms / 1000

    @staticmethod
    def overlaps(value: str, nets: Sequence[_Net]) -> bool:
        """Whether the address or range ``value`` overlaps one of ``nets`` (either inside the other); a value that
        is not an address counts as overlapping, so it is never acted on."""
        try:
            net = canonical_network(value)
        except ValueError:
            return True  # not an address: never act on it
        return any(net.version == a.version and (net.subnet_of(a) or a.subnet_of(net))  # type: ignore[arg-type]
                   for a in nets)

    def submit(self, c: Candidate) -> Decision | None:
        self.stream_ms = c.decided_at
        self.expire(c.decided_at)
        try:
            net = canonical_network(c.value)
        except ValueError:
            self.suppressed["invalid"] += 1
            return None
        value = net_value(net)
        if value in self.active:
            self.suppressed["active"] += 1
            return None
        if c.scope == "ip" and self._range_holds(net, c.decided_at + c.duration_s * 1000):
            self.suppressed["active_range"] += 1
            return None
        never = never_ban_reason(net)
        if never is not None:
            self.suppressed[never] += 1
            log.warning("dos: refusing to ban %s (%s, never banned); rule %s", value, never, c.rule)
            return None
        if self.overlaps(value, self.proxies):
            self.suppressed["trusted_proxy"] += 1
            if value not in self._proxy_warned:  # once per value: a live detector resubmits it every batch
                self._proxy_warned.add(value)
                log.warning("dos: refusing to ban %s: a trusted proxy (sites[].trusted_proxies) or a range "
                            "holding one; rule %s (said once per address)", value, c.rule)
            return None
        if self.overlaps(value, self.allow):
            self.suppressed["allowlist"] += 1
            return None
        if c.scope == "ip" and self.verifier.verified(value, c.user_agents):
            self.suppressed["crawler"] += 1
            return None
        if c.scope == "range" and self._crawler_range(c):
            self.suppressed["crawler"] += 1
            return None
        minute = c.decided_at // 60_000
        if c.breaker_group and c.breaker_limit is not None:
            bans, limit = self.group_minute_bans.setdefault(c.breaker_group, {}), c.breaker_limit
        else:
            bans, limit = self.minute_bans, self.cfg.max_bans_per_minute
        mode: str = self.cfg.mode
        if mode == "enforce" and bans.get(minute, 0) + 1 > limit:
            # not enforced, so not held as active either: the offender stays judgeable and is banned for real
            # once the budget allows.  Recorded once for as long as the ban would have lasted (a live detector
            # resubmits it every batch while the flood goes on; once per minute made a big swarm's rows ~10x
            # its members).
            if minute < self.breaker_seen.get(value, minute):
                self.suppressed["breaker_repeat"] += 1
                return None
            mode = "breaker"
            warned = (c.breaker_group, minute)
            if warned not in self._breaker_warned:  # one line per budget and minute, not one per offender
                if len(self._breaker_warned) > 100:
                    self._breaker_warned = {w for w in self._breaker_warned if w[1] >= minute - 1}
                self._breaker_warned.add(warned)
                log.warning("dos circuit breaker%s: more than %d bans in minute %s; %s and any further ones this "
                            "minute recorded with mode=breaker, not enforced",
                            f" ({c.breaker_group})" if c.breaker_group else "", limit, iso_ms(minute * 60_000),
                            value)
        bans[minute] = bans.get(minute, 0) + 1
        if len(bans) > 10:
            for k in sorted(bans)[:-5]:
                del bans[k]
        esc = self.cfg.escalation
        horizon = c.decided_at - esc.window_s * 1000
        hist = self.offences.get(value, deque())
        while hist and hist[0] < horizon:
            hist.popleft()
        duration = int(min(esc.max_duration_s, c.duration_s * esc.factor ** len(hist)))
        d = Decision(
            id=uuid.uuid4().hex, created_at=int(self.wall() * 1000), decided_at=c.decided_at,
            first_seen=c.first_seen, expires_at=c.decided_at + duration * 1000, site=self.cfg.site, action="ban",
            value=value, scope=c.scope, reason=c.rule, duration_s=duration, mode=mode, origin="forumpulse",
            evidence={**c.evidence, "offence": len(hist) + 1},
        )
        if mode == "breaker":
            self.breaker_seen[value] = minute + max(1, -(-duration // 60))
            if len(self.breaker_seen) > self._prune_breaker_at:  # amortised: when the map has doubled
                self.breaker_seen = {k: m for k, m in self.breaker_seen.items() if m > minute}
                self._prune_breaker_at = max(10_000, 2 * len(self.breaker_seen))
        else:
            # a breaker decision is no offence (nothing was enforced) and blocks no later real ban
            hist.append(c.decided_at)
            self.offences[value] = hist
            self.active[value] = d
            self._prune_offences(horizon)
        self._dispatch(d)
        return d

    def _range_holds(self, net: _Net, until_ms: int) -> bool:
        """An enforced range ban in force holds ``net`` until at least ``until_ms``: a ban of one of its
        addresses would block nothing more, yet took a place in the minute's breaker budget (a range's members
        went on tripping client_flood, from a trial) -- refused as ``active_range``.  One ending sooner does not
        hold it: the address is banned for its own time.  (Scans the bans in force, as :meth:`expire` does.)"""
        return any(d.scope == "range" and d.mode == "enforce" and d.expires_at >= until_ms
                   and net.version == (r := canonical_network(d.value)).version
                   and net.subnet_of(r)  # type: ignore[arg-type]
                   for d in self.active.values())

    def _crawler_range(self, c: Candidate) -> bool:
        """A crawler's own range (Googlebot from a dozen addresses of 66.249.66.0/24): its busiest addresses
        (:attr:`Candidate.members`) each pass the single-client check, and either they hold at least half of the
        range's requests in the window or the range lies inside one crawler's published network.  Only with
        ``verify: dns`` (forward-confirmed reverse DNS, or a published network for clients without a user agent):
        with ``ua`` anyone could spare a whole range by sending a crawler's user agent, and the range rules are
        what is left against a /24 that does so."""
        if self.verifier.mode != "dns" or not c.members:
            return False
        if float(c.evidence.get("members_share", 0.0)) < 0.5 and not self._in_crawler_network(c.value):
            return False
        return all(self.verifier.verified(ip, uas) for ip, uas in c.members)

    def _in_crawler_network(self, value: str) -> bool:
        nets = self.verifier.networks
        if nets is None:
            return False
        try:
            net = canonical_network(value)
        except ValueError:
            return False
        first = nets.name_of(str(net.network_address))
        return first is not None and first == nets.name_of(str(net.broadcast_address))

    def _prune_offences(self, horizon_ms: int) -> None:
        """Forget addresses whose newest offence is older than the escalation window (amortised: runs when the
        map has doubled since the last pass)."""
        if len(self.offences) <= self._prune_offences_at:
            return
        self.offences = {k: h for k, h in self.offences.items() if h and h[-1] >= horizon_ms}
        self._prune_offences_at = max(1024, 2 * len(self.offences))

    def expire(self, now_ms: int) -> list[Decision]:
        """Forget bans whose expiry (stream time) has passed; the firewall sets expire them on their own."""
        gone = [d for d in self.active.values() if d.expires_at <= now_ms]
        for d in gone:
            del self.active[d.value]
        return gone

    def unban(self, value: str, reason: str = "manual", now_ms: int | None = None) -> Decision | None:
        """Manual unban: removes the active ban (if any) and tells every sink and action.  ``value`` may be any
        spelling of the address or network (it is made canonical like a candidate's).  It also forgets the
        value's offences (:meth:`forget`), held or not: an operator unbans because a ban was wrong, so the next
        ban of that value is a first offence again, not an escalated one.  Returns None when nothing was held."""
        try:
            value = canonical_value(value)
        except ValueError:
            return None
        self.forget(value)
        d = self.active.pop(value, None)
        if d is None:
            return None
        now = int(self.wall() * 1000) if now_ms is None else now_ms
        u = Decision(id=uuid.uuid4().hex, created_at=int(self.wall() * 1000), decided_at=now, first_seen=d.first_seen,
                     expires_at=now, site=d.site, action="unban", value=d.value, scope=d.scope, reason=reason,
                     duration_s=0, mode=d.mode, origin="forumpulse", evidence={"ban_id": d.id})
        self._dispatch(u)
        return u

    def forget(self, value: str) -> None:
        """Forget the escalation history of ``value`` (any spelling): its offences and a breaker record, so its
        next ban is a first offence with the rule's own duration.  A manual unban calls it."""
        try:
            value = canonical_value(value)
        except ValueError:
            return
        self.offences.pop(value, None)
        self.breaker_seen.pop(value, None)

    def dispatch(self, d: Decision) -> None:
        """Record ``d`` and fan it out to the sinks and (enforced) actions, counted like the manager's own; for
        a decision made outside :meth:`submit` / :meth:`unban` (an unban of a ban this manager does not hold).
        It does not change ``active``."""
        self._dispatch(d)

    def _dispatch(self, d: Decision) -> None:
        self.decisions.append(d)
        self.decisions_made += 1
        k = (d.action, d.reason, d.scope, d.mode)
        self.made[k] = self.made.get(k, 0) + 1
        for s in self.sinks:
            s.emit(d)
        if d.mode != "enforce":
            return
        for a in self.actions:
            try:
                a.ban(d) if d.action == "ban" else a.unban(d)
            except Exception as exc:
                self.action_errors += 1
                log.error("action %s failed for %s %s: %s", getattr(a, "name", a), d.action, d.value, exc)

    def flush(self) -> None:
        for s in self.sinks:
            s.flush()


# --------------------------------------------------------------------------------------------- sinks


class JsonLinesSink:
    """Appends one JSON object per decision to a text stream (or a path)."""

    def __init__(self, out: Any) -> None:
        self._own = isinstance(out, str)
        self.out = open(out, "a", encoding="utf-8") if isinstance(out, str) else out  # noqa: SIM115

    def emit(self, decision: Decision) -> None:
        self.out.write(json.dumps(decision.to_json(), sort_keys=True) + "\n")

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        self.flush()
        if self._own:
            self.out.close()


class StoreSink:
    """Buffers decisions and inserts them into the ``decisions`` table (one Arrow block per flush)."""

    def __init__(self, store: Any, flush_every: int = 100) -> None:
        self.store = store
        self.flush_every = flush_every
        self.buf: list[Decision] = []

    def emit(self, decision: Decision) -> None:
        self.buf.append(decision)
        if len(self.buf) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self.buf:
            return
        import pyarrow as pa

        ts = pa.timestamp("ms", tz="UTC")
        b, self.buf = self.buf, []
        t = pa.table({
            "id": [d.id for d in b],
            "created_at": pa.array([d.created_at for d in b], ts),
            "decided_at": pa.array([d.decided_at for d in b], ts),
            "first_seen": pa.array([d.first_seen for d in b], ts),
            "expires_at": pa.array([d.expires_at for d in b], ts),
            "site": [d.site for d in b], "action": [d.action for d in b], "value": [d.value for d in b],
            "scope": [d.scope for d in b], "reason": [d.reason for d in b],
            "duration_s": pa.array([d.duration_s for d in b], pa.uint32()),
            "mode": [d.mode for d in b], "origin": [d.origin for d in b],
            "evidence": [json.dumps(d.evidence, sort_keys=True) for d in b],
        })
        token = "decisions-" + hashlib.sha256("".join(d.id for d in b).encode()).hexdigest()[:24]
        self.store.insert("decisions", t, dedup_token=token)

    def close(self) -> None:
        self.flush()


class UndeliveredError(RuntimeError):
    """A sink could not deliver ``undelivered`` (decisions): the caller keeps them and emits them again
    (:class:`forumpulse.pipeline.live_detect._GuardedSink` does, bounded)."""

    def __init__(self, message: str, undelivered: Sequence[Decision]) -> None:
        super().__init__(message)
        self.undelivered = list(undelivered)


class KafkaSink:
    """Publishes decisions as JSON on ``topic`` (default ``weblogs.decisions``), keyed by the banned value.

    Delivery is confirmed, not assumed: each message carries a delivery callback.  :meth:`flush` waits up to
    ``flush_timeout_s`` and raises :class:`UndeliveredError` with the decisions whose delivery failed (librdkafka
    gave up: ``message.timeout.ms``, 5 min by default), to be emitted again; those still waiting (a broker away
    for less) stay in the producer's queue, counted in :attr:`waiting`, and a later flush reports them.
    :meth:`close` waits ``close_timeout_s`` more and raises with everything still unconfirmed: the process is
    about to drop them.  Before this a flush that left messages queued returned quietly and a closing CLI lost
    them (from a review).  At least once: a message re-sent after a timeout may also arrive late.

    ``producer`` may be injected (anything with ``produce(topic, value=, key=, on_delivery=)``, ``poll`` and
    ``flush``); otherwise a confluent-kafka Producer is made from ``bootstrap_servers``.

    ``on_delivered`` (e.g. :func:`published_recorder`: the ``decisions_published`` table) is called at each
    flush and at close with the ids of the decisions confirmed since the last call, so that a restarted owner
    can publish again what the topic never confirmed (``LiveDos.republish``).  An exception from it is logged and
    counted in :attr:`record_errors`, never raised (the decisions *were* delivered); the ids are offered again at
    the first flush :data:`RECORD_RETRY_S` later (and at close), up to :data:`KEEP_CONFIRMED` of them (the
    oldest beyond are forgotten: published again at the next start, at least once).
    """

    def __init__(self, bootstrap_servers: str = "127.0.0.1:9092", topic: str = "weblogs.decisions",
                 producer: Any = None, flush_timeout_s: float = 10.0, close_timeout_s: float = 10.0,
                 on_delivered: Callable[[list[str]], None] | None = None) -> None:
        if producer is None:
            from confluent_kafka import Producer
            from forumpulse.pipeline.kafka_client import client_config

            producer = Producer(client_config({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                                               "linger.ms": 20}))
        self.producer = producer
        self.topic = topic
        self.flush_timeout_s, self.close_timeout_s = flush_timeout_s, close_timeout_s
        self.delivered = 0
        self.failed = 0
        self._serial = 0
        self._in_flight: dict[int, Decision] = {}  # handed to the producer, no delivery report yet
        self._errors: list[tuple[Decision, str]] = []  # delivery reports with an error, since the last flush
        self.on_delivered = on_delivered
        self.record_errors = 0
        self._confirmed: list[str] = []  # ids delivered and not yet handed to on_delivered
        self._record_after = 0.0  # monotonic time before which a failed on_delivered is not tried again

    @property
    def waiting(self) -> int:
        """Decisions handed to the producer without a delivery report yet."""
        return len(self._in_flight)

    def emit(self, decision: Decision) -> None:
        self._serial += 1
        serial = self._serial

        def report(err: Any, _msg: Any) -> None:
            d = self._in_flight.pop(serial, None)
            if d is None:
                return
            if err is None:
                self.delivered += 1
                if self.on_delivered is not None:
                    self._confirmed.append(d.id)
            else:
                self._errors.append((d, str(err)))

        self.producer.produce(self.topic, value=json.dumps(decision.to_json(), sort_keys=True).encode(),
                              key=decision.value.encode(), on_delivery=report)
        self._in_flight[serial] = decision  # only once handed over: a produce() that raised leaves nothing
        self.producer.poll(0)

    def flush(self) -> None:
        self._wait(self.flush_timeout_s)

    def _wait(self, timeout_s: float, give_up: bool = False) -> None:
        self.producer.flush(timeout_s)
        self._record(force=give_up)
        bad, self._errors = self._errors, []
        why = bad[0][1] if bad else f"no delivery report within {timeout_s:g} s"
        lost = [d for d, _ in bad]
        if give_up and self._in_flight:
            lost += list(self._in_flight.values())
            self._in_flight.clear()
        if lost:
            self.failed += len(lost)
            raise UndeliveredError(f"{len(lost)} decision(s) not delivered to Kafka topic {self.topic} ({why})",
                                   lost)

    def close(self) -> None:
        self._wait(max(self.close_timeout_s, self.flush_timeout_s), give_up=True)

    def _record(self, force: bool = False) -> None:
        if not self._confirmed or self.on_delivered is None:
            return
        if not force and time.monotonic() < self._record_after:
            return  # it failed a moment ago (the store away): not a second store timeout on every flush
        ids = self._confirmed
        try:
            self.on_delivered(ids)
        except Exception as exc:
            self.record_errors += 1
            self._record_after = time.monotonic() + RECORD_RETRY_S
            keep = ids[-KEEP_CONFIRMED:]
            log.warning("kafka %s: %d delivered decision(s) not recorded as published (%s)%s", self.topic,
                        len(ids), error_line(exc),
                        "; the next start publishes again those in the decisions table (or its spool)" if force else
                        f"; offered again in {RECORD_RETRY_S:g} s" if len(keep) == len(ids) else
                        f"; {len(ids) - len(keep)} forgotten (published again at the next start)")
            self._confirmed = keep
        else:
            self._confirmed = []


#: delivered decision ids a KafkaSink keeps while its ``on_delivered`` fails (the store away)
KEEP_CONFIRMED = 10_000
#: seconds a KafkaSink waits after a failed ``on_delivered`` before trying it again (flushes in between skip it)
RECORD_RETRY_S = 10.0


def published_recorder(store: Any, topic: str, clock: Callable[[], float] = time.time) -> Callable[[list[str]], None]:
    """An ``on_delivered`` for :class:`KafkaSink`: one ``decisions_published`` row (migration 0012) per decision
    id ``topic`` confirmed.  Idempotent (the table keeps one row per topic and id).  Raises what the insert
    raises (a store without the table: run ``forumpulse db migrate``)."""

    def record(ids: list[str]) -> None:
        import pyarrow as pa
        from forumpulse.pipeline.tables import PUBLISHED_SCHEMA

        now = int(clock() * 1000)
        store.insert("decisions_published", pa.table(
            {"topic": [topic] * len(ids), "id": ids, "published_at": [now] * len(ids)}, schema=PUBLISHED_SCHEMA))

    return record


# --------------------------------------------------------------------------------------------- detector


@dataclass
class _Hits:
    """The seconds (ascending) of one batch in which a rule holds for one key, and how to make the candidate of
    the ``pos``-th of them.  The first is submitted; a later one only when the manager's answer can change."""

    secs: np.ndarray
    make: Callable[[int], Candidate]

    def find(self, from_sec: int) -> int | None:
        """Position of the first hit second >= ``from_sec`` (None: none left in this batch)."""
        pos = int(np.searchsorted(self.secs, from_sec, side="left"))
        return pos if pos < len(self.secs) else None


class DosDetector:
    """Evaluates every rule on each batch, keeping window state between batches (stream time).

    ``process(batch)`` returns the decisions made for this batch (after the manager's controls).
    ``stats`` counts lines seen/ignored and candidates per rule.
    """

    def __init__(self, rules: RuleSet | None = None, manager: DecisionManager | None = None) -> None:
        self.rules = rules or load_rules()
        self.manager = manager or DecisionManager()
        self.rx = self.rules.compiled
        self.windows: dict[str, tuple[Any, ...]] = {}
        for r in self.rules.rules:
            if r.kind == "count":
                self.windows[r.name] = (_CountWindow(r.window_s),)
            elif r.kind == "distinct":
                self.windows[r.name] = (_DistinctWindow(r.window_s), _CountWindow(r.window_s)) + (
                    (_DistinctWindow(r.window_s),) if r.max_target_ratio is not None else ())
            elif r.kind == "swarm":
                self.windows[r.name] = (_CountWindow(r.window_s), _DistinctWindow(r.window_s))
            else:
                self.windows[r.name] = (_CountWindow(r.window_s), _DistinctWindow(r.window_s),
                                        _CountWindow(r.window_s))
        # count rules with the same key, filter and window (prefix_flood, prefix_surge) share their windows: one
        # count and one clients window per batch for the group, each rule reading its own thresholds from them
        self._group: dict[str, str] = {}  # rule -> the group's first rule
        self._group_min: dict[str, float] = {}  # group -> lowest threshold in it
        sigs: dict[tuple[str, str, int], str] = {}
        for r in self.rules.rules:
            if r.kind == "count":
                g = sigs.setdefault((r.key, r.filter.model_dump_json(), r.window_s), r.name)
                self._group[r.name] = g
                self._group_min[g] = min(self._group_min.get(g, r.threshold), r.threshold)
                self.windows[r.name] = self.windows[g]
        self.path_rates = _PathRates(self.rules.baseline.alpha)
        pb = self.rules.prefix_baseline
        #: learned non-static requests per minute of each busy prefix (/24, /64), for prefix rules with
        #: ``scale: baseline``; a banned range teaches nothing while banned
        self.prefix_rates = _PathRates(pb.alpha, floor=pb.min_requests_per_minute,
                                       forget_after_min=max(pb.forget_after_s // 60, 1), decay=False,
                                       keep_last=pb.crowd_min_ranges > 0)
        self.has_prefix_scale = any(r.key == "prefix" and r.scale == "baseline" for r in self.rules.rules)
        self.has_swarm_rules = any(r.kind == "swarm" for r in self.rules.rules)
        self.swarms: dict[tuple[str, str], _SwarmWatch] = {}  # (rule, target) -> watch
        #: the first distinct stream minutes with lines (the warm-ups of rules with min_history_s count these)
        self._minutes_seen: list[int] = []
        self._warm_minutes_needed = max((-(-r.min_history_s // 60) for r in self.rules.rules), default=0)
        #: the baselines (address, prefix) have learned every minute before this second (None: nothing yet)
        self.learned_to_sec: int | None = None
        self.baseline = _Baseline(self.rules)
        self._prefixes = _PrefixCache()
        self.watermark_ms = 0
        self.stats: dict[str, int] = {"lines": 0, "ignored": 0, **{r.name: 0 for r in self.rules.rules}}

    # -- feature columns, computed once per batch (codes and distinct values, never one string per line)
    def _codes(self, b: Batch, name: str, cache: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """(codes, uniques) of a field, uniques in first-appearance order (as pandas.factorize of the strings)."""
        k = "codes:" + name
        if k not in cache:
            if name == "path_query":
                pcodes, puniq = b.codes("path")
                qcodes, quniq = b.codes("query")
                pair, first = pd.factorize(pcodes * np.int64(max(len(quniq), 1)) + qcodes, sort=False)
                pi, qi = first // max(len(quniq), 1), first % max(len(quniq), 1)
                import pyarrow as pa
                import pyarrow.compute as pc

                pa_p = pa.array(puniq[pi], type=pa.string())
                pa_q = pa.array(quniq[qi], type=pa.string())
                joined = pc.if_else(pc.equal(pa_q, ""), pa_p, pc.binary_join_element_wise(pa_p, pa_q, "?"))
                strs = np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object)
                sc, su = pd.factorize(strs, sort=False)  # distinct pairs may spell the same string
                cache[k] = (sc.astype(np.int64)[pair], np.asarray(su, dtype=object))
            else:
                cache[k] = b.codes(name)
        return cache[k]

    def _pattern(self, b: Batch, name: str, cache: dict[str, Any]) -> np.ndarray:
        k = "pattern:" + name
        if k not in cache:
            p = self.rules.patterns[name]
            codes, uniq = self._codes(b, p.field, cache)
            pk = "prepared:" + p.field
            if pk not in cache:
                cache[pk] = prepare_values(uniq)
            hit = pattern_hits(self.rx[name], uniq, cache[pk])
            cache[k] = hit[codes] if len(codes) else np.zeros(0, dtype=bool)
        return cache[k]

    def _mask(self, r: Rule, b: Batch, cache: dict[str, Any]) -> np.ndarray:
        m = np.ones(len(b), dtype=bool)
        f = r.filter
        if f.static is not None:
            st = b.is_static if b.is_static is not None else self._pattern(b, "static", cache)
            m &= st if f.static else ~st
        if f.status_in:
            m &= np.isin(b.status, f.status_in)
        if f.method_in:
            mc, mu = self._codes(b, "method", cache)
            m &= np.isin(mu, f.method_in)[mc]
        if f.pattern:
            m &= self._pattern(b, f.pattern, cache)
        return m

    def warm_prefix_rates(self, rows: Iterable[tuple[str, int, int]]) -> int:
        """Teach the prefix baselines earlier minutes, e.g. from the store's ``prefix_minute`` rollup when a live
        detector starts (a restarted owner would otherwise judge every range as never seen: a carrier NAT /24
        busy since yesterday could be banned as a surge).  ``rows``: (prefix as :func:`prefix_of` writes it,
        epoch minute, requests), in minute order, all before the lines this detector will judge.  Returns the
        number of prefixes with a learned rate.  Counts that include static files teach a higher rate than the
        live path's non-static ones: thresholds err upwards (fewer range bans), never down."""
        for prefix, minute, n in rows:
            self.prefix_rates.learn(prefix, int(minute), int(n))
        return len(self.prefix_rates.rate)

    def _note_minutes(self, secs: np.ndarray) -> None:
        """Remember the first distinct stream minutes seen (as many as the longest ``min_history_s`` needs)."""
        need = self._warm_minutes_needed
        if need == 0 or len(self._minutes_seen) >= need:
            return
        mins = set(np.unique(secs // 60).tolist())
        self._minutes_seen = sorted(set(self._minutes_seen) | mins)[:need]

    def warm_from_sec(self, min_history_s: int) -> int | None:
        """Stream second from which a rule with ``min_history_s`` may judge: the end of the
        ``ceil(min_history_s / 60)``-th distinct minute with lines seen (None: not that many yet).  Minutes, not
        the oldest line: one line of a source an hour behind adds one minute, not an hour of history."""
        k = -(-int(min_history_s) // 60)
        if k == 0:
            return 0
        return self._minutes_seen[k - 1] * 60 + 60 if len(self._minutes_seen) >= k else None

    def process(self, batch: Batch) -> list[Decision]:
        n0 = len(batch)
        self.stats["lines"] += n0
        if n0 == 0:
            return []
        ipc0, ipu0 = batch.raw_codes("client_ip")
        ok = (np.asarray(ipu0, dtype=object) != "")[ipc0] if len(ipu0) else np.zeros(n0, dtype=bool)
        if not ok.all():
            self.stats["ignored"] += int((~ok).sum())
            batch = batch.take(np.flatnonzero(ok))
        if len(batch) == 0:
            return []
        order = np.argsort(batch.ts, kind="stable")
        if not (order == np.arange(len(order))).all():
            batch = batch.take(order)
        self.watermark_ms = max(self.watermark_ms, int(batch.ts[-1]))
        self._note_minutes(batch.ts // 1000)
        wm_sec = self.watermark_ms // 1000
        secs = batch.ts // 1000
        cache: dict[str, Any] = {}
        cache["ip"] = batch.codes("client_ip")
        out: list[Decision] = []
        heap: list[tuple[int, int, Candidate, _Hits | None]] = []
        for r in self.rules.rules:
            m = self._mask(r, batch, cache)
            if not m.any():
                continue
            for item in self._evaluate(r, batch, m, secs, wm_sec, cache):
                if isinstance(item, Candidate):
                    heap.append((item.decided_at, len(heap), item, None))
                else:
                    c = item.make(0)
                    heap.append((c.decided_at, len(heap), c, item))
        heapq.heapify(heap)
        seq = len(heap)
        # submit in stream order so TTLs, escalation and the breaker see time move forward only; a key's later hit
        # seconds in this batch are offered again once the manager's answer can change (its ban expired, a later
        # minute has breaker budget), so a batch of any size decides what small live batches would
        while heap:
            _, _, c, hits = heapq.heappop(heap)
            self.stats[c.rule] += 1
            before = dict(self.manager.suppressed)
            d = self.manager.submit(c)
            if d is not None:
                out.append(d)
                if d.mode != "breaker":
                    if c.scope == "ip":
                        self.baseline.taint(c.value, (d.expires_at // 1000))
                    else:  # a range: its flood never raises its own threshold
                        self.prefix_rates.taint(d.value, d.expires_at // 1000)
            if hits is None:
                continue
            nxt = self._retry_from(c, d, before)
            if nxt is None:
                continue
            pos = hits.find(nxt)
            if pos is not None:
                c2 = hits.make(pos)
                heapq.heappush(heap, (c2.decided_at, seq, c2, hits))
                seq += 1
        # learn after judging: a batch is judged on what earlier batches taught, never on its own future
        nonstatic = self._mask_static(batch, cache)
        self.baseline.update(cache["ip"], batch.codes("user_agent"), nonstatic, secs, wm_sec)
        # the lines of an address decided against (while its ban or watch lasts) teach no path or range either:
        # a flood banned in a second must not raise its /24's thresholds for the crowd after it (user trial 37)
        teach = (nonstatic & ~self._tainted_lines(cache["ip"], secs)
                 if self.has_swarm_rules or self.has_prefix_scale else nonstatic)
        if self.has_swarm_rules:
            pc, pu = self._codes(batch, "path", cache)
            self.path_rates.update(pc[teach], pu, secs[teach], wm_sec)
            self.swarms = {k: w for k, w in self.swarms.items() if w.until_sec >= wm_sec}
        if self.has_prefix_scale:
            fc, fu = self._prefix_codes(batch, cache)
            self.prefix_rates.update(fc[teach], fu, secs[teach], wm_sec)
        self.learned_to_sec = wm_sec // 60 * 60
        return out

    def _tainted_lines(self, ip: tuple[np.ndarray, np.ndarray], secs: np.ndarray) -> np.ndarray:
        """The lines (bool mask) whose address the address baseline does not learn from at their second (it
        was decided against: :meth:`_Baseline.taint`, up to its ban's end)."""
        tainted = self.baseline.tainted
        codes, uniq = ip
        if not tainted or not len(secs):
            return np.zeros(len(secs), dtype=bool)
        # one look-up per distinct address of the batch (the tainted table grows with a botnet's bans)
        until = np.fromiter((tainted.get(str(u), -1) for u in uniq.tolist()), dtype=np.int64, count=len(uniq))
        return (codes >= 0) & (secs <= until[codes])

    def _retry_from(self, c: Candidate, d: Decision | None, before: dict[str, int]) -> int | None:
        """The first stream second at which the manager could answer ``c``'s key differently: the end of the ban
        just made or already held, the next minute after a breaker decision (its budget is per minute); None
        when the answer cannot change (allowlisted, a verified crawler, never banned, not an address)."""
        m = self.manager
        if d is not None:
            return -(-d.expires_at // 1000) if d.mode != "breaker" else (c.decided_at // 60_000 + 1) * 60
        why = next((k for k, n in m.suppressed.items() if n != before.get(k, 0)), None)
        if why == "breaker_repeat":
            return (c.decided_at // 60_000 + 1) * 60
        if why == "active_range":  # until the range ban ends (or is lifted): asked again each second
            return c.decided_at // 1000 + 1
        if why == "active":
            try:
                held = m.active.get(canonical_value(c.value))
            except ValueError:
                return None
            return -(-held.expires_at // 1000) if held is not None else c.decided_at // 1000 + 1
        return None

    def _mask_static(self, b: Batch, cache: dict[str, Any]) -> np.ndarray:
        st = b.is_static if b.is_static is not None else self._pattern(b, "static", cache)
        return ~st

    def _keys(self, r: Rule, b: Batch, cache: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        ip_codes, ip_uniq = cache["ip"]
        if r.kind in ("distributed", "swarm"):
            return self._codes(b, "path", cache)
        if r.key == "ip":
            return ip_codes, ip_uniq
        return self._prefix_codes(b, cache)

    def _prefix_codes(self, b: Batch, cache: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """(codes, uniques) of the lines' prefixes (/24, /64; '' for values that are not addresses)."""
        if "prefix" not in cache:
            ip_codes, ip_uniq = cache["ip"]
            pc, pu = _factorize(self._prefixes(ip_uniq))
            cache["prefix"] = (pc[ip_codes], pu)
        return cache["prefix"]

    def _evaluate(self, r: Rule, b: Batch, m: np.ndarray, secs: np.ndarray, wm_sec: int,
                  cache: dict[str, Any]) -> Iterator[Candidate | _Hits]:
        idx = np.flatnonzero(m)
        kcodes, kuniq = self._keys(r, b, cache)
        kc, s, ts = kcodes[idx], secs[idx], b.ts[idx]
        win = self.windows[r.name]
        if r.kind == "count":
            g = self._group[r.name]
            if "count:" + g not in cache:  # once per batch for the rules sharing this window
                cache["count:" + g] = win[0].update(kc, kuniq, s, ts, wm_sec, min_win=self._group_min[g])
            res, table = cache["count:" + g]  # scaling only raises thresholds: rows under them cannot fire
            res = res[res["win"] >= r.threshold]
            res = res.assign(value=res["win"])
        elif r.kind == "distinct":
            vc, vu = self._codes(b, r.distinct_of or "path", cache)
            cres, _ = win[1].update(kc, kuniq, s, ts, wm_sec, min_win=r.threshold)
            # distinct values <= requests in the same window: only points with enough requests are counted
            cres = cres[cres["win"] >= r.threshold]
            dres, table = win[0].update(kc, kuniq, vc[idx], vu, s, wm_sec, query=_points(cres))
            res = cres.merge(dres, on=["key", "sec"], how="left")
            res["value"] = res["distinct"].fillna(0)
            if r.min_ratio is not None:
                res = res[res["distinct"] >= r.min_ratio * res["win"]]
            if r.max_target_ratio is not None:  # readers behind one address (a NAT) browse many URLs
                tc_, tu_ = self._codes(b, "path_query", cache)
                tres, _ = win[2].update(kc, kuniq, tc_[idx], tu_, s, wm_sec, query=_points(res))
                res = res.merge(tres.rename(columns={"distinct": "targets"}), on=["key", "sec"], how="left")
                res = res[res["targets"].fillna(0) <= r.max_target_ratio * res["win"]]
        elif r.kind == "swarm":
            yield from self._swarm(r, b, idx, kc, kuniq, s, ts, wm_sec, cache)
            return
        else:
            yield from self._distributed(r, b, idx, kc, kuniq, s, ts, wm_sec, cache)
            return
        hits = res[res["value"] >= r.threshold]
        if r.min_history_s and len(hits):
            # warm-up: judged only once earlier batches taught the baselines min_history_s of stream time (a
            # replay's first large batch is never judged on baselines that batch itself has not taught yet)
            warm = self.warm_from_sec(r.min_history_s)
            taught = self.learned_to_sec
            hits = hits[hits["sec"] >= warm] if warm is not None and taught is not None and taught >= warm \
                else hits.iloc[:0]
        if r.key == "prefix" and r.min_clients > 1:
            g = self._group.get(r.name, r.name)
            if "clients:" + g not in cache:  # once per batch; distinct clients at every point of the group's rows
                dwin = self.windows.setdefault(g + ":clients", (_DistinctWindow(r.window_s),))[0]
                pts = _points(cache["count:" + g][0]) if r.kind == "count" else _points(hits)
                cache["clients:" + g] = dwin.update(kc, kuniq, cache["ip"][0][idx], cache["ip"][1], s, wm_sec,
                                                   query=pts)[0]
            if len(hits):
                hits = hits.merge(cache["clients:" + g], on=["key", "sec"], how="left")
                hits = hits[hits["distinct"] >= r.min_clients]
        if hits.empty:
            return
        for key_code, grp in hits.groupby("key", sort=False):
            value = str(table[key_code])
            if not value:
                continue
            thr = r.threshold
            learned: float | None = None
            crowd = 1.0
            if r.scale == "baseline" and r.key == "prefix":
                # the prefix's learned rate (earlier batches only), whatever its number of addresses
                minute = int(grp["sec"].min()) // 60
                learned = self.prefix_rates.per_minute(value, minute) / 60.0
                # the short measure compares the rule's window with learned non-static rates: only for a rule
                # counting exactly those lines
                same_lines = r.filter == RuleFilter(static=False)
                crowd = self._crowd(b, cache, minute, value, wm_sec, recent=win[0] if same_lines else None,
                                    sec=int(grp["sec"].min())) if learned > 0 or r.crowd_floor else 1.0
                # its own normal risen with the crowd; with crowd_floor, at least the rule's threshold risen with
                # it (a range with a low or no learned rate gets new readers too: the same allowance either way)
                sc = self._prefix_scale(learned * crowd, r.threshold / r.window_s)
                if r.crowd_floor:
                    sc = max(sc, min(self.rules.prefix_baseline.max_scale, crowd))
                thr = r.threshold * sc
                grp = grp[grp["value"] >= thr]
                if grp.empty:
                    continue
            elif r.scale == "baseline":
                sc = max(self.baseline.scale(value, r.threshold / r.window_s),
                         self._provisional_scale(b, cache, int(key_code), int(grp["sec"].max())))
                thr = r.threshold * sc
                grp = grp[grp["value"] >= thr]
                if grp.empty:
                    continue
            grp = grp.sort_values("sec", kind="stable")

            def make(pos: int, grp: pd.DataFrame = grp, key_code: Any = key_code, value: str = value,
                     thr: float = thr, learned: float | None = learned, crowd: float = crowd) -> Candidate:
                c = self._candidate(r, b, idx, kc, int(key_code), value, grp.iloc[pos], thr, cache)
                if learned is not None:
                    c.evidence["baseline_per_s"] = round(learned, 2)
                    if crowd > 1.0:
                        c.evidence["crowd_rise"] = round(crowd, 2)
                return c

            yield _Hits(grp["sec"].to_numpy(dtype=np.int64), make)

    def _crowd(self, b: Batch, cache: dict[str, Any], minute: int, exclude: str, wm_sec: int,
               recent: _CountWindow | None = None, sec: int | None = None) -> float:
        """How much the *other* busy ranges rose against their learned rates (the median of their rises, at
        least 1, at most ``max_scale``): a flash crowd -- breaking news, a push notification -- raises the
        traffic of every range with readers in it at once, and a range rising with it is not a surge of its
        own.  It multiplies a range's learned rate and, for rules with ``crowd_floor``, the rule's threshold
        (whichever is higher: a range with a low or no learned rate gets new readers too).
        1.0 when fewer than ``crowd_min_ranges`` ranges are busy (a minute of them learned in the last
        ``crowd_recent_s``).

        Two measures, the higher wins: the minute under way (for the seconds elapsed; in its first half the
        minute before is added, so a few seconds of counts are not taken as a rate), and -- given the rule's
        count window ``recent`` (of non-static lines) and the candidate's second ``sec`` -- the rule's own
        window (10 s) up to ``sec``, so a crowd is seen in its first seconds, while the minute measure still
        dilutes it with the calm before (that is when rules version 5 still banned new readers' ranges).  The
        short measure is the median *weighted by the ranges' learned rates*: a burst of a few seconds from many
        small ranges an attacker keeps busy cannot move it, only the ranges that carry most of the site's
        traffic can.  It needs at least half the window inside the window's carried tail, i.e. ``sec`` at most
        5 s before the batch's last second (live batches are small; a replay's long batches use the minute
        measure for their earlier seconds, so a replay can judge differently from a live run there).

        A range rising alone (a flood from one subnet, or a few) is judged as before: each median ignores the
        few.  Only an attack from more than half of the busy ranges at once raises it, and that is a site-wide
        flood the per-address and distributed rules see."""
        pb = self.rules.prefix_baseline
        if pb.crowd_min_ranges <= 0:
            return 1.0
        key = f"crowd:{minute}"
        if key not in cache:  # once per batch and minute: every candidate reads the same sorted rises
            rises = self._crowd_rises(b, cache, minute, wm_sec)
            cache[key] = (rises, sorted(rises.values()))
        med = self._median_but(cache[key], exclude)
        if recent is not None and sec is not None:
            key = f"crowd_recent:{id(recent)}:{sec}"
            if key not in cache:  # once per batch, window and second
                rises, weights = self._crowd_recent_rises(recent, sec, wm_sec)
                cache[key] = (rises, weights, sorted((v, weights[p]) for p, v in rises.items()))
            rises, weights, ordered = cache[key]
            med = max(med, self._weighted_median_but(rises, weights, ordered, exclude))
        return float(min(pb.max_scale, max(1.0, med)))

    def _weighted_median_but(self, rises: dict[str, float], weights: dict[str, float],
                             ordered: list[tuple[float, float]], exclude: str) -> float:
        """The median of the rises but ``exclude``'s own, each range weighted by its learned rate (the lower
        weighted median: the smallest rise with at least half the weight at or below it); 0.0 when fewer than
        ``crowd_min_ranges`` ranges remain."""
        n = len(ordered) - (exclude in rises)
        if n < self.rules.prefix_baseline.crowd_min_ranges:
            return 0.0
        total = sum(w for _, w in ordered)
        skip = None
        if exclude in rises:
            skip = (rises[exclude], weights[exclude])
            total -= skip[1]
        acc = 0.0
        for v, w in ordered:
            if skip is not None and (v, w) == skip:
                skip = None  # leave out one entry equal to the candidate's own
                continue
            acc += w
            if acc * 2 >= total:
                return float(v)
        return 0.0

    def _median_but(self, rises_ordered: tuple[dict[str, float], list[float]], exclude: str) -> float:
        """The median of the rises but ``exclude``'s own (left out by position: no copy per candidate); 0.0 when
        fewer than ``crowd_min_ranges`` remain."""
        rises, ordered = rises_ordered
        gone = -1
        if exclude in rises:
            gone = bisect.bisect_left(ordered, rises[exclude])
        n = len(ordered) - (gone >= 0)
        if n < self.rules.prefix_baseline.crowd_min_ranges:
            return 0.0

        def at(i: int) -> float:
            return float(ordered[i + 1] if 0 <= gone <= i else ordered[i])

        return at(n // 2) if n % 2 else 0.5 * (at(n // 2 - 1) + at(n // 2))

    def _busy_ranges(self, minute: int) -> dict[str, float]:
        """Ranges with a minute learned in the ``crowd_recent_s`` before ``minute``: their learned non-static
        requests per minute."""
        recent = minute - max(self.rules.prefix_baseline.crowd_recent_s // 60, 1)
        return {p: r for p, (r, last) in self.prefix_rates.rate.items() if recent <= last < minute and r > 0}

    def _crowd_recent_rises(self, win: _CountWindow, sec: int,
                            wm_sec: int) -> tuple[dict[str, float], dict[str, float]]:
        """Each busy range's non-static requests in the rule's window up to ``sec`` (read from the window's
        carried tail: the seconds after ``wm_sec - w``, this batch included) over its learned rate, and the busy
        ranges' learned rates; both empty when less than half the window is in the tail."""
        lo = max(sec - win.w, wm_sec - win.w)
        covered = sec - lo
        if covered * 2 < win.w:
            return {}, {}
        busy = self._busy_ranges(sec // 60)
        if len(busy) < self.rules.prefix_baseline.crowd_min_ranges:
            return {}, {}
        sel = (win.t_sec > lo) & (win.t_sec <= sec)
        counts: dict[str, int] = {}
        for p, n in zip(win.t_key[sel].tolist(), win.t_n[sel].tolist(), strict=True):
            if p in busy:
                counts[p] = counts.get(p, 0) + n
        return {p: counts.get(p, 0) * 60.0 / (r * covered) for p, r in busy.items()}, busy

    def _crowd_rises(self, b: Batch, cache: dict[str, Any], minute: int, wm_sec: int) -> dict[str, float]:
        """Each busy range's non-static requests in ``minute`` (so far) over its learned rate."""
        pr = self.prefix_rates
        busy = self._busy_ranges(minute)
        if len(busy) < self.rules.prefix_baseline.crowd_min_ranges:
            return {}
        elapsed = min(60, max(1, wm_sec - minute * 60 + 1))
        with_prev = elapsed < 30
        fc, fu = self._prefix_codes(b, cache)
        secs = b.ts // 1000
        ns = self._mask_static(b, cache)
        counts: dict[str, int] = {}
        for m in ((minute - 1, minute) if with_prev else (minute,)):
            sel = ns & (secs // 60 == m)
            if sel.any():
                n = np.bincount(fc[sel], minlength=len(fu))
                for i in np.flatnonzero(n):
                    p = str(fu[i])
                    if p in busy:
                        counts[p] = counts.get(p, 0) + int(n[i])
            if m == pr.last_minute:
                for p, c in pr.last_counts.items():
                    if p in busy:
                        counts[p] = counts.get(p, 0) + c
            else:
                for p in busy:
                    pc = pr.pending.get((p, m))
                    if pc:
                        counts[p] = counts.get(p, 0) + pc
        span = (60 + elapsed if with_prev else elapsed) / 60.0
        return {p: counts.get(p, 0) / (r * span) for p, r in busy.items()}

    def _prefix_scale(self, learned_per_s: float, base_rate_per_s: float) -> float:
        """A prefix's threshold factor: headroom x its learned rate over the rule's own rate, 1 to max_scale."""
        c = self.rules.prefix_baseline
        return float(min(c.max_scale, max(1.0, c.headroom * learned_per_s / base_rate_per_s)))

    def _provisional_scale(self, b: Batch, cache: dict[str, Any], ip_code: int, sec: int) -> float:
        """Users behind an address seen in this batch (the learned baseline only knows earlier batches):
        distinct user agents with >= min_requests_per_user requests in the 60 s up to ``sec``; capped at
        ``provisional_max_scale`` so a UA-rotating tool cannot raise its own threshold far."""
        c = self.rules.baseline
        rows = np.flatnonzero(cache["ip"][0] == ip_code)
        t = b.ts[rows] // 1000
        rows = rows[(t <= sec) & (t > sec - 60)]
        if len(rows) == 0:
            return 1.0
        counts = np.bincount(b.codes("user_agent")[0][rows])
        users = int((counts >= c.min_requests_per_user).sum())
        return float(min(c.provisional_max_scale, max(1.0, users / c.users_per_unit)))

    def _candidate(self, r: Rule, b: Batch, idx: np.ndarray, kc: np.ndarray, key_code: int, value: str,
                   row: Any, thr: float, cache: dict[str, Any]) -> Candidate:
        sec = int(row["sec"])
        sel = idx[(kc == key_code) & (b.ts[idx] // 1000 == sec)]
        if r.kind == "count" and len(sel):
            k = int(thr) - (int(row["win"]) - int(row["n"]))
            trig = sel[min(max(k, 1), len(sel)) - 1]
        else:
            trig = sel[-1] if len(sel) else idx[-1]
        in_win = idx[(kc == key_code) & (b.ts[idx] // 1000 > sec - r.window_s) & (b.ts[idx] <= b.ts[trig])]
        samples = [f"{b.value('method', i)} {b.value('path', i)}"
                   f"{'?' + b.value('query', i) if b.value('query', i) else ''} {b.status[i]}" for i in in_win[:3]]
        uas = sorted({b.value("user_agent", i) for i in in_win[:50]})
        first = int(row["first_ts"]) if "first_ts" in row and not pd.isna(row["first_ts"]) else int(b.ts[in_win[0]])
        ev = {"rule": r.name, "window_s": r.window_s, "threshold": round(thr, 2),
              "count": int(row["win"]), "samples": samples, "user_agents": uas[:5]}
        if "distinct" in row and not pd.isna(row["distinct"]):
            ev["distinct"] = int(row["distinct"])
        if "targets" in row and not pd.isna(row["targets"]):
            ev["distinct_urls"] = int(row["targets"])
        members: list[tuple[str, list[str]]] = []
        if r.scope == "range" and len(in_win):
            ipc, ipu = cache["ip"]
            codes, counts = np.unique(ipc[in_win], return_counts=True)
            order = np.argsort(-counts, kind="stable")
            # the busiest addresses: at least 3 (when there are), more until they hold half of the range's
            # requests in the window, at most 10 (each may cost a DNS lookup, cached)
            cum = np.cumsum(counts[order])
            k = min(len(order), 10, max(3, int(np.searchsorted(cum, 0.5 * len(in_win))) + 1))
            win_ips = ipc[in_win]
            for code in codes[order[:k]].tolist():
                rows = in_win[win_ips == code][:50]
                members.append((str(ipu[code]), sorted({b.value("user_agent", i) for i in rows})))
            ev["top_clients"] = [[str(ipu[c]), int(n)] for c, n in zip(codes[order[:3]].tolist(),
                                                                         counts[order[:3]].tolist(), strict=True)]
            ev["members_share"] = round(float(cum[k - 1]) / len(in_win), 3)
        return Candidate(rule=r.name, value=value, scope=r.scope, decided_at=int(b.ts[trig]),
                         first_seen=min(first, int(b.ts[trig])), duration_s=r.duration_s, evidence=ev,
                         user_agents=uas, members=members)

    def _distributed(self, r: Rule, b: Batch, idx: np.ndarray, tc: np.ndarray, tuniq: np.ndarray,
                     s: np.ndarray, ts: np.ndarray, wm_sec: int, cache: dict[str, Any]) -> Iterator[_Hits]:
        cnt_w, cli_w, pair_w = self.windows[r.name]
        ip_codes, ip_uniq = cache["ip"]
        ipc = ip_codes[idx]
        res, table = cnt_w.update(tc, tuniq, s, ts, wm_sec, min_win=r.threshold / 4)  # "warm" targets and up
        # clients are counted only where the target has enough requests (clients <= requests)
        dres, _ = cli_w.update(tc, tuniq, ipc, ip_uniq, s, wm_sec, query=_points(res[res["win"] >= r.threshold]))
        res = res.merge(dres, on=["key", "sec"], how="left")
        # per-client counts only for "warm" targets (>= 1/4 of the threshold): keeps the pair state small
        warm = res.loc[res["win"] * 4 >= r.threshold, "key"].unique()
        wm = np.isin(tc, warm)
        nip = np.int64(len(ip_uniq) + 1)
        pair_codes, pair_uniq = _factorize(tc[wm] * nip + ipc[wm])
        names = np.asarray([f"{tuniq[p // nip]}\x1f{ip_uniq[p % nip]}" for p in pair_uniq], dtype=object)
        pres, ptable = pair_w.update(pair_codes, names, s[wm], ts[wm], wm_sec, min_win=r.per_client_min)
        hits = res[(res["win"] >= r.threshold) & (res["distinct"] >= r.min_clients)]
        if hits.empty:
            return
        pres = pres.assign(name=ptable[pres["key"].to_numpy()])
        for key_code, grp in hits.groupby("key", sort=False):
            target = str(table[key_code])
            row = grp.sort_values("sec").iloc[0]
            sec = int(row["sec"])
            pre = target + "\x1f"
            cand = pres[(pres["sec"] >= sec) & pres["name"].str.startswith(pre) & (pres["win"] >= r.per_client_min)]
            hot = grp["sec"].to_numpy(dtype=np.int64)
            for name, g2 in cand.groupby("name", sort=False):
                ip = str(name)[len(pre):]
                g2 = g2.sort_values("sec", kind="stable")
                # its first second from the target's first hot one, then (a repeat after a ban ended, a later
                # minute with breaker budget) only seconds in which the target is hot too
                keep = np.isin(g2["sec"].to_numpy(dtype=np.int64), hot)
                keep[0] = True
                g2 = g2[keep]
                sel = idx[(ipc == _index(ip_uniq).get_loc(ip)) & (tc == key_code)]

                def make(pos: int, g2: pd.DataFrame = g2, sel: np.ndarray = sel, ip: str = ip, row: Any = row,
                         sec: int = sec, target: str = target) -> Candidate:
                    prow = g2.iloc[pos]
                    if pos == 0:  # the per_client_min-th request on the target, not before its first hot second
                        k = min(r.per_client_min, len(sel)) - 1
                        t_at = max(int(b.ts[sel[k]]), sec * 1000) if len(sel) else sec * 1000
                    else:
                        in_sec = sel[b.ts[sel] // 1000 == int(prow["sec"])]
                        t_at = int(b.ts[in_sec[0]]) if len(in_sec) else int(prow["sec"]) * 1000
                    ev = {"rule": r.name, "window_s": r.window_s, "target": target, "target_count": int(row["win"]),
                          "target_clients": int(row["distinct"]), "count": int(prow["win"]),
                          "threshold": r.per_client_min,
                          "samples": [f"{b.value('method', i)} {b.value('path', i)} {b.status[i]}" for i in sel[:3]]}
                    uas = sorted({b.value("user_agent", i) for i in sel[:50]})
                    return Candidate(rule=r.name, value=ip, scope="ip", decided_at=t_at,
                                     first_seen=int(prow["first_ts"]), duration_s=r.duration_s, evidence=ev,
                                     user_agents=uas)

                yield _Hits(g2["sec"].to_numpy(dtype=np.int64), make)


    def _swarm(self, r: Rule, b: Batch, idx: np.ndarray, tc: np.ndarray, tuniq: np.ndarray, s: np.ndarray,
               ts: np.ndarray, wm_sec: int, cache: dict[str, Any]) -> Iterator[Candidate]:
        """Swarm: a target's requests in the window reach ``threshold`` from >= ``min_clients`` addresses and
        ``rise_factor`` x its learned rate (after ``min_history_s`` of stream time).  The target is then
        watched for ``watch_s``; its clients with >= ``per_client_min`` target requests, <= ``member_max_static``
        static requests and >= ``member_min_target_share`` of their requests on the target are members.  They
        are banned only while members are >= ``min_member_share`` of the clients with ``per_client_min``
        target requests: a crowd of browsers (assets, other pages) is real users and bans nobody."""
        cnt_w, cli_w = self.windows[r.name]
        ip_codes, ip_uniq = cache["ip"]
        res, table = cnt_w.update(tc, tuniq, s, ts, wm_sec, min_win=r.threshold)
        hot = res
        dres, _ = cli_w.update(tc, tuniq, ip_codes[idx], ip_uniq, s, wm_sec, query=_points(hot))
        hot = hot.merge(dres, on=["key", "sec"], how="left")
        hot = hot[hot["distinct"] >= r.min_clients]
        warm_sec = self.warm_from_sec(r.min_history_s)
        warm = warm_sec is not None and wm_sec >= warm_sec
        for key_code, grp in hot.groupby("key", sort=False):
            target = str(table[key_code])
            w = self.swarms.get((r.name, target))
            if w is not None:
                w.until_sec = max(w.until_sec, int(grp["sec"].max()) + r.watch_s)
                continue
            if not warm:
                continue
            base = np.asarray([self.path_rates.per_minute(target, int(x) // 60) for x in grp["sec"]]) * (
                r.window_s / 60.0)
            ok = grp[grp["win"].to_numpy() >= r.rise_factor * np.maximum(base, 1e-9)]
            ok = ok[ok["sec"] >= (warm_sec or 0)]
            if ok.empty:
                continue
            row = ok.sort_values("sec").iloc[0]
            sec = int(row["sec"])
            per_min = self.path_rates.per_minute(target, sec // 60)
            # the line that completed the trigger: the threshold-th request of the window (count semantics)
            in_sec = idx[(tc == key_code) & (s == sec)]
            k = int(r.threshold) - (int(row["win"]) - int(row["n"]))
            trig_ms = int(b.ts[in_sec[min(max(k, 1), len(in_sec)) - 1]]) if len(in_sec) else sec * 1000
            self.swarms[(r.name, target)] = _SwarmWatch(
                target=target, start_sec=sec - r.window_s + 1, until_sec=sec + r.watch_s, trigger_ms=trig_ms,
                trigger={"target": target, "at": iso_ms(trig_ms), "target_count": int(row["win"]),
                         "target_clients": int(row["distinct"]), "window_s": r.window_s,
                         "baseline_per_window": round(per_min * r.window_s / 60.0, 2)})
        for (rule, _target), w in list(self.swarms.items()):
            if rule == r.name:
                yield from self._swarm_members(r, b, w, wm_sec, cache)

    def _swarm_members(self, r: Rule, b: Batch, w: _SwarmWatch, wm_sec: int,
                       cache: dict[str, Any]) -> Iterator[Candidate]:
        secs = b.ts // 1000
        rows = np.flatnonzero((secs >= w.start_sec) & (secs <= w.until_sec))
        self.path_rates.taint(w.target, w.until_sec)
        if not len(rows):
            return
        ip_codes, ip_uniq = cache["ip"]
        pc, pu = self._codes(b, "path", cache)
        hit = np.flatnonzero(pu == w.target)
        st = ~self._mask_static(b, cache)
        on_t = (pc[rows] == hit[0]) & ~st[rows] if len(hit) else np.zeros(len(rows), dtype=bool)
        ipc = ip_codes[rows]
        nip = len(ip_uniq)
        n_t = np.bincount(ipc[on_t], minlength=nip)
        n_st = np.bincount(ipc[st[rows]], minlength=nip)
        n_oth = np.bincount(ipc, minlength=nip) - n_t - n_st
        seen = np.flatnonzero(n_t + n_st + n_oth)
        cur = pd.DataFrame({"t": n_t[seen], "st": n_st[seen], "oth": n_oth[seen]}, index=ip_uniq[seen])
        prior_t = w.clients["t"].reindex(cur.index, fill_value=0).to_numpy()
        w.clients = w.clients.add(cur, fill_value=0).astype(np.int64) if len(w.clients) else cur
        c = w.clients
        eligible = c[c["t"] >= r.per_client_min]
        if eligible.empty:
            return
        total = eligible["t"] + eligible["st"] + eligible["oth"]
        member = (eligible["st"] <= r.member_max_static) & (eligible["t"] >= r.member_min_target_share * total)
        share = float(member.mean())
        w.crowd = share < r.min_member_share
        if w.crowd:
            return
        new = [ip for ip in eligible.index[member.to_numpy()] if ip not in w.decided]
        if not new:
            return
        # decided_at: the member's per_client_min-th target request when it falls in this batch
        t_rows = rows[on_t]
        t_ip = ipc[on_t]
        k_in_batch = pd.Series(t_ip).groupby(t_ip).cumcount().to_numpy() + 1
        prior = dict(zip(cur.index.tolist(), prior_t.tolist(), strict=True))
        wanted = set(new)
        mine_rows: dict[str, list[int]] = {}
        cross: dict[str, int] = {}
        for row_i, code, kk in zip(t_rows.tolist(), t_ip.tolist(), k_in_batch.tolist(), strict=True):
            ip = str(ip_uniq[code])
            if ip not in wanted:
                continue
            lst = mine_rows.setdefault(ip, [])
            if len(lst) < 50:
                lst.append(row_i)
            if ip not in cross and prior.get(ip, 0) + kk >= r.per_client_min:
                cross[ip] = row_i
        for ip in new:
            w.decided.add(ip)
            mine = mine_rows.get(ip, [])
            i = cross.get(ip, mine[0] if mine else None)
            # never before the line that triggered the watch (stream-time causality)
            at = max(int(b.ts[i]) if i is not None else int(b.ts[-1]), w.trigger_ms)
            cr = c.loc[ip]
            ev = {"rule": r.name, **w.trigger, "members": int(member.sum()), "eligible": len(eligible),
                  "member_share": round(share, 3), "count": int(cr["t"]), "static": int(cr["st"]),
                  "other": int(cr["oth"]), "threshold": r.per_client_min,
                  "samples": [f"{b.value('method', j)} {b.value('path', j)}"
                              f"{'?' + b.value('query', j) if b.value('query', j) else ''} {b.status[j]}"
                              for j in mine[:3]]}
            uas = sorted({b.value("user_agent", j) for j in mine})
            yield Candidate(rule=r.name, value=ip, scope="ip", decided_at=at,
                            first_seen=int(b.ts[mine[0]]) if mine else at, duration_s=r.duration_s,
                            evidence=ev, user_agents=uas, breaker_group=r.name,
                            breaker_limit=r.max_bans_per_minute)


def detect_records(records: Iterable[ParsedLine], detector: DosDetector | None = None,
                   batch_lines: int = 50_000) -> Iterator[Decision]:
    """Replay helper: feed records in stream order in batches; yields decisions as they are made."""
    det = detector or DosDetector()
    buf: list[ParsedLine] = []
    for rec in records:
        buf.append(rec)
        if len(buf) >= batch_lines:
            yield from det.process(Batch.from_records(buf))
            buf = []
    if buf:
        yield from det.process(Batch.from_records(buf))
    det.manager.flush()


__all__ = ["Action", "Batch", "Candidate", "CrawlerVerifier", "Decision", "DecisionManager", "DecisionSink",
           "DosDetector", "JsonLinesSink", "KafkaSink", "StoreSink", "UndeliveredError", "detect_records", "iso_ms",
           "prefix_of"]


# --------------------------------------------------------------------------------------------- replay / CLI


def parse_file(path: str, fmt: str = "auto", tz: str = "UTC", trusted_proxies: Sequence[str] = ()) -> Iterator[ParsedLine]:
    """Parsed records of a log file (``-`` = stdin) with the pipeline's parsers; drops are skipped and counted
    in ``parse_file.drops`` of the last call.  Trailing whitespace and a leading byte order mark are stripped
    before parsing; times written without an offset are in ``tz`` (the site's zone, as ingest reads them); a
    client behind one of ``trusted_proxies`` is read from ``X-Forwarded-For`` (the site's, as ingest does)."""
    import sys
    from pathlib import Path

    # lazy: the CLI imports this module at start
    from forumpulse.pipeline.formats import TrustedProxies, get_parser
    from forumpulse.pipeline.ingest import _open_maybe_compressed
    from forumpulse.pipeline.process import local_clock

    parser = get_parser(fmt, trusted=TrustedProxies(list(trusted_proxies)))
    parse = parser.parse
    local = local_clock(tz) if getattr(parser, "naive_time", False) else None
    raw = None if path == "-" else _open_maybe_compressed(Path(path))  # .gz too, as ingest reads it

    def lines() -> Iterator[str]:
        if raw is None:
            yield from sys.stdin
            return
        rest = b""
        while block := raw.read(1 << 20):
            *done, rest = (rest + block).split(b"\n")
            for b in done:
                yield b.decode("utf-8", errors="replace")
        if rest:
            yield rest.decode("utf-8", errors="replace")

    drops = 0
    try:
        for line in lines():
            r = parse(line.rstrip().removeprefix("\ufeff"))
            if isinstance(r, ParsedLine):
                yield r if local is None else r._replace(ts=local(r.ts))
            else:
                drops += 1
    finally:
        _drops[path] = drops
        if raw is not None:
            _damaged[path] = getattr(raw, "damaged", None)
            raw.close()


_drops: dict[str, int] = {}
_damaged: dict[str, str | None] = {}  # a .gz cut short or damaged: why (the lines before it were read)


def replay_warnings(lines: int, unparsed: int, ignored: int, fmt: str) -> list[str]:
    """What a replay's summary should say out loud: nothing (or little) was judged because the lines did not
    parse as ``fmt`` or carry no client address.  ``lines``: parsed lines, ``ignored``: those without an
    address (host names, as in the NASA 1995 logs, or ``-``)."""
    out = []
    if unparsed and lines == 0:
        out.append(f"none of the {unparsed} lines parsed as format {fmt!r}: nothing was judged; check --format "
                   "(`forumpulse parse --format auto FILE` shows what a line parses as)")
    elif unparsed * 2 > unparsed + lines:
        out.append(f"{unparsed} of {unparsed + lines} lines did not parse as format {fmt!r} and were not judged; "
                   "check --format")
    if lines and ignored == lines:
        out.append(f"none of the {lines} parsed lines has a client IP address (host names instead of addresses, "
                   "or '-'): nothing was judged; the DoS rules judge and ban addresses only")
    elif lines and ignored * 2 > lines:
        out.append(f"{ignored} of {lines} parsed lines have no client IP address (host names or '-') and were not "
                   "judged")
    return out


def build_detector(config_path: str | None = None, rules_file: str | None = None, mode: str | None = None,
                   sinks: Sequence[DecisionSink] = (), actions: Sequence[Action] = (),
                   verifier: CrawlerVerifier | None = None, crawler_verify: str | None = None,
                   wall_clock: Callable[[], float] | str | None = None) -> DosDetector:
    """A detector from the configuration file (section ``detectors.dos``) with the given sinks/actions;
    ``crawler_verify`` (``dns`` / ``ua`` / ``off``) overrides ``crawlers.verify``.  ``wall_clock``: the clock
    that stamps decisions' ``created_at``, the wall clock by default; ``"stream"`` stamps each decision with
    its own stream time (``DecisionManager.stream_clock``: ``created_at`` = ``decided_at``), as ``forumpulse
    detect dos`` does, so a replay of old logs makes no ban that would be in force today."""
    cfg = DosConfig()
    networks_file = None
    proxies: list[str] = []
    if config_path is not None:
        from forumpulse.pipeline.config import load_settings

        settings = load_settings(config_path)
        cfg = DosConfig.model_validate(settings.detectors.get("dos", {}))
        networks_file = settings.bots.networks_file
        proxies = site_proxies(settings)
    if mode is not None:
        cfg = cfg.model_copy(update={"mode": mode})
    if crawler_verify is not None:
        crawlers = type(cfg.crawlers).model_validate({**cfg.crawlers.model_dump(), "verify": crawler_verify})
        cfg = cfg.model_copy(update={"crawlers": crawlers})
    rules = load_rules(rules_file or cfg.rules_file, cfg.rule_overrides)
    if isinstance(wall_clock, str) and wall_clock != "stream":
        raise ValueError(f"wall_clock: a clock or 'stream', not {wall_clock!r}")
    mgr = DecisionManager(cfg, sinks=sinks, actions=actions, verifier=verifier, networks_file=networks_file,
                          trusted_proxies=proxies, wall_clock=time.time if wall_clock is None or isinstance(wall_clock, str) else wall_clock)
    if wall_clock == "stream":
        mgr.wall = mgr.stream_clock
    return DosDetector(rules, mgr)


def dos_command(
    input: str = _typer_option("-", "--input", "-i", help="log file to replay in stream time (- = stdin)"),
    format: str = _typer_option("auto", "--format", "-f", help="log format preset or spec (see `forumpulse parse`)"),
    config: str | None = _typer_option(None, "--config", "-c", help="forumpulse.yaml (section detectors.dos)"),
    rules: str | None = _typer_option(None, "--rules", help="rules YAML instead of the built-in dos.yaml"),
    observe: bool = _typer_option(False, "--observe", help="observe-only: record decisions, apply nothing"),
    crawler_verify: str | None = _typer_option(None, "--crawler-verify", help="dns | ua | off (overrides config)"),
) -> None:
    """Replay a log through the DoS detector; print one JSON object per decision: what the detector would decide
    (its `mode` as configured), with no firewall action applied.  The summary on stderr counts lines parsed,
    unparsed and ignored (no client address); a warning follows when most lines were not judged.  With `detectors.dos.enabled: false` it still
    replays (an explicit offline run, for tuning) and says so on stderr."""
    import sys

    import typer
    from forumpulse.detectors.dos_rules import DosRulesError
    from forumpulse.pipeline.cli import check_inputs
    from pydantic import ValidationError

    check_inputs([input], format)
    if crawler_verify is not None and crawler_verify not in ("dns", "ua", "off"):
        raise typer.BadParameter("must be dns, ua or off", param_hint="--crawler-verify")
    sink = JsonLinesSink(sys.stdout)
    try:
        det = build_detector(config, rules, "observe" if observe else None, sinks=[sink],
                             crawler_verify=crawler_verify, wall_clock="stream")
    except OSError as exc:
        typer.echo(f"error: cannot read {exc.filename}: {exc.strerror}", err=True)
        raise typer.Exit(2) from None
    except DosRulesError as exc:  # not YAML, not a rules mapping, an override of a rule the file lacks
        typer.echo(f"error: rules {exc}" if exc.key == "rules_file" else
                   f"error: detectors.dos.{exc} -- with --rules {rules}" if rules else f"error: detectors.dos.{exc}",
                   err=True)
        raise typer.Exit(2) from None
    except ValidationError as exc:  # a rules file that is not a DoS rules file: every problem, one a line (the
        # first alone hid the others, e.g. a mistyped scope behind a missing field; user trial 41)
        from forumpulse.detectors.dos_rules import rule_problems

        problems = rule_problems(rules, exc)
        more = [f"  ... and {len(problems) - 20} more"] if len(problems) > 20 else []
        typer.echo("\n".join([f"error: rules {rules or 'file'}: {len(problems)} problem(s):",
                               *(f"  {p}" for p in problems[:20]), *more]), err=True)
        raise typer.Exit(2) from None
    if not det.manager.cfg.enabled:  # an explicit offline replay (tuning) still runs; it applies no action anyway
        typer.echo(f"note: detectors.dos.enabled is false in {config}: the live service (run --dos) judges "
                   "nothing; this replay shows what it would decide if enabled", err=True)
    from forumpulse.pipeline.config import load_settings

    site = load_settings(config).sites[0]  # ingest's default site: its zone for times without an offset, its proxies
    for _ in detect_records(parse_file(input, format, site.timezone, site.trusted_proxies), det):
        pass
    sink.flush()
    lines, unparsed, ignored = det.stats["lines"], _drops.get(input, 0), det.stats["ignored"]
    print(json.dumps({"summary": {"lines": lines, "unparsed": unparsed, "ignored": ignored,
                                  "decisions": det.manager.decisions_made,
                                  "suppressed": det.manager.suppressed}}), file=sys.stderr)
    for warning in replay_warnings(lines, unparsed, ignored, format):
        typer.echo(f"warning: {warning}", err=True)
    if _damaged.get(input):
        typer.echo(f"error: {input}: {_damaged[input]}", err=True)
        raise typer.Exit(1)
