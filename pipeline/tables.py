"""Arrow shapes of what the pipeline writes: must match ``schemas/migrations`` (tests/test_schema.py checks)."""

from __future__ import annotations

import pyarrow as pa

#: Columns of the ``requests`` tables the pipeline produces (ClickHouse computes ``query``/``client`` and stores
#: no ``path``: see DERIVED_IN_STORE).
REQUEST_COLUMNS: tuple[str, ...] = (
    "ts", "site", "origin_host", "origin_file", "source_format", "client_ip", "client_host", "ident", "user",
    "method", "url", "path", "protocol", "status", "bytes", "referer", "user_agent", "elapsed_ms",
    "cache_result", "hierarchy", "upstream", "content_type", "vhost", "topic_id", "page_kind", "is_static",
    "is_bot", "bot_name",
)

REQUESTS_SCHEMA = pa.schema(
    [
        ("ts", pa.timestamp("ms", tz="UTC")),
        ("site", pa.string()), ("origin_host", pa.string()), ("origin_file", pa.string()),
        ("source_format", pa.string()), ("client_ip", pa.string()), ("client_host", pa.string()),
        ("ident", pa.string()), ("user", pa.string()), ("method", pa.string()), ("url", pa.string()),
        ("path", pa.string()), ("protocol", pa.string()), ("status", pa.uint16()), ("bytes", pa.uint64()),
        ("referer", pa.string()), ("user_agent", pa.string()), ("elapsed_ms", pa.float32()),
        ("cache_result", pa.string()), ("hierarchy", pa.string()), ("upstream", pa.string()),
        ("content_type", pa.string()), ("vhost", pa.string()), ("topic_id", pa.uint64()),
        ("page_kind", pa.string()), ("is_static", pa.bool_()), ("is_bot", pa.bool_()), ("bot_name", pa.string()),
    ]
)

#: Columns of ``REQUESTS_SCHEMA`` that the ``requests`` table derives itself (ALIAS, never stored): the store drops
#: them on insert.  The table computes them with exactly the parser's semantics (tests/test_schema.py checks).
DERIVED_IN_STORE: tuple[str, ...] = ("path",)

#: ``requests`` columns plus ``query`` (the stream table handed to detectors and ``forumpulse parse``)
STREAM_SCHEMA = REQUESTS_SCHEMA.append(pa.field("query", pa.string()))

QUARANTINE_SCHEMA = pa.schema(
    [
        ("ingested_at", pa.timestamp("ms", tz="UTC")), ("site", pa.string()), ("origin_host", pa.string()),
        ("origin_file", pa.string()), ("source_format", pa.string()), ("reason", pa.string()),
        ("detail", pa.string()), ("raw", pa.binary()), ("line_no", pa.uint64()), ("source_ref", pa.string()),
    ]
)

#: ``decisions_published`` (migration 0012): one decision a Kafka topic confirmed (``detectors.dos.KafkaSink``).
PUBLISHED_SCHEMA = pa.schema([
    ("topic", pa.string()), ("id", pa.string()), ("published_at", pa.timestamp("ms", tz="UTC")),
])
