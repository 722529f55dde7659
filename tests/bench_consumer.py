"""Benchmark (a script, not a test; pytest collects nothing here):

    .venv/bin/python tests/bench_consumer.py [--lines 1000000] [--partitions 4] [--batch-lines 50000]
                                             [--variants pipelined,inline]

Starts a real Kafka broker, pre-fills a topic with N seeded envelope messages, then in the same run measures
(1) a bare confluent-kafka batched read of the whole topic and (2) the LiveConsumer loading it into a fresh chDB
database (parse, attribute, insert with tokens, commit), once per variant (``pipelined``: inserts in the insert
thread, the default; ``inline``: ``pipeline_inserts=False``), each with its own consumer group and database.
Prints one JSON line with every rate and each variant's ratio to the bare read.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch-lines", type=int, default=50_000)
    ap.add_argument("--variants", default="pipelined,inline")
    args = ap.parse_args()
    from forumpulse.pipeline.bench import bare_read
    from forumpulse.pipeline.config import load_settings
    from forumpulse.pipeline.consumer import ConsumerOptions, LiveConsumer
    from forumpulse.pipeline.store import migrate, open_store
    from live_stack import kafka_broker
    from test_live_support import NO_TTL_PARAMS, create_topics, produce, stream

    with tempfile.TemporaryDirectory(prefix="fp-bench-") as tmp, kafka_broker(Path(tmp) / "kafka",
                                                                               create_topics=False) as broker:
        create_topics(broker.bootstrap, args.partitions, "bench.raw", "bench.dlq")
        t0 = time.perf_counter()
        n = produce(broker.bootstrap, "bench.raw", stream(args.lines, seed=1))
        produce_s = time.perf_counter() - t0

        got, nbytes, bare_s = bare_read(broker.bootstrap, "bench.raw", n)

        settings = load_settings()
        bare_rate = got / bare_s
        variants: dict[str, dict[str, object]] = {}
        anchor = open_store(f"chdb:{tmp}/chdb")  # keeps the process's one chDB session open across variants
        for i, name in enumerate(v.strip() for v in args.variants.split(",") if v.strip()):
            store = open_store(f"chdb:{tmp}/chdb", database=f"bench_{name}_{i}")
            migrate(store, NO_TTL_PARAMS)
            opts = ConsumerOptions(bootstrap_servers=broker.bootstrap, topic="bench.raw",
                                   dead_letter_topic="bench.dlq", group_id=f"fp-bench-{name}-{i}",
                                   instance_id=f"bench-{name}-{i}", batch_lines=args.batch_lines, stats_interval_s=5,
                                   pipeline_inserts=name != "inline")
            lc = LiveConsumer(settings, store, opts)
            idle = 1.0
            t0 = time.perf_counter()
            summary = lc.run(idle_exit_s=idle)
            load_s = time.perf_counter() - t0 - idle
            rows = store.query_rows("SELECT (SELECT count() FROM requests) + (SELECT count() FROM quarantine)")[0][0]
            store.close()
            variants[f"{i}:{name}"] = {"lines_s": round(n / load_s), "ratio_to_bare": round(n / load_s / bare_rate, 3),
                              "load_s": round(load_s, 1), "rows_stored": rows, "batches": summary["batches"]}
        anchor.close()
    print(json.dumps({
        "messages": n, "avg_value_bytes": round(nbytes / max(got, 1), 1), "produce_msg_s": round(n / produce_s),
        "bare_confluent_kafka_msg_s": round(bare_rate), "consumer": variants,
    }))


if __name__ == "__main__":
    main()
