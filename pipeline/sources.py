"""Retired log sources (``source_retired``, migration 0011): a web server removed, a vhost deleted, a sender
decommissioned -- a source ops know will not send again.

Guarantees and how to read a retirement:

* A retirement of ``(site, origin_host, origin_file)`` at ``retired_at`` holds while the source has sent no line
  after ``retired_at``.  The traffic detectors then close the source's open ``pipeline_gap`` where the
  retirement begins (``detail.closed_by = retired``) and open none for its silence after it; the status page
  (``source_status``, ``GET /fp/sources``) and the sources panel show it ``retired`` instead of ``dead``.
  Live runs, history runs and a restarted live run read the same rows, so they agree.
* A line after ``retired_at`` makes it an ordinary source again (a server put back needs no command); a later
  silence is judged as any other.
* Undo (a source retired by mistake): a row with ``retired_at`` = the epoch (:data:`NOT_RETIRED`): every line is
  after it.  The newest row (``updated_at``) per source stands; rows are never deleted.
* A site whose every source that sent it lines in the hour before its last line is retired and silent is
  retired with them: its own ``pipeline_gap``, or an outage or dip still open, closes where the latest
  retirement begins, and its silence after it is neither (``SourceGapDetector.site_retired``).
* Misuse: retire a collector's network listener by stopping it: a listener is no source
  (``GET /fp/listeners``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import pyarrow as pa
import typer
from forumpulse.pipeline.store import sql_string as _q

RETIRED_SCHEMA = pa.schema([
    ("site", pa.string()), ("origin_host", pa.string()), ("origin_file", pa.string()),
    ("retired_at", pa.timestamp("ms", tz="UTC")), ("note", pa.string()), ("updated_at", pa.timestamp("ms", tz="UTC")),
])
#: ``retired_at`` of an undone retirement: every line is after it
NOT_RETIRED = datetime(1970, 1, 1, tzinfo=UTC)


def parse_source(text: str) -> tuple[str, str]:
    """``host/file`` (as a source ``pipeline_gap``'s scope names it, ``source:`` prefix allowed; the file may
    start with ``/``: ``web1//var/log/apache2/access.log``) -> ``(origin_host, origin_file)``."""
    host, sep, file = text.removeprefix("source:").partition("/")
    if not sep or not host or not file:
        raise ValueError(f"{text!r} is not a source: write origin_host/origin_file, as a source pipeline_gap's "
                         "scope shows it (e.g. web1//var/log/apache2/access.log, or web1/tcp:5140 for a raw sender)")
    return host, file


def has_table(store: Any) -> bool:
    """The store has ``source_retired`` (a store from before migration 0011 has not: nothing is retired)."""
    return bool(store.query_rows("SELECT count() FROM system.tables WHERE database = currentDatabase() "
                                 "AND name = 'source_retired'")[0][0])


def known_source(store: Any, site: str, host: str, file: str) -> bool:
    """The store has heard of the source: a ``source_liveness`` row (the live path) or a loaded line
    (``forumpulse ingest``)."""
    where = f"site = {_q(site)} AND origin_host = {_q(host)} AND origin_file = {_q(file)}"
    return bool(store.query_rows(f"SELECT count() FROM source_liveness WHERE {where}")[0][0]) or bool(
        store.query_rows(f"SELECT 1 FROM requests WHERE {where} LIMIT 1"))


def retirement_minute(at: datetime) -> datetime:
    """``at`` rounded up to a whole minute: a line before it is "before the retirement" everywhere (the
    detectors judge whole minutes, so a line earlier in ``at``'s minute counts as before it, also on the status
    page: a source retired right after it stopped, within the same minute, is retired)."""
    at = at.astimezone(UTC)
    whole = at.replace(second=0, microsecond=0)
    return whole if whole == at else whole + timedelta(minutes=1)


def retired_after(line_ms: int, retired_ms: int, now_ms: int) -> bool:
    """A source whose last line came at ``line_ms`` is retired at ``now_ms`` by a retirement at ``retired_ms``
    (0: none): the retirement has come, and the line is before its minute rounded up
    (:func:`retirement_minute`; ``dashboards.panels.liveness_sources`` states the same in SQL)."""
    return 0 < retired_ms <= now_ms and line_ms < -(-retired_ms // 60_000) * 60_000


def retire(store: Any, site: str, sources: Iterable[tuple[str, str]], at: datetime, note: str = "",
           now: datetime | None = None) -> int:
    """Record ``sources`` of ``site`` as retired at ``at`` (compared with lines by :func:`retired_after`);
    :data:`NOT_RETIRED`: undo.  The newest row
    per source stands: each is stamped after every earlier row of its source (``argMax`` and ``FINAL`` then
    agree).  Returns the rows written."""
    srcs = list(sources)
    if not srcs:
        return 0
    at = at.astimezone(UTC)
    pairs = ", ".join(f"({_q(h)}, {_q(f)})" for h, f in srcs)
    [[prev]] = store.query_rows("SELECT toUnixTimestamp64Milli(max(updated_at)) FROM source_retired "
                                f"WHERE site = {_q(site)} AND (origin_host, origin_file) IN ({pairs})")
    stamp = max(now or datetime.now(UTC), datetime.fromtimestamp((int(prev or 0) + 1) / 1000, UTC))
    rows = [{"site": site, "origin_host": h, "origin_file": f, "retired_at": at, "note": note, "updated_at": stamp}
            for h, f in srcs]
    store.insert("source_retired", pa.Table.from_pylist(rows, schema=RETIRED_SCHEMA))
    return len(rows)


def retired_sources(store: Any, site: str | None = None) -> dict[tuple[str, str, str], int]:
    """``(site, origin_host, origin_file)`` -> ``retired_at`` in epoch milliseconds, the newest
    row per source (undone ones left out); ``site`` None: every site.  Empty on a store without the table.
    A retirement later than the time judged (``--at`` in the future) does not hold yet: readers compare."""
    if not has_table(store):
        return {}
    where = f"WHERE site = {_q(site)} " if site is not None else ""
    return {(str(s), str(h), str(f)): int(ms) for s, h, f, ms in store.query_rows(
        "SELECT site, origin_host, origin_file, toUnixTimestamp64Milli(argMax(retired_at, updated_at)) AS ms "
        f"FROM source_retired {where}GROUP BY site, origin_host, origin_file HAVING ms > 0")}


# ---------------------------------------------------------------------------------------------- commands

def _unknown_text(store: Any, site: str, unknown: list[str], limit: int = 50) -> str:
    """The error for sources the store has not heard of: the site's sources on the live path
    (``source_liveness``) and, apart, those only loaded by ``forumpulse ingest`` (lines in ``requests``; the
    list omitted them, though pipeline_gap names them too, user trial 41), with the closest to each unknown
    name suggested."""
    import difflib

    def names(sql: str) -> list[str]:
        return sorted({f"{h}/{f}" for h, f in store.query_rows(sql)})

    live = names(f"SELECT origin_host, origin_file FROM source_liveness WHERE site = {_q(site)} "
                 "GROUP BY origin_host, origin_file")
    ingested = [n for n in names(f"SELECT origin_host, origin_file FROM requests WHERE site = {_q(site)} "
                                 f"GROUP BY origin_host, origin_file LIMIT {limit + len(live)}") if n not in live]
    hints = [f"{u} -> {m[0]}?" for u in unknown for m in [difflib.get_close_matches(u, live + ingested, 1, 0.6)] if m]
    return (f"site {site!r} has no source {', '.join(unknown)} (nothing written; --force writes it anyway)."
            + (f" Did you mean: {'; '.join(hints)}" if hints else "")
            + f" Its sources on the live path: {', '.join(live) or 'none'}"
            + (f"; loaded by forumpulse ingest: {', '.join(ingested[:limit])}"
               + (" ..." if len(ingested) > limit else "") if ingested else ""))


def _open(config: str | None, store_url: str | None) -> Any:
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.store import open_store

    settings = load_settings(config)  # ConfigError / StoreError: reported by the CLI's main()
    return open_store(store_url or settings.store.url, existing=True)


def retire_command(
    sources: Annotated[list[str], typer.Argument(help="origin_host/origin_file, as a source pipeline_gap's scope "
                                                 "names it (source:web1//var/log/apache2/access.log)")],
    site: Annotated[str, typer.Option(help="the site the sources send for")],
    at: Annotated[str, typer.Option(help="retired since (ISO 8601, UTC unless an offset is given; default: "
                                    "now); a line after it makes the source an ordinary one again")] = "",
    note: Annotated[str, typer.Option(help="why (kept with the row)")] = "",
    undo: Annotated[bool, typer.Option("--undo", help="the retirement was a mistake: judge the sources as "
                                       "before")] = False,
    force: Annotated[bool, typer.Option("--force", help="also a source the store has not heard of")] = False,
    store: Annotated[str | None, typer.Option(help="chdb:PATH or clickhouse://... (while the owner runs: its URL, "
                                              "which `make up` prints)")] = None,
    config: Annotated[str | None, typer.Option("--config", "-c", help="YAML configuration file")] = None,
) -> None:
    """Retire log sources that will not send again (a server removed): the detectors close their open
    pipeline_gap where the retirement begins and open none for the silence after it, and the status page shows
    them `retired` instead of `dead` -- until a source sends a line again.  Prints one JSON line per source."""
    try:
        parsed = [parse_source(s) for s in sources]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    if undo:
        when = NOT_RETIRED
    elif at:
        try:
            when = datetime.fromisoformat(at.replace("Z", "+00:00"))
        except ValueError:
            raise typer.BadParameter(f"{at!r} is not an ISO 8601 date or time", param_hint="--at") from None
        when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
        if when > datetime.now(UTC):
            raise typer.BadParameter(f"{at!r} is in the future: retire a source once it has stopped",
                                     param_hint="--at")
    else:
        when = datetime.now(UTC)
    st = _open(config, store)
    try:
        if not has_table(st):
            print("error: the store has no table source_retired: run `forumpulse db migrate` (migration 0011)",
                  file=sys.stderr)
            raise SystemExit(1)
        unknown = [f"{h}/{f}" for h, f in parsed if not force and not known_source(st, site, h, f)]
        if unknown:  # a typo is a usage error (2), as the CLI's others (it was 1; user trial 41)
            print(f"error: {_unknown_text(st, site, unknown)}", file=sys.stderr)
            raise SystemExit(2)
        warnings = _surprises(st, site, parsed, when, undo)
        retire(st, site, parsed, when, note)
        whole = not undo and site_wholly_retired(st, site)
    finally:
        st.close()
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    stamp = when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for h, f in parsed:
        print(json.dumps({"site": site, "source": f"{h}/{f}", "retired_at": None if undo else stamp,
                          "note": note}))
    print("note: live detectors apply it within a minute or two (their next run over landed data); `detect "
          "history` over a range after it "
          "reports the source's gap closed there (closed_by: retired)" if not undo else
          "note: undone: the sources are judged as before from the detectors' next run", file=sys.stderr)
    if whole:
        print(f"note: every source that sent site {site!r} lines in its last hour is retired now: the site is "
              "retired too (its own pipeline_gap, or an outage or dip still open, closes where the latest "
              "retirement begins)", file=sys.stderr)


def site_wholly_retired(store: Any, site: str) -> bool:
    """Every source (``source_liveness``) that sent ``site`` lines in the hour before its latest line is
    retired now (:func:`retired_after`): the detectors then take the site itself as retired
    (``SourceGapDetector.site_retired`` asks the same sources from the lines it has read, by their minutes:
    both are judged in whole minutes here, but a line's arrival time is not its log time, so at the hour's
    edge this is a hint, not the detectors' verdict)."""
    rows = store.query_rows(
        "SELECT origin_host, origin_file, toUnixTimestamp64Milli(max(last_line_ts)) FROM source_liveness "
        f"WHERE site = {_q(site)} GROUP BY origin_host, origin_file")
    lines = {(str(h), str(f)): int(ms) for h, f, ms in rows if int(ms or 0) > 0}
    if not lines:
        return False
    minute = {k: ms // 60_000 * 60_000 for k, ms in lines.items()}
    latest = max(minute.values())
    retired = retired_sources(store, site)
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    return all(retired_after(ms, retired.get((site, h, f), 0), now_ms)
               for (h, f), ms in lines.items() if minute[(h, f)] > latest - 3_600_000)


def _surprises(store: Any, site: str, sources: list[tuple[str, str]], when: datetime, undo: bool) -> list[str]:
    """What an operator probably did not mean (written anyway): retiring a source whose last line came after
    the retirement or lately (it is still sending: the retirement is moot, or ends with its next line), undoing
    one that was not retired."""
    out = []
    now_ms = int(datetime.now(UTC).timestamp() * 1000)
    retired = retired_sources(store, site)
    for h, f in sources:
        if undo:
            if (site, h, f) not in retired:
                out.append(f"{h}/{f} was not retired")
            continue
        [[line_ms]] = store.query_rows(
            "SELECT toUnixTimestamp64Milli(max(last_line_ts)) FROM source_liveness "
            f"WHERE site = {_q(site)} AND origin_host = {_q(h)} AND origin_file = {_q(f)}")
        at_ms = int(when.timestamp() * 1000)
        if line_ms and not retired_after(int(line_ms), at_ms, max(now_ms, at_ms)):
            out.append(f"{h}/{f} sent a line {(now_ms - int(line_ms)) / 1000:.0f} s ago, after the retirement "
                       "(its minute, rounded up): it is an ordinary source until a later retirement")
        elif line_ms and now_ms - int(line_ms) < 300_000:
            out.append(f"{h}/{f} sent a line {(now_ms - int(line_ms)) / 1000:.0f} s ago: is it really gone? "
                       "(its next line makes it an ordinary source again)")
    return out


def status_command(
    site: Annotated[str | None, typer.Option(help="only this site")] = None,
    store: Annotated[str | None, typer.Option(help="chdb:PATH or clickhouse://... (while the owner runs: its URL)")]
    = None,
    config: Annotated[str | None, typer.Option("--config", "-c", help="YAML configuration file")] = None,
) -> None:
    """The log sources as GET /fp/sources shows them (live, silent, stuck, quiet, dead, retired), one JSON line
    each, from the store's liveness rows (sources on the live path; `forumpulse ingest` records none)."""
    from dataclasses import asdict

    from forumpulse.pipeline.consumer import source_status

    st = _open(config, store)
    try:
        rows = [asdict(s) for s in source_status(st) if site is None or s.site == site]
    finally:
        st.close()
    for r in rows:
        print(json.dumps(r))
    if not rows:
        print("note: no source has sent anything on the live path" + (f" for site {site!r}" if site else ""),
              file=sys.stderr)
