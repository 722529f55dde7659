"""Smoke runs of the ``make bench`` harness (``forumpulse.pipeline.bench``) with very small sizes.

They check that every section runs against the real tools (forumpulse ingest, goaccess, fail2ban-regex, chDB,
Kafka, syslog-ng, the owner process), that BENCHMARKS-style markdown has every section and summary row, and that
every figure is computed (finite, positive where it must be) and consistent with the input sizes.  No timing
assertion: speed is what the harness reports, not what the tests check.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_bench(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any], subprocess.CompletedProcess[str]]:
    out, js = tmp_path / "BENCH.md", tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "forumpulse.pipeline.bench", *args, "--workdir", str(tmp_path / "w"),
                           "--out", str(out), "--json", str(js)], capture_output=True, text=True, cwd=REPO,
                          timeout=1200, check=False)
    assert out.exists(), f"no report written (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    doc = json.loads(js.read_text())
    assert doc["errors"] == {}, f"failed sections: {doc['errors']}\n{proc.stdout[-4000:]}"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out.read_text(), doc, proc


def positive(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_offline_sections(tmp_path: Path) -> None:
    """ingest (+ GoAccess), scaling, dos (+ fail2ban-regex), storage and queries over tiny simulated files."""
    md, doc, _ = run_bench(tmp_path, "--sections", "ingest,dos,storage,queries", "--sizes", "20000",
                           "--scale", "20000,40000", "--repeat", "2")
    r = doc["results"]
    # ingest: both sizes, all lines stored, peer measured on the compared size only
    assert set(r["ingest"]) == {"20000", "40000"}
    for n, x in r["ingest"].items():
        assert x["lines"] == int(n) or abs(x["lines"] - int(n)) <= int(n) * 0.01, x
        assert x["rows"]["requests"] + x["rows"]["quarantine"] == x["lines"]
        assert positive(x["lines_s"]) and positive(x["rss_kb"])
        assert "error" not in x
        # CPU by kind of thread, sampled from /proc: the interpreter parsed, chDB inserted; never above the total
        t = x["threads_cpu_s"]
        assert positive(t["interpreter"]) and positive(t["chDB"]), t
        assert sum(t.values()) <= x["cpu_s"] + 0.05, (t, x["cpu_s"])
    g = r["ingest"]["20000"]["goaccess"]
    assert g["total_requests"] == r["ingest"]["20000"]["lines"]  # GoAccess really parsed every line
    assert positive(r["ingest"]["20000"]["ratio"]) and "goaccess" not in r["ingest"]["40000"]
    # the compared size runs alternating pairs (default 3); the row is the pair with the median ratio
    pairs = r["ingest"]["20000"]["pairs"]
    assert len(pairs) == 3 and "pairs" not in r["ingest"]["40000"]
    assert r["ingest"]["20000"]["ratio"] == sorted(p["ratio"] for p in pairs)[1]
    assert all(positive(p["seconds"]) and positive(p["goaccess_seconds"]) for p in pairs)
    assert "alternating pairs" in md
    # dos: detector saw every stored row; fail2ban matched every line of the same file
    d = r["dos"]
    assert d["lines"] == r["ingest"]["20000"]["rows"]["requests"] and positive(d["lines_s"])
    assert d["fail2ban"]["lines"] == r["ingest"]["20000"]["lines"] == d["fail2ban"]["matched"]
    assert positive(d["ratio"])
    # storage on the largest store: every table listed, requests rows = stored rows, raw bytes = file size
    st = r["analyze"]["storage"]
    assert r["analyze"]["lines"] == 40000
    assert st["tables"]["requests"]["rows"] == r["ingest"]["40000"]["rows"]["requests"]
    assert st["raw_bytes"] == r["ingest"]["40000"]["bytes"]
    assert all(positive(st["tables"][t]["bytes_on_disk"]) for t in ("requests", "site_minute", "topic_minute",
                                                                     "client_minute", "prefix_minute"))
    assert {c["column"] for c in st["columns"]} >= {"ts", "client_ip", "url", "user_agent"}
    pr = st["proposal"]  # the proposed schema variant holds the same rows (and derives path exactly if proposed)
    if pr is None:  # nothing left to propose: the current schema already has the changes
        types = {c["column"]: c["type"] for c in st["columns"]}
        assert types["url"].startswith("LowCardinality") and types["referer"].startswith("LowCardinality")
        assert "path" not in types  # derived: no bytes on disk
    else:
        assert pr["applied"] and pr["after"]["rows"] == pr["before"]["rows"] == st["tables"]["requests"]["rows"]
        assert pr["path_mismatches"] in (None, 0) and positive(pr["after"]["bytes_on_disk"])
        assert "path" not in pr["columns_after"]  # derived: no bytes on disk
    assert positive(st["tables"]["topic_hour"]["bytes_on_disk"])
    # queries: every panel of both dashboards, the variables and annotations, for both ranges
    from forumpulse.dashboards.panels import all_specs, sql_variables

    n_items = sum(len(v) for v in all_specs().values()) + len(sql_variables()) + 1
    q = r["analyze"]["queries"]
    assert len(q) == 2 * n_items and {x["range"] for x in q} == {"24h", "7d"}
    assert all(positive(x["p50_ms"]) and x["p95_ms"] >= x["p50_ms"] and x["runs"] == 2 for x in q)
    assert any(x["rows"] > 0 for x in q)  # the dataset is really queried
    dq = r["analyze"]["detector_queries"]
    assert dq and all(positive(x["p95_ms"]) for x in dq) and {x["phase"] for x in dq} == {"warm-up", "per minute"}
    # report: every section, summary rows with verdicts, machine/versions/commands, no missing figure
    for head in ("## Machine", "## Versions", "## Summary against targets", "## File → parse", "## DoS detector",
                 "## Storage", "## Queries over 40,000 rows", "## Memory (peak RSS)", "## Commands"):
        assert head in md, head
    summary = md.split("## Summary against targets", 1)[1].split("\n## ", 1)[0]
    for row in ("file → chDB, 20,000 lines", "DoS detector alone", "`requests` on disk", "dashboard queries",
                "scaling 20,000 → 40,000"):
        assert row in summary, row
    assert "n/a" not in md and not re.search(r"\bnan\b", md)
    assert "goaccess --log-format=COMBINED" in md and "fail2ban-regex" in md
    assert "CPU s by kind of thread" in md and "20,000 lines: interpreter" in md
    assert "load average before:" in md and "after:" in md


@pytest.mark.kafka
@pytest.mark.syslogng
def test_live_sections(tmp_path: Path) -> None:
    """consumer (pre-filled topic vs bare read) and end to end through syslog-ng and the owner, tiny sizes."""
    md, doc, _ = run_bench(tmp_path, "--sections", "consumer,e2e", "--sizes", "30000", "--consumer-lines", "20000",
                           "--e2e-lines", "20000", "--fresh-rate", "2000", "--fresh-seconds", "3")
    c = doc["results"]["consumer"]
    assert c["messages"] == c["bare_read"] == 20000
    assert c["rows"]["requests"] + c["rows"]["quarantine"] == 20000
    assert all(positive(c[k]) for k in ("bare_msg_s", "consumer_lines_s", "produce_msg_s", "consumer_rss_kb",
                                        "kafka_rss_kb"))
    t = c["consumer_threads_cpu_s"]  # the consumer's own threads, librdkafka's among them (20k messages: ~0 s)
    assert positive(t["interpreter"]) and positive(t["chDB"]) and t["librdkafka"] >= 0, t
    assert sum(t.values()) <= c["consumer_cpu_s"] + 0.05
    e = doc["results"]["e2e"]
    assert e["syslogng_dropped"] == 0 and e["e2e_s"] >= e["syslogng_s"] > 0
    assert e["fresh_lines"] == 6000 and e["fresh_measured"] == e["fresh_slices"] > 0
    assert 0 <= e["fresh_p50_s"] <= e["fresh_p95_s"] <= e["fresh_max_s"]
    assert all(positive(e[k]) for k in ("owner_rss_kb", "syslogng_rss_kb", "kafka_rss_kb", "e2e_lines_s"))
    assert "by kind of thread (sampled every 0.1 s): interpreter" in md
    for row in ("Kafka → chDB consumer", "file → syslog-ng → Kafka → rows queryable", "freshness p95"):
        assert row in md, row
    assert "n/a" not in md and not re.search(r"\bnan\b", md)
