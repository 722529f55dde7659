"""Rollups count clients as requests does (migration 0005): a hostname client (old CLF logs) is one client of its
own, not the address '::' shared by all of them; address clients are counted as before."""

from __future__ import annotations

from pathlib import Path

from forumpulse.pipeline.ingest import ingest_paths

NASA = Path(__file__).parent / "fixtures" / "parse" / "NASA_access_log_Aug95.partial_damaged.log"


def test_hostname_clients_are_distinct_in_visitors_and_client_minute(store, settings) -> None:
    settings.retention.raw_days = 0
    settings.retention.rollup_days = 0
    ingest_paths(store, settings, [str(NASA)], fmt="common", site="nasa")
    q = store.query_rows
    humans = int(q("SELECT uniqExact(client) FROM requests WHERE NOT is_bot")[0][0])
    hostnames = int(q("SELECT uniqExact(client_host) FROM requests WHERE client_host != ''")[0][0])
    assert hostnames > 100 and humans > hostnames  # the sample has both kinds
    # site_minute: per minute, the visitors equal the distinct human clients of that minute
    per_minute_rollup = dict(q("SELECT minute, uniqMerge(visitors) FROM site_minute GROUP BY minute"))
    per_minute_raw = dict(q("SELECT toStartOfMinute(ts) AS m, uniqExact(client) FROM requests WHERE NOT is_bot "
                            "GROUP BY m"))
    assert per_minute_rollup.keys() == per_minute_raw.keys()
    assert all(int(per_minute_rollup[m]) == int(per_minute_raw[m]) for m in per_minute_raw)  # uniq is exact < 64k
    # client_minute: one row per client and minute, none for the shared '::'
    rows = int(q("SELECT count() FROM client_minute")[0][0])
    expected = int(q("SELECT count() FROM (SELECT DISTINCT toStartOfMinute(ts), client FROM requests)")[0][0])
    assert rows == expected
    assert int(q("SELECT count() FROM client_minute WHERE client_ip = toIPv6('::')")[0][0]) == 0
    assert int(q("SELECT sum(requests) FROM client_minute")[0][0]) == int(q("SELECT count() FROM requests")[0][0])
    # an address client keeps its own address
    some_ip = q("SELECT toString(any(client_ip)) FROM requests WHERE client_host = ''")[0][0]
    assert int(q(f"SELECT count() FROM client_minute WHERE client_ip = toIPv6('{some_ip}')")[0][0]) > 0
