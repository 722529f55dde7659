"""The real syslog-ng (syslog-ng/forumpulse.conf) into the real Kafka: every line once, tagged right, keyed by
client; rotation and restarts lose and double nothing; quiet sources send heartbeats.

Read-back uses confluent-kafka on a topic of each test's own; nothing is mocked.
"""

from __future__ import annotations

import collections
import os
import socket
import subprocess
from pathlib import Path

import pytest
from live_stack import Broker, Message, forumpulse_defines, syslog_ng, wait_until
from live_stack import kafka_fixture as kafka_fixture  # the `kafka` fixture

pytestmark = [pytest.mark.kafka, pytest.mark.syslogng]
HB = "-heartbeat-"


def combined(i: int, tag: str, path_len: int = 0) -> str:
    ip = f"10.{i % 3}.{(i // 3) % 250}.{i % 11 + 1}"
    path = f"/{tag}/{i}" + ("?" + "q" * path_len if path_len else "")
    return (f'{ip} - - [10/Oct/2023:13:55:{i % 60:02d} +0000] "GET {path} HTTP/1.1" 200 {i} '
            f'"https://example.org/" "Mozilla/5.0 (X11; Linux x86_64) test/{tag}"')


def squid(i: int) -> str:
    return (f"1696946136.{i % 1000:03d}    {i % 900:5d} 192.168.{i % 5}.{i % 13} TCP_MISS/200 {i + 300} GET "
            f"http://cdn.example.com/sq/{i} - HIER_DIRECT/203.0.113.{i % 200} text/html")


def envelope(m: Message) -> tuple[str, str, str, str, str, str]:
    parts = m.value.decode().split("\t", 5)
    assert len(parts) == 6 and parts[0] == "fp1", m.value[:200]
    return parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]


def data_messages(msgs: list[Message]) -> list[Message]:
    return [m for m in msgs if envelope(m)[4] != HB]


def write_lines(path: Path, lines: list[str]) -> None:
    with path.open("a") as f:
        f.writelines(line + "\n" for line in lines)


def test_every_source_delivers_every_line_tagged(kafka: Broker, tmp_path: Path) -> None:
    topic = kafka.create_topic("t.delivery", 4)
    logs = tmp_path / "logs"
    d = forumpulse_defines(logs, kafka, fp_topic=topic, fp_syslog_site="syslogsite", fp_raw_site="rawsite",
                           fp_raw_format="common")
    vhosts = logs / "vhosts"
    (vhosts / "board.example.net").mkdir(parents=True)
    forum_file = vhosts / "forum.example.org.access.log"
    board_file = vhosts / "board.example.net" / "access.log"
    squid_file = logs / "squid" / "access.log"
    long_url_line = combined(10_000, "long", path_len=100_000)   # a 100 KB URL must pass whole
    forum = [combined(i, "forum") for i in range(500)] + [long_url_line]
    board = [combined(i, "board") for i in range(200)]
    sq = [squid(i) for i in range(300)]
    raw = [combined(i, "raw") for i in range(400)]
    s3164 = [combined(i, "s3164") for i in range(100)]
    s5424 = [combined(i, "s5424") for i in range(100)]
    # forwarded squid and vhost_combined lines: the key must come from where each format puts the client
    sq_fwd = [squid(i + 1000) for i in range(50)]
    vh_fwd = [f"vh.example.org:443 {combined(i, 'vhc')}" for i in range(50)]
    write_lines(forum_file, forum[:250])   # present before start and appended after
    with syslog_ng(tmp_path / "sng", defines=d) as sng:
        write_lines(forum_file, forum[250:])
        write_lines(board_file, board)
        write_lines(squid_file, sq)
        with socket.create_connection(("127.0.0.1", int(d["fp_raw_tcp_port"]))) as s:
            s.sendall("".join(line + "\n" for line in raw).encode())
        for tag, args, lines in (("forum.example.org/combined", ["--rfc3164", "-P", d["fp_syslog_port"]], s3164),
                                 ("apache", ["--octet-count", "-P", d["fp_syslog5424_port"]], s5424),
                                 ("proxy/squid", ["--rfc3164", "-P", d["fp_syslog_port"]], sq_fwd),
                                 ("vh.example.org/vhost_combined", ["--rfc3164", "-P", d["fp_syslog_port"]], vh_fwd)):
            subprocess.run(["logger", "-n", "127.0.0.1", "-T", "-t", tag, "--size", "8192", *args],
                           input="\n".join(lines) + "\n", text=True, check=True)
        total = len(forum) + len(board) + len(sq) + len(raw) + len(s3164) + len(s5424) + len(sq_fwd) + len(vh_fwd)
        wait_until(lambda: len(data_messages(kafka.read_all(topic, timeout_s=30))) >= total, 120,
                   what=f"{total} lines in {topic}")
        msgs = data_messages(kafka.read_all(topic, idle_s=2.0))
        assert sng.stat("dst.kafka", "dropped") == 0
    host = d["fp_origin_host"]
    expected = collections.Counter(
        [("forum.example.org", host, str(forum_file), "combined", x) for x in forum]
        + [("board.example.net", host, str(board_file), "combined", x) for x in board]
        + [("proxy", host, str(squid_file), "squid", x) for x in sq]
        + [("rawsite", "127.0.0.1", f"tcp:{d['fp_raw_tcp_port']}", "common", x) for x in raw]
        + [("forum.example.org", socket.gethostname(), "forum.example.org/combined", "combined", x) for x in s3164]
        + [("syslogsite", socket.gethostname(), "apache", "combined", x) for x in s5424]
        + [("proxy", socket.gethostname(), "proxy/squid", "squid", x) for x in sq_fwd]
        + [("vh.example.org", socket.gethostname(), "vh.example.org/vhost_combined", "vhost_combined", x)
           for x in vh_fwd])
    got = collections.Counter(envelope(m)[1:] for m in msgs)
    assert got == expected, (sorted((expected - got).items())[:3], sorted((got - expected).items())[:3])
    assert any(envelope(m)[5] == long_url_line for m in msgs)
    # key = client address (squid: third column, vhost_combined: second field, files and network alike); one
    # client's lines stay in one partition
    partitions: dict[bytes, set[int]] = collections.defaultdict(set)
    for m in msgs:
        line, fmt = envelope(m)[5], envelope(m)[4]
        assert m.key == line.split()[{"squid": 2, "vhost_combined": 1}.get(fmt, 0)].encode(), (fmt, line[:80])
        partitions[m.key].add(m.partition)
    assert all(len(p) == 1 for p in partitions.values())
    assert len({p for ps in partitions.values() for p in ps}) > 1, "all clients in one partition"
    # file order is kept per client
    for key in list(partitions)[:20]:
        forum_seq = [envelope(m)[5] for m in msgs if m.key == key and envelope(m)[1] == "forum.example.org"
                     and envelope(m)[3] == str(forum_file)]
        assert forum_seq == [x for x in forum if x.split()[0].encode() == key]


def _rotation_counts(msgs: list[Message], tag: str) -> collections.Counter[int]:
    needle = f"/{tag}/"
    return collections.Counter(int(envelope(m)[5].split(needle, 1)[1].split()[0])
                               for m in msgs if needle in envelope(m)[5])


def test_rotation_and_restart_lose_and_double_nothing(kafka: Broker, tmp_path: Path) -> None:
    topic = kafka.create_topic("t.rotation", 4)
    logs = tmp_path / "logs"
    d = forumpulse_defines(logs, kafka, fp_topic=topic)
    f = logs / "vhosts" / "rot.example.com.access.log"
    n = 20_000
    with syslog_ng(tmp_path / "sng", defines=d) as sng:
        # 1. logrotate `create` + reload: rename, a new EMPTY file appears at once, the old writer keeps writing
        #    to the renamed file for a while, then reopens (apache2ctl graceful / nginx -s reopen / squid -k rotate)
        w = f.open("a")
        w.writelines(combined(i, "A") + "\n" for i in range(100))
        w.flush()
        wait_until(lambda: sng.stat("src.file", "processed") >= 100, 60, what="first lines read")
        w.writelines(combined(i, "A") + "\n" for i in range(100, n))   # unread rest of the file at rotation
        w.flush()
        os.rename(f, f.with_name(f.name + ".1"))
        f.touch()
        late = [combined(i, "A") + "\n" for i in range(n, n + 5000)]
        wait_until(lambda: sng.stat("src.file", "processed") >= n, 60, what="renamed file read to its end")
        w.writelines(late)                 # written to the renamed file after syslog-ng polled it at EOF
        w.close()
        w = f.open("a")                    # the writer reopens: the new file gets data
        w.writelines(combined(i, "A") + "\n" for i in range(n + 5000, 2 * n))
        w.close()
        # 2. restart syslog-ng mid-stream: the persist file keeps positions
        wait_until(lambda: sng.stat("src.file", "processed") >= 2 * n, 60, what="all A lines read")
        sng.stop()
        write_lines(f, [combined(i, "A") for i in range(2 * n, 2 * n + 3000)])
        sng.start()
        # 3. plain rename + new file by the writer (no late writes), right after a burst
        write_lines(f, [combined(i, "A") for i in range(2 * n + 3000, 2 * n + 6000)])
        os.rename(f, f.with_name(f.name + ".2"))
        write_lines(f, [combined(i, "A") for i in range(2 * n + 6000, 2 * n + 8000)])
        total = 2 * n + 8000
        wait_until(lambda: sum(_rotation_counts(kafka.read_all(topic, timeout_s=30), "A").values()) >= total,
                   120, what=f"{total} rotated lines")
        counts = _rotation_counts(kafka.read_all(topic, idle_s=2.0), "A")
    missing = sorted(set(range(total)) - set(counts))
    doubled = sorted(i for i, c in counts.items() if c > 1)
    assert not missing, f"{len(missing)} lost, e.g. {missing[:5]}"
    assert not doubled, f"{len(doubled)} doubled, e.g. {doubled[:5]}"
    assert set(counts) == set(range(total))


def test_quiet_source_sends_heartbeats(kafka: Broker, tmp_path: Path) -> None:
    topic = kafka.create_topic("t.heartbeat", 2)
    logs = tmp_path / "logs"
    d = forumpulse_defines(logs, kafka, fp_topic=topic, heartbeat_s=1, fp_raw_site="rawsite")
    f = logs / "vhosts" / "quiet.example.org-access.log"
    write_lines(f, [combined(1, "quiet")])
    sq = logs / "squid" / "access.log"
    write_lines(sq, [squid(1)])

    def beats() -> list[tuple[str, ...]]:
        return [envelope(m) for m in kafka.read_all(topic, timeout_s=20) if envelope(m)[4] == HB]

    with syslog_ng(tmp_path / "sng", defines=d):
        wait_until(lambda: sum(1 for b in beats() if b[3] == str(f)) >= 3, 60, what="3 heartbeats of a quiet file")
        msgs = kafka.read_all(topic, idle_s=1.0)
    data = data_messages(msgs)
    assert [envelope(m)[5] for m in data if envelope(m)[3] == str(f)] == [combined(1, "quiet")]
    hb = [(m, envelope(m)) for m in msgs if envelope(m)[4] == HB]
    quiet = [(m, e) for m, e in hb if e[3] == str(f)]
    for m, e in quiet:
        assert e[1] == "quiet.example.org" and e[2] == d["fp_origin_host"]
        assert m.key == str(f).encode()
        fields = dict(kv.split("=") for kv in e[5].split())
        assert int(fields["size"]) == f.stat().st_size and int(fields["inode"]) == f.stat().st_ino
        assert int(fields["ts"]) > 1_600_000_000
    assert len({e[5].split()[0] for _, e in quiet}) >= 2, "heartbeats do not advance in time"
    by_file = {e[3]: e for _, e in hb}
    assert by_file[str(sq)][1] == "proxy"
    assert by_file[f"tcp:{d['fp_raw_tcp_port']}"][1] == "rawsite"
    assert f"syslog:{d['fp_syslog_port']}" in by_file
