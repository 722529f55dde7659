"""Bot detection: every UA in rules/bots.yaml is a test case."""

from __future__ import annotations

import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.enrich import BotDetector, Enricher, RulesError

DETECTOR = BotDetector()
NAMED = [(e.name, ua) for e in [*DETECTOR.doc.custom, *DETECTOR.doc.names] for ua in e.cases]


def test_every_entry_has_cases() -> None:
    entries = [*DETECTOR.doc.custom, *DETECTOR.doc.names]
    assert entries and all(e.cases for e in entries), [e.name for e in entries if not e.cases]
    assert len({e.name for e in entries}) == len(entries)


@pytest.mark.parametrize(("name", "ua"), NAMED, ids=[f"{n}:{ua[:50]}" for n, ua in NAMED])
def test_bot_case(name: str, ua: str) -> None:
    assert DETECTOR.detect(ua) == (True, name)
    assert DETECTOR.detect(ua) == (True, name)  # cached answer is the same


@pytest.mark.parametrize("ua", DETECTOR.doc.not_bots, ids=[ua[:60] for ua in DETECTOR.doc.not_bots])
def test_browser_is_not_a_bot(ua: str) -> None:
    assert DETECTOR.detect(ua) == (False, None)


BROWSERS = [ua for e in DETECTOR.doc.browsers for ua in e.cases]


@pytest.mark.parametrize("ua", BROWSERS, ids=[ua[:60] for ua in BROWSERS])
def test_browser_entries_are_not_bots_though_crawlerdetect_flags_them(ua: str) -> None:
    """A ``browsers`` entry earns its place: crawlerdetect alone calls its UA a crawler (Lynx's "libwww-FM")."""
    from crawlerdetect import CrawlerDetect

    assert DETECTOR.detect(ua) == (False, None)
    assert CrawlerDetect().is_crawler(ua)


def test_every_browser_entry_has_cases() -> None:
    assert DETECTOR.doc.browsers and all(e.cases for e in DETECTOR.doc.browsers)
    # an entry is the browser's real shape: a tool whose UA merely starts with "Lynx/" is still a bot
    assert DETECTOR.detect("Lynx/1 python-requests/2.31.0")[0] is True


@pytest.mark.parametrize("ua", [None, "", "   "])
def test_empty_user_agent_is_not_a_bot_but_is_counted(ua: str | None) -> None:
    e = Enricher(Settings())
    assert e.derive("forum", "GET", "/", "", None, ua)[3:] == (False, None)
    assert e.derive("forum", "GET", "/", "", None, "curl/8.0")[3:] == (True, "curl")
    assert e.empty_user_agents == (1 if not ua else 0)


def test_unlisted_crawler_gets_a_short_stable_name() -> None:
    name = DETECTOR.detect("Mozilla/5.0 (compatible; FooSearchBot/3.1; +https://foo.example/bot)")
    assert name == (True, "FooSearchBot")
    is_bot, bot_name = DETECTOR.detect("Java/17.0.2")
    assert is_bot and bot_name and len(bot_name) <= 64 and " " not in bot_name


def test_extra_patterns_from_settings() -> None:
    e = Enricher(Settings(bots={"extra_patterns": [r"^(?P<name>acme-sync)/", r"internal-health"]}))
    assert e.derive("forum", "GET", "/", "", None, "acme-sync/2.0 (+ops)")[3:] == (True, "acme-sync")
    assert e.derive("forum", "GET", "/", "", None, "probe internal-health v1")[3:] == (True, "internal-health")
    assert Enricher(Settings()).derive("forum", "GET", "/", "", None, "acme-sync/2.0 (+ops)")[3] is False
    # without a name group the matched text names the bot, without the "/" that ends it
    e = Enricher(Settings(bots={"extra_patterns": [r"(?i)forummonitor/"]}))
    assert e.derive("forum", "GET", "/", "", None, "ForumMonitor/2.0 (ops)")[3:] == (True, "ForumMonitor")
    with pytest.raises(RulesError, match="extra_patterns"):
        Enricher(Settings(bots={"extra_patterns": ["("]}))


def test_ua_cache_is_bounded_and_consistent() -> None:
    d = BotDetector(cache_size=4)
    uas = [f"Mozilla/5.0 (compatible; Googlebot/2.{i})" for i in range(50)]
    for ua in uas:
        assert d.detect(ua) == (True, "Googlebot")
    assert len(d._cache) <= 8
    assert d.detect(uas[0]) == (True, "Googlebot")
