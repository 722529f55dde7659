"""``source_status`` / ``listener_status`` / ``GET /fp/sources`` for sources received over the network.

The collector's heartbeats come from the collector itself: one per followed file (tagged like that file's lines)
and one per network listener (``origin_host`` = the collector, ``origin_file`` = ``tcp:5140``, ``syslog:5514``…;
site ``*`` for the syslog ports).  Lines received over the network carry the *sender's* host.  So:

* a listener's heartbeat row is not a source: it is not listed in ``source_status``, it is folded into the
  senders it covers and listed by ``listener_status`` / ``GET /fp/listeners``;
* a network sender without heartbeats of its own whose listener heartbeats is ``quiet`` (idle or gone: cannot
  tell), not ``dead``; once the listener stops, ``dead``;
* a sender that forwards its own heartbeats (syslog-ng MARK → ``*`` site, empty ``origin_file``; or a tag
  ``<site>/-heartbeat-`` → that site) is ``silent``/``dead`` like a followed file;
* followed files keep their meaning: heartbeats → ``silent``, stale heartbeats → ``dead``, and no listener ever
  covers a path.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.consumer import LIVENESS_SCHEMA, listener_status, source_status
from forumpulse.pipeline.owner import Owner
from forumpulse.pipeline.store import Store

NOW = 1_800_000_000.0
MIN = 60


def _rows(store: Store, rows: list[tuple[str, str, str, float | None, float | None]]) -> None:
    """(site, host, file, line age s, heartbeat age s) — ``None`` = never."""
    def ms(age: float | None) -> int:
        return 0 if age is None else int((NOW - age) * 1000)

    store.insert("source_liveness", pa.Table.from_pylist([
        {"site": s, "origin_host": h, "origin_file": f, "last_line_ts": ms(la), "last_heartbeat_ts": ms(ha),
         "lines": 0 if la is None else 10, "updated_at": int(NOW * 1000)} for s, h, f, la, ha in rows
    ], schema=LIVENESS_SCHEMA))


def _states(store: Store, **kw: float) -> dict[tuple[str, str, str], str]:
    return {(s.site, s.origin_host, s.origin_file): s.state
            for s in source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120, **kw)}


COLLECTOR = [
    # the collector's own heartbeats: a followed file, the raw TCP listener, the syslog listener
    ("forum", "coll1", "/var/log/apache2/vhosts/forum.access.log", 3600, 5),
    ("rawsite", "coll1", "tcp:5140", None, 5),
    ("*", "coll1", "syslog:5514", None, 5),
]


def test_listener_rows_are_folded_and_quiet_network_senders_are_not_dead(store: Store) -> None:
    _rows(store, [*COLLECTOR,
                  ("rawsite", "10.0.0.5", "tcp:5140", 3600, None),          # raw TCP sender, quiet for an hour
                  ("rawsite", "10.0.0.6", "tcp:5140", 10, None),            # raw TCP sender, busy
                  ("forum", "web7", "forum/combined", 3600, None)])         # syslog sender without heartbeats
    assert _states(store) == {
        ("forum", "coll1", "/var/log/apache2/vhosts/forum.access.log"): "silent",
        ("rawsite", "10.0.0.5", "tcp:5140"): "quiet",
        ("rawsite", "10.0.0.6", "tcp:5140"): "live",
        ("forum", "web7", "forum/combined"): "quiet",
    }, "listener rows must not be listed as sources; quiet senders are not dead while their listener is up"
    by = {s.origin_host: s for s in source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)}
    assert by["10.0.0.5"].listener == "coll1 tcp:5140" and by["10.0.0.5"].last_heartbeat_s_ago is None
    assert by["10.0.0.5"].listener_heartbeat_s_ago is not None and abs(by["10.0.0.5"].listener_heartbeat_s_ago - 5) < 1
    assert by["web7"].listener == "coll1 syslog:5514"
    assert by["coll1"].listener is None and by["coll1"].last_heartbeat_s_ago is not None
    lst = {(x.collector, x.listener): x for x in listener_status(store, now=NOW, heartbeat_timeout_s=120)}
    assert set(lst) == {("coll1", "tcp:5140"), ("coll1", "syslog:5514")}
    assert lst["coll1", "tcp:5140"].state == "up" and lst["coll1", "tcp:5140"].sources == 2
    assert lst["coll1", "syslog:5514"].site == "*" and lst["coll1", "syslog:5514"].sources == 1


def test_network_senders_are_dead_when_their_listener_stops(store: Store) -> None:
    _rows(store, [("rawsite", "coll1", "tcp:5140", None, 3600),             # collector down for an hour
                  ("*", "coll1", "syslog:5514", None, 3600),
                  ("rawsite", "10.0.0.5", "tcp:5140", 3600, None),
                  ("forum", "web7", "forum/combined", 3600, None),
                  ("other", "10.0.0.9", "udp:5141", 3600, None)])           # a port without listener heartbeats
    assert _states(store) == {("rawsite", "10.0.0.5", "tcp:5140"): "dead", ("forum", "web7", "forum/combined"): "dead",
                              ("other", "10.0.0.9", "udp:5141"): "dead"}
    assert {x.listener: x.state for x in listener_status(store, now=NOW, heartbeat_timeout_s=120)} == {
        "tcp:5140": "down", "syslog:5514": "down"}


def test_forwarded_heartbeats_make_network_senders_silent_or_dead(store: Store) -> None:
    _rows(store, [*COLLECTOR,
                  # web7's syslog-ng forwards MARKs (site "*", empty origin_file): every site of web7
                  ("forum", "web7", "forum/combined", 3600, None),
                  ("proxy", "web7", "proxy/squid", 3600, None),
                  ("*", "web7", "", None, 8),
                  # web8 sends "<site>/-heartbeat-" for forum only
                  ("forum", "web8", "forum/combined", 3600, None),
                  ("board", "web8", "board/combined", 3600, None),
                  ("forum", "web8", "", None, 8),
                  # web9 forwarded heartbeats once, then stopped: judged by them (dead), not covered by the listener
                  ("forum", "web9", "forum/combined", 3600, None),
                  ("*", "web9", "", None, 3000)])
    states = _states(store)
    assert states[("forum", "web7", "forum/combined")] == "silent"
    assert states[("proxy", "web7", "proxy/squid")] == "silent"
    assert states[("forum", "web8", "forum/combined")] == "silent"
    assert states[("board", "web8", "board/combined")] == "quiet"
    assert states[("forum", "web9", "forum/combined")] == "dead"
    assert not [k for k in states if k[0] == "*" or k[2] == ""], "host heartbeat rows are not sources"


def test_followed_files_keep_their_meaning_next_to_live_listeners(store: Store) -> None:
    _rows(store, [*COLLECTOR,
                  ("forum", "coll1", "/var/log/apache2/vhosts/gone.access.log", 3600, 3000),  # deleted file
                  ("forum", "coll1", "/var/log/apache2/vhosts/busy.access.log", 3, 5),
                  ("forum", "coll2", "/var/log/apache2/vhosts/forum.access.log", 3600, None)])  # no heartbeats
    assert _states(store) == {
        ("forum", "coll1", "/var/log/apache2/vhosts/forum.access.log"): "silent",
        ("forum", "coll1", "/var/log/apache2/vhosts/gone.access.log"): "dead",
        ("forum", "coll1", "/var/log/apache2/vhosts/busy.access.log"): "live",
        ("forum", "coll2", "/var/log/apache2/vhosts/forum.access.log"): "dead",
    }


def test_owner_serves_sources_and_listeners(chdb_path: Path, settings: Settings) -> None:
    owner = Owner(settings, store_url=f"chdb:{chdb_path}", port=0)
    owner.start()
    try:
        assert owner.store is not None
        now = time.time()
        owner.store.insert("source_liveness", pa.Table.from_pylist([
            {"site": "rawsite", "origin_host": "coll1", "origin_file": "tcp:5140", "last_line_ts": 0,
             "last_heartbeat_ts": int((now - 5) * 1000), "lines": 0, "updated_at": int(now * 1000)},
            {"site": "rawsite", "origin_host": "10.0.0.5", "origin_file": "tcp:5140",
             "last_line_ts": int((now - 3600) * 1000), "last_heartbeat_ts": 0, "lines": 3,
             "updated_at": int(now * 1000)},
        ], schema=LIVENESS_SCHEMA))

        def get(path: str) -> list[dict[str, object]]:
            with urllib.request.urlopen(f"http://127.0.0.1:{owner.port}{path}", timeout=30) as r:
                rows: list[dict[str, object]] = json.loads(r.read())
                return rows

        sources = get("/fp/sources")
        assert [(s["origin_host"], s["state"], s["listener"]) for s in sources] == [
            ("10.0.0.5", "quiet", "coll1 tcp:5140")]
        assert [(x["collector"], x["listener"], x["state"], x["sources"]) for x in get("/fp/listeners")] == [
            ("coll1", "tcp:5140", "up", 1)]
    finally:
        if owner.store is not None:  # the owner's database is shared by this test process's other owner tests
            owner.store.command("TRUNCATE TABLE source_liveness")
        owner.shutdown()


def test_a_sender_is_quiet_only_while_every_collector_that_may_receive_it_is_up(store: Store) -> None:
    """Two collectors with the same listener label: a silent sender may be one of the dead collector's, so the
    live collector does not vouch for it (the oldest covering listener decides)."""
    _rows(store, [("rawsite", "collA", "tcp:5140", None, 1000),   # collector A stopped heartbeating
                  ("rawsite", "collB", "tcp:5140", None, 10),     # collector B is up
                  ("rawsite", "10.0.0.9", "tcp:5140", 2000, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.origin_host, s.state, s.listener) == ("10.0.0.9", "dead", "collA tcp:5140")
    store.command("TRUNCATE TABLE source_liveness")
    _rows(store, [("rawsite", "collA", "tcp:5140", None, 20), ("rawsite", "collB", "tcp:5140", None, 10),
                  ("rawsite", "10.0.0.9", "tcp:5140", 2000, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.state, s.listener) == ("quiet", "collA tcp:5140")


def test_a_listener_down_before_the_senders_last_line_does_not_vouch_or_condemn(store: Store) -> None:
    """A retired collector or an old syslog port (its listener row never expires) went down hours before the
    sender's last line: it did not receive that line, so the listener that is up decides (user trial 33: every
    heartbeat-less syslog sender was dead for good after a port change)."""
    _rows(store, [("*", "coll1", "syslog5424:15515", None, 6 * 3600),   # the old port, down for 6 hours
                  ("*", "coll1", "syslog5424:25515", None, 10),          # the port in use, up
                  ("forum", "web3.remote.example", "forum/combined_d", 1500, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.state, s.listener) == ("quiet", "coll1 syslog5424:25515")
    store.command("TRUNCATE TABLE source_liveness")
    _rows(store, [("*", "coll1", "syslog5424:15515", None, 6 * 3600),
                  ("*", "coll1", "syslog5424:25515", None, 1000),        # the port in use stopped after the line
                  ("forum", "web3.remote.example", "forum/combined_d", 1500, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.state, s.listener) == ("dead", "coll1 syslog5424:25515")
    store.command("TRUNCATE TABLE source_liveness")  # user trial 34: the sender's line 57 s after the port change
    _rows(store, [("*", "coll1", "syslog5424:15515", None, 1500 + 57),
                  ("*", "coll1", "syslog5424:25515", None, 10),
                  ("forum", "web3.remote.example", "forum/combined_d", 1500, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.state, s.listener) == ("quiet", "coll1 syslog5424:25515")
    store.command("TRUNCATE TABLE source_liveness")  # a collector that died 20 s after the line: it may have got it
    _rows(store, [("*", "coll1", "syslog5424:15515", None, 1500 - 20),
                  ("*", "coll1", "syslog5424:25515", None, 10),
                  ("forum", "web3.remote.example", "forum/combined_d", 1500, None)])
    [s] = source_status(store, now=NOW, quiet_after_s=300, heartbeat_timeout_s=120)
    assert (s.state, s.listener) == ("dead", "coll1 syslog5424:15515")
