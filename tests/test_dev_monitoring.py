"""The development corpus's monitoring-style families (``detectors/devcorpus.py``, ``evaluate --dev-monitoring``):
determinism, labels where the anomalies are, benign events outside them, added only on request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from forumpulse.detectors.devcorpus import FAMILIES, monitoring_series
from forumpulse.detectors.evaluate import dev_corpus, monitoring_dev_series


def test_monitoring_families_are_deterministic_and_labelled() -> None:
    a, b = monitoring_series(seed=5, per_family=2), monitoring_series(seed=5, per_family=2)
    assert set(a) == {f"monitoring/{f}_{j}" for f in FAMILIES for j in range(2)}
    for k in a:
        ts, x, starts = a[k]
        assert np.array_equal(x, b[k][1]) and starts == b[k][2]
        n = len(x)
        assert 4000 <= n < 8000 and len(ts) == n and np.isfinite(x).all()
        assert starts and all(int(0.3 * n) <= s < n - 200 for s in starts)  # after NAB's probation (15%)
    c = monitoring_series(seed=6, per_family=2)
    assert any(not np.array_equal(a[k][1], c[k][1]) for k in a)


def test_monitoring_anomalies_show_in_their_windows() -> None:
    series = monitoring_dev_series(seed=11, per_family=6)
    assert len(series) == 6 * len(FAMILIES)
    assert sum(len(v.limits) for v in series.values()) >= 60
    for name, v in series.items():
        assert v.limits and all(0 <= lo < hi < len(v.values) for lo, hi in v.limits), name
    # a periodic job that stops: its next run is due inside the window and the level never resets after it
    stopped = 0
    for name, v in series.items():
        if not name.startswith("monitoring/sawtooth"):
            continue
        lo, hi = v.limits[0]
        centre = (lo + hi) // 2
        top = v.values[:lo].max()
        if np.diff(v.values[centre:]).min() > -top / 2:  # no reset after the window's centre: the job stopped
            stopped += 1
            assert v.values[-1] > 1.5 * top  # ... and the level rises past anything seen before
        else:  # the job still runs (at another period): it keeps resetting to the bottom
            assert v.values[centre:].min() < 0.3 * top
    assert stopped >= 1


def test_benign_spikes_lie_outside_the_windows() -> None:
    series = monitoring_dev_series(seed=11, per_family=6)
    for name, v in series.items():
        if not name.startswith("monitoring/spiky"):
            continue
        inside = np.zeros(len(v.values), dtype=bool)
        for lo, hi in v.limits:
            inside[lo: hi + 1] = True
        d = np.abs(v.values - np.median(v.values))
        assert (d[~inside] > 8.0).sum() >= 5, name  # unlabelled single-row spikes the score must not alarm on


def test_dev_corpus_adds_the_families_only_on_request(tmp_path: Path) -> None:
    plain = dev_corpus(tmp_path, [])
    both = dev_corpus(tmp_path, [], monitoring=True)
    assert not any(k.startswith("monitoring/") for k in plain)
    assert set(both) - set(plain) == set(monitoring_dev_series())
