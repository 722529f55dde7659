"""Nightly ``detect history`` runs (``--from D --to D+1``, then ``--from D+1 --to D+2``) store what one run over
both days stores.  An event open at the end of the first night whose ``end`` the second night back-dates before
its ``--from`` (a pipeline gap whose lines come back at 00:00 ends at 23:59; an outage ends at the minute the
traffic came back, confirmed after midnight) was left ``open`` in ``detections`` for ever: the second run dropped
it as "ended before the range" (found by a review)."""

from __future__ import annotations

from typing import Any

import pytest
from forumpulse.detectors.traffic import detect_history
from test_traffic_cases import _local, _settings, build_requests

GAP = {"site": {"name": "nightgap", "timezone": "UTC"}, "start": "2026-03-01", "days": 12, "per_minute": 20,
       "weekend_factor": 1.0, "events": [{"kind": "gap", "from": "2026-03-10T23:00", "to": "2026-03-11T00:00"}]}
OUTAGE = {"site": {"name": "nightout", "timezone": "UTC"}, "start": "2026-03-01", "days": 12, "per_minute": 20,
          "weekend_factor": 1.0,
          "events": [{"kind": "status", "status": 503, "from": "2026-03-10T22:00", "to": "2026-03-10T23:55"}]}


def _stored(store: Any, kind: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in store.query_rows(
        f"SELECT id, scope, start_ts, end_ts, state FROM detections FINAL WHERE kind = '{kind}'"))


@pytest.mark.parametrize(("case", "kind"), [(GAP, "pipeline_gap"), (OUTAGE, "outage")])
def test_two_nightly_runs_store_what_one_run_stores(store: Any, case: dict[str, Any], kind: str) -> None:
    store.insert("requests", build_requests(case))
    s, name = _settings([case]), case["site"]["name"]
    d10, d11, d12 = (_local(case, x) for x in ("2026-03-10T00:00", "2026-03-11T00:00", "2026-03-12T00:00"))
    first = detect_history(store, d10, d11, s, sites=[name])
    assert any(d.kind == kind and d.state == "open" for d in first)  # open at the first night's end
    second = detect_history(store, d11, d12, s, sites=[name])
    nightly = _stored(store, kind)
    assert nightly and all(r[4] == "closed" for r in nightly), nightly
    closed_now = [d for d in second if d.kind == kind]
    assert closed_now and all(d.state == "closed" and d.end is not None and d.end < d11 for d in closed_now)
    store.command("TRUNCATE TABLE detections")
    detect_history(store, d10, d12, s, sites=[name])
    assert nightly == _stored(store, kind)
