"""A flood that rotates user agents is not a NAT of readers (rules version 6): only user agents at a reader's pace
count as users, so rotating them neither lifts the address's threshold nor, undecided, teaches it a high rate."""

from __future__ import annotations

import numpy as np
import pytest
from forumpulse.detectors.dos import Batch, DecisionManager, DosDetector, _Baseline
from forumpulse.detectors.dos_rules import DosConfig, load_rules
from forumpulse.detectors.eval_dos import ordered, rec, synth_nat

T0 = 1_709_294_400_000  # 2024-03-01T12:00:00Z
CHROME = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/{v}.0.0.0 Safari/537.36"


def rotating(rate: float, seconds: float, uas: int, ip: str = "198.51.100.7", start_s: float = 0) -> list:
    n = int(rate * seconds)
    return [rec(T0 + int((start_s + i / rate) * 1000), ip, "/viewtopic.php", f"t={i % 50}",
                ua=CHROME.format(v=110 + i % uas)) for i in range(n)]


def background(seconds: int) -> list:
    return [rec(T0 + t * 1000, "203.0.113.10", f"/viewtopic.php?t={t % 7}") for t in range(seconds)]


def decisions(records: list, batch_lines: int) -> list:
    det = DosDetector(manager=DecisionManager(DosConfig(crawlers={"verify": "off"})))  # type: ignore[arg-type]
    out = []
    for i in range(0, len(records), batch_lines):
        out += det.process(Batch.from_records(records[i:i + batch_lines]))
    return out


@pytest.mark.parametrize(("rate", "seconds", "uas"), [(25, 600, 8), (35, 60, 12), (50, 60, 12), (25, 60, 4)])
@pytest.mark.parametrize("batch_lines", [50_000, 50])
def test_a_flood_rotating_user_agents_is_banned_within_two_seconds(rate: int, seconds: int, uas: int,
                                                                   batch_lines: int) -> None:
    """The trial's floods: 8 UAs at 25 req/s for 600 s and 12 UAs at 35 req/s were never banned (threshold
    raised 2-3x by the 'users' they made up, then up to 10x by the rate they taught), 12 UAs at 50 req/s only
    at threshold 78."""
    got = decisions(ordered(rotating(rate, seconds, uas) + background(seconds)), batch_lines)
    assert [(d.value, d.reason) for d in got][:1] == [("198.51.100.7", "client_flood")], got
    assert got[0].decided_at - T0 <= 2000 and got[0].evidence["threshold"] == 26


def test_user_agents_faster_than_a_reader_teach_no_users_and_little_rate() -> None:
    """Five minutes of 8 rotated UAs at 25 req/s (say the flood went undecided): the learned scale of the address
    stays near 1 (it was 7.7: 4 x 25 req/s over client_flood's 13 req/s); 40 readers behind a NAT are still
    learned as about 40 users (scale 9-10: the cap is 10)."""
    rules = load_rules()
    for recs, ip, lo, hi in ((rotating(25, 300, 8), "198.51.100.7", 1.0, 1.5),
                             (synth_nat(np.random.default_rng(3), T0, 300, "100.70.0.2", users=40, pages_per_min=4.0),
                              "100.70.0.2", 9.0, 10.0)):
        b = Batch.from_records(ordered(recs))
        base = _Baseline(rules)
        secs = b.ts // 1000
        nonstatic = ~np.asarray([p.startswith(("/assets/", "/uploads/")) for p in b.path])
        base.update(b.codes("client_ip"), b.codes("user_agent"), nonstatic, secs, int(secs.max()) + 60)
        assert lo <= base.scale(ip, 26 / 2) <= hi, (ip, base.rate.get(ip), base.users.get(ip))
