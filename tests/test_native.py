"""The native scanner (pipeline/native) gives exactly what the RE2/numpy code it replaces gives.

Checked directly, piece by piece: acceptance against RE2 (``pc.match_substring_regex``) on fixture lines and on
generated mutations of them, for every preset's program; field boundaries (``FastPath.extract``) against the
numpy positions path; ``string_view`` structs and integers against the numpy builders; newline offsets.  The
whole-table equality with the reference path runs in tests/test_fastpath*.py with the scanner on (the default)
and, here, with it off.  CI has a C compiler: the scanner must load (no silent fall-back).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from forumpulse.pipeline import native
from forumpulse.pipeline.fastpath import BlockLines, FastPath, _Chunk, plan_for_spec
from forumpulse.pipeline.formats import PRESETS
from forumpulse.pipeline.process import Processor, SourceContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fastpath import FIXTURE_LOGS, _settings, run_both

SPLIT_PRESETS = [n for n, spec in PRESETS.items() if spec != "squid:native"]


@pytest.fixture(scope="module")
def sc() -> native.Scanner:
    s = native.scanner()
    assert s is not None, native.status()
    return s


@pytest.fixture(scope="module")
def fp() -> FastPath:
    return FastPath(Processor(_settings()))


def test_the_scanner_builds_and_loads_here():
    assert shutil.which("cc") or shutil.which("gcc"), "CI installs gcc (deploy/install-system-deps.sh)"
    assert native.status().startswith("native ("), native.status()


def test_every_split_preset_gets_a_program(fp):
    for name in SPLIT_PRESETS:
        plan = fp.plan(name)
        assert plan is not None and plan.prog is not None, name
        assert len(plan.prog.quotes) == plan.n_segments - 1


def test_regexes_that_could_backtrack_or_have_unknown_atoms_get_no_program():
    word = r'(?:[^"\t\n\x0b\x0c\r ]+)'
    end = r"(?:\r\n|\n)?$"
    assert native.program_for("^" + word + " " + word + end) is not None
    assert native.program_for("^" + word + "-" + word + end) is None  # "-" is in the word class
    assert native.program_for("^" + r"(?:\d+|-)" + "7" + end) is None  # a digit after \d+
    assert native.program_for("^" + word + r"(?:\d+|-)" + end) is None  # two open-ended atoms
    assert native.program_for("^" + r"(?:\d{4}-[\d:T.+Z-]+|-)" + end) is None  # not a known atom
    assert native.program_for(word + end) is None  # not anchored
    assert native.program_for("^" + word) is None  # no end
    ws = r"\t\n\x0b\x0c\r "
    assert native.program_for("^" + rf'(?:[^"{ws}:]+)' + " " + word + end) is not None  # [^...:]: colon excluded
    assert native.program_for("^" + rf'(?:[^"{ws}\d]+)' + " " + word + end) is None  # \d is a class, not "d"
    assert native.program_for("^" + rf'(?:-|[^"{ws}\-]+)' + " " + word + end) is None  # "-" accepted, not in class
    custom = plan_for_spec('apache:%h %l %u %t "%r" %>s %b "%{Referer}i" "%{User-Agent}i" %D', "custom")
    assert custom is not None and native.program_for(custom.regex) is not None


def _lines() -> list[bytes]:
    out: list[bytes] = []
    for p in FIXTURE_LOGS:
        out += p.read_bytes().splitlines(keepends=True)[:400]
    return out


FIX_LINES = _lines()


def _preset_lines(name: str) -> list[bytes]:
    """Fixture lines, plus the combined ones rendered in ``name``'s layout (fixtures lack some presets)."""
    out = [x for x in FIX_LINES if _utf8(x)]
    combined = [x.rstrip(b"\r\n") for x in out if x.count(b'"') == 6 and x.rstrip(b"\r\n").endswith(b'"')]
    extra = {"vhost_combined": lambda x: b"forum.example:443 " + x, "combined_d": lambda x: x + b" 1234",
             "nginx_main": lambda x: x + b' "-"', "squid_combined": lambda x: x + b" TCP_MISS:HIER_DIRECT",
             "common": lambda x: b'"'.join(x.split(b'"')[:3]).rstrip()}
    if name in extra:
        out += [extra[name](x) + b"\n" for x in combined]
    return out
ALPHABET = [b" ", b'"', b"\t", b"\r", b"\n", b"-", b"[", b"]", b":", b"0", b"7", b"a", b"Z", b"_", b"\xc3\xa9",
            b"  ", b'" "', b"\x0b", b"/", b"."]


def _accept_both(sc: native.Scanner, plan, lines: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(RE2 acceptance, native acceptance) of valid-UTF-8 lines (invalid ones never reach either)."""
    lines = [x for x in lines if _utf8(x)]
    if not lines:
        return np.zeros(0, bool), np.zeros(0, bool)
    data = b"".join(lines)
    offs = np.zeros(len(lines) + 1, dtype=np.int64)
    np.cumsum([len(x) for x in lines], out=offs[1:])
    buf = pa.py_buffer(data + bytes(16))
    arr = pa.StringArray.from_buffers(len(lines), pa.py_buffer(offs.astype(np.int32)), buf)
    re2 = pc.match_substring_regex(arr, plan.regex).to_numpy(zero_copy_only=False)
    acc, _ = sc.match(plan.prog, buf.address, offs, np.ones(len(lines), dtype=bool))
    return re2, acc


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.parametrize("name", SPLIT_PRESETS)
def test_acceptance_equals_re2_on_fixture_lines(sc, fp, name):
    plan = fp.plan(name)
    lines = _preset_lines(name)
    re2, acc = _accept_both(sc, plan, lines)
    assert len(re2) > 900
    bad = np.flatnonzero(re2 != acc)
    assert not len(bad), [lines[i] for i in bad[:3]]
    assert acc.sum() > 300  # the comparison covers accepted lines, not only rejections


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([x for n in SPLIT_PRESETS for x in _preset_lines(n)[-300:]]), edits=st.lists(
    st.tuples(st.integers(0, 400), st.integers(0, 3), st.sampled_from(ALPHABET)), min_size=1, max_size=4))
def test_acceptance_equals_re2_on_mutated_lines(sc, fp, base, edits):
    line = base
    for pos, cut, ins in edits:
        pos = min(pos, len(line))
        line = line[:pos] + ins + line[pos + cut:]
    for name in SPLIT_PRESETS:
        plan = fp.plan(name)
        re2, acc = _accept_both(sc, plan, [line, base])
        assert (re2 == acc).all(), (name, line)


@pytest.mark.parametrize("name", SPLIT_PRESETS)
def test_acceptance_equals_re2_on_token_edits(sc, fp, name):
    """Every token of a line (the text between separators) emptied, doubled, or replaced by a tricky value."""
    plan = fp.plan(name)
    variants: list[bytes] = []
    for line in _preset_lines(name)[-60:]:
        parts = re.split(rb'([ "\[\]:\r\n])', line)
        for i in range(0, len(parts), 2):
            for new in (b"", b"-", b"--", b"a b", b'"', b"0", b"\t", parts[i] + parts[i], b"12345678901234"):
                variants.append(b"".join([*parts[:i], new, *parts[i + 1:]]))
        for i in range(1, len(parts), 2):  # a separator removed or doubled
            variants.append(b"".join([*parts[:i], *parts[i + 1:]]))
            variants.append(b"".join([*parts[:i], parts[i], *parts[i:]]))
    re2, acc = _accept_both(sc, plan, variants)
    assert len(re2) > 5000 and 0 < acc.sum() < len(acc)
    bad = np.flatnonzero(re2 != acc)
    valid = [x for x in variants if _utf8(x)]
    assert not len(bad), [valid[i] for i in bad[:3]]


@pytest.mark.parametrize("name", SPLIT_PRESETS)
def test_field_bounds_equal_the_numpy_positions_path(fp, name):
    plan = fp.plan(name)
    chunk = fp.lines_array(_preset_lines(name))
    assert chunk is not None and chunk.sc is not None
    acc = fp.accept(plan, chunk, auto=False)
    rows = np.flatnonzero(acc)
    assert len(rows) > 300, name
    native_bounds = fp.extract(plan, chunk, rows).bounds
    chunk.seps.clear()  # the numpy path: positions of every quote and space + searchsorted
    numpy_bounds = fp.extract(plan, chunk, rows).bounds
    assert native_bounds.keys() == numpy_bounds.keys()
    for g in native_bounds:
        for x, y in zip(native_bounds[g], numpy_bounds[g], strict=True):
            assert np.array_equal(x, y), (name, g)


def test_views_and_uints_equal_the_numpy_builders(sc):
    rng = np.random.default_rng(7)
    data = b"".join(rng.choice([b"1", b"23", b"-", b"x", b" ", b"\xc3\xa9", b"4567890123456"], 4000).tolist())
    chunk = _Chunk(data, np.array([0, len(data)], dtype=np.int64), np.ones(1, dtype=bool))
    a = rng.integers(0, len(data), 3000)
    z = np.minimum(a + rng.integers(0, 30, 3000), len(data))
    for n in (0, 1, 12, 13):  # exact lengths around the inline limit
        a = np.append(a, 5)
        z = np.append(z, 5 + n)
    valid = rng.random(len(a)) > 0.1
    with_c = chunk.views(a, z, valid)
    chunk.sc = None
    without = chunk.views(a, z, valid)
    assert with_c.buffers()[1].to_pybytes() == without.buffers()[1].to_pybytes()
    assert with_c.equals(without)
    digits = np.frombuffer(data, dtype=np.uint8)
    runs = [(m.start(), m.end()) for m in re.finditer(rb"\d+|-", data)]
    ra = np.array([r[0] for r in runs], dtype=np.int64)
    rz = np.array([r[1] for r in runs], dtype=np.int64)
    from forumpulse.pipeline.fastpath import _Fields

    f = _Fields(chunk, {0: (ra, rz)})
    without_u = f.uint(0)
    chunk.sc = sc
    with_u = f.uint(0)
    for x, y in zip(with_u, without_u, strict=True):
        assert np.array_equal(x, y)
    assert with_u[2].any() and with_u[1].any() and len(digits)  # long values and dashes were exercised


@pytest.mark.parametrize("data", [b"", b"a", b"\n", b"a\nb", b"a\nb\n", b"\n\n\nx\n" * 1000])
def test_newline_offsets(sc, data):
    want = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1
    assert np.array_equal(sc.newline_ends(data), want)
    assert len(BlockLines(data)) == len(data.splitlines(keepends=True))


def test_after_nth_newline_equals_the_python_cut(sc):
    """The reader's cut (ingest._chunks) in C against the Python definition, on random buffers, starts, counts
    and sizes (a buffer filled only in part), and its argument checks."""
    import random

    from forumpulse.pipeline.ingest import _after_nth_newline

    rng = random.Random(3)
    for _ in range(3000):
        buf = bytearray(rng.choice(b"ab\n\n\r") for _ in range(rng.randrange(0, 300)))
        size = rng.randrange(0, len(buf) + 1)
        start, n = rng.randrange(0, size + 1), rng.randrange(1, 60)
        assert sc.after_nth_newline(buf, start, n, size) == _after_nth_newline(buf, start, n, 256.0, size), (
            bytes(buf), start, n, size)
    buf = bytearray(b"a\n" * 10)
    buf.extend(b"b")  # the buffer may grow after a call (no export left behind)
    for bad in ((3, 2, 1), (0, 22, 1), (0, 5, 0), (-1, 5, 1)):
        with pytest.raises(ValueError):
            sc.after_nth_newline(buf, bad[0], bad[2], bad[1])


@pytest.mark.parametrize("path", FIXTURE_LOGS[:3], ids=lambda p: p.name)
@pytest.mark.parametrize("fmt", ["combined", "vhost_combined", "auto"])
def test_fast_path_without_the_scanner_still_equals_the_reference(path, fmt, monkeypatch):
    monkeypatch.setenv("FORUMPULSE_NATIVE", "0")
    assert native.scanner() is None
    s = _settings()
    fast_p, ref_p = Processor(s), Processor(s)
    lines = path.read_bytes().splitlines(keepends=True)
    ctx = SourceContext(site="forum", origin_host="web1", origin_file=path.name, format=fmt)
    run_both(fast_p, ref_p, lines, ctx)


def test_build_is_cached_by_source_hash_and_atomic(tmp_path, monkeypatch):
    monkeypatch.setenv("FORUMPULSE_NATIVE_CACHE", str(tmp_path))
    assert native.library_dirs() == [tmp_path]
    p = native.build()
    assert p.parent == tmp_path and p.name.startswith("fpscan-") and p.exists()
    assert p.stat().st_mode & 0o777 == 0o755  # the services' users can load what make install built
    mtime = p.stat().st_mtime_ns
    assert native.build() == p and p.stat().st_mtime_ns == mtime  # not rebuilt
    assert [x.name for x in tmp_path.iterdir()] == [p.name]  # no temporary file left
    assert native.Scanner(p).newline_ends(b"a\nb\n").tolist() == [2, 4]


def test_no_compiler_means_the_numpy_path_and_a_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FORUMPULSE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    with pytest.raises(RuntimeError, match="no C compiler"):
        native.build()
    assert os.listdir(tmp_path) == []


def test_a_library_others_could_write_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("FORUMPULSE_NATIVE_CACHE", str(tmp_path))
    p = native.build()
    p.chmod(0o777)
    with pytest.raises(RuntimeError, match="not loaded"):
        native.build()


def test_a_library_that_does_not_load_is_rebuilt_in_its_place(tmp_path, monkeypatch):
    """A library cut short (or another machine's build in a shared cache) does not leave the process on the
    numpy path for good: it is compiled again over the broken file and loaded."""
    monkeypatch.setenv("FORUMPULSE_NATIVE_CACHE", str(tmp_path))
    broken = native.library_path()
    broken.write_bytes(b"\x7fELF cut short")
    broken.chmod(0o755)
    with pytest.raises(OSError):
        native.Scanner(broken)
    sc = native.load()
    assert sc.path == broken and sc.newline_ends(b"x\ny\n").tolist() == [2, 4]
    assert broken.stat().st_size > 1000 and broken.stat().st_mode & 0o777 == 0o755
    assert [x.name for x in tmp_path.iterdir()] == [broken.name]  # replaced, no temporary file left


def test_a_broken_library_in_a_read_only_place_is_rebuilt_in_the_next(tmp_path, monkeypatch):
    installed, cache = tmp_path / "installed", tmp_path / "cache"
    installed.mkdir()
    monkeypatch.setattr(native, "library_dirs", lambda: [installed, cache])
    broken = native.library_path(installed)
    broken.write_bytes(b"not a shared object")
    broken.chmod(0o755)
    real_mkstemp = native.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):  # the installed tree is read-only for this user (root ignores modes)
        if Path(dir) == installed:
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(*args, dir=dir, **kw)

    monkeypatch.setattr(native.tempfile, "mkstemp", mkstemp)
    sc = native.load()
    assert sc.path == native.library_path(cache)
    assert broken.read_bytes() == b"not a shared object"  # left alone
    assert native.load().path == sc.path  # next time: the broken one is skipped, the cache's one loads


def test_a_library_that_still_does_not_load_gives_every_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("FORUMPULSE_NATIVE_CACHE", str(tmp_path))
    broken = native.library_path()
    broken.write_bytes(b"junk")
    broken.chmod(0o755)

    def bad_build(force=False):
        assert force  # a refused library is rebuilt, not returned again
        return broken

    monkeypatch.setattr(native, "build", bad_build)
    with pytest.raises(RuntimeError, match=r"did not load \(.*did not load after building it"):
        native.load()


def test_the_library_is_looked_for_next_to_the_source_first(monkeypatch):
    monkeypatch.delenv("FORUMPULSE_NATIVE_CACHE", raising=False)
    dirs = native.library_dirs()
    assert dirs[0] == native.SOURCE.parent / "_build" and dirs[1] == native.cache_dir()
