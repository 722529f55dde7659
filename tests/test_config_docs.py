"""docs/configuration.md, forumpulse.example.yaml and `forumpulse config check` agree with the code.

* the key table committed in docs/configuration.md is exactly ``markdown_reference()``;
* forumpulse.example.yaml loads with ``load_settings`` (every owner-validated section included) and mentions
  every key of the reference;
* the documented resolution order holds (file < environment ``FORUMPULSE_<SECTION>__<KEY>``);
* ``forumpulse config check`` run as a subprocess reports wrong keys and values with the key and the reason, exit 2.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import forumpulse.detectors.dos_rules
import forumpulse.detectors.traffic
import forumpulse.pipeline.live_detect  # noqa: F401  (register their section validators, as `config check` does)
import pytest
from forumpulse.pipeline.config import ConfigError, load_settings, markdown_reference, reference_rows

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
EXAMPLE = ROOT / "forumpulse.example.yaml"
CLI = ROOT / ".venv" / "bin" / "forumpulse"
BEGIN = "<!-- BEGIN GENERATED: markdown_reference -->\n"
END = "<!-- END GENERATED: markdown_reference -->"


@pytest.fixture(autouse=True)
def _no_forumpulse_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("FORUMPULSE_"):
            monkeypatch.delenv(k)


def test_doc_table_is_the_generated_reference() -> None:
    text = DOC.read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "markers missing or duplicated in docs/configuration.md"
    committed = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert committed == markdown_reference(), (
        "docs/configuration.md key table is stale: regenerate it with markdown_reference() (see the doc)")


def test_doc_mentions_resolution_order_env_and_check() -> None:
    text = DOC.read_text()
    for needle in ("FORUMPULSE_<SECTION>__<KEY>", "forumpulse config check", "--config", "$FORUMPULSE_CONFIG"):
        assert needle in text


def test_example_loads_and_passes_every_validator() -> None:
    s = load_settings(EXAMPLE)
    assert s.sites[0].timezone == "Asia/Kuala_Lumpur"
    assert [src.name for src in s.sources] == ["web1", "proxy"]
    assert s.detectors["dos"]["mode"] == "observe"
    assert s.detectors["live"]["dos_source"] == "feed"
    assert s.privacy.pseudonym_key is None and s.actions["decision_api"]["api_key"] is None  # no secret in the file


def test_example_mentions_every_key_of_the_reference() -> None:
    text = EXAMPLE.read_text()
    keys = {re.split(r"[.\[\]]+", key.rstrip("]"))[-1] for key, *_ in reference_rows()}
    missing = sorted(k for k in keys if not re.search(rf"^\s*(- )?{re.escape(k)}:", text, re.M))
    assert not missing, f"forumpulse.example.yaml does not document: {missing}"


def test_example_documents_owner_sections_keys() -> None:
    from forumpulse.detectors.dos_rules import ActionsConfig, DosConfig
    from forumpulse.detectors.traffic import TrafficSettings
    from forumpulse.pipeline.live_detect import LiveConfig

    text = EXAMPLE.read_text()
    names = (set(DosConfig.model_fields) | set(ActionsConfig.model_fields) | set(TrafficSettings.model_fields)
             | set(LiveConfig.model_fields))
    for sub in ActionsConfig.model_fields.values():
        ann = sub.annotation
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            names |= set(ann.model_fields)
    missing = sorted(n for n in names if not re.search(rf"^\s*{re.escape(n)}:", text, re.M))
    assert not missing, f"forumpulse.example.yaml lacks detectors/actions keys: {missing}"


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "f.yaml"
    cfg.write_text("retention:\n  raw_days: 10\nstore:\n  url: chdb:/from/file\n")
    assert load_settings(cfg).retention.raw_days == 10
    monkeypatch.setenv("FORUMPULSE_RETENTION__RAW_DAYS", "7")
    monkeypatch.setenv("FORUMPULSE_SITES", '[{"name": "board", "timezone": "Europe/Berlin"}]')
    s = load_settings(cfg)
    assert s.retention.raw_days == 7
    assert s.store.url == "chdb:/from/file"
    assert [(x.name, x.timezone) for x in s.sites] == [("board", "Europe/Berlin")]
    monkeypatch.setenv("FORUMPULSE_RETENTION__RAW_DAYS", "-1")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert any(p.startswith("retention.raw_days:") for p in err.value.problems)


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    assert CLI.exists(), f"{CLI} missing: run `make install` first"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    return subprocess.run([str(CLI), "config", "check", "--config", str(path)], capture_output=True, text=True,
                          env=env, timeout=120)


def test_config_check_accepts_the_example() -> None:
    r = _check(EXAMPLE)
    assert r.returncode == 0, r.stderr
    assert "configuration OK" in r.stdout


@pytest.mark.parametrize(
    ("body", "key", "reason"),
    [
        ("retention:\n  raw_dayz: 5\n", "retention.raw_dayz", "Extra inputs are not permitted"),
        ("privacy:\n  client_ip: hide\n", "privacy.client_ip", "Input should be 'keep', 'truncate' or 'pseudonymize'"),
        ("sites:\n  - name: forum\n    timezone: Mars/Olympus\n", "sites.0.timezone", "unknown time zone"),
        ("detectors:\n  dos:\n    mode: ban-everyone\n", "detectors.dos.mode", "Input should be 'enforce' or 'observe'"),
        ("actions:\n  decision_api:\n    enabled: true\n", "actions.decision_api", "needs api_key"),
        # checked where the configuration is, not first when a detector or the parser starts
        ("detectors:\n  dos:\n    rule_overrides:\n      nope: {threshold: 3}\n", "detectors.dos",
         "rule_overrides: unknown rule 'nope'"),
        ("detectors:\n  dos:\n    rule_overrides:\n      client_flood: {thresholdz: 3}\n", "detectors.dos",
         "rules: client_flood.thresholdz: Extra inputs are not permitted"),
        ("detectors:\n  dos:\n    rules_file: /nonexistent/dos.yaml\n", "detectors.dos",
         "rules_file: cannot read /nonexistent/dos.yaml"),
        ("detectors:\n  traffic:\n    rules_file: /nonexistent/traffic.yaml\n", "detectors.traffic.rules_file",
         "cannot read /nonexistent/traffic.yaml"),
        ("privacy:\n  client_ip: pseudonymize\n", "privacy", "pseudonym_key is not set"),
        ("topics:\n  post_map_csv: /nonexistent/posts.csv\n", "data file error",
         "topics.post_map_csv: cannot read /nonexistent/posts.csv"),
        ("topics:\n  titles_csv: /nonexistent/titles.csv\n", "data file error", "cannot read /nonexistent/titles.csv"),
        ("sources:\n  - name: a\n    format: combinedd\n", "sources.0.format", "unknown format spec 'combinedd'"),
        ("topics:\n  groups:\n    - name: g\n      title_pattern: '(['\n", "topics.groups.0.title_pattern",
         "bad regular expression"),
        # a misspelt detector part: each part's owner allows the others' keys, so this one is checked by name
        ("detectors:\n  dso:\n    mode: observe\n", "detectors", "unknown detector section(s) 'dso'"),
        # an empty spool folder would be the working directory (user trial 43)
        ("detectors:\n  live:\n    spool_dir: ' '\n", "detectors.live.spool_dir", "empty: name a folder"),
        ("detectors:\n  traffic:\n    enabled: [site, topicz]\n", "detectors.traffic.enabled.1",
         "Input should be 'site', 'topic' or 'transfer'"),
        ("sites:\n  - name: f\n    country: XX\n", "sites", "no holiday calendar for country 'XX'"),
        ("sites:\n  - name: f\n  - name: f\n", "sites", "two sites share a name"),
        # the documented form (unquoted YAML dates) is accepted; nonsense and inverted periods are not
        ("sites:\n  - name: f\n    holiday_periods:\n      - {name: a, start: 2026-05-23, end: 2026-06-07}\n"
         "      - {name: b, start: '23/05/2026', end: '2026-06-01'}\n", "sites.0.holiday_periods.1.start",
         "'23/05/2026' is not a day YYYY-MM-DD"),
        ("sites:\n  - name: f\n    holiday_periods:\n      - {name: a, start: 2026-06-07, end: 2026-05-23}\n",
         "sites.0.holiday_periods.0", "end 2026-05-23 is before start 2026-06-07"),
        # an impossible unquoted date is reported by its key (YAML's date constructor raised with none: trial 31)
        ("sites:\n  - name: f\n    holiday_periods:\n      - {name: a, start: 2024-02-08, end: 2024-02-30}\n",
         "sites.0.holiday_periods.0.end", "'2024-02-30' is not a day YYYY-MM-DD"),
    ],
)
def test_config_check_reports_key_and_reason(tmp_path: Path, body: str, key: str, reason: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(body)
    r = _check(cfg)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln.strip() for ln in (r.stdout + r.stderr).splitlines()]
    assert any(ln.startswith(f"{key}:") and reason in ln for ln in lines), lines


def test_config_show_and_check_mask_secrets(tmp_path: Path) -> None:
    cfg = tmp_path / "secrets.yaml"
    cfg.write_text("store:\n  url: clickhouse://writer:s3cr3t-pw@ch:8123/forumpulse\n"
                   "privacy:\n  client_ip: pseudonymize\n  pseudonym_key: k3y-k3y-k3y\n"
                   "actions:\n  webhook:\n    enabled: true\n    url: https://hooks.example/x\n    secret: hmac-h3x\n"
                   "  decision_api:\n    enabled: true\n    api_key: bouncer-k3y\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    show = subprocess.run([str(CLI), "config", "show", "-c", str(cfg)], capture_output=True, text=True, env=env,
                          timeout=120)
    check = _check(cfg)
    assert show.returncode == 0 and check.returncode == 0, (show.stderr, check.stderr)
    for secret in ("s3cr3t-pw", "k3y-k3y-k3y", "hmac-h3x", "bouncer-k3y"):
        assert secret not in show.stdout + check.stdout, secret
    data = json.loads(show.stdout)
    assert data["store"]["url"] == "clickhouse://writer:***@ch:8123/forumpulse"
    assert data["actions"]["webhook"]["secret"] == "***" and data["actions"]["decision_api"]["api_key"] == "***"
    assert data["actions"]["webhook"]["url"] == "https://hooks.example/***"  # chat webhooks: secret in the path
    assert data["privacy"]["pseudonym_key"] != "k3y-k3y-k3y"
    assert "clickhouse://writer:***@ch:8123/forumpulse" in check.stdout


def test_kafka_consumer_queue_reaches_the_loader_options() -> None:
    from forumpulse.pipeline.consumer import ConsumerOptions

    s = load_settings()
    assert ConsumerOptions.from_settings(s).queued_max_kbytes == s.kafka.consumer_queue_kbytes == 65_536
    s.kafka.consumer_queue_kbytes = 4_096
    assert ConsumerOptions.from_settings(s).queued_max_kbytes == 4_096


def test_documented_holiday_period_form_loads_as_dates(tmp_path: Path) -> None:
    import datetime as dt

    cfg = tmp_path / "p.yaml"
    cfg.write_text("sites:\n  - name: f\n    country: MY\n    holiday_periods:\n"
                   "      - {name: Hari Raya, start: 2026-05-23, end: \"2026-06-07\"}\n")
    p = load_settings(cfg).sites[0].holiday_periods[0]
    assert (p.start, p.end) == (dt.date(2026, 5, 23), dt.date(2026, 6, 7))
    from forumpulse.detectors.calendar import site_calendar

    cal = site_calendar(load_settings(cfg).sites[0])
    assert cal.is_holiday(dt.date(2026, 6, 1)) and not cal.is_holiday(dt.date(2026, 6, 9))


def test_misspelt_environment_section_and_unconfigured_site(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(CLI), "config", "check"], capture_output=True, text=True, timeout=120,
                       env={**env, "FORUMPULSE_STOR__URL": "chdb:/x"}, cwd=tmp_path)
    assert r.returncode == 2 and "environment FORUMPULSE_STOR__URL: no section 'stor'" in r.stderr, r.stderr
    cfg = tmp_path / "s.yaml"
    cfg.write_text("sources:\n  - name: a\n    site: frum\n")
    r = _check(cfg)
    # close to the configured site's name: most likely a typo, a warning naming it
    assert r.returncode == 0 and ("warning: sources.0.site 'frum' is not in sites (did you mean 'forum'?)"
                                  in r.stderr), (r.stdout, r.stderr)
    cfg.write_text("sources:\n  - name: a\n    site: shop\n")  # another site altogether: a note
    r = _check(cfg)
    assert r.returncode == 0 and "note: sources.0.site 'shop' is not in sites" in r.stdout, (r.stdout, r.stderr)
    cfg.write_text("detectors:\n  dos:\n    site: fourm\n")  # the site the DoS decisions name (user trial 43)
    r = _check(cfg)
    assert r.returncode == 0 and ("warning: detectors.dos.site 'fourm' is not in sites (did you mean 'forum'?)"
                                  in r.stderr), (r.stdout, r.stderr)


def test_one_run_reports_the_core_and_the_detector_sections_problems(tmp_path: Path) -> None:
    """A wrong site key and wrong detector keys are reported together (before, the detector sections were only
    checked once every core key was right: a user fixed one batch of problems and met the next)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sites:\n  - name: forum\n    timezone: Mars/Base\n    trusted_proxies: [nope]\n"
                   "detectors:\n  dos:\n    allowlist: [example.com]\n  traffic:\n    site:\n      spike_ratio: -3\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    keys = [p.split(":", 1)[0] for p in exc.value.problems]
    assert sorted(keys) == ["detectors.dos.allowlist", "detectors.traffic.site", "sites.0.timezone",
                            "sites.0.trusted_proxies"], exc.value.problems
    # a detectors value that is not a mapping is one problem, its validators are not run on the default
    cfg.write_text("sites:\n  - name: forum\n    timezone: Mars/Base\ndetectors: 5\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    assert [p.split(":", 1)[0] for p in exc.value.problems] == ["sites.0.timezone", "detectors"], exc.value.problems
    # an unknown detector section does not hide a known section's problems
    cfg.write_text("detectors:\n  livee: {}\n  dos:\n    no_such_key: 1\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    assert [p.split(":", 1)[0] for p in exc.value.problems] == ["detectors", "detectors.dos.no_such_key"], \
        exc.value.problems
    # a problem of the file as a whole (two sites of one name) is reported alone, as before
    cfg.write_text("sites:\n  - name: a\n  - name: a\n")
    with pytest.raises(ConfigError, match="two sites share a name"):
        load_settings(cfg)
