"""forumpulse simulate: format validity, determinism, exact volumes and scenario ground truth recomputed from
the written lines (parsed here with small regexes, independent of forumpulse.pipeline.formats)."""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from forumpulse.pipeline.simulate import (
    SCAN_PATHS,
    ScenarioSpec,
    SimConfig,
    SourceSpec,
    file_digest,
    parse_scenarios,
    parse_sources,
    simulate,
    simulate_command,
)

APACHE = re.compile(
    r'^(?P<client>\S+) - - \[(?P<t>\d{2}/[A-Z][a-z]{2}/\d{4}:\d{2}:\d{2}:\d{2}) (?P<off>[+-]\d{4})\] '
    r'"(?P<method>GET|POST|HEAD) (?P<url>/\S*) (?P<proto>HTTP/1\.1|HTTP/2\.0)" (?P<status>\d{3}) (?P<bytes>\d+|-) '
    r'"(?P<ref>[^"]*)" "(?P<ua>[^"]+)"(?: (?P<us>\d+))?$'
)
SQUID = re.compile(
    r"^(?P<sec>\d{9,})\.(?P<ms>\d{3}) +(?P<el>\d+) (?P<client>\S+) (?P<code>[A-Z_]+)/(?P<status>\d{3}) "
    r"(?P<bytes>\d+) (?P<method>GET|POST|HEAD) https://forum\.example\.my(?P<url>/\S*) - "
    r"(?P<hier>[A-Z_]+)/(?P<peer>\S+) (?P<ct>\S+)$"
)
BOTS = ("Googlebot", "bingbot", "AhrefsBot", "SemrushBot", "YandexBot", "GPTBot", "PetalBot", "UptimeRobot")


def _parse_dir(out: Path, truth: dict) -> pd.DataFrame:
    """Every line of every source as a row; fails on the first line that does not match its format."""
    rows: list[tuple] = []
    tcache: dict[str, int] = {}
    for src in truth["sources"]:
        fmt, name, with_d = src["format"], src["name"], src["format"] == "combined_d"
        with open(out / src["file"], encoding="utf-8") as f:
            for i, line in enumerate(f):
                line = line.rstrip("\n")
                if fmt == "squid":
                    m = SQUID.match(line)
                    assert m, f"{src['file']}:{i + 1} is not squid native: {line!r}"
                    sec, ms, el, client, code, status, nb, method, url, _hier, peer, _ct = m.groups()
                    # field widths: time is %9d.%03d, elapsed is right-aligned in 6 columns
                    assert line[14] == " " and (len(el) > 6 or line[15:21].lstrip() == el)
                    rows.append((name, int(sec) * 1000 + int(ms), client, method, url, int(status),
                                 int(nb), float(el), "", peer, code))
                else:
                    m = APACHE.match(line)
                    assert m, f"{src['file']}:{i + 1} is not {fmt}: {line!r}"
                    client, t, off, method, url, _proto, status, nb, _ref, ua, us = m.groups()
                    assert (us is not None) == with_d, f"{src['file']}:{i + 1} %D presence"
                    key = t + off
                    if key not in tcache:
                        tcache[key] = int(datetime.strptime(key, "%d/%b/%Y:%H:%M:%S%z").timestamp() * 1000)
                    rows.append((name, tcache[key], client, method, url, int(status), 0 if nb == "-" else int(nb),
                                 float(us) / 1000 if us else np.nan, ua, "", ""))
    df = pd.DataFrame(rows, columns=["source", "ts", "client", "method", "url", "status", "bytes", "elapsed_ms",
                                     "ua", "peer", "code"])
    df["bot"] = df["ua"].str.contains("|".join(BOTS), regex=True)
    df["topic"] = pd.to_numeric(df["url"].str.extract(r"^/threads/[^/?]*\.(\d+)/(?:page-\d+)?(?:\?|$)")[0],
                                errors="coerce")
    return df


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, pd.DataFrame]:
    """The default scenario mix over 4 weeks at a small volume."""
    out = tmp_path_factory.mktemp("sim")
    res = simulate(SimConfig(out=out, days=28, lines_per_day=16_000, seed=11))
    truth = json.loads((out / "truth.json").read_text())
    assert res.total_lines == truth["total_lines"]
    return out, truth, _parse_dir(out, truth)


def _scn(truth: dict, kind: str) -> dict:
    found = [s for s in truth["scenarios"] if s["kind"] == kind]
    assert found, f"no {kind} scenario in truth.json; skipped: {truth['skipped']}"
    return found[0]


def _in(df: pd.DataFrame, a: int, b: int) -> pd.DataFrame:
    return df[(df.ts >= a) & (df.ts < b)]


WEEK = 7 * 86_400_000


# --- formats, order, bookkeeping --------------------------------------------------------------------------


def test_every_line_parses_and_files_are_time_ordered(run: tuple[Path, dict, pd.DataFrame]) -> None:
    out, truth, df = run
    assert {s["format"] for s in truth["sources"]} == {"combined", "combined_d", "squid"}
    for src in truth["sources"]:
        ts = df.loc[df.source == src["name"], "ts"].to_numpy()
        assert len(ts) == src["lines"] > 0
        assert (np.diff(ts) >= 0).all(), f"{src['name']} is not in time order"
        assert ts.min() >= truth["start_ms"] and ts.max() < truth["end_ms"]
    raw = (out / "web2.log").read_text().splitlines()[:50]
    assert all(" +0800] " in line for line in raw), "Apache timestamps carry the site offset"


def test_truth_file_is_consistent(run: tuple[Path, dict, pd.DataFrame]) -> None:
    out, truth, df = run
    kinds = {s["kind"] for s in truth["scenarios"]}
    assert {"event", "holiday", "outage", "flood_ip", "flood_prefix", "flood_distributed", "scan",
            "transfer_collapse", "pipeline_gap"} <= kinds
    assert truth["total_lines"] == len(df)
    for s in truth["scenarios"]:
        assert s["start_ms"] < s["end_ms"]
        assert datetime.fromisoformat(s["start"]).timestamp() * 1000 == s["start_ms"]
        # a weekly baseline (two normal weeks) before every scenario
        assert s["start_ms"] >= truth["start_ms"] + 2 * WEEK - 86_400_000
        if "lines" in s:  # the scenario's own lines are inside its window
            assert s["lines_in_window"] >= s["lines"] > 0
    with open(out / "topics.csv", encoding="utf-8") as f:
        topics = {int(r["topic_id"]): r for r in csv.DictReader(f)}
    assert len(topics) == truth["topic_count"]
    group = truth["topic_groups"]["election"]
    assert all(t in topics and topics[t]["forum"] == "Politics" for t in group)
    served = df[df.status < 400]
    assert set(served.topic.dropna().astype(int)) <= set(topics), "every served topic id has a title"
    hol = _scn(truth, "holiday")
    assert "Chinese New Year" in hol["magnitude"]["name"] and hol["magnitude"]["official_days"]


def test_realistic_mix(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    assert df.client.str.contains(":").mean() > 0.05, "some IPv6 clients"
    st = df.status.value_counts(normalize=True)
    assert st[200] > 0.6 and st.get(304, 0) > 0.05 and st.get(404, 0) > 0.002 and st.get(301, 0) > 0.001
    assert df.url.str.contains(r"[?&](?:s|_xfToken)=", regex=True).mean() > 0.005, "session params to strip"
    assert (df.url.str.endswith("/add-reply") & (df.method == "POST")).sum() > 100
    assert df.url.str.startswith(("/styles/", "/js/", "/data/avatars/", "/favicon.ico")).mean() > 0.2
    assert 0.02 < df.bot.mean() < 0.2
    # daily seasonality in local time: evening peak well above the night trough (normal weeks only)
    normal = df[(df.ts < truth["start_ms"] + 2 * WEEK) & ~df.bot]
    hour = ((normal.ts // 1000 + 8 * 3600) % 86400) // 3600
    by_hour = hour.value_counts()
    assert by_hour[21] > 4 * by_hour[4]
    # benign look-alikes are listed and present
    nat = [b for b in truth["benign"] if b["kind"] == "nat_gateway"]
    for n in nat:
        uas = df.loc[df.client == n["client_ip"], "ua"]
        assert len(uas) > 100 and uas[uas != ""].nunique() > 5, "a NAT gateway shows many user agents"
    burst = max((b for b in truth["benign"] if b["kind"] == "crawler_burst"), key=lambda b: b["lines"])
    w = _in(df, burst["start_ms"], burst["end_ms"] + 1)
    assert w.client.isin(burst["client_ips"]).sum() >= burst["lines"] * 0.9


# --- scenarios recomputed from the lines ------------------------------------------------------------------


def test_flood_ip_rate(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "flood_ip")
    ip = s["scope"]["client_ip"]
    mine = df[df.client == ip]
    assert len(mine) == s["lines"]
    assert mine.ts.min() >= s["start_ms"] and mine.ts.max() < s["end_ms"], "the flood IP only appears in its window"
    per_min = mine.groupby(mine.ts // 60_000).size()
    assert len(per_min) >= (s["end_ms"] - s["start_ms"]) // 60_000
    assert per_min.min() >= 20 * 60, f"flood below 20 req/s in some minute: {per_min.min() / 60:.1f}"
    assert len(mine) / ((s["end_ms"] - s["start_ms"]) / 1000) >= 20


def test_flood_prefix_and_distributed(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "flood_prefix")
    pre = s["scope"]["prefix"].rsplit(".", 1)[0] + "."
    w = _in(df, s["start_ms"], s["end_ms"])
    swarm = w[w.client.str.startswith(pre)]
    dur = (s["end_ms"] - s["start_ms"]) / 1000
    assert len(swarm) == s["lines"] and swarm.client.nunique() >= 100
    assert swarm.groupby("client").size().max() / dur < 3, "each swarm member is moderate"
    assert len(swarm) / dur >= 0.8 * s["magnitude"]["rate"]
    d = _scn(truth, "flood_distributed")
    w = _in(df, d["start_ms"], d["end_ms"])
    hits = w[w.client.isin(set(w.client) - set(df[df.ts < d["start_ms"]].client)) & w.url.str.startswith("/search/")]
    assert hits.client.nunique() >= 500 and len(hits) >= 0.9 * d["lines"]
    assert hits.url.nunique() > 0.8 * len(hits), "random-query cache busting"
    assert hits.groupby("client").size().max() / ((d["end_ms"] - d["start_ms"]) / 1000) < 1


def test_scan_mostly_404(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "scan")
    mine = df[df.client == s["scope"]["client_ip"]]
    assert len(mine) == s["lines"] > 50
    assert set(mine.url) <= {p for p, _ in SCAN_PATHS}
    assert (mine.status >= 400).mean() > 0.8 and (mine.status == 404).mean() > 0.6


def test_event_share_at_peak(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "event")
    group = set(s["scope"]["topic_ids"])
    views = df[df.topic.notna() & (df.method == "GET")]
    peak = int(datetime.fromisoformat(s["peak"]).timestamp() * 1000)
    at_peak = _in(views, peak - 1_800_000, peak + 1_800_000)
    share = at_peak.topic.isin(group).mean()
    assert abs(share - s["magnitude"]["peak_share"]) < 0.08, f"share at peak {share:.3f}"
    week_before = _in(views, peak - WEEK - 1_800_000, peak - WEEK + 1_800_000)
    assert week_before.topic.isin(group).mean() < 0.05
    # rises then decays: share 4 h before the peak and 8 h after are both well below the peak
    for t in (peak - 4 * 3_600_000, peak + 8 * 3_600_000):
        assert _in(views, t - 1_800_000, t + 1_800_000).topic.isin(group).mean() < share - 0.15
    replies = df[df.url.str.endswith("/add-reply")]
    rep_topic = pd.to_numeric(replies.url.str.extract(r"\.(\d+)/add-reply$")[0])
    in_w = (replies.ts >= s["start_ms"]) & (replies.ts < s["end_ms"])
    before = (replies.ts >= s["start_ms"] - WEEK) & (replies.ts < s["end_ms"] - WEEK)
    assert (in_w & rep_topic.isin(group)).sum() > 5 * max(1, (before & rep_topic.isin(group)).sum())
    assert in_w.sum() > 1.3 * before.sum(), "replies rise with the event"


def test_holiday_week_volume(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "holiday")
    human = df[~df.bot & ~df.url.str.startswith("/attachments/")]
    scen_ips = {x["scope"].get("client_ip") for x in truth["scenarios"]}
    human = human[~human.client.isin(scen_ips)]
    now = len(_in(human, s["start_ms"], s["end_ms"]))
    base = len(_in(human, s["start_ms"] - WEEK, s["end_ms"] - WEEK))
    mag = s["magnitude"]
    n_off = len(mag["official_days"])
    expect = (n_off * mag["official_factor"] + (7 - n_off) * mag["other_factor"]) / 7
    assert abs(now / base - expect) < 0.07, f"holiday ratio {now / base:.3f}, expected {expect:.3f}"
    assert 0.4 < now / base < 0.6
    # deepest on the official days
    day = (human.ts // 1000 + 8 * 3600) // 86400
    counts = day.value_counts()
    off = [(datetime.fromisoformat(d).date() - datetime(1970, 1, 1).date()).days for d in mag["official_days"]]
    others = [d for d in range(s["start_ms"] // 86_400_000 + 1, s["end_ms"] // 86_400_000) if d not in off]
    assert max(counts[d] for d in off) < min(counts[d] for d in others)


def test_outage_answers_5xx_with_sources_alive(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "outage")
    w = _in(df, s["start_ms"], s["end_ms"])
    w = w[~w.url.str.startswith("/attachments/")]
    assert (w.status >= 500).mean() > 0.97
    assert set(w.source) == {x["name"] for x in truth["sources"]}, "every source keeps writing"
    before = _in(df, s["start_ms"] - WEEK, s["end_ms"] - WEEK)
    ratio = (~w.bot).sum() / (~before.bot & ~before.url.str.startswith("/attachments/")).sum()
    assert abs(ratio - s["magnitude"]["volume_factor"]) < 0.12, f"outage volume ratio {ratio:.2f}"
    assert (w.groupby(w.ts // 600_000).size() > 0).all()


def test_transfer_collapse(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "transfer_collapse")
    big = df[(df.source == s["scope"]["source"]) & (df.peer == s["scope"]["upstream"]) & (df.bytes >= 1_000_000)]
    rate = big.bytes / (big.elapsed_ms / 1000) / 1e6
    inside = rate[(big.ts >= s["start_ms"]) & (big.ts < s["end_ms"])]
    outside = rate[(big.ts < s["start_ms"]) | (big.ts >= s["end_ms"])]
    assert len(inside) > 10 and len(outside) > 100
    assert abs(outside.median() / s["magnitude"]["normal_mbps"] - 1) < 0.25
    assert abs(inside.median() / s["magnitude"]["degraded_mbps"] - 1) < 0.25
    other = df[(df.peer == "10.20.0.32") & (df.bytes >= 1_000_000)]
    other_in = other[(other.ts >= s["start_ms"]) & (other.ts < s["end_ms"])]
    assert (other_in.bytes / other_in.elapsed_ms / 1e3).median() > 400, "the other upstream is unaffected"


def test_pipeline_gap(run: tuple[Path, dict, pd.DataFrame]) -> None:
    _, truth, df = run
    s = _scn(truth, "pipeline_gap")
    w = _in(df, s["start_ms"], s["end_ms"])
    assert (w.source == s["scope"]["source"]).sum() == 0
    assert set(w.source) == {x["name"] for x in truth["sources"]} - {s["scope"]["source"]}
    before = _in(df, s["start_ms"] - 3_600_000, s["start_ms"])
    assert (before.source == s["scope"]["source"]).sum() > 0


# --- determinism, exact volume, options -------------------------------------------------------------------


def _small(out: Path, seed: int, **kw: object) -> SimConfig:
    args: dict = {"out": out, "days": 3, "lines": 40_000, "seed": seed,
                  "scenarios": parse_scenarios("flood_ip@2024-01-23T14:00/5m,scan,outage@2024-01-24T02:00/1h")}
    args.update(kw)
    return SimConfig(**args)


def test_same_seed_same_bytes(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    simulate(_small(a, 5))
    simulate(_small(b, 5))
    simulate(_small(c, 6))
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir()) and "truth.json" in names and "topics.csv" in names
    for n in names:
        assert file_digest(a / n) == file_digest(b / n), n
    assert file_digest(a / "web1.log") != file_digest(c / "web1.log")


def test_exact_line_count_and_explicit_placement(tmp_path: Path) -> None:
    res = simulate(_small(tmp_path, 3))
    assert res.total_lines == 40_000
    truth = json.loads(res.truth_path.read_text())
    assert sum(s["lines"] for s in truth["sources"]) == 40_000
    fl = _scn(truth, "flood_ip")
    assert fl["start_local"].startswith("2024-01-23T14:00:00+08:00") and fl["end_ms"] - fl["start_ms"] == 300_000
    # the truth's duration is the explicit one (it said the default: 0.2 h for /5m, 3 h for /1h; trial 31)
    assert fl["magnitude"]["duration_h"] == round(5 / 60, 4)
    assert _scn(truth, "outage")["magnitude"]["duration_h"] == 1.0
    got = sum(len(p.read_text().splitlines()) for p in tmp_path.glob("*.log"))
    assert got == 40_000
    with pytest.raises(ValueError, match="more than half"):
        simulate(_small(tmp_path / "x", 3, lines=5_000))


def test_single_format_and_other_timezone(tmp_path: Path) -> None:
    res = simulate(SimConfig(out=tmp_path, days=2, lines_per_day=5_000, sources=parse_sources("combined"),
                             tz="Europe/Berlin", country=None, scenarios=(), start=datetime(2024, 3, 30).date()))
    lines = (tmp_path / "web1.log").read_text().splitlines()
    assert len(lines) == res.total_lines == res.files["web1"]
    offs = {re.search(r" ([+-]\d{4})\] ", ln).group(1) for ln in lines}  # type: ignore[union-attr]
    assert offs == {"+0100", "+0200"}, "DST change on 31 March is followed"
    assert json.loads(res.truth_path.read_text())["scenarios"] == []


def test_option_parsing_errors() -> None:
    assert [s.name for s in parse_sources("combined_d,combined,squid")] == ["web1", "web2", "proxy"]
    assert parse_sources("edge=squid")[0] == SourceSpec("edge", "squid")
    with pytest.raises(ValueError, match="unknown format"):
        parse_sources("json")
    assert parse_scenarios("none") == () and parse_scenarios("default") is None
    with pytest.raises(ValueError, match="unknown scenario"):
        parse_scenarios("meteor")
    with pytest.raises(ValueError, match="bad scenario duration"):
        parse_scenarios("outage@2024-01-23T10:00/3x")
    with pytest.raises(ValueError, match="needs a squid or combined_d"):
        simulate(SimConfig(out=Path("/nonexistent/never"), days=3, sources=parse_sources("combined"),
                           scenarios=(ScenarioSpec("transfer_collapse"),)))


def test_command_function(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("noop")(lambda: None)
    r = CliRunner().invoke(app, ["simulate", "--out", str(tmp_path), "--days", "2", "--lines", "80000",
                                 "--format", "combined,squid", "--scenarios", "flood_ip", "--seed", "4"])
    assert r.exit_code == 0, r.output
    assert "web1.log: " in r.output and "proxy.log: " in r.output and "flood_ip-1" in r.output
    assert sum(len(p.read_text().splitlines()) for p in tmp_path.glob("*.log")) == 80_000
    bad = CliRunner().invoke(app, ["simulate", "--out", str(tmp_path), "--format", "xml"])
    assert bad.exit_code == 2 and "unknown format" in bad.output


def test_a_short_event_rises_and_decays_within_its_window(tmp_path: Path) -> None:
    """``event@…/80m`` rises and decays in proportion to its length: with the default 5 h rise it was cut off
    at 80 min at a few percent of traffic, and its truth gave a peak after its end (user trial 32)."""
    res = simulate(_small(tmp_path, 3, scenarios=parse_scenarios("event@2024-01-23T20:00/80m")))
    ev = _scn(json.loads(res.truth_path.read_text()), "event")
    assert ev["magnitude"]["rise_h"] == round(5.0 * (80 / 60) / 18.0, 4)
    assert ev["start_ms"] < datetime.fromisoformat(ev["peak"].replace("Z", "+00:00")).timestamp() * 1000 < ev["end_ms"]
