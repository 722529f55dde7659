"""What a forum operator meets when setting up forumpulse for their own logs (found by a user trial): engine names
checked, formats pasted from the server's configuration, `parse` showing what `ingest` stores, the user rules'
fixture cases run by `config check`, an unconfigured --site named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from forumpulse.pipeline.config import SiteConfig
from forumpulse.pipeline.formats import get_parser
from forumpulse.pipeline.record import ParsedLine
from pydantic import ValidationError

FP = str(Path(sys.executable).with_name("forumpulse"))
FIX = Path(__file__).parent / "fixtures"
COMBINED = ('203.0.113.5 - - [10/Mar/2024:14:02:11 +0000] "GET /threads/hello.77/ HTTP/1.1" 200 5123 "-" '
            '"Mozilla/5.0 (X11; Linux x86_64) Firefox/123.0"')


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FP, *args], capture_output=True, text=True, timeout=180, cwd=cwd)


def test_engine_names_are_checked_and_taken_in_any_case() -> None:
    assert SiteConfig(engines=["phpBB", " XenForo"]).engines == ["phpbb", "xenforo"]
    with pytest.raises(ValidationError, match=r"unknown engine 'xenforo2' \(did you mean 'xenforo'\?\)"):
        SiteConfig(engines=["xenforo2"])


def test_config_check_names_an_unknown_engine(tmp_path: Path) -> None:
    cfg = tmp_path / "fp.yaml"
    cfg.write_text("sites:\n  - name: forum\n    engines: [phpbb3]\n")
    r = _run("config", "check", "-c", str(cfg), cwd=tmp_path)
    assert r.returncode == 2 and "sites.0.engines: unknown engine 'phpbb3'" in r.stdout + r.stderr


@pytest.mark.parametrize("spec", [
    r'apache:%h %l %u %t \"%r\" %>s %O \"%{Referer}i\" \"%{User-Agent}i\"',  # copied from apache2.conf
    r'apache:"%h %l %u %t \"%r\" %>s %O \"%{Referer}i\" \"%{User-Agent}i\""',  # with the enclosing quotes
    "nginx:'$remote_addr - $remote_user [$time_local] \"$request\" ' '$status $body_bytes_sent "
    "\"$http_referer\" ' '\"$http_user_agent\"';",  # nginx.conf's quoted pieces and the semicolon
])
def test_formats_pasted_from_the_server_configuration_parse(spec: str) -> None:
    r = get_parser(spec).parse(COMBINED)
    assert isinstance(r, ParsedLine), r
    assert (r.status, r.bytes, r.path, r.user_agent) == (200, 5123, "/threads/hello.77/",
                                                          "Mozilla/5.0 (X11; Linux x86_64) Firefox/123.0")


def test_a_format_whose_quotes_are_the_logs_is_left_alone() -> None:
    r = get_parser('apache:"%r" %t %>s "%{Referer}i"').parse(
        '"GET /a HTTP/1.1" [10/Mar/2024:14:02:11 +0000] 404 "-"')
    assert isinstance(r, ParsedLine) and (r.path, r.status) == ("/a", 404)


def test_parse_uses_the_configured_source_like_ingest(tmp_path: Path) -> None:
    log = tmp_path / "bb.access.log"
    nginx = '$remote_addr [$time_local] "$request" $status $body_bytes_sent "$http_user_agent" $request_time'
    log.write_text('203.0.113.5 [10/Mar/2024:14:02:11 +0000] "GET /viewtopic.php?t=5 HTTP/1.1" 200 10 "Mozilla/5.0" '
                   "0.250\n")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text(f"sites:\n  - name: bb\n    engines: [phpbb]\nsources:\n  - name: bbweb\n    site: bb\n    paths: ['{tmp_path}/*.log']\n"
                   f"    format: 'nginx:{nginx}'\n")
    r = _run("parse", "-c", str(cfg), str(log), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    [rec] = [json.loads(x) for x in r.stdout.splitlines()]
    assert (rec.get("error"), rec["site"], rec["topic_id"], rec["page_kind"], rec["elapsed_ms"]) == (
        None, "bb", 5, "topic_view", 250.0)


def test_config_check_runs_the_user_rules_cases(tmp_path: Path) -> None:
    rules = (FIX / "rules" / "site_rules.yaml").read_text()
    good = tmp_path / "rules.yaml"
    good.write_text(rules)
    cfg = tmp_path / "fp.yaml"
    cfg.write_text(f"topics:\n  rules_file: {good}\n")
    r = _run("config", "check", "-c", str(cfg), cwd=tmp_path)
    assert r.returncode == 0 and "fixture case(s) of the user rules passed" in r.stdout, r.stdout + r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(rules.replace("{url: '/article/42-budget-day', topic: 42,", "{url: '/article/42-budget-day', topic: 999,"))
    cfg.write_text(f"topics:\n  rules_file: {bad}\n")
    r = _run("config", "check", "-c", str(cfg), cwd=tmp_path)
    assert r.returncode == 2
    assert ("rule 'mysite.article', case GET /article/42-budget-day (site news): expected topic 999 kind "
            "topic_view from this rule, got topic 42 kind topic_view from rule 'mysite.article'") in r.stderr


def test_ingest_names_a_site_that_is_not_configured(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text(COMBINED + "\n")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text("retention:\n  raw_days: 0\n")
    r = _run("ingest", "-c", str(cfg), "--store", f"chdb:{tmp_path / 'st'}", "--site", "fourm", "-f", "combined",
             str(log), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "note: --site 'fourm' is not in sites (forum)" in r.stderr


def test_log_times_without_an_offset_are_in_the_sites_time_zone(tmp_path: Path) -> None:
    """Apache writes ``%{%Y-%m-%d %H:%M:%S}t`` in the server's local time, without an offset: read in the site's
    time zone (summer time included), not as UTC."""
    log = tmp_path / "a.log"
    log.write_text('203.0.113.5 - - [2024-03-10 14:02:11] "GET /t/1 HTTP/1.1" 200 10\n'
                   '203.0.113.5 - - [2024-07-10 14:02:11] "GET /t/1 HTTP/1.1" 200 10\n')
    fmt = 'apache:%h %l %u [%{%Y-%m-%d %H:%M:%S}t] "%r" %>s %b'
    cfg = tmp_path / "fp.yaml"
    cfg.write_text("sites:\n  - name: forum\n    timezone: Europe/Berlin\n")
    r = _run("parse", "-c", str(cfg), "-f", fmt, str(log), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x)["ts"] for x in r.stdout.splitlines()] == ["2024-03-10T13:02:11.000Z",
                                                                    "2024-07-10T12:02:11.000Z"]
    # with an offset in the format the zone plays no part
    log.write_text('203.0.113.5 - - [2024-07-10 14:02:11 +0000] "GET /t/1 HTTP/1.1" 200 10\n')
    r = _run("parse", "-c", str(cfg), "-f", fmt.replace("%S}t", "%S %z}t"), str(log), cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["ts"] == "2024-07-10T14:02:11.000Z", r.stdout + r.stderr


@pytest.mark.parametrize("suffix", [".bz2", ".xz"])
def test_bz2_and_xz_files_are_decompressed_and_a_cut_one_loads_what_is_there(store, settings, tmp_path: Path,
                                                                             suffix: str) -> None:
    import bz2
    import lzma

    from forumpulse.pipeline.ingest import ingest_paths

    data = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes() * 8  # bz2: several 900 kB blocks
    packed = bz2.compress(data) if suffix == ".bz2" else lzma.compress(data)
    f = tmp_path / f"access.log.2{suffix}"
    f.write_bytes(packed)
    [c] = ingest_paths(store, settings, [str(f)], fmt="combined")
    assert (c.read, c.loaded + c.quarantined, c.error) == (8000, 8000, None) and c.loaded > 7900
    cut = tmp_path / f"cut{suffix}"
    cut.write_bytes(packed[: len(packed) * 2 // 3])
    [k] = ingest_paths(store, settings, [str(cut)], fmt="combined", origin_host="other")
    assert k.error is not None and "damaged or cut short" in k.error and 0 < k.read < 8000


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_it(tmp_path: Path) -> None:
    log = tmp_path / "bom.log"
    log.write_bytes(b"\xef\xbb\xbf" + COMBINED.encode() + b"\n" + COMBINED.encode() + b"\n")
    r = _run("parse", "-f", "combined", str(log), cwd=tmp_path)
    recs = [json.loads(x) for x in r.stdout.splitlines()]
    assert [d.get("error") for d in recs] == [None, None] and recs[0]["client_ip"] == "203.0.113.5"


def test_a_zone_whose_clocks_change_inside_an_hour_is_converted_minute_by_minute() -> None:
    """Lord Howe Island moves its clocks by 30 minutes at 02:00: an offset looked up once per hour put 02:45 (after
    the change) half an hour before 02:15 would have been (from a review)."""
    from datetime import UTC, datetime

    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.process import Processor

    s = load_settings()
    s.sites = [SiteConfig(name="lh", timezone="Australia/Lord_Howe")]
    to_utc = Processor(s)._local_clock("lh")
    assert to_utc is not None

    def utc(wall: str) -> str:
        ms = int(datetime.fromisoformat(wall).replace(tzinfo=UTC).timestamp() * 1000)
        return datetime.fromtimestamp(to_utc(ms) / 1000, UTC).strftime("%H:%M")

    assert [utc(f"2024-10-06 {t}") for t in ("01:45", "02:45", "03:10")] == ["15:15", "15:45", "16:10"]


def test_nginx_conf_escapes_are_undone_as_nginx_does() -> None:
    from forumpulse.pipeline.formats.compiler import nginx_config_string

    assert nginx_config_string(r"""'$remote_addr ' '\"$request\" $status\t';""") == '$remote_addr "$request" $status\t'


def test_the_dos_replay_reads_times_and_marks_as_ingest_does(tmp_path: Path) -> None:
    """``detect dos`` parses on its own path: times without an offset in the site's zone, a byte order mark
    dropped -- its decisions' stream times matched ingest's rows only for UTC sites (from a review)."""
    from forumpulse.detectors.dos import _drops, parse_file

    log = tmp_path / "naive.log"
    log.write_bytes(b'\xef\xbb\xbf203.0.113.5 - - [2024-07-10 14:02:11] "GET /t/1 HTTP/1.1" 200 10\n'
                    b'203.0.113.5 - - [2024-07-10 14:02:12] "GET /t/1 HTTP/1.1" 200 10\n')
    fmt = 'apache:%h %l %u [%{%Y-%m-%d %H:%M:%S}t] "%r" %>s %b'
    got = [r.ts for r in parse_file(str(log), fmt, "Europe/Berlin")]
    assert got == [1720612931000, 1720612932000] and _drops[str(log)] == 0  # 12:02:11Z, 12:02:12Z
