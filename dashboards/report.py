"""Editorial reports: one self-contained HTML page (inline CSS, charts as base64 PNG, no network fetches) plus the
PNG charts, for a topic, a topic group or a detected event; and a daily overview.

Public API:

* :func:`generate_event_report` ``(store, *, topic_id=None, group=None, event_id=None, time_from=None,
  time_to=None, out_dir, site="forum", baseline_days=7, own_hosts=(), tz="UTC") -> Path`` — exactly one of
  topic_id / group / event_id; times shown in the zone ``tz`` (the site's).
  With ``event_id`` the scope and range come from ``detections`` (latest state, FINAL); the range is padded by a
  quarter of the event's duration (at least one hour) on both sides.  Without a range the last 48 hours of data
  are used.  The range is widened to whole chart intervals; a last interval the site's data ends inside (an
  open event, a range ending now) is counted in the totals but not drawn, and the page and charts say so.  Writes ``index.html``, ``views_replies.png``, ``share.png``, ``visitors.png``,
  ``humans_bots.png`` into ``out_dir`` and returns the HTML path.  The detector may call it for topic surges.
* :func:`generate_daily_report` ``(store, day, out_dir, site="forum", tz="UTC") -> Path`` — the day's detections
  and top topics, ``day`` and the times shown in the zone ``tz``.
* :func:`report_event_command`, :func:`report_daily_command` — Typer-compatible command functions
  (``forumpulse report event|daily``); the integrator registers them on the CLI app.

What is in an event report: views and replies over time (absolute), their share of all topic views / replies
(the rest of the forum is "all other topics"), unique visitors (human), peak time and peak share, a baseline
comparison (the scope's share and hourly views over the ``baseline_days`` before the range, less the minutes of
the scope's own earlier surges stored in ``detections``, which the summary names; views per hour, in the range
and the baseline alike, are over the wall time from the site's first to its last minute of data), top
referrer
domains (referrers are privacy-scrubbed at ingest), humans vs bots, and a plain-language summary.  Everything is
read from ClickHouse: the rollups for series, ``requests`` only for referrers.

Guarantees: all numbers shown are computed by the SQL in this module (no sampling); times (text and chart axes)
are in the site's time zone with its UTC offset written next to them (``UTC+08:00``; ``tz``, UTC by default);
the page
references no external resource (no ``http(s)://`` in ``src``/``href`` attributes).  Misuse: a scope without
data in the range raises :class:`ReportError` instead of writing an empty page.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, tzinfo
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import typer
from forumpulse.pipeline.store import Store, open_store

__all__ = [
    "ReportError",
    "generate_daily_report",
    "generate_event_report",
    "report_daily_command",
    "report_event_command",
]


class ReportError(ValueError):
    """The report cannot be produced (unknown event, no data, bad arguments)."""


def _q(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ts(t: datetime) -> str:
    return f"toDateTime({int(t.timestamp())})"


def _utc(v: Any) -> datetime:
    if isinstance(v, int | float):
        return datetime.fromtimestamp(v, UTC)
    if isinstance(v, datetime):
        return v if v.tzinfo else v.replace(tzinfo=UTC)
    raise TypeError(f"not a time: {v!r}")


@dataclass
class Scope:
    kind: str  # topic | group
    topic_id: int | None
    group: str | None
    label: str
    topic_filter: str  # SQL predicate on topic_minute / requests topic_id

    @property
    def detection_scope(self) -> str:
        """The ``scope`` of this topic's or group's ``topic_surge`` detections."""
        return f"topic:{self.topic_id}" if self.kind == "topic" else f"group:{self.group}"


def _scope(store: Store, site: str, topic_id: int | None, group: str | None) -> Scope:
    if topic_id is not None:
        rows = store.query_rows(
            f"SELECT argMax(title, updated_at) FROM topic_titles WHERE site = {_q(site)} AND topic_id = {int(topic_id)}"
        )
        title = rows[0][0] if rows and rows[0][0] else ""
        label = f"Topic #{topic_id}" + (f" “{title}”" if title else "")
        return Scope("topic", int(topic_id), None, label, f"topic_id = {int(topic_id)}")
    assert group is not None
    members = [r[0] for r in store.query_rows(
        f"SELECT topic_id FROM topic_groups FINAL WHERE site = {_q(site)} AND group_name = {_q(group)} ORDER BY topic_id")]
    if not members:
        import difflib

        have = [str(r[0]) for r in store.query_rows(
            f"SELECT DISTINCT group_name FROM topic_groups FINAL WHERE site = {_q(site)} ORDER BY group_name")]
        near = difflib.get_close_matches(group, have, n=1)
        raise ReportError(f"topic group {group!r} has no topics in topic_groups for site {site!r}"
                          + (f" -- did you mean {near[0]!r}?" if near else "")
                          + f" (groups: {', '.join(have) or 'none'}; topics.groups in the configuration, loaded by `forumpulse db load-titles`)")
    return Scope("group", None, group, f"Topic group “{group}” ({len(members)} topics)",
                 f"topic_id IN ({', '.join(str(int(t)) for t in members)})")


#: a topic surge's lead measure (``detail.measure``) as the report names it.  The visitors measure counts
#: visitor-minutes (a visitor once per minute active), not the unique visitors the page's figures show: the page
#: called its 54.8% a share "of topic visitors" next to a 36.5% share of unique visitors (user trial 40)
_MEASURE_WORD = {"views": "views", "replies": "replies",
                 "visitors": "visitor-minutes (each visitor counted once per minute active)"}


def _event(store: Store, site: str, event_id: str) -> tuple[int | None, str | None, datetime, datetime, dict[str, Any]]:
    rows = store.query_rows(
        "SELECT scope, start_ts, end_ts, kind, label, score, observed, expected, peak_ts, detail "
        f"FROM detections FINAL WHERE site = {_q(site)} AND id = {_q(event_id)}"
    )
    if not rows:
        raise ReportError(f"no detection with id {event_id!r} for site {site!r}")
    scope, start, end, kind, label, score, observed, expected, peak, detail = rows[0]
    try:
        measure = str(json.loads(detail or "{}").get("measure", "views"))
    except (ValueError, AttributeError):
        measure = "views"
    still_open = end is None
    if still_open:  # an event still going on: the report runs to the end of the data, not to its peak
        last = store.query_rows(f"SELECT maxOrNull(minute) FROM site_minute WHERE site = {_q(site)}")
        end = _utc(last[0][0]) + timedelta(minutes=1) if last and last[0][0] is not None else peak
    start, end = _utc(start), _utc(end)
    pad = max(timedelta(hours=1), (end - start) / 4)
    meta = {"id": event_id, "kind": kind, "label": label, "score": score, "observed": observed,
            "expected": expected, "peak": _utc(peak), "start": start, "end": end, "open": still_open,
            "measure": measure}
    if still_open:
        return (*_event_scope(scope, event_id), start - max(timedelta(hours=1), (end - start) / 4), end, meta)
    return (*_event_scope(scope, event_id), start - pad, end + pad, meta)


def _event_scope(scope: str, event_id: str) -> tuple[int | None, str | None]:
    if scope.startswith("topic:"):
        return int(scope.split(":", 1)[1]), None
    if scope.startswith("group:"):
        return None, scope.split(":", 1)[1]
    raise ReportError(f"detection {event_id!r} has scope {scope!r}; event reports need topic:<id> or group:<name>")


def _bucket_seconds(span: timedelta) -> int:
    # at most ~300 points per chart, whole minutes, rounded up to a "nice" width
    raw = span.total_seconds() / 300
    for b in (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400):
        if b >= raw:
            return b
    return 86400


def _interval_name(b: int) -> str:
    """A chart interval as an editor says it: minute, 10 minutes, hour, 3 hours, day."""
    if b % 86400 == 0:
        return "day" if b == 86400 else f"{b // 86400} days"
    if b % 3600 == 0:
        return "hour" if b == 3600 else f"{b // 3600} hours"
    return "minute" if b == 60 else f"{b // 60} minutes"


def _per(b: int) -> str:
    return f"per {_interval_name(b)}"


def _count(n: int, word: str, plural: str | None = None) -> str:
    """``1 view``, ``46 views``; ``plural`` when it is not ``word + "s"`` (reply/replies, person/people)."""
    return f"{n:,} " + (word if n == 1 else plural or word + "s")


def _pct(x: float) -> str:
    """A share that stays readable when small: 12.3%, 0.4%, 0.012% (not 0.0%), 0%."""
    if x == 0:
        return "0%"
    if x < 0.001:
        return "<0.001%"
    if 99.9 < x < 100:
        return "99.9%"  # not "100.0%" for a topic that is not the only one
    return f"{x:.1f}%" if x >= 0.1 else f"{x:.2g}%"


def _ratio(x: float) -> str:
    """0.2, 1.5, 28.7, 150 (not "0" or "1" for ratios under 1.5)."""
    return f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def _one(b: int) -> str:
    """``one minute``, ``one hour``, ``10 minutes``, ``3 hours``: an interval after "in"."""
    name = _interval_name(b)
    return name if name[0].isdigit() else f"one {name}"


@dataclass
class EventData:
    times: list[datetime]
    views: list[float]
    replies: list[float]
    visitors: list[float]
    bot_views: list[float]
    site_views: list[float]
    site_replies: list[float]
    bucket_s: int
    total_views: int
    total_replies: int
    total_visitors: int
    total_bot_views: int
    site_total_views: int
    site_total_replies: int
    base_share: float | None
    base_views_per_hour: float | None
    referrers: list[tuple[str, int]]
    data_hours: float  # wall time from the site's first to its last minute of data in the range (views per hour)
    t0: datetime  # the range, aligned to bucket boundaries (what the charts and totals cover)
    t1: datetime
    cut_from: datetime | None = None  # start of a trailing interval left out of the charts (data ends inside it)
    cut_minutes: int = 0  # minutes of data in that interval (counted in the totals)
    head_to: datetime | None = None  # end of a leading interval left out of the charts (data begins inside it)
    head_minutes: int = 0
    concentrated: tuple[str, int, int] | None = None  # (block, its views, views with an address) when one dominates
    base_left_out: list[tuple[datetime, datetime]] = field(default_factory=list)  # earlier surges not in the baseline
    concentrated_site: int = 0  # that block's human topic views of the whole forum in the range


def _align(t: datetime, b: int, up: bool, off: int = 0) -> datetime:
    """``t`` on a boundary of ``b``-second buckets of the clock ``off`` seconds ahead of UTC (as :func:`_bucket_sql`
    groups them), rounded down or up."""
    s = int(t.timestamp()) + off
    s = (s + (b - 1 if up else 0)) // b * b
    return datetime.fromtimestamp(s - off, UTC)


def _bucket_sql(b: int, off: int) -> str:
    """The start of a row's ``b``-second bucket on the clock ``off`` seconds ahead of UTC: a day runs from the
    site's midnight, an hour from its hour (India's too), not from UTC's."""
    if off == 0:
        return f"toStartOfInterval(minute, INTERVAL {b} second)"
    return f"addSeconds(toStartOfInterval(addSeconds(minute, {off}), INTERVAL {b} second), {-off})"


def _zone_offset(t: datetime) -> int:
    """The report zone's UTC offset at ``t``, in seconds (the buckets of a range keep the offset at its start: a
    DST change inside the range moves the later buckets' boundaries by the change, as a fixed clock would)."""
    off = t.astimezone(_ZONE.get()).utcoffset()
    return int(off.total_seconds()) if off is not None else 0


def _data_span_hours(store: Store, site_f: str, rng: str) -> float | None:
    """Wall time from the site's first to its last minute with data in ``rng`` (both included), in hours; None
    without data.  The range's and the baseline's views per hour both divide by this: minutes without any
    request (a sparse site) are not rows, so a count of minutes would overstate the rate."""
    first, last = store.query_rows(f"SELECT minOrNull(minute), maxOrNull(minute) FROM site_minute "
                                   f"WHERE {site_f} AND {rng}")[0]
    if first is None or last is None:
        return None
    return (_utc(last) - _utc(first)).total_seconds() / 3600 + 1 / 60


#: an address block (IPv4 /24, IPv6 /64) behind this share of a scope's human topic views, and at least
#: CONCENTRATED_MIN_VIEWS of them, is named in the report: a flood, a scraper with a browser's user agent or a
#: crawler logged without one counts as human (the rollups leave out known bots only)
CONCENTRATED_SHARE = 0.25
CONCENTRATED_MIN_VIEWS = 50
#: the block of a stored client address (IPv4 is stored IPv4-mapped: its /24 is the IPv6 /120).  With
#: privacy.client_ip truncate the stored address is already its truncated prefix (an IPv4 /16 is labelled as its
#: first /24, an IPv6 /48 as its first /64); with pseudonymize, a pseudonymised /24 shares one fd04::/64
_BLOCK = ("if(startsWith(toString(client_ip), '::ffff:'), "
          "concat(replaceRegexpOne(toString(IPv6CIDRToRange(client_ip, 120).1), '^::ffff:', ''), '/24'), "
          "concat(toString(IPv6CIDRToRange(client_ip, 64).1), '/64'))")


def _concentrated(store: Store, where: str, by_topic: bool = False) -> dict[int, tuple[str, int, int]]:
    """Per topic (``0`` for the whole scope unless ``by_topic``): the address block behind the most human topic
    views of ``requests`` rows matching ``where``, with its views and the views with a stored address (the share
    is of those: hostname clients and unresolvable ``::`` are left out, and raw rows past their retention are
    gone), when it passes the :data:`CONCENTRATED_SHARE` / :data:`CONCENTRATED_MIN_VIEWS` bar."""
    key = "topic_id" if by_topic else "0"
    rows = store.query_rows(f"""
        SELECT k, argMax(block, n), max(n), sum(n) FROM (
            SELECT {key} AS k, {_BLOCK} AS block, count() AS n FROM requests
            WHERE {where} AND NOT is_bot AND page_kind = 'topic_view' AND client_host = ''
              AND client_ip != toIPv6('::')
            GROUP BY k, block)
        GROUP BY k""")
    return {int(k): (str(b), int(n), int(tot)) for k, b, n, tot in rows
            if n >= CONCENTRATED_MIN_VIEWS and n >= CONCENTRATED_SHARE * tot}


def _collect(store: Store, site: str, sc: Scope, t0: datetime, t1: datetime, baseline_days: int,
             own_hosts: Sequence[str] = ()) -> EventData:
    """The report's numbers for [t0, t1), widened to whole chart intervals (``bucket_s``): every interval drawn
    is a whole one.  A trailing interval the site's data ends inside (an open event, a range ending now) is
    counted in the totals but left out of the charts (``cut_from``): drawn as a whole interval it would show a
    drop that did not happen."""
    b = _bucket_seconds(t1 - t0)
    off = _zone_offset(t0) if b > 60 else 0
    t0, t1 = _align(t0, b, up=False, off=off), _align(t1, b, up=True, off=off)
    bucket = _bucket_sql(b, off)
    rng = f"minute >= {_ts(t0)} AND minute < {_ts(t1)}"
    site_f = f"site = {_q(site)}"
    # every interval in which the site has data; the scope's figures are 0 where it had none (a chart line must
    # not bridge a quiet stretch); intervals without site data (no data) stay out
    rows = store.query_rows(f"""
        SELECT d.time, s.views, s.replies, s.visitors, s.bot_views, d.views, d.replies FROM (
            SELECT {bucket} AS time, sum(topic_views) AS views,
                   sum(replies) AS replies
            FROM site_minute WHERE {site_f} AND {rng} GROUP BY time) AS d
        LEFT JOIN (
            SELECT {bucket} AS time, sum(views) AS views,
                   sum(replies) AS replies, uniqMerge(visitors) AS visitors, sum(bot_views) AS bot_views
            FROM topic_minute WHERE {site_f} AND {sc.topic_filter} AND {rng} GROUP BY time) AS s ON s.time = d.time
        ORDER BY d.time SETTINGS join_use_nulls = 0""")
    tot = store.query_rows(f"""
        SELECT sum(views), sum(replies), uniqMerge(visitors), sum(bot_views)
        FROM topic_minute WHERE {site_f} AND {sc.topic_filter} AND {rng}""")[0]
    if not rows or not any(tot[i] for i in (0, 1, 3)):
        (ever,), = store.query_rows(f"SELECT count() FROM topic_minute WHERE {site_f} AND {sc.topic_filter}")
        if not ever:
            raise ReportError(f"{sc.label} has no traffic at all on site {site!r}: is the "
                              + ("id" if sc.kind == "topic" else "group") + " right?")
        raise ReportError(f"no traffic for {sc.label} between {_fmt_t(t0)} and {_fmt_t(t1)}")
    site_tot = store.query_rows(f"SELECT sum(topic_views), sum(replies) FROM site_minute WHERE {site_f} AND {rng}")[0]
    b0 = t0 - timedelta(days=baseline_days)
    brng = f"minute >= {_ts(b0)} AND minute < {_ts(t0)}"
    # the scope's own earlier surges (detected, in `detections`) are not its usual level: their minutes (from the
    # start of the window that opened each) stay out of the baseline, as the surge detector keeps them out of its own
    one = timedelta(minutes=1)
    spans: list[tuple[datetime, datetime]] = []  # minutes left out, merged (re-runs can store overlapping ones)
    shown: list[tuple[datetime, datetime]] = []  # the detections' own start and end, for the summary
    for a, st, e in store.query_rows(f"""
            SELECT start_ts - toIntervalMinute(JSONExtractUInt(detail, 'window_minutes')), start_ts, end_ts
            FROM detections FINAL WHERE {site_f} AND kind = 'topic_surge' AND scope = {_q(sc.detection_scope)}
              AND start_ts < {_ts(t0)} AND (end_ts IS NULL OR end_ts >= {_ts(b0)}) ORDER BY start_ts"""):
        lo, hi = max(_utc(a), b0), min(_utc(e) if e is not None else t0, t0 - one)
        if lo > hi:
            continue
        shown.append((max(_utc(st), b0), min(_utc(e) if e is not None else t0, t0)))
        if spans and lo <= spans[-1][1] + one:
            spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
        else:
            spans.append((lo, hi))
    full = brng
    for a, e in spans:
        brng += f" AND NOT (minute >= {_ts(a)} AND minute <= {_ts(e)})"
    bv = store.query_rows(f"SELECT sum(views), count() FROM topic_minute WHERE {site_f} AND {sc.topic_filter} AND {brng}")[0]
    bs = store.query_rows(f"SELECT sum(topic_views) FROM site_minute WHERE {site_f} AND {brng}")[0]
    base_share = base_vph = None
    if bs[0]:
        base_share = 100.0 * (bv[0] or 0) / bs[0]
        # wall time of the baseline's data less the left-out minutes inside it (each counted once)
        first, last = store.query_rows(f"SELECT minOrNull(minute), maxOrNull(minute) FROM site_minute "
                                       f"WHERE {site_f} AND {full}")[0]
        hours = 1 / 60
        if first is not None and last is not None:
            first, last = _utc(first), _utc(last)
            gone = sum((max(timedelta(0), min(e, last) - max(a, first) + one) for a, e in spans), timedelta(0))
            hours = max((last - first + one - gone).total_seconds() / 3600, 1 / 60)
        base_vph = (bv[0] or 0) / hours
    left_out = shown
    # external referrers: not the site's own host names (sites[].hosts) nor the request's virtual host (a click
    # from one forum page to another is navigation, not an arrival); counted in human topic views
    own = ", ".join(_q(h.lower().removeprefix("www.")) for h in own_hosts) or "''"
    refs = store.query_rows(f"""
        SELECT domain(referer) AS d, count() AS n FROM requests
        WHERE {site_f} AND {sc.topic_filter} AND ts >= {_ts(t0)} AND ts < {_ts(t1)} AND NOT is_bot AND referer != ''
          AND page_kind = 'topic_view' AND lower(domainWithoutWWW(referer)) NOT IN ({own})
          AND lower(domainWithoutWWW(referer)) != lower(replaceRegexpOne(vhost, '^www\\.', ''))
        GROUP BY d HAVING d != '' ORDER BY n DESC, d LIMIT 10""")
    conc = _concentrated(store, f"{site_f} AND {sc.topic_filter} AND ts >= {_ts(t0)} AND ts < {_ts(t1)}").get(0)
    conc_site = 0  # that block's human topic views of the whole forum in the range (for the share without it)
    if conc is not None:
        conc_site = int(store.query_rows(f"""
            SELECT count() FROM requests WHERE {site_f} AND ts >= {_ts(t0)} AND ts < {_ts(t1)} AND NOT is_bot
              AND page_kind = 'topic_view' AND client_host = '' AND client_ip != toIPv6('::')
              AND {_BLOCK} = {_q(conc[0])}""")[0][0])
    (data_start, data_end), = store.query_rows(
        f"SELECT minOrNull(minute), maxOrNull(minute) FROM site_minute WHERE {site_f}")
    head_to, head_minutes = None, 0
    if data_start is not None and len(rows) > 2 and _utc(data_start) > _utc(rows[0][0]):
        # the site's data begins inside the first interval: drawn whole, it would look like a ramp-up
        head_to, rows = _utc(rows[0][0]) + timedelta(seconds=b), rows[1:]
        head_minutes = store.query_rows(f"SELECT count(DISTINCT minute) FROM site_minute WHERE {site_f} "
                                        f"AND minute >= {_ts(t0)} AND minute < {_ts(head_to)}")[0][0]
    cut_from, cut_minutes = None, 0
    if data_end is not None and len(rows) > 1:
        end = _utc(data_end) + timedelta(minutes=1)  # the site's data (any range) ends here
        last = _utc(rows[-1][0])
        if last + timedelta(seconds=b) > end:
            cut_from, rows = last, rows[:-1]
            cut_minutes = store.query_rows(f"SELECT count(DISTINCT minute) FROM site_minute WHERE {site_f} "
                                           f"AND minute >= {_ts(last)} AND minute < {_ts(t1)}")[0][0]
    return EventData(
        times=[_utc(r[0]) for r in rows], views=[float(r[1]) for r in rows], replies=[float(r[2]) for r in rows],
        visitors=[float(r[3]) for r in rows], bot_views=[float(r[4]) for r in rows],
        site_views=[float(r[5]) for r in rows], site_replies=[float(r[6]) for r in rows], bucket_s=b,
        total_views=int(tot[0] or 0), total_replies=int(tot[1] or 0), total_visitors=int(tot[2] or 0),
        total_bot_views=int(tot[3] or 0), site_total_views=int(site_tot[0] or 0),
        site_total_replies=int(site_tot[1] or 0), base_share=base_share, base_views_per_hour=base_vph,
        referrers=[(str(r[0]), int(r[1])) for r in refs], data_hours=_data_span_hours(store, site_f, rng) or 0.0,
        t0=t0, t1=t1, cut_from=cut_from, cut_minutes=int(cut_minutes), head_to=head_to,
        head_minutes=int(head_minutes), concentrated=conc, concentrated_site=conc_site, base_left_out=left_out,
    )


# ----------------------------------------------------------------------------------------------- charts


def _fig() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.6, 3.6), dpi=100)
    ax.grid(True, alpha=0.3)
    return plt, fig, ax


def _save(plt: Any, fig: Any, path: Path) -> bytes:
    import matplotlib.dates as mdates

    zone = _ZONE.get()
    for ax in fig.axes:  # ticks placed on the zone's hours (midnight, 06:00...), not UTC's, and written in it
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(tz=zone))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%d %b\n%H:%M", tz=zone))
        # the PNGs are forwarded on their own: say which clock
        ax.set_xlabel("UTC" if zone is UTC else f"{zone} time")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    data = buf.getvalue()
    path.write_bytes(data)
    return data


def _plain(text: str) -> str:
    """Text for matplotlib shown as written: '$' would start math markup (a topic title like "Bitcoin at $100k"
    was mangled, and an unbalanced one raised)."""
    return text.replace("\\", "\\\\").replace("$", "\\$")


def _share(a: list[float], b: list[float]) -> list[float]:
    return [100.0 * x / y if y else 0.0 for x, y in zip(a, b, strict=True)]


def _cut_text(d: EventData) -> str:
    """The note on a leading or trailing interval left out of the charts ('' when none)."""
    out = []
    if d.head_to is not None:
        out.append(f"The interval before {_fmt_t(d.head_to)} is not drawn: the data begins inside it "
                   f"({d.head_minutes} of {d.bucket_s // 60} minutes), and drawn as a whole interval it would look "
                   "like a rise. Its traffic is counted in the totals.")
    if d.cut_from is not None:
        out.append(f"The interval from {_fmt_t(d.cut_from)} is not drawn: the data ends inside it ({d.cut_minutes} "
                   f"of {d.bucket_s // 60} minutes), and drawn as a whole interval it would look like a drop. Its "
                   "traffic is counted in the totals.")
    return " ".join(out)


def _charts(d: EventData, out: Path, label: str) -> dict[str, bytes]:
    per = _per(d.bucket_s)
    charts = {}
    cut = "; ".join(
        ([f"not drawn: the interval before {_fmt_t(d.head_to)} (the data begins inside it)"] if d.head_to else [])
        + ([f"not drawn: the interval from {_fmt_t(d.cut_from)} (the data ends inside it)"] if d.cut_from else []))

    def note(ax: Any) -> None:  # the PNGs travel alone: each says what is left out
        if cut:
            ax.annotate(cut, xy=(1, 1), xycoords="axes fraction", xytext=(-4, -4), textcoords="offset points",
                        ha="right", va="top", fontsize=8, color="#666666")

    plt, fig, ax = _fig()
    ax.plot(d.times, d.views, label="views", color="#1f77b4", linewidth=1.6)
    ax.plot(d.times, d.replies, label="replies", color="#ff7f0e", linewidth=1.6)
    ax.set_title(_plain(f"{label}: views and replies {per}"))
    ax.legend(loc="upper left")
    note(ax)
    charts["views_replies.png"] = _save(plt, fig, out / "views_replies.png")

    plt, fig, ax = _fig()
    vs, rs = _share(d.views, d.site_views), _share(d.replies, d.site_replies)
    ax.fill_between(d.times, vs, color="#1f77b4", alpha=0.35, label="share of all topic views")
    ax.plot(d.times, rs, color="#ff7f0e", linewidth=1.4, label="share of all replies")
    if d.base_share is not None:
        ax.axhline(d.base_share, color="#555555", linestyle="--", linewidth=1, label="baseline view share")
    # the scale follows the data (a topic at 2% drawn on 0-100% was a flat line), up to 100%
    top = max([*vs, *rs, d.base_share or 0.0, 0.0])
    ax.set_ylim(0, min(100.0, max(1.0, top * 1.15)))
    ax.set_ylabel("%")
    ax.set_title("Share of all topic views and replies on the forum")
    ax.legend(loc="upper left")
    note(ax)
    charts["share.png"] = _save(plt, fig, out / "share.png")

    plt, fig, ax = _fig()
    # a bar covers its interval (times are interval starts): centred on the start it was drawn half an interval early
    ax.bar(d.times, d.visitors, width=d.bucket_s / 86400 * 0.9, align="edge", color="#2ca02c", label="unique visitors")
    ax.set_title(f"Unique (human) visitors {per}")
    note(ax)
    charts["visitors.png"] = _save(plt, fig, out / "visitors.png")

    plt, fig, ax = _fig()
    ax.stackplot(d.times, d.views, d.bot_views, labels=["humans", "bots"], colors=["#1f77b4", "#d62728"], alpha=0.8)
    ax.set_title("Topic views: humans vs bots")
    ax.legend(loc="upper left")
    note(ax)
    charts["humans_bots.png"] = _save(plt, fig, out / "humans_bots.png")
    return charts


# ------------------------------------------------------------------------------------------------- HTML

CSS = """
body{font-family:Georgia,'Times New Roman',serif;max-width:1000px;margin:24px auto;color:#222;background:#fff;padding:0 16px}
h1{font-size:28px;margin:0 0 4px} h2{font-size:20px;border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:28px}
.meta{color:#666;font-size:14px} .summary{font-size:18px;line-height:1.5;background:#f6f6f2;padding:12px 16px}
.figures{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0} .fig{border:1px solid #ddd;padding:8px 12px;min-width:150px}
.fig .v{font-size:24px;font-weight:bold} .fig .k{font-size:13px;color:#666}
img.chart{width:960px;max-width:100%;display:block;margin:8px 0}
table{border-collapse:collapse;font-size:15px} td,th{border-bottom:1px solid #eee;padding:4px 10px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
"""


#: the time zone a report being written shows its times in (set by the generate_* functions for their duration)
_ZONE: ContextVar[tzinfo] = ContextVar("report_zone", default=UTC)


@contextmanager
def _shown_in(tz: str) -> Iterator[tzinfo]:
    zone: tzinfo = UTC if tz == "UTC" else ZoneInfo(tz)
    token = _ZONE.set(zone)
    try:
        yield zone
    finally:
        _ZONE.reset(token)


def _zone_label(t: datetime) -> str:
    """``UTC`` for UTC itself, else the offset in force at ``t``: ``UTC+08:00``, ``UTC-03:00``, ``UTC+05:45``
    (abbreviations are ambiguous: CST is China's and Central US time, IST India's and Ireland's)."""
    off = t.utcoffset()
    if t.tzinfo is UTC or off is None:
        return "UTC"
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _fmt_t(t: datetime) -> str:
    """A time as an editor reads it: in the report's zone (:func:`_shown_in`), the zone named after it."""
    local = t.astimezone(_ZONE.get())
    return f"{local:%Y-%m-%d %H:%M} {_zone_label(local)}"


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _rate(x: float) -> str:
    """A rate that stays readable when small: 134, 3.3, 0.40 (not "0")."""
    return f"{x:,.0f}" if x >= 10 else (f"{x:.1f}" if x >= 1 else f"{x:.2f}")


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def _img(name: str, data: bytes, alt: str) -> str:
    return (f'<img class="chart" id="chart-{name.removesuffix(".png")}" alt="{html.escape(alt)}" '
            f'src="data:image/png;base64,{base64.b64encode(data).decode()}">')


def _top_referrer_text(referrers: Sequence[tuple[str, int]]) -> str:
    """The summary's sentence on referrers: the largest single source by views, every one tied with it named.
    It claimed "most visitors who arrived from elsewhere came from X" of a source with 18% of them, and named one of
    several tied sources as if it led (user trial 41)."""
    if not referrers:
        return ""
    top = referrers[0][1]
    names = [dm for dm, n in referrers if n == top]
    views = _count(top, "view")
    if len(names) == 1:
        return f" The largest single source of views arriving from other sites was {names[0]} ({views})."
    listed = ", ".join(names[:-1]) + f" and {names[-1]}"
    return f" The largest single sources of views arriving from other sites were {listed} ({views} each)."


def generate_event_report(
    store: Store, *, topic_id: int | None = None, group: str | None = None, event_id: str | None = None,
    time_from: datetime | None = None, time_to: datetime | None = None, out_dir: Path, site: str = "forum",
    baseline_days: int = 7, own_hosts: Sequence[str] = (), tz: str = "UTC",
) -> Path:
    """Write the event report for a topic, a topic group or a detection into ``out_dir``; returns index.html.
    ``own_hosts``: the site's host names (``sites[].hosts``), left out of the top referrers.  ``tz``: the site's
    time zone, in which the page and the charts show times (the ranges themselves are instants)."""
    with _shown_in(tz):
        return _event_report(store, topic_id=topic_id, group=group, event_id=event_id, time_from=time_from,
                             time_to=time_to, out_dir=out_dir, site=site, baseline_days=baseline_days,
                             own_hosts=own_hosts)


def _event_report(
    store: Store, *, topic_id: int | None, group: str | None, event_id: str | None, time_from: datetime | None,
    time_to: datetime | None, out_dir: Path, site: str, baseline_days: int, own_hosts: Sequence[str],
) -> Path:
    if sum(x is not None for x in (topic_id, group, event_id)) != 1:
        raise ReportError("give exactly one of topic_id, group, event_id")
    meta: dict[str, Any] | None = None
    if event_id is not None:
        topic_id, group, t0, t1, meta = _event(store, site, event_id)
        t0, t1 = time_from or t0, time_to or t1
    else:
        if time_to is None:
            last = store.query_rows(f"SELECT maxOrNull(minute) FROM site_minute WHERE site = {_q(site)}")
            if not last or last[0][0] is None:
                have = [str(r[0]) for r in store.query_rows("SELECT DISTINCT site FROM site_minute ORDER BY site")]
                raise ReportError(f"no data for site {site!r} (sites with data: {', '.join(have) or 'none'}; "
                                  "--site or sites[] in the configuration)")
            time_to = _utc(last[0][0]) + timedelta(minutes=1)
        t0, t1 = time_from or time_to - timedelta(hours=48), time_to
    t0, t1 = _utc(t0), _utc(t1)
    if t1 <= t0:
        raise ReportError("the range is empty (to <= from)")
    sc = _scope(store, site, topic_id, group)
    d = _collect(store, site, sc, t0, t1, baseline_days, own_hosts)
    t0, t1 = d.t0, d.t1  # aligned to whole chart intervals
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    try:
        charts = _charts(d, out, sc.label)
    except (ValueError, RuntimeError) as exc:  # a chart that cannot be drawn is a clear error, not a traceback
        raise ReportError(f"cannot draw the charts for {sc.label}: {' '.join(str(exc).split())[:200]}") from None

    shares = _share(d.views, d.site_views)
    ip = max(range(len(d.views)), key=lambda i: (d.views[i], -i))
    isf = max(range(len(shares)), key=lambda i: (shares[i], -i))
    overall_share = 100.0 * d.total_views / d.site_total_views if d.site_total_views else 0.0
    bot_share = 100.0 * d.total_bot_views / max(d.total_views + d.total_bot_views, 1)
    per = _interval_name(d.bucket_s)
    vph = d.total_views / max(d.data_hours, 1 / 60)
    if d.base_share:
        ratio = overall_share / d.base_share
        base_txt = (f"Over the whole range its share was {_ratio(ratio)}× its usual {_pct(d.base_share)} of the previous "
                    f"{baseline_days} days ({_rate(vph)} views per hour against "
                    f"{_rate(d.base_views_per_hour or 0)} usually)"
                    + (f", and {_ratio(shares[isf] / d.base_share)}× at its peak"
                       + (f" (the peak rests on only {_count(int(d.views[isf]), 'view')}: too few for the "
                          "multiple to mean much)" if d.views[isf] < FEW_VIEWS else "")
                       if d.total_views and shares[isf] >= 1.2 * overall_share else "") + ".")
        if d.base_left_out:
            spans = "; ".join(f"{_fmt_t(a)} to {_fmt_t(e)}" for a, e in d.base_left_out)
            many = len(d.base_left_out) > 1
            base_txt += (f" {'Its surges' if many else 'Its surge'} detected in those days ({spans}) "
                         f"{'are' if many else 'is'} left out of that usual level.")
    elif d.base_share == 0.0:
        base_txt = f"It had no views at all in the previous {baseline_days} days."
        ratio = math.inf
    else:
        base_txt = f"There is no data from the previous {baseline_days} days to compare with."
        ratio = math.nan
    top_ref = _top_referrer_text(d.referrers)
    if d.total_views:
        peak_txt = (f"The busiest {per} began at {_fmt_t(d.times[ip])}, with {_count(int(d.views[ip]), 'view')}; "
                    f"its share of the forum's topic views was highest, {_pct(shares[isf])}, in the {per} from "
                    f"{_fmt_t(d.times[isf])}. ")
    else:
        peak_txt = "No person viewed it in this range. "
    summary = (
        f"{sc.label} drew {_count(d.total_views, 'view')} and {_count(d.total_replies, 'reply', 'replies')} "
        f"from {_count(d.total_visitors, 'person', 'people')} "
        f"between {_fmt_t(t0)} and {_fmt_t(t1)} — {_pct(overall_share)} of all topic views on the forum. "
        f"{peak_txt}{base_txt}{top_ref}"
    )
    figs = [("total-views", _n(d.total_views), "views"), ("total-replies", _n(d.total_replies), "replies"),
            ("total-visitors", _n(d.total_visitors), "unique visitors"),
            ("peak-time", _fmt_t(d.times[ip]) if d.total_views else "n/a",
             f"start of the busiest {per} ({_count(int(d.views[ip]), 'view')})"),
            ("peak-share", _pct(shares[isf]), f"highest share of topic views in {_one(d.bucket_s)}"),
            ("overall-share", _pct(overall_share), "share over the whole range"),
            ("baseline-share", "n/a" if d.base_share is None else _pct(d.base_share),
             f"baseline share ({baseline_days} days before)"),
            ("baseline-ratio", "n/a" if math.isnan(ratio) else ("∞" if math.isinf(ratio) else f"{ratio:.1f}×"),
             "against baseline"),
            ("bot-share", f"{bot_share:.1f}%", "of views by bots")]
    cut_text = _cut_text(d)
    conc_txt = ""
    if d.concentrated:
        block, n, tot = d.concentrated
        conc_txt = (f"{_n(n)} of the {_count(tot, 'view')} with a stored address ({_pct(100.0 * n / tot)}) came from "
                    f"one address block, {block}. That is what a flood, a scraper posing as a browser or a crawler logged without "
                    "its name looks like (or many readers behind one carrier's NAT); such views are counted above as "
                    "human. Compare the DoS detector's "
                    "decisions for that block before quoting these numbers.")
        rest, rest_site = d.total_views - n, d.site_total_views - d.concentrated_site
        if rest >= 0 and rest_site > 0:
            conc_txt += (f" Without that block's views, {sc.label} drew {_count(rest, 'view')}: "
                         f"{_pct(100.0 * rest / rest_site)} of the forum's topic views without that block "
                         f"({_pct(overall_share)} with it; the other figures above include it).")
    fig_html = "".join(f'<div class="fig" id="{i}"><div class="v">{html.escape(v)}</div><div class="k">'
                       f"{html.escape(k)}</div></div>" for i, v, k in figs)
    ref_rows = "".join(f"<tr><td>{html.escape(dm)}</td><td class=\"n\">{_n(n)}</td></tr>" for dm, n in d.referrers)
    ev_html = ""
    if meta:
        until = (f"still open (data to {_fmt_t(meta['end'])})" if meta.get("open") else _fmt_t(meta["end"]))
        ev_html = (f'<p class="meta" id="event-meta">Detection {html.escape(meta["id"])}: {html.escape(meta["kind"])} '
                   f'({html.escape(meta["label"])}), {_fmt_t(meta["start"])} – {html.escape(until)}, '
                   f'peak {_fmt_t(meta["peak"])}'
                   # the detector's peak share is over its trailing window to that minute; the summary's over
                   # the report's clock-aligned intervals, so the two can differ by a few points
                   + (f' ({_pct(100.0 * float(meta["observed"]))} of topic '
                      f'{html.escape(_MEASURE_WORD.get(meta["measure"], meta["measure"]))} over the detector\'s '
                      'window to that minute)' if meta["kind"] == "topic_surge" else "")
                   + f', score {meta["score"]:.2f}</p>')
    body = (
        f"<h1 id=\"title\">{html.escape(sc.label)}</h1>"
        f"<p class=\"meta\">{html.escape(site)} · {_fmt_t(t0)} – {_fmt_t(t1)} · generated by forumpulse</p>{ev_html}"
        f"<h2>Summary</h2><p class=\"summary\" id=\"summary\">{html.escape(summary)}</p>"
        + (f"<p class=\"summary\" id=\"concentrated\"><b>Check before quoting:</b> {html.escape(conc_txt)}</p>"
           if conc_txt else "")
        + f"<div class=\"figures\">{fig_html}</div>"
        f"<h2>Views and replies</h2>{_img('views_replies.png', charts['views_replies.png'], 'views and replies')}"
        + (f"<p class=\"meta\" id=\"cut-note\">{html.escape(cut_text)}</p>" if cut_text else "")
        + f"<h2>Share of forum traffic</h2>{_img('share.png', charts['share.png'], 'share of all topic views')}"
        f"<h2>Unique visitors</h2>{_img('visitors.png', charts['visitors.png'], 'unique visitors')}"
        f"<h2>Humans and bots</h2>{_img('humans_bots.png', charts['humans_bots.png'], 'humans vs bots')}"
        f"<p>Bots (known crawlers) made {_n(d.total_bot_views)} views ({bot_share:.1f}% of all views of this scope)."
        "</p><h2>Top referrers</h2>"
        + (f"<table id=\"referrers\"><tr><th>site</th><th>views</th></tr>{ref_rows}</table>" if ref_rows
           else "<p id=\"referrers\">No external referrers were recorded.</p>")
        + "<p class=\"meta\">Counts are human requests unless stated; referrers: human topic views arriving from "
        + ("another site (the forum's own hosts left out), stored privacy-filtered. " if own_hosts else
           "another site, stored privacy-filtered; the forum's own host names are not configured (sites[].hosts: "
           "give the configuration with -c), so only the request's own host is left out and links between the "
           "forum's own sites may show as referrers. ")
        + "Visitors are distinct human client addresses that requested the topic, whatever the answer (a redirect "
        "or a refused request counts too), so they can outnumber views. Views from one address block that "
        f"carries {CONCENTRATED_SHARE:.0%} or more of them are named above the figures.</p>"
    )
    path = out / "index.html"
    path.write_text(_page(f"forumpulse report: {sc.label}", body), encoding="utf-8")
    return path


#: a peak share resting on fewer views than this is said to (a topic with 2 views in its busiest 10 minutes read
#: "65× at its peak" with no word of caution: user trial 40)
FEW_VIEWS = 20


def _duration(start: datetime, end: datetime | None, kind: str = "") -> str:
    """``2 h 05 min`` / ``40 min`` between two times; empty while open.  A ``pipeline_gap``'s ``end`` is its last
    silent minute (other kinds end at the minute things were back), so its minute counts: a 22:00-23:59 gap is
    2 h 00 min (it read 1 h 59 min: user trial 40)."""
    if end is None:
        return ""
    m = max(0, int((end - start).total_seconds() // 60) + (1 if kind == "pipeline_gap" else 0))
    return f"{m // 60} h {m % 60:02d} min" if m >= 60 else f"{m} min"


def _figure(x: float) -> str:
    """An event's observed / expected figure (a share, a rate, a count): 4 significant digits."""
    return f"{x:,.4g}" if abs(x) < 1e4 else f"{x:,.0f}"


def _figure_of(kind: str, x: float) -> str:
    """``x`` (an event's observed or expected) in its kind's unit (docs/detectors.md's table): a topic surge's
    share as a percentage, a transfer rate in MB/s, a response time in ms, counts with their noun.  Bare
    figures (0.5, 1.3e+08) left editors to guess (user trial 41)."""
    if kind == "topic_surge":
        return _pct(100.0 * x)
    if kind == "transfer_regression":
        return f"{_figure(x / 1e6)} MB/s"
    if kind == "latency_regression":
        return f"{_figure(x)} ms"
    if kind in ("spike", "dip", "outage"):
        return f"{_figure(x)} views"
    if kind == "pipeline_gap":
        return f"{_figure(x)} lines"
    return _figure(x)


def generate_daily_report(store: Store, day: date, out_dir: Path, site: str = "forum", tz: str = "UTC",
                          rerun_options: str = "") -> Path:
    """The day's detections (latest state) and top topics by human views, as one HTML page; returns its path.
    ``day`` is a calendar day in the site's time zone ``tz`` (an editor's day, not the UTC day), and the page
    shows its times there."""
    return _daily_report(store, day, out_dir, site, tz, rerun_options)[0]


def _peak_after_end(peak: Any, end: Any) -> bool:
    """A closed event whose peak time is after its end: a trailing window's end (docs/detectors.md, spike); the
    daily page marks it and says why (a peak after the end read as an error, user trial 41)."""
    return end is not None and peak is not None and _utc(peak) > _utc(end)


def _judged(store: Store, site: str, t0: datetime, t1: datetime) -> list[tuple[datetime, datetime]] | None:
    """The parts of ``[t0, t1)`` a detection run judged for ``site`` (``detection_runs``, migration 0010: history
    runs' ranges, live sessions' minutes), merged and in order; None for a store without that table (not yet
    migrated: nothing is known)."""
    (have,), = store.query_rows("SELECT count() FROM system.tables WHERE database = currentDatabase() "
                                "AND name = 'detection_runs'")
    if not int(have):
        return None
    spans: list[tuple[datetime, datetime]] = []
    for a, b in store.query_rows(f"SELECT from_ts, to_ts FROM detection_runs FINAL WHERE site = {_q(site)} "
                                 f"AND from_ts < {_ts(t1)} AND to_ts > {_ts(t0)} ORDER BY from_ts, to_ts"):
        lo, hi = max(_utc(a), t0), min(_utc(b), t1)
        if spans and lo <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], hi))
        else:
            spans.append((lo, hi))
    return spans


def _judged_text(spans: list[tuple[datetime, datetime]] | None, t0: datetime, t1: datetime, day: date,
                 rerun_options: str = "") -> str:
    """What the daily report says about which minutes of the day the detectors judged; the command it suggests
    carries ``rerun_options`` (the configuration and store the page was made from: without them a pasted command
    judged the default store, user trial 41)."""
    if spans is None:
        return ("Which minutes of this day the detectors judged is not recorded in this store (it predates "
                "migration 0010: run forumpulse db migrate).")
    whole = (t1 - t0).total_seconds()
    done = sum((b - a).total_seconds() for a, b in spans)
    # the site's day, with its offsets: a bare date is UTC, so the day of a site east or west of UTC was only
    # partly covered by the command this page suggested (user trial 40)
    frm, to = (t.astimezone(_ZONE.get()).isoformat(timespec="minutes") for t in (t0, t1))
    rerun = f"forumpulse detect --from {frm} --to {to}" + (f" {rerun_options}" if rerun_options else "")
    if not spans:
        return f"No detection run covered this day: its events are unknown, not absent ({rerun} judges it)."
    if done >= whole:
        return "The detectors judged the whole day."
    parts = ", ".join(f"{_fmt_t(a)} – {_fmt_t(b)}" for a, b in spans)
    return (f"The detectors judged only {parts} ({100.0 * done / whole:.0f}% of the day): events in the rest are "
            f"unknown ({rerun} judges it; give --from/--to in UTC or with an offset for part of it).")


def _daily_report(store: Store, day: date, out_dir: Path, site: str, tz: str,
                  rerun_options: str = "") -> tuple[Path, int, int]:
    """:func:`generate_daily_report`, also returning how many events and topics the page lists."""
    with _shown_in(tz) as zone:
        return _daily_page(store, day, out_dir, site, tz, zone, rerun_options)


def _daily_page(store: Store, day: date, out_dir: Path, site: str, tz: str, zone: tzinfo,
                rerun_options: str) -> tuple[Path, int, int]:
    t0 = datetime(day.year, day.month, day.day, tzinfo=zone).astimezone(UTC)
    nxt = day + timedelta(days=1)
    t1 = datetime(nxt.year, nxt.month, nxt.day, tzinfo=zone).astimezone(UTC)  # 23 or 25 hours on DST days
    events = store.query_rows(f"""
        SELECT id, kind, scope, label, state, start_ts, end_ts, peak_ts, observed, expected, score FROM detections FINAL
        WHERE site = {_q(site)} AND start_ts < {_ts(t1)} AND (end_ts IS NULL OR end_ts >= {_ts(t0)})
        ORDER BY score DESC, start_ts, id LIMIT 50""")
    topics = store.query_rows(f"""
        SELECT p.topic_id, t.title, p.views, p.replies, p.visitors FROM (
            SELECT topic_id, sum(views) AS views, sum(replies) AS replies, uniqMerge(visitors) AS visitors
            FROM topic_minute WHERE site = {_q(site)} AND minute >= {_ts(t0)} AND minute < {_ts(t1)}
            GROUP BY topic_id) AS p
        LEFT JOIN (SELECT topic_id, argMax(title, updated_at) AS title FROM topic_titles
                   WHERE site = {_q(site)} GROUP BY topic_id) AS t ON p.topic_id = t.topic_id
        ORDER BY p.views DESC, p.topic_id LIMIT 20""")
    ev_rows = "".join(
        f"<tr><td>{html.escape(str(i))}</td><td>{html.escape(str(k))}</td><td>{html.escape(str(s))}</td>"
        f"<td>{html.escape(str(lb))}</td><td>{html.escape(str(st))}</td><td>{_fmt_t(_utc(a))}</td>"
        f"<td>{_fmt_t(_utc(e)) if e is not None else 'open'}</td><td>{_duration(_utc(a), _utc(e) if e is not None else None, str(k))}</td>"
        f"<td>{_fmt_t(_utc(p))}{' *' if _peak_after_end(p, e) else ''}</td><td class=\"n\">{_figure_of(str(k), ob)}</td>"
        f"<td class=\"n\">{_figure_of(str(k), ex)}</td>"
        f"<td class=\"n\">{sc:.2f}</td></tr>"
        for i, k, s, lb, st, a, e, p, ob, ex, sc in events)
    judged = _judged(store, site, t0, t1)
    (day_views,), = store.query_rows(f"SELECT sum(topic_views) FROM site_minute WHERE site = {_q(site)} AND "
                                     f"minute >= {_ts(t0)} AND minute < {_ts(t1)}")
    conc = _concentrated(store, f"site = {_q(site)} AND ts >= {_ts(t0)} AND ts < {_ts(t1)} AND topic_id IN "
                                f"({', '.join(str(int(t[0])) for t in topics) or '0'})", by_topic=True)

    def flag(tid: int) -> str:
        c = conc.get(int(tid))
        return "" if c is None else f"{_n(c[1])} from {c[0]}"

    tp_rows = "".join(
        f"<tr><td class=\"n\">{tid}</td><td>{html.escape(title or '')}</td><td class=\"n\">{_n(v)}</td>"
        f"<td class=\"n\">{_pct(100.0 * v / day_views) if day_views else 'n/a'}</td>"
        f"<td class=\"n\">{_n(r)}</td><td class=\"n\">{_n(u)}</td><td>{html.escape(flag(tid))}</td></tr>"
        for tid, title, v, r, u in topics)
    day_txt = f"{tz} day, {_fmt_t(t0)} – {_fmt_t(t1)}"
    body = (f"<h1 id=\"title\">Daily report {day.isoformat()}</h1><p class=\"meta\">{html.escape(site)} · "
            f"{html.escape(day_txt)}</p>"
            "<h2>Top events</h2>"
            + f"<p class=\"meta\" id=\"judged\">{html.escape(_judged_text(judged, t0, t1, day, rerun_options))}</p>"
            + (f"<table id=\"events\"><tr><th>id</th><th>kind</th><th>scope</th><th>label</th><th>state</th>"
               f"<th>start</th><th>end</th><th>duration</th><th>peak</th><th>observed</th><th>expected</th>"
               f"<th>score</th></tr>{ev_rows}</table>" if ev_rows
               else "<p id=\"events\">No detections are recorded for this day.</p>")
            + ("<p class=\"meta\" id=\"peak-note\">* The peak of a detector that measures a trailing window (a "
               "spike: the last 30 minutes) is the end of the window with the highest ratio to its expectation, so "
               "after a short burst it falls after the event ended.</p>"
               if any(_peak_after_end(ev[7], ev[6]) for ev in events) else "")
            + "<h2>Top topics</h2>"
            + f"<table id=\"topics\"><tr><th>topic</th><th>title</th><th>views</th><th>share of the day's "
            f"topic views</th><th>replies</th><th>visitors</th><th>views from one address block</th></tr>{tp_rows}</table>"
            + ("<p class=\"meta\" id=\"concentrated\">A topic with views from one address block (IPv4 /24, IPv6 /64) "
               f"behind at least {CONCENTRATED_SHARE:.0%} of its views (and {CONCENTRATED_MIN_VIEWS} or more): a flood, "
               "a scraper posing as a browser or a crawler logged without its name looks like that (so do many readers "
               "behind one carrier's NAT), and such views are counted as human. Check the DoS detector's decisions before quoting them.</p>" if conc else ""))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"daily-{day.isoformat()}.html"
    path.write_text(_page(f"forumpulse daily report {day.isoformat()}", body), encoding="utf-8")
    return path, len(events), len(topics)


# ---------------------------------------------------------------------------------------------- commands


def _parse_time(s: str | None, option: str) -> datetime | None:
    if s is None:
        return None
    try:
        t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{s!r} is not an ISO 8601 date or time", param_hint=option) from None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


_StoreOpt = Annotated[str | None, typer.Option("--store", help="chdb:PATH or clickhouse://... (default: the "
                                                "configured store.url)")]
_SiteOpt = Annotated[str | None, typer.Option("--site", help="site name (default: the first configured site)")]
_ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="YAML configuration file (default: "
                                                 "$FORUMPULSE_CONFIG, else built-in defaults)")]


def _check_out(out: Path) -> None:
    """Refuse, before any query, an --out that is a file or lies under one (nothing is created here: the report
    creates the folder when it writes; a write that fails then is :func:`_write_failed`)."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                what = "is a file, not a folder" if p == out else f"cannot be created ({p} is a file)"
                typer.echo(f"error: --out {out} {what}", err=True)
                raise typer.Exit(2)
            return


def _write_failed(out: Path, exc: OSError) -> typer.Exit:
    """A one-line error for a write into ``out`` that failed (re-raises any other OSError)."""
    if not exc.filename or not Path(str(exc.filename)).is_relative_to(out):
        raise exc
    typer.echo(f"error: --out {out}: cannot write the report there ({exc.strerror or exc})", err=True)
    return typer.Exit(2)


def _open_for_report(config: Path | None, store: str | None,
                     site: str | None) -> tuple[Store, str, Any, bool]:
    """The store, site and the site's configuration (hosts, time zone) of a report: the options, else the
    configuration (store.url, the first site); and whether the site is one of ``sites[]``."""
    from forumpulse.pipeline.config import load_settings

    settings = load_settings(config)  # a bad file: ConfigError, reported by the CLI's main() (exit 2)
    name = site or settings.sites[0].name
    configured = any(s.name == name for s in settings.sites)
    return open_store(store or settings.store.url, existing=True), name, settings.site(name), configured


def _rerun_options(config: Path | None, store: str | None) -> str:
    """The options that make a command the page suggests read the same configuration and store as the page: the
    configuration file (--config, else $FORUMPULSE_CONFIG) and a --store given on the command line, paths made
    absolute (the command may be pasted elsewhere) and a password in a store URL left as a placeholder (the page
    is shared)."""
    import shlex
    from urllib.parse import urlsplit

    opts: list[str] = []
    path = config or (Path(os.environ["FORUMPULSE_CONFIG"]) if os.environ.get("FORUMPULSE_CONFIG") else None)
    if path is not None:
        opts += ["-c", str(path.absolute())]
    if store:
        if store.startswith("chdb:"):
            store = "chdb:" + str(Path(store[len("chdb:"):]).absolute())
        else:
            u = urlsplit(store)
            if u.password:
                store = u._replace(netloc=u.netloc.replace(f":{u.password}@", ":PASSWORD@", 1)).geturl()
        opts += ["--store", store]
    return " ".join(shlex.quote(o) for o in opts)


def report_event_command(
    out: Annotated[Path, typer.Option("--out", help="output folder (created)")],
    topic: Annotated[int | None, typer.Option("--topic", help="topic id")] = None,
    group: Annotated[str | None, typer.Option("--group", help="topic group name")] = None,
    event: Annotated[str | None, typer.Option("--event", help="id of a topic_surge detection (scope topic:<id> or "
                                              "group:<name>; other kinds have no topic to report on)")] = None,
    from_: Annotated[str | None, typer.Option("--from", help="start, ISO 8601 (UTC if no offset); default: the "
                                              "event's range padded by a quarter of its length (at least 1 h) "
                                              "with --event, else 48 hours before --to")] = None,
    to: Annotated[str | None, typer.Option("--to", help="end, ISO 8601 (UTC if no offset); default: the event's "
                                           "end padded likewise with --event (an open event: the end of the "
                                           "data), else the end of the site's data")] = None,
    store: _StoreOpt = None,
    site: _SiteOpt = None,
    config: _ConfigOpt = None,
) -> None:
    """forumpulse report event --topic ID | --group NAME | --event ID [--from --to] --out DIR"""
    time_from, time_to = _parse_time(from_, "--from"), _parse_time(to, "--to")  # refused before the store opens
    if sum(x is not None for x in (topic, group, event)) != 1:
        typer.echo("error: give exactly one of --topic, --group, --event", err=True)
        raise typer.Exit(2)
    _check_out(out)
    st, site, cfg, _ = _open_for_report(config, store, site)
    try:
        path = generate_event_report(st, topic_id=topic, group=group, event_id=event, time_from=time_from,
                                     time_to=time_to, out_dir=out, site=site, own_hosts=cfg.hosts, tz=cfg.timezone)
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        raise _write_failed(out, exc) from None
    finally:
        st.close()
    typer.echo(str(path))


def report_daily_command(
    out: Annotated[Path, typer.Option("--out", help="output folder (created)")],
    day: Annotated[str | None, typer.Option("--day", help="YYYY-MM-DD, a day in the site's time zone; default: "
                                            "yesterday there")] = None,
    store: _StoreOpt = None,
    site: _SiteOpt = None,
    config: _ConfigOpt = None,
) -> None:
    """forumpulse report daily [--day YYYY-MM-DD] --out DIR"""
    try:
        d = date.fromisoformat(day) if day else None
    except ValueError:
        typer.echo(f"error: --day {day!r} is not a date YYYY-MM-DD", err=True)
        raise typer.Exit(2) from None
    _check_out(out)
    st, site, cfg, configured = _open_for_report(config, store, site)
    tz = cfg.timezone
    if d is None:
        d = (datetime.now(ZoneInfo(tz)) - timedelta(days=1)).date()
    # a site named by --site that is neither configured nor in the data is a typo (a configured site without data
    # yet gets its empty page and a note, below)
    if not configured and not st.query_rows(f"SELECT count() FROM site_minute WHERE site = {_q(site)}")[0][0]:
        have = [str(r[0]) for r in st.query_rows("SELECT DISTINCT site FROM site_minute ORDER BY site")]
        st.close()
        typer.echo(f"error: site {site!r} is not configured and has no data (sites with data: "
                   f"{', '.join(have) or 'none'}; --site or sites[] in the configuration)", err=True)
        raise typer.Exit(2)
    try:
        path, n_events, n_topics = _daily_report(st, d, out, site, tz, _rerun_options(config, store))
    except OSError as exc:
        raise _write_failed(out, exc) from None
    finally:
        st.close()
    if not n_events and not n_topics:
        typer.echo(f"note: no detections and no topic views on {d} ({tz}) for site {site}: the page is empty",
                   err=True)
    typer.echo(str(path))


if __name__ == "__main__":  # python -m forumpulse.dashboards.report event ... (until the CLI wires it)
    app = typer.Typer(add_completion=False)
    app.command("event")(report_event_command)
    app.command("daily")(report_daily_command)
    app()
