"""Traffic event detectors over the ClickHouse rollups (``site_minute``, ``topic_minute``, ``transfer_minute``,
``source_liveness``), live (:meth:`TrafficDetector.run_once` every minute) and over history (:func:`detect_history`).

Detectors (thresholds in ``detectors/rules/traffic.yaml``; fixture cases in ``detectors/rules/traffic_cases/``):

* ``spike`` / ``dip`` / ``outage`` per site — :class:`forumpulse.detectors.series.SeasonalDetector` fed with the
  *answered* requests per minute (``requests - 5xx - no status``), so an error storm reads as zero traffic.  Dips
  on calendar holidays / holiday periods are labelled ``holiday``, others ``unexplained``.
* ``outage`` — answered traffic ~0 while the site's log sources are alive (lines with errors, or heartbeats in
  ``source_liveness`` without lines) for ``health.outage_min_minutes``.  A heartbeat is evidence of liveness at
  time ``t`` when ``0 <= t - heartbeat <= heartbeat_fresh_seconds`` (``t`` = the end of a history range, or the
  wall clock live, where a shipper clock up to :data:`LIVE_CLOCK_SKEW_S` ahead is tolerated).
* ``pipeline_gap`` — no lines and no heartbeats (absent minutes): reported for ops (``scope = pipeline``), never
  fed to the traffic detectors as zeros, so a gap is never a dip.  The same for one log source of a site
  (``scope = source:<host>/<file>``): while any source of the site is in a pipeline_gap, the site's minutes are
  no data for its seasonal model (not fed: no dip, kept out of its baselines).
* ``topic_surge`` — per topic and per topic group (``topic_groups`` table + ``Settings.topics.groups``): for each
  measure of ``topic.measures`` -- human topic views, replies (over ``reply_window_minutes``, floor
  ``min_replies``: sparse) and visitors (visitor-minutes) -- the share of the forum's total in its window against
  the scope's share over the previous ``baseline_hours``, and its rate against its own baseline rate; any
  measure passing opens the surge (``detail.measure`` / ``detail.measures`` name them, ``detail.by_measure``
  gives observed / expected share of each, see :class:`TopicSurgeDetector`); for configured groups also a binomial
  CUSUM on the per-minute counts (:class:`SurgeCusum`), which accumulates evidence while a share ramps up;
  lifecycle start -> peak -> end (a surge reopening within ``merge_minutes`` continues its event); detail
  carries views, replies, visitors, peak share, magnitude, the trigger (``window`` / ``cusum``).  No surge opens
  before the baseline holds :data:`TOPIC_MIN_BASELINE_MINUTES` (the start of the data or of a warm-up).
* ``transfer_regression`` / ``latency_regression`` — per (origin_host, upstream, large size class) per window:
  median transfer rate (bytes/s) and p95 response time against the median of the previous windows; a low
  transfer median opens a regression only on enough evidence (binomial tail of the window's responses, multiplied
  over consecutive low windows, :class:`TransferDetector`); a slow creep, which that baseline follows, against an
  anchored reference (the same keys 2-9 days back / the same hours a week back, :meth:`TransferDetector._creep`).

Every detection has a stable ``id`` (site, kind, scope, start) so the ``detections`` ReplacingMergeTree keeps its
latest state; it is printed as a JSON line, inserted, and handed to an optional ``producer`` hook
(``callable(topic, key, value)``, the live path wires Kafka ``weblogs.events``).

Guarantees: only complete minutes (``< now`` truncated to the minute, minus ``lag_minutes``; live -- and history
without an explicit end -- also before the site's watermark, :meth:`TrafficDetector._watermark`: the loader's
progress by the sources' lines and heartbeats and by the consumers' per-partition reports) are read; running
``run_once`` twice for the same ``now`` adds nothing new; history and live use the same code path.  Live, a store
error loses nothing and feeds nothing twice: a site's detectors are fed only after every read for its new minutes
succeeded, detections stay in an outbox until stored and published, and one site's error does not stop the others
(:meth:`TrafficDetector.run_once`).  History (:func:`detect_history`) reports every event overlapping the range,
including one that started before it; it judges each minute with the heartbeats of that minute from the heartbeat
log (``source_heartbeat_minute``, migration 0008; :class:`HeartbeatLog`), as does a live run catching up over
several minutes; before the log's first minute for the site's sources it knows heartbeats only at the end of its
range, so a silence that ended before is a ``pipeline_gap`` of unknown liveness (``detail.liveness``), not written
over a live ``outage``.
Misuse: one ``TrafficDetector`` per store and process (it keeps per-site state in memory).
"""

from __future__ import annotations

import bisect
import copy
import difflib
import json
import logging
import math
import re
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

import pyarrow as pa
import typer
import yaml
from forumpulse.detectors.calendar import SiteCalendar, site_calendar
from forumpulse.detectors.series import (
    REFERENCE_DAYS_BACK,
    Detection,
    ScoreParams,
    SeasonalDetector,
    SeasonalParams,
    json_safe,
)
from forumpulse.pipeline.contracts import LISTENER_LABEL_RE, Beat, covering_listeners, file_grew
from forumpulse.pipeline.enrich import latest_titles
from forumpulse.pipeline.sources import retired_sources, retirement_minute
from forumpulse.pipeline.store import sql_string
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

log = logging.getLogger(__name__)

RULES_FILE = Path(__file__).resolve().parent / "rules" / "traffic.yaml"

# ------------------------------------------------------------------------------------------------ config


RULES_VERSION = 11  # 11: health.gap_blinds_min_share (a source gap blinds the site model only for a source that
# carried that share of the site's lines);
# 10: site.new_level_hours (a spike / unexplained dip that holds a day is a new level);
# 9: health.stuck_grace_seconds (a silent source whose file grows is a pipeline_gap);
# 8: series.period_min_lag / period_max_lag (learned period, re-learnt after a period change);
# 7: series.novelty_* (contextual novelty next to the anomaly likelihood);
# 6: topic.measures / reply_window_minutes / min_replies / min_visitors (replies and visitors);
# 5: site.exclude_events, transfer/latency creep_* (anchored creep baseline);
# 4: health.gap_blinds_site_hours; 2: topic.cusum_ratio / cusum_h / merge_minutes (group CUSUM), series.likelihood_* changes;
# 3: transfer regressions by binomial evidence (transfer.max_p / tail_share / tail_min_requests), series.seasonal_gain


@lru_cache(maxsize=8)
def _load_yaml(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(data, dict) or data.get("version") != RULES_VERSION:
        found = data.get("version") if isinstance(data, dict) else None
        raise ValueError(f"{path}: expected a mapping with version: {RULES_VERSION}"
                         + (f" (found version {found}: copy detectors/rules/traffic.yaml of this release and "
                            "re-apply your changes)" if found is not None else " (see detectors/rules/traffic.yaml)"))
    if Path(path).resolve() != RULES_FILE:
        data = _as_replacement(path, data, _load_yaml(str(RULES_FILE)))
    return data


#: rules that count rows, minutes, windows, days, levels ...: used as sizes and slice bounds, so whole numbers only
#: (other numeric rules -- hours, seconds, thresholds -- take any number)
_WHOLE = ("_minutes", "_window", "_windows", "_days", "_short", "_cycles", "_levels", "_orders", "_buckets", "_lag",
          "suppress", "min_history", "baseline_hours")


def _whole(key: str, shipped: Any) -> bool:
    return isinstance(shipped, int) and not isinstance(shipped, bool) and key.endswith(_WHOLE)


def _same_kind(key: str, value: Any, shipped: Any) -> bool:
    """``value`` may replace ``shipped``: a bool for a bool, a whole number for a counting rule (``30.0`` is 30,
    ``30.5`` is refused: it would fail later as a slice bound), any number for another numeric rule, else the
    same type."""
    if isinstance(shipped, bool):
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if _whole(key, shipped):
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(shipped, (int, float)):
        return isinstance(value, (int, float))
    return isinstance(value, type(shipped))


def _as_shipped(key: str, value: Any, shipped: Any) -> Any:
    return int(value) if _whole(key, shipped) else value


def _kind_name(key: str, shipped: Any) -> str:
    return "whole number" if _whole(key, shipped) else \
        "number" if isinstance(shipped, (int, float)) and not isinstance(shipped, bool) else type(shipped).__name__


def _as_replacement(path: str, data: dict[str, Any], shipped: dict[str, Any]) -> dict[str, Any]:
    """A replacement rules file (``rules_file``, ``--rules``): every section and key it names must exist in the
    shipped file, with a value of the same kind (a typo is an error naming it, not a crash later); the keys it
    leaves out keep the shipped values."""
    merged, problems = _merge_rules(shipped, {k: v for k, v in data.items() if k != "version"}, "")
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    return merged


def _merge_rules(base: dict[str, Any], data: dict[str, Any], what: str) -> tuple[dict[str, Any], list[str]]:
    """``base`` with ``data``'s section -> key -> value merged in, and every problem at once (a section or key
    ``base`` lacks, with a did-you-mean; a value of another kind); ``what`` begins the messages."""
    problems: list[str] = []
    merged = copy.deepcopy(base)
    for section, values in data.items():
        if section not in base or not isinstance(base[section], dict):
            near = difflib.get_close_matches(str(section), [k for k, v in base.items() if isinstance(v, dict)], n=1)
            problems.append(f"unknown {what}section {section!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
            continue
        if not isinstance(values, dict):
            problems.append(f"section {section!r} must be a mapping of rule: value")
            continue
        for k, v in values.items():
            if k not in base[section]:
                near = difflib.get_close_matches(str(k), list(base[section]), n=1)
                problems.append(f"unknown {what or 'rule '}{section}.{k}"
                                + (f" (did you mean {section}.{near[0]}?)" if near else ""))
            elif not _same_kind(k, v, base[section][k]):
                problems.append(f"{what}{section}.{k}: {v!r} is not a {_kind_name(k, base[section][k])} "
                                f"(shipped: {base[section][k]!r})")
            else:
                merged[section][k] = _as_shipped(k, v, base[section][k])
    return merged, problems


def load_rules(path: str | Path | None = None, overrides: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Rules from ``traffic.yaml`` (or ``path``) with per-section ``overrides``; unknown keys are errors, all of
    them in one ValueError (config check used to name one per run: user trial 40)."""
    rules, problems = _merge_rules(_load_yaml(str(path or RULES_FILE)), overrides or {}, "traffic rule ")
    if problems:
        raise ValueError("; ".join(problems))
    return rules


def score_params(rules: dict[str, Any]) -> ScoreParams:
    return ScoreParams(**rules["series"])


def seasonal_params(rules: dict[str, Any], rollup: bool = False) -> SeasonalParams:
    p = dict(rules["site"])
    if rollup:
        p["outage_min_minutes"] = rules["health"]["outage_min_minutes"]
    return SeasonalParams(**p)


class TrafficSettings(BaseModel):
    """``Settings.detectors.traffic``."""

    model_config = ConfigDict(extra="forbid")
    rules_file: str | None = Field(None, description="replacement for detectors/rules/traffic.yaml")
    thresholds: dict[str, dict[str, Any]] = Field(default_factory=dict, description="section -> key -> value overrides")
    enabled: list[Literal["site", "topic", "transfer"]] = Field(default_factory=lambda: ["site", "topic", "transfer"],  # type: ignore[arg-type]
                               description="detectors to run: site (spike/dip/outage/pipeline_gap), topic, transfer")
    history_days: int = Field(15, ge=1, le=60, description="days of rollups loaded to warm the baselines at start")
    lag_minutes: int = Field(1, ge=0, description="minutes behind now considered not yet complete")

    def rules(self) -> dict[str, Any]:
        return load_rules(self.rules_file, self.thresholds)

    @field_validator("rules_file")
    @classmethod
    def _rules_file(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                load_rules(v)
            except OSError as exc:
                raise ValueError(f"cannot read {exc.filename}: {exc.strerror}") from None
        return v

    @field_validator("thresholds")
    @classmethod
    def _rules_load(cls, v: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        """Unknown sections/keys and values of the wrong kind raise ValueError (all of them, a ValidationError
        naming detectors.traffic.thresholds), checked against ``rules_file`` (the shipped rules when it is
        not readable: that is reported on its own key).  Field validators, so these are reported with the
        other fields' problems in one run (a model validator ran only once every field was right: user trial
        40)."""
        load_rules(info.data.get("rules_file"), v)
        return v


class DetectorsSection(BaseModel):
    """The ``detectors`` section: ``traffic`` here; other keys belong to other detector modules."""

    model_config = ConfigDict(extra="allow")
    traffic: TrafficSettings = Field(default_factory=TrafficSettings)


def validate_detectors_section(value: Any) -> DetectorsSection:
    return DetectorsSection.model_validate(value or {})


def validate_site_calendars(sites: Any) -> None:
    """Every site's holiday calendar can be built: a country (and subdivision) the ``holidays`` package knows.
    Checked with the detectors' sections (``config check``, every detector command), not by ``parse``/``ingest``,
    which do not use calendars."""
    for i, site in enumerate(sites or []):
        try:
            site_calendar(site)
        except ValueError as exc:
            raise ValueError(f"site {getattr(site, 'name', i)!r}: {exc}") from None


def _register() -> None:
    from forumpulse.pipeline.config import register_section_validator

    register_section_validator("detectors", validate_detectors_section)
    register_section_validator("sites", validate_site_calendars)


_register()

# ------------------------------------------------------------------------------------------------ helpers


def _utc(t: datetime | int | float) -> datetime:
    """Aware UTC datetime from a datetime (naive = UTC) or epoch seconds (chDB returns DateTime as integers)."""
    if isinstance(t, int | float):
        return datetime.fromtimestamp(t, UTC)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _sql_ts(t: datetime) -> str:
    return f"toDateTime('{_utc(t):%Y-%m-%d %H:%M:%S}', 'UTC')"


_q = sql_string


DETECTION_SCHEMA = pa.schema([
    ("id", pa.string()), ("kind", pa.string()), ("site", pa.string()), ("scope", pa.string()),
    ("start_ts", pa.timestamp("ms", tz="UTC")), ("end_ts", pa.timestamp("ms", tz="UTC")),
    ("peak_ts", pa.timestamp("ms", tz="UTC")), ("observed", pa.float64()), ("expected", pa.float64()),
    ("score", pa.float64()), ("label", pa.string()), ("state", pa.string()), ("detail", pa.string()),
    ("updated_at", pa.timestamp("ms", tz="UTC")),
])


RUNS_SCHEMA = pa.schema([
    ("site", pa.string()), ("mode", pa.string()), ("from_ts", pa.timestamp("s", tz="UTC")),
    ("to_ts", pa.timestamp("s", tz="UTC")), ("recorded_at", pa.timestamp("ms", tz="UTC"))])
"""``detection_runs`` (migration 0010): the minutes ``[from_ts, to_ts)`` a run judged for a site."""

#: a live session moves its ``detection_runs`` row on at most this often (and at its first run)
RUNS_EVERY = timedelta(minutes=15)


def record_runs(store: Any, runs: Iterable[tuple[str, str, datetime, datetime]], now: datetime) -> None:
    """Insert ``(site, mode, from, to)`` rows into ``detection_runs`` (mode ``history`` or ``live``); the latest
    ``recorded_at`` per (site, mode, from) stands, so a live session re-inserts its row as it goes on."""
    rows = [{"site": site, "mode": mode, "from_ts": _utc(a), "to_ts": _utc(b), "recorded_at": _utc(now)}
            for site, mode, a, b in runs if b > a]
    if rows:
        store.insert("detection_runs", pa.Table.from_pylist(rows, schema=RUNS_SCHEMA))


def detections_table(dets: Iterable[Detection], now: datetime) -> pa.Table:
    rows = [{
        "id": d.id, "kind": d.kind, "site": d.site, "scope": d.scope, "start_ts": _utc(d.start),
        "end_ts": _utc(d.end) if d.end else None, "peak_ts": _utc(d.peak_ts), "observed": float(d.observed),
        "expected": float(d.expected), "score": float(d.score), "label": d.label, "state": d.state,
        "detail": json.dumps(json_safe({k: v for k, v in d.detail.items() if not k.startswith("_")}), default=str,
                             allow_nan=False),
        "updated_at": _utc(now),
    } for d in dets]
    return pa.Table.from_pylist(rows, schema=DETECTION_SCHEMA)


# ------------------------------------------------------------------------------------------------ topic surge


MEASURES = ("views", "replies", "visitors")
"""The traffic measures a topic surge judges, in the order of the per-minute count tuples: human topic views,
replies (posts) and visitors (per minute, the distinct human visitors of the topic; summed over minutes and
member topics: *visitor-minutes*, an additive stand-in for unique visitors)."""

_Counts = tuple[int, int, int]
_MinuteItem = tuple[datetime, dict[str, _Counts], _Counts]


@dataclass
class _Rolling:
    """One measure (``idx`` in the count tuples): its trailing window of ``window`` minutes and the ``baseline``
    minutes before it, with running sums per scope and of the forum's totals (O(scopes of the minute) per push).
    The per-minute dicts are shared with the other measures' rollings.  With ``zero_keys`` (views, as rules v5
    meant them) a scope that has a row in the baseline but no count there is still "seen" (:meth:`seen`): its
    baseline share is floored at ``new_topic_share / 10``, not set to ``new_topic_share`` as for a scope never
    seen.  "Seen" is counted in rows (``base_rows``), not read off the sums, whose keys go at 0."""

    idx: int
    window: int
    baseline: int
    win: deque[_MinuteItem] = field(default_factory=deque)
    base: deque[_MinuteItem] = field(default_factory=deque)
    win_sum: dict[str, int] = field(default_factory=dict)
    base_sum: dict[str, int] = field(default_factory=dict)
    win_total: int = 0
    base_total: int = 0
    zero_keys: bool = False  # views: a scope with a row in the baseline is "seen" even with 0 views (floor / 10)
    base_rows: dict[str, int] = field(default_factory=dict)  # zero_keys: baseline minutes with a row, per scope

    def seen(self, scope: str) -> bool:
        """Whether ``scope`` has a count in the baseline, or (``zero_keys``) at least a row there."""
        return scope in self.base_sum or (self.zero_keys and scope in self.base_rows)

    def push(self, item: _MinuteItem) -> None:
        minute, counts, totals = item
        i, keep = self.idx, self.zero_keys
        self.win.append(item)
        for k, c in counts.items():
            if c[i] or keep:
                self.win_sum[k] = self.win_sum.get(k, 0) + c[i]
        self.win_total += totals[i]
        while self.win and self.win[0][0] <= minute - timedelta(minutes=self.window):
            old = self.win.popleft()
            for k, c in old[1].items():
                if c[i] or keep:
                    _add(self.win_sum, k, -c[i])
                    _add(self.base_sum, k, c[i])
                if keep:
                    self.base_rows[k] = self.base_rows.get(k, 0) + 1
            self.win_total -= old[2][i]
            self.base_total += old[2][i]
            self.base.append(old)
        while self.base and self.base[0][0] <= minute - timedelta(minutes=self.window + self.baseline):
            old = self.base.popleft()
            for k, c in old[1].items():
                if c[i]:
                    _add(self.base_sum, k, -c[i])
                if keep:
                    _add(self.base_rows, k, -1)
            self.base_total -= old[2][i]

    @property
    def baseline_minutes(self) -> int:
        return max(1, len(self.base))

    def recount(self, scopes: set[str]) -> None:
        """Recompute the sums (and rows) of ``scopes`` from the kept minutes (after :meth:`_TopicState.regroup`
        rewrote their per-minute counts)."""
        for sums in (self.win_sum, self.base_sum, self.base_rows):
            for k in scopes:
                sums.pop(k, None)
        for part, sums in ((self.win, self.win_sum), (self.base, self.base_sum)):
            for _, counts, _ in part:
                for k in scopes & counts.keys():
                    _add(sums, k, counts[k][self.idx])
                    if self.zero_keys and part is self.base:
                        self.base_rows[k] = self.base_rows.get(k, 0) + 1


def _add(sums: dict[str, int], key: str, delta: int) -> None:
    """``sums[key] += delta``, dropping the key at 0 (scopes without counts are not kept)."""
    n = sums.get(key, 0) + delta
    if n > 0:
        sums[key] = n
    else:
        sums.pop(key, None)


class _TopicState:
    """Per-minute topic counts (views, replies, visitors) of every topic and group: one :class:`_Rolling` per
    measure, views and visitors over ``window`` minutes, replies (sparse) over ``reply_window`` minutes, each
    with the ``baseline`` minutes before its own window.  ``win_sum`` / ``base_sum`` / ``win_total`` /
    ``base_total`` / ``base`` / ``window`` are the views rolling's (the view-share test and the group CUSUM)."""

    def __init__(self, window: int, baseline: int, reply_window: int | None = None) -> None:
        self.views = _Rolling(0, window, baseline, zero_keys=True)
        self.replies = _Rolling(1, max(window, reply_window or window), baseline)
        self.visitors = _Rolling(2, window, baseline)
        self.rollings = {"views": self.views, "replies": self.replies, "visitors": self.visitors}

    def push(self, minute: datetime, counts: dict[str, _Counts], totals: _Counts) -> None:
        item = (minute, counts, totals)
        for r in self.rollings.values():
            r.push(item)

    @property
    def window(self) -> int:
        return self.views.window

    @property
    def win(self) -> deque[_MinuteItem]:
        return self.views.win

    @property
    def base(self) -> deque[_MinuteItem]:
        return self.views.base

    @property
    def win_sum(self) -> dict[str, int]:
        return self.views.win_sum

    @property
    def base_sum(self) -> dict[str, int]:
        return self.views.base_sum

    @property
    def win_total(self) -> int:
        return self.views.win_total

    @property
    def base_total(self) -> int:
        return self.views.base_total

    @property
    def win_replies(self) -> dict[str, int]:
        """Replies per scope in the reply window (``topic.reply_window_minutes``)."""
        return self.replies.win_sum

    @property
    def baseline_minutes(self) -> int:
        return self.views.baseline_minutes

    def regroup(self, changed: set[str], groups: dict[str, set[int]]) -> None:
        """Recompute the per-minute counts of the ``changed`` groups in every kept minute from their members'
        topic counts (``groups``: the new membership; a group missing there is removed) and adjust every
        rolling's sums.  Each per-minute dict is rewritten once, whichever rollings hold it."""
        items: dict[int, dict[str, _Counts]] = {}
        for r in self.rollings.values():
            for part in (r.win, r.base):
                for _, counts, _ in part:
                    items[id(counts)] = counts
        diffs: dict[int, dict[str, tuple[_Counts, _Counts]]] = {}
        for key, counts in items.items():
            d: dict[str, tuple[_Counts, _Counts]] = {}
            for g in changed:
                scope = f"group:{g}"
                old = counts.pop(scope, (0, 0, 0))
                members = [counts[f"topic:{t}"] for t in groups.get(g, ()) if f"topic:{t}" in counts]
                new = (sum(m[0] for m in members), sum(m[1] for m in members), sum(m[2] for m in members))
                if any(new):
                    counts[scope] = new
                if new != old:
                    d[scope] = (old, new)
            if d:
                diffs[key] = d
        touched = {scope for d in diffs.values() for scope in d} | {f"group:{g}" for g in changed}
        for r in self.rollings.values():
            r.recount(touched)


def surge_p_value(views: int, total: int, base_share: float) -> float:
    """One-sided binomial tail ``P(X >= views)`` for ``X ~ Binomial(total, base_share)``: how likely this many of
    the window's ``total`` topic views fall on the topic/group if its share were still ``base_share``.  Small
    counts decide as soon as they are improbable (no fixed minimum count); 1.0 for ``views <= 0``."""
    from scipy.stats import binom

    if views <= 0 or total <= 0:
        return 1.0
    share = min(max(base_share, 1e-12), 1.0)
    return float(binom.sf(views - 1, max(total, views), share))


class SurgeCusum:
    """One-sided binomial CUSUM of a group's per-minute views against its baseline share.

    Each minute adds the log-likelihood ratio of ``x`` views out of ``n`` under share ``ratio × p0`` versus
    ``p0``: ``x·ln(p1/p0) + (n - x)·ln((1 - p1)/(1 - p0))``; the statistic is floored at 0 and the test fires
    when it reaches ``h``.  Evidence accumulates while a share ramps up, so a surge is found as soon as the
    views are decisive whatever the volume (a fixed window needs a fixed count).  Under the null the mean time
    between false alarms is at least ``e^h`` minutes (Wald; ``h = 10`` measured at 16-33 weeks per group for
    20-300 views per minute and a 0.35% share).  ``fired_since``: the minute after the statistic last left 0,
    the change-point estimate.  The caller :meth:`reset` s it after firing.  Misuse: ``p0`` must be in (0, 1);
    feed every minute (a minute with no views is evidence too)."""

    def __init__(self, ratio: float, h: float) -> None:
        self.ratio, self.h = ratio, h
        self.stat = 0.0
        self.since: datetime | None = None
        self.fired_stat = 0.0
        self.fired_since: datetime | None = None

    def update(self, minute: datetime, x: int, n: int, p0: float) -> bool:
        p0 = min(max(p0, 1e-9), 0.5)
        p1 = min(self.ratio * p0, 0.999)
        llr = x * math.log(p1 / p0) + (n - x) * math.log((1.0 - p1) / (1.0 - p0))
        if self.stat <= 0.0 and llr > 0.0:
            self.since = minute
        self.stat = max(0.0, self.stat + llr)
        if self.stat == 0.0:
            self.since = None
        if self.stat >= self.h:
            self.fired_stat, self.fired_since = self.stat, self.since
            return True
        return False

    def reset(self) -> None:
        self.stat, self.since = 0.0, None


TOPIC_MIN_BASELINE_MINUTES = 60
"""Minutes of baseline (views before the window) a topic surge needs before it can open.  Without it the first
minutes of the data -- the start of every warm-up -- compare each topic against the new-topic share, and a popular
topic "surges" and stays open for good (its share never falls under 1.5 x that floor)."""


class _Stat(NamedTuple):
    """One measure of one scope at one minute: its count in the measure's window, the forum's total there, the
    share and the baseline share (floored as the view share always was), the rates per minute, and how many
    minutes its baseline holds."""

    n: int  # the count in the window (not `count`: a tuple method)
    total: int
    share: float
    base_share: float
    rate: float
    base_rate: float
    window: int
    base_minutes: int


#: most distinct count tuples :class:`TopicSurgeDetector` shares before it starts afresh
_COUNTS_CACHE = 1 << 16


class TopicSurgeDetector:
    """Surges of topics and topic groups from per-minute human topic views, replies and visitors (see the module
    docstring and docs/detectors.md "Topic surge").

    Each measure of ``topic.measures`` is judged on its own: its share of the forum's total of that measure in
    its window against the scope's share over the previous ``baseline_hours``, and its rate against its own
    baseline rate, with the same ratios and binomial tail levels; replies (sparse) over ``reply_window_minutes``
    with the floor ``min_replies``.  A surge opens when any measure passes (or, for a configured group, the views
    CUSUM fires).  The measure that opened it (views first, then replies, then visitors) is the event's
    ``detail.measure``: ``observed`` / ``expected`` / the peak are its share; ``detail.measures`` lists every
    measure that passed its test while the event was open (each with its baseline share frozen then), and the
    event ends when none of them is still at ``end_share_ratio`` x its frozen baseline share (and a third of its
    count floor).  With only views passing, this is exactly the view-share detector of rules v5."""

    def __init__(self, rules: dict[str, Any], groups: dict[str, set[int]], site: str) -> None:
        self.r = rules["topic"]
        self.groups = groups
        self.site = site
        wanted = list(self.r.get("measures", MEASURES))
        unknown = set(wanted) - set(MEASURES)
        if unknown:
            raise ValueError(f"topic.measures: unknown measure(s) {sorted(unknown)} (known: {', '.join(MEASURES)})")
        self.measures = tuple(m for m in MEASURES if m in wanted)
        self.min_count = {"views": float(self.r["min_views"]), "replies": float(self.r["min_replies"]),
                          "visitors": float(self.r["min_visitors"])}
        self.state = _TopicState(int(self.r["window_minutes"]), int(self.r["baseline_hours"]) * 60,
                                 int(self.r["reply_window_minutes"]))
        self.open: dict[str, Detection] = {}
        self.cusum: dict[str, SurgeCusum] = {
            f"group:{g}": SurgeCusum(float(self.r["cusum_ratio"]), float(self.r["cusum_h"])) for g in groups}
        self._closed: dict[str, Detection] = {}
        self._bases: dict[str, dict[str, float]] = {}  # scope -> measure -> baseline share frozen when it passed
        self._pruned: datetime | None = None  # last :meth:`_prune`
        # the kept minutes (a week of baseline) hold a count tuple per scope and minute: equal tuples are shared
        # (most are a handful of small counts) and scope names interned, instead of new objects every minute (a
        # one-day history at 300 topics a minute: 1,049 -> 676 MB).  Cleared past _COUNTS_CACHE (big counts)
        self._counts_cache: dict[_Counts, _Counts] = {}

    def update(self, minute: datetime, topic_counts: Mapping[int, tuple[int, ...]],
               total_views: int) -> Iterator[Detection]:
        """Feed one minute.  ``topic_counts``: topic id -> ``(views, replies[, visitors])`` of the minute (visitors
        = distinct human visitors of the topic in the minute; 0 when absent); ``total_views``: the forum's human
        topic views of the minute (the view share's denominator).  The reply and visitor shares' denominators
        are the sums over ``topic_counts``."""
        if self._pruned is None or minute - self._pruned >= timedelta(hours=1):
            self._prune(minute)
        counts: dict[str, _Counts] = {}
        rep_total = vis_total = 0
        shared = self._counts_cache
        if len(shared) > _COUNTS_CACHE:
            shared.clear()
        for t, c in topic_counts.items():
            cc = (int(c[0]), int(c[1]) if len(c) > 1 else 0, int(c[2]) if len(c) > 2 else 0)
            rep_total += cc[1]
            vis_total += cc[2]
            counts[sys.intern(f"topic:{t}")] = shared.setdefault(cc, cc)
        for g, members in self.groups.items():
            got = [counts[f"topic:{t}"] for t in members if f"topic:{t}" in counts]
            gc = (sum(m[0] for m in got), sum(m[1] for m in got), sum(m[2] for m in got))
            if any(gc):
                counts[sys.intern(f"group:{g}")] = shared.setdefault(gc, gc)
        st = self.state
        fired: dict[str, tuple[float, datetime]] = {}
        # sequential evidence per group, against the share before this minute -- only once the baseline is long
        # enough for a surge to open: evidence gathered against a few minutes' share would otherwise carry
        # through the gate and open a surge at its first minute (at every start of the data or of a warm-up)
        # (the hour counted is what is left of the baseline at this minute: this minute's push drops the minutes
        # older than window + baseline -- all of them after a gap longer than that -- and moves the window's oldest
        # minute in, hence the 59 newest that stay)
        span = timedelta(minutes=st.views.window + st.views.baseline)
        if st.base_total > 0 and len(st.base) >= TOPIC_MIN_BASELINE_MINUTES \
                and st.base[-(TOPIC_MIN_BASELINE_MINUTES - 1)][0] > minute - span:
            floor = float(self.r["new_topic_share"])
            for scope, cs in self.cusum.items():
                if scope in self.open:
                    continue
                # floored at the new-topic share: a group with (almost) no baseline views must not fire on a
                # trickle (a handful of views over a week gives a share estimate near 0)
                p0 = max(st.base_sum.get(scope, 0) / st.base_total, floor)
                x = counts.get(scope, (0, 0, 0))[0]
                if cs.update(minute, x, max(total_views, x), p0):
                    fired[scope] = (cs.fired_stat, cs.fired_since or minute)
        else:  # no baseline (the start, or after a gap longer than it): evidence from before it is against nothing
            for scope, cs in self.cusum.items():
                if scope not in self.open:
                    cs.reset()
        st.push(minute, counts, (total_views, rep_total, vis_total))
        ratio = float(self.r["share_ratio"])
        end_ratio = float(self.r["end_share_ratio"])
        judged = ("views", *(m for m in self.measures if m != "views"))
        # the scopes judged: open, fired, or with a measure at its count floor and at the share floor (the first
        # two conditions of :meth:`_passes`, the same arithmetic as :meth:`_stat`); any other scope cannot open,
        # and on a forum with hundreds of topics a minute that is nearly all of them
        scopes = set(self.open) | set(fired)
        min_share = float(self.r["min_share"])
        for m in self.measures:
            r, mc = st.rollings[m], self.min_count[m]
            tot = max(r.win_total, 1)
            scopes.update(k for k, c in r.win_sum.items() if c >= mc and c / tot >= min_share)
        for scope in sorted(scopes):
            det = self.open.get(scope)
            stats = {m: self._stat(m, scope) for m in judged}
            if det is None:
                passed = [m for m in self.measures if self._passes(m, scope, stats[m])]
                cusum = scope in fired and stats["views"].base_minutes >= TOPIC_MIN_BASELINE_MINUTES
                if not passed and not cusum:
                    continue
                lead = "views" if ("views" in passed or cusum) else passed[0]
                crossed = (["views"] if lead == "views" and "views" not in passed else []) + passed
                det = self._reopen(scope, minute)
                if det is None:
                    s = stats[lead]
                    bases = {m: stats[m].base_share for m in crossed}
                    self._bases[scope] = bases
                    det = Detection("topic_surge", scope, minute, None, minute, s.share, s.base_share,
                                    min(1.0, s.share / s.base_share / (2 * ratio)), "surge",
                                    self._detail(scope, lead, stats, bases), site=self.site)
                    det.detail["peak_share"] = round(s.share, 5)
                    det.detail["trigger"] = "cusum" if lead == "views" and "views" not in passed else "window"
                    det.detail["measure"] = lead
                    det.detail["measures"] = crossed
                    if scope in fired:
                        stat, since = fired[scope]
                        det.detail["cusum"] = round(stat, 2)
                        det.detail["change_from"] = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                else:
                    self._cross(scope, det, [m for m in crossed if m not in self._bases.setdefault(scope, {})],
                                stats)
                self.open[scope] = det
                if scope in self.cusum:
                    self.cusum[scope].reset()
                yield det
                continue
            lead = str(det.detail.get("measure", "views"))
            bases = self._bases.setdefault(scope, {lead: det.expected})
            s = stats[lead]
            if s.share > det.observed:
                det.observed, det.peak_ts = s.share, minute
                det.score = max(det.score, min(1.0, s.share / det.expected / (2 * ratio)))
                det.detail.update(self._detail(scope, lead, stats, bases))
                det.detail["peak_share"] = round(s.share, 5)
                yield det
            new = [m for m in self.measures if m not in bases and self._passes(m, scope, stats[m])]
            if new:  # another measure surges too: named, and the event lasts while any of them does
                self._cross(scope, det, new, stats)
                yield det
            if not any(stats[m].share >= end_ratio * b and stats[m].n >= self.min_count[m] / 3
                       for m, b in bases.items() if m in stats):
                det.end, det.state = self._end(scope, det, [m for m in bases if m in stats], minute), "closed"
                del self.open[scope]
                self._closed[scope] = det
                yield det

    def _end(self, scope: str, det: Detection, measures: list[str], minute: datetime) -> datetime:
        """The end of ``scope``'s event that closes at ``minute``: the minute after the last one with a count of any
        of its ``measures`` in that measure's window (the window's first minute when it holds none), when earlier
        than ``minute`` (never before the start or the peak).  A surge that stops at once closes only when its
        windows' shares fall, up to a window later (30 minutes for replies); its end is when the counts stopped.  A
        surge that fades keeps counts to the last minute, so its end is ``minute``."""
        end: datetime | None = None
        for m in measures:
            r = self.state.rollings[m]
            if not r.win:
                return minute
            stop = r.win[0][0]  # no count in the window: they stopped before it
            for item_minute, counts, _ in reversed(r.win):
                c = counts.get(scope)
                if c is not None and c[r.idx] > 0:
                    stop = item_minute + timedelta(minutes=1)
                    break
            end = stop if end is None else max(end, stop)
        if end is None or end >= minute:
            return minute
        return max(end, det.start, det.peak_ts)

    def _cross(self, scope: str, det: Detection, new: list[str], stats: dict[str, _Stat]) -> None:
        """Measures ``new`` passed their test while ``scope``'s event is open (or reopens): freeze their baseline
        shares, name them in ``detail.measures``, refresh ``detail.by_measure`` and the score."""
        if not new:
            return
        bases = self._bases.setdefault(scope, {})
        for m in new:
            bases[m] = stats[m].base_share
        det.detail["measures"] = [*det.detail.get("measures", []), *new]
        det.detail["by_measure"] = self._by_measure(stats, bases)
        ratio = float(self.r["share_ratio"])
        det.score = max(det.score, *(min(1.0, stats[m].share / bases[m] / (2 * ratio)) for m in new))

    def _stat(self, measure: str, scope: str) -> _Stat:
        r = self.state.rollings[measure]
        c = r.win_sum.get(scope, 0)
        floor = float(self.r["new_topic_share"])
        base_share = r.base_sum.get(scope, 0) / r.base_total if r.base_total > 0 and r.seen(scope) else floor
        return _Stat(c, r.win_total, c / max(r.win_total, 1), max(base_share, floor / 10), c / r.window,
                     r.base_sum.get(scope, 0) / r.baseline_minutes, r.window, len(r.base))

    def _passes(self, measure: str, scope: str, s: _Stat) -> bool:
        """The window test of one measure: enough baseline, count floor, share floor, share and rate ratios, and
        the binomial tail at the scope family's level."""
        return (s.base_minutes >= TOPIC_MIN_BASELINE_MINUTES and s.n >= self.min_count[measure]
                and s.share >= self.r["min_share"] and s.share >= self.r["share_ratio"] * s.base_share
                and s.rate >= self.r["rate_ratio"] * max(s.base_rate, 1e-9)
                and surge_p_value(s.n, s.total, s.base_share) <= self._max_p(scope))

    def set_groups(self, groups: dict[str, set[int]]) -> None:
        """Replace the configured groups (live: ``topic_groups`` or the topic titles changed).  A new group, or one
        whose members changed, gets its per-minute counts in the kept windows and baselines recomputed from its
        members' topic counts, so it is judged against its history as if it had always had these members (a new
        group does not "surge" from the new-topic floor); its CUSUM restarts.  A removed group is no longer
        counted (an open surge of it closes at the next minute, its counts being 0)."""
        changed = {g for g in set(groups) | set(self.groups) if groups.get(g) != self.groups.get(g)}
        if not changed:
            return
        self.state.regroup(changed, groups)
        for g in changed:
            scope = f"group:{g}"
            if g in groups:
                self.cusum[scope] = SurgeCusum(float(self.r["cusum_ratio"]), float(self.r["cusum_h"]))
            else:
                self.cusum.pop(scope, None)
        self.groups = {g: set(m) for g, m in groups.items()}

    def _prune(self, minute: datetime) -> None:
        """Forget closed surges that can no longer reopen (ended more than ``merge_minutes`` before ``minute``) and
        the frozen baselines of scopes neither open nor able to reopen: one entry per topic that ever surged
        would otherwise be kept for good."""
        merge = timedelta(minutes=int(self.r["merge_minutes"]))
        self._closed = {k: d for k, d in self._closed.items() if d.end is None or minute - d.end <= merge}
        self._bases = {k: b for k, b in self._bases.items() if k in self.open or k in self._closed}
        self._pruned = minute

    def _reopen(self, scope: str, minute: datetime) -> Detection | None:
        """The event of ``scope`` that closed at most ``merge_minutes`` ago, reopened (same id): a surge whose
        share dips under the end level for a few minutes at low volume is one event, not several."""
        prev = self._closed.get(scope)
        if prev is None or prev.end is None or minute - prev.end > timedelta(minutes=int(self.r["merge_minutes"])):
            return None
        del self._closed[scope]
        prev.end, prev.state = None, "open"
        return prev

    def _max_p(self, scope: str) -> float:
        """Per-family test level: configured groups are a handful of pre-declared watch items, topics are
        thousands of simultaneous tests, so topics need the stricter level (Bonferroni-style)."""
        return float(self.r["group_max_p"] if scope.startswith("group:") else self.r["max_p"])

    def _detail(self, scope: str, lead: str, stats: dict[str, _Stat], bases: dict[str, float]) -> dict[str, Any]:
        """``views`` (in the view window), ``replies`` (in the reply window), the leading measure's share, baseline
        share (frozen when it passed), magnitude, rates and window, and ``by_measure``."""
        s = stats[lead]
        b = bases.get(lead, s.base_share)
        return {"views": stats["views"].n, "replies": self.state.replies.win_sum.get(scope, 0),
                "share": round(s.share, 5), "baseline_share": round(b, 6), "magnitude": round(s.share / b, 2),
                "rate_per_min": round(s.rate, 2), "baseline_rate_per_min": round(s.base_rate, 4),
                "window_minutes": s.window, "by_measure": self._by_measure(stats, bases)}

    @staticmethod
    def _by_measure(stats: dict[str, _Stat], bases: dict[str, float]) -> dict[str, dict[str, Any]]:
        """Observed and expected figures of every judged measure (``count``: views, replies, or visitor-minutes in
        the measure's window; ``baseline_share``: frozen for a measure that passed its test in this event)."""
        out = {}
        for m in MEASURES:
            if m not in stats:
                continue
            s = stats[m]
            b = bases.get(m, s.base_share)
            out[m] = {"count": s.n, "share": round(s.share, 5), "baseline_share": round(b, 6),
                      "magnitude": round(s.share / b, 2), "rate_per_min": round(s.rate, 3),
                      "baseline_rate_per_min": round(s.base_rate, 4), "window_minutes": s.window}
        return out


# ------------------------------------------------------------------------------------------------ transfer


class TransferDetector:
    """``transfer_regression``: median transfer rate of large responses per (origin_host, upstream, size_class)
    against the median of the previous ``baseline_hours`` of windows; ``latency_regression``: p95 response time of
    the common small classes.  Windows that are part of a regression stay out of the baseline.

    Transfer windows are judged by *evidence*, not by a count floor (rules v3): a window whose median rate is at
    most ``rate_drop_ratio`` x baseline is "low"; under no regression that needs at least half of its ``n``
    responses under ``rate_drop_ratio`` x baseline, each with probability ``q`` (see :meth:`tail_share`), so its
    probability is the binomial tail ``P(X >= ceil(n/2) | n, q)``.  The tails of consecutive low windows are
    multiplied; the regression opens when the product is at most ``max_p`` (start = first low window), and a
    window that is not low resets it.  A median of 3 responses is weak evidence (``q`` = 5%: 7e-3), 20 responses
    are strong (1e-8), a run of low windows adds up.  Guarantee: one window counts once; windows are fed in order."""

    def __init__(self, rules: dict[str, Any], site: str) -> None:
        self.rules = {"transfer_regression": rules["transfer"], "latency_regression": rules["latency"]}
        self.site = site
        self.history: dict[tuple[str, str], deque[float]] = {}
        self.lower: dict[tuple[str, str], deque[float]] = {}  # baseline windows' q05 / median (enough responses)
        self.pending: dict[tuple[str, str], int] = {}
        self.evidence: dict[tuple[str, str], tuple[float, datetime, int]] = {}  # log10 p, first low window, n
        self.open: dict[tuple[str, str], Detection] = {}
        # creep (rules v5): every counted window (end, value, inside a regression) back to creep_ref_to_days, the
        # first window seen per key (no creep is judged before the history reaches that far back), the run of
        # windows over the creep threshold, and the open creep regressions (their reference frozen at opening)
        self.long: dict[tuple[str, str], deque[tuple[datetime, float, bool]]] = {}
        self.first_seen: dict[tuple[str, str], datetime] = {}
        self.creep_run: dict[tuple[str, str], int] = {}
        self.creep_open: dict[tuple[str, str], Detection] = {}

    def tail_share(self, key: tuple[str, str]) -> float:
        """``q``: share of single responses expected under ``rate_drop_ratio`` x the baseline median.  From the
        baseline windows with at least ``tail_min_requests`` responses, the median ratio q05 / median gives a
        log-normal left tail (sigma = ln(median / q05) / 1.645); ``q`` is that tail at the drop ratio, never under
        ``tail_share`` (5%: a lower tail as wide as the class's own spread is assumed when the baseline says less
        or has no large windows)."""
        r = self.rules["transfer_regression"]
        floor = float(r["tail_share"])
        lows = self.lower.get(key)
        if not lows:
            return floor
        lo = sorted(lows)[len(lows) // 2]
        if lo >= r["rate_drop_ratio"] or lo <= 0.0:
            return floor
        sigma = math.log(1.0 / lo) / 1.6449
        return max(floor, 0.5 * math.erfc(math.log(1.0 / float(r["rate_drop_ratio"])) / sigma / math.sqrt(2.0)))

    def update(self, kind: str, window_end: datetime,
               rows: list[tuple[str, str, str, int, float]] | list[tuple[str, str, str, int, float, float]]
               ) -> Iterator[Detection]:
        """``rows``: (origin_host, upstream, size_class, requests, value[, q05]) of one window, value = median rate
        (B/s) and q05 its 5% quantile for ``transfer_regression``, p95 elapsed (ms) for ``latency_regression``."""
        r = self.rules[kind]
        keep = int(r["baseline_hours"]) * 60 // int(r["window_minutes"])
        for row in rows:
            host, upstream, size_class, n, value = row[:5]
            key = (kind, f"{host}|{upstream or '-'}|{size_class}")
            hist = self.history.setdefault(key, deque(maxlen=keep))
            if n < r["min_requests"]:
                continue
            bad = False
            if len(hist) >= r["min_baseline_windows"]:
                base = sorted(hist)[len(hist) // 2]
                if kind == "transfer_regression":
                    bad = value <= r["rate_drop_ratio"] * base
                    yield from self._check_transfer(key, window_end, value, base, bad, n, r)
                else:
                    bad = value >= r["latency_rise_ratio"] * base and value - base >= r["min_rise_ms"]
                    yield from self._check(key, window_end, value, base, bad, n, r)
            yield from self._creep(key, window_end, float(value), n, r, bad or key in self.open)
            if not bad and key not in self.open:
                hist.append(value)
                if kind == "transfer_regression" and len(row) > 5 and n >= r["tail_min_requests"] and value > 0:
                    self.lower.setdefault(key, deque(maxlen=keep)).append(float(row[5]) / value)

    def _creep(self, key: tuple[str, str], ts: datetime, value: float, n: int, r: dict[str, Any],
               flagged: bool) -> Iterator[Detection]:
        """Creeping regressions (rules v5), which the 24-hour baseline follows and never reports: the *level* (median
        of the windows of the last ``creep_level_hours``, a whole day, so the daily cycle cancels) against an
        *anchored* reference: the median of the windows ``creep_ref_from_days`` to ``creep_ref_to_days`` back,
        or, when it is the more conservative, the level of the same hours one week back (the weekly cycle
        cancels).  Latency: level >= ``creep_ratio`` x reference and ``creep_min_rise_ms`` more; transfer: level
        <= reference / ``creep_ratio``.  Held for ``creep_confirm_windows`` windows it opens (start = first window
        of the run, ``detail.trigger = creep``); the reference is frozen while it is open, and the event closes
        when the level is back under the threshold.  Windows inside any regression stay out of the reference.
        Nothing is judged before the key's history reaches ``creep_ref_to_days`` back, or while a short-term
        regression of the key is open (it already reports the change, against its own frozen baseline)."""
        if "creep_ratio" not in r:
            return
        rise = key[0] == "latency_regression"
        hist = self.long.setdefault(key, deque())
        in_creep = key in self.creep_open
        hist.append((ts, value, flagged or in_creep))
        first = self.first_seen.setdefault(key, ts)
        ref_to = timedelta(days=float(r["creep_ref_to_days"]))
        while hist and hist[0][0] < ts - ref_to:
            hist.popleft()
        if ts - first < ref_to:
            return
        span = timedelta(hours=float(r["creep_level_hours"]))
        ref_end = ts - timedelta(days=float(r["creep_ref_from_days"]))
        week = ts - timedelta(days=7)
        level_vals = [v for t, v, _ in hist if t > ts - span]
        ref_vals = [v for t, v, f in hist if t <= ref_end and not f]
        week_vals = [v for t, v, f in hist if week - span < t <= week and not f]
        min_level = int(r["creep_min_level_windows"])
        det = self.creep_open.get(key)
        if len(level_vals) < min_level or (det is None and len(ref_vals) < int(r["creep_min_ref_windows"])):
            return
        level = _median(level_vals)
        if det is not None:
            ref = det.expected  # frozen at opening (the windows since are inside the regression)
        else:
            ref = _median(ref_vals)
            if len(week_vals) >= min_level:
                ref = max(ref, _median(week_vals)) if rise else min(ref, _median(week_vals))
        ratio = float(r["creep_ratio"])
        if rise:
            bad = level >= ratio * ref and level - ref >= float(r.get("creep_min_rise_ms", 0.0))
        else:
            bad = ref > 0 and level <= ref / ratio
        rel = _ratio(level, ref)
        if det is not None:
            if (level > det.observed) if rise else (level < det.observed):
                det.observed, det.peak_ts = level, ts
                det.detail["ratio"] = _round(rel)
            if (value >= ratio * ref and value - ref >= float(r.get("creep_min_rise_ms", 0.0)) if rise
                    else value <= ref / ratio):
                det.detail["_last_bad"] = ts  # this window on its own is still over the threshold
            if not bad:
                # the level is a day's median: it comes back about half a day after the windows did; the
                # regression ended with the last window over the threshold on its own (the end of that window)
                det.end, det.state = max(det.start, det.detail.pop("_last_bad", ts)), "closed"
                del self.creep_open[key]
                self.creep_run[key] = 0
                yield det
            return
        if key in self.open:
            self.creep_run[key] = 0
            return
        run = self.creep_run[key] = self.creep_run.get(key, 0) + 1 if bad else 0
        confirm = int(r["creep_confirm_windows"])
        if run < confirm:
            return
        self.creep_run[key] = 0
        w = timedelta(minutes=int(r["window_minutes"]))
        det = Detection(key[0], key[1], ts - w * confirm, None, ts, level, ref, _ratio_score(rel), "regression",
                        {"metric": "bytes_per_s_p50" if not rise else "elapsed_ms_p95", "trigger": "creep",
                         "ratio": _round(rel), "requests": n, "level_hours": float(r["creep_level_hours"]),
                         "reference_days": [float(r["creep_ref_from_days"]), float(r["creep_ref_to_days"])],
                         "confirmed_at": ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                        site=self.site)
        self.creep_open[key] = det
        yield det

    def _check_transfer(self, key: tuple[str, str], ts: datetime, obs: float, exp: float, bad: bool, n: int,
                        r: dict[str, Any]) -> Iterator[Detection]:
        w = timedelta(minutes=int(r["window_minutes"]))
        if key in self.open:
            yield from self._check(key, ts, obs, exp, bad, n, r)
            return
        if not bad:
            self.evidence.pop(key, None)
            return
        from scipy.stats import binom  # scipy ships with statsmodels (a pinned dependency)

        q = self.tail_share(key)
        log_p = float(binom.logsf(math.ceil(n / 2) - 1, n, q)) / math.log(10.0)
        prev = self.evidence.get(key)
        total, first, n_all = (prev[0] + log_p, prev[1], prev[2] + n) if prev else (log_p, ts - w, n)
        self.evidence[key] = (total, first, n_all)
        if total > math.log10(float(r["max_p"])):
            return
        del self.evidence[key]
        ratio = _ratio(obs, exp)
        det = Detection(key[0], key[1], first, None, ts, obs, exp, _ratio_score(ratio), "regression",
                        {"metric": "bytes_per_s_p50", "ratio": _round(ratio), "requests": n,
                         "requests_in_run": n_all, "log10_p": round(total, 2), "tail_share": round(q, 4),
                         "confirmed_at": ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
                        site=self.site)
        self.open[key] = det
        yield det

    def _check(self, key: tuple[str, str], ts: datetime, obs: float, exp: float, bad: bool, n: int,
               r: dict[str, Any]) -> Iterator[Detection]:
        det = self.open.get(key)
        ratio = _ratio(obs, exp)
        metric = "bytes_per_s_p50" if key[0] == "transfer_regression" else "elapsed_ms_p95"
        if det is None:
            self.pending[key] = self.pending.get(key, 0) + 1 if bad else 0
            if bad and self.pending[key] >= int(r["confirm_windows"]):
                start = ts - timedelta(minutes=int(r["window_minutes"]) * int(r["confirm_windows"]))
                det = Detection(key[0], key[1], start, None, ts, obs, exp, _ratio_score(ratio), "regression",
                                {"metric": metric, "ratio": _round(ratio), "requests": n}, site=self.site)
                self.open[key] = det
                self.pending[key] = 0
                yield det
            return
        worse = obs < det.observed if key[0] == "transfer_regression" else obs > det.observed
        # the worst window is one with as many responses as the current worst's, or with enough for a rate to mean
        # something (tail_min_requests): a window of one slow response is no worse a regression (trial 30)
        if worse and n >= min(int(r.get("tail_min_requests", 0)), int(det.detail.get("requests", 0))):
            det.observed, det.peak_ts = obs, ts
            det.detail["ratio"] = _round(ratio)
            det.detail["requests"] = n  # of the window `observed` comes from (was: of the opening window)
        if not bad:
            # ts is the end of the window that recovered: the regression ended where that window began
            det.end, det.state = ts - timedelta(minutes=int(r["window_minutes"])), "closed"
            del self.open[key]
            yield det


def _ratio(observed: float, expected: float) -> float | None:
    """observed / expected; None when the baseline is 0 (a cache host logging 0 ms, whose p95 is 0: the ratio
    was ``inf`` and printed as ``Infinity``, which is no JSON)."""
    return observed / expected if expected else None


def _ratio_score(ratio: float | None) -> float:
    return 1.0 if ratio is None else min(1.0, abs(1 - ratio))


def _round(ratio: float | None) -> float | None:
    return None if ratio is None else round(ratio, 3)


def _median(values: list[float]) -> float:
    """Median (mean of the two middle values for an even count)."""
    v = sorted(values)
    k = len(v) // 2
    return v[k] if len(v) % 2 else 0.5 * (v[k - 1] + v[k])


def _reported(dets: Iterable[Detection], at: datetime) -> list[Detection]:
    """``dets`` with the data minute at which each was first reported kept in ``detail["_reported"]`` (hidden:
    not printed, not stored).  ``start`` is back-dated to where the event began; this is when a detector fed
    minute by minute could first say so, which is what the evaluation's detection delays measure."""
    out = list(dets)
    for d in out:
        d.detail.setdefault("_reported", at)
    return out


def _first_report(prev: Detection | None, d: Detection) -> Detection:
    """``d`` (a later state of ``prev``'s event) keeping the earliest ``_reported`` of the two."""
    if prev is not None and "_reported" in prev.detail:
        first = prev.detail["_reported"]
        if "_reported" not in d.detail or first < d.detail["_reported"]:
            d.detail["_reported"] = first
    return d


#: an open ``pipeline_gap`` whose sources heartbeat again closes once they have done so this long (and ends the
#: minute before they came back); lines returning meanwhile close it as lines always did
HEARTBEATS_BACK_CONFIRM = timedelta(minutes=2)

#: a network listener's entry in a set of fresh sources (``_fresh_sources``, :meth:`HeartbeatLog.at`), never a
#: source's ``host/file``: the prefix, then site (the listener's: the site or ``*``), collector host and label,
#: tab-separated (no host name holds a tab) (:func:`listener_key`)
LISTENER_KEY = "\tlistener\t"


def listener_key(site: str, host: str, label: str) -> str:
    """The entry of listener ``label`` (``tcp:5140``, ``syslog:5514``...) of collector ``host`` for ``site``."""
    return f"{LISTENER_KEY}{site}\t{host}\t{label}"


def parse_listener_key(key: str) -> tuple[str, str, str]:
    """(site, collector host, label) of a :func:`listener_key` entry; not for a source's ``host/file``."""
    site, host, label = key[len(LISTENER_KEY):].split("\t")
    return site, host, label


def sources_only(fresh: set[str]) -> set[str]:
    """``fresh`` without its listener entries: the heartbeats of the site's own sources and hosts (a listener
    receiving heartbeat-less senders is no evidence that the *site* is up: see :meth:`SourceGapDetector.tail`)."""
    return {k for k in fresh if not k.startswith(LISTENER_KEY)}


def _retired_detail(at: datetime) -> dict[str, str]:
    """What a gap closed by a retirement at ``at`` says of it."""
    return {"closed_by": "retired", "retired_at": at.isoformat().replace("+00:00", "Z")}


def _last_before_retirement(at: datetime) -> datetime:
    """The last minute a retirement at ``at`` leaves to a gap (the minute before ``at``'s minute)."""
    return at.replace(second=0, microsecond=0) - timedelta(minutes=1)


def _close_by_retirement(det: Detection, at: datetime) -> Detection:
    """``det`` (an open ``pipeline_gap``, of a source or of a site) closed where the retirement at ``at``
    begins: its end the minute before, never before its start."""
    det.end = max(det.start, _last_before_retirement(at))
    det.state = "closed"
    det.detail.pop("_back_since", None)
    det.detail.update(_retired_detail(at))
    return det


def _whole_silence(det: Detection) -> Detection:
    """A source gap that closed: ``expected`` covers its whole silence at the rate it opened with, and
    ``detail.minutes`` says how long it was, as a gap found closed (history) says.  It kept the figure of the
    minute it opened (10 minutes' lines for a silence of 2 hours: user trial 40)."""
    rate = det.detail.pop("_rate", None)
    if det.end is not None:
        minutes = int((det.end - det.start).total_seconds() // 60) + 1
        det.detail["minutes"] = minutes
        if rate is not None:
            det.expected = rate * minutes
    return det


#: how far back a restarted live run reads to see the start of a pipeline_gap still open in the store (days)
GAP_WARM_DAYS = 92


class SourceGapDetector:
    """Per log source (origin_host/origin_file): a silence of at least ``gap_min_minutes`` when the source's rate
    over the hour before predicts at least ``gap_min_expected`` lines is a ``pipeline_gap`` (scope
    ``source:<host>/<file>``).  Live: a source silent up to now whose heartbeat is fresh is *not* a gap (it is
    alive; the site-level detectors judge the traffic) -- neither while it lasts nor when its lines come back: a
    silence through which the source was seen heartbeating at an evaluated time (:meth:`alive`) is not reported
    when it ends.

    A source that never heartbeats (a network sender: raw TCP/UDP, syslog without forwarded MARKs) has only its
    collector's *listener* heartbeats for evidence, as in ``source_status``: its silence is still a gap when its
    rate said lines were due (ops must hear that a busy sender stopped), but one that opens while every listener
    that may receive it (``contracts.covering_listeners``, as for ``source_status``: the listener named by a raw
    source's label, every multi-site listener for a syslog program) is up -- and each that was up at the minute
    after its last line still is -- says so: ``reason: source silent, its listener up``, ``detail.liveness:
    quiet``, ``detail.listeners`` (the sender is idle or gone; the collector is not the place to look).  ``GET
    /fp/sources`` shows it ``quiet``.  Such a gap does not close when listener heartbeats go on (they never
    stopped); it closes with its lines.

    A source ops retired (:attr:`retired`, ``forumpulse sources retire``) and silent since: its open gap closes
    where the retirement begins, and no gap opens for it after that (:meth:`_retire`)."""

    def __init__(self, rules: dict[str, Any], site: str) -> None:
        self.h = rules["health"]
        self.site = site
        self.recent: dict[str, deque[tuple[datetime, int]]] = {}
        self.open: dict[str, Detection] = {}
        # the first minute at which :meth:`tail` can open a gap for each source (its last line fixes it), and the
        # earliest of them: a history run calls ``tail`` every minute, and must not rescan every source each time
        self._due: dict[str, datetime] = {}
        self.next_due = datetime.min.replace(tzinfo=UTC)
        # the latest evaluated time at which each silent source was seen heartbeating (:meth:`alive`)
        self._alive: dict[str, datetime] = {}
        #: the site's sources (``host/file``) and hosts (``host/``) that ever sent a heartbeat (``source_liveness``,
        #: set by each run): judged by their heartbeats alone, never by a listener's (as ``source_status`` does)
        self.heartbeating: set[str] = set()
        # sources fed lines since the last :meth:`tail`, and the listeners up at the minute after each one's last
        # line (judged: from the heartbeats of that minute); a quiet gap needs each of them still up
        self._fed: list[str] = []
        self._line_cover: dict[str, frozenset[str]] = {}
        #: sources ops retired (``source_retired``, migration 0011; :meth:`set_retired` by each run):
        #: ``host/file`` -> retired_at
        self.retired: dict[str, datetime] = {}

    def set_retired(self, retired: dict[str, datetime]) -> None:
        """The retirements as read by a run.  A change (one undone) rescans every source at the next
        :meth:`tail`: nothing about a retired source is forgotten, so an undone one is judged as before."""
        if retired != self.retired:
            self.retired = dict(retired)
            self.next_due = datetime.min.replace(tzinfo=UTC)

    def _retired(self, src: str, until: datetime) -> datetime | None:
        """When ``src`` was retired, if it is at ``until``: retired by then, and its last line's minute before
        the retirement's minute rounded up (a line earlier in that minute is before it: as the status page,
        :func:`forumpulse.pipeline.sources.retired_after`)."""
        at = self.retired.get(src)
        if at is None or at > until:
            return None
        q = self.recent.get(src)
        return at if q and q[-1][0] < retirement_minute(at) else None

    def site_retired(self, until: datetime) -> datetime | None:
        """The site's latest retirement when every source sending in the hour before the site's last line is
        retired at ``until`` (retired by then, its last line before the retirement's minute rounded up): the
        site is gone, so its silence is neither a ``pipeline_gap`` nor zeros for an outage.  A source that had
        stopped an hour or more before the others is not asked (retired or not: every process, however long it
        has run, judges the same sources).  Exact only with the lines before ``until`` fed and none after:
        ``TrafficDetector._feed`` asks it in its minute loop for a window's minutes, and at the window's end."""
        if not self.retired or not self.recent:
            return None
        latest = max(q[-1][0] for q in self.recent.values() if q)
        ats: list[datetime] = []
        for src, q in self.recent.items():
            if not q or q[-1][0] <= latest - timedelta(minutes=60):
                continue
            at = self.retired.get(src)
            if at is None or at > until or q[-1][0] >= retirement_minute(at):
                return None
            ats.append(at)
        return max(ats) if ats else None

    def _retire(self, until: datetime) -> Iterator[Detection]:
        """The open gaps of the sources retired at ``until``, closed where the retirement begins
        (``detail.closed_by = retired``; the end the minute before it, never before the start)."""
        for src in [s for s in self.open if s in self.retired]:
            at = self._retired(src, until)
            if at is None:
                continue
            yield _whole_silence(_close_by_retirement(self.open.pop(src), at))

    def _cover(self, src: str, fresh: set[str]) -> frozenset[str]:
        """The listener entries of ``fresh`` that may receive ``src`` (``contracts.covering_listeners``), for a
        source that never heartbeats (itself or its host) and is no followed file; else none."""
        host, _, label = src.partition("/")
        if src in self.heartbeating or host + "/" in self.heartbeating:
            return frozenset()
        ls = {k: parse_listener_key(k) for k in fresh if k.startswith(LISTENER_KEY)}
        return frozenset(covering_listeners(self.site, label, ls, lambda k: (ls[k][0], ls[k][2])))

    def _expected(self, src: str, last: datetime, silent: int) -> float:
        hist = [n for m, n in self.recent.get(src, ()) if m > last - timedelta(minutes=60)]
        return sum(hist) / 60.0 * silent

    def _site_share(self, src: str, last: datetime, until: datetime) -> float:
        """``src``'s share of the site's lines: its lines in the hour up to its last line against those plus the
        latest hour of every other source not in a gap nor retired at ``until`` (each source keeps its own last
        hour: a quiet source's gap can open an hour or more into its silence)."""
        mine = sum(n for m, n in self.recent.get(src, ()) if m > last - timedelta(minutes=60))
        others = sum(n for k, q in self.recent.items() if k != src and k not in self.open
                     and (not self.retired or self._retired(k, until) is None) for _, n in q)
        return mine / (mine + others) if mine + others > 0 else 1.0

    def update(self, src: str, minute: datetime, n: int) -> Iterator[Detection]:
        q = self.recent.setdefault(src, deque())
        gap_min = int(self.h["gap_min_minutes"])
        if src in self.open:
            det = self.open.pop(src)
            det.end, det.state = minute - timedelta(minutes=1), "closed"
            yield _whole_silence(det)
        elif q and minute - q[-1][0] > timedelta(minutes=gap_min) and self._retired(src, minute) is None:
            # (a source back after its retirement: the retirement covered the silence, closing any gap of it)
            last = q[-1][0]
            silent = int((minute - last).total_seconds() // 60) - 1
            exp = self._expected(src, last, silent)
            # heartbeats seen during the silence: the source was alive (an outage is the site detectors' call)
            seen_alive = self._alive.get(src, last) > last + timedelta(minutes=1)
            if exp >= float(self.h["gap_min_expected"]) and not seen_alive:
                yield Detection("pipeline_gap", f"source:{src}", last + timedelta(minutes=1),
                                minute - timedelta(minutes=1), last + timedelta(minutes=1), 0.0, exp, 1.0,
                                "pipeline_gap", {"reason": "source silent", "minutes": silent,
                                                 "liveness": "unknown",
                                                 "site_share": round(self._site_share(src, last, minute), 4)},
                                site=self.site, state="closed")
        q.append((minute, n))
        self._fed.append(src)
        self._line_cover.pop(src, None)
        self._alive.pop(src, None)  # lines again: a later silence needs heartbeats of its own
        while q and q[0][0] <= minute - timedelta(minutes=60):
            q.popleft()
        due = minute + timedelta(minutes=gap_min + 1)
        self._due[src] = due
        self.next_due = min(self.next_due, due)

    def alive(self, until: datetime, fresh: set[str],
              grew: Callable[[str, datetime, datetime], bool] | None = None) -> None:
        """Note the sources silent at ``until`` (no line in the minute before it) that heartbeat then (``fresh``:
        their own heartbeat or their host's, evidence of liveness at ``until``): their silence is not a gap when
        their lines come back.  Called at a time whose heartbeats are known: the end of a live run's window (where
        they were read), or a minute judged with the heartbeat log -- never for an earlier minute with the
        heartbeats of a later time (a heartbeat now says nothing about then).
        ``grew(src, last line minute, until)``: the source's file grew meanwhile -- written but not read, so not
        alive whatever its heartbeats say."""
        for src, q in self.recent.items():
            if q and q[-1][0] < until - timedelta(minutes=1) and (
                    src in fresh or src.split("/", 1)[0] + "/" in fresh) and not (
                    grew is not None and grew(src, q[-1][0], until)):
                self._alive[src] = until

    def tail(self, until: datetime, fresh: set[str], judged: bool = True,
             grew: Callable[[str, datetime, datetime], bool] | None = None) -> Iterator[Detection]:
        """Sources silent from their last line up to ``until`` (exclusive) and without a fresh heartbeat, or
        whose file grew meanwhile (``grew(src, last line minute, until)``: written, not read -- a stuck shipper).
        ``judged``: ``fresh`` holds the heartbeats of ``until`` -- read then, or from the heartbeat log (else --
        an earlier minute of a history run or of a live catch-up without the log -- the heartbeats of that time
        are not known: the gap's ``detail.liveness`` is ``unknown``).

        Cheap to call every minute: nothing is scanned before :attr:`next_due`, and a quiet source whose silence
        does not yet amount to ``gap_min_expected`` lines is skipped until the minute it would.

        An open gap of a source that heartbeats again at ``until`` (``judged``; its file not growing) closes at
        the minute before: the pipeline is back, and the silence that goes on is the site's (the outage path).  A
        stuck shipper's gap (its file grew) closes only when its lines return."""
        if self.retired:
            yield from self._retire(until)
        fed, self._fed = self._fed, []
        if judged:
            for src in fed:  # the listeners up at the minute after a source's last line (a quiet gap's test)
                q = self.recent.get(src)
                if q and q[-1][0] == until - timedelta(minutes=1):
                    self._line_cover[src] = self._cover(src, fresh)
            for src in [s for s, d in self.open.items() if d.detail.get("reason") == "source silent, no heartbeat"]:
                q = self.recent.get(src)
                det = self.open[src]
                if (src in fresh or src.split("/", 1)[0] + "/" in fresh) and not (
                        grew is not None and q and grew(src, q[-1][0], until)):
                    since = det.detail.setdefault("_back_since", until)
                    if until - since >= HEARTBEATS_BACK_CONFIRM:
                        del self.open[src]
                        det.end, det.state = since - timedelta(minutes=1), "closed"
                        det.detail["closed_by"] = "heartbeats"
                        yield _whole_silence(det)
                else:
                    det.detail.pop("_back_since", None)
        if until < self.next_due:
            return
        gap_min = int(self.h["gap_min_minutes"])
        threshold = float(self.h["gap_min_expected"])
        never = datetime.max.replace(tzinfo=UTC)
        next_due = never
        for src, q in self.recent.items():
            if not q or src in self.open or (self.retired and self._retired(src, until) is not None):
                continue  # (a retired source is not rescheduled: set_retired rescans when one is undone)
            last = q[-1][0]
            due = self._due.get(src, last + timedelta(minutes=gap_min + 1))
            if until < due:
                next_due = min(next_due, due)
                continue
            stuck = False
            if src in fresh or src.split("/", 1)[0] + "/" in fresh:  # its own heartbeat or its host's
                stuck = grew is not None and grew(src, last, until)
                if not stuck:
                    next_due = min(next_due, due)
                    continue
            silent = int((until - last).total_seconds() // 60) - 1
            exp = self._expected(src, last, silent)
            if exp >= threshold:
                why: dict[str, Any] = ({"reason": "source silent, its file grows"} if stuck
                                       else {"reason": "source silent, no heartbeat"} if judged
                                       else {"reason": "source silent", "liveness": "unknown"})
                cover = self._cover(src, fresh) if judged and not stuck else frozenset()
                if cover and self._line_cover.get(src, frozenset()) <= cover:
                    why = {"reason": "source silent, its listener up", "liveness": "quiet",
                           "listeners": sorted(" ".join(parse_listener_key(k)[1:]) for k in cover)}
                why["site_share"] = round(self._site_share(src, last, until), 4)
                why["_rate"] = exp / silent if silent > 0 else 0.0  # lines per minute, for the closed gap's figure
                det = Detection("pipeline_gap", f"source:{src}", last + timedelta(minutes=1), None,
                                last + timedelta(minutes=1), 0.0, exp, 1.0, "pipeline_gap", why, site=self.site)
                self.open[src] = det
                yield det
                continue
            # the expectation grows by the source's rate per silent minute: the minute it reaches the threshold
            rate = exp / silent if silent > 0 else 0.0
            if rate <= 0.0:
                due = never
            else:
                needed = max(gap_min, math.ceil(threshold / rate - 1e-9))
                due = max(last + timedelta(minutes=needed + 1), until + timedelta(minutes=1))
            self._due[src] = due
            next_due = min(next_due, due)
        self.next_due = next_due


class HeartbeatLog:
    """The heartbeats of a site's sources over a range, from ``source_heartbeat_minute`` (migration 0008): which
    sources were alive at an evaluated time ``t`` (a minute boundary) -- a heartbeat at ``h`` with
    ``0 <= t - h <= fresh_s``, the test live runs make against ``source_liveness`` at their clock (without their
    30 s allowance for a shipper clock running ahead, so a change of state can fall a minute apart) -- and
    whether a source's file grew over a stretch (:meth:`grew`).

    ``spans``: per source (named as :meth:`TrafficDetector._fresh_sources` names them: ``host/file``, ``host/``
    for a host heartbeat), time-ordered runs ``(first heartbeat ms, last heartbeat ms)`` in which consecutive
    heartbeats are at most ``fresh_s`` apart (merged by the store: one row per run, not per minute).
    ``known_from``: the first time the log can answer for -- its first heartbeat plus ``fresh_s``: earlier, a
    heartbeat from before the log began may have been fresh; callers must not read :meth:`at` before it as "no
    heartbeat".  ``samples(src, lo_ms, hi_ms)``: the file heartbeats ``(ms, size, inode)`` of a source in a
    range, in time order, fetched when :meth:`grew` first needs them (a silence is short; the history is not)."""

    def __init__(self, known_from: datetime, spans: Iterable[tuple[str, int, int]], fresh_s: float,
                 samples: Callable[[str, int, int], list[Beat]] | None = None,
                 growth_window_s: float = 600.0) -> None:
        self.known_from = known_from
        self.growth_window_ms = round(growth_window_s * 1000)
        fresh_ms = round(fresh_s * 1000)
        self._starts: dict[str, list[int]] = {}
        self._ends: dict[str, list[int]] = {}
        for src, first_ms, last_ms in sorted(spans):  # a run's heartbeats are evidence at t in [first, last + fresh]
            starts, ends = self._starts.setdefault(src, []), self._ends.setdefault(src, [])
            if ends and first_ms <= ends[-1]:
                ends[-1] = max(ends[-1], last_ms + fresh_ms)
            else:
                starts.append(first_ms)
                ends.append(last_ms + fresh_ms)
        self._fetch = samples
        self._cache: dict[str, tuple[int, int, list[Beat]]] = {}

    def at(self, t: datetime) -> set[str]:
        """The sources with a heartbeat that is evidence of liveness at ``t``: one bisection per source."""
        ms = int(t.timestamp() * 1000)
        got = set()
        for src, starts in self._starts.items():
            i = bisect.bisect_right(starts, ms) - 1
            if i >= 0 and self._ends[src][i] >= ms:
                got.add(src)
        return got

    def _samples(self, src: str, lo: int, hi: int) -> list[Beat]:
        """The file heartbeats of ``src`` from ``lo`` to at least ``hi`` (ms), in time order: fetched for an hour
        ahead and fetched again only when asked past it or before it (a minute-by-minute run asks for a window
        sliding forward: one query an hour, not one a minute)."""
        if self._fetch is None:
            return []
        got = self._cache.get(src)
        if got is None or lo < got[0] or hi > got[1]:
            got = (lo, hi + 3_600_000, self._fetch(src, lo, hi + 3_600_000))
            self._cache[src] = got
        return got[2]

    def grew(self, src: str, since: datetime, until: datetime) -> bool:
        """:func:`forumpulse.pipeline.contracts.file_grew` over ``src``'s heartbeats in the last
        ``growth_window_s`` before ``until`` (and after ``since``); host heartbeats (``host/``) and listeners
        never grow."""
        if src.endswith("/") or src.startswith(LISTENER_KEY) or src not in self._starts:
            return False
        hi = int(until.timestamp() * 1000)
        lo = max(int(since.timestamp() * 1000), hi - self.growth_window_ms)
        if lo >= hi:
            return False
        return file_grew(self._samples(src, lo, hi), lo, hi)

    def growing(self, since: datetime, until: datetime) -> list[str]:
        """The sources whose file grew in ``[since, until]`` (:meth:`grew`), sorted."""
        return sorted(src for src in self._starts if self.grew(src, since, until))


# ------------------------------------------------------------------------------------------------ orchestration


@dataclass
class _SiteRuntime:
    name: str
    seasonal: SeasonalDetector
    topics: TopicSurgeDetector
    transfer: TransferDetector
    sources: SourceGapDetector
    cursor: datetime | None = None           # every minute < cursor has been fed (exclusive upper bound)
    transfer_cursor: datetime | None = None
    gap: Detection | None = None
    last_seen: datetime | None = None
    # the first minute of a silence fed as zeros before gap_min_minutes because the site was down (answering
    # errors) when it fell silent; None once lines come back
    down_silence_from: datetime | None = None
    # the start of the site gap the site's retirement closed (site_tail; _gap_check does not report it again)
    retired_gap: datetime | None = None
    groups_mark: tuple[Any, ...] | None = None  # state of topic_groups / topic_titles the groups were read at
    judged_from: datetime | None = None      # live: the first minute this session read (its detection_runs row)
    runs_recorded_to: datetime | None = None  # live: the to_ts last written to detection_runs


TransferRow = tuple[str, str, str, int, float, float]


_TopicDay = dict[datetime, dict[int, tuple[int, int, int]]]  # minute -> topic -> views, replies, visitors
TopicRows = Mapping[datetime, dict[int, tuple[int, int, int]]]


class _TopicRowsByDay(Mapping[datetime, dict[int, tuple[int, int, int]]]):
    """History runs and a live process's first run (the ``history_days`` warm-up): the topic rows of ``[start,
    until)`` read a day at a time, as :meth:`TrafficDetector._feed` asks for its minutes in order (a forum with
    hundreds of topics a minute has millions of rows in 15 days; only one day's are held).  ``load(a, b)`` reads
    ``[a, b)``.  A minute outside the loaded day loads the day that starts at it.  Misuse: only where detectors
    left half-fed by a read failing half-way are thrown away (a history run's with the error; a live site's state
    after a failure while feeding) -- a live run's later windows are read whole before any detector is fed;
    iterating or ``len`` would read everything and are refused."""

    def __init__(self, load: Callable[[datetime, datetime], _TopicDay], start: datetime, until: datetime,
                 chunk: timedelta = timedelta(days=1)) -> None:
        self._load, self._start, self._until, self._chunk = load, start, until, chunk
        self._lo = self._hi = start
        self._rows: _TopicDay = {}

    def __getitem__(self, minute: datetime) -> dict[int, tuple[int, int, int]]:
        if not self._start <= minute < self._until:
            raise KeyError(minute)
        if not self._lo <= minute < self._hi:
            self._lo, self._hi = minute, min(minute + self._chunk, self._until)
            self._rows = {}  # the previous day's rows go before the next day's are read
            self._rows = self._load(self._lo, self._hi)
        return self._rows[minute]

    def __iter__(self) -> Iterator[datetime]:
        raise TypeError("_TopicRowsByDay is read by minute only (get / [])")

    def __len__(self) -> int:
        raise TypeError("_TopicRowsByDay is read by minute only (get / [])")


@dataclass
class _Window:
    """Everything one site's advance over ``[start, until)`` needs from the store, read before any detector of
    the site is fed (so a failing read leaves the detectors as they were) -- except the topic rows of a history
    run and of a live site's first run, read a day at a time as they are fed (:class:`_TopicRowsByDay`)."""

    start: datetime
    until: datetime
    site_rows: list[tuple[datetime, int, int, int, int]]  # minute, requests, 5xx + no status, topic views, pageviews
    topic_rows: TopicRows  # minute -> topic -> views, replies, visitors
    source_rows: list[tuple[str, datetime, int]]           # host/file, minute, lines
    fresh: set[str]                                         # sources heartbeating at the evaluated time
    transfer: list[tuple[datetime, list[tuple[str, list[TransferRow]]]]]  # complete windows (end, rows), in order
    groups: dict[str, set[int]] | None = None  # live: topic groups re-read because their tables changed
    groups_mark: tuple[Any, ...] | None = None
    live: bool = False  # read by a live run (``fresh`` is the wall clock's, just after ``until``)
    hb_log: HeartbeatLog | None = None  # the heartbeats of each minute of the window (migration 0008), if known
    hb_recent: HeartbeatLog | None = None  # live: the last minutes' heartbeats up to now (file growth at the end)
    topics_from: datetime | None = None  # history: topics are fed from this minute on (see detect_history)
    heartbeating: set[str] = field(default_factory=set)  # SourceGapDetector.heartbeating: sources that ever beat
    retired: dict[str, datetime] = field(default_factory=dict)  # SourceGapDetector.retired (migration 0011)


@dataclass
class _VisitorQuery:
    """Unique-visitor figures still to add to a topic surge: the window of ``window`` minutes ending at ``minute``."""

    site: str
    det: Detection
    minute: datetime
    topic_ids: list[int]
    window: int


@dataclass
class _Outgoing:
    det: Detection
    stored: bool = False  # inserted into ``detections`` in its current state (only the producer is left)
    shown: bool = False   # printed (echo) in its current state: a retried publication is not printed again


class TrafficRunError(RuntimeError):
    """:meth:`TrafficDetector.run_once` failed for some sites after emitting everything it could: ``errors``
    (site -> exception), ``emitted`` (the detections this call did emit).  The failed sites retry from where they
    stopped at the next call."""

    def __init__(self, errors: dict[str, BaseException], emitted: list[Detection]) -> None:
        self.errors, self.emitted = errors, emitted
        what = "; ".join(f"{site}: {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}"
                         for site, exc in errors.items())
        super().__init__(f"traffic detectors failed for {len(errors)} site(s) (retried at the next run): {what}")


#: a network listener's heartbeat row (``LISTENER_LABEL_RE`` in SQL, as dashboards/panels.py states it)
_LISTENER_SQL = f"match(origin_file, '^{LISTENER_LABEL_RE.pattern}$')"
#: a ``source_liveness`` row that is no listener's (``consumer._is_listener``: a listener label and never a line):
#: a listener receives lines under the senders' hosts, its heartbeats are no source's (nor its collector host's)
_NOT_LISTENER_ROW = f"NOT ({_LISTENER_SQL} AND toUnixTimestamp64Milli(last_line_ts) = 0)"


def _site_rows_sql(site: str, keep: str | None = None) -> str:
    """A condition on ``source_liveness`` (or ``source_heartbeat_minute``) rows: the rows of ``site``, and the rows
    of every site (``*``: syslog-ng's MARK, a host heartbeat) of the hosts that have rows in ``site``.

    ``keep`` None: every such row, listeners' included (the watermark: how far whatever feeds the site has
    landed).  Otherwise each row must also meet ``keep`` (e.g. :data:`_NOT_LISTENER_ROW`), and the hosts are those
    of the site's rows that are no listener's: a listener's collector host is not one of the site's hosts."""
    hosts = f"SELECT origin_host FROM source_liveness WHERE site = {_q(site)}"
    if keep is None:
        return f"site = {_q(site)} OR (site = '*' AND origin_host IN ({hosts}))"
    return f"(site = {_q(site)} OR (site = '*' AND origin_host IN ({hosts} AND {_NOT_LISTENER_ROW}))) AND {keep}"


LIVE_CLOCK_SKEW_S = 30.0
"""Live runs: a heartbeat up to this many seconds later than the wall clock still counts (the shipper stamps it
with its own clock; a consumer stamps its progress reports with its own).  History runs accept none later than
the end of the range."""


def partition_state(loaded_ms: int, lag: int, active: bool, reported_ms: int, now_ms: int, stale_s: float,
                    gap_min_minutes: int) -> tuple[str, int | None]:
    """A Kafka partition's loading state from its owner's newest ``consumer_progress`` row (migration 0007), at
    ``now_ms``, and the limit it puts on the live watermark (epoch ms, None = none); the rule of
    :meth:`TrafficDetector._partitions` and of the ops dashboard's partition panel (tests compare the two):

    ``gone`` (no report for ``gap_min_minutes``), ``far behind`` (lag > 0 or unknown, and the newest message
    stored is older than that: not waited for, as a source silent that long), ``behind`` (lag > 0 or unknown,
    whether its owner still runs or exited cleanly while behind -- a rolling restart hands the partition over with
    messages waiting: the limit is the newest stored message's Kafka time; when that is later than the clock
    allows, now minus how far behind the consumer was by its own clock, or the report's time if earlier),
    ``released`` (its owner exited cleanly, caught up), ``not reporting``
    (caught up at a report older than ``stale_s`` plus :data:`LIVE_CLOCK_SKEW_S` -- the report carries the
    consumer's clock: the limit is that report), ``caught up``."""
    gap_ms = gap_min_minutes * 60_000
    skew_ms = int(LIVE_CLOCK_SKEW_S * 1000)
    if reported_ms < now_ms - gap_ms:
        return "gone", None
    if lag != 0:
        if loaded_ms < now_ms - gap_ms:
            return "far behind", None
        if loaded_ms <= now_ms + skew_ms:
            return "behind", loaded_ms
        # a Kafka time ahead of this clock must not lift the hold.  The consumer clamps it to its own clock, so
        # that clock is ahead: how far behind it is by its own clock (report - loaded, skew-free) counts back
        # from now.  A row of a consumer that did not clamp (a producer's clock ahead, its own right) holds at
        # its report.
        return "behind", min(reported_ms, now_ms - max(0, reported_ms - loaded_ms))
    if not active:
        return "released", None
    if reported_ms < now_ms - int(stale_s * 1000) - skew_ms:
        return "not reporting", reported_ms
    return "caught up", None


Producer = Callable[[str, bytes, bytes], None]


class TrafficDetector:
    """All traffic detectors for the configured sites over one store.

    ``run_once(store, now)`` reads the complete minutes landed since the previous call (the first call warms the
    baselines with ``history_days`` of rollups), feeds every detector, and emits what changed: inserted into
    ``detections``, printed as JSON lines when ``echo`` is set, and passed to ``producer`` (topic
    ``events_topic``).  Returns the detections emitted by this call (latest state of each).  Failure handling is
    described at :meth:`run_once`.
    """

    def __init__(self, settings: Any = None, producer: Producer | None = None, echo: bool = False,
                 out: Any = None, rules: dict[str, Any] | None = None, sites: Iterable[str] | None = None) -> None:
        from forumpulse.pipeline.config import Settings

        self.settings = settings if settings is not None else Settings()
        section = validate_detectors_section(self.settings.detectors)
        self.cfg = section.traffic
        self.rules = rules if rules is not None else self.cfg.rules()
        self.producer = producer
        self.echo = echo
        self.out = out or sys.stdout
        self.events_topic = getattr(getattr(self.settings, "kafka", None), "events_topic", "weblogs.events")
        self.sites: dict[str, _SiteRuntime] = {}
        self.only_sites = set(sites) if sites is not None else None
        self._outbox: dict[str, _Outgoing] = {}       # id -> detection not yet inserted and published (latest state)
        #: detection states stored in ``detections`` since start (what the detectors found, published or not)
        self.stored_total = 0
        self._visits: dict[str, _VisitorQuery] = {}   # id -> visitor figures to add before it is emitted

    # -- setup ------------------------------------------------------------------------------------------
    def _site(self, store: Any, name: str) -> _SiteRuntime:
        rt = self.sites.get(name)
        if rt is None:
            sc = self.settings.site(name)
            cal = SiteCalendar(sc.country, sc.subdivision, sc.holiday_periods)
            mark = self._groups_mark(store, name)
            rt = _SiteRuntime(
                name,
                SeasonalDetector(sc.timezone, cal, seasonal_params(self.rules, rollup=True), scope="site", site=name),
                TopicSurgeDetector(self.rules, self._groups(store, name), name),
                TransferDetector(self.rules, name),
                SourceGapDetector(self.rules, name),
                groups_mark=mark,
            )
            self.sites[name] = rt
        return rt

    def _groups(self, store: Any, site: str) -> dict[str, set[int]]:
        groups: dict[str, set[int]] = {}
        titles: list[tuple[str, int, str]] | None = None  # read once, for the first group with a title pattern
        for g in self.settings.topics.groups:
            if g.site != site:
                continue
            ids = set(g.topic_ids)
            if g.title_pattern:
                rx = re.compile(g.title_pattern)
                titles = titles if titles is not None else latest_titles(store, site)
                ids |= {tid for _, tid, title in titles if rx.search(title)}
            groups[g.name] = ids
        for name, tid in store.query_rows(
                f"SELECT group_name, topic_id FROM topic_groups FINAL WHERE site = {_q(site)}"):
            groups.setdefault(str(name), set()).add(int(tid))
        return groups

    def _groups_mark(self, store: Any, site: str) -> tuple[Any, ...]:
        """A cheap fingerprint of what :meth:`_groups` reads for ``site``: row count and latest ``updated_at`` of
        ``topic_groups`` and, when a configured group of the site matches titles, of ``topic_titles``.  Live runs
        re-read the groups when it changes (a new topic whose title matches an election pattern joins its group)."""
        parts = [f"SELECT 'groups', count(), toString(max(updated_at)) FROM topic_groups WHERE site = {_q(site)}"]
        if any(g.site == site and g.title_pattern for g in self.settings.topics.groups):
            parts.append(f"SELECT 'titles', count(), toString(max(updated_at)) FROM topic_titles WHERE site = {_q(site)}")
        return tuple(sorted(tuple(r) for r in store.query_rows(" UNION ALL ".join(parts))))

    def _site_names(self, store: Any) -> list[str]:
        names = {s.name for s in self.settings.sites}
        names |= {str(r[0]) for r in store.query_rows("SELECT DISTINCT site FROM site_minute")}
        if self.only_sites is not None:
            names &= self.only_sites
        return sorted(names)

    # -- main entry ---------------------------------------------------------------------------------------
    def run_once(self, store: Any, now: datetime | None = None) -> list[Detection]:
        """Advance every site to the last complete minute before ``now`` and emit what changed.

        Guarantees, per site and independently of the other sites:

        * all store reads for the site's new minutes happen before any of its detectors is fed; a failing read
          leaves the detectors and the site's cursor untouched, and the next call reads the same minutes again —
          no minute is fed twice or skipped (the first run, which warms the detectors on ``history_days``, reads
          its topic rows a day at a time while feeding: a read failing there discards the site's state, as below);
        * detections wait in an outbox until they are inserted into ``detections`` and handed to ``producer``
          (and printed): a failing insert, producer or visitor query keeps them, in their latest state, for the
          next call.  A detection is inserted again only after its state changed, and handed to the producer
          once per emitted state -- again at the next calls while a producer with ``confirm()`` does not confirm
          its delivery (at least once: a message Kafka delivered late can arrive twice, with the same key);
        * an error on one site does not stop the others: they advance and their detections are emitted, then
          :class:`TrafficRunError` is raised naming the failed sites (they retry at the next call).

        A failure while *feeding* the in-memory detectors (a defect, not a store error) discards that site's
        state: the next call warms it again from ``history_days`` of rollups, as after a restart.
        """
        now = _utc(now or datetime.now(UTC))
        until = now.replace(second=0, microsecond=0) - timedelta(minutes=self.cfg.lag_minutes)
        errors: dict[str, BaseException] = {}
        for name in self._site_names(store):
            try:
                self._run_site(store, name, until, now)
            except Exception as exc:
                errors[name] = exc
                log.warning("traffic detectors: site %s failed (retried at the next run): %s", name,
                            (str(exc).splitlines() or [""])[0][:300])
        sent = self._flush(store, now)
        self._record_live_runs(store, now)
        if errors:
            raise TrafficRunError(errors, sent)
        return sent

    def _record_live_runs(self, store: Any, now: datetime) -> None:
        """Move this session's ``detection_runs`` rows on (at the first run, then every :data:`RUNS_EVERY` of
        judged minutes).  Best effort: a failed insert is logged and tried again at the next run; it never holds
        the detections back."""
        due, runs = [], []
        for rt in self.sites.values():
            if rt.judged_from is not None and rt.cursor is not None and (
                    rt.runs_recorded_to is None or rt.cursor - rt.runs_recorded_to >= RUNS_EVERY):
                due.append(rt)
                runs.append((rt.name, "live", rt.judged_from, rt.cursor))
        if not due:
            return
        try:
            record_runs(store, runs, now)
        except Exception as exc:
            log.warning("traffic detectors: detection_runs not updated (tried again at the next run): %s",
                        (str(exc).splitlines() or [""])[0][:300])
            return
        for rt in due:
            rt.runs_recorded_to = rt.cursor

    def _run_site(self, store: Any, name: str, until: datetime, now: datetime) -> None:
        """One site's step of :meth:`run_once`: read, feed, commit the cursor, queue the detections."""
        rt = self._site(store, name)
        topics_from = None if rt.cursor else until - timedelta(days=self.cfg.history_days)
        start = rt.cursor or self._warm_start(store, name, until - timedelta(days=self.cfg.history_days))
        mark = self._watermark(store, name, now)
        if mark is not None:
            until = min(until, mark.replace(second=0, microsecond=0))
        if start < until:
            # the first run warms on history_days: its topic rows are read a day at a time as they are fed (a
            # forum with hundreds of topics a minute has millions of rows in 15 days); a read failing there is a
            # failure while feeding, handled below
            win = self._read(store, rt, start, until, now, live=True, topics_from=topics_from,
                             topics_by_day=rt.cursor is None)
            try:
                dets, visits = self._feed(rt, win)
            except Exception:
                del self.sites[name]  # half-fed: start the site afresh rather than feed its minutes twice
                raise
            rt.cursor = until
            if topics_from is not None and start < topics_from:
                # warmed further back for an open gap (_warm_start): what ended before the usual warm-up was
                # stored by earlier runs; re-derived here from colder baselines it must not overwrite them, and
                # those days count as judged by earlier runs, not this one (found by a review)
                dets = [d for d in dets if d.end is None or d.end >= topics_from]
            if rt.judged_from is None:
                rt.judged_from = start if topics_from is None else max(start, topics_from)
            for d in dets:
                prev = self._outbox.get(d.id)
                self._outbox[d.id] = _Outgoing(_first_report(prev.det if prev else None, d))
            for q in visits:
                self._visits[q.det.id] = q
        for key, q in list(self._visits.items()):
            if q.site == name:
                self._add_visitors(store, q)
                del self._visits[key]

    # -- reading (no detector state is touched) -------------------------------------------------------------
    def _warm_start(self, store: Any, name: str, start: datetime) -> datetime:
        """Where a site's first live run starts reading: ``start`` (``history_days`` back), or earlier when the
        store has a ``pipeline_gap`` of the site still open that began before it (at most ``GAP_WARM_DAYS``
        before ``start``): from the hour before that gap, so the warm-up sees the silent source's last lines,
        opens the same gap (same id) and closes it when the lines come back.  A restart used to leave such a gap
        open for good: its source was never seen again (found by a review).  The topic detectors still start at
        ``start``, and what the longer warm-up finds ended before ``start`` is not emitted (:meth:`_run_site`)."""
        try:
            rows = store.query_rows(
                f"SELECT min(start_ts) FROM detections FINAL WHERE site = {_q(name)} AND kind = 'pipeline_gap' "
                f"AND state = 'open' AND start_ts < {_sql_ts(start)} "
                f"AND start_ts >= {_sql_ts(start - timedelta(days=GAP_WARM_DAYS))}")
        except Exception as exc:  # a store without detections yet: warm as usual
            log.debug("open gaps of %s not read: %s", name, exc)
            return start
        first = rows[0][0] if rows and rows[0] and rows[0][0] is not None else None
        if first is None or _utc(first).year < 1971:  # min() over no rows is the epoch in ClickHouse
            return start
        return min(start, _utc(first) - timedelta(minutes=61))

    def _read(self, store: Any, rt: _SiteRuntime, start: datetime, until: datetime, now: datetime,
              live: bool, topics_from: datetime | None = None, topics_by_day: bool = False) -> _Window:
        """``topics_by_day``: the topic rows are read a day at a time while they are fed (history runs and a live
        site's first run: see :class:`_TopicRowsByDay`); otherwise everything is read here, before any detector
        is fed."""
        enabled = set(self.cfg.enabled)
        topic_start = max(start, topics_from) if topics_from is not None else start
        site_rows = [(_utc(m), int(req), int(err), int(tv), int(pv)) for m, req, err, tv, pv in store.query_rows(
            "SELECT minute, sum(requests), sum(status_5xx) + sum(status_none), sum(topic_views), sum(pageviews) "
            "FROM site_minute "
            f"WHERE site = {_q(rt.name)} AND minute >= {_sql_ts(start)} AND minute < {_sql_ts(until)} "
            "GROUP BY minute ORDER BY minute")]
        def topics(a: datetime, b: datetime) -> _TopicDay:
            rows: _TopicDay = {}
            for minute, tid, v, r, u in store.query_rows(
                    "SELECT minute, topic_id, sum(views), sum(replies), uniqMerge(visitors) FROM topic_minute "
                    f"WHERE site = {_q(rt.name)} AND minute >= {_sql_ts(a)} AND minute < {_sql_ts(b)} "
                    "GROUP BY minute, topic_id"):
                rows.setdefault(_utc(minute), {})[int(tid)] = (int(v), int(r), int(u or 0))
            return rows

        topic_rows: TopicRows = {}
        if "topic" in enabled:
            topic_rows = _TopicRowsByDay(topics, topic_start, until) if topics_by_day else topics(topic_start, until)
        source_rows: list[tuple[str, datetime, int]] = []
        fresh: set[str] = set()
        heartbeating: set[str] = set()
        retired: dict[str, datetime] = {}
        if "site" in enabled:
            source_rows = [(str(src), _utc(m), int(n)) for src, m, n in store.query_rows(
                "SELECT concat(origin_host, '/', origin_file) AS src, toStartOfMinute(ts) AS m, count() FROM requests "
                f"WHERE site = {_q(rt.name)} AND ts >= {_sql_ts(start)} AND ts < {_sql_ts(until)} "
                "GROUP BY src, m ORDER BY m, src")]
            fresh = self._fresh_sources(store, rt.name, now, live)
            heartbeating = {str(r[0]) for r in store.query_rows(
                "SELECT concat(origin_host, '/', if(origin_file IN ('', '-'), '', origin_file)) FROM source_liveness "
                f"WHERE site = {_q(rt.name)} OR (site = '*' AND origin_file IN ('', '-')) "
                "GROUP BY site, origin_host, origin_file HAVING toUnixTimestamp64Milli(max(last_heartbeat_ts)) > 0")}
            retired = {f"{h}/{f}": _utc(ms / 1000) for (_s, h, f), ms in retired_sources(store, rt.name).items()}
        transfer = self._read_transfer(store, rt, start, until) if "transfer" in enabled else []
        win = _Window(start, until, site_rows, topic_rows, source_rows, fresh, transfer, live=live,
                      topics_from=topics_from, heartbeating=heartbeating, retired=retired)
        if "site" in enabled and (not live or until - start > timedelta(minutes=1)):
            # history, or a live run catching up: the minutes before the evaluated time are judged with the
            # heartbeats of their own time; a history run's end too (today's latest heartbeat says nothing of it)
            win.hb_log = self._heartbeat_log(store, rt.name, start, until)
            if win.hb_log is not None and not live and until >= win.hb_log.known_from:
                win.fresh = win.fresh | win.hb_log.at(until)
        if "site" in enabled and live and sources_only(win.fresh) and self._maybe_silent(rt, until):
            # sources heartbeat while something is silent: do their files grow (a stuck shipper)?
            back = timedelta(minutes=2 * int(self.rules["health"]["gap_min_minutes"]))
            win.hb_recent = self._heartbeat_log(store, rt.name, until - back, now, known=False)
        if live and "topic" in enabled:
            mark = self._groups_mark(store, rt.name)
            if mark != rt.groups_mark:
                win.groups, win.groups_mark = self._groups(store, rt.name), mark
        return win

    def _watermark(self, store: Any, site: str, now: datetime) -> datetime | None:
        """Live: how far the site's data has landed.  For each source that heartbeats and was heard from (a line
        or a heartbeat) within ``gap_min_minutes``, the time of the latest line or heartbeat loaded; the site's
        watermark is the earliest of them.  Lines and heartbeats travel the same path (syslog-ng -> Kafka -> the
        loader), so a minute before the watermark has landed: a loader running behind holds the detectors back
        instead of their reading its missing minutes as minutes without traffic (then never reading them).
        Sources without heartbeats (no way to tell late from quiet) and sources silent longer than
        ``gap_min_minutes`` (the gap detectors' case) do not hold it back; None when no source counts.  A file's
        heartbeats include its host's (``origin_file`` empty, in this site or in every site ``*``), as for
        :meth:`_fresh_sources`: a quiet file of a host that heartbeats does not hold the site back.

        A source quiet at its last report (no line after its latest heartbeat) whose heartbeat is older than
        ``heartbeat_fresh_seconds`` does not hold it either while the Kafka loader reports every partition caught
        up (:meth:`_partitions`): nothing of it waits in the loader, and a source heartbeating more slowly than
        that (syslog's MARK every 20 minutes, a cron ``logger``) pinned the site at its last heartbeat for up to
        ``gap_min_minutes`` (from a review).  Without loader reports (``forumpulse ingest``) such a source still
        holds it: there a late loader and a slow heartbeat look alike.  Left: a stall before Kafka (a sender's
        buffer) of a quiet source is not waited for once its heartbeat is stale."""
        gap = timedelta(minutes=int(self.rules["health"]["gap_min_minutes"]))
        rows = store.query_rows(
            "SELECT origin_host, origin_file, site, toUnixTimestamp64Milli(argMax(last_line_ts, updated_at)), "
            "toUnixTimestamp64Milli(argMax(last_heartbeat_ts, updated_at)) FROM source_liveness "
            f"WHERE {_site_rows_sql(site)} GROUP BY origin_host, origin_file, site")
        host_hb: dict[str, int] = {}
        for host, file, _site, _line, hb in rows:
            if str(file) in ("", "-"):
                host_hb[str(host)] = max(host_hb.get(str(host), 0), int(hb or 0))
        lo = int((now - gap).timestamp() * 1000)
        hi = int((now + timedelta(seconds=LIVE_CLOCK_SKEW_S)).timestamp() * 1000)
        parts = self._partitions(store, now)
        marks = [m for _, m in parts if m is not None]
        # the Kafka loader reports every partition caught up: what reached Kafka has landed
        loaded_up = not marks and any(state == "caught up" for state, _ in parts)
        stale = int((now - timedelta(seconds=float(self.rules["health"]["heartbeat_fresh_seconds"]))).timestamp()
                    * 1000)
        for host, file, row_site, line, hb in rows:
            if row_site != site and str(file) not in ("", "-"):
                continue
            beat = max(int(hb or 0), host_hb.get(str(host), 0))
            t = max(int(line or 0), beat)
            if beat > 0 and lo <= t <= hi:
                if loaded_up and int(line or 0) <= beat < stale:
                    continue  # quiet at its last heartbeat, which is not fresh: see the docstring
                marks.append(t)
        return datetime.fromtimestamp(min(marks) / 1000, UTC) if marks else None

    def _partitions(self, store: Any, now: datetime) -> list[tuple[str, int | None]]:
        """Live: each Kafka partition's :func:`partition_state` (state, limit) at ``now``: how far the consumers
        have loaded it (``consumer_progress``, migration 0007), as limits on every site's watermark (a partition
        carries lines of every site).  A source's latest line comes from whichever partition is current, so
        :meth:`_watermark`'s sources cannot show a loader behind on one partition only; these rows can.  Per
        partition, the newest row (its owner's latest report):

        * reported more than ``gap_min_minutes`` ago (no loader for it that long: a pipeline gap, not a reason to
          wait), or released caught up (``active`` false, lag 0: its owner exited cleanly): no limit;
        * behind (lag > 0, or unknown; also when its owner exited cleanly behind, as in a rolling restart, until
          the next owner reports): the Kafka time of the newest message stored from it, when that is within
          ``gap_min_minutes`` (a loader further behind is not waited for, as for a source);
        * caught up, with a report older than ``progress_stale_seconds`` (its owner stopped reporting: stuck or
          killed): the time of that report -- what was produced before it was loaded;
        * caught up and reporting: no limit.

        Misuse: the rows say nothing about which sites a partition carries, so one partition behind holds every
        site back; a store with no Kafka loader (``forumpulse ingest``) has no rows and no limits."""
        health = self.rules["health"]
        gap_min = int(health["gap_min_minutes"])
        stale_s = float(health.get("progress_stale_seconds", 30))
        rows = store.query_rows(
            "SELECT toUnixTimestamp64Milli(argMax(loaded_ts, updated_at)), argMax(lag, updated_at), "
            "argMax(active, updated_at), toUnixTimestamp64Milli(max(updated_at)) FROM consumer_progress "
            f"WHERE updated_at >= {_sql_ts(now - timedelta(minutes=gap_min))} GROUP BY group_id, topic, partition")
        now_ms = int(now.timestamp() * 1000)
        return [partition_state(int(loaded), int(lag), bool(active), int(updated), now_ms, stale_s, gap_min)
                for loaded, lag, active, updated in rows]

    def _fresh_sources(self, store: Any, site: str, at: datetime, live: bool) -> set[str]:
        """Sources of ``site`` (``host/file``, ``host/`` for a host heartbeat) whose last heartbeat is evidence of
        liveness at ``at``: ``0 <= at - heartbeat <= heartbeat_fresh_seconds``.  A heartbeat later than ``at`` says
        nothing about ``at`` (a history run over a past range must not take today's heartbeat for "alive then");
        live runs (``at`` = the wall clock) accept one up to :data:`LIVE_CLOCK_SKEW_S` ahead."""
        lo = at - timedelta(seconds=float(self.rules["health"]["heartbeat_fresh_seconds"]))
        hi = at + timedelta(seconds=LIVE_CLOCK_SKEW_S if live else 0.0)
        # a host heartbeat (origin_file '' or '-') covers every file of its host; with site '*' (syslog-ng's
        # MARK) in every site -- counted for the hosts that have sources in this site (as source_status does).
        # The listeners of the site and of every site ('*') come as listener_key entries only (no lines of their
        # own), never as the site's sources, nor make their collector host one of the site's
        return {str(r[0]) for r in store.query_rows(
            "SELECT concat(origin_host, '/', if(origin_file IN ('', '-'), '', origin_file)), "
            "argMax(last_heartbeat_ts, updated_at) AS hb "
            f"FROM source_liveness WHERE {_site_rows_sql(site, _NOT_LISTENER_ROW)} "
            "GROUP BY origin_host, origin_file "
            f"HAVING hb >= {_sql_ts(lo)} AND hb <= {_sql_ts(hi)} "
            f"UNION ALL SELECT concat({_q(LISTENER_KEY)}, site, '\\t', origin_host, '\\t', origin_file), "
            "max(last_heartbeat_ts) AS hb "
            f"FROM source_liveness WHERE site IN ({_q(site)}, '*') AND {_LISTENER_SQL} "
            "GROUP BY site, origin_host, origin_file "
            f"HAVING toUnixTimestamp64Milli(max(last_line_ts)) = 0 AND hb >= {_sql_ts(lo)} AND hb <= {_sql_ts(hi)}")}

    @staticmethod
    def _maybe_silent(rt: _SiteRuntime, until: datetime) -> bool:
        """Live: the site or one of its sources may have had no line for a while by ``until`` (read before the
        window is fed: the last minute with lines is then at most this old)."""
        cut = until - timedelta(minutes=2)
        if rt.last_seen is None or rt.last_seen < cut:
            return True
        return any(q and q[-1][0] < cut for q in rt.sources.recent.values())

    def _heartbeat_log(self, store: Any, site: str, start: datetime, until: datetime,
                       known: bool = True) -> HeartbeatLog | None:
        """The heartbeats of ``site``'s sources that are evidence of liveness at some minute of ``[start,
        until]`` (``source_heartbeat_minute``, migration 0008), or None when the log has nothing for them before
        ``until`` (a store from before the migration, or sources that do not heartbeat: liveness unknown, as
        before).  Host heartbeats and syslog-ng's MARK (site ``*``) count as in :meth:`_fresh_sources`.
        ``known=False``: only the range's heartbeats are wanted (a live run's file-growth test), the log's first
        minute is not looked up (``known_from`` is then ``start``: do not judge liveness before it)."""
        fresh_s = float(self.rules["health"]["heartbeat_fresh_seconds"])
        fresh_ms = round(fresh_s * 1000)
        # (no listener's heartbeats: in the log a listener label is always a listener's, senders never heartbeat)
        where = _site_rows_sql(site, f"NOT {_LISTENER_SQL}")
        src_expr = "concat(origin_host, '/', if(origin_file IN ('', '-'), '', origin_file))"
        # the listeners of the site and of every site, as listener_key entries (liveness is the site's sources'
        # heartbeats; see SourceGapDetector for what a listener tells).  The log is "known" from the first beat of
        # either: a listener heartbeat that may receive the site's senders logged means the log was being written
        # then, so a site heard only through network senders is judged as live runs judge it ("no heartbeats"),
        # not "unknown" for good
        lwhere = f"site IN ({_q(site)}, '*') AND {_LISTENER_SQL}"
        lkey = f"concat({_q(LISTENER_KEY)}, site, '\\t', origin_host, '\\t', origin_file)"
        known_from = start
        if known:
            first = store.query_rows(
                "SELECT toUnixTimestamp64Milli(tupleElement(min(first_beat), 1)), count() "
                f"FROM source_heartbeat_minute WHERE (({where}) OR ({lwhere})) AND minute <= {_sql_ts(until)}")
            if not first or not int(first[0][1]):
                return None
            # heartbeats from before the log began may still have been fresh for fresh_s after its first one
            ms = int(first[0][0]) + fresh_ms
            known_from = _utc(-(-ms // 60_000) * 60)
        lo = start - timedelta(seconds=fresh_s + 60)
        # runs of heartbeats at most fresh_s apart, merged in the store (one row per run, not per minute)
        spans = store.query_rows(
            "SELECT src, min(f), max(l) FROM ("
            "SELECT src, f, l, sum(brk) OVER (PARTITION BY src ORDER BY f ROWS UNBOUNDED PRECEDING) AS run FROM ("
            "SELECT src, f, l, if(f - lagInFrame(l, 1, toInt64(-1)) OVER (PARTITION BY src ORDER BY f "
            f"ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) > {fresh_ms} OR "
            "lagInFrame(l, 1, toInt64(-1)) OVER (PARTITION BY src ORDER BY f "
            "ROWS BETWEEN 1 PRECEDING AND CURRENT ROW) < 0, 1, 0) AS brk FROM ("
            "SELECT src, toInt64(toUnixTimestamp64Milli(tupleElement(min(first_beat), 1))) AS f, "
            "toInt64(toUnixTimestamp64Milli(tupleElement(max(last_beat), 1))) AS l FROM ("
            f"SELECT {src_expr} AS src, minute, first_beat, last_beat FROM source_heartbeat_minute WHERE {where} "
            f"AND minute >= {_sql_ts(lo)} AND minute <= {_sql_ts(until)} "
            f"UNION ALL SELECT {lkey} AS src, minute, first_beat, last_beat FROM source_heartbeat_minute "
            f"WHERE {lwhere} AND minute >= {_sql_ts(lo)} AND minute <= {_sql_ts(until)}) "
            "GROUP BY src, minute))) GROUP BY src, run")

        def samples(src: str, lo_ms: int, hi_ms: int) -> list[Beat]:
            beats: list[Beat] = []
            for f_ms, f_size, f_ino, l_ms, l_size, l_ino in store.query_rows(
                    "SELECT toUnixTimestamp64Milli(tupleElement(min(first_beat), 1)), tupleElement(min(first_beat), 2), "
                    "tupleElement(min(first_beat), 3), toUnixTimestamp64Milli(tupleElement(max(last_beat), 1)), "
                    "tupleElement(max(last_beat), 2), tupleElement(max(last_beat), 3) "
                    f"FROM source_heartbeat_minute WHERE {where} AND {src_expr} = {_q(src)} "
                    f"AND minute >= {_sql_ts(_utc(lo_ms // 60_000 * 60))} AND minute <= {_sql_ts(_utc(hi_ms // 1000))} "
                    "GROUP BY minute ORDER BY minute"):
                for b in ((int(f_ms), int(f_size), int(f_ino)), (int(l_ms), int(l_size), int(l_ino))):
                    if lo_ms <= b[0] <= hi_ms and (not beats or beats[-1] != b):
                        beats.append(b)
            return beats

        return HeartbeatLog(known_from, ((str(a), int(b), int(c)) for a, b, c in spans), fresh_s, samples,
                            growth_window_s=60.0 * int(self.rules["health"]["gap_min_minutes"]))

    def _read_transfer(self, store: Any, rt: _SiteRuntime, start: datetime,
                       until: datetime) -> list[tuple[datetime, list[tuple[str, list[TransferRow]]]]]:
        """Complete transfer/latency windows from the transfer cursor (or ``start``) to ``until``, in order."""
        w = int(self.rules["transfer"]["window_minutes"])
        first = rt.transfer_cursor or start
        specs = (("transfer_regression", "transfer", "quantilesTDigestMerge(0.05, 0.5, 0.95)(rate_q)"),
                 ("latency_regression", "latency", "quantilesTDigestMerge(0.5, 0.95, 0.99)(elapsed_q)"))
        by: dict[datetime, list[tuple[str, list[TransferRow]]]] = {}
        for kind, section, expr in specs:
            classes = ", ".join(_q(c) for c in self.rules[section]["size_classes"])
            rows = store.query_rows(
                f"SELECT toStartOfInterval(minute, INTERVAL {w} MINUTE) AS w, origin_host, upstream, size_class, "
                f"sum(requests), {expr} FROM transfer_minute "
                f"WHERE site = {_q(rt.name)} AND size_class IN ({classes}) AND minute >= {_sql_ts(first)} "
                f"AND minute < {_sql_ts(until)} GROUP BY w, origin_host, upstream, size_class ORDER BY w")
            grouped: dict[datetime, list[TransferRow]] = {}
            for wstart, host, up, sc, n, qs in rows:  # transfer: (q05, median, q95) of rates; latency: p50/p95/p99
                grouped.setdefault(_utc(wstart), []).append(
                    (str(host), str(up), str(sc), int(n), float(qs[1]), float(qs[0])))
            for ws, lst in grouped.items():
                by.setdefault(ws, []).append((kind, lst))
        out = []
        for wstart in sorted(by):
            wend = wstart + timedelta(minutes=w)
            if wend > until:  # incomplete window: read again next time
                break
            out.append((wend, by[wstart]))
        return out

    # -- feeding (in memory only) --------------------------------------------------------------------------
    def _feed(self, rt: _SiteRuntime, win: _Window) -> tuple[list[Detection], list[_VisitorQuery]]:
        """Feed the window to the site's detectors.  Returns the detections (opened, updated, closed) and the
        visitor figures the topic surges among them need.  Sources are fed first: a minute in which one of the
        site's log sources is in a ``pipeline_gap`` is no data for the site's seasonal model (not fed, so never a
        dip and kept out of its baselines), for at most ``health.gap_blinds_site_hours`` from the gap's start: a
        source retired for good does not blind the site's detector forever (its traffic is then judged
        without that source)."""
        enabled = set(self.cfg.enabled)
        health = self.rules["health"]
        out: list[Detection] = []
        visits: list[_VisitorQuery] = []
        blocked: list[tuple[datetime, datetime, datetime]] = []
        hb = win.hb_log
        # the window's minutes at which the site's retirement (every source retired) changes: (minute, retired_at
        # or None), recorded in the sources' minute loop, as the sources stood then
        gone_steps: list[tuple[datetime, datetime | None]] = []

        def gone_at(t: datetime) -> datetime | None:
            """The site's retirement at ``t`` (:meth:`SourceGapDetector.site_retired`): recorded for the
            window's minutes (the window's source lines are all fed first), asked afresh at its end."""
            if t >= win.until:
                return rt.sources.site_retired(t)
            k = bisect.bisect_right(gone_steps, t, key=lambda x: x[0])
            return gone_steps[k - 1][1] if k else None

        def logged(t: datetime) -> bool:
            """``t`` is judged with the heartbeat log (known then)."""
            return hb is not None and t >= hb.known_from

        # the heartbeats that tell whether files grow at the window's end (live: the last minutes' up to now)
        end_log = win.hb_recent if win.live else (hb if hb is not None and win.until >= hb.known_from else None)
        grace = timedelta(seconds=float(health.get("stuck_grace_seconds", 120)))

        def grew_in(log_: HeartbeatLog | None) -> Callable[[str, datetime, datetime], bool] | None:
            """``grew(src, last line minute, t)``: the source's file grew after its silence began (plus
            ``stuck_grace_seconds`` for lines already on their way) -- written but not read."""
            if log_ is None:
                return None
            return lambda src, last, t: log_.grew(src, last + timedelta(minutes=1) + grace, t)

        if "site" in enabled:
            # minute by minute, as live runs see it: at each minute, the sources silent up to it (a pipeline_gap
            # opens gap_min_minutes into a silence, not when the lines come back).  Without the heartbeat log,
            # heartbeats are known at the evaluated time only; a source heartbeating then is taken as alive
            # through a silence that lasts to it (a silence that ended earlier is still a gap, found when its
            # lines came back).
            src_rows = sorted(win.source_rows, key=lambda r: r[1])
            rt.sources.heartbeating = win.heartbeating
            rt.sources.set_retired(win.retired)
            i, m = 0, win.start
            # the heartbeats read tell about the window's end (live: its last minute, as in a run per minute);
            # with the heartbeat log, every earlier minute is judged with the heartbeats of its own time
            judged_from = win.until - timedelta(minutes=1) if win.live else win.until
            while m < win.until:
                if rt.sources.retired:  # (lines before m fed, none after: site_retired is exact here)
                    g = rt.sources.site_retired(m)
                    if g != (gone_steps[-1][1] if gone_steps else None):
                        gone_steps.append((m, g))
                if rt.sources.recent:
                    if logged(m) and m < judged_from:
                        beats = hb.at(m)  # type: ignore[union-attr]
                        out.extend(_reported(rt.sources.tail(m, beats, grew=grew_in(hb)), m - timedelta(minutes=1)))
                        if beats:
                            rt.sources.alive(m, beats, grew=grew_in(hb))
                    else:
                        out.extend(_reported(rt.sources.tail(m, win.fresh, m >= judged_from),
                                             m - timedelta(minutes=1)))
                while i < len(src_rows) and src_rows[i][1] <= m:
                    src, sm, n = src_rows[i]
                    out.extend(_reported(rt.sources.update(src, sm, n), sm))
                    i += 1
                m += timedelta(minutes=1)
            for src, sm, n in src_rows[i:]:
                out.extend(_reported(rt.sources.update(src, sm, n), sm))
            out.extend(_reported(rt.sources.tail(win.until, win.fresh, grew=grew_in(end_log)),
                                 win.until - timedelta(minutes=1)))
            rt.sources.alive(win.until, win.fresh, grew=grew_in(end_log))
            last = win.until - timedelta(minutes=1)
            never = datetime.min.replace(tzinfo=UTC)
            # a source gap blinds the site only for a source that carried gap_blinds_min_share of its lines (a
            # one-off sender or a minor file falling silent must not switch the site's spikes and dips off)
            min_share = float(health.get("gap_blinds_min_share", 0.0))
            blocked = [(d.start, d.end or last, d.detail.get("_reported", never))
                       for d in out if d.kind == "pipeline_gap" and d.detail.get("site_share", 1.0) >= min_share]
            blocked += [(d.start, last, d.detail.get("_reported", never)) for d in rt.sources.open.values()
                        if d.detail.get("site_share", 1.0) >= min_share]
            cap = timedelta(hours=float(health.get("gap_blinds_site_hours", 24)))
            blocked = [(lo, min(hi, lo + cap), r) for lo, hi, r in blocked]
            blocked = [(lo, hi, r) for lo, hi, r in blocked if hi >= win.start]

        def feed_site(minute: datetime, value: float, known_at: datetime) -> None:
            """``known_at``: the minute a minute-by-minute live run feeds ``minute`` at -- only the source gaps
            reported by then block it (a gap found later is back-dated, but that run could not know it)."""
            if not any(lo <= minute <= hi and r <= known_at for lo, hi, r in blocked):
                out.extend(_reported(rt.seasonal.update(minute, value), minute))

        if win.groups is not None:  # live: the groups' tables changed since they were read
            rt.topics.set_groups(win.groups)
            rt.groups_mark = win.groups_mark
        err_frac = float(health["error_statuses_fraction"])
        gap_min = timedelta(minutes=int(health["gap_min_minutes"]))
        use_pv = health.get("metric", "pageviews") == "pageviews"

        def down_silent() -> bool:
            """A silence of a site that was down (errors, or an outage open) when it fell silent, outside a
            ``pipeline_gap``: its minutes are judged as they come, not ``gap_min_minutes`` in (see site_tail)."""
            return rt.gap is None and (rt.down_silence_from is not None or rt.seasonal.down)

        def feed_zeros(until: datetime) -> None:
            """The silent minutes after ``rt.last_seen`` up to ``until`` are zeros (the site answered nothing)."""
            assert rt.last_seen is not None
            m = rt.last_seen + timedelta(minutes=1)
            while m < until:
                feed_site(m, 0.0, until - timedelta(minutes=1))
                rt.last_seen = m
                m += timedelta(minutes=1)

        def site_tail(until: datetime, fresh: set[str], log_: HeartbeatLog | None) -> None:
            """A run's step at ``until`` for a site silent since ``rt.last_seen``: lines stopped but the
            shippers heartbeat -> the site answers nothing (zeros, the outage path); no heartbeat, or a log file
            that grows meanwhile (written, not read: a stuck shipper) -> a ``pipeline_gap`` (unless a quiet
            night).  A site down (its last minutes answered errors: an outage is being confirmed or is open) that
            falls silent while the shippers heartbeat gets its zeros at once, not ``gap_min_minutes`` later: an
            error storm turning into silence is confirmed as an outage when its down minutes add up, not 10
            minutes after (user trial 33).  A file then seen growing (within ``gap_min_minutes``: the zeros are
            judged in chunks of that length) stops the zeros and opens the ``pipeline_gap`` from the silence's
            first minute; without heartbeats the gap begins after the minutes fed as zeros."""
            assert rt.last_seen is not None
            gone = gone_at(until)
            if gone is not None:
                # every source of the site retired, silent since (the site is gone): its silence is no
                # pipeline_gap and no zeros; an open gap closes where the retirement begins (as a source's)
                if rt.gap is not None:
                    g, rt.gap = _close_by_retirement(rt.gap, gone), None
                    assert g.end is not None
                    g.expected = _gap_expected(rt, g.start, g.end)
                    blocked.append((g.start, g.end, datetime.min.replace(tzinfo=UTC)))
                    out.extend(_reported([g], until - timedelta(minutes=1)))
                    rt.retired_gap = g.start
                else:  # a run that did not see the gap open (restarted, or history): the gap it would have had
                    out.extend(_reported(self._silence_gap(rt, until, health, gone), until - timedelta(minutes=1)))
                if rt.seasonal.open:  # an outage (its hosts heartbeat on) or dip open: the site is gone, not down
                    out.extend(_reported(rt.seasonal.close_open("retired", _last_before_retirement(gone)),
                                         until - timedelta(minutes=1)))
                rt.down_silence_from = None
                return
            fresh = sources_only(fresh)  # a listener's heartbeats say nothing of the site
            silent_from = rt.down_silence_from or rt.last_seen + timedelta(minutes=1)
            tail = until - silent_from
            early = tail < gap_min
            if early and not (fresh and down_silent()):
                return
            grown = log_.growing(silent_from + grace, until) if fresh and log_ else []
            if early:
                if not grown and until - rt.last_seen > timedelta(minutes=1):
                    rt.down_silence_from = silent_from
                    feed_zeros(until)
                return
            if rt.gap is not None and rt.gap.detail.get("growing"):
                return  # the files were seen growing: no lines since is the shipper's silence until lines return
            if fresh and not grown:
                if rt.gap is not None:
                    # the shippers heartbeat again: the pipeline is back (it stayed "open" until lines came, for
                    # a quiet site hours after the collector had returned); what follows is the site's silence,
                    # judged on the outage path, and the gap's own minutes stay out of the seasonal model.  Closed
                    # once the heartbeats have been back HEARTBEATS_BACK_CONFIRM (lines returning with them close
                    # it as before, live and history alike), ending the minute before they came back
                    since = rt.gap.detail.setdefault("_back_since", until)
                    if until - since < HEARTBEATS_BACK_CONFIRM:
                        return
                    back = since - timedelta(minutes=1)
                    rt.gap.end, rt.gap.state = back, "closed"
                    rt.gap.detail["closed_by"] = "heartbeats"
                    rt.gap.expected = _gap_expected(rt, rt.gap.start, back)
                    blocked.append((rt.gap.start, back, datetime.min.replace(tzinfo=UTC)))
                    out.extend(_reported([rt.gap], until - timedelta(minutes=1)))
                    rt.gap = None
                    rt.last_seen = max(rt.last_seen, back)
                feed_zeros(until)
                rt.down_silence_from = None  # judged to here: a file growing later is a gap from here on
            elif rt.gap is not None:
                rt.gap.detail.pop("_back_since", None)  # silent again before the return was confirmed
            elif not self._quiet(rt, until, int(tail.total_seconds() // 60), health):
                why: dict[str, Any] = ({"reason": "no lines while log files grow", "growing": grown} if grown
                                       else {"reason": "no lines and no heartbeats"})
                # a growing file: the shipper stopped reading when the silence began (zeros fed meanwhile were
                # wrong); no heartbeats: the gap begins after the minutes judged with fresh heartbeats
                gap_start = silent_from if grown else rt.last_seen + timedelta(minutes=1)
                rt.down_silence_from = None
                rt.gap = Detection("pipeline_gap", "pipeline", gap_start, None, gap_start, 0.0,
                                   _gap_expected(rt, gap_start, until - timedelta(minutes=1)), 1.0,
                                   "pipeline_gap", why, site=rt.name)
                out.extend(_reported([rt.gap], until - timedelta(minutes=1)))

        def logged_tails(upto: datetime) -> None:
            """The steps live runs would have made at each minute ``t <= upto`` of a silence, with the heartbeats
            of the time (history, or a live catch-up, with the heartbeat log)."""
            if hb is None or rt.last_seen is None:
                return

            def first() -> datetime:  # the first minute site_tail may act at (every minute while the site is down)
                assert rt.last_seen is not None
                lead = timedelta(minutes=1) if down_silent() else gap_min
                return rt.last_seen + timedelta(minutes=1) + lead

            t = max(first(), hb.known_from, win.start + timedelta(minutes=1))
            while t <= upto:
                site_tail(t, hb.at(t), hb)
                t = max(t + timedelta(minutes=1), first())

        for minute, req, err, tviews, pv in win.site_rows:
            if "site" in enabled:
                logged_tails(minute)
                out.extend(_reported(self._gap_check(rt, minute, health, gone_at), minute))
                if rt.last_seen is not None and timedelta(minutes=1) < minute - rt.last_seen <= gap_min:
                    m = rt.last_seen + timedelta(minutes=1)  # a few minutes without rows = minutes with 0 requests
                    while m < minute:
                        feed_site(m, 0.0, minute)
                        m += timedelta(minutes=1)
                # answered traffic: an error storm reads as zero; pageviews scaled by the answered share.  Blocked
                # only by source gaps reported by this minute, as a minute-by-minute live run knows them: a gap
                # found later in the same batch (history, a live catch-up) is back-dated to where the silence
                # began, and blocking by it left out minutes live had judged (a spike confirmed live 3 minutes
                # after a minor source fell silent was missed by history and by a restart's warm-up)
                ok = 0.0 if req and err / req >= err_frac else 1.0 - (err / req if req else 0.0)
                feed_site(minute, ok * float(pv if use_pv else req), minute)
            rt.last_seen, rt.down_silence_from = minute, None
            if "topic" in enabled and (win.topics_from is None or minute >= win.topics_from):
                for d in _reported(rt.topics.update(minute, win.topic_rows.get(minute, {}), int(tviews)), minute):
                    if d.peak_ts == minute:
                        q = self._visitor_query(rt, d, minute)
                        if q is not None:
                            visits.append(q)
                    out.append(d)
        if "site" in enabled and rt.last_seen is not None:
            logged_tails(win.until - timedelta(minutes=1))
            site_tail(win.until, win.fresh, end_log)
        if "transfer" in enabled:
            for wend, lst in win.transfer:
                for kind, rows in lst:
                    out.extend(_reported(rt.transfer.update(kind, wend, rows), wend))
                rt.transfer_cursor = wend
        return out, visits

    def _visitor_query(self, rt: _SiteRuntime, det: Detection, minute: datetime) -> _VisitorQuery | None:
        kind, _, ident = det.scope.partition(":")
        ids = [int(ident)] if kind == "topic" else sorted(rt.topics.groups.get(ident, set()))
        return _VisitorQuery(rt.name, det, minute, ids, rt.topics.state.window) if ids else None

    def _add_visitors(self, store: Any, q: _VisitorQuery) -> None:
        """Unique human visitors of the surging topic/group in the window, and their share of the site's."""
        lo = q.minute - timedelta(minutes=q.window - 1)
        cond = f"site = {_q(q.site)} AND minute >= {_sql_ts(lo)} AND minute <= {_sql_ts(q.minute)}"
        tv = store.query_rows(f"SELECT uniqMerge(visitors) FROM topic_minute WHERE {cond} "
                              f"AND topic_id IN ({', '.join(str(i) for i in q.topic_ids)})")
        sv = store.query_rows(f"SELECT uniqMerge(visitors) FROM site_minute WHERE {cond}")
        v, s = int(tv[0][0] or 0), int(sv[0][0] or 0)
        q.det.detail["visitors"] = v
        q.det.detail["visitor_share"] = round(v / s, 5) if s else None

    @staticmethod
    def _quiet(rt: _SiteRuntime, until: datetime, silent: int, health: dict[str, Any]) -> bool:
        """The ``silent`` minutes before ``until`` would normally have fewer than ``gap_min_expected`` requests (a
        quiet night): no lines there is no pipeline gap.  The same test when the lines come back (history) and
        while they are still missing (the tail of a live run), so live and history agree."""
        exp, n = rt.seasonal.expected((until - timedelta(minutes=1)).astimezone(rt.seasonal.tz), min(silent, 1440))
        return bool(n) and exp < float(health["gap_min_expected"])

    def _gap_check(self, rt: _SiteRuntime, minute: datetime, health: dict[str, Any],
                   gone_at: Callable[[datetime], datetime | None]) -> Iterator[Detection]:
        if rt.gap is not None:  # lines are back: the gap closes at the last silent minute
            rt.gap.end, rt.gap.state = minute - timedelta(minutes=1), "closed"
            rt.gap.expected = _gap_expected(rt, rt.gap.start, rt.gap.end)
            yield rt.gap
            rt.gap = None
            return
        if rt.last_seen is not None and minute - rt.last_seen > timedelta(minutes=int(health["gap_min_minutes"])):
            yield from self._silence_gap(rt, minute, health, gone_at(minute))

    def _silence_gap(self, rt: _SiteRuntime, minute: datetime, health: dict[str, Any],
                     gone: datetime | None) -> list[Detection]:
        """The site's closed ``pipeline_gap`` for its silence from ``rt.last_seen`` to ``minute`` (lines back
        then, or a run's step there), unless a quiet night.  ``gone``: every source of the site retired then
        (:meth:`SourceGapDetector.site_retired`): the gap ends where the retirement begins, as the gap a live
        run had open closes there, and there is none when it came before a gap would have opened; reported
        once (``rt.retired_gap``)."""
        gap_min = timedelta(minutes=int(health["gap_min_minutes"]))
        if rt.last_seen is None or minute - rt.last_seen <= gap_min:
            return []
        start, stop = rt.last_seen + timedelta(minutes=1), minute
        more: dict[str, Any] = {}
        if gone is not None:
            if gone <= start + gap_min or rt.retired_gap == start:
                return []
            stop = max(start, _last_before_retirement(gone)) + timedelta(minutes=1)
            more = _retired_detail(gone)
        silent = int((stop - rt.last_seen).total_seconds() // 60) - 1
        if self._quiet(rt, stop, silent, health):
            return []  # a quiet night, not a gap
        if gone is not None:
            rt.retired_gap = start
        exp, n = rt.seasonal.expected((stop - timedelta(minutes=1)).astimezone(rt.seasonal.tz), min(silent, 1440))
        return [Detection("pipeline_gap", "pipeline", start, stop - timedelta(minutes=1), start, 0.0,
                          round(exp, 1) if n else 0.0, 1.0,
                          "pipeline_gap", {"reason": "no lines", "minutes": silent,
                                           "expected_requests": None if not n else round(exp, 1),
                                           "liveness": "unknown", **more},
                          site=rt.name, state="closed")]

    def _advance(self, store: Any, rt: _SiteRuntime, start: datetime, until: datetime,
                 now: datetime, live: bool = False, topics_from: datetime | None = None) -> list[Detection]:
        """History: read ``[start, until)``, feed it and add the visitor figures (an error propagates).  Heartbeats
        are judged at ``now`` (with the live clock-skew allowance when ``live``).  ``topics_from``: the topic
        detectors see the minutes from then on only (as if the data began there).  The topic rows are read a day
        at a time as they are fed: ``rt``'s detectors are half-fed after an error, so they are for this run only."""
        dets, visits = self._feed(rt, self._read(store, rt, start, until, now, live=live,
                                                 topics_from=topics_from, topics_by_day=True))
        for q in {q.det.id: q for q in visits}.values():  # the last peak of each surge decides, as live
            self._add_visitors(store, q)
        return dets

    # -- output -----------------------------------------------------------------------------------------
    def _flush(self, store: Any, now: datetime) -> list[Detection]:
        """Emit the outbox (except detections still waiting for visitor figures): insert what is not stored in
        its current state, then hand each to the producer / print it, and drop from the outbox what the producer
        confirms delivered (:meth:`_confirmed`).  What is not confirmed stays (stored: only the producer is left)
        and is handed again at the next call; on an error the rest stays too."""
        ready = sorted((o for k, o in self._outbox.items() if k not in self._visits),
                       key=lambda o: (o.det.start, o.det.kind, o.det.scope))
        unstored = [o for o in ready if not o.stored]
        if unstored:
            store.insert("detections", detections_table([o.det for o in unstored], now))
            for o in unstored:
                o.stored = True
            self.stored_total += len(unstored)
        handed: list[_Outgoing] = []
        try:
            for o in ready:
                line = o.det.to_json()
                if self.producer is not None:
                    self.producer(self.events_topic, o.det.id.encode(), line.encode())
                if self.echo and not o.shown:
                    print(line, file=self.out, flush=True)
                    o.shown = True
                handed.append(o)
        finally:
            done = self._confirmed([o.det.id.encode() for o in handed])
        sent = []
        for o in handed:
            if o.det.id.encode() in done and self._outbox.get(o.det.id) is o:
                del self._outbox[o.det.id]
                sent.append(o.det)
        return sent

    def _confirmed(self, keys: list[bytes]) -> set[bytes]:
        """The keys among ``keys`` (handed to the producer by this flush) whose delivery is confirmed.  A producer
        with a ``confirm()`` method (live: :class:`forumpulse.pipeline.live_detect.EventsPublisher`, which waits
        for Kafka's delivery reports) says which; for a plain callable, or none, handing over is delivery."""
        confirm = getattr(self.producer, "confirm", None)
        if confirm is None or not keys:
            return set(keys)
        return set(confirm()) & set(keys)

    def _emit(self, store: Any, dets: list[Detection], now: datetime) -> None:
        if not dets:
            return
        store.insert("detections", detections_table(dets, now))
        for d in dets:
            line = d.to_json()
            if self.echo:
                print(line, file=self.out, flush=True)
            if self.producer is not None:
                self.producer(self.events_topic, d.id.encode(), line.encode())
        keys = [d.id.encode() for d in dets] if self.producer is not None else []
        missing = len(set(keys) - self._confirmed(keys))
        if missing:
            raise RuntimeError(f"{missing} detection(s) stored but their delivery to {self.events_topic} was not "
                               "confirmed")


def detect_history(store: Any, start: datetime, end: datetime | None, settings: Any = None, echo: bool = False,
                   out: Any = None, sites: Iterable[str] | None = None,
                   now: datetime | None = None, record: bool = True) -> list[Detection]:
    """Run every traffic detector over ``[start, end)`` (baselines warmed with ``history_days`` before ``start``);
    returns the final state of each detection overlapping the range — started in it, or started before and still
    open at ``start`` or ended at/after it — plus any that ended before ``start`` while ``detections`` still has
    them open (an earlier run's range ended while they were open), and, with ``record`` (default), writes them to ``detections`` (what
    Grafana's annotations and the reports read; idempotent by detection id, see below for what is not
    overwritten).  Liveness is judged at each minute from the heartbeat log, else
    (before the log's first minute) at ``end`` from heartbeats not later than ``end``.

    ``end=None``: up to now as a live run reads it -- per site, the last complete minute before ``now`` (default:
    the wall clock) minus ``lag_minutes``, and not past the site's watermark (:meth:`TrafficDetector._watermark`),
    with heartbeats judged at ``now`` (live clock-skew allowance): the partly loaded current minute is never read.

    Each minute is judged with the heartbeats of its own time from the heartbeat log (migration 0008), as live
    runs judged it.  Where the log has nothing for the site's sources yet (a store from before the migration,
    sources that never heartbeat) history knows heartbeats only at the evaluated time, so a silence that ended
    before it is a ``pipeline_gap`` with ``detail.liveness = "unknown"``; such a gap is returned (and printed) but
    not written to ``detections`` when the store holds an ``outage`` of the site overlapping it: a live run saw the
    sources heartbeating through that silence, and its outage stands."""
    det = TrafficDetector(settings, echo=False, out=out, sites=sites)
    # warmed at least as far back as the site baseline looks for its reference days (REFERENCE_DAYS_BACK): with
    # only history_days (15), a day after a festival week found fewer same-kind days than a run over more data,
    # so a nightly run (--from D --to D+1) gave the same dip another start, another id, and left that record
    # open for ever (user trial 31)
    warm = _utc(start) - timedelta(days=max(det.cfg.history_days, REFERENCE_DAYS_BACK + 1))
    # the topic detectors' baselines reach baseline_hours (7 days) back: they are warmed with history_days, as a
    # live run's are.  Fed the site's 43 days, a one-day run of a forum with 300 topics read every minute took
    # 1,423 s and 5.2 GB (most of it in the topic detectors); fed 15 days, 604 s and 2.1 GB
    topics_from = _utc(start) - timedelta(days=det.cfg.history_days)
    lag = det.cfg.lag_minutes
    det.cfg = det.cfg.model_copy(update={"lag_minutes": 0})
    clock = _utc(now or datetime.now(UTC))
    latest: dict[str, Detection] = {}
    ends: dict[str, datetime] = {}
    for name in det._site_names(store):
        rt = det._site(store, name)
        if end is None:
            until = clock.replace(second=0, microsecond=0) - timedelta(minutes=lag)
            mark = det._watermark(store, name, clock)
            if mark is not None:
                until = min(until, mark.replace(second=0, microsecond=0))
            ends[name] = until
            dets = det._advance(store, rt, warm, until, clock, live=True, topics_from=topics_from) \
                if warm < until else []
        else:
            ends[name] = _utc(end)
            dets = det._advance(store, rt, warm, _utc(end), _utc(end), topics_from=topics_from)
        for d in dets:
            latest[d.id] = _first_report(latest.get(d.id), d)
        for d in rt.seasonal.finish():
            latest[d.id] = _first_report(latest.get(d.id), d)
    out_list = [d for d in latest.values() if d.end is None or _utc(d.end) >= _utc(start)]
    # An event that ended before --from but that the store still has open -- an earlier run over a range ending
    # while it was open (last night's --from D-1 --to D), with an end back-dated before D: a gap whose lines came
    # back at 00:00 ends at 23:59, an outage at the minute the traffic came back -- is written closed too, or
    # its record stayed open for ever (a review found both).
    ended = [d for d in latest.values() if d.end is not None and _utc(d.end) < _utc(start)]
    stored_open: set[str] = set()
    for k in range(0, len(ended), 1000):  # (in chunks: a busy site's warm-up ends many events)
        stored_open |= {str(r[0]) for r in store.query_rows(
            f"SELECT id FROM detections FINAL WHERE id IN ({', '.join(_q(d.id) for d in ended[k:k + 1000])}) "
            "AND state = 'open'")}
    out_list += [d for d in ended if d.id in stored_open]
    out_list.sort(key=lambda d: (d.start, d.kind, d.scope))
    # An event still open at this run's end that the store already has closed at or after that end was seen
    # to its end by a run over more data (live, or history with a later --to): keep that state, do not write
    # this run's truncated view over it (it is still printed: it is what this range shows).
    later: set[str] = set()
    for name in {d.site for d in out_list if d.state == "open"}:
        still_open = [d for d in out_list if d.state == "open" and d.site == name]
        later |= {str(r[0]) for r in store.query_rows(
            f"SELECT id FROM detections FINAL WHERE id IN ({', '.join(_q(d.id) for d in still_open)}) "
            f"AND state = 'closed' AND end_ts >= {_sql_ts(ends[name] - timedelta(minutes=1))}")}
    kept_closed = len(later)
    later |= _gaps_under_stored_outages(store, out_list)
    if out_list and record:
        det._emit(store, [d for d in out_list if d.id not in later], datetime.now(UTC))
        if kept_closed and echo:
            print(f"note: {kept_closed} event(s) still open at the end of this range were closed by an earlier run "
                  "over more data: printed as open here, their stored closed record is kept", file=sys.stderr)
    if record:
        # the minutes this run judged, per site (report daily tells a day no run covered from a quiet one); after
        # the detections, which a store not yet migrated to 0010 must not lose
        try:
            record_runs(store, [(name, "history", _utc(start), until) for name, until in ends.items()],
                        datetime.now(UTC))
        except Exception as exc:
            print(f"warning: the judged range was not recorded in detection_runs (run `forumpulse db migrate` after "
                  f"an upgrade): {(str(exc).splitlines() or [''])[0][:200]}", file=sys.stderr)
    if echo:
        for d in out_list:
            print(d.to_json(), file=out or sys.stdout)
    return out_list


def _gaps_under_stored_outages(store: Any, dets: list[Detection]) -> set[str]:
    """Ids of the ``pipeline_gap`` detections of unknown liveness (history: a silence that ended before the
    evaluated time) overlapping an ``outage`` of their site already in ``detections``: a live run judged those
    minutes with the heartbeats of the time (sources alive, the site answering nothing)."""
    gaps = [d for d in dets if d.kind == "pipeline_gap" and d.detail.get("liveness") == "unknown"]
    if not gaps:
        return set()
    lo = min(d.start for d in gaps)
    hi = max(d.end or d.start for d in gaps)
    rows = store.query_rows(
        "SELECT site, start_ts, end_ts FROM detections FINAL WHERE kind = 'outage' "
        f"AND site IN ({', '.join(sorted({_q(d.site) for d in gaps}))}) AND start_ts <= {_sql_ts(hi)} "
        f"AND (end_ts IS NULL OR end_ts >= {_sql_ts(lo)})")
    outages = [(str(site), _utc(a), _utc(b) if b is not None else None) for site, a, b in rows]
    return {d.id for d in gaps
            if any(site == d.site and a <= (d.end or d.start) and (b is None or b >= d.start)
                   for site, a, b in outages)}


def detect_history_command(
    from_: Annotated[str, typer.Option("--from", help="start (ISO date/time, UTC unless an offset is given)")] = "",
    to: Annotated[str, typer.Option("--to", help="end, exclusive (default: now -- the last complete minute before now minus lag_minutes, not past the "
                                                             "watermark, as live)")] = "",
    config: Annotated[str | None, typer.Option("--config", "-c", help="forumpulse.yaml")] = None,
    store_url: Annotated[str | None, typer.Option("--store", help="chdb:PATH or clickhouse://...")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print only: do not record the detections in the "
                                          "store's detections table")] = False,
) -> None:
    """Run the traffic detectors over the store's rollups for a time range; prints JSON lines and records them
    in the store's detections table (Grafana annotations and reports read it), unless --dry-run.  A note on
    stderr says when nothing was found and when --to lies past a site's data (minutes without lines or
    heartbeats read as a pipeline gap)."""
    _history_cli(from_, to, config, store_url, record=not dry_run)


def _hosts_without_timing(store: Any, start: datetime, end: datetime) -> dict[str, list[str]]:
    """Site -> origin hosts with requests in ``start..end`` but none with a response time (``transfer_minute``
    has only timed rows): the transfer and latency detectors never see those hosts, which would otherwise pass
    in silence.  Reads the raw ``requests`` (two low-cardinality columns); hosts whose raw rows have expired are
    not listed."""
    lo = _sql_ts(start.replace(second=0, microsecond=0))  # whole minutes on both sides, end exclusive
    seen = store.query_rows(f"SELECT DISTINCT site, origin_host FROM requests WHERE ts >= {lo} "
                            f"AND ts < {_sql_ts(end)}")
    timed = {(str(a), str(b)) for a, b in store.query_rows(
        f"SELECT DISTINCT site, origin_host FROM transfer_minute WHERE minute >= {lo} AND minute < {_sql_ts(end)}")}
    out: dict[str, list[str]] = {}
    for site, host in sorted((str(a), str(b)) for a, b in seen):
        if (site, host) not in timed:
            out.setdefault(site, []).append(host or "(none)")
    return out


def _gap_expected(rt: Any, start: datetime, last: datetime) -> float:
    """A site-scope ``pipeline_gap``'s ``expected``: the seasonal expectation of the site's requests over its
    minutes ``start..last`` (up to the last day of them), 0 when the site has no reference days yet.  Open, it is
    that of the silence so far; closed, of the whole gap (live and history store the same figure)."""
    minutes = int((last - start).total_seconds() // 60) + 1
    exp, n = rt.seasonal.expected(last.astimezone(rt.seasonal.tz), max(1, min(minutes, 1440)))
    return round(exp, 1) if n else 0.0


def _history_cli(from_: str, to: str, config: str | None, store_url: str | None, record: bool = True) -> None:
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.store import open_store

    settings = load_settings(config)  # ConfigError / StoreError below: reported by the CLI's main()

    def when(text: str, name: str) -> datetime:
        try:
            return _utc(datetime.fromisoformat(text.replace("Z", "+00:00")))
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not an ISO 8601 date or time", param_hint=name) from None

    now = datetime.now(UTC)
    start = when(from_, "--from") if from_ else now - timedelta(days=1)
    # without --to: up to now as live reads it (whole minutes, lag_minutes and the watermark; detect_history)
    end = when(to, "--to") if to else None
    if (end or now) <= start:
        raise typer.BadParameter(f"--to ({to or 'now'}) is not after --from ({from_ or 'a day ago'})")
    store = open_store(store_url or settings.store.url, existing=True)
    try:
        found = detect_history(store, start, end, settings, echo=True, now=now, record=record)
        spans = {str(site): (_utc(lo), _utc(hi)) for site, lo, hi in store.query_rows(
            "SELECT site, min(minute), max(minute) FROM site_minute GROUP BY site")}
        untimed = (_hosts_without_timing(store, start, end or now)
                   if "transfer" in validate_detectors_section(settings.detectors).traffic.enabled else {})
    finally:
        store.close()

    def z(t: datetime) -> str:
        return t.replace(microsecond=0).isoformat().replace("+00:00", "Z")

    # the sites the detectors ran over: the configured ones and every one with data (TrafficDetector._site_names)
    names = sorted({s.name for s in settings.sites} | set(spans))
    configured = {s.name for s in settings.sites}
    for name in names:
        span = spans.get(name)
        if span is None:
            print(f"note: site {name}: no data in the store", file=sys.stderr)
            continue
        if name not in configured:
            print(f"note: site {name}: not in the configuration: judged in UTC "
                  "with no holiday calendar (add it under sites: with its timezone and country)", file=sys.stderr)
        if untimed.get(name):
            print(f"note: site {name}: no response times from origin host(s) {', '.join(untimed[name])} in this "
                  "range: transfer and latency regressions were not judged there (their log format has no "
                  "response time: log one, e.g. Apache %D (preset combined_d), nginx $request_time, squid's "
                  "native format)", file=sys.stderr)
        if end is not None and end > span[1] + timedelta(minutes=1):
            print(f"note: site {name}: its data ends at {z(span[1] + timedelta(minutes=1))} (last minute "
                  f"{z(span[1])}); the minutes after it up to --to are judged as silence (a pipeline_gap when no "
                  "heartbeats either, recorded as open until a run over later data closes it; --dry-run only "
                  "prints)", file=sys.stderr)
    if not found:
        have = ", ".join(f"{n} {z(a)} to {z(b + timedelta(minutes=1))}" for n, (a, b) in sorted(spans.items()))
        print(f"note: no detections from {z(start)} to {z(end) if end is not None else 'now'}; the store's data: "
              f"{have or 'none'}", file=sys.stderr)
    elif not record:
        print(f"note: --dry-run: {len(found)} detection(s) printed, not recorded", file=sys.stderr)
