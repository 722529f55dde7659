"""Out-of-band enforcement of DoS decisions: nftables set, ipset, signed webhook.

Every action validates the decision value with :mod:`ipaddress` and builds its command from the parsed
object (``str(ip_network)``), never from log text; commands run as argument lists (no shell).  Set elements
carry per-element timeouts, so bans expire in the kernel even if forumpulse stops.

``netns`` (nftables/ipset): run the command inside that network namespace (``ip netns exec NS ...``); used by
the namespace tests, ``None`` in production.
"""

from __future__ import annotations

import atexit
import hashlib
import hmac
import ipaddress
import json
import logging
import queue
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from forumpulse.detectors.dos import Decision, canonical_network, never_ban_reason

log = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,30}$")


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


class NftablesAction:
    """``table inet T`` with sets ``ban_v4``/``ban_v6`` (flags interval,timeout) and an input chain dropping them.

    ``ensure()`` creates them idempotently (also called lazily by the first ban).  A ban that fails for another
    reason than overlapping intervals (the table was flushed away: ``nft flush ruleset``, a firewall reload)
    creates them again and is retried once.  Interval sets cannot hold overlapping elements: a range ban
    replaces the banned addresses and ranges inside it (same transaction), and an address or range inside a
    range already banned is left to that range.
    """

    name = "nftables"
    #: the kernel set is lost on reboot: the owner re-applies bans still in force when it restarts
    reapply_on_restore = True

    def __init__(self, table: str = "forumpulse", set_v4: str = "ban_v4", set_v6: str = "ban_v6",
                 hook_priority: int = -10, netns: str | None = None) -> None:
        self.table, self.set_v4, self.set_v6 = _name(table), _name(set_v4), _name(set_v6)
        self.prio = int(hook_priority)
        self.pre = _ns_prefix(netns)
        self._ready = False

    def _nft(self, script: str) -> str:
        return _run([*self.pre, "nft", "-f", "-"], stdin=script)

    def ensure(self) -> None:
        t = self.table
        if not self._table_exists():
            self._nft(
                f"table inet {t} {{\n"
                f"  set {self.set_v4} {{ type ipv4_addr; flags interval, timeout; }}\n"
                f"  set {self.set_v6} {{ type ipv6_addr; flags interval, timeout; }}\n"
                f"  chain input {{ type filter hook input priority {self.prio}; policy accept;\n"
                f"    ip saddr @{self.set_v4} drop\n    ip6 saddr @{self.set_v6} drop\n  }}\n}}\n"
            )
        self._ready = True

    def _set(self, net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
        return self.set_v4 if net.version == 4 else self.set_v6

    def ban(self, d: Decision) -> None:
        net = ban_target(d.value)
        if not self._ready:
            self.ensure()
        secs = max(1, int(d.duration_s))
        try:
            self._add(net, secs)
        except ActionError as exc:
            # the table or set may have gone since ensure() (nft flush ruleset, a firewall reload): _ready was a
            # guess.  Create them again and retry once; a second failure is a real error.
            log.warning("nftables ban of %s failed (%s); re-creating table %s and retrying once", net,
                        str(exc).splitlines()[0][:200], self.table)
            self._ready = False
            self.ensure()
            self._add(net, secs)

    def _add(self, net: ipaddress.IPv4Network | ipaddress.IPv6Network, secs: int) -> None:
        el, st = _element(net), self._set(net)
        try:
            # delete+add in one transaction so a repeat ban refreshes the timeout (add keeps the old one)
            self._nft(f"add element inet {self.table} {st} {{ {el} timeout {secs}s }}\n"
                      f"delete element inet {self.table} {st} {{ {el} }}\n"
                      f"add element inet {self.table} {st} {{ {el} timeout {secs}s }}\n")
            return
        except ActionError as exc:
            if "interval overlaps" not in str(exc):
                raise
        # an interval set refuses overlapping elements (auto-merge would fuse neighbours, and an unban of one of
        # them would then miss).  Prefixes nest or are disjoint, so the overlap is one of two kinds:
        held = [(e, exp) for e, exp in self._entries(st) if e != net]
        outer = [(e, exp) for e, exp in held if net.subnet_of(e)]  # type: ignore[arg-type]
        if outer:
            # inside a range already banned: that range enforces it (for as long as the range lasts)
            e, exp = outer[0]
            if exp is not None and exp < secs:
                log.warning("nftables: %s is inside banned range %s, which ends in %ds (this ban: %ds)",
                            net, e, exp, secs)
            return
        inner = [e for e, _ in held if e.subnet_of(net)]  # type: ignore[arg-type]
        # a range over banned addresses/ranges: they give way to it, in the same transaction
        self._nft("".join(f"delete element inet {self.table} {st} {{ {_element(e)} }}\n" for e in inner)
                  + f"add element inet {self.table} {st} {{ {el} timeout {secs}s }}\n")

    def unban(self, d: Decision) -> None:
        """Delete the element.  Only "element does not exist" is ignored (and no table at all: nothing was ever
        banned); anything else (a wrong set name, a syntax error) is raised."""
        net = parse_value(d.value)
        try:
            self._nft(f"delete element inet {self.table} {self._set(net)} {{ {_element(net)} }}\n")
        except ActionError as exc:
            if "element does not exist" in str(exc):
                return
            if "No such file or directory" in str(exc) and not self._table_exists():
                return
            raise

    def _table_exists(self) -> bool:
        try:
            _run([*self.pre, "nft", "-j", "list", "table", "inet", self.table])
        except ActionError:
            return False
        return True

    def _entries(self, s: str) -> list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]]:
        """Elements of set ``s`` as networks, with their seconds left (None: no timeout)."""
        data = json.loads(_run([*self.pre, "nft", "-j", "list", "set", "inet", self.table, s]))
        out: list[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, int | None]] = []
        for x in data.get("nftables", []):
            for el in x.get("set", {}).get("elem", []):
                inner = el.get("elem", {}) if isinstance(el, dict) else {}
                v = inner.get("val", el) if isinstance(el, dict) else el
                if isinstance(v, dict) and "prefix" in v:
                    v = f"{v['prefix']['addr']}/{v['prefix']['len']}"
                try:
                    net = ipaddress.ip_network(str(v), strict=False)
                except ValueError:
                    continue  # an interval that is no prefix (added by hand): not ours
                exp = inner.get("expires")
                out.append((net, int(exp) if exp is not None else None))
        return out

    def elements(self) -> list[str]:
        """Current elements of both sets (addresses/CIDRs as text)."""
        return [_element(n) for s in (self.set_v4, self.set_v6) for n, _ in self._entries(s)]

    def remove(self) -> None:
        self._nft(f"delete table inet {self.table}\n")
        self._ready = False


class IpsetAction:
    """``hash:net`` ipsets with default timeout support, plus (optionally) iptables INPUT DROP rules for them."""

    name = "ipset"
    reapply_on_restore = True

    def __init__(self, set_v4: str = "forumpulse4", set_v6: str = "forumpulse6", iptables_rule: bool = True,
                 netns: str | None = None) -> None:
        self.set_v4, self.set_v6 = _name(set_v4), _name(set_v6)
        self.iptables_rule = iptables_rule
        self.pre = _ns_prefix(netns)
        self._ready = False

    def ensure(self) -> None:
        _run([*self.pre, "ipset", "create", self.set_v4, "hash:net", "family", "inet", "timeout", "0", "-exist"])
        _run([*self.pre, "ipset", "create", self.set_v6, "hash:net", "family", "inet6", "timeout", "0", "-exist"])
        if self.iptables_rule:
            for tool, s in (("iptables", self.set_v4), ("ip6tables", self.set_v6)):
                rule = ["INPUT", "-m", "set", "--match-set", s, "src", "-j", "DROP"]
                check = subprocess.run([*self.pre, tool, "-C", *rule], capture_output=True, check=False)
                if check.returncode != 0:
                    _run([*self.pre, tool, "-I", *rule])
        self._ready = True

    def ban(self, d: Decision) -> None:
        net = ban_target(d.value)
        if not self._ready:
            self.ensure()
        s = self.set_v4 if net.version == 4 else self.set_v6
        _run([*self.pre, "ipset", "add", s, _element(net), "timeout", str(max(1, int(d.duration_s))), "-exist"])

    def unban(self, d: Decision) -> None:
        net = parse_value(d.value)
        s = self.set_v4 if net.version == 4 else self.set_v6
        _run([*self.pre, "ipset", "del", s, _element(net), "-exist"])

    def members(self) -> list[str]:
        out = _run([*self.pre, "ipset", "list", self.set_v4]) + _run([*self.pre, "ipset", "list", self.set_v6])
        members, on = [], False
        for line in out.splitlines():
            if line.startswith("Members:"):
                on = True
            elif on and line.strip():
                members.append(line.split()[0])
            elif line.startswith("Name:"):
                on = False
        return members


def sign(secret: bytes, body: bytes) -> str:
    """Value of the ``X-Forumpulse-Signature`` header: ``sha256=<hex HMAC-SHA256(secret, body)>``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(secret: bytes, body: bytes, header: str | None) -> bool:
    return header is not None and hmac.compare_digest(sign(secret, body), header)


class WebhookAction:
    """POSTs each decision as JSON with an HMAC-SHA256 signature header; retries 5xx/network errors with
    exponential backoff (``backoff_s * 2**attempt``); 4xx are not retried.  Raises ActionError when it gives up.

    ``background=True`` (set by :class:`~forumpulse.detectors.dos.DecisionManager` through
    :meth:`deliver_in_background`): ``ban``/``unban`` only queue the decision and return; one daemon thread
    delivers them in order, retries included, so a slow or failing receiver never holds up the detector, the
    firewall sets or the decision API.  Failures are then logged and counted in ``failed``; a full queue
    (``queue_max``) refuses the decision with ActionError.  ``join(timeout)`` waits for the queue; at
    interpreter exit it is given up to ``exit_wait_s``.  Without it (a one-shot ``forumpulse detect unban``)
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
                atexit.register(self.join, self.exit_wait_s)
        try:
            self._queue.put_nowait(payload)
        except queue.Full:
            raise ActionError(f"webhook queue full ({self._queue.maxsize}): receiver too slow or down") from None

    def _drain(self) -> None:
        while True:
            payload = self._queue.get()
            try:
                self._post(payload)
            except Exception as exc:
                self.failed += 1
                log.error("webhook gave up on %s %s: %s", payload.get("action"), payload.get("value"), exc)
            finally:
                self._queue.task_done()

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
            try:
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise ActionError(f"webhook refused the decision: HTTP {exc.code}") from None
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            if attempt < self.retries:
                self.sleep(self.backoff_s * 2**attempt)
        raise ActionError(f"webhook failed after {self.retries + 1} attempts: {last}")

    def ban(self, d: Decision) -> None:
        ban_target(d.value)
        self._send(d.to_json())

    def unban(self, d: Decision) -> None:
        parse_value(d.value)
        self._send(d.to_json())


def build_actions(cfg: Any, registry: Any = None) -> list[Any]:
    """Actions enabled in an :class:`~forumpulse.detectors.dos_rules.ActionsConfig` (plus the decision API
    registry, if given, which is itself an action: first, being in memory).  A :class:`DecisionManager`
    driving them makes the webhook deliver in the background, so its retries hold up nothing."""
    acts: list[Any] = [] if registry is None else [registry]
    if cfg.nftables.enabled:
        acts.append(NftablesAction(cfg.nftables.table, cfg.nftables.set_v4, cfg.nftables.set_v6,
                                   cfg.nftables.hook_priority))
    if cfg.ipset.enabled:
        acts.append(IpsetAction(cfg.ipset.set_v4, cfg.ipset.set_v6, cfg.ipset.iptables_rule))
    if cfg.webhook.enabled:
        acts.append(WebhookAction(cfg.webhook.url, cfg.webhook.secret.get_secret_value(), cfg.webhook.retries,
                                  cfg.webhook.backoff_s, cfg.webhook.timeout_s))
    return acts
