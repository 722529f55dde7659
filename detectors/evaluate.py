"""Detector evaluation (``make eval`` = ``python -m forumpulse.detectors.evaluate``).

Parts (each says clearly when its data is absent and goes on with the others):

* **NAB v1.0** (``<data>/nab``): our streaming scorer (:func:`forumpulse.detectors.series.anomaly_scores`,
  parameters from ``detectors/rules/traffic.yaml`` section ``series``) on all 58 files, scored with our NAB scorer
  (:mod:`forumpulse.detectors.nab`) for the three profiles: at NAB's optimised threshold (exact sweep) and at our
  shipped threshold, on the full corpus, realTweets and realKnownCause/nyc_taxi, next to the published scoreboard.
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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
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
        series[name] = (ts, anomaly_scores(df["value"].to_numpy(dtype=float), params))
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


# ---------------------------------------------------------------------------------------------------- NASA


def nasa_part(nasa_dir: Path, rules: dict[str, Any]) -> list[Detection] | None:
    f = nasa_dir / "nasa_http_1995_per_minute.csv"
    if not f.is_file():
        _say(f"\nNASA-HTTP 1995: data absent ({f} not found) -- skipped")
        return None
    df = pd.read_csv(f)
    ts = pd.to_datetime(df["timestamp_edt"], utc=True)
    t0 = time.perf_counter()
    dets = run_seasonal(list(ts.to_numpy().astype("datetime64[ms]").astype(datetime)), df["requests"].tolist(),
                        "America/New_York", SiteCalendar("US"), seasonal_params(rules), scope="nasa", site="nasa")
    dets = [_aware(d) for d in dets]
    _say(f"\n## NASA-HTTP 1995 (requests per minute, America/New_York, US calendar; {len(df)} minutes in "
         f"{time.perf_counter() - t0:.1f} s)\n")
    events = json.loads((nasa_dir / "events.json").read_text())["events"] if (nasa_dir / "events.json").is_file() else []
    for line in nasa_verdict(dets, events):
        _say(line)
    _say("\nAll detections:")
    for d in dets:
        _say("  " + d.to_json())
    return dets


def _aware(d: Detection) -> Detection:
    return d


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
    out.append(f"- launch spike 13 Jul: {'FOUND' if ok else 'MISSED'}"
               + (f", first alarm {first:%H:%M} EDT (peak 09:49 EDT), {len(launch)} spike event(s) that day" if ok else ""))
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


def simulator_part() -> None:
    try:
        import forumpulse.pipeline.simulate  # noqa: F401
    except ImportError:
        _say("\n## Simulator\n\nforumpulse.pipeline.simulate is not installed yet -- simulator evaluation skipped "
             "(the rollup detectors are checked on SQL-built fixtures in tests/test_traffic_detectors.py).")
        return
    _say("\n## Simulator\n\nforumpulse.pipeline.simulate is present; its scenario evaluation is not wired yet.")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="forumpulse-eval", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=Path(os.environ.get("FORUMPULSE_EVAL_DATA", DEFAULT_DATA)))
    ap.add_argument("--only", choices=["nab", "nasa", "sim"], action="append")
    args = ap.parse_args(argv)
    data: Path = args.data
    parts = set(args.only or ["nab", "nasa", "sim"])
    if not data.is_dir():
        _say(f"evaluation data folder {data} is absent: pass --data PATH (the shared data folder with nab/ and "
             "nasa_http_1995/) or set FORUMPULSE_EVAL_DATA")
        return 2
    rules = load_rules()
    _say(f"# forumpulse detector evaluation (data: {data})")
    if "nab" in parts:
        run = nab_part(data / "nab", rules)
        if run:
            print_nab(run, data / "nab")
    if "nasa" in parts:
        nasa_part(data / "nasa_http_1995", rules)
    if "sim" in parts:
        simulator_part()
    return 0


if __name__ == "__main__":
    sys.exit(main())
