"""CrowdSec-compatible decision stream, so stock CrowdSec bouncers enforce forumpulse decisions.

Endpoints (CrowdSec LAPI subset used by bouncers), all require header ``X-Api-Key`` (constant-time compare):

* ``GET /v1/decisions/stream?startup=true|false`` -> ``{"new": [...], "deleted": [...]}``; ``startup=true``
  returns every active decision and resets the caller's cursor; later calls return what changed since that
  caller's previous call (callers are told apart by API key + User-Agent + peer address).  ``null`` lists are
  sent as ``null`` like LAPI does when empty.
* ``GET /v1/decisions?ip=A`` -> the active decisions covering A (exact address or a containing range), or ``null``.

Decision objects: ``{"id","origin","type":"ban","scope":"Ip"|"Range","value","duration":"123s","scenario",
"until"}``; durations count down in wall time from when the decision was registered.

:class:`DecisionRegistry` is an :class:`~forumpulse.detectors.dos.Action` (``ban``/``unban``), so the decision
manager feeds it like any firewall.  Misuse: an empty API key is refused at construction.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from forumpulse.detectors.dos import Decision


class DecisionRegistry:
    """Active decisions with wall-clock expiry and a change log for per-bouncer stream cursors."""

    name = "decision_api"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.active: dict[str, dict[str, Any]] = {}  # value -> decision record
        self.log: list[tuple[int, str, dict[str, Any]]] = []  # (seq, "new"|"deleted", record)
        self.seq = 0
        self.cursors: dict[str, int] = {}
        self._next_id = 1

    def _record(self, d: Decision) -> dict[str, Any]:
        net = ipaddress.ip_network(d.value, strict=False)
        single = net.prefixlen == net.max_prefixlen
        rid, self._next_id = self._next_id, self._next_id + 1
        return {"id": rid, "origin": "forumpulse", "type": "ban", "scope": "Ip" if single else "Range",
                "value": str(net.network_address) if single else str(net), "scenario": f"forumpulse/{d.reason}",
                "until": self.clock() + max(1, d.duration_s), "net": net}

    def ban(self, d: Decision) -> None:
        rec = self._record(d)
        with self.lock:
            old = self.active.get(rec["value"])
            if old is not None:
                self._append("deleted", old)
            self.active[rec["value"]] = rec
            self._append("new", rec)

    def unban(self, d: Decision) -> None:
        net = ipaddress.ip_network(d.value, strict=False)
        key = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
        with self.lock:
            rec = self.active.pop(key, None)
            if rec is not None:
                self._append("deleted", rec)

    def _append(self, kind: str, rec: dict[str, Any]) -> None:
        self.seq += 1
        self.log.append((self.seq, kind, rec))

    def _expire(self) -> None:
        now = self.clock()
        for k in [k for k, r in self.active.items() if r["until"] <= now]:
            self._append("deleted", self.active.pop(k))
        if len(self.log) > 100_000:  # keep the change log bounded; cursors older than it get a startup
            cut = self.log[-50_000][0]
            self.log = [e for e in self.log if e[0] >= cut]

    def _public(self, rec: dict[str, Any]) -> dict[str, Any]:
        left = max(0.0, rec["until"] - self.clock())
        out = {k: v for k, v in rec.items() if k not in ("until", "net")}
        out["duration"] = f"{left:.0f}s" if left >= 1 else "1s"
        return out

    def stream(self, caller: str, startup: bool) -> dict[str, Any]:
        with self.lock:
            self._expire()
            since = self.cursors.get(caller)
            if startup or since is None or (self.log and since < self.log[0][0] - 1):
                new = [self._public(r) for r in self.active.values()]
                deleted: list[dict[str, Any]] = []
            else:
                new_recs: dict[str, dict[str, Any]] = {}
                deleted = []
                for seq, kind, rec in self.log:
                    if seq <= since:
                        continue
                    if kind == "new":
                        new_recs[rec["value"]] = rec
                    else:
                        if new_recs.get(rec["value"]) is rec:
                            del new_recs[rec["value"]]
                        else:
                            deleted.append(self._public(rec))
                new = [self._public(r) for r in new_recs.values() if self.active.get(r["value"]) is r]
            self.cursors[caller] = self.seq
            return {"new": new or None, "deleted": deleted or None}

    def lookup(self, ip: str) -> list[dict[str, Any]] | None:
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            raise ValueError(f"invalid ip {ip!r}") from None
        with self.lock:
            self._expire()
            hits = [self._public(r) for r in self.active.values() if r["net"].version == addr.version
                    and addr in r["net"]]
        return hits or None


class DecisionApiServer:
    """Threaded HTTP server for :class:`DecisionRegistry`; ``start()`` runs it in a daemon thread."""

    def __init__(self, registry: DecisionRegistry, api_key: str, host: str = "127.0.0.1", port: int = 8090) -> None:
        if not api_key:
            raise ValueError("the decision API needs a non-empty api_key (config actions.decision_api.api_key)")
        self.registry = registry
        key = api_key.encode()

        class Handler(BaseHTTPRequestHandler):
            server_version = "forumpulse-lapi/1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, payload: Any) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                given = (self.headers.get("X-Api-Key") or "").encode()
                if not hmac.compare_digest(given, key):
                    self._send(403, {"message": "access forbidden"})
                    return
                u = urlparse(self.path)
                q = parse_qs(u.query)
                if u.path.rstrip("/") == "/v1/decisions/stream":
                    startup = q.get("startup", ["false"])[0].lower() == "true"
                    caller = f"{given.decode(errors='replace')}|{self.headers.get('User-Agent', '')}|" \
                             f"{self.client_address[0]}"
                    self._send(200, registry.stream(caller, startup))
                elif u.path.rstrip("/") == "/v1/decisions":
                    ip = q.get("ip", [""])[0]
                    try:
                        self._send(200, registry.lookup(ip) if ip else None)
                    except ValueError as exc:
                        self._send(400, {"message": str(exc)})
                else:
                    self._send(404, {"message": "not found"})

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> DecisionApiServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fp-decision-api", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
