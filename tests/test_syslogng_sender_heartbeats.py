"""Heartbeats of network senders, through the real chain: forwarder syslog-ng → relay syslog-ng → the collector
(syslog-ng/forumpulse.conf) → Kafka → LiveConsumer → ``source_status`` / ``listener_status``.

* the forwarder runs ``deploy/forwarders/syslog-ng-forwarder.conf`` plus the heartbeat snippet printed in
  docs/architecture.md (so the documented snippet is the tested one), with ``fpfwd_origin_host=web7`` (not this
  machine's name): its MARKs must reach Kafka as ``-heartbeat-`` envelopes of host ``web7`` — the host of its
  lines — through a relay that keeps host names; the relay's own MARKs are heartbeats of the relay's host;
* an RFC3164 MARK (what a remote syslog-ng ``network()`` destination sends) and a ``<site>/-heartbeat-`` tag
  are heartbeats of the message's HOST; no MARK ever becomes a data line;
* loaded by the consumer: the forwarded sources are ``silent`` (not ``dead``, not ``quiet``), a raw TCP sender
  (which cannot send heartbeats) is ``quiet`` behind its live listener, no listener or host-heartbeat row is
  listed as a source, and everything is ``dead`` once the heartbeats are old.
"""

from __future__ import annotations

import re
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer, listener_status, source_status
from forumpulse.pipeline.store import Store
from live_stack import Broker, Message, forumpulse_defines, free_ports, syslog_ng, wait_until
from live_stack import kafka_fixture as kafka_fixture  # the `kafka` fixture
from test_deploy_forwarders import _start as start
from test_deploy_forwarders import _stop

pytestmark = [pytest.mark.kafka, pytest.mark.syslogng]
ROOT = Path(__file__).resolve().parent.parent
HB = "-heartbeat-"


def doc_snippet() -> str:
    """The forwarder heartbeat snippet as docs/architecture.md prints it."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"```\n( *# forumpulse forwarder heartbeats:.*?)```", text, re.S)
    assert m, "heartbeat snippet not found in docs/architecture.md"
    return textwrap.dedent(m.group(1))


def forwarder_config(d: Path, **defines: str) -> Path:
    text = (ROOT / "deploy" / "forwarders" / "syslog-ng-forwarder.conf").read_text() + "\n" + doc_snippet()
    for k, v in defines.items():
        text, n = re.subn(rf'^@define {k} "[^"]*"$', f'@define {k} "{v}"', text, flags=re.M)
        assert n == 1, f"no @define {k}"
    conf = d / "forwarder.conf"
    conf.write_text("@version: 3.38\noptions { stats-freq(0); };\n" + text)
    return conf


_STOPPED: dict[int, str] = {}


def stop(proc: subprocess.Popen[str]) -> str:
    """Stop a syslog-ng started here once; later calls return the same output (failure paths stop early)."""
    if proc.pid not in _STOPPED:
        _STOPPED[proc.pid] = _stop(proc)
    return _STOPPED[proc.pid]


def env(m: Message) -> tuple[str, str, str, str, str]:
    parts = m.value.decode().split("\t", 5)
    assert len(parts) == 6 and parts[0] == "fp1", m.value[:200]
    return parts[1], parts[2], parts[3], parts[4], parts[5]


LINE = '203.0.113.{} - - [22/Nov/2026:03:00:0{} +0000] "GET /t/{} HTTP/1.1" 200 512 "-" "Mozilla/5.0"'


def test_forwarded_heartbeats_are_attributed_to_the_sender_and_make_it_silent(
        kafka: Broker, tmp_path: Path, store: Store, settings: Settings) -> None:
    topic = kafka.create_topic("t.sender-hb", 2)
    d = forumpulse_defines(tmp_path / "logs", kafka, fp_topic=topic, heartbeat_s=1, fp_raw_site="rawsite",
                           fp_origin_host="collector1")
    taken = {int(v) for k, v in d.items() if k.endswith("_port") and str(v).isdigit()}
    relay_port = next(p for p in free_ports(8) if p not in taken)  # separate calls may return the same port
    web, squid, state = tmp_path / "web", tmp_path / "squid", tmp_path / "state"
    for p in (web, squid, state):
        p.mkdir()
    (web / "forum.example.org.access.log").write_text("")
    fwd_conf = forwarder_config(tmp_path, fpfwd_collector="127.0.0.1", fpfwd_port=str(relay_port),
                                fpfwd_state_dir=str(state), fpfwd_origin_host="web7", fpfwd_web_dir=str(web),
                                fpfwd_web_tag="forum.example.org/combined", fpfwd_squid_dir=str(squid),
                                fpfwd_heartbeat_s="1")
    relay_conf = tmp_path / "relay.conf"
    relay_conf.write_text(
        "@version: 3.38\n"
        "options { stats-freq(0); keep-hostname(yes); chain-hostnames(no); use-dns(no); dns-cache(no); "
        "mark-freq(1); };\n"
        f'source s_in {{ syslog(ip("127.0.0.1") port({relay_port}) transport(tcp)); }};\n'
        f'destination d_out {{ syslog("127.0.0.1" port({d["fp_syslog5424_port"]}) transport(tcp) '
        "mark-mode(periodical)); };\n"
        "log { source(s_in); destination(d_out); flags(flow-control); };\n")
    relay_host = socket.gethostname().split(".")[0]
    assert relay_host not in ("web7", "web8", "web9", "collector1")
    t0 = int(time.time())
    logs = ""

    def msgs() -> list[Message]:
        return kafka.read_all(topic, timeout_s=20)

    def beats_of(host: str) -> int:
        return sum(1 for m in msgs() if env(m)[3] == HB and env(m)[1] == host)

    with syslog_ng(tmp_path / "collector", defines=d):
        relay = start(relay_conf, tmp_path, "relay")
        try:
            time.sleep(0.5)
            fwd = start(fwd_conf, tmp_path, "forwarder")
            try:
                time.sleep(1.5)  # the poll monitor has seen the empty file: lines appended now are new data
                with open(web / "forum.example.org.access.log", "a") as fh:
                    fh.write(LINE.format(7, 1, "fwd") + "\n")
                with socket.create_connection(("127.0.0.1", int(d["fp_raw_tcp_port"]))) as s:
                    s.sendall((LINE.format(5, 2, "raw") + "\n").encode())
                with socket.create_connection(("127.0.0.1", int(d["fp_syslog_port"]))) as s:
                    stamp = time.strftime("%b %e %H:%M:%S")
                    s.sendall((f"<46>{stamp} web8 -- MARK --\n"  # a remote syslog-ng's network() MARK
                               f"<14>{stamp} web9 board.example.net/-heartbeat-: alive\n"
                               f"<14>{stamp} web9 board.example.net/combined: {LINE.format(9, 3, 'b')}\n").encode())
                def both_beating() -> bool:
                    for name, proc in (("relay", relay), ("forwarder", fwd)):  # a daemon that died says why
                        assert proc.poll() is None, f"{name} syslog-ng exited: {stop(proc)}"
                    return beats_of("web7") >= 2 and beats_of(relay_host) >= 2

                try:
                    wait_until(both_beating, 150, what="forwarder (web7) and relay heartbeats in Kafka")
                except AssertionError as exc:
                    seen: dict[str, int] = {}
                    for m in msgs():
                        seen[f"{env(m)[1]} {env(m)[3]}"] = seen.get(f"{env(m)[1]} {env(m)[3]}", 0) + 1
                    raise AssertionError(f"{exc}; messages by host and format: {seen}; relay: {stop(relay)}; "
                                         f"forwarder: {stop(fwd)}") from None
                wait_until(lambda: sum(1 for m in msgs() if env(m)[3] != HB) >= 3, 90, what="3 data lines")
            finally:
                logs += stop(fwd)
        finally:
            logs += stop(relay)
    t1 = int(time.time())
    all_msgs = msgs()
    data = [env(m) for m in all_msgs if env(m)[3] != HB]
    beats = [(m, env(m)) for m in all_msgs if env(m)[3] == HB]
    assert sorted((e[0], e[1], e[2], e[4]) for e in data) == sorted([
        ("forum.example.org", "web7", "forum.example.org/combined", LINE.format(7, 1, "fwd")),
        ("rawsite", "127.0.0.1", f"tcp:{d['fp_raw_tcp_port']}", LINE.format(5, 2, "raw")),
        ("board.example.net", "web9", "board.example.net/combined", LINE.format(9, 3, "b")),
    ]), (data, logs)
    sender = {(e[0], e[1], e[2]) for _, e in beats if e[1] != "collector1"}
    assert sender == {("*", "web7", ""), ("*", relay_host, ""), ("*", "web8", ""), ("board.example.net", "web9", "")}
    for m, e in beats:
        if e[1] != "collector1":
            assert m.key == e[1].encode()
            ts = int(dict(kv.split("=", 1) for kv in e[4].split())["ts"])
            assert t0 - 2 <= ts <= t1 + 2, e

    # loaded by the consumer
    c = LiveConsumer(settings, store, ConsumerOptions(
        bootstrap_servers=kafka.bootstrap, topic=topic, dead_letter_topic=None, group_id=f"g-{topic}",
        instance_id="hb1", batch_lines=1000, max_wait_s=0.3, stats_interval_s=1.0))
    summary = c.run(idle_exit_s=1.5)
    assert summary["loaded"] == 3 and summary["heartbeats"] == len(beats)
    raw_file = f"tcp:{d['fp_raw_tcp_port']}"
    now = time.time()
    got = {(s.site, s.origin_host, s.origin_file): s for s in source_status(store, now=now, quiet_after_s=0.0,
                                                                            heartbeat_timeout_s=120)}
    assert {k: s.state for k, s in got.items()} == {
        ("forum.example.org", "web7", "forum.example.org/combined"): "silent",
        ("board.example.net", "web9", "board.example.net/combined"): "silent",
        ("rawsite", "127.0.0.1", raw_file): "quiet",
    }
    assert got[("rawsite", "127.0.0.1", raw_file)].listener == f"collector1 {raw_file}"
    lst = {(x.site, x.listener): x for x in listener_status(store, now=now, heartbeat_timeout_s=120)}
    assert lst[("rawsite", raw_file)].collector == "collector1" and lst[("rawsite", raw_file)].state == "up"
    assert lst[("rawsite", raw_file)].sources == 1
    assert lst[("*", f"syslog5424:{d['fp_syslog5424_port']}")].state == "up"
    later = {k[1]: s.state for k, s in ((k, s) for s in source_status(store, now=now + 1000, quiet_after_s=0.0,
                                                                       heartbeat_timeout_s=120)
                                        for k in [(s.site, s.origin_host, s.origin_file)])}
    assert later == {"web7": "dead", "web9": "dead", "127.0.0.1": "dead"}
