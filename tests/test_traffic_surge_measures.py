"""Topic surges on replies and visitors (rules v6), next to views: a heated thread (many posts, few new readers)
and a topic whose visitors jump while views per visitor drop are surges naming their measure; sparse replies
(0 -> a few) are not; steady traffic with replies and visitors stays quiet; a views-only surge is unchanged
(pure, no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from forumpulse.detectors.series import Detection
from forumpulse.detectors.traffic import TopicSurgeDetector, load_rules

T0 = datetime(2026, 3, 2, tzinfo=UTC)
POP = 1.0 / np.arange(1, 201)
POP /= POP.sum()


def _background(rng: np.random.Generator, rate: float, reply_p: float,
                views_per_visitor: float) -> tuple[dict[int, tuple[int, int, int]], int]:
    """One minute of forum traffic: Poisson topic views over topics 100-299 (Zipf-like), each view a reply with
    probability ``reply_p``; visitors per topic ~ views / ``views_per_visitor`` (at least 1)."""
    total = int(rng.poisson(rate))
    views: dict[int, list[int]] = {}
    for tid in rng.choice(np.arange(100, 300), size=total, p=POP):
        vr = views.setdefault(int(tid), [0, 0])
        if rng.random() < reply_p:
            vr[1] += 1
        else:
            vr[0] += 1
    out = {t: (v, r, max(1, round((v + r) / views_per_visitor))) for t, (v, r) in views.items()}
    return out, sum(v for v, _, _ in out.values())


def _feed(det: TopicSurgeDetector, minutes: int, extra: Any = None, rate: float = 100.0, reply_p: float = 0.02,
          views_per_visitor: float = 1.5, seed: int = 1, start: int = 0) -> list[Detection]:
    """Feed ``minutes`` minutes from ``T0 + start``; ``extra(i)`` returns {topic: (views, replies, visitors)}
    added to minute ``i`` (a topic's counts replaced)."""
    rng = np.random.default_rng(seed)
    out: list[Detection] = []
    for i in range(start, start + minutes):
        counts, total = _background(rng, rate, reply_p, views_per_visitor)
        for tid, c in (extra(i) if extra else {}).items():
            total += c[0] - counts.get(tid, (0, 0, 0))[0]
            counts[tid] = c
        out.extend(det.update(T0 + timedelta(minutes=i), counts, total))
    return out


WARM = 2 * 1440


def test_heated_thread_replies_open_a_surge_naming_replies() -> None:
    """Topic 50 is read steadily (3 views/min by ~2 readers, a reply every 20 minutes); for an hour its few
    readers post 1.5 replies per minute (a heated thread: no new readers, views unchanged).  Only the reply
    share surges; the detection says so.  Topic 50's counts are given as (views, replies): visitors default to 0."""

    def thread(i: int) -> dict[int, tuple[int, ...]]:
        heated = WARM <= i < WARM + 60
        replies = (1 if i % 2 else 2) if heated else (1 if i % 20 == 0 else 0)
        return {50: (3, replies)}

    det = TopicSurgeDetector(load_rules(), {}, "forum")
    dets = [d for d in _feed(det, WARM + 90, thread) if d.scope == "topic:50"]
    assert dets, "heated thread not reported"
    first = dets[0]
    assert first.start >= T0 + timedelta(minutes=WARM), first.to_json()
    assert first.start <= T0 + timedelta(minutes=WARM + 15), first.to_json()  # 8 replies reached in ~6 minutes
    assert first.detail["measure"] == "replies" and first.detail["measures"] == ["replies"], first.to_json()
    by = first.detail["by_measure"]
    assert by["replies"]["magnitude"] >= 3 and by["views"]["magnitude"] < 3, by
    assert first.observed == pytest.approx(by["replies"]["share"], abs=1e-5)
    assert first.expected == pytest.approx(by["replies"]["baseline_share"], rel=1e-3)
    assert by["replies"]["window_minutes"] == load_rules()["topic"]["reply_window_minutes"]
    last = dets[-1]
    assert last.state == "closed" and last.end is not None and last.end >= T0 + timedelta(minutes=WARM + 60)


def test_visitors_jump_while_views_per_visitor_drop() -> None:
    """Topic 60 has a regular: 10 views per minute from one reader.  For an hour the same 10 views per minute come
    from 10 different visitors (a link shared elsewhere): the view share does not move, the visitor share
    jumps ~10x."""

    def topic(i: int) -> dict[int, tuple[int, ...]]:
        return {60: (10, 0, 10 if WARM <= i < WARM + 60 else 1)}

    det = TopicSurgeDetector(load_rules(), {}, "forum")
    dets = [d for d in _feed(det, WARM + 90, topic) if d.scope == "topic:60"]
    assert dets, "visitor surge not reported"
    first = dets[0]
    assert T0 + timedelta(minutes=WARM) <= first.start <= T0 + timedelta(minutes=WARM + 5), first.to_json()
    assert first.detail["measure"] == "visitors" and "views" not in first.detail["measures"], first.to_json()
    by = first.detail["by_measure"]
    assert by["visitors"]["magnitude"] >= 3 and by["views"]["magnitude"] < 1.5, by
    assert dets[-1].state == "closed"


def test_views_surge_keeps_its_view_share_figures() -> None:
    """A views surge (with visitors along) is still led by views: observed / expected are the view share, as in
    rules v5, and the surge runs over the same minutes."""

    def topic(i: int) -> dict[int, tuple[int, ...]]:
        return {70: (30, 0, 20)} if WARM <= i < WARM + 30 else {}

    got = {}
    for measures in (["views"], ["views", "replies", "visitors"]):
        det = TopicSurgeDetector(load_rules(overrides={"topic": {"measures": measures}}), {}, "forum")
        got[len(measures)] = [d for d in _feed(det, WARM + 60, topic, seed=3) if d.scope == "topic:70"]
    old, new = got[1], got[3]
    assert old and new
    assert new[0].detail["measure"] == "views"
    assert (new[0].start, new[0].observed, new[0].expected) == (old[0].start, old[0].observed, old[0].expected)
    assert new[0].detail["share"] == old[0].detail["share"]


def test_zero_to_a_few_replies_is_no_surge() -> None:
    """Replies are sparse: on a quiet night (20 topic views per minute, ~1 reply per 25 minutes) topic 80, read
    but never replied to, gets 2 replies in one minute, and later topic 81 gets 3: no surge of them or of their
    groups, the reply count floor ``min_replies`` holds.  Without it (``min_replies: 1``) the 3 replies open a
    group surge on the binomial tail alone (3 of the few replies of 30 minutes at the new-topic share)."""

    def burst(i: int) -> dict[int, tuple[int, ...]]:
        if i == WARM:
            return {80: (1, 2, 1)}
        if i == WARM + 40:
            return {81: (1, 3, 1)}
        return {80: (1, 0, 1), 81: (1, 0, 1)} if i % 30 == 0 else {}

    def run(rules: dict[str, Any]) -> list[Detection]:
        det = TopicSurgeDetector(rules, {"g": {80}, "h": {81}}, "forum")
        return [d for d in _feed(det, WARM + 60, burst, rate=20.0, reply_p=0.002, seed=5)
                if d.scope in ("topic:80", "topic:81", "group:g", "group:h")]

    assert not (dets := run(load_rules())), [d.to_json() for d in dets]
    loose = run(load_rules(overrides={"topic": {"min_replies": 1}}))
    assert [(d.scope, d.detail["measure"]) for d in loose][:1] == [("group:h", "replies")], [d.to_json() for d in loose]


def test_steady_traffic_with_replies_and_visitors_raises_no_surge() -> None:
    """Three days of steady traffic (200 topic views per minute, 2% replies, 1.5 views per visitor): no surge on
    any measure after the first hours."""
    det = TopicSurgeDetector(load_rules(), {"election": {101, 102}}, "forum")
    dets = _feed(det, 3 * 1440, rate=200.0, seed=2)
    late = [d for d in dets if d.start >= T0 + timedelta(hours=12)]
    assert not late, [d.to_json() for d in late[:3]]


def test_unknown_measure_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"topic\.measures"):
        TopicSurgeDetector(load_rules(overrides={"topic": {"measures": ["views", "likes"]}}), {}, "forum")
