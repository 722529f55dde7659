"""Rules as data: the rules file validates, and every rule's fixture cases (rules/dos_cases/) hold."""

from __future__ import annotations

import os
import random
import string
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from forumpulse.detectors.dos_rules import CASES_DIR, ActionsConfig, DosConfig, load_rules
from forumpulse.detectors.eval_dos import ordered, rec, run_detector
from forumpulse.pipeline.record import ParsedLine

T0 = 1_700_000_000_000
RULES = load_rules()


def expand(traffic: list[dict[str, Any]], seed: int) -> list[ParsedLine]:
    """Compact traffic spec -> records.  Placeholders: {k} client index, {i} request index, {n} random
    9-digit number, {AZ} six random upper-case letters."""
    rnd = random.Random(seed)
    out = []
    for t in traffic:
        for k in range(int(t.get("clients", 1))):
            n = int(t["rate"] * t["seconds"])
            for i in range(n):
                def f(s: str, i: int = i, k: int = k) -> str:
                    return (s.replace("{k}", str(k + 1)).replace("{i}", str(i))
                            .replace("{n}", str(rnd.randrange(10**8, 10**9)))
                            .replace("{AZ}", "".join(rnd.choices(string.ascii_uppercase, k=6))))
                ts = T0 + int((t.get("start_s", 0) + i / t["rate"]) * 1000) + 13 * k
                out.append(rec(ts, f(str(t["ip"])), f(t.get("path", "/")), f(str(t.get("query", ""))),
                               int(t.get("status", 200)), f(t.get("ua", "Mozilla/5.0 (X11) Firefox/120.0")),
                               t.get("method", "GET")))
    return ordered(out)


def all_cases() -> list[Any]:
    out = []
    for r in RULES.rules:
        f = CASES_DIR / f"{r.name}.yaml"
        data = yaml.safe_load(f.read_text()) if f.is_file() else {"rule": r.name, "cases": []}
        for i, c in enumerate(data["cases"]):
            out.append(pytest.param(r.name, c, id=f"{r.name}-{i}"))
    return out


def test_every_rule_has_positive_and_negative_cases() -> None:
    for r in RULES.rules:
        f = CASES_DIR / f"{r.name}.yaml"
        assert f.is_file(), f"rule {r.name} has no fixture cases ({f})"
        data = yaml.safe_load(f.read_text())
        assert data["rule"] == r.name
        assert any(c["expect"] for c in data["cases"]) and any(not c["expect"] for c in data["cases"]), r.name
    assert {p.stem for p in CASES_DIR.glob("*.yaml")} == {r.name for r in RULES.rules}


@pytest.mark.parametrize(("rule", "case"), all_cases())
def test_rule_case(rule: str, case: dict[str, Any]) -> None:
    recs = expand(case["traffic"], seed=len(case["name"]))
    verify = case.get("crawlers_verify", "off")  # off unless the case is about crawler verification
    det = run_detector(recs, DosConfig(crawlers={"verify": verify}), batch_lines=500)  # type: ignore[arg-type]
    got = {d.value: d for d in det.manager.decisions}
    if not case["expect"]:
        assert got == {}, f"{case['name']}: unexpected {[(d.value, d.reason) for d in got.values()]}"
        return
    assert det.stats[rule] >= 1, f"{case['name']}: rule {rule} never fired ({det.stats})"
    start = recs[0].ts
    for e in case["expect"]:
        assert e["value"] in got, f"{case['name']}: {e['value']} not decided; got {sorted(got)}"
        assert got[e["value"]].decided_at - start <= e["within_s"] * 1000


def test_rules_file_misuse_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown rule"):
        load_rules(overrides={"no_such_rule": {"threshold": 1}})
    bad = yaml.safe_load((CASES_DIR.parent / "dos.yaml").read_text())
    bad["rules"][0]["filter"]["pattern"] = "nope"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="unknown pattern"):
        load_rules(p)
    assert load_rules(overrides={"client_flood": {"threshold": 50}}).rules[0].threshold == 50


def test_config_sections_validate_and_need_secrets() -> None:
    assert DosConfig(allowlist=["10.1.2.3/8"]).allowlist == ["10.0.0.0/8"]
    with pytest.raises(ValueError, match="not an IP"):
        DosConfig(allowlist=["example.com"])
    with pytest.raises(ValueError, match="secret"):
        ActionsConfig.model_validate({"webhook": {"enabled": True, "url": "https://h/x"}})
    with pytest.raises(ValueError, match="api_key"):
        ActionsConfig.model_validate({"decision_api": {"enabled": True}})
    with pytest.raises(ValueError):
        ActionsConfig.model_validate({"nftables": {"table": "x; flush ruleset"}})
    ok = ActionsConfig.model_validate({"webhook": {"enabled": True, "url": "https://h/x", "secret": "s"}})
    assert ok.webhook.secret is not None and ok.webhook.secret.get_secret_value() == "s"


def test_prefix_baseline_section_is_validated(tmp_path: Path) -> None:
    """Rules version 4: the prefix_baseline section (learned rates of /24 and /64 ranges) is part of the rules
    data; prefix_surge scales by it and waits for its warm-up."""
    rules = load_rules()
    assert rules.version >= 4
    pb = rules.prefix_baseline
    assert (pb.headroom, pb.max_scale) == (4.0, 10.0)
    surge = next(r for r in rules.rules if r.name == "prefix_surge")
    assert (surge.key, surge.scope, surge.scale, surge.min_history_s) == ("prefix", "range", "baseline", 600)
    assert next(r for r in rules.rules if r.name == "prefix_flood").scale == "baseline"
    data = yaml.safe_load((CASES_DIR.parent / "dos.yaml").read_text())
    for bad, msg in (({"headroom": 0.5}, "greater than or equal to 1"), ({"window": 3}, "Extra inputs")):
        p = tmp_path / "bad.yaml"
        p.write_text(yaml.safe_dump({**data, "prefix_baseline": {**data["prefix_baseline"], **bad}}))
        with pytest.raises(ValueError, match=msg):
            load_rules(p)


EXE = Path(sys.executable).with_name("forumpulse")


def _no_client_flood(tmp_path: Path) -> Path:
    data = yaml.safe_load((CASES_DIR.parent / "dos.yaml").read_text())
    data["rules"] = [r for r in data["rules"] if r["name"] != "client_flood"]
    p = tmp_path / "noclient.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize(("args", "files", "message"), [
    (["detect", "dos", "-i", "a.log", "--rules", "bad.yaml"], {"bad.yaml": "version: 5\npatterns: [\n"},
     "error: rules bad.yaml: not valid YAML: line 3"),
    (["detect", "dos", "-i", "a.log", "--rules", "list.yaml"], {"list.yaml": "- a\n"},
     "error: rules list.yaml: the top level must be a mapping"),
    (["detect", "dos", "-i", "a.log", "--rules", "noclient.yaml", "-c", "fp.yaml"],
     {"fp.yaml": "detectors:\n  dos:\n    rule_overrides: {client_flood: {threshold: 40}}\n"},
     "error: detectors.dos.rule_overrides: unknown rule 'client_flood' (not in noclient.yaml"),
    (["config", "check", "-c", "fp.yaml"], {"fp.yaml": "detectors:\n  dos:\n    rules_file: bad.yaml\n",
                                            "bad.yaml": "version: 5\npatterns: [\n"},
     "detectors.dos: rules_file bad.yaml: not valid YAML: line 3"),
])
def test_bad_rules_files_are_one_line_errors(tmp_path: Path, args: list[str], files: dict[str, str],
                                             message: str) -> None:
    """A rules file that is not YAML, not a mapping, or lacks a rule the configuration overrides: one line naming
    the file and the reason, exit 2 (were yaml ParserError / ValueError tracebacks)."""
    (tmp_path / "a.log").write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n')
    _no_client_flood(tmp_path)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(EXE), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_a_rules_file_with_several_problems_names_every_one(tmp_path: Path) -> None:
    """The first problem alone hid the others (a missing field before a mistyped scope; user trial 41)."""
    data = yaml.safe_load((CASES_DIR.parent / "dos.yaml").read_text())
    names = [r["name"] for r in data["rules"]]
    del data["rules"][names.index("client_flood")]["window_s"]
    data["rules"][names.index("prefix_flood")]["scope"] = "ipp"
    (tmp_path / "two.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "a.log").write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET / HTTP/1.0" 200 1\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(EXE), "detect", "dos", "-i", "a.log", "--rules", "two.yaml"], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    err = r.stderr
    assert "error: rules two.yaml:" in err and "problem(s):" in err, err
    assert "  client_flood.window_s: Field required" in err, err  # the rule named, not its position
    assert "  prefix_flood.scope:" in err and "'ip'" in err, err


def test_load_rules_raises_one_error_type_for_unusable_files(tmp_path: Path) -> None:
    from forumpulse.detectors.dos_rules import DosRulesError

    p = tmp_path / "bad.yaml"
    p.write_text("version: 5\npatterns: [\n")
    with pytest.raises(DosRulesError, match="not valid YAML"):
        load_rules(p)
    with pytest.raises(DosRulesError, match="unknown rule 'client_flood'") as info:
        load_rules(_no_client_flood(tmp_path), {"client_flood": {"threshold": 40}})
    assert info.value.key == "rule_overrides"


def test_crawler_verify_off_may_be_written_unquoted_in_yaml() -> None:
    """YAML reads `verify: off` as false; the example documents `dns | ua | off`, so false means off (user trial
    43: refused with "Input should be 'dns', 'ua' or 'off'").  true is not a mode and stays refused."""
    import yaml
    from forumpulse.detectors.dos_rules import DosConfig
    from pydantic import ValidationError

    cfg = DosConfig.model_validate(yaml.safe_load("crawlers:\n  verify: off\n"))
    assert cfg.crawlers.verify == "off"
    with pytest.raises(ValidationError):
        DosConfig.model_validate(yaml.safe_load("crawlers:\n  verify: on\n"))
