"""Ansor's per-statement program features (paper §5.2, Appendix B) computed from the loop IR.

One row per Store in program order (reduction init and update are separate statements, as in TVM).
The column layout is `layout.NAMES` (164 columns, TVM feature.cc order); magnitudes are stored as
log2(1 + x). Deviations from TVM forced by this loop IR, all deliberate:

- op counts include index arithmetic and the guards (`If` conditions) enclosing the statement;
  `mad` counts float/int add/sub whose operand is a multiply (the multiply still counts as `mul`);
  casts have their own column in place of TVM's `is_gpu` flag (GPU columns are zero on CPU).
- annotation position: a loop is *spatial* for a statement if the store index depends on it,
  *reduce* otherwise; inner/middle/outer is its rank among those loops. Several annotated loops of
  different positions give `mixed`.
- the arithmetic-intensity curve samples flops/unique-bytes at each loop level (innermost out),
  linearly interpolated against log2(flops) at 10 evenly spaced points up to the full nest.
- footprints, cache lines and reuse use the approximations documented in `features.access`.
- auto_unroll_max_step comes from the lowered function's `attrs["auto_unroll"]` ({stage name: step}).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tensorgen.features.access import Access, BufferStats, buffer_stats, coefficients
from tensorgen.features.layout import (
    ANNOT_POS,
    BUF_WIDTH,
    CURVE_POINTS,
    N_BUFFERS,
    N_FEATURES,
    NAMES,
    OFF_ALLOC,
    OFF_BUF,
    OFF_CURVE,
    OFF_OTHER,
    OFF_PARALLEL,
    OFF_UNROLL,
    OFF_VEC,
    OP_CATEGORIES,
    log_scale,
)
from tensorgen.loopir.nodes import Allocate, BufLoad, For, If, PrimFunc, Seq, Stmt, Store
from tensorgen.target import HardwareParams
from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Expr, Logic, Select, is_float

__all__ = ["N_FEATURES", "NAMES", "statement_features"]

_OP_COL = {c: k for k, c in enumerate(OP_CATEGORIES)}
_BIN_CAT = {"add": "addsub", "sub": "addsub", "mul": "mul", "div": "divmod", "floordiv": "divmod",
            "floormod": "divmod", "min": "maxmin", "max": "maxmin"}
_N_OPS = 2 * len(OP_CATEGORIES) + 3  # float, int, then bool / select / cast


@dataclass
class _Context:
    """A statement with everything around it that the features need."""

    store: Store
    loops: tuple[For, ...]
    conds: tuple[Expr, ...]
    alloc_outer: float | None  # executions of the Allocate of the store's buffer (None: an argument)


def _collect(body: Stmt) -> list[_Context]:
    out: list[_Context] = []

    def visit(s: Stmt, loops: tuple[For, ...], conds: tuple[Expr, ...], allocs: dict[str, float]) -> None:
        if isinstance(s, Store):
            out.append(_Context(s, loops, conds, allocs.get(s.buffer.name)))
        elif isinstance(s, For):
            visit(s.body, loops + (s,), conds, allocs)
        elif isinstance(s, Seq):
            for x in s.stmts:
                visit(x, loops, conds, allocs)
        elif isinstance(s, If):
            visit(s.then, loops, conds + (s.cond,), allocs)
            if s.orelse is not None:
                visit(s.orelse, loops, conds, allocs)
        elif isinstance(s, Allocate):
            visit(s.body, loops, conds, {**allocs, s.buffer.name: float(math.prod([f.extent for f in loops]))})

    visit(body, (), (), {})
    return out


def _count_ops(exprs: list[Expr]) -> tuple[np.ndarray, list[BufLoad]]:
    """Operations per execution by category, and the distinct loads met on the way."""
    counts = np.zeros(_N_OPS)
    loads: list[BufLoad] = []
    stack = list(exprs)
    seen: set[int] = set()
    while stack:
        e = stack.pop()
        if id(e) in seen:  # shared subtrees (the store index reused by the accumulator load) count once: CSE
            continue
        seen.add(id(e))
        if isinstance(e, BinOp):
            cat = _BIN_CAT.get(e.op)
            if cat == "addsub" and (_is_mul(e.a) or _is_mul(e.b)):
                cat = "mad"
            if cat is not None:
                counts[_OP_COL[cat] + (0 if is_float(e.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Cmp):
            counts[_OP_COL["cmp"] + (0 if is_float(e.a.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Call):
            counts[_OP_COL["math_func"] + (0 if is_float(e.dtype) else len(OP_CATEGORIES))] += 1
        elif isinstance(e, Logic):
            counts[-3] += 1
        elif isinstance(e, Select):
            counts[-2] += 1
        elif isinstance(e, Cast):
            counts[-1] += 1
        elif isinstance(e, BufLoad):
            loads.append(e)
        stack.extend(e.children())
    return counts, loads


def _is_mul(e: Expr) -> bool:
    return isinstance(e, BinOp) and e.op == "mul"


def _annotation(kind: str, loops: tuple[For, ...], spatial: np.ndarray) -> np.ndarray:
    """num, prod, len of the innermost, and the one-hot position of `kind` loops around a statement."""
    out = np.zeros(3 + len(ANNOT_POS))
    idx = [k for k, f in enumerate(loops) if f.kind == kind]
    if not idx:
        out[3] = 1.0
        return out
    out[0], out[1], out[2] = len(idx), float(math.prod([loops[k].extent for k in idx])), loops[idx[-1]].extent
    pos = set()
    for k in idx:
        group = np.nonzero(spatial == spatial[k])[0]
        rank = "inner" if k == group[-1] else "outer" if k == group[0] else "middle"
        pos.add(f"{rank}_{'spatial' if spatial[k] else 'reduce'}")
    out[3 + ANNOT_POS.index(pos.pop() if len(pos) == 1 else "mixed")] = 1.0
    return out


def _curve(flops_per_exec: float, extents: np.ndarray, stats: list[BufferStats]) -> np.ndarray:
    """Arithmetic intensity (flops / unique bytes) per loop level, sampled at 10 points of log2 flops."""
    if flops_per_exec <= 0:
        return np.zeros(CURVE_POINTS)
    n = len(extents)
    inner = np.ones(n + 1)  # executions under loops k.., innermost level last
    if n:
        inner[:n] = np.cumprod(extents[::-1])[::-1]
    flops = (flops_per_exec * inner)[::-1]  # innermost (statement alone) first
    nbytes = np.sum([s.unique for s in stats], axis=0)[::-1] if stats else np.ones(n + 1)
    x, y = np.log2(flops), flops / np.maximum(nbytes, 1.0)
    keep = np.concatenate([[True], np.diff(x) > 1e-9])
    x, y = x[keep], y[keep]
    targets = x[-1] * np.arange(1, CURVE_POINTS + 1) / CURVE_POINTS
    return np.interp(targets, x, y)


def _buffer_row(st: BufferStats, stats: list[BufferStats], extents: np.ndarray, serial: list[int]) -> np.ndarray:
    """TVM's per-buffer record; reuse is found at the innermost loop that revisits data (serial[k]:
    statements touching the buffer under loop k)."""
    row = np.zeros(BUF_WIDTH)
    row[0 if not st.writes else 1 if not st.reads else 2] = 1.0
    row[3:7] = st.bytes, st.unique[0], st.lines, st.unique_lines
    reuse, dis_iter, dis_bytes, ct = 2, 0.0, 0.0, 0.0
    for k in range(len(extents) - 1, -1, -1):
        if extents[k] > 1 and any(c[k] == 0 for c in st.coefs):  # this loop revisits the same data
            reuse, ct = 0, float(extents[k])
        elif serial[k] > 1:  # several statements touch the buffer in the same loop body
            reuse, ct = 1, float(serial[k] - 1)
        else:
            continue
        dis_iter = float(math.prod(extents[k + 1:]))
        dis_bytes = float(sum(s.unique[k + 1] for s in stats))
        break
    row[7 + reuse] = 1.0
    row[10:13] = dis_iter, dis_bytes, ct
    div = ct if ct > 0.5 else 0.5  # no reuse: TVM's "multiply by 2"
    row[13:17] = np.array([st.bytes, st.unique[0], st.lines, st.unique_lines]) / div
    row[17] = st.stride
    return row


def statement_features(func: PrimFunc, hw: HardwareParams, log: bool = True) -> np.ndarray:
    """(n_statements, N_FEATURES) features of every Store of `func`, in program order."""
    auto_unroll = func.attrs.get("auto_unroll", {})
    ctxs = _collect(func.body)
    rows = np.zeros((len(ctxs), N_FEATURES))
    # statements touching each buffer under each loop: the serial-reuse counter (TVM's for_touch_regions_)
    infos = []
    under: dict[tuple[int, str], int] = {}
    for ctx in ctxs:
        ops, loads = _count_ops([ctx.store.value, ctx.store.index, *ctx.conds])
        names = {ctx.store.buffer.name, *(ld.buffer.name for ld in loads)}
        for f in ctx.loops:
            for nm in names:
                under[(id(f), nm)] = under.get((id(f), nm), 0) + 1
        infos.append((ops, loads))
    for r, (ctx, (ops, loads)) in enumerate(zip(ctxs, infos)):
        rows[r] = _row(ctx, ops, loads, hw, auto_unroll, under)
    return log_scale(rows) if log else rows


def _row(ctx: _Context, ops: np.ndarray, loads: list[BufLoad], hw: HardwareParams,
         auto_unroll: Mapping[str, int], under: dict[tuple[int, str], int]) -> np.ndarray:
    row = np.zeros(N_FEATURES)
    loops = ctx.loops
    loop_vars = [f.var for f in loops]
    extents = np.array([f.extent for f in loops], dtype=float)
    trip = float(math.prod(extents))
    row[:_N_OPS] = ops * trip

    store_coef, store_off = coefficients(ctx.store.index, loop_vars, extents)
    accesses = [Access(ctx.store.buffer, True, store_coef, store_off)]
    for ld in loads:
        accesses.append(Access(ld.buffer, False, *coefficients(ld.index, loop_vars, extents)))
    spatial = store_coef > 0
    row[OFF_VEC:OFF_VEC + 11] = _annotation("vectorize", loops, spatial)
    row[OFF_UNROLL:OFF_UNROLL + 11] = _annotation("unroll", loops, spatial)
    row[OFF_PARALLEL:OFF_PARALLEL + 11] = _annotation("parallel", loops, spatial)

    stats = buffer_stats(accesses, extents, trip, hw.cache_line_bytes)
    float_ops = float(ops[:len(OP_CATEGORIES)].sum())
    row[OFF_CURVE:OFF_CURVE + CURVE_POINTS] = _curve(float_ops, extents, stats)

    ranked = sorted(stats, key=lambda s: (-s.bytes, -s.unique[0], s.buffer.name))[:N_BUFFERS]
    for b, st in enumerate(ranked):
        nm = st.buffer.name
        serial = [under.get((id(f), nm), 0) for f in loops]
        row[OFF_BUF + b * BUF_WIDTH:OFF_BUF + (b + 1) * BUF_WIDTH] = _buffer_row(st, stats, extents, serial)

    if ctx.alloc_outer is not None:
        buf = ctx.store.buffer
        row[OFF_ALLOC:OFF_ALLOC + 4] = buf.nbytes, buf.size * ctx.alloc_outer, ctx.alloc_outer, \
            trip / max(ctx.alloc_outer, 1.0)
    row[OFF_OTHER:OFF_OTHER + 3] = trip, len(loops), float(auto_unroll.get(ctx.store.buffer.name, 0))
    return row
