"""The canonical access record: the contract between parsers, stores, detectors, dashboards and outside tools.

Every access line any source writes (squid native, squid combined, Apache/nginx with any ``LogFormat`` /
``log_format``) becomes one :class:`ParsedLine` or one :class:`Drop` with a *named* reason.  Nothing else.

Field names and meanings (version :data:`RECORD_VERSION`; adding a field is a minor change, renaming or
changing a meaning is a major one and needs a new Kafka contract version as well):

``ts``            UTC timestamp in **milliseconds** since the epoch (int).  Apache ``%t`` has second precision,
                  ``%{...}t`` / squid / nginx ``$msec`` may carry milliseconds; microseconds are truncated.
``site``          the site the source belongs to (from configuration, never from the line).
``origin_host``   host that wrote the line (syslog HOST or configuration).
``origin_file``   file or program the line came from.
``source_format`` name of the format that parsed the line (preset name or ``custom``).
``client_ip``     IPv4 or IPv6 text form, ``None`` when the client field was a hostname.
``client_host``   the client field when it is a hostname (old CLF logs), else ``None``.
``ident``         RFC 1413 identity (``None`` for ``-``).
``user``          authenticated user (``None`` for ``-``).
``method``        request method as logged (``""`` for HTTP/0.9-style or missing request lines).
``url``           request target as logged, after privacy scrubbing.
``path``          percent-encoded path part of ``url`` (no scheme/host for absolute squid URLs).
``query``         query string without ``?`` (``""`` when none), after privacy scrubbing.
``protocol``      e.g. ``HTTP/1.1``; ``""`` for HTTP/0.9 request lines.
``status``        final status code, ``0`` for ``-`` / ``000``.
``bytes``         response bytes, ``0`` for ``-``.
``referer``       ``None`` for ``-``; privacy-scrubbed.
``user_agent``    ``None`` for ``-``.
``elapsed_ms``    float milliseconds (squid elapsed, Apache ``%D``/``%T``/``%{ms}T``, nginx ``$request_time``),
                  ``None`` when the format does not log it.  Stored as Float32 (and printed by ``parse`` rounded
                  to 0.001 ms): ``%D`` microseconds are kept exactly up to 16.7 s, to 2 µs up to 33 s.
``cache_result``  squid ``%Ss`` (``TCP_MISS``), ``None`` elsewhere.
``hierarchy``     squid ``%Sh`` (``HIER_DIRECT``), ``None`` elsewhere.
``upstream``      squid peer host, nginx ``$upstream_addr``, ``None`` when not logged.
``content_type``  response content type (``None`` for ``-``, ``:`` or empty).
``vhost``         virtual host (Apache ``%v``/``%V``, nginx ``$host``/``$server_name``), ``None`` when not logged.

Derived by :mod:`forumpulse.pipeline.enrich` (rules as data): ``topic_id`` (int or ``None``), ``page_kind``
(one of :data:`PAGE_KINDS`), ``is_static``, ``is_bot``, ``bot_name``.  ``page_kind`` depends on the ``status``
too: a ``topic_view`` answered with neither 2xx nor 304 (a 301/302 redirect, 403, 404, 5xx) and a ``reply``
answered with 400 or more are ``other`` (``topic_id`` kept); a ``reply`` answered 302/303 (POST-redirect-GET)
stays a reply, and an unknown status (``0``) keeps the kind (``enrich.status_page_kind``).

Guarantees: a parser never raises on any input (``str`` of any content); it returns a :class:`Drop` instead.
Parsing is a pure function of (line, format): same input, same output, no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

RECORD_VERSION = "1.0"

PAGE_KINDS = ("topic_view", "reply", "forum", "static", "api", "search", "login", "other")


class ParsedLine(NamedTuple):
    """Fields a parser extracts from one line (context fields such as ``site`` are added by the caller)."""

    ts: int
    client_ip: str | None
    client_host: str | None
    ident: str | None
    user: str | None
    method: str
    url: str
    path: str
    query: str
    protocol: str
    status: int
    bytes: int
    referer: str | None
    user_agent: str | None
    elapsed_ms: float | None
    cache_result: str | None
    hierarchy: str | None
    upstream: str | None
    content_type: str | None
    vhost: str | None


PARSED_FIELDS: tuple[str, ...] = ParsedLine._fields
CONTEXT_FIELDS: tuple[str, ...] = ("site", "origin_host", "origin_file", "source_format")
DERIVED_FIELDS: tuple[str, ...] = ("topic_id", "page_kind", "is_static", "is_bot", "bot_name")
#: Every field of the canonical record, in the order ``forumpulse parse`` prints them.
RECORD_FIELDS: tuple[str, ...] = ("ts", *CONTEXT_FIELDS, *PARSED_FIELDS[1:], *DERIVED_FIELDS)


class Drop(NamedTuple):
    """A line that is not a record.  ``reason`` is one of :data:`DROP_REASONS` (a stable, countable name);
    ``detail`` is free text for humans (which field, what was seen)."""

    reason: str
    detail: str = ""


#: Named drop reasons.  Metrics and the ``quarantine`` table use these names; keep them stable.
DROP_REASONS: dict[str, str] = {
    "empty_line": "the line is empty or only whitespace",
    "no_format_matched": "the line does not have the shape of the configured format (or of any preset)",
    "not_access_log": "the line is an error-log or other non-access line",
    "truncated": "the line ends before all fields of its format were seen (cut in the middle)",
    "bad_timestamp": "the timestamp field does not parse or is out of range",
    "bad_client": "the client field is neither an IP address nor a hostname",
    "bad_number": "a numeric field (status, bytes, elapsed) is not a number or is out of range",
    "bad_request_line": "the request line cannot be split into method, target and protocol",
    "line_too_long": "the line is longer than the configured maximum",
    "unknown_format": "the source names a format that is not configured",
}
