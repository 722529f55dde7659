"""Kafka topic contracts (schemas/contracts/): examples match their contract, the syslog-ng template writes the
documented raw envelope, and the producers' real payloads (Detection, Decision) validate against the schemas."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import jsonschema
import pytest
from forumpulse.detectors.dos import Decision
from forumpulse.detectors.series import Detection
from forumpulse.pipeline.contracts import HEARTBEAT_FORMAT, split_envelope
from live_stack import FORUMPULSE_CONF

CONTRACTS = Path(__file__).resolve().parents[1] / "schemas" / "contracts"


def _schema(topic: str) -> dict[str, object]:
    schema = json.loads((CONTRACTS / f"{topic}.v1.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def _lines(name: str) -> list[bytes]:
    lines = (CONTRACTS / name).read_bytes().splitlines()
    assert lines, f"{name} is empty"
    return lines


def test_raw_examples_split_into_six_fields() -> None:
    for value in _lines("weblogs.raw.v1.example"):
        parts = value.split(b"\t", 5)
        assert len(parts) == 6 and parts[0] == b"fp1", value
        assert all(p and b"\r" not in p for p in parts[1:5])
        env = split_envelope(value)
        assert env is not None and not env.is_heartbeat and env.line == parts[5]
    for value in _lines("weblogs.raw.v1.heartbeat.example"):
        env = split_envelope(value)
        assert env is not None and env.is_heartbeat and env.format == HEARTBEAT_FORMAT
        kv = dict(item.split("=") for item in env.line.decode().split())
        assert int(kv["ts"]) > 1_500_000_000


def test_syslogng_template_is_the_documented_envelope() -> None:
    conf = FORUMPULSE_CONF.read_text()
    templates = re.findall(r'^\s*message\("([^"]*)"\)', conf, flags=re.M)
    assert templates == ["fp1\\t${.fp.site}\\t${.fp.host}\\t${.fp.file}\\t${.fp.format}\\t${MSG}"]
    assert re.search(r'^\s*key\("\$\{\.fp\.client\}"\)', conf, flags=re.M)
    assert f'set("{HEARTBEAT_FORMAT}" value(".fp.format"))' in conf
    doc = (CONTRACTS / "weblogs.raw.v1.md").read_text()
    assert "fp1 TAB <site> TAB <origin_host> TAB <origin_file> TAB <format> TAB <raw line>" in doc


def test_dlq_example_headers() -> None:
    ex = json.loads((CONTRACTS / "weblogs.raw.dlq.v1.example.json").read_text())
    assert set(ex["headers"]) == {"fp-reason", "fp-detail", "fp-source"}
    assert re.fullmatch(r"weblogs\.raw/\d+/\d+", ex["headers"]["fp-source"])
    assert split_envelope(ex["value"].encode()) is None  # why it was dead-lettered


@pytest.mark.parametrize("topic", ["weblogs.events", "weblogs.decisions"])
def test_json_examples_validate(topic: str) -> None:
    validator = jsonschema.Draft202012Validator(_schema(topic))
    for line in _lines(f"{topic}.v1.example"):
        validator.validate(json.loads(line))


@pytest.mark.parametrize("topic,bad", [
    ("weblogs.events", {"kind": None}),
    ("weblogs.events", {"start": "10/Oct/2023:13:55:36"}),
    ("weblogs.decisions", {"action": "delete"}),
    ("weblogs.decisions", {"duration_s": -5}),
])
def test_schemas_reject_broken_payloads(topic: str, bad: dict[str, object]) -> None:
    obj = json.loads(_lines(f"{topic}.v1.example")[0])
    obj.update(bad)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _schema(topic))


def test_real_producer_payloads_validate() -> None:
    t = datetime(2023, 10, 10, 13, 55, tzinfo=UTC)
    det = Detection(kind="spike", scope="site", start=t, end=None, peak_ts=t, observed=10.0, expected=2.0,
                    score=5.0, label="spike", detail={"k": 1}, site="forum.example.org")
    jsonschema.validate(json.loads(det.to_json()), _schema("weblogs.events"))
    ms = int(t.timestamp() * 1000)
    dec = Decision(id="x1", created_at=ms, decided_at=ms, first_seen=ms - 60_000, expires_at=ms + 3_600_000,
                   site="forum.example.org", action="ban", value="203.0.113.7", scope="ip", reason="flood",
                   duration_s=3600, mode="enforce", origin="forumpulse", evidence={"requests": 900})
    jsonschema.validate(dec.to_json(), _schema("weblogs.decisions"))
