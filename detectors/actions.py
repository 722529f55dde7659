"""Out-of-band enforcement of DoS decisions: nftables set, ipset, signed webhook.

Every action validates the decision value with :mod:`ipaddress` and builds its command from the parsed
object (``str(ip_network)``), never from log text; commands run as argument lists (no shell).  Set elements
carry per-element timeouts, so bans expire in the kernel even if forumpulse stops.

``netns`` (nftables/ipset): run the command inside that network namespace (``ip netns exec NS ...``); used by
the namespace tests, ``None`` in production.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import queue
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from forumpulse.detectors.dos import Decision, canonical_network, never_ban_reason
from forumpulse.pipeline.runtime import error_line

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")
_CHAIN = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,28}$")  # an iptables chain name (at most 29 characters)
#: how many undelivered webhook decisions a give-up at exit names in its log line
_LOG_DROPPED = 20


class ActionError(RuntimeError):
    pass


def parse_value(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """Strictly parse a decision value (address or CIDR) into its canonical network
    (:func:`~forumpulse.detectors.dos.canonical_network`: IPv4-mapped IPv6 becomes IPv4; scoped IPv6 such as
    ``fe80::1%eth0`` and whole families are refused).  Raises ActionError."""
    try:
        return canonical_network(value)
    except ValueError as exc:
        raise ActionError(str(exc)) from None


def ban_target(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """:func:`parse_value`, and refuse what must never be banned (loopback, unspecified, link-local, multicast;
    :func:`~forumpulse.detectors.dos.never_ban_reason`) even when a decision did not come through the manager
    (restored from the table, made by hand).  Unbans use :func:`parse_value`, so an old such ban can be lifted."""
    net = parse_value(value)
    reason = never_ban_reason(net)
    if reason is not None:
        raise ActionError(f"refusing to ban {net}: {reason} addresses are never banned")
    return net


def _name(v: str) -> str:
    if not _NAME.fullmatch(v):
        raise ActionError(f"bad table/set name {v!r}")
    return v


def _ns_prefix(netns: str | None) -> list[str]:
    if netns is None:
        return []
    if not _NAME.fullmatch(netns):
        raise ActionError(f"bad namespace name {netns!r}")
    return ["ip", "netns", "exec", netns]


def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    if shutil.which(argv[0]) is None:
        raise ActionError(f"{argv[0]} is not installed (apt-get install nftables ipset iptables iproute2)")
    p = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30, check=False)
    if p.returncode != 0:
        raise ActionError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def _element(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    full = net.prefixlen == net.max_prefixlen
    return str(net.network_address) if full else str(net)


_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


class _Held:
    """What an action added and has not lifted: element -> (network, wall-clock expiry).  Expired entries are
    dropped when read.  The action's own account of its bans, independent of the kernel's: when the kernel loses
    them (``nft flush ruleset``, a firewall reload, ``ipset destroy``) the action puts back those still in force
    with the time they have left."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._d: dict[str, tuple[_Net, float]] = {}

    def put(self, net: _Net, secs: int) -> None:
        self._d[_element(net)] = (net, self.clock() + secs)
        if len(self._d) % 4096 == 0:
            self.in_force()  # drop expired entries now and then, so a long run's record does not only grow

    def adopt(self, net: _Net, secs: int) -> None:
        """Record an element found in the kernel (an earlier run's ban) unless it is already recorded."""
        if _element(net) not in self._d:
            self.put(net, secs)

    def drop(self, net: _Net) -> None:
        self._d.pop(_element(net), None)

    def clear(self) -> None:
        self._d.clear()

    def in_force(self) -> list[tuple[_Net, int]]:
        """(network, whole seconds left) of every element still in force (at least 1 s left)."""
        now = self.clock()
        for k in [k for k, (_, exp) in self._d.items() if exp - now < 1]:
            del self._d[k]
        return [(net, int(exp - now)) for net, exp in self._d.values()]

    def __len__(self) -> int:
        return len(self.in_force())


#: the nftables hooks a ban can filter: traffic delivered to this host, and traffic routed through it
NFT_HOOKS = ("input", "forward")


class NftablesAction:
    """``table inet T``: addresses in plain sets ``ban_v4``/``ban_v6`` (``flags timeout``), ranges in interval sets
    ``ban_v4_<len>``/``ban_v6_<len>``, one per prefix length in use (``flags interval, timeout``), and one base
    chain per hook in ``hooks`` -- ``input`` (traffic to this host, the default) and/or ``forward`` (traffic routed
    through it: a web server in Docker with published ports, whose packets are DNATed in prerouting and then
    forwarded, so the client's address is still the source there) -- each named after its hook, with one drop
    rule per set.

    Prefixes of one length are equal or disjoint, so no set ever holds overlapping elements (nft refuses them in
    an interval set), and an address ban, a range over it and a range of another length over both are separate
    elements: lifting or expiring one never touches another.  A range set and its rule are created with the
    first range of that length.

    ``ensure()`` makes the table match that layout (lazily, at the first ban or unban): it creates what is missing;
    a table of another layout (an older forumpulse's single interval set, a changed hook priority, a set without
    its rule, a chain whose hook is no longer configured) is rebuilt in one transaction with its elements carried over.  The action records what it added
    (element -> wall-clock expiry, forgotten on unban or expiry); when a ban or unban finds the table gone (``nft
    flush ruleset``, a firewall reload) it is re-created and every recorded ban still in force is added back with
    the time it has left.  The action has no background check of its own: the re-creation happens at the next ban
    or unban, or when the owner's periodic check (``LiveDos.check_firewall``, ``detectors.live.firewall_check_s``)
    calls ``ensure()``.
    """

    name = "nftables"
    #: the kernel set is lost on reboot: the owner re-applies bans still in force when it restarts
    reapply_on_restore = True

    def __init__(self, table: str = "forumpulse", set_v4: str = "ban_v4", set_v6: str = "ban_v6",
                 hook_priority: int = -10, netns: str | None = None, clock: Callable[[], float] = time.time,
                 hooks: Sequence[str] = ("input",)) -> None:
        self.table, self.set_v4, self.set_v6 = _name(table), _name(set_v4), _name(set_v6)
        self.prio = int(hook_priority)
        self.hooks = tuple(dict.fromkeys(hooks))
        if not self.hooks or any(h not in NFT_HOOKS for h in self.hooks):
            raise ValueError(f"nftables hooks must be some of {', '.join(NFT_HOOKS)}, got {list(hooks)}")
        self.pre = _ns_prefix(netns)
        self.held = _Held(clock)
        self._ready = False
        self._range_sets: set[str] = set()  # range sets known to exist (with their rule)
        self._lock = threading.RLock()

    def _nft(self, script: str) -> str:
        return _run([*self.pre, "nft", "-f", "-"], stdin=script)

    # -- layout ---------------------------------------------------------------------------------------
    def _set(self, net: _Net) -> str:
        base = self.set_v4 if net.version == 4 else self.set_v6
        return base if net.prefixlen == net.max_prefixlen else f"{base}_{net.prefixlen}"

    def _ours(self, name: str) -> tuple[int, int] | None:
        """(family, prefix length) if ``name`` is one of this action's sets, else None."""
        if name in (self.set_v4, self.set_v6):
            return (4, 32) if name == self.set_v4 else (6, 128)
        for version, base, top in ((4, self.set_v4, 32), (6, self.set_v6, 128)):
            if name.startswith(base + "_") and name[len(base) + 1:].isdigit():
                n = int(name[len(base) + 1:])
                if 1 <= n < top and str(n) == name[len(base) + 1:]:
                    return version, n
        return None

    def _set_decl(self, name: str) -> str:
        version, plen = self._ours(name)  # type: ignore[misc]
        typ = "ipv4_addr" if version == 4 else "ipv6_addr"
        flags = "timeout" if plen == (32 if version == 4 else 128) else "interval, timeout"
        return f"{{ type {typ}; flags {flags}; }}"

    def _rule(self, name: str) -> str:
        version, _ = self._ours(name)  # type: ignore[misc]
        return f"{'ip' if version == 4 else 'ip6'} saddr @{name} drop"

    def _state(self) -> dict[str, Any] | None:
        """The table as nft lists it (None: no such table): ``sets`` name -> (type, flags, {element: seconds
        left}), ``chains`` chain name (``input``, ``forward``) -> its description, ``rules`` chain name -> the set
        names its rules refer to."""
        try:
            out = _run([*self.pre, "nft", "-j", "list", "table", "inet", self.table])
        except ActionError as exc:
            # nft 1.0.6: "Error: No such file or directory" under "list table inet T" (a missing network
            # namespace says "Cannot open network namespace ...: No such file or directory", without "Error:")
            if "Error: No such file or directory" in str(exc):
                return None
            raise
        sets: dict[str, tuple[str, list[str], dict[_Net, int]]] = {}
        chains: dict[str, dict[str, Any]] = {}
        rules: dict[str, set[str]] = {}
        for x in json.loads(out).get("nftables", []):
            if "set" in x:
                s = x["set"]
                sets[s["name"]] = (s.get("type"), sorted(s.get("flags", [])), _elements(s))
            elif "chain" in x and x["chain"].get("name") in NFT_HOOKS:
                chains[x["chain"]["name"]] = x["chain"]
            elif "rule" in x and x["rule"].get("chain") in NFT_HOOKS:
                rules.setdefault(x["rule"]["chain"], set()).update(
                    re.findall(r'"@([A-Za-z0-9_-]+)"', json.dumps(x["rule"].get("expr", []))))
        return {"sets": sets, "chains": chains, "rules": rules}

    def _wrong(self, st: dict[str, Any]) -> str | None:
        """Why the listed table cannot be kept as it is (None: it can; missing sets or rules are just added)."""
        for name, c in sorted(st["chains"].items()):
            if name not in self.hooks:
                return f"chain {name} is there but hooks are {', '.join(self.hooks)} (configuration changed)"
            if (c.get("type"), c.get("hook"), c.get("prio")) != ("filter", name, self.prio):
                return f"chain {name} is not a filter hook {name} priority {self.prio} chain"
        for name, (typ, flags, _) in st["sets"].items():
            ours = self._ours(name)
            if ours is None:
                continue
            version, plen = ours
            want = ["timeout"] if plen == (32 if version == 4 else 128) else ["interval", "timeout"]
            if typ != ("ipv4_addr" if version == 4 else "ipv6_addr") or flags != want:
                return f"set {name} is {typ} with flags {','.join(flags) or 'none'} (an older layout?)"
        return None

    def ensure(self) -> None:
        """Make the table match the layout and hold every recorded ban still in force (one transaction)."""
        with self._lock:
            st = self._state()
            script: list[str] = []
            present: dict[str, set[str]] = {}
            ruled: dict[str, set[str]] = {}
            if st is not None:
                # adopt what is in our sets: an earlier run's bans, or an older layout's elements to carry over
                for name, (_, _, elems) in st["sets"].items():
                    if self._ours(name) is not None:
                        for net, left in elems.items():
                            if left >= 1:
                                self.held.adopt(net, left)
                why = self._wrong(st)
                if why is not None:
                    log.warning("nftables: rebuilding table inet %s with its %d ban(s): %s", self.table,
                                len(self.held), why)
                    script.append(f"delete table inet {self.table}\n")
                    st = None
                else:
                    present = {n: {_element(e) for e in v[2]} for n, v in st["sets"].items() if self._ours(n)}
                    ruled = st["rules"]
            if st is None:
                script.append(f"add table inet {self.table}\n")
            for hook in self.hooks:
                if st is None or hook not in st["chains"]:
                    script.append(f"add chain inet {self.table} {hook} {{ type filter hook {hook} priority "
                                  f"{self.prio}; policy accept; }}\n")
            held = self.held.in_force()
            names = {self.set_v4, self.set_v6, *present, *self._range_sets, *(self._set(n) for n, _ in held)}
            for name in sorted(names, key=lambda n: (n not in (self.set_v4, self.set_v6), n)):
                if name not in present:
                    script.append(f"add set inet {self.table} {name} {self._set_decl(name)}\n")
                    present[name] = set()
                for hook in self.hooks:
                    if name not in ruled.get(hook, ()):
                        script.append(f"add rule inet {self.table} {hook} {self._rule(name)}\n")
            for net, left in held:
                if _element(net) not in present[self._set(net)]:
                    script.append(f"add element inet {self.table} {self._set(net)} "
                                  f"{{ {_element(net)} timeout {_nft_timeout(left)} }}\n")
            if script:
                self._nft("".join(script))
            self._range_sets = {n for n in present if n not in (self.set_v4, self.set_v6)}
            self._ready = True

    # -- bans -----------------------------------------------------------------------------------------
    def ban(self, d: Decision) -> None:
        net = ban_target(d.value)
        secs = max(1, int(d.duration_s))
        with self._lock:
            self.held.put(net, secs)
            if not self._ready or (net.prefixlen < net.max_prefixlen and self._set(net) not in self._range_sets):
                self.ensure()  # also adds this ban (it is recorded), creating its range set if need be
            try:
                self._add(net, secs)
            except ActionError as exc:
                # the table or a set may have gone since ensure() (nft flush ruleset, a firewall reload): _ready
                # was a guess.  Re-create them with every recorded ban still in force and retry once; a second
                # failure is a real error.
                log.warning("nftables ban of %s failed (%s); re-creating table %s with %d recorded ban(s) and "
                            "retrying once", net, error_line(exc), self.table, len(self.held))
                self._ready = False
                self.ensure()
                self._add(net, secs)

    def _add(self, net: _Net, secs: int) -> None:
        el, st = _element(net), self._set(net)
        # delete+add in one transaction so a repeat ban refreshes the timeout (add keeps the old one)
        t = _nft_timeout(secs)
        self._nft(f"add element inet {self.table} {st} {{ {el} timeout {t} }}\n"
                  f"delete element inet {self.table} {st} {{ {el} }}\n"
                  f"add element inet {self.table} {st} {{ {el} timeout {t} }}\n")

    def unban(self, d: Decision) -> None:
        """Delete the element from its own set (no other ban is touched).  Not an error: an element that is not
        there, a range length never banned (no set), no table at all with nothing recorded.  A table that is
        gone while bans are recorded is re-created with them.  Anything else is raised."""
        net = parse_value(d.value)
        with self._lock:
            if not self._ready:
                st = self._state()
                if st is None and not len(self.held):
                    return  # nothing was ever banned here
                self.ensure()  # adopts an earlier run's bans, migrates an older layout
            self.held.drop(net)
            el, s = _element(net), self._set(net)
            try:
                # add+delete in one transaction: removes the element whether or not it is there, so "it was not
                # there" needs no matching of nft's wording
                self._nft(f"add element inet {self.table} {s} {{ {el} timeout 1s }}\n"
                          f"delete element inet {self.table} {s} {{ {el} }}\n")
                return
            except ActionError as exc:
                if "No such file or directory" not in str(exc):
                    raise
                err = exc
            st = self._state()  # which is missing: the table, the set?
            if st is not None and s in st["sets"]:
                raise err
            if st is not None and s not in (self.set_v4, self.set_v6) and s not in self._range_sets:
                return  # a prefix length never banned: nothing to delete
            if len(self.held):
                log.warning("nftables unban of %s: table %s or set %s is gone; re-creating it with %d recorded "
                            "ban(s)", net, self.table, s, len(self.held))
            self._ready = False
            self._range_sets.discard(s)
            if st is not None or len(self.held):
                self.ensure()

    # -- inspection -----------------------------------------------------------------------------------
    def elements(self) -> list[str]:
        """Current elements of all this action's sets (addresses/CIDRs as text)."""
        st = self._state()
        if st is None:
            return []
        return [_element(n) for name, (_, _, elems) in st["sets"].items() if self._ours(name) for n in elems]

    def remove(self) -> None:
        with self._lock:
            self._nft(f"delete table inet {self.table}\n")
            self.held.clear()
            self._range_sets = set()
            self._ready = False


def _elements(s: dict[str, Any]) -> dict[_Net, int]:
    """Elements of a set listed by ``nft -j`` as networks -> seconds left (no timeout: a large number)."""
    out: dict[_Net, int] = {}
    for el in s.get("elem", []):
        inner = el.get("elem", {}) if isinstance(el, dict) else {}
        v = inner.get("val", el) if isinstance(el, dict) else el
        if isinstance(v, dict) and "prefix" in v:
            v = f"{v['prefix']['addr']}/{v['prefix']['len']}"
        try:
            net = ipaddress.ip_network(str(v), strict=False)
        except ValueError:
            continue  # an interval that is no prefix (added by hand): not ours
        exp = inner.get("expires")
        out[net] = int(exp) if exp is not None else 2**31
    return out


#: the longest element timeout ipset accepts (seconds, about 24.8 days); a longer ban is added with this and put
#: back by a later ``ensure()`` (the periodic firewall check) once the kernel has dropped it while still in force
IPSET_MAX_TIMEOUT = 2_147_483


class IpsetAction:
    """``hash:net`` ipsets with default timeout support, plus (optionally) iptables INPUT DROP rules for them.

    ``hash:net`` keeps every prefix length apart (an address and a range over it are two entries, deleting one
    leaves the other), so the nftables overlap problem does not arise here.  Like :class:`NftablesAction` the
    action records what it added; when a ban or unban finds a set gone (``ipset destroy`` in a firewall reload)
    it creates the sets and rules again and puts back every recorded ban still in force with its time left.

    ipset refuses element timeouts over ``IPSET_MAX_TIMEOUT`` (2147483 s, about 24.8 days): a longer ban is added
    with that timeout, and the record keeps its real end, so the next ``ensure()`` after the kernel dropped it
    (the owner's periodic firewall check) adds it again for the time it has left.
    """

    name = "ipset"
    reapply_on_restore = True

    def __init__(self, set_v4: str = "forumpulse4", set_v6: str = "forumpulse6", iptables_rule: bool = True,
                 netns: str | None = None, clock: Callable[[], float] = time.time,
                 iptables_chains: Sequence[str] = ("INPUT",), maxelem: int = 65536) -> None:
        self.set_v4, self.set_v6 = _name(set_v4), _name(set_v6)
        self.iptables_rule = iptables_rule
        self.chains = tuple(dict.fromkeys(iptables_chains))
        if not self.chains or not all(_CHAIN.fullmatch(c) for c in self.chains):
            raise ActionError(f"bad iptables chain name(s) {list(iptables_chains)}")
        self.maxelem = int(maxelem)
        if not 1 <= self.maxelem <= 2**31 - 1:
            raise ActionError(f"maxelem must be 1..{2**31 - 1}, got {maxelem}")
        self._warned: set[tuple[str, str]] = set()  # (tool, missing chain) / (set, "shrink"): warned about once
        self.pre = _ns_prefix(netns)
        self.held = _Held(clock)
        self._ready = False
        self._lock = threading.RLock()

    def ensure(self) -> None:
        """Create the sets (and rules) if missing, adopt their members into the record and add every recorded
        ban still in force that is missing (``ipset restore``, one call)."""
        with self._lock:
            for s, family in ((self.set_v4, "inet"), (self.set_v6, "inet6")):
                self._create(s, family)
            if self.iptables_rule:
                for tool, s in (("iptables", self.set_v4), ("ip6tables", self.set_v6)):
                    for chain in self.chains:
                        self._rule(tool, chain, s)
            present = self._members()
            for net, left in present.items():
                self.held.adopt(net, left)
            missing = [(net, left) for net, left in self.held.in_force() if net not in present]
            if missing:
                self._restore(missing)
            self._ready = True

    def _create(self, name: str, family: str) -> None:
        """Create the set unless it exists with these parameters.  One that exists with a smaller ``maxelem``
        (the default 65,536 before the setting was raised) is enlarged in place: a new set is filled with its
        members and swapped in (``ipset swap``), so the iptables rules, which refer to the set and not its name,
        keep matching and no ban is off for a moment.  A larger one is kept as it is (with one warning)."""
        create = ["hash:net", "family", family, "timeout", "0", "maxelem", str(self.maxelem)]
        try:
            _run([*self.pre, "ipset", "create", name, *create, "-exist"])
            return
        except ActionError as exc:
            if "already exists" not in str(exc):
                raise
        header = _run([*self.pre, "ipset", "list", "-t", name])
        m = re.search(r"\bmaxelem (\d+)", header)
        if (m is None or int(m.group(1)) == self.maxelem or f"family {family} " not in header
                or not re.search(r"^Type:\s*hash:net\s*$", header, re.M)):
            raise ActionError(f"ipset {name} exists with other parameters than hash:net {family} timeout "
                              f"maxelem {self.maxelem}: {header.strip()[:300]}")
        if int(m.group(1)) > self.maxelem:
            # never shrunk: a set holding more members than the new bound cannot be refilled ("Hash is full"),
            # and every ban would fail from then on (found by a review); a larger set does no harm
            if (name, "shrink") not in self._warned:
                self._warned.add((name, "shrink"))
                log.warning("ipset %s: maxelem is %s, above the configured %d: kept (sets are only enlarged)",
                            name, m.group(1), self.maxelem)
            return
        tmp = f"{name[:27]}_new"
        log.warning("ipset %s: resizing from maxelem %s to %d (swap with a new set)", name, m.group(1),
                    self.maxelem)
        subprocess.run([*self.pre, "ipset", "destroy", tmp], capture_output=True, check=False)  # a crashed resize
        _run([*self.pre, "ipset", "create", tmp, *create])
        try:
            members = [ln.split(" ", 2)[2] for ln in _run([*self.pre, "ipset", "save", name]).splitlines()
                       if ln.startswith(f"add {name} ")]
            _run([*self.pre, "ipset", "-exist", "restore"], stdin="".join(f"add {tmp} {e}\n" for e in members))
            _run([*self.pre, "ipset", "swap", tmp, name])
        finally:
            subprocess.run([*self.pre, "ipset", "destroy", tmp], capture_output=True, check=False)

    def _rule(self, tool: str, chain: str, name: str) -> None:
        """Insert ``chain -m set --match-set name src -j DROP`` at the top of ``chain`` unless it is there.  A
        chain that does not exist (``DOCKER-USER`` before Docker has started, or in ip6tables when Docker runs
        without IPv6) is skipped with one warning; the owner's periodic check adds the rule once it exists."""
        rule = [chain, "-m", "set", "--match-set", name, "src", "-j", "DROP"]
        if subprocess.run([*self.pre, tool, "-C", *rule], capture_output=True, check=False).returncode == 0:
            return
        if subprocess.run([*self.pre, tool, "-S", chain], capture_output=True, check=False).returncode != 0:
            if (tool, chain) not in self._warned:
                self._warned.add((tool, chain))
                log.warning("%s has no chain %s (yet): set %s is not matched there until it exists", tool,
                            chain, name)
            return
        self._warned.discard((tool, chain))
        _run([*self.pre, tool, "-I", *rule])

    def _restore(self, missing: list[tuple[_Net, int]]) -> None:
        """Add ``missing`` in one ``ipset restore``; when that fails (it stops at the first bad line), add them
        one by one, so one bad element never keeps the others out.  When some are added and some refused, the
        refused ones are dropped from the record (they would fail every later check the same way); when all are
        refused (sets gone, no permission) the record is kept.  Refusals are raised together."""
        lines = [f"add {self._set(net)} {_element(net)} timeout {_ipset_timeout(left)}\n" for net, left in missing]
        try:
            _run([*self.pre, "ipset", "-exist", "restore"], stdin="".join(lines))
            return
        except ActionError as exc:
            log.warning("ipset restore of %d element(s) failed (%s); adding them one by one", len(lines),
                        str(exc).splitlines()[-1][:200])
        refused: list[tuple[_Net, str]] = []
        for net, left in missing:
            try:
                self._add(net, left)
            except ActionError as exc:
                refused.append((net, f"{_element(net)}: {str(exc).splitlines()[-1][:200]}"))
        if len(refused) < len(missing):
            for net, _ in refused:
                self.held.drop(net)
        if refused:
            raise ActionError(f"ipset refused {len(refused)} of {len(missing)} element(s): "
                              + "; ".join(why for _, why in refused[:5]))

    def _set(self, net: _Net) -> str:
        return self.set_v4 if net.version == 4 else self.set_v6

    def ban(self, d: Decision) -> None:
        net = ban_target(d.value)
        secs = max(1, int(d.duration_s))
        with self._lock:
            self.held.put(net, secs)
            if not self._ready:
                self.ensure()
            try:
                self._add(net, secs)
            except ActionError as exc:
                # a set may have gone (ipset destroy in a firewall reload): create it again with every recorded
                # ban still in force and retry once
                log.warning("ipset ban of %s failed (%s); re-creating sets with %d recorded ban(s) and retrying "
                            "once", net, error_line(exc), len(self.held))
                self._ready = False
                self.ensure()
                self._add(net, secs)

    def _add(self, net: _Net, secs: int) -> None:
        _run([*self.pre, "ipset", "add", self._set(net), _element(net), "timeout", str(_ipset_timeout(secs)),
              "-exist"])

    def unban(self, d: Decision) -> None:
        """Delete the entry (``-exist``: one that is not there is no error).  A set that is gone (ipset 7.17: "The
        set with the given name does not exist") is created again with the bans recorded, or, with none
        recorded, left alone (nothing to lift).  Anything else is raised."""
        net = parse_value(d.value)
        with self._lock:
            self.held.drop(net)
            try:
                _run([*self.pre, "ipset", "del", self._set(net), _element(net), "-exist"])
            except ActionError as exc:
                if "does not exist" not in str(exc):
                    raise
                self._ready = False
                if len(self.held):
                    log.warning("ipset unban of %s: set %s is gone; re-creating the sets with %d recorded ban(s)",
                                net, self._set(net), len(self.held))
                    self.ensure()

    def _members(self) -> dict[_Net, int]:
        """Members of both sets -> seconds left (``ipset save`` lines ``add SET ELEMENT timeout N``)."""
        out: dict[_Net, int] = {}
        for s in (self.set_v4, self.set_v6):
            for line in _run([*self.pre, "ipset", "save", s]).splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "add":
                    try:
                        net = ipaddress.ip_network(parts[2], strict=False)
                    except ValueError:
                        continue
                    left = int(parts[parts.index("timeout") + 1]) if "timeout" in parts[3:] else 2**31
                    out[net] = left
        return out

    def members(self) -> list[str]:
        return [_element(n) for n in self._members()]


def _ipset_timeout(secs: int) -> int:
    return max(1, min(int(secs), IPSET_MAX_TIMEOUT))


#: the longest element timeout written to nftables (10 years; an element adopted without a timeout -- added by
#: hand -- is written back with this after a flush)
NFT_MAX_TIMEOUT = 3650 * 86_400


def _nft_timeout(secs: int) -> str:
    """An nft element timeout in days, hours, minutes and seconds: nft 1.0.6 refuses ``100000000s`` ("value too
    large") where ``1157d9h46m40s`` is taken, and one refused element rejects the whole transaction (every later
    ban and the periodic check failed).  At least 1 s, at most :data:`NFT_MAX_TIMEOUT`."""
    d, rest = divmod(max(1, min(int(secs), NFT_MAX_TIMEOUT)), 86_400)
    h, rest = divmod(rest, 3600)
    m, sec = divmod(rest, 60)
    return f"{d}d{h}h{m}m{sec}s"


def sign(secret: bytes, body: bytes) -> str:
    """Value of the ``X-Forumpulse-Signature`` header: ``sha256=<hex HMAC-SHA256(secret, body)>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    """``X-Forumpulse-Signature`` matches ``body``.  It signs the body alone, so a recorded delivery can be
    replayed as it was: a receiver that can should check :func:`verify_timed_signature` instead."""
    return header is not None and hmac.compare_digest(sign(secret, body), header)


def sign_timed(secret: bytes, body: bytes, ts: int) -> str:
    """Value of the ``X-Forumpulse-Signature-Timed`` header: ``sha256=<hex HMAC-SHA256(secret, "<ts>." + body)>``
    with ``ts`` the ``X-Forumpulse-Timestamp`` header (Unix seconds of the attempt)."""
    return "sha256=" + hmac.new(secret, str(int(ts)).encode() + b"." + body, hashlib.sha256).hexdigest()


def verify_timed_signature(secret: bytes, body: bytes, timestamp: str | None, header: str | None,
                           tolerance_s: float = 300.0, now: float | None = None) -> bool:
    """``X-Forumpulse-Signature-Timed`` matches ``body`` and ``X-Forumpulse-Timestamp``, and that timestamp is
    within ``tolerance_s`` of ``now`` (default: the clock): a delivery replayed later is refused (the body-only
    signature could be replayed any time, user trial 41).  Each retry is signed afresh."""
    if timestamp is None or header is None or not timestamp.isdigit():
        return False
    if abs((time.time() if now is None else now) - int(timestamp)) > tolerance_s:
        return False
    return hmac.compare_digest(sign_timed(secret, body, int(timestamp)), header)


class WebhookAction:
    """POSTs each decision as JSON with HMAC-SHA256 signature headers (``X-Forumpulse-Signature`` over the body;
    ``X-Forumpulse-Signature-Timed`` over the ``X-Forumpulse-Timestamp`` and the body, which a receiver checks
    with :func:`verify_timed_signature` to refuse replays); retries 5xx, 408, 429 and network errors
    with exponential backoff (``backoff_s * 2**attempt``, or the receiver's ``Retry-After`` seconds when longer, at
    most 60 s); other 4xx are not retried.  Raises ActionError when it gives up.  ``timeout_s`` bounds each attempt
    as a whole (connect, send, response), not each socket read: a receiver trickling its answer is cut off.

    ``background=True`` (set by :class:`~forumpulse.detectors.dos.DecisionManager` through
    :meth:`deliver_in_background`): ``ban``/``unban`` only queue the decision and return; one daemon thread
    delivers them in order, retries included, so a slow or failing receiver never holds up the detector, the
    firewall sets or the decision API.  Failures are then logged and counted in ``failed``; a full queue
    (``queue_max``) refuses the decision with ActionError (which the manager counts in ``action_errors``).
    ``join(timeout)`` waits for the queue; at interpreter exit :meth:`close` gives it up to ``exit_wait_s``, and
    what is still undelivered then (queued, or being retried) is given up: logged (how many, and the first
    ``_LOG_DROPPED`` of them) and counted in ``failed``.  Without it (a one-shot ``forumpulse detect unban``)
    every call delivers before it returns and raises its error.
    """

    #: longest wait at interpreter exit for queued deliveries
    exit_wait_s = 10.0

    name = "webhook"

    def __init__(self, url: str, secret: str | bytes, retries: int = 4, backoff_s: float = 0.5,
                 timeout_s: float = 5.0, sleep: Callable[[float], None] = time.sleep, background: bool = False,
                 queue_max: int = 10_000) -> None:
        if not url.startswith(("http://", "https://")):
            raise ActionError("webhook url must be http(s)")
        if not secret:
            raise ActionError("webhook secret is required")
        self.url = url
        self.secret = secret.encode() if isinstance(secret, str) else secret
        self.retries, self.backoff_s, self.timeout_s, self.sleep = retries, backoff_s, timeout_s, sleep
        self.attempts = 0
        self.background = background
        self.failed = 0
        self._current: dict[str, Any] | None = None  # the payload the worker is delivering
        self._count_lock = threading.Lock()
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue(maxsize=queue_max)
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def deliver_in_background(self) -> None:
        self.background = True

    def _send(self, payload: dict[str, Any]) -> None:
        if not self.background:
            self._post(payload)
            return
        with self._start_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name="forumpulse-webhook", daemon=True)
                self._worker.start()
                atexit.register(self.close, self.exit_wait_s)
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            raise ActionError(f"webhook queue full ({self._queue.maxsize}): receiver too slow or down") from None

    def _drain(self) -> None:
        while True:
            payload = self._queue.get()
            self._current = payload
            try:
                self._post(payload)
            except Exception as exc:
                with self._count_lock:
                    self.failed += 1
                log.error("webhook gave up on %s %s: %s", payload.get("action"), payload.get("value"), exc)
            finally:
                self._current = None
                self._queue.task_done()

    def close(self, timeout: float | None = None) -> int:
        """Wait up to ``timeout`` for the queue (:meth:`join`); then give up what is still undelivered, the
        decision being delivered (retried) included: log how many and which (the first ``_LOG_DROPPED``) and
        count them in ``failed``.  Returns that number.  Called at interpreter exit with ``exit_wait_s``."""
        if self.join(timeout):
            return 0
        dropped = [] if self._current is None else [self._current]
        while True:
            try:
                dropped.append(self._queue.get_nowait())
            except queue.Empty:
                break
            self._queue.task_done()
        if not dropped:
            return 0
        with self._count_lock:
            self.failed += len(dropped)
        shown = ", ".join(f"{p.get('action')} {p.get('value')}" for p in dropped[:_LOG_DROPPED])
        more = f" and {len(dropped) - _LOG_DROPPED} more" if len(dropped) > _LOG_DROPPED else ""
        log.error("webhook: gave up %d undelivered decision(s) after waiting %s s for the receiver: %s%s",
                  len(dropped), timeout, shown, more)
        return len(dropped)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every queued decision was delivered or given up; False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def _post(self, payload: dict[str, Any]) -> int:
        body = json.dumps(payload, sort_keys=True).encode()
        headers = {"Content-Type": "application/json", "X-Forumpulse-Signature": sign(self.secret, body),
                   "X-Forumpulse-Event": str(payload.get("action", "")), "User-Agent": "forumpulse-dos/1"}
        last = ""
        for attempt in range(self.retries + 1):
            self.attempts += 1
            wait = self.backoff_s * 2**attempt
            ts = int(time.time())  # per attempt: a retry minutes later is still fresh for the receiver
            headers["X-Forumpulse-Timestamp"] = str(ts)
            headers["X-Forumpulse-Signature-Timed"] = sign_timed(self.secret, body, ts)
            try:
                return self._attempt(body, headers)
            except urllib.error.HTTPError as exc:
                if exc.code < 500 and exc.code not in (408, 429):
                    raise ActionError(f"webhook refused the decision: HTTP {exc.code}") from None
                last = f"HTTP {exc.code}"
                after = (exc.headers.get("Retry-After") or "").strip() if exc.headers is not None else ""
                if after.isdigit():
                    wait = max(wait, min(float(after), 60.0))
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if attempt < self.retries:
                self.sleep(wait)
        raise ActionError(f"webhook failed after {self.retries + 1} attempts: {last}")

    def _attempt(self, body: bytes, headers: dict[str, str]) -> int:
        """One POST, cut off ``timeout_s`` after it began: a timer shuts the connection's socket down (urllib's
        timeout applies to each socket operation, so a receiver sending a byte now and then never trips it)."""
        socks: list[socket.socket] = []
        done = threading.Event()

        def cut() -> None:
            if not done.is_set():
                for s in socks:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)

        timer = threading.Timer(self.timeout_s, cut)
        timer.daemon = True
        timer.start()
        try:
            req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
            with _opener(socks).open(req, timeout=self.timeout_s) as resp:
                return int(resp.status)
        except (http.client.HTTPException, ValueError) as exc:  # a cut-off answer: a network error
            raise OSError(f"{type(exc).__name__}: {exc}") from None
        finally:
            done.set()
            timer.cancel()

    def ban(self, d: Decision) -> None:
        ban_target(d.value)
        self._send(d.to_json())

    def unban(self, d: Decision) -> None:
        parse_value(d.value)
        self._send(d.to_json())


def _opener(socks: list[socket.socket]) -> urllib.request.OpenerDirector:
    """A urllib opener (proxies from the environment as usual) whose connections put their sockets in
    ``socks``, so that a deadline can shut them down."""

    def track(conn: http.client.HTTPConnection) -> None:
        make = conn._create_connection  # type: ignore[attr-defined]

        def create(*a: Any, **k: Any) -> socket.socket:
            s = make(*a, **k)
            socks.append(s)
            return s

        conn._create_connection = create  # type: ignore[attr-defined]

    class Conn(http.client.HTTPConnection):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            track(self)

    class TlsConn(http.client.HTTPSConnection):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            track(self)

    class Http(urllib.request.HTTPHandler):
        def http_open(self, req: Any) -> Any:
            return self.do_open(Conn, req)

    class Https(urllib.request.HTTPSHandler):
        def https_open(self, req: Any) -> Any:
            return self.do_open(TlsConn, req, context=self._context)  # type: ignore[attr-defined]

    return urllib.request.build_opener(Http, Https)


def build_actions(cfg: Any, registry: Any = None) -> list[Any]:
    """Actions enabled in an :class:`~forumpulse.detectors.dos_rules.ActionsConfig` (plus the decision API
    registry, if given, which is itself an action: first, being in memory).  A :class:`DecisionManager`
    driving them makes the webhook deliver in the background, so its retries hold up nothing."""
    acts: list[Any] = [] if registry is None else [registry]
    if cfg.nftables.enabled:
        acts.append(NftablesAction(cfg.nftables.table, cfg.nftables.set_v4, cfg.nftables.set_v6,
                                   cfg.nftables.hook_priority, hooks=cfg.nftables.hooks))
    if cfg.ipset.enabled:
        acts.append(IpsetAction(cfg.ipset.set_v4, cfg.ipset.set_v6, cfg.ipset.iptables_rule,
                                iptables_chains=cfg.ipset.iptables_chains, maxelem=cfg.ipset.maxelem))
    if cfg.webhook.enabled:
        acts.append(WebhookAction(cfg.webhook.url, cfg.webhook.secret.get_secret_value(), cfg.webhook.retries,
                                  cfg.webhook.backoff_s, cfg.webhook.timeout_s))
    return acts
