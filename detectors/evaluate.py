"""Detector evaluation (``make eval`` = ``python -m forumpulse.detectors.evaluate``).

Parts (each says clearly when its data is absent and goes on with the others):

* **NAB v1.0** (``<data>/nab``): our streaming scorer (:func:`forumpulse.detectors.series.anomaly_scores`,
  parameters from ``detectors/rules/traffic.yaml`` section ``series``) on all 58 files, scored with our NAB scorer
  (:mod:`forumpulse.detectors.nab`) for the three profiles: at NAB's optimised threshold (exact sweep) and at our
  shipped threshold, on the full corpus, realTweets and realKnownCause/nyc_taxi, next to the published scoreboard;
  then NAB's protocol check: Relative Entropy re-implemented (:mod:`forumpulse.detectors.nab_baseline`), scored as
  NAB runs it (the file's range known in advance) and streaming.
* **NASA-HTTP 1995** (``<data>/nasa_http_1995``): the seasonal event detector over requests per minute in
  America/New_York with the US calendar; every detection is printed and matched against ``events.json``.
* **Simulator** (``forumpulse.pipeline.simulate``, when installed): see :func:`simulator_part`.

``--data`` defaults to ``../shared/data`` next to the project root (or ``$FORUMPULSE_EVAL_DATA``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from forumpulse.detectors import nab
from forumpulse.detectors.calendar import SiteCalendar
from forumpulse.detectors.series import Detection, anomaly_scores, run_seasonal
from forumpulse.detectors.traffic import load_rules, score_params, seasonal_params

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data"


def _say(msg: str = "") -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------------------- NAB


@dataclass
class NabRun:
    rows: list[tuple[str, str, str, float, float, int]]  # (profile, subset, mode, threshold, score, windows)
    seconds: float
    n_rows: int


SUBSETS: dict[str, Callable[[str], bool]] = {
    "all 58 files": lambda f: True,
    "realTweets": lambda f: f.startswith("realTweets/"),
    "realKnownCause/nyc_taxi": lambda f: f == "realKnownCause/nyc_taxi.csv",
}


def nab_part(nab_dir: Path, rules: dict[str, Any]) -> NabRun | None:
    if not (nab_dir / "labels" / "combined_windows.json").is_file():
        _say(f"NAB: data absent ({nab_dir}/labels/combined_windows.json not found) -- skipped")
        return None
    windows = nab.load_windows(nab_dir / "labels" / "combined_windows.json")
    params = score_params(rules)
    t0 = time.perf_counter()
    series: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    n_rows = 0
    for name in sorted(windows):
        df = pd.read_csv(nab_dir / "data" / name)
        ts = pd.to_datetime(df["timestamp"]).to_numpy()
        series[name] = (ts, anomaly_scores(df["value"].to_numpy(dtype=float), params, ts))
        n_rows += len(df)
    seconds = time.perf_counter() - t0
    rows = []
    for profile in nab.PROFILES:
        files = {name: (s, nab.row_weights(len(s), nab.window_indices(ts, windows[name]), profile))
                 for name, (ts, s) in series.items()}
        best_t, _ = nab.optimise_threshold(list(files.values()))
        for mode, thr in (("optimised", best_t), ("shipped", params.alarm)):
            for subset, pred in SUBSETS.items():
                sub = {k: v for k, v in files.items() if pred(k)}
                res = nab.score_corpus(sub, profile, thr)
                rows.append((profile, subset, mode, thr, res.normalised, res.n_windows))
    return NabRun(rows, seconds, n_rows)


def _published(nab_dir: Path) -> dict[str, dict[str, float]]:
    p = nab_dir / "results" / "final_results.json"
    if not p.is_file():
        return {}
    out: dict[str, dict[str, float]] = json.loads(p.read_text())
    return out


def print_nab(run: NabRun, nab_dir: Path) -> None:
    _say(f"\n## NAB v1.0 ({run.n_rows} rows scored in {run.seconds:.1f} s; threshold optimised by exact sweep "
         "over the whole corpus per profile, subsets scored at that corpus threshold)\n")
    _say("| profile | subset | optimised thr | score | shipped thr | score |")
    _say("|---|---|---|---|---|---|")
    by = {(p, s, m): (t, v) for p, s, m, t, v, _ in run.rows}
    for profile in nab.PROFILES:
        for subset in SUBSETS:
            ot, ov = by[(profile, subset, "optimised")]
            st, sv = by[(profile, subset, "shipped")]
            _say(f"| {profile} | {subset} | {ot:.4f} | {ov:.1f} | {st:.2f} | {sv:.1f} |")
    pub = _published(nab_dir)
    if pub:
        _say("\nPublished scoreboard (final_results.json, full corpus):\n")
        _say("| detector | standard | reward_low_FP | reward_low_FN |")
        _say("|---|---|---|---|")
        ours = [by[(p, "all 58 files", "optimised")][1] for p in nab.PROFILES]
        entries = [(k, v) for k, v in pub.items()] + [("forumpulse (this run)", dict(zip(nab.PROFILES, ours, strict=True)))]
        for name, v in sorted(entries, key=lambda kv: -kv[1].get("standard", 0)):
            _say(f"| {name} | {v.get('standard', float('nan')):.1f} | {v.get('reward_low_FP_rate', float('nan')):.1f} "
                 f"| {v.get('reward_low_FN_rate', float('nan')):.1f} |")


@dataclass
class ProtocolRun:
    """A published detector re-implemented (Relative Entropy: :mod:`forumpulse.detectors.nab_baseline`, CAD OSE:
    :mod:`forumpulse.detectors.nab_cad_ose`), NAB's protocol vs streaming."""

    scores: dict[tuple[str, str, str], float]  # (mode, profile, subset) -> normalised score at the optimised thr
    rows: int
    differing: int | None  # rows whose NAB-protocol score differs from NAB's published raw output (None: absent)
    seconds: float
    detector: str = "Relative Entropy"
    modes: tuple[str, ...] = ()
    check: str = ""  # how the NAB-protocol run was checked against the published results (when not row by row)


PROTOCOL_MODES = ("file range known in advance (NAB's protocol)", "streaming: range of rows <= t")


def nab_protocol_part(nab_dir: Path) -> ProtocolRun | None:
    """Score one published detector twice: as NAB runs it (quantised on the whole file's min and max, which NAB's
    runner gives every detector before the first row) and streaming (the running min and max).  The first must
    reproduce NAB's published raw output; the gap between the two is what the look-ahead is worth to it."""
    from forumpulse.detectors.nab_baseline import relative_entropy_scores

    if not (nab_dir / "labels" / "combined_windows.json").is_file():
        return None
    windows = nab.load_windows(nab_dir / "labels" / "combined_windows.json")
    t0 = time.perf_counter()
    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {m: {} for m in PROTOCOL_MODES}
    rows = 0
    differing: int | None = 0
    for name in sorted(windows):
        df = pd.read_csv(nab_dir / "data" / name)
        v = df["value"].to_numpy(dtype=float)
        ts = pd.to_datetime(df["timestamp"]).to_numpy()
        ahead = relative_entropy_scores(v, (float(v.min()), float(v.max())))
        series[PROTOCOL_MODES[0]][name] = (ts, ahead)
        series[PROTOCOL_MODES[1]][name] = (ts, relative_entropy_scores(v))
        rows += len(v)
        category, fname = name.split("/")
        raw = nab_dir / "results" / "relativeEntropy" / category / f"relativeEntropy_{fname}"
        if differing is not None and raw.is_file():
            published = pd.read_csv(raw)["anomaly_score"].to_numpy(dtype=float)
            differing += int(np.sum(published != ahead)) if len(published) == len(ahead) else len(ahead)
        else:
            differing = None
    return ProtocolRun(_protocol_scores(series, windows), rows, differing, time.perf_counter() - t0,
                       modes=PROTOCOL_MODES)


def _protocol_scores(series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]],
                     windows: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    scores: dict[tuple[str, str, str], float] = {}
    for mode, by_file in series.items():
        for profile in nab.PROFILES:
            files = {name: (s, nab.row_weights(len(s), nab.window_indices(ts, windows[name]), profile))
                     for name, (ts, s) in by_file.items()}
            thr, _ = nab.optimise_threshold(list(files.values()))
            for subset, pred in SUBSETS.items():
                res = nab.score_corpus({k: x for k, x in files.items() if pred(k)}, profile, thr)
                scores[(mode, profile, subset)] = res.normalised
    return scores


CAD_MODES = ("file range known in advance (NAB's protocol)", "streaming: range of rows <= t, not re-binned",
             "streaming: re-binned on every range change (replay)")


def _cad_ose_file(args: tuple[Path, str, bool]) -> tuple[str, dict[str, np.ndarray]]:
    from forumpulse.detectors.nab_cad_ose import cad_ose_rebinned_scores, cad_ose_scores, nab_cad_ose_scores

    path, name, rebinned = args
    v = pd.read_csv(path)["value"].to_numpy(dtype=float)
    out = {CAD_MODES[0]: nab_cad_ose_scores(v), CAD_MODES[1]: cad_ose_scores(v)}
    if rebinned:
        out[CAD_MODES[2]] = cad_ose_rebinned_scores(v)
    return name, out


def cad_ose_protocol_part(nab_dir: Path, rebinned: bool = False, workers: int = 2) -> ProtocolRun | None:
    """CAD OSE (the published reward_low_FP leader, 67.0) scored as NAB runs it (the file's min and max, and a rest
    period from its length) and streaming (running min and max, rest period 150; with ``rebinned`` also the form
    that replays earlier rows on every new range: row t scored as NAB would score the file cut at t, ~6 min more).
    The NAB-protocol run is checked against NAB's published per-file contextOSE scores and TP/TN/FP/FN counts at
    the published thresholds (the shared copy has no raw output of it).  ~2.5 min on 2 cores (~9 with ``rebinned``)."""
    from concurrent.futures import ProcessPoolExecutor

    if not (nab_dir / "labels" / "combined_windows.json").is_file():
        return None
    windows = nab.load_windows(nab_dir / "labels" / "combined_windows.json")
    t0 = time.perf_counter()
    names = sorted(windows, key=lambda n: -(nab_dir / "data" / n).stat().st_size)  # longest first
    with ProcessPoolExecutor(workers) as ex:
        done = dict(ex.map(_cad_ose_file, [(nab_dir / "data" / n, n, rebinned) for n in names]))
    modes = CAD_MODES if rebinned else CAD_MODES[:2]
    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {m: {} for m in modes}
    rows = 0
    stamps = {}
    for name in sorted(windows):
        ts = pd.to_datetime(pd.read_csv(nab_dir / "data" / name)["timestamp"]).to_numpy()
        stamps[name] = ts
        rows += len(ts)
        for m in modes:
            series[m][name] = (ts, done[name][m])
    checked = differ = 0
    for profile in nab.PROFILES:
        pub_file = nab_dir / "results" / "contextOSE" / f"contextOSE_{profile}_scores.csv"
        if not pub_file.is_file():
            continue
        pub = pd.read_csv(pub_file).set_index("File")
        thr = float(pub["Threshold"].iloc[0])
        for name in sorted(windows):
            if name not in pub.index:
                continue
            ts = stamps[name]
            fs = nab.score_file(done[name][CAD_MODES[0]],
                                nab.row_weights(len(ts), nab.window_indices(ts, windows[name]), profile), thr)
            row = pub.loc[name]
            checked += 1
            same = ((fs.tp, fs.tn, fs.fp, fs.fn) == (int(row["TP"]), int(row["TN"]), int(row["FP"]), int(row["FN"]))
                    and abs(fs.score - float(row["Score"])) < 1e-6)
            differ += not same
    check = (f"NAB-protocol run vs NAB's published per-file contextOSE scores and TP/TN/FP/FN at the published "
             f"thresholds: {differ} of {checked} file-profile pairs differ" if checked
             else "published contextOSE scores absent: reproduction not checked")
    return ProtocolRun(_protocol_scores(series, windows), rows, None, time.perf_counter() - t0,
                       detector="CAD OSE", modes=modes, check=check)


def print_nab_protocol(run: ProtocolRun) -> None:
    _say(f"\n## NAB's protocol: what knowing a file's range in advance is worth ({run.detector}, re-implemented)\n")
    _say("NAB's runner gives every detector the whole file's min and max before its first row; the published "
         "leaders (ARTime, HTM, CAD OSE) and Relative Entropy quantise on them.  Our score is streaming (row t uses "
         "rows <= t).  The same detector both ways, optimised threshold per profile:")
    if run.check:
        _say(f"({run.check}; {run.seconds:.1f} s)")
    elif run.differing is None:
        _say("(published raw output absent: reproduction not checked)")
    else:
        _say(f"(NAB-protocol scores vs NAB's published relativeEntropy raw output: {run.differing} of {run.rows} "
             f"rows differ; {run.seconds:.1f} s)")
    _say(f"\n| {run.detector} | subset | standard | reward_low_FP | reward_low_FN |\n|---|---|---|---|---|")
    for mode in run.modes or PROTOCOL_MODES:
        for subset in SUBSETS:
            vals = " | ".join(f"{run.scores[(mode, p, subset)]:.1f}" for p in nab.PROFILES)
            _say(f"| {mode} | {subset} | {vals} |")


# ------------------------------------------------------------------------------------- development corpus


@dataclass
class DevSeries:
    """One labelled series of the development corpus (``limits``: inclusive row ranges of NAB-style windows)."""

    timestamps: np.ndarray
    values: np.ndarray
    limits: list[tuple[int, int]]


def _nab_limits(ts: np.ndarray, starts: Sequence[Any]) -> list[tuple[int, int]]:
    """NAB-style windows: total width 10% of the rows split over the anomalies, centred on each start, merged
    when they overlap."""
    n = len(ts)
    if not starts:
        return []
    half = max(1, int(0.1 * n / len(starts) / 2))
    out: list[tuple[int, int]] = []
    for s in sorted(starts):
        c = int(np.searchsorted(ts, s))
        lo, hi = max(0, c - half), min(n - 1, c + half)
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def synthetic_series(seed: int = 7, count: int = 24) -> dict[str, DevSeries]:
    """Generic synthetic series with injected anomalies (level shifts, spikes, dropouts, variance changes,
    missing daily cycles, trend breaks) on noise, daily/weekly cycles, random walks and low Poisson counts.
    Deterministic (``seed``).  Written from first principles; not derived from NAB's files."""
    rng = np.random.default_rng(seed)
    out: dict[str, DevSeries] = {}
    kinds = ["noise", "daily", "walk", "counts"]
    anomalies = ["shift", "spike", "dropout", "variance", "pattern", "trend"]
    for i in range(count):
        base = kinds[i % len(kinds)]
        n = int(rng.integers(3000, 7000))
        step = [300, 300, 600, 60][i % 4]
        ts = np.datetime64("2020-01-06T00:00") + np.arange(n) * np.timedelta64(step, "s")
        t = np.arange(n)
        day = 86400 // step
        if base == "noise":
            x = 50 + rng.normal(0, 3, n)
        elif base == "daily":
            wk = (t // day) % 7 >= 5
            x = 100 + 60 * np.sin(2 * np.pi * t / day) * np.where(wk, 0.5, 1.0) + rng.normal(0, 6, n)
        elif base == "walk":
            x = 200 + np.cumsum(rng.normal(0, 1, n)) * 0.5 + rng.normal(0, 2, n)
        else:
            lam = 3 + 2 * np.sin(2 * np.pi * t / day)
            x = rng.poisson(np.maximum(lam, 0.2)).astype(float)
        scale = float(np.std(np.diff(x))) + 1.0
        k = int(rng.integers(1, 4))
        starts_i = np.sort(rng.choice(np.arange(int(0.2 * n), n - 200), size=k, replace=False))
        starts: list[Any] = []
        for s0 in (int(v) for v in starts_i):
            kind = anomalies[int(rng.integers(len(anomalies)))]
            if kind == "shift":
                x[s0:] += rng.choice([-1, 1]) * rng.uniform(3, 8) * scale
            elif kind == "spike":
                x[s0: s0 + int(rng.integers(1, 4))] += rng.uniform(6, 15) * scale
            elif kind == "dropout":
                x[s0: s0 + int(rng.integers(10, 100))] = float(np.min(x[:s0]))
            elif kind == "variance":
                m = len(x[s0: s0 + int(rng.integers(50, 300))])
                x[s0: s0 + m] += rng.normal(0, 4 * scale, m)
            elif kind == "pattern":
                m = min(day, n - s0)
                x[s0: s0 + m] = float(np.median(x[:s0])) + rng.normal(0, 0.5 * scale, m)
            else:
                x[s0:] += np.arange(n - s0) * rng.uniform(0.05, 0.2) * scale
            starts.append(ts[s0])
        if i % 5 == 3:  # a few series with absent rows
            keep = np.ones(n, dtype=bool)
            keep[int(0.5 * n): int(0.5 * n) + 50] = False
            ts, x = ts[keep], x[keep]
        out[f"synthetic/{i:02d}_{base}"] = DevSeries(ts, x, _nab_limits(ts, starts))
    return out


def nasa_series(nasa_dir: Path) -> dict[str, DevSeries]:
    """NASA-HTTP 1995 requests per 5 minutes and per hour, windows at the 4 July, launch and outage starts."""
    f = nasa_dir / "nasa_http_1995_per_minute.csv"
    if not f.is_file():
        return {}
    df = pd.read_csv(f)
    s = pd.Series(df["requests"].to_numpy(dtype=float), index=pd.to_datetime(df["timestamp_edt"], utc=True))
    starts = [np.datetime64(pd.Timestamp(x).tz_convert("UTC").tz_localize(None))
              for x in ("1995-07-04T00:00:00-04:00", "1995-07-13T07:00:00-04:00", "1995-08-01T14:52:00-04:00")]
    out = {}
    for name, rule in (("nasa/requests_5min", "5min"), ("nasa/requests_1h", "1h")):
        r = s.resample(rule).sum(min_count=1).dropna()
        t = pd.DatetimeIndex(r.index).tz_convert("UTC").tz_localize(None).to_numpy()
        out[name] = DevSeries(t, r.to_numpy(), _nab_limits(t, starts))
    return out


def sim_series(sim_dir: Path) -> dict[str, DevSeries]:
    """Simulator site series per 5 minutes (5xx+no-status, human pageviews, all requests) from ``site_minute.csv`` +
    ``truth.json`` (written by :func:`dump_sim`); every scenario start is a window."""
    f, tf = sim_dir / "site_minute.csv", sim_dir / "truth.json"
    if not (f.is_file() and tf.is_file()):
        return {}
    df = pd.read_csv(f)
    truth = json.loads(tf.read_text())
    idx = pd.to_datetime(df["ts"], unit="s")
    starts = [np.datetime64(pd.Timestamp(s["start_ms"], unit="ms")) for s in truth["scenarios"]]
    out = {}
    for col in ("bad", "pageviews", "requests"):  # requests: benign crawler bursts (unlabelled) test false alarms
        r = pd.Series(df[col].to_numpy(dtype=float), index=idx).resample("5min").sum(min_count=1).dropna()
        t = r.index.to_numpy()
        out[f"sim{truth['seed']}/{col}_5min"] = DevSeries(t, r.to_numpy(), _nab_limits(t, starts))
    return out


def dump_sim(out: Path, lines_per_day: int = 60_000, seed: int = 1, days: int = 28) -> None:
    """Simulate + ingest into a fresh chDB folder and write ``site_minute.csv`` and ``truth.json`` into ``out``."""
    import tempfile

    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.ingest import ingest_paths
    from forumpulse.pipeline.simulate import SimConfig, simulate, truth_config
    from forumpulse.pipeline.store import open_store

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="fp-dev-"))
    res = simulate(SimConfig(out=tmp / "sim", days=days, lines_per_day=lines_per_day, seed=seed))
    truth = json.loads(res.truth_path.read_text())
    settings = Settings(**truth_config(truth, tmp / "sim"))
    store = open_store(f"chdb:{tmp / 'chdb'}")
    try:
        ingest_paths(store, settings, [str(tmp / "sim" / s["file"]) for s in truth["sources"]], workers=1)
        rows = store.query_rows("SELECT toUnixTimestamp(minute), sum(requests), sum(status_5xx) + sum(status_none), "
                                "sum(topic_views), sum(pageviews) FROM site_minute GROUP BY minute ORDER BY minute")
    finally:
        store.close()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)  # logs + chDB (~0.5 GB at 60k lines/day): only the CSV is kept
    pd.DataFrame(rows, columns=["ts", "requests", "bad", "topic_views", "pageviews"]).to_csv(
        out / "site_minute.csv", index=False)
    (out / "truth.json").write_text(json.dumps(truth))


def monitoring_dev_series(seed: int = 11, per_family: int = 6) -> dict[str, DevSeries]:
    """The monitoring-style families of :mod:`forumpulse.detectors.devcorpus` with NAB-style windows."""
    from forumpulse.detectors.devcorpus import monitoring_series

    return {k: DevSeries(ts, x, _nab_limits(ts, [ts[s] for s in starts]))
            for k, (ts, x, starts) in monitoring_series(seed, per_family).items()}


def dev_corpus(data: Path, sim_dirs: list[Path], monitoring: bool = False) -> dict[str, DevSeries]:
    """The corpus the generic scorer's parameters are chosen on: synthetic series, NASA-HTTP 1995, simulator, and
    with ``monitoring`` the monitoring-style families (:func:`monitoring_dev_series`, added after rules v7)."""
    out = synthetic_series()
    out.update(nasa_series(data / "nasa_http_1995"))
    for d in sim_dirs:
        out.update(sim_series(d))
    if monitoring:
        out.update(monitoring_dev_series())
    return out


def score_dev(corpus: dict[str, DevSeries], params: Any) -> dict[str, tuple[float, float, float]]:
    """NAB-scored development corpus (our scorer): profile -> (score at the optimised threshold, that threshold,
    score at ``params.alarm``)."""
    scores = {k: anomaly_scores(v.values, params, v.timestamps) for k, v in corpus.items()}
    out = {}
    for profile in nab.PROFILES:
        files = {k: (scores[k], nab.row_weights(len(v.values), v.limits, profile)) for k, v in corpus.items()}
        t, _ = nab.optimise_threshold(list(files.values()))
        out[profile] = (nab.score_corpus(files, profile, t).normalised, t,
                        nab.score_corpus(files, profile, params.alarm).normalised)
    return out


# ---------------------------------------------------------------------------------------------------- NASA


def nasa_part(nasa_dir: Path, rules: dict[str, Any]) -> list[Detection] | None:
    f = nasa_dir / "nasa_http_1995_per_minute.csv"
    if not f.is_file():
        _say(f"\nNASA-HTTP 1995: data absent ({f} not found) -- skipped")
        return None
    df = pd.read_csv(f)
    ts = pd.to_datetime(df["timestamp_edt"], utc=True)
    t0 = time.perf_counter()
    dets = run_seasonal([t.to_pydatetime() for t in ts], df["requests"].tolist(),
                        "America/New_York", SiteCalendar("US"), seasonal_params(rules), scope="nasa", site="nasa")
    _say(f"\n## NASA-HTTP 1995 (requests per minute, America/New_York, US calendar; {len(df)} minutes in "
         f"{time.perf_counter() - t0:.1f} s)\n")
    events = json.loads((nasa_dir / "events.json").read_text())["events"] if (nasa_dir / "events.json").is_file() else []
    for line in nasa_verdict(dets, events):
        _say(line)
    _say("\nAll detections:")
    for d in dets:
        _say("  " + d.to_json())
    return dets


def nasa_verdict(dets: list[Detection], events: list[dict[str, Any]]) -> list[str]:
    """Match detections to the labelled events.  Rules: the launch spike is found when a spike starts on
    13 Jul (local) before the labelled peak; the 4 Jul dip when a dip labelled ``holiday`` covers 4 Jul; the
    outage when an ``outage`` starts within an hour of the labelled start; the no-data gap must carry no
    detection; every other detection is listed as unmatched (a weekend one would be a false alarm)."""
    from zoneinfo import ZoneInfo

    ny = ZoneInfo("America/New_York")

    def local(t: datetime) -> datetime:
        return t.astimezone(ny)

    out = []
    used: set[str] = set()
    launch = [d for d in dets if d.kind == "spike" and local(d.start).date().isoformat() == "1995-07-13"]
    peak = datetime.fromisoformat("1995-07-13T09:49:00-04:00")
    ok = [d for d in launch if d.start <= peak]
    used |= {d.id for d in launch}
    first = min((local(d.start) for d in ok), default=None)
    alarm = min((local(datetime.fromisoformat(str(d.detail.get("confirmed_at", d.start.isoformat())).replace("Z", "+00:00")))
                 for d in ok), default=None)
    out.append(f"- launch spike 13 Jul: {'FOUND' if ok else 'MISSED'}"
               + (f", spike from {first:%H:%M} EDT reported at {alarm:%H:%M} EDT (labelled rise from 07:00, peak "
                  f"09:49 EDT), {len(launch)} spike event(s) that day" if ok and alarm else ""))
    hol = [d for d in dets if d.kind == "dip" and local(d.start).date().isoformat() == "1995-07-04"]
    used |= {d.id for d in hol}
    out.append(f"- 4 Jul dip: {'FOUND, label ' + hol[0].label if hol else 'MISSED'}"
               + (f" ({hol[0].detail.get('holiday')})" if hol else ""))
    o_start = datetime.fromisoformat("1995-08-01T14:52:02-04:00")
    outs = [d for d in dets if d.kind == "outage" and abs((d.start - o_start).total_seconds()) <= 3600]
    used |= {d.id for d in outs}
    out.append(f"- 1-3 Aug outage: {'FOUND, ' + _span(outs[0], local) if outs else 'MISSED'}")
    g0, g1 = datetime.fromisoformat("1995-07-28T13:32:24-04:00"), datetime.fromisoformat("1995-08-01T00:00:00-04:00")
    in_gap = [d for d in dets if g0 <= d.start < g1]
    used |= {d.id for d in in_gap}
    out.append(f"- 28 Jul - 1 Aug no-data gap: {'no detection (right)' if not in_gap else f'{len(in_gap)} detection(s) (WRONG)'}")
    rest = [d for d in dets if d.id not in used]
    weekend = [d for d in rest if local(d.start).weekday() >= 5]
    out.append(f"- weekend detections: {len(weekend)}; other detections not in events.json: {len(rest)}")
    for d in rest:
        out.append(f"    {d.kind}/{d.label} {_span(d, local)} ratio {d.detail.get('ratio')}")
    _ = events
    return out


def _span(d: Detection, local: Callable[[datetime], datetime]) -> str:
    end = f"{local(d.end):%a %d %b %H:%M}" if d.end else "open"
    return f"{local(d.start):%a %d %b %H:%M} -> {end} EDT"


# ----------------------------------------------------------------------------------------------- simulator


def simulator_part(work: Path | None = None, days: int = 28, lines_per_day: int = 60_000, seed: int = 1) -> dict[str, Any] | None:
    """Simulate ``days`` of forum logs with the default scenarios, ingest them into a fresh chDB store, run the
    traffic detectors over history and score them against ``truth.json``: per scenario found / delay, and the
    detections matching no scenario (false alarms) per week."""
    try:
        from forumpulse.pipeline.ingest import ingest_paths
        from forumpulse.pipeline.simulate import SimConfig, simulate, truth_config
    except ImportError as exc:
        _say(f"\n## Simulator\n\nsimulator or ingest not available ({exc}) -- skipped")
        return None
    import tempfile

    from forumpulse.detectors.traffic import detect_history
    from forumpulse.pipeline.config import Settings
    from forumpulse.pipeline.store import open_store

    tmp = Path(tempfile.mkdtemp(prefix="fp-eval-")) if work is None else work
    marker = tmp / "ingested.json"  # written after a complete ingest: a kept work folder is re-used as it is
    wanted = {"days": days, "lines_per_day": lines_per_day, "seed": seed}
    reuse = work is not None and marker.is_file() and json.loads(marker.read_text()) == wanted
    t0 = time.perf_counter()
    if reuse:
        truth = json.loads((tmp / "sim" / "truth.json").read_text())
        total_lines = int(truth.get("total_lines", 0))
    else:
        res = simulate(SimConfig(out=tmp / "sim", days=days, lines_per_day=lines_per_day, seed=seed))
        truth = json.loads(res.truth_path.read_text())
        total_lines = res.total_lines
    t_sim = time.perf_counter() - t0
    settings = Settings(**truth_config(truth, tmp / "sim"))
    store = open_store(f"chdb:{tmp / 'chdb'}")
    try:
        t1 = time.perf_counter()
        if not reuse:
            ingest_paths(store, settings, [str(tmp / "sim" / s["file"]) for s in truth["sources"]], workers=1)
            marker.write_text(json.dumps(wanted))
        t_ing = time.perf_counter() - t1
        start = datetime.fromtimestamp(truth["start_ms"] / 1000, UTC) + timedelta(days=8)
        end = datetime.fromtimestamp(truth["end_ms"] / 1000, UTC)
        t2 = time.perf_counter()
        dets = detect_history(store, start, end, settings)
        t_det = time.perf_counter() - t2
        crossing = _surge_crossing(store, truth, settings)
    finally:
        store.close()
    if work is None:  # our own temporary folder (1.7 GB of logs at 300k lines/day): remove it
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        (tmp / "detections.jsonl").write_text("".join(d.to_json() + "\n" for d in dets))
    report = score_simulation(truth, dets, start, end, crossing)
    how = "re-used store: no simulate / ingest" if reuse else f"simulate {t_sim:.0f} s, ingest {t_ing:.0f} s"
    _say(f"\n## Simulator ({days} days, {total_lines} lines, seed {seed}; {how}, detect {t_det:.0f} s; "
         f"scored from {start:%Y-%m-%d} to {end:%Y-%m-%d})\n")
    _say("| scenario | local start | found | detection | delay |")
    _say("|---|---|---|---|---|")
    for row in report["rows"]:
        _say("| " + " | ".join(str(x) for x in row) + " |")
    if CROSSING_STATS:
        c = CROSSING_STATS
        _say(f"\nElection group at the 3x crossing: baseline share {c['baseline_share']:.4%}, "
             f"{c['topic_views_per_min']:.0f} human topic views/min, group views/min expected at baseline "
             f"{c['group_views_per_min_expected']:.2f}, at 3x {c['group_views_per_min_at_3x']:.2f} "
             f"({c['group_views_in_window']:.0f} group views in the crossing 5-min window)")
        topic = load_rules()["topic"]
        lam0 = c["group_views_per_min_expected"]
        k = float(topic["cusum_ratio"])
        drift = k * lam0 * np.log(k) - (k - 1) * lam0  # E[LLR] per minute at exactly 3x (Poisson approximation)
        if drift > 0:
            _say(f"Statistics bound: a step to exactly {k:g}x would take the group CUSUM ~{topic['cusum_h'] / drift:.0f} "
                 f"min on average (h = {topic['cusum_h']:g}, +{drift:.2f} evidence per minute); a ramp that keeps "
                 "rising is found sooner")
    _say(f"\nDetections matching no scenario: {len(report['false'])} over {report['weeks']:.1f} weeks "
         f"= {len(report['false']) / report['weeks']:.2f} per week")
    for d in report["false"]:
        _say("  " + d.to_json())
    return report


TARGETS: dict[str, tuple[set[str], str]] = {
    # scenario kind -> (detection kinds that find it, how)
    "event": ({"topic_surge"}, "group"),
    "holiday": ({"dip"}, "holiday"),
    "outage": ({"outage"}, "overlap"),
    "transfer_collapse": ({"transfer_regression", "latency_regression"}, "upstream"),
    "pipeline_gap": ({"pipeline_gap"}, "source"),
}


def _reported_at(d: Detection) -> datetime:
    """When the detector first reported ``d`` (``detail['_reported']``; its start when not recorded)."""
    at = d.detail.get("_reported")
    return at if isinstance(at, datetime) else d.start


def _overlaps(d: Detection, s: dict[str, Any], slack: timedelta = timedelta(minutes=30)) -> bool:
    s0 = datetime.fromtimestamp(s["start_ms"] / 1000, UTC) - slack
    s1 = datetime.fromtimestamp(s["end_ms"] / 1000, UTC) + slack
    end = d.end or d.start
    return d.start <= s1 and end >= s0


#: scenario kind -> what a detection overlapping its window may be and still count as explained (``None``: any
#: kind -- floods and scans make traffic that really is abnormal).  Anything else overlapping it is a false
#: alarm: a dip called "unexplained" during a pipeline gap, a spike during a holiday, a dip not labelled holiday.
EXPLAINED_BY: dict[str, Callable[[Detection], bool] | None] = {
    "event": lambda d: d.kind in ("topic_surge", "spike"),
    "holiday": lambda d: d.kind == "dip" and d.label == "holiday",
    # a broken site also answers slowly (timeouts): its latency and transfer regressions are the outage's
    "outage": lambda d: (d.kind in ("outage", "pipeline_gap", "latency_regression", "transfer_regression")
                         or (d.kind == "dip" and d.label == "outage")),
    "transfer_collapse": lambda d: d.kind in ("transfer_regression", "latency_regression"),
    "pipeline_gap": lambda d: d.kind == "pipeline_gap",
}


def score_simulation(truth: dict[str, Any], dets: list[Detection], start: datetime, end: datetime,
                     crossing: datetime | None) -> dict[str, Any]:
    """Match detections to scenarios (see :data:`TARGETS`); a detection overlapping a scenario window counts as
    explained only when it is what that scenario may cause (:data:`EXPLAINED_BY`), else as a false alarm."""
    rows: list[list[Any]] = []
    explained: set[str] = set()
    for s in truth["scenarios"]:
        s_start = datetime.fromtimestamp(s["start_ms"] / 1000, UTC)
        hits = [d for d in dets if _overlaps(d, s)]
        ok = EXPLAINED_BY.get(s["kind"])
        explained |= {d.id for d in hits if ok is None or ok(d)}
        if s["kind"] not in TARGETS:
            continue
        kinds, how = TARGETS[s["kind"]]
        found = [d for d in hits if d.kind in kinds]
        if how == "group":
            found = [d for d in found if d.scope == f"group:{s['scope']['group']}"]
        elif how == "holiday":
            found = [d for d in found if d.label == "holiday"]
        elif how == "upstream":
            found = [d for d in found if f"|{s['scope']['upstream']}|" in d.scope]
        elif how == "source":
            found = [d for d in found if d.scope.startswith(f"source:{s['scope']['source']}/")]
        first = min(found, key=_reported_at) if found else None
        ref = crossing if s["kind"] == "event" and crossing else s_start
        # delay to the first *report* (the data minute at which the detector, fed in order, first said so), not
        # to the back-dated start it reports
        delay = f"{(_reported_at(first) - ref).total_seconds() / 60:+.0f} min" if first else "-"
        if s["kind"] == "event" and crossing:
            delay += f" (after crossing 3x baseline share at {crossing:%H:%M} UTC)"
        rows.append([s["kind"], s["start_local"][:16], "yes" if first else "NO",
                     f"{first.kind}/{first.label} {first.scope}" if first else "-", delay])
    false = [d for d in dets if d.id not in explained]
    weeks = max((end - start).total_seconds() / (7 * 86400), 1e-9)
    return {"rows": rows, "false": false, "weeks": weeks}


def _surge_crossing(store: Any, truth: dict[str, Any], settings: Any) -> datetime | None:
    """First minute of the event where the group's 5-minute share of human topic views reaches 3x its baseline
    share (previous 7 days, floored at the detector's ``new_topic_share`` like the detector does)."""
    ev = next((s for s in truth["scenarios"] if s["kind"] == "event"), None)
    if ev is None:
        return None
    rules = load_rules()
    floor = float(rules["topic"]["new_topic_share"])
    ids = ", ".join(str(int(i)) for i in ev["scope"]["topic_ids"])
    s0 = ev["start_ms"] // 1000
    site = truth["site"].replace("'", "")
    base = store.query_rows(
        f"SELECT sumIf(views, topic_id IN ({ids})), sum(views) FROM topic_minute WHERE site = '{site}' AND "
        f"minute >= toDateTime({s0 - 7 * 86400}) AND minute < toDateTime({s0})")
    g, tot = base[0]
    share0 = max(g / tot if tot else 0.0, floor)
    rows = store.query_rows(
        f"SELECT minute, sumIf(views, topic_id IN ({ids})), sum(views) FROM topic_minute WHERE site = '{site}' "
        f"AND minute >= toDateTime({s0 - 600}) AND minute < toDateTime({ev['end_ms'] // 1000}) "
        "GROUP BY minute ORDER BY minute")
    win: list[tuple[int, int]] = []
    for minute, gv, tv in rows:
        win = [*win[-4:], (int(gv), int(tv))]
        share = sum(x for x, _ in win) / max(sum(y for _, y in win), 1)
        if len(win) == 5 and share >= 3 * share0:
            m = minute if isinstance(minute, datetime) else datetime.fromtimestamp(int(minute), UTC)
            m = m.replace(tzinfo=UTC) if m.tzinfo is None else m
            per_min = sum(y for _, y in win) / 5
            CROSSING_STATS.update({"baseline_share": share0, "topic_views_per_min": per_min,
                                   "group_views_per_min_expected": share0 * per_min,
                                   "group_views_per_min_at_3x": 3 * share0 * per_min,
                                   "group_views_in_window": sum(x for x, _ in win)})
            return m
    return None


#: what the last :func:`_surge_crossing` saw at the crossing minute (printed with the simulator table)
CROSSING_STATS: dict[str, float] = {}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="forumpulse-eval", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("FORUMPULSE_EVAL_DATA", DEFAULT_DATA)))
    ap.add_argument("--only", choices=["nab", "nasa", "sim", "dev"], action="append",
                    help="dev = the development corpus the generic score's parameters were chosen on (not default)")
    ap.add_argument("--dev-sim", type=Path, action="append", default=[],
                    help="simulator dump folder for the dev corpus (created with seed 1, 2, ... when absent)")
    ap.add_argument("--dev-monitoring", action="store_true",
                    help="dev corpus also with the monitoring-style families (detectors/devcorpus.py, 54 series)")
    ap.add_argument("--sim-days", type=int, default=28)
    ap.add_argument("--sim-lines-per-day", type=int, default=60_000)
    ap.add_argument("--sim-work", type=Path, default=None,
                    help="keep the simulator's logs and chDB store in this folder; a folder ingested before with "
                         "the same days / lines per day is re-used (detection only)")
    ap.add_argument("--cad-ose-rebinned", action="store_true",
                    help="NAB part: also CAD OSE streaming with the memory re-binned on every range change "
                         "(replay; ~7 min more on 2 cores)")
    args = ap.parse_args(argv)
    data: Path = args.data
    parts = set(args.only or ["nab", "nasa", "sim"])  # dev only on request
    if not data.is_dir():
        _say(f"evaluation data folder {data} is absent: pass --data PATH (the shared data folder with nab/ and "
             "nasa_http_1995/) or set FORUMPULSE_EVAL_DATA -- NAB and NASA parts skipped")
        parts -= {"nab", "nasa"}
        if not parts:
            return 2
    rules = load_rules()
    _say(f"# forumpulse detector evaluation (data: {data})")
    if "nab" in parts:
        run = nab_part(data / "nab", rules)
        if run:
            print_nab(run, data / "nab")
            proto = nab_protocol_part(data / "nab")
            if proto:
                print_nab_protocol(proto)
            cad = cad_ose_protocol_part(data / "nab", rebinned=args.cad_ose_rebinned)
            if cad:
                print_nab_protocol(cad)
    if "nasa" in parts:
        nasa_part(data / "nasa_http_1995", rules)
    if "sim" in parts:
        simulator_part(work=args.sim_work, days=args.sim_days, lines_per_day=args.sim_lines_per_day)
    if "dev" in parts:
        for seed, d in enumerate(args.dev_sim, start=1):
            if not (d / "truth.json").is_file():
                dump_sim(d, seed=seed)
        res = score_dev(dev_corpus(data, args.dev_sim, args.dev_monitoring), score_params(rules))
        _say("\n## Development corpus (synthetic, NASA 1995, simulator; NAB-style windows and scoring)\n")
        _say("| profile | optimised | threshold | shipped |\n|---|---|---|---|")
        for profile, (opt, thr, shipped) in res.items():
            _say(f"| {profile} | {opt:.1f} | {thr:.4f} | {shipped:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
