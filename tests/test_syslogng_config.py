"""syslog-ng configs: every shipped config passes `syslog-ng --syntax-only`; define overrides are checked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from live_stack import FORUMPULSE_CONF, SYSLOGNG_DIR, SYSLOGNG_SH, ensure_syslogng_installed

pytestmark = pytest.mark.syslogng
CONFIGS = sorted(SYSLOGNG_DIR.glob("*.conf"))


def _sh(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SYSLOGNG_SH), *map(str, args)], capture_output=True, text=True, check=False)


def test_configs_exist() -> None:
    assert FORUMPULSE_CONF in CONFIGS


@pytest.mark.parametrize("conf", CONFIGS, ids=lambda p: p.name)
def test_syntax_only(conf: Path, tmp_path: Path) -> None:
    ensure_syslogng_installed()
    proc = _sh("check", "--config", conf, "--dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    rendered = (tmp_path / "syslog-ng.conf").read_text()
    # the invariants the pipeline relies on
    paths = re.findall(r"^log \{.*?^\};", rendered, flags=re.M | re.S)
    assert paths, "no log paths"
    for path in paths:
        assert re.search(r"^\s*flags\(flow-control\);", path, flags=re.M), f"log path lacks flow-control:\n{path}"
    assert '@define fp_disk_buf_reliable "yes"' in rendered and "reliable(`fp_disk_buf_reliable`)" in rendered
    assert "monitor-method(inotify)" not in rendered


def test_define_override_is_applied_and_unknown_rejected(tmp_path: Path) -> None:
    ensure_syslogng_installed()
    proc = _sh("render", "--config", FORUMPULSE_CONF, "--dir", tmp_path,
               "--define", "fp_topic=weblogs.test", "--define", 'fp_raw_site=a "quoted" site')
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "syslog-ng.conf").read_text()
    assert '@define fp_topic "weblogs.test"' in text
    assert '@define fp_raw_site "a \\"quoted\\" site"' in text
    assert f'@define fp_state_dir "{tmp_path}/state"' in text
    bad = _sh("render", "--config", FORUMPULSE_CONF, "--dir", tmp_path, "--define", "fp_tpoic=x")
    assert bad.returncode != 0 and "no '@define fp_tpoic' line" in bad.stderr


def test_broken_config_fails_check(tmp_path: Path) -> None:
    ensure_syslogng_installed()
    conf = tmp_path / "broken.conf"
    conf.write_text(FORUMPULSE_CONF.read_text().replace("flags(flow-control);", "flags(flow-control;", 1))
    # (a copy away from syslog-ng/: its heartbeat.sh is named, or the render refuses before the syntax check)
    proc = _sh("check", "--config", conf, "--dir", tmp_path / "d", "--define",
               f"fp_heartbeat_cmd={FORUMPULSE_CONF.parent / 'heartbeat.sh'}")
    assert proc.returncode != 0 and "syntax check failed" in proc.stderr
