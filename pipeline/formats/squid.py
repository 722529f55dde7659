"""squid native access.log (``logformat squid``) and squid's own combined format.

Native columns (squid_format_facts.md): ``time.ms elapsed client code/status bytes method URL rfc931
peerstatus/peerhost type [req headers] [reply headers]`` with space padding (``%9d.%03d %6d``), a URL that may
contain spaces, ``TIMEOUT_``-prefixed hierarchy codes, and a content type that may be ``-``, ``:`` or empty.

Mapping: ``ts`` from ``time.ms`` (UTC), ``elapsed_ms`` = elapsed, ``cache_result`` = code (``TCP_MISS``),
``status`` (``000`` -> 0), ``bytes`` (reply size incl. headers, as squid logs it), ``user`` = rfc931 column
(squid logs the ident or authenticated user name there; ``None`` for ``-``), ``ident`` is ``None``,
``hierarchy`` = peerstatus as logged (a ``TIMEOUT_`` prefix is kept), ``upstream`` = peerhost (``None`` for
``-``), ``content_type`` (``None`` for ``-``, ``:``, empty), ``protocol`` = ``""`` (not logged), ``url`` as
logged, ``path``/``query`` without scheme and host (``CONNECT host:443`` gives path ``""``).
Header columns are matched but not stored.
"""

from __future__ import annotations

import re

from forumpulse.pipeline.record import Drop, ParsedLine

from . import _values as V
from .compiler import SQUID_SS, CompiledFormat, Tok, compile_tokens, tokenize_apache

_NATIVE = (
    r" *(\d+)\.(\d{1,6}) +(-?\d+) +(\S+) +([A-Za-z0-9_]+)/(\d{1,3}) +(\d+|-) +(\S+) +(URL) +(\S+)"
    r" +([A-Za-z0-9_]+)/(\S+)(?: +(\S*))?(?: +\[(.*)\] +\[(.*)\])? *"
)
FAST = re.compile(_NATIVE.replace("(URL)", r"(\S+)"), re.ASCII)
LENIENT = re.compile(_NATIVE.replace("(URL)", r"(.*?)"), re.ASCII)
PARTIAL = re.compile(
    r" *\d+(?:\.\d*)?(?: +(?:-?\d*(?: +(?:[0-9A-Za-z_.:%\[\]-]*(?: +(?:[A-Za-z0-9_]*(?:/\d*)?"
    r"(?: +(?:[\d-]*(?: +.*)?))?))?))?))?",
    re.ASCII,
)


def _convert(g: tuple) -> ParsedLine | Drop:
    sec, frac, elapsed, client, code, status, nbytes, method, url, user, hier, peer, ctype = g[:13]
    ts = int(sec) * 1000 + int((frac + "00")[:3])
    if not (V.TS_MIN_MS <= ts <= V.TS_MAX_MS):
        return Drop("bad_timestamp", f"time={sec}.{frac}")
    c = V.classify_client(client)
    if c is None:
        return Drop("bad_client", f"client={client[:80]!r}")
    n = V.to_int(nbytes, 1 << 62)
    if n is None:
        return Drop("bad_number", f"bytes={nbytes[:80]!r}")
    path, query = V.split_url(url, True)
    return ParsedLine(
        ts, c[0], c[1], None, V.dash_none(user), method, url, path, query, "", int(status), n, None, None,
        V.to_float(elapsed, 1.0), code, hier, V.dash_none(peer),
        None if ctype is None or ctype in ("-", ":", "") else ctype, None,
    )


NATIVE = CompiledFormat(FAST, LENIENT, PARTIAL, _convert, "squid:native")

COMBINED_LOGFORMAT = '%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i"'


def compile_squid_combined() -> CompiledFormat:
    """Apache combined + `` %Ss:%Sh`` (squid's HttpdCombined output, e.g. `` TCP_MISS:HIER_DIRECT``)."""
    toks = tokenize_apache(COMBINED_LOGFORMAT)
    toks.append(Tok(literal=" "))
    toks.append(Tok(slot="squid_ss", kind=SQUID_SS))
    return compile_tokens(toks, "squid:combined")
