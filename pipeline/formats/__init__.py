"""Access-log parsers: format compilers, presets, per-line auto-detection.

Public API::

    parser = get_parser("combined")          # a preset name
    parser = get_parser('apache:%h %l %u %t "%r" %>s %b')   # any Apache LogFormat
    parser = get_parser("nginx:$remote_addr - $remote_user [$time_local] \\"$request\\" $status ...")
    parser = get_parser("auto")              # per-line detection among PRESETS
    rec = parser.parse(line)                 # ParsedLine | Drop, never raises for any str
    parser.last_format                       # preset name (or "custom") of the last ParsedLine

``last_format`` is the value for the record's ``source_format``: for a fixed spec it is always the parser's
``name``; for ``auto`` it is the preset that matched the last successfully parsed line (read it right after
``parse``).  :func:`parse_lines` yields ``ParsedLine | Drop`` for an iterable of lines.

Guarantees: ``parse`` is a pure function of (line, spec, trusted proxies) apart from bounded caches; it never raises for a
``str``; every :class:`Drop` reason is a key of :data:`~forumpulse.pipeline.record.DROP_REASONS`.  A trailing
``\\n``/``\\r\\n`` is removed.  Values are kept as logged (no unescaping of ``\\"`` or ``\\xHH``; privacy
scrubbing is done later by :mod:`forumpulse.pipeline.privacy`).

Misuse: ``get_parser`` raises ``ValueError`` for an unknown preset or spec prefix, and for a custom format
without any timestamp directive (a record needs ``ts``).  Lines must be ``str``: decode bytes with
``errors="backslashreplace"`` first.  Parsers are not thread-safe (they remember ``last_format``); create one
per thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Protocol

from forumpulse.pipeline.record import Drop, ParsedLine

from . import squid
from ._values import NO_PROXIES, TrustedProxies
from .compiler import CompiledFormat, compile_apache, compile_nginx

__all__ = [
    "AUTO_ORDER",
    "PRESETS",
    "AutoParser",
    "FormatParser",
    "LineParser",
    "TrustedProxies",
    "get_parser",
    "is_error_log_line",
    "parse_lines",
]

_COMBINED = '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"'
_NGINX_COMBINED = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
                   '"$http_referer" "$http_user_agent"')

#: preset name -> spec (``apache:<LogFormat>``, ``nginx:<log_format>`` or ``squid:native|combined``).
PRESETS: dict[str, str] = {
    "common": 'apache:%h %l %u %t "%r" %>s %b',
    "combined": "apache:" + _COMBINED,
    "vhost_combined": 'apache:%v:%p %h %l %u %t "%r" %>s %O "%{Referer}i" "%{User-Agent}i"',
    "combined_d": "apache:" + _COMBINED + " %D",
    "nginx_combined": "nginx:" + _NGINX_COMBINED,
    "nginx_main": "nginx:" + _NGINX_COMBINED + ' "$http_x_forwarded_for"',
    "squid": "squid:native",
    "squid_combined": "squid:combined",
}

#: Order in which ``auto`` tries presets (most specific first).  ``nginx_combined`` has exactly the shape of
#: ``combined``, so such lines are reported as ``combined``.
AUTO_ORDER: tuple[str, ...] = (
    "squid", "squid_combined", "combined_d", "vhost_combined", "nginx_main", "combined", "common",
    "nginx_combined",
)

_ERROR_LOG = re.compile(
    r"\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d [\d:.]+ \d{4}\] "  # Apache 2.x error log
    r"|\[[^\]]{6,40}\] \[[\w:-]+\] "  # [time] [module:level] ...
    r"|\[\d{4}[-/]\d\d[-/]\d\d[ T][\d:.,]+\] "  # [2021/06/03 09:30:50] ...
    r"|\d{4}/\d\d/\d\d \d\d:\d\d:\d\d \[(?:debug|info|notice|warn|error|crit|alert|emerg)\] "  # nginx
)


def is_error_log_line(line: str) -> bool:
    """True when ``line`` has the shape of an Apache or nginx error-log line."""
    return _ERROR_LOG.match(line) is not None


class LineParser(Protocol):
    name: str
    last_format: str

    def parse(self, line: str) -> ParsedLine | Drop: ...


def _precheck(line: str, max_line_bytes: int) -> tuple[str, Drop | None]:
    n = len(line)
    if n > max_line_bytes or (n * 4 > max_line_bytes
                              and len(line.encode("utf-8", "surrogatepass")) > max_line_bytes):
        return line, Drop("line_too_long", f"{len(line.encode('utf-8', 'surrogatepass'))} bytes")
    if line.endswith("\n"):
        line = line[:-2] if line.endswith("\r\n") else line[:-1]
    if not line or line.isspace():
        return line, Drop("empty_line")
    return line, None


def _candidates(line: str) -> tuple[str, ...]:
    """The line, then (when it has any) the line without trailing blanks: some servers and copy/paste leave a
    trailing space after the last field (the secrepo logs do), while squid's empty last column needs it kept."""
    stripped = line.rstrip(" \t\r")
    return (line,) if stripped == line else (line, stripped)


def _failed(line: str, formats: Iterable[CompiledFormat]) -> Drop:
    if is_error_log_line(line):
        return Drop("not_access_log", line[:80])
    for f in formats:
        if f.partial.fullmatch(line) is not None:
            return Drop("truncated", line[-40:])
    return Drop("no_format_matched", line[:80])


def _other_preset(line: str, name: str) -> str | None:
    """The first preset (``auto``'s order) other than ``name`` that parses ``line`` completely; only asked on the
    failure path, to tell a line of another format (a wrong ``--format``) from a line cut in the middle."""
    for preset in AUTO_ORDER:
        if preset == name:
            continue
        c = _compiled(preset)
        for cand in _candidates(line.rstrip("\n")):
            if c.fast.fullmatch(cand) is not None:
                return preset
    return None


class FormatParser:
    """Parser for one fixed format (a preset or a custom spec)."""

    def __init__(self, compiled: CompiledFormat, name: str, max_line_bytes: int = 65536) -> None:
        self.name = name
        self.last_format = name
        self.spec = compiled.source
        self.max_line_bytes = max_line_bytes
        self._fmt = compiled
        self._fast = compiled.fast.fullmatch
        self._lenient = compiled.lenient.fullmatch
        self._convert = compiled.convert
        #: times without a zone, read as UTC here: the processor moves them by the site's time zone
        self.naive_time = compiled.naive_time

    def parse(self, line: str) -> ParsedLine | Drop:
        try:
            m = self._fast(line)
            if m is not None and len(line) * 4 <= self.max_line_bytes:
                return self._convert(m.groups())
            line, drop = _precheck(line, self.max_line_bytes)
            if drop is not None:
                return drop
            for cand in _candidates(line):
                m = self._fast(cand) or self._lenient(cand)
                if m is not None:
                    return self._convert(m.groups())
            drop = _failed(line.rstrip(" \t\r"), (self._fmt,))
            # Stateless on purpose (the same line gets the same reason in any worker, in any order): a few
            # regex matches more per failed line (~3-10 us), on the failure path only.
            other = None if drop.reason == "not_access_log" else _other_preset(line, self.name)
            if other is None:
                return drop
            # a whole line of another format is no cut line: say which format it is
            return Drop("no_format_matched", f"the line is {other}, not {self.name}: wrong format?")
        except Exception as exc:  # the contract is "never raises"; a bug must still show up in counts
            return Drop("no_format_matched", f"parser error {type(exc).__name__}: {exc}"[:200])


class AutoParser:
    """Per-line detection among :data:`AUTO_ORDER`; the last successful preset is tried first, so a
    homogeneous file costs one regex match per line.  ``last_format`` names the preset of the last record."""

    name = "auto"

    def __init__(self, max_line_bytes: int = 65536, order: Iterable[str] = AUTO_ORDER,
                 trusted: TrustedProxies = NO_PROXIES) -> None:
        self.max_line_bytes = max_line_bytes
        self._order = [(n, _compiled(n, trusted)) for n in order]
        self._use(0)

    def _use(self, i: int) -> None:
        self._last = i
        self.last_format, fmt = self._order[i]
        self._fast = fmt.fast.fullmatch
        self._convert = fmt.convert

    def parse(self, line: str) -> ParsedLine | Drop:
        try:
            m = self._fast(line)
            if m is not None and len(line) * 4 <= self.max_line_bytes:
                rec = self._convert(m.groups())
                if rec.__class__ is ParsedLine:
                    return rec
            line, drop = _precheck(line, self.max_line_bytes)
            if drop is not None:
                return drop
            first_drop: Drop | None = None
            for cand in _candidates(line):
                for attr in ("fast", "lenient"):
                    for i, (_name, fmt) in enumerate(self._order):
                        m = getattr(fmt, attr).fullmatch(cand)
                        if m is None:
                            continue
                        rec = fmt.convert(m.groups())
                        if isinstance(rec, ParsedLine):
                            self._use(i)
                            return rec
                        if first_drop is None:
                            first_drop = rec
            if first_drop is not None:  # the shape matched but a value did not convert: name that value
                return first_drop
            return _failed(line.rstrip(" \t\r"), (f for _, f in self._order))
        except Exception as exc:
            return Drop("no_format_matched", f"parser error {type(exc).__name__}: {exc}"[:200])


_cache: dict[str, CompiledFormat] = {}


def compile_spec(spec: str, require_time: bool = True, trusted: TrustedProxies = NO_PROXIES) -> CompiledFormat:
    """Compile ``apache:...``, ``nginx:...`` or ``squid:native|combined`` (cached per spec and trusted proxies:
    they decide the client of a format that logs ``X-Forwarded-For``, see
    :func:`~forumpulse.pipeline.formats._values.forwarded_client`)."""
    key = f"{require_time}:{trusted.key}:{spec}"
    c = _cache.get(key)
    if c is not None:
        return c
    if trusted:
        plain = compile_spec(spec, require_time)
        if not plain.forwarded:  # the proxies cannot change this format's converter: share it
            _cache[key] = plain
            return plain
    kind, sep, body = spec.partition(":")
    if not sep:
        raise ValueError(f"unknown format spec {spec!r}: use a preset ({', '.join(PRESETS)}), 'auto', "
                         "'apache:<LogFormat>' or 'nginx:<log_format>'")
    if kind == "apache":
        c = compile_apache(body, require_time, trusted)
    elif kind == "nginx":
        c = compile_nginx(body, require_time, trusted)
    elif kind == "squid" and body == "native":
        c = squid.NATIVE
    elif kind == "squid" and body == "combined":
        c = squid.compile_squid_combined()
    else:
        raise ValueError(f"unknown format spec prefix in {spec!r} (apache:, nginx:, squid:native, squid:combined)")
    _cache[key] = c
    return c


def _compiled(preset: str, trusted: TrustedProxies = NO_PROXIES) -> CompiledFormat:
    return compile_spec(PRESETS[preset], trusted=trusted)


def get_parser(spec: str, *, max_line_bytes: int = 65536, trusted: TrustedProxies = NO_PROXIES) -> LineParser:
    """A parser for a preset name, ``auto``, ``apache:<LogFormat>`` or ``nginx:<log_format>``.  ``trusted``:
    the site's own proxies, whose ``X-Forwarded-For`` names the client (``sites[].trusted_proxies``)."""
    if spec == "auto":
        return AutoParser(max_line_bytes, trusted=trusted)
    if spec in PRESETS:
        return FormatParser(_compiled(spec, trusted), spec, max_line_bytes)
    return FormatParser(compile_spec(spec, trusted=trusted), "custom", max_line_bytes)


def parse_lines(lines: Iterable[str], spec: str, *, max_line_bytes: int = 65536) -> Iterator[ParsedLine | Drop]:
    """Parse every line with one parser for ``spec`` (see :func:`get_parser`)."""
    parse = get_parser(spec, max_line_bytes=max_line_bytes).parse
    for line in lines:
        yield parse(line)
