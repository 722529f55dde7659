"""The owner process (``forumpulse run``): the one process that owns the embedded store and hosts what needs it.

chDB lets one process open a data folder and cannot listen on a port.  In embedded mode the owner opens
``chdb:PATH``, applies migrations, and serves on one HTTP port (default 127.0.0.1:8123):

* the ClickHouse-compatible endpoint (:mod:`forumpulse.pipeline.chhttp`): other commands and other consumers use
  ``--store clickhouse://127.0.0.1:8123/forumpulse``; curl, clickhouse-connect and Grafana's ClickHouse plugin
  (HTTP mode, within the documented subset) query it;
* ``GET /fp/health`` (JSON: status ok/degraded/stopping, pid, store, uptime, consumer totals, Kafka reachability), ``GET /fp/sources`` (live/stuck/silent/quiet/dead/retired
  per source, see :func:`forumpulse.pipeline.consumer.source_status`), ``GET /fp/listeners`` (the collectors'
  network listeners, up/down, see :func:`~forumpulse.pipeline.consumer.listener_status`), ``GET /metrics``
  (Prometheus text: the owner's, its consumer's, and the live detectors' ``forumpulse_dos_*`` /
  ``forumpulse_traffic_*`` families, see :mod:`forumpulse.pipeline.live_detect`).

With ``--consume`` it also runs a :class:`~forumpulse.pipeline.consumer.LiveConsumer` in a thread (the
embedded deployment's loader).  Other components (detectors, decisions, reports) plug in as *owner services*:
``register_owner_service(fn)`` before :func:`run_command`; each ``fn(ctx)`` gets an :class:`OwnerContext` and
may add stream hooks (fed by the consumer), HTTP routes and background threads that stop on ``ctx.stop``.
``--dos`` / ``--traffic`` add the live detector services of :mod:`forumpulse.pipeline.live_detect`.

Shutdown (SIGTERM/SIGINT): the consumer finishes and commits its current batches, services are told to stop,
the HTTP server stops accepting, and the store is closed (the folder lock is released).  A kill -9 loses
nothing: uncommitted batches are replayed by the next run (see :mod:`forumpulse.pipeline.consumer`).

With a ``clickhouse://`` store (a real server) the owner still hosts the consumer, services and the ``/fp``
routes; the ClickHouse endpoint then answers 501 (query the server directly).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from forumpulse.pipeline.chhttp import ClickHouseHTTPServer, RequestInfo, Route
from forumpulse.pipeline.config import Settings, load_settings, mask_url
from forumpulse.pipeline.consumer import (
    ConsumerOptions,
    LiveConsumer,
    StreamHook,
    listener_status,
    open_store_waiting,
    source_status,
)
from forumpulse.pipeline.enrich import RulesError, load_configured_titles
from forumpulse.pipeline.metrics import PipelineMetrics
from forumpulse.pipeline.runtime import error_line
from forumpulse.pipeline.store import Store, StoreError, StoreLocationError
from prometheus_client import CollectorRegistry, generate_latest

log = logging.getLogger("forumpulse.owner")


@dataclass
class OwnerContext:
    """What an owner service receives.  Add to ``hooks`` / ``routes`` during setup (before the consumer starts)."""

    settings: Settings
    store: Store
    stop: threading.Event
    hooks: list[StreamHook] = field(default_factory=list)
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    #: the owner's HTTP password (routes that change state check it themselves), and whether a loader runs
    password: str | None = None
    consume: bool = False
    #: prometheus-client collectors (``collect()`` yielding metric families) served by the owner's ``/metrics``
    collectors: list[Any] = field(default_factory=list)


OwnerService = Callable[[OwnerContext], None]
_SERVICES: list[OwnerService] = []


def register_owner_service(service: OwnerService) -> None:
    """Register a component the owner hosts (called once per ``forumpulse run`` with the context)."""
    _SERVICES.append(service)


class Owner:
    """Owns the store and the HTTP port.  ``start()`` then ``wait()``; ``stop()`` from any thread or a signal."""

    def __init__(self, settings: Settings, store_url: str | None = None, host: str = "127.0.0.1", port: int = 8123,
                 password: str | None = None, consume: bool = False,
                 consumer_options: ConsumerOptions | None = None, services: list[OwnerService] | None = None) -> None:
        self.settings = settings
        self.store_url = store_url or settings.store.url
        self.host = host
        self.port = port
        self.password = password
        self.consume = consume
        self.consumer_options = consumer_options
        self.services = list(_SERVICES if services is None else services)
        self.stop_event = threading.Event()
        self.metrics = PipelineMetrics("owner", f"{os.uname().nodename}-{os.getpid()}")
        self.started = time.time()
        self.store: Store | None = None
        self.server: ClickHouseHTTPServer | None = None
        self.consumer: LiveConsumer | None = None
        self._services_registry: CollectorRegistry | None = None  # the services' collectors (live detectors)
        self._consumer_thread: threading.Thread | None = None
        self.ctx: OwnerContext | None = None
        self.auditor: Any = None  # RollupAuditor: hours of replayed batches checked once settled (--consume)

    # ------------------------------------------------------------------------------------------ routes

    def _health(self, _req: RequestInfo) -> tuple[int, str, bytes]:
        """Always 200 while the process serves (it waits for what is down, it does not stop); ``status`` is
        ``stopping``, ``degraded`` (the loader reaches no Kafka broker -- ``kafka`` says since when and the last
        error -- or its Kafka client has not been polled for a minute: ``kafka.stale``) or ``ok``."""
        kafka = self.consumer.broker.snapshot() if self.consumer else None
        status = ("stopping" if self.stop_event.is_set() else
                  "degraded" if kafka is not None and (kafka["reachable"] is False or kafka["stale"]) else "ok")
        body = {
            "status": status, "pid": os.getpid(),
            "store": mask_url(self.store_url), "uptime_s": round(time.time() - self.started, 1),
            "consumer": self.consumer.metrics.summary() if self.consumer else None,
            "kafka": kafka,
        }
        return 200, "application/json", json.dumps(body).encode()

    def _sources(self, req: RequestInfo) -> tuple[int, str, bytes]:
        assert self.store is not None
        quiet = float(req.params.get("quiet_after_s", 300))
        hb = float(req.params.get("heartbeat_timeout_s", 180))
        rows = [asdict(s) for s in source_status(self.store, quiet_after_s=quiet, heartbeat_timeout_s=hb)]
        return 200, "application/json", json.dumps(rows).encode()

    def _listeners(self, req: RequestInfo) -> tuple[int, str, bytes]:
        assert self.store is not None
        hb = float(req.params.get("heartbeat_timeout_s", 180))
        rows = [asdict(s) for s in listener_status(self.store, heartbeat_timeout_s=hb)]
        return 200, "application/json", json.dumps(rows).encode()

    def _metrics(self, _req: RequestInfo) -> tuple[int, str, bytes]:
        # one copy of each loader family: the consumer's when this process loads Kafka (the owner's own
        # PipelineMetrics counts nothing then, and two unlabelled copies made Prometheus keep the zeros)
        out = (self.consumer.metrics if self.consumer is not None else self.metrics).exposition()
        if self._services_registry is not None:
            out += generate_latest(self._services_registry)
        return 200, "text/plain; version=0.0.4; charset=utf-8", out

    # ------------------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store, start the services, the HTTP endpoint and (``consume``) the loader.  A failure on the
        way (a service refusing its settings, the port in use) stops what had started and closes the store
        before it is raised: a chDB session still open at interpreter exit crashed the process (rc 139)."""
        try:
            self._start()
        except BaseException:
            self.shutdown()
            raise

    def _start(self) -> None:
        self.store = open_store_waiting(self.store_url, self.stop_event,
                                        migrate_params=self.settings.retention.migration_params())
        try:
            for w in load_configured_titles(self.store, self.settings).groups.warnings():  # titles_csv, groups
                log.warning("%s", w)
        except RulesError:
            raise  # a bad titles file: refused at start, as before
        except Exception as exc:  # e.g. a writer role from before ALTER DELETE on topic_groups
            log.warning("topic groups not synchronised with topics.groups (the detectors still read the "
                        "configured groups): %s", exc)
        ctx = self.ctx = OwnerContext(self.settings, self.store, self.stop_event, password=self.password,
                                      consume=self.consume)
        for service in self.services:
            service(ctx)
        if self.consume:  # the hours of batches its loader replays are checked (and rebuilt) once settled
            from forumpulse.pipeline.rollup_check import start_auditor

            started = start_auditor(self.settings.store.rollup_audit, self.store, self.store_url, self.stop_event)
            if started is not None:
                self.auditor = started[0]
                ctx.collectors.append(self.auditor)
                ctx.threads.append(started[1])  # joined at shutdown with the services' threads
        if ctx.collectors:
            self._services_registry = CollectorRegistry()
            for c in ctx.collectors:
                self._services_registry.register(c)
        routes: dict[tuple[str, str], Route] = {
            ("GET", "/fp/health"): self._health, ("GET", "/fp/sources"): self._sources,
            ("GET", "/fp/listeners"): self._listeners, ("GET", "/metrics"): self._metrics, **ctx.routes,
        }
        self.server = ClickHouseHTTPServer(self.store, self.host, self.port, password=self.password, routes=routes)
        self.port = self.server.port
        threading.Thread(target=self.server.serve_forever, name="owner-http", daemon=True).start()
        log.info("owner serving on http://%s:%d (store %s)", self.host, self.port, mask_url(self.store_url))
        if self.consume:
            opts = self.consumer_options or ConsumerOptions.from_settings(self.settings)
            self.consumer = LiveConsumer(self.settings, self.store, opts, hooks=ctx.hooks)
            if self.auditor is not None:
                self.consumer.replay_listeners.append(self.auditor.advise)
            self._consumer_thread = threading.Thread(target=self._run_consumer, name="owner-consumer", daemon=True)
            self._consumer_thread.start()

    def _run_consumer(self) -> None:
        assert self.consumer is not None
        try:
            self.consumer.run()
        except Exception:
            log.exception("consumer failed: stopping the owner")
            self.stop_event.set()

    def stop(self) -> None:
        self.stop_event.set()

    def wait(self) -> None:
        while not self.stop_event.wait(0.5):
            pass
        self.shutdown()

    def shutdown(self) -> None:
        self.stop_event.set()
        if self.consumer is not None:
            self.consumer.stop()
        if self._consumer_thread is not None:
            self._consumer_thread.join(120)
        if self.ctx is not None:
            for t in self.ctx.threads:
                t.join(30)
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.store is not None:
            self.store.close()
            self.store = None
        log.info("owner stopped")


def settings_with_bootstrap(settings: Settings, bootstrap: str | None) -> Settings:
    """``--bootstrap`` for every Kafka client of the process: the loader, the DoS feed, the decision and event
    producers all read ``settings.kafka.bootstrap_servers`` (only the loader used to get the option, and the
    others went to the configured default, 127.0.0.1:9092 -- another stack's broker, if one runs there)."""
    if bootstrap:
        settings.kafka.bootstrap_servers = bootstrap
    return settings


def run_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML configuration file (default: "
                                                "$FORUMPULSE_CONFIG, else built-in defaults)")] = None,
    store: Annotated[str | None, typer.Option(help="chdb:PATH to own (default: the configured store, "
                                              "chdb:./data/chdb)")] = None,
    host: Annotated[str, typer.Option(help="address to serve on (beyond 127.0.0.1, set --password-env)")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port of the ClickHouse-compatible HTTP endpoint and the /fp routes")]
    = 8123,
    password_env: Annotated[str | None, typer.Option(help="name of an environment variable holding the password "
                                                     "every request must carry")] = None,
    consume: Annotated[bool, typer.Option(help="also load Kafka (weblogs.raw) into the store in this process")]
    = False,
    instance_id: Annotated[str | None, typer.Option(help="static consumer-group member id, Kafka group.instance.id (default: none, dynamic membership)")]
    = None,
    bootstrap: Annotated[str | None, typer.Option(help="Kafka bootstrap servers (default: from the configuration)")]
    = None,
    dos: Annotated[bool, typer.Option(help="run live DoS detection: decisions to the table, Kafka, the configured "
                                      "firewall actions and the CrowdSec-compatible decision stream")] = False,
    traffic: Annotated[bool, typer.Option(help="run the traffic detectors (spikes, dips, surges, regressions) "
                                          "every minute")] = False,
) -> None:
    """Own the embedded store and serve it until SIGTERM: a ClickHouse-compatible HTTP endpoint (for
    clickhouse-connect, curl and Grafana) and the /fp routes (health, sources, decisions, unban), optionally
    loading Kafka and running the live detectors in the same process.

    chDB lets one process open a data folder; this is that process.  Other commands (a second consumer,
    dashboards, reports) reach the store through this endpoint with --store clickhouse://127.0.0.1:PORT.
    Prints one JSON line ({"owner": pid, "port": ..., "store": ...}) when it is ready.
    """
    from forumpulse.pipeline.runtime import start_service

    start_service(log)
    settings = settings_with_bootstrap(load_settings(config), bootstrap)
    password = os.environ.get(password_env) if password_env else None
    if password_env and not password:
        raise SystemExit(f"--password-env {password_env}: the variable is empty or not set")
    if host not in ("127.0.0.1", "::1", "localhost") and not password:
        log.warning("serving on %s without a password: anyone reaching the port can run any SQL", host)
    opts = ConsumerOptions.from_settings(settings, instance_id=instance_id)
    services: list[OwnerService] | None = None
    if dos or traffic:
        from forumpulse.pipeline.live_detect import live_services

        services = [*_SERVICES, *live_services(dos=dos, traffic=traffic)]
    owner = Owner(settings, store, host, port, password, consume, opts, services=services)

    signalled = threading.Event()

    def _signal(signum: int, _frame: Any) -> None:
        log.info("signal %d: shutting down", signum)
        signalled.set()
        owner.stop()

    signal.signal(signal.SIGTERM, _signal)
    signal.signal(signal.SIGINT, _signal)
    try:
        owner.start()
    except OSError as exc:  # the port in use, an address not on this host: one line, the store already closed
        log.error("cannot start: %s", exc)
        raise SystemExit(f"error: cannot start the owner: {exc}") from None
    except StoreError as exc:
        if not signalled.is_set() or isinstance(exc, StoreLocationError):  # (start() sets stop_event on any error)
            raise
        # SIGTERM while waiting for a store that is away: a requested stop, not a failure (it exited 3 with
        # "cannot reach ClickHouse", and systemd marked the unit failed; user trial 42)
        log.info("stopped while waiting for the store: %s", error_line(exc))
        return
    print(json.dumps({"owner": os.getpid(), "port": owner.port, "store": mask_url(owner.store_url)}), flush=True)
    owner.wait()


if __name__ == "__main__":  # `python -m forumpulse.pipeline.owner ...` (tests, before CLI wiring)
    import typer

    typer.run(run_command)
