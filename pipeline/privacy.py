"""Privacy filter applied before storage: query-parameter scrubbing and client-address handling.

Guarantees
----------
* :meth:`Privacy.scrub_query` / :meth:`Privacy.scrub_url` / :meth:`Privacy.scrub_referer` remove every query
  parameter whose *name* is listed in ``PrivacyConfig.strip_params`` (names compared case-sensitively, exactly as
  configured).  Parameters are separated by ``&`` or ``;`` (SMF writes ``index.php?topic=1.0;PHPSESSID=...``); a
  parameter written without ``=`` (``?sid&x=1``) is matched by its whole text.  Everything else is kept
  byte-identical: order, encoding, the other separators, the ``#fragment``.  When every parameter is removed the
  ``?`` goes too (``/x?s=1`` -> ``/x``).  Scrubbing is idempotent and never changes a URL that carries no listed
  parameter (one precompiled regex search decides, so the common case costs well under a microsecond).
* :meth:`Privacy.store_ip` returns the address as it should be *stored* (detectors see the real address in the
  stream, not this):

  ``keep``          the text as given (not even validated).
  ``truncate``      the network address of the ``truncate_ipv4_prefix`` (default /24) or ``truncate_ipv6_prefix``
                    (default /48) network, in text form; IPv4-mapped IPv6 (``::ffff:a.b.c.d``) is treated as IPv4,
                    and so are the IPv6 addresses that carry the client's IPv4 address: 6to4 (``2002::/16``, whose
                    /48 *is* the whole IPv4 address) and Teredo (``2001::/32``, client address in the last 32 bits,
                    obfuscated) are stored as the truncated IPv4 network of that embedded address
                    (``2002:cb00:7105::1`` -> ``203.0.113.0``).  ``pseudonymize`` is unchanged (HMAC hides them).
  ``pseudonymize``  a keyed HMAC-SHA256 pseudonym, **always an IPv6 address inside fd00::/8** (unique-local, never
                    routed on the Internet, so a pseudonym can never be mistaken for a real client):

                    * IPv4 ``a.b.c.d`` -> ``fd04:NNNN:NNNN:NNNN:HHHH:HHHH:HHHH:HHHH``
                    * IPv6             -> ``fd06:NNNN:NNNN:NNNN:HHHH:HHHH:HHHH:HHHH``

                    ``N`` (48 bits) = HMAC(key, network) where network is the IPv4 /24 or the IPv6 /64;
                    ``H`` (64 bits) = HMAC(key, full address).  So addresses of one /24 (or /64) share one
                    pseudonymous /64: the ``prefix_minute`` rollup (which groups IPv6 by /64) still groups a
                    pseudonymised IPv4 /24 together -- with ``prefix_len`` 64, not 24.  Same key + same address ->
                    same pseudonym; another key -> another pseudonym; without the key the mapping cannot be
                    inverted (HMAC-SHA256 is a PRF).  The key must stay secret and stable: rotating it breaks
                    continuity of stored client identities (by design).

  Text that is not an IP address yields ``None`` in ``truncate`` and ``pseudonymize`` modes (storing it could leak
  what the mode promises to hide).  ``None`` in, ``None`` out.
* :meth:`Privacy.store_host` does the same for a hostname client (old CLF logs, ``client_host``): ``keep`` stores
  it as given; ``truncate`` keeps only its last two labels, the domain (``dialup-42.isp.example.net`` ->
  ``example.net``; a name of one or two labels, which names a host rather than a network, -> ``None``), as a
  network prefix keeps only the network; ``pseudonymize``
  stores ``anon-`` + 16 hex digits of HMAC-SHA256(key, name) (case-folded), stable for one key.

Misuse: ``client_ip: pseudonymize`` without ``pseudonym_key`` raises :class:`ValueError` at construction (never
silently stores real addresses).  Both classes in this module are pure after construction: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Callable
from typing import Generic, TypeVar

from forumpulse.pipeline.config import PrivacyConfig

K = TypeVar("K")
V = TypeVar("V")


class BoundedCache(Generic[K, V]):
    """A two-generation cache holding at most ``2 * capacity`` entries.

    Lookups hit the young generation, then the old one (promoting the entry).  When the young generation is full
    it becomes the old one and the previous old one is dropped: an O(1) approximation of LRU without per-hit
    bookkeeping.  Not thread-safe for concurrent writers (one instance per worker).  ``young`` is exposed
    read-only for hot loops: ``cache.young.get(k) or cache.get(k)`` saves a method call on the common hit
    (stored values must then be truthy).
    """

    __slots__ = ("_capacity", "_old", "young")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self.young: dict[K, V] = {}
        self._old: dict[K, V] = {}

    def get(self, key: K) -> V | None:
        v = self.young.get(key)
        if v is not None:
            return v
        v = self._old.get(key)
        if v is not None:
            self.put(key, v)
        return v

    def put(self, key: K, value: V) -> None:
        if len(self.young) >= self._capacity:
            self._old = self.young
            self.young = {}
        self.young[key] = value

    def __len__(self) -> int:
        return len(self.young) + len(self._old)


_NONE = object()
_SEP = re.compile(r"([&;])")


class Privacy:
    """Scrubs URLs, queries and referers and maps client addresses for storage (see the module docstring)."""

    def __init__(self, cfg: PrivacyConfig) -> None:
        self.mode = cfg.client_ip
        self._names = frozenset(cfg.strip_params)
        self._probe: re.Pattern[str] | None = None
        self._probe_first: re.Pattern[str] | None = None
        if self._names:
            alts = "|".join(re.escape(n) for n in sorted(self._names, key=len, reverse=True))
            # A listed name at the start of a parameter, followed by '=', a separator or the end.  Split in two
            # (after a separator / at the start) because a pattern opening with a character class lets `re` scan
            # quickly, ~1.6x faster than (?:^|[&;]) on this machine.
            self._probe = re.compile(rf"[&;](?:{alts})(?=[=&;]|$)")
            self._probe_first = re.compile(rf"(?:{alts})(?=[=&;]|$)")
        self._v4_prefix = cfg.truncate_ipv4_prefix
        self._v6_prefix = cfg.truncate_ipv6_prefix
        self._key = b""
        if self.mode == "pseudonymize":
            if cfg.pseudonym_key is None or not cfg.pseudonym_key.get_secret_value():
                raise ValueError(
                    "privacy.client_ip is 'pseudonymize' but privacy.pseudonym_key is not set "
                    "(set FORUMPULSE_PRIVACY__PSEUDONYM_KEY to a long random secret)")
            self._key = cfg.pseudonym_key.get_secret_value().encode()
        self._ip_cache: BoundedCache[str, object] = BoundedCache(65_536)
        self._ip_fn: Callable[[str], str | None] = {
            "keep": lambda s: s,
            "truncate": self._truncate,
            "pseudonymize": self._pseudonymize,
        }[self.mode]

    # -- query / URL ---------------------------------------------------------------------------------------

    def scrub_query(self, query: str) -> str:
        """``query`` without ``?``; returns it without the listed parameters (see module docstring)."""
        probe = self._probe
        if probe is None or not query or (probe.search(query) is None
                                          and self._probe_first.match(query) is None):  # type: ignore[union-attr]
            return query
        names = self._names
        tokens = _SEP.split(query)  # [part, sep, part, sep, ..., part]
        out: list[str] = []
        for k in range(0, len(tokens), 2):
            part = tokens[k]
            eq = part.find("=")
            if (part if eq < 0 else part[:eq]) in names:
                continue
            if out:
                out.append(tokens[k - 1])  # the separator written before this kept parameter
            out.append(part)
        return "".join(out)

    def scrub_url(self, url: str) -> str:
        """A request target or absolute URL with the listed query parameters removed (fragment kept)."""
        q = url.find("?")
        if q < 0:
            return url
        h = url.find("#", q)
        query = url[q + 1:] if h < 0 else url[q + 1:h]
        cleaned = self.scrub_query(query)
        if cleaned is query or cleaned == query:
            return url
        tail = "" if h < 0 else url[h:]
        return url[:q] + ("?" + cleaned if cleaned else "") + tail

    def scrub_referer(self, ref: str | None) -> str | None:
        """Same as :meth:`scrub_url`; ``None`` stays ``None``."""
        if ref is None:
            return None
        return self.scrub_url(ref)

    # -- addresses -----------------------------------------------------------------------------------------

    def store_ip(self, ip: str | None) -> str | None:
        """The client address as stored under the configured mode (see module docstring)."""
        if ip is None:
            return None
        if self.mode == "keep":
            return ip
        hit = self._ip_cache.get(ip)
        if hit is not None:
            return None if hit is _NONE else hit  # type: ignore[return-value]
        out = self._ip_fn(ip)
        self._ip_cache.put(ip, _NONE if out is None else out)
        return out

    def store_host(self, host: str | None) -> str | None:
        """A hostname client as it should be stored under the configured mode (see module docstring)."""
        if host is None or self.mode == "keep":
            return host
        if self.mode == "truncate":
            labels = [x for x in host.rstrip(".").split(".") if x]
            return ".".join(labels[-2:]).lower() if len(labels) >= 3 else None
        return "anon-" + hmac.new(self._key, b"hostname" + host.lower().encode(), hashlib.sha256).hexdigest()[:16]

    @staticmethod
    def _parse(ip: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
        try:
            addr = ipaddress.ip_address(ip.strip())
        except ValueError:
            return None
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            return addr.ipv4_mapped
        return addr

    def _truncate(self, ip: str) -> str | None:
        addr = self._parse(ip)
        if addr is None:
            return None
        if isinstance(addr, ipaddress.IPv6Address):  # 6to4 / Teredo: truncate the client's embedded IPv4
            embedded = addr.sixtofour or (addr.teredo[1] if addr.teredo is not None else None)
            if embedded is not None:
                addr = embedded
        prefix = self._v4_prefix if addr.version == 4 else self._v6_prefix
        return str(ipaddress.ip_network(f"{addr}/{prefix}", strict=False).network_address)

    def _pseudonymize(self, ip: str) -> str | None:
        addr = self._parse(ip)
        if addr is None:
            return None
        packed = addr.packed
        if addr.version == 4:
            tag, net = b"\xfd\x04", b"v4net" + packed[:3]
        else:
            tag, net = b"\xfd\x06", b"v6net" + packed[:8]
        n = hmac.new(self._key, net, hashlib.sha256).digest()[:6]
        h = hmac.new(self._key, b"host" + bytes([addr.version]) + packed, hashlib.sha256).digest()[:8]
        return str(ipaddress.IPv6Address(tag + n + h))
