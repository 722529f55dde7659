"""Firewall actions for real, inside network namespaces made by deploy/netns/topology.sh.

Topology per test (TAG-v victim, TAG-a attacker 10.200.N.2, TAG-l legit 10.200.N+1.2, root 10.200.N+2.1):
after the decision, TCP connects from the attacker to a tiny server in the victim fail and the legit namespace
still connects.  Needs root, iproute2, nftables, ipset, iptables and crowdsec-firewall-bouncer: missing tools
FAIL with a message (never skip).  Namespaces are deleted even when a test fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from forumpulse.detectors.actions import ActionError, IpsetAction, NftablesAction
from forumpulse.detectors.decision_api import DecisionApiServer, DecisionRegistry
from forumpulse.detectors.dos import Decision

pytestmark = pytest.mark.netns
TOPO = Path(__file__).resolve().parent.parent / "deploy" / "netns" / "topology.sh"
PY = sys.executable
SERVER = ("import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('0.0.0.0', 8080)); s.listen(64)\nwhile True:\n    c,_=s.accept(); c.sendall(b'ok'); c.close()\n")


def _require() -> None:
    p = subprocess.run(["bash", str(TOPO), "check"], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        pytest.fail("namespace tests need root and tools: " + p.stdout.strip() +
                    " (run deploy/install-system-deps.sh; apt-get install iproute2 nftables ipset iptables)")


class Topo:
    def __init__(self, tag: str, n: int) -> None:
        self.tag, self.n = tag, n
        self.victim, self.attacker, self.legit = f"{tag}-v", f"{tag}-a", f"{tag}-l"
        self.attacker_ip, self.legit_ip = f"10.200.{n}.2", f"10.200.{n + 1}.2"
        self.victim_from_a, self.victim_from_l = f"10.200.{n}.1", f"10.200.{n + 1}.1"
        self.root_ip = f"10.200.{n + 2}.1"
        self.procs: list[subprocess.Popen[bytes]] = []

    def ns(self, name: str, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True,
                              check=False, **kw)  # type: ignore[call-overload]

    def connects(self, src: str, dst: str) -> bool:
        code = f"import socket; c=socket.create_connection(('{dst}', 8080), timeout=1.5); assert c.recv(2)==b'ok'"
        return self.ns(src, PY, "-c", code).returncode == 0


@pytest.fixture
def topo(request: pytest.FixtureRequest) -> Iterator[Topo]:
    _require()
    tag = "fp" + {"test_nftables_action": "n", "test_ipset_action": "i"}.get(request.node.name, "b")
    n = {"fpn": 40, "fpi": 44, "fpb": 48}[tag]
    subprocess.run(["bash", str(TOPO), "down", tag], capture_output=True, check=False)
    t = Topo(tag, n)
    try:
        subprocess.run(["bash", str(TOPO), "up", tag, str(n)], check=True, capture_output=True, text=True)
        t.procs.append(subprocess.Popen(["ip", "netns", "exec", t.victim, PY, "-c", SERVER]))
        for _ in range(50):
            if t.connects(t.legit, t.victim_from_l):
                break
            time.sleep(0.1)
        yield t
    finally:
        for p in t.procs:
            p.kill()
            p.wait()
        subprocess.run(["bash", str(TOPO), "down", tag], capture_output=True, check=False)


def ban(value: str, duration: int = 600) -> Decision:
    return Decision(id="x", created_at=0, decided_at=0, first_seen=0, expires_at=0, site="forum", action="ban",
                    value=value, scope="ip", reason="client_flood", duration_s=duration, mode="enforce",
                    origin="forumpulse", evidence={})


def test_nftables_action(topo: Topo) -> None:
    assert topo.connects(topo.attacker, topo.victim_from_a) and topo.connects(topo.legit, topo.victim_from_l)
    act = NftablesAction(netns=topo.victim)
    act.ban(ban(topo.attacker_ip))
    act.ban(ban("2001:db8::/64"))
    assert topo.attacker_ip in act.elements() and "2001:db8::/64" in act.elements()
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    assert topo.connects(topo.legit, topo.victim_from_l)
    listing = topo.ns(topo.victim, "nft", "list", "set", "inet", "forumpulse", "ban_v4").stdout
    assert "expires" in listing  # per-element timeout
    act.unban(ban(topo.attacker_ip))
    assert topo.connects(topo.attacker, topo.victim_from_a)
    act.ban(ban(topo.attacker_ip, duration=2))
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    time.sleep(3)  # the kernel expires the element on its own
    assert topo.connects(topo.attacker, topo.victim_from_a)
    # the root namespace was not touched
    assert "forumpulse" not in subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout


def test_ipset_action(topo: Topo) -> None:
    act = IpsetAction(netns=topo.victim)
    assert topo.connects(topo.attacker, topo.victim_from_a)
    act.ban(ban(topo.attacker_ip))
    assert topo.attacker_ip in act.members()
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    assert topo.connects(topo.legit, topo.victim_from_l)
    act.unban(ban(topo.attacker_ip))
    assert topo.connects(topo.attacker, topo.victim_from_a)


BOUNCER_CONF = """mode: nftables
pid_dir: {dir}
update_frequency: 1s
daemonize: false
log_mode: stdout
log_level: info
api_url: http://{api}/
api_key: {key}
insecure_skip_verify: false
disable_ipv6: true
deny_action: DROP
deny_log: false
supported_decisions_types:
  - ban
blacklists_ipv4: crowdsec-blacklists
blacklists_ipv6: crowdsec6-blacklists
nftables:
  ipv4:
    enabled: true
    set-only: false
    table: crowdsec
    chain: crowdsec-chain
  ipv6:
    enabled: false
    set-only: false
    table: crowdsec6
    chain: crowdsec6-chain
prometheus:
  enabled: false
  listen_addr: 127.0.0.1
  listen_port: 60601
"""


def test_crowdsec_bouncer_enforces_our_decisions(topo: Topo, tmp_path: Path) -> None:
    exe = shutil.which("crowdsec-firewall-bouncer")
    if exe is None:
        pytest.fail("crowdsec-firewall-bouncer is not installed: apt-get install -y --no-install-recommends "
                    "crowdsec-firewall-bouncer")
    key = "bouncer-test-key-0123456789"
    reg = DecisionRegistry()
    srv = DecisionApiServer(reg, key, host=topo.root_ip, port=0).start()
    conf = tmp_path / "bouncer.yaml"
    conf.write_text(BOUNCER_CONF.format(dir=tmp_path, api=f"{topo.root_ip}:{srv.port}", key=key))
    out = (tmp_path / "bouncer.log").open("w")
    bouncer = subprocess.Popen(["ip", "netns", "exec", topo.victim, exe, "-c", str(conf)], stdout=out,
                               stderr=subprocess.STDOUT)
    topo.procs.append(bouncer)
    try:
        assert topo.connects(topo.attacker, topo.victim_from_a)
        reg.ban(ban(topo.attacker_ip, duration=600))

        def in_set() -> bool:
            r = topo.ns(topo.victim, "nft", "list", "set", "ip", "crowdsec", "crowdsec-blacklists")
            return topo.attacker_ip in r.stdout

        for _ in range(100):
            if in_set() or bouncer.poll() is not None:
                break
            time.sleep(0.2)
        log = (tmp_path / "bouncer.log").read_text()
        assert in_set(), "bouncer did not add the address; its log:\n" + log
        assert not topo.connects(topo.attacker, topo.victim_from_a)
        assert topo.connects(topo.legit, topo.victim_from_l)
        reg.unban(ban(topo.attacker_ip))
        for _ in range(100):
            if not in_set():
                break
            time.sleep(0.2)
        assert not in_set(), "bouncer did not remove the unbanned address"
        assert topo.connects(topo.attacker, topo.victim_from_a)
    finally:
        srv.stop()
        out.close()


# ------------------------------------------------------------------ nft set edge cases (a bare namespace each)


@pytest.fixture
def bare_ns() -> Iterator[str]:
    """An empty network namespace (own nftables ruleset), deleted afterwards."""
    if shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.fail("nftables tests need root, iproute2 and nftables (apt-get install iproute2 nftables)")
    name = "fpnft-t"
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    p = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        pytest.fail("cannot create a network namespace (needs root): " + p.stderr.strip())
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def _expires(ns: str, el: str) -> int:
    import json

    out = subprocess.run(["ip", "netns", "exec", ns, "nft", "-j", "list", "ruleset"], capture_output=True,
                         text=True, check=True).stdout
    for x in json.loads(out)["nftables"]:
        for e in x.get("set", {}).get("elem", []):
            v = e["elem"]["val"]
            v = f"{v['prefix']['addr']}/{v['prefix']['len']}" if isinstance(v, dict) else v
            if v == el:
                return int(e["elem"]["expires"])
    raise AssertionError(f"{el} not in the sets")


def test_nftables_range_ban_over_addresses_already_banned(bare_ns: str) -> None:
    act = NftablesAction(netns=bare_ns)
    act.ban(ban("10.9.1.5"))
    act.ban(ban("10.9.1.6", duration=300))
    act.ban(ban("10.9.2.7"))
    act.ban(ban("2001:db8:1::5"))
    # a range over banned addresses: nft refuses overlapping intervals, so the covered addresses give way
    act.ban(ban("10.9.1.0/24", duration=900))
    act.ban(ban("2001:db8:1::/64", duration=900))
    assert sorted(act.elements()) == ["10.9.1.0/24", "10.9.2.7", "2001:db8:1::/64"]
    assert _expires(bare_ns, "10.9.1.0/24") > 800
    # an address inside a banned range is already enforced by it: no error, the range stays
    act.ban(ban("10.9.1.77"))
    assert sorted(act.elements()) == ["10.9.1.0/24", "10.9.2.7", "2001:db8:1::/64"]
    # a repeat ban of the range refreshes its timeout
    act.ban(ban("10.9.1.0/24", duration=5000))
    assert _expires(bare_ns, "10.9.1.0/24") > 4000
    act.unban(ban("10.9.1.0/24"))
    assert sorted(act.elements()) == ["10.9.2.7", "2001:db8:1::/64"]


def test_nftables_recreates_its_table_after_an_external_flush(bare_ns: str) -> None:
    act = NftablesAction(netns=bare_ns)
    act.ban(ban("10.9.3.1"))
    subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "flush", "ruleset"], check=True)
    act.ban(ban("10.9.3.2"))  # the set is gone: recreated (with its drop chain), and the ban retried once
    assert act.elements() == ["10.9.3.2"]
    chain = subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "list", "chain", "inet", "forumpulse", "input"],
                           capture_output=True, text=True, check=True).stdout
    assert "@ban_v4 drop" in chain


def test_nftables_unban_ignores_only_a_missing_element(bare_ns: str) -> None:
    act = NftablesAction(netns=bare_ns)
    act.unban(ban("10.9.4.1"))  # nothing was ever banned (no table yet): nothing to delete
    act.ban(ban("10.9.4.2"))
    act.unban(ban("10.9.4.1"))  # not in the set
    act.unban(ban("10.9.4.2"))
    act.unban(ban("10.9.4.2"))  # twice
    assert act.elements() == []
    # a set that does not exist in an existing table is a configuration error, not a missing element
    wrong = NftablesAction(set_v4="nosuchset", netns=bare_ns)
    with pytest.raises(ActionError, match="No such file"):
        wrong.unban(ban("10.9.4.2"))
    with pytest.raises(ActionError, match="zone"):
        act.unban(ban("2001:db8::1%eth0"))
