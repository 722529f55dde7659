"""Generate the Grafana dashboards (JSON, committed next to this file) with grafana-foundation-sdk.

``python -m forumpulse.dashboards.build`` rewrites ``dashboards/forumpulse-ops.json`` and
``dashboards/forumpulse-topics.json``; ``--check`` exits 1 when the committed files differ from a fresh build
(CI).  Output is deterministic (sorted keys, fixed ids and grid positions), so a diff shows real changes only.

Provisioning for Grafana lives in ``dashboards/provisioning/`` (data source ``forumpulse-clickhouse`` and a file
provider pointing at the folder holding these JSON files).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from forumpulse.dashboards.panels import (
    DATASOURCE_TYPE,
    DATASOURCE_UID,
    METRICS,
    ClickHouseQuery,
    PanelSpec,
    all_specs,
    annotation_json,
    sql_variables,
)
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common, dashboard

OUT_DIR = Path(__file__).resolve().parent
TITLES = {"forumpulse-ops": "forumpulse / Ops live", "forumpulse-topics": "forumpulse / Forum topics"}
DS = dashboard.DataSourceRef(type_val=DATASOURCE_TYPE, uid=DATASOURCE_UID)


def _layout(specs: list[PanelSpec]) -> list[dashboard.GridPos]:
    """Left-to-right rows of the 24-column grid; a panel that does not fit starts a new row (no overlaps)."""
    out, x, y, row_h = [], 0, 0, 0
    for s in specs:
        if x + s.w > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(dashboard.GridPos(h=s.h, w=s.w, x=x, y=y))
        x, row_h = x + s.w, max(row_h, s.h)
    return out


def _panel(spec: PanelSpec, pid: int, pos: dashboard.GridPos) -> Any:
    target = ClickHouseQuery(spec.sql)
    target = target.table() if spec.fmt == 1 else target.time_series()
    p: Any
    if spec.kind == "timeseries":
        p = timeseries.Panel().interval("1m").line_width(1).fill_opacity(25 if spec.stacked else 8)
        if spec.stacked:
            p = p.stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL))
    elif spec.kind == "table":
        p = table.Panel()
    else:
        raise ValueError(f"unknown panel kind {spec.kind}")
    p = p.id(pid).title(spec.title).datasource(DS).with_target(target).grid_pos(pos)
    if spec.description:
        p = p.description(spec.description)
    if spec.unit:
        p = p.unit(spec.unit)
    if spec.links:
        p = p.data_links([db.DashboardLink(title).url(url) for title, url in spec.links])
    return p


def _variables(uid: str) -> list[Any]:
    """The dashboard variables.  Only the topic takes custom values (a link may open a topic that has no title row
    yet); the others offer their options only.  That is not what keeps the SQL safe (a URL or an API call can still
    carry any value): the panels read every variable percent-encoded (panels.SITE_VALUE)."""
    sqls = sql_variables()
    out: list[Any] = [
        db.QueryVariable("site").label("Site").datasource(DS).query(sqls["site"])
        .refresh(dashboard.VariableRefresh.ON_DASHBOARD_LOAD).allow_custom_value(False)
    ]
    if uid == "forumpulse-topics":
        out += [
            db.CustomVariable("metric").label("Metric").values(",".join(METRICS))
            .current(dashboard.VariableOption(selected=True, text="views", value="views")).allow_custom_value(False),
            db.QueryVariable("group").label("Topic groups").datasource(DS).query(sqls["group"]).multi(True)
            .include_all(True).refresh(dashboard.VariableRefresh.ON_DASHBOARD_LOAD).allow_custom_value(False),
            db.QueryVariable("topic").label("Topic").datasource(DS).query(sqls["topic"])
            .refresh(dashboard.VariableRefresh.ON_DASHBOARD_LOAD).allow_custom_value(True),
        ]
    return out


def build_dashboard(uid: str) -> dict[str, Any]:
    """The dashboard ``uid`` as a JSON-ready dict."""
    specs = all_specs()[uid]
    b = (
        db.Dashboard(TITLES[uid]).uid(uid).tags(["forumpulse"]).timezone("").time("now-6h", "now")
        .refresh("1m").editable().variables(_variables(uid))
    )
    for i, (spec, pos) in enumerate(zip(specs, _layout(specs), strict=True), start=1):
        b = b.with_panel(_panel(spec, i, pos))
    b = b.link(db.DashboardLink("forumpulse").type(dashboard.DashboardLinkType.DASHBOARDS).tags(["forumpulse"])
               .as_dropdown(True).keep_time(True).include_vars(True))
    data: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    # Grafana's built-in annotations plus detections from ClickHouse (the SDK's AnnotationTarget cannot hold a
    # datasource-specific query, so the plugin's query model is set here).
    data["annotations"] = {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            annotation_json(),
        ]
    }
    return data


def render_all() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {f"{uid}.json": json.dumps(build_dashboard(uid), indent=2, sort_keys=True) + "\n" for uid in all_specs()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT_DIR, help="output folder (default: the package folder)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the files in --out are not up to date")
    a = ap.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        path = a.out / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python -m forumpulse.dashboards.build)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
