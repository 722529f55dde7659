"""`forumpulse ingest` when the store fails half-way (a full disk: ClickHouse's NOT_ENOUGH_SPACE): one clear error
with what to do, exit code 1, no traceback; and doing what it says — running the same command again — stores
every line exactly once (the blocks stored before the failure are recognised by their tokens and skipped,
rollups included).

The failure is injected at the store's boundary (``ChdbStore.insert`` raises the error chDB raises on a full
disk, on the third block), in a child process running the real command against a real chDB folder; everything
else is the product's own code.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

FIX = Path(__file__).parent / "fixtures"
EXE = Path(sys.executable).with_name("forumpulse")

FAILING = textwrap.dedent("""
    import sys
    from forumpulse.pipeline import store as st
    from forumpulse.pipeline.cli import main

    real, seen, fail_at = st.ChdbStore.insert, [0], int(sys.argv[1])

    def insert(self, table, data, dedup_token=None):
        if table == "requests":
            seen[0] += 1
            if seen[0] == fail_at:
                raise st.StoreError("insert into requests failed: Code: 243. DB::Exception: Cannot reserve "
                                    "22.22 MiB, not enough space. (NOT_ENOUGH_SPACE)")
        return real(self, table, data, dedup_token)

    st.ChdbStore.insert = insert
    sys.argv = ["forumpulse", *sys.argv[2:]]
    main()
""")

COUNTS = textwrap.dedent("""
    import json, sys
    from forumpulse.pipeline.store import open_store
    s = open_store("chdb:" + sys.argv[1])
    q = lambda sql: int(s.query_rows(sql)[0][0])
    print(json.dumps({"requests": q("SELECT count() FROM requests"), "quarantine": q("SELECT count() FROM quarantine"),
                      "site_minute": q("SELECT sum(requests) FROM site_minute"),
                      "client_minute": q("SELECT sum(requests) FROM client_minute"),
                      "topic_minute": q("SELECT sum(views) FROM topic_minute")}))
""")


def _counts(store: Path) -> dict[str, int]:
    r = subprocess.run([sys.executable, "-c", COUNTS, str(store)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout))


def test_a_store_failure_half_way_is_one_clear_error_and_a_rerun_stores_every_line_once(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_bytes((FIX / "ingest" / "mixed.log").read_bytes() * 1500)  # 15,000 lines, some malformed
    n_lines = log.read_bytes().count(b"\n")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text(yaml.safe_dump({"ingest": {"batch_lines": 2000},  # 8 blocks: the failure lands in the middle
                                   "retention": {"raw_days": 0, "rollup_days": 0, "quarantine_days": 0}}))
    store = tmp_path / "db"
    args = ["ingest", "--config", str(cfg), "--store", f"chdb:{store}", "--format", "combined", str(log)]

    r = subprocess.run([sys.executable, "-c", FAILING, "3", *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "error: insert into requests failed" in r.stderr and "NOT_ENOUGH_SPACE" in r.stderr
    assert "run the same command on the same input again" in r.stderr
    assert "Traceback" not in r.stderr
    partial = _counts(store)
    assert 0 < partial["requests"] + partial["quarantine"] < n_lines  # two blocks stored before the failure

    r = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    after = _counts(store)
    ref_store = tmp_path / "ref"
    r = subprocess.run([str(EXE), *args[:4], f"chdb:{ref_store}", *args[5:]], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ref = _counts(ref_store)
    assert after == ref  # nothing twice, nothing missing, rollups included
    assert after["requests"] + after["quarantine"] == n_lines and after["requests"] > 0
