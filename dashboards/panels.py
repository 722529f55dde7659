"""Panel SQL and the ClickHouse query type for grafana-foundation-sdk.

The SDK has no ClickHouse query type; :class:`ClickHouseQuery` is a small builder that emits the JSON the
grafana-clickhouse-datasource plugin (v4) stores for a SQL-editor query:

``{"refId", "datasource": {"type": "grafana-clickhouse-datasource", "uid"}, "editorType": "sql", "rawSql",
"format", "queryType"}``

``format`` is grafana-plugin-sdk-go ``sqlutil.FormatQueryOption``: **0 time series** (long frames are converted
to wide, one series per string column value), **1 table**, 2 logs, 3 traces, 4 multi.  ``queryType`` is the
plugin's editor hint (``timeseries`` / ``table``, its QueryType enum).

Every SQL here reads ClickHouse only: the per-minute rollups (``site_minute``, ``topic_minute``,
``client_minute``, ``prefix_minute``, ``transfer_minute`` — AggregatingMergeTree, so ``sum()`` over the
SimpleAggregateFunction columns, ``uniqMerge(visitors)``, ``quantilesTDigestMerge(...)(elapsed_q)``) for time
panels, ``detections`` / ``topic_*`` (ReplacingMergeTree, read with ``FINAL`` or ``argMax``),
``source_liveness`` (``max`` per source over every consumer's rows, classified as ``source_status`` does), and
``decisions`` / ``quarantine`` / ``pipeline_stats``.

Topic and top-prefix panels read ``topic_hour`` / ``prefix_hour`` (migration 0003: hourly rollups cascaded from
the ``*_minute`` ones) for the whole hours inside the dashboard range and the minute
rollup for the partial hours at its edges (:func:`rollup_rows`), so their numbers are exactly those of the minute
rollup alone (tests/test_dashboards.py compares both paths).  Range aggregates (rankings, top tables) always take
that path; time series only when every bucket is whole hours (``$__interval_s`` a multiple of 3600), otherwise
they keep per-minute data.  ``$metric`` aggregates only the
chosen metric (``-If`` combinators with the constant condition): ``uniqMerge`` of visitor states is the costly one.

Variables used: ``site`` (single), ``metric`` (views | replies | visitors), ``group`` (multi, All),
``topic`` (single topic id).  Every one is inserted percent-encoded and decoded in SQL (:data:`SITE_VALUE`): no
value, whatever its quotes or backslashes, can leave its string literal.  Hourly rollups hold UTC hours, and the
SQL computes hours in UTC whatever the server's time zone.  Rate panels divide each interval by the seconds it
covers inside the range (:data:`BUCKET_MINUTE_SECONDS`).  Detections that concern one topic are expected to carry ``scope = 'topic:<id>'``
(group surges ``group:<name>``); the event list links topic events to the topic drill-down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants

DATASOURCE_TYPE = "grafana-clickhouse-datasource"
DATASOURCE_UID = "forumpulse-clickhouse"
FORMAT_TIME_SERIES = 0
FORMAT_TABLE = 1


class ClickHouseDataquery(cogvariants.Dataquery):
    """The plugin's SQL query model (only the fields a raw-SQL query needs)."""

    def __init__(self, raw_sql: str, fmt: int, ref_id: str = "A", uid: str = DATASOURCE_UID) -> None:
        if fmt not in (0, 1, 2, 3, 4):
            raise ValueError("format must be a sqlutil.FormatQueryOption (0..4)")
        self.raw_sql = raw_sql
        self.format = fmt
        self.ref_id = ref_id
        self.uid = uid

    def to_json(self) -> dict[str, object]:
        return {
            "refId": self.ref_id,
            "datasource": {"type": DATASOURCE_TYPE, "uid": self.uid},
            "editorType": "sql",
            "format": self.format,
            "queryType": "timeseries" if self.format == FORMAT_TIME_SERIES else "table",
            "rawSql": self.raw_sql,
        }


class ClickHouseQuery(cogbuilder.Builder[cogvariants.Dataquery]):
    """Builder for :class:`ClickHouseDataquery` (``.with_target(ClickHouseQuery(sql).table())``)."""

    def __init__(self, raw_sql: str) -> None:
        self._q = ClickHouseDataquery(raw_sql.strip(), FORMAT_TIME_SERIES)

    def table(self) -> ClickHouseQuery:
        self._q.format = FORMAT_TABLE
        return self

    def time_series(self) -> ClickHouseQuery:
        self._q.format = FORMAT_TIME_SERIES
        return self

    def ref_id(self, ref_id: str) -> ClickHouseQuery:
        self._q.ref_id = ref_id
        return self

    def build(self) -> cogvariants.Dataquery:
        return self._q


# ------------------------------------------------------------------------------------------------ SQL pieces

# Variables reach the SQL only percent-encoded (Grafana's ``${var:percentencode}``: encodeURIComponent plus
# ``!'()*``, so the text between the quotes is [A-Za-z0-9._~%-] only) and are decoded by ClickHouse: whatever a
# viewer puts in the URL (``?var-site=...``) or a custom value, it stays one string literal.  ``singlequote`` was
# not safe: it escapes ' as \' but leaves backslashes, which ClickHouse reads as escapes (``\' OR 1=1 --``).
#: the selected site, as a string expression
SITE_VALUE = "decodeURLComponent('${site:percentencode}')"
SITE = f"site = {SITE_VALUE}"
#: the selected topic id; NULL (no rows, no error) when it is empty or not a number
TOPIC = "toUInt64OrNull(decodeURLComponent('${topic:percentencode}'))"
#: the selected metric; anything but 'replies' / 'visitors' is read as views (:func:`metric_expr`)
METRIC = "decodeURLComponent('${metric:percentencode}')"
#: the selected topic groups (multi-value: percentencode of a list is ``{a,b}``): an Array(String).  A group
#: name containing a comma cannot be told apart from two names (it selects nothing; never more than asked).
GROUP_VALUES = "splitByChar(',', replaceRegexpAll(decodeURLComponent('${group:percentencode}'), '^[{]|[}]$', ''))"


def metric_expr(prefix: str = "") -> str:
    """The ``$metric`` value of topic rows (views/replies: sum; visitors: uniqMerge).

    Each aggregate runs only for its metric (``-If`` with a condition that is constant per query): ``multiIf``
    alone would still merge every visitor state when the metric is views.
    """
    p = prefix
    return (
        f"multiIf({METRIC} = 'replies', toFloat64(sumIf({p}replies, {METRIC} = 'replies')), "
        f"{METRIC} = 'visitors', toFloat64(uniqMergeIf({p}visitors, {METRIC} = 'visitors')), "
        f"toFloat64(sumIf({p}views, {METRIC} NOT IN ('replies', 'visitors'))))"
    )


#: The forum-wide denominator of ``$metric`` from site_minute (human topic views / replies / visitors).
SITE_METRIC = (
    f"multiIf({METRIC} = 'replies', toFloat64(sumIf(replies, {METRIC} = 'replies')), "
    f"{METRIC} = 'visitors', toFloat64(uniqMergeIf(visitors, {METRIC} = 'visitors')), "
    f"toFloat64(sumIf(topic_views, {METRIC} NOT IN ('replies', 'visitors'))))"
)

#: First and end (exclusive) of the whole hours inside the range ``$__timeFilter`` selects (minute >= from AND
#: minute <= to): hour h is whole when h >= from and its last minute h + 59 min <= to.  Empty when from >= to.
#: Hours are UTC hours (``topic_hour.hour`` is ``toStartOfHour(minute)`` of a DateTime('UTC') column): ``$__fromTime``
#: is a DateTime in the server's (session's) time zone, whose hours start at :30 in Asia/Kolkata.
HOUR_FROM = "toStartOfHour($__fromTime + INTERVAL 3599 SECOND, 'UTC')"
HOUR_TO = "toStartOfHour($__toTime + INTERVAL 60 SECOND, 'UTC')"
#: Rates of the minute rollups (per second) count only the minutes wholly inside the range, and divide each bucket
#: of ``$__timeInterval`` by the seconds of those minutes it holds: the first bucket of a range that starts
#: mid-bucket and the last one of a range ending now (the minute under way is not whole: it is left out until it
#: ends) are drawn at their rate, not as a drop.  An ingest delay is not corrected (a minute loaded late reads low
#: until it is complete in the store; see the Freshness panel).
WHOLE_MINUTES = "$__timeFilter(minute) AND minute <= $__toTime - INTERVAL 60 SECOND"
#: The seconds of bucket ``time`` (``$__timeInterval``) covered by the minutes :data:`WHOLE_MINUTES` selects:
#: 60 x the minute starts in [max(bucket start, first minute start >= from), min(bucket end, to rounded down to
#: a minute)).  At least 60 for a bucket that has a row.
BUCKET_MINUTE_SECONDS = (
    "(60 * (intDiv(least(toUnixTimestamp(time) + $__interval_s, intDiv(toUnixTimestamp($__toTime), 60) * 60) + 59, 60)"
    " - intDiv(greatest(toUnixTimestamp(time), intDiv(toUnixTimestamp($__fromTime) + 59, 60) * 60) + 59, 60)))"
)
#: The same for rows with their own timestamps (``$__timeFilter(c)``: from <= c <= to): the bucket clamped to the
#: range, in seconds (at least 1).
BUCKET_RANGE_SECONDS = (
    "greatest(least(toUnixTimestamp(time) + $__interval_s, toUnixTimestamp($__toTime))"
    " - greatest(toUnixTimestamp(time), toUnixTimestamp($__fromTime)), 1)"
)
#: When :func:`rollup_rows` reads whole hours from an hourly rollup: always (range totals), or when the buckets of
#: ``$__timeInterval`` are whole hours (toStartOfInterval is aligned to the epoch).
HOURS_ALWAYS = "(3600 > 0)"
HOURS_IF_HOURLY_BUCKETS = "($__interval_s % 3600 = 0)"


def minute_path(sql: str) -> str:
    """``sql`` (a panel query) reading the minute rollups only: the reference the hourly path must equal (tests,
    comparisons).  Not for dashboards: it is the slow path."""
    return sql.replace(HOURS_ALWAYS, "(1 = 0)").replace(HOURS_IF_HOURLY_BUCKETS, "(1 = 0)")


def rollup_rows(kind: str, columns: str, where: str = "", bucketed: bool = True) -> str:
    """A subquery (for ``FROM (...)``) with the ``<kind>_minute`` rows of the dashboard range, the whole hours read
    from ``<kind>_hour`` (migration 0003): column ``t`` (minute or hour start) and ``columns``.  Aggregate it
    (``sum``/``uniqMerge``); never read ``t`` as a minute.

    ``where``: an extra condition on those columns (e.g. one topic).  ``bucketed``: the caller groups by
    ``$__timeInterval(t)``, so hours are used only when the buckets are whole hours; otherwise (range totals,
    rankings) whole hours are always read hourly.  Misuse: ``$__timeFilter`` must stay the panel's only range.
    """
    use = HOURS_IF_HOURLY_BUCKETS if bucketed else HOURS_ALWAYS
    extra = f" AND {where}" if where else ""
    return (
        f"SELECT minute AS t, {columns} FROM {kind}_minute "
        f"WHERE {SITE} AND $__timeFilter(minute){extra} AND NOT ({use} AND minute >= {HOUR_FROM} AND minute < {HOUR_TO}) "
        "UNION ALL "
        f"SELECT hour AS t, {columns} FROM {kind}_hour "
        f"WHERE {SITE} AND {use} AND hour >= {HOUR_FROM} AND hour < {HOUR_TO}{extra}"
    )


def topic_rows(where: str = "", bucketed: bool = True) -> str:
    """:func:`rollup_rows` of topics: ``t``, ``topic_id``, ``views``, ``replies``, ``bot_views``, ``visitors``."""
    return rollup_rows("topic", "topic_id, views, replies, bot_views, visitors", where, bucketed)


TITLES = (
    "SELECT topic_id, argMax(title, updated_at) AS title, argMax(forum, updated_at) AS forum "
    f"FROM topic_titles WHERE {SITE} GROUP BY topic_id"
)
GROUPS = f"SELECT topic_id, group_name FROM topic_groups FINAL WHERE {SITE} AND has({GROUP_VALUES}, group_name)"
TOP_TOPICS = f"SELECT topic_id FROM ({topic_rows(bucketed=False)}) GROUP BY topic_id ORDER BY {metric_expr()} DESC, topic_id LIMIT 10"
#: The 25 topics of the "Top topics" table (most human views in the range); visitor states are merged for these
#: only, and their peak minute (earliest on ties) comes from topic_minute.
TOP_TABLE_TOPICS = (
    f"SELECT topic_id FROM ({topic_rows(bucketed=False)}) GROUP BY topic_id ORDER BY sum(views) DESC, topic_id LIMIT 25"
)
SITE_TOTALS = (
    f"SELECT $__timeInterval(minute) AS time, {SITE_METRIC} AS total FROM site_minute "
    f"WHERE {SITE} AND $__timeFilter(minute) GROUP BY time"
)
TOPIC_LABEL = "concat('#', toString(s.topic_id), if(t.title = '', '', concat(' ', t.title)))"


# ------------------------------------------------------------------------------------------------ liveness
# The states of forumpulse.pipeline.consumer.source_status / listener_status (docs/architecture.md, "Liveness"),
# in SQL, at the end of the dashboard range.  tests/test_dashboards_liveness.py compares them on the same store.

#: source_status(quiet_after_s=...) and (heartbeat_timeout_s=...) defaults, as GET /fp/sources uses them
LIVE_WITHIN_S = 300
HEARTBEAT_TIMEOUT_S = 180
#: consumer.STUCK_WINDOW_S / STUCK_GRACE_S: a file growing (heartbeat size=, same inode, in two minutes) within the
#: last STUCK_WINDOW_S and later than STUCK_GRACE_S after the source's last line is ``stuck`` (forumpulse.pipeline.
#: contracts.file_grew is the rule; the SQL below states it over each minute's first and last heartbeat)
STUCK_WINDOW_S = 600
STUCK_GRACE_S = 120
#: consumer.LISTENER_GRACE_S: a listener whose last heartbeat is more than this before a heartbeat-less sender's
#: last line did not receive it (three heartbeats at the collector's default 10-s interval)
LISTENER_GRACE_S = 30
#: origin_file of a network listener's heartbeat (contracts.LISTENER_LABEL_RE: ``tcp:5140``, ``syslog:5514``...)
LISTENER_LABEL = "match({col}, '^[A-Za-z][A-Za-z0-9_]*:[0-9]{{1,5}}$')"

#: One row per (site, origin_host, origin_file) as source_status reads them (newest line / heartbeat of every
#: consumer's rows, epoch milliseconds, 0 = never) and whether the row is a listener's heartbeat (no lines).
LIVENESS_ROWS = f"""lv AS (
    SELECT site, origin_host, origin_file,
           toUnixTimestamp64Milli(max(last_line_ts)) AS line_ms,
           toUnixTimestamp64Milli(max(last_heartbeat_ts)) AS hb_ms, max(lines) AS n_lines,
           line_ms = 0 AND hb_ms > 0 AND {LISTENER_LABEL.format(col="origin_file")} AS is_listener
    FROM source_liveness
    GROUP BY site, origin_host, origin_file
)"""


def liveness_sources(where: str = "1 = 1") -> str:
    """A subquery over ``lv`` (:data:`LIVENESS_ROWS`): the sources (rows that are neither a listener's heartbeat
    nor a host-level heartbeat without lines) matching ``where`` with ``own_hb_ms`` (their newest heartbeat, or
    their host's: empty ``origin_file``, same site or ``*``), ``cover`` (the listeners that may have received a
    source without heartbeats of its own: array of (site, collector, listener, hb_ms), oldest first: a source is
    quiet only while all of them are up; a listener that stopped heartbeating before the source's last line — a
    retired collector, an old port — did not receive it and is left out), ``grew`` (its file grew lately: see :data:`STUCK_WINDOW_S`) and
    ``state`` (retired | live | stuck | silent | quiet | dead: ``retired`` when ``source_retired``, migration
    0011, retired it by ``now_s`` and its last line came before the retirement's minute rounded up: as
    ``pipeline.sources.retired_after``; it then covers no listener); ``now_s`` must be
    defined.  Needs migration 0011 (the owner and consumers migrate at start; ``forumpulse db migrate``)."""
    return f"""
    SELECT s.site AS site, s.origin_host AS origin_host, s.origin_file AS origin_file, s.line_ms AS line_ms,
           s.n_lines AS n_lines, greatest(s.hb_ms, ifNull(h.host_hb_ms, 0), ifNull(hs.host_hb_ms, 0)) AS own_hb_ms,
           arrayFilter(x -> x.3 = s.origin_file AND (x.1 = s.site OR x.1 = '*'), l.ls) AS exact,
           if(own_hb_ms > 0, [],
              if(notEmpty(exact) OR startsWith(s.origin_file, '/') OR {LISTENER_LABEL.format(col="s.origin_file")},
                 exact, arrayFilter(x -> x.1 = '*', l.ls))) AS may_cover,
           ifNull(r.retired_ms, 0) AS r_ms,
           r_ms > 0 AND r_ms <= toInt64(now_s) * 1000 AND s.line_ms < intDiv(r_ms + 59999, 60000) * 60000 AS retired,
           arrayFilter(x -> NOT retired AND (s.line_ms = 0 OR x.4 >= s.line_ms - {LISTENER_GRACE_S * 1000}),
                       may_cover) AS unsorted_cover,
           arraySort(x -> (x.4, x.2, x.3, x.1), unsorted_cover) AS cover,
           if(empty(cover), 0, cover[1].4) AS via_ms,
           toInt64(now_s) * 1000 AS now_ms,
           greatest(now_ms - {STUCK_WINDOW_S * 1000}, if(s.line_ms > 0, s.line_ms + {STUCK_GRACE_S * 1000}, 0)) AS grow_lo,
           arrayFilter(x -> x.1 >= grow_lo AND x.1 <= now_ms, g.beats) AS gb,
           length(arrayDistinct(arrayFilter(m -> m >= 0, arrayMap((c, p) -> if(c.3 = p.3 AND c.2 > p.2,
               intDiv(c.1, 60000), -1), arrayPopFront(gb), arrayPopBack(gb))))) >= 2 AS grew,
           multiIf(retired, 'retired',
                   s.line_ms > 0 AND now_s - s.line_ms / 1000 <= {LIVE_WITHIN_S}, 'live',
                   own_hb_ms > 0 AND now_s - own_hb_ms / 1000 <= {HEARTBEAT_TIMEOUT_S} AND grew, 'stuck',
                   own_hb_ms > 0 AND now_s - own_hb_ms / 1000 <= {HEARTBEAT_TIMEOUT_S}, 'silent',
                   via_ms > 0 AND now_s - via_ms / 1000 <= {HEARTBEAT_TIMEOUT_S}, 'quiet', 'dead') AS state
    FROM (SELECT * FROM lv WHERE {where} AND NOT is_listener AND NOT (origin_file IN ('', '-') AND line_ms = 0)) AS s
    LEFT JOIN (SELECT site, origin_host, max(hb_ms) AS host_hb_ms FROM lv WHERE origin_file IN ('', '-')
               GROUP BY site, origin_host) AS h ON s.site = h.site AND s.origin_host = h.origin_host
    LEFT JOIN (SELECT origin_host, max(hb_ms) AS host_hb_ms FROM lv WHERE origin_file IN ('', '-') AND site = '*'
               GROUP BY origin_host) AS hs ON s.origin_host = hs.origin_host
    LEFT JOIN (SELECT site, origin_host, origin_file, arraySort(arrayDistinct(arrayFlatten(groupArray([f, l])))) AS beats
               FROM (SELECT site, origin_host, origin_file,
                            (toInt64(toUnixTimestamp64Milli(min(first_beat).1)), toUInt64(min(first_beat).2),
                             toUInt64(min(first_beat).3)) AS f,
                            (toInt64(toUnixTimestamp64Milli(max(last_beat).1)), toUInt64(max(last_beat).2),
                             toUInt64(max(last_beat).3)) AS l
                     FROM source_heartbeat_minute
                     WHERE minute >= toDateTime(intDiv(now_s - {STUCK_WINDOW_S}, 60) * 60, 'UTC')
                       AND origin_file NOT IN ('', '-')
                     GROUP BY site, origin_host, origin_file, minute)
               GROUP BY site, origin_host, origin_file) AS g
        ON s.site = g.site AND s.origin_host = g.origin_host AND s.origin_file = g.origin_file
    LEFT JOIN (SELECT site, origin_host, origin_file,
                      toUnixTimestamp64Milli(argMax(retired_at, updated_at)) AS retired_ms
               FROM source_retired GROUP BY site, origin_host, origin_file) AS r
        ON s.site = r.site AND s.origin_host = r.origin_host AND s.origin_file = r.origin_file
    CROSS JOIN (SELECT groupArray((site, origin_host, origin_file, hb_ms)) AS ls FROM lv WHERE is_listener) AS l"""


SOURCE_LIVENESS_SQL = f"""
WITH toUnixTimestamp($__toTime) AS now_s,
{LIVENESS_ROWS}
SELECT origin_host, origin_file, state AS status,
       if(line_ms > 0, fromUnixTimestamp64Milli(line_ms, 'UTC'), NULL) AS last_line_ts,
       if(line_ms > 0, now_s - line_ms / 1000, NULL) AS line_age_s,
       if(own_hb_ms > 0, now_s - own_hb_ms / 1000, NULL) AS heartbeat_age_s,
       if(empty(cover), NULL, concat(cover[1].2, ' ', cover[1].3)) AS listener,
       if(empty(cover), NULL, now_s - via_ms / 1000) AS listener_heartbeat_age_s,
       n_lines AS lines
FROM ({liveness_sources(SITE)})
ORDER BY indexOf(['dead', 'stuck', 'quiet', 'silent', 'live', 'retired'], status), origin_host, origin_file"""

LISTENERS_SQL = f"""
WITH toUnixTimestamp($__toTime) AS now_s,
{LIVENESS_ROWS}
SELECT l.site AS listener_site, l.origin_host AS collector, l.origin_file AS listener,
       if(now_s - l.hb_ms / 1000 <= {HEARTBEAT_TIMEOUT_S}, 'up', 'down') AS status,
       now_s - l.hb_ms / 1000 AS heartbeat_age_s, ifNull(k.n, 0) AS sources
FROM (SELECT * FROM lv WHERE is_listener AND ({SITE} OR site = '*')) AS l
LEFT JOIN (
    SELECT c.1 AS c_site, c.2 AS c_host, c.3 AS c_file, count() AS n
    FROM ({liveness_sources()}) ARRAY JOIN cover AS c
    GROUP BY c_site, c_host, c_file
) AS k ON l.site = k.c_site AND l.origin_host = k.c_host AND l.origin_file = k.c_file
ORDER BY status, collector, listener, listener_site"""

#: ``consumer_progress`` (migration 0007) per partition, classified at the end of the range as the live detectors'
#: watermark does (forumpulse.detectors.traffic.partition_state, with the shipped rules' thresholds: overrides in
#: forumpulse.yaml are not seen here).  tests/test_dashboards.py compares the two on the same rows.
PROGRESS_GAP_S = 600  # detectors/rules/traffic.yaml health.gap_min_minutes (tests check they agree)
PROGRESS_STALE_S = 30  # health.progress_stale_seconds
PROGRESS_SKEW_S = 30  # detectors.traffic.LIVE_CLOCK_SKEW_S: a report carries the consumer's clock
PARTITIONS_SQL = f"""
WITH toUnixTimestamp64Milli(toDateTime64($__toTime, 3)) AS now_ms
SELECT group_id, topic, partition, argMax(instance, updated_at) AS owner,
       multiIf(now_ms - reported_ms > {PROGRESS_GAP_S * 1000}, 'gone',
               lag_messages != 0 AND now_ms - loaded_ms > {PROGRESS_GAP_S * 1000}, 'far behind',
               lag_messages != 0, 'behind',
               NOT argMax(active, updated_at), 'released',
               now_ms - reported_ms > {(PROGRESS_STALE_S + PROGRESS_SKEW_S) * 1000}, 'not reporting',
               'caught up') AS status,
       argMax(lag, updated_at) AS lag_messages,
       toUnixTimestamp64Milli(argMax(loaded_ts, updated_at)) AS loaded_ms,
       toUnixTimestamp64Milli(max(updated_at)) AS reported_ms,
       if(lag_messages != 0 AND loaded_ms > 0, (reported_ms - loaded_ms) / 1000, 0) AS behind_s,
       (now_ms - reported_ms) / 1000 AS report_age_s,
       if(loaded_ms > 0, fromUnixTimestamp64Milli(loaded_ms, 'UTC'), NULL) AS newest_loaded
FROM consumer_progress
GROUP BY group_id, topic, partition
ORDER BY indexOf(['far behind', 'behind', 'not reporting', 'gone', 'caught up', 'released'], status), group_id,
         topic, partition"""


@dataclass(frozen=True)
class PanelSpec:
    """One panel: kind (timeseries | table | stat), title, SQL, width/height, unit, stacking, links."""

    kind: str
    title: str
    sql: str
    w: int = 12
    h: int = 8
    unit: str | None = None
    stacked: bool = False
    description: str = ""
    links: tuple[tuple[str, str], ...] = ()

    @property
    def fmt(self) -> int:
        return FORMAT_TIME_SERIES if self.kind == "timeseries" else FORMAT_TABLE


RATE_NOTE = ("Per second over the whole minutes inside the range: each interval is divided by the seconds it "
             "covers, so a first or last interval cut by the range is not drawn as a drop; the minute under way "
             "is shown once it ends.")

OPS_PANELS: list[PanelSpec] = [
    PanelSpec("timeseries", "Requests per second", f"""
SELECT $__timeInterval(minute) AS time, sum(requests) / {BUCKET_MINUTE_SECONDS} AS requests_per_s
FROM site_minute
WHERE {SITE} AND {WHOLE_MINUTES}
GROUP BY time ORDER BY time""", unit="reqps", description=RATE_NOTE),
    PanelSpec("timeseries", "Bytes per second", f"""
SELECT $__timeInterval(minute) AS time, sum(bytes) / {BUCKET_MINUTE_SECONDS} AS bytes_per_s
FROM site_minute
WHERE {SITE} AND {WHOLE_MINUTES}
GROUP BY time ORDER BY time""", unit="Bps", description=RATE_NOTE),
    PanelSpec("timeseries", "Status mix (requests per interval)", f"""
SELECT $__timeInterval(minute) AS time,
       sum(status_1xx) AS s1xx, sum(status_2xx) AS s2xx, sum(status_3xx) AS s3xx,
       sum(status_4xx) AS s4xx, sum(status_5xx) AS s5xx, sum(status_none) AS no_status
FROM site_minute
WHERE {SITE} AND $__timeFilter(minute)
GROUP BY time ORDER BY time""", stacked=True),
    PanelSpec("timeseries", "Error ratio", f"""
SELECT $__timeInterval(minute) AS time,
       sum(status_4xx) / greatest(sum(requests), 1) AS client_error_ratio,
       sum(status_5xx) / greatest(sum(requests), 1) AS server_error_ratio
FROM site_minute
WHERE {SITE} AND $__timeFilter(minute)
GROUP BY time ORDER BY time""", unit="percentunit"),
    PanelSpec("table", "Top clients", f"""
SELECT multiIf(client_ip = toIPv6('::'), '(hostname clients)',
               startsWith(toString(client_ip), 'fd68:'), concat('(a hostname client: key ', toString(client_ip), ')'),
               replaceRegexpOne(toString(client_ip), '^::ffff:', '')) AS client,
       sum(requests) AS requests_total, sum(bytes) AS bytes_total, sum(status_4xx) AS errors_4xx,
       sum(status_5xx) AS errors_5xx, sum(bot_requests) AS bot_requests_total,
       round(requests_total / greatest(dateDiff('second', $__fromTime, $__toTime), 1), 3) AS avg_rps
FROM client_minute
WHERE {SITE} AND $__timeFilter(minute)
GROUP BY client_ip ORDER BY requests_total DESC, client LIMIT 25"""),
    PanelSpec("table", "Top prefixes", f"""
SELECT concat(replaceRegexpOne(toString(prefix), '^::ffff:', ''), '/', toString(prefix_len)) AS network,
       sum(requests) AS requests_total, uniqMerge(clients) AS distinct_clients
FROM ({rollup_rows("prefix", "prefix, prefix_len, requests, clients", bucketed=False)})
GROUP BY prefix, prefix_len ORDER BY requests_total DESC, network LIMIT 25"""),
    PanelSpec("table", "Active bans (at end of range)", f"""
SELECT value, scope, reason, mode, origin, decided_at, expires_at,
       dateDiff('second', $__toTime, expires_at) AS remaining_s
FROM decisions
WHERE {SITE} AND action = 'ban' AND decided_at <= $__toTime AND expires_at > $__toTime
ORDER BY decided_at DESC, value LIMIT 100"""),
    PanelSpec("table", "Recent decisions", f"""
SELECT decided_at, action, value, scope, reason, duration_s, mode, origin,
       id GLOBAL IN (SELECT id FROM decisions_published) AS kafka_confirmed
FROM decisions
WHERE {SITE} AND $__timeFilter(decided_at)
ORDER BY decided_at DESC, value LIMIT 50""", description=(
        "kafka_confirmed: the decisions topic (weblogs.decisions) confirmed it, so firewall hosts reading the topic "
        "have it; false while the broker is away (the next owner start sends what it never confirmed), and always "
        "when decisions are not published to Kafka.")),
    PanelSpec("timeseries", "Quarantined lines per second", f"""
SELECT $__timeInterval(ingested_at) AS time, reason, count() / {BUCKET_RANGE_SECONDS} AS lines_per_s
FROM quarantine
WHERE {SITE} AND $__timeFilter(ingested_at)
GROUP BY time, reason ORDER BY time, reason""", stacked=True, description=(
        "Per second: an interval cut by the range (its start, or now) is divided by the seconds inside it.")),
    PanelSpec("timeseries", "Pipeline lag (messages)", """
SELECT $__timeInterval(ts) AS time, concat(component, '/', instance) AS consumer, max(lag) AS lag
FROM pipeline_stats
WHERE $__timeFilter(ts)
GROUP BY time, consumer ORDER BY time, consumer"""),
    PanelSpec("timeseries", "Freshness (seconds behind the log)", """
SELECT $__timeInterval(ts) AS time, concat(component, '/', instance) AS consumer, max(freshness_s) AS freshness_s
FROM pipeline_stats
WHERE $__timeFilter(ts)
GROUP BY time, consumer ORDER BY time, consumer""", unit="s"),
    PanelSpec("table", "Source liveness", SOURCE_LIVENESS_SQL, w=24, description=(
        "live: a line within 300 s; silent: no recent line, but a heartbeat of the source or its host within "
        "180 s (up and idle); stuck: the same heartbeats, but they say its file kept growing in the last 10 min "
        "(same inode, larger size, in two minutes, from 2 min after its last line): written, not shipped -- a "
        "broken tail; quiet: a network sender without heartbeats of its own, idle or gone, while the "
        "listener receiving it heartbeats; dead: none of these; retired: retired by ops (forumpulse sources "
        "retire) and silent since. Same states as GET /fp/sources at the end of "
        "the range; listener and host heartbeat rows are not sources (see Collector listeners).")),
    PanelSpec("table", "Collector listeners", LISTENERS_SQL, description=(
        "Network listeners of the collectors (heartbeats with origin_file tcp:5140, syslog:5514...) for this "
        "site or every site (*): up = a heartbeat within 180 s; sources = senders without heartbeats of their "
        "own it covers (all sites). Same as GET /fp/listeners at the end of the range.")),
    PanelSpec("table", "Kafka partitions: loading", PARTITIONS_SQL, description=(
        "Each consumer's last report per partition (every 10 s): lag_messages = messages waiting (-1 unknown), behind_s = "
        "the newest message stored was produced that long before the report; the live detectors wait for a "
        "partition behind (also when its consumer exited cleanly behind, until the next owner reports) or not "
        "reporting (30 s, plus 30 s for clock skew) for up to 10 minutes. far behind / gone (no report for 10 "
        "minutes) are not waited for; released = its consumer exited cleanly, caught up. State at the end of the "
        "range.")),
    PanelSpec("timeseries", "Response time percentiles", f"""
SELECT time, q[1] AS p50_ms, q[2] AS p95_ms, q[3] AS p99_ms
FROM (
    SELECT $__timeInterval(minute) AS time, quantilesTDigestMerge(0.5, 0.95, 0.99)(elapsed_q) AS q
    FROM transfer_minute
    WHERE {SITE} AND $__timeFilter(minute)
    GROUP BY time
)
ORDER BY time""", unit="ms"),
    PanelSpec("timeseries", "Transfer rate percentiles (responses >= 100 kB)", f"""
SELECT time, q[1] AS p05_Bps, q[2] AS p50_Bps, q[3] AS p95_Bps
FROM (
    SELECT $__timeInterval(minute) AS time, quantilesTDigestMerge(0.05, 0.5, 0.95)(rate_q) AS q
    FROM transfer_minute
    WHERE {SITE} AND $__timeFilter(minute) AND size_class != 'lt100k'
    GROUP BY time
)
ORDER BY time""", unit="Bps"),
]

TOPIC_LINK = (
    "/d/forumpulse-topics/forum-topics?var-site=${site}&var-metric=${metric}&var-topic=${__data.fields.topic_id}"
    "&${__url_time_range}"
)
EVENT_LINK = (
    "/d/forumpulse-topics/forum-topics?var-site=${site}&var-topic=${__data.fields.topic_id}"
    "&from=${__data.fields.link_from_ms}&to=${__data.fields.link_to_ms}"
)

TOPIC_PANELS: list[PanelSpec] = [
    PanelSpec("timeseries", "Top topics: $metric (stacked)", f"""
SELECT s.time AS time, {TOPIC_LABEL} AS topic, s.value AS value
FROM (
    SELECT $__timeInterval(t) AS time, topic_id, {metric_expr()} AS value
    FROM ({topic_rows(f"topic_id IN ({TOP_TOPICS})")})
    GROUP BY time, topic_id
) AS s
LEFT JOIN ({TITLES}) AS t ON s.topic_id = t.topic_id
ORDER BY time, topic""", stacked=True),
    PanelSpec("timeseries", "Top topics: share of forum $metric (%)", f"""
SELECT s.time AS time, {TOPIC_LABEL} AS topic, round(100 * s.value / d.total, 4) AS share_pct
FROM (
    SELECT $__timeInterval(t) AS time, topic_id, {metric_expr()} AS value
    FROM ({topic_rows(f"topic_id IN ({TOP_TOPICS})")})
    GROUP BY time, topic_id
) AS s
INNER JOIN ({SITE_TOTALS}) AS d ON s.time = d.time
LEFT JOIN ({TITLES}) AS t ON s.topic_id = t.topic_id
WHERE d.total > 0
ORDER BY time, topic""", unit="percent", stacked=True),
    PanelSpec("timeseries", "Topic groups: $metric (stacked)", f"""
SELECT $__timeInterval(tm.t) AS time, g.group_name AS topic_group, {metric_expr('tm.')} AS value
FROM ({topic_rows()}) AS tm
INNER JOIN ({GROUPS}) AS g ON tm.topic_id = g.topic_id
GROUP BY time, topic_group ORDER BY time, topic_group""", stacked=True),
    PanelSpec("timeseries", "Topic groups: share of forum $metric (%)", f"""
SELECT s.time AS time, s.topic_group AS topic_group, round(100 * s.value / d.total, 4) AS share_pct
FROM (
    SELECT $__timeInterval(tm.t) AS time, g.group_name AS topic_group, {metric_expr('tm.')} AS value
    FROM ({topic_rows()}) AS tm
    INNER JOIN ({GROUPS}) AS g ON tm.topic_id = g.topic_id
    GROUP BY time, topic_group
) AS s
INNER JOIN ({SITE_TOTALS}) AS d ON s.time = d.time
WHERE d.total > 0
ORDER BY time, topic_group""", unit="percent", stacked=True),
    PanelSpec("table", "Top topics", f"""
SELECT p.topic_id AS topic_id, t.title AS title, t.forum AS forum, p.views AS views, p.replies AS replies,
       v.visitors AS visitors, p.bot_views AS bot_views,
       round(100 * p.views / greatest(d.total_views, 1), 2) AS views_share_pct,
       k.peak_minute AS peak_minute, k.peak_views AS peak_views
FROM (
    SELECT topic_id, sum(views) AS views, sum(replies) AS replies, sum(bot_views) AS bot_views
    FROM ({topic_rows(bucketed=False)})
    GROUP BY topic_id ORDER BY views DESC, topic_id LIMIT 25
) AS p
LEFT JOIN (
    SELECT topic_id, uniqMerge(visitors) AS visitors
    FROM ({topic_rows(f"topic_id IN ({TOP_TABLE_TOPICS})", bucketed=False)})
    GROUP BY topic_id
) AS v ON p.topic_id = v.topic_id
LEFT JOIN (
    SELECT topic_id, argMax(minute, (mv, -toUnixTimestamp(minute))) AS peak_minute, max(mv) AS peak_views
    FROM (
        SELECT topic_id, minute, sum(views) AS mv
        FROM topic_minute
        WHERE {SITE} AND $__timeFilter(minute) AND topic_id IN ({TOP_TABLE_TOPICS})
        GROUP BY topic_id, minute
    )
    GROUP BY topic_id
) AS k ON p.topic_id = k.topic_id
LEFT JOIN ({TITLES}) AS t ON p.topic_id = t.topic_id
CROSS JOIN (SELECT sum(topic_views) AS total_views FROM site_minute WHERE {SITE} AND $__timeFilter(minute)) AS d
ORDER BY views DESC, topic_id LIMIT 25""", w=24, links=(("Open topic", TOPIC_LINK),)),
    PanelSpec("timeseries", "Selected topic: activity", f"""
SELECT $__timeInterval(t) AS time, sum(views) AS views, sum(replies) AS replies,
       uniqMerge(visitors) AS visitors, sum(bot_views) AS bot_views
FROM ({topic_rows(f"topic_id = {TOPIC}")})
GROUP BY time ORDER BY time"""),
    PanelSpec("timeseries", "Selected topic: share of forum traffic (%)", f"""
SELECT s.time AS time,
       round(100 * s.views / greatest(d.views, 1), 4) AS views_share_pct,
       round(100 * s.replies / greatest(d.replies, 1), 4) AS replies_share_pct,
       round(100 * s.visitors / greatest(d.visitors, 1), 4) AS visitors_share_pct
FROM (
    SELECT $__timeInterval(t) AS time, sum(views) AS views, sum(replies) AS replies,
           uniqMerge(visitors) AS visitors
    FROM ({topic_rows(f"topic_id = {TOPIC}")})
    GROUP BY time
) AS s
INNER JOIN (
    SELECT $__timeInterval(minute) AS time, sum(topic_views) AS views, sum(replies) AS replies,
           uniqMerge(visitors) AS visitors
    FROM site_minute
    WHERE {SITE} AND $__timeFilter(minute)
    GROUP BY time
) AS d ON s.time = d.time
ORDER BY time""", unit="percent"),
    PanelSpec("timeseries", "Humans vs bots (requests per interval)", f"""
SELECT $__timeInterval(minute) AS time, sum(requests) - sum(bot_requests) AS human_requests,
       sum(bot_requests) AS bot_requests_n, sum(pageviews) AS human_pageviews
FROM site_minute
WHERE {SITE} AND $__timeFilter(minute)
GROUP BY time ORDER BY time"""),
    PanelSpec("table", "Detected events", f"""
SELECT id, kind, scope, label, state, start_ts, end_ts, peak_ts, round(observed, 4) AS observed,
       round(expected, 4) AS expected, round(score, 2) AS score,
       toUInt64OrZero(extract(scope, '^topic:([0-9]+)')) AS topic_id,
       toUnixTimestamp64Milli(start_ts) - 3600000 AS link_from_ms,
       toUnixTimestamp64Milli(coalesce(end_ts, now64(3))) + 3600000 AS link_to_ms
FROM detections FINAL
WHERE {SITE} AND start_ts <= $__toTime AND (end_ts IS NULL OR end_ts >= $__fromTime)
ORDER BY start_ts DESC, id LIMIT 100""", w=24, links=(("Open topic at event time", EVENT_LINK),)),
]

#: Detections drawn on every time panel of both dashboards (columns the plugin maps: time, timeEnd, text, tags).
ANNOTATION_SQL = f"""
SELECT toDateTime(start_ts) AS time, toDateTime(coalesce(end_ts, least(now64(3), $__toTime))) AS timeEnd,
       concat(kind, ' ', scope, ': ', label, ' (score ', toString(round(score, 2)), ')') AS text,
       [toString(kind), toString(label)] AS tags
FROM detections FINAL
WHERE {SITE} AND start_ts <= $__toTime AND (end_ts IS NULL OR end_ts >= $__fromTime)
ORDER BY time"""

SITE_VARIABLE_SQL = "SELECT DISTINCT site FROM site_minute ORDER BY site"
GROUP_VARIABLE_SQL = f"SELECT DISTINCT group_name FROM topic_groups FINAL WHERE {SITE} ORDER BY group_name"
TOPIC_VARIABLE_SQL = (
    "SELECT topic_id, concat('#', toString(topic_id), ' ', argMax(title, updated_at)) AS label "
    f"FROM topic_titles WHERE {SITE} GROUP BY topic_id ORDER BY topic_id"
)
METRICS = ("views", "replies", "visitors")


def all_specs() -> dict[str, list[PanelSpec]]:
    return {"forumpulse-ops": OPS_PANELS, "forumpulse-topics": TOPIC_PANELS}


def sql_variables() -> dict[str, str]:
    """Variable name -> its query SQL (query variables run through the plugin like panels)."""
    return {"site": SITE_VARIABLE_SQL, "group": GROUP_VARIABLE_SQL, "topic": TOPIC_VARIABLE_SQL}


def annotation_json(uid: str = DATASOURCE_UID) -> dict[str, Any]:
    return {
        "name": "Detections",
        "datasource": {"type": DATASOURCE_TYPE, "uid": uid},
        "enable": True,
        "hide": False,
        "iconColor": "rgba(255, 96, 96, 1)",
        "target": ClickHouseDataquery(ANNOTATION_SQL.strip(), FORMAT_TABLE, "Anno", uid).to_json(),
    }
