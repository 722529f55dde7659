"""Enrichment of access records from rules kept as data: topic attribution, page kind, statics, bots.

Rules live in versioned YAML files next to this module (``rules/topics.yaml``, ``rules/static.yaml``,
``rules/bots.yaml``; each file documents its schema and carries its own fixture ``cases``), plus the user's
``Settings.topics.rules_file`` (same schema as ``topics.yaml``, tried *before* the built-in rules) and
``Settings.bots.extra_patterns`` / ``Settings.bots.static_extensions``.

:meth:`Enricher.derive` is the hot-path call: ``(site, method, path, query, content_type, user_agent)`` ->
``(topic_id, page_kind, is_static, is_bot, bot_name)``.

Guarantees
----------
* Pure: after construction no I/O, no clock; same input, same output.  Never raises for any ``str`` input.
* Classification uses method + path + query only; :meth:`Enricher.derive` does not see the response status.  The
  callers then apply :func:`status_page_kind` (the reference path, per line) or :func:`status_page_kinds` (the
  fast path, vectorised over the assembled rows, as the per-request-line cache holds no status): a
  ``topic_view`` stays one only for a 2xx or 304 answer, a ``reply`` only below 400 (a POST-redirect-GET 302/303
  is still a reply); otherwise the page is ``other``, its topic kept.  An unknown status (``0``: ``-``/``000``,
  or ``None``) keeps the kind.  So a 404, a 403, a 5xx or a 301/302 redirect of a topic URL (XenForo redirects
  /threads/123 to /threads/slug.123/: one visit, two lines) is not a topic view, and a failed POST is not a reply.
* Only ``GET`` and ``POST`` requests can be ``topic_view`` or ``reply``: any other method (``HEAD``, ``OPTIONS``,
  ``PUT``...) turns such an answer into ``other`` (topic kept), whichever rule (built-in or user) matched.
  ``path`` is the percent-encoded path (no scheme/host), ``query`` is without ``?`` (``""`` when none).
* ``topic_id`` is an int in ``1 .. 2**63-1`` or ``None``; ``page_kind`` is one of
  :data:`forumpulse.pipeline.record.PAGE_KINDS`.
* A path whose extension / prefix is static skips the topic rules (``page_kind`` ``static``).  A static content
  type marks ``is_static`` and turns an ``other`` page into ``static`` but never overrides a topic rule.
* A request with an empty or ``None`` user agent is a bot only when its client address is in a crawler's
  published network (``rules/crawler_networks.yaml``, ``Settings.bots.by_address``; ``bot_name`` is the
  crawler's), else not a bot (``bot_name`` ``None``); :attr:`Enricher.empty_user_agents` counts them so a caller
  can report how many lines had no UA.  An address never makes a request *with* a user agent a bot.
* Memory is bounded: results are cached in two-generation caches (see :class:`BoundedCache`) keyed by
  ``(site, method, path)`` when no rule consulted the query, else by ``(site, method, path, query)``; UAs and
  content types are cached separately.  Session parameters in the query therefore do not defeat the cache for
  path-only rules (XenForo, Discourse, Flarum, Invision...).

Misuse: an invalid rules file (bad regex, unknown page kind, duplicate id, unknown ``topic`` source) raises
:class:`RulesError` naming the file and rule at construction.  One Enricher per worker: the caches are not
thread-safe for concurrent writers.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.privacy import BoundedCache
from forumpulse.pipeline.record import PAGE_KINDS
from forumpulse.pipeline.store import sql_string
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "BUILTIN_ENGINES",
    "REFERER_TOPIC",
    "BotDetector",
    "CrawlerNetworks",
    "Enricher",
    "GroupSync",
    "RulesError",
    "StaticClassifier",
    "TitlesLoad",
    "TopicRules",
    "benchmark_derive",
    "builtin_rules_path",
    "empty_groups",
    "load_configured_titles",
    "load_post_map",
    "load_topic_rules",
    "load_topic_titles",
    "log_requests",
    "stored_titles",
    "sync_topic_groups",
    "synthetic_requests",
    "topic_group_rows",
]

BUILTIN_ENGINES = ("vbulletin", "phpbb", "xenforo", "discourse", "smf", "mybb", "invision", "flarum")
MAX_TOPIC_ID = 2**63 - 1
_LEADING_DIGITS = re.compile(r"\d{1,19}")
_QSEP = re.compile(r"[&;]")
#: page kinds only a GET or POST can be (see the module docstring); other methods get ``other``
_READ_KINDS = frozenset(("topic_view", "reply"))
_READ_METHODS = frozenset(("GET", "POST"))


def status_page_kind(kind: str, status: int | None) -> str:
    """``kind`` (from :meth:`Enricher.derive`) given the response ``status`` (see the module docstring): a
    ``topic_view`` answered with neither 2xx nor 304, or a ``reply`` answered with 400 or more, is ``other``;
    an unknown status (``0`` or ``None``) and every other kind are kept."""
    if not status:
        return kind
    if kind == "topic_view":
        return kind if 200 <= status < 300 or status == 304 else "other"
    if kind == "reply":
        return kind if status < 400 else "other"
    return kind


def status_page_kinds(kinds: pa.Array, statuses: pa.Array) -> pa.Array:
    """:func:`status_page_kind` for columns of page kinds (strings) and statuses (integers, nulls are unknown);
    returns ``kinds`` itself when no row changes."""
    st = np.asarray(statuses.fill_null(0).to_numpy(zero_copy_only=False))
    view_bad = (st != 0) & ((st < 200) | (st >= 300)) & (st != 304)
    reply_bad = st >= 400
    if not (view_bad.any() or reply_bad.any()):
        return kinds
    demote = view_bad & np.asarray(pc.equal(kinds, "topic_view").to_numpy(zero_copy_only=False))
    demote |= reply_bad & np.asarray(pc.equal(kinds, "reply").to_numpy(zero_copy_only=False))
    if not demote.any():
        return kinds
    return pc.if_else(pa.array(demote), pa.scalar("other", pa.string()), kinds)


class RulesError(ValueError):
    """A rules file is invalid; the message names the file and the rule."""


class DataFileError(RulesError):
    """A data file the configuration names (topic titles, the post map) is missing or invalid; the message names
    the file and the line.  A RulesError, so every caller of those still catches it; the CLI labels it apart."""


def builtin_rules_path(name: str) -> Path:
    """Path of a built-in rules file (``topics.yaml``, ``static.yaml``, ``bots.yaml``)."""
    return Path(str(resources.files("forumpulse.pipeline").joinpath("rules", name)))


#: libyaml's safe loader when PyYAML was built with it (several times faster on the rule files), else PyYAML's own
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_SAFE_LOADER)
    except (OSError, yaml.YAMLError) as exc:
        raise RulesError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise RulesError(f"{path}: the top level must be a mapping")
    return data


def _errors(path: Path, exc: ValidationError) -> RulesError:
    return RulesError(f"{path}: " + "; ".join(
        f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()))


# ================================================================================= topic rules: schema


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


#: topic answer of a rule whose topic comes from the page the request was sent from (``referer`` source, e.g. a
#: Discourse reply is ``POST /posts`` from the topic's page): callers resolve it per line with
#: :meth:`Enricher.topic_from_referer` (``Processor`` and the fast path do), never store it.
REFERER_TOPIC = -1


class TopicCase(_M):
    method: str = "GET"
    url: str
    referer: str | None = None
    topic: int | None
    kind: str
    post_map: dict[int, int] = Field(default_factory=dict)

    def split(self) -> tuple[str, str]:
        path, _, query = self.url.partition("?")
        return path, query


class TopicRuleModel(_M):
    id: str
    engine: str
    sites: list[str] | None = None
    methods: list[str] | None = None
    hint: str | None = None
    path: str | None = None
    raw_query: str | None = None
    query: dict[str, str | None] = Field(default_factory=dict)
    query_absent: list[str] = Field(default_factory=list)
    topic: list[str] = Field(default_factory=list)
    page_kind: str
    cases: list[TopicCase] = Field(default_factory=list)

    @field_validator("page_kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v not in PAGE_KINDS:
            raise ValueError(f"unknown page_kind {v!r} (one of {', '.join(PAGE_KINDS)})")
        return v

    @field_validator("topic")
    @classmethod
    def _sources(cls, v: list[str]) -> list[str]:
        for s in v:
            kind, _, key = s.partition(":")
            if not ((kind in ("path", "raw_query", "referer") and not key) or (kind in ("query", "post_map") and key)):
                raise ValueError(f"unknown topic source {s!r} (path, raw_query, query:KEY, post_map:KEY, referer)")
        if "referer" in v[:-1]:
            raise ValueError("topic source 'referer' must come last (it always answers, so later sources would "
                             "never be tried)")
        return v


class TopicRulesFile(_M):
    version: int
    rules: list[TopicRuleModel]


# ================================================================================= topic rules: compiled


@dataclass(frozen=True, slots=True)
class Rule:
    """A compiled topic rule (see ``rules/topics.yaml`` for the meaning of each field)."""

    id: str
    engine: str
    user: bool
    sites: frozenset[str] | None
    methods: frozenset[str] | None
    hint: str | None
    path: re.Pattern[str] | None
    raw_query: re.Pattern[str] | None
    query: tuple[tuple[str, re.Pattern[str] | None], ...]
    query_absent: tuple[str, ...]
    topic: tuple[tuple[str, str], ...]
    page_kind: str
    uses_query: bool
    model: TopicRuleModel


def load_topic_rules(path: str | Path, *, user: bool = False) -> list[Rule]:
    """Load and compile a topic rules file.  Raises :class:`RulesError` on any problem."""
    p = Path(path)
    try:
        doc = TopicRulesFile.model_validate(_read_yaml(p))
    except ValidationError as exc:
        raise _errors(p, exc) from None
    out: list[Rule] = []
    seen: set[str] = set()
    for m in doc.rules:
        if m.id in seen:
            raise RulesError(f"{p}: duplicate rule id {m.id!r}")
        seen.add(m.id)
        try:
            path_re = re.compile(m.path) if m.path is not None else None
            raw_re = re.compile(m.raw_query) if m.raw_query is not None else None
            query = tuple((k, re.compile(v) if v is not None else None) for k, v in m.query.items())
        except re.error as exc:
            raise RulesError(f"{p}: rule {m.id}: bad regular expression: {exc}") from None
        sources = tuple((s.partition(":")[0], s.partition(":")[2]) for s in m.topic)
        if ("path", "") in sources and (path_re is None or "topic" not in path_re.groupindex):
            raise RulesError(f"{p}: rule {m.id}: topic source 'path' needs a (?P<topic>...) group in path")
        if ("raw_query", "") in sources and (raw_re is None or "topic" not in raw_re.groupindex):
            raise RulesError(f"{p}: rule {m.id}: topic source 'raw_query' needs a (?P<topic>...) group")
        uses_query = bool(query or m.query_absent or raw_re is not None
                          or any(k != "path" for k, _ in sources))
        out.append(Rule(
            id=m.id, engine=m.engine, user=user, sites=frozenset(m.sites) if m.sites is not None else None,
            methods=frozenset(x.upper() for x in m.methods) if m.methods is not None else None,
            hint=m.hint or None, path=path_re, raw_query=raw_re, query=query,
            query_absent=tuple(m.query_absent), topic=sources, page_kind=m.page_kind,
            uses_query=uses_query, model=m))
    return out


def _parse_query(query: str) -> dict[str, str]:
    params: dict[str, str] = {}
    for part in _QSEP.split(query):
        k, _, v = part.partition("=")
        if k not in params:
            params[k] = v
    return params


def _digits(value: str | None) -> int | None:
    if not value:
        return None
    m = _LEADING_DIGITS.match(value)
    if m is None:
        return None
    n = int(m.group())
    return n if 0 < n <= MAX_TOPIC_ID else None


def _routable(path: str) -> bool:
    """Whether ``path`` is an ``index.php`` whose query may be a route (so its answer depends on the query)."""
    return path.endswith("index.php") and (len(path) == 9 or path[-10] == "/")


def _route(path: str, query: str) -> tuple[str, str] | None:
    """``/x/index.php?threads/slug.1/&a=b`` -> (``/x/threads/slug.1/``, ``a=b``); None when not a route."""
    if not query or not _routable(path):
        return None
    m = _QSEP.search(query)
    first = query if m is None else query[:m.start()]
    if not first or "=" in first:
        return None
    return path[:-9] + first.lstrip("/"), ("" if m is None else query[m.end():])


class TopicRules:
    """An ordered list of compiled rules answering ``(topic_id, page_kind)`` for a request.

    ``post_map`` maps phpBB post ids to topic ids (``post_map:KEY`` sources); it is not copied.
    """

    def __init__(self, rules: Sequence[Rule], post_map: Mapping[int, int] | None = None) -> None:
        self.rules = tuple(rules)
        self.post_map: Mapping[int, int] = post_map if post_map is not None else {}

    def select(self, site: str, engines: Iterable[str] = ()) -> tuple[Rule, ...]:
        """Rules applying to ``site``: built-in rules of ``engines`` (empty = all) and every user rule,
        minus rules restricted to other sites (order kept)."""
        allowed = frozenset(engines)
        return tuple(r for r in self.rules
                     if (r.sites is None or site in r.sites) and (r.user or not allowed or r.engine in allowed))

    def classify(self, rules: Sequence[Rule], method: str, path: str,
                 query: str) -> tuple[int | None, str, Rule | None, bool]:
        """-> ``(topic_id, page_kind, rule or None, query_used)``; ``query_used`` says whether the answer may
        depend on ``query`` (False allows caching by path only).  No match -> ``(None, "other", None, ...)``."""
        # An index.php answers by its query whenever the query *could* be a route: a bare /index.php (or
        # /index.php?foo=1) must not be cached by path, or a later /index.php?threads/x.1/ would get its answer.
        query_used = _routable(path)
        routed = _route(path, query)
        if routed is not None:
            path, query = routed
        params: dict[str, str] | None = None
        for r in rules:
            if r.methods is not None and method not in r.methods:
                continue
            if r.hint is not None and r.hint not in path:
                continue
            pm = None
            if r.path is not None:
                pm = r.path.search(path)
                if pm is None:
                    continue
            if r.uses_query:
                query_used = True
            rm = None
            if r.raw_query is not None:
                rm = r.raw_query.match(query)
                if rm is None:
                    continue
            if r.query or r.query_absent:
                if params is None:
                    params = _parse_query(query)
                if any(k in params for k in r.query_absent):
                    continue
                ok = True
                for k, rx in r.query:
                    v = params.get(k)
                    if v is None or (rx is not None and rx.fullmatch(v) is None):
                        ok = False
                        break
                if not ok:
                    continue
            topic: int | None = None
            for kind, key in r.topic:
                if kind == "path":
                    topic = _digits(pm.group("topic") if pm is not None else None)
                elif kind == "raw_query":
                    topic = _digits(rm.group("topic") if rm is not None else None)
                elif kind == "referer":
                    topic = REFERER_TOPIC
                else:
                    if params is None:
                        params = _parse_query(query)
                    n = _digits(params.get(key))
                    if kind == "post_map":
                        n = self.post_map.get(n) if n is not None else None
                        n = n if n is not None and 0 < n <= MAX_TOPIC_ID else None
                    topic = n
                if topic is not None:
                    break
            kind = r.page_kind
            if kind in _READ_KINDS and method not in _READ_METHODS:
                kind = "other"  # a HEAD (link checker, monitor), OPTIONS, PUT... reads or posts nothing
            return topic, kind, r, query_used
        return None, "other", None, query_used


    def topic_from_referer(self, rules: Sequence[Rule], referer: str | None) -> int | None:
        """The topic of the page a request came from: the referer's path and query classified as a ``GET``, kept
        when that page is a topic view or reply with a topic (a forum list, a search engine: ``None``).  The
        referer's host is not checked: a topic-shaped path on another host counts too (browsers send a
        cross-site referer for a POST only from a page that posts to this forum)."""
        if not referer or referer == "-":
            return None
        rest = referer
        scheme = rest.find("://")
        if scheme >= 0:
            slash = rest.find("/", scheme + 3)
            rest = rest[slash:] if slash >= 0 else "/"
        elif not rest.startswith("/"):
            return None
        rest = rest.partition("#")[0]
        path, _, query = rest.partition("?")
        topic, kind, _, _ = self.classify(rules, "GET", path, query)
        if topic is None or topic == REFERER_TOPIC or kind not in ("topic_view", "reply"):
            return None
        return topic


def load_post_map(csv_path: str | Path) -> dict[int, int]:
    """Read a ``post_id,topic_id`` CSV (optional header) into a dict.  Raises RulesError (a ValueError) naming
    the file and the line."""
    out: dict[int, int] = {}
    try:
        with open(csv_path, newline="", encoding="utf-8-sig") as fh:
            for no, row in enumerate(csv.reader(fh), 1):
                if not row or (no == 1 and not row[0].strip().isdigit()):
                    continue
                try:
                    out[int(row[0])] = int(row[1])
                except (ValueError, IndexError):
                    raise DataFileError(f"{csv_path}:{no}: expected post_id,topic_id, got {row!r}") from None
    except OSError as exc:
        raise DataFileError(f"topics.post_map_csv: cannot read {csv_path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{csv_path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return out


# ================================================================================= statics


class StaticCase(_M):
    path: str
    content_type: str | None = None
    static: bool


class StaticFile(_M):
    version: int
    extensions: list[str]
    path_prefixes: list[str]
    content_types: list[str]
    cases: list[StaticCase] = Field(default_factory=list)


class StaticClassifier:
    """Static resources by extension, path prefix and content type (``rules/static.yaml``)."""

    def __init__(self, path: str | Path | None = None, extra_extensions: Iterable[str] = ()) -> None:
        p = Path(path) if path is not None else builtin_rules_path("static.yaml")
        try:
            self.doc = StaticFile.model_validate(_read_yaml(p))
        except ValidationError as exc:
            raise _errors(p, exc) from None
        self.extensions = frozenset(e.lower().lstrip(".") for e in [*self.doc.extensions, *extra_extensions])
        self.prefixes = tuple(self.doc.path_prefixes)
        self._ct_exact = frozenset(c.lower() for c in self.doc.content_types if not c.endswith("/"))
        self._ct_prefix = tuple(c.lower() for c in self.doc.content_types if c.endswith("/"))
        self._ct_cache: dict[str, bool] = {}

    def path_is_static(self, path: str) -> bool:
        if path.startswith(self.prefixes):
            return True
        seg = path[path.rfind("/") + 1:]
        dot = seg.rfind(".")
        return dot >= 0 and seg[dot + 1:].lower() in self.extensions

    def content_type_is_static(self, content_type: str | None) -> bool:
        if not content_type:
            return False
        hit = self._ct_cache.get(content_type)
        if hit is None:
            t = content_type.split(";", 1)[0].strip().lower()
            hit = t in self._ct_exact or t.startswith(self._ct_prefix)
            if len(self._ct_cache) < 4096:
                self._ct_cache[content_type] = hit
        return hit


# ================================================================================= bots


class BotEntry(_M):
    name: str
    pattern: str
    cases: list[str] = Field(default_factory=list)


class BotsFile(_M):
    version: int
    custom: list[BotEntry] = Field(default_factory=list)
    names: list[BotEntry] = Field(default_factory=list)
    browsers: list[BotEntry] = Field(default_factory=list)
    not_bots: list[str] = Field(default_factory=list)


_GENERIC_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*?(?:bot|spider|crawler)", re.IGNORECASE)


class BotDetector:
    """crawlerdetect + custom patterns + readable names (``rules/bots.yaml``).

    :meth:`detect` -> ``(is_bot, bot_name)``; results are cached per UA string (bounded).  crawlerdetect costs
    ~70-200 µs per uncached UA on this machine, so the cache matters.
    """

    def __init__(self, path: str | Path | None = None, extra_patterns: Iterable[str] = (),
                 cache_size: int = 50_000) -> None:
        from crawlerdetect import CrawlerDetect

        p = Path(path) if path is not None else builtin_rules_path("bots.yaml")
        try:
            self.doc = BotsFile.model_validate(_read_yaml(p))
        except ValidationError as exc:
            raise _errors(p, exc) from None
        try:
            self._custom = [(e.name, re.compile(e.pattern, re.IGNORECASE)) for e in self.doc.custom]
            self._names = [(e.name, re.compile(e.pattern, re.IGNORECASE)) for e in self.doc.names]
            self._browsers = [re.compile(e.pattern, re.IGNORECASE) for e in self.doc.browsers]
        except re.error as exc:
            raise RulesError(f"{p}: bad regular expression: {exc}") from None
        self._extra: list[re.Pattern[str]] = []
        for x in extra_patterns:
            try:
                self._extra.append(re.compile(x, re.IGNORECASE))
            except re.error as exc:
                raise RulesError(f"bots.extra_patterns: bad regular expression {x!r}: {exc}") from None
        self._cd = CrawlerDetect()
        self._cache: BoundedCache[str, tuple[bool, str | None]] = BoundedCache(cache_size)

    def detect(self, user_agent: str | None) -> tuple[bool, str | None]:
        if not user_agent:
            return False, None
        hit = self._cache.get(user_agent)
        if hit is None:
            hit = self._detect(user_agent)
            self._cache.put(user_agent, hit)
        return hit

    def _detect(self, ua: str) -> tuple[bool, str | None]:
        if not ua.strip():
            return False, None
        for name, rx in self._custom:
            if rx.search(ua):
                return True, name
        for rx in self._extra:
            m = rx.search(ua)
            if m:
                named = m.groupdict().get("name")  # a (?P<name>...) group names the bot; else the match,
                return True, ((named or m.group()).strip(" /;:,.-_()") or rx.pattern)[:64]  # without its "/"
        if any(rx.search(ua) for rx in self._browsers):
            return False, None
        if not self._cd.is_crawler(ua):
            return False, None
        for name, rx in self._names:
            if rx.search(ua):
                return True, name
        m = _GENERIC_NAME.search(ua)
        if m:
            return True, m.group()[:64]
        matched = self._cd.get_matches() or "bot"
        return True, (re.sub(r"[^\w.-]+", "", matched) or "bot")[:64]


# ================================================================================= crawlers by address


class NetworkCases(_M):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    in_: list[str] = Field(default_factory=list, alias="in")
    out: list[str] = Field(default_factory=list)


class CrawlerEntry(_M):
    name: str
    source: str = ""
    networks: list[str] = Field(default_factory=list)
    #: files in the operators' published format (``{"prefixes": [{"ipv4Prefix": ...}, {"ipv6Prefix": ...}]}``, as
    #: googlebot.json and bingbot.json), whose prefixes are added to ``networks``; relative to the rules file
    prefixes_json: list[str] = Field(default_factory=list)
    #: reverse-DNS name suffixes of this crawler only (not of its operator's other fetchers): the DoS detector's
    #: ``crawlers.verify: dns`` also asks a UA-less client in these networks for a forward-confirmed name ending so
    dns_suffixes: list[str] = Field(default_factory=list)
    cases: NetworkCases = Field(default_factory=NetworkCases)


class CrawlerNetworksFile(_M):
    version: int
    crawlers: list[CrawlerEntry] = Field(default_factory=list)


def _published_prefixes(path: Path) -> list[str]:
    """The prefixes of a crawler list in the operators' published JSON format (googlebot.json, bingbot.json)."""
    import json

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        out = []
        for x in doc["prefixes"]:
            v = x.get("ipv4Prefix") or x.get("ipv6Prefix")
            if not isinstance(v, str):
                raise KeyError(f"entry {x!r} has no ipv4Prefix / ipv6Prefix")
            out.append(v)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RulesError(f"{path}: not a published crawler list ({{\"prefixes\": [{{\"ipv4Prefix\": ...}}]}}): "
                         f"{type(exc).__name__}: {exc}") from None
    if not out:
        raise RulesError(f"{path}: no prefixes (an empty list would silently verify nothing)")
    return out


class CrawlerNetworks:
    """Crawlers known by their address (``rules/crawler_networks.yaml``, or ``Settings.bots.networks_file``).

    :meth:`name_of` -> the crawler's ``bot_name`` for an address inside one of its published networks, else
    ``None``.  Used only for requests logged without a user agent (see :meth:`Enricher.derive`); an address is
    never a reason to call a request *with* a user agent a bot.  IPv4-mapped IPv6 addresses are looked up as IPv4.
    Pure after construction; answers are cached per address string (bounded).  Overlapping networks of
    *different* crawlers are a :class:`RulesError` at construction (an address has one answer).
    """

    def __init__(self, path: str | Path | None = None, cache_size: int = 50_000) -> None:
        import ipaddress

        p = Path(path) if path is not None else builtin_rules_path("crawler_networks.yaml")
        try:
            self.doc = CrawlerNetworksFile.model_validate(_read_yaml(p))
        except ValidationError as exc:
            raise _errors(p, exc) from None
        v4: list[tuple[int, int, str]] = []
        self._v6: list[tuple[ipaddress.IPv6Network, str]] = []
        for e in self.doc.crawlers:
            for cidr in [*e.networks, *(x for f in e.prefixes_json for x in _published_prefixes(p.parent / f))]:
                try:
                    net = ipaddress.ip_network(cidr, strict=True)
                except ValueError as exc:
                    raise RulesError(f"{p}: crawler {e.name!r}: bad network {cidr!r}: {exc}") from None
                if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
                    raise RulesError(f"{p}: crawler {e.name!r}: write {cidr!r} as an IPv4 network (IPv4-mapped "
                                     "addresses are looked up as IPv4)")
                if isinstance(net, ipaddress.IPv4Network):
                    v4.append((int(net.network_address), int(net.broadcast_address), e.name))
                else:
                    for other, name in self._v6:
                        if name != e.name and net.overlaps(other):
                            raise RulesError(f"{p}: {cidr} ({e.name}) overlaps {other} ({name})")
                    self._v6.append((net, e.name))
        v4.sort()
        merged: list[tuple[int, int, str]] = []  # disjoint, sorted: nested networks of one crawler are merged
        for a0, a1, name in v4:
            if merged and a0 <= merged[-1][1]:
                m0, m1, mname = merged[-1]
                if mname != name:
                    raise RulesError(f"{p}: a network of {name} from {ipaddress.IPv4Address(a0)} overlaps a network "
                                     f"of {mname} ({ipaddress.IPv4Address(m0)} - {ipaddress.IPv4Address(m1)})")
                merged[-1] = (m0, max(m1, a1), name)
            else:
                merged.append((a0, a1, name))
        #: crawler names in file order; :meth:`codes_of_ipv4` answers indexes into it
        self.names: list[str] = list(dict.fromkeys(e.name for e in self.doc.crawlers))
        self._starts = np.array([a for a, _, _ in merged], dtype=np.int64)
        self._ends = np.array([b for _, b, _ in merged], dtype=np.int64)
        self._codes = np.array([self.names.index(n) for _, _, n in merged], dtype=np.int64)
        self._cache: BoundedCache[str, tuple[str | None]] = BoundedCache(cache_size)
        self._suffixes = {e.name: tuple(x.lower() for x in e.dns_suffixes) for e in self.doc.crawlers}

    def dns_suffixes(self, name: str) -> tuple[str, ...]:
        """The reverse-DNS suffixes the rules give crawler ``name`` (empty: none given)."""
        return self._suffixes.get(name, ())

    def name_of(self, address: str | None) -> str | None:
        """``bot_name`` of the crawler whose published network holds ``address`` (a plain IP text), else ``None``;
        ``None`` for anything that is not an IP address."""
        if not address:
            return None
        hit = self._cache.young.get(address) or self._cache.get(address)
        if hit is None:
            hit = (self._lookup(address),)  # a 1-tuple: truthy also for "no crawler"
            self._cache.put(address, hit)
        return hit[0]

    def codes_of_ipv4(self, values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """:meth:`name_of` for IPv4 addresses given as integers, vectorised (one binary search for all): the index
        of the crawler's name in :attr:`names`, ``-1`` for no crawler."""
        if len(self._starts) == 0 or len(values) == 0:
            return np.full(len(values), -1, dtype=np.int64)
        i = np.searchsorted(self._starts, values, side="right") - 1
        hit = (i >= 0) & (values <= self._ends[np.maximum(i, 0)])
        return np.where(hit, self._codes[np.maximum(i, 0)], -1)

    def _lookup(self, address: str) -> str | None:
        import ipaddress

        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address):
            if ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            else:
                return next((name for net, name in self._v6 if ip in net), None)
        code = int(self.codes_of_ipv4(np.array([int(ip)], dtype=np.int64))[0])
        return self.names[code] if code >= 0 else None


# ================================================================================= the enricher


class Enricher:
    """Derives ``(topic_id, page_kind, is_static, is_bot, bot_name)`` for one request (see module docstring)."""

    def __init__(self, settings: Settings, *, cache_size: int = 100_000) -> None:
        rules = load_topic_rules(settings.topics.rules_file, user=True) if settings.topics.rules_file else []
        builtin = load_topic_rules(builtin_rules_path("topics.yaml"))
        ids = {r.id for r in rules}
        rules += [r for r in builtin if r.id not in ids]  # a user rule with a built-in id replaces it
        post_map = load_post_map(settings.topics.post_map_csv) if settings.topics.post_map_csv else {}
        self.topics = TopicRules(rules, post_map)
        self.static = StaticClassifier(extra_extensions=settings.bots.static_extensions)
        self.bots = BotDetector(extra_patterns=settings.bots.extra_patterns)
        self.networks: CrawlerNetworks | None = (CrawlerNetworks(settings.bots.networks_file)
                                                 if settings.bots.by_address else None)
        self._settings = settings
        self._site_rules: dict[str, tuple[Rule, ...]] = {}
        self._by_path: BoundedCache[tuple[str, str, str], tuple[int | None, str, bool]] = BoundedCache(cache_size)
        self._by_query: BoundedCache[tuple[str, str, str, str], tuple[int | None, str, bool]] = BoundedCache(
            cache_size)
        self._by_referer: BoundedCache[tuple[str, str], int] = BoundedCache(cache_size)
        self.empty_user_agents = 0

    def rules_for(self, site: str) -> tuple[Rule, ...]:
        rules = self._site_rules.get(site)
        if rules is None:
            rules = self.topics.select(site, self._settings.site(site).engines)
            self._site_rules[site] = rules
        return rules

    def check_user_cases(self) -> tuple[int, list[str]]:
        """Run the fixture ``cases`` of the user rules file (``topics.rules_file``) as the built-in ones are run
        by the tests: each must be answered by its own rule, with its topic and page kind, on every configured
        site the rule applies to (user rules come before the built-in ones; a static path is answered before
        any rule).  Returns the number of cases run and one message per case that failed."""
        failed: list[str] = []
        n = 0
        sites = [x.name for x in self._settings.sites]
        for rule in (r for r in self.topics.rules if r.user):
            for case in rule.model.cases:
                rules = TopicRules(self.topics.rules, {**self.topics.post_map, **case.post_map})
                path, query = case.split()
                for site in rule.sites or sites:
                    n += 1
                    mine = rules.select(site, self._settings.site(site).engines)
                    rid: str | None
                    if self.static.path_is_static(path):
                        topic, kind, rid = None, "static", "static.path"
                    else:
                        topic, kind, got, _ = rules.classify(mine, case.method, path, query)
                        if topic == REFERER_TOPIC:
                            topic = rules.topic_from_referer(mine, case.referer)
                        rid = got.id if got is not None else None
                    if (topic, kind, rid) != (case.topic, case.kind, rule.id):
                        failed.append(f"rule {rule.id!r}, case {case.method} {case.url} (site {site}): expected "
                                      f"topic {case.topic} kind {case.kind} from this rule, got topic {topic} kind "
                                      f"{kind} from " + (f"rule {rid!r}" if rid else "no rule"))
        return n, failed

    def topic_from_referer(self, site: str, referer: str | None) -> int | None:
        """Resolves :data:`REFERER_TOPIC`: the topic of the referring page (cached per distinct referer)."""
        key = (site, referer or "")
        hit = self._by_referer.get(key)
        if hit is not None:
            return hit or None
        topic = self.topics.topic_from_referer(self.rules_for(site), referer)
        self._by_referer.put(key, topic or 0)
        return topic

    def classify(self, site: str, method: str, path: str, query: str) -> tuple[int | None, str, bool, str | None]:
        """Uncached topic/kind/static-by-path answer plus the id of the rule that decided (for explain/tests)."""
        if self.static.path_is_static(path):
            return None, "static", True, "static.path"
        topic, kind, rule, _ = self.topics.classify(self.rules_for(site), method, path, query)
        return topic, kind, False, rule.id if rule is not None else None

    def _page(self, site: str, method: str, path: str, query: str) -> tuple[int | None, str, bool]:
        pkey = (site, method, path)
        hit = self._by_path.get(pkey)
        if hit is not None:
            return hit
        qkey = (site, method, path, query)
        hit = self._by_query.get(qkey)
        if hit is not None:
            return hit
        if self.static.path_is_static(path):
            res: tuple[int | None, str, bool] = (None, "static", True)
            self._by_path.put(pkey, res)
            return res
        topic, kind, _, query_used = self.topics.classify(self.rules_for(site), method, path, query)
        res = (topic, kind, False)
        if query_used:
            self._by_query.put(qkey, res)
        else:
            self._by_path.put(pkey, res)
        return res

    def derive(self, site: str, method: str, path: str, query: str, content_type: str | None,
               user_agent: str | None, client_ip: str | None = None) -> tuple[int | None, str, bool, bool, str | None]:
        """-> ``(topic_id, page_kind, is_static, is_bot, bot_name)``.  ``client_ip`` (the real address, before any
        privacy transform) decides ``is_bot`` only when there is no user agent (:meth:`address_bot`)."""
        topic, kind, is_static = (self._by_path.young.get((site, method, path))
                                  or self._page(site, method, path, query))
        if content_type and not is_static and self.static.content_type_is_static(content_type):
            is_static = True
            if kind == "other":
                kind = "static"
        if not user_agent:
            self.empty_user_agents += 1
            name = self.address_bot(client_ip)
            return topic, kind, is_static, name is not None, name
        is_bot, bot_name = self.bots._cache.young.get(user_agent) or self.bots.detect(user_agent)
        return topic, kind, is_static, is_bot, bot_name

    def address_bot(self, client_ip: str | None) -> str | None:
        """``bot_name`` of a request *without* a user agent from ``client_ip``: the crawler whose published network
        holds the address (:class:`CrawlerNetworks`), else ``None`` (also with ``bots.by_address: false``)."""
        return self.networks.name_of(client_ip) if self.networks is not None and client_ip else None

# ================================================================================= topic titles and groups

TITLES_SCHEMA = pa.schema([
    ("site", pa.string()), ("topic_id", pa.uint64()), ("title", pa.string()), ("forum", pa.string()),
    ("updated_at", pa.timestamp("ms", tz="UTC")),
])
GROUPS_SCHEMA = pa.schema([
    ("site", pa.string()), ("group_name", pa.string()), ("topic_id", pa.uint64()),
    ("updated_at", pa.timestamp("ms", tz="UTC")),
])


def _stamp(updated_at: datetime | None, fallback: datetime) -> datetime:
    ts = updated_at or fallback
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)


def load_topic_titles(csv_path: str | Path, updated_at: datetime | None = None) -> pa.Table:
    """Read ``site,topic_id,title[,forum]`` (a header line starting with ``site`` is skipped; UTF-8, BOM ok)
    into a table for ``topic_titles``.  ``updated_at`` defaults to the file's modification time, so reloading an
    unchanged file replaces nothing new in the ReplacingMergeTree.  Raises RulesError (a ValueError) naming the
    file and the bad line."""
    p = Path(csv_path)
    try:
        return _read_topic_titles(p, updated_at)
    except OSError as exc:
        raise DataFileError(f"topic titles: cannot read {p}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{p}: not UTF-8 ({exc.reason} at byte {exc.start})") from None


@dataclass(frozen=True)
class GroupSync:
    """What :func:`sync_topic_groups` did: memberships written, memberships the store had that the configuration
    no longer has (deleted), and configured groups that got no member (``site/name``: no ``topic_ids`` and a
    ``title_pattern`` matching no title, or no titles loaded)."""

    memberships: int
    removed: int
    empty: tuple[str, ...]
    kept_stale: int = 0  # stale memberships left in place (a cluster whose Distributed engine could not be read)

    def warnings(self) -> list[str]:
        out = []
        if self.kept_stale:
            out.append(f"topic groups: {self.kept_stale:,} membership(s) no longer in topics.groups are still in "
                       "topic_groups (its Distributed engine names no cluster this reads): delete them on the "
                       "local tables by hand")
        if self.removed:
            out.append(f"topic groups: {self.removed:,} membership(s) no longer in topics.groups were removed "
                       "from topic_groups")
        for g in self.empty:
            out.append(empty_group_warning(g, "in the store (topics.titles_csv)"))
        return out


def sync_topic_groups(store: Any, settings: Settings) -> GroupSync:
    """Make ``topic_groups`` hold exactly the configured groups (:func:`topic_group_rows`, patterns matched against
    every title in the store's ``topic_titles``, not only a file just loaded), so a group or a topic removed from
    ``topics.groups`` is gone for the detectors, the reports and the dashboards (rows were only ever added before: a
    removed group kept being reported).  The configuration is the only writer of that table.

    Writes only what differs: when the table already holds the configured memberships nothing is written (a
    restart runs no mutation); stale memberships are deleted (``ALTER TABLE … DELETE`` of the rows older than this
    load, ``ON CLUSTER`` on the local tables of a cluster; the writer role has ``ALTER DELETE`` on this table only,
    ``deploy/clickhouse/ingest_user.sql``).  With **no group configured** the table is left as it is (a command
    run without the configuration file must not wipe the groups).  Idempotent; two loaders with different
    configurations running at once may leave the union of both."""
    if not settings.topics.groups:
        return GroupSync(0, 0, ())
    titles = stored_titles(store)
    stamp = datetime.now(tz=UTC)
    rows = topic_group_rows(settings, titles, updated_at=stamp)
    before = {(str(a), str(b), int(c)) for a, b, c in store.query_rows(
        "SELECT site, group_name, topic_id FROM topic_groups FINAL")}
    configured = {(r["site"], r["group_name"], r["topic_id"]) for r in rows.to_pylist()}
    empty = empty_groups(settings, rows)
    if before == configured:
        return GroupSync(rows.num_rows, 0, empty)
    stale = before - configured
    if rows.num_rows:  # all of them, with the new stamp: the delete below removes what is older
        store.insert("topic_groups", rows)
    if stale:
        bound = f"toDateTime64('{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}', 3, 'UTC')"
        target = "topic_groups"
        engine = store.query_rows("SELECT engine_full FROM system.tables WHERE database = currentDatabase() "
                                  "AND name = 'topic_groups'")
        full = str(engine[0][0]) if engine else ""
        if full.startswith("Distributed"):
            dist = re.match(r"Distributed\(\s*'?([^,']+)'?\s*,\s*'?([^,']+)'?\s*,\s*'?([^,']+)'?", full)
            if dist is None:  # left in place, said so: a Distributed table takes no mutation
                return GroupSync(rows.num_rows, 0, empty, len(stale))
            db, local, cluster = (dist.group(i).strip() for i in (2, 3, 1))
            target = f"`{db}`.`{local}` ON CLUSTER `{cluster}`"
        # the configured memberships were just written again with the new stamp, so "older than it" is the stale
        store.command(f"ALTER TABLE {target} DELETE WHERE updated_at < {bound} SETTINGS mutations_sync = 2")
    return GroupSync(rows.num_rows, len(stale), empty)


def latest_titles(store: Any, site: str | None = None) -> list[tuple[str, int, str]]:
    """``(site, topic_id, title)`` of every topic in the store's ``topic_titles`` (the latest title of each, ``""``
    for none), of one site or of all; ordered by site and topic.  The one place that reads what a title pattern
    is matched against (the group sync here, the traffic detector's groups)."""
    where = "" if site is None else f" WHERE site = {sql_string(site)}"
    got = store.query_rows(f"SELECT site, topic_id, argMax(title, updated_at) FROM topic_titles{where} "
                           "GROUP BY site, topic_id ORDER BY site, topic_id")
    return [(str(a), int(b), str(c or "")) for a, b, c in got]


def empty_group_warning(group: str, titles_from: str) -> str:
    """The warning for a configured group (``site/name``) with no member; ``titles_from`` says which titles its
    pattern was matched against."""
    return (f"topic group {group} has no topics: no topic_ids, and its title_pattern matches no title {titles_from}: "
            "its surges cannot be detected or reported")


def stored_titles(store: Any) -> pa.Table:
    """Every topic title in the store's ``topic_titles`` (the latest per site and topic, :func:`latest_titles`), as
    a table for :func:`topic_group_rows`."""
    got = latest_titles(store)
    return pa.table({"site": [r[0] for r in got], "topic_id": [r[1] for r in got], "title": [r[2] for r in got]})


def empty_groups(settings: Settings, rows: pa.Table) -> tuple[str, ...]:
    """Configured groups (``site/name``) without a row in ``rows`` (:func:`topic_group_rows`): no ``topic_ids``,
    and a ``title_pattern`` that matches no title (or no titles loaded)."""
    have = set(zip(rows.column("site").to_pylist(), rows.column("group_name").to_pylist(), strict=True))
    return tuple(f"{g.site}/{g.name}" for g in settings.topics.groups if (g.site, g.name) not in have)


@dataclass(frozen=True)
class TitlesLoad:
    """What :func:`load_configured_titles` loaded: titles (None when ``topics.titles_csv`` is not set) and the
    group synchronisation."""

    titles: int | None
    groups: GroupSync


def load_configured_titles(store: Any, settings: Settings) -> TitlesLoad:
    """Load ``topics.titles_csv`` (when set) into ``topic_titles`` and make ``topic_groups`` the configured topic
    groups (:func:`sync_topic_groups`; without titles, groups by their ``topic_ids`` only).  Idempotent: title rows
    carry the file's modification time, so reloading an unchanged file adds nothing the ReplacingMergeTree keeps.
    Called by ``db migrate``, ``db load-titles`` without a CSV, the owner process at start and the demo."""
    titles = load_topic_titles(settings.topics.titles_csv) if settings.topics.titles_csv else None
    if titles is not None:
        store.insert("topic_titles", titles)
    return TitlesLoad(None if titles is None else int(titles.num_rows), sync_topic_groups(store, settings))


def _read_topic_titles(p: Path, updated_at: datetime | None) -> pa.Table:
    stamp = _stamp(updated_at, datetime.fromtimestamp(p.stat().st_mtime, tz=UTC))
    sites: list[str] = []
    ids: list[int] = []
    titles: list[str] = []
    forums: list[str] = []
    with p.open(newline="", encoding="utf-8-sig") as fh:
        for no, row in enumerate(csv.reader(fh), 1):
            if not row or not any(c.strip() for c in row):
                continue
            if no == 1 and row[0].strip().lower() == "site":
                continue
            if len(row) < 3:
                raise DataFileError(f"{p}:{no}: expected site,topic_id,title[,forum], got {len(row)} fields")
            try:
                tid = int(row[1])
            except ValueError:
                raise DataFileError(f"{p}:{no}: topic_id {row[1]!r} is not an integer") from None
            if not 0 < tid <= MAX_TOPIC_ID:
                raise DataFileError(f"{p}:{no}: topic_id {tid} out of range")
            sites.append(row[0].strip())
            ids.append(tid)
            titles.append(row[2])
            forums.append(row[3] if len(row) > 3 else "")
    return pa.table({"site": sites, "topic_id": ids, "title": titles, "forum": forums,
                     "updated_at": [stamp] * len(ids)}, schema=TITLES_SCHEMA)


def topic_group_rows(settings: Settings, titles: pa.Table | None = None,
                     updated_at: datetime | None = None) -> pa.Table:
    """Rows for ``topic_groups`` from ``settings.topics.groups``: listed ``topic_ids`` plus every title of the
    group's site matching ``title_pattern`` (re.search).  Deduplicated, sorted by (site, group, topic).
    Raises ValueError for a bad pattern."""
    stamp = _stamp(updated_at, datetime.now(tz=UTC))
    rows: set[tuple[str, str, int]] = set()
    by_site: dict[str, list[tuple[int, str]]] = {}
    if titles is not None and titles.num_rows:
        for s, t, title in zip(titles.column("site").to_pylist(), titles.column("topic_id").to_pylist(),
                               titles.column("title").to_pylist(), strict=True):
            by_site.setdefault(s, []).append((t, title))
    for g in settings.topics.groups:
        for t in g.topic_ids:
            rows.add((g.site, g.name, t))
        if g.title_pattern:
            try:
                rx = re.compile(g.title_pattern)
            except re.error as exc:
                raise ValueError(f"topics.groups[{g.name}].title_pattern: {exc}") from None
            for t, title in by_site.get(g.site, []):
                if rx.search(title):
                    rows.add((g.site, g.name, t))
    ordered = sorted(rows)
    return pa.table({"site": [r[0] for r in ordered], "group_name": [r[1] for r in ordered],
                     "topic_id": [r[2] for r in ordered], "updated_at": [stamp] * len(ordered)},
                    schema=GROUPS_SCHEMA)


# ================================================================================= benchmark

_COMBINED = re.compile(r'^\S+ \S+ \S+ \[[^\]]*\] "(\S+) (\S+)[^"]*" \d+ \S+ "[^"]*" "([^"]*)"')


def synthetic_requests(n: int, seed: int = 1, topics: int = 5000,
                       user_agents: int = 3000) -> list[tuple[str, str, str, str | None, str | None]]:
    """A XenForo-style request mix (method, path, query, content_type, user_agent) for benchmarks: Zipf topic
    popularity, pages, replies, forums, search, login, statics after page views, API calls, session params,
    a browser-UA pool plus crawlers."""
    import random

    rnd = random.Random(seed)
    weights = [1 / (i + 1) for i in range(topics)]
    browsers = [f"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) "
                f"Chrome/{100 + i % 40}.0.{i}.{i % 97} Safari/537.36" for i in range(user_agents)]
    bots = ["Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
            "Mozilla/5.0 (compatible; bingbot/2.0; +http://www.bing.com/bingbot.htm)",
            "Mozilla/5.0 (compatible; AhrefsBot/7.0; +http://ahrefs.com/robot/)"]
    statics = [("/styles/default/xenforo/logo.png", "image/png"), ("/js/xf/core-compiled.js", "application/javascript"),
               ("/css.php", "text/css"), ("/favicon.ico", "image/x-icon")]
    out: list[tuple[str, str, str, str | None, str | None]] = []
    tids = rnd.choices(range(1, topics + 1), weights=weights, k=n)
    for i in range(n):
        ua = rnd.choice(bots) if rnd.random() < 0.15 else rnd.choice(browsers)
        r = rnd.random()
        tid = tids[i]
        q = f"s={rnd.getrandbits(64):016x}" if rnd.random() < 0.05 else ""
        if r < 0.45:
            page = "" if rnd.random() < 0.7 else f"page-{rnd.randint(2, 20)}"
            out.append(("GET", f"/threads/topic-title-{tid}.{tid}/{page}", q, "text/html; charset=utf-8", ua))
        elif r < 0.47:
            out.append(("POST", f"/threads/topic-title-{tid}.{tid}/add-reply",
                        f"_xfToken={rnd.getrandbits(32)}", "application/json", ua))
        elif r < 0.52:
            out.append(("GET", f"/forums/forum-{tid % 30}.{tid % 30}/", q, "text/html", ua))
        elif r < 0.54:
            out.append(("GET", "/search/", f"q=word{rnd.randint(1, 5000)}", "text/html", ua))
        elif r < 0.55:
            out.append(("POST", "/login/login", "", "text/html", ua))
        elif r < 0.60:
            out.append(("GET", f"/api/threads/{tid}/", "", "application/json", ua))
        elif r < 0.63:
            out.append(("GET", "/", q, "text/html", ua))
        elif r < 0.78:
            out.append(("GET", f"/data/avatars/m/{tid % 100}/{tid}.jpg", "", "image/jpeg", ua))
        else:
            p, ct = rnd.choice(statics)
            out.append(("GET", p, f"v={rnd.randint(1, 3)}", ct, ua))
    return out


def log_requests(path: str | Path) -> list[tuple[str, str, str, str | None, str | None]]:
    """(method, path, query, None, user_agent) of each Apache combined line of ``path`` (benchmark input)."""
    out: list[tuple[str, str, str, str | None, str | None]] = []
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            m = _COMBINED.match(line)
            if m:
                p, _, q = m.group(2).partition("?")
                out.append((m.group(1), p, q, None, m.group(3) if m.group(3) != "-" else None))
    return out


def benchmark_derive(requests: Sequence[tuple[str, str, str, str | None, str | None]],
                     settings: Settings | None = None) -> dict[str, float]:
    """derive() throughput (requests/s) over ``requests``: cold (fresh Enricher, first pass: every cache miss
    is paid) and warm (second pass over the same requests)."""
    import time

    e = Enricher(settings or Settings())
    result: dict[str, float] = {"requests": float(len(requests))}
    for label in ("cold", "warm"):
        t0 = time.perf_counter()
        for m, p, q, ct, ua in requests:
            e.derive("forum", m, p, q, ct, ua)
        result[f"{label}_per_s"] = len(requests) / (time.perf_counter() - t0)
    result["distinct_user_agents"] = float(len({r[4] for r in requests}))
    result["distinct_page_keys"] = float(len({r[:3] for r in requests}))
    return result


if __name__ == "__main__":  # python -m forumpulse.pipeline.enrich [N | access.log ...]
    import sys

    args = sys.argv[1:] or ["200000"]
    for arg in args:
        reqs = synthetic_requests(int(arg)) if arg.isdigit() else log_requests(arg)
        res = benchmark_derive(reqs)
        print(f"{arg}: " + ", ".join(f"{k}={v:,.0f}" for k, v in res.items()))
