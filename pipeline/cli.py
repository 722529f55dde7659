"""The ``forumpulse`` command line.  Each subcommand's ``--help`` explains it; ``docs/`` has the background."""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="forumpulse: traffic analytics for community sites. squid/Apache/nginx access logs -> (syslog-ng -> Kafka ->) "
    "ClickHouse, attributed to forum topics; topic surges, holiday dips, outages and floods detected; firewall "
    "triggers, Grafana dashboards and editorial reports.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help texts are plain: brackets like [/3h] are literal, not markup
    context_settings={"help_option_names": ["-h", "--help"]},
)
db_app = typer.Typer(rich_markup_mode=None, help="Schema and reference data: migrations, topic titles and groups.", no_args_is_help=True)
config_app = typer.Typer(rich_markup_mode=None, help="Configuration file: check it, show the effective values.", no_args_is_help=True)
detect_app = typer.Typer(rich_markup_mode=None, help="Detectors: traffic events over history, a generic series, DoS replay.")
report_app = typer.Typer(rich_markup_mode=None, help="Editorial reports (self-contained HTML with charts).", no_args_is_help=True)
sources_app = typer.Typer(rich_markup_mode=None, help="Log sources: their status, and retiring one that will not send "
                          "again.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(config_app, name="config")
app.add_typer(detect_app, name="detect")
app.add_typer(sources_app, name="sources")


@detect_app.callback(invoke_without_command=True)
def detect(
    ctx: typer.Context,
    from_: Annotated[str, typer.Option("--from", help="start (ISO date/time, UTC unless an offset is given); "
                                       "without a subcommand: run the traffic detectors over history")] = "",
    to: Annotated[str, typer.Option("--to", help="end, exclusive (default: now)")] = "",
    config: ConfigOpt = None,
    store: StoreOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print only: do not record the detections in the "
                                          "store's detections table")] = False,
) -> None:
    """Detectors.  `forumpulse detect --from A --to B` runs the traffic detectors (topic surges, spikes, dips
    classified holiday/outage/pipeline_gap, transfer and latency regressions) over the stored rollups, prints
    JSON lines and records them in the store's detections table (--dry-run: print only), as `detect history`
    does; the subcommands run the other modes."""
    if ctx.invoked_subcommand is not None:
        given = [name for name, v in (("--from", from_), ("--to", to), ("--config", config), ("--store", store),
                                      ("--dry-run", dry_run)) if v]
        if given:  # they would be silently ignored: the subcommand has options of its own
            sub = ctx.invoked_subcommand
            get = getattr(ctx.command, "get_command", None)  # a group (typer's click)
            cmd = get(ctx, sub) if get is not None and sub is not None else None
            takes = {o for p in (cmd.params if cmd else []) for o in getattr(p, "opts", [])}
            moved, foreign = [g for g in given if g in takes], [g for g in given if g not in takes]
            hint = (f"put {', '.join(moved)} after it (forumpulse detect {sub} {moved[0]} ...)" if moved else "")
            if foreign:  # (a separator only between the two parts: it ended the message with '; ', user trial 40)
                hint += ("; " if hint else "") + f"'{sub}' takes no {', '.join(foreign)}"
            typer.echo(f"error: {', '.join(given)} before '{sub}' would be ignored: {hint}", err=True)
            raise typer.Exit(2)
        return
    from forumpulse.detectors.traffic import _history_cli

    _history_cli(from_, to, str(config) if config else None, store, record=not dry_run)
app.add_typer(report_app, name="report")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML configuration file (default: $FORUMPULSE_CONFIG, else built-in defaults)")
]
StoreOpt = Annotated[
    str | None, typer.Option("--store", help="chdb:PATH (embedded, default chdb:./data/chdb) or clickhouse://user:pass@host:8123/db")
]


def _settings(config: Path | None, store: str | None = None) -> Any:
    from forumpulse.pipeline.config import ConfigError, load_settings

    try:
        s = load_settings(config)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if store:
        s.store.url = store
    return s


def _open(settings: Any, *, existing: bool = False) -> Any:
    from forumpulse.pipeline.store import StoreBusy, StoreLocationError, StoreUnavailable, open_store

    try:
        return open_store(settings.store.url, existing=existing)
    except (StoreBusy, StoreUnavailable) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3) from None
    except StoreLocationError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def check_inputs(files: list[str], fmt: str | None) -> None:
    """Refuse, with a one-line error and exit code 2, a missing input file or an unknown format, before any work
    starts (instead of a traceback half-way).  Used by every command that reads log files."""
    for f in files:
        if f != "-" and not Path(f).is_file():
            what = "is a directory (give the files in it)" if Path(f).is_dir() else "no such file"
            typer.echo(f"error: {f}: {what}", err=True)
            raise typer.Exit(2)
    if fmt is not None and fmt != "auto":
        from forumpulse.pipeline.formats import get_parser

        try:
            get_parser(fmt)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None


@app.command()
def parse(
    file: Annotated[str, typer.Argument(help="log file to parse (.gz, .bz2, .xz ok), or - for standard input")] = "-",
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="preset (combined, common, vhost_combined, "
                   "combined_d, nginx_combined, nginx_main, squid, squid_combined), 'apache:<LogFormat>', "
                   "'nginx:<log_format>' or 'auto' (default: as ingest -- the configured source matching the path, "
                   "else auto)")] = None,
    site: Annotated[str | None, typer.Option(help="site name to put in the records (default: as ingest -- the "
                                             "configured source's, else the first site)")] = None,
    config: ConfigOpt = None,
) -> None:
    """Print one JSON object per input line, in order: the canonical record, or {"error": reason, "line": raw}.

    Records carry every contract field (ts in UTC with milliseconds, derived topic_id/page_kind/is_bot...), with
    the privacy filter applied to url, query and referer as it would be before storage.  Site and format are
    chosen as `forumpulse ingest` chooses them, so parse shows what ingest would store.
    """
    from forumpulse.pipeline.ingest import _chunks, _open_maybe_compressed, context_for
    from forumpulse.pipeline.process import Processor, SourceContext, record_dicts

    check_inputs([file], fmt)
    settings = _settings(config)
    proc = Processor(settings)
    c = context_for(file, settings, fmt, site, "")
    ctx = SourceContext(site=c.site, origin_host="", origin_file=file if file != "-" else "stdin", format=c.format)
    fh = sys.stdin.buffer if file == "-" else _open_maybe_compressed(Path(file))
    out = sys.stdout
    base = 0
    try:
        for block, n in _chunks(fh, 20_000, 4 << 20):
            batch = proc.process_block(block, ctx, line_no_base=base)
            for d in record_dicts(batch, base):
                out.write(json.dumps(d, ensure_ascii=False) + "\n")
            base += n
    finally:
        if fh is not sys.stdin.buffer:
            fh.close()
    damaged = getattr(fh, "damaged", None)
    if damaged:
        typer.echo(f"error: {file}: {damaged}", err=True)
        raise typer.Exit(1)


@app.command()
def ingest(
    files: Annotated[list[str], typer.Argument(help="log files (.gz, .bz2, .xz ok), or - for standard input")],
    fmt: Annotated[str | None, typer.Option("--format", "-f", help="log format for all files (default: from the "
                                            "configured source matching the path, else per-line auto-detection)")] = None,
    site: Annotated[str | None, typer.Option(help="site name (default: configured source or first site)")] = None,
    origin_host: Annotated[str | None, typer.Option(help="host that wrote the logs (default: this host)")] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Load access logs into the store with a progress bar; print per-file counts (read, loaded, quarantined, rate).

    Lines that do not parse go to the `quarantine` table with their reason; read == loaded + quarantined is
    checked for every file.  Re-ingesting a file stores nothing twice: the lines an earlier ingest loaded (same
    site, origin host and format; the file grown, renamed, compressed or named another way since) are skipped,
    recognised by their content, and an interrupted run's blocks are deduplicated.
    """
    from forumpulse.pipeline.runtime import tune_allocator, tune_gc, without_modules

    check_inputs(files, fmt)
    without_modules("pandas", why="forumpulse ingest does not use it (pyarrow would import it only to check its "
                    "inputs for pandas objects, 0.15-0.2 s of every run)")
    settings = _settings(config, store)
    if site is not None and site not in {x.name for x in settings.sites}:
        typer.echo(f"note: --site {site!r} is not in sites ({', '.join(x.name for x in settings.sites)}): its rows "
                   "get the defaults (every built-in engine's rules, UTC, no holiday calendar) and are kept apart "
                   "from the configured sites' -- check the spelling", err=True)
    st = _open(settings)
    tune_allocator()  # before pyarrow allocates anything

    from concurrent.futures import wait

    from forumpulse.pipeline.store import StoreError, migrate_in_background, table_ttl_days

    # What the table keeps, not what the configuration says: a store created with another retention keeps its
    # own until `db migrate --apply-retention`, and the expired-rows warning must count against that.
    ttls = table_ttl_days(st)
    raw_ttl, rollup_ttl = ttls.get("requests"), ttls.get("site_minute")
    if raw_ttl is not None and raw_ttl != settings.retention.raw_days:
        days = lambda d: f"{d} days" if d else "forever"  # noqa: E731
        typer.echo(f"warning: requests keeps rows {days(raw_ttl)} (its TTL) but retention.raw_days says "
                   f"{days(settings.retention.raw_days)}: the table's TTL applies; `forumpulse db migrate "
                   "--apply-retention` changes it", err=True)
        settings.retention.raw_days = raw_ttl
    if rollup_ttl is not None:
        settings.retention.rollup_days = rollup_ttl
    # a new store's tables are created while the parsers are imported and built (chDB works without the GIL)
    schema = migrate_in_background(st, settings.retention.migration_params())
    again = ("nothing stored is lost or doubled: run the same command on the same input again (after fixing the "
             "cause); the blocks already stored are recognised by their tokens and skipped")
    try:
        from forumpulse.pipeline.ingest import file_progress, ingest_paths
        from rich.console import Console

        tune_gc()
        console = Console(stderr=True)
        with file_progress(console) as on_file:
            results = ingest_paths(st, settings, files, fmt=fmt, site=site, origin_host=origin_host, on_file=on_file,
                                   schema=schema)
    except StoreError as exc:  # e.g. the disk is full: one clear message, not a traceback
        typer.echo(f"error: {exc}\n{again}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted\n{again}", err=True)
        raise typer.Exit(130) from None
    finally:
        wait([schema])  # never close chDB under a running migration
        st.close()
    _print_counts(results)


def _print_counts(results: list[Any]) -> None:
    total = [0, 0, 0]
    for r in results:
        reasons = ", ".join(f"{k}={v}" for k, v in r.by_reason.most_common())
        # rows past retention.raw_days are parsed and inserted, then dropped by the table TTL: the counts line says
        # so itself (it read "loaded 418,646" for a file none of whose rows was kept: user trial 40)
        gone = f" (of which {r.expired:,} past retention, not kept)" if r.expired else ""
        typer.echo(f"{r.name}: read {r.read:,}  loaded {r.loaded:,}{gone}  quarantined {r.quarantined:,}"
                   + (f" ({reasons})" if reasons else "") + f"  {r.rate:,.0f} lines/s")
        total = [total[0] + r.read, total[1] + r.loaded, total[2] + r.quarantined]
        if r.skipped:
            typer.echo(f"note: {r.name}: its first {r.skipped:,} lines were ingested before ({r.skipped_from}): not "
                       + ("read again; nothing new" if not r.read else "read again, only the lines after them"))
        if r.other_format:
            typer.echo(f"warning: {r.name}: these lines were ingested before as format {r.other_format}; loaded "
                       "again in another format, they are now stored twice (formats are kept apart so that a load "
                       "with the wrong format can be redone)", err=True)
        if r.already_stored:
            typer.echo(f"note: {r.name}: {r.already_stored:,} of these rows were already stored (the same blocks "
                       "were ingested before): deduplicated, nothing stored twice")
        if r.expired:
            typer.echo(f"warning: {r.name}: {r.expired:,} of the loaded rows are older than retention.raw_days and "
                       "were dropped at once by the table TTL, so they are NOT stored (nor in rollups older than "
                       "retention.rollup_days); to keep archives set retention.raw_days: 0 and rollup_days: 0 "
                       "and run `forumpulse db migrate --apply-retention` (tables keep the retention they were "
                       "created with), then ingest again",
                       err=True)
        if r.read and not r.loaded and r.by_reason.get("no_format_matched", 0) + r.by_reason.get("truncated", 0) \
                >= r.quarantined / 2:
            typer.echo(f"warning: {r.name}: no line loaded: is the format right? `forumpulse parse -f auto {r.name} "
                       "| head` shows what the lines parse as (quarantined lines keep their reason and text)", err=True)
        if r.error:
            typer.echo(f"error: {r.name}: {r.error}", err=True)
    if len(results) > 1:
        typer.echo(f"total: read {total[0]:,}  loaded {total[1]:,}  quarantined {total[2]:,}")
    if any(r.error for r in results):
        raise typer.Exit(1)


@db_app.command("migrate")
def db_migrate(
    config: ConfigOpt = None,
    store: StoreOpt = None,
    apply_retention: Annotated[bool, typer.Option(
        "--apply-retention", help="also change existing tables' TTLs to the configured retention.* (a shorter "
        "one removes older rows); without it differences are only reported")] = False,
) -> None:
    """Apply pending schema migrations (idempotent; records what ran in schema_migrations), then load
    topics.titles_csv when it is configured and make topic_groups the configured topics.groups.  Tables keep the retention they were created with until
    --apply-retention changes it."""
    from forumpulse.pipeline.enrich import load_configured_titles
    from forumpulse.pipeline.store import apply_retention as apply_ttl
    from forumpulse.pipeline.store import migrate, retention_changes

    settings = _settings(config, store)
    params = settings.retention.migration_params()
    st = _open(settings)
    try:
        ran = migrate(st, params)
        rows = st.query_rows("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
        loaded = load_configured_titles(st, settings)
        changes = apply_ttl(st, params) if apply_retention else retention_changes(st, params)
    finally:
        st.close()
    typer.echo(f"applied now: {', '.join(f'{m.version:04d}_{m.name}' for m in ran) or 'nothing (up to date)'}")
    for v, n, at in rows:
        typer.echo(f"  {int(v):04d}_{n}  applied {at}")
    if loaded.titles is not None:
        typer.echo(f"topic titles: {loaded.titles:,} loaded from {settings.topics.titles_csv} (topics.titles_csv)")
    for w in loaded.groups.warnings():
        typer.echo(f"warning: {w}", err=True)
    for c in changes:
        days = lambda d: f"{d} days" if d else "forever"  # noqa: E731
        if apply_retention:
            typer.echo(f"retention: {c.table} now keeps rows {days(c.wanted_days)} (was {days(c.current_days)})")
        else:
            typer.echo(f"warning: {c.table} keeps rows {days(c.current_days)} but the configuration says "
                       f"{days(c.wanted_days)}: run `forumpulse db migrate --apply-retention` to change it", err=True)


@db_app.command("check-rollups")
def db_check_rollups(
    from_: Annotated[str, typer.Option("--from", help="start (ISO date/time, UTC unless an offset is given; "
                                       "default: 24 hours before --to), widened to the whole hour")] = "",
    to: Annotated[str, typer.Option("--to", help="end, exclusive (default: the start of the current hour, which "
                                    "is still being written), widened to the whole hour")] = "",
    repair: Annotated[bool, typer.Option("--repair", help="rebuild the hours of the rollups that differ from "
                                         "requests, then check again (stop the consumers first, also an owner's "
                                         "--consume, unless the hours are no longer written)")] = False,
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Compare every rollup (site/topic/client/prefix/transfer minute tables, topic/prefix hour tables) with what
    the requests of the range imply, and with --repair rebuild them.  A process killed while it inserted can leave
    one rollup without that block (ClickHouse commits the views' parts one by one); run this after a crash of the
    loader or the owner.  Exit code 1 when a difference is found and not repaired."""
    from datetime import UTC, datetime, timedelta

    from forumpulse.pipeline.rollup_check import check_rollups
    from forumpulse.pipeline.store import StoreError, open_store

    def when(text: str, opt: str) -> datetime:
        try:
            dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise typer.BadParameter(f"{opt} {text!r} is not an ISO date/time (e.g. 2026-11-25 or 2026-11-25T18:00)") from None
        return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)

    end = when(to, "--to") if to else datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    start = when(from_, "--from") if from_ else end - timedelta(days=1)
    if end <= start:
        raise typer.BadParameter(f"--to ({to or 'the start of the current hour'}) is not after --from ({from_ or 'a day before'})")
    settings = _settings(config, store)
    st = _open(settings, existing=True)
    scratch = lambda db: open_store(settings.store.url, database=db)  # noqa: E731
    try:
        res = check_rollups(st, start, end, repair=repair, open_scratch=scratch)
        after = check_rollups(st, start, end, open_scratch=scratch) if res.repaired else None
    except ValueError as exc:  # not the single-node schema
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except StoreError as exc:  # the server refused a statement (rights, disk): what and why, no traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(3) from None
    finally:
        st.close()
    fmt = "%Y-%m-%d %H:%M"
    typer.echo(f"rollups vs requests, {res.start:{fmt}} .. {res.end:{fmt}} UTC: {res.requests:,} requests rows")
    if res.note:
        typer.echo(f"note: {res.note}")
    if res.stale_dropped:
        typer.echo(f"note: dropped {len(res.stale_dropped)} scratch database(s) left by a run that did not finish: "
                   f"{', '.join(res.stale_dropped)}")
    for table, (extra, missing) in res.differences.items():
        state = ("same" if (extra, missing) == (0, 0) else
                 f"DIFFERENT: {extra:,} row(s) not as recomputed, {missing:,} recomputed row(s) not there")
        typer.echo(f"  {table:<16} {state}")
    if res.hours:
        typer.echo(f"hours with differences: {', '.join(res.hours[:12])}{' ...' if len(res.hours) > 12 else ''}")
    if res.raw_incomplete:
        n = len(res.raw_incomplete)
        typer.echo(f"warning: {n} hour(s) not compared, the rollups counted more requests there than requests "
                   f"still holds (raw rows dropped: retention): {', '.join(res.raw_incomplete[:6])}"
                   f"{' ...' if n > 6 else ''}", err=True)
    if after is not None:
        changed = sum(1 for v in res.differences.values() if v != (0, 0))
        typer.echo(f"repaired: {len(res.hours)} hour(s) of {changed} rollup(s) rebuilt from requests; checked "
                   f"again: {'every rollup the same' if after.ok else 'STILL DIFFERENT'}")
        if not after.ok:
            raise typer.Exit(1)
    elif not res.ok:
        typer.echo("run again with --repair to rebuild them from requests", err=True)
        raise typer.Exit(1)


@db_app.command("load-titles")
def db_load_titles(
    csv: Annotated[Path | None, typer.Argument(
        help="CSV with columns site,topic_id,title[,forum] (default: topics.titles_csv of the configuration)")] = None,
    config: ConfigOpt = None,
    store: StoreOpt = None,
) -> None:
    """Load topic titles (names for topic ids) and make topic_groups the configured topic groups (memberships no
    longer configured are removed; a group without members is warned about)."""
    from forumpulse.pipeline.enrich import load_topic_titles, sync_topic_groups
    from forumpulse.pipeline.ingest import ensure_schema

    settings = _settings(config, store)
    path = str(csv) if csv is not None else settings.topics.titles_csv
    if not path:
        typer.echo("error: give a CSV file or set topics.titles_csv in the configuration", err=True)
        raise typer.Exit(2)
    titles = load_topic_titles(path)  # a bad file is reported by main() before the store is opened
    st = _open(settings)
    try:
        ensure_schema(st, settings)
        st.insert("topic_titles", titles)
        groups = sync_topic_groups(st, settings)
    finally:
        st.close()
    typer.echo(f"loaded {titles.num_rows:,} topic titles and {groups.memberships:,} topic-group memberships")
    for w in groups.warnings():
        typer.echo(f"warning: {w}", err=True)


@db_app.command("cluster-ddl")
def db_cluster_ddl(
    cluster: Annotated[str, typer.Option(help="cluster name as in the servers' remote_servers config")] = "forum_cluster",
    database: Annotated[str, typer.Option(help="database to create the tables in")] = "forumpulse",
    config: ConfigOpt = None,
) -> None:
    """Print the cluster variant of the schema (ReplicatedMergeTree + Distributed, ON CLUSTER), generated from
    the same migrations; run it once with clickhouse-client --multiquery."""
    from forumpulse.pipeline.cluster import cluster_sql

    settings = _settings(config)
    typer.echo(cluster_sql(cluster, database, settings.retention.migration_params()), nl=False)


@config_app.command("check")
def config_check(config: ConfigOpt = None) -> None:
    """Validate the configuration file; print every problem as `key: reason` (exit 2 when invalid)."""
    _load_plugins()
    if PLUGIN_ERRORS:  # a module that validates a section failed to import: its keys would go unchecked
        for name, err in PLUGIN_ERRORS.items():
            typer.echo(f"error: cannot load {name}: {err}", err=True)
        raise typer.Exit(1)
    s = _settings(config)
    from forumpulse.pipeline.config import mask_url
    from forumpulse.pipeline.enrich import Enricher

    enricher = Enricher(s)  # loads every rules file the configuration names; a bad one is reported by main() (exit 2)
    cases, failed = enricher.check_user_cases()
    for msg in failed:
        typer.echo(f"rules error: {s.topics.rules_file}: {msg}", err=True)
    if failed:
        typer.echo(f"{len(failed)} of {cases} fixture case(s) of the user rules failed (each case must be answered "
                   "by its own rule: fix the rule or the case; `forumpulse parse` shows how a line is attributed)",
                   err=True)
        raise typer.Exit(2)
    from forumpulse.pipeline.enrich import (
        empty_group_warning,
        empty_groups,
        load_topic_titles,
        topic_group_rows,
    )

    titles = load_topic_titles(s.topics.titles_csv) if s.topics.titles_csv else None
    typer.echo(f"configuration OK: {len(s.sites)} site(s), {len(s.sources)} source(s), store {mask_url(s.store.url)}"
               + (f", {cases} fixture case(s) of the user rules passed" if cases else ""))
    for g in empty_groups(s, topic_group_rows(s, titles)):
        typer.echo("warning: " + empty_group_warning(g, f"of {s.topics.titles_csv}" if titles is not None
                                                       else "(topics.titles_csv is not set)"), err=True)
    import difflib

    names = [site.name for site in s.sites]
    for where, name in s.unconfigured_sites():
        # a name close to a configured site's is most likely a typo of it: said as a warning on stderr, with
        # the name (a note on stdout among "configuration OK" went unread, user trial 41)
        close = difflib.get_close_matches(name, names, 1, 0.75)
        if close:
            typer.echo(f"warning: {where} is not in sites (did you mean {close[0]!r}?): it gets the defaults "
                       "(UTC, no holiday calendar)", err=True)
        else:
            typer.echo(f"note: {where} is not in sites: it gets the defaults (UTC, no holiday calendar)")
    for what in s.long_holiday_periods():
        typer.echo(f"warning: {what}: a holiday period this long calls every dip in it a holiday (a year typo?)",
                   err=True)
    from forumpulse.pipeline.live_detect import live_config, spool_state

    spool = live_config(s).spool_dir

    def relative(path: str) -> str:  # a relative path is resolved by each process against its working directory
        return "" if Path(path).is_absolute() else (f" (relative: checked as {Path(path).absolute()}; the owner "
                                                    "resolves it against its own working directory)")

    problem, waiting = spool_state(spool)
    if problem:  # found when checked, not when an owner stops with decisions the store has not taken
        typer.echo(f"warning: detectors.live.spool_dir {spool}: {problem}{relative(spool)}: decisions the store has "
                   "not taken when a `run --dos` owner stops would be lost", err=True)
    elif waiting:
        typer.echo(f"note: detectors.live.spool_dir {spool}: {waiting} spooled decision file(s) wait for the next "
                   f"owner start, which loads them into the store{relative(spool)}")
    from forumpulse.detectors.dos_rules import ActionsConfig

    jsonl = ActionsConfig.model_validate(s.actions or {}).jsonl_path
    if jsonl:  # opened when `run --dos` starts and appended to by every decision (user trial 43)
        jp = Path(jsonl)
        if jp.is_dir():
            problem = "a folder"
        elif jp.exists():  # a file made beforehand (under /var/log, say) needs only itself writable
            problem = None if os.access(jp, os.W_OK) else "not writable"
        elif not jp.parent.is_dir():
            problem = f"its folder {jp.parent} " + ("is not a folder" if jp.parent.exists() else
                                                     "does not exist (it is not created)")
        else:
            problem = None if os.access(jp.parent, os.W_OK | os.X_OK) else f"its folder {jp.parent} is not writable"
        if problem:
            typer.echo(f"warning: actions.jsonl_path {jsonl}: {problem}{relative(jsonl)}: decisions could not be "
                       "appended to it", err=True)


@config_app.command("show")
def config_show(config: ConfigOpt = None) -> None:
    """Print the effective configuration (defaults, file and environment merged) as JSON; secrets (keys, API
    keys, webhook secrets, passwords in URLs) masked as ***."""
    from forumpulse.pipeline.config import masked_dump

    s = _settings(config)
    typer.echo(json.dumps(masked_dump(s), indent=2))


@app.command()
def demo(
    data: Annotated[Path, typer.Option(help="folder for the simulated logs and the chDB store")] = Path("data"),
    weeks: Annotated[int, typer.Option(min=2, help="weeks of simulated traffic (at least 2; 4 recommended: the "
                                       "detectors learn weekly baselines, so with fewer weeks the scenarios of the "
                                       "first weeks have no baseline yet and show as not found)")] = 4,
    lines_per_day: Annotated[int, typer.Option(help="average access lines per day")] = 60_000,
    seed: Annotated[int, typer.Option(help="random seed (same seed, same logs)")] = 7,
) -> None:
    """The main job end to end with no servers: simulate weeks of forum traffic (an election-night event, a holiday
    week, an outage, floods) -> ingest into chDB under ./data -> run the detectors -> print a summary and point
    at an event report.  Starts afresh: deletes DATA/demo first (refused while another process has its store
    open)."""
    from forumpulse.pipeline.demo import run_demo

    run_demo(data_dir=data, weeks=weeks, lines_per_day=lines_per_day, seed=seed)


# ------------------------------------------------------------------------------------------------------------
# Commands written in other modules (detectors, live path, reports).  Registered by name so this module stays the
# one place that lists the command line.
_PLUGINS: list[tuple[typer.Typer, str, str, str]] = [
    (app, "simulate", "forumpulse.pipeline.simulate", "simulate_command"),
    (app, "run", "forumpulse.pipeline.owner", "run_command"),
    (app, "consume", "forumpulse.pipeline.consumer", "consume_command"),
    (detect_app, "history", "forumpulse.detectors.traffic", "detect_history_command"),
    (detect_app, "series", "forumpulse.detectors.series", "detect_series_command"),
    (detect_app, "dos", "forumpulse.detectors.dos", "dos_command"),
    (detect_app, "unban", "forumpulse.detectors.dos_cli", "unban_command"),
    (detect_app, "decisions", "forumpulse.detectors.dos_cli", "decisions_command"),
    (report_app, "event", "forumpulse.dashboards.report", "report_event_command"),
    (report_app, "daily", "forumpulse.dashboards.report", "report_daily_command"),
    (sources_app, "retire", "forumpulse.pipeline.sources", "retire_command"),
    (sources_app, "status", "forumpulse.pipeline.sources", "status_command"),
]
#: modules whose import registers configuration section validators (checked by `config check`)
_SECTION_MODULES = ("forumpulse.pipeline.live_detect", "forumpulse.detectors.dos_rules", "forumpulse.detectors.traffic")
_loaded = False
PLUGIN_ERRORS: dict[str, str] = {}


def _load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for target, name, module, attr in _PLUGINS:
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as exc:  # the command is then missing from --help; tests fail on it
            PLUGIN_ERRORS[name] = f"{module}.{attr}: {exc}"
            continue
        target.command(name)(fn)
    for module in _SECTION_MODULES:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            PLUGIN_ERRORS[module] = str(exc)


#: commands defined in this module that need no plugin: their start-up skips importing the plugins (the
#: simulator, owner and detector modules cost ~0.3 s of every `forumpulse ingest` otherwise)
_NO_PLUGINS = frozenset({"ingest", "parse"})


def main() -> None:
    from forumpulse.pipeline.threadcpu import report_at_exit_if_asked

    report_at_exit_if_asked()  # `make bench` only (FP_THREAD_CPU_OUT): every thread's CPU seconds at exit
    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if first not in _NO_PLUGINS:
        _load_plugins()
    try:
        app()
    except Exception as exc:
        from forumpulse.pipeline.config import ConfigError
        from forumpulse.pipeline.enrich import DataFileError, RulesError
        from forumpulse.pipeline.store import StoreBusy, StoreLocationError, StoreUnavailable

        # a user's error, not a bug: one clear message, no traceback.  Commands written in other modules load
        # their settings and open their store themselves; their errors end here.
        if isinstance(exc, ConfigError):  # the configuration: every problem as `key: reason`
            typer.echo(str(exc), err=True)
            sys.exit(2)
        if isinstance(exc, RulesError):
            # a rules or data file named in the configuration (topics.rules_file, topics.post_map_csv,
            # topics.titles_csv, bots.networks_file, bots.extra_patterns) is missing or invalid: which and where
            # "rules error" of a data file (titles_csv, post_map_csv) read as a rules problem (user trial 41)
            typer.echo(f"{'data file' if isinstance(exc, DataFileError) else 'rules'} error: {exc}", err=True)
            sys.exit(2)
        if isinstance(exc, StoreBusy | StoreUnavailable | StoreLocationError):  # as _open() reports them
            typer.echo(f"error: {exc}", err=True)
            sys.exit(2 if isinstance(exc, StoreLocationError) else 3)
        raise


if __name__ == "__main__":
    main()
