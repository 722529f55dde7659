"""Firewall actions for real, inside network namespaces made by deploy/netns/topology.sh.

Topology per test (TAG-v victim, TAG-a attacker 10.200.N.2, TAG-l legit 10.200.N+1.2, root 10.200.N+2.1, and
TAG-s 10.200.N+3.2, a server the victim routes to): after the decision, TCP connects from the attacker to a tiny
server in the victim fail and the legit namespace still connects; with the forward hook / a DOCKER-USER rule the
same holds for the server behind the victim.  Needs root, iproute2, nftables, ipset, iptables and crowdsec-firewall-bouncer: missing tools
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
from forumpulse.detectors.dos import Candidate, Decision, DecisionManager
from forumpulse.detectors.dos_rules import DosConfig

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
        self.server, self.server_ip = f"{tag}-s", f"10.200.{n + 3}.2"
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
    tag = "fp" + {"test_nftables_action": "n", "test_ipset_action": "i", "test_nftables_forward_hook": "f",
                  "test_ipset_docker_user_chain_and_resize": "d"}.get(request.node.name, "b")
    n = {"fpn": 40, "fpi": 44, "fpb": 48, "fpf": 52, "fpd": 56}[tag]
    subprocess.run(["bash", str(TOPO), "down", tag], capture_output=True, check=False)
    t = Topo(tag, n)
    try:
        subprocess.run(["bash", str(TOPO), "up", tag, str(n)], check=True, capture_output=True, text=True)
        t.procs.append(subprocess.Popen(["ip", "netns", "exec", t.victim, PY, "-c", SERVER]))
        t.procs.append(subprocess.Popen(["ip", "netns", "exec", t.server, PY, "-c", SERVER]))
        for _ in range(50):
            if t.connects(t.legit, t.victim_from_l) and t.connects(t.legit, t.server_ip):
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
    # the attacker's /24 banned and lifted again: the address ban (its own set) still drops it
    net24 = topo.attacker_ip.rsplit(".", 1)[0] + ".0/24"
    act.ban(ban(net24))
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    act.unban(ban(net24))
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    act.unban(ban(topo.attacker_ip))
    assert topo.connects(topo.attacker, topo.victim_from_a)
    act.ban(ban(net24))  # a range alone (its own interval set and rule) drops the address too
    assert not topo.connects(topo.attacker, topo.victim_from_a)
    assert topo.connects(topo.legit, topo.victim_from_l)
    act.unban(ban(net24))
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


def test_nftables_forward_hook(topo: Topo) -> None:
    """hooks: [input, forward] also drops banned sources routed through the host (a container's published port);
    the default input hook does not, and dropping forward from the configuration takes its chain away again."""
    a, s = topo.attacker, topo.server_ip
    assert topo.connects(a, s) and topo.connects(topo.legit, s)
    NftablesAction(netns=topo.victim).ban(ban(topo.attacker_ip))
    assert not topo.connects(a, topo.victim_from_a)
    assert topo.connects(a, s)  # the documented limit of the input hook: forwarded traffic passes
    both = NftablesAction(netns=topo.victim, hooks=("input", "forward"))
    both.ensure()  # adds the forward chain and its rules to the table, keeping the ban
    assert not topo.connects(a, s) and not topo.connects(a, topo.victim_from_a)
    assert topo.connects(topo.legit, s)
    both.ban(ban("10.200.99.0/24"))  # a range set made later gets its rule in both chains
    chains = topo.ns(topo.victim, "nft", "list", "table", "inet", "forumpulse").stdout
    assert chains.count("@ban_v4_24 drop") == 2 and chains.count("@ban_v4 drop") == 2, chains
    again = NftablesAction(netns=topo.victim)  # forward removed from the configuration
    again.ensure()
    assert "chain forward" not in topo.ns(topo.victim, "nft", "list", "table", "inet", "forumpulse").stdout
    assert topo.connects(a, s) and not topo.connects(a, topo.victim_from_a)  # the ban itself was kept
    with pytest.raises(ValueError, match="hooks"):
        NftablesAction(netns=topo.victim, hooks=("output",))


def test_ipset_docker_user_chain_and_resize(topo: Topo) -> None:
    """iptables_chains: [INPUT, DOCKER-USER]: a chain Docker has not made yet is skipped and gets its rule at the
    next check once it exists (ip6tables, without one, is skipped); a set made with the default maxelem is
    resized in place when the setting is raised, keeping its members and its rules' match."""
    a, s = topo.attacker, topo.server_ip
    act = IpsetAction(netns=topo.victim, iptables_chains=("INPUT", "DOCKER-USER"))
    act.ban(ban(topo.attacker_ip))  # DOCKER-USER does not exist yet: no error
    assert not topo.connects(a, topo.victim_from_a) and topo.connects(a, s)
    for cmd in (["iptables", "-N", "DOCKER-USER"], ["iptables", "-I", "FORWARD", "-j", "DOCKER-USER"]):
        assert topo.ns(topo.victim, *cmd).returncode == 0  # what Docker does when it starts
    act.ensure()  # the owner's periodic firewall check
    assert not topo.connects(a, s) and topo.connects(topo.legit, s)
    act.ensure()  # the rule is not added twice
    rules = topo.ns(topo.victim, "iptables", "-S", "DOCKER-USER").stdout
    assert rules.count("--match-set forumpulse4 src -j DROP") == 1, rules
    assert "maxelem 65536" in topo.ns(topo.victim, "ipset", "list", "-t", "forumpulse4").stdout
    big = IpsetAction(netns=topo.victim, iptables_chains=("INPUT", "DOCKER-USER"), maxelem=200_000)
    big.ensure()
    assert "maxelem 200000" in topo.ns(topo.victim, "ipset", "list", "-t", "forumpulse4").stdout
    assert "maxelem 200000" in topo.ns(topo.victim, "ipset", "list", "-t", "forumpulse6").stdout
    assert big.members() == [topo.attacker_ip]
    assert not topo.connects(a, s) and not topo.connects(a, topo.victim_from_a)  # the rules match the new set
    assert "forumpulse4_new" not in topo.ns(topo.victim, "ipset", "list", "-n").stdout
    small = IpsetAction(netns=topo.victim, iptables_chains=("INPUT", "DOCKER-USER"), maxelem=1)
    small.ensure()  # lowering it keeps the larger set (a set fuller than the bound cannot be refilled)
    small.ban(ban("10.200.99.7"))  # and bans go on working
    assert "maxelem 200000" in topo.ns(topo.victim, "ipset", "list", "-t", "forumpulse4").stdout
    small.unban(ban("10.200.99.7"))
    big.unban(ban(topo.attacker_ip))
    assert topo.connects(a, s) and topo.connects(a, topo.victim_from_a)


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


def _manager(*actions: object) -> DecisionManager:
    return DecisionManager(DosConfig(crawlers={"verify": "off"}), actions=list(actions))  # type: ignore[arg-type]


def _cand(value: str, at: int, duration: int) -> Candidate:
    return Candidate(rule="prefix_flood" if "/" in value else "client_flood", value=value,
                     scope="range" if "/" in value else "ip", decided_at=at, first_seen=at, duration_s=duration,
                     evidence={})


def test_nftables_address_and_range_bans_are_independent(bare_ns: str) -> None:
    """An address ban and a range over it are separate elements of separate sets: lifting or expiring one never
    frees the other (the range used to replace the address, or the address was left to the range, while the
    manager and the registry still held the address ban as active and refused to ban it again)."""
    t0 = 1_700_000_000_000
    act, reg = NftablesAction(netns=bare_ns), DecisionRegistry()
    mgr = _manager(reg, act)
    # address first (1 h), then a range over it (10 min), then the range is lifted
    mgr.submit(_cand("198.51.100.7", t0, 3600))
    mgr.submit(_cand("198.51.100.0/24", t0 + 1000, 600))
    assert sorted(act.elements()) == ["198.51.100.0/24", "198.51.100.7"]
    mgr.unban("198.51.100.0/24")
    # range first, an address inside it later, the range is lifted
    mgr.submit(_cand("203.0.113.0/24", t0 + 2000, 600))
    mgr.submit(_cand("203.0.113.9", t0 + 3000, 3600))
    assert sorted(act.elements()) == ["198.51.100.7", "203.0.113.0/24", "203.0.113.9"]
    mgr.unban("203.0.113.0/24")
    assert sorted(act.elements()) == sorted(mgr.active) == sorted(reg.active) == ["198.51.100.7", "203.0.113.9"]
    assert mgr.action_errors == 0
    # a range that ends on its own (kernel timeout) before the address inside it
    mgr.submit(_cand("192.0.2.0/24", t0 + 4000, 2))
    mgr.submit(_cand("192.0.2.5", t0 + 5000, 3600))
    time.sleep(3)
    assert sorted(act.elements()) == ["192.0.2.5", "198.51.100.7", "203.0.113.9"]
    assert _expires(bare_ns, "192.0.2.5") > 3500
    # IPv6 too
    act.ban(ban("2001:db8:1::5", duration=3600))
    act.ban(ban("2001:db8:1::/64", duration=60))
    act.unban(ban("2001:db8:1::/64"))
    assert "2001:db8:1::5" in act.elements() and "2001:db8:1::/64" not in act.elements()
    # the address sets are plain hash sets; ranges go to interval sets, one per prefix length
    listing = subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "list", "table", "inet", "forumpulse"],
                             capture_output=True, text=True, check=True).stdout
    for s in ("@ban_v4 drop", "@ban_v6 drop", "@ban_v4_24 drop", "@ban_v6_64 drop"):
        assert s in listing, listing


def test_nftables_nested_ranges_are_independent_too(bare_ns: str) -> None:
    """A manual /16 and a detected /24 inside it (different prefix lengths) are in different sets, so neither
    gives way to the other; a repeat ban refreshes an element's timeout."""
    act = NftablesAction(netns=bare_ns)
    act.ban(ban("10.9.1.0/24", duration=900))
    act.ban(ban("10.9.0.0/16", duration=2))
    act.ban(ban("10.8.0.0/16", duration=900))
    act.ban(ban("10.8.1.0/24", duration=900))
    act.ban(ban("10.8.1.5", duration=900))
    assert sorted(act.elements()) == ["10.8.0.0/16", "10.8.1.0/24", "10.8.1.5", "10.9.0.0/16", "10.9.1.0/24"]
    act.unban(ban("10.8.0.0/16"))
    time.sleep(3)  # 10.9.0.0/16 expires in the kernel
    assert sorted(act.elements()) == ["10.8.1.0/24", "10.8.1.5", "10.9.1.0/24"]
    assert _expires(bare_ns, "10.9.1.0/24") > 800
    act.ban(ban("10.9.1.0/24", duration=5000))
    assert _expires(bare_ns, "10.9.1.0/24") > 4000
    act.ban(ban("10.8.1.5", duration=5000))
    assert _expires(bare_ns, "10.8.1.5") > 4000
    # unbanning a prefix length never banned (its set does not exist) is not an error
    act.unban(ban("10.7.0.0/20"))
    act.unban(ban("10.8.1.0/24"))
    act.unban(ban("10.8.1.5"))
    assert act.elements() == ["10.9.1.0/24"]


def test_nftables_recreates_its_table_after_an_external_flush(bare_ns: str) -> None:
    """After ``nft flush ruleset`` (a firewall reload) the next ban or unban re-creates the table and puts back
    every ban it recorded that is still in force, with the time it has left (it used to put back only the ban
    that noticed, while the manager held the others as active and refused to ban them again)."""
    t0 = 1_700_000_000_000
    act = NftablesAction(netns=bare_ns)
    mgr = _manager(act)
    mgr.submit(_cand("198.51.100.1", t0, 3600))
    mgr.submit(_cand("198.51.100.2", t0 + 1, 600))
    mgr.submit(_cand("203.0.113.0/24", t0 + 2, 1800))
    mgr.submit(_cand("2001:db8:2::/64", t0 + 3, 1800))
    mgr.submit(_cand("198.51.100.9", t0 + 4, 2))  # ends before the flush is noticed: not put back
    mgr.unban("198.51.100.2")  # lifted: not put back
    time.sleep(2.5)
    flush = ["ip", "netns", "exec", bare_ns, "nft", "flush", "ruleset"]
    subprocess.run(flush, check=True)
    mgr.submit(_cand("198.51.100.3", t0 + 5, 600))
    assert sorted(act.elements()) == ["198.51.100.1", "198.51.100.3", "2001:db8:2::/64", "203.0.113.0/24"]
    assert 3500 < _expires(bare_ns, "198.51.100.1") <= 3598
    assert 1700 < _expires(bare_ns, "203.0.113.0/24") <= 1798
    chain = subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "list", "chain", "inet", "forumpulse", "input"],
                           capture_output=True, text=True, check=True).stdout
    for s in ("@ban_v4 drop", "@ban_v6 drop", "@ban_v4_24 drop", "@ban_v6_64 drop"):
        assert s in chain
    # an unban notices too
    subprocess.run(flush, check=True)
    mgr.unban("198.51.100.3")
    assert sorted(act.elements()) == ["198.51.100.1", "2001:db8:2::/64", "203.0.113.0/24"]
    assert mgr.action_errors == 0


def test_nftables_long_and_hand_added_elements_do_not_block_later_bans(bare_ns: str) -> None:
    """A ban of 200,000,000 s (~6 years: no config caps it) and an element an operator added by hand without a
    timeout: nft 1.0.6 refuses ``timeout 100000000s`` and more ("value too large"), and one refused element
    rejected the whole transaction -- the long ban itself, every later ban and, after a flush, the re-created
    table with every ban (found in a review).  Timeouts are now written in days (capped at 10 years)."""
    act = NftablesAction(netns=bare_ns)
    act.ban(ban("198.51.100.50", 200_000_000))
    act.ban(ban("198.51.100.60"))
    subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "add", "element", "inet", "forumpulse", "ban_v4",
                    "{ 192.0.2.9 }"], check=True)
    act.ensure()  # the periodic firewall check adopts what is in its sets
    subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "flush", "ruleset"], check=True)
    act.ban(ban("198.51.100.61"))  # notices the flush: re-creates the table with every ban it knows of
    assert sorted(act.elements()) == ["192.0.2.9", "198.51.100.50", "198.51.100.60", "198.51.100.61"]
    assert 199_999_000 < _expires(bare_ns, "198.51.100.50") <= 200_000_000
    assert 3649 * 86_400 < _expires(bare_ns, "192.0.2.9") <= 3650 * 86_400  # adopted: written back for 10 years


def test_nftables_rebuilds_a_table_of_the_older_layout(bare_ns: str) -> None:
    """A table left by a version with one interval set per family is rebuilt (one transaction), its elements
    carried over with their time left."""
    old = ("table inet forumpulse {\n"
           "  set ban_v4 { type ipv4_addr; flags interval, timeout; elements = { 10.9.2.7 timeout 900s, "
           "10.9.1.0/24 timeout 600s } }\n"
           "  set ban_v6 { type ipv6_addr; flags interval, timeout; }\n"
           "  chain input { type filter hook input priority -10; policy accept;\n"
           "    ip saddr @ban_v4 drop\n    ip6 saddr @ban_v6 drop\n  }\n}\n")
    subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "-f", "-"], input=old, text=True, check=True)
    act = NftablesAction(netns=bare_ns)
    act.ban(ban("10.9.1.5", duration=300))
    assert sorted(act.elements()) == ["10.9.1.0/24", "10.9.1.5", "10.9.2.7"]
    assert 800 < _expires(bare_ns, "10.9.2.7") <= 900 and 500 < _expires(bare_ns, "10.9.1.0/24") <= 600
    act.unban(ban("10.9.1.0/24"))
    assert sorted(act.elements()) == ["10.9.1.5", "10.9.2.7"]


def test_nftables_unban_ignores_only_a_missing_element(bare_ns: str) -> None:
    act = NftablesAction(netns=bare_ns)
    act.unban(ban("10.9.4.1"))  # nothing was ever banned (no table yet): nothing to delete, nothing created
    assert subprocess.run(["ip", "netns", "exec", bare_ns, "nft", "list", "ruleset"], capture_output=True,
                          text=True, check=True).stdout.strip() == ""
    act.ban(ban("10.9.4.2"))
    act.unban(ban("10.9.4.1"))  # not in the set
    act.unban(ban("10.9.4.2"))
    act.unban(ban("10.9.4.2"))  # twice
    act.unban(ban("10.9.0.0/16"))  # no /16 was ever banned: no such set
    assert act.elements() == []
    # anything else is raised, e.g. a namespace that does not exist ("Cannot open network namespace ...: No such
    # file or directory", which the unban used to take for a missing table)
    with pytest.raises(ActionError, match="network namespace"):
        NftablesAction(netns="fpnft-nosuch").unban(ban("10.9.4.2"))
    with pytest.raises(ActionError, match="zone"):
        act.unban(ban("2001:db8::1%eth0"))


def _ipset_timeout(ns: str, s: str, el: str) -> int:
    for line in subprocess.run(["ip", "netns", "exec", ns, "ipset", "save", s], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if parts[:3] == ["add", s, el]:
            return int(parts[parts.index("timeout") + 1])
    raise AssertionError(f"{el} not in {s}")


def test_ipset_address_and_range_are_separate_entries(bare_ns: str) -> None:
    """hash:net keeps each prefix length apart: lifting a range leaves the address inside it, and the other way
    round (the nftables overlap problem does not arise with ipset)."""
    act = IpsetAction(netns=bare_ns)
    act.ban(ban("10.9.5.5", duration=3600))
    act.ban(ban("10.9.5.0/24", duration=600))
    act.ban(ban("10.9.0.0/16", duration=600))
    act.unban(ban("10.9.5.0/24"))
    assert sorted(act.members()) == ["10.9.0.0/16", "10.9.5.5"]
    act.ban(ban("10.9.6.0/24", duration=600))
    act.unban(ban("10.9.5.5"))
    act.unban(ban("10.9.0.0/16"))
    assert act.members() == ["10.9.6.0/24"]


def test_ipset_ban_longer_than_ipsets_maximum_timeout(bare_ns: str) -> None:
    """ipset refuses timeouts over 2147483 s: a 30-day ban used to fail, stay in the action's record and make
    every later ``ipset restore`` (a firewall reload, the periodic check) fail, so later bans were lost too."""
    act = IpsetAction(iptables_rule=False, netns=bare_ns)
    act.ban(ban("198.51.100.1", duration=30 * 86_400))
    assert 2_147_000 < _ipset_timeout(bare_ns, "forumpulse4", "198.51.100.1") <= 2_147_483
    subprocess.run(["ip", "netns", "exec", bare_ns, "ipset", "destroy"], check=True)
    act.ban(ban("198.51.100.2", duration=600))  # the sets are re-created with the long ban in one restore
    act.ensure()
    assert sorted(act.members()) == ["198.51.100.1", "198.51.100.2"]


def test_ipset_recreates_its_sets_after_a_firewall_reload(bare_ns: str) -> None:
    """A reload that deletes the rules and destroys the sets: the next ban (or unban) creates them again and
    puts back every recorded ban still in force with its time left (a ban used to fail from then on)."""
    act = IpsetAction(netns=bare_ns)
    act.ban(ban("198.51.100.1", duration=3600))
    act.ban(ban("203.0.113.0/24", duration=1800))
    act.ban(ban("2001:db8:3::/64", duration=1800))
    act.ban(ban("198.51.100.2", duration=600))
    act.unban(ban("198.51.100.2"))

    def reload() -> None:
        for cmd in (["iptables", "-F", "INPUT"], ["ip6tables", "-F", "INPUT"], ["ipset", "destroy"]):
            subprocess.run(["ip", "netns", "exec", bare_ns, *cmd], check=True)

    reload()
    act.ban(ban("198.51.100.3", duration=600))
    assert sorted(act.members()) == ["198.51.100.1", "198.51.100.3", "2001:db8:3::/64", "203.0.113.0/24"]
    assert 3500 < _ipset_timeout(bare_ns, "forumpulse4", "198.51.100.1") <= 3600
    for tool, s in (("iptables", "forumpulse4"), ("ip6tables", "forumpulse6")):
        rules = subprocess.run(["ip", "netns", "exec", bare_ns, tool, "-S", "INPUT"], capture_output=True,
                               text=True, check=True).stdout
        assert f"--match-set {s} src -j DROP" in rules
    reload()
    act.unban(ban("198.51.100.3"))
    assert sorted(act.members()) == ["198.51.100.1", "2001:db8:3::/64", "203.0.113.0/24"]
    # with nothing recorded, an unban of a set that does not exist has nothing to lift
    subprocess.run(["ip", "netns", "exec", bare_ns, "iptables", "-F", "INPUT"], check=True)
    subprocess.run(["ip", "netns", "exec", bare_ns, "ip6tables", "-F", "INPUT"], check=True)
    subprocess.run(["ip", "netns", "exec", bare_ns, "ipset", "destroy"], check=True)
    IpsetAction(netns=bare_ns).unban(ban("198.51.100.1"))


def test_the_owner_puts_flushed_bans_back_without_waiting_for_a_ban(bare_ns: str, tmp_path: Path) -> None:
    """The owner's periodic firewall check (``detectors.live.firewall_check_s``): after a firewall reload
    (``nft flush ruleset``) or an emptied set under an intact table -- which no later ban would notice --
    every ban in force is back in the kernel."""
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.live_detect import LiveDos
    from forumpulse.pipeline.store import migrate, open_store

    settings = load_settings()
    store = open_store(f"chdb:{tmp_path / 'db'}")
    try:
        migrate(store, {"raw_ttl_days": 0, "rollup_ttl_days": 0, "quarantine_ttl_days": 0, "stats_ttl_days": 0})
        act = NftablesAction(netns=bare_ns)
        live = LiveDos(settings, store, actions=[act], publish=False)
        now = int(time.time() * 1000)
        with live.lock:
            for i, v in enumerate(("198.51.100.1", "203.0.113.0/24", "2001:db8::5")):
                assert live.manager.submit(_cand(v, now + i, 3600)) is not None
        want = ["198.51.100.1", "2001:db8::5", "203.0.113.0/24"]
        assert sorted(act.elements()) == want
        nft = ["ip", "netns", "exec", bare_ns, "nft"]
        subprocess.run([*nft, "flush", "ruleset"], check=True)
        assert live.check_firewall() == 0 and sorted(act.elements()) == want
        subprocess.run([*nft, "flush", "set", "inet", "forumpulse", "ban_v4"], check=True)
        assert sorted(act.elements()) == ["2001:db8::5", "203.0.113.0/24"]
        assert live.check_firewall() == 0 and sorted(act.elements()) == want
        assert (live.firewall_checks, live.firewall_check_errors) == (2, 0)
        live.close()
    finally:
        store.close()
