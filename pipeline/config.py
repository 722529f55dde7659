"""One configuration file for the whole pipeline (YAML), validated with pydantic-settings.

Resolution order (later wins): built-in defaults < ``forumpulse.yaml`` (``--config`` or ``$FORUMPULSE_CONFIG``)
< environment variables ``FORUMPULSE_<SECTION>__<KEY>`` (e.g. ``FORUMPULSE_STORE__URL=clickhouse://...``,
``FORUMPULSE_PRIVACY__CLIENT_IP=truncate``).  Every key is documented in ``docs/configuration.md``.

Sections owned by other modules (``detectors``, ``actions``) are kept as plain mappings here and validated by
their owners' models through :func:`register_section_validator`, so ``forumpulse config check`` reports every
error with its key and reason.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_STRIP_PARAMS = [
    "sid", "s", "PHPSESSID", "phpsessid", "session", "sessionid", "session_id", "token", "access_token",
    "auth", "authtoken", "api_key", "apikey", "key", "password", "passwd", "pwd", "csrf", "_xfToken", "hash",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RollupAuditConfig(_Strict):
    """Replayed batches' hours checked against requests, and rebuilt, once settled (embedded store; operations.md)."""

    enabled: bool = Field(True, description="the loader owning a chdb: store (forumpulse run --consume, or the "
                          "standalone consumer) checks the hours of every batch it replayed against requests once "
                          "they settled, as `db check-rollups` would (not on a ClickHouse server: run that command)")
    repair: bool = Field(True, description="rebuild from requests the hours that still differ (as `db "
                         "check-rollups --repair`); false: log and count them only")
    settle_s: float = Field(3600.0, ge=0, description="an advised hour is audited this long after it ended (and "
                            "once no partition is behind it), when its late lines are in")
    interval_s: float = Field(60.0, gt=0, description="seconds between the owner's audit passes")


class StoreConfig(_Strict):
    """Where rows are stored."""

    url: str = Field("chdb:./data/chdb", description="chdb:PATH (embedded, default) or clickhouse://user:pass@host:8123/db")
    rollup_audit: RollupAuditConfig = Field(default_factory=lambda: RollupAuditConfig())

    _url = field_validator("url")(lambda cls, v: check_store_url(v))


def check_store_url(url: str) -> str:
    """``url`` if it names a store forumpulse can open (``chdb:PATH``, ``clickhouse[s]://...``), else ValueError."""
    if url.startswith("chdb:"):
        if not url[len("chdb:"):].partition("?database=")[0].strip():
            raise ValueError(f"store URL {url!r} has no folder: use chdb:PATH, e.g. chdb:./data/chdb")
        return url
    if url.startswith(("clickhouse://", "clickhouses://")):
        return url
    raise ValueError(f"unknown store URL {mask_url(url)!r}: use chdb:PATH or clickhouse://user:pass@host:8123/db")


class SiteConfig(_Strict):
    name: str = Field("forum", description="site name stored in every row")
    timezone: str = Field("UTC", description="IANA time zone for daily/weekly seasonality and holidays, the clock the "
                          "reports (event, daily) show times in (its UTC offset written next to each), and the "
                          "zone of log times written without an offset (an Apache %{...}t without %z)")
    country: str | None = Field(None, description="ISO country code for the `holidays` calendar, e.g. MY")
    subdivision: str | None = Field(None, description="state/province code for the holidays calendar")
    holiday_periods: list[HolidayPeriod] = Field(default_factory=list, description="extra holiday periods (festival weeks)")
    engines: list[str] = Field(
        default_factory=list,
        description="forum engines whose URL rules apply (vbulletin, phpbb, xenforo, discourse, smf, mybb, invision, flarum); empty = all",
    )
    hosts: list[str] = Field(default_factory=list, description="host names of this site: referrers from them are "
                             "internal (left out of event reports' top referrers); lines are assigned to sites by "
                             "sources[].site and ingest --site, not by host")

    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses (CIDRs) of this site's own reverse proxies and load balancers (squid in front of "
                    "Apache, a CDN's egress ranges): a line whose logged client is one of them takes its client from "
                    "the X-Forwarded-For the format logs (%{X-Forwarded-For}i, $http_x_forwarded_for), walked from "
                    "the right like mod_remoteip; and the DoS detector never bans them. Empty: the header is not "
                    "believed (anyone can send one)")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: list[str]) -> list[str]:
        import ipaddress

        out = []
        for c in v:
            try:
                net = ipaddress.ip_network(c.strip(), strict=False)
            except ValueError:
                raise ValueError(f"not an address or CIDR: {c!r} (e.g. 10.0.0.5 or 10.0.0.0/24)") from None
            if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None \
                    and net.prefixlen >= 96:  # ::ffff:10.0.0.5 is how a dual-stack socket logs 10.0.0.5
                net = ipaddress.ip_network(f"{net.network_address.ipv4_mapped}/{net.prefixlen - 96}")
            if net.prefixlen < (8 if net.version == 4 else 32):
                raise ValueError(f"{c!r} is too wide for a proxy list (every address in it could name any client "
                                 "and would never be banned): list your proxies' own addresses or ranges")
            out.append(str(net))
        return out

    @field_validator("engines")
    @classmethod
    def _engines(cls, v: list[str]) -> list[str]:
        """Built-in engine names, any case ("phpBB"); an unknown one is refused -- it used to select no rule at
        all, silently turning topic attribution off for the site."""
        import difflib

        from forumpulse.pipeline.enrich import BUILTIN_ENGINES  # here: enrich imports this module

        out = []
        for e in v:
            k = e.strip().lower()
            if k not in BUILTIN_ENGINES:
                near = difflib.get_close_matches(k, BUILTIN_ENGINES, n=1)
                raise ValueError(f"unknown engine {e!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
                                 + f": the built-in engines are {', '.join(BUILTIN_ENGINES)}; the rules of a user "
                                 "rules file (topics.rules_file) apply to every site whatever its engines")
            out.append(k)
        return out

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (use an IANA name such as Asia/Kuala_Lumpur)") from None
        return v


LONG_HOLIDAY_DAYS = 92  # a holiday period longer than a quarter of a year is likely a typo (config check warns)


class HolidayPeriod(_Strict):
    name: str = Field(description="what the period is, e.g. Chinese New Year week")
    start: date = Field(description="first day, YYYY-MM-DD (site time zone; quoted or not)")
    end: date = Field(description="last day, YYYY-MM-DD, inclusive")

    @field_validator("start", "end", mode="before")
    @classmethod
    def _iso_day(cls, v: Any) -> Any:
        # a date only, written YYYY-MM-DD (a YAML date or a string): not a timestamp, not "23/05/2026"
        if isinstance(v, datetime):
            raise ValueError("a day YYYY-MM-DD, not a time")
        if isinstance(v, str):
            try:
                return date.fromisoformat(v.strip())
            except ValueError:
                raise ValueError(f"{v!r} is not a day YYYY-MM-DD") from None
        return v

    @model_validator(mode="after")
    def _ordered(self) -> HolidayPeriod:
        if self.end < self.start:
            raise ValueError(f"end {self.end} is before start {self.start}")
        return self


SiteConfig.model_rebuild()


class SourceConfig(_Strict):
    name: str = Field(description="source name (a label; the live path's sources are syslog-ng's, defined in "
                      "syslog-ng/forumpulse.conf)")
    site: str = Field("forum", description="site this source belongs to")
    format: str = Field(
        "auto",
        description="preset (combined, common, vhost_combined, combined_d, nginx_combined, nginx_main, squid, squid_combined), "
        "'apache:<LogFormat>', 'nginx:<log_format>', or 'auto' (per-line detection among presets)",
    )
    paths: list[str] = Field(default_factory=list, description="files or globs: `forumpulse ingest` gives a file that "
                             "matches this source's site, format and origin_host (syslog-ng follows its own list)")
    origin_host: str | None = Field(None, description="host name to record when the transport does not carry one")

    @field_validator("format")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != "auto":
            from forumpulse.pipeline.formats import get_parser

            get_parser(v)  # ValueError "unknown format spec ..." (with the presets) -> `sources.N.format: ...`
        return v


class PrivacyConfig(_Strict):
    """What is removed or masked before storage."""

    strip_params: list[str] = Field(default_factory=lambda: list(DEFAULT_STRIP_PARAMS),
                                    description="query parameters removed from url, query and referer before storage")
    client_ip: Literal["keep", "truncate", "pseudonymize"] = Field(
        "keep", description="how client addresses are stored (detectors always see the real address in the stream)")
    truncate_ipv4_prefix: int = Field(24, ge=0, le=32, description="with client_ip=truncate: IPv4 bits kept (24 = a.b.c.0)")
    truncate_ipv6_prefix: int = Field(48, ge=0, le=128, description="with client_ip=truncate: IPv6 bits kept")
    pseudonym_key: SecretStr | None = Field(None, description="secret key for keyed pseudonymisation (HMAC-SHA256)")

    @model_validator(mode="after")
    def _key_for_pseudonyms(self) -> PrivacyConfig:
        # refused here, so `config check` and every command say so before any work (the Privacy step refuses too)
        if self.client_ip == "pseudonymize" and (self.pseudonym_key is None
                                                 or not self.pseudonym_key.get_secret_value()):
            raise ValueError("client_ip is 'pseudonymize' but pseudonym_key is not set "
                             "(set FORUMPULSE_PRIVACY__PSEUDONYM_KEY to a long random secret)")
        return self


class RetentionConfig(_Strict):
    """How long rows are kept (ClickHouse TTL, set when a table is created; db migrate --apply-retention)."""

    raw_days: int = Field(90, ge=0, description="raw `requests` rows, by log time; 0 = keep forever")
    rollup_days: int = Field(730, ge=0, description="per-minute rollups; 0 = keep forever")
    quarantine_days: int = Field(30, ge=0, description="quarantined lines, by ingest time; 0 = keep forever")
    stats_days: int = Field(30, ge=0, description="pipeline_stats rows; 0 = keep forever")

    def migration_params(self) -> dict[str, int]:
        return {"raw_ttl_days": self.raw_days, "rollup_ttl_days": self.rollup_days,
                "quarantine_ttl_days": self.quarantine_days, "stats_ttl_days": self.stats_days}


class TopicGroup(_Strict):
    name: str = Field(description="group name shown in dashboards and reports, e.g. election")
    site: str = Field("forum", description="site the topics belong to")
    topic_ids: list[int] = Field(default_factory=list, description="member topic ids")
    title_pattern: str | None = Field(None, description="regular expression matched against topic titles")

    @field_validator("title_pattern")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"bad regular expression {v!r}: {exc}") from None
        return v


class TopicsConfig(_Strict):
    """Forum topic attribution: rules, groups, titles."""

    rules_file: str | None = Field(None, description="extra/override topic URL rules (YAML); built-in rules always load")
    groups: list[TopicGroup] = Field(default_factory=list, description="named topic groups (by ids or title pattern)")
    titles_csv: str | None = Field(None, description="CSV site,topic_id,title[,forum] loaded into topic_titles (and "
                                   "the groups resolved) by `db migrate`, `db load-titles` and `run` at start")
    post_map_csv: str | None = Field(None, description="CSV post_id,topic_id for phpBB viewtopic.php?p=N")


class BotsConfig(_Strict):
    """Bot and static-asset classification additions."""

    extra_patterns: list[str] = Field(default_factory=list, description="regular expressions for site-specific bots")
    static_extensions: list[str] = Field(default_factory=list, description="extra static file extensions")
    by_address: bool = Field(True, description="a request logged without a user agent from a crawler's published "
                             "network is that crawler (rules/crawler_networks.yaml)")
    networks_file: str | None = Field(None, description="crawler networks (YAML, schema of rules/crawler_networks.yaml) "
                                      "used instead of the built-in ones")


class KafkaConfig(_Strict):
    """The live path's Kafka topics."""

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers (host:port, comma-separated)")
    raw_topic: str = Field("weblogs.raw", description="raw access lines from syslog-ng (contract schemas/contracts)")
    dead_letter_topic: str = Field("weblogs.raw.dlq", description="lines that could not be parsed, with their reason")
    events_topic: str = Field("weblogs.events", description="traffic detections")
    decisions_topic: str = Field("weblogs.decisions", description="firewall decisions (bans, unbans)")
    group_id: str = Field("forumpulse-loader", description="consumer group of the loaders")
    consumer_queue_kbytes: int = Field(65_536, ge=1_024, description="librdkafka's fetch queue of each loader "
                                       "(queued.max.messages.kbytes); lower it when memory matters more than "
                                       "catch-up speed")


class IngestConfig(_Strict):
    """Batching and limits of the loaders."""

    batch_lines: int = Field(250_000, ge=1, description="lines per columnar insert (files: parsed in chunks of at "
                             "most 100,000; consumers: at most 50,000 per partition)")
    max_line_bytes: int = Field(262_144, ge=256, description="longer lines are quarantined as line_too_long "
                                "(default: the collector's fp_log_msg_size, so a line syslog-ng passes is parsed)")


_SECTION_VALIDATORS: dict[str, dict[str, Callable[[Any], Any]]] = {}
#: the parts of section ``detectors`` (owned by forumpulse.pipeline.live_detect, .detectors.dos_rules and
#: .detectors.traffic); any other name there is an error whichever modules are loaded
DETECTOR_SECTIONS = ("dos", "live", "traffic")


def register_section_validator(section: str, validator: Callable[[Any], Any]) -> None:
    """Modules owning a free-form section (``detectors``, ``actions``) register a validator (e.g. a pydantic
    ``model_validate``).  Several modules may share a section (``detectors.dos``, ``detectors.traffic``): every
    registered validator runs; each should check its own keys and allow the others'."""
    _SECTION_VALIDATORS.setdefault(section, {})[getattr(validator, "__qualname__", repr(validator))] = validator


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, except that a date-like scalar that is no real date (``2024-02-30``) stays a
    string: the field holding it then reports it by key (YAML's date constructor raised "day is out of range for
    month" with no key or line)."""


def _timestamp(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    try:
        return yaml.SafeLoader.construct_yaml_timestamp(loader, node)  # type: ignore[arg-type]
    except ValueError:
        return loader.construct_scalar(node)  # type: ignore[arg-type]


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


class _YamlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.data: dict[str, Any] = {}
        if path is not None:
            loaded = yaml.load(path.read_text(), Loader=_Loader) or {}  # _Loader is a SafeLoader
            if not isinstance(loaded, dict):
                raise ValueError(f"{path}: the top level must be a mapping")
            # unknown top-level sections already reported: dropped so the rest is still checked (load_settings)
            self.data = {k: v for k, v in loaded.items() if k not in _DROP_TOP}

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FORUMPULSE_", env_nested_delimiter="__", extra="forbid")

    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    sites: list[SiteConfig] = Field(default_factory=lambda: [SiteConfig()], min_length=1)
    sources: list[SourceConfig] = Field(default_factory=list)
    privacy: PrivacyConfig = Field(default_factory=lambda: PrivacyConfig())
    retention: RetentionConfig = Field(default_factory=lambda: RetentionConfig())
    topics: TopicsConfig = Field(default_factory=lambda: TopicsConfig())
    bots: BotsConfig = Field(default_factory=lambda: BotsConfig())
    kafka: KafkaConfig = Field(default_factory=lambda: KafkaConfig())
    ingest: IngestConfig = Field(default_factory=lambda: IngestConfig())
    detectors: dict[str, Any] = Field(default_factory=dict, description="detector thresholds (validated by forumpulse.detectors)")
    actions: dict[str, Any] = Field(default_factory=dict, description="firewall/webhook actions (validated by forumpulse.detectors)")

    _yaml_path: Path | None = None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlSource(settings_cls, _CURRENT_PATH))

    @field_validator("detectors")
    @classmethod
    def _detector_sections(cls, v: dict[str, Any]) -> dict[str, Any]:
        # each part is validated by its owner (which allows the others' keys), so a misspelt part name would
        # otherwise pass unseen and leave that detector on its defaults
        unknown = sorted(set(v) - set(DETECTOR_SECTIONS))
        if unknown:
            raise ValueError(f"unknown detector section(s) {', '.join(map(repr, unknown))} (known: "
                             f"{', '.join(DETECTOR_SECTIONS)})")
        return v

    @model_validator(mode="after")
    def _sites_named(self) -> Settings:
        names = [site.name for site in self.sites]
        if len(set(names)) != len(names):
            raise ValueError(f"sites: two sites share a name ({names})")
        return self

    def unconfigured_sites(self) -> list[tuple[str, str]]:
        """Sites that sources, topic groups or ``detectors.dos.site`` name but ``sites`` does not list, as
        (``key 'name'``, name): allowed (such a site gets the defaults: UTC, no holiday calendar, every engine's
        rules), but often a typo; ``config check`` says so."""
        names = {site.name for site in self.sites}
        out = [(f"sources.{i}.site {x.site!r}", x.site) for i, x in enumerate(self.sources) if x.site not in names]
        out += [(f"topics.groups.{i}.site {g.site!r}", g.site) for i, g in enumerate(self.topics.groups)
                if g.site not in names]
        dos = (self.detectors or {}).get("dos")
        if isinstance(dos, dict) and isinstance(dos.get("site"), str) and dos["site"] not in names:
            out.append((f"detectors.dos.site {dos['site']!r}", dos["site"]))  # the site its decisions name
        return out

    def long_holiday_periods(self, days: int = LONG_HOLIDAY_DAYS) -> list[str]:
        """Holiday periods longer than ``days`` days (``sites.N.holiday_periods.M``: name, length): allowed (a
        school forum's summer break), but a year typo (``2042-02-16`` for ``2024-02-16``) makes a festival week
        cover years, every dip in it a "holiday"; ``config check`` says so."""
        return [f"sites.{i}.holiday_periods.{j} {p.name!r}: {p.start} to {p.end}, {(p.end - p.start).days + 1:,} days"
                for i, site in enumerate(self.sites) for j, p in enumerate(site.holiday_periods)
                if (p.end - p.start).days + 1 > days]

    def site(self, name: str) -> SiteConfig:
        for s in self.sites:
            if s.name == name:
                return s
        return SiteConfig(name=name)


_CURRENT_PATH: Path | None = None
_DROP_TOP: frozenset[str] = frozenset()  # top-level keys of the file left out while the rest is checked


def _msg(text: str) -> str:
    """pydantic's message without its "Value error, " prefix (the key and reason are what a user needs)."""
    return text.removeprefix("Value error, ")


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load settings from ``path`` (or ``$FORUMPULSE_CONFIG``), environment and ``overrides``.

    Raises :class:`ConfigError` with one line per problem (``key: reason``).
    """
    global _CURRENT_PATH, _DROP_TOP
    p = path or os.environ.get("FORUMPULSE_CONFIG")
    _CURRENT_PATH = Path(p) if p else None
    problems: list[str] = []
    settings: Settings | None
    values: dict[str, Any] = {}  # sections with a problem of their own whose known parts are still validated
    try:
        if _CURRENT_PATH is not None and not _CURRENT_PATH.is_file():
            raise ConfigError([f"config: file {_CURRENT_PATH} does not exist"])
        try:
            settings = Settings(**overrides)
        except ValidationError as exc:
            problems = [f"{'.'.join(str(x) for x in e['loc'])}: {_msg(e['msg'])}".removeprefix(": ")
                        for e in exc.errors()]
            # the other sections are still checked, so one run reports every problem: the keys that failed are
            # set to their defaults for that (the file's other values are kept), unknown sections left out
            unknown = frozenset(str(e["loc"][0]) for e in exc.errors() if len(e["loc"]) == 1
                                and e["loc"][0] not in Settings.model_fields and e["type"] == "extra_forbidden")
            if not all(e["loc"] and (e["loc"][0] in Settings.model_fields or str(e["loc"][0]) in unknown)
                       for e in exc.errors()):
                raise ConfigError(problems) from None  # a problem of the file as a whole
            defaults = {str(e["loc"][0]): Settings.model_fields[str(e["loc"][0])].get_default(
                call_default_factory=True) for e in exc.errors() if e["loc"][0] in Settings.model_fields}
            _DROP_TOP = unknown
            for e in exc.errors():  # unknown detector sections: the known ones are still checked
                if tuple(e["loc"]) == ("detectors",) and isinstance(e.get("input"), dict):
                    values["detectors"] = {k: v for k, v in e["input"].items() if k in DETECTOR_SECTIONS}
            try:
                settings = Settings(**{**overrides, **defaults})
            except (ValidationError, ValueError):
                # a mapping section's bad keys survive its default (the file's mapping is merged into it): only
                # the sections whose values are known here are checked further
                if not values:
                    raise ConfigError(problems) from None
                settings = None
        except (yaml.YAMLError, ValueError) as exc:
            raise ConfigError([f"config: {exc}"]) from None
    finally:
        _CURRENT_PATH, _DROP_TOP = None, frozenset()
    problems += [f"environment {k}: no section {k.split('__')[0][len('FORUMPULSE_'):].lower()!r} (sections: "
                 f"{', '.join(Settings.model_fields)})" for k in sorted(os.environ)
                 if k.startswith("FORUMPULSE_") and "__" in k
                 and k.split("__")[0][len("FORUMPULSE_"):].lower() not in Settings.model_fields]
    failed = {p.split(".", 1)[0].split(":", 1)[0] for p in problems} - set(values)
    for section, validators in _SECTION_VALIDATORS.items():
        if section in failed or (settings is None and section not in values):
            continue  # already reported (its value was not even the section's shape), or not known
        value = values[section] if section in values else getattr(settings, section)
        for validator in validators.values():
            try:
                validator(value)
            except ValidationError as exc:
                problems += [f"{section}.{'.'.join(str(x) for x in e['loc'])}: {_msg(e['msg'])}"
                             for e in exc.errors()]
            except ValueError as exc:
                problems.append(f"{section}: {exc}")
            except OSError as exc:  # a file the section names (rules_file, ...) cannot be read
                problems.append(f"{section}: cannot read {exc.filename}: {exc.strerror}")
    if problems or settings is None:
        raise ConfigError(problems)
    return settings


#: key names whose values are secrets (masked by :func:`masked_dump`), in any section
_SECRET_KEY = re.compile(r"(secret|password|passwd|api_key|apikey|token|pseudonym_key|sasl_password)$", re.I)
#: user:password@ in a URL (clickhouse://user:pass@host, kafka SASL URLs)
_URL_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@:\s]*:)[^/@\s]+@", re.I)


def mask_url(url: str) -> str:
    """``clickhouse://user:pass@host`` -> ``clickhouse://user:***@host`` (other strings unchanged)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}***@", url)


def masked_dump(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain JSON data with every secret replaced by ``***``: SecretStr fields, keys
    named like secrets in any section (``actions.webhook.secret``, ``actions.decision_api.api_key``, ...) and
    passwords inside URLs, the path of the webhook URL.  What ``config show`` prints; safe to paste into an issue."""

    def walk(v: Any, key: str = "", parent: str = "") -> Any:
        if isinstance(v, dict):
            return {k: walk(x, str(k), key) for k, x in v.items()}
        if parent == "webhook" and key == "url" and isinstance(v, str):
            return re.sub(r"^([a-z][a-z0-9+.-]*://[^/]+)/.+$", r"\1/***", v)  # chat webhooks carry the secret in the path
        if isinstance(v, list):
            return [walk(x, key, parent) for x in v]
        if _SECRET_KEY.search(key) and v not in (None, ""):
            return "***"
        if isinstance(v, str):
            return mask_url(v)
        return v

    data = settings.model_dump(mode="json")
    out: dict[str, Any] = walk(data)
    return out


class ConfigError(ValueError):
    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "")
    return re.sub(r"forumpulse\.pipeline\.config\.", "", text).replace("pydantic.types.", "")


def reference_rows(model: type[BaseModel] = Settings, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every key, nested sections flattened with dots (lists use ``[]``)."""
    rows: list[tuple[str, str, str, str]] = []
    for name, f in model.model_fields.items():
        key = f"{prefix}{name}"
        ann = f.annotation
        inner = getattr(ann, "__args__", (None,))[0] if getattr(ann, "__origin__", None) is list else None
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.append((key, "section", "", f.description or ann.__doc__ or ""))
            rows += reference_rows(ann, key + ".")
            continue
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            rows.append((key, f"list of {inner.__name__}", "", f.description or ""))
            rows += reference_rows(inner, key + "[].")
            continue
        default = f.default_factory() if f.default_factory is not None else f.default  # type: ignore[call-arg]
        shown = "required" if default is PydanticUndefined else json.dumps(
            default if not isinstance(default, SecretStr) else "***", default=str)
        rows.append((key, _type_name(ann), shown, f.description or ""))
    return rows


def markdown_reference() -> str:
    """The key reference of docs/configuration.md (generated; tests check the committed file is current)."""
    out = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key, typ, default, desc in reference_rows():
        if len(default) > 60:
            default = default[:57] + "..."
        out.append(f"| `{key}` | {typ.replace('|', 'or')} | `{default}` | {desc.replace('|', '/')} |" if default
                   else f"| `{key}` | {typ.replace('|', 'or')} | | {desc.replace('|', '/')} |")
    return "\n".join(out) + "\n"
