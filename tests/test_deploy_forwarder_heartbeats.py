"""deploy/forwarders/syslog-ng-forwarder.conf carries the forwarder heartbeat snippet of docs/architecture.md.

* the ``#> `` lines at its end are exactly the snippet docs/architecture.md prints (the one
  tests/test_syslogng_sender_heartbeats.py runs through the real chain), and the install command in the file
  extracts them;
* installed as documented (a second conf.d file next to the forwarder), the pair passes ``syslog-ng --syntax-only``;
* the forwarder's comment no longer says an idle forwarded source is ``dead``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "deploy" / "forwarders" / "syslog-ng-forwarder.conf"


def doc_snippet() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    m = re.search(r"```\n( *# forumpulse forwarder heartbeats:.*?)```", text, re.S)
    assert m, "heartbeat snippet not found in docs/architecture.md"
    return textwrap.dedent(m.group(1))


def conf_snippet() -> str:
    return "".join(re.sub(r"^#> ?", "", ln) for ln in CONF.read_text().splitlines(keepends=True) if ln.startswith("#>"))


def test_forwarder_carries_the_documented_snippet() -> None:
    assert conf_snippet() == doc_snippet()
    text = CONF.read_text()
    assert "sed -n 's/^#> \\{0,1\\}//p' syslog-ng-forwarder.conf" in text
    sed = subprocess.run(["sed", "-n", r"s/^#> \{0,1\}//p", str(CONF)], capture_output=True, text=True, check=True)
    assert sed.stdout == doc_snippet()
    # the active part of the forwarder stays without heartbeats (they are the second file's)
    code = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    assert "s_fpfwd_mark" not in code and "mark-freq" not in code


def test_idle_forwarded_source_is_not_described_as_dead() -> None:
    text = " ".join(ln.lstrip("# ").strip() for ln in CONF.read_text().splitlines() if ln.startswith("#"))
    assert 'shows as "dead", not "silent"' not in text
    assert '"quiet"' in text and '"silent" when idle' in text


def test_forwarder_with_heartbeat_file_passes_syntax_only(tmp_path: Path) -> None:
    exe = shutil.which("syslog-ng")
    assert exe, "syslog-ng not found: apt-get install syslog-ng-core (3.38); `make test` installs it"
    fwd = tmp_path / "forumpulse-forwarder.conf"
    fwd.write_text(CONF.read_text())
    hb = tmp_path / "forumpulse-forwarder-heartbeats.conf"
    hb.write_text(conf_snippet())
    main = tmp_path / "syslog-ng.conf"
    main.write_text(f'@version: 3.38\noptions {{ stats-freq(0); }};\n@include "{fwd}"\n@include "{hb}"\n')
    r = subprocess.run([exe, "--syntax-only", "-f", str(main), "-R", str(tmp_path / "persist"),
                        "-p", str(tmp_path / "pid"), "-c", str(tmp_path / "ctl")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
