"""Retired log sources (``source_retired``, migration 0011; ``forumpulse sources retire``): a source that stops
for good no longer keeps a ``pipeline_gap`` open forever nor shows ``dead`` forever -- and one that sends again
is an ordinary source again."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from forumpulse.detectors.series import Detection
from forumpulse.detectors.traffic import SourceGapDetector, TrafficDetector, detect_history, load_rules
from forumpulse.pipeline.consumer import source_status
from forumpulse.pipeline.sources import NOT_RETIRED, parse_source, retire, retired_sources
from test_traffic_cases import _local, _settings, build_requests
from test_traffic_liveness_review import _beat, _beat_log

T0 = datetime(2026, 3, 11, 9, 0, tzinfo=UTC)


def _m(minutes: int, seconds: int = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, seconds=seconds)


def _feed(gaps: SourceGapDetector, src: str, first: int, last: int, n: int = 10) -> list[Detection]:
    return [d for m in range(first, last + 1) for d in gaps.update(src, _m(m), n)]


def test_a_retirement_closes_the_open_gap_where_it_begins_and_opens_no_other() -> None:
    gaps = SourceGapDetector(load_rules(), "forum")
    _feed(gaps, "web1/access.log", 0, 59)  # 10 lines a minute, last line in 09:59
    opened = list(gaps.tail(_m(72), set()))
    assert [(d.scope, d.start, d.end) for d in opened] == [("source:web1/access.log", _m(60), None)]
    gaps.set_retired({"web1/access.log": _m(90, 20)})  # ops retire it at 10:30:20
    assert list(gaps.tail(_m(85), set())) == []  # not yet: the retirement begins later
    closed = list(gaps.tail(_m(91), set()))
    assert [(d.scope, d.start, d.end, d.state, d.detail["closed_by"]) for d in closed] == [
        ("source:web1/access.log", _m(60), _m(89), "closed", "retired")]
    assert closed[0].detail["retired_at"] == "2026-03-11T10:30:20Z"
    assert list(gaps.tail(_m(300), set())) == [] and not gaps.open  # its silence goes on: no gap
    # undone (a mistake): judged as before at the next run -- the gap open again from the same start (same id)
    gaps.set_retired({})
    assert [(d.scope, d.start, d.end) for d in gaps.tail(_m(301), set())] == [
        ("source:web1/access.log", _m(60), None)]
    gaps.set_retired({"web1/access.log": _m(90, 20)})
    assert [d.detail["closed_by"] for d in gaps.tail(_m(302), set())] == ["retired"]
    # it sends again after the retirement: an ordinary source again, whose next silence is a gap (and its return
    # after the retirement reports no gap for the retired silence)
    assert _feed(gaps, "web1/access.log", 310, 369) == []
    again = list(gaps.tail(_m(382), set()))
    assert [(d.scope, d.start, d.end) for d in again] == [("source:web1/access.log", _m(370), None)]


def test_a_source_retired_before_its_gap_would_open_gets_none() -> None:
    gaps = SourceGapDetector(load_rules(), "forum")
    _feed(gaps, "web1/access.log", 0, 59)
    _feed(gaps, "web2/access.log", 0, 59)
    gaps.set_retired({"web1/access.log": _m(61), "web3/access.log": _m(0)})  # web3: never seen: nothing
    opened = list(gaps.tail(_m(80), set()))
    assert [d.scope for d in opened] == ["source:web2/access.log"]  # web2, not retired, falls silent as before
    # a retirement dated before the source's last line is moot: the line came after it
    gaps = SourceGapDetector(load_rules(), "forum")
    _feed(gaps, "web1/access.log", 0, 59)
    gaps.set_retired({"web1/access.log": _m(30)})
    assert [d.scope for d in gaps.tail(_m(80), set())] == ["source:web1/access.log"]


CASE = {"site": {"name": "case-retire", "timezone": "UTC"}, "start": "2026-03-01", "days": 11, "per_minute": 20,
        "weekend_factor": 1.0, "sources": [{"file": "main.log", "share": 0.85}, {"file": "minor.log", "share": 0.15}],
        "events": [{"kind": "source_gap", "source": "main.log", "from": "2026-03-11T10:00", "to": "2026-03-12T00:00"}]}


def _gaps(dets: Any, since: datetime) -> list[tuple[Any, ...]]:
    return sorted((d.scope, d.start, d.end, d.detail.get("closed_by")) for d in dets
                  if d.kind == "pipeline_gap" and d.scope.startswith("source:") and d.start >= since)


def _start(store: Any, case: dict[str, Any]) -> tuple[str, Any, TrafficDetector, dict[str, Detection]]:
    """The case's requests stored; its name, settings, a live detector and the detections it reports, by id."""
    name = case["site"]["name"]
    store.insert("requests", build_requests(case))
    settings = _settings([case])
    return name, settings, TrafficDetector(settings, sites=[name]), {}


def test_a_retired_source_is_judged_alike_live_in_history_and_after_a_restart(store: Any) -> None:
    """main.log (85% of the site) stops for good at 10:00, heartbeats and all (its server removed): its gap opens
    live; ops retire it at 10:30:10 (``retire``, as the command writes it).  Live every minute, history and a
    live detector started at 11:10 all close the gap at 10:29 (``closed_by: retired``) and open no other;
    without the retirement the gap stays open (the control)."""
    name, settings, det, live = _start(store, CASE)
    since = _local(CASE, "2026-03-11T09:00")
    t = _local(CASE, "2026-03-11T09:50:30")
    end = _local(CASE, "2026-03-11T11:10:30")
    retired_at = _local(CASE, "2026-03-11T10:30:10")
    control: list[tuple[Any, ...]] = []
    while t <= end:
        hb = t - timedelta(seconds=5)
        _beat(store, name, hb - timedelta(seconds=1), hb, file="minor.log")
        if t < _local(CASE, "2026-03-11T10:00"):
            _beat(store, name, hb - timedelta(seconds=1), hb, file="main.log")
        if t >= retired_at and not control:
            control = _gaps(live.values(), since)
            retire(store, name, [parse_source("source:origin/main.log")], retired_at, "web server removed")
        for d in det.run_once(store, t):
            live[d.id] = d
        t += timedelta(minutes=1)
    opened = _local(CASE, "2026-03-11T10:00")
    assert control == [("source:origin/main.log", opened, None, None)]  # open before the retirement
    want = [("source:origin/main.log", opened, _local(CASE, "2026-03-11T10:29"), "retired")]
    assert _gaps(live.values(), since) == want
    hist = detect_history(store, since, end.replace(second=0), settings, sites=[name])
    assert _gaps(hist, since) == want
    restarted = TrafficDetector(settings, sites=[name]).run_once(store, end)
    assert _gaps(restarted, since) == want
    # the status page: main.log retired (not dead), minor.log live
    states = {s.origin_file: s.state for s in source_status(store, now=end.timestamp()) if s.site == name}
    assert states == {"main.log": "retired", "minor.log": "live"}
    # undone: judged as before -- the live detector's gap open again (same id), dead on the status page, and
    # history keeps the gap open to the end
    retire(store, name, [("origin", "main.log")], NOT_RETIRED, now=datetime.now(UTC) + timedelta(seconds=1))
    assert retired_sources(store, name) == {}
    assert _gaps(det.run_once(store, end + timedelta(minutes=1)), since) == [
        ("source:origin/main.log", opened, None, None)]
    assert {s.origin_file: s.state for s in source_status(store, now=end.timestamp())
            if s.site == name}["main.log"] == "dead"
    assert _gaps(detect_history(store, since, end.replace(second=0), settings, sites=[name]), since) == [
        ("source:origin/main.log", opened, None, None)]


def test_the_status_page_counts_a_retirement_from_its_minute_until_a_line_after_it() -> None:
    """``source_status``'s side, in the detectors' terms: retired once the retirement has come and no line
    arrived since its minute rounded up; a retirement still ahead (judged at an earlier time) does not hold
    yet; a line after it makes the source ordinary.  A source retired right after it stopped, within the same
    minute, is retired (the detectors judge whole minutes)."""
    from forumpulse.pipeline.sources import retirement_minute

    assert retirement_minute(datetime(2026, 3, 11, 9, 59, 10, tzinfo=UTC)) == datetime(2026, 3, 11, 10, 0,
                                                                                        tzinfo=UTC)
    assert retirement_minute(datetime(2026, 3, 11, 10, 0, tzinfo=UTC)) == datetime(2026, 3, 11, 10, 0, tzinfo=UTC)
    from forumpulse.pipeline.consumer import _classify, _Row

    t = 1_800_000_000  # a whole minute
    rows = [_Row("forum", "web1", "/a.log", (t - 400) * 1000, (t - 400) * 1000)]  # last line 06:40 before t

    def state(retired_ms: int, now: float) -> str:
        [s] = _classify(rows, now, 300.0, 180.0, retired={("forum", "web1", "/a.log"): retired_ms})[0]
        return s.state

    assert state(t * 1000, t + 10) == "retired"
    assert state(t * 1000, t - 10) == "dead"       # the retirement is still ahead at that time
    assert state((t - 480) * 1000, t + 10) == "dead"  # dated before the last line: moot
    assert state((t - 420) * 1000, t + 10) == "dead"  # the last line came after the (whole-minute) retirement
    assert state((t - 430) * 1000, t + 10) == "dead"  # ... and after the one rounded up to t - 420
    assert state((t - 390) * 1000, t + 10) == "retired"  # 10 s after the last line, in its minute


def test_parse_source_reads_a_gap_scope() -> None:
    assert parse_source("source:web1//var/log/apache2/access.log") == ("web1", "/var/log/apache2/access.log")
    assert parse_source("10.0.0.7/tcp:5140") == ("10.0.0.7", "tcp:5140")
    for bad in ("web1", "web1/", "/access.log", "source:"):
        with pytest.raises(ValueError, match="not a source"):
            parse_source(bad)


def test_the_retire_command_refuses_an_unknown_source_and_writes_a_known_one(tmp_path: Path) -> None:
    """`forumpulse sources retire` on an embedded store: a typo is refused with the site's sources listed and
    nothing written; a known source is written (one JSON line) and `sources status` shows it retired."""
    url = f"chdb:{tmp_path / 'chdb'}"
    # a source heard on the live path (its liveness row), written by another process (one chDB folder a process)
    seed = subprocess.run([sys.executable, "-c", f"""
from datetime import UTC, datetime
from forumpulse.pipeline.store import migrate, open_store
from test_traffic_liveness_review import _beat, _beat_log
st = open_store({url!r})
migrate(st)
t = datetime(2026, 3, 11, 9, 0, tzinfo=UTC)
_beat(st, "forum", t, t, host="web1", file="/var/log/apache2/access.log")
import numpy as np
from table_rows import forum_requests
# a source only loaded by `forumpulse ingest` (lines, no liveness row): web1/access.log
recent = int(datetime.now(UTC).timestamp() * 1000) - 3_600_000  # within the raw data's retention
st.insert("requests", forum_requests("forum", np.array([recent]), np.array([200]), np.random.default_rng(1)))
st.close()
"""], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent)
    assert seed.returncode == 0, seed.stderr
    fp = [sys.executable, "-m", "forumpulse.pipeline.cli"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*fp, "sources", *args, "--store", url], capture_output=True, text=True, timeout=120)

    typo = run("retire", "source:web1//var/log/apache2/acess.log", "--site", "forum")
    # a usage error (2, as the CLI's others), the closest name suggested, the ingested-only source listed too
    assert typo.returncode == 2, typo.stderr
    assert ("Did you mean: web1//var/log/apache2/acess.log -> web1//var/log/apache2/access.log?" in typo.stderr
            and "Its sources on the live path: web1//var/log/apache2/access.log; loaded by forumpulse ingest: "
            "web1/access.log" in typo.stderr), typo.stderr
    # written, with a warning: dated before its last line (moot), and an undo of what was not retired
    moot = run("retire", "web1//var/log/apache2/access.log", "--site", "forum", "--at", "2026-03-11T08:00Z")
    assert moot.returncode == 0 and "after the retirement" in moot.stderr, moot.stderr
    assert "the site is retired too" not in moot.stderr  # moot: the site still has a source
    undo = run("retire", "web1//var/log/apache2/access.log", "--site", "forum", "--undo")
    assert undo.returncode == 0 and "warning" not in undo.stderr, undo.stderr
    again = run("retire", "web1//var/log/apache2/access.log", "--site", "forum", "--undo")
    assert again.returncode == 0 and "was not retired" in again.stderr, again.stderr
    ok = run("retire", "source:web1//var/log/apache2/access.log", "--site", "forum", "--note", "removed")
    assert ok.returncode == 0 and "warning" not in ok.stderr, ok.stderr
    assert "site 'forum' lines in its last hour is retired now: the site is retired too" in ok.stderr, ok.stderr
    out = json.loads(ok.stdout.splitlines()[0])
    assert out["source"] == "web1//var/log/apache2/access.log" and out["note"] == "removed"
    future = run("retire", "web1//var/log/apache2/access.log", "--site", "forum", "--at", "2999-01-01")
    assert future.returncode == 2 and "in the future" in future.stderr, future.stderr
    status = run("status", "--site", "forum")
    assert status.returncode == 0, status.stderr
    rows = [json.loads(x) for x in status.stdout.splitlines()]
    assert [(r["origin_file"], r["state"]) for r in rows] == [("/var/log/apache2/access.log", "retired")]


SITE_GONE = {**CASE, "site": {"name": "case-retire-site", "timezone": "UTC"},
             "events": [{"kind": "source_gap", "source": f, "from": "2026-03-11T10:00", "to": "2026-03-11T12:00"}
                        for f in ("main.log", "minor.log")]}


def _site_dets(dets: Any, since: datetime) -> list[tuple[Any, ...]]:
    """The site-scope detections (the site's gap, dips, outages) since ``since``."""
    return sorted((d.kind, d.start, d.end, d.detail.get("closed_by")) for d in dets
                  if not d.scope.startswith(("source:", "topic:", "group:")) and d.start >= since)


def test_a_site_whose_every_source_is_retired_has_no_gap_nor_outage_after_it(store: Any) -> None:
    """Both log files of a site stop at 10:00, heartbeats and all (the site decommissioned): the site's own
    ``pipeline_gap`` opens live; ops retire both files at 10:30:10.  Live, history and a restarted live run
    close it at 10:29 (``closed_by: retired``), feed no zeros (no dip, no outage) and open nothing more while
    the site stays silent; its lines returning at 12:00 (after the retirement: an ordinary site again) report
    no gap for the retired silence.  Retiring one file of the two leaves the site's gap open (the control)."""
    name, settings, det, live = _start(store, SITE_GONE)
    since = _local(SITE_GONE, "2026-03-11T09:00")
    t = _local(SITE_GONE, "2026-03-11T09:50:30")
    end = _local(SITE_GONE, "2026-03-11T11:10:30")
    retired_at = _local(SITE_GONE, "2026-03-11T10:30:10")
    opened = _local(SITE_GONE, "2026-03-11T10:00")
    while t <= end:
        hb = t - timedelta(seconds=5)
        if t < opened:
            for f in ("main.log", "minor.log"):
                _beat(store, name, hb - timedelta(seconds=1), hb, file=f)
        if t >= retired_at and not retired_sources(store, name):
            # the control: one file retired, the other silent without heartbeats -> the site's gap stays open
            retire(store, name, [("origin", "main.log")], retired_at)
            for d in det.run_once(store, t):
                live[d.id] = d
            assert _site_dets(live.values(), since) == [("pipeline_gap", opened, None, None)]
            retire(store, name, [("origin", "minor.log")], retired_at)
        for d in det.run_once(store, t):
            live[d.id] = d
        t += timedelta(minutes=1)
    want = [("pipeline_gap", opened, _local(SITE_GONE, "2026-03-11T10:29"), "retired")]
    assert _site_dets(live.values(), since) == want
    assert [d.detail["retired_at"] for d in live.values() if d.scope == "pipeline"] == ["2026-03-11T10:30:10Z"]
    assert _site_dets(TrafficDetector(settings, sites=[name]).run_once(store, end), since) == want
    back = _local(SITE_GONE, "2026-03-11T13:00")
    assert _site_dets(detect_history(store, since, end.replace(second=0), settings, sites=[name]), since) == want
    assert _site_dets(detect_history(store, since, back, settings, sites=[name]), since) == want
    # undone: the site's gap is open again at the next run (same start, so the same id)
    retire(store, name, [("origin", "main.log"), ("origin", "minor.log")], NOT_RETIRED,
           now=datetime.now(UTC) + timedelta(seconds=1))
    assert _site_dets(det.run_once(store, end + timedelta(minutes=1)), since) == [
        ("pipeline_gap", opened, None, None)]


@pytest.mark.parametrize("late", [False, True], ids=["retired-on-time", "retired-30-min-late"])
def test_a_decommissioned_site_whose_hosts_heartbeat_on_has_its_outage_closed_by_the_retirement(
        store: Any, late: bool) -> None:
    """The likelier decommission: the site's vhost is removed but its hosts stay up for other sites, so its
    files' heartbeats go on.  Its silence reads as an outage (the site answers nothing while its shippers are
    alive), correctly so until ops retire both files as of 10:50:10; then the outage closes (``closed_by:
    retired``) by the minute before the retirement -- also when ops write it half an hour later (``--at`` in the
    past: the live runs fed zeros meanwhile) -- no other site detection follows, and no pipeline_gap is
    reported.  Live, history and a restarted run (with the heartbeat log) agree.  Before the change the outage
    stayed open for good."""
    case = {**SITE_GONE, "site": {"name": "case-retire-vhost", "timezone": "UTC"}}
    name, settings, det, live = _start(store, case)
    t = _local(case, "2026-03-11T09:50:30")
    stopped = _local(case, "2026-03-11T10:00")
    retired_at = _local(case, "2026-03-11T10:50:10")
    written_at = retired_at + timedelta(minutes=30 if late else 0)
    end = _local(case, "2026-03-11T11:40:30")
    before: list[tuple[Any, ...]] = []
    while t <= end:
        hb = t - timedelta(seconds=5)
        for f in ("main.log", "minor.log"):
            _beat(store, name, min(hb - timedelta(seconds=1), stopped - timedelta(seconds=20)), hb, file=f)
            _beat_log(store, name, hb, file=f)
        if t >= written_at and not before:
            before = _site_dets(live.values(), stopped)
            retire(store, name, [("origin", "main.log"), ("origin", "minor.log")], retired_at)
        for d in det.run_once(store, t):
            live[d.id] = d
        t += timedelta(minutes=1)
    assert [(k, e) for k, _s, e, _c in before] == [("outage", None)]  # open until the retirement
    after = _site_dets(live.values(), stopped)
    assert [(k, e, c) for k, _s, e, c in after] == [("outage", _local(case, "2026-03-11T10:49"), "retired")]
    assert not [d for d in live.values() if d.kind == "pipeline_gap"]
    assert _site_dets(detect_history(store, stopped, end.replace(second=0), settings, sites=[name]),
                      stopped) == after
    assert _site_dets(TrafficDetector(settings, sites=[name]).run_once(store, end), stopped) == after


def test_site_retired_asks_the_sources_sending_when_the_site_fell_silent() -> None:
    """``site_retired``: every source that sent in the hour before the site's last line must be retired; one
    that had stopped long before is not asked, retired or not (a process that has run for days and one started
    an hour ago judge the same sources)."""
    gaps = SourceGapDetector(load_rules(), "forum")
    _feed(gaps, "old/access.log", -3000, -2000)  # stopped two days before, never retired
    _feed(gaps, "web1/access.log", 0, 59)
    _feed(gaps, "web2/access.log", 0, 30)  # quieter: its last line half an hour before the site's
    gaps.set_retired({"web1/access.log": _m(70, 5)})
    assert gaps.site_retired(_m(80)) is None  # web2 sent in the last hour and is not retired
    gaps.set_retired({"web1/access.log": _m(70, 5), "web2/access.log": _m(65)})
    assert gaps.site_retired(_m(69)) is None  # web1's retirement has not come yet
    assert gaps.site_retired(_m(80)) == _m(70, 5)  # the latest of them; old/access.log not asked
    gaps.set_retired({"web1/access.log": _m(70, 5), "web2/access.log": _m(65), "old/access.log": _m(90)})
    assert gaps.site_retired(_m(80)) == _m(70, 5)  # (nor its later retirement in a clean-up)
    assert _feed(gaps, "web2/access.log", 81, 81) == []  # back after its retirement: the site is not gone
    assert gaps.site_retired(_m(82)) is None
