"""`forumpulse demo` end to end on a small volume: every stage runs on the real engine and the numbers add up."""

from __future__ import annotations

import json
from pathlib import Path

from forumpulse.pipeline.demo import run_demo
from rich.console import Console


def test_demo_small_run(tmp_path):
    out = tmp_path / "out.txt"
    with out.open("w") as fh:
        figures = run_demo(tmp_path, weeks=4, lines_per_day=8000, seed=3, console=Console(file=fh, width=160))
    text = out.read_text()
    truth = json.loads((tmp_path / "demo" / "logs" / "truth.json").read_text())
    assert figures["lines"] == truth["total_lines"] == figures["loaded"] + figures["quarantined"]
    assert figures["scenarios"] == len(truth["scenarios"])
    assert figures["detections"] > 0 and figures["decisions"] > 0
    # the simulated single-IP flood is banned and the election surge is detected, even at this small volume
    flood = next(s for s in truth["scenarios"] if s["kind"] == "flood_ip")
    assert flood["scope"]["client_ip"] in text
    assert "group:election" in text
    assert figures["report"] and Path(figures["report"]).is_file()
    for heading in ("top topics", "traffic per day", "quarantined lines", "detections (traffic)", "ground truth"):
        assert heading in text
    assert f"{figures['detections']} detections over 21 days (7 more for the baselines)" in text  # step 3 says
    # the replay's bans are stamped in stream time (2024): none is in force today, for `detect decisions` or an
    # owner restoring bans from the table
    from forumpulse.pipeline.live_detect import active_from_store
    from forumpulse.pipeline.store import open_store

    st = open_store(f"chdb:{tmp_path / 'demo' / 'chdb'}")
    try:
        stored = st.query_rows("SELECT count(), toYear(max(created_at)) FROM decisions WHERE action = 'ban'")
        assert stored[0][0] > 0 and stored[0][1] == 2024, stored
        assert active_from_store(st) == []
    finally:
        st.close()
