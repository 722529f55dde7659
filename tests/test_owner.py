"""The owner process in-process: it owns the store, serves the ClickHouse endpoint and /fp routes, hosts services."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.owner import Owner, OwnerContext
from forumpulse.pipeline.store import ClickHouseStore


def _get(port: int, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.status, r.read()


def test_owner_serves_store_routes_and_services(chdb_path: Path, settings: Settings) -> None:
    seen: list[OwnerContext] = []

    def service(ctx: OwnerContext) -> None:
        seen.append(ctx)
        ctx.routes[("GET", "/fp/hello")] = lambda req: (200, "text/plain", f"hi {req.params.get('n', '')}".encode())
        ctx.hooks.append(lambda stream, info: None)

    owner = Owner(settings, store_url=f"chdb:{chdb_path}", port=0, services=[service])
    owner.start()
    try:
        assert seen and seen[0].store is owner.store and len(seen[0].hooks) == 1
        status, body = _get(owner.port, "/fp/health")
        health = json.loads(body)
        assert status == 200 and health["status"] == "ok" and health["store"] == f"chdb:{chdb_path}"
        assert _get(owner.port, "/fp/hello?n=3") == (200, b"hi 3")
        assert json.loads(_get(owner.port, "/fp/sources")[1]) == []
        assert b"# TYPE forumpulse_" in _get(owner.port, "/metrics")[1]
        # other commands reach the owned store through the ClickHouse-compatible endpoint; migrations were applied
        cs = ClickHouseStore(f"clickhouse://default@127.0.0.1:{owner.port}/forumpulse")
        try:
            versions = [v for (v,) in cs.query_rows("SELECT version FROM schema_migrations ORDER BY version")]
            assert versions[:2] == [1, 2]
            assert cs.query_rows("SELECT count() FROM consumer_batches") == [(0,)]
        finally:
            cs.close()
    finally:
        owner.shutdown()
    assert owner.store is None


def test_a_consuming_owner_audits_the_hours_of_replayed_batches(chdb_path: Path, settings: Settings) -> None:
    """``forumpulse run --consume`` wires its loader's replayed batches to a RollupAuditor (``store.rollup_audit``),
    whose counters are on the owner's /metrics and whose advice is kept in the chDB folder; ``enabled: false``
    turns it off.  (No broker here: the loader
    waits for one, which does not matter to the wiring.)"""
    from forumpulse.pipeline.consumer import ConsumerOptions

    opts = ConsumerOptions(bootstrap_servers="127.0.0.1:9", topic="t", dead_letter_topic=None, group_id="g")
    owner = Owner(settings, store_url=f"chdb:{chdb_path}", port=0, consume=True, consumer_options=opts, services=[])
    owner.start()
    try:
        assert owner.auditor is not None and owner.consumer is not None
        assert owner.consumer.replay_listeners == [owner.auditor.advise]
        assert owner.auditor.state_path is not None and owner.auditor.state_path.parent == chdb_path.resolve()
        body = _get(owner.port, "/metrics")[1]
        assert b"forumpulse_rollup_audit_pending_hours 0.0" in body
        assert b'forumpulse_rollup_audit_hours_total{result="repaired"} 0.0' in body
        # one copy of each loader family, the consumer's (a second, always-zero copy made Prometheus keep zeros)
        types = [ln for ln in body.decode().splitlines() if ln.startswith("# TYPE ")]
        assert len(types) == len(set(types)) and "# TYPE forumpulse_lines_in_total counter" in types
        owner.consumer.metrics.lines_in.inc(7)
        assert b"forumpulse_lines_in_total 7.0" in _get(owner.port, "/metrics")[1]
    finally:
        owner.shutdown()
    off = settings.model_copy(update={"store": settings.store.model_copy(
        update={"rollup_audit": settings.store.rollup_audit.model_copy(update={"enabled": False})})})
    owner = Owner(off, store_url=f"chdb:{chdb_path}", port=0, consume=True, consumer_options=opts, services=[])
    owner.start()
    try:
        assert owner.auditor is None and owner.consumer is not None and owner.consumer.replay_listeners == []
    finally:
        owner.shutdown()


def test_health_says_degraded_while_the_loader_reaches_no_broker(chdb_path: Path, settings: Settings) -> None:
    """A loader whose broker is down waits for it (it does not stop); /fp/health stays 200 but says
    ``degraded``, with the Kafka side's state and last error, and the gauge reads 0."""
    from forumpulse.pipeline.consumer import ConsumerOptions
    from live_stack import wait_until

    opts = ConsumerOptions(bootstrap_servers="127.0.0.1:9", topic="t", dead_letter_topic=None, group_id="g")
    owner = Owner(settings, store_url=f"chdb:{chdb_path}", port=0, consume=True, consumer_options=opts, services=[])
    owner.start()
    try:
        def health() -> dict:
            code, body = _get(owner.port, "/fp/health")
            assert code == 200
            return json.loads(body)

        wait_until(lambda: health()["status"] == "degraded", 30, what="/fp/health degraded")
        h = health()
        assert h["kafka"]["reachable"] is False and h["kafka"]["since"] and h["kafka"]["last_error"]
        assert b"forumpulse_kafka_reachable 0.0" in _get(owner.port, "/metrics")[1]
    finally:
        owner.shutdown()


def test_broker_link_reads_librdkafka_statistics() -> None:
    """Up when any configured or learned broker connection is UP (the group coordinator's logical entry is not a
    connection of its own); a later statistics without one turns it down, with the time it changed."""
    from forumpulse.pipeline.kafka_client import BrokerLink

    now = [1000.0]
    link = BrokerLink(clock=lambda: now[0], monotonic=lambda: now[0])
    assert link.snapshot()["reachable"] is None and link.gauge_value() != link.gauge_value()  # NaN

    def stats(*states: tuple[str, str]) -> str:
        return json.dumps({"brokers": {f"b{i}": {"state": st, "source": src, "nodeid": i}
                                       for i, (st, src) in enumerate(states)}})

    link.on_stats(stats(("UP", "configured"), ("INIT", "logical")))
    assert link.reachable is True and link.gauge_value() == 1.0
    now[0] = 1010.0
    link.on_stats(stats(("TRY_CONNECT", "configured"), ("UP", "logical"), ("UP", "internal")))
    snap = link.snapshot()
    assert snap["reachable"] is False and snap["since"] == "1970-01-01T00:16:50+00:00" and snap["checked_s_ago"] == 0
    link.on_stats("not json")  # ignored
    assert link.reachable is False
    # the client stopped being polled (a stuck loader thread): the last word goes stale after a minute
    link.on_stats(stats(("UP", "configured")))
    now[0] += 61
    assert link.snapshot()["reachable"] is True and link.snapshot()["stale"] is True
    link.on_stats(stats(("UP", "configured")))
    assert link.snapshot()["stale"] is False
    # the wall clock stepping (NTP) does not age the last word: ages are monotonic
    stepped = BrokerLink(clock=lambda: now[0] + 3600)
    stepped.on_stats(stats(("UP", "configured")))
    assert stepped.snapshot()["stale"] is False


def test_bootstrap_option_reaches_every_kafka_client_of_the_process(settings: Settings) -> None:
    """``run --bootstrap`` is the broker of the loader and of the DoS feed and the decision/event producers,
    which read ``settings.kafka.bootstrap_servers`` (they went to the default 127.0.0.1:9092 before)."""
    from forumpulse.pipeline.consumer import ConsumerOptions
    from forumpulse.pipeline.owner import settings_with_bootstrap

    default = settings.kafka.bootstrap_servers
    s = settings_with_bootstrap(settings.model_copy(deep=True), "127.0.0.1:19092")
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092" != default
    assert ConsumerOptions.from_settings(s).bootstrap_servers == "127.0.0.1:19092"
    assert settings_with_bootstrap(settings.model_copy(deep=True), None).kafka.bootstrap_servers == default


def test_a_port_in_use_is_one_line_and_the_store_is_closed_cleanly(tmp_path: Path) -> None:
    """``run`` on a port another process holds: one line, exit 1 -- before, a traceback and often a crash at exit
    (rc 139: the chDB session was still open when the interpreter ended)."""
    import socket
    import subprocess
    import sys

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        exe = Path(sys.executable).with_name("forumpulse")
        r = subprocess.run([str(exe), "run", "--store", f"chdb:{tmp_path / 'st'}", "--port", str(port)],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert "error: cannot start the owner:" in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_store_url_password_is_never_shown(chdb_path: Path, settings: Settings,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """The systemd detectors reach the store through the owner's endpoint with its password in the URL: their
    /fp/health (no password needed), the log and the ready line printed it in plain text (user trial 42)."""
    secret = "S3cret-owner-pw"
    owner = Owner(settings, store_url=f"chdb:{chdb_path}", port=0, services=[], password=secret)
    owner.start()
    try:
        url = f"clickhouse://default:{secret}@127.0.0.1:{owner.port}/forumpulse"
        with caplog.at_level("INFO"):
            detectors = Owner(settings, store_url=url, port=0, services=[])
            detectors.start()
        try:
            health = json.loads(_get(detectors.port, "/fp/health")[1])
            assert health["store"] == f"clickhouse://default:***@127.0.0.1:{owner.port}/forumpulse"
            assert "owner serving on" in caplog.text and secret not in caplog.text
        finally:
            detectors.shutdown()
    finally:
        owner.shutdown()


def test_sigterm_while_waiting_for_an_absent_store_is_a_clean_stop(tmp_path: Path) -> None:
    """``run`` whose store (a ClickHouse server, or the owner's endpoint the systemd detectors use) is away
    waits for it; a SIGTERM then is a requested stop: exit 0 -- it was exit 3 "cannot reach ClickHouse", and
    systemd marked the unit failed (user trial 42).  The password in the URL is not printed while it waits."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as s1, socket.socket() as s2:
        s1.bind(("127.0.0.1", 0))
        s2.bind(("127.0.0.1", 0))
        absent, port = s1.getsockname()[1], s2.getsockname()[1]  # nothing listens on either once closed
    exe = Path(sys.executable).with_name("forumpulse")
    p = subprocess.Popen([str(exe), "run", "--store", f"clickhouse://default:S3cret-pw@127.0.0.1:{absent}/forumpulse",
                          "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(5)  # started, found no store, waiting (its first retry is logged at once)
        assert p.poll() is None, "it did not wait for the store"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, (p.returncode, err[-2000:])
    assert "not available" in err and "S3cret-pw" not in err + out and "Traceback" not in err, err[-2000:]
