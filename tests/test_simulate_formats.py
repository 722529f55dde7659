"""Cross-check: every simulated line parses with the project's own parsers (forumpulse.pipeline.formats)."""

from __future__ import annotations

import json
from pathlib import Path

from forumpulse.pipeline.formats import get_parser
from forumpulse.pipeline.record import Drop
from forumpulse.pipeline.simulate import SimConfig, parse_scenarios, simulate


def test_simulated_lines_parse_with_project_parsers(tmp_path: Path) -> None:
    simulate(SimConfig(out=tmp_path, days=2, lines=60_000, seed=2,
                       scenarios=parse_scenarios("scan@2024-01-23T03:00/10m,outage@2024-01-23T10:00/1h")))
    truth = json.loads((tmp_path / "truth.json").read_text())
    for src in truth["sources"]:
        parser = get_parser(src["format"])
        last = 0
        n = 0
        for line in (tmp_path / src["file"]).read_text().splitlines():
            rec = parser.parse(line)
            assert not isinstance(rec, Drop), f"{src['file']}: {rec} for {line!r}"
            assert rec.ts >= last and truth["start_ms"] <= rec.ts < truth["end_ms"]
            assert (rec.elapsed_ms is not None) == (src["format"] != "combined")
            last = rec.ts
            n += 1
        assert n == src["lines"] > 0
