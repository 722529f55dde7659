"""Process tuning (pipeline/runtime.py): the collector settings, and that the long-running commands apply them."""

from __future__ import annotations

import subprocess
import sys

from forumpulse.pipeline import runtime


def _run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          timeout=120).stdout.strip()


def test_tune_gc_raises_the_young_threshold_and_freezes_start_up_objects():
    out = _run("import gc; before = gc.get_threshold(); "
               "from forumpulse.pipeline.runtime import tune_gc; tune_gc(); "
               "print(before[0], gc.get_threshold()[0], gc.get_threshold()[1:] == before[1:], gc.get_freeze_count() > 1000)")
    assert out == f"700 {runtime.GC_GEN0_THRESHOLD} True True"


def test_fewer_full_collections_while_processing():
    """The same processing, with and without tune_gc: full collections (the costly ones) counted by CPython."""
    code = (
        "import gc, sys\n"
        "from forumpulse.pipeline.config import Settings\n"
        "from forumpulse.pipeline.process import Processor, SourceContext\n"
        "from forumpulse.pipeline.runtime import tune_gc\n"
        "from pathlib import Path\n"
        "if sys.argv[1] == '1': tune_gc()\n"
        "lines = Path('tests/fixtures/fastpath/elastic_apache_1000.log').read_bytes().splitlines(keepends=True)\n"
        "p = Processor(Settings())\n"
        "ctx = SourceContext(site='s', origin_host='h', origin_file='f', format='combined')\n"
        "g2 = gc.get_stats()[2]['collections']\n"
        "for i in range(100):\n"
        "    p.process_reference(lines, ctx, line_no_base=0, source_ref='x')\n"
        "print(gc.get_stats()[2]['collections'] - g2)\n"
    )
    default = int(subprocess.run([sys.executable, "-c", code, "0"], capture_output=True, text=True, check=True,
                                 timeout=300).stdout)
    tuned = int(subprocess.run([sys.executable, "-c", code, "1"], capture_output=True, text=True, check=True,
                               timeout=300).stdout)
    assert default >= 1 and tuned < default, (default, tuned)


def test_the_long_running_commands_apply_it():
    import inspect

    from forumpulse.pipeline import cli, consumer, owner, runtime

    assert "tune_gc()" in inspect.getsource(cli.ingest)
    assert "tune_gc()" in inspect.getsource(runtime.start_service)
    assert "start_service(log)" in inspect.getsource(consumer.consume_command)
    assert "start_service(log)" in inspect.getsource(owner.run_command)


def test_without_modules_refuses_the_import_but_pyarrow_still_converts():
    out = _run("import sys; from forumpulse.pipeline.runtime import without_modules; "
               "without_modules('pandas', why='not used here'); "
               "import numpy as np, pyarrow as pa; "
               "a = pa.array(['x', None]); b = pa.array(np.arange(3)); t = pa.table({'a': [1, 2]}); "
               "err = ''\n"
               "try:\n    import pandas.core.api\nexcept ImportError as e:\n    err = str(e)\n"
               "print(a.to_pylist(), b.to_pylist(), t.num_rows, 'pandas' in sys.modules, err)")
    assert out == "['x', None] [0, 1, 2] 2 False pandas is not loaded in this process: not used here"


def test_ingest_runs_without_pandas(tmp_path):
    """The ingest command refuses pandas for its process (pyarrow would import it only to check its inputs); the
    whole command, parse to insert, works without it."""
    log = tmp_path / "a.log"
    log.write_text('1.2.3.4 - - [01/Jul/1995:00:00:01 -0400] "GET /showthread.php?t=5 HTTP/1.0" 200 1 "-" "ua"\n'
                   "garbage line\n")
    code = ("import sys\nfrom forumpulse.pipeline.cli import main\n"
            f"sys.argv = ['forumpulse', 'ingest', '--store', 'chdb:{tmp_path / 'db'}', '--format', 'combined', '{log}']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('pandas' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "False"
    assert "read 2  loaded 1 (of which 1 past retention, not kept)  quarantined 1" in r.stdout + r.stderr  # 1995
