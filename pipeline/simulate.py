"""``forumpulse simulate``: a deterministic generator of forum access logs with ground truth.

What it writes into ``--out DIR``:

* one access log per source (``<name>.log``): Apache ``combined``, Apache ``combined_d`` (combined + `` %D``
  microseconds) or squid native (``%9d.%03d %6d client code/status bytes method URL - hier/peer type``).
  Lines are in time order within each file; Apache timestamps carry the site's UTC offset, squid ones are UTC
  epoch seconds with milliseconds.
* ``topics.csv`` (``site,topic_id,title,forum``): the titles of every simulated topic.
* ``truth.json``: the run's parameters, sources and line counts, topic groups, every injected scenario (kind,
  UTC start/end as ISO text and epoch ms, local start, scope, magnitudes, lines) and the benign look-alikes
  (crawler bursts, NAT gateways, an uptime monitor) that a detector must *not* flag.

The traffic model (all of it data in this module's tables):

* a XenForo forum: a few thousand topics with Zipf popularity, ~24 forums, members, statics after page views,
  replies (POST ``/threads/<slug>.<id>/add-reply``), search, login, API and ``job.php`` calls, some URLs
  carrying session parameters (``?s=<hex>``, ``_xfToken=``) for the privacy filter to strip;
* daily (night trough, evening peak) and weekly seasonality in the site's time zone;
* browsers with fixed user agents, IPv4 and IPv6; NAT gateways (one address, many user agents, a sustained
  share of the traffic); crawlers (Googlebot, bingbot, AhrefsBot, ...) in bursts; an uptime monitor (HEAD / each
  minute);
* statuses (200/304/301/403/404/5xx), bytes by kind (``-`` for 0 in Apache), elapsed times.

Scenarios (``--scenarios``): ``event``, ``holiday``, ``outage``, ``flood_ip``, ``flood_prefix``,
``flood_distributed``, ``scan``, ``transfer_collapse``, ``pipeline_gap``; ``default`` places all of them after
two normal weeks (a weekly baseline before each) and puts the holiday week on a real public holiday of
``--country`` when one falls in the run.  ``kind@YYYY-MM-DDTHH:MM[/90m|3h|2d]`` places one at a local time; an
``event`` shorter than its default 18 h rises and decays in proportion (5 h and 3 h at 18 h).

Guarantees:

* Deterministic: the output is a pure function of the options (same seed, byte-identical files).  Every random
  draw comes from a generator keyed by (seed, hour, source, component), so the result does not depend on chunking.
* ``lines`` (``--lines N``) makes the total number of written lines exactly ``N``: the normal traffic adapts, the
  scenario magnitudes stay absolute (a flood stays at its requests/s); it fails when scenarios would be more
  than half of ``N``.
* Magnitudes in ``truth.json`` are the generator's targets; ``lines`` there are exact counts of the lines the
  scenario's own traffic contributed.  Tests recompute the effects from the written lines.

Misuse: ``pipeline_gap`` windows are whole UTC hours (they are rounded outward); DST changes inside an hour are
applied at the next hour; ``combined`` logs no elapsed time, so ``transfer_collapse`` needs a ``squid`` or
``combined_d`` source (it is skipped from ``default`` otherwise, and an error when asked for explicitly).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

GENERATOR_VERSION = 1
FORMATS = ("combined", "combined_d", "squid")
SCENARIO_KINDS = (
    "event", "holiday", "outage", "flood_ip", "flood_prefix", "flood_distributed", "scan",
    "transfer_collapse", "pipeline_gap",
)
DEFAULT_SCENARIOS = SCENARIO_KINDS
HOUR_MS = 3_600_000
MIN_MS = 60_000

# ----------------------------------------------------------------------------------------------------------
# Static tables
# ----------------------------------------------------------------------------------------------------------

BROWSER_UAS: tuple[str, ...] = (
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Safari/537.36 Edg/121.0.0.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:122.0) Gecko/20100101 Firefox/122.0",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:121.0) Gecko/20100101 Firefox/121.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2.1 Safari/605.1.15",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14.2; rv:122.0) Gecko/20100101 Firefox/122.0",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Safari/537.36",
    "Mozilla/5.0 (X11; Ubuntu; Linux x86_64; rv:121.0) Gecko/20100101 Firefox/121.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_2_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 16_6 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/16.6 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) CriOS/121.0.6167.66 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (iPad; CPU OS 17_2 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.2 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 10; K) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 14; SM-S918B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.6099.230 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 13; SM-A536E) AppleWebKit/537.36 (KHTML, like Gecko) SamsungBrowser/23.0 Chrome/115.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 12; Redmi Note 11) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/119.0.6045.193 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 13; CPH2387) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 11; V2027) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/118.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (Linux; Android 14; Pixel 7) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.6167.101 Mobile Safari/537.36",
    "Mozilla/5.0 (Android 13; Mobile; rv:122.0) Gecko/122.0 Firefox/122.0",
    "Mozilla/5.0 (Linux; Android 13; SM-G991B) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Mobile Safari/537.36 [FBAN/EMA;FBLC/en_US;FBAV/390.0.0.12.106;]",
    "Mozilla/5.0 (Windows NT 6.1; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/109.0.0.0 Safari/537.36",
)
#: (name, user agent, address prefixes, share of crawler volume, max burst rate req/s)
CRAWLERS: tuple[tuple[str, str, tuple[str, ...], float, float], ...] = (
    ("Googlebot", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
     ("66.249.66.", "66.249.68.", "66.249.79."), 0.38, 12.0),
    ("bingbot", "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
     ("157.55.39.", "40.77.167.", "207.46.13."), 0.18, 6.0),
    ("AhrefsBot", "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)",
     ("54.36.148.", "5.39.109.", "51.222.253."), 0.14, 8.0),
    ("SemrushBot", "Mozilla/5.0 (compatible; SemrushBot/7~bl; +http://www.semrush.com/bot.html)",
     ("85.208.96.", "185.191.171."), 0.10, 5.0),
    ("YandexBot", "Mozilla/5.0 (compatible; YandexBot/3.0; +http://yandex.com/bots)",
     ("5.255.231.", "213.180.203."), 0.06, 3.0),
    ("GPTBot", "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)",
     ("20.171.207.",), 0.08, 6.0),
    ("PetalBot", "Mozilla/5.0 (Linux; Android 7.0;) AppleWebKit/537.36 (KHTML, like Gecko) Mobile Safari/537.36 (compatible; PetalBot;+https://webmaster.petalsearch.com/site/petalbot)",
     ("114.119.134.", "114.119.147."), 0.06, 4.0),
)
TOOL_UAS: dict[str, str] = {
    "python": "python-requests/2.31.0",
    "go": "Go-http-client/1.1",
    "curl": "curl/7.88.1",
    "zgrab": "Mozilla/5.0 zgrab/0.x",
    "monitor": "Mozilla/5.0+(compatible; UptimeRobot/2.0; http://www.uptimerobot.com/)",
    "spoof": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/96.0.4664.110 Safari/537.36",
}
#: Residential/mobile IPv4 /16s (Malaysian ISPs and neighbours) and IPv6 /32s used for browsing clients.
V4_PREFIXES = ("175.136.", "175.139.", "115.132.", "115.133.", "60.48.", "60.50.", "113.210.", "1.32.", "202.188.",
               "42.153.", "42.190.", "161.142.", "219.92.", "183.171.", "110.159.", "14.192.", "203.106.", "124.13.")
V6_PREFIXES = ("2001:e68:", "2001:d08:", "2405:3800:", "2402:1980:", "2001:f40:")
FORUMS: tuple[str, ...] = (
    "General Chit-Chat", "Kopitiam", "Politics", "Finance & Business", "Property", "Cars & Motoring", "Mobile Phones",
    "Computers & Hardware", "Gaming", "Travel", "Food & Drinks", "Education", "Jobs & Careers", "Sports", "Football",
    "Movies & TV", "Music", "Health & Fitness", "Parenting", "Marketplace", "Photography", "Home & Garden",
    "Technology News", "Feedback & Help",
)
TOPIC_WORDS: tuple[str, ...] = (
    "best", "cheap", "help", "review", "new", "latest", "discussion", "thread", "guide", "tips", "question", "price",
    "update", "official", "problem", "anyone", "experience", "recommend", "vs", "2024", "KL", "Penang", "Johor",
    "Proton", "Perodua", "iPhone", "Samsung", "laptop", "GPU", "broadband", "Unifi", "Maxis", "Celcom", "EPF",
    "ASB", "stocks", "property", "condo", "rental", "nasi lemak", "mamak", "durian", "travel", "Bali", "Japan",
    "salary", "interview", "SPM", "university", "scholarship", "badminton", "JDT", "Liverpool", "Netflix", "drama",
    "gym", "running", "baby", "school", "aircon", "renovation", "camera", "lens", "budget", "petrol", "toll", "MRT",
    "LRT", "flood", "weather", "traffic", "insurance", "loan", "credit card", "e-wallet", "TNG", "Grab", "Shopee",
)
EVENT_TITLES: tuple[str, ...] = (
    "GE16 live results thread", "Election night: seat by seat discussion", "GE16 vote counting live updates",
    "Who will form the government? GE16 predictions", "GE16 polling day queues and turnout",
)
STATIC_ASSETS: tuple[tuple[str, str, int], ...] = (  # (path, kind, typical bytes)
    ("/styles/default/xenforo/xenforo.css?v=1706580000", "css", 61_000),
    ("/styles/default/xenforo/editor.css?v=1706580000", "css", 18_000),
    ("/js/xf/core-compiled.js?_v=4a1b2c3d", "js", 142_000),
    ("/js/vendor/jquery/jquery-3.5.1.min.js?_v=4a1b2c3d", "js", 89_000),
    ("/js/xf/lightbox-compiled.js?_v=4a1b2c3d", "js", 32_000),
    ("/styles/default/xenforo/logo.png", "png", 9_800),
    ("/styles/fonts/fa/fa-regular-400.woff2?_v=5.15.3", "font", 33_000),
    ("/favicon.ico", "ico", 1_150),
)
API_PATHS: tuple[str, ...] = ("/api/threads/", "/api/alerts/", "/api/conversations/", "/api/me/", "/api/forums/")
SCAN_PATHS: tuple[tuple[str, int], ...] = (  # (path, status)
    ("/.env", 404), ("/wp-login.php", 404), ("/.git/config", 403), ("/.git/HEAD", 403), ("/wp-admin/setup-config.php", 404),
    ("/xmlrpc.php", 404), ("/phpmyadmin/", 404), ("/pma/", 404), ("/config.php.bak", 404), ("/.aws/credentials", 404),
    ("/server-status", 403), ("/.DS_Store", 404), ("/backup.zip", 404), ("/db.sql", 404), ("/dump.sql", 404),
    ("/vendor/phpunit/phpunit/src/Util/PHP/eval-stdin.php", 404), ("/cgi-bin/luci", 404), ("/.env.bak", 404),
    ("/admin.php", 200), ("/install/index.php", 403), ("/config/database.yml", 404), ("/.svn/entries", 404),
    ("/actuator/health", 404), ("/solr/admin/info/system", 404), ("/boaform/admin/formLogin", 404), ("/.htpasswd", 403),
    ("/internal_data/logs/", 403), ("/src/config.php", 403), ("/wp-content/plugins/", 404), ("/owa/auth/logon.aspx", 404),
)
REFERER_EXTERNAL: tuple[str, ...] = (
    "https://www.google.com/", "https://www.google.com.my/", "https://www.google.com/", "https://www.bing.com/",
    "https://duckduckgo.com/", "https://www.facebook.com/", "https://l.facebook.com/", "https://t.co/",
    "https://www.reddit.com/", "https://news.google.com/",
)
SEARCH_ENGINE_REFS = 5  # the first five external referers are search engines
CONTENT_TYPES: tuple[str, ...] = (
    "text/html", "text/css", "application/javascript", "image/png", "image/jpeg", "image/x-icon", "font/woff2",
    "application/json", "video/mp4", "application/zip", "text/plain", "-",
)
CT = {n: i for i, n in enumerate(CONTENT_TYPES)}

# Request kinds (small ints carried per line).
K_TOPIC, K_REPLY, K_FORUM, K_HOME, K_SEARCH, K_LOGIN_GET, K_LOGIN_POST, K_API, K_WHATSNEW, K_MEMBER = range(10)
K_JOB, K_NOTFOUND, K_STATIC, K_AVATAR, K_ROBOTS, K_SITEMAP, K_ATTACH, K_SCAN, K_WATCH = range(10, 19)
HTML_KINDS = (K_TOPIC, K_FORUM, K_HOME, K_SEARCH, K_LOGIN_GET, K_WHATSNEW, K_MEMBER, K_NOTFOUND)
#: browser primary request mix (kind, probability)
PRIMARY_MIX: tuple[tuple[int, float], ...] = (
    (K_TOPIC, 0.60), (K_REPLY, 0.022), (K_FORUM, 0.085), (K_HOME, 0.05), (K_SEARCH, 0.025), (K_LOGIN_GET, 0.008),
    (K_LOGIN_POST, 0.008), (K_API, 0.035), (K_WHATSNEW, 0.045), (K_MEMBER, 0.03), (K_JOB, 0.06),
    (K_NOTFOUND, 0.012), (K_WATCH, 0.02),
)
#: per kind: (method index, content type, median bytes, bytes sigma, median elapsed µs, elapsed sigma)
KIND_PROFILE: dict[int, tuple[int, str, int, float, int, float]] = {
    K_TOPIC: (0, "text/html", 19_000, 0.35, 120_000, 0.6), K_REPLY: (1, "application/json", 3_200, 0.3, 260_000, 0.5),
    K_FORUM: (0, "text/html", 15_500, 0.3, 95_000, 0.5), K_HOME: (0, "text/html", 22_000, 0.25, 110_000, 0.5),
    K_SEARCH: (0, "text/html", 12_000, 0.4, 380_000, 0.7), K_LOGIN_GET: (0, "text/html", 7_800, 0.1, 40_000, 0.4),
    K_LOGIN_POST: (1, "text/html", 0, 0.0, 180_000, 0.4), K_API: (0, "application/json", 2_400, 0.8, 45_000, 0.6),
    K_WHATSNEW: (0, "text/html", 17_000, 0.3, 150_000, 0.5), K_MEMBER: (0, "text/html", 11_000, 0.3, 80_000, 0.5),
    K_JOB: (1, "application/json", 120, 0.2, 30_000, 0.8), K_NOTFOUND: (0, "text/html", 3_100, 0.05, 35_000, 0.4),
    K_STATIC: (0, "text/css", 0, 0.0, 900, 0.6), K_AVATAR: (0, "image/jpeg", 5_500, 0.5, 700, 0.5),
    K_ROBOTS: (0, "text/plain", 410, 0.0, 500, 0.3), K_SITEMAP: (0, "application/xml", 48_000, 0.1, 60_000, 0.3),
    K_ATTACH: (0, "video/mp4", 0, 0.0, 0, 0.0), K_SCAN: (0, "text/html", 3_100, 0.05, 2_000, 0.5),
    K_WATCH: (0, "text/html", 0, 0.0, 60_000, 0.4),
}
METHODS = ("GET", "POST", "HEAD")
PROTOCOLS = ("HTTP/1.1", "HTTP/2.0")
STATIC_304_SHARE = 0.4
MAX_PAGE = 200
FLUSH_LINES = 250_000  # lines per source formatted and written at once


# ----------------------------------------------------------------------------------------------------------
# Public configuration and result types
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    """One log file: ``name`` (file ``<name>.log``, also the origin host), ``format`` (one of :data:`FORMATS`)."""

    name: str
    format: str


@dataclass(frozen=True)
class ScenarioSpec:
    """A requested scenario.  ``start_local`` (naive local time) and ``duration`` are optional (auto-placed when
    ``None``); ``params`` override the kind's magnitudes (see :data:`SCENARIO_DEFAULTS`)."""

    kind: str
    start_local: datetime | None = None
    duration: timedelta | None = None
    params: dict[str, Any] = field(default_factory=dict)


#: default magnitudes per scenario kind; ``hour`` is the preferred local start hour when auto-placed.
SCENARIO_DEFAULTS: dict[str, dict[str, Any]] = {
    "event": {"hour": 17.0, "duration_h": 18.0, "rise_h": 5.0, "decay_tau_h": 3.0, "peak_share": 0.5,
              "group": "election", "topics": 5, "reply_boost": 2.5},
    "holiday": {"official_factor": 0.35, "other_factor": 0.62, "days": 7},
    "outage": {"hour": 10.0, "duration_h": 3.0, "volume_factor": 0.3},
    "flood_ip": {"hour": 14.0, "duration_h": 0.2, "rate": 35.0},
    "flood_prefix": {"hour": 16.0, "duration_h": 0.25, "addresses": 120, "rate": 60.0},
    "flood_distributed": {"hour": 20.5, "duration_h": 0.25, "addresses": 800, "rate": 64.0},
    "scan": {"hour": 3.5, "duration_h": 0.15, "rate": 1.0},
    "transfer_collapse": {"hour": 12.0, "duration_h": 3.0, "normal_mbps": 700.0, "degraded_mbps": 130.0},
    "pipeline_gap": {"hour": 6.0, "duration_h": 2.0},
}


@dataclass
class SimConfig:
    """Everything that determines the output (``simulate(SimConfig(...))`` is the plain-function entry)."""

    out: Path
    start: date = date(2024, 1, 22)
    days: int = 28
    lines_per_day: int = 100_000
    lines: int | None = None
    sources: tuple[SourceSpec, ...] = (SourceSpec("web1", "combined_d"), SourceSpec("web2", "combined"),
                                       SourceSpec("proxy", "squid"))
    tz: str = "Asia/Kuala_Lumpur"
    country: str | None = "MY"
    seed: int = 1
    scenarios: tuple[ScenarioSpec, ...] | None = None  # None = default mix
    site: str = "forum"
    host: str = "forum.example.my"
    topics: int = 3000
    crawler_share: float = 0.06
    transfer_share: float = 0.008


@dataclass
class SimResult:
    out: Path
    files: dict[str, int]
    total_lines: int
    scenarios: list[dict[str, Any]]
    skipped: list[str]
    seconds: float
    truth_path: Path

    @property
    def lines_per_second(self) -> float:
        return self.total_lines / self.seconds if self.seconds > 0 else float("inf")


# ----------------------------------------------------------------------------------------------------------
# Option parsing
# ----------------------------------------------------------------------------------------------------------


def parse_sources(text: str) -> tuple[SourceSpec, ...]:
    """``combined_d,combined,squid`` or ``web1=combined_d,proxy=squid`` -> sources.  Unnamed Apache sources are
    called ``web1``, ``web2``...; squid ones ``proxy``, ``proxy2``..."""
    out: list[SourceSpec] = []
    web = proxy = 0
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, fmt = part.rpartition("=")
        if fmt not in FORMATS:
            raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
        if not name:
            if fmt == "squid":
                proxy += 1
                name = "proxy" if proxy == 1 else f"proxy{proxy}"
            else:
                web += 1
                name = f"web{web}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or any(s.name == name for s in out):
            raise ValueError(f"bad or duplicate source name {name!r}")
        out.append(SourceSpec(name, fmt))
    if not out:
        raise ValueError("no formats given")
    return tuple(out)


_DUR = re.compile(r"^(\d+(?:\.\d+)?)([mhd])$")


def parse_scenarios(text: str) -> tuple[ScenarioSpec, ...] | None:
    """``default`` -> None (the default mix), ``none`` -> (), else a comma list of ``kind`` or
    ``kind@YYYY-MM-DDTHH:MM[/DURATION]`` (local time; duration like ``90m``, ``3h``, ``2d``)."""
    t = text.strip().lower()
    if t in ("", "default"):
        return None
    if t == "none":
        return ()
    specs: list[ScenarioSpec] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        kind, _, when = part.partition("@")
        if kind not in SCENARIO_KINDS:
            raise ValueError(f"unknown scenario {kind!r} (choose from {', '.join(SCENARIO_KINDS)}, none, default)")
        start = dur = None
        if when:
            at, _, d = when.partition("/")
            try:
                start = datetime.fromisoformat(at)
            except ValueError:
                raise ValueError(f"bad scenario time {at!r} (use YYYY-MM-DDTHH:MM, site local time)") from None
            if d:
                m = _DUR.match(d)
                if not m:
                    raise ValueError(f"bad scenario duration {d!r} (use e.g. 90m, 3h, 2d)")
                dur = timedelta(**{{"m": "minutes", "h": "hours", "d": "days"}[m.group(2)]: float(m.group(1))})
        specs.append(ScenarioSpec(kind, start, dur))
    return tuple(specs)


# ----------------------------------------------------------------------------------------------------------
# Site model (topics, clients, string tables)
# ----------------------------------------------------------------------------------------------------------


def _slug(title: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return s[:60].rstrip("-") or "thread"


def _hex(rng: np.random.Generator, n: int, width: int) -> list[str]:
    vals = rng.integers(0, 16, size=(n, width))
    digits = np.array(list("0123456789abcdef"))
    return ["".join(row) for row in digits[vals]]


class _Site:
    """Immutable per-run tables: topics, forums, members, clients, URL pieces, referers, user agents."""

    def __init__(self, cfg: SimConfig, rng: np.random.Generator, event_topics: int, nominal_per_day: float):
        self.host = cfg.host
        n_topics = max(50, cfg.topics)
        # forums
        forum_ids = np.sort(rng.choice(np.arange(2, 120), size=len(FORUMS), replace=False))
        self.forum_names = list(FORUMS)
        self.forum_urls = [f"/forums/{_slug(n)}.{int(i)}/" for n, i in zip(FORUMS, forum_ids, strict=True)]
        # topics: ids increase with age; popularity is Zipf over a random permutation biased to newer topics
        ids = np.sort(rng.choice(np.arange(1_000, 720_000), size=n_topics, replace=False))
        titles: list[str] = []
        for _ in range(n_topics):
            k = int(rng.integers(3, 8))
            words = rng.choice(len(TOPIC_WORDS), size=k, replace=False)
            t = " ".join(TOPIC_WORDS[int(w)] for w in words)
            titles.append(t[0].upper() + t[1:])
        topic_forum = rng.integers(0, len(FORUMS), size=n_topics)
        politics = FORUMS.index("Politics")
        # event topics: new topics (highest ids) in Politics with election titles
        n_ev = min(event_topics, n_topics // 10)
        ev_idx = np.arange(n_topics - n_ev, n_topics)
        for j, i in enumerate(ev_idx):
            titles[int(i)] = EVENT_TITLES[j % len(EVENT_TITLES)] + ("" if j < len(EVENT_TITLES) else f" #{j}")
            topic_forum[i] = politics
        self.event_topic_idx = ev_idx
        self.topic_ids = ids
        self.topic_titles = titles
        self.topic_forum = topic_forum
        age_rank = np.argsort(np.argsort(-ids + rng.normal(0, 150_000, n_topics)))  # newer -> smaller rank
        weights = 1.0 / (age_rank + 3.0) ** 1.05
        weights[ev_idx] = weights[ev_idx].min() * 3  # event topics are quiet before the event
        self.topic_cdf = np.cumsum(weights) / weights.sum()
        self.topic_pages = np.clip((rng.pareto(1.3, n_topics) * 3 + 1).astype(np.int64), 1, MAX_PAGE)
        self.topic_pages[ev_idx] = np.maximum(self.topic_pages[ev_idx], 40)
        # members and avatars
        n_members = 3000
        member_ids = np.sort(rng.choice(np.arange(1, 400_000), size=n_members, replace=False))
        names = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=int(rng.integers(4, 10))))
                 for _ in range(n_members)]
        member_urls = [f"/members/{n}.{int(i)}/" for n, i in zip(names, member_ids, strict=True)]
        avatar_urls = [f"/data/avatars/m/{int(i) // 1000}/{int(i)}.jpg?{1_600_000_000 + int(i) * 97}" for i in member_ids]
        attach_ids = np.sort(rng.choice(np.arange(10_000, 900_000), size=400, replace=False))
        attach_urls = [f"/attachments/{'video' if j % 3 else 'archive'}-{int(i)}-{'mp4' if j % 3 else 'zip'}.{int(i)}/"
                       for j, i in enumerate(attach_ids)]
        self.attach_is_zip = np.array([j % 3 == 0 for j in range(len(attach_urls))])
        gone = rng.choice(np.arange(1_000, 720_000), size=200)
        notfound_urls = [f"/threads/deleted-thread.{int(i)}/" for i in gone]
        topic_urls = [f"/threads/{_slug(t)}.{int(i)}/" for t, i in zip(titles, ids, strict=True)]
        misc = ["/", "/search/?q=", "/login/", "/login/login", "/whats-new/", "/job.php", "/robots.txt",
                "/sitemap.xml", "/search/search"]
        # base URL table (index ranges recorded)
        bases: list[str] = []

        def add(items: Sequence[str]) -> int:
            off = len(bases)
            bases.extend(items)
            return off

        self.b_topic = add(topic_urls)
        self.b_forum = add(self.forum_urls)
        self.b_misc = add(misc)
        self.b_static = add([a[0] for a in STATIC_ASSETS])
        self.b_avatar = add(avatar_urls)
        self.n_avatar = len(avatar_urls)
        self.b_member = add(member_urls)
        self.n_member = len(member_urls)
        self.b_api = add(list(API_PATHS))
        self.b_attach = add(attach_urls)
        self.n_attach = len(attach_urls)
        self.b_notfound = add(notfound_urls)
        self.n_notfound = len(notfound_urls)
        self.b_scan = add([p for p, _ in SCAN_PATHS])
        self.bases = bases
        self.base_tbl = pa.array(bases, pa.string())
        self.abs_base_tbl = pa.array([f"https://{cfg.host}{b}" for b in bases], pa.string())
        # page / action suffixes
        pages = ["", *[f"page-{n}" for n in range(2, MAX_PAGE + 1)], "add-reply", "unread", "watch", "latest"]
        self.p_reply = MAX_PAGE
        self.p_unread, self.p_watch, self.p_latest = MAX_PAGE + 1, MAX_PAGE + 2, MAX_PAGE + 3
        self.page_tbl = pa.array(pages, pa.string())
        # query/parameter suffixes
        params: list[str] = [""]
        self.q_session = len(params)
        params += [f"?s={h}" for h in _hex(rng, 64, 32)]
        self.q_xftoken = len(params)
        params += [f"?_xfToken={1_706_000_000 + int(t)}%2C{h}" for t, h in
                   zip(rng.integers(0, 2_000_000, 64), _hex(rng, 64, 32), strict=True)]
        self.q_search = len(params)
        search_terms = ["+".join(TOPIC_WORDS[int(w)].replace(" ", "+") for w in rng.choice(len(TOPIC_WORDS), int(k)))
                        for k in rng.integers(1, 4, 1500)]
        params += search_terms
        self.n_search = len(search_terms)
        self.q_api = len(params)
        params += ["?page=2", "?unread=1", "?limit=20", "?with_posts=1"]
        self.param_strs = params
        # referers: "-", external, then absolute URL of every base
        self.r_ext = 1
        self.r_base = 1 + len(REFERER_EXTERNAL)
        self.referer_tbl = pa.concat_arrays([pa.array(["-", *REFERER_EXTERNAL], pa.string()), self.abs_base_tbl])
        # user agents: browsers, crawlers, tools
        self.u_crawler = len(BROWSER_UAS)
        self.u_tool = {k: self.u_crawler + len(CRAWLERS) + i for i, k in enumerate(TOOL_UAS)}
        self.ua_tbl = pa.array([*BROWSER_UAS, *[c[1] for c in CRAWLERS], *TOOL_UAS.values()], pa.string())
        # clients: humans (Zipf activity, fixed UA), then extra addresses appended by scenarios/crawlers
        n_clients = int(min(200_000, max(2_000, nominal_per_day / 12)))
        v6 = rng.random(n_clients) < 0.15
        p4 = rng.integers(0, len(V4_PREFIXES), n_clients)
        o3 = rng.integers(0, 256, n_clients)
        o4 = rng.integers(1, 255, n_clients)
        p6 = rng.integers(0, len(V6_PREFIXES), n_clients)
        g6 = rng.integers(0, 65536, size=(n_clients, 5))
        ips: list[str] = []
        for ci in range(n_clients):
            if v6[ci]:
                g = [int(x) for x in g6[ci]]
                ips.append(f"{V6_PREFIXES[p6[ci]]}{g[0]:x}:{g[1]:x}:{g[2]:x}:{g[3]:x}::{g[4]:x}")
            else:
                ips.append(f"{V4_PREFIXES[p4[ci]]}{o3[ci]}.{o4[ci]}")
        ips = list(dict.fromkeys(ips))
        self.n_humans = len(ips)
        act = 1.0 / (np.arange(self.n_humans) + 10.0) ** 0.9
        self.client_cdf = np.cumsum(act) / act.sum()
        ua_w = np.linspace(3.0, 0.5, len(BROWSER_UAS))
        self.client_ua = rng.choice(len(BROWSER_UAS), size=self.n_humans, p=ua_w / ua_w.sum()).astype(np.int32)
        self.client_strs: list[str] = ips

    def add_clients(self, ips: Iterable[str]) -> int:
        off = len(self.client_strs)
        self.client_strs.extend(ips)
        return off

    def add_params(self, items: Sequence[str]) -> int:
        off = len(self.param_strs)
        self.param_strs.extend(items)
        return off

    def finish(self) -> None:
        self.client_tbl = pa.array(self.client_strs, pa.string())
        self.param_tbl = pa.array(self.param_strs, pa.string())


# ----------------------------------------------------------------------------------------------------------
# Time model
# ----------------------------------------------------------------------------------------------------------

#: relative traffic by local hour (0..23), interpolated between hour midpoints
DAILY = np.array([0.50, 0.36, 0.25, 0.18, 0.14, 0.13, 0.17, 0.30, 0.50, 0.66, 0.74, 0.79, 0.84, 0.82, 0.77, 0.75,
                  0.77, 0.80, 0.84, 0.91, 0.98, 1.00, 0.92, 0.72])
WEEKLY = np.array([1.00, 1.01, 1.00, 0.98, 0.93, 0.80, 0.85])  # Mon..Sun
NOMINAL_MEAN = float(np.mean(DAILY) * np.mean(WEEKLY))


def _daily_shape(local_hour: np.ndarray) -> np.ndarray:
    x = np.concatenate([DAILY, DAILY[:1]])
    h = np.mod(local_hour - 0.5, 24.0)
    i = np.floor(h).astype(np.int64)
    f = h - i
    return x[i] * (1 - f) + x[i + 1] * f


@dataclass
class _Scn:
    """A placed scenario (internal)."""

    id: str
    kind: str
    start_ms: int
    end_ms: int
    params: dict[str, Any]
    scope: dict[str, Any] = field(default_factory=dict)
    comp: int = 0
    client_off: int = 0
    n_clients: int = 0
    param_off: int = 0
    lines: int = 0
    notes: str = ""


@dataclass
class _Burst:
    bot: int
    start_ms: int
    end_ms: int
    rate: float
    client_off: int
    n_ips: int
    comp: int
    lines: int = 0


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


class _Plan:
    """Run-level plan: minute-resolution rate curves, placed scenarios, crawler bursts, per-hour line counts."""

    def __init__(self, cfg: SimConfig):
        if cfg.days < 1:
            raise ValueError("days must be >= 1")
        if cfg.lines is not None and cfg.lines < 1:
            raise ValueError("lines must be >= 1")
        self.cfg = cfg
        self.zone = ZoneInfo(cfg.tz)
        self.t0 = _ms(datetime(cfg.start.year, cfg.start.month, cfg.start.day, tzinfo=self.zone))
        self.t1 = _ms(datetime.combine(cfg.start + timedelta(days=cfg.days), datetime.min.time(), self.zone))
        self.h0 = self.t0 // HOUR_MS * HOUR_MS
        self.n_hours = -(-(self.t1 - self.h0) // HOUR_MS)
        self.n_min = self.n_hours * 60
        self.sources = cfg.sources
        self.n_src = len(cfg.sources)
        nominal = cfg.lines / cfg.days if cfg.lines is not None else float(cfg.lines_per_day)
        self.nominal_per_day = nominal
        prng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, 0xC0FFEE])))
        self.skipped: list[str] = []
        self.scenarios = self._place(cfg.scenarios)
        ev = [s for s in self.scenarios if s.kind == "event"]
        self.site = _Site(cfg, prng, int(ev[0].params["topics"]) if ev else 5, nominal)
        # minute grid
        m_ms = self.h0 + np.arange(self.n_min, dtype=np.int64) * MIN_MS
        self.min_ms = m_ms
        hour_off = np.array([int(datetime.fromtimestamp((self.h0 + h * HOUR_MS) / 1000, self.zone).utcoffset()
                                 .total_seconds()) for h in range(self.n_hours)], dtype=np.int64)  # type: ignore[union-attr]
        self.hour_off_s = hour_off
        local_s = m_ms // 1000 + np.repeat(hour_off, 60) + 30
        local_h = (local_s % 86400) / 3600.0
        local_day = local_s // 86400
        dow = (local_day + 3) % 7  # 1970-01-01 was a Thursday
        inside = (m_ms >= self.t0) & (m_ms < self.t1)
        self.inside_min = inside
        shape = _daily_shape(local_h) * WEEKLY[dow]
        self.local_day = local_day
        factor = np.ones(self.n_min)
        self.outage = np.zeros(self.n_min, dtype=bool)
        self.event_share: list[tuple[_Scn, np.ndarray]] = []
        self.collapse: list[_Scn] = []
        for s in self.scenarios:
            w = (m_ms + 30_000 >= s.start_ms) & (m_ms + 30_000 < s.end_ms)
            if s.kind == "holiday":
                off_days = set(s.params["official_local_days"])
                f = np.where(np.isin(local_day, list(off_days)), s.params["official_factor"], s.params["other_factor"])
                factor = np.where(w, factor * f, factor)
            elif s.kind == "outage":
                factor = np.where(w, factor * s.params["volume_factor"], factor)
                self.outage |= w
            elif s.kind == "event":
                t_h = (m_ms + 30_000 - s.start_ms) / HOUR_MS
                rise, tau = s.params["rise_h"], s.params["decay_tau_h"]
                g = np.where(t_h < rise, np.clip(t_h / rise, 0, 1) ** 2, np.exp(-(t_h - rise) / tau))
                g = np.where(w, g, 0.0)
                ps = s.params["peak_share"]
                boost = g * ps / (1 - ps)  # at the peak, (1 + boost) doubles traffic when ps = 0.5
                factor = factor * (1 + boost)
                self.event_share.append((s, boost / (1 + boost)))
            elif s.kind == "transfer_collapse":
                self.collapse.append(s)
        self.lam = np.where(inside, shape * factor, 0.0)  # relative human traffic per minute
        self.lam_hour = self.lam.reshape(self.n_hours, 60).sum(axis=1)
        # gaps (source, hour)
        self.gap = np.zeros((self.n_hours, self.n_src), dtype=bool)
        for s in self.scenarios:
            if s.kind == "pipeline_gap":
                si = [x.name for x in self.sources].index(s.scope["source"])
                a = (s.start_ms - self.h0) // HOUR_MS
                b = (s.end_ms - self.h0) // HOUR_MS
                self.gap[a:b, si] = True
        self.live: np.ndarray = ~self.gap
        self.any_live: np.ndarray = np.asarray(self.live.any(axis=1))
        self.media_src = self._media_source()
        self._crawlers(prng)
        self._scenario_clients(prng)
        self._counts(prng)
        for s in self.scenarios:
            if s.kind == "flood_distributed":  # one distinct random query per request (cache busting)
                tokens = prng.permutation(np.arange(s.lines, dtype=np.int64) * 7_919 + int(prng.integers(1 << 40)))
                s.param_off = self.site.add_params([f"{int(t):010x}" for t in tokens])
        self.site.finish()

    # --- placement ------------------------------------------------------------------------------------
    def _local(self, ms: int) -> datetime:
        return datetime.fromtimestamp(ms / 1000, self.zone).replace(tzinfo=None)

    def _to_ms(self, local: datetime) -> int:
        return _ms(local.replace(tzinfo=self.zone))

    def _place(self, specs: tuple[ScenarioSpec, ...] | None) -> list[_Scn]:
        cfg = self.cfg
        explicit = specs is not None
        if specs is None:
            specs = tuple(ScenarioSpec(k) for k in DEFAULT_SCENARIOS)
        baseline = 14 if cfg.days >= 21 else max(1, cfg.days // 3)
        placed: list[_Scn] = []
        fmt = {s.format for s in self.sources}
        counter: dict[str, int] = {}

        def new(kind: str, start_ms: int, end_ms: int, params: dict[str, Any]) -> _Scn:
            counter[kind] = counter.get(kind, 0) + 1
            sid = f"{kind}-{counter[kind]}"
            s = _Scn(sid, kind, start_ms, end_ms, params)
            placed.append(s)
            return s

        def overlaps(a: int, b: int, margin: int = HOUR_MS) -> bool:
            return any(a < s.end_ms + margin and s.start_ms - margin < b for s in placed)

        # holiday first: it takes a week
        for sp in [s for s in specs if s.kind == "holiday"]:
            params = {**SCENARIO_DEFAULTS["holiday"], **sp.params}
            ndays = int(params["days"])
            if sp.start_local is not None:
                first = sp.start_local.date()
                if sp.duration is not None:
                    ndays = max(1, round(sp.duration / timedelta(days=1)))
                off_days = [first + timedelta(days=ndays // 2)]
                name = params.get("name", "holiday (given)")
            else:
                found = self._find_holiday(baseline, ndays)
                if found is None:
                    if cfg.days < baseline + ndays:
                        msg = f"holiday: needs {baseline + ndays} days (a baseline before a {ndays}-day week)"
                        if explicit:
                            raise ValueError(msg)
                        self.skipped.append(msg)
                        continue
                    first = cfg.start + timedelta(days=baseline)
                    off_days = [first + timedelta(days=3), first + timedelta(days=4)]
                    name = "festival week (synthetic)"
                else:
                    first, off_days, name = found
            off_days = [d for d in off_days if first <= d < first + timedelta(days=ndays)] or [first]
            a = self._to_ms(datetime.combine(first, datetime.min.time()))
            b = self._to_ms(datetime.combine(first + timedelta(days=ndays), datetime.min.time()))
            params["name"] = name
            params["official_days"] = [d.isoformat() for d in off_days]
            params["official_local_days"] = [(d - date(1970, 1, 1)).days for d in off_days]
            s = new("holiday", a, b, params)
            s.scope = {"site": cfg.site, "local_days": [(first + timedelta(days=i)).isoformat() for i in range(ndays)]}
        hol = [(s.start_ms, s.end_ms) for s in placed]
        hol_days = {(datetime.fromtimestamp(t / 1000, self.zone).date() - cfg.start).days
                    for hs, he in hol for t in range(hs, he, 3_600_000)}
        day_list = [d for d in range(baseline, cfg.days) if d not in hol_days] or list(range(baseline, cfg.days))
        auto_i = 0
        for sp in specs:
            if sp.kind == "holiday":
                continue
            params = {**SCENARIO_DEFAULTS[sp.kind], **sp.params}
            if sp.kind == "transfer_collapse" and self._media_source_from(fmt) is None:
                msg = "transfer_collapse: needs a squid or combined_d source (elapsed time)"
                if explicit:
                    raise ValueError(msg)
                self.skipped.append(msg)
                continue
            dur = sp.duration or timedelta(hours=float(params["duration_h"]))
            if sp.start_local is not None:
                a = self._to_ms(sp.start_local)
                b = a + int(dur.total_seconds() * 1000)
            else:
                got = None
                for j in range(len(day_list)):
                    d = day_list[(auto_i + j) % len(day_list)]
                    hh = float(params["hour"])
                    loc = datetime.combine(cfg.start + timedelta(days=d), datetime.min.time()) + timedelta(hours=hh)
                    a = self._to_ms(loc)
                    b = a + int(dur.total_seconds() * 1000)
                    if sp.kind == "pipeline_gap":
                        a, b = a // HOUR_MS * HOUR_MS, -(-b // HOUR_MS) * HOUR_MS
                    if b > self.t1 or overlaps(a, b) or any(a < he and hs < b for hs, he in hol):
                        continue
                    got = (a, b)
                    break
                if got is None:
                    msg = f"{sp.kind}: no free slot after the {baseline}-day baseline"
                    if explicit:
                        raise ValueError(msg)
                    self.skipped.append(msg)
                    continue
                a, b = got
                auto_i += 1
            if sp.kind == "pipeline_gap":
                a, b = a // HOUR_MS * HOUR_MS, -(-b // HOUR_MS) * HOUR_MS
            if a < self.t0 or b > self.t1 or b <= a:
                raise ValueError(f"{sp.kind}: window {_iso(a)}..{_iso(b)} is outside the run")
            # the truth's duration is the window's (an explicit `/4h` read as the default 3 h: trial 31)
            params["duration_h"] = round((b - a) / HOUR_MS, 4)
            if sp.kind == "event" and sp.duration is not None:
                # a shorter event rises and decays in proportion (`event@…/80m` rose for 5 h and was cut off at
                # 80 min, at a share of ~3% instead of its peak_share, and its truth gave a peak after its end:
                # user trial 32)
                k = min(1.0, params["duration_h"] / float(SCENARIO_DEFAULTS["event"]["duration_h"]))
                for key in ("rise_h", "decay_tau_h"):
                    if key not in sp.params:
                        params[key] = round(float(params[key]) * k, 4)
            s = new(sp.kind, a, b, params)
            s.scope = {"site": cfg.site}
            if sp.kind == "pipeline_gap":
                src = str(params.get("source", self.sources[-1].name))
                if src not in [x.name for x in self.sources]:
                    raise ValueError(f"pipeline_gap: unknown source {src!r}")
                s.scope["source"] = src
        placed.sort(key=lambda s: (s.start_ms, s.kind))
        return placed

    def _find_holiday(self, baseline: int, ndays: int) -> tuple[date, list[date], str] | None:
        cfg = self.cfg
        if not cfg.country:
            return None
        import holidays

        lo = cfg.start + timedelta(days=baseline + 2)
        hi = cfg.start + timedelta(days=cfg.days - ndays + 2)
        if hi <= lo:
            return None
        try:
            cal = holidays.country_holidays(cfg.country, years=range(lo.year, hi.year + 1))
        except NotImplementedError:
            raise ValueError(f"holidays has no calendar for country {cfg.country!r}") from None
        cands = sorted(d for d in cal if lo <= d < hi)
        if not cands:
            return None
        pref = ("Chinese New Year", "Eid al-Fitr", "Hari Raya", "Deepavali", "Christmas", "New Year")
        best = next((d for p in pref for d in cands if p in str(cal.get(d))), cands[0])
        off = [best]
        d = best + timedelta(days=1)
        while d in cal and len(off) < 3:
            off.append(d)
            d += timedelta(days=1)
        first = best - timedelta(days=2)
        first = max(first, cfg.start + timedelta(days=baseline))
        first = min(first, cfg.start + timedelta(days=cfg.days - ndays))
        return first, off, str(cal.get(best)).split(";")[0]

    @staticmethod
    def _media_source_from(fmts: set[str]) -> str | None:
        return "squid" if "squid" in fmts else ("combined_d" if "combined_d" in fmts else None)

    def _media_source(self) -> int | None:
        want = self._media_source_from({s.format for s in self.sources})
        if want is None:
            return None
        return next(i for i, s in enumerate(self.sources) if s.format == want)

    # --- extra clients ----------------------------------------------------------------------------------
    def _crawlers(self, prng: np.random.Generator) -> None:
        cfg = self.cfg
        per_day = self.nominal_per_day * cfg.crawler_share
        self.bursts: list[_Burst] = []
        comp = 100
        for b, (_name, _ua, prefixes, share, max_rate) in enumerate(CRAWLERS):
            ips = [f"{prefixes[int(prng.integers(len(prefixes)))]}{int(prng.integers(1, 255))}" for _ in range(4)]
            off = self.site.add_clients(ips)
            for d in range(cfg.days):
                budget = per_day * share
                n_b = 1 + int(prng.poisson(2.0))
                parts = prng.dirichlet(np.ones(n_b)) * budget
                for lines in parts:
                    dur_s = float(prng.uniform(180, 1800))
                    rate = lines / dur_s
                    if rate > max_rate:
                        dur_s, rate = lines / max_rate, max_rate
                    a = self.t0 + d * 86_400_000 + int(prng.uniform(0, 86_400_000 - dur_s * 1000))
                    nips = int(prng.integers(1, 4))
                    self.bursts.append(_Burst(b, a, a + int(dur_s * 1000), rate, off, nips, comp))
                    comp += 1
        self.nat: list[dict[str, Any]] = []
        nat_defs = [("203.106.93.10", "campus", 3.0, 0.10), ("27.125.242.5", "cgnat", 2.0, 0.06)]
        for ip, kind, rate, cap in nat_defs:
            off = self.site.add_clients([ip])
            self.nat.append({"ip": ip, "kind": kind, "target_rate": rate, "cap_share": cap, "client": off})
        self.monitor_client = self.site.add_clients(["69.162.124.235"])

    def _scenario_clients(self, prng: np.random.Generator) -> None:
        for i, s in enumerate(self.scenarios):
            s.comp = 1000 + i
            if s.kind == "flood_ip":
                ip = f"45.135.232.{int(prng.integers(2, 250))}"
                s.client_off, s.n_clients = self.site.add_clients([ip]), 1
                s.scope.update({"client_ip": ip})
            elif s.kind == "scan":
                ip = f"193.46.255.{int(prng.integers(2, 250))}"
                s.client_off, s.n_clients = self.site.add_clients([ip]), 1
                s.scope.update({"client_ip": ip, "paths": [p for p, _ in SCAN_PATHS]})
            elif s.kind == "flood_prefix":
                n = int(s.params["addresses"])
                base = f"103.152.{int(prng.integers(100, 200))}."
                hosts = prng.choice(np.arange(1, 255), size=min(n, 254), replace=False)
                s.client_off = self.site.add_clients([f"{base}{int(h)}" for h in hosts])
                s.n_clients = len(hosts)
                s.scope.update({"prefix": f"{base}0/24", "addresses": s.n_clients})
            elif s.kind == "flood_distributed":
                n = int(s.params["addresses"])
                a = prng.integers(1, 224, n)
                a = np.where(np.isin(a, [10, 127, 100, 172, 192, 169]), a + 1, a)
                ips = [f"{int(x)}.{int(y)}.{int(z)}.{int(w)}" for x, y, z, w in
                       zip(a, prng.integers(0, 256, n), prng.integers(0, 256, n), prng.integers(1, 255, n), strict=True)]
                ips = list(dict.fromkeys(ips))
                s.client_off, s.n_clients = self.site.add_clients(ips), len(ips)
                s.scope.update({"url": "/search/", "query": "random q (cache busting)", "addresses": len(ips)})
            elif s.kind == "event":
                tids = [int(self.site.topic_ids[i]) for i in self.site.event_topic_idx]
                s.scope.update({"group": s.params["group"], "topic_ids": tids})
            elif s.kind == "transfer_collapse":
                src = self.sources[self.media_src]  # type: ignore[index]
                s.scope.update({"source": src.name, "origin_host": src.name})
                if src.format == "squid":
                    s.scope["upstream"] = "10.20.0.31"
                s.scope["size_class"] = ">= 1 MB"
                f = s.params["normal_mbps"] / s.params["degraded_mbps"]
                s.params = {**s.params, "elapsed_factor": round(f, 2)}
            elif s.kind == "outage":
                s.scope.update({"sources": [x.name for x in self.sources], "statuses": [502, 503, 504]})

    # --- counts ---------------------------------------------------------------------------------------
    def _counts(self, prng: np.random.Generator) -> None:
        cfg = self.cfg
        H = self.n_hours
        self.extra: dict[int, np.ndarray] = {}  # comp -> per-hour counts
        hours_start = self.h0 + np.arange(H, dtype=np.int64) * HOUR_MS

        def window_counts(a: int, b: int, rate: float) -> np.ndarray:
            ov = np.clip(np.minimum(hours_start + HOUR_MS, b) - np.maximum(hours_start, a), 0, None) / 1000.0
            return np.where(self.any_live, prng.poisson(rate * ov), 0)

        for bu in self.bursts:
            c = window_counts(bu.start_ms, min(bu.end_ms, self.t1), bu.rate)
            bu.lines = int(c.sum())
            self.extra[bu.comp] = c
        mon = np.zeros(H, dtype=np.int64)
        for h in range(H):
            lo, hi = max(int(hours_start[h]), self.t0), min(int(hours_start[h]) + HOUR_MS, self.t1)
            mon[h] = max(0, (hi - lo) // MIN_MS) if self.any_live[h] else 0
        self.extra[1] = mon
        for s in self.scenarios:
            if s.kind in ("flood_ip", "flood_prefix", "flood_distributed", "scan"):
                c = window_counts(s.start_ms, s.end_ms, float(s.params["rate"]))
                self.extra[s.comp] = c
                s.lines = int(c.sum())
        lam_norm = self.lam_hour / (NOMINAL_MEAN * 1440.0)  # expected days-worth per hour for nominal volume
        if self.media_src is not None:
            tr = prng.poisson(lam_norm * self.nominal_per_day * cfg.transfer_share)
            self.extra[2] = np.where(self.live[:, self.media_src], tr, 0)
        extras_total = int(sum(int(v.sum()) for v in self.extra.values()))
        # background: exact multinomial over (hour, source) cells
        share = np.full(self.n_src, 1.0 / self.n_src)
        w = (self.lam_hour[:, None] * share[None, :] * self.live).ravel()
        bg_expected = float(lam_norm.sum()) * self.nominal_per_day * (
            1 - cfg.crawler_share - cfg.transfer_share - 1440 / max(self.nominal_per_day, 1))
        if cfg.lines is not None:
            n_bg = cfg.lines - extras_total
            if n_bg < cfg.lines / 2:
                raise ValueError(f"--lines {cfg.lines}: scenarios, crawlers and monitors need {extras_total} lines, "
                                 "more than half; ask for more lines, more days or fewer scenarios")
        else:
            # expected background, with the gap hours' share removed
            n_bg = round(bg_expected * w.sum() / max((self.lam_hour[:, None] * share[None, :]).sum(), 1e-12))
        n_bg = max(n_bg, 0)
        self.bg = prng.multinomial(n_bg, w / w.sum()).reshape(H, self.n_src) if w.sum() > 0 else np.zeros(
            (H, self.n_src), dtype=np.int64)
        # absolute background line rate per minute (lines/s across sources), for NAT shares
        scale = n_bg / max(float(self.lam[:, None].sum() * 1.0), 1e-12)
        rate_s = self.lam * scale / 60.0
        self.nat_p = np.zeros((len(self.nat), self.n_min))
        local_s = self.min_ms // 1000 + np.repeat(self.hour_off_s, 60) + 30
        local_h = (local_s % 86400) / 3600.0
        dow = (self.local_day + 3) % 7
        for k, n in enumerate(self.nat):
            if n["kind"] == "campus":
                on = (dow < 5) & (local_h >= 8) & (local_h < 18)
                target = np.where(on, n["target_rate"], 0.0)
            else:
                target = n["target_rate"] * _daily_shape(local_h)
            nat_rate = np.minimum(target, n["cap_share"] * rate_s)
            self.nat_p[k] = np.where(rate_s > 0, nat_rate / np.maximum(rate_s, 1e-12), 0.0)
        self.total = int(self.bg.sum()) + extras_total


# ----------------------------------------------------------------------------------------------------------
# Line batches
# ----------------------------------------------------------------------------------------------------------

_COLS = ("ts", "client", "ua", "method", "base", "page", "param", "proto", "status", "bytes", "elapsed",
         "referer", "kind", "peer", "azip")
_DT = {"ts": np.int64, "client": np.int32, "ua": np.int32, "method": np.int8, "base": np.int32, "page": np.int16,
       "param": np.int32, "proto": np.int8, "status": np.int16, "bytes": np.int64, "elapsed": np.int64,
       "referer": np.int32, "kind": np.int8, "peer": np.int8,
       "azip": np.bool_}
Batch = dict[str, Any]  # column name -> numpy array (scalars are broadcast by _fix)


def _empty(n: int) -> Batch:
    b: Batch = {c: np.zeros(n, dtype=_DT[c]) for c in _COLS}
    b["peer"][:] = -1
    return b


def _fix(b: Batch) -> Batch:
    """Broadcast scalar columns and cast every column to its dtype."""
    n = len(b["ts"])
    for c in _COLS:
        b[c] = np.broadcast_to(np.asarray(b[c]), (n,)).astype(_DT[c])
    return b


def _concat(batches: list[Batch]) -> Batch:
    batches = [b for b in batches if len(b["ts"])]
    if not batches:
        return _empty(0)
    return {c: np.concatenate([b[c] for b in batches]) for c in _COLS}


def _take(b: Batch, idx: np.ndarray) -> Batch:
    return {c: v[idx] for c, v in b.items()}


def _rng(seed: int, *key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *key])))


def _lognormal(rng: np.random.Generator, median: np.ndarray | float, sigma: np.ndarray | float, n: int) -> np.ndarray:
    return np.asarray(median) * np.exp(rng.normal(0.0, 1.0, n) * np.asarray(sigma))


_PROFILE_ARR = {name: np.array([KIND_PROFILE.get(k, (0, "text/html", 0, 0.0, 0, 0.0))[i] for k in range(19)])
                for i, name in enumerate(("method", "ctype", "bmed", "bsig", "emed", "esig"))}
_KIND_CT = np.array([CT.get(str(c), CT["text/html"]) if c != "application/xml" else CT["text/plain"]
                     for c in _PROFILE_ARR["ctype"]], dtype=np.int8)


def _fill_perf(rng: np.random.Generator, b: Batch) -> None:
    """Bytes and elapsed from the kind profile (statuses already set)."""
    _fix(b)
    k = b["kind"].astype(np.int64)
    n = len(k)
    bm = _PROFILE_ARR["bmed"].astype(float)[k]
    bs = _PROFILE_ARR["bsig"].astype(float)[k]
    by = np.where(bm > 0, _lognormal(rng, np.maximum(bm, 1), bs, n), 0).astype(np.int64)
    st = b["status"]
    by = np.where(st == 304, 0, by)
    by = np.where((st == 301) | (st == 302) | (st == 303), 245, by)
    by = np.where(st == 404, 3_100 + (k % 7) * 11, by)
    by = np.where(st == 403, 1_024, by)
    by = np.where(st >= 500, 1_180 + (st - 500) * 13, by)
    b["bytes"] = np.where(st == 304, 0, np.where(b["bytes"] > 0, b["bytes"], by))
    em = _PROFILE_ARR["emed"].astype(float)[k]
    es = _PROFILE_ARR["esig"].astype(float)[k]
    el = _lognormal(rng, np.maximum(em, 200), es, n)
    el = np.where(st == 304, el * 0.4, el)
    b["elapsed"] = np.where(b["elapsed"] > 0, b["elapsed"], el.astype(np.int64) + 150)


def _times(rng: np.random.Generator, lam_min: np.ndarray, h_start: int, n: int) -> np.ndarray:
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    tot = lam_min.sum()
    p = lam_min / tot if tot > 0 else np.full(60, 1 / 60)
    minute = np.searchsorted(np.cumsum(p), rng.random(n) * (1 - 1e-12), side="right")
    minute = np.minimum(minute, 59)
    return h_start + minute * MIN_MS + rng.integers(0, MIN_MS, n)


class _Gen:
    """Generates one hour's batch for one source (pure function of the plan and (seed, hour, source))."""

    def __init__(self, plan: _Plan):
        self.p = plan
        self.s = plan.site
        mix_k = np.array([k for k, _ in PRIMARY_MIX])
        mix_p = np.array([p for _, p in PRIMARY_MIX])
        self.mix_k, self.mix_cdf = mix_k, np.cumsum(mix_p / mix_p.sum())
        self.is_html = np.isin(np.arange(19), HTML_KINDS)

    # background browsing: page views + statics, exactly n lines
    def background(self, h: int, src: int, n: int) -> Batch:
        p, s = self.p, self.s
        rng = _rng(p.cfg.seed, h, src, 0)
        if n == 0:
            return _empty(0)
        h_start = p.h0 + h * HOUR_MS
        m0 = h * 60
        m_primary = int(n / 2.0) + 16
        kinds = self.mix_k[np.searchsorted(self.mix_cdf, rng.random(m_primary), side="right").clip(0, len(self.mix_k) - 1)]
        nst = np.where(self.is_html[kinds] & (kinds != K_NOTFOUND), rng.geometric(0.3, m_primary) - 1, 0)
        nst = np.where(rng.random(m_primary) < 0.35, 0, np.minimum(nst, 8))
        while int((1 + nst).sum()) < n:  # rare: draw more primaries
            more = self.mix_k[np.searchsorted(self.mix_cdf, rng.random(m_primary), side="right").clip(0, len(self.mix_k) - 1)]
            kinds = np.concatenate([kinds, more])
            nst = np.concatenate([nst, np.where(self.is_html[more], rng.geometric(0.3, m_primary) - 1, 0).clip(0, 8)])
        size = 1 + nst
        cs = np.cumsum(size)
        g = int(np.searchsorted(cs, n)) + 1
        kinds, size = kinds[:g], size[:g].copy()
        size[-1] -= int(cs[g - 1] - n)
        t = _times(rng, p.lam[m0:m0 + 60], h_start, g)
        gm = np.minimum((t - h_start) // MIN_MS, 59) + m0
        # clients: NAT gateways or Zipf humans
        client = np.searchsorted(s.client_cdf, rng.random(g) * (1 - 1e-12), side="right").astype(np.int32)
        ua = s.client_ua[client]
        u = rng.random(g)
        acc = np.zeros(g)
        for k, nat in enumerate(p.nat):
            pk = p.nat_p[k][gm]
            sel = (u >= acc) & (u < acc + pk)
            client = np.where(sel, nat["client"], client)
            ua = np.where(sel, rng.integers(0, len(BROWSER_UAS), g), ua)
            acc = acc + pk
        # topics (Zipf, redirected to event groups)
        topic = np.searchsorted(s.topic_cdf, rng.random(g) * (1 - 1e-12), side="right").clip(0, len(s.topic_ids) - 1)
        in_event = np.zeros(g, dtype=bool)
        for scn, share in p.event_share:
            sh = share[gm]
            hit = rng.random(g) < sh
            ev = s.event_topic_idx
            w = np.array([0.46, 0.22, 0.14, 0.1, 0.08][: len(ev)] + [0.05] * max(0, len(ev) - 5))
            pick = ev[np.searchsorted(np.cumsum(w / w.sum()), rng.random(g) * (1 - 1e-12), side="right").clip(0, len(ev) - 1)]
            topic = np.where(hit, pick, topic)
            in_event |= hit
            # replies rise too: some event views become replies
            boost = float(scn.params["reply_boost"])
            conv = hit & (kinds == K_TOPIC) & (rng.random(g) < 0.022 * (boost - 1))
            kinds = np.where(conv, K_REPLY, kinds)
        b = _empty(g)
        b["ts"], b["client"], b["ua"], b["kind"] = t, client, ua, kinds.astype(np.int8)
        b["method"] = _PROFILE_ARR["method"][kinds].astype(np.int8)
        b["proto"] = (rng.random(g) < 0.25).astype(np.int8)
        base = np.zeros(g, dtype=np.int64)
        page = np.zeros(g, dtype=np.int64)
        param = np.zeros(g, dtype=np.int64)
        ref = np.zeros(g, dtype=np.int64)
        status = np.full(g, 200, dtype=np.int64)
        r = rng.random(g)
        r2 = rng.random(g)
        ri = rng.integers(0, 1 << 30, g)
        npages = s.topic_pages[topic]
        # topic views: page 1 (55%), last page (25%), any page
        pg = np.where(r < 0.55, 1, np.where(r < 0.80, npages, 1 + ri % npages))
        is_t = kinds == K_TOPIC
        base = np.where(is_t | (kinds == K_REPLY) | (kinds == K_WATCH), s.b_topic + topic, base)
        page = np.where(is_t, np.where(pg > 1, pg - 1, 0), page)
        page = np.where(kinds == K_REPLY, s.p_reply, page)
        page = np.where(kinds == K_WATCH, np.where(r2 < 0.5, s.p_unread, s.p_watch), page)
        param = np.where(is_t & (r2 < 0.03), s.q_session + ri % 64, param)
        param = np.where((kinds == K_WATCH) & (page == s.p_watch), s.q_xftoken + ri % 64, param)
        status = np.where((kinds == K_WATCH) & (page == s.p_unread), 303, status)
        forum_of = s.topic_forum[topic]
        base = np.where(kinds == K_FORUM, s.b_forum + forum_of, base)
        page = np.where((kinds == K_FORUM) & (r < 0.2), 1 + ri % 5, page)
        base = np.where(kinds == K_HOME, s.b_misc + 0, base)
        base = np.where(kinds == K_SEARCH, s.b_misc + 1, base)
        param = np.where(kinds == K_SEARCH, s.q_search + ri % s.n_search, param)
        base = np.where(kinds == K_LOGIN_GET, s.b_misc + 2, base)
        base = np.where(kinds == K_LOGIN_POST, s.b_misc + 3, base)
        status = np.where(kinds == K_LOGIN_POST, np.where(r < 0.9, 303, 200), status)
        base = np.where(kinds == K_WHATSNEW, s.b_misc + 4, base)
        base = np.where(kinds == K_JOB, s.b_misc + 5, base)
        base = np.where(kinds == K_API, s.b_api + ri % len(API_PATHS), base)
        param = np.where((kinds == K_API) & (r2 < 0.4), s.q_api + ri % 4, param)
        base = np.where(kinds == K_MEMBER, s.b_member + ri % s.n_member, base)
        base = np.where(kinds == K_NOTFOUND, s.b_notfound + ri % s.n_notfound, base)
        status = np.where(kinds == K_NOTFOUND, 404, status)
        # occasional moved / forbidden / server errors on pages
        status = np.where(is_t & (r2 > 0.985), 301, status)
        status = np.where(is_t & (r2 > 0.995), 403, status)
        status = np.where((kinds != K_NOTFOUND) & (rng.random(g) < 0.002), 500 + (ri % 3) * 2, status)
        # referers for page views: internal forum/topic, search engines, social, none
        rk = rng.random(g)
        ext = s.r_ext + ri % len(REFERER_EXTERNAL)
        ref = np.where(rk < 0.35, s.r_base + s.b_forum + forum_of,
                       np.where(rk < 0.55, s.r_base + s.b_topic + (ri % len(s.topic_ids)),
                                np.where(rk < 0.75, s.r_ext + ri % SEARCH_ENGINE_REFS,
                                         np.where(rk < 0.85, ext, 0))))
        ref = np.where(in_event & (rk > 0.5) & (rk < 0.75), s.r_ext + 5 + ri % 5, ref)  # social shares of the event
        ref = np.where(~is_t & (kinds != K_FORUM), np.where(rk < 0.8, s.r_base + s.b_misc + 0, 0), ref)
        ref = np.where((kinds == K_REPLY) | (kinds == K_WATCH), s.r_base + base, ref)
        b["base"], b["page"], b["param"], b["status"], b["referer"] = (
            base.astype(np.int32), page.astype(np.int16), param.astype(np.int32), status.astype(np.int16),
            ref.astype(np.int32))
        # statics after the page view (same client/UA), a few hundred ms later
        idx = np.repeat(np.arange(g), size)
        first = np.zeros(n, dtype=bool)
        first[np.concatenate([[0], np.cumsum(size)[:-1]])] = True
        out = _take(b, idx)
        st = ~first
        n_st = int(st.sum())
        if n_st:
            rs = rng.random(n_st)
            ri2 = rng.integers(0, 1 << 30, n_st)
            is_av = rs < 0.45
            sbase = np.where(is_av, s.b_avatar + ri2 % s.n_avatar, s.b_static + ri2 % len(STATIC_ASSETS))
            grp_rank = np.arange(n) - np.repeat(np.cumsum(size) - size, size)
            dt = (grp_rank[st] * rng.exponential(180.0, n_st)).astype(np.int64) + 40
            out["ts"][st] = np.minimum(out["ts"][st] + dt, h_start + HOUR_MS - 1)
            out["referer"][st] = (s.r_base + out["base"][st]).astype(np.int32)
            out["base"][st] = sbase
            out["page"][st] = 0
            out["param"][st] = 0
            out["method"][st] = 0
            out["kind"][st] = np.where(is_av, K_AVATAR, K_STATIC)
            out["status"][st] = np.where(rng.random(n_st) < STATIC_304_SHARE, 304, 200)
            a_bytes = np.array([a[2] for a in STATIC_ASSETS])
            sb = np.where(is_av, 0, a_bytes[(ri2 % len(STATIC_ASSETS))])
            out["bytes"][st] = sb
        _fill_perf(rng, out)
        return _fix(out)

    def _uniform_in(self, rng: np.random.Generator, h: int, a: int, b: int, n: int) -> np.ndarray:
        hs = self.p.h0 + h * HOUR_MS
        lo, hi = max(hs, a), min(hs + HOUR_MS, b)
        return rng.integers(lo, max(hi, lo + 1), n).astype(np.int64)

    def crawler(self, h: int, bu: _Burst, n: int) -> Batch:
        s = self.s
        rng = _rng(self.p.cfg.seed, h, 99, bu.comp)
        b = _empty(n)
        b["ts"] = self._uniform_in(rng, h, bu.start_ms, bu.end_ms, n)
        b["client"] = bu.client_off + rng.integers(0, bu.n_ips, n)
        b["ua"] = s.u_crawler + bu.bot
        r = rng.random(n)
        ri = rng.integers(0, 1 << 30, n)
        topic = ri % len(s.topic_ids)  # crawlers walk the long tail uniformly
        pg = 1 + (ri // 7) % s.topic_pages[topic]
        kinds = np.where(r < 0.80, K_TOPIC, np.where(r < 0.92, K_FORUM, np.where(r < 0.95, K_MEMBER,
                         np.where(r < 0.97, K_ROBOTS, np.where(r < 0.985, K_SITEMAP, K_NOTFOUND)))))
        base = np.where(kinds == K_TOPIC, s.b_topic + topic, 0)
        base = np.where(kinds == K_FORUM, s.b_forum + ri % len(s.forum_urls), base)
        base = np.where(kinds == K_MEMBER, s.b_member + ri % s.n_member, base)
        base = np.where(kinds == K_ROBOTS, s.b_misc + 6, base)
        base = np.where(kinds == K_SITEMAP, s.b_misc + 7, base)
        base = np.where(kinds == K_NOTFOUND, s.b_notfound + ri % s.n_notfound, base)
        b["kind"] = kinds.astype(np.int8)
        b["base"] = base.astype(np.int32)
        b["page"] = np.where(kinds == K_TOPIC, pg - 1, 0).astype(np.int16)
        st = np.where(kinds == K_NOTFOUND, 404, 200)
        st = np.where((kinds == K_TOPIC) & (rng.random(n) < 0.03), 301, st)
        st = np.where((kinds == K_TOPIC) & (rng.random(n) < 0.06), 304, st)
        b["status"] = st.astype(np.int16)
        _fill_perf(rng, b)
        return _fix(b)

    def monitor(self, h: int, n: int) -> Batch:
        p = self.p
        hs = p.h0 + h * HOUR_MS
        start = max(hs, p.t0)
        b = _empty(n)
        b["ts"] = start + np.arange(n, dtype=np.int64) * MIN_MS + 17_000
        b["client"] = p.monitor_client
        b["ua"] = self.s.u_tool["monitor"]
        b["method"] = 2
        b["kind"] = K_HOME
        b["base"] = self.s.b_misc + 0
        b["status"] = 200
        b["bytes"] = 0
        b["elapsed"] = 95_000 + (np.arange(n) * 7919) % 40_000
        return _fix(b)

    def transfers(self, h: int, n: int) -> Batch:
        p, s = self.p, self.s
        rng = _rng(p.cfg.seed, h, 98, 2)
        hs = p.h0 + h * HOUR_MS
        b = _empty(n)
        b["ts"] = _times(rng, p.lam[h * 60:h * 60 + 60], hs, n)
        b["client"] = np.searchsorted(s.client_cdf, rng.random(n) * (1 - 1e-12), side="right")
        b["ua"] = s.client_ua[b["client"]]
        att = rng.integers(0, s.n_attach, n)
        b["base"] = s.b_attach + att
        b["kind"] = K_ATTACH
        b["referer"] = s.r_base + s.b_topic + rng.integers(0, len(s.topic_ids), n)
        b["peer"] = (rng.random(n) < 0.4).astype(np.int8)  # 0 = media1 (10.20.0.31), 1 = media2
        size = np.clip(_lognormal(rng, 60e6, 1.0, n), 2e6, 1.5e9).astype(np.int64)
        partial = rng.random(n) < 0.05
        b["status"] = np.where(partial, 206, 200)
        b["bytes"] = size
        mbps = _lognormal(rng, 700.0, 0.15, n)
        for scn in p.collapse:
            inwin = (b["ts"] >= scn.start_ms) & (b["ts"] < scn.end_ms) & (b["peer"] == 0)
            mbps = np.where(inwin, _lognormal(rng, float(scn.params["degraded_mbps"]), 0.15, n), mbps)
            mbps = np.where(~inwin & (b["peer"] == 0), mbps * float(scn.params["normal_mbps"]) / 700.0, mbps)
        b["elapsed"] = (size / (mbps * 1e6) * 1e6).astype(np.int64) + 20_000
        b["azip"] = s.attach_is_zip[att]
        return _fix(b)

    def scenario(self, h: int, scn: _Scn, n: int) -> Batch:
        s = self.s
        rng = _rng(self.p.cfg.seed, h, 97, scn.comp)
        b = _empty(n)
        b["ts"] = self._uniform_in(rng, h, scn.start_ms, scn.end_ms, n)
        ri = rng.integers(0, 1 << 30, n)
        r = rng.random(n)
        b["proto"] = 0
        if scn.kind == "flood_ip":
            b["client"] = scn.client_off
            b["ua"] = s.u_tool["python"] if scn.comp % 2 else s.u_tool["spoof"]
            kinds = np.where(r < 0.5, K_TOPIC, np.where(r < 0.8, K_HOME, K_SEARCH))
            topic = np.searchsorted(s.topic_cdf, rng.random(n) * (1 - 1e-12), side="right").clip(0, len(s.topic_ids) - 1)
            b["base"] = np.where(kinds == K_TOPIC, s.b_topic + topic, np.where(kinds == K_HOME, s.b_misc, s.b_misc + 1))
            b["param"] = np.where(kinds == K_SEARCH, s.q_search + ri % s.n_search, 0)
            b["status"] = np.where(rng.random(n) < 0.04, 503, 200)
        elif scn.kind == "flood_prefix":
            w = _rng(self.p.cfg.seed, 0, 96, scn.comp).uniform(0.5, 1.5, scn.n_clients)
            b["client"] = scn.client_off + np.searchsorted(np.cumsum(w / w.sum()), rng.random(n) * (1 - 1e-12),
                                                           side="right").clip(0, scn.n_clients - 1)
            b["ua"] = rng.integers(0, len(BROWSER_UAS), n)
            kinds = np.where(r < 0.7, K_TOPIC, K_FORUM)
            topic = np.searchsorted(s.topic_cdf, rng.random(n) * (1 - 1e-12), side="right").clip(0, len(s.topic_ids) - 1)
            b["base"] = np.where(kinds == K_TOPIC, s.b_topic + topic, s.b_forum + ri % len(s.forum_urls))
            b["status"] = 200
        elif scn.kind == "flood_distributed":
            b["client"] = scn.client_off + ri % scn.n_clients
            b["ua"] = np.where(r < 0.5, s.u_tool["spoof"], rng.integers(0, len(BROWSER_UAS), n))
            kinds = np.full(n, K_SEARCH)
            b["base"] = s.b_misc + 1
            before = int(self.p.extra[scn.comp][:h].sum())
            b["param"] = scn.param_off + before + np.arange(n)
            b["status"] = np.where(rng.random(n) < 0.15, 503, 200)
        else:  # scan
            b["client"] = scn.client_off
            b["ua"] = np.where(r < 0.6, s.u_tool["zgrab"], s.u_tool["curl"])
            kinds = np.full(n, K_SCAN)
            sp = ri % len(SCAN_PATHS)
            b["base"] = s.b_scan + sp
            b["status"] = np.array([st for _, st in SCAN_PATHS])[sp]
            b["method"] = np.where(rng.random(n) < 0.1, 1, 0)
        b["kind"] = kinds.astype(np.int8)
        if scn.kind != "scan":
            b["method"] = _PROFILE_ARR["method"][kinds].astype(np.int8)
        _fill_perf(rng, b)
        return _fix(b)


# ----------------------------------------------------------------------------------------------------------
# Formatting
# ----------------------------------------------------------------------------------------------------------

_MON = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_HMS = None
_MS3 = pa.array([f".{i:03d}" for i in range(1000)], pa.string())
_STATUS = pa.array([f"{i:03d}" for i in range(1000)], pa.string())
_PEERS = ("10.20.0.31", "10.20.0.32")
_BACKENDS = ("10.20.0.11", "10.20.0.12")


def _hms() -> pa.Array:
    global _HMS
    if _HMS is None:
        _HMS = pa.array([f"{h:02d}:{m:02d}:{s:02d}" for h in range(24) for m in range(60) for s in range(60)], pa.string())
    return _HMS


def _take_str(tbl: pa.Array, idx: np.ndarray) -> pa.Array:
    return tbl.take(pa.array(idx))


def _to_bytes(arr: pa.Array) -> memoryview:
    """The concatenated UTF-8 bytes of a string array (no copy)."""
    if len(arr) == 0:
        return memoryview(b"")
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset: arr.offset + len(arr) + 1]
    return memoryview(bufs[2])[int(offs[0]): int(offs[-1])]


def _apache_time(b: Batch, off_s: np.ndarray) -> pa.Array:
    """``[dd/Mon/yyyy:HH:MM:SS +hhmm] "`` per line; ``off_s`` is each line's UTC offset in seconds."""
    local = b["ts"] // 1000 + off_s
    day = local // 86400
    d0 = int(day.min())
    prefixes = []
    for d in range(d0, int(day.max()) + 1):
        dt = date(1970, 1, 1) + timedelta(days=d)
        prefixes.append(f"[{dt.day:02d}/{_MON[dt.month - 1]}/{dt.year}:")
    pre = _take_str(pa.array(prefixes, pa.string()), day - d0)
    hms = _take_str(_hms(), local % 86400)
    uoff, inv = np.unique(off_s, return_inverse=True)
    sfx = []
    for o in uoff:
        oh, om = divmod(abs(int(o)) // 60, 60)
        sfx.append(f" {'+' if o >= 0 else '-'}{oh:02d}{om:02d}] \"")
    return pc.binary_join_element_wise(pre, hms, _take_str(pa.array(sfx, pa.string()), inv), "")


def format_lines(site: _Site, fmt: str, b: Batch, off_s: np.ndarray) -> memoryview:
    """Format a time-sorted batch as ``fmt`` log lines (each ending in a newline); ``off_s``: UTC offset of
    each line in seconds (Apache formats)."""
    if len(b["ts"]) == 0:
        return memoryview(b"")
    client = _take_str(site.client_tbl, b["client"])
    method = _take_str(pa.array(METHODS, pa.string()), b["method"])
    url = pc.binary_join_element_wise(_take_str(site.base_tbl, b["base"]), _take_str(site.page_tbl, b["page"]),
                                      _take_str(site.param_tbl, b["param"]), "")
    status = _take_str(_STATUS, b["status"])
    if fmt in ("combined", "combined_d"):
        ts = _apache_time(b, off_s)
        byt = pc.if_else(pa.array(b["bytes"] == 0), pa.scalar("-"), pc.cast(pa.array(b["bytes"]), pa.string()))
        proto = _take_str(pa.array(PROTOCOLS, pa.string()), b["proto"])
        ref = _take_str(site.referer_tbl, b["referer"])
        ua = _take_str(site.ua_tbl, b["ua"])
        parts: list[Any] = [client, " - - ", ts, method, " ", url, " ", proto, "\" ", status, " ", byt, " \"", ref,
                            "\" \"", ua, "\""]
        if fmt == "combined_d":
            parts += [" ", pc.cast(pa.array(b["elapsed"]), pa.string())]
        parts += ["\n", ""]
        return _to_bytes(pc.binary_join_element_wise(*parts))
    if fmt != "squid":
        raise ValueError(f"unknown format {fmt!r}")
    sec = pc.cast(pa.array(b["ts"] // 1000), pa.string())
    ms = _take_str(_MS3, b["ts"] % 1000)
    el = pc.utf8_lpad(pc.cast(pa.array(b["elapsed"] // 1000), pa.string()), width=6, padding=" ")
    kind = b["kind"].astype(np.int64)
    st = b["status"]
    is_static = (kind == K_STATIC) | (kind == K_AVATAR)
    # cache result and hierarchy/peer
    code = np.where(is_static & (st == 304), 3, np.where(is_static & (st == 200), np.where(b["bytes"] % 3 == 0, 2, 1), 0))
    code_tbl = pa.array(["TCP_MISS", "TCP_HIT", "TCP_MEM_HIT", "TCP_REFRESH_UNMODIFIED"], pa.string())
    peer = b["peer"].astype(np.int64)
    hier_tbl = pa.array(["HIER_NONE/-", f"FIRST_UP_PARENT/{_BACKENDS[0]}", f"FIRST_UP_PARENT/{_BACKENDS[1]}",
                         f"FIRST_UP_PARENT/{_PEERS[0]}", f"FIRST_UP_PARENT/{_PEERS[1]}"], pa.string())
    hier = np.where(peer >= 0, 3 + peer, np.where(code > 0, 0, 1 + (b["ts"] % 2)))
    ct = _KIND_CT[kind]
    ct = np.where(kind == K_ATTACH, np.where(b["azip"], CT["application/zip"], CT["video/mp4"]), ct)
    ct = np.where(is_static & (b["base"] >= site.b_static) & (b["base"] < site.b_static + len(STATIC_ASSETS)),
                  _static_ct()[np.clip(b["base"] - site.b_static, 0, len(STATIC_ASSETS) - 1)], ct)
    ct = np.where(st >= 300, np.where(st == 304, CT["-"], CT["text/html"]), ct)
    ct = np.where(st == 206, CT["video/mp4"], ct)
    byt = pc.cast(pa.array(np.where(st == 304, 280, b["bytes"] + 310)), pa.string())
    parts = [sec, ms, " ", el, " ", client, " ", _take_str(code_tbl, code), "/", status, " ", byt, " ", method,
             f" https://{site.host}", url, " - ", _take_str(hier_tbl, hier), " ",
             _take_str(pa.array(CONTENT_TYPES, pa.string()), ct), "\n", ""]
    return _to_bytes(pc.binary_join_element_wise(*parts))


def _static_ct() -> np.ndarray:
    m = {"css": "text/css", "js": "application/javascript", "png": "image/png", "font": "font/woff2",
         "ico": "image/x-icon"}
    return np.array([CT[m[a[1]]] for a in STATIC_ASSETS])


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------


def _apply_outage(plan: _Plan, b: Batch, fmt: str) -> None:
    if not len(b["ts"]):
        return
    m = np.clip((b["ts"] - plan.h0) // MIN_MS, 0, plan.n_min - 1)
    o = plan.outage[m] & (b["kind"] != K_ATTACH)
    if not o.any():
        return
    k = int(o.sum())
    pick = (b["ts"][o] // 7) % 10
    if fmt == "squid":
        st = np.where(pick < 6, 502, np.where(pick < 9, 503, 504))
    else:
        st = np.where(pick < 8, 503, 500)
    b["status"][o] = st
    b["bytes"][o] = 1_180 + (st - 500) * 13
    b["elapsed"][o] = np.where(st == 504, 30_000_000, 2_000 + (b["ts"][o] % 5000) * 100)
    b["proto"][o] = b["proto"][o]
    _ = k


def simulate(cfg: SimConfig, progress: bool = False) -> SimResult:
    """Generate the logs, ``topics.csv`` and ``truth.json`` under ``cfg.out``; return a summary.

    Raises ``ValueError`` for inconsistent options (unknown format/scenario, a scenario window outside the run,
    ``lines`` too small for the scenarios).  Existing files of the same names are overwritten."""
    t_start = time.perf_counter()
    plan = _Plan(cfg)
    site = plan.site
    gen = _Gen(plan)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {s.name: out / f"{s.name}.log" for s in plan.sources}
    handles = {name: open(path, "wb") for name, path in files.items()}  # noqa: SIM115
    counts = dict.fromkeys(files, 0)
    live_src = [np.flatnonzero(plan.live[h]) for h in range(plan.n_hours)]
    bursts_by_hour: dict[int, list[_Burst]] = {}
    for bu in plan.bursts:
        for h in np.flatnonzero(plan.extra[bu.comp]):
            bursts_by_hour.setdefault(int(h), []).append(bu)
    flood_scn = [s for s in plan.scenarios if s.comp in plan.extra]
    in_window = {s.id: 0 for s in plan.scenarios}
    event_views = {s.id: 0 for s in plan.scenarios if s.kind == "event"}
    ev_bases = site.b_topic + site.event_topic_idx
    pending: list[list[Batch]] = [[] for _ in plan.sources]
    pending_n = [0] * len(plan.sources)
    made = 0  # lines generated so far (progress)
    try:
        for h in range(plan.n_hours):
            extras: list[Batch] = []
            for bu in bursts_by_hour.get(h, []):
                extras.append(gen.crawler(h, bu, int(plan.extra[bu.comp][h])))
            if plan.extra[1][h]:
                extras.append(gen.monitor(h, int(plan.extra[1][h])))
            for scn in flood_scn:
                c = int(plan.extra[scn.comp][h])
                if c:
                    extras.append(gen.scenario(h, scn, c))
            ex = _concat(extras)
            if len(ex["ts"]):
                ls = live_src[h]
                ex_src = ls[_rng(cfg.seed, h, 95).integers(0, len(ls), len(ex["ts"]))]
            else:
                ex_src = np.zeros(0, dtype=np.int64)
            last = h == plan.n_hours - 1
            for si, src in enumerate(plan.sources):
                parts = [gen.background(h, si, int(plan.bg[h, si])), _take(ex, np.flatnonzero(ex_src == si))]
                if plan.media_src == si and 2 in plan.extra and plan.extra[2][h]:
                    parts.append(gen.transfers(h, int(plan.extra[2][h])))
                b = _concat(parts)
                if len(b["ts"]):
                    b = _take(b, np.argsort(b["ts"], kind="stable"))
                    pending[si].append(b)
                    pending_n[si] += len(b["ts"])
                    made += len(b["ts"])
                if pending_n[si] and (pending_n[si] >= FLUSH_LINES or last):
                    b = _concat(pending[si])
                    pending[si], pending_n[si] = [], 0
                    _apply_outage(plan, b, src.format)
                    for scn in plan.scenarios:
                        lo, hi = np.searchsorted(b["ts"], [scn.start_ms, scn.end_ms])
                        in_window[scn.id] += int(hi - lo)
                        if scn.kind == "event" and hi > lo:
                            sel = slice(int(lo), int(hi))
                            event_views[scn.id] += int(np.isin(b["base"][sel], ev_bases).sum())
                    off = plan.hour_off_s[(b["ts"] - plan.h0) // HOUR_MS]
                    handles[src.name].write(format_lines(site, src.format, b, off))
                    counts[src.name] += len(b["ts"])
            if progress and h % 24 == 23:
                # lines made so far (written in blocks of FLUSH_LINES, so the files lag behind)
                print(f"  day {h // 24 + 1}/{-(-plan.n_hours // 24)}: {made:,} lines", flush=True)
    finally:
        for fh in handles.values():
            fh.close()
    _write_topics(cfg, site, out / "topics.csv")
    secs = time.perf_counter() - t_start
    truth = _truth(cfg, plan, counts, in_window, event_views, files)
    truth_path = out / "truth.json"
    truth_path.write_text(json.dumps(truth, indent=2, sort_keys=False) + "\n")
    return SimResult(out, counts, sum(counts.values()), truth["scenarios"], plan.skipped, secs, truth_path)


def _write_topics(cfg: SimConfig, site: _Site, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["site", "topic_id", "title", "forum"])
        for i in np.argsort(site.topic_ids):
            w.writerow([cfg.site, int(site.topic_ids[i]), site.topic_titles[i], site.forum_names[site.topic_forum[i]]])


def _truth(cfg: SimConfig, plan: _Plan, counts: dict[str, int], in_window: dict[str, int],
           event_views: dict[str, int], files: dict[str, Path]) -> dict[str, Any]:
    zone = plan.zone

    def local(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, zone).isoformat()

    scen = []
    for s in plan.scenarios:
        mag = {k: v for k, v in s.params.items() if k not in ("hour", "official_local_days")}
        e: dict[str, Any] = {"id": s.id, "kind": s.kind, "start": _iso(s.start_ms), "end": _iso(s.end_ms), "start_ms": s.start_ms,
             "end_ms": s.end_ms, "start_local": local(s.start_ms), "end_local": local(s.end_ms), "scope": s.scope,
             "magnitude": mag, "lines_in_window": in_window[s.id]}
        if s.comp in plan.extra:
            e["lines"] = s.lines
        if s.kind == "event":
            e["group_views_in_window"] = event_views[s.id]
            e["peak"] = _iso(min(s.start_ms + int(float(s.params["rise_h"]) * HOUR_MS), s.end_ms - 60_000))
        if s.kind == "flood_prefix" or s.kind == "flood_distributed":
            e["magnitude"]["per_address_rate"] = round(float(s.params["rate"]) / max(s.n_clients, 1), 4)
        scen.append(e)
    benign: list[dict[str, Any]] = []
    for n in plan.nat:
        benign.append({"kind": "nat_gateway", "client_ip": n["ip"], "profile": n["kind"],
                       "target_rate": n["target_rate"], "max_share_of_traffic": n["cap_share"]})
    for bu in plan.bursts:
        if bu.lines:
            benign.append({"kind": "crawler_burst", "bot": CRAWLERS[bu.bot][0],
                           "client_ips": plan.site.client_strs[bu.client_off: bu.client_off + bu.n_ips],
                           "start": _iso(bu.start_ms), "end": _iso(bu.end_ms), "start_ms": bu.start_ms,
                           "end_ms": bu.end_ms, "rate": round(bu.rate, 3), "lines": bu.lines})
    benign.append({"kind": "uptime_monitor", "client_ip": plan.site.client_strs[plan.monitor_client],
                   "rate": "1 HEAD / per minute"})
    return {
        "generator": "forumpulse.pipeline.simulate", "version": GENERATOR_VERSION, "seed": cfg.seed,
        "site": cfg.site, "host": cfg.host, "timezone": cfg.tz, "country": cfg.country,
        "start": _iso(plan.t0), "end": _iso(plan.t1), "start_ms": plan.t0, "end_ms": plan.t1, "days": cfg.days,
        "lines_per_day": round(plan.nominal_per_day), "lines_requested": cfg.lines, "total_lines": sum(counts.values()),
        "sources": [{"name": s.name, "format": s.format, "file": files[s.name].name, "origin_host": s.name,
                     "lines": counts[s.name]} for s in plan.sources],
        "topics_csv": "topics.csv", "topic_count": len(plan.site.topic_ids),
        "topic_groups": {s.scope["group"]: s.scope["topic_ids"] for s in plan.scenarios if s.kind == "event"},
        "upstreams": {"media1": _PEERS[0], "media2": _PEERS[1], "web_backends": list(_BACKENDS)},
        "scenarios": scen, "skipped": plan.skipped, "benign": benign,
    }


def file_digest(path: Path) -> str:
    """sha256 of a file (for determinism checks)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------

try:
    import typer

    _Opt = typer.Option
except ImportError:  # pragma: no cover - typer is a dependency
    typer = None  # type: ignore[assignment]


def simulate_command(
    out: Annotated[Path, typer.Option("--out", help="output folder (logs, topics.csv, truth.json)")] = Path("sim"),
    start: Annotated[str, typer.Option(help="first day (YYYY-MM-DD, site local time)")] = "2024-01-22",
    weeks: Annotated[int | None, typer.Option(help="weeks to simulate (default 4 unless --days)")] = None,
    days: Annotated[int | None, typer.Option(help="days to simulate (overrides --weeks)")] = None,
    lines_per_day: Annotated[int, typer.Option(help="average lines per normal day (all files together)")] = 100_000,
    lines: Annotated[int | None, typer.Option(help="exact total line count (volume adapts; for benchmarks)")] = None,
    formats: Annotated[str, typer.Option("--formats", "--format",
                                         help="comma list of combined, combined_d, squid, optionally name=format; "
                                              "one file per entry")] = "combined_d,combined,squid",
    tz: Annotated[str, typer.Option(help="site time zone (IANA)")] = "Asia/Kuala_Lumpur",
    country: Annotated[str, typer.Option(help="holidays calendar country code ('' for none)")] = "MY",
    seed: Annotated[int, typer.Option(help="random seed (same seed and options, byte-identical output)")] = 1,
    scenarios: Annotated[str, typer.Option(help="'default', 'none', or a comma list of kinds, each optionally "
                                                "kind@YYYY-MM-DDTHH:MM[/3h] (local time)")] = "default",
    topics: Annotated[int, typer.Option(help="number of topics")] = 3000,
    site: Annotated[str, typer.Option(help="site name (topics.csv, truth.json)")] = "forum",
) -> None:
    """Generate realistic, deterministic forum access logs with injected scenarios and their ground truth."""
    try:
        n_days = days if days is not None else 7 * (weeks if weeks is not None else 4)
        cfg = SimConfig(out=out, start=date.fromisoformat(start), days=n_days, lines_per_day=lines_per_day,
                        lines=lines, sources=parse_sources(formats), tz=tz, country=country or None, seed=seed,
                        scenarios=parse_scenarios(scenarios), site=site, topics=topics)
        res = simulate(cfg, progress=True)
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    print_summary(res)


def print_summary(res: SimResult) -> None:
    """Print lines per file and per scenario (plain text, one item per line)."""
    echo = print
    echo(f"simulated {res.total_lines:,} lines in {res.seconds:.1f} s ({res.lines_per_second:,.0f} lines/s)")
    for name, n in res.files.items():
        echo(f"  {res.out / (name + '.log')}: {n:,} lines")
    tz = json.loads(res.truth_path.read_text()).get("timezone", "UTC") if res.truth_path.is_file() else "UTC"
    echo(f"scenarios (ground truth: {res.truth_path}; windows in the site's time, {tz}):")
    for e in res.scenarios:
        scope = {k: v for k, v in e["scope"].items() if k not in ("paths", "local_days", "site")}
        if "topic_ids" in scope:
            scope["topic_ids"] = len(scope["topic_ids"])
        own = f", own lines {e['lines']:,}" if "lines" in e else ""
        echo(f"  {e['id']:<22} {e['start_local'][:16]} .. {e['end_local'][:16]}  lines in window "
             f"{e['lines_in_window']:,}{own}  {json.dumps(scope)}")
    for sk in res.skipped:
        echo(f"  skipped: {sk}")


def _lines_per_second(n: int) -> float:
    """Helper for ad-hoc measurements: seconds to generate ``n`` combined lines into a temp folder."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        res = simulate(SimConfig(out=Path(d), days=max(1, math.ceil(n / 400_000)), lines=n,
                                 sources=(SourceSpec("web1", "combined"),), scenarios=()))
        return res.lines_per_second


def truth_config(truth: dict[str, Any], log_dir: Path) -> dict[str, Any]:
    """The forumpulse configuration (as a mapping for ``Settings``/YAML) that describes a simulated run: its site
    (time zone, holiday country, host), one source per log file with its format, the topic groups, the titles
    CSV, and retention off (simulated logs are dated in the past and would be dropped by a TTL)."""
    return {
        "sites": [{"name": truth["site"], "timezone": truth["timezone"], "country": truth.get("country"),
                   "hosts": [truth["host"]]}],
        "sources": [{"name": s["name"], "site": truth["site"], "format": s["format"],
                     "paths": [str(Path(log_dir) / s["file"])], "origin_host": s["origin_host"]}
                    for s in truth["sources"]],
        "retention": {"raw_days": 0, "rollup_days": 0},
        "topics": {"titles_csv": str(Path(log_dir) / truth["topics_csv"]),
                   "groups": [{"name": g, "site": truth["site"], "topic_ids": ids}
                              for g, ids in truth["topic_groups"].items()]},
    }

