"""Topic/page-kind and static rules: every fixture case in the YAML files is a test case."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.enrich import (
    BUILTIN_ENGINES,
    REFERER_TOPIC,
    Enricher,
    Rule,
    RulesError,
    StaticCase,
    StaticClassifier,
    TopicCase,
    TopicRules,
    benchmark_derive,
    builtin_rules_path,
    load_post_map,
    load_topic_rules,
    status_page_kind,
    status_page_kinds,
    synthetic_requests,
)
from forumpulse.pipeline.record import PAGE_KINDS
from hypothesis import given, settings
from hypothesis import strategies as st

FIX = Path(__file__).parent / "fixtures" / "rules"
BUILTIN = load_topic_rules(builtin_rules_path("topics.yaml"))
USER = load_topic_rules(FIX / "site_rules.yaml", user=True)
STATIC = StaticClassifier()
ENRICHER = Enricher(Settings())


def _cases(rules: list[Rule]) -> list[tuple[Rule, TopicCase]]:
    return [(r, c) for r in rules for c in r.model.cases]


def _id(rc: tuple[Rule, TopicCase]) -> str:
    return f"{rc[0].id}:{rc[1].method} {rc[1].url}"


CASES = _cases(BUILTIN)


def test_every_rule_has_cases_and_every_engine_has_rules() -> None:
    assert all(r.model.cases for r in BUILTIN), [r.id for r in BUILTIN if not r.model.cases]
    assert {r.engine for r in BUILTIN} == set(BUILTIN_ENGINES)
    assert {r.page_kind for r in BUILTIN} <= set(PAGE_KINDS)


@pytest.mark.parametrize("rc", CASES, ids=[_id(rc) for rc in CASES])
def test_builtin_case_answered_by_its_rule(rc: tuple[Rule, TopicCase]) -> None:
    rule, case = rc
    rules = TopicRules(BUILTIN, dict(case.post_map))
    path, query = case.split()
    mine = rules.select("forum", [rule.engine])
    topic, kind, got, _ = rules.classify(mine, case.method, path, query)
    if topic == REFERER_TOPIC:  # the topic of the referring page, as the processors resolve it per line
        topic = rules.topic_from_referer(mine, case.referer)
    assert (topic, kind, got.id if got else None) == (case.topic, case.kind, rule.id)
    # With every engine on (the default), an earlier rule of another engine may answer -- with the same result.
    topic, kind, got, _ = rules.classify(rules.select("forum"), case.method, path, query)
    if topic == REFERER_TOPIC:
        topic = rules.topic_from_referer(rules.select("forum"), case.referer)
    assert (topic, kind) == (case.topic, case.kind)
    assert got is not None


@pytest.mark.parametrize("rc", CASES, ids=[_id(rc) for rc in CASES])
def test_builtin_rules_do_not_collide(rc: tuple[Rule, TopicCase]) -> None:
    """No fixture URL is matched by two engines with different answers."""
    _, case = rc
    rules = TopicRules(BUILTIN, dict(case.post_map))
    path, query = case.split()
    answers = {}
    for engine in BUILTIN_ENGINES:
        topic, kind, got, _ = rules.classify(rules.select("forum", [engine]), case.method, path, query)
        if got is not None:
            answers[engine] = (topic, kind)
    assert len(set(answers.values())) == 1, answers


def test_derive_agrees_with_cases_through_the_cache() -> None:
    """The cached hot path gives the same answers as the rules, on a second (warm) pass as well."""
    enricher = Enricher(Settings())
    plain = [c for _, c in CASES if not c.post_map]
    for _ in range(2):
        for c in plain:
            path, query = c.split()
            topic, kind, is_static, is_bot, bot_name = enricher.derive("forum", c.method, path, query, None, None)
            if topic == REFERER_TOPIC:
                topic = enricher.topic_from_referer("forum", c.referer)
            assert (topic, kind, is_static, is_bot, bot_name) == (c.topic, c.kind, False, False, None), c.url


def test_query_independent_results_are_cached_by_path_without_leaking_query_dependence() -> None:
    e = Enricher(Settings(), cache_size=8)
    # Path-only rule: session parameters must not matter.
    for q in ("", "s=1", "s=2&_xfToken=x"):
        assert e.derive("forum", "GET", "/threads/a.9/", q, None, None)[:2] == (9, "topic_view")
    assert len(e._by_path) == 1 and len(e._by_query) == 0
    # Query-dependent rule on the same path with different queries.
    assert e.derive("forum", "GET", "/viewtopic.php", "t=5", None, None)[:2] == (5, "topic_view")
    assert e.derive("forum", "GET", "/viewtopic.php", "t=6", None, None)[:2] == (6, "topic_view")
    assert e.derive("forum", "GET", "/showthread.php", "tid=7", None, None)[:2] == (7, "topic_view")
    assert e.derive("forum", "GET", "/showthread.php", "x=1", None, None)[:2] == (None, "other")
    assert e.derive("forum", "GET", "/showthread.php", "t=8", None, None)[:2] == (8, "topic_view")
    # The caches stay bounded.
    for i in range(100):
        e.derive("forum", "GET", f"/threads/a.{i}/", "", None, None)
        e.derive("forum", "GET", "/viewtopic.php", f"t={i + 1}", None, None)
    assert len(e._by_path) <= 16 and len(e._by_query) <= 16
    assert e.derive("forum", "GET", "/viewtopic.php", "t=5", None, None)[:2] == (5, "topic_view")


def test_index_php_routes() -> None:
    rules = TopicRules(BUILTIN)
    sel = rules.select("forum")
    assert rules.classify(sel, "GET", "/forum/index.php", "threads/x.12/page-3&s=1")[:2] == (12, "topic_view")
    assert rules.classify(sel, "GET", "/index.php", "/topic/77-x/")[:2] == (77, "topic_view")
    # SMF parameters are not routes
    assert rules.classify(sel, "GET", "/index.php", "topic=5.0")[:2] == (5, "topic_view")
    # a file merely ending in index.php is not index.php
    assert rules.classify(sel, "GET", "/myindex.php", "threads/x.12/")[:2] == (None, "other")


@pytest.mark.parametrize("first", ["", "foo=1"])
def test_a_bare_index_php_is_not_cached_for_its_routes(first: str) -> None:
    """``/index.php`` without a route must not be cached by path: its ``other`` would answer every later
    ``/index.php?threads/x.123/`` (XenForo/Invision without friendly URLs)."""
    for engines, route in ((["xenforo"], "threads/hello.123/"), (["invision"], "/topic/123-hello/")):
        e = Enricher(Settings(sites=[{"name": "f", "engines": engines}]))
        assert e.derive("f", "GET", "/index.php", first, None, None)[:2] == (None, "other")
        assert e.derive("f", "GET", "/index.php", route, None, None)[:2] == (123, "topic_view"), engines
        assert e.derive("f", "GET", "/forum/index.php", first, None, None)[:2] == (None, "other")
        assert e.derive("f", "GET", "/forum/index.php", route, None, None)[:2] == (123, "topic_view"), engines


def test_engine_selection_per_site() -> None:
    s = Settings(sites=[{"name": "xf", "engines": ["xenforo"]}, {"name": "bb", "engines": ["phpbb", "mybb"]}])
    e = Enricher(s)
    assert e.derive("xf", "GET", "/threads/a.5/", "", None, None)[:2] == (5, "topic_view")
    assert e.derive("xf", "GET", "/viewtopic.php", "t=5", None, None)[:2] == (None, "other")
    assert e.derive("bb", "GET", "/viewtopic.php", "t=5", None, None)[:2] == (5, "topic_view")
    assert e.derive("bb", "GET", "/showthread.php", "tid=6", None, None)[:2] == (6, "topic_view")
    assert e.derive("bb", "GET", "/threads/a.5/", "", None, None)[:2] == (None, "other")
    # an unconfigured site uses every engine
    assert e.derive("other", "GET", "/d/9-x", "", None, None)[:2] == (9, "topic_view")
    assert {r.engine for r in e.rules_for("bb")} == {"phpbb", "mybb"}


USER_CASES = _cases(USER)


@pytest.mark.parametrize("rc", USER_CASES, ids=[_id(rc) for rc in USER_CASES])
def test_user_rules_file_cases(rc: tuple[Rule, TopicCase]) -> None:
    rule, case = rc
    e = Enricher(Settings(topics={"rules_file": str(FIX / "site_rules.yaml")},
                          sites=[{"name": "news", "engines": ["xenforo"]}]))
    site = sorted(rule.sites)[0] if rule.sites else "forum"
    path, query = case.split()
    assert e.classify(site, case.method, path, query) == (case.topic, case.kind, False, rule.id)


def test_user_rules_override_and_site_restriction() -> None:
    e = Enricher(Settings(topics={"rules_file": str(FIX / "site_rules.yaml")}))
    # the user's xenforo.thread replaced the built-in one: /unread no longer a topic view
    assert e.classify("forum", "GET", "/threads/a.5/unread", "") == (5, "other", False, "xenforo.thread_action")
    assert sum(r.id == "xenforo.thread" for r in e.topics.rules) == 1
    # restricted to site "news"
    assert e.classify("news", "GET", "/article/42-x", "")[:2] == (42, "topic_view")
    assert e.classify("forum", "GET", "/article/42-x", "")[:2] == (None, "other")


def test_post_map_from_settings() -> None:
    assert load_post_map(FIX / "post_map.csv") == {456: 123, 789: 124}
    e = Enricher(Settings(topics={"post_map_csv": str(FIX / "post_map.csv")}))
    assert e.derive("forum", "GET", "/viewtopic.php", "p=789", None, None)[:2] == (124, "topic_view")
    assert e.derive("forum", "GET", "/viewtopic.php", "p=1", None, None)[:2] == (None, "topic_view")
    assert e.derive("forum", "GET", "/viewtopic.php", "t=3&p=789", None, None)[:2] == (3, "topic_view")


def test_bad_post_map_names_line(tmp_path: Path) -> None:
    p = tmp_path / "pm.csv"
    p.write_text("1,2\n3,x\n")
    with pytest.raises(ValueError, match=r"pm.csv:2"):
        load_post_map(p)


@pytest.mark.parametrize(("body", "message"), [
    ("version: 1\nrules:\n  - {id: a, engine: e, path: '(', page_kind: other}\n", "bad regular expression"),
    ("version: 1\nrules:\n  - {id: a, engine: e, page_kind: page}\n", "unknown page_kind"),
    ("version: 1\nrules:\n  - {id: a, engine: e, page_kind: other}\n  - {id: a, engine: e, page_kind: api}\n",
     "duplicate rule id"),
    ("version: 1\nrules:\n  - {id: a, engine: e, page_kind: other, topic: ['cookie:x']}\n", "unknown topic source"),
    ("version: 1\nrules:\n  - {id: a, engine: e, page_kind: reply, topic: [referer, 'query:t']}\n",
     "must come last"),
    ("version: 1\nrules:\n  - {id: a, engine: e, path: 'x', page_kind: other, topic: [path]}\n",
     "needs a \\(\\?P<topic>"),
    ("version: 1\nrules:\n  - {id: a, engine: e, page_kind: other, colour: red}\n", "colour"),
    ("- just a list\n", "top level must be a mapping"),
])
def test_invalid_rules_files_are_refused_with_a_reason(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "rules.yaml"
    p.write_text(body)
    with pytest.raises(RulesError, match=message):
        load_topic_rules(p)
    with pytest.raises(RulesError, match=r"rules\.yaml"):
        Enricher(Settings(topics={"rules_file": str(p)}))


def test_topic_ids_out_of_range_are_none() -> None:
    rules = TopicRules(BUILTIN)
    sel = rules.select("forum")
    assert rules.classify(sel, "GET", "/viewtopic.php", "t=0")[:2] == (None, "topic_view")
    assert rules.classify(sel, "GET", "/viewtopic.php", "t=99999999999999999999")[:2] == (None, "topic_view")
    assert rules.classify(sel, "GET", "/viewtopic.php", f"t={2**63 - 1}")[:2] == (2**63 - 1, "topic_view")


# ------------------------------------------------------------------------------------------------ statics

STATIC_CASES = STATIC.doc.cases


@pytest.mark.parametrize("case", STATIC_CASES, ids=[f"{c.path} {c.content_type}" for c in STATIC_CASES])
def test_static_case(case: StaticCase) -> None:
    assert STATIC.path_is_static(case.path) or STATIC.content_type_is_static(case.content_type) or not case.static
    _, kind, is_static, _, _ = ENRICHER.derive("forum", "GET", case.path, "", case.content_type, None)
    assert is_static is case.static
    assert (kind == "static") is case.static


def test_static_content_type_never_overrides_a_topic_rule_and_extra_extensions_apply() -> None:
    e = Enricher(Settings(bots={"static_extensions": ["rss", ".XML"]}))
    assert e.derive("forum", "GET", "/threads/a.5/", "", "image/png", None)[:3] == (5, "topic_view", True)
    assert e.derive("forum", "GET", "/feed.rss", "", None, None)[:3] == (None, "static", True)
    assert e.derive("forum", "GET", "/sitemap.xml", "", None, None)[:3] == (None, "static", True)
    assert Enricher(Settings()).derive("forum", "GET", "/feed.rss", "", None, None)[:3] == (None, "other", False)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["GET", "POST", "", "HEAD"]), st.text(max_size=60), st.text(max_size=40),
       st.one_of(st.none(), st.text(max_size=20)), st.one_of(st.none(), st.text(max_size=40)))
def test_derive_never_raises_and_answers_within_the_contract(
        method: str, path: str, query: str, ct: str | None, ua: str | None) -> None:
    topic, kind, is_static, is_bot, bot_name = ENRICHER.derive("forum", method, path, query, ct, ua)
    assert kind in PAGE_KINDS
    assert topic is None or 0 < topic < 2**63
    assert isinstance(is_static, bool) and isinstance(is_bot, bool)
    assert (bot_name is not None) is is_bot


def test_synthetic_mix_is_classified_as_generated() -> None:
    """The benchmark's XenForo-style mix (the simulator's URL shapes) lands in the expected kinds."""
    reqs = synthetic_requests(2000, seed=7)
    e = Enricher(Settings())
    kinds: Counter[str] = Counter()
    for m, p, q, ct, ua in reqs:
        topic, kind, is_static, _, _ = e.derive("forum", m, p, q, ct, ua)
        kinds[kind] += 1
        if p.startswith("/threads/"):
            assert topic == int(p.split(".")[1].split("/")[0]) and kind in ("topic_view", "reply")
        assert is_static is (kind == "static")
    assert set(kinds) == {"topic_view", "reply", "forum", "search", "login", "api", "other", "static"}
    res = benchmark_derive(reqs[:300])
    assert res["requests"] == 300 and res["cold_per_s"] > 0 and res["warm_per_s"] > 0


def test_single_page_app_replies_take_the_topic_of_their_referer_on_both_paths() -> None:
    """Discourse/Flarum/XenForo-API replies carry no topic in their URL: the processors take it from the page the
    reply was posted from, identically on the vectorised and the per-line path; GETs are untouched."""
    from forumpulse.pipeline.process import Processor, SourceContext

    def line(i: int, req: str, ref: str) -> bytes:
        return (f'203.0.113.{i} - - [22/Jan/2024:10:00:{i:02d} +0800] "{req} HTTP/1.1" 200 5 "{ref}" '
                f'"Mozilla/5.0"\n').encode()

    lines = [
        line(1, "POST /posts", "https://forum.example/t/election-night/555"),
        line(2, "POST /posts.json", "https://forum.example/t/election-night/555/12?u=bob"),
        line(3, "POST /posts", "https://forum.example/c/news/5"),
        line(4, "POST /posts", "-"),
        line(5, "POST /posts?topic_id=56", "https://forum.example/t/other/555"),
        line(6, "GET /t/election-night/555", "https://www.google.com/"),
        line(7, "POST /posts", "https://forum.example/t/second-topic/777"),
    ]
    s = Settings()
    ctx = SourceContext(site="forum", origin_host="web1", origin_file="a.log", format="combined")
    fast = Processor(s).process(lines, ctx).requests.to_pydict()
    ref = Processor(s).process_reference(lines, ctx).requests.to_pydict()
    assert fast["topic_id"] == ref["topic_id"] == [555, 555, 0, 0, 56, 555, 777]
    assert fast["page_kind"] == ref["page_kind"] == ["reply"] * 5 + ["topic_view", "reply"]


REPLY_FLOWS = [  # (engine, GET of the reply form, POST that submits it, topic)
    ("vbulletin", "/newreply.php?do=newreply&noquote=1&t=77", "/newreply.php?do=postreply&t=77", 77),
    ("vbulletin", "/newreply.php?t=77", "/newreply.php?t=77", 77),
    ("phpbb", "/posting.php?mode=reply&f=2&t=123", "/posting.php?mode=reply&f=2&t=123", 123),
    ("phpbb", "/posting.php?mode=quote&f=2&t=123&p=456", "/posting.php?mode=quote&f=2&t=123&p=456", 123),
    ("smf", "/index.php?action=post;topic=123.0", "/index.php?action=post2;topic=123.0", 123),
    ("mybb", "/newreply.php?tid=123", "/newreply.php?tid=123&processed=1", 123),
    ("invision", "/topic/123-hello/?do=reply", "/topic/123-hello/?do=reply", 123),
]


@pytest.mark.parametrize("engine,form,submit,topic", REPLY_FLOWS)
@pytest.mark.parametrize("engines", ["one", "all"])
def test_a_reply_is_its_submission_not_the_form(engine: str, form: str, submit: str, topic: int,
                                                 engines: str) -> None:
    """Opening the reply form (a GET) and sending it (a POST) is one reply: the form is ``other`` with its topic
    (neither a reply nor a topic view), the POST a reply."""
    e = Enricher(Settings(sites=[{"name": "f", "engines": [engine] if engines == "one" else []}]))
    fp, _, fq = form.partition("?")
    sp, _, sq = submit.partition("?")
    assert e.derive("f", "GET", fp, fq, None, None)[:2] == (topic, "other")
    assert e.derive("f", "POST", sp, sq, None, None)[:2] == (topic, "reply")


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "PUT", "DELETE"])
def test_only_get_and_post_are_topic_views_or_replies(method: str, tmp_path: Path) -> None:
    """A HEAD (uptime monitors, link checkers) or any method but GET/POST reads or posts nothing: ``other`` with
    the topic kept, for built-in and user rules alike; other kinds are unchanged."""
    user = tmp_path / "rules.yaml"
    user.write_text("version: 1\nrules:\n  - {id: my.view, engine: custom, path: '^/story/(?P<topic>\\d+)$', "
                    "topic: [path], page_kind: topic_view}\n")
    s = Settings(sites=[{"name": "f", "engines": []}])
    s.topics.rules_file = str(user)
    e = Enricher(s)
    for path, query, want in (("/threads/a.9/", "", (9, "topic_view")), ("/viewtopic.php", "t=5", (5, "topic_view")),
                              ("/t/slug/55", "", (55, "topic_view")), ("/story/12", "", (12, "topic_view"))):
        assert e.derive("f", "GET", path, query, None, None)[:2] == want
        assert e.derive("f", method, path, query, None, None)[:2] == (want[0], "other"), (method, path)
    assert e.derive("f", "POST", "/threads/a.9/add-reply", "", None, None)[:2] == (9, "reply")
    assert e.derive("f", method, "/threads/a.9/add-reply", "", None, None)[:2] == (9, "other")
    assert e.derive("f", method, "/forums/", "", None, None)[:2] == (None, "forum")
    assert e.derive("f", method, "/styles/x.css", "", None, None)[:2] == (None, "static")


def test_status_rule_scalar_and_vectorised_agree_on_every_kind_and_status():
    """The status rule of the page kind (reference path: ``status_page_kind`` per line; fast path:
    ``status_page_kinds`` on columns): views only for 2xx/304, replies below 400, unknown status keeps the kind."""
    statuses = [None, *range(1000)]
    for kind in PAGE_KINDS:
        want = [status_page_kind(kind, s) for s in statuses]
        got = status_page_kinds(pa.array([kind] * len(statuses), pa.string()), pa.array(statuses, pa.uint16()))
        assert got.to_pylist() == want, kind
        if kind not in ("topic_view", "reply"):
            assert set(want) == {kind}
    view = {s: status_page_kind("topic_view", s) for s in statuses}
    assert [s for s, k in view.items() if k == "topic_view"] == [None, 0, *range(200, 300), 304]
    reply = {s: status_page_kind("reply", s) for s in statuses}
    assert [s for s, k in reply.items() if k == "reply"] == [None, *range(400)]
    assert set(view.values()) | set(reply.values()) == {"topic_view", "reply", "other"}
