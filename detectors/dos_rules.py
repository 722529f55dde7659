"""DoS/abuse rules as data (``detectors/rules/dos.yaml``) and the ``detectors.dos`` / ``actions`` config models.

:func:`load_rules` validates the rules file (every pattern compiles, every rule names known patterns, windows
and thresholds are positive) and raises :class:`ValueError` naming the rule and field on misuse
(:class:`DosRulesError`, one line ``<file>: <reason>``, for a file that is not YAML or not a rules mapping, or
an override of a rule the file lacks).
:class:`DosConfig` (section ``detectors.dos``) and :class:`ActionsConfig` (section ``actions``) are registered
with :func:`forumpulse.pipeline.config.register_section_validator` when this module is imported, so
``forumpulse config check`` reports their errors.  Secrets (decision API key, webhook HMAC secret) have no
defaults: they come from the configuration file or ``FORUMPULSE_ACTIONS__...`` environment variables.
"""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from forumpulse.pipeline.config import register_section_validator
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

RULES_PATH = Path(__file__).resolve().parent / "rules" / "dos.yaml"
CASES_DIR = Path(__file__).resolve().parent / "rules" / "dos_cases"

PatternField = Literal["path", "query", "path_query", "user_agent"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Pattern(_Strict):
    field: PatternField
    regex: str

    @field_validator("regex")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"regular expression does not compile: {exc}") from None
        return v


class RuleFilter(_Strict):
    static: bool | None = Field(None, description="true: only static files, false: only non-static, null: both")
    status_in: list[int] | None = None
    method_in: list[str] | None = None
    pattern: str | None = Field(None, description="name of a pattern in the `patterns` section")


class Rule(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str
    kind: Literal["count", "distinct", "distributed", "swarm"]
    key: Literal["ip", "prefix"] = "ip"
    target: Literal["path"] = "path"
    distinct_of: PatternField | None = None
    filter: RuleFilter = Field(default_factory=RuleFilter)
    window_s: int = Field(ge=1, le=3600)
    threshold: float = Field(gt=0)
    min_ratio: float | None = Field(None, gt=0, le=1)
    max_target_ratio: float | None = Field(None, gt=0, le=1, description="distinct rules: fire only when the "
                                           "window's distinct URLs (path and query) / requests is at most this -- "
                                           "a tool hammers a few URLs, readers behind one address browse many pages")
    min_clients: int = Field(1, ge=1)
    per_client_min: int = Field(1, ge=1)
    scale: Literal["none", "baseline"] = "none"
    crowd_floor: bool = Field(False, description="prefix rules with scale: baseline: inside a flash crowd the "
                              "rule's own threshold is raised by the crowd's rise too (a range with a low or no "
                              "learned rate gets new readers as well); off keeps the threshold an absolute floor")
    scope: Literal["ip", "range"] = "ip"
    duration_s: int = Field(ge=1)
    # swarm rules (many addresses, each below per-client thresholds, one target): see docs/dos.md
    rise_factor: float = Field(1.0, ge=1, description="swarm: target requests in the window >= this x the "
                               "target's learned requests per window")
    min_history_s: int = Field(0, ge=0, description="swarm and count rules: stream time the detector must have "
                               "seen before the rule judges anything (its baselines are learned first)")
    watch_s: int = Field(1800, ge=1, description="swarm: how long a triggered target's clients are followed")
    member_max_static: int = Field(0, ge=0, description="swarm member: at most this many static requests")
    member_min_target_share: float = Field(0.8, gt=0, le=1, description="swarm member: share of its requests "
                                           "on the target")
    min_member_share: float = Field(0.5, gt=0, le=1, description="swarm: members / clients with "
                                    "per_client_min target requests; below it the crowd is taken as real users")
    max_bans_per_minute: int | None = Field(None, ge=1, description="own circuit-breaker budget for this rule's "
                                            "bans (a swarm bans many members at once); default: the shared one")

    @model_validator(mode="after")
    def _consistent(self) -> Rule:
        if self.kind == "distinct" and self.distinct_of is None:
            raise ValueError("a distinct rule needs distinct_of")
        if self.scope == "range" and self.key != "prefix":
            raise ValueError("scope range needs key prefix")
        if self.kind in ("distributed", "swarm") and self.scope != "ip":
            raise ValueError(f"a {self.kind} rule bans clients (scope ip)")
        return self


class Baseline(_Strict):
    alpha: float = Field(0.3, gt=0, le=1)
    headroom: float = Field(4.0, ge=1)
    users_per_unit: float = Field(4, gt=0)
    min_requests_per_user: int = Field(2, ge=1)
    max_scale: float = Field(10.0, ge=1)
    provisional_max_scale: float = Field(3.0, ge=1, description="cap for users seen only in the current batch")
    forget_after_s: int = Field(3600, ge=60)


class PrefixBaseline(_Strict):
    """Learned rate of each prefix (IPv4 /24, IPv6 /64) for prefix rules with ``scale: baseline``."""

    alpha: float = Field(0.3, gt=0, le=1, description="EWMA weight of the last completed minute")
    headroom: float = Field(4.0, ge=1, description="threshold >= headroom x the prefix's learned rate")
    max_scale: float = Field(10.0, ge=1, description="the threshold is never raised above max_scale x")
    min_requests_per_minute: int = Field(30, ge=1, description="quieter minutes teach nothing (the rate is "
                                         "kept, not lowered)")
    forget_after_s: int = Field(86_400, ge=60, description="a prefix with no minute learned for this long is "
                                "forgotten (learned rate 0)")
    crowd_min_ranges: int = Field(10, ge=0, description="a flash crowd raises every range's threshold: the "
                                  "median rise of the other busy ranges multiplies their learned rates, counted "
                                  "when at least this many ranges are busy (0: off)")
    crowd_recent_s: int = Field(300, ge=60, description="a range is busy (counts in the crowd) when a minute of it "
                                "was learned this recently")


class RuleSet(_Strict):
    version: int
    patterns: dict[str, Pattern]
    baseline: Baseline = Field(default_factory=Baseline)
    prefix_baseline: PrefixBaseline = Field(default_factory=PrefixBaseline)
    rules: list[Rule]

    @model_validator(mode="after")
    def _refs(self) -> RuleSet:
        names = [r.name for r in self.rules]
        if len(set(names)) != len(names):
            raise ValueError("rule names must be unique")
        if "static" not in self.patterns:
            raise ValueError("the `static` pattern is required (it defines static files)")
        for r in self.rules:
            if r.filter.pattern is not None and r.filter.pattern not in self.patterns:
                raise ValueError(f"rule {r.name}: unknown pattern {r.filter.pattern!r}")
        return self

    @cached_property
    def compiled(self) -> dict[str, re.Pattern[str]]:
        return {k: re.compile(p.regex) for k, p in self.patterns.items()}


class DosRulesError(ValueError):
    """A DoS rules file, or ``rule_overrides`` applied to it, cannot be used.  ``str()`` is one line naming the
    file (or ``rule_overrides``) and the reason; commands print it without a traceback (exit 2).  ``key`` is
    what is wrong: ``rules_file`` or ``rule_overrides``."""

    def __init__(self, message: str, key: str = "rules_file") -> None:
        super().__init__(message)
        self.key = key


def _read_rules(p: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DosRulesError(f"{p}: not valid YAML: {where}{what}") from None
    except UnicodeDecodeError:
        raise DosRulesError(f"{p}: not a text file (UTF-8)") from None
    if data is None:
        raise DosRulesError(f"{p}: the file is empty (expected version, patterns and rules)")
    if not isinstance(data, dict):
        raise DosRulesError(f"{p}: the top level must be a mapping with version, patterns and rules")
    return data


def load_rules(path: str | Path | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> RuleSet:
    """Load and validate a rules file (default: the built-in ``rules/dos.yaml``).

    ``overrides`` maps rule name -> field values (from ``detectors.dos.rule_overrides``), e.g.
    ``{"client_flood": {"threshold": 50}}``.  Errors: :class:`OSError` when the file cannot be read,
    :class:`DosRulesError` (a ValueError, one line ``<file>: <reason>``) when it is not YAML, not a mapping, or an
    override names a rule the file does not have, pydantic's ``ValidationError`` (also a ValueError) when a
    rule or field is invalid.
    """
    p = Path(path or RULES_PATH)
    data = _read_rules(p)
    if overrides:
        rules = data.get("rules")
        by_name = {r.get("name"): r for r in rules if isinstance(r, dict)} if isinstance(rules, list) else {}
        for name, fields in overrides.items():
            if name not in by_name:
                raise DosRulesError(f"rule_overrides: unknown rule {name!r} (not in {p}; remove the override or "
                                    "use a rules file that has it)", key="rule_overrides")
            by_name[name].update(fields)
    return RuleSet.model_validate(data)


def rule_problems(path: str | Path | None, exc: ValidationError) -> list[str]:
    """Every problem of a rules file (``path``, default the built-in one) that does not validate, as
    ``<rule name>.<field>: <reason>``: the rule named, not its position in the file."""
    data = _read_rules(Path(path or RULES_PATH))
    rules = data.get("rules", [])
    names = [r.get("name") for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []

    def where(loc: tuple[Any, ...]) -> str:
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int) and loc[1] < len(names):
            loc = (names[loc[1]], *loc[2:])
        return ".".join(str(x) for x in loc)

    return [f"{where(e['loc']) or '(file)'}: {e['msg']}" for e in exc.errors()]


# --------------------------------------------------------------------------------------------- config


def _network(v: str) -> str:
    try:
        return str(ipaddress.ip_network(v, strict=False))
    except ValueError:
        raise ValueError(f"{v!r} is not an IP address or CIDR") from None


class CrawlerConfig(_Strict):
    verify: Literal["dns", "ua", "off"] = Field(
        "dns", description="dns: UA match + reverse DNS + forward confirmation; ua: trust the UA; off: no exemption")

    @field_validator("verify", mode="before")
    @classmethod
    def _yaml_off(cls, v: Any) -> Any:
        # YAML 1.1 reads an unquoted `off` as false: `verify: off`, as the example writes it, was refused
        # (user trial 43)
        return "off" if v is False else v
    cache_ttl_s: int = Field(3600, ge=1)
    timeout_s: float = Field(2.0, gt=0)
    networks: bool = Field(True, description="a client whose requests carry no user agent (squid's native log) and "
                           "whose address is in a crawler's published network (pipeline/rules/crawler_networks.yaml, "
                           "or bots.networks_file) is that crawler -- with verify: dns only when its reverse name "
                           "also ends in the crawler's own dns_suffixes -- and not banned by address")


class EscalationConfig(_Strict):
    factor: float = Field(4.0, ge=1, description="each repeat offence multiplies the ban duration")
    window_s: int = Field(86_400, ge=60, description="offences older than this are forgotten")
    max_duration_s: int = Field(7 * 86_400, ge=60)


class DosConfig(_Strict):
    """Section ``detectors.dos``."""

    enabled: bool = True
    rules_file: str | None = Field(None, description="rules YAML; default the built-in rules/dos.yaml")
    rule_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    mode: Literal["enforce", "observe"] = Field("enforce", description="observe: record decisions, apply none")
    allowlist: list[str] = Field(default_factory=list, description="CIDRs never banned (own infra, CDNs, NATs)")
    crawlers: CrawlerConfig = Field(default_factory=CrawlerConfig)
    escalation: EscalationConfig = Field(default_factory=EscalationConfig)
    max_bans_per_minute: int = Field(30, ge=1, description="circuit breaker: more bans in one stream minute are "
                                     "recorded with mode=breaker and not enforced")
    site: str = "forum"

    _norm = field_validator("allowlist")(lambda cls, v: [_network(x) for x in v])

    @model_validator(mode="after")
    def _rules_load(self) -> DosConfig:
        # the rules file and the overrides are checked where the configuration is (config check, every command's
        # start), not first when the detector starts: an unknown rule or field in rule_overrides, a missing file
        try:
            load_rules(self.rules_file, self.rule_overrides)
        except OSError as exc:
            raise ValueError(f"rules_file: cannot read {exc.filename}: {exc.strerror}") from None
        except DosRulesError as exc:
            raise ValueError(f"rules_file {exc}" if exc.key == "rules_file" else str(exc)) from None
        except ValidationError as exc:
            raise ValueError("; ".join(f"rules: {p}" for p in rule_problems(self.rules_file, exc))) from None
        return self


class NftablesConfig(_Strict):
    enabled: bool = False
    table: str = Field("forumpulse", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,30}$")
    set_v4: str = Field("ban_v4", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,30}$")
    set_v6: str = Field("ban_v6", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,30}$")
    hook_priority: int = -10
    hooks: list[Literal["input", "forward"]] = Field(
        ["input"], min_length=1,
        description="base chains that drop banned sources: input (traffic to this host) and/or forward (traffic "
                    "routed through it, e.g. a web server in Docker with published ports)")


class IpsetConfig(_Strict):
    enabled: bool = False
    set_v4: str = Field("forumpulse4", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")
    set_v6: str = Field("forumpulse6", pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")
    iptables_rule: bool = Field(True, description="insert iptables rules dropping members of the sets")
    iptables_chains: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z][A-Za-z0-9_-]{0,28}$")]] = Field(
        ["INPUT"], min_length=1,
        description="chains the drop rule goes in (top of each): INPUT, and DOCKER-USER for a web server in "
                    "Docker with published ports; a chain missing in iptables or ip6tables is skipped there")
    maxelem: int = Field(65536, ge=1, le=2**31 - 1,
                         description="most entries per set; an existing smaller set is resized in place")


class WebhookConfig(_Strict):
    enabled: bool = False
    url: str = ""
    secret: SecretStr | None = Field(None, description="HMAC-SHA256 key (no default; set in config or env)")
    retries: int = Field(4, ge=0, le=10)
    backoff_s: float = Field(0.5, ge=0)
    timeout_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _needs(self) -> WebhookConfig:
        if self.enabled and (not self.url.startswith(("http://", "https://")) or self.secret is None):
            raise ValueError("an enabled webhook needs an http(s) url and a secret")
        if self.enabled and self.secret is not None and not self.secret.get_secret_value():
            raise ValueError("secret is empty: set the HMAC key (or FORUMPULSE_ACTIONS__WEBHOOK__SECRET)")
        return self


class BouncerKey(_Strict):
    """One bouncer of the decision API: its own key, so its own stream cursor (a key is a bouncer, as in CrowdSec)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", description="bouncer name (logs, cursors)")
    api_key: SecretStr = Field(description="this bouncer's X-Api-Key; no default")

    @field_validator("api_key")
    @classmethod
    def _not_empty(cls, v: SecretStr) -> SecretStr:
        if not v.get_secret_value():
            raise ValueError("a bouncer key must not be empty")
        return v


_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def listen_address(v: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPV6]:PORT`` -> (host, port) (host without brackets; port 0 = any free port).  Raises
    ValueError saying what to write instead."""
    text = v.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"{v!r}: write an IPv6 address as [ADDRESS]:PORT, e.g. [::1]:8090")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{v!r}: {host!r} in brackets is not an IPv6 address") from None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            raise ValueError(f"{v!r} has no port: write HOST:PORT, e.g. 127.0.0.1:8090")
        if ":" in host:
            raise ValueError(f"{v!r}: write an IPv6 address in brackets, e.g. [::1]:8090")
        if not host:
            raise ValueError(f"{v!r} has no host: write HOST:PORT, e.g. 127.0.0.1:8090 (0.0.0.0:PORT for every "
                             "IPv4 interface)")
        if not _HOSTNAME.match(host):
            raise ValueError(f"{v!r}: {host!r} is not an address or host name")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{v!r}: the port must be a number from 0 to 65535 (0: any free port)")
    return host, int(port)


class DecisionApiConfig(_Strict):
    enabled: bool = False
    listen: str = Field("127.0.0.1:8090", description="HOST:PORT (IPv6: [ADDRESS]:PORT) of the CrowdSec-compatible "
                        "decision stream")
    api_key: SecretStr | None = Field(None, description="key of a single bouncer (X-Api-Key, the bouncer named "
                                      "`default`); no default.  Several bouncers: `bouncers`")
    bouncers: list[BouncerKey] = Field(default_factory=list, description="one entry (name, api_key) per bouncer: "
                                       "each key has its own stream cursor, so bouncers behind one proxy or NAT "
                                       "each get every change")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        listen_address(v)
        return v.strip()

    def address(self) -> tuple[str, int]:
        """(host, port) of ``listen``: the host without brackets (an IPv6 address is served over IPv6)."""
        return listen_address(self.listen)

    @model_validator(mode="after")
    def _needs(self) -> DecisionApiConfig:
        if self.enabled and self.api_key is not None and not self.api_key.get_secret_value():
            raise ValueError("api_key is empty: set the bouncer's key (or FORUMPULSE_ACTIONS__DECISION_API__API_KEY), "
                             "or remove api_key and list bouncers")
        keys = self.keys()
        if self.enabled and not keys:
            raise ValueError("an enabled decision API needs api_key (one bouncer) or bouncers (one key each)")
        names = [b.name for b in self.bouncers] + (["default"] if self.api_key is not None else [])
        if len(set(names)) != len(names):
            raise ValueError("bouncer names must be unique (api_key is the bouncer named `default`)")
        if len(set(keys.values())) != len(keys):
            raise ValueError("two bouncers have the same api_key: a key is one bouncer, give each its own")
        return self

    def keys(self) -> dict[str, str]:
        """Bouncer name -> key (``api_key`` is the bouncer ``default``), for ``DecisionApiServer``."""
        out = {b.name: b.api_key.get_secret_value() for b in self.bouncers}
        if self.api_key is not None:
            out["default"] = self.api_key.get_secret_value()
        return out


class ActionsConfig(_Strict):
    """Section ``actions``."""

    nftables: NftablesConfig = Field(default_factory=NftablesConfig)
    ipset: IpsetConfig = Field(default_factory=IpsetConfig)
    webhook: WebhookConfig = Field(default_factory=WebhookConfig)
    decision_api: DecisionApiConfig = Field(default_factory=DecisionApiConfig)
    jsonl_path: str | None = Field(None, description="also append every decision to this JSON-lines file")
    kafka: bool = Field(False, description="publish decisions on kafka.decisions_topic, and require a direct "
                        "`detect unban` to (an error when Kafka does not confirm it); owners publish anyway when "
                        "detectors.live.publish_decisions")


class DetectorsSection(BaseModel):
    """The part of section ``detectors`` this module owns (other detectors validate their own keys)."""

    model_config = ConfigDict(extra="allow")
    dos: DosConfig = Field(default_factory=DosConfig)


register_section_validator("actions", ActionsConfig.model_validate)


def _validate_detectors(v: Any) -> Any:
    return DetectorsSection.model_validate(v)


register_section_validator("detectors", _validate_detectors)
