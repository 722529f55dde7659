"""Rows for the `requests` table written straight into a store by the detector tests (no log parsing)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa


def forum_requests(site: str, ts_ms: np.ndarray, status: np.ndarray, rng: np.random.Generator) -> pa.Table:
    """One row per timestamp (epoch ms): human forum-index requests of ``site`` from ~5000 IPv4 clients, one
    source (web1 access.log), with the given statuses and random response sizes."""
    n = len(ts_ms)
    return pa.table({
        "ts": pa.array(ts_ms, pa.int64()).cast(pa.timestamp("ms", tz="UTC")),
        "site": [site] * n, "origin_host": ["web1"] * n, "origin_file": ["access.log"] * n,
        "source_format": ["combined"] * n,
        "client_ip": [f"::ffff:10.1.{(i >> 8) & 255}.{i & 255}" for i in rng.integers(0, 5000, n)],
        "method": ["GET"] * n, "url": ["/index.php"] * n, "path": ["/index.php"] * n,
        "status": pa.array(status, pa.uint16()), "bytes": pa.array(rng.integers(500, 9000, n), pa.uint64()),
        "page_kind": ["forum"] * n, "is_static": [False] * n, "is_bot": [False] * n,
    })
