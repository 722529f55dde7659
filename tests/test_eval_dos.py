"""The DoS evaluation's CrowdSec hub part: the hub's test logs attack from loopback, which the manager never
bans (dos.NEVER_BAN); the evaluation replays them from routable stand-ins and reports under the case's address."""

from __future__ import annotations

import ipaddress
import json
import shutil
from pathlib import Path

from forumpulse.detectors.dos import NEVER_BAN
from forumpulse.detectors.eval_dos import crowdsec_cases, stand_in

FIX = Path(__file__).parent / "fixtures" / "dos"


def test_stand_ins_are_bannable_and_keep_the_prefix_structure() -> None:
    for ip in ("127.0.0.1", "127.0.0.9", "127.1.1.3", "127.2.2.2", "::1", "::ffff:127.0.0.1"):
        s = stand_in(ip)
        assert s is not None and s != ip
        a = ipaddress.ip_address(s)
        assert not any(a in net for _, net in NEVER_BAN if net.version == a.version), s
    # same /24 stays one /24, different /24s stay apart, distinct addresses stay distinct
    assert stand_in("127.0.0.1").rsplit(".", 1)[0] == stand_in("127.0.0.4").rsplit(".", 1)[0]  # type: ignore[union-attr]
    assert len({stand_in(f"127.{a}.{b}.{c}") for a in range(3) for b in range(3) for c in range(1, 4)}) == 27
    for ip in ("172.17.0.1", "2001:db8::1", "not-an-ip", None):
        assert stand_in(ip) == ip


def test_hub_case_from_loopback_is_judged_and_reported_under_its_address(tmp_path: Path) -> None:
    base = tmp_path / "crowdsec_hub_tests"
    case = base / "tests" / "nginx-http-sqli-probing"
    case.mkdir(parents=True)
    shutil.copy(FIX / "nginx-http-sqli-probing.log", case)
    (base / "SUMMARY.json").write_text(json.dumps([{
        "test": "nginx-http-sqli-probing", "log_type": "nginx", "log_file": "nginx-http-sqli-probing.log",
        "expected": {"alerts": [{"scenario": "crowdsecurity/http-sqli-probbing-detection",
                                 "sources": ["127.0.0.1"]}]}}]))
    head, rows = crowdsec_cases(tmp_path)
    assert head[-1] == "verdict"
    assert len(rows) == 1
    name, expected, ours, verdict = rows[0]
    assert expected == "127.0.0.1 (http-sqli-probbing-detection)"
    assert (name, verdict) == ("nginx-http-sqli-probing", "match"), rows
    assert ours.startswith("127.0.0.1 (") and "sqli_probe" in ours, ours
