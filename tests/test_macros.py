"""forumpulse.dashboards.macros against the expansions grafana-clickhouse-datasource documents (pkg/macros/macros.go,
src/ch-parser/pluginMacros.ts) and Grafana's variable formatting."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from forumpulse.dashboards.macros import (
    MacroError,
    QueryContext,
    TemplateVar,
    expand_macros,
    interpolate_variables,
    render_query,
    utc,
)

# the plugin's documented example range: 2014-11-12T11:45:26.371Z .. 2015-11-12T11:45:26.371Z
CTX = QueryContext(utc("2014-11-12T11:45:26.371Z"), utc("2015-11-12T11:45:26.371Z"), interval_ms=20_000)


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        ("$__timeFilter(time)", "time >= toDateTime(1415792726) AND time <= toDateTime(1447328726)"),
        ("$__timeFilter_ms(time)",
         "time >= fromUnixTimestamp64Milli(1415792726371) AND time <= fromUnixTimestamp64Milli(1447328726371)"),
        ("$__dateFilter(d)", "d >= toDate('2014-11-12') AND d <= toDate('2015-11-12')"),
        ("$__dateTimeFilter(d, t)",
         "(d >= toDate('2014-11-12') AND d <= toDate('2015-11-12')) AND "
         "(t >= toDateTime(1415792726) AND t <= toDateTime(1447328726))"),
        ("$__dt(d,t)",
         "(d >= toDate('2014-11-12') AND d <= toDate('2015-11-12')) AND "
         "(t >= toDateTime(1415792726) AND t <= toDateTime(1447328726))"),
        ("$__fromTime", "toDateTime(1415792726)"),
        ("$__toTime", "toDateTime(1447328726)"),
        ("$__fromTime_ms", "fromUnixTimestamp64Milli(1415792726371)"),
        ("$__toTime_ms", "fromUnixTimestamp64Milli(1447328726371)"),
        ("$__timeInterval(column)", "toStartOfInterval(toDateTime(column), INTERVAL 20 second)"),
        ("$__timeInterval_ms(column)", "toStartOfInterval(toDateTime64(column, 3), INTERVAL 20000 millisecond)"),
        ("$__interval_s", "20"),
    ],
)
def test_documented_expansions(sql: str, want: str) -> None:
    assert expand_macros(sql, CTX) == want


def test_interval_is_at_least_one_second() -> None:
    ctx = QueryContext(CTX.time_from, CTX.time_to, interval_ms=200)
    assert expand_macros("$__interval_s", ctx) == "1"
    assert expand_macros("$__timeInterval(c)", ctx).endswith("INTERVAL 1 second)")
    assert expand_macros("$__timeInterval_ms(c)", ctx).endswith("INTERVAL 200 millisecond)")


def test_word_boundary_and_longer_names_first() -> None:
    out = expand_macros("SELECT $__fromTime_ms, $__fromTime, $__timeFilter_ms(a) OR $__timeFilter(b)", CTX)
    assert out == ("SELECT fromUnixTimestamp64Milli(1415792726371), toDateTime(1415792726), "
                   "a >= fromUnixTimestamp64Milli(1415792726371) AND a <= fromUnixTimestamp64Milli(1447328726371) OR "
                   "b >= toDateTime(1415792726) AND b <= toDateTime(1447328726)")


def test_bare_macro_does_not_swallow_later_parentheses() -> None:
    # grafana-plugin-sdk-go#859: arguments only when '(' immediately follows the name
    out = expand_macros("count() / $__interval_s AS r FROM t WHERE x IN (1, 2)", CTX)
    assert out == "count() / 20 AS r FROM t WHERE x IN (1, 2)"


def test_nested_parentheses_in_argument() -> None:
    assert expand_macros("$__timeFilter(toDateTime(ts))", CTX) == (
        "toDateTime(ts) >= toDateTime(1415792726) AND toDateTime(ts) <= toDateTime(1447328726)")
    # a comma inside nested parentheses belongs to the argument (sqlds / sdk parseArgs, 'nested parens are not
    # parsed further'); it used to be an argument-count error here
    assert expand_macros("$__timeFilter(toDateTime(ts, 'UTC'))", CTX) == (
        "toDateTime(ts, 'UTC') >= toDateTime(1415792726) AND toDateTime(ts, 'UTC') <= toDateTime(1447328726)")
    assert expand_macros("$__dt(toDate(ts, 'UTC'), ts)", CTX).startswith("(toDate(ts, 'UTC') >= toDate(")


@pytest.mark.parametrize("sql", ["$__timeFilter(a, b)", "$__timeFilter(f(a), b)", "$__dt(a)", "$__dt(f(a, b))"])
def test_argument_count_errors(sql: str) -> None:
    # args are split on the commas outside nested parentheses, as in sqlds / sqlutil parseArgs
    with pytest.raises(MacroError, match="number of arguments"):
        expand_macros(sql, CTX)


def test_empty_argument_list_is_one_empty_argument() -> None:
    assert expand_macros("$__timeInterval()x", CTX) == "toStartOfInterval(toDateTime(), INTERVAL 20 second)x"


@pytest.mark.parametrize("name", ["timeFrom(t)", "timeTo(t)", "timeGroup(t, 5m)", "conditionalAll(a, $v)"])
def test_non_clickhouse_macros_are_refused(name: str) -> None:
    with pytest.raises(MacroError, match="not supported"):
        expand_macros(f"SELECT 1 WHERE $__{name}", CTX)


def test_whole_seconds_floor() -> None:
    ctx = QueryContext(datetime(2024, 1, 1, 0, 0, 0, 999_000, tzinfo=UTC), datetime(2024, 1, 1, 0, 0, 1, tzinfo=UTC))
    assert expand_macros("$__fromTime", ctx) == "toDateTime(1704067200)"
    assert expand_macros("$__fromTime_ms", ctx) == "fromUnixTimestamp64Milli(1704067200999)"


def test_naive_times_rejected() -> None:
    with pytest.raises(ValueError):
        QueryContext(datetime(2024, 1, 1), datetime(2024, 1, 2))


VARS = {
    "site": TemplateVar("site", "forum"),
    "multi": TemplateVar("multi", ["a", "b's"]),
    "topic": TemplateVar("topic", "101"),
    "all": TemplateVar("all", [], is_all=True, all_options=("x", "y")),
    "allc": TemplateVar("allc", [], is_all=True, all_value="*", all_options=("x",)),
}


@pytest.mark.parametrize(
    ("sql", "want"),
    [
        ("site = '$site'", "site = 'forum'"),
        ("site = ${site:singlequote}", "site = 'forum'"),
        ("x IN ($multi)", "x IN ('a','b's')"),  # the plugin's default formatter does not escape
        ("x IN (${multi:singlequote})", "x IN ('a','b\\'s')"),
        ("x IN (${multi:sqlstring})", "x IN ('a','b''s')"),
        ("x IN (${multi:csv})", "x IN (a,b's)"),
        ("x = [[topic]] AND y = ${topic}", "x = 101 AND y = 101"),
        ("g IN (${all:singlequote})", "g IN ('x','y')"),
        ("g IN ($all)", "g IN ('x','y')"),
        ("g = ${allc:singlequote}", "g = *"),
        ("$unknown $__interval_s ${site:doublequote}", '$unknown $__interval_s "forum"'),
        # percentencode (grafana-scenes encodeURIComponentStrict; a list as {a,b}): nothing can close a literal
        ("'${site:percentencode}'", "'forum'"),
        ("'${multi:percentencode}'", "'%7Ba%2Cb%27s%7D'"),
        ("'${all:percentencode}'", "'%7Bx%2Cy%7D'"),
        ("'${allc:percentencode}'", "'%2A'"),  # Grafana formats a custom all value for percentencode
    ],
)
def test_variable_formatting(sql: str, want: str) -> None:
    assert interpolate_variables(sql, VARS) == want


def test_render_query_order_and_leftovers() -> None:
    sql = "SELECT $__timeInterval(m) AS time FROM t WHERE site = ${site:singlequote} AND $__timeFilter(m)"
    out = render_query(sql, CTX, VARS)
    assert "${" not in out and "$__" not in out and "site = 'forum'" in out
    with pytest.raises(MacroError, match="unresolved"):
        render_query("SELECT $nosuchvar", CTX, VARS)
    # a dollar inside a string literal (a regex) is not a leftover reference
    assert render_query("SELECT match(s, '^a$') FROM t", CTX) == "SELECT match(s, '^a$') FROM t"


@pytest.mark.parametrize(
    ("value", "want"),
    [  # encodeURIComponent(v).replace(/[!'()*]/g, c => '%' + hex(c).toUpperCase()), as in a browser
        ("a-b_c.d~e", "a-b_c.d~e"),
        ("\\' OR 1=1 --", "%5C%27%20OR%201%3D1%20--"),
        ("!'()*", "%21%27%28%29%2A"),
        ("café ✓ $x", "caf%C3%A9%20%E2%9C%93%20%24x"),
        ("a+b/c?d&e=f%", "a%2Bb%2Fc%3Fd%26e%3Df%25"),
    ],
)
def test_percent_encode_is_encode_uri_component_strict(value: str, want: str) -> None:
    from forumpulse.dashboards.macros import percent_encode

    assert percent_encode(value) == want
    assert set(want) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~%")
