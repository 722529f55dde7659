"""A replacement traffic rules file (``rules_file``, ``--rules``) is checked against the shipped one: a typo or a
value of the wrong kind is an error naming it (``config check`` catches it; ``detect`` exits 2, no traceback),
an old version says so, and the keys it leaves out keep the shipped values (ops trial, stop 29)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from forumpulse.detectors.traffic import RULES_FILE, TrafficSettings, load_rules
from pydantic import ValidationError

SHIPPED = yaml.safe_load(RULES_FILE.read_text())


def _rules(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "rules.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_partial_replacement_keeps_the_shipped_values(tmp_path: Path) -> None:
    r = load_rules(_rules(tmp_path, {"version": SHIPPED["version"], "site": {"spike_ratio": 3}}))
    assert r["site"]["spike_ratio"] == 3
    assert r["site"]["spike_z"] == SHIPPED["site"]["spike_z"] and r["series"] == SHIPPED["series"]


@pytest.mark.parametrize(("data", "message"), [
    ({"site": {"spike_ratoi": 3}}, "unknown rule site.spike_ratoi (did you mean site.spike_ratio?)"),
    ({"sites": {"spike_ratio": 3}}, "unknown section 'sites' (did you mean 'site'?)"),
    ({"site": {"spike_ratio": "high"}}, "site.spike_ratio: 'high' is not a number (shipped: 2.0)"),
    ({"site": {"bucket_minutes": 30.5}}, "site.bucket_minutes: 30.5 is not a whole number (shipped: 30)"),
    ({"site": {"exclude_events": 1}}, "site.exclude_events: 1 is not a bool"),
    ({"site": [1, 2]}, "section 'site' must be a mapping"),
])
def test_mistakes_are_named(tmp_path: Path, data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=r"rules\.yaml: ") as exc:
        load_rules(_rules(tmp_path, {"version": SHIPPED["version"], **data}))
    assert message in str(exc.value)


def test_an_old_version_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"found version 8: copy detectors/rules/traffic.yaml of this release"):
        load_rules(_rules(tmp_path, {**SHIPPED, "version": 8}))


def test_overrides_of_the_wrong_kind_are_refused() -> None:
    with pytest.raises(ValueError, match=r"traffic rule site.spike_ratio: 'x' is not a number"):
        load_rules(overrides={"site": {"spike_ratio": "x"}})
    assert load_rules(overrides={"site": {"spike_ratio": 3}})["site"]["spike_ratio"] == 3  # an int is a number
    with pytest.raises(ValueError, match=r"site.bucket_minutes: 30.5 is not a whole number"):
        load_rules(overrides={"site": {"bucket_minutes": 30.5}})
    whole = load_rules(overrides={"site": {"bucket_minutes": 30.0}})["site"]["bucket_minutes"]
    assert whole == 30 and isinstance(whole, int)  # 30.0 would break slicing later (review)
    with pytest.raises(ValueError, match=r"topic.baseline_hours: 0.5 is not a whole number"):  # int() made it 0
        load_rules(overrides={"topic": {"baseline_hours": 0.5}})
    # hours, seconds and thresholds take fractions (a test shortens health.gap_blinds_site_hours to 0.1)
    assert load_rules(overrides={"health": {"gap_blinds_site_hours": 0.1}})["health"]["gap_blinds_site_hours"] == 0.1


def test_config_and_cli_refuse_a_typo(tmp_path: Path) -> None:
    rules = _rules(tmp_path, {"version": SHIPPED["version"], "site": {"spike_ratoi": 3}})
    with pytest.raises(ValidationError, match=r"unknown rule site\.spike_ratoi"):
        TrafficSettings(rules_file=str(rules))
    (tmp_path / "s.csv").write_text("2024-01-01T00:00Z,5\n")
    r = subprocess.run([sys.executable, "-m", "forumpulse.pipeline.cli", "detect", "series", "--input", "s.csv",
                        "--rules", str(rules)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "unknown rule site.spike_ratoi" in r.stderr and "Traceback" not in r.stderr, r.stderr
