"""Action settings that used to crash ``forumpulse run --dos`` at start are refused by the configuration (so
``config check`` names the key and the reason), IPv6 listen addresses work, and a port in use is a one-line
error with exit status 1 (it was a traceback, sometimes followed by a segfault: status 139)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from forumpulse.detectors.decision_api import DecisionApiServer, DecisionRegistry
from forumpulse.detectors.dos_rules import ActionsConfig, listen_address

EXE = Path(sys.executable).with_name("forumpulse")


@pytest.mark.parametrize(("actions", "key", "reason"), [
    ({"decision_api": {"enabled": True, "listen": "127.0.0.1", "api_key": "k"}}, "actions.decision_api.listen",
     "has no port: write HOST:PORT"),
    ({"decision_api": {"enabled": True, "listen": "::1:8090", "api_key": "k"}}, "actions.decision_api.listen",
     "write an IPv6 address in brackets"),
    ({"decision_api": {"enabled": True, "listen": "127.0.0.1:70000", "api_key": "k"}}, "actions.decision_api.listen",
     "the port must be a number from 0 to 65535"),
    ({"decision_api": {"enabled": True, "listen": ":8090", "api_key": "k"}}, "actions.decision_api.listen",
     "has no host"),
    ({"decision_api": {"enabled": True, "api_key": ""}}, "actions.decision_api", "api_key is empty"),
    ({"webhook": {"enabled": True, "url": "https://h.example/x", "secret": ""}}, "actions.webhook",
     "secret is empty"),
    ({"nftables": {"enabled": True, "hooks": ["output"]}}, "actions.nftables.hooks.0", "'input' or 'forward'"),
    ({"nftables": {"enabled": True, "hooks": []}}, "actions.nftables.hooks", "at least 1 item"),
    ({"ipset": {"enabled": True, "iptables_chains": ["DOCKER USER"]}}, "actions.ipset.iptables_chains.0",
     "should match pattern"),
    ({"ipset": {"enabled": True, "maxelem": 0}}, "actions.ipset.maxelem", "greater than or equal to 1"),
])
def test_config_check_names_the_action_settings_run_would_crash_on(tmp_path: Path, actions: dict[str, object],
                                                                   key: str, reason: str) -> None:
    (tmp_path / "fp.yaml").write_text(json.dumps({"actions": actions}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
    r = subprocess.run([str(EXE), "config", "check", "-c", "fp.yaml"], capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=env)
    assert r.returncode == 2 and f"{key}: " in r.stderr and reason in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_firewall_hooks_chains_and_maxelem_reach_the_actions() -> None:
    from forumpulse.detectors.actions import IpsetAction, NftablesAction, build_actions

    cfg = ActionsConfig.model_validate({"nftables": {"enabled": True, "hooks": ["input", "forward", "input"]},
                                        "ipset": {"enabled": True, "iptables_chains": ["INPUT", "DOCKER-USER"],
                                                  "maxelem": 262144}})
    nft, ips = build_actions(cfg)
    assert isinstance(nft, NftablesAction) and nft.hooks == ("input", "forward")
    assert isinstance(ips, IpsetAction) and ips.chains == ("INPUT", "DOCKER-USER") and ips.maxelem == 262144
    default_nft, default_ips = build_actions(ActionsConfig.model_validate(
        {"nftables": {"enabled": True}, "ipset": {"enabled": True}}))
    assert default_nft.hooks == ("input",) and default_ips.chains == ("INPUT",) and default_ips.maxelem == 65536


def test_listen_addresses() -> None:
    assert listen_address("127.0.0.1:8090") == ("127.0.0.1", 8090)
    assert listen_address("[::1]:0") == ("::1", 0)
    assert listen_address("bouncers.example:8090") == ("bouncers.example", 8090)
    ok = ActionsConfig.model_validate({"decision_api": {"enabled": True, "listen": "[::1]:8090", "api_key": "k"}})
    assert ok.decision_api.address() == ("::1", 8090)
    # disabled features keep accepting empty secrets (an unset variable in a compose file)
    ActionsConfig.model_validate({"webhook": {"secret": ""}, "decision_api": {"api_key": ""}})


def _has_ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6(), reason="no IPv6 loopback here")
def test_the_decision_api_serves_on_an_ipv6_address() -> None:
    api = DecisionApiServer(DecisionRegistry(), "k6", "::1", 0).start()
    try:
        req = urllib.request.Request(f"http://[::1]:{api.port}/v1/decisions/stream?startup=true",
                                     headers={"X-Api-Key": "k6"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read()) == {"new": None, "deleted": None}
    finally:
        api.stop()


def test_a_decision_api_port_in_use_is_a_one_line_error_and_exit_1(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        (tmp_path / "fp.yaml").write_text(json.dumps({
            "actions": {"decision_api": {"enabled": True, "listen": f"127.0.0.1:{port}", "api_key": "k"}},
            "detectors": {"live": {"publish_decisions": False}}}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORUMPULSE_")}
        for _ in range(2):  # the segfault after the error came and went with thread timing
            r = subprocess.run([str(EXE), "run", "--dos", "--store", f"chdb:{tmp_path / 'store'}",
                                "--port", "0", "-c", "fp.yaml"], capture_output=True, text=True, timeout=120,
                               cwd=tmp_path, env=env)
            assert r.returncode == 1, (r.returncode, r.stderr)
            assert "Traceback" not in r.stderr
            assert r.stderr.strip().splitlines()[-1] == (
                f"error: the decision API cannot listen on 127.0.0.1:{port} (actions.decision_api.listen): Address "
                "already in use; free the port or choose another address")
