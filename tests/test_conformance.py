"""Parser conformance against 317 upstream cases (apachelogs, Vector VRL, CrowdSec hub, plaso, Squid docs).

Each upstream names fields its own way; ``_expect_*`` map them onto the record contract (see the table in
``tests/fixtures/conformance/ATTRIBUTION.md``).  Cases that cannot be expressed in our contract are listed,
with reasons, in ``OUT_OF_SCOPE.md``; the test checks that this list is exactly the set of cases it skips.
Every other case must give the expected values; the score is printed and must be >= 99%.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from forumpulse.pipeline.formats import FormatParser, compile_spec, get_parser
from forumpulse.pipeline.formats._values import clf_timestamp_ms
from forumpulse.pipeline.record import DROP_REASONS, Drop, ParsedLine

FIX = Path(__file__).parent / "fixtures" / "conformance"
FILES = ("apachelogs_cases.jsonl", "vrl_cases.jsonl", "crowdsec_parser_cases.jsonl", "plaso_cases.jsonl",
         "squid_doc_cases.jsonl")

# Line shapes that are not a preset: the spec the site would configure (CrowdSec's grok patterns accept them).
_NPM_PROXY = ("nginx:[$time_local] $upstream_cache_status $upstream_status $status - $request_method $scheme $host "
              '"$request_uri" [Client $remote_addr] [Length $body_bytes_sent] [Gzip $gzip_ratio] '
              '[Sent-to $server] "$http_user_agent" "$http_referer"')
SPEC_OVERRIDES: list[tuple[str, str]] = [
    (r"^\S+ - \[", 'nginx:$remote_addr - [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
                   '"$http_user_agent"'),
    (r'^[a-z][\w.-]+ \S+ - - \[.* \d+ "[^"]*" "[^"]*" "[^"]*"$',
     'nginx:$host $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent '
     '"$http_referer" "$http_user_agent" "$http_x_forwarded_for"'),
    (r"^[a-z][\w.-]+ \d\S* \S+ \S+ \[", 'apache:%v %h %l %u %t "%r" %>s %O "%{Referer}i" "%{User-Agent}i"'),
    (r"^\[[^\]]+\] \S+ \S+ [\d.]+ \"", "nginx:[$time_local] $host $remote_addr $request_time \"$request\" $status "
                                      "$body_bytes_sent $bytes_sent $http_referer $http_user_agent"),
    (r"^\[[^\]]+\] \d+ - ", _NPM_PROXY.replace("$upstream_cache_status $upstream_status $status", "$status")),
    (r"^\[[^\]]+\] \S+ \d+ \d+ - ", _NPM_PROXY.replace(' [Sent-to $server]', "")),
    (r".* \[[^\]]*\] \[[^\]]*\] \S+ \S+ \S+ \S+ \S+$",
     'nginx:$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
     '"$http_user_agent" $request_length $request_time [$proxy_upstream_name] [$proxy_alternative_upstream_name] '
     "$upstream_addr $upstream_response_length $upstream_response_time $upstream_status $req_id"),
    (r'^\S+ \S+ \S+ \[[^\]]+\] "[^"]*" \S+ \S+ [^"\s]+ [^"\s]+$',
     'apache:%h %l %u %t "%r" %>s %b %{Referer}i %{User-Agent}i'),
    (r"^\S+ \S+ \S+ \[\d{4}-", 'apache:%h %l %u [%{%Y-%m-%dT%H:%M:%S}tZ] "%r" %>s %b'),
]


# Upstream accepts these lines; our contract cannot make a record of them (no timestamp / no client), so the
# mapped expectation is a drop with the named reason.
DIVERGENT: dict[str, tuple[str, str]] = {
    "vrl_cases.jsonl:8": ("no_format_matched", "all fields '-': no request quotes, no timestamp"),
    "vrl_cases.jsonl:9": ("bad_timestamp", "time '[-]': a record needs a timestamp"),
    "vrl_cases.jsonl:14": ("no_format_matched", "all fields '-': no request quotes, no timestamp"),
    "vrl_cases.jsonl:15": ("bad_timestamp", "time '[-]': a record needs a timestamp"),
    "vrl_cases.jsonl:16": ("bad_client", "client '-': a record needs a client"),
}


def load_cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in FILES:
        for i, line in enumerate((FIX / name).read_text(encoding="utf-8").splitlines(), start=1):
            out.append((f"{name}:{i}", json.loads(line)))
    return out


def out_of_scope() -> dict[str, str]:
    listed = {}
    for line in (FIX / "OUT_OF_SCOPE.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"^- `([^`]+)` — (.+)$", line)
        if m:
            listed[m.group(1)] = m.group(2)
    return listed


def iso_ms(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def apache_unescape(s: str | None) -> str | None:
    """apachelogs decodes Apache's escapes (``\\"``, ``\\\\``, ``\\xHH`` as latin-1); we keep values as logged,
    so the same decoding is applied to our value before comparing."""
    if s is None:
        return None
    return re.sub(r'\\(x[0-9A-Fa-f]{2}|.)',
                  lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) == 3 else m.group(1), s)


def request_line(r: ParsedLine) -> str:
    if not r.method:
        return r.url
    return f"{r.method} {r.url}" + (f" {r.protocol}" if r.protocol else "")


def client(r: ParsedLine) -> str | None:
    return r.client_ip if r.client_ip is not None else r.client_host


def dash(v: Any) -> Any:
    return None if v == "-" else v


# ------------------------------------------------------------------ per-upstream mapping -> (spec, expected)

def _spec_for(line: str, default: str) -> str:
    for rx, spec in SPEC_OVERRIDES:
        if re.match(rx, line):
            return spec
    return default


def _expect_apachelogs(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    e = c["expected"] or {}
    fmt = c["apache_logformat"]
    x: dict[str, Any] = {}
    if "remote_address" in e:
        x["client"] = e["remote_address"]
    elif "remote_host" in e:
        x["client"] = e["remote_host"]
    if "remote_logname" in e:
        x["ident"] = e["remote_logname"]
    if "remote_user" in e:
        x["user"] = e["remote_user"]
    for k in ("request_time", "final_request_time", "original_request_time"):
        if k in e:
            if e[k] is not None:
                x["ts"] = iso_ms(e[k])
            else:
                f = e.get(k + "_fields") or {}
                if f.get("year") is not None:
                    x["ts"] = iso_ms(f"{f['year']:04d}-{f['mon']:02d}-{f['mday']:02d}T00:00:00+00:00")
                else:
                    x["drop"] = "bad_timestamp"  # our record needs a timestamp: "-" is a drop
    if "request_line" in e:
        x["request"] = e["request_line"] or ""
    for k in ("final_status", "status", "original_status"):
        if k in e:
            x["status"] = e[k]
            break
    for k in ("bytes_sent", "bytes_out"):
        if k in e:
            x["bytes"] = e[k]
            break
    h = e.get("headers_in") or {}
    if "Referer" in h:
        x["referer_unesc"] = h["Referer"]
    if "User-Agent" in h:
        x["user_agent_unesc"] = h["User-Agent"]
    if "virtual_host" in e:
        x["vhost"] = e["virtual_host"]
    if "request_method" in e:
        x["method"] = e["request_method"]
    if "request_uri" in e:
        x["path_unesc"] = e["request_uri"]
    if "request_query" in e:
        x["query"] = (e["request_query"] or "")[1:]
    if "request_protocol" in e:
        x["protocol"] = e["request_protocol"]
    for k, scale in (("request_duration_microseconds", 0.001), ("request_duration_milliseconds", 1.0),
                     ("request_duration_seconds", 1000.0), ("final_request_duration_seconds", 1000.0),
                     ("original_request_duration_seconds", 1000.0)):
        if k in e:
            x["elapsed_ms"] = None if e[k] is None else e[k] * scale
            break
    return "apache:" + fmt, x


def _vrl_ts(v: Any) -> int:
    return iso_ms(v["timestamp_rfc3339"] if isinstance(v, dict) else v)


def _expect_vrl(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fmt = c["format"]
    e = c["expected"] or {}
    if fmt.endswith(":error"):
        return "auto", {"drop": "not_access_log"}
    default = {"vrl:parse_apache_log:common": "common", "vrl:parse_common_log": "common",
               "vrl:parse_apache_log:combined": "combined"}.get(fmt, "auto")
    spec = _spec_for(c["line"], default)
    x: dict[str, Any] = {}
    for k in ("host", "client", "remote_addr"):
        if k in e:
            x["client"] = e[k]
    if "identity" in e:
        x["ident"] = e["identity"]
    for k in ("user", "remote_user"):
        if k in e:
            x["user"] = e[k]
    if "timestamp" in e:
        x["ts"] = _vrl_ts(e["timestamp"])
    for k in ("message", "request"):
        if k in e:
            x["request"] = e[k]
    for k, f in (("method", "method"), ("path", "url"), ("protocol", "protocol"), ("status", "status")):
        if k in e:
            x[f] = e[k]
    for k in ("size", "body_bytes_size"):
        if k in e:
            x["bytes"] = e[k]
    for k in ("referrer", "referer", "http_referer"):
        if k in e:
            x["referer"] = dash(e[k])
    for k in ("agent", "http_user_agent"):
        if k in e:
            x["user_agent"] = dash(e[k])
    if "request_time" in e:
        x["elapsed_ms"] = e["request_time"] * 1000
    if "upstream_addr" in e:
        x["upstream"] = dash(e["upstream_addr"])
    return spec, x


_CS_ERROR_KEYS = {"loglevel", "errorcode", "module"}


def _expect_crowdsec(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    p = (c["expected"] or {}).get("Parsed") or {}
    if _CS_ERROR_KEYS & set(p):
        return "auto", {"drop": "not_access_log"}
    x: dict[str, Any] = {}
    for k in ("remote_addr", "clientip"):
        if k in p:
            x["client"] = p[k]
    for k in ("remote_user", "auth"):
        if k in p:
            x["user"] = dash(p[k])
    if "ident" in p:
        x["ident"] = dash(p["ident"])
    for k in ("time_local", "timestamp"):
        if k in p:
            x["ts"] = clf_timestamp_ms(p[k])
    if "verb" in p:
        x["method"] = p["verb"]
    if "request" in p:  # CrowdSec's request is the target (path + query), not the request line
        x["url"] = p["request"]
    if "rawrequest" in p:
        x["method"] = ""
        x["url"] = p["rawrequest"]
    if "http_version" in p:
        x["protocol"] = "HTTP/" + p["http_version"]
    for k in ("status", "response"):
        if k in p:
            x["status"] = int(p[k])
    for k in ("body_bytes_sent", "bytes"):
        if k in p:
            x["bytes"] = int(p[k])
    for k in ("http_referer", "referrer"):
        if k in p:
            x["referer"] = dash(p[k])
    if "http_user_agent" in p:
        x["user_agent"] = dash(p["http_user_agent"])
    if "target_fqdn" in p:
        x["vhost"] = p["target_fqdn"]
    if "request_time" in p:
        x["elapsed_ms"] = float(p["request_time"]) * 1000
    return _spec_for(c["line"], "auto"), x


def _expect_plaso(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    e = c["expected"] or {}
    x: dict[str, Any] = {}
    m = {"ip_address": "client", "client_ip": "client", "remote_name": "ident", "username": "user",
         "user_id": "user", "http_response_code": "status", "http_status": "status",
         "http_response_bytes": "bytes", "bytes_transferred": "bytes", "http_request_referer": "referer",
         "http_request_user_agent": "user_agent", "server_name": "vhost", "result_code": "cache_result",
         "response_time": "elapsed_ms", "content_type": "content_type", "http_request": "request"}
    for k, f in m.items():
        if k in e:
            x[f] = e[k]
    if "recorded_time" in e:
        x["ts"] = iso_ms(e["recorded_time"])
    if "hierarchy_info" in e:
        x["hier_peer"] = e["hierarchy_info"]
    return "auto", x


def _expect_squid_doc(c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    e = c["expected"]
    return "squid", {"ts": round(e["time"] * 1000), "elapsed_ms": e["elapsed_ms"], "client": e["remotehost"],
                     "cache_result": e["code"], "status": e["status"], "bytes": e["bytes"], "method": e["method"],
                     "url": e["url"], "user": dash(e["rfc931"]), "hierarchy": e["peerstatus"],
                     "upstream": dash(e["peerhost"]), "content_type": dash(e["type"])}


def expectation(cid: str, c: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    src = cid.split(":")[0]
    fn = {"apachelogs_cases.jsonl": _expect_apachelogs, "vrl_cases.jsonl": _expect_vrl,
          "crowdsec_parser_cases.jsonl": _expect_crowdsec, "plaso_cases.jsonl": _expect_plaso,
          "squid_doc_cases.jsonl": _expect_squid_doc}[src]
    return fn(c)


def _actual(r: ParsedLine, key: str) -> Any:
    if key == "client":
        return client(r)
    if key == "request":
        return request_line(r)
    if key.endswith("_unesc"):
        return apache_unescape(getattr(r, key[: -len("_unesc")]))
    if key == "hier_peer":
        return f"{r.hierarchy}/{r.upstream or '-'}"
    return getattr(r, key)


def check_case(cid: str, c: dict[str, Any]) -> list[str]:
    """Problems found for one case (empty = conforms)."""
    line = c["line"]
    if c.get("format") == "apache_timestamp":
        got = clf_timestamp_ms(line)
        if c["expect_error"]:
            return [] if got is None else [f"expected an error, got {got}"]
        want_ts = iso_ms(c["expected"]["timestamp"])
        return [] if got == want_ts else [f"ts {got} != {want_ts}"]
    spec, want = expectation(cid, c)
    if cid in DIVERGENT:
        want = {"drop": DIVERGENT[cid][0]}
    if c.get("format") == "apache_logformat":
        parser: Any = FormatParser(compile_spec(spec, require_time=False), "custom")
    else:
        parser = get_parser(spec)
    r = parser.parse(line)
    if isinstance(r, Drop):
        assert r.reason in DROP_REASONS
        if "parser error" in r.detail:
            return [f"internal error: {r.detail}"]
        if c["expect_error"]:
            return []
        if want.get("drop") == r.reason:
            return []
        return [f"dropped {r.reason} ({r.detail}) with spec {spec!r}"]
    if c["expect_error"] or "drop" in want:
        return [f"expected a drop ({want.get('drop', 'error')}), got {r}"]
    problems = []
    for k, v in want.items():
        got = _actual(r, k)
        if isinstance(v, float) or isinstance(got, float):
            ok = got is not None and v is not None and abs(float(got) - float(v)) < 1e-6
        else:
            ok = got == v
        if not ok:
            problems.append(f"{k}: got {got!r}, want {v!r}")
    return problems


def test_out_of_scope_list_is_exactly_what_is_skipped() -> None:
    cases = dict(load_cases())
    listed = out_of_scope()
    assert len(cases) == 317
    unknown = set(listed) - set(cases)
    assert not unknown, f"OUT_OF_SCOPE.md names cases that do not exist: {sorted(unknown)}"
    for cid, reason in listed.items():
        assert reason.strip(), cid


def test_conformance_score() -> None:
    cases = load_cases()
    skipped = out_of_scope()
    results: dict[str, list[str]] = {}
    for cid, c in cases:
        if cid in skipped:
            continue
        results[cid] = check_case(cid, c)
    evaluated = len(results)
    assert evaluated + len(skipped) == len(cases)  # nothing silently dropped
    failed = {k: v for k, v in results.items() if v}
    score = (evaluated - len(failed)) / evaluated
    per_source: dict[str, list[int]] = {}
    for cid, probs in results.items():
        s = per_source.setdefault(cid.split(":")[0], [0, 0])
        s[0] += not probs
        s[1] += 1
    print(f"\nconformance: {evaluated - len(failed)}/{evaluated} in-scope cases right ({score:.1%}); "
          f"{len(skipped)} out of scope")
    for src, (ok, n) in sorted(per_source.items()):
        print(f"  {src}: {ok}/{n}")
    for cid, probs in failed.items():
        print(f"  FAIL {cid}: {'; '.join(probs)}")
    assert score >= 0.99, f"{len(failed)} failures: " + json.dumps(failed, indent=1)[:4000]


@pytest.mark.parametrize("cid", ["squid_doc_cases.jsonl:1", "plaso_cases.jsonl:16", "crowdsec_parser_cases.jsonl:1"])
def test_individual_sources_conform(cid: str) -> None:
    cases = dict(load_cases())
    assert check_case(cid, cases[cid]) == []
