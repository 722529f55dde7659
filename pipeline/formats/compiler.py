"""Format compilers: Apache ``LogFormat`` and nginx ``log_format`` strings -> one :class:`CompiledFormat`.

A format string is tokenised into literals and fields.  Each field has a *slot* (which record field it feeds,
or ``ignore``) and a regex chosen from the field's kind and its context (inside quotes, inside brackets,
followed by a literal, last on the line).  From the token list three regexes are built, once:

* ``fast``: strict, cheap character classes (``[^"]*`` inside quotes): the hot path is one ``fullmatch``;
* ``lenient``: tried only when ``fast`` fails; quoted fields accept unescaped quotes (``(.*?)``);
* ``partial``: matches strict prefixes of a valid line; a line that fails both full regexes but matches this
  one was cut in the middle -> ``Drop("truncated")``.

The conversion from regex groups to :class:`~forumpulse.pipeline.record.ParsedLine` is generated as Python
source per format (only group indices and helper names are emitted, never text from the format string) and
compiled with ``exec`` once, so the per-line cost is one match, a tuple of groups and a few cached lookups.

Field precedence when a format logs the same thing twice: client ``%a`` > ``%{c}a`` > ``%h``; status ``%>s`` >
``%s`` > ``%<s``; bytes body (``%b``/``%B``/``$body_bytes_sent``) > total (``%O``/``$bytes_sent``); elapsed
``%D``/``%{us}T`` > ``%{ms}T`` > ``%T``/``$request_time``; vhost ``%v`` > ``%V`` > ``$host`` > ``$server_name``.
A request line (``%r``/``$request``) wins over separate method/URI/protocol directives.  The upstream is nginx's
``$upstream_addr`` or, for an Apache reverse proxy, ``%{BALANCER_WORKER_NAME}e`` (mod_proxy_balancer).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from forumpulse.pipeline.record import Drop, ParsedLine

from . import _values as V

# Field kinds decide the regex; slots decide where the value goes.
WORD, STR, NUM, FLOAT, CLIENT, TIME_CLF, TIME_RAW, TIME_PARTS, URI, QUERY, SQUID_SS, LIST = (
    "word", "str", "num", "float", "client", "time_clf", "time_raw", "time_parts", "uri", "query", "ss", "list")
#: a value nginx may write as a list: one item per upstream server tried (", ") and per upstream group after an
#: internal redirect (" : "), e.g. ``$upstream_status`` "502, 200" when a retry succeeded
LIST_RX = r"[^\s,]+(?:(?:, | : )[^\s,]+)*+"  # possessive: adjacent lists cannot trade items (backtracking)
#: an unquoted ``X-Forwarded-For`` between other fields: its left part is whatever the client sent, so any items
#: with or without a space after the comma, empty ones included ("a,b", ", x"), must not make the line unparseable
#: (a quarantined line is invisible to the DoS detector).  Last on the line it is ``.*``.
FORWARDED_RX = r"[^\s,]*(?:, ?[^\s,]*)*+"


@dataclass
class Tok:
    """One token of a compiled format: ``literal`` text, or a field with ``slot``/``kind``."""

    literal: str | None = None
    slot: str = "ignore"
    kind: str = WORD
    conditional: bool = False  # Apache %400r style: may log "-" instead of the value
    rank: int = 0  # among fields feeding the same slot the lowest rank wins (plain < %<X/%>X < conditional)
    parts: list[str] = field(default_factory=list)  # TIME_PARTS: component kind per inner group
    parts_rx: str = ""  # TIME_PARTS: inner regex with one group per component
    ts_kind: str = ""  # TIME_RAW: clf | iso | epoch


# ----------------------------------------------------------------------------------------- Apache

_APACHE_DIRECTIVE = re.compile(r"%((?:[<>!,0-9]|\{[^}]*\})*)([a-zA-Z%^])")

_STRFTIME: dict[str, tuple[str, str | None]] = {
    "Y": (r"(\d{4})", "Y"), "m": (r"(\d{1,2})", "m"), "d": (r"(\d{1,2})", "d"), "e": (r" ?(\d{1,2})", "d"),
    "H": (r"(\d{1,2})", "H"), "k": (r" ?(\d{1,2})", "H"), "I": (r"(\d{1,2})", "I"), "M": (r"(\d{2})", "M"),
    "S": (r"(\d{2})", "S"), "z": (r"([+-]\d{2}:?\d{2}|Z)", "z"), "b": (r"([A-Za-z]{3})", "b"),
    "h": (r"([A-Za-z]{3})", "b"), "B": (r"([A-Za-z]+)", "b"), "y": (r"(\d{2})", "y"), "s": (r"(\d+)", "sec"),
    "p": (r"([AaPp][Mm])", "p"), "a": (r"[A-Za-z]{3}", None), "A": (r"[A-Za-z]+", None),
    "Z": (r"[A-Za-z]+", None), "j": (r"\d{3}", None), "u": (r"\d", None), "w": (r"\d", None),
    "f": (r"(\d{1,9})", "frac"), "n": (r"\s", None), "t": (r"\s", None),
}
_STRFTIME_ALIAS = {"T": "%H:%M:%S", "F": "%Y-%m-%d", "D": "%m/%d/%y", "R": "%H:%M", "r": "%I:%M:%S %p"}
_TIME_SPECIAL = {"sec": (r"(\d+)", "sec"), "msec": (r"(\d+)", "msec"), "usec": (r"(\d+)", "usec"),
                 "msec_frac": (r"(\d{3})", "msec_frac"), "usec_frac": (r"(\d{6})", "usec_frac")}


def _strftime_to_rx(fmt: str) -> tuple[str, list[str]]:
    for k, v in _STRFTIME_ALIAS.items():
        fmt = fmt.replace("%" + k, v)
    out: list[str] = []
    parts: list[str] = []
    i = 0
    while i < len(fmt):
        c = fmt[i]
        if c == "%" and i + 1 < len(fmt):
            d = fmt[i + 1]
            i += 2
            if d == "%":
                out.append("%")
                continue
            rx, kind = _STRFTIME.get(d, (r"\S+?", None))
            out.append(rx)
            if kind is not None:
                parts.append(kind)
        else:
            out.append(r"\ " if c == " " else re.escape(c))
            i += 1
    return "".join(out), parts


def _apache_time(arg: str | None) -> Tok:
    if arg is None or arg == "":
        return Tok(slot="time", kind=TIME_CLF)
    a = arg
    for pre in ("begin:", "end:"):
        if a.startswith(pre):
            a = a[len(pre):]
    if a in _TIME_SPECIAL:
        rx, kind = _TIME_SPECIAL[a]
        return Tok(slot="time", kind=TIME_PARTS, parts=[kind], parts_rx=rx)
    rx, parts = _strftime_to_rx(a)
    return Tok(slot="time", kind=TIME_PARTS, parts=parts, parts_rx=rx)


#: environment variables an Apache reverse proxy can log (``%{NAME}e``) that name the backend it used:
#: mod_proxy_balancer sets ``BALANCER_WORKER_NAME`` (e.g. ``http://10.0.0.5:8080``) per request
_APACHE_UPSTREAM_ENV = ("balancer_worker_name",)


def _apache_field(mods: str, code: str) -> Tok:
    arg = None
    m = re.search(r"\{([^}]*)\}", mods)
    if m:
        arg = m.group(1)
    flags = re.sub(r"\{[^}]*\}", "", mods)
    final = None
    for ch in flags:
        if ch in "<>":
            final = ch
    cond = any(ch.isdigit() for ch in flags)
    low = (arg or "").lower()
    t: Tok
    if code == "h":
        t = Tok(slot="client_h", kind=CLIENT)
    elif code == "a":
        t = Tok(slot="client_c" if low == "c" else "client_a", kind=CLIENT)
    elif code == "l":
        t = Tok(slot="ident")
    elif code == "u":
        t = Tok(slot="user")
    elif code == "t":
        t = _apache_time(arg)
    elif code == "r":
        t = Tok(slot="request", kind=STR)
    elif code == "m":
        t = Tok(slot="method")
    elif code == "U":
        t = Tok(slot="uri", kind=URI)
    elif code == "q":
        t = Tok(slot="query", kind=QUERY)
    elif code == "H":
        t = Tok(slot="protocol")
    elif code == "s":
        t = Tok(slot={">": "status_final", "<": "status_orig"}.get(final or "", "status"), kind=NUM)
    elif code in "bB":
        t = Tok(slot="bytes_body", kind=NUM)
    elif code == "O":
        t = Tok(slot="bytes_total", kind=NUM)
    elif code in "ISk":
        t = Tok(kind=NUM)
    elif code == "D":
        t = Tok(slot="el_us", kind=NUM)
    elif code == "T":
        unit = {"ms": "el_ms", "us": "el_us"}.get(low, "el_s")
        t = Tok(slot=unit, kind=NUM if unit != "el_s" else FLOAT)
    elif code == "v":
        t = Tok(slot="vhost_v")
    elif code == "V":
        t = Tok(slot="vhost_V")
    elif code == "i" and low == "x-forwarded-for":  # a list: "client, proxy1" (unquoted too)
        t = Tok(slot="forwarded", kind=LIST)
    elif code == "i":
        slot = {"referer": "referer", "user-agent": "user_agent"}.get(low, "ignore")
        t = Tok(slot=slot, kind=STR)
    elif code == "o":
        t = Tok(slot="content_type" if low == "content-type" else "ignore", kind=STR)
    elif code == "^":  # %^ti / %^to trailers (mod_log_config 2.5): ignored text
        t = Tok(kind=STR)
    elif code == "p":
        t = Tok(kind=NUM)
    elif code == "e" and low in _APACHE_UPSTREAM_ENV:  # mod_proxy_balancer's chosen worker: the upstream
        t = Tok(slot="upstream", kind=STR)
    else:  # e n C X L R f A ... and unknown letters: a field we skip
        t = Tok(kind=STR if code in "eniCo" else WORD)
    t.conditional = cond
    t.rank = (2 if cond else 0) + (1 if final and code != "s" else 0)
    return t


def apache_config_string(fmt: str) -> str:
    """A ``LogFormat`` as written in the Apache configuration -- with ``\\"`` for each quote, as copied from
    ``apache2.conf``, possibly with the enclosing quotes -- becomes the format Apache uses (its config parser
    removes them).  A format without ``\\"`` is returned as is (its quotes are the log's)."""
    if '\\"' not in fmt:
        return fmt
    f = fmt.strip()
    if len(f) >= 2 and f[0] == f[-1] == '"' and '"' not in f[1:-1].replace('\\"', ""):
        f = f[1:-1]
    return f.replace('\\"', '"')


def nginx_config_string(fmt: str) -> str:
    """A ``log_format`` as written in ``nginx.conf`` -- single-quoted strings (``'$remote_addr - ' '$status'``,
    nginx joins them), a trailing ``;`` -- becomes the format nginx uses.  A bare format is returned as is."""
    f = fmt.strip().rstrip(";").strip()
    if len(f) >= 2 and f[0] == f[-1] == "'":
        parts = re.findall(r"'((?:[^'\\]|\\.)*)'", f)
        if parts and not re.sub(r"'(?:[^'\\]|\\.)*'", "", f).strip():
            unescape = {"t": "\t", "n": "\n", "r": "\r"}  # as nginx's config parser does; \x -> x otherwise
            return re.sub(r"\\(.)", lambda m: unescape.get(m.group(1), m.group(1)), "".join(parts))
    return fmt


def tokenize_apache(fmt: str) -> list[Tok]:
    """Apache ``LogFormat`` string -> tokens (``%%`` is a literal ``%``; unknown directives are ignored fields).
    The string may be written as in the Apache configuration (:func:`apache_config_string`)."""
    fmt = apache_config_string(fmt)
    toks: list[Tok] = []
    pos = 0
    for m in _APACHE_DIRECTIVE.finditer(fmt):
        if m.start() > pos:
            toks.append(Tok(literal=fmt[pos:m.start()]))
        if m.group(2) == "%":
            toks.append(Tok(literal="%"))
        else:
            code = m.group(2)
            mods = m.group(1)
            if code == "^":  # %^ti, %^to: two more letters
                end = m.end() + 2
                toks.append(_apache_field(mods, "^"))
                pos = end
                continue
            toks.append(_apache_field(mods, code))
        pos = m.end()
    if pos < len(fmt):
        toks.append(Tok(literal=fmt[pos:]))
    return _merge_literals(toks)


def _merge_literals(toks: list[Tok]) -> list[Tok]:
    out: list[Tok] = []
    for t in toks:
        if t.literal is not None and out and out[-1].literal is not None:
            out[-1] = Tok(literal=(out[-1].literal or "") + t.literal)
        elif t.literal == "":
            continue
        else:
            out.append(t)
    return out


# ----------------------------------------------------------------------------------------- nginx

_NGINX_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")
_NGINX_SLOTS: dict[str, tuple[str, str]] = {
    "remote_addr": ("client_a", CLIENT), "remote_user": ("user", WORD),
    "time_local": ("time", TIME_RAW), "time_iso8601": ("time", TIME_RAW), "msec": ("time", TIME_RAW),
    "request": ("request", STR), "status": ("status_final", NUM), "body_bytes_sent": ("bytes_body", NUM),
    "bytes_sent": ("bytes_total", NUM), "http_referer": ("referer", STR), "http_user_agent": ("user_agent", STR),
    "request_time": ("el_s", FLOAT), "host": ("vhost_host", WORD),
    "server_name": ("vhost_sn", WORD), "request_method": ("method", WORD), "request_uri": ("request_uri", STR),
    "uri": ("nginx_uri", STR), "document_uri": ("nginx_uri", STR), "args": ("args", STR),
    "query_string": ("args", STR), "server_protocol": ("protocol", WORD),
    "sent_http_content_type": ("content_type", STR), "remote_port": ("ignore", NUM),
    "request_length": ("ignore", NUM), "server_port": ("ignore", NUM), "connection": ("ignore", NUM),
    "pid": ("ignore", NUM),
    # the $upstream_* variables: lists when nginx tried several servers (the upstream slot keeps the whole list)
    **{f"upstream_{v}": ("ignore", LIST) for v in (
        "status", "response_time", "connect_time", "header_time", "response_length", "bytes_received",
        "bytes_sent")},
    "upstream_addr": ("upstream", LIST),
    "http_x_forwarded_for": ("forwarded", LIST),
}
_TS_KIND = {"time_local": "clf", "time_iso8601": "iso", "msec": "epoch"}


def tokenize_nginx(fmt: str) -> list[Tok]:
    """nginx ``log_format`` string -> tokens; variables not in the table are ignored fields.  The string may be
    written as in ``nginx.conf`` (:func:`nginx_config_string`)."""
    fmt = nginx_config_string(fmt)
    toks: list[Tok] = []
    pos = 0
    for m in _NGINX_VAR.finditer(fmt):
        if m.start() > pos:
            toks.append(Tok(literal=fmt[pos:m.start()]))
        name = m.group(1) or m.group(2)
        slot, kind = _NGINX_SLOTS.get(name, ("ignore", STR))
        t = Tok(slot=slot, kind=kind, ts_kind=_TS_KIND.get(name, ""))
        if name.startswith("http_") and slot == "ignore":
            t.kind = STR
        toks.append(t)
        pos = m.end()
    if pos < len(fmt):
        toks.append(Tok(literal=fmt[pos:]))
    return _merge_literals(toks)


# ----------------------------------------------------------------------------------------- regexes

def _field_rx(toks: list[Tok], i: int, mode: str) -> str:
    """Regex body (no group) for field ``i`` in ``mode`` fast | lenient | partial."""
    t = toks[i]
    prev = toks[i - 1].literal if i > 0 else None
    nxt = toks[i + 1].literal if i + 1 < len(toks) else None
    nxt_is_field = i + 1 < len(toks) and toks[i + 1].literal is None
    last = i + 1 == len(toks)
    quoted = bool(prev and prev.endswith('"') and nxt and nxt.startswith('"'))
    bracketed = bool(prev and prev.endswith("[") and nxt and nxt.startswith("]"))
    stop = nxt[0] if nxt and not nxt[0].isspace() else None

    if t.slot == "forwarded" and not quoted:
        return r".*" if last else FORWARDED_RX
    if mode == "partial":
        if t.kind in (NUM, FLOAT):
            return r"[0-9.-]+"
        if t.kind == TIME_CLF:
            return r"\[[^\]]*|-"
        if t.kind == CLIENT:
            return r"[0-9A-Za-z_.:%\[\]-]+"
        if t.kind == LIST and not quoted:
            return LIST_RX
        if quoted:
            return r'[^"]*'
        if bracketed:
            return r"[^\]]*"
        if t.kind in (TIME_PARTS, TIME_RAW):
            return r"[^\[\]\"]*"
        return r"\S+"

    kind = t.kind
    if kind == NUM:
        body = r"\d+|-"
    elif kind == FLOAT:
        body = r"\d+(?:\.\d+)?|-"
    elif kind == TIME_CLF:
        body = r"\[[^\]]*\]|-"
    elif kind == TIME_RAW:
        body = {"clf": r"[^\]\s]+ [^\]\s]+" if not bracketed else r"[^\]]*",
                "iso": r"\d{4}-[\d:T.+Z-]+|-", "epoch": r"\d+(?:\.\d+)?|-"}.get(t.ts_kind, r"\S+")
    elif kind == URI:
        body = r"[^\s?]*"
    elif kind == QUERY:
        body = r"\?\S*|"
    elif kind == TIME_PARTS:
        body = t.parts_rx
    elif kind == SQUID_SS:
        body = r"[A-Za-z_0-9]+:[A-Za-z_0-9]+|-"
    elif kind == LIST and not quoted:
        body = LIST_RX
    elif quoted:
        body = r".*?" if mode == "lenient" else r'[^"]*'
    elif bracketed:
        body = r"[^\]]*"
    elif kind == STR and last:
        body = r".*"
    elif stop is not None and stop != '"':
        body = r"[^\s" + re.escape(stop) + r"]+"
    elif nxt_is_field:
        body = r"\S*?"
    elif kind == STR and nxt and nxt.startswith(" ") and t.slot == "request":
        body = r"\S+(?: \S+){0,2}"
    elif kind == STR:
        body = r"\S*"
    else:
        body = r"\S+"
    if t.conditional and kind != TIME_CLF and not body.endswith("|-"):
        body = "-|" + body
    return body


def _quoted(toks: list[Tok], i: int) -> bool:
    prev = toks[i - 1].literal if i > 0 else None
    nxt = toks[i + 1].literal if i + 1 < len(toks) else None
    return bool(prev and prev.endswith('"') and nxt and nxt.startswith('"'))


def _n_groups(t: Tok) -> int:
    return 1 + (len(t.parts) if t.kind == TIME_PARTS else 0)


def build_regexes(toks: list[Tok]) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    fast: list[str] = []
    lenient: list[str] = []
    for i, t in enumerate(toks):
        if t.literal is not None:
            fast.append(re.escape(t.literal))
            lenient.append(re.escape(t.literal))
        else:
            fast.append("(" + _field_rx(toks, i, "fast") + ")")
            lenient.append("(" + _field_rx(toks, i, "lenient") + ")")
    # partial: R_i = (?: F_i (?: R_{i+1} )? | P_i )
    partial = ""
    for i in range(len(toks) - 1, -1, -1):
        t = toks[i]
        if t.literal is not None:
            full = re.escape(t.literal)
            prefixes = [re.escape(t.literal[:k]) for k in range(len(t.literal) - 1, 0, -1)]
            p = "|".join(prefixes) if prefixes else None
        elif _quoted(toks, i) and _field_rx(toks, i, "lenient") == ".*?":
            # a complete quoted field ends at its closing quote (escapes \" allowed inside), not anywhere: the
            # lenient .*? let a complete line with extra fields after it pass for a line cut inside the field
            full = r'(?:[^"\\]|\\.)*'
            p = r'(?:[^"\\]|\\.)*\\?'
        else:
            full = "(?:" + re.sub(r"(?<!\\)\((?!\?)", "(?:", _field_rx(toks, i, "lenient")) + ")"
            p = _field_rx(toks, i, "partial")
        inner = f"{full}(?:{partial})?" if partial else full
        partial = f"(?:{inner}|(?:{p}))" if p else f"(?:{inner})"
    return (re.compile("".join(fast), re.ASCII), re.compile("".join(lenient), re.ASCII),
            re.compile(partial, re.ASCII))


# ----------------------------------------------------------------------------------------- conversion

def _bad(reason: str, what: str, value: str | None) -> Drop:
    v = "" if value is None else value
    return Drop(reason, f"{what}={v[:80]!r}")


def _user(v: str | None) -> str | None:
    if v is None or v == "-":
        return None
    return "" if v == '""' else v


def _ctype(v: str | None) -> str | None:
    return None if v is None or v in ("-", ":", "") else v


_MONTH_FULL = {name: i for name, i in V.MONTHS.items()}


def parts_to_ms(kinds: tuple[str, ...], values: tuple[str | None, ...]) -> int | None:
    """Combine strftime components (from one or more ``%{...}t`` / ``%t``) into UTC ms, ``None`` if impossible."""
    p: dict[str, str] = {}
    clf_ms = None
    for k, v in zip(kinds, values, strict=True):
        if v is None or v == "-":
            continue
        if k == "clf":
            clf_ms = V.clf_timestamp_ms(v)
            if clf_ms is None:
                return None
        else:
            p[k] = v
    frac = 0
    if "msec_frac" in p:
        frac = int(p["msec_frac"])
    elif "usec_frac" in p:
        frac = int(p["usec_frac"]) // 1000
    elif "frac" in p:
        frac = int((p["frac"] + "00")[:3])
    if clf_ms is not None:
        return clf_ms + frac
    if "msec" in p:
        return int(p["msec"])
    if "usec" in p:
        return int(p["usec"]) // 1000
    if "sec" in p:
        return int(p["sec"]) * 1000 + frac
    try:
        if "Y" in p:
            year = int(p["Y"])
        elif "y" in p:
            year = 2000 + int(p["y"]) if int(p["y"]) < 69 else 1900 + int(p["y"])
        else:
            return None
        if "m" in p:
            month = int(p["m"])
        elif "b" in p:
            mm = V.MONTHS.get(p["b"][:3].lower())
            if mm is None:
                return None
            month = mm
        else:
            return None
        day = int(p.get("d", "0"))
        hour = int(p.get("H", p.get("I", "0")))
        if "p" in p and "I" in p:
            hour = hour % 12 + (12 if p["p"].lower() == "pm" else 0)
        off = 0
        z = p.get("z")
        if z and z != "Z":
            z = z.replace(":", "")
            off = int(z[1:3]) * 60 + int(z[3:5])
            if z[0] == "-":
                off = -off
        return V.civil_to_ms(year, month, day, hour, int(p.get("M", "0")), int(p.get("S", "0")), frac, off)
    except ValueError:
        return None


_parts_cache: dict[tuple[str | None, ...], int | None] = {}


def _parts_cached(kinds: tuple[str, ...], values: tuple[str | None, ...]) -> int | None:
    key = (*kinds, *values)
    v = _parts_cache.get(key)
    if v is None and key not in _parts_cache:
        v = parts_to_ms(kinds, values)
        if len(_parts_cache) >= V.CACHE_LIMIT:
            _parts_cache.clear()
        _parts_cache[key] = v
    return v


def _first(slots: dict[str, list[int]], *names: str) -> int | None:
    for n in names:
        if n in slots:
            return slots[n][0]
    return None


def generate_converter(toks: list[Tok], require_time: bool = True,
                       trusted: V.TrustedProxies = V.NO_PROXIES) -> Callable[[tuple], ParsedLine | Drop]:
    """Emit and compile ``convert(groups) -> ParsedLine | Drop`` for a token list.

    The client: the peer field (``%a`` > ``%{c}a`` > ``%h``, ``$remote_addr``); when the format also logs
    ``X-Forwarded-For`` and the peer is one of ``trusted`` (the site's own proxies), the client is found in the
    header (:func:`~._values.forwarded_client`).  A format with the header and no peer field takes the client
    from the header's right end when the site has trusted proxies, else it has none.  Without trusted proxies
    the header is never read (it is the client's to forge)."""
    slots: dict[str, list[int]] = {}
    time_groups: list[tuple[str, int]] = []  # (kind, group index)
    ranks: dict[int, int] = {}
    gi = 0
    for t in toks:
        if t.literal is not None:
            continue
        slots.setdefault(t.slot, []).append(gi)
        ranks[gi] = t.rank
        if t.slot == "time":
            if t.kind == TIME_CLF:
                time_groups.append(("clf", gi))
            elif t.kind == TIME_RAW:
                time_groups.append((t.ts_kind or "clf", gi))
            else:
                for j, k in enumerate(t.parts):
                    time_groups.append((k, gi + 1 + j))
        gi += _n_groups(t)
    for lst in slots.values():
        lst.sort(key=lambda k: ranks[k])

    L: list[str] = ["def convert(g):"]
    ns: dict[str, object] = {
        "PL": ParsedLine, "new": tuple.__new__, "bad": _bad, "clf": V.clf_timestamp_ms,
        "CLF": V._clf_cache, "iso": V.iso_timestamp_ms, "epoch": V.epoch_seconds_ms, "parts": _parts_cached,
        "client": V.classify_client, "CC": V._client_cache, "request_fields": V.request_fields,
        "split_url": V.split_url, "to_float": V.to_float, "user_": _user, "ctype": _ctype,
        "BIG": 1 << 62, "fwd": V.forwarded_client, "TP": trusted,
    }

    def dash(i: int) -> str:
        return f"(None if g[{i}] == '-' else g[{i}])"

    def blank(i: int) -> str:
        return f"('' if g[{i}] is None or g[{i}] == '-' else g[{i}])"

    # time
    if not time_groups:
        if require_time:
            raise ValueError("the format has no timestamp directive (%t, %{...}t, $time_local, $time_iso8601, $msec)")
        L.append("    ts = 0")
    elif len(time_groups) == 1 and time_groups[0][0] in ("clf", "iso", "epoch"):
        k, i = time_groups[0]
        if k == "clf":
            L.append(f"    ts = CLF.get(g[{i}])")
            L.append(f"    if ts is None: ts = clf(g[{i}]) if g[{i}] is not None else None")
        else:
            L.append(f"    ts = {k}(g[{i}]) if g[{i}] is not None else None")
        L.append(f"    if ts is None: return bad('bad_timestamp', 'time', g[{i}])")
    else:
        kinds = tuple(k for k, _ in time_groups)
        ns["TK"] = kinds
        vals = ", ".join(f"g[{i}]" for _, i in time_groups)
        L.append(f"    ts = parts(TK, ({vals},))")
        first_i = time_groups[0][1]
        L.append(f"    if ts is None: return bad('bad_timestamp', 'time', g[{first_i}])")
    # client
    ci = _first(slots, "client_a", "client_c", "client_h")
    xi = _first(slots, "forwarded")
    if ci is None and xi is None:
        L.append("    c = (None, None)")
    elif ci is None:  # the header instead of the peer: believed only for a site with trusted proxies
        L.append(f"    c = (fwd(None, g[{xi}], TP), None)" if trusted else "    c = (None, None)")
    else:
        L.append(f"    c = CC.get(g[{ci}])")
        L.append("    if c is None:")
        L.append(f"        c = client(g[{ci}]) if g[{ci}] is not None else None")
        L.append(f"        if c is None: return bad('bad_client', 'client', g[{ci}])")
        if xi is not None and trusted:
            L.append(f"    if c[0] is not None and c[0] in TP: c = (fwd(c[0], g[{xi}], TP), None)")
    k_ident = _first(slots, "ident")
    ident = dash(k_ident) if k_ident is not None else "None"
    k_user = _first(slots, "user")
    user = f"user_(g[{k_user}])" if k_user is not None else "None"
    # request
    ri = _first(slots, "request")
    if ri is not None:
        L.append(f"    r = g[{ri}]")
        L.append("    if r is None: method = url = path = query = proto = ''")
        L.append("    else: method, url, path, query, proto = request_fields(r)")
    else:
        mi = _first(slots, "method")
        L.append(f"    method = {blank(mi)}" if mi is not None else "    method = ''")
        pi = _first(slots, "protocol")
        L.append(f"    proto = {blank(pi)}" if pi is not None else "    proto = ''")
        ui = _first(slots, "request_uri")
        if ui is not None:
            L.append(f"    url = {blank(ui)}")
        else:
            pth = _first(slots, "uri", "nginx_uri")
            qi = _first(slots, "query")
            ai = _first(slots, "args")
            L.append(f"    url = {blank(pth)}" if pth is not None else "    url = ''")
            if qi is not None:
                L.append(f"    q = g[{qi}]")
                L.append("    if q and q != '-': url = url + q")
            elif ai is not None:
                L.append(f"    q = g[{ai}]")
                L.append("    if q and q != '-': url = url + '?' + q")
        L.append("    path, query = split_url(url, method != '')")
    # status / bytes / elapsed: the regexes guarantee ASCII digits or '-'
    si = _first(slots, "status_final", "status", "status_orig")
    if si is not None:
        L.append(f"    s = g[{si}]")
        L.append("    status = 0 if s is None or s == '-' else int(s)")
        L.append("    if status > 999: return bad('bad_number', 'status', s)")
    else:
        L.append("    status = 0")
    bi = _first(slots, "bytes_body", "bytes_total")
    if bi is not None:
        L.append(f"    b = g[{bi}]")
        L.append("    nbytes = 0 if b is None or b == '-' else int(b)")
        L.append("    if nbytes > BIG: return bad('bad_number', 'bytes', b)")
    else:
        L.append("    nbytes = 0")
    if "el_us" in slots:
        el = f"to_float(g[{slots['el_us'][0]}], 1.0, 1000.0)"
    elif "el_ms" in slots:
        el = f"to_float(g[{slots['el_ms'][0]}], 1.0)"
    elif "el_s" in slots:
        el = f"to_float(g[{slots['el_s'][0]}], 1000.0)"
    else:
        el = "None"
    out: dict[str, str] = {}
    for name in ("referer", "user_agent", "upstream"):
        fx = _first(slots, name)
        out[name] = dash(fx) if fx is not None else "None"
    fx = _first(slots, "content_type")
    out["content_type"] = f"ctype(g[{fx}])" if fx is not None else "None"
    fx = _first(slots, "vhost_v", "vhost_V", "vhost_host", "vhost_sn")
    out["vhost"] = dash(fx) if fx is not None else "None"
    fx = _first(slots, "squid_ss")
    if fx is not None:
        L.append(f"    ss = g[{fx}]")
        L.append("    if ss is None or ss == '-': cache_result = hier = None")
        L.append("    else: cache_result, _, hier = ss.partition(':')")
        cr, hi = "cache_result", "hier"
    else:
        cr, hi = "None", "None"
    L.append(f"    return new(PL, (ts, c[0], c[1], {ident}, {user}, method, url, path, query, proto, status,"
             f" nbytes, {out['referer']}, {out['user_agent']}, {el}, {cr}, {hi}, {out['upstream']},"
             f" {out['content_type']}, {out['vhost']}))")
    src = "\n".join(L)
    exec(compile(src, "<forumpulse-format>", "exec"), ns)
    fn: Callable[[tuple], ParsedLine | Drop] = ns["convert"]  # type: ignore[assignment]
    fn.__doc__ = src
    return fn


@dataclass
class CompiledFormat:
    """Regexes + converter of one format.  ``convert(match.groups())`` -> ParsedLine | Drop."""

    fast: re.Pattern[str]
    lenient: re.Pattern[str]
    partial: re.Pattern[str]
    convert: Callable[[tuple], ParsedLine | Drop]
    source: str
    #: the time is a local wall-clock time without its UTC offset (an Apache ``%{%Y-%m-%d %H:%M:%S}t`` without
    #: ``%z``): the converter reads it as UTC and the processor moves it by the site's time zone
    naive_time: bool = False
    #: the format logs ``X-Forwarded-For`` (``%{X-Forwarded-For}i``, ``$http_x_forwarded_for``): with the site's
    #: trusted proxies the client may come from it, so the converter depends on them
    forwarded: bool = False
    #: ... and logs no peer address: with trusted proxies the client is the header's right end
    header_client: bool = False


def naive_time(toks: list[Tok]) -> bool:
    """Whether the format's time has no zone: strftime components only, without ``%z``, an epoch or a CLF time."""
    kinds = [k for t in toks if t.literal is None and t.kind == TIME_PARTS for k in t.parts]
    other = any(t.literal is None and t.kind in (TIME_CLF, TIME_RAW) for t in toks)
    return bool(kinds) and not other and not {"z", "sec", "msec", "usec", "clf"} & set(kinds)


def compile_tokens(toks: list[Tok], source: str, require_time: bool = True,
                   trusted: V.TrustedProxies = V.NO_PROXIES) -> CompiledFormat:
    fast, lenient, partial = build_regexes(toks)
    fields = {t.slot for t in toks if t.literal is None}
    return CompiledFormat(fast, lenient, partial, generate_converter(toks, require_time, trusted), source,
                          naive_time(toks), "forwarded" in fields,
                          "forwarded" in fields and not fields & {"client_a", "client_c", "client_h"})


def compile_apache(fmt: str, require_time: bool = True, trusted: V.TrustedProxies = V.NO_PROXIES) -> CompiledFormat:
    return compile_tokens(tokenize_apache(fmt), "apache:" + fmt, require_time, trusted)


def compile_nginx(fmt: str, require_time: bool = True, trusted: V.TrustedProxies = V.NO_PROXIES) -> CompiledFormat:
    return compile_tokens(tokenize_nginx(fmt), "nginx:" + fmt, require_time, trusted)
