"""Value converters shared by every format: timestamps, clients, request lines, URLs, numbers.

All functions are pure and never raise on ``str`` input; they return ``None`` (or a documented sentinel) when a
value does not convert.  Hot converters keep bounded caches keyed by the exact logged text (timestamps and
clients repeat a lot in real logs); the caches are cleared when they grow past :data:`CACHE_LIMIT` entries so
memory stays bounded on adversarial input.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from datetime import UTC, datetime, timedelta

CACHE_LIMIT = 200_000

MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Accepted range for timestamps (ms): 1900-01-01 .. 2200-01-01; outside is ``bad_timestamp``.
TS_MIN_MS = -2_208_988_800_000
TS_MAX_MS = 7_258_118_400_000

_CLF_RE = re.compile(r"\[?(\d{1,2})/([A-Za-z]{3})/(\d{4}):(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? ([+-])(\d{2})(\d{2})\]?", re.ASCII)
_ISO_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?", re.ASCII)


def civil_to_ms(year: int, month: int, day: int, hour: int, minute: int, second: int,
                frac_ms: int = 0, offset_min: int = 0) -> int | None:
    """UTC milliseconds for a wall-clock time with a fixed UTC offset, ``None`` when a part is out of range."""
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        return None
    try:
        dt = datetime(year, month, day, hour, minute, min(second, 59), tzinfo=UTC)
    except (ValueError, OverflowError):
        return None
    ms = (int((dt - _EPOCH) // timedelta(seconds=1)) + (second == 60) - offset_min * 60) * 1000 + frac_ms
    if not (TS_MIN_MS <= ms <= TS_MAX_MS):
        return None
    return ms


def _frac_to_ms(frac: str | None) -> int:
    return int((frac + "00")[:3]) if frac else 0


_clf_cache: dict[str, int | None] = {}


def clf_timestamp_ms(text: str) -> int | None:
    """``10/Oct/2000:13:55:36 -0700`` (brackets optional, as Apache ``%t`` / nginx ``$time_local``) -> UTC ms.

    Cached by exact text.  ``None`` for anything else (wrong month name, ``-05:00`` offsets, missing zone...).
    """
    v = _clf_cache.get(text)
    if v is not None or text in _clf_cache:
        return v
    m = _CLF_RE.fullmatch(text)
    ms = None
    if m is not None:
        d, mon, y, hh, mm, ss, frac, sign, oh, om = m.groups()
        month = MONTHS.get(mon.lower())
        if month is not None:
            off = int(oh) * 60 + int(om)
            ms = civil_to_ms(int(y), month, int(d), int(hh), int(mm), int(ss), _frac_to_ms(frac),
                             -off if sign == "-" else off)
    if len(_clf_cache) >= CACHE_LIMIT:
        _clf_cache.clear()
    _clf_cache[text] = ms
    return ms


_CLF_STRICT = re.compile(r"\[?\d\d/[A-Za-z]{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4}\]?", re.ASCII)
_clf_day: dict[str, int | None] = {}


def clf_timestamps_ms(texts: list[str]) -> list[int | None]:
    """:func:`clf_timestamp_ms` of each text, equal value for value, faster on the common shape
    ``dd/Mon/yyyy:HH:MM:SS +hhmm`` (brackets optional): the date and zone part is converted once per distinct
    day and zone (cached), the time of day is added as arithmetic.  Any other shape takes the general function."""
    out: list[int | None] = []
    strict = _CLF_STRICT.fullmatch
    day_cache = _clf_day
    for text in texts:
        if strict(text) is None:
            out.append(clf_timestamp_ms(text))
            continue
        t = text[1:] if text[0] == "[" else text
        hh, mm, ss = int(t[12:14]), int(t[15:17]), int(t[18:20])
        if hh > 23 or mm > 59 or ss > 60:
            out.append(None)
            continue
        key = t[:11] + t[20:26]
        base = day_cache.get(key, -1)
        if base == -1:
            month = MONTHS.get(t[3:6].lower())
            off = int(t[22:24]) * 60 + int(t[24:26])
            b = None if month is None else civil_to_ms(int(t[7:11]), month, int(t[0:2]), 0, 0, 0, 0,
                                                      -off if t[21] == "-" else off)
            if b is None and month is not None:  # midnight out of range but the time of day may be in: exact path
                out.append(clf_timestamp_ms(text))
                continue
            if len(day_cache) >= CACHE_LIMIT:
                day_cache.clear()
            day_cache[key] = base = b
        if base is None:
            out.append(None)
            continue
        ms = base + (hh * 3600 + mm * 60 + ss) * 1000
        out.append(ms if TS_MIN_MS <= ms <= TS_MAX_MS else None)
    return out


_iso_cache: dict[str, int | None] = {}


def iso_timestamp_ms(text: str) -> int | None:
    """ISO 8601 (nginx ``$time_iso8601``: ``2024-01-02T03:04:05+01:00``, ``Z`` or no zone = UTC) -> UTC ms."""
    v = _iso_cache.get(text)
    if v is not None or text in _iso_cache:
        return v
    m = _ISO_RE.fullmatch(text)
    ms = None
    if m is not None:
        y, mo, d, hh, mi, ss, frac, zone = m.groups()
        off = 0
        if zone and zone != "Z":
            z = zone.replace(":", "")
            off = int(z[1:3]) * 60 + int(z[3:5])
            if z[0] == "-":
                off = -off
        ms = civil_to_ms(int(y), int(mo), int(d), int(hh), int(mi), int(ss), _frac_to_ms(frac), off)
    if len(_iso_cache) >= CACHE_LIMIT:
        _iso_cache.clear()
    _iso_cache[text] = ms
    return ms


def epoch_seconds_ms(text: str) -> int | None:
    """``1677971734.079`` (squid time, nginx ``$msec``) -> ms; extra fraction digits are truncated."""
    sec, dot, frac = text.partition(".")
    if not sec.isdigit() or (dot and not (frac.isdigit() or frac == "")) or not sec.isascii():
        return None
    ms = int(sec) * 1000 + (_frac_to_ms(frac) if frac.isascii() else 0)
    return ms if TS_MIN_MS <= ms <= TS_MAX_MS else None


# ---------------------------------------------------------------- clients

#: Hostname clients are checked leniently (old CLF logs hold odd names): ASCII letters, digits, ``_.-``, with at
#: least one letter, at most 253 characters.  DNS syntax is not enforced (a cut name such as ``.jp`` passes).
_HOST_RE = re.compile(r"[A-Za-z0-9_.-]{0,252}[A-Za-z][A-Za-z0-9_.-]{0,252}", re.ASCII)
_client_cache: dict[str, tuple[str | None, str | None] | None] = {}


def classify_client(text: str) -> tuple[str | None, str | None] | None:
    """``(client_ip, client_host)`` for an IP (IPv4, IPv6, ``[v6]``, v6 with zone) or a hostname; ``None`` when
    the text is neither (``bad_client``).  IPs are returned in the text form that was logged (not normalised),
    except that an IPv6 zone (``fe80::1%eth0``: the interface of a link-local address on the logging host) is
    dropped: it names nothing outside that host and an IPv6 column cannot hold it (chDB stored such a text as
    ``::``, a ClickHouse server rejects the whole insert)."""
    v = _client_cache.get(text)
    if v is not None or text in _client_cache:
        return v
    res: tuple[str | None, str | None] | None = None
    t = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        if ":" in t:
            try:  # the C parser first (10x faster; agrees with ipaddress on 600k fuzzed texts), ipaddress decides
                socket.inet_pton(socket.AF_INET6, t.split("%", 1)[0])
            except OSError:
                ipaddress.IPv6Address(t.split("%", 1)[0])
        else:
            ipaddress.IPv4Address(t)
        res = (t.split("%", 1)[0], None)
    except ValueError:
        if len(t) <= 253 and _HOST_RE.fullmatch(t) is not None:
            res = (None, t)
    if len(_client_cache) >= CACHE_LIMIT:
        _client_cache.clear()
    _client_cache[text] = res
    return res


# ---------------------------------------------------------------- X-Forwarded-For

_PORT_V4 = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}):\d{1,5}", re.ASCII)
_PORT_V6 = re.compile(r"\[([0-9A-Fa-f:.]+(?:%[^\]]*)?)\](?::\d{1,5})?", re.ASCII)


def forwarded_entry(item: str) -> str | None:
    """One ``X-Forwarded-For`` item -> the address it names (as :func:`classify_client` writes it), or ``None``
    for anything else (``unknown``, a hostname, an obfuscated ``_hidden`` identifier, garbage).  A port
    (``192.0.2.1:4711``, ``[2001:db8::1]:4711``, written by some load balancers) is dropped."""
    t = item.strip()
    m = _PORT_V4.fullmatch(t) or _PORT_V6.fullmatch(t)
    if m is not None:
        t = m.group(1)
    c = classify_client(t) if t else None
    return c[0] if c is not None else None


class TrustedProxies:
    """The site's own proxies and load balancers (``sites[].trusted_proxies``): the addresses whose
    ``X-Forwarded-For`` is believed.  Immutable; ``key`` (the sorted normalised CIDRs) names it in caches.
    Membership of an address text is cached (bounded like the other caches); a text that is not an address is
    never trusted."""

    def __init__(self, cidrs: tuple[str, ...] | list[str] = ()) -> None:
        nets = {ipaddress.ip_network(c.strip(), strict=False) for c in cidrs}
        self.networks = tuple(sorted(nets, key=lambda n: (n.version, str(n))))
        self.key = ",".join(str(n) for n in self.networks)
        self._seen: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def __contains__(self, ip: object) -> bool:
        if not isinstance(ip, str):
            return False
        v = self._seen.get(ip)
        if v is None:
            try:
                a = ipaddress.ip_address(ip)
                if isinstance(a, ipaddress.IPv6Address) and a.ipv4_mapped is not None:
                    a = a.ipv4_mapped  # ::ffff:10.0.0.5 is 10.0.0.5 (a dual-stack socket logs it so)
                v = any(a.version == n.version and a in n for n in self.networks)
            except ValueError:
                v = False
            if len(self._seen) >= CACHE_LIMIT:
                self._seen.clear()
            self._seen[ip] = v
        return v


NO_PROXIES = TrustedProxies()


def forwarded_client(peer: str | None, xff: str | None, trusted: TrustedProxies = NO_PROXIES) -> str | None:
    """The client address of a request from its logged peer address and ``X-Forwarded-For`` value, the way
    Apache's mod_remoteip and nginx's realip module (``real_ip_recursive on``) decide it: the addresses are
    walked from the right (the peer, then the header's items from its end, each appended by the proxy that
    received the request); the first address that is not a trusted proxy is the client.

    * A peer that is not a trusted proxy is the client: its header is ignored, since anyone can send one.
    * ``peer`` ``None`` (a format that logs the header *instead of* the peer, the common
      ``LogFormat "%{X-Forwarded-For}i ..."`` behind a proxy): the header's last item was written by the proxy
      in front of the server, so it is believed; trusted proxies further left are skipped the same way.
    * An item that is not an address (``unknown``, garbage) ends the walk: the last address walked is the
      client (a trusted proxy, rather than a value a client could have forged).  When every address is
      trusted, the leftmost one is the client.
    * ``None`` only when there is no address at all (no peer, header absent or ``-``, or its last item is not
      an address).

    Pure; never raises for ``str``/``None`` input.  Misuse: ``peer`` must be an address as
    :func:`classify_client` returns it, not a hostname (a hostname is never a trusted proxy, so it is
    returned as given)."""
    items = [] if xff is None or xff == "-" else xff.split(",")
    client: str | None = None
    if peer is not None:
        client = peer
        if peer not in trusted:
            return peer
    for item in reversed(items):
        a = forwarded_entry(item)
        if a is None:
            break
        client = a
        if a not in trusted:
            break
    return client


# ---------------------------------------------------------------- requests and URLs

_METHOD_RE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,31}", re.ASCII)
_method_ok: dict[str, bool] = {}


def _is_method(tok: str) -> bool:
    ok = _method_ok.get(tok)
    if ok is None:
        ok = _METHOD_RE.fullmatch(tok) is not None
        if len(_method_ok) < 10_000:
            _method_ok[tok] = ok
    return ok


def split_request(r: str) -> tuple[str, str, str]:
    """Split a logged request line into ``(method, target, protocol)``.

    ``GET /x HTTP/1.1`` -> ``("GET", "/x", "HTTP/1.1")``; HTTP/0.9 ``GET /`` -> ``("GET", "/", "")``;
    a target with inner or doubled spaces keeps them (``GET /a  HTTP/2.0`` -> target ``"/a "``);
    ``-`` or empty -> ``("", "", "")``; anything whose first word is not a method token (binary TLS
    handshakes, ``HELP``, garbage) -> ``("", line, "")``: the line is kept as the target so nothing is lost.
    """
    sp = r.find(" ")
    if sp > 0:
        method = r[:sp]
        if _is_method(method):
            rest = r[sp + 1:]
            sp2 = rest.rfind(" ")
            if sp2 >= 0 and rest.startswith("HTTP/", sp2 + 1):
                return method, rest[:sp2], rest[sp2 + 1:]
            return method, rest, ""
    if r == "-":
        return "", "", ""
    return "", r, ""


_COMMON_METHODS = frozenset(("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "PROPFIND", "CONNECT"))


def request_fields(r: str) -> tuple[str, str, str, str, str]:
    """``(method, url, path, query, protocol)`` of a logged request line (see :func:`split_request` and
    :func:`split_url`); a fast path handles the common ``METHOD /origin-form HTTP/x`` shape."""
    parts = r.split(" ")
    if len(parts) == 3:
        method, url, proto = parts
        if method in _COMMON_METHODS and url[:1] == "/" and proto[:5] == "HTTP/":
            q = url.find("?")
            if q < 0:
                return method, url, url, "", proto
            return method, url, url[:q], url[q + 1:], proto
    method, url, proto = split_request(r)
    path, query = split_url(url, method != "")
    return method, url, path, query, proto


def split_url(url: str, has_method: bool = True) -> tuple[str, str]:
    """``(path, query)`` of a request target.  Origin form ``/a?b`` -> ``("/a", "b")``; absolute
    ``http://h:3128/a?b`` -> ``("/a", "b")`` (scheme and host removed, ``/`` when the URL has no path);
    authority form (``CONNECT h:443``), ``*`` and unsplittable request lines -> ``("", "")``."""
    if not url:
        return "", ""
    if url[0] != "/":
        if not has_method:
            return "", ""
        low = url[:8].lower()
        if low.startswith("http://") or low.startswith("https://") or low.startswith("ftp://"):
            start = url.find("//") + 2
            slash = url.find("/", start)
            qm = url.find("?", start)
            if slash < 0 or (0 <= qm < slash):
                return ("/", url[qm + 1:]) if qm >= 0 else ("/", "")
            url = url[slash:]
        else:
            return "", ""
    q = url.find("?")
    if q < 0:
        return url, ""
    return url[:q], url[q + 1:]


def dash_none(text: str | None) -> str | None:
    """``None`` for ``-`` or a missing value, else the text as logged."""
    return None if text is None or text == "-" else text


def to_int(text: str | None, limit: int) -> int | None:
    """Non-negative int; ``-``/missing -> 0; ``None`` when not a number or above ``limit``."""
    if text is None or text == "-" or text == "":
        return 0
    if not text.isdigit() or not text.isascii():
        return None
    v = int(text)
    return v if v <= limit else None


def to_float(text: str | None, scale: float, div: float = 1.0) -> float | None:
    """float(text) * scale / div (``div`` keeps ``%D`` microseconds exact: ``3695 / 1000 == 3.695``); ``None`` for ``-``/missing/garbage (elapsed is optional, never a drop by itself)."""
    if text is None or text == "-" or text == "":
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    if v != v or v < 0 or v == float("inf"):
        return None
    return v * scale / div if div != 1.0 else v * scale
