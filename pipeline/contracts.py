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

from typing import NamedTuple

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
    line = parts[5]
    if line.endswith(b"\n"):
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return parts[1], parts[2], parts[3], parts[4] if parts[4] not in (b"-", b"") else b"auto", line


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
