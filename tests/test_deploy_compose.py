"""deploy/compose: the compose stack is valid without a Docker engine.

* the file validates against the compose-spec JSON schema (vendored in tests/fixtures/deploy, Apache-2.0), before
  and after variable interpolation, and with Debian's ``docker-compose`` 1.29 ``config``;
* secrets have no defaults (``${VAR:?message}``): compose refuses to render without them;
* every image (compose and Dockerfile ``FROM``) has an explicit version tag, every mounted file and build input
  exists in the repo, long-running services have health checks;
* the forumpulse commands and options the stack runs exist in the CLI;
* the helper scripts (ClickHouse user init, Kafka topics, syslog-ng entrypoint) do what the stack relies on,
  run against recording stand-ins for ``clickhouse`` / ``kafka-topics.sh`` and the real ``syslog-ng --syntax-only``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
# The compose-spec JSON schema as shipped by Debian's docker-compose package (installed by deploy/install-system-deps.sh).
SCHEMA = Path("/usr/lib/python3/dist-packages/compose/config/compose_spec.json")
CLI = ROOT / ".venv" / "bin" / "forumpulse"

SECRETS = ["CLICKHOUSE_ADMIN_PASSWORD", "FORUMPULSE_INGEST_PASSWORD", "GRAFANA_CH_PASSWORD",
           "GRAFANA_ADMIN_PASSWORD", "FORUMPULSE_DECISION_API_KEY", "FORUMPULSE_DETECTORS_PASSWORD", "KAFKA_CLUSTER_ID"]
TEST_ENV = {name: f"t3st{i}value" for i, name in enumerate(SECRETS)}

_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


class MissingVariable(Exception):
    pass


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose-spec interpolation: ${V}, ${V:-default}, ${V-default}, ${V:?err}, ${V?err}, $V, $$ -> $."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2), m.group(3)
        val = env.get(name)
        unset_or_empty = val is None or (val == "" and op is not None and op.startswith(":"))
        if op in (":-", "-"):
            return arg if unset_or_empty else (val or "")
        if op in (":?", "?"):
            if unset_or_empty:
                raise MissingVariable(f"{name}: {arg}")
            return val or ""
        return val or ""

    return _VAR.sub(sub, value)


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def resolved() -> dict[str, Any]:
    return interpolate(load_compose(), TEST_ENV)


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    s = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(s)
    return s


def test_interpolated_file_validates_against_compose_spec(schema: dict[str, Any]) -> None:
    """Compose validates after interpolation and type conversion (the raw file has `scale: ${FORUMPULSE_CONSUMERS:-2}`,
    which compose turns into the integer 2, as it does for every integer field)."""
    doc = resolved()
    for svc in doc["services"].values():
        if isinstance(svc.get("scale"), str) and svc["scale"].isdigit():
            svc["scale"] = int(svc["scale"])
    jsonschema.Draft7Validator(schema).validate(doc)


def test_schema_rejects_a_broken_file(schema: dict[str, Any]) -> None:
    """The schema really constrains services (guards against a schema that accepts everything)."""
    bad = resolved()
    bad["services"]["kafka"]["restrat"] = "always"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(bad)


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _docker_compose() -> str:
    exe = shutil.which("docker-compose")
    assert exe, "docker-compose not found: apt-get install docker-compose (Debian 12 ships 1.29; needs no engine)"
    return exe


def _env_file(tmp_path: Path, values: dict[str, str]) -> Path:
    example = (COMPOSE_DIR / ".env.example").read_text()
    lines = []
    for ln in example.splitlines():
        m = re.match(r"^([A-Z0-9_]+)=(.*)$", ln)
        if m and m.group(1) in values:
            ln = f"{m.group(1)}={values[m.group(1)]}"
        lines.append(ln)
    p = tmp_path / "test.env"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_env_example_lists_every_variable_and_no_secret_values() -> None:
    text = (COMPOSE_DIR / ".env.example").read_text()
    assigned = dict(re.findall(r"^([A-Z0-9_]+)=(.*)$", text, re.M))
    used = {m.group(1) or m.group(4) for text in _strings(load_compose()) for m in _VAR.finditer(text)
            if m.group(0) != "$$"}
    assert used - set(assigned) == set(), f".env.example misses {sorted(used - set(assigned))}"
    for name in SECRETS:
        assert assigned[name] == "", f"{name} must have no value in .env.example"


def test_docker_compose_1_29_config_accepts_the_file(tmp_path: Path) -> None:
    exe = _docker_compose()
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    r = subprocess.run([exe, "--env-file", str(_env_file(tmp_path, TEST_ENV)), "-f", str(COMPOSE), "config"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    rendered = yaml.safe_load(r.stdout)
    assert set(rendered["services"]) == set(load_compose()["services"])
    assert rendered["services"]["forumpulse-consumer"]["scale"] == 2
    url = rendered["services"]["forumpulse-consumer"]["environment"]["FORUMPULSE_STORE__URL"]
    assert url == f"clickhouse://forumpulse_ingest:{TEST_ENV['FORUMPULSE_INGEST_PASSWORD']}@clickhouse:8123/forumpulse"


@pytest.mark.parametrize("missing", SECRETS)
def test_no_default_secrets_compose_refuses_without_them(tmp_path: Path, missing: str) -> None:
    exe = _docker_compose()
    values = {k: v for k, v in TEST_ENV.items() if k != missing}
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    r = subprocess.run([exe, "--env-file", str(_env_file(tmp_path, values)), "-f", str(COMPOSE), "config"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0
    assert f"set {missing}" in r.stderr, r.stderr
    with pytest.raises(MissingVariable, match=missing):
        interpolate(load_compose(), {k: v for k, v in TEST_ENV.items() if k != missing})


def test_secret_looking_settings_are_required_variables() -> None:
    for name, svc in load_compose()["services"].items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|API_KEY|SECRET|CLUSTER_ID", key) or (key == "FORUMPULSE_STORE__URL"):
                assert isinstance(value, str) and ":?" in value, f"{name}.{key} must be ${{VAR:?...}}, got {value!r}"


def _image_tag_ok(image: str) -> bool:
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and re.search(r"\d", tag) is not None


def _dockerfiles() -> list[Path]:
    out = []
    for svc in resolved()["services"].values():
        b = svc.get("build")
        if b:
            out.append((COMPOSE_DIR / b["context"] / b["dockerfile"]).resolve())
    return sorted(set(out))


def test_every_image_is_pinned() -> None:
    images = [svc["image"] for svc in resolved()["services"].values() if "image" in svc]
    assert images, "no images found"
    bad = [i for i in images if not _image_tag_ok(i)]
    assert not bad, f"unpinned images: {bad}"
    froms = []
    for df in _dockerfiles():
        froms += re.findall(r"^FROM\s+(\S+)", df.read_text(), re.M)
    assert len(froms) >= 2
    assert all(_image_tag_ok(f) for f in froms), froms
    assert not _image_tag_ok("grafana/grafana:latest") and not _image_tag_ok("prom/prometheus")


def test_every_mounted_file_and_build_input_exists() -> None:
    raw = load_compose()
    for name, svc in resolved()["services"].items():
        raw_vols = raw["services"][name].get("volumes") or (raw.get("x-forumpulse", {}).get("volumes") or [])
        for vol, raw_vol in zip(svc.get("volumes", []), raw_vols, strict=False):
            src = vol.split(":", 1)[0]
            if not src.startswith((".", "/")):
                assert src in raw["volumes"], f"{name}: named volume {src} not declared"
                continue
            if raw_vol.startswith("${"):
                continue  # host data folder chosen by the user (log directories), not a repo file
            path = (COMPOSE_DIR / src).resolve()
            assert path.exists(), f"{name}: mounted {src} does not exist ({path})"
            assert ROOT in path.parents, f"{name}: {src} is outside the repo"
        b = svc.get("build")
        if b:
            ctx = (COMPOSE_DIR / b["context"]).resolve()
            df = ctx / b["dockerfile"]
            assert df.is_file(), df
            for line in re.findall(r"^COPY\s+(.+)$", df.read_text(), re.M):
                for src in line.split()[:-1]:
                    assert (ctx / src).exists(), f"{df.name}: COPY source {src} missing"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether a .dockerignore excludes ``path`` (patterns in order, the last match wins, ``!`` re-includes; a
    pattern also covers what lies below a folder it matches)."""
    from fnmatch import fnmatch

    out = False
    for p in patterns:
        neg, pat = p.startswith("!"), p.lstrip("!").rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if any(fnmatch(x, pat) or fnmatch(x, pat.removeprefix("**/")) for x in prefixes):
            out = not neg
    return out


def _ignore_file(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_build_contexts_keep_what_the_images_copy_and_leave_out_the_bulk() -> None:
    """Both builders: BuildKit reads <Dockerfile>.dockerignore, the classic builder (docker-compose 1.x) only the
    context's .dockerignore; neither may drop a COPY source, and the classic one must leave out .venv and data."""
    root_ignore = _ignore_file(ROOT / ".dockerignore")
    assert _ignored(".venv/lib/x.py", root_ignore) and _ignored("data/nasa/x.log", root_ignore)
    assert _ignored("pipeline/__pycache__/x.pyc", root_ignore) and not _ignored("pipeline/cli.py", root_ignore)
    for svc in resolved()["services"].values():
        b = svc.get("build")
        if not b:
            continue
        df = (COMPOSE_DIR / b["context"]).resolve() / b["dockerfile"]
        own = _ignore_file(df.with_name(df.name + ".dockerignore"))
        for line in re.findall(r"^COPY\s+(.+)$", df.read_text(), re.M):
            for src in line.split()[:-1]:
                assert not _ignored(src, root_ignore), f"{df.name}: .dockerignore drops COPY source {src}"
                assert not _ignored(src, own), f"{df.name}: {df.name}.dockerignore drops COPY source {src}"


def test_the_image_installs_the_pinned_versions() -> None:
    text = (COMPOSE_DIR / "Dockerfile").read_text()
    assert re.search(r"pip install -c constraints\.txt -e \.", text)
    assert re.search(r"^COPY [^\n]*\bconstraints\.txt\b", text, re.M)


def test_long_running_services_have_healthchecks_and_restart() -> None:
    services = resolved()["services"]
    oneshots = {n for n, s in services.items() if s.get("restart") == "no"}
    assert oneshots == {"kafka-init", "forumpulse-migrate"}
    for name, svc in services.items():
        if name in oneshots:
            continue
        assert svc.get("restart") == "unless-stopped", name
        assert "test" in svc.get("healthcheck", {}), f"{name} has no healthcheck"
    for name in ("forumpulse-consumer", "forumpulse-detectors"):
        deps = services[name]["depends_on"]
        assert deps["forumpulse-migrate"]["condition"] == "service_completed_successfully"
        assert deps["kafka-init"]["condition"] == "service_completed_successfully"


def test_published_ports_bind_the_configured_address() -> None:
    """Every port binds FORUMPULSE_BIND (127.0.0.1 by default), except the decision API, which has a bind of its
    own (also 127.0.0.1 by default) so that bouncers elsewhere can reach it without the detectors' endpoint."""
    seen = []
    for name, svc in load_compose()["services"].items():
        for p in svc.get("ports", []):
            if p.endswith(":8090"):
                assert (name, p) == ("forumpulse-detectors",
                                     "${FORUMPULSE_DECISION_API_BIND:-127.0.0.1}:${FORUMPULSE_DECISION_API_PORT:-8090}:8090")
                seen.append(p)
                continue
            assert p.startswith("${FORUMPULSE_BIND:-127.0.0.1}:"), f"{name}: {p} must bind FORUMPULSE_BIND"
    assert len(seen) == 1


def test_the_endpoint_that_lifts_bans_needs_a_password() -> None:
    cmd = load_compose()["services"]["forumpulse-detectors"]["command"]
    assert "--password-env" in cmd
    var = cmd[cmd.index("--password-env") + 1]
    env = load_compose()["services"]["forumpulse-detectors"]["environment"]
    assert env[var] == f"${{{var}:?set {var} in .env}}" and var in SECRETS


def _forumpulse_commands() -> list[list[str]]:
    cmds = []
    for svc in resolved()["services"].values():
        c = svc.get("command")
        if isinstance(c, list) and c and c[0] == "forumpulse":
            cmds.append(c[1:])
        elif isinstance(c, list) and c[:2] == ["/bin/sh", "-c"]:
            m = re.search(r"forumpulse ((?:[a-z-]+ ?)+)(.*?)(?:>|\|\||;|$)", c[2])
            assert m, c
            cmds.append(m.group(1).split() + m.group(2).split())
    return cmds


def _help(path: list[str]) -> str:
    assert CLI.exists(), f"{CLI} missing: run `make install` first"
    r = subprocess.run([str(CLI), *path, "--help"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, f"`forumpulse {' '.join(path)}` is not a command: {r.stderr[-500:]}"
    return r.stdout


def test_forumpulse_commands_and_options_exist() -> None:
    cmds = _forumpulse_commands()
    assert [c[0] for c in cmds] == ["db", "consume", "run"], cmds
    for argv in cmds:
        words = [w for w in argv if not w.startswith("-")]
        path = []
        for w in words:
            if w.startswith(('"', "$")) or w[0].isdigit() or w.startswith("0.0"):
                break
            path.append(w)
        text = _help(path)
        for opt in (a for a in argv if a.startswith("--")):
            assert opt in text, f"forumpulse {' '.join(path)} has no option {opt}"


def test_compose_forumpulse_config_is_valid_with_the_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    import forumpulse.detectors.dos_rules
    import forumpulse.detectors.traffic
    import forumpulse.pipeline.live_detect  # noqa: F401
    from forumpulse.pipeline.config import ConfigError, load_settings

    for k in list(os.environ):
        if k.startswith("FORUMPULSE_"):
            monkeypatch.delenv(k)
    cfg = COMPOSE_DIR / "forumpulse.yaml"
    with pytest.raises(ConfigError, match=r"actions\.decision_api"):
        load_settings(cfg)
    env = resolved()["services"]["forumpulse-detectors"]["environment"]
    for k, v in env.items():
        if k.startswith("FORUMPULSE_") and k != "FORUMPULSE_CONFIG":
            monkeypatch.setenv(k, str(v))
    s = load_settings(cfg)
    assert s.store.url.startswith("clickhouse://forumpulse_ingest:")
    assert s.kafka.bootstrap_servers == "kafka:9092"
    assert s.detectors["live"]["dos_source"] == "feed"
    monkeypatch.setenv("FORUMPULSE_DETECTORS", '{"live": {"dos_source": "nowhere"}}')
    with pytest.raises(ConfigError, match=r"detectors\.live\.dos_source"):
        load_settings(cfg)
    # the spool of decisions ClickHouse had not taken at a stop outlives the container, and its user may write it
    from forumpulse.pipeline.live_detect import live_config

    workdir = re.findall(r"^WORKDIR\s+(\S+)", (COMPOSE_DIR / "Dockerfile").read_text(), re.M)[-1]
    spool = str(Path(workdir) / live_config(s).spool_dir)
    mounts = {v.split(":")[1]: v.split(":")[0] for v in resolved()["services"]["forumpulse-detectors"]["volumes"]}
    assert spool in mounts and mounts[spool] in load_compose()["volumes"], (spool, mounts)
    assert "/etc/forumpulse/forumpulse.yaml" in mounts  # its own volumes replace the shared list: config kept
    assert re.search(rf"install -d -o forumpulse -g forumpulse .*{re.escape(spool)}",
                     (COMPOSE_DIR / "Dockerfile").read_text())


# ---------------------------------------------------------------------------------------- helper scripts


def _recorder(tmp_path: Path, name: str) -> tuple[Path, Path]:
    log = tmp_path / f"{name}.log"
    exe = tmp_path / name
    exe.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\n')
    exe.chmod(0o755)
    return exe, log


def test_clickhouse_init_creates_users_without_secrets_on_command_lines(tmp_path: Path) -> None:
    """The first-start script runs `clickhouse client` with no password in its argv (ps shows argv to every user
    of the Docker host): admin credentials in a 0600 config file removed afterwards; each new user's password
    only inside its CREATE USER statement (ClickHouse masks it in its logs; a SET param_pw would be logged), on
    stdin, comment lines left out.  Every statement sent parses in the real engine (chDB, EXPLAIN AST)."""
    from chdb import session

    script = ROOT / "deploy" / "clickhouse" / "initdb" / "10-forumpulse-users.sh"
    assert os.access(script, os.X_OK), "not executable: the image's entrypoint would source it"
    log = tmp_path / "calls.log"
    fake = tmp_path / "clickhouse"
    # records: argv, the config file's mode and content, then the SQL it was given on stdin
    fake.write_text(f"""#!/bin/bash
cfg=""; prev=""
for a in "$@"; do [ "$prev" = --config-file ] && cfg=$a; prev=$a; done
{{ echo "ARGV $*"; echo "MODE $(stat -c %a "$cfg")"; echo "CFG $(tr -d '\\n' < "$cfg")"; echo "CFGPATH $cfg"
   sed 's/^/SQL /'; echo END; }} >> "{log}"
""")
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "CLICKHOUSE_CLIENT": str(fake), "CLICKHOUSE_USER": "admin",
           "CLICKHOUSE_PASSWORD": "adm1n-pw", "FORUMPULSE_INGEST_PASSWORD": "ing3st-pw", "GRAFANA_CH_PASSWORD": "gr4f-pw",
           "FORUMPULSE_SQL_DIR": str(ROOT / "deploy" / "clickhouse"), "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [c.strip().splitlines() for c in log.read_text().split("END\n") if c.strip()]
    assert len(calls) == 3
    for call in calls:
        argv = call[0]
        assert argv.startswith("ARGV client --config-file ")
        for secret in ("adm1n-pw", "ing3st-pw", "gr4f-pw"):
            assert secret not in argv, argv
        assert call[1] == "MODE 600"
        assert "<host>127.0.0.1</host>" in call[2] and "<user>admin</user>" in call[2]
        assert "<password>adm1n-pw</password>" in call[2]
        assert not Path(call[3].split(" ", 1)[1]).exists(), "client config file left behind"
    sql = ["\n".join(line[4:] for line in call if line.startswith("SQL ")) for call in calls]
    assert "CREATE DATABASE IF NOT EXISTS forumpulse" in sql[0]
    for text, pw, user in ((sql[1], "ing3st-pw", "forumpulse_ingest"), (sql[2], "gr4f-pw", "grafana_ro")):
        assert "{pw:String}" not in text and "param_pw" not in text and not re.search(r"^\s*--", text, re.M)
        (line,) = [x for x in text.splitlines() if pw in x]  # the password once, in its CREATE USER only
        assert line.startswith(f"CREATE USER IF NOT EXISTS {user} ") and f"BY '{pw}'" in line
    s = session.Session()
    for text in sql:
        for statement in (x.strip() for x in text.split(";")):
            if statement:
                assert s.query(f"EXPLAIN AST {statement}", "TSV") is not None
    # a password that would need quoting is refused before the client runs
    log.unlink()
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                       env={**env, "GRAFANA_CH_PASSWORD": "it's"})
    assert r.returncode == 2 and "GRAFANA_CH_PASSWORD must be URL-safe" in r.stderr and not log.exists()
    del env["GRAFANA_CH_PASSWORD"]
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0 and "GRAFANA_CH_PASSWORD" in r.stderr


def test_compose_clickhouse_leaves_clickhouse_db_unset() -> None:
    """The image's entrypoint creates CLICKHOUSE_DB with `clickhouse-client --password ...` on a command line;
    our init script creates the database instead."""
    compose = yaml.safe_load((COMPOSE_DIR / "docker-compose.yml").read_text())
    assert "CLICKHOUSE_DB" not in compose["services"]["clickhouse"]["environment"]


def test_ingest_user_sql_is_least_privilege() -> None:
    sql = (ROOT / "deploy" / "clickhouse" / "ingest_user.sql").read_text()
    grants = re.findall(r"^GRANT (.+?) ON (\S+) TO forumpulse_writer;", sql, re.M)
    assert grants, "no grants found"
    for privs, target in grants:
        assert target.startswith(("forumpulse.", "system.")), target
        if privs == "ALTER DELETE":  # only on the topic groups, which the loaders make the configured ones
            assert target in ("forumpulse.topic_groups", "forumpulse.topic_groups_local"), target
            continue
        assert not re.search(r"\b(ALL|DROP|ALTER|TRUNCATE|ACCESS MANAGEMENT)\b", privs), privs
        if target.startswith("system."):
            assert privs == "SELECT"
    assert "{pw:String}" in sql and "IDENTIFIED WITH sha256_password" in sql


def test_kafka_topics_script(tmp_path: Path) -> None:
    fake, log = _recorder(tmp_path, "kafka-topics.sh")
    script = COMPOSE_DIR / "kafka-topics.sh"
    env = {"PATH": os.environ["PATH"], "KAFKA_TOPICS": str(fake), "RAW_PARTITIONS": "12"}
    r = subprocess.run(["bash", str(script), "kafka:9092"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    creates = {c.split("--topic ")[1].split()[0]: c for c in log.read_text().splitlines() if "--create" in c}
    assert set(creates) == {"weblogs.raw", "weblogs.raw.dlq", "weblogs.events", "weblogs.decisions"}
    assert "--partitions 12" in creates["weblogs.raw"] and "--if-not-exists" in creates["weblogs.raw"]
    assert all("--bootstrap-server kafka:9092" in c for c in creates.values())
    env["RAW_PARTITIONS"] = "0"
    r = subprocess.run(["bash", str(script), "kafka:9092"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "RAW_PARTITIONS" in r.stderr


def _entrypoint(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    assert shutil.which("syslog-ng"), "syslog-ng not found: apt-get install syslog-ng-core syslog-ng-mod-rdkafka"
    env = {"PATH": os.environ["PATH"], "FP_CHECK_ONLY": "1", "FP_STATE_DIR": str(tmp_path / "state"),
           "FP_TEMPLATE": str(ROOT / "syslog-ng" / "forumpulse.conf"),
           "FP_RENDER": str(ROOT / "deploy" / "syslog-ng" / "syslogng.sh"),
           "FP_HEARTBEAT_CMD": str(ROOT / "syslog-ng" / "heartbeat.sh"), **extra}
    return subprocess.run(["bash", str(COMPOSE_DIR / "syslog-ng-entrypoint.sh")], capture_output=True, text=True,
                          env=env, timeout=60)


def test_syslog_ng_entrypoint_renders_a_valid_config(tmp_path: Path) -> None:
    r = _entrypoint(tmp_path, FP_KAFKA_BOOTSTRAP="kafka:9092", FP_ORIGIN_HOST="web7",
                    FP_SYSLOGNG_DEFINES="fp_squid_site=proxy2 fp_vhost_format=combined_d")
    assert r.returncode == 0, r.stderr
    conf = (tmp_path / "state" / "syslog-ng.conf").read_text()
    for line in ('@define fp_kafka_bootstrap "kafka:9092"', '@define fp_listen_ip "0.0.0.0"',
                 '@define fp_origin_host "web7"', '@define fp_squid_site "proxy2"',
                 '@define fp_vhost_format "combined_d"', f'@define fp_state_dir "{tmp_path}/state/buffer"'):
        assert line in conf


def test_syslog_ng_entrypoint_rejects_unknown_defines(tmp_path: Path) -> None:
    r = _entrypoint(tmp_path, FP_SYSLOGNG_DEFINES="fp_no_such_define=1")
    assert r.returncode != 0 and "fp_no_such_define" in r.stderr


def test_syslog_ng_publishes_every_listener_of_the_collector() -> None:
    """docs list raw TCP/UDP, RFC3164 TCP/UDP and RFC5424 TCP/UDP: the compose service publishes each one."""
    text = (ROOT / "deploy" / "compose" / "docker-compose.yml").read_text()
    published = set(re.findall(r':(\d+)/(tcp|udp)"', text))
    for port in ("5140", "5514", "5515"):
        for proto in ("tcp", "udp"):
            assert (port, proto) in published, f"{port}/{proto} not published"
    expose = (ROOT / "deploy" / "compose" / "syslog-ng.Dockerfile").read_text()
    for port in ("5140", "5514", "5515"):
        assert f"{port}/tcp" in expose and f"{port}/udp" in expose
