"""CAD OSE, a published NAB detector, re-implemented as an evaluation baseline (not used by the pipeline).

CAD OSE — "Contextual Anomaly Detector, Open Source Edition" (Mikhail Smirnov, 2016; NAB's ``contextOSE``,
published 69.9 / 67.0 / 73.2 in ``results/final_results.json``) — written here from its description and NAB's
source (``nab/detectors/context_ose/``), to measure what NAB's protocol (the whole file's min and max known
before its first row) is worth to a second published detector, next to Relative Entropy (``nab_baseline.py``).

The algorithm, per row:

* **Encoding.**  The value is quantised on ``[min, max]`` into ``2**3`` levels,
  ``k = int((v - min) / ((max - min) / 7))`` (a zero range counts as 7); bit ``b`` of ``k`` becomes the *sensor
  fact* ``2·b + bit``.  The timestamp is not used.
* **Contexts.**  A context is a pair (left facts, right facts): the previous row's *left facts* — its sensor facts
  plus the *neuron facts* ``2**31 + id`` of up to 15 active contexts — and this row's sensor facts.  Contexts are
  stored as a left and a right *semi-context* (shared between contexts).  Every row the pair (previous left facts,
  this row's sensor facts) is looked up as a *zero-level* context and created when new.
* **Update.**  Every left semi-context whose facts all were in the previous row's left facts is *selected*: each
  of its contexts whose right facts all occur in this row is *active* (its activation count goes up).  When the
  row made a new zero-level context, the intersections of the zero-level contexts with the current facts (left
  part of at most 7 facts) are *potential new contexts*, stored in memory.
* **Neurons.**  The 15 active contexts with the most activations (ties: larger Python 2 hash of the left, then the
  right, facts tuple) give the neuron facts of this row's left facts.
* **Score.**  ``(1 - active/selected + new/potential) / 2`` (``new/potential``: the share of this row's potential
  new contexts, zero-level one included, that were really new; 0 when the row made no new zero-level context).
  It is reported as 0 while a raw score of the last ``rest_period`` rows is ``>= 0.75`` (the history starts with
  one 1.0, so the first ``rest_period`` rows report 0).  NAB sets ``rest_period`` to a fifth of the probationary
  period, ``min(floor(0.15·n), 750) / 5`` (NAB's ``context_ose_detector.py``): the detector also takes the file's
  length.

Details kept on purpose, because they decide which neurons win ties and in which order contexts get their ids,
and hence later scores: ties between active contexts are broken by **Python 2's** 64-bit tuple hash
(:func:`py2_tuple_hash`); potential new contexts are made in the order the original visits a left semi-context's
``{right id: context id}`` dict, i.e. **Python 2's dict order** (:func:`py2_dict_order`; with insertion order 7
of NAB's 58 files score differently at some rows, and NAB's published raw output sides with Python 2's order,
though no published per-file score changes); context id 0 is skipped in the update whenever the row made no new
zero-level context (the original compares the new context's id, ``False`` when none, with ``!=``, and
``False == 0``).  Semi-contexts are keyed by their facts tuple (the original keys them by its hash; equal hashes
of different tuples would merge them).

Which revision: NAB's repository holds two revisions of CAD OSE.  The published scores are those of the one
described above (``cad_ose.py`` / ``context_operator.py`` without predictions; its raw outputs are under
``results/contextOSE/`` at NAB commit 3a3fe451): with each file's range this module reproduces NAB's published
per-file ``contextOSE`` scores and TP/TN/FP/FN counts on all 58 files and all three profiles, and the published
raw scores at every row compared.  The other revision (Python 2, ``lastPredictionedFacts``; raw outputs at NAB
commit 059c7823) also predicts the next row's sensor facts and reports 0 when all of them were predicted; it does
not give the published scores (52 of 58 files) and is not implemented here.

Modes (:func:`cad_ose_scores`):

* ``value_range=(lo, hi)``: NAB's protocol (NAB passes the file's own min and max: :func:`nab_cad_ose_scores`).
  Not streaming: the encoding of row 0 depends on the whole file.
* ``value_range=None``: **streaming** — row t is encoded on the min and max of rows <= t.  Memory learnt on an
  earlier (narrower) range is kept as it is, not re-binned: when the running range moves, a level stands for a
  different band of values from then on.  The rest period defaults to 150 rows (NAB's value for every file of at
  least 5,000 rows), so the file's length is not needed either.

:func:`cad_ose_rebinned_scores` is the streaming form that re-bins: on every change of the running range it
replays all earlier rows on the new range, so row t is scored as NAB's protocol would score the last row of the
file made of rows <= t (rest period 150).  Exact, and streaming, but ~5x slower.

Guarantees: deterministic; pure (no state between calls); in streaming mode the score of row t does not change
when rows after t are removed or altered.  Scores lie in [0, 1].  Speed: ~0.1–0.3 ms a row, growing with the
memory (pure Python + numpy): NAB's 58 files take ~65 s on one core with the range in advance, ~90 s streaming.
A NaN value raises ``ValueError``.  Checked in ``tests/test_nab_cad_ose.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import chain

import numpy as np
import numpy.typing as npt

BASE_THRESHOLD = 0.75
MAX_LEFT_SEMI_CONTEXT_LEN = 7
MAX_ACTIVE_NEURONS = 15
NORM_VALUE_BITS = 3
#: Rest period of the streaming mode: NAB's ``probation / 5`` for every file of >= 5,000 rows (750 / 5).
STREAMING_REST_PERIOD = 150.0

_NEURON_BASE = 2**31
_MASK64 = (1 << 64) - 1

IntArray = npt.NDArray[np.int64]
Facts = tuple[int, ...]
_EMPTY = np.zeros(0, dtype=np.int64)


# ------------------------------------------------------------------------------ Python 2 hashing and dict order


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def py2_tuple_hash(items: Sequence[int]) -> int:
    """``hash(tuple(items))`` as 64-bit CPython 2.7 computes it for a tuple of non-negative ints (whose hash is the
    int itself; CPython 3 before 3.8 gives the same).  The original breaks ties between active contexts on it."""
    x = 0x345678
    mult = 1000003
    n = len(items)
    for i, y in enumerate(items):
        x = ((x ^ y) * mult) & _MASK64
        mult += 82520 + 2 * (n - 1 - i)
    x = _signed64(x + 97531)
    return -2 if x == -1 else x


def _py2_probe(table: list[int | None], key: int) -> None:
    """Put ``key`` where CPython 2.7's open addressing puts it (hash = key, perturbation shift 5)."""
    mask = len(table) - 1
    i = key & mask
    perturb = key
    while table[i & mask] is not None:
        i = (i << 2) + i + perturb + 1
        perturb >>= 5
    table[i & mask] = key


def py2_dict_order(keys: Sequence[int]) -> list[int]:
    """Iteration order of a CPython 2.7 dict into which the distinct non-negative int ``keys`` were inserted in
    this order (no deletions): 8 slots to start, resized to the smallest power of two above ``4·used`` once
    two thirds are filled, old slots re-inserted in slot order."""
    table: list[int | None] = [None] * 8
    for used, k in enumerate(keys, start=1):
        _py2_probe(table, k)
        if used * 3 >= len(table) * 2:
            size = 8
            while size <= 4 * used:
                size <<= 1
            old, table = table, [None] * size
            for key in old:
                if key is not None:
                    _py2_probe(table, key)
    return [k for k in table if k is not None]


# ------------------------------------------------------------------------------------------------- memory


class _Grow:
    """A growable int64 array (amortised O(1) append); :attr:`view` is the filled part."""

    __slots__ = ("a", "n")

    def __init__(self) -> None:
        self.a: IntArray = np.zeros(16, dtype=np.int64)
        self.n = 0

    def append(self, x: int) -> None:
        if self.n == len(self.a):
            self.a = np.concatenate([self.a, np.zeros(len(self.a), dtype=np.int64)])
        self.a[self.n] = x
        self.n += 1

    @property
    def view(self) -> IntArray:
        return self.a[:self.n]


class ContextualAnomalyDetector:
    """CAD OSE, one row at a time (:meth:`score`).

    ``value_range``: fixed ``(min, max)`` of the encoding (NAB's protocol), or ``None`` for the running min and
    max of the values seen so far, this row included (streaming).  ``rest_period``: rows after a raw score
    >= ``base_threshold`` that report 0 (NAB: a fifth of the probationary period).

    Memory layout: semi-contexts and contexts are numbered in creation order; per-context counters live in
    growable numpy arrays, so a row's crossing and update are vectorised over the selected contexts.  Only the
    ordering-sensitive step (making potential new contexts) loops in Python, in the original's order."""

    def __init__(self, value_range: tuple[float, float] | None, rest_period: float,
                 *, base_threshold: float = BASE_THRESHOLD,
                 max_left_semi_context_len: int = MAX_LEFT_SEMI_CONTEXT_LEN,
                 max_active_neurons: int = MAX_ACTIVE_NEURONS, norm_value_bits: int = NORM_VALUE_BITS) -> None:
        self._fixed = value_range
        self._lo = math.inf
        self._hi = -math.inf
        self._rest = int(rest_period)
        self._threshold = base_threshold
        self._max_left = max_left_semi_context_len
        self._max_neurons = max_active_neurons
        self._bits = norm_value_bits
        self._max_bin = 2.0**norm_value_bits - 1.0
        # left semi-contexts: facts, size, contexts (insertion order), zero-level contexts (dict order)
        self._left_id: dict[Facts, int] = {}
        self._left_facts: list[Facts] = []
        self._left_size = _Grow()
        self._left_ctx: list[list[int]] = []
        self._left_rights: list[dict[int, int]] = []  # right id -> context id
        self._left_zero: list[list[int]] = []
        self._left_has_zero = _Grow()
        self._postings: dict[int, _Grow] = {}  # fact -> left semi-contexts holding it
        # right semi-contexts
        self._right_id: dict[Facts, int] = {}
        self._right_facts: list[Facts] = []
        self._right_size = _Grow()
        # contexts
        self._ctx_left = _Grow()
        self._ctx_right = _Grow()
        self._ctx_pos = _Grow()  # position in its left semi-context's (Python 2) dict order
        self._ctx_zero = _Grow()
        self._ctx_act = _Grow()  # activations
        self._ctx_lhash = _Grow()
        self._ctx_rhash = _Grow()
        self._hashes: dict[Facts, int] = {}
        self._got_cache: dict[tuple[Facts, int], IntArray] = {}
        # state between rows
        self._prev_facts: Facts = ()  # the previous row's left facts (sensor + neuron facts)
        self._counts: IntArray = _EMPTY  # per left semi-context: facts of _prev_facts it holds
        self._selected: IntArray = _EMPTY  # contexts of the left semi-contexts fully inside _prev_facts
        self._row = 0
        self._last_high = 0  # history index of the last raw score >= threshold (index 0: the initial 1.0)

    # ---------------------------------------------------------------------------------------- encoding

    def _encode(self, value: float) -> Facts:
        if self._fixed is None:
            self._lo = min(self._lo, value)
            self._hi = max(self._hi, value)
            lo, hi = self._lo, self._hi
        else:
            lo, hi = self._fixed
        span = hi - lo
        if span == 0.0:
            span = self._max_bin
        level = int((value - lo) / (span / self._max_bin))
        if level < 0:
            raise ValueError(f"value {value} below the encoding range ({lo}, {hi})")
        n_bits = max(self._bits, level.bit_length())
        return tuple(sorted(2 * b + ((level >> b) & 1) for b in range(n_bits)))

    # ------------------------------------------------------------------------------------------ memory

    def _hash(self, facts: Facts) -> int:
        h = self._hashes.get(facts)
        if h is None:
            h = self._hashes[facts] = py2_tuple_hash(facts)
        return h

    def _mark_zero(self, cid: int) -> None:
        self._ctx_zero.a[cid] = 1
        left = int(self._ctx_left.a[cid])
        self._left_has_zero.a[left] = 1
        zero = [c for c in self._left_ctx[left] if self._ctx_zero.a[c]]
        zero.sort(key=lambda c: int(self._ctx_pos.a[c]))
        self._left_zero[left] = zero

    def _store(self, left: Facts, right: Facts, zero_level: bool) -> tuple[bool, int]:
        """Find or create the context (left, right): ``(created, context id)``.  A zero-level lookup marks an
        existing context zero-level."""
        lid = self._left_id.get(left)
        if lid is None:
            lid = self._left_id[left] = len(self._left_facts)
            self._left_facts.append(left)
            self._left_size.append(len(left))
            self._left_ctx.append([])
            self._left_rights.append({})
            self._left_zero.append([])
            self._left_has_zero.append(0)
            for f in left:
                p = self._postings.get(f)
                if p is None:
                    p = self._postings[f] = _Grow()
                p.append(lid)
        rid = self._right_id.get(right)
        if rid is None:
            rid = self._right_id[right] = len(self._right_facts)
            self._right_facts.append(right)
            self._right_size.append(len(right))
        rights = self._left_rights[lid]
        cid = rights.get(rid)
        if cid is not None:
            if zero_level and not self._ctx_zero.a[cid]:
                self._mark_zero(cid)
            return False, cid
        cid = self._ctx_left.n
        rights[rid] = cid
        self._left_ctx[lid].append(cid)
        for g, x in ((self._ctx_left, lid), (self._ctx_right, rid), (self._ctx_pos, 0), (self._ctx_zero, 0),
                     (self._ctx_act, 0),
                     (self._ctx_lhash, self._hash(left)), (self._ctx_rhash, self._hash(right))):
            g.append(x)
        for pos, r in enumerate(py2_dict_order(list(rights))):
            self._ctx_pos.a[rights[r]] = pos
        if zero_level:
            self._mark_zero(cid)
        elif self._left_has_zero.a[lid]:  # positions moved: keep the zero list in dict order
            self._left_zero[lid].sort(key=lambda c: int(self._ctx_pos.a[c]))
        return True, cid

    def _contexts_of(self, lefts: IntArray) -> IntArray:
        ctx = self._left_ctx
        return np.fromiter(chain.from_iterable(ctx[i] for i in lefts.tolist()), dtype=np.int64)

    def _cross_left(self, facts: Facts) -> None:
        """Cross the left semi-contexts with ``facts`` (this row's left facts): per semi-context, how many of its
        facts are in them; the contexts of those fully inside them are the next row's selected contexts."""
        n = len(self._left_facts)
        parts = [self._postings[f].view for f in facts if f in self._postings]
        counts = np.bincount(np.concatenate(parts), minlength=n) if parts else np.zeros(n, dtype=np.int64)
        self._counts = counts
        self._selected = self._contexts_of(np.flatnonzero(counts == self._left_size.view))

    def _update(self, sensor: Facts, new_zero: bool) -> tuple[IntArray, int, list[tuple[Facts, Facts]]]:
        """Update the contexts selected by the previous row's left facts against this row's sensor facts:
        ``(active context ids, number selected, potential new contexts in the original's order)``."""
        key = (sensor, len(self._right_facts))
        got_r = self._got_cache.get(key)
        if got_r is None:  # per right semi-context: how many of its facts occur in this row
            got_r = self._got_cache[key] = np.fromiter(
                (sum(f in sensor for f in fs) for fs in self._right_facts), dtype=np.int64, count=key[1])
        sel = self._selected
        if not new_zero:  # the original's `newContextID != id` with newContextID False == 0
            sel = sel[sel != 0]
        rid = self._ctx_right.a[sel]
        size = self._right_size.a[rid]
        got = got_r[rid]
        is_active = (got > 0) & (got == size)
        active = sel[is_active]
        self._ctx_act.a[active] += 1
        potential: list[tuple[Facts, Facts]] = []
        if new_zero:
            counts = self._counts
            n = len(counts)
            lefts = self._ctx_left.a[sel]
            short = counts[lefts] <= self._max_left
            cand_full = sel[(self._ctx_zero.a[sel] == 1) & (got > 0) & ~is_active & short]
            partial = np.flatnonzero((counts > 0) & (counts <= self._max_left)
                                     & (counts != self._left_size.a[:n]) & (self._left_has_zero.a[:n] == 1))
            zero = self._left_zero
            cand_part = np.fromiter(chain.from_iterable(zero[i] for i in partial.tolist()), dtype=np.int64)
            cand_part = cand_part[got_r[self._ctx_right.a[cand_part]] > 0]
            cand = np.concatenate([cand_full, cand_part])
            if len(cand):
                cand = cand[np.lexsort((self._ctx_pos.a[cand], self._ctx_left.a[cand]))]
                prev = set(self._prev_facts)
                sens = set(sensor)
                lf, rf = self._left_facts, self._right_facts
                lcross: dict[int, Facts] = {}  # the crossed facts of a semi-context, once per row
                rcross: dict[int, Facts] = {}
                for lid, r in zip(self._ctx_left.a[cand].tolist(), self._ctx_right.a[cand].tolist(), strict=True):
                    lc = lcross.get(lid)
                    if lc is None:
                        lc = lcross[lid] = tuple([f for f in lf[lid] if f in prev])
                    rc = rcross.get(r)
                    if rc is None:
                        rc = rcross[r] = tuple([f for f in rf[r] if f in sens])
                    potential.append((lc, rc))
        return active, len(sel), potential

    # -------------------------------------------------------------------------------------------- a row

    def score(self, value: float) -> float:
        """Feed one row; return its reported anomaly score."""
        sensor = self._encode(value)

        potential_set: set[tuple[Facts, Facts]] = set()
        new_zero = False
        if self._prev_facts:
            potential_set.add((self._prev_facts, sensor))
            new_zero, _ = self._store(self._prev_facts, sensor, True)
        active, selected, potential = self._update(sensor, new_zero)
        potential_set.update(potential)
        active_share = len(active) / selected if selected > 0 else 0.0

        neurons: set[int] = set()
        if len(active):
            order = np.lexsort((self._ctx_rhash.a[active], self._ctx_lhash.a[active], self._ctx_act.a[active]))
            neurons = {_NEURON_BASE + c for c in active[order[-self._max_neurons:]].tolist()}
        self._prev_facts = facts = tuple(sorted(set(sensor) | neurons))

        added = sum(self._store(left, right, False)[0] for left, right in potential)
        added += 1 if new_zero else 0
        new_share = added / len(potential_set) if new_zero and potential_set else 0.0
        self._cross_left(facts)

        raw = (1.0 - active_share + new_share) / 2.0
        self._row += 1  # history index of this row's raw score
        quiet = self._rest > 0 and self._last_high < self._row - self._rest
        if raw >= self._threshold:
            self._last_high = self._row
        return raw if quiet else 0.0


# ---------------------------------------------------------------------------------------------- files


def nab_rest_period(n_rows: int) -> float:
    """NAB's rest period for an ``n_rows``-row file: its probationary period ``min(floor(0.15·n), 750)`` / 5."""
    return min(math.floor(0.15 * n_rows), 0.15 * 5000) / 5.0


def cad_ose_scores(values: npt.ArrayLike, value_range: tuple[float, float] | None = None,
                   *, rest_period: float | None = None) -> npt.NDArray[np.float64]:
    """One score per row, in [0, 1].

    ``value_range=(lo, hi)``: encode on that fixed range (NAB's protocol passes the file's own min and max); the
    rest period defaults to NAB's, from the number of rows (:func:`nab_rest_period`).  ``None``: encode row t on
    the min and max of rows <= t, rest period :data:`STREAMING_REST_PERIOD` by default (streaming: needs neither
    the range nor the length).  A value below a fixed range raises ``ValueError``; above it, it gets more bits
    (as in the original)."""
    v = np.asarray(values, dtype=np.float64)
    if rest_period is None:
        rest_period = STREAMING_REST_PERIOD if value_range is None else nab_rest_period(len(v))
    det = ContextualAnomalyDetector(value_range, rest_period)
    return np.fromiter((det.score(x) for x in v.tolist()), dtype=np.float64, count=len(v))


def cad_ose_rebinned_scores(values: npt.ArrayLike, *, rest_period: float = STREAMING_REST_PERIOD
                             ) -> npt.NDArray[np.float64]:
    """Streaming and re-binned: row t gets the score a detector gives it after seeing rows <= t, all quantised on
    the min and max of rows <= t — NAB's protocol applied to the prefix that ends at row t (with a fixed rest
    period).  Whenever the running range moves, the memory is rebuilt by replaying every earlier row on the new
    range (their scores are not reported again).  Costly: each range change replays the rows before it (on NAB
    ~4x as many rows as the corpus, ~5x the time of :func:`cad_ose_scores`)."""
    xs = np.asarray(values, dtype=np.float64).tolist()
    out = np.zeros(len(xs))
    if not xs:
        return out
    rng = (xs[0], xs[0])
    det = ContextualAnomalyDetector(rng, rest_period)
    for t, x in enumerate(xs):
        if not rng[0] <= x <= rng[1]:
            rng = (min(rng[0], x), max(rng[1], x))
            det = ContextualAnomalyDetector(rng, rest_period)
            for y in xs[:t]:
                det.score(y)
        out[t] = det.score(x)
    return out


def nab_cad_ose_scores(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """CAD OSE as NAB ran it for its published scores: the file's own min and max, NAB's rest period from the
    file's length (look-ahead, by design)."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return np.zeros(0)
    return cad_ose_scores(v, (float(v.min()), float(v.max())))
