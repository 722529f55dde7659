"""The fast path's byte loops in C (``fpscan.c``), built on first use and called through ctypes.

What it is for: :mod:`forumpulse.pipeline.fastpath` finds field boundaries with whole-chunk numpy passes (RE2
acceptance, then the sorted positions of every quote and space, then ``searchsorted``).  For the formats whose
acceptance regex is made only of the deterministic atoms below, :func:`program_for` turns that regex into a small
program that :meth:`Scanner.match` runs over each line once, in C: it accepts exactly the lines the regex accepts,
and records the separators of accepted lines on the way.  :meth:`Scanner.views` and :meth:`Scanner.uint` replace
the numpy gathers that build Arrow ``string_view`` arrays and integer columns.

Guarantees:

* same results as the numpy/RE2 code it replaces, for every input (tests/test_native.py checks acceptance and
  boundaries against RE2 and the numpy path on every preset, the fixture logs and generated lines); a regex with
  any other atom gets no program and stays with RE2;
* the library is compiled from ``fpscan.c`` with the system C compiler (``$CC``, else ``cc``/``gcc``) into
  ``$FORUMPULSE_NATIVE_CACHE`` (default ``~/.cache/forumpulse``), named by the source's hash, written atomically
  (concurrent first uses are safe).  ``make install`` builds it.  Without a compiler, :func:`scanner` returns
  ``None``, the numpy path is used (same results, ~15% more CPU per line) and :func:`status` says why;
* ``FORUMPULSE_NATIVE=0`` turns it off (the tests use this to compare both paths).

Misuse: the functions trust their arguments (offsets inside the buffer, arrays of the stated dtype and length,
C-contiguous); only :class:`Scanner` should call the library.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("fpscan.c")

OP_LIT, OP_WORD, OP_ANYNQ, OP_DIGDASH, OP_CLF, OP_CLFIN, OP_SS, OP_END = range(1, 9)

_WS = r"\t\n\x0b\x0c\r "
_WS_BYTES = b"\t\n\x0b\x0c\r "
#: regex atom text (as fastpath.plan_for_spec writes it) -> (op, arg)
_ATOMS: dict[str, tuple[int, int]] = {
    '(?:[^"]*)': (OP_ANYNQ, 0),
    '(?:-|[^"]*)': (OP_ANYNQ, 0),  # the same language: "-" is in [^"]*
    rf'(?:[^"{_WS}]+)': (OP_WORD, -1),
    rf'(?:-|[^"{_WS}]+)': (OP_WORD, -1),  # the same language
    rf'(?:\[[^\]"{_WS}]* [^\]"{_WS}]*\])': (OP_CLF, 0),
    rf'(?:[^\]"{_WS}]* [^\]"{_WS}]*)': (OP_CLFIN, 0),
    r"(?:\d+|-)": (OP_DIGDASH, 0),
    r"(?:[A-Za-z_0-9]+:[A-Za-z_0-9]+|-)": (OP_SS, 0),
    r"(?:\r\n|\n)?$": (OP_END, 0),
}
_WORD_X = re.compile(r'\(\?:(-\|)?\[\^"' + re.escape(_WS) + r"(\\?[^\\\]])\]\+\)")
_RE2_SPECIAL = "\\.+*?()|[]{}^$"
_WORDCH = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True)
class Program:
    """A translated acceptance regex: ``code`` (op, arg pairs) and where its separators sit.

    ``quotes[i]``: index (in a line's separator row) of the line's i-th quote; ``spaces[s]``: indices of the
    spaces of quote segment ``s`` (the space inside a CLF time included), in order."""

    code: np.ndarray
    k: int
    quotes: tuple[int, ...]
    spaces: dict[int, tuple[int, ...]]


def program_for(regex: str) -> Program | None:
    """The program accepting exactly what ``regex`` (anchored, no groups) accepts, or ``None`` when the regex has
    an atom this scanner does not know or an atom whose greedy match could need backtracking."""
    if not regex.startswith("^"):
        return None
    i, n = 1, len(regex)
    ops: list[tuple[int, int]] = []
    while i < n:
        for text, atom in _ATOMS.items():
            if regex.startswith(text, i):
                ops.append(atom)
                i += len(text)
                break
        else:
            m = _WORD_X.match(regex, i)
            if m:
                x = m.group(2)[-1]
                if len(x.encode()) != 1 or (m.group(2).startswith("\\") and x.isalnum()):
                    return None  # "\\d" and friends are classes, not the letter
                if m.group(1) and x == "-":
                    return None  # "-|[^...-]+" accepts "-" that the class excludes
                ops.append((OP_WORD, ord(x)))
                i = m.end()
                continue
            c = regex[i]
            if c == "\\":
                if i + 1 >= n or regex[i + 1] not in _RE2_SPECIAL:
                    return None
                c = regex[i + 1]
                i += 2
            elif c in _RE2_SPECIAL:
                return None
            else:
                i += 1
            ops.extend((OP_LIT, b) for b in c.encode())
    if not ops or ops[-1][0] != OP_END or any(op == OP_END for op, _ in ops[:-1]):
        return None
    # every greedy atom must be followed by a byte it cannot take (then greedy = the only match)
    for (op, arg), (nop, narg) in itertools.pairwise(ops):
        nxt = narg if nop == OP_LIT else None
        if nop not in (OP_LIT, OP_END) and op not in (OP_LIT, OP_CLF):
            return None  # two open-ended atoms in a row
        if op == OP_WORD and not (nop == OP_END or nxt in (34, *_WS_BYTES) or nxt == arg):
            return None
        if op == OP_ANYNQ and nxt != 34:
            return None
        if op == OP_DIGDASH and nop == OP_LIT and 48 <= (nxt or 0) <= 57:
            return None
        if op == OP_SS and nop == OP_LIT and nxt in _WORDCH:
            return None
        if op == OP_CLFIN and not (nop == OP_END or nxt in (93, 34, *_WS_BYTES)):
            return None
    quotes: list[int] = []
    spaces: dict[int, list[int]] = {}
    k = seg = 0
    for op, arg in ops:
        if (op == OP_LIT and arg == 32) or op in (OP_CLF, OP_CLFIN):
            spaces.setdefault(seg, []).append(k)
            k += 1
        elif op == OP_LIT and arg == 34:
            quotes.append(k)
            k += 1
            seg += 1
    code = np.array([x for pair in ops for x in pair], dtype=np.int32)
    return Program(code, k, tuple(quotes), {s: tuple(v) for s, v in spaces.items()})


# ------------------------------------------------------------------------------------------------ library

_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_lock = threading.Lock()
_state: dict[str, object] = {}


def cache_dir() -> Path:
    d = os.environ.get("FORUMPULSE_NATIVE_CACHE")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forumpulse"


def library_dirs() -> list[Path]:
    """Where the library is looked for, then built: ``$FORUMPULSE_NATIVE_CACHE`` alone when set; else next to
    the source (``_build/``: written by ``make install``, readable by the services' own users, whose home
    directories may be read-only), then the user's cache directory."""
    if os.environ.get("FORUMPULSE_NATIVE_CACHE"):
        return [cache_dir()]
    return [SOURCE.parent / "_build", cache_dir()]


def _compiler() -> str | None:
    for c in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if c and shutil.which(c):
            return c
    return None


def library_path(directory: Path | None = None) -> Path:
    """The library's file name in ``directory`` (default: the first of :func:`library_dirs`): named by the
    source's hash, so an edited source is rebuilt and never loads a stale library."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    return (directory or library_dirs()[0]) / f"fpscan-{digest}.so"


def _check_trusted(path: Path) -> None:
    """Refuse a library another user could have written (it runs inside our process)."""
    st = path.stat()
    if st.st_uid not in (os.getuid(), 0) or st.st_mode & 0o022:
        raise RuntimeError(f"{path}: not loaded, owned by uid {st.st_uid} with mode {oct(st.st_mode & 0o777)} "
                           "(must be this user's or root's, and not group/world writable)")


def build(force: bool = False) -> Path:
    """The library for the current source: an existing one from :func:`library_dirs`, else compiled (once per
    source version) into the first of them that can be written; ``force`` compiles even when one exists (it
    replaces, atomically, the one in that directory).  Raises ``RuntimeError`` with the reason when there is none
    and it cannot be built."""
    dirs = library_dirs()
    for d in dirs if not force else ():
        p = library_path(d)
        if p.exists():
            _check_trusted(p)
            return p
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc, gcc or clang; $CC): apt-get install gcc")
    errors = []
    for d in dirs:
        dest = library_path(d)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=dest.stem + ".", suffix=".so.tmp", dir=dest.parent)
        except OSError as exc:  # read-only install or home directory: try the next place
            errors.append(f"{d}: {exc}")
            continue
        os.close(fd)
        try:
            r = subprocess.run([cc, "-O2", "-std=c99", "-shared", "-fPIC", "-o", tmp, str(SOURCE)],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"{cc} failed: {r.stderr.strip()[:2000]}")
            os.chmod(tmp, 0o755)  # mkstemp made it 0600: other users (the services) must be able to load it
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return dest
    raise RuntimeError("cannot write the library anywhere: " + "; ".join(errors))


class Scanner:
    """The loaded library, with numpy-facing wrappers (see the C file for each function's contract)."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        lib.fp_match.restype = _I64
        lib.fp_match.argtypes = [_P, ctypes.c_int32, _P, _P, _I64, _P, _P, _P, ctypes.c_int32]
        lib.fp_views.restype = None
        lib.fp_views.argtypes = [_P, _P, _P, _I64, _P]
        lib.fp_uint.restype = None
        lib.fp_uint.argtypes = [_P, _P, _P, _I64, _P, _P, _P]
        lib.fp_count_newlines.restype = _I64
        lib.fp_count_newlines.argtypes = [_P, _I64]
        lib.fp_newlines.restype = _I64
        lib.fp_newlines.argtypes = [_P, _I64, _P, _I64]
        lib.fp_after_nth_newline.restype = _I64
        lib.fp_after_nth_newline.argtypes = [_P, _I64, _I64, _I64]
        self.lib = lib
        self.path = path

    def match(self, prog: Program, data_addr: int, offs: np.ndarray, valid: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """``(accepted, seps)`` for every line ``i`` (bytes ``offs[i]:offs[i+1]`` at ``data_addr``); ``seps`` is
        ``(n, prog.k)`` int32, meaningful on accepted rows only."""
        n = len(offs) - 1
        offs = np.ascontiguousarray(offs, dtype=np.int64)
        valid_u8 = np.ascontiguousarray(valid, dtype=np.uint8)
        acc = np.zeros(n, dtype=np.uint8)
        seps = np.empty((n, prog.k), dtype=np.int32)  # chunks stay under 2**31 bytes (fastpath checks)
        self.lib.fp_match(prog.code.ctypes.data, len(prog.code), data_addr, offs.ctypes.data, n,
                          valid_u8.ctypes.data, acc.ctypes.data, seps.ctypes.data, prog.k)
        return acc.view(bool), seps

    def views(self, data_addr: int, a: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``(n, 16)`` uint8: Arrow ``string_view`` structs of ``data[a[i]:z[i]]`` (buffer index 0)."""
        a = np.ascontiguousarray(a, dtype=np.int64)
        z = np.ascontiguousarray(z, dtype=np.int64)
        out = np.empty((len(a), 16), dtype=np.uint8)
        self.lib.fp_views(data_addr, a.ctypes.data, z.ctypes.data, len(a), out.ctypes.data)
        return out

    def uint(self, data_addr: int, a: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a = np.ascontiguousarray(a, dtype=np.int64)
        z = np.ascontiguousarray(z, dtype=np.int64)
        n = len(a)
        vals = np.empty(n, dtype=np.int64)
        dash = np.empty(n, dtype=np.uint8)
        too_long = np.empty(n, dtype=np.uint8)
        self.lib.fp_uint(data_addr, a.ctypes.data, z.ctypes.data, n, vals.ctypes.data, dash.ctypes.data,
                         too_long.ctypes.data)
        return vals, dash.view(bool), too_long.view(bool)

    def after_nth_newline(self, buf: bytearray, start: int, n: int, size: int) -> int:
        """The position just after the ``n``-th newline (``n >= 1``) at or after ``start`` in ``buf[:size]``, or
        -1 when there are fewer (``0 <= start <= size <= len(buf)``).  The GIL is released while it scans."""
        if not 0 <= start <= size <= len(buf) or n < 1:
            raise ValueError(f"bad cut request: start {start}, size {size}, n {n} for {len(buf)} bytes")
        view = (ctypes.c_char * len(buf)).from_buffer(buf)  # exports buf only for this call (it can grow after)
        try:
            return int(self.lib.fp_after_nth_newline(ctypes.addressof(view), start, size, n))
        finally:
            del view

    def newline_ends(self, data: bytes) -> np.ndarray:
        """Positions after every ``\\n`` of ``data`` (int64)."""
        addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value  # the bytes object's own buffer
        c = int(self.lib.fp_count_newlines(addr, len(data)))
        out = np.empty(c, dtype=np.int64)
        if c:
            self.lib.fp_newlines(addr, len(data), out.ctypes.data, c)
        return out


def load() -> Scanner:
    """The loaded library for the current source.  An existing library that the dynamic loader refuses (cut
    short on a full disk, or another machine's build in a cache directory shared between architectures) is not
    a reason to run without it: the next place is tried, and when none loads, the library is compiled again
    (replacing the broken one in the first writable place) and loaded once more.  Raises ``RuntimeError`` with
    every reason when that fails too."""
    refused = []
    for d in library_dirs():
        p = library_path(d)
        if p.exists():
            _check_trusted(p)
            try:
                return Scanner(p)
            except OSError as exc:
                refused.append(f"{p} did not load ({exc})")
    p = build(force=bool(refused))
    try:
        return Scanner(p)
    except OSError as exc:
        raise RuntimeError("; ".join([*refused, f"{p} did not load after building it ({exc})"])) from exc


def scanner() -> Scanner | None:
    """The native scanner, built and loaded on first call; ``None`` when turned off or unavailable."""
    if os.environ.get("FORUMPULSE_NATIVE", "1") == "0":
        return None
    s = _state.get("scanner")
    if s is not None or "error" in _state:
        return s  # type: ignore[return-value]
    with _lock:
        if "scanner" not in _state and "error" not in _state:
            try:
                _state["scanner"] = load()
            except Exception as exc:  # no compiler, read-only cache: the numpy path does the same work
                _state["error"] = f"{type(exc).__name__}: {exc}"
    return _state.get("scanner")  # type: ignore[return-value]


def status() -> str:
    """``native (PATH)``, ``off (FORUMPULSE_NATIVE=0)`` or ``unavailable: REASON``."""
    if os.environ.get("FORUMPULSE_NATIVE", "1") == "0":
        return "off (FORUMPULSE_NATIVE=0)"
    s = scanner()
    return f"native ({s.path})" if s is not None else f"unavailable: {_state.get('error')}"
