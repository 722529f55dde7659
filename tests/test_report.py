"""Editorial event reports on a 48-hour topic surge (plus one baseline day): numbers against the Python rows."""

from __future__ import annotations

import html
import re
import sys
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
import test_dashboards_fixture as fx
from forumpulse.dashboards.report import ReportError, generate_daily_report, generate_event_report
from forumpulse.detectors.traffic import record_runs
from forumpulse.pipeline.store import migrate, open_store

T0 = fx.T0
FROM, TO = T0 + timedelta(days=1), T0 + timedelta(days=3)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Any:
    store = open_store(f"chdb:{tmp_path_factory.mktemp('report_chdb')}")
    migrate(store, {"raw_ttl_days": 0, "rollup_ttl_days": 0})
    tr = fx.make_traffic(minutes=3 * 1440, event_start=1440, event_peak=2 * 1440 + 600, event_width=400,
                         event_height=12, flood=False, seed=11)
    fx.load_requests(store, tr.rows)
    titles = [{"site": fx.SITE, "topic_id": k, "title": v, "forum": "f", "updated_at": T0} for k, v in fx.TOPICS.items()]
    import pyarrow as pa
    store.insert("topic_titles", fx.ts_table(titles, ("updated_at",), {"topic_id": pa.uint64()}))
    groups = [{"site": fx.SITE, "group_name": g, "topic_id": t, "updated_at": T0} for g, ts in fx.GROUPS.items() for t in ts]
    store.insert("topic_groups", fx.ts_table(groups, ("updated_at",), {"topic_id": pa.uint64()}))
    det = [{"id": "ev-48h", "kind": "topic_surge", "site": fx.SITE, "scope": "topic:101", "start_ts": FROM + timedelta(hours=4),
            "end_ts": TO - timedelta(hours=4), "peak_ts": T0 + timedelta(minutes=2 * 1440 + 600), "observed": 0.5,
            "expected": 0.1, "score": 9.0, "label": "surge", "state": "closed", "detail": "{}", "updated_at": TO}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    yield store, tr
    store.close()


def human(r: dict[str, Any], kind: str) -> bool:
    return not r["is_bot"] and r["page_kind"] == kind


def in_range(r: dict[str, Any], t0: Any = FROM, t1: Any = TO) -> bool:
    return bool(t0 <= r["ts"] < t1)


def text_of(html: str, elem_id: str) -> str:
    m = re.search(rf'id="{elem_id}"[^>]*>(.*?)</(?:p|div|h1|table)>', html, re.S)
    assert m, elem_id
    return re.sub(r"<[^>]+>", " ", m.group(1))


def test_event_report_numbers(world: Any, tmp_path: Path) -> None:
    store, tr = world
    path = generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO, out_dir=tmp_path)
    page = path.read_text()
    rows = [r for r in tr.rows if in_range(r)]
    t101 = [r for r in rows if r["topic_id"] == 101]
    views = sum(human(r, "topic_view") for r in t101)
    replies = sum(human(r, "reply") for r in t101)
    visitors = len({fx.mapped(r["client_ip"]) for r in t101 if not r["is_bot"]})
    all_views = sum(human(r, "topic_view") for r in rows)
    assert f"{views:,}" in text_of(page, "total-views")
    assert f"{replies:,}" in text_of(page, "total-replies")
    assert f"{visitors:,}" in text_of(page, "total-visitors")
    assert f"{100 * views / all_views:.1f}%" in text_of(page, "overall-share")
    # 48 h at 10-minute buckets: peak share bucket computed from the rows
    buckets: dict[int, list[int]] = {}
    for r in rows:
        if human(r, "topic_view"):
            b = int((r["ts"] - FROM).total_seconds() // 600)
            c = buckets.setdefault(b, [0, 0])
            c[0] += r["topic_id"] == 101
            c[1] += 1
    peak_b = max(buckets, key=lambda b: (buckets[b][0] / buckets[b][1], -b))
    assert f"{100 * buckets[peak_b][0] / buckets[peak_b][1]:.1f}%" in text_of(page, "peak-share")
    base = [r for r in tr.rows if r["ts"] < FROM and human(r, "topic_view")]
    base_share = 100 * sum(r["topic_id"] == 101 for r in base) / len(base)
    assert f"{base_share:.1f}%" in text_of(page, "baseline-share")
    # human topic views arriving from another site (the forum's own host and the request's vhost left out)
    refs = Counter(r["referer"].split("/")[2] for r in t101 if human(r, "topic_view") and r["referer"]
                   and r["referer"].split("/")[2].removeprefix("www.") != (r.get("vhost") or "").removeprefix("www."))
    assert refs.most_common(1)[0][0] == "news.example.com"
    table = text_of(page, "referrers")
    assert table.index("news.example.com") < table.index("www.google.com")
    assert f"{refs['news.example.com']:,}" in table
    # the largest single source, with its views (it claimed "most visitors who arrived from elsewhere" of it)
    top_n = refs["news.example.com"]
    assert (f"The largest single source of views arriving from other sites was news.example.com ({top_n:,} "
            f"view{'s' if top_n != 1 else ''}).") in text_of(page, "summary")
    assert "the forum's own host names are not configured" in page  # no own_hosts given: said, not claimed
    assert "Election results thread" in text_of(page, "title")
    summary = text_of(page, "summary")
    assert f"{views:,} views" in summary and "The busiest 10 minutes began at" in summary
    # the peak's own ratio to the baseline is said apart from the whole range's (they were one "× its usual")
    assert "× its usual" in summary and "at its peak" in summary
    # the views per hour (the whole range's) stand next to the whole range's ratio, not after "at its peak"
    assert re.search(r"× its usual .*? days \([\d,.]+ views per hour against [\d,.]+ usually\), and [\d,.]+× at "
                     r"its peak\.", summary), summary
    # self-contained: no external fetches, charts inline and as files
    assert not re.search(r'(?:src|href)\s*=\s*"(?:https?:)?//', page)
    assert page.count('src="data:image/png;base64,') == 4
    for name in ("views_replies.png", "share.png", "visitors.png", "humans_bots.png"):
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and im.size[0] >= 900
            assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 10, f"{name} looks blank"
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    print(f"48-hour event report: index.html {path.stat().st_size} bytes, folder {size} bytes")


def test_event_id_and_group(world: Any, tmp_path: Path) -> None:
    store, tr = world
    page = generate_event_report(store, event_id="ev-48h", out_dir=tmp_path / "ev").read_text()
    assert "ev-48h" in text_of(page, "event-meta") and "Topic #101" in page
    # range padded by a quarter of the 40 h event on both sides = the full 48 h + 2 h... from start-10h to end+10h
    start, end = FROM + timedelta(hours=4), TO - timedelta(hours=4)
    t0, t1 = start - (end - start) / 4, end + (end - start) / 4
    views = sum(human(r, "topic_view") for r in tr.rows if r["topic_id"] == 101 and in_range(r, t0, t1))
    assert f"{views:,}" in text_of(page, "total-views")
    gpage = generate_event_report(store, group="election", time_from=FROM, time_to=TO, out_dir=tmp_path / "g").read_text()
    gviews = sum(human(r, "topic_view") for r in tr.rows if r["topic_id"] in (101, 102) and in_range(r))
    assert f"{gviews:,}" in text_of(gpage, "total-views") and "election" in text_of(gpage, "title")


def test_errors(world: Any, tmp_path: Path) -> None:
    store, _ = world
    with pytest.raises(ReportError, match="exactly one"):
        generate_event_report(store, out_dir=tmp_path)
    with pytest.raises(ReportError, match="no detection"):
        generate_event_report(store, event_id="nope", out_dir=tmp_path)
    # a topic id that never had traffic is named as such (a typo), not as a quiet range
    with pytest.raises(ReportError, match="Topic #999 has no traffic at all on site 'forum': is the id right"):
        generate_event_report(store, topic_id=999, time_from=FROM, time_to=TO, out_dir=tmp_path)
    with pytest.raises(ReportError, match=r"^no traffic for Topic #101"):  # a real topic, a range without it
        generate_event_report(store, topic_id=101, time_from=FROM - timedelta(days=300),
                              time_to=FROM - timedelta(days=299), out_dir=tmp_path)
    with pytest.raises(ReportError, match=r"no topics.*\(groups: election, sports;"):
        generate_event_report(store, group="nope", out_dir=tmp_path)
    with pytest.raises(ReportError, match="did you mean 'election'"):
        generate_event_report(store, group="electoin", out_dir=tmp_path)


def test_daily_report(world: Any, tmp_path: Path) -> None:
    store, tr = world
    day = (T0 + timedelta(days=2)).date()
    page = generate_daily_report(store, day, tmp_path).read_text()
    events = text_of(page, "events")
    assert "ev-48h" in events
    # its end, duration and figures, for ops (trial 31: start and peak only, an outage's length was nowhere)
    end = TO - timedelta(hours=4)
    assert f"{end:%Y-%m-%d %H:%M}" in events and "40 h 00 min" in events, events
    # duration, peak, observed and expected in their unit (a topic surge's shares as percentages), score
    assert re.search(r"40 h 00 min\s+[\d-]+ [\d:]+ UTC\s+50\.0%\s+10\.0%\s+9\.00", events), events
    t0 = T0 + timedelta(days=2)
    views = Counter(r["topic_id"] for r in tr.rows if in_range(r, t0, t0 + timedelta(days=1)) and human(r, "topic_view"))
    (top, n), = views.most_common(1)
    topics = text_of(page, "topics")
    assert top == 101 and f"{n:,}" in topics and topics.index("Election") < topics.index("Garden")
    # each topic's share of the day's human topic views (per-topic share, for editors)
    assert f"{100 * n / sum(views.values()):.1f}%" in topics, topics
    empty = generate_daily_report(store, (T0 - timedelta(days=5)).date(), tmp_path).read_text()
    assert "No detections are recorded for this day" in empty
    assert 'id="peak-note"' not in page  # its peak is inside the event


def test_daily_report_marks_a_spike_peak_after_the_end(world: Any, tmp_path: Path) -> None:
    """A spike's peak is the end of its trailing 30-minute window: after a short burst it falls after the event
    ended, which read as an error on the page (user trial 41); marked, and the note says why."""
    store, _ = world
    start = T0 + timedelta(days=2, hours=10)
    det = [{"id": "ev-burst", "kind": "spike", "site": "spiky", "scope": "site", "start_ts": start,
            "end_ts": start + timedelta(minutes=20), "peak_ts": start + timedelta(minutes=35), "observed": 900.0,
            "expected": 300.0, "score": 0.9, "label": "spike", "state": "closed", "detail": "{}", "updated_at": TO}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    page = generate_daily_report(store, start.date(), tmp_path, site="spiky").read_text()
    assert f"{start + timedelta(minutes=35):%Y-%m-%d %H:%M} UTC *" in text_of(page, "events")
    assert "900 views" in text_of(page, "events") and "300 views" in text_of(page, "events")  # in their unit
    assert "after a short burst it falls after the event ended" in text_of(page, "peak-note")


def test_daily_report_tells_an_unjudged_day_from_a_quiet_one(world: Any, tmp_path: Path) -> None:
    """A day without detections is quiet only where a detection run judged it (detection_runs): a nightly
    `detect --from D --to D+1` that did not run left the day unknown, and the page said nothing of it (trial 31).
    Live sessions' and history runs' ranges add up; a live row moved on counts as its latest state."""
    store, _ = world
    day = date(2025, 6, 2)
    t0 = datetime(2025, 6, 2, tzinfo=UTC)

    def judged() -> str:
        return text_of(generate_daily_report(store, day, tmp_path, site="judged").read_text(), "judged")

    assert judged() == ("No detection run covered this day: its events are unknown, not absent (forumpulse detect "
                        "--from 2025-06-02T00:00+00:00 --to 2025-06-03T00:00+00:00 judges it).")
    # a site east of UTC: its day, with its offset (a bare date is UTC: the command covered 08:00-24:00 of it)
    kl = text_of(generate_daily_report(store, day, tmp_path, site="judged", tz="Asia/Kuala_Lumpur").read_text(),
                 "judged")
    assert "--from 2025-06-02T00:00+08:00 --to 2025-06-03T00:00+08:00 judges it" in kl, kl
    now = datetime.now(UTC)
    record_runs(store, [("judged", "live", t0 - timedelta(days=15), t0 + timedelta(hours=3))], now)
    record_runs(store, [("judged", "live", t0 - timedelta(days=15), t0 + timedelta(hours=6))],
                now + timedelta(seconds=1))  # the same session, moved on
    record_runs(store, [("judged", "history", t0 + timedelta(hours=12), t0 + timedelta(hours=18))], now)
    assert judged() == ("The detectors judged only 2025-06-02 00:00 UTC – 2025-06-02 06:00 UTC, 2025-06-02 12:00 UTC "
                        "– 2025-06-02 18:00 UTC (50% of the day): events in the rest are unknown (forumpulse detect "
                        "--from 2025-06-02T00:00+00:00 --to 2025-06-03T00:00+00:00 judges it; give --from/--to in UTC or "
                        "with an offset for "
                        "part of it).")
    record_runs(store, [("judged", "history", t0 + timedelta(hours=5), t0 + timedelta(days=1))], now)
    assert judged() == "The detectors judged the whole day."
    store.command("RENAME TABLE detection_runs TO detection_runs_away")  # a store from before migration 0010
    try:
        assert judged() == ("Which minutes of this day the detectors judged is not recorded in this store (it "
                            "predates migration 0010: run forumpulse db migrate).")
    finally:
        store.command("RENAME TABLE detection_runs_away TO detection_runs")


def test_own_hosts_are_not_external_referrers(world: Any, tmp_path: Path) -> None:
    store, _ = world
    page = generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO, out_dir=tmp_path,
                                 own_hosts=["www.news.example.com"]).read_text()  # www. or not: the same site
    table = text_of(page, "referrers")
    assert "news.example.com" not in table and "www.google.com" in table
    assert "the forum's own hosts left out" in page and "not configured" not in page


def test_event_figures_are_shown_in_their_unit() -> None:
    from forumpulse.dashboards.report import _figure_of

    assert _figure_of("transfer_regression", 130_000_000.0) == "130 MB/s"
    assert _figure_of("latency_regression", 812.5) == "812.5 ms"
    assert _figure_of("topic_surge", 0.4321) == "43.2%" and _figure_of("pipeline_gap", 0.0) == "0 lines"


def test_tied_top_referrers_are_all_named() -> None:
    from forumpulse.dashboards.report import _top_referrer_text

    assert _top_referrer_text([]) == ""
    assert _top_referrer_text([("b.example", 7), ("a.example", 7), ("c.example", 7), ("d.example", 2)]) == (
        " The largest single sources of views arriving from other sites were b.example, a.example and c.example "
        "(7 views each).")


def test_titles_with_dollar_signs_are_drawn_as_written(world: Any, tmp_path: Path) -> None:
    import pyarrow as pa

    store, _ = world
    for i, title in enumerate(("Bitcoin at $100k and ETH at $4k?", r"Save \$ with $\frac{ tips$ now")):
        store.insert("topic_titles", fx.ts_table([{"site": fx.SITE, "topic_id": 102, "title": title, "forum": "f",
                                                   "updated_at": TO + timedelta(minutes=i + 1)}],
                                                 ("updated_at",), {"topic_id": pa.uint64()}))
        out = tmp_path / str(i)
        page = generate_event_report(store, topic_id=102, time_from=FROM, time_to=TO, out_dir=out).read_text()
        assert title.replace("$", "").split()[0] in text_of(page, "title")  # no math markup, no exception
        assert (out / "views_replies.png").stat().st_size > 1000


def test_an_open_event_runs_to_the_end_of_the_data(world: Any, tmp_path: Path) -> None:
    store, _ = world
    det = [{"id": "ev-open", "kind": "topic_surge", "site": fx.SITE, "scope": "topic:101",
            "start_ts": FROM + timedelta(hours=30), "end_ts": None, "peak_ts": FROM + timedelta(hours=31),
            "observed": 0.5, "expected": 0.1, "score": 5.0, "label": "surge", "state": "open", "detail": "{}",
            "updated_at": TO}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    page = generate_event_report(store, event_id="ev-open", out_dir=tmp_path / "e").read_text()
    meta = text_of(page, "event-meta")
    assert "still open (data to" in meta, meta
    # the detection's own peak share (over its trailing window) is shown, apart from the report's intervals
    assert "(50.0% of topic views over the detector's window to that minute)" in meta, meta
    daily = generate_daily_report(store, (FROM + timedelta(days=1, hours=12)).date(), tmp_path / "d").read_text()
    assert "ev-open" in text_of(daily, "events")  # listed while open, not only once closed
    # a surge led by visitors names visitor-minutes, not the unique visitors of the page's figures (user trial 40)
    store.insert("detections", fx.ts_table([{**det[0], "id": "ev-vis", "detail": '{"measure": "visitors"}'}],
                                           ("start_ts", "end_ts", "peak_ts", "updated_at")))
    vis = text_of(generate_event_report(store, event_id="ev-vis", out_dir=tmp_path / "v").read_text(), "event-meta")
    assert "(50.0% of topic visitor-minutes (each visitor counted once per minute active) over the" in vis, vis


def test_intervals_without_views_are_zero_not_bridged(world: Any) -> None:
    from forumpulse.dashboards.report import _collect, _scope

    store, _ = world
    sc = _scope(store, fx.SITE, 104, None)
    d = _collect(store, fx.SITE, sc, FROM, FROM + timedelta(hours=6), 1)
    site_buckets = store.query_rows(
        f"SELECT count(DISTINCT toStartOfInterval(minute, INTERVAL {d.bucket_s} second)) FROM site_minute "
        f"WHERE site = '{fx.SITE}' AND minute >= toDateTime('{FROM:%Y-%m-%d %H:%M:%S}', 'UTC') "
        f"AND minute < toDateTime('{FROM + timedelta(hours=6):%Y-%m-%d %H:%M:%S}', 'UTC')")[0][0]
    assert len(d.times) == site_buckets  # every interval with site data, the topic's zeros included
    assert 0.0 in d.views


def test_daily_report_is_a_day_in_the_site_time_zone(world: Any, tmp_path: Path) -> None:
    store, tr = world
    day = (T0 + timedelta(days=2)).date()
    page = generate_daily_report(store, day, tmp_path / "kl", tz="Asia/Kuala_Lumpur").read_text()
    t0 = T0 + timedelta(days=2) - timedelta(hours=8)  # local midnight in UTC+8
    views = Counter(r["topic_id"] for r in tr.rows if in_range(r, t0, t0 + timedelta(days=1)) and human(r, "topic_view"))
    (top, n), = views.most_common(1)
    topics = text_of(page, "topics")
    assert str(top) in topics and f"{n:,}" in topics  # the local day's top topic and its views
    # times shown in the site's zone, its offset named: the local day runs from 00:00 to 00:00
    assert "Asia/Kuala_Lumpur day" in page and f"{day:%Y-%m-%d} 00:00 UTC+08:00" in page
    assert f"{day + timedelta(days=1):%Y-%m-%d} 00:00 UTC+08:00" in page and " UTC<" not in page


def _steady(site: str, minutes: range, per_minute: dict[int, int]) -> list[dict[str, Any]]:
    """Human topic views at a constant rate: ``per_minute`` topic -> views in each minute of ``minutes``."""
    return [dict(fx.REQ_DEFAULTS, site=site, ts=T0 + timedelta(minutes=m, seconds=1 + 7 * k), client_ip="::ffff:10.0.0.1",
                 topic_id=t, page_kind="topic_view", url=f"/t/{t}", path=f"/t/{t}")
            for m in minutes for t, n in per_minute.items() for k in range(n)]


def test_views_per_hour_of_range_and_baseline_have_the_same_denominator(world: Any, tmp_path: Path) -> None:
    """A sparse site (one view every 10 minutes, for 8 days): the range and the baseline both run at 6 views per
    hour.  The range used to divide by the minutes that had traffic (60 per hour) and the baseline by wall time."""
    store, _ = world
    store.insert("requests", fx.requests_table(_steady("sparse", range(0, 8 * 1440, 10), {7: 1})), dedup_token="sparse")
    page = generate_event_report(store, topic_id=7, site="sparse", time_from=T0 + timedelta(days=7),
                                 time_to=T0 + timedelta(days=8), out_dir=tmp_path).read_text()
    summary = text_of(page, "summary")
    assert "its share was 1.0× its usual 100.0%" in summary
    assert "(6.0 views per hour against 6.0 usually)" in summary, summary


def test_open_event_range_is_aligned_and_its_unfinished_last_interval_not_drawn(world: Any, tmp_path: Path) -> None:
    """Steady traffic whose data ends at 23:53 (live: the newest minute is now), an open event: the range starts
    and ends on interval boundaries, every drawn interval is whole (steady: all equal, no false drop at the end),
    the 23:50 interval (3 of 5 minutes) is counted in the totals, left out of the charts, and the page says so."""
    from forumpulse.dashboards.report import _collect, _event, _scope

    store, _ = world
    end_m = 30 * 60 - 7  # data: minutes 0 .. 29:52, i.e. it ends at 29:53 (05:53 the second day)
    store.insert("requests", fx.requests_table(_steady("live", range(end_m), {7: 3, 8: 2})), dedup_token="live")
    det = [{"id": "ev-live", "kind": "topic_surge", "site": "live", "scope": "topic:7",
            "start_ts": T0 + timedelta(hours=10, minutes=2, seconds=13), "end_ts": None,
            "peak_ts": T0 + timedelta(hours=12), "observed": 0.6, "expected": 0.6, "score": 3.0, "label": "surge",
            "state": "open", "detail": "{}", "updated_at": T0}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    tid, grp, t0, t1, _meta = _event(store, "live", "ev-live")
    assert t1 == T0 + timedelta(minutes=end_m)
    d = _collect(store, "live", _scope(store, "live", tid, grp), t0, t1, 7)
    b = d.bucket_s
    assert b == 300 and d.t0.timestamp() % b == 0 and d.t1.timestamp() % b == 0 and d.t0 <= t0 and d.t1 >= t1
    assert all(t.timestamp() % b == 0 for t in d.times)
    assert d.times[-1] + timedelta(seconds=b) <= t1  # no interval past the data is drawn as a whole one
    assert set(d.views) == {15.0} and set(d.site_views) == {25.0}, "steady traffic: every drawn interval equal"
    assert d.cut_from == T0 + timedelta(minutes=end_m - 3) and d.cut_minutes == 3
    assert d.total_views == 3 * (end_m - int((d.t0 - T0).total_seconds() // 60))  # the cut interval is counted
    page = generate_event_report(store, event_id="ev-live", site="live", out_dir=tmp_path).read_text()
    note = text_of(page, "cut-note")
    assert "not drawn" in note and "3 of 5 minutes" in note and "counted in the totals" in note
    assert f"{d.total_views:,}" in text_of(page, "total-views")


def test_a_site_without_data(world: Any, tmp_path: Path) -> None:
    """max(minute) of no rows is 1970-01-01, not NULL: the empty-site branches now fire."""
    from forumpulse.dashboards.report import _event

    store, _ = world
    with pytest.raises(ReportError, match=r"no data for site 'nosuch' \(sites with data: .*forum"):
        generate_event_report(store, topic_id=101, site="nosuch", out_dir=tmp_path)
    peak = T0 + timedelta(hours=5)
    det = [{"id": "ev-empty", "kind": "topic_surge", "site": "nodata", "scope": "topic:1", "start_ts": peak - timedelta(hours=1),
            "end_ts": None, "peak_ts": peak, "observed": 0.5, "expected": 0.1, "score": 5.0, "label": "surge",
            "state": "open", "detail": "{}", "updated_at": peak}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    _tid, _grp, t0, t1, meta = _event(store, "nodata", "ev-empty")
    assert meta["end"] == peak and t1 == peak and t0 < t1  # an open event without site_minute rows: up to its peak


def test_event_report_shows_times_in_the_site_time_zone(world: Any, tmp_path: Path) -> None:
    """The same report with the site's zone: every time shown moves by the zone's offset and names it (UTC+08:00
    for Asia/Kuala_Lumpur, UTC+01:00 / +02:00 for Europe/Berlin), the numbers are unchanged."""
    store, _ = world
    utc = generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO, out_dir=tmp_path / "u").read_text()
    kl = generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO, out_dir=tmp_path / "k",
                               tz="Asia/Kuala_Lumpur").read_text()
    peak = datetime.strptime(text_of(utc, "peak-time").split(" UTC")[0].strip()[-16:], "%Y-%m-%d %H:%M")
    assert f"{peak + timedelta(hours=8):%Y-%m-%d %H:%M} UTC+08:00" in text_of(kl, "peak-time")
    assert f"{FROM + timedelta(hours=8):%Y-%m-%d %H:%M} UTC+08:00" in text_of(kl, "summary")
    assert " UTC " not in text_of(kl, "summary") and text_of(kl, "total-views") == text_of(utc, "total-views")
    berlin = generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO, out_dir=tmp_path / "b",
                                   tz="Europe/Berlin").read_text()
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC\+0[12]:00", text_of(berlin, "peak-time"))


def test_chart_ticks_fall_on_the_zones_own_hours(tmp_path: Path) -> None:
    """Asia/Kathmandu is UTC+05:45: ticks placed in UTC would read :45 on its axis; they are placed on its own
    hours, as written (the chart's label names the zone)."""
    import matplotlib.dates as mdates
    from forumpulse.dashboards.report import _fig, _save, _shown_in

    times = [FROM + timedelta(minutes=10 * i) for i in range(6 * 48)]
    with _shown_in("Asia/Kathmandu") as zone:
        plt, fig, ax = _fig()
        ax.plot(times, range(len(times)))
        _save(plt, fig, tmp_path / "c.png")
    ticks = [mdates.num2date(t, tz=zone) for t in ax.get_xticks()]
    assert ticks and all(t.minute == 0 for t in ticks), ticks
    assert ax.get_xlabel() == "Asia/Kathmandu time"


def test_wording_helpers_read_as_an_editor_says_them() -> None:
    from forumpulse.dashboards.report import _count, _interval_name, _one, _pct, _ratio

    assert [_interval_name(b) for b in (60, 600, 3600, 10800, 43200, 86400)] == [
        "minute", "10 minutes", "hour", "3 hours", "12 hours", "day"]
    assert (_count(1, "view"), _count(46, "view"), _count(1234, "view")) == ("1 view", "46 views", "1,234 views")
    assert (_count(1, "person", "people"), _count(2, "reply", "replies")) == ("1 person", "2 replies")
    assert (_pct(51.84), _pct(0.35), _pct(0.0123), _pct(0.0)) == ("51.8%", "0.3%", "0.012%", "0%")
    assert (_pct(4.56e-5), _pct(99.96), _pct(100.0)) == ("<0.001%", "99.9%", "100.0%")  # no 1e-05%, no false 100%
    assert (_ratio(0.2), _ratio(1.34), _ratio(28.71), _ratio(150.2)) == ("0.2", "1.3", "29", "150")
    assert (_one(60), _one(3600), _one(600), _one(10800)) == ("one minute", "one hour", "10 minutes", "3 hours")


def test_a_topic_nobody_viewed_gets_no_peak_sentence(world: Any, tmp_path: Path) -> None:
    """Only bots viewed it: the summary said "Interest peaked at 00:00 with 0 views"."""
    store, _ = world
    rows = [dict(r, is_bot=True, bot_name="Googlebot") for r in _steady("botsonly", range(0, 120), {5: 1})]
    rows += _steady("botsonly", range(0, 120), {6: 2})
    store.insert("requests", fx.requests_table(rows), dedup_token="botsonly")
    page = generate_event_report(store, topic_id=5, site="botsonly", time_from=T0, time_to=T0 + timedelta(hours=2),
                                 out_dir=tmp_path).read_text()
    summary = text_of(page, "summary")
    assert "drew 0 views and 0 replies from 0 people" in summary and "No person viewed it" in summary, summary
    assert "peaked" not in summary and "busiest" not in summary


def _readers(site: str, topic: int, n: int, client: Any) -> list[dict[str, Any]]:
    """``n`` human views of ``topic`` over two hours, the k-th from ``client(k)``."""
    return [dict(fx.REQ_DEFAULTS, site=site, ts=T0 + timedelta(seconds=20 * k), client_ip=client(k), topic_id=topic,
                 page_kind="topic_view", url=f"/t/{topic}", path=f"/t/{topic}") for k in range(n)]


def test_views_from_one_address_block_are_named_in_event_and_daily_reports(world: Any, tmp_path: Path) -> None:
    """A flood from one /24 counts as human views (the rollups leave out known bots only): the reports say how
    many came from which block; a topic read by many addresses gets no such note."""
    store, _ = world
    many = lambda k: f"::ffff:203.{k // 250}.{k % 250}.1"  # noqa: E731 - one reader per /24
    rows = _readers("flooded", 9, 300, many) + _readers("flooded", 9, 120, lambda k: f"::ffff:198.51.100.{k % 7 + 1}")
    rows += _readers("flooded", 8, 300, many)
    rows += _readers("flooded", 8, 60, lambda k: f"::ffff:198.51.100.{k % 7 + 1}")  # the block reads topic 8 too
    store.insert("requests", fx.requests_table(rows), dedup_token="flooded")
    t1 = T0 + timedelta(hours=2)
    page = generate_event_report(store, topic_id=9, site="flooded", time_from=T0, time_to=t1,
                                 out_dir=tmp_path / "e9").read_text()
    note = text_of(page, "concentrated")
    assert "120 of the 420 views with a stored address (28.6%) came from one address block, 198.51.100.0/24" in note, note
    # and what the figures are without it (editorial trial: named, not subtracted): 300 of the forum's 780 less
    # the block's 180 (its views of topic 8 too; subtracting only its 120 here would read 45.5%)
    assert ("Without that block's views, Topic #9 drew 300 views: 50.0% of the forum's topic views without that "
            "block (53.8% with it; the other figures above include it)." in html.unescape(note)), html.unescape(note)
    calm = generate_event_report(store, topic_id=8, site="flooded", time_from=T0, time_to=t1,
                                 out_dir=tmp_path / "e8").read_text()
    assert 'id="concentrated"' not in calm
    daily = generate_daily_report(store, T0.date(), tmp_path / "d", site="flooded").read_text()
    topics = text_of(daily, "topics")
    assert "120 from 198.51.100.0/24" in topics and topics.count("/24") == 1, topics
    assert 'id="concentrated"' in daily


@pytest.mark.parametrize(("tz", "hours"), [("Asia/Kuala_Lumpur", 8), ("Asia/Kolkata", 5.5)])
def test_chart_intervals_run_on_the_sites_clock(world: Any, tmp_path: Path, tz: str, hours: float) -> None:
    """A 30-day range has 3-hour intervals: they begin at the site's 00:00, 03:00 ... (they began at UTC's:
    02:00, 05:00 ... in Kuala Lumpur, and at half past in India), and the range begins at the site's midnight."""
    from forumpulse.dashboards.report import _align, _bucket_seconds

    store, _ = world
    zone = ZoneInfo(tz)
    t0 = datetime(T0.year, T0.month, T0.day, tzinfo=zone) - timedelta(days=5)
    page = generate_event_report(store, topic_id=101, time_from=t0, time_to=t0 + timedelta(days=30),
                                 out_dir=tmp_path, tz=tz).read_text()
    assert _bucket_seconds(timedelta(days=30)) == 10800
    busiest = text_of(page, "peak-time").split(" UTC")[0].strip()[-5:]
    assert int(busiest[:2]) % 3 == 0 and busiest[3:] == "00", busiest
    assert f"{t0:%Y-%m-%d} 00:00 UTC+0{int(hours)}:{int(hours % 1 * 60):02d} –" in page
    off = int(hours * 3600)
    assert _align(t0 + timedelta(minutes=1), 10800, up=False, off=off) == t0


def test_an_interval_the_data_begins_inside_is_not_drawn(world: Any, tmp_path: Path) -> None:
    """A site whose data begins at 05:00 in a range of 3-hour intervals from 03:00: the 03:00 interval holds one
    hour of data; drawn whole it looked like a ramp-up. Left out of the charts and said so; counted in totals."""
    store, _ = world
    store.insert("requests", fx.requests_table(_steady("late", range(5 * 60, 40 * 1440), {4: 2})), dedup_token="late")
    t0 = T0 + timedelta(hours=3)
    page = generate_event_report(store, topic_id=4, site="late", time_from=t0, time_to=t0 + timedelta(days=30),
                                 out_dir=tmp_path).read_text()
    note = text_of(page, "cut-note")
    assert f"The interval before {(t0 + timedelta(hours=3)):%Y-%m-%d %H:%M} UTC is not drawn: the data begins inside it" \
        in note and "(60 of 180 minutes)" in note, note
    assert f"{2 * (30 * 1440 - 120):,}" in text_of(page, "total-views")  # counted from 05:00 on


def test_the_scopes_earlier_surge_is_left_out_of_its_baseline(world: Any, tmp_path: Path) -> None:
    """Editorial trial's open item: a topic that surged three days before the report had that surge in its "usual"
    share, so the report understated the new surge.  A stored topic_surge of the same scope in the baseline days is
    left out (as the detector leaves it out of its own baseline), and the summary says so."""
    store, _ = world
    rows = _steady("relapse", range(0, 8 * 1440), {5: 1, 6: 4})  # topic 5: 20% of topic views
    rows += _steady("relapse", range(3 * 1440 + 600, 3 * 1440 + 780), {5: 20})  # day 3, 3 hours: a surge
    store.insert("requests", fx.requests_table(rows), dedup_token="relapse")
    args = dict(topic_id=5, site="relapse", time_from=T0 + timedelta(days=7), time_to=T0 + timedelta(days=8))
    before = text_of(generate_event_report(store, out_dir=tmp_path / "a", **args).read_text(), "summary")
    assert "its usual 20.0%" not in before and "left out" not in before  # the surge inflates the usual share
    det = [{"id": "relapse-1", "kind": "topic_surge", "site": "relapse", "scope": "topic:5",
            "start_ts": T0 + timedelta(days=3, minutes=605), "end_ts": T0 + timedelta(days=3, minutes=779),
            "peak_ts": T0 + timedelta(days=3, minutes=700), "observed": 0.8, "expected": 0.2, "score": 9.0,
            "label": "surge", "state": "closed", "detail": '{"window_minutes": 5}', "updated_at": T0}]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    after = text_of(generate_event_report(store, out_dir=tmp_path / "b", **args).read_text(), "summary")
    assert "its usual 20.0%" in after and "(60 views per hour against 60 usually)" in after, after
    assert "Its surge detected in those days (2024-03-13 10:05 UTC to 2024-03-13 12:59 UTC) is left out" in after


def test_left_out_surges_at_the_baseline_edges_and_overlapping_are_counted_once(world: Any, tmp_path: Path) -> None:
    """Review: a surge at the start of the baseline's data, one running into the report's range, and two stored
    detections of one surge (history re-runs) leave each minute out once: the usual rate stays the steady one."""
    store, _ = world
    rows = _steady("edges", range(0, 8 * 1440), {5: 1, 6: 4})
    rows += _steady("edges", range(0, 600), {5: 20})  # the first 10 hours of data
    rows += _steady("edges", range(3 * 1440, 3 * 1440 + 300), {5: 20})  # day 3, two overlapping detections
    rows += _steady("edges", range(7 * 1440 - 240, 7 * 1440 - 3), {5: 20})  # up to the report's start, still open
    store.insert("requests", fx.requests_table(rows), dedup_token="edges")

    def surge(i: int, a: int, b: int | None) -> dict[str, Any]:
        return {"id": f"edges-{i}", "kind": "topic_surge", "site": "edges", "scope": "topic:5",
                "start_ts": T0 + timedelta(minutes=a), "end_ts": None if b is None else T0 + timedelta(minutes=b),
                "peak_ts": T0 + timedelta(minutes=a), "observed": 0.8, "expected": 0.2, "score": 9.0, "label": "surge",
                "state": "open" if b is None else "closed", "detail": '{"window_minutes": 5}', "updated_at": T0}

    # (a minute's 20 views of _steady spill over 2+ minutes: the detections end 3 minutes after the rows)
    det = [surge(1, 5, 602), surge(2, 3 * 1440 + 5, 3 * 1440 + 200), surge(3, 3 * 1440 + 100, 3 * 1440 + 302),
           surge(4, 7 * 1440 - 235, None)]
    store.insert("detections", fx.ts_table(det, ("start_ts", "end_ts", "peak_ts", "updated_at")))
    page = generate_event_report(store, topic_id=5, site="edges", time_from=T0 + timedelta(days=7),
                                 time_to=T0 + timedelta(days=8), out_dir=tmp_path).read_text()
    summary = text_of(page, "summary")
    assert "its usual 20.0%" in summary and "(60 views per hour against 60 usually)" in summary, summary
    assert "Its surges detected in those days (" in summary and summary.count(" to 2024-") == 4


def test_durations_count_a_gaps_last_silent_minute() -> None:
    """A pipeline_gap ends on its last silent minute, an outage on the first minute back: a 22:00-00:00 gap read
    "1 h 59 min" next to an outage's "3 h 00 min" (user trial 40)."""
    from forumpulse.dashboards.report import _duration

    a = datetime(2024, 2, 4, 22, 0, tzinfo=UTC)
    assert _duration(a, a + timedelta(minutes=119), "pipeline_gap") == "2 h 00 min"
    assert _duration(a, a + timedelta(minutes=120), "outage") == "2 h 00 min"
    assert _duration(a, None, "pipeline_gap") == ""


def test_a_peak_multiple_from_few_views_says_so(world: Any, tmp_path: Path) -> None:
    """A topic with 2 views in its busiest 10 minutes read "65× at its peak" with no word of caution (user trial
    40): under 20 views the summary says what the peak rests on; a busy topic's summary does not."""
    store, _ = world
    quiet = text_of(generate_event_report(store, topic_id=106, time_from=FROM, time_to=TO,
                                          out_dir=tmp_path / "q").read_text(), "summary")
    assert re.search(r"× at its peak \(the peak rests on only \d+ views?: too few for the multiple to mean much\)",
                     quiet), quiet
    busy = text_of(generate_event_report(store, topic_id=101, time_from=FROM, time_to=TO,
                                         out_dir=tmp_path / "b").read_text(), "summary")
    assert "at its peak" in busy and "rests on only" not in busy
