"""Render a Grafana ClickHouse panel query exactly as Grafana + grafana-clickhouse-datasource would, without Grafana.

Two stages, in Grafana's order:

1. :func:`interpolate_variables` — the browser side (``templateSrv.replace`` with the plugin's format function):
   ``$name``, ``${name}``, ``${name:fmt}``, ``[[name]]``.  Without an explicit format the plugin's formatter is
   used: a multi-value (list) selection becomes ``'a','b'`` (values are *not* escaped), a single value is inserted
   raw.  Explicit formats implemented: ``singlequote`` (``'v'``, ``'`` escaped as ``\\'``, joined by ``,``),
   ``doublequote``, ``sqlstring`` (``'`` doubled), ``csv``, ``raw``, ``text``, ``pipe``, ``percentencode``
   (JavaScript ``encodeURIComponent`` plus ``!'()*``, UTF-8; a list is encoded as ``{a,b}``).  "All" with a custom
   ``allValue`` inserts that value unformatted (Grafana skips formatting for custom all values).  Unknown names are
   left untouched, as Grafana does; ``$__…`` names are never template variables here (they are macros).
2. :func:`expand_macros` — the plugin backend (``pkg/macros/macros.go`` on top of grafana-plugin-sdk-go
   ``sqlutil.Interpolate``), F/T = the dashboard range in whole unix seconds (milliseconds for ``_ms``):

   ==============================  ==========================================================================
   ``$__timeFilter(c)``            ``c >= toDateTime(F) AND c <= toDateTime(T)``
   ``$__timeFilter_ms(c)``         ``c >= fromUnixTimestamp64Milli(Fms) AND c <= fromUnixTimestamp64Milli(Tms)``
   ``$__dateFilter(c)``            ``c >= toDate('YYYY-MM-DD') AND c <= toDate('YYYY-MM-DD')``
   ``$__dateTimeFilter(d, t)``     ``(d >= toDate(..) AND d <= toDate(..)) AND (t >= toDateTime(F) AND t <= toDateTime(T))``
   ``$__dt(d, t)``                 same as ``$__dateTimeFilter``
   ``$__fromTime`` / ``$__toTime`` ``toDateTime(F)`` / ``toDateTime(T)``
   ``$__fromTime_ms`` / ``_ms``    ``fromUnixTimestamp64Milli(Fms)`` / ``fromUnixTimestamp64Milli(Tms)``
   ``$__timeInterval(c)``          ``toStartOfInterval(toDateTime(c), INTERVAL N second)``, N = max(interval, 1) s
   ``$__timeInterval_ms(c)``       ``toStartOfInterval(toDateTime64(c, 3), INTERVAL N millisecond)``
   ``$__interval_s``               N (whole seconds, at least 1)
   ==============================  ==========================================================================

   Parsing follows sqlutil: the macro name must end at a word boundary (``$__timeFilter`` never matches
   ``$__timeFilter_ms``; longer names are applied first), arguments are taken only from a parenthesis that
   immediately follows the name (grafana-plugin-sdk-go#859), up to the balancing ``)``, and split on the commas
   outside nested parentheses (``parseArgs`` of the same change: ``$__timeFilter(toDateTime(ts, 'UTC'))`` has one
   argument; parentheses inside quotes count too, as there).  A wrong argument count raises :class:`MacroError`
   like the plugin does.

   ``$__timeFrom``/``$__timeTo``/``$__timeGroup`` are *not* ClickHouse-plugin macros in macros.go: they fall
   through to sqlutil's generic defaults (RFC 3339 string comparisons, ``datepart(...)``) which do not suit
   ClickHouse; we refuse them (:class:`MacroError`) so no dashboard depends on them.  ``$__conditionalAll`` and
   ad-hoc filters are frontend features not used by our dashboards; they are refused as well.

Misuse: the renderer is for tests and offline checks; it does not validate SQL — run the result on ClickHouse
(chDB) for that.  :func:`render_query` also fails when any ``$`` reference survives rendering.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

__all__ = [
    "MacroError",
    "QueryContext",
    "TemplateVar",
    "expand_macros",
    "interpolate_variables",
    "percent_encode",
    "render_query",
]


class MacroError(ValueError):
    """A macro could not be expanded (bad argument count, unsupported macro) or a reference was left over."""


@dataclass(frozen=True)
class QueryContext:
    """What Grafana sends with a panel query: the dashboard range and the panel interval."""

    time_from: datetime
    time_to: datetime
    interval_ms: int = 60_000

    def __post_init__(self) -> None:
        for t in (self.time_from, self.time_to):
            if t.tzinfo is None:
                raise ValueError("QueryContext times must be timezone-aware (UTC)")
        if self.time_to < self.time_from:
            raise ValueError("time_to is before time_from")


@dataclass(frozen=True)
class TemplateVar:
    """A dashboard variable's current state.  ``value`` is a str (single) or list of str (multi)."""

    name: str
    value: str | Sequence[str]
    is_all: bool = False
    all_value: str | None = None
    all_options: Sequence[str] = field(default_factory=tuple)


# ------------------------------------------------------------------------------------------ stage 1: frontend

_VAR_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")


def _plugin_default_format(value: str | Sequence[str]) -> str:
    # CHDatasource.format: arrays -> 'a','b' (no escaping); scalars unchanged.
    if isinstance(value, str):
        return value
    return "'" + "','".join(value) + "'"


def _listify(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


_FORMATS: dict[str, Callable[[list[str]], str]] = {
    "singlequote": lambda vs: ",".join("'" + v.replace("'", "\\'") + "'" for v in vs),
    "doublequote": lambda vs: ",".join('"' + v.replace('"', '\\"') + '"' for v in vs),
    "sqlstring": lambda vs: ",".join("'" + v.replace("'", "''") + "'" for v in vs),
    "csv": lambda vs: ",".join(vs),
    "raw": lambda vs: ",".join(vs),
    "text": lambda vs: " + ".join(vs),
    "pipe": lambda vs: "|".join(vs),
}


def percent_encode(value: str | Sequence[str]) -> str:
    """Grafana's ``percentencode`` format (grafana-scenes formatRegistry: ``encodeURIComponentStrict``, a list as
    ``{a,b}``): every byte but ``A-Z a-z 0-9 - _ . ~`` becomes ``%XX`` (UTF-8, upper-case hex)."""
    text = value if isinstance(value, str) else "{" + ",".join(value) + "}"
    return quote(text, safe="")


def interpolate_variables(sql: str, variables: Mapping[str, TemplateVar]) -> str:
    """Replace template variable references as Grafana's templateSrv does with the ClickHouse plugin formatter."""

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(4)
        fmt = m.group(3) or m.group(6)
        if name is None or name.startswith("__") or name not in variables:
            return m.group(0)
        var = variables[name]
        value: str | Sequence[str] = var.value
        if var.is_all:
            if var.all_value is not None and fmt not in ("text", "percentencode"):
                return var.all_value
            if var.all_value is not None and fmt == "percentencode":
                return percent_encode(var.all_value)
            value = list(var.all_options)
        if fmt is None:
            return _plugin_default_format(value)
        if fmt == "percentencode":  # a single value and a one-element list differ ('a' vs '{a}')
            return percent_encode(value)
        if fmt not in _FORMATS:
            raise MacroError(f"variable format {fmt!r} is not implemented by this renderer")
        return _FORMATS[fmt](_listify(value))

    return _VAR_RE.sub(repl, sql)


# ------------------------------------------------------------------------------------------- stage 2: backend


def _secs(t: datetime) -> int:
    return int(t.timestamp() // 1)


def _millis(t: datetime) -> int:
    return int(t.timestamp() * 1000 // 1)


def _dt(t: datetime) -> str:
    return f"toDateTime({_secs(t)})"


def _dt64(t: datetime) -> str:
    return f"fromUnixTimestamp64Milli({_millis(t)})"


def _date(t: datetime) -> str:
    """The date of ``t`` in UTC.  The plugin formats it in its server process's local zone (``time.Unix`` then
    ``Format``): the same while Grafana runs in UTC, the official image's default; no forumpulse panel uses the
    date macros."""
    return f"toDate('{t.astimezone(UTC).strftime('%Y-%m-%d')}')"


def _need(name: str, args: list[str], n: int) -> None:
    if len(args) != n:
        raise MacroError(f"$__{name}: unexpected number of arguments: expected {n}, received {len(args)}")


def _time_filter(c: QueryContext, a: list[str]) -> str:
    _need("timeFilter", a, 1)
    return f"{a[0]} >= {_dt(c.time_from)} AND {a[0]} <= {_dt(c.time_to)}"


def _time_filter_ms(c: QueryContext, a: list[str]) -> str:
    _need("timeFilter_ms", a, 1)
    return f"{a[0]} >= {_dt64(c.time_from)} AND {a[0]} <= {_dt64(c.time_to)}"


def _date_filter(c: QueryContext, a: list[str]) -> str:
    _need("dateFilter", a, 1)
    return f"{a[0]} >= {_date(c.time_from)} AND {a[0]} <= {_date(c.time_to)}"


def _date_time_filter(c: QueryContext, a: list[str]) -> str:
    _need("dateTimeFilter", a, 2)
    d, t = a
    return (
        f"({d} >= {_date(c.time_from)} AND {d} <= {_date(c.time_to)}) AND "
        f"({t} >= {_dt(c.time_from)} AND {t} <= {_dt(c.time_to)})"
    )


def _interval_s(c: QueryContext) -> int:
    return max(c.interval_ms // 1000, 1)


def _time_interval(c: QueryContext, a: list[str]) -> str:
    _need("timeInterval", a, 1)
    return f"toStartOfInterval(toDateTime({a[0]}), INTERVAL {_interval_s(c)} second)"


def _time_interval_ms(c: QueryContext, a: list[str]) -> str:
    _need("timeInterval_ms", a, 1)
    return f"toStartOfInterval(toDateTime64({a[0]}, 3), INTERVAL {max(c.interval_ms, 1)} millisecond)"


def _refuse(name: str, why: str) -> Callable[[QueryContext, list[str]], str]:
    def f(c: QueryContext, a: list[str]) -> str:
        raise MacroError(f"$__{name} is not supported: {why}")

    return f


_GENERIC = "not a ClickHouse-plugin macro (sqlutil's generic default emits non-ClickHouse SQL)"

#: name -> expansion, as registered by the plugin (plus the generic sqlutil defaults, refused).
MACROS: dict[str, Callable[[QueryContext, list[str]], str]] = {
    "fromTime": lambda c, a: _dt(c.time_from),
    "toTime": lambda c, a: _dt(c.time_to),
    "fromTime_ms": lambda c, a: _dt64(c.time_from),
    "toTime_ms": lambda c, a: _dt64(c.time_to),
    "timeFilter": _time_filter,
    "timeFilter_ms": _time_filter_ms,
    "dateFilter": _date_filter,
    "dateTimeFilter": _date_time_filter,
    "dt": _date_time_filter,
    "timeInterval": _time_interval,
    "timeInterval_ms": _time_interval_ms,
    "interval_s": lambda c, a: str(_interval_s(c)),
    "timeFrom": _refuse("timeFrom", _GENERIC),
    "timeTo": _refuse("timeTo", _GENERIC),
    "timeGroup": _refuse("timeGroup", _GENERIC),
    "table": _refuse("table", "needs the query builder's table field"),
    "column": _refuse("column", "needs the query builder's column field"),
    "conditionalAll": _refuse("conditionalAll", "frontend macro, not used by forumpulse dashboards"),
    "adHocFilters": _refuse("adHocFilters", "frontend macro, not used by forumpulse dashboards"),
}


def _matches(sql: str, name: str) -> list[tuple[str, list[str]]]:
    out = []
    for m in re.finditer(r"\$__" + re.escape(name) + r"\b", sql):
        end = m.end()
        args: list[str] = []
        if end < len(sql) and sql[end] == "(":
            depth, arg = 0, end + 1
            for i in range(end, len(sql)):
                if sql[i] == "(":
                    depth += 1
                elif sql[i] == ")":
                    depth -= 1
                    if depth == 0:
                        args.append(sql[arg:i].strip())
                        end = i + 1
                        break
                elif sql[i] == "," and depth == 1:  # a comma inside nested parentheses is the argument's own
                    args.append(sql[arg:i].strip())
                    arg = i + 1
            else:
                raise MacroError(f"$__{name}: unbalanced parentheses")
        out.append((sql[m.start() : end], args))
    return out


def expand_macros(sql: str, ctx: QueryContext) -> str:
    """Expand the plugin's ``$__`` macros (see module docstring); longer macro names first."""
    for name in sorted(MACROS, key=len, reverse=True):
        for text, args in _matches(sql, name):
            sql = sql.replace(text, MACROS[name](ctx, args))
    return sql


_LEFTOVER = re.compile(r"\$\{?\w+|\[\[\w+")


def render_query(sql: str, ctx: QueryContext, variables: Mapping[str, TemplateVar] | None = None) -> str:
    """Variables, then macros; raises :class:`MacroError` if any ``$name``/``${…}``/``[[…]]`` is left over."""
    out = expand_macros(interpolate_variables(sql, variables or {}), ctx)
    left = _LEFTOVER.search(_strip_literals(out))
    if left:
        raise MacroError(f"unresolved reference {left.group(0)!r} in rendered SQL")
    return out


def _strip_literals(sql: str) -> str:
    return re.sub(r"'(?:[^'\\]|\\.)*'", "''", sql)


def utc(s: str) -> datetime:
    """Parse an ISO-8601 timestamp (``Z`` allowed) into an aware UTC datetime."""
    return datetime.fromisoformat(s.replace("Z", "+00:00")).astimezone(UTC)
