"""CrowdSec-compatible decision stream, so stock CrowdSec bouncers enforce forumpulse decisions.

Endpoints (CrowdSec LAPI subset used by bouncers), all require header ``X-Api-Key`` (constant-time compare
against every configured bouncer key):

* ``GET /v1/decisions/stream?startup=true|false`` -> ``{"new": [...], "deleted": [...]}``.  ``startup=true``
  returns every active decision plus the decisions deleted (lifted or expired) within ``keep_deleted_s`` that the
  registry knows of, and resets the caller's cursor; later calls return what changed since that caller's
  previous call.  A caller without a cursor (first poll, a cursor forgotten, one older than the change log, or a
  cursor of a previous forumpulse process) gets the startup answer.  ``null`` lists are sent as ``null`` like
  LAPI does when empty.  A deletion is not sent while the same value has a decision in force (LAPI hides an
  expired decision behind a later one of the same value): a bouncer that applies ``new`` before ``deleted`` and
  deletes by value (the PHP remediation engine, older Traefik plugins) would otherwise drop a re-ban sent in
  the same answer.
* ``GET /v1/decisions?ip=A`` (or ``range=CIDR``) -> the active decisions covering A (exact address or a
  containing range; with ``contains=false`` the decisions inside the given range instead), or ``null``; an
  IPv4-mapped IPv6 address (``::ffff:192.0.2.9``) is looked up as the IPv4 address.  Without ``ip`` / ``range``
  -> every active decision, or ``null`` when there is none (as LAPI's ``GetDecision`` answers with no filter).

Both take LAPI's filters: ``scopes`` / ``scope`` (comma-separated, ``ip``/``range``, any case), ``value`` and
``type`` (exact), ``origins``, ``scenarios_containing`` and ``scenarios_not_containing`` (comma-separated
substrings); a decision left out by a filter is left out of that answer only (a stream cursor still moves past
it: use the same filters on every poll, as bouncers do).  So a bouncer's look-up of another scope
(``scope=Country&value=FR``, the PHP bouncers' geolocation, the Traefik plugin's live scopes) answers ``null``:
forumpulse decides on addresses and ranges only.  ``HEAD`` on either route answers 200 with no body, as LAPI.

* ``POST /v1/usage-metrics`` (what current bouncers push every 30 min) -> ``201``; the body (up to 1 MiB) is read
  in chunks and dropped, and counted in :attr:`DecisionApiServer.usage_metrics` (a ``404``/``501`` made bouncers log a
  warning on every push).

Bouncers: like CrowdSec, a key is a bouncer.  Give every bouncer its own key (``actions.decision_api.bouncers``);
each key has its own cursor.  Callers are told apart by key name, and within one key by peer address,
``X-Forwarded-For`` and ``User-Agent`` -- so bouncers that share one key still get their own cursors when they
reach the API from different addresses, but not behind one proxy or NAT without ``X-Forwarded-For``: a key
seen from more than one caller is logged (warning, once per key) and counted in ``shared_keys``.

Decision objects: ``{"id","origin","type":"ban","scope":"Ip"|"Range","value","duration":"123s","scenario"}``;
durations count down in wall time; a deleted decision's is negative, the time since it ended (``"-42s"``), as
LAPI's.  ``GET /v1/decisions?ip=`` (an empty filter) is a 400, as in LAPI, not a list of everything.  ``id`` is derived from the forumpulse decision id and value (a positive
integer below 2**53), so it is the same after a restart: bouncers that forget a decision by id (cs-firewall-bouncer's
``pkg/state``) can still be told to delete one they were given by the previous process.

:class:`DecisionRegistry` is an :class:`~forumpulse.detectors.dos.Action` (``ban``/``unban``), so the decision
manager feeds it like any firewall.  :meth:`DecisionRegistry.load_store` rebuilds it after a restart from the
``decisions`` table (bans still in force, and the deletions of the last ``keep_deleted_s``).  Expiry and trimming
run on every ban, unban, poll and lookup, so the registry stays bounded when no bouncer polls.

The server closes a connection idle for ``timeout_s`` (10 s) and serves at most ``max_connections`` (64) at a
time (more are closed at once).  Misuse: an empty API key is refused at construction.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
import json
import logging
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from forumpulse.detectors.dos import Decision, canonical_network, net_value, never_ban_reason

log = logging.getLogger(__name__)

#: decision ids stay below this (JSON numbers every bouncer language reads exactly)
MAX_ID = 2**53 - 1


def decision_number(decision_id: str, value: str) -> int:
    """The CrowdSec decision id of a forumpulse decision: a positive integer derived from its id and canonical
    value, the same in every process (a restart does not renumber what bouncers hold)."""
    h = hashlib.sha256(f"{decision_id}|{value}".encode()).digest()
    return int.from_bytes(h[:8], "big") & MAX_ID or 1


class DecisionRegistry:
    """Active decisions with wall-clock expiry, recent deletions, and a change log for per-bouncer cursors.

    ``keep_deleted_s``: how long a deletion is still sent in startup answers (default 7 days, the default
    ``escalation.max_duration_s``: a bouncer whose set survived may hold a ban that long).  ``max_log``,
    ``max_deleted``, ``max_cursors`` bound the change log, the deletions kept and the cursors (least recently
    used go first; a cursor idle for ``cursor_idle_s`` is forgotten -- its bouncer gets a startup answer).
    """

    name = "decision_api"

    def __init__(self, clock: Callable[[], float] = time.time, keep_deleted_s: float = 7 * 86_400,
                 max_log: int = 100_000, max_deleted: int = 50_000, max_cursors: int = 10_000,
                 cursor_idle_s: float = 86_400) -> None:
        self.clock = clock
        self.keep_deleted_s = keep_deleted_s
        self.max_log, self.max_deleted, self.max_cursors = max_log, max_deleted, max_cursors
        self.cursor_idle_s = cursor_idle_s
        self.lock = threading.Lock()
        self.active: dict[str, dict[str, Any]] = {}  # value -> decision record
        self.deleted: OrderedDict[int, dict[str, Any]] = OrderedDict()  # id -> record ("gone": when), oldest first
        self.log: deque[tuple[int, str, dict[str, Any]]] = deque()  # (seq, "new"|"deleted", record)
        self.seq = 0
        self.trimmed = 0  # change-log entries up to this seq are gone
        self.cursors: OrderedDict[str, tuple[int, float]] = OrderedDict()  # caller -> (seq, last poll)
        self._expiry: list[tuple[float, int, str]] = []  # heap of (until, id, value)

    # -- records --------------------------------------------------------------------------------------
    def _record(self, decision_id: str, value: str, reason: str, until: float) -> dict[str, Any]:
        net = canonical_network(value)
        single = net.prefixlen == net.max_prefixlen
        v = net_value(net)
        return {"id": decision_number(decision_id, v), "origin": "forumpulse", "type": "ban",
                "scope": "Ip" if single else "Range", "value": v, "scenario": f"forumpulse/{reason}",
                "until": until, "net": net}

    def _add(self, rec: dict[str, Any], now: float) -> None:
        old = self.active.get(rec["value"])
        if old is not None and old["id"] == rec["id"]:
            old["until"] = rec["until"]  # the same decision again (restored after load_store): nothing changed
            heapq.heappush(self._expiry, (old["until"], old["id"], old["value"]))
            return
        if old is not None:
            self._delete(old, now)
        self.deleted.pop(rec["id"], None)
        self.active[rec["value"]] = rec
        self._append("new", rec)
        heapq.heappush(self._expiry, (rec["until"], rec["id"], rec["value"]))

    def _delete(self, rec: dict[str, Any], when: float) -> None:
        rec["gone"] = when
        self._append("deleted", rec)
        self.deleted[rec["id"]] = rec
        self.deleted.move_to_end(rec["id"])

    def _append(self, kind: str, rec: dict[str, Any]) -> None:
        self.seq += 1
        self.log.append((self.seq, kind, rec))

    def ban(self, d: Decision) -> None:
        with self.lock:
            now = self.clock()
            self._expire(now)
            self._add(self._record(d.id, d.value, d.reason, now + max(1, d.duration_s)), now)
            self._trim(now)

    def unban(self, d: Decision) -> None:
        key = net_value(canonical_network(d.value))
        with self.lock:
            now = self.clock()
            self._expire(now)
            rec = self.active.pop(key, None)
            if rec is not None:
                self._delete(rec, now)
            self._trim(now)

    # -- rebuild after a restart ----------------------------------------------------------------------
    def load(self, rows: Iterable[Any]) -> int:
        """Rebuild from ``decisions`` rows (objects with ``id``, ``created_at`` (ms), ``action``, ``value``,
        ``duration_s``, ``reason``, ``mode``; any order): per value the latest enforced ban is active unless a
        later unban or its end lifted it; bans lifted, replaced or expired within ``keep_deleted_s`` become
        deletions (sent in startup answers, so a bouncer that held them drops them).  Values that are not
        addresses or must never be banned are skipped.  Meant for an empty registry (at start, before the
        restore bans again, which are then no change).  Returns the active decisions loaded."""
        by_value: dict[str, list[Any]] = {}
        for r in rows:
            if str(r.mode) != "enforce" or str(r.action) not in ("ban", "unban"):
                continue
            try:
                net = canonical_network(str(r.value))
            except ValueError:
                continue
            if never_ban_reason(net) is None:
                by_value.setdefault(net_value(net), []).append(r)
        with self.lock:
            now = self.clock()
            for value, rs in by_value.items():
                cur: dict[str, Any] | None = None
                for r in sorted(rs, key=lambda r: (int(r.created_at), r.action == "ban")):
                    at = int(r.created_at) / 1000
                    if cur is not None:
                        end = min(at, cur["until"])
                        if end > now - self.keep_deleted_s:
                            cur["gone"] = end
                            self.deleted[cur["id"]] = cur
                        cur = None
                    if r.action == "ban":
                        cur = self._record(str(r.id), value, str(r.reason), at + max(1, int(r.duration_s)))
                if cur is not None and cur["until"] > now:
                    self.deleted.pop(cur["id"], None)
                    self._add(cur, now)
                elif cur is not None and cur["until"] > now - self.keep_deleted_s:
                    cur["gone"] = cur["until"]
                    self.deleted[cur["id"]] = cur
            self.deleted = OrderedDict(sorted(self.deleted.items(), key=lambda kv: kv[1]["gone"]))
            for rid in [rid for rid, r in self.deleted.items() if self.active.get(r["value"]) is r]:
                del self.deleted[rid]
            self._trim(now)
            return len(self.active)

    def load_store(self, store: Any) -> int:
        """:meth:`load` from the store's ``decisions`` table: bans that ended within ``keep_deleted_s`` or
        later, and the unbans since the oldest of them.  Store errors are raised."""
        since_ms = int((self.clock() - self.keep_deleted_s) * 1000)
        cols = ("id, toUnixTimestamp64Milli(created_at), action, value, duration_s, reason, mode")
        bans = list(store.query_rows(
            f"SELECT {cols} FROM decisions WHERE action = 'ban' AND mode = 'enforce' AND "
            f"toUnixTimestamp64Milli(created_at) + toInt64(duration_s) * 1000 > {since_ms}"))
        if not bans:
            return self.load([])
        first = min(int(r[1]) for r in bans)
        unbans = list(store.query_rows(
            f"SELECT {cols} FROM decisions WHERE action = 'unban' AND "
            f"toUnixTimestamp64Milli(created_at) >= {first}"))
        return self.load(_Row(*r) for r in [*bans, *unbans])

    # -- upkeep ---------------------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, rid, value = heapq.heappop(self._expiry)
            rec = self.active.get(value)
            if rec is not None and rec["id"] == rid and rec["until"] <= now:
                del self.active[value]
                self._delete(rec, rec["until"])
        if len(self._expiry) > 2 * len(self.active) + 1024:  # entries of lifted or replaced bans
            self._expiry = [(r["until"], r["id"], v) for v, r in self.active.items()]
            heapq.heapify(self._expiry)

    def _trim(self, now: float) -> None:
        while self.deleted:
            rid, rec = next(iter(self.deleted.items()))
            if rec["gone"] > now - self.keep_deleted_s and len(self.deleted) <= self.max_deleted:
                break
            del self.deleted[rid]
        while self.cursors:
            caller, (_, seen) = next(iter(self.cursors.items()))
            if seen > now - self.cursor_idle_s and len(self.cursors) <= self.max_cursors:
                break
            del self.cursors[caller]
        # the log holds only what some cursor has not seen yet (a caller without a cursor gets a startup answer)
        keep_from = min((s for s, _ in self.cursors.values()), default=self.seq)
        while self.log and (self.log[0][0] <= keep_from or len(self.log) > self.max_log):
            self.trimmed = self.log.popleft()[0]
        if not self.log:
            self.trimmed = self.seq

    def _public(self, rec: dict[str, Any], now: float) -> dict[str, Any]:
        left = max(0.0, rec["until"] - now)
        out = {k: v for k, v in rec.items() if k not in ("until", "net", "gone")}
        out["duration"] = f"{left:.0f}s" if left >= 1 else "1s"
        return out

    def _public_deleted(self, rec: dict[str, Any], now: float) -> dict[str, Any]:
        """A deleted decision as LAPI sends it: its duration is the time left until it ended, negative (LAPI's
        ``until`` of a lifted decision is the moment it was lifted; of an expired one, its end)."""
        out = self._public(rec, now)
        ago = now - min(rec["until"], rec.get("gone", rec["until"]))
        out["duration"] = f"-{ago:.0f}s" if ago >= 0.5 else "0s"
        return out

    # -- bouncer API ----------------------------------------------------------------------------------
    def stream(self, caller: str, startup: bool) -> dict[str, Any]:
        with self.lock:
            now = self.clock()
            self._expire(now)
            self._trim(now)
            since = self.cursors[caller][0] if caller in self.cursors else None
            if startup or since is None or since < self.trimmed:
                new = [self._public(r, now) for r in self.active.values()]
                deleted = [self._public_deleted(r, now) for r in self.deleted.values()
                           if r["value"] not in self.active]
            else:
                new_recs: dict[str, dict[str, Any]] = {}
                deleted = []
                for seq, kind, rec in self.log:
                    if seq <= since:
                        continue
                    if kind == "new":
                        new_recs[rec["value"]] = rec
                    elif new_recs.get(rec["value"]) is rec:
                        del new_recs[rec["value"]]
                    elif rec["value"] not in self.active:  # hidden behind the value's decision in force
                        deleted.append(self._public_deleted(rec, now))
                new = [self._public(r, now) for r in new_recs.values() if self.active.get(r["value"]) is r]
            self.cursors[caller] = (self.seq, now)
            self.cursors.move_to_end(caller)
            self._trim(now)
            return {"new": new or None, "deleted": deleted or None}

    def lookup(self, ip: str | None, contains: bool = True) -> list[dict[str, Any]] | None:
        """The active decisions covering ``ip`` -- an address or a range (CIDR) -- that is, equal to it or a
        range containing it; with ``contains=False`` those inside it instead (LAPI's ``contains`` parameter).
        Every active decision when ``ip`` is None or empty (LAPI's ``GET /v1/decisions`` without a filter).
        None when there are none, as LAPI answers ``null``.  ValueError names an address that is not one."""
        want = None
        if ip is not None and ip.strip():
            try:
                want = ipaddress.ip_network(ip.strip(), strict=False)
            except ValueError:
                raise ValueError(f"invalid ip or range {ip!r}") from None
            mapped = want.network_address.ipv4_mapped if isinstance(want, ipaddress.IPv6Network) else None
            if mapped is not None and want.prefixlen >= 96:  # ::ffff:a.b.c.d is a.b.c.d, as decisions are keyed
                want = ipaddress.IPv4Network(f"{mapped}/{want.prefixlen - 96}", strict=False)
        with self.lock:
            now = self.clock()
            self._expire(now)
            self._trim(now)
            hits = [self._public(r, now) for r in self.active.values() if want is None or _covers(r["net"], want, contains)]
        return hits or None


def _covers(net: Any, want: Any, contains: bool) -> bool:
    """LAPI's address filter: the decision's ``net`` contains ``want`` (``contains``) or lies inside it."""
    if net.version != want.version:
        return False
    return bool(want.subnet_of(net) if contains else net.subnet_of(want))


def lapi_bool(text: str) -> bool:
    """A boolean query parameter as LAPI (Go's ``strconv.ParseBool``) reads it; ValueError otherwise."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise ValueError(f"invalid contains value {text!r} (true or false)")


def _csv(q: Mapping[str, list[str]], key: str) -> list[str]:
    return [x.strip().lower() for v in q.get(key, []) for x in v.split(",") if x.strip()]


def filter_decisions(items: list[dict[str, Any]] | None, q: Mapping[str, list[str]]) -> list[dict[str, Any]] | None:
    """``items`` (public decisions) that pass LAPI's query filters ``scopes`` (or ``scope``), ``value``,
    ``type``, ``origins``, ``scenarios_containing``, ``scenarios_not_containing`` (``q``: ``parse_qs`` of the
    query); None when none is left, as LAPI answers ``null``."""
    if not items:
        return None
    scopes, origins = _csv(q, "scopes") + _csv(q, "scope"), _csv(q, "origins")
    having, not_having = _csv(q, "scenarios_containing"), _csv(q, "scenarios_not_containing")
    value, kind = (q["value"][0] if q.get("value") else None), (q["type"][0] if q.get("type") else None)
    out = [d for d in items
           if (not scopes or str(d.get("scope", "")).lower() in scopes)
           and (value is None or d.get("value") == value)
           and (kind is None or d.get("type") == kind)
           and (not origins or str(d.get("origin", "")).lower() in origins)
           and (not having or any(h in str(d.get("scenario", "")).lower() for h in having))
           and not any(h in str(d.get("scenario", "")).lower() for h in not_having)]
    return out or None


class _Row:
    __slots__ = ("action", "created_at", "duration_s", "id", "mode", "reason", "value")

    def __init__(self, id: Any, created_at: Any, action: Any, value: Any, duration_s: Any, reason: Any,
                 mode: Any) -> None:
        self.id, self.created_at, self.action, self.value = str(id), int(created_at), str(action), str(value)
        self.duration_s, self.reason, self.mode = int(duration_s), str(reason), str(mode)


def bouncer_keys(api_key: str | Mapping[str, str] | None) -> dict[str, str]:
    """Bouncer name -> key: one key (``api_key``) is the bouncer ``default``."""
    if api_key is None:
        return {}
    return {"default": api_key} if isinstance(api_key, str) else dict(api_key)


class _Server(ThreadingHTTPServer):
    """At most ``max_connections`` connections served at a time; one over it is closed at once."""

    daemon_threads = True

    def __init__(self, addr: tuple[str, int], handler: Any, max_connections: int) -> None:
        self.slots = threading.BoundedSemaphore(max_connections)
        self.refused = 0
        if ":" in addr[0]:  # an IPv6 address ([::1]:8090 in the configuration)
            self.address_family = socket.AF_INET6
        super().__init__(addr, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):  # a client gone or timed out: no traceback on stderr
            log.debug("decision API: connection from %s: %s", client_address, exc)
            return
        log.exception("decision API: request from %s failed", client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class DecisionApiServer:
    """Threaded HTTP server for :class:`DecisionRegistry`; ``start()`` runs it in a daemon thread.

    ``api_key``: one key (the bouncer ``default``) or a mapping bouncer name -> key (each its own cursor).
    ``host``: an IPv4 address, a host name, or an IPv6 address (without brackets; served over IPv6).  The socket
    is bound in the constructor: a port in use raises :class:`OSError` there."""

    def __init__(self, registry: DecisionRegistry, api_key: str | Mapping[str, str], host: str = "127.0.0.1",
                 port: int = 8090, timeout_s: float = 10.0, max_connections: int = 64) -> None:
        keys = bouncer_keys(api_key)
        if not keys or not all(keys.values()):
            raise ValueError("the decision API needs a non-empty api_key (config actions.decision_api.api_key "
                             "or actions.decision_api.bouncers)")
        if len(set(keys.values())) != len(keys):
            raise ValueError("two bouncers of the decision API have the same key: give each its own")
        self.registry = registry
        encoded = [(name, k.encode()) for name, k in keys.items()]
        self.callers: dict[str, set[str]] = {}  # bouncer name -> callers seen
        #: usage-metrics pushes received (``POST /v1/usage-metrics``), read and dropped
        self.usage_metrics = 0
        self.shared_keys: set[str] = set()
        server = self

        class Handler(BaseHTTPRequestHandler):
            server_version = "forumpulse-lapi/1"
            timeout = timeout_s  # socket timeout: an idle or trickling connection is closed

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, payload: Any) -> None:
                body = b"" if self.command == "HEAD" else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _bouncer(self) -> str | None:
                """The bouncer whose key the request carries (403 sent and None when none)."""
                given = (self.headers.get("X-Api-Key") or "").encode()
                name = None
                for n, k in encoded:  # compare with every key (constant time each), whichever matches
                    if hmac.compare_digest(given, k):
                        name = n
                if name is None:
                    self._send(403, {"message": "access forbidden"})
                return name

            def do_GET(self) -> None:
                name = self._bouncer()
                if name is None:
                    return
                u = urlparse(self.path)
                q = parse_qs(u.query)
                if u.path.rstrip("/") == "/v1/decisions/stream":
                    startup = q.get("startup", ["false"])[0].lower() == "true"
                    caller = server._caller(name, self.client_address[0], self.headers.get("X-Forwarded-For", ""),
                                            self.headers.get("User-Agent", ""))
                    got = registry.stream(caller, startup)
                    self._send(200, {k: filter_decisions(v, q) for k, v in got.items()})
                elif u.path.rstrip("/") == "/v1/decisions":
                    ip = (q.get("ip") or q.get("range") or [""])[0]
                    try:
                        blank = parse_qs(u.query, keep_blank_values=True)
                        if not ip and ("ip" in blank or "range" in blank):
                            raise ValueError("invalid ip or range '' (LAPI refuses an empty filter too)")
                        contains = lapi_bool(q.get("contains", ["true"])[0])
                        self._send(200, filter_decisions(registry.lookup(ip or None, contains), q))
                    except ValueError as exc:
                        self._send(400, {"message": str(exc)})
                else:
                    self._send(404, {"message": "not found"})

            def do_HEAD(self) -> None:  # LAPI answers HEAD on both routes with an empty 200
                if self._bouncer() is None:
                    return
                known = urlparse(self.path).path.rstrip("/") in ("/v1/decisions/stream", "/v1/decisions")
                self._send(200 if known else 404, None)

            def do_POST(self) -> None:
                if self._bouncer() is None:
                    return
                if urlparse(self.path).path.rstrip("/") != "/v1/usage-metrics":
                    self._send(404, {"message": "not found"})
                    return
                try:
                    size = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    size = -1
                if not 0 <= size <= 1 << 20:
                    self._send(400, {"message": "a usage-metrics body needs a Content-Length of at most 1 MiB"})
                    return
                left = size
                while left > 0:  # read and drop, a chunk at a time (the body is not kept)
                    try:
                        got = self.rfile.read(min(left, 65536))
                    except OSError:  # the socket timeout: a client that stalls mid-body
                        got = b""
                    if not got:
                        self.close_connection = True
                        return  # the client went away or stalled: nothing to answer
                    left -= len(got)
                with registry.lock:
                    server.usage_metrics += 1
                self._send(201, {})

        self.httpd = _Server((host, port), Handler, max_connections)
        self.thread: threading.Thread | None = None

    def _caller(self, name: str, peer: str, forwarded: str, agent: str) -> str:
        """The cursor key of a poll: the bouncer (key) name, and who polls with it."""
        who = f"{peer}|{forwarded.strip()}|{agent}"
        with self.registry.lock:
            seen = self.callers.setdefault(name, set())
            if who not in seen and len(seen) < 64:
                seen.add(who)
                if len(seen) == 2 and name not in self.shared_keys:
                    self.shared_keys.add(name)
                    log.warning("decision API: bouncer key %r is used by more than one client (%s); a key is one "
                                "bouncer: give each bouncer its own key (actions.decision_api.bouncers), or two "
                                "behind one proxy or NAT share a cursor and miss each other's changes",
                                name, " and ".join(sorted(seen)))
        return f"{name}|{who}"

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def refused(self) -> int:
        """Connections closed at once because ``max_connections`` were being served."""
        return self.httpd.refused

    def start(self) -> DecisionApiServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fp-decision-api", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

