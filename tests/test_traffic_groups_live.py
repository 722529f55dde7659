"""Live topic groups follow their tables: a group defined by a title pattern gains a topic whose title arrives
after the detector started (a new election thread), and ``topic_groups`` rows added while it runs count -- the
groups are re-read when those tables change, with the group's history rebuilt from its members' views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
from forumpulse.detectors.traffic import TopicSurgeDetector, TrafficDetector, load_rules
from forumpulse.pipeline.config import Settings, SiteConfig, TopicGroup
from forumpulse.pipeline.store import Store

DAY0 = datetime(2026, 3, 9, tzinfo=UTC)  # a Monday
NEW_TOPIC = 777
SURGE = DAY0 + timedelta(days=2, hours=12)


def _requests(site: str, end: datetime) -> pa.Table:
    """Human topic views (Poisson 30 a minute over topics 1..50) from ``DAY0`` to ``end``; from ``SURGE`` on, 20
    more a minute on the new topic ``NEW_TOPIC``."""
    rng = np.random.default_rng(5)
    minutes = int((end - DAY0).total_seconds() // 60)
    idx = np.repeat(np.arange(minutes), rng.poisson(30, minutes))
    topic = rng.integers(1, 51, len(idx))
    first = int((SURGE - DAY0).total_seconds() // 60)
    extra = np.repeat(np.arange(first, minutes), 20)
    idx = np.concatenate([idx, extra])
    topic = np.concatenate([topic, np.full(len(extra), NEW_TOPIC)])
    n = len(idx)
    ts = int(DAY0.timestamp() * 1000) + idx * 60_000 + rng.integers(0, 60_000, n)
    return pa.table({
        "ts": pa.array(ts, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "site": [site] * n, "origin_host": ["web1"] * n, "origin_file": ["access.log"] * n,
        "source_format": ["combined"] * n,
        "client_ip": [f"::ffff:10.1.{(i >> 8) & 255}.{i & 255}" for i in rng.integers(0, 5000, n)],
        "method": ["GET"] * n, "url": ["/t"] * n, "path": ["/t"] * n,
        "status": pa.array(np.full(n, 200), pa.uint16()), "bytes": pa.array(rng.integers(500, 9000, n), pa.uint64()),
        "topic_id": pa.array(topic, pa.uint64()), "page_kind": ["topic_view"] * n,
        "is_static": [False] * n, "is_bot": [False] * n,
    })


def _title(store: Store, site: str, topic: int, title: str) -> None:
    store.insert("topic_titles", pa.table({
        "site": [site], "topic_id": pa.array([topic], pa.uint64()), "title": [title], "forum": ["news"],
        "updated_at": pa.array([datetime.now(UTC)], pa.timestamp("ms", tz="UTC"))}))


def test_live_groups_follow_new_titles(store: Store) -> None:
    site = "forum-groups"
    settings = Settings(sites=[SiteConfig(name=site, timezone="UTC")],
                        topics={"groups": [TopicGroup(name="election", site=site, title_pattern="(?i)election")]})
    store.insert("requests", _requests(site, SURGE + timedelta(hours=1)))
    _title(store, site, 3, "Football")
    det = TrafficDetector(settings, sites=[site])
    det.run_once(store, SURGE - timedelta(hours=1))  # warm-up: the election group has no member yet
    assert det.sites[site].topics.groups == {"election": set()}
    _title(store, site, NEW_TOPIC, "Election night: live results")  # the thread opens while the detector runs
    dets = det.run_once(store, SURGE + timedelta(minutes=30))
    assert det.sites[site].topics.groups == {"election": {NEW_TOPIC}}
    scopes = {d.scope for d in dets if d.kind == "topic_surge"}
    assert {"group:election", f"topic:{NEW_TOPIC}"} <= scopes, scopes
    # nothing changed since: the groups are not re-read (same fingerprint), the next run adds nothing new
    assert det.run_once(store, SURGE + timedelta(minutes=30)) == []


def test_set_groups_rebuilds_the_group_history_from_its_members() -> None:
    """A group defined while the detector runs gets its past window/baseline views from its members' topic views,
    exactly as if it had been configured from the start (so an old busy topic joining a group is no "surge")."""
    rules = load_rules()
    rng = np.random.default_rng(3)
    feed = []
    for i in range(300):
        ids, counts = np.unique(rng.integers(1, 20, 40), return_counts=True)
        feed.append((DAY0 + timedelta(minutes=i), {int(t): (int(v), 0) for t, v in zip(ids, counts, strict=True)}))
    from_start = TopicSurgeDetector(rules, {"g": {1, 2, 3}}, "s")
    late = TopicSurgeDetector(rules, {}, "s")
    for i, (m, views) in enumerate(feed):
        if i == 200:
            late.set_groups({"g": {1, 2, 3}})
        total = sum(v for v, _ in views.values())
        a = list(from_start.update(m, views, total))
        b = list(late.update(m, views, total))
        if i >= 200:
            assert [d.scope for d in a] == [d.scope for d in b]
    st_a, st_b = from_start.state, late.state
    assert st_a.base_sum == st_b.base_sum and st_a.win_sum == st_b.win_sum and st_a.win_replies == st_b.win_replies
    late.set_groups({})
    assert not any(k.startswith("group:") for k in late.state.base_sum) and late.cusum == {}
