#!/usr/bin/env python3
"""Wall-clock latency of a flood line to a ban in the kernel, through the real stack:

    access-log file --(syslog-ng 3.38 wildcard-file, poll)--> Kafka weblogs.raw --(owner: forumpulse run --consume
    --dos, DoS feed or loader hook)--> DosDetector --> NftablesAction --> nftables set in a network namespace

Each flood is one client (198.51.100.N) at ``--rate`` requests/s (default 25) appended line by line, with its
real wall-clock time in the log line, over background traffic (``--background`` lines/s from ~2000 clients).
A poller inside the namespace lists the set (``nft -j list set inet forumpulse ban_v4``) every 20 ms; the
flood stops once its address is in the set.  For each flood we report:

* ``from_threshold``: set time - append time of the line that makes the rule decidable (the client_flood
  threshold-th line; a decision cannot come earlier in stream time) -- the pipeline's own latency;
* ``from_first``: set time - append time of the flood's first line (includes the rule window);
* stages of the threshold line: ``file_to_kafka`` (Kafka CreateTime of that line, set by syslog-ng's
  librdkafka), ``kafka_to_decision`` (the decision row's created_at), ``decision_to_set``.

Usage (root; Kafka jars, syslog-ng and nftables installed, see deploy/install-system-deps.sh)::

    .venv/bin/python deploy/bench_dos_latency.py [--floods 12] [--source feed|loader] [--follow-freq 1]
                                                 [--max-wait 0.2] [--loader-max-wait 1.0] [--background 200]

Creates namespace ``fplat`` (no interfaces but lo, no addresses outside it), Kafka, syslog-ng and the owner
under a temporary directory; removes all of them on exit, also on failure.  Prints one JSON summary line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NS = "fplat"
_MON = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
POLLER = r"""
import json, subprocess, sys, time
seen = set()
while True:
    p = subprocess.run(["nft", "-j", "list", "set", "inet", "forumpulse", "ban_v4"], capture_output=True, text=True)
    t = time.time()
    if p.returncode == 0:
        for x in json.loads(p.stdout).get("nftables", []):
            for el in x.get("set", {}).get("elem", []):
                v = el.get("elem", {}).get("val") if isinstance(el, dict) else el
                if isinstance(v, str) and v not in seen:
                    seen.add(v)
                    print(json.dumps({"value": v, "t": t}), flush=True)
    time.sleep(0.02)
"""


def clf(t: float) -> str:
    tm = time.gmtime(t)
    return f"{tm.tm_mday:02d}/{_MON[tm.tm_mon - 1]}/{tm.tm_year}:{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} +0000"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (k - lo), 3)


# ------------------------------------------------------------------------------------------ owner (child)


def owner_child(config: str, netns: str, consume: bool, loader_max_wait: float) -> None:
    """The owner process: forumpulse run --dos [--consume] with the nftables action inside ``netns``."""
    import logging

    from forumpulse.detectors.actions import NftablesAction
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import live_services
    from forumpulse.pipeline.owner import Owner

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings(Path(config))
    nft = NftablesAction(netns=netns)
    nft.ensure()  # the table exists before the first ban (as after the first ban of a long-running owner)
    from forumpulse.pipeline.consumer import ConsumerOptions

    opts = ConsumerOptions.from_settings(settings, max_wait_s=loader_max_wait)
    owner = Owner(settings, port=0, consume=consume, consumer_options=opts,
                  services=live_services(dos=True, actions=[nft]))
    signal.signal(signal.SIGTERM, lambda *_: owner.stop())
    owner.start()
    print(json.dumps({"port": owner.port}), flush=True)
    owner.wait()


# ------------------------------------------------------------------------------------------ bench (parent)


class Writer:
    """Appends lines to one access log; every line is flushed to the file at once."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.lock = threading.Lock()

    def write(self, line: str) -> float:
        with self.lock:
            self.f.write(line + "\n")
            self.f.flush()
            return time.time()

    def close(self) -> None:
        self.f.close()


def background(w: Writer, rate: float, stop: threading.Event) -> None:
    rng = random.Random(11)
    clients = [f"203.0.113.{i}" for i in range(1, 255)] + [f"10.{a}.{b}.{c}" for a, b, c in
                                                           zip(range(1, 9), range(200), range(1, 240), strict=False)]
    clients += [f"192.0.2.{i}" for i in range(1, 255)] + [f"100.64.{i // 250}.{i % 250 + 1}" for i in range(1500)]
    uas = ["Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/120.0", "Mozilla/5.0 (X11; Linux x86_64) Firefox/121.0",
           "Mozilla/5.0 (iPhone; CPU iPhone OS 17_1 like Mac OS X) Mobile/15E148"]
    n, t0 = 0, time.monotonic()
    while not stop.is_set():
        ip = rng.choice(clients)
        r = rng.random()
        path = (f"/showthread.php?t={rng.randrange(1, 900)}" if r < 0.6 else
                f"/static/{rng.choice(['app.js', 'style.css'])}" if r < 0.85 else "/index.php")
        now = time.time()
        w.write(f'{ip} - - [{clf(now)}] "GET {path} HTTP/1.1" 200 {rng.randrange(300, 90000)} '
                f'"https://forum.example/" "{rng.choice(uas)}"')
        n += 1
        ahead = n / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "tests"))
    import yaml
    from forumpulse.detectors.dos_rules import load_rules
    from live_stack import forumpulse_defines, kafka_broker, syslog_ng

    threshold = int(next(r.threshold for r in load_rules().rules if r.name == "client_flood"))
    subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    procs: list[subprocess.Popen[Any]] = []
    stop_bg = threading.Event()
    tmp = Path(tempfile.mkdtemp(prefix="fp-doslat-"))
    try:
        subprocess.run(["ip", "-n", NS, "link", "set", "lo", "up"], check=True)
        with kafka_broker(tmp / "kafka") as broker:
            defines = forumpulse_defines(tmp / "logs", broker, fp_follow_freq=args.follow_freq)
            log_path = tmp / "logs" / "vhosts" / "forum.example.access.log"
            log_path.touch()
            with syslog_ng(tmp / "sng", defines=defines):
                cfg = tmp / "forumpulse.yaml"
                cfg.write_text(yaml.safe_dump({
                    "store": {"url": f"chdb:{tmp / 'chdb'}"},
                    "kafka": {"bootstrap_servers": broker.bootstrap},
                    "detectors": {"dos": {"crawlers": {"verify": "ua"}},
                                  "live": {"dos_source": args.source, "feed_start": "earliest",
                                           "feed_max_wait_s": args.max_wait}},
                    "actions": {},
                }))
                env = {**os.environ, "PYTHONUNBUFFERED": "1", "FORUMPULSE_LOG_LEVEL": "INFO"}
                owner_log = open(tmp / "owner.log", "w")  # noqa: SIM115
                owner = subprocess.Popen([sys.executable, __file__, "--owner-child", str(cfg), NS,
                                          "--consume" if args.consume or args.source == "loader" else "--no-consume",
                                          str(args.loader_max_wait)],
                                         stdout=subprocess.PIPE, stderr=owner_log, text=True, env=env, cwd=ROOT)
                procs.append(owner)
                port = json.loads(owner.stdout.readline() if owner.stdout else "{}")["port"]
                poller = subprocess.Popen(["ip", "netns", "exec", NS, sys.executable, "-c", POLLER],
                                          stdout=subprocess.PIPE, text=True)
                procs.append(poller)
                seen: dict[str, float] = {}

                def read_poller() -> None:
                    assert poller.stdout is not None
                    for ln in poller.stdout:
                        d = json.loads(ln)
                        seen.setdefault(d["value"], d["t"])

                threading.Thread(target=read_poller, daemon=True).start()
                w = Writer(log_path)
                bg = threading.Thread(target=background, args=(w, args.background, stop_bg), daemon=True)
                bg.start()
                time.sleep(args.warmup)  # background flowing end to end, feed assigned, baselines learning
                floods = []
                for k in range(args.floods):
                    ip = f"198.51.100.{10 + k}"
                    appended: list[float] = []
                    t_start = time.monotonic()
                    i = 0
                    while ip not in seen and time.monotonic() - t_start < args.flood_cap:
                        i += 1
                        now = time.time()
                        appended.append(w.write(
                            f'{ip} - - [{clf(now)}] "GET /forumdisplay.php?f=3 HTTP/1.1" 200 5120 '
                            f'"https://forum.example/?seq={i}" "python-requests/2.31"'))
                        nxt = t_start + i / args.rate
                        time.sleep(max(0.0, nxt - time.monotonic()))
                    deadline = time.monotonic() + 5
                    while ip not in seen and time.monotonic() < deadline:
                        time.sleep(0.01)
                    floods.append({"ip": ip, "lines": len(appended), "appended": appended, "set_at": seen.get(ip)})
                    time.sleep(args.gap)
                stop_bg.set()
                bg.join()
                # stage times from the decisions table (owner endpoint) and the Kafka CreateTime of the lines
                from forumpulse.pipeline.store import ClickHouseStore

                cs = ClickHouseStore(f"clickhouse://default@127.0.0.1:{port}/forumpulse")
                created = {str(v): int(c) / 1000 for v, c in cs.query_rows(
                    "SELECT value, toUnixTimestamp64Milli(min(created_at)) FROM decisions WHERE action = 'ban' "
                    "GROUP BY value")}
                reasons = {str(v): str(r) for v, r in cs.query_rows(
                    "SELECT value, any(reason) FROM decisions WHERE action = 'ban' GROUP BY value")}
                loaded = int(cs.query_rows("SELECT count() FROM requests")[0][0])
                cs.close()
                kafka_ts: dict[tuple[str, int], float] = {}
                # Kafka CreateTime of every flood line (set by syslog-ng's librdkafka when it produced it)
                from confluent_kafka import Consumer, TopicPartition

                c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "bench-ts",
                              "enable.auto.commit": False})
                marks = broker.watermarks("weblogs.raw")
                c.assign([TopicPartition("weblogs.raw", p, lo) for p, (lo, _hi) in marks.items()])
                todo = {p: hi for p, (lo, hi) in marks.items() if hi > lo}
                while todo:
                    for m in c.consume(10000, 1.0):
                        if m.error():
                            continue
                        key = (m.key() or b"").decode()
                        if key.startswith("198.51.100."):
                            v = (m.value() or b"").decode("utf-8", "replace")
                            seq = v.rsplit("?seq=", 1)[-1].split('"', 1)[0]
                            if seq.isdigit():
                                kafka_ts[(key, int(seq))] = m.timestamp()[1] / 1000
                        if m.offset() + 1 >= todo.get(m.partition(), 0):
                            todo.pop(m.partition(), None)
                c.close()
        rows = []
        for f in floods:
            if f["set_at"] is None or len(f["appended"]) < threshold:
                rows.append({"ip": f["ip"], "banned": False, "lines": f["lines"]})
                continue
            t_thr = f["appended"][threshold - 1]
            k_ts = kafka_ts.get((f["ip"], threshold))
            dec = created.get(f["ip"])
            rows.append({
                "ip": f["ip"], "banned": True, "lines": f["lines"], "reason": reasons.get(f["ip"]),
                "from_threshold": round(f["set_at"] - t_thr, 3), "from_first": round(f["set_at"] - f["appended"][0], 3),
                "file_to_kafka": round(k_ts - t_thr, 3) if k_ts else None,
                "kafka_to_decision": round(dec - k_ts, 3) if dec and k_ts else None,
                "decision_to_set": round(f["set_at"] - dec, 3) if dec else None,
            })
        ok = [r for r in rows if r["banned"]]

        def stat(name: str) -> dict[str, float]:
            xs = [r[name] for r in ok if r.get(name) is not None]
            return {"p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": round(max(xs), 3) if xs else float("nan")}

        return {"source": args.source, "consume": bool(args.consume or args.source == "loader"),
                "follow_freq_s": args.follow_freq, "feed_max_wait_s": args.max_wait,
                "loader_max_wait_s": args.loader_max_wait if args.source == "loader" else None,
                "flood_rate": args.rate, "background_rate": args.background, "threshold_line": threshold,
                "floods": len(rows), "banned": len(ok), "lines_loaded": loaded,
                "from_threshold_s": stat("from_threshold"), "from_first_s": stat("from_first"),
                "file_to_kafka_s": stat("file_to_kafka"), "kafka_to_decision_s": stat("kafka_to_decision"),
                "decision_to_set_s": stat("decision_to_set"), "per_flood": rows}
    finally:
        stop_bg.set()
        for p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        subprocess.run(["ip", "netns", "del", NS], capture_output=True, check=False)
        if not args.keep:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp}", file=sys.stderr)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--owner-child":
        owner_child(sys.argv[2], sys.argv[3], sys.argv[4] == "--consume", float(sys.argv[5]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--floods", type=int, default=12)
    ap.add_argument("--rate", type=float, default=25.0, help="flood requests/s")
    ap.add_argument("--background", type=float, default=200.0, help="background lines/s")
    ap.add_argument("--source", choices=["feed", "loader"], default="feed")
    ap.add_argument("--consume", action="store_true", default=True, help="the owner also loads (default)")
    ap.add_argument("--no-consume", dest="consume", action="store_false")
    ap.add_argument("--follow-freq", default="1", help="syslog-ng follow-freq() of the file sources (s)")
    ap.add_argument("--max-wait", type=float, default=0.2, help="DoS feed batch wait (s)")
    ap.add_argument("--loader-max-wait", type=float, default=1.0, help="loader batch wait with --source loader")
    ap.add_argument("--warmup", type=float, default=8.0)
    ap.add_argument("--gap", type=float, default=1.5)
    ap.add_argument("--flood-cap", type=float, default=10.0, help="stop a flood that is not banned after this")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespace, nftables)")
    out = run_bench(args)
    print(json.dumps(out))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
