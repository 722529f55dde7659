"""The command line: every command is registered, explains itself, and exits non-zero on bad input."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from forumpulse.pipeline import cli
from typer.testing import CliRunner

EXE = Path(sys.executable).with_name("forumpulse")
COMMANDS = [
    ["parse"], ["ingest"], ["simulate"], ["demo"], ["run"], ["consume"], ["db", "migrate"], ["db", "load-titles"],
    ["db", "cluster-ddl"], ["db", "check-rollups"], ["config", "check"], ["config", "show"], ["detect"], ["detect", "series"],
    ["detect", "dos"], ["detect", "history"], ["detect", "unban"], ["detect", "decisions"], ["report", "event"], ["report", "daily"],
]


def test_every_plugin_command_is_registered():
    cli._load_plugins()
    assert cli.PLUGIN_ERRORS == {}, cli.PLUGIN_ERRORS


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_has_help(cmd):
    cli._load_plugins()
    r = CliRunner().invoke(cli.app, [*cmd, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage:" in r.output and len(r.output.splitlines()) > 4


def test_console_script_runs_and_reports_a_bad_config_with_key_and_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("privacy:\n  client_ip: sometimes\nretention:\n  raw_days: -1\n")
    r = subprocess.run([str(EXE), "config", "check", "--config", str(bad)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "privacy.client_ip:" in r.stderr and "retention.raw_days:" in r.stderr


def test_a_bad_rules_file_is_reported_not_a_traceback(tmp_path):
    nets = tmp_path / "nets.yaml"
    nets.write_text("version: 1\ncrawlers: [{name: a, networks: [10.0.0.1/8]}]\n")  # host bits set
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\nbots:\n  networks_file: {nets}\n")
    log = tmp_path / "a.log"
    log.write_text("1700000000.100 12 66.249.66.1 TCP_MISS/200 5120 GET http://f.example/t/1 - DIRECT/10.0.0.5 text/html\n")
    for args in (["config", "check", "--config", str(cfg)], ["ingest", "--config", str(cfg), "--format", "squid", str(log)]):
        r = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (args, r.stderr)
        assert "rules error:" in r.stderr and str(nets) in r.stderr and "10.0.0.1/8" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr


def test_busy_store_is_reported_not_a_traceback(tmp_path, store, chdb_path):
    r = subprocess.run([str(EXE), "db", "migrate", "--store", f"chdb:{chdb_path}"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3
    assert "in use by another process" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("cmd", ["parse", "ingest"])
def test_a_missing_file_or_unknown_format_is_a_one_line_error(tmp_path, cmd):
    exe = Path(sys.executable).with_name("forumpulse")
    store = ["--store", f"chdb:{tmp_path / 'db'}"] if cmd == "ingest" else []
    r = subprocess.run([str(exe), cmd, *store, str(tmp_path / "nope.log")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"error: {tmp_path / 'nope.log'}: no such file" in r.stderr
    log = tmp_path / "a.log"
    log.write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n')
    r = subprocess.run([str(exe), cmd, *store, "-f", "bogus", str(log)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown format spec 'bogus'" in r.stderr
    assert not (tmp_path / "db").exists() or cmd == "parse"


def test_parse_reads_gz_files(tmp_path):
    import gzip

    exe = Path(sys.executable).with_name("forumpulse")
    lines = [f'1.2.3.{i} - - [01/Jul/1995:00:00:0{i} -0400] "GET /{i} HTTP/1.0" 200 1\n' for i in range(5)]
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress("".join(lines).encode()))
    r = subprocess.run([str(exe), "parse", "-f", "common", str(gz)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d["url"] for d in out] == [f"/{i}" for i in range(5)]


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if c not in (["db", "cluster-ddl"],) and c[0] != "simulate"
                                 and c[0] != "demo" and c != ["detect", "series"]], ids=lambda c: " ".join(c))
def test_every_command_with_a_configuration_takes_dash_c(cmd):
    cli._load_plugins()
    r = CliRunner().invoke(cli.app, [*cmd, "--help"])
    assert "--config" in r.output and "-c" in r.output.replace("--config", ""), r.output


@pytest.mark.parametrize("args", [["run"], ["consume"], ["detect", "--from", "2024-02-01"],
                                  ["report", "daily", "--out", "r"], ["detect", "dos", "--input", "x.log"]],
                         ids=lambda a: " ".join(a[:2]))
def test_plugin_commands_report_a_bad_configuration_not_a_traceback(tmp_path, args):
    bad = tmp_path / "bad.yaml"
    bad.write_text("retention:\n  raw_dayz: 5\n")
    (tmp_path / "x.log").write_text("")
    r = subprocess.run([str(EXE), *args, "-c", str(bad)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "retention.raw_dayz:" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args", [["detect", "--from", "yesterday"], ["report", "event", "--group", "g", "--from",
                                                                        "soon", "--out", "r"],
                                  ["report", "daily", "--day", "2024-13-01", "--out", "r"],
                                  ["detect", "--from", "2024-02-02", "--to", "2024-02-01"]],
                         ids=["detect-from", "event-from", "daily-day", "to-before-from"])
def test_bad_times_are_one_line_errors(tmp_path, args):
    r = subprocess.run([str(EXE), *args, "--store", f"chdb:{tmp_path / 'st'}"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "is not" in r.stderr


def test_detect_options_before_a_subcommand_are_refused_not_ignored(tmp_path):
    """`detect --from A --to B history` would run history over its defaults (the last day): refused, saying to
    put the options after the subcommand."""
    r = subprocess.run([str(EXE), "detect", "--from", "2024-02-05", "--to", "2024-02-06", "history", "--store",
                        "chdb:typo"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "--from, --to before 'history'" in r.stderr and "Traceback" not in r.stderr
    assert "forumpulse detect history --from" in r.stderr and not (tmp_path / "typo").exists()
    assert r.stderr.rstrip().endswith("...)"), r.stderr  # no dangling '; ' (user trial 40)
    # an option the subcommand does not have is not suggested there
    r = subprocess.run([str(EXE), "detect", "--from", "2024-02-05", "series", "--input", "x.csv"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "'series' takes no --from" in r.stderr and "detect series --from" not in r.stderr


def test_report_event_option_errors_are_one_line_and_name_the_option(tmp_path):
    """Refused before any store is opened: a --from that is not a time names --from; not exactly one of --topic,
    --group, --event says so with the options' names; an --out that cannot be created says why."""
    (tmp_path / "afile").write_text("")
    cases = [(["--group", "g", "--from", "soon"], "--from"),
             ([], "give exactly one of --topic, --group, --event"),
             (["--topic", "1", "--group", "g"], "give exactly one of --topic, --group, --event"),
             (["--topic", "1", "--out", str(tmp_path / "afile" / "sub")], "cannot be created (")]
    for extra, message in cases:
        out = [] if "--out" in extra else ["--out", "r"]
        r = subprocess.run([str(EXE), "report", "event", *extra, *out, "--store", "chdb:typo"], capture_output=True,
                           text=True, timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)
    assert not (tmp_path / "typo").exists()


def test_titles_csv_is_loaded_by_migrate_and_reports_use_the_configured_store(tmp_path):
    titles = tmp_path / "titles.csv"
    titles.write_text("site,topic_id,title\nboard,7,Election night\nboard,8,Gardening\n")
    st = tmp_path / "st"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"store:\n  url: chdb:{st}\nsites:\n  - name: board\ntopics:\n  titles_csv: {titles}\n"
                   "  groups:\n    - name: vote\n      site: board\n      title_pattern: '(?i)election'\n")
    r = subprocess.run([str(EXE), "db", "migrate", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"topic titles: 2 loaded from {titles}" in r.stdout
    r = subprocess.run([str(EXE), "db", "load-titles", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "loaded 2 topic titles and 1 topic-group memberships" in r.stdout, r.stderr
    # the report finds the store and the site in the configuration (no --store, no --site)
    r = subprocess.run([str(EXE), "report", "daily", "--day", "2024-02-01", "--out", str(tmp_path / "out"), "-c",
                        str(cfg)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: no detections and no topic views on 2024-02-01 (UTC) for site board" in r.stderr  # nothing ingested
    assert not (tmp_path / "data").exists()  # not the built-in default ./data/chdb
    page = (tmp_path / "out" / "daily-2024-02-01.html").read_text()
    assert "board" in page
    # the command the page suggests reads the same configuration (pasted without it, it judged the default store
    # and recorded the day as judged there, user trial 41)
    assert (f"(forumpulse detect --from 2024-02-01T00:00+00:00 --to 2024-02-02T00:00+00:00 -c {cfg} judges it)"
            in page), page
    # a --site typo (neither configured nor in the data) is an error, not an empty page with exit 0
    r = subprocess.run([str(EXE), "report", "daily", "--day", "2024-02-01", "--out", str(tmp_path / "out2"), "-c",
                        str(cfg), "--site", "bord"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "site 'bord' is not configured and has no data" in r.stderr, r.stderr
    assert not (tmp_path / "out2").exists()
    from forumpulse.pipeline.store import open_store

    s = open_store(f"chdb:{st}")
    try:
        rows = s.query_rows("SELECT group_name, topic_id FROM topic_groups FINAL")
    finally:
        s.close()
    assert [(str(g), int(t)) for g, t in rows] == [("vote", 7)]


def test_daily_report_rerun_options_name_the_configuration_and_store(tmp_path, monkeypatch):
    """The suggested command carries the page's configuration and store: absolute paths (it may be pasted in
    another folder), a store URL's password left as a placeholder (the page is shared), quoted for a shell."""
    from forumpulse.dashboards.report import _rerun_options

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FORUMPULSE_CONFIG", raising=False)
    assert _rerun_options(None, None) == ""
    assert _rerun_options(Path("c.yaml"), "chdb:st") == f"-c {tmp_path / 'c.yaml'} --store chdb:{tmp_path / 'st'}"
    assert (_rerun_options(None, "clickhouse://ops:s3cret@ch:8123/fp")
            == "--store clickhouse://ops:PASSWORD@ch:8123/fp")
    monkeypatch.setenv("FORUMPULSE_CONFIG", "my conf.yaml")
    assert _rerun_options(None, None) == f"-c '{tmp_path / 'my conf.yaml'}'"


def test_load_titles_without_a_csv_or_configured_file_is_an_error(tmp_path):
    r = subprocess.run([str(EXE), "db", "load-titles", "--store", f"chdb:{tmp_path / 'st'}"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "give a CSV file or set topics.titles_csv" in r.stderr


@pytest.mark.parametrize(("url", "message"), [
    ("chdb:", "has no folder"),
    ("foo:bar", "unknown store URL 'foo:bar'"),
    ("chdb:{tmp}/afile/x", "as a chDB data folder: Not a directory"),
])
def test_unusable_store_urls_are_one_line_errors(tmp_path, url, message):
    (tmp_path / "afile").write_text("")
    log = tmp_path / "a.log"
    log.write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n')
    r = subprocess.run([str(EXE), "ingest", "--store", url.format(tmp=tmp_path), "-f", "common", str(log)],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_reading_commands_do_not_create_a_store_where_there_is_none(tmp_path):
    no_owner = ["--owner", "http://127.0.0.1:9"]  # nothing listens there: the commands go to the store
    for args in (["detect", "--from", "2024-02-01", "--to", "2024-02-02"], ["report", "daily", "--day", "2024-02-01",
                                                                            "--out", "r"],
                 ["detect", "decisions", *no_owner], ["detect", "unban", "192.0.2.1", *no_owner]):
        r = subprocess.run([str(EXE), *args, "--store", "chdb:typo/chdb"], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
        assert r.returncode == 2 and "no chDB store at typo/chdb" in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "data").exists()
    (tmp_path / "empty").mkdir()
    r = subprocess.run([str(EXE), "report", "daily", "--day", "2024-02-01", "--out", "r", "--store", "chdb:empty"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "no chDB store at empty" in r.stderr, r.stderr
    assert list((tmp_path / "empty").iterdir()) == []  # nothing written into a folder that is not a store
    migrated = tmp_path / "migrated"  # a chDB folder without the forumpulse tables (made in a process of its own:
    # chDB serves one folder per process, and this test process may hold the session's)
    subprocess.run([sys.executable, "-c", "import sys; from forumpulse.pipeline.store import open_store; "
                    "open_store(sys.argv[1]).close()", f"chdb:{migrated}?database=other"], check=True, timeout=120)
    r = subprocess.run([str(EXE), "report", "daily", "--day", "2024-02-01", "--out", "r", "--store",
                        f"chdb:{migrated}"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "has no forumpulse tables" in r.stderr, r.stderr
    assert "database other there has them (chdb:PATH?database=NAME)" not in r.stderr  # `other` has no tables
    # the tables in another database of the folder: the error names it (user trial 35: a URL naming `default`)
    subprocess.run([sys.executable, "-c", "import sys; from forumpulse.pipeline.store import migrate, open_store; "
                    "st = open_store(sys.argv[1]); migrate(st); st.close()", f"chdb:{migrated}?database=other"],
                   check=True, timeout=300)
    r = subprocess.run([str(EXE), "report", "daily", "--day", "2024-02-01", "--out", "r", "--store",
                        f"chdb:{migrated}?database=scratch"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 2 and "has no forumpulse tables" in r.stderr, r.stderr
    assert "database other there has them (chdb:PATH?database=NAME)" in r.stderr, r.stderr


def test_config_check_refuses_an_unknown_store_url(tmp_path):
    r = subprocess.run([str(EXE), "config", "check"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")},
                            "FORUMPULSE_STORE__URL": "mysql://u:pw@h/db"})
    assert r.returncode == 2 and "store.url: unknown store URL" in r.stderr and "pw" not in r.stderr, r.stderr


def test_demo_refuses_to_wipe_a_store_in_use(tmp_path):
    from forumpulse.pipeline.demo import run_demo
    from forumpulse.pipeline.store import StoreBusy

    chdb = tmp_path / "demo" / "chdb"
    chdb.mkdir(parents=True)
    (tmp_path / "demo" / "keep.html").write_text("a report the user kept")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('held', flush=True); "
                               "time.sleep(60)", str(chdb / ".forumpulse.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StoreBusy, match="open in another process"):
            run_demo(tmp_path, weeks=2)
        assert (tmp_path / "demo" / "keep.html").exists()  # nothing was deleted
    finally:
        holder.kill()
        holder.wait()


@contextlib.contextmanager
def _holding(opens: str, folder: Path) -> Iterator[subprocess.Popen[str]]:
    """A child process that opens ``folder`` with the Python statement ``opens`` (``sys.argv[1]`` is the folder)
    and holds it until the block ends; it has started (within 120 s) when the block begins."""
    proc = subprocess.Popen([sys.executable, "-c", f"import sys,time\n{opens}\nprint('held', flush=True)\n"
                             "time.sleep(600)", str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and select.select([proc.stdout], [], [], 120)[0], "holder never started"
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_store_held_by_a_plain_chdb_session_is_named_not_wiped(tmp_path):
    """A chDB session of some script (not forumpulse: no .forumpulse.lock) holding the demo's store: the demo
    deleted and rebuilt the folder and exited 0, and other commands said "Cannot lock file .../status ...
    (BAD_ARGUMENTS)" (user trial 40).  Both name the holding pid now; nothing is deleted.  A forumpulse process
    holds the engine's lock too: it is named as forumpulse's, not as a foreign one (a review)."""
    from forumpulse.pipeline.demo import run_demo
    from forumpulse.pipeline.store import StoreBusy

    for data in (tmp_path / "plain", tmp_path / "fp"):  # two data folders: this process keeps a demo's folder lock
        (data / "demo" / "chdb").mkdir(parents=True)
        (data / "demo" / "keep.html").write_text("a report the user kept")
    chdb = tmp_path / "plain" / "demo" / "chdb"
    with _holding("from chdb import session\ns = session.Session(sys.argv[1])", chdb) as holder:
        with pytest.raises(StoreBusy, match=rf"open in another process \(pid {holder.pid}, not forumpulse"):
            run_demo(tmp_path / "plain", weeks=2)
        assert (tmp_path / "plain" / "demo" / "keep.html").exists()  # nothing was deleted
        log = tmp_path / "a.log"
        log.write_text('1.2.3.4 - - [01/Feb/2024:10:00:00 +0000] "GET /t/1 HTTP/1.1" 200 10 "-" "Mozilla/5.0"\n')
        r = subprocess.run([str(EXE), "ingest", "--store", f"chdb:{chdb}", "-f", "combined", str(log)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert r.returncode != 0 and f"open in another process (pid {holder.pid}) that is not forumpulse" in r.stderr
        assert "Traceback" not in r.stderr, r.stderr
    opener = "from forumpulse.pipeline.store import open_store\ns = open_store('chdb:' + sys.argv[1])"
    with _holding(opener, tmp_path / "fp" / "demo" / "chdb") as fp:
        with pytest.raises(StoreBusy, match=rf"open in another process \(pid {fp.pid}\); the demo") as err:
            run_demo(tmp_path / "fp", weeks=2)
        assert "not forumpulse" not in str(err.value)
        assert (tmp_path / "fp" / "demo" / "keep.html").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--input", "nope.log"], "error: nope.log: no such file"),
    (["--input", "."], "error: .: is a directory"),
    (["--input", "a.log", "--format", "combinedd"], "unknown format spec 'combinedd'"),
    (["--input", "a.log", "--rules", "nope.yaml"], "error: cannot read nope.yaml"),
    (["--input", "a.log", "--rules", "empty.yaml"], "error: rules empty.yaml:"),
    (["--input", "a.log", "--crawler-verify", "maybe"], "must be dns, ua or off"),
    (["--input", "a.log", "-c", "nope.yaml"], "config: file nope.yaml does not exist"),
])
def test_detect_dos_bad_inputs_are_one_line_errors(tmp_path, args, message):
    (tmp_path / "a.log").write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n')
    (tmp_path / "empty.yaml").write_text("")
    r = subprocess.run([str(EXE), "detect", "dos", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_detect_dos_reads_gzip_and_fails_on_a_damaged_one(tmp_path):
    import gzip

    line = b'1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n'
    (tmp_path / "ok.gz").write_bytes(gzip.compress(line * 50))
    r = subprocess.run([str(EXE), "detect", "dos", "--input", "ok.gz", "-f", "common"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and '"lines": 50' in r.stderr and '"reason": "client_flood"' in r.stdout, r.stderr
    (tmp_path / "cut.gz").write_bytes(gzip.compress(line * 5000)[:200])
    r = subprocess.run([str(EXE), "detect", "dos", "--input", "cut.gz", "-f", "common"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 1 and "damaged or cut short" in r.stderr, r.stderr


@pytest.mark.parametrize(("content", "args", "message"), [
    (None, [], "no such file"),
    ("", [], "the file is empty"),
    ("a;b\n1;2\n", [], "expected two columns timestamp,value"),
    ("timestamp,value\n2024-01-01T00:00,5\nbad,6\n", [], "row 3: 'bad' is not a timestamp"),
    ("2024-01-01T00:00,5\n", ["--timezone", "Mars/X"], "unknown time zone 'Mars/X'"),
    ("2024-01-01T00:00,5\n", ["--country", "XX"], "no holiday calendar for country 'XX'"),
    ("2024-01-01T00:00,5\n", ["--rules", "nope.yaml"], "cannot read nope.yaml"),
])
def test_detect_series_bad_inputs_are_one_line_errors(tmp_path, content, args, message):
    if content is not None:
        (tmp_path / "s.csv").write_text(content)
    r = subprocess.run([str(EXE), "detect", "series", "--input", "s.csv", *args], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_detect_series_reads_epoch_seconds_and_says_what_it_ignored(tmp_path):
    (tmp_path / "e.csv").write_text("".join(f"{1_700_000_000 + 300 * i},{10 + i % 3}\n" for i in range(3)))
    r = subprocess.run([str(EXE), "detect", "series", "--input", "e.csv", "--scores"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.splitlines()[1].startswith("2023-11-14T22:13:20Z,10.0,"), r.stdout
    (tmp_path / "w.csv").write_text("ts,v\n2024-01-01T00:00,5\n2024-01-01T00:05,abc\n2024-01-01T00:05,7\n")
    r = subprocess.run([str(EXE), "detect", "series", "--input", "w.csv", "--scores"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0
    assert "1 value(s) are not numbers and count as missing (first: row 3, 'abc')" in r.stderr
    assert "1 row(s) repeat an earlier timestamp" in r.stderr
    assert r.stdout.splitlines()[2].startswith("2024-01-01T00:05:00Z,7.0,")  # the last row of the timestamp


def test_a_wrong_format_is_named_not_called_a_cut_line(tmp_path):
    log = tmp_path / "d.log"
    log.write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1 "-" "UA" 1234\n'
                   '1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HT\n')
    r = subprocess.run([str(EXE), "parse", "-f", "combined", str(log)], capture_output=True, text=True, timeout=120)
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert rows[0]["error"] == "no_format_matched" and "the line is combined_d, not combined" in rows[0]["detail"]
    assert rows[1]["error"] == "truncated"  # a line really cut in the middle keeps its reason
    r = subprocess.run([str(EXE), "ingest", "--store", f"chdb:{tmp_path / 'st'}", "-f", "squid", str(log)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "no line loaded: is the format right?" in r.stderr, r.stderr


def test_decisions_on_a_held_store_without_an_owner_says_both(tmp_path):
    chdb = tmp_path / "st"
    (chdb / "metadata").mkdir(parents=True)  # a store's folder (a missing one is refused before any lock)
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); f.write('4242'); f.flush(); print('held', flush=True); "
                               "time.sleep(60)", str(chdb / ".forumpulse.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = subprocess.run([str(EXE), "detect", "decisions", "--store", f"chdb:{chdb}", "--owner",
                            "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 3 and "Traceback" not in r.stderr, r.stderr
    assert "in use by another process (pid 4242)" in r.stderr and "No owner answers at http://127.0.0.1:9" in r.stderr


def test_decisions_without_an_owner_says_when_none_are_in_force_and_when_spooled_ones_wait(tmp_path):
    """No owner, a store without bans, two spooled decision files (the last owner stopped with the store away):
    stdout stays JSON lines (none), stderr says the list is empty and that spooled decisions are not in it
    (user trial 43: an empty answer without a word, the spooled bans missing silently)."""
    spool = tmp_path / "data" / "spool"
    spool.mkdir(parents=True)
    for name in ("decisions-0000000000001-a.jsonl", "decisions-0000000000002-b.jsonl"):
        (spool / name).write_text("{}\n")
    m = subprocess.run([str(EXE), "db", "migrate", "--store", f"chdb:{tmp_path / 'st'}"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert m.returncode == 0, m.stderr
    r = subprocess.run([str(EXE), "detect", "decisions", "--store", f"chdb:{tmp_path / 'st'}", "--owner",
                        "http://127.0.0.1:9"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    assert "note: no bans in force" in r.stderr
    assert "note: 2 spooled decision file(s) in data/spool are not in the store yet (not listed)" in r.stderr


@pytest.mark.parametrize("cmd", ["consume", "run"])
def test_long_running_commands_do_not_wait_for_a_store_url_that_cannot_work(tmp_path, cmd):
    r = subprocess.run([str(EXE), cmd, "--store", "foo:bar"], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 2 and "unknown store URL 'foo:bar'" in r.stderr, r.stderr


def test_a_fatal_consumer_error_without_the_fatal_flag_is_fatal():
    from confluent_kafka import KafkaError
    from forumpulse.pipeline.consumer import _is_fatal

    # what librdkafka hands a fenced static member: code _FATAL, fatal() False -- the loader used to poll on forever
    assert _is_fatal(KafkaError(KafkaError._FATAL, "Static consumer fenced by other consumer"))
    assert _is_fatal(KafkaError(KafkaError._TRANSPORT, "x", fatal=True))
    assert not _is_fatal(KafkaError(KafkaError._TRANSPORT, "broker down"))


def test_config_check_warns_about_groups_without_members(tmp_path):
    """A group with no topic_ids whose title_pattern matches no title is found when the configuration is checked,
    not on election night when its report comes back empty (user trial 30); so is a holiday period whose end year
    is a typo (trial 31: an 18-year "Chinese New Year week" called every dip in it a holiday)."""
    titles = tmp_path / "titles.csv"
    titles.write_text("site,topic_id,title\nboard,7,Election night live\nboard,8,Cats\n")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\nsites:\n  - name: board\n"
                   "    holiday_periods:\n      - {name: CNY week, start: 2024-02-08, end: 2024-02-16}\n"
                   "      - {name: CNY 2025, start: 2025-01-27, end: 2042-02-04}\n"
                   f"topics:\n  titles_csv: {titles}\n"
                   "  groups:\n    - {name: vote, site: board, title_pattern: '(?i)election'}\n"
                   "    - {name: nomatch, site: board, title_pattern: 'no such title'}\n"
                   "    - {name: empty, site: board}\n")
    r = subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "configuration OK" in r.stdout, r.stderr
    assert f"warning: topic group board/nomatch has no topics: no topic_ids, and its title_pattern matches no title of {titles}" in r.stderr
    assert "warning: topic group board/empty has no topics" in r.stderr and "board/vote" not in r.stderr
    assert ("warning: sites.0.holiday_periods.1 'CNY 2025': 2025-01-27 to 2042-02-04, 6,218 days: a holiday period "
            "this long calls every dip in it a holiday (a year typo?)") in r.stderr, r.stderr
    assert "holiday_periods.0" not in r.stderr


def test_config_check_says_when_the_spool_folder_cannot_take_decisions(tmp_path):
    """detectors.live.spool_dir is checked with the configuration (read only: nothing is created), not found
    unusable when an owner stops with decisions the store has not taken; spooled files waiting are said; so is
    an actions.jsonl_path that could not be appended to."""
    blocker = tmp_path / "spool-is-a-file"
    blocker.write_text("x")

    def check(spool):
        cfg = tmp_path / "fp.yaml"
        cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\ndetectors:\n  live:\n    spool_dir: {spool}\n")
        return subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True,
                              timeout=120)

    r = check(blocker)
    assert r.returncode == 0 and "configuration OK" in r.stdout, r.stderr
    assert f"warning: detectors.live.spool_dir {blocker}: not a folder: decisions the store" in r.stderr, r.stderr
    r = check(blocker / "spool")
    assert f"spool_dir {blocker / 'spool'}: cannot be created ({blocker} is not a folder)" in r.stderr, r.stderr
    cfg = tmp_path / "fp.yaml"  # the decisions' JSON-lines file under a file, and as a folder (user trial 43)
    cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\nactions:\n  jsonl_path: {blocker / 'd.jsonl'}\n")
    r = subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and (f"warning: actions.jsonl_path {blocker / 'd.jsonl'}: its folder {blocker} is not "
                                  "a folder: decisions could not be appended to it") in r.stderr, r.stderr
    for path, said in ((tmp_path, "a folder"),  # a folder, and a missing folder (it is not created, from a review)
                       (tmp_path / "nope" / "d.jsonl", f"its folder {tmp_path / 'nope'} does not exist")):
        cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\nactions:\n  jsonl_path: {path}\n")
        r = subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True,
                           timeout=120)
        assert f"warning: actions.jsonl_path {path}: {said}" in r.stderr, r.stderr
    ready = tmp_path / "d.jsonl"  # a file made beforehand: fine (its folder's mode is not asked)
    ready.write_text("")
    cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\nactions:\n  jsonl_path: {ready}\n")
    r = subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "jsonl_path" not in r.stderr, r.stderr
    # a relative spool folder is checked from here, and said so (the owner resolves it from its own directory)
    (tmp_path / "rel").write_text("x")
    cfg.write_text(f"store:\n  url: chdb:{tmp_path / 'st'}\ndetectors:\n  live:\n    spool_dir: rel\n")
    r = subprocess.run([str(EXE), "config", "check", "-c", str(cfg)], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert (f"spool_dir rel: not a folder (relative: checked as {tmp_path / 'rel'}; the owner resolves it against "
            "its own working directory)") in r.stderr, r.stderr
    fresh = tmp_path / "new" / "spool"
    r = check(fresh)
    assert "spool_dir" not in r.stderr + r.stdout and not (tmp_path / "new").exists()  # checked, not created
    fresh.mkdir(parents=True)
    for name in ("decisions-0000000000001-a.jsonl", "decisions-0000000000002-b.jsonl", "decisions-3.tmp"):
        (fresh / name).write_text("{}\n")
    r = check(fresh)
    assert f"note: detectors.live.spool_dir {fresh}: 2 spooled decision file(s) wait for the next owner" in r.stdout


def test_an_unreachable_clickhouse_is_one_error_line(tmp_path):
    """clickhouse-connect logged "Unexpected Http Driver Exception" on a line of its own above our error, which
    read as a second, unexplained failure (user trial 40)."""
    r = subprocess.run([str(EXE), "detect", "--from", "2024-02-01", "--to", "2024-02-02", "--store",
                        "clickhouse://default@127.0.0.1:9/x"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode != 0 and "cannot reach ClickHouse at 127.0.0.1:9" in r.stderr, r.stderr
    assert "Unexpected Http Driver Exception" not in r.stderr and "Traceback" not in r.stderr, r.stderr
