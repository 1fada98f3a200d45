"""Data-flow features of a program (Pruner §2.4, PaCM's second branch), for a CPU: one row per program.

Pruner reads the multi-level tiling pattern of a GPU program as the data flow global -> shared -> local memory and
encodes each buffer's part in it. A CPU program has the same pattern one level per cache: the main statement's
operands flow from memory into the tile that fits L2, into the tile that fits L1, into the register tile (the
loops inside the innermost reduction loop). Each (level, buffer) pair is a token that says what moves into that
level: the bytes of the buffer's tile there, how often it is loaded (the iterations around the level), the traffic
that makes, how much of each cache line it uses, the work and arithmetic intensity inside, the vector fill and
the cores kept busy. Levels in data-flow order, buffers in the statement's order (the output first), up to
BUFFERS of them; a program without the pattern (no reduction: element-wise, copies) gets zero tokens, as in the
paper.

The row also carries a workload descriptor (the program's flops, argument bytes, the main statement's reduction and
spatial sizes, the vector width), which PaCM's statement branch appends to every statement row. It is laid out in
the 164 columns of a statement row so a program's features stay one (rows, 164) array: the extractor appends it as
the last row when a cost model reads it (`FeatureExtractor(dataflow=True)`), and its last column holds -1 (a
statement row's columns are counts or log2(1 + x), never negative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tensorgen.features.access import footprints
from tensorgen.features.layout import N_FEATURES, OP_CATEGORIES
from tensorgen.features.statement import Statement
from tensorgen.target import HardwareParams

LEVELS = ("l2_tile", "l1_tile", "register_tile")
BUFFERS = 3
TOKEN_FIELDS = (*(f"level.{lv}" for lv in LEVELS), "write", "intermediate", "tile_bytes", "tile_elements",
                "loads", "traffic_bytes", "line_use", "inner_stride", "flops_inside", "intensity", "vector_fill",
                "busy_cores", "loops_inside", "fits_l1")
WORKLOAD_FIELDS = ("flops", "main_flops", "argument_bytes", "reduction_size", "spatial_size", "statements",
                   "buffers", "has_pattern", "intermediate_bytes", "vector_lanes")
TOKENS = len(LEVELS) * BUFFERS
TOKEN_WIDTH = len(TOKEN_FIELDS)
WORKLOAD_WIDTH = len(WORKLOAD_FIELDS)
MARK = N_FEATURES - 1  # the column that is -1 in a data-flow row
assert WORKLOAD_WIDTH + TOKENS * TOKEN_WIDTH <= MARK

_FLOAT_OPS = len(OP_CATEGORIES)


def _log(x: float | np.ndarray) -> float | np.ndarray:
    return np.log2(1.0 + np.maximum(x, 0.0))


def dataflow_row(stmts: Sequence[Statement], hw: HardwareParams) -> np.ndarray:
    """The data-flow row of a program given by its statements (module docstring)."""
    row = np.zeros(N_FEATURES)
    row[MARK] = -1.0
    if not stmts:
        return row
    work = [max(float(st.ops[:_FLOAT_OPS].sum()), 0.0) * float(np.prod(st.extents)) for st in stmts]
    buffers = {a.buffer.name: a.buffer for st in stmts for a in st.accesses}
    mains = [k for k, st in enumerate(stmts) if any(a.buffer.name == st.accesses[0].buffer.name
                                                    for a in st.accesses[1:])]
    main = max(mains, key=lambda k: work[k], default=None)
    workload = row[:WORKLOAD_WIDTH]
    workload[0] = _log(sum(work))
    workload[2] = _log(sum(b.nbytes for b in buffers.values() if b.scope == "arg"))
    workload[5] = len(stmts)
    workload[6] = len(buffers)
    workload[8] = _log(sum(b.nbytes for b in buffers.values() if b.scope != "arg"))
    workload[9] = math.log2(hw.float_lanes)
    if main is None:
        return row
    st = stmts[main]
    ext = np.asarray(st.extents, dtype=float)
    store = st.accesses[0]
    reduction = (store.coef == 0) & (ext > 1)
    workload[1] = _log(work[main])
    workload[3] = _log(np.prod(np.where(reduction, ext, 1.0)))
    workload[4] = _log(np.prod(np.where(reduction, 1.0, ext)))
    workload[7] = 1.0
    row[WORKLOAD_WIDTH:WORKLOAD_WIDTH + TOKENS * TOKEN_WIDTH] = _tokens(st, ext, reduction, hw).reshape(-1)
    return row


def _tokens(st: Statement, ext: np.ndarray, reduction: np.ndarray, hw: HardwareParams) -> np.ndarray:
    L = len(ext)
    accesses = list({(a.buffer.name, tuple(a.coef)): a for a in st.accesses}.values())[:BUFFERS]
    coef = np.array([a.coef for a in accesses], dtype=float).reshape(len(accesses), L)
    elem = np.array([a.buffer.nbytes / max(a.buffer.size, 1) for a in accesses])
    size = np.array([a.buffer.size for a in accesses], dtype=float)
    feet = np.minimum(footprints(coef, ext), size[:, None]) * elem[:, None]  # (A, L + 1) bytes
    total = feet.sum(0)
    fits_l2, fits_l1 = np.nonzero(total <= hw.l2_bytes)[0], np.nonzero(total <= hw.l1_bytes)[0]
    register = (int(np.nonzero(reduction)[0][-1]) + 1) if reduction.any() else L
    levels = [int(fits_l2[0]) if fits_l2.size else L, int(fits_l1[0]) if fits_l1.size else L, register]
    flops_each = max(float(st.ops[:_FLOAT_OPS].sum()), 1.0)
    vec = [k for k in range(L) if st.kinds[k] == "vectorize"]
    fill = ext[vec[-1]] / (math.ceil(ext[vec[-1]] / hw.float_lanes) * hw.float_lanes) if vec else 0.0
    par = float(np.prod([ext[k] for k in range(L) if st.kinds[k] == "parallel"] or [1.0]))
    busy = par / (math.ceil(par / hw.cores) * hw.cores)
    line = float(hw.cache_line_bytes)
    out = np.zeros((len(LEVELS), BUFFERS, TOKEN_WIDTH))
    for i, level in enumerate(levels):
        around = float(np.prod(ext[:level]))
        inside = float(np.prod(ext[level:]))
        for j, a in enumerate(accesses):
            moving = [k for k in range(level, L) if coef[j, k] != 0]
            run = max([ext[k] for k in moving if coef[j, k] == 1] or [1.0])
            tok = out[i, j]
            tok[i] = 1.0
            tok[3] = float(j == 0)
            tok[4] = float(a.buffer.scope != "arg")
            tok[5], tok[6] = _log(feet[j, level]), _log(feet[j, level] / elem[j])
            tok[7], tok[8] = _log(around), _log(feet[j, level] * around)
            tok[9] = min(line, elem[j] * run) / line if moving else 1.0
            tok[10] = _log(coef[j, moving[-1]]) if moving else 0.0
            tok[11] = _log(flops_each * inside)
            tok[12] = _log(flops_each * inside / max(total[level], 1.0))
            tok[13] = fill if vec and vec[-1] >= level else 0.0
            tok[14] = busy
            tok[15] = L - level
            tok[16] = float(total[level] <= hw.l1_bytes)
    return out


def split_dataflow(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A program's (rows, 164) features with the data-flow row last -> (statement rows, workload descriptor,
    tokens (TOKENS, TOKEN_WIDTH)); a program with no rows (not a program) gets zeros."""
    if rows.shape[0] == 0 or rows[-1, MARK] != -1.0:
        return rows, np.zeros(WORKLOAD_WIDTH), np.zeros((TOKENS, TOKEN_WIDTH))
    last = rows[-1]
    return (rows[:-1], last[:WORKLOAD_WIDTH],
            last[WORKLOAD_WIDTH:WORKLOAD_WIDTH + TOKENS * TOKEN_WIDTH].reshape(TOKENS, TOKEN_WIDTH))
