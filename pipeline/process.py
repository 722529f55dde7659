"""The processing step: raw lines of one source in, storage-ready columnar rows and quarantined lines out.

This is the one pure function every path uses (``forumpulse parse``, ``ingest``, the Kafka consumer): decode →
parse (format from the source, or per-line auto-detection) → privacy scrub → topic/page/bot/static attribution →
columns.  No I/O; the only state is caches (parsers per format, enrichment caches) that never change results.

Guarantees:

* every input line yields exactly one output: a row in ``requests`` or a row in ``quarantine`` (``read == loaded +
  quarantined`` for every call, checked here, not assumed);
* output order equals input order (within ``requests`` and within ``quarantine``);
* the same lines with the same settings give byte-identical tables (so a replayed batch gives the same insert
  block and ClickHouse block deduplication works).

Misuse to avoid: do not feed lines of different sources in one call (context fields come from ``ctx``); split on
source first.  Lines must not carry their trailing newline (a trailing ``\\n``/``\\r\\n`` is removed if present).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.enrich import REFERER_TOPIC, Enricher, status_page_kind
from forumpulse.pipeline.formats import PRESETS, TrustedProxies, compile_spec, get_parser
from forumpulse.pipeline.formats._values import NO_PROXIES
from forumpulse.pipeline.privacy import Privacy
from forumpulse.pipeline.record import RECORD_FIELDS, Drop
from forumpulse.pipeline.tables import QUARANTINE_SCHEMA, STREAM_SCHEMA

if TYPE_CHECKING:
    from forumpulse.pipeline.fastpath import FastPath


@dataclass(frozen=True)
class SourceContext:
    """Where lines came from.  ``format`` is a parser spec: preset name, ``apache:…``, ``nginx:…`` or ``auto``."""

    site: str = "forum"
    origin_host: str = ""
    origin_file: str = ""
    format: str = "auto"


@dataclass
class ProcessedBatch:
    requests: pa.Table
    quarantine: pa.Table
    #: the same rows as ``requests`` plus ``query``, with the client address as logged (before privacy): for
    #: detectors, which must see real addresses, and for ``forumpulse parse``.  Never store it.
    stream: pa.Table
    read: int
    loaded: int
    quarantined: int
    by_reason: dict[str, int] = field(default_factory=dict)
    newest_ts: int | None = None

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickle ``stream`` as its difference to ``requests`` (the ``query`` column, and ``client_ip`` only when
        privacy changed it): worker processes send each value once instead of twice."""
        ip = self.stream.column("client_ip")
        if ip is self.requests.column("client_ip") or ip.equals(self.requests.column("client_ip")):
            ip = None
        return (_rebuild_batch, (self.requests, self.stream.column("query"), ip, self.quarantine, self.read,
                                 self.loaded, self.quarantined, self.by_reason, self.newest_ts))


def _rebuild_batch(requests: pa.Table, query: pa.ChunkedArray, ip: pa.ChunkedArray | None, quarantine: pa.Table,
                   read: int, loaded: int, quarantined: int, by_reason: dict[str, int],
                   newest_ts: int | None) -> ProcessedBatch:
    stream = requests.append_column(STREAM_SCHEMA.field("query"), query)
    if ip is not None:
        stream = stream.set_column(STREAM_SCHEMA.names.index("client_ip"), STREAM_SCHEMA.field("client_ip"), ip)
    return ProcessedBatch(requests, quarantine, stream, read, loaded, quarantined, by_reason, newest_ts)


def decode_line(raw: bytes | str) -> str:
    """Bytes → str without ever failing: invalid UTF-8 becomes ``\\xNN`` escapes (as Apache escapes them)."""
    s = raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")
    if s.endswith("\n"):
        s = s[:-2] if s.endswith("\r\n") else s[:-1]
    if s.startswith("\ufeff"):  # a byte order mark (a file's first line, written by a Windows tool)
        s = s[1:]
    return s


def local_clock(tz: str) -> Callable[[int], int] | None:
    """For a format whose times carry no zone: wall-clock ms (read as if UTC) -> UTC ms in time zone ``tz``,
    the offset looked up once per local hour (per timestamp in an hour whose offset changes inside it);
    ``None`` for UTC.  A wall time that occurs twice (the hour the clocks go back) is taken as the first, one that
    does not occur (the clocks go forward) with the offset before the change."""
    if tz == "UTC":
        return None
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(tz)
    offsets: dict[int, int | None] = {}  # local hour -> its offset; None: the offset changes inside the hour

    def offset_at(ms: int) -> int:
        delta = datetime.fromtimestamp(ms // 1000, UTC).replace(tzinfo=zone).utcoffset()
        return int(delta.total_seconds() * 1000) if delta is not None else 0

    def to_utc(ms: int) -> int:
        h = ms // 3_600_000
        if h not in offsets:
            a, b = offset_at(h * 3_600_000), offset_at(h * 3_600_000 + 3_599_000)
            offsets[h] = a if a == b else None  # e.g. Lord Howe's half-hour change at 02:00
        off = offsets[h]
        return ms - (off if off is not None else offset_at(ms))

    return to_utc


class Processor:
    """Holds parsers and enrichment caches for one process.  Not thread-safe: one per thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.enricher = Enricher(settings)
        self.privacy = Privacy(settings.privacy)
        self.max_line_bytes = settings.ingest.max_line_bytes
        self._parsers: dict[tuple[str, str], object] = {}
        self._trusted: dict[str, TrustedProxies] = {}
        self._ip_changes = settings.privacy.client_ip != "keep"
        self._fast: FastPath | None = None

    def trusted(self, site: str) -> TrustedProxies:
        """The site's trusted proxies (``sites[].trusted_proxies``)."""
        t = self._trusted.get(site)
        if t is None:
            t = self._trusted[site] = TrustedProxies(self.settings.site(site).trusted_proxies)
        return t

    def parser(self, spec: str, site: str | None = None) -> object:
        """The parser of ``spec`` for ``site`` (its trusted proxies decide the client of a format that logs
        ``X-Forwarded-For``); one per (spec, trusted proxies), so ``auto``'s preset state carries over."""
        trusted = self.trusted(site) if site is not None else NO_PROXIES
        p = self._parsers.get((spec, trusted.key))
        if p is None:
            p = self._parsers[(spec, trusted.key)] = get_parser(spec, max_line_bytes=self.max_line_bytes,
                                                                trusted=trusted)
        return p

    def header_client(self, ctx: SourceContext) -> bool:
        """Whether ``ctx``'s client is read from ``X-Forwarded-For`` logged instead of the peer (a site with trusted
        proxies): such lines take the per-line path, which the vectorised one does not follow there."""
        if ctx.format == "auto" or not self.trusted(ctx.site):
            return False  # no preset logs the header without the peer
        try:
            return compile_spec(PRESETS.get(ctx.format, ctx.format)).header_client
        except ValueError:
            return False

    def process(
        self, lines: Sequence[bytes | str], ctx: SourceContext, line_no_base: int = 0, source_ref: str = ""
    ) -> ProcessedBatch:
        """Process one chunk of lines of one source.  Uses the vectorised fast path (:mod:`.fastpath`) when the
        lines are ``bytes`` and the format is supported, else :meth:`process_reference`; both give equal tables
        (only ``quarantine.ingested_at``, the wall clock, differs between calls)."""
        if self._fast is None:
            from forumpulse.pipeline.fastpath import FastPath

            self._fast = FastPath(self)
        if lines and self._fast.supports(ctx.format) and not self.header_client(ctx):
            batch = self._fast.run(lines, ctx, line_no_base, source_ref)  # type: ignore[arg-type]  # str lines: run() returns None
            if batch is not None:
                return batch
        return self.process_reference(lines, ctx, line_no_base, source_ref)

    def process_block(
        self, data: bytes, ctx: SourceContext, line_no_base: int = 0, source_ref: str = ""
    ) -> ProcessedBatch:
        """Same as :meth:`process` on ``data`` split after every ``\\n`` (how ``readlines`` splits a file; a last
        line without newline counts), without making one ``bytes`` object per line on the fast path.  Readers
        that hand whole blocks to workers save the per-line split, pickling and join."""
        from forumpulse.pipeline.fastpath import BlockLines

        lines = BlockLines(data)
        if self._fast is None:
            from forumpulse.pipeline.fastpath import FastPath

            self._fast = FastPath(self)
        if len(lines) and self._fast.supports(ctx.format) and not self.header_client(ctx):
            batch = self._fast.run(lines, ctx, line_no_base, source_ref)
            if batch is not None:
                return batch
        return self.process_reference(lines[:], ctx, line_no_base, source_ref)

    def process_reference(
        self, lines: Sequence[bytes | str], ctx: SourceContext, line_no_base: int = 0, source_ref: str = ""
    ) -> ProcessedBatch:
        """The per-line implementation: the definition of what :meth:`process` returns."""
        rows, real_ips, bad, newest = self.reference_rows(ctx, enumerate(lines))
        return self.assemble(_to_table(rows, STREAM_SCHEMA.names, STREAM_SCHEMA), real_ips, bad, newest,
                             len(lines), ctx, line_no_base, source_ref)

    def _local_clock(self, site: str) -> Callable[[int], int] | None:
        """:func:`local_clock` in the site's time zone (``sites[].timezone``)."""
        return local_clock(self.settings.site(site).timezone)

    def reference_rows(
        self, ctx: SourceContext, items: Iterable[tuple[int, bytes | str]]
    ) -> tuple[list[tuple[object, ...]], list[str | None], list[tuple[int, bytes, Drop, str]], int | None]:
        """Per-line processing of ``(index, raw)`` pairs: stream rows, real client addresses, quarantined
        ``(index, raw, drop, format)`` and the newest timestamp.  For ``auto`` the parser's preset state carries
        over from line to line (and from call to call), as it does in :meth:`process_reference`."""
        parser = self.parser(ctx.format, ctx.site)
        parse = parser.parse  # type: ignore[attr-defined]
        derive = self.enricher.derive
        topic_from_referer = self.enricher.topic_from_referer
        scrub_url = self.privacy.scrub_url
        scrub_ref = self.privacy.scrub_referer
        scrub_query = self.privacy.scrub_query
        store_ip = self.privacy.store_ip
        store_host = self.privacy.store_host
        site, ohost, ofile = ctx.site, ctx.origin_host, ctx.origin_file
        fixed_name = getattr(parser, "name", ctx.format)
        is_auto = ctx.format == "auto"
        local = self._local_clock(site) if getattr(parser, "naive_time", False) else None
        rows: list[tuple[object, ...]] = []
        real_ips: list[str | None] = []
        bad: list[tuple[int, bytes, Drop, str]] = []
        newest = None
        for i, raw in items:
            text = decode_line(raw)
            r = parse(text)
            if isinstance(r, Drop):
                rawb = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
                if rawb.endswith(b"\n"):  # the line end is one "\n" or "\r\n" (as decode_line), nothing more
                    rawb = rawb[:-2] if rawb.endswith(b"\r\n") else rawb[:-1]
                bad.append((i, rawb, r, ctx.format))
                continue
            (ts, cip, chost, ident, user, method, url, path, query, proto, status, nbytes, ref, ua, elapsed,
             cache_result, hierarchy, upstream, ctype, vhost) = r
            fmt = parser.last_format if is_auto else fixed_name  # type: ignore[attr-defined]
            if local is not None:
                ts = local(ts)
            query = scrub_query(query) if query else query
            topic_id, page_kind, is_static, is_bot, bot_name = derive(site, method, path, query, ctype, ua, cip)
            if topic_id == REFERER_TOPIC:
                topic_id = topic_from_referer(site, ref)
            page_kind = status_page_kind(page_kind, status)  # derive does not see the status
            if newest is None or ts > newest:
                newest = ts
            real_ips.append(cip)
            rows.append((
                ts, site, ohost, ofile, fmt, store_ip(cip) if cip is not None else None, store_host(chost), ident, user,
                method, scrub_url(url), path, proto, status, nbytes, scrub_ref(ref), ua, elapsed,
                cache_result, hierarchy, upstream, ctype, vhost, topic_id or 0, page_kind, is_static, is_bot,
                bot_name, query,
            ))
        return rows, real_ips, bad, newest

    def assemble(
        self, full: pa.Table, real_ips: Sequence[str | None] | pa.Array, bad: Sequence[tuple[int, bytes, Drop, str]],
        newest: int | None, read: int, ctx: SourceContext, line_no_base: int, source_ref: str,
    ) -> ProcessedBatch:
        """The batch from the stream-shaped table of loaded rows (in input order) and the quarantined lines."""
        requests = full.drop_columns(["query"])
        if self._ip_changes and full.num_rows:
            ips = real_ips if isinstance(real_ips, pa.Array) else pa.array(real_ips, pa.string())
            stream = full.set_column(STREAM_SCHEMA.names.index("client_ip"), "client_ip", ips)
        else:
            stream = full
        now_ms = int(time.time() * 1000)
        site, ohost, ofile = ctx.site, ctx.origin_host, ctx.origin_file
        qrows = [
            (now_ms, site, ohost, ofile, fmt_spec, d.reason, d.detail, rawb, line_no_base + i, source_ref)
            for i, rawb, d, fmt_spec in bad
        ]
        quarantine = _to_table(qrows, QUARANTINE_SCHEMA.names, QUARANTINE_SCHEMA)
        if requests.num_rows + quarantine.num_rows != read:  # pragma: no cover - a broken invariant is a bug
            raise AssertionError(f"processing lost lines: {read} read, {requests.num_rows}+{quarantine.num_rows} out")
        return ProcessedBatch(
            requests=requests, quarantine=quarantine, stream=stream, read=read, loaded=requests.num_rows,
            quarantined=quarantine.num_rows, by_reason=dict(Counter(b[2].reason for b in bad)), newest_ts=newest,
        )


def _to_table(rows: Sequence[tuple[object, ...]], names: Sequence[str], schema: pa.Schema) -> pa.Table:
    if not rows:
        return schema.empty_table()
    cols = list(zip(*rows, strict=True))
    return pa.Table.from_arrays([pa.array(c, type=t) for c, t in zip(cols, schema.types, strict=True)], schema=schema)


def record_dicts(batch: ProcessedBatch, line_no_base: int = 0) -> list[dict[str, object]]:
    """One dict per input line, in input order: the record in the contract's field order (``RECORD_FIELDS``,
    ``ts`` as ISO 8601 UTC with milliseconds, ``None`` for absent values), or ``{"error": reason, "line": raw}``."""
    errors = {
        int(n): {"error": r, "detail": d, "line": raw.decode("utf-8", "backslashreplace")}
        for n, r, d, raw in zip(
            batch.quarantine.column("line_no").to_pylist(), batch.quarantine.column("reason").to_pylist(),
            batch.quarantine.column("detail").to_pylist(), batch.quarantine.column("raw").to_pylist(), strict=True,
        )
    }
    records = iter(batch.stream.to_pylist())
    out: list[dict[str, object]] = []
    for i in range(line_no_base, line_no_base + batch.read):
        if i in errors:
            out.append(errors[i])
            continue
        d = next(records)
        ts = d["ts"]
        d["ts"] = ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"
        d["topic_id"] = d["topic_id"] or None
        if d["elapsed_ms"] is not None:  # stored as Float32: exact to the microsecond up to 16.7 s; print that
            d["elapsed_ms"] = round(d["elapsed_ms"], 3)
        for k in _OPTIONAL_TEXT:
            d[k] = d[k] or None
        out.append({k: d[k] for k in RECORD_FIELDS})
    return out


_OPTIONAL_TEXT = ("client_ip", "client_host", "ident", "user", "referer", "user_agent", "cache_result", "hierarchy",
                  "upstream", "content_type", "vhost", "bot_name")
