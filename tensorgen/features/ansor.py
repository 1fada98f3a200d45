"""Ansor's per-statement program features (paper §5.2, Appendix B), many statements at once.

One row per Store in program order (reduction init and update are separate statements, as in TVM).
The column layout is `layout.NAMES` (164 columns, TVM feature.cc order); magnitudes are stored as
log2(1 + x). Deviations from TVM forced by this loop IR, all deliberate:

- op counts include index arithmetic and the guards (`If` conditions) enclosing the statement;
  `mad` counts float/int add/sub whose operand is a multiply (the multiply still counts as `mul`);
  casts have their own column in place of TVM's `is_gpu` flag. A statement in a GPU kernel has its binding
  lengths as TVM's: per axis the extent of the innermost loop bound to it, vthread's the product, 1 where none is;
  they are zero on CPU. Bound loops are loops of the nest like any other (TVM's fake loops).
- annotation position: a loop is *spatial* for a statement if the store index depends on it,
  *reduce* otherwise; inner/middle/outer is its rank among those loops. Several annotated loops of
  different positions give `mixed`.
- the arithmetic-intensity curve samples flops/unique-bytes at each loop level (innermost out),
  linearly interpolated against log2(flops) at 10 evenly spaced points up to the full nest.
- footprints, cache lines and reuse use the approximations documented in `features.access`.

The search scores thousands of candidates per generation; computed one statement at a time the
features cost ~40 small NumPy calls each. Statements of the same shape (loop count, accessed buffers
in order) are stacked instead, and every quantity is one array operation over the stack.
- auto_unroll_max_step is the statement's stage's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tensorgen.features.access import footprints
from tensorgen.features.layout import (
    BUF_WIDTH,
    CURVE_POINTS,
    N_BUFFERS,
    N_FEATURES,
    NAMES,
    OFF_ALLOC,
    OFF_BUF,
    OFF_CURVE,
    OFF_GPU,
    OFF_OTHER,
    OFF_PARALLEL,
    OFF_UNROLL,
    OFF_VEC,
    OP_CATEGORIES,
    log_scale,
)
from tensorgen.features.statement import N_OPS, Statement, ir_statements
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.target import HardwareParams

#: the loop kinds binding GPU axes, in the order of layout.GPU_AXES' columns
_BINDINGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z", "vthread")
_KIND = {"serial": 0, "parallel": 1, "vectorize": 2, "unroll": 3, **{b: 4 + k for k, b in enumerate(_BINDINGS)}}
_ANNOTATED = ((_KIND["vectorize"], OFF_VEC), (_KIND["unroll"], OFF_UNROLL), (_KIND["parallel"], OFF_PARALLEL))


__all__ = ["N_FEATURES", "NAMES", "batch_features", "features_of", "statement_features"]


def statement_features(func: PrimFunc, hw: HardwareParams, log: bool = True) -> np.ndarray:
    """(n_statements, N_FEATURES) features of every Store of `func`, in program order."""
    return features_of(ir_statements(func), hw, log)


def features_of(stmts: Sequence[Statement], hw: HardwareParams, log: bool = True) -> np.ndarray:
    """(n_statements, N_FEATURES) features of one program's statements, log-scaled unless `log` is False."""
    return batch_features([stmts], hw, log)[0]


def batch_features(programs: Sequence[Sequence[Statement]], hw: HardwareParams, log: bool = True) -> list[np.ndarray]:
    """One (n_statements, N_FEATURES) array per program, rows in statement order."""
    out = [np.zeros((len(p), N_FEATURES)) for p in programs]
    groups: dict[tuple, list[tuple[int, int, Statement, list[list[int]]]]] = {}
    for p, stmts in enumerate(programs):
        # statements touching each buffer under each loop: the serial-reuse counter (TVM's for_touch_regions_)
        under: dict[tuple, int] = {}
        for st in stmts:
            for nm in {a.buffer.name for a in st.accesses}:
                for lid in st.ids:
                    under[(lid, nm)] = under.get((lid, nm), 0) + 1
        for s, st in enumerate(stmts):
            names = tuple((a.buffer.name, a.write) for a in st.accesses)
            serial = [[under.get((lid, nm), 0) for lid in st.ids] for nm in dict.fromkeys(n for n, _ in names)]
            groups.setdefault((len(st.extents), names), []).append((p, s, st, serial))
    for (n_loops, names), members in groups.items():
        rows = _rows([m[2] for m in members], np.array([m[3] for m in members], dtype=float), n_loops, names,
                     hw.cache_line_bytes)
        if log:
            log_scale(rows)
        for (p, s, _, _), row in zip(members, rows):
            out[p][s] = row
    return out


def _rows(stmts: list[Statement], serial: np.ndarray, n_loops: int, names: tuple, line: int) -> np.ndarray:
    """Feature rows of statements of one shape; `serial` is (N, n_buffers, n_loops)."""
    n, L, A = len(stmts), n_loops, len(names)
    ext = np.array([st.extents for st in stmts], dtype=float).reshape(n, L)
    coef = np.array([[a.coef for a in st.accesses] for st in stmts], dtype=float).reshape(n, A, L)
    offset = np.array([[a.offset for a in st.accesses] for st in stmts], dtype=float).reshape(n, A)
    size = np.array([[a.buffer.size for a in st.accesses] for st in stmts], dtype=float).reshape(n, A)
    elem = np.array([[a.buffer.nbytes for a in st.accesses] for st in stmts], dtype=float).reshape(n, A)
    elem /= np.maximum(size, 1.0)
    ops = np.array([st.ops for st in stmts], dtype=float).reshape(n, N_OPS)
    kind = np.array([[_KIND[k] for k in st.kinds] for st in stmts], dtype=int).reshape(n, L)
    rows = np.zeros((n, N_FEATURES))
    trip = ext.prod(axis=1)
    at = np.arange(n)
    rows[:, :N_OPS] = ops * trip[:, None]

    # annotations: where the annotated loops sit among the statement's spatial / reduce loops
    spatial = coef[:, 0, :] > 0
    if L:
        later_same = np.where(spatial, _after(spatial), _after(~spatial))
        earlier_same = np.where(spatial, np.cumsum(spatial, 1) - spatial, np.cumsum(~spatial, 1) - ~spatial)
        rank = np.where(later_same == 0, 0, np.where(earlier_same == 0, 2, 1))  # inner, middle, outer
        code = rank + np.where(spatial, 0, 3)  # ANNOT_POS index - 1
    for k, off in _ANNOTATED:
        mask = kind == k
        num = mask.sum(axis=1)
        pos = np.zeros(n, dtype=int)
        if L:
            has = num > 0
            innermost = L - 1 - np.argmax(mask[:, ::-1], axis=1)
            rows[:, off] = num
            rows[:, off + 1] = np.where(has, np.where(mask, ext, 1.0).prod(axis=1), 0.0)
            rows[:, off + 2] = np.where(has, ext[at, innermost], 0.0)
            lo, hi = np.where(mask, code, 99).min(axis=1), np.where(mask, code, -1).max(axis=1)
            pos = np.where(has, np.where(lo == hi, 1 + lo, 7), 0)
        rows[at, off + 3 + pos] = 1.0

    # per access: footprints under each loop level, innermost moving loop and its stride
    footprint = footprints(coef, ext)
    suffix = np.ones((n, L + 1))  # iterations of loops k.. (k = L: the statement alone)
    moving = np.zeros((n, A), dtype=bool)
    inner = np.zeros((n, A), dtype=int)
    stride = np.zeros((n, A))
    smallest = np.full((n, A), np.inf)
    if L:
        suffix[:, :L] = np.cumprod(ext[:, ::-1], axis=1)[:, ::-1]
        nz = coef != 0
        moving = nz.any(axis=-1)
        inner = L - 1 - np.argmax(nz[..., ::-1], axis=-1)
        stride = np.where(moving, np.take_along_axis(coef, inner[..., None], -1)[..., 0], 0.0)
        smallest = np.where(nz, coef, np.inf).min(axis=-1)
    per_line = np.minimum(1.0, stride * elem / line)
    lines_each = np.where(moving, trip[:, None] / suffix[at[:, None], np.minimum(inner + 1, L)] * per_line, 1.0)

    # per buffer (accesses grouped by name, in order of first appearance)
    bufs: dict[str, list[int]] = {}
    for a, (nm, _) in enumerate(names):
        bufs.setdefault(nm, []).append(a)
    nb = len(bufs)
    b_bytes, b_u0, b_lines, b_ulines, b_stride = (np.zeros((nb, n)) for _ in range(5))
    b_unique = np.zeros((nb, n, L + 1))
    b_revisit = np.zeros((nb, n, L), dtype=bool)  # a loop that leaves some access of the buffer in place
    b_type = np.zeros(nb, dtype=int)
    for g, idx in enumerate(bufs.values()):
        c = coef[:, idx, :]
        same = (c == c[:, :1, :]).all(axis=(1, 2))
        shift = offset[:, idx].max(axis=1) - offset[:, idx].min(axis=1)
        total = footprint[:, idx, :].sum(axis=1)
        elems = np.where(same[:, None], np.minimum(footprint[:, idx[0], :] + shift[:, None], total), total)
        elems = np.minimum(elems, size[:, idx[0], None])
        eb = elem[:, idx[0]]
        smin = smallest[:, idx].min(axis=1)
        writes = sum(names[a][1] for a in idx)
        b_type[g] = 0 if not writes else 1 if writes == len(idx) else 2
        b_bytes[g] = len(idx) * trip * eb
        b_unique[g] = elems * eb[:, None]
        b_u0[g] = b_unique[g][:, 0]
        b_lines[g] = lines_each[:, idx].sum(axis=1)
        with np.errstate(invalid="ignore"):
            b_ulines[g] = np.where(np.isinf(smin), 1.0,
                                   np.maximum(1.0, elems[:, 0] * np.minimum(line, smin * eb) / line))
        b_stride[g] = stride[:, idx].max(axis=1)
        b_revisit[g] = (c == 0).any(axis=1) & (ext > 1)
    unique_all = b_unique.sum(axis=0) if nb else np.ones((n, L + 1))

    rows[:, OFF_CURVE:OFF_CURVE + CURVE_POINTS] = _curve(ops[:, :len(OP_CATEGORIES)].sum(axis=1), suffix, unique_all)

    # the N_BUFFERS buffers with most bytes (then most unique bytes, then by name)
    name_rank = np.argsort(np.argsort(list(bufs)))
    order = np.lexsort((np.broadcast_to(name_rank[:, None], (nb, n)), -b_u0, -b_bytes), axis=0)
    ser = serial.transpose(1, 0, 2)  # (nb, N, L)
    for slot in range(min(nb, N_BUFFERS)):
        g = order[slot]
        base = OFF_BUF + slot * BUF_WIDTH
        rows[at, base + b_type[g]] = 1.0
        stats = np.stack([b_bytes[g, at], b_u0[g, at], b_lines[g, at], b_ulines[g, at]], axis=1)
        rows[:, base + 3:base + 7] = stats
        loop_reuse, serial_reuse = b_revisit[g, at], ser[g, at] > 1
        either = loop_reuse | serial_reuse
        found = either.any(axis=1)
        k = L - 1 - np.argmax(either[:, ::-1], axis=1) if L else np.zeros(n, dtype=int)
        by_loop = found & (loop_reuse[at, k] if L else False)
        reuse = np.where(found, np.where(by_loop, 0, 1), 2)
        ct = np.zeros(n)
        if L:
            ct = np.where(found, np.where(by_loop, ext[at, k], ser[g, at][at, k] - 1), 0.0)
        rows[at, base + 7 + reuse] = 1.0
        rows[:, base + 10] = np.where(found, suffix[at, np.minimum(k + 1, L)], 0.0)
        rows[:, base + 11] = np.where(found, unique_all[at, np.minimum(k + 1, L)], 0.0)
        rows[:, base + 12] = ct
        rows[:, base + 13:base + 17] = stats / np.where(ct > 0.5, ct, 0.5)[:, None]
        rows[:, base + 17] = b_stride[g, at]

    alloc = np.array([np.nan if st.alloc_outer is None else st.alloc_outer for st in stmts])
    has_alloc = ~np.isnan(alloc)
    rows[has_alloc, OFF_ALLOC] = (elem[:, 0] * size[:, 0])[has_alloc]
    rows[has_alloc, OFF_ALLOC + 1] = (size[:, 0] * alloc)[has_alloc]
    rows[has_alloc, OFF_ALLOC + 2] = alloc[has_alloc]
    rows[has_alloc, OFF_ALLOC + 3] = (trip / np.maximum(alloc, 1.0))[has_alloc]
    bound = kind[:, :, None] == 4 + np.arange(len(_BINDINGS))  # (n, L, bindings)
    if bound.any():
        e = ext[:, :, None]
        last = L - 1 - np.argmax(bound[:, ::-1, :], axis=1)  # the innermost loop bound to each (where one is)
        innermost = np.take_along_axis(e, last[:, None, :], axis=1)[:, 0, :]
        lengths = np.where(bound.any(1), innermost, 1.0)
        lengths[:, -1] = np.where(bound[..., -1], e[..., 0], 1.0).prod(1)  # vthreads nest
        rows[:, OFF_GPU:OFF_GPU + len(_BINDINGS)] = np.where(bound.any((1, 2))[:, None], lengths, 0.0)
    rows[:, OFF_OTHER] = trip
    rows[:, OFF_OTHER + 1] = L
    rows[:, OFF_OTHER + 2] = [st.unroll for st in stmts]
    return rows


def _after(mask: np.ndarray) -> np.ndarray:
    """How many later entries of each row are set."""
    return np.cumsum(mask[:, ::-1], axis=1)[:, ::-1] - mask


def _curve(flops_per_exec: np.ndarray, suffix: np.ndarray, unique: np.ndarray) -> np.ndarray:
    """Arithmetic intensity (flops / unique bytes) per loop level, sampled at 10 points of log2 flops."""
    out = np.zeros((len(suffix), CURVE_POINTS))
    for r in np.nonzero(flops_per_exec > 0)[0]:
        flops = (flops_per_exec[r] * suffix[r])[::-1]  # the statement alone first
        x, y = np.log2(flops), flops / np.maximum(unique[r][::-1], 1.0)
        keep = np.concatenate([[True], np.diff(x) > 1e-9])
        x, y = x[keep], y[keep]
        out[r] = np.interp(x[-1] * np.arange(1, CURVE_POINTS + 1) / CURVE_POINTS, x, y)
    return out
