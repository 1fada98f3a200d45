"""Pruner's Parameterized Static Analyzer (PSA, Pruner §2.3) for CPUs: a formula latency, no training.

The learned model only ranks well what it has seen; a random sample of a large space is mostly programs no
one would write (one accumulator, partial vectors, a serial outer loop), and the first rounds spend their
measurements on them. PSA estimates each innermost statement's compute and memory latency from hardware
parameters and a few penalty terms, so the search can drop such programs before anything is measured.

Pruner's terms are written for GPUs; on a CPU they become
- thread level: the register tile (the loops inside the innermost reduction loop) against the vector
  registers, P_reg = max(n_r / n_r*, 1) with n_r = accumulators + the operand registers held (a read
  reused across a tile loop keeps its points inside that loop, as a GEMM tile keeps B's row; one that moves
  with every tile loop streams through one register, as A's points do), times alpha = 1 + loads /
  accumulators (the memory-to-compute ratio of the tile); a short innermost reduction that the compiler unrolls
  inside spatial loops may instead keep what those loops do not move in registers (a weight-stationary tile) and
  load the rest with the accumulators once per pass: alpha is the lower of the two;
- warp level: the lane fill of the vectorized loop (a 24-element loop fills two 16-lane vectors 75%), and
  the dependency chains: fewer independent accumulators in flight than `fma_chain` (FMA latency x FMA ports)
  stall. In flight are the register tile's accumulators, times the tiles the out-of-order `window` holds when
  a chain is short: a chain runs over the reduction loops around the tile up to where its accumulator is
  initialized (a 3 x 3 window: 9 steps), and the next tile's chains start while it ends;
- kernel level: parallel iterations against cores, p / (ceil(p / cores) * cores) (1 / cores if serial);
- memory: cache-line use of the contiguous run of each access, against the traffic that misses L2: the
  footprint (`window_footprints`: a convolution's overlapping windows counted once) of the outermost loop level
  that fits, then what each iteration of the loop just outside adds to the previous one's (nothing if the access
  does not move with it: a 1x1 conv's weights, read whole by every parallel iteration, are fetched once; the
  rows a sliding window moves on), times the iterations of the loops around that one.
An out-of-order core overlaps compute and memory, so a statement costs max(L_com, L_mem) where Pruner
(for GPUs) adds them; the program's latency is the sum over statements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.features.access import window_footprints
from tensorgen.features.layout import OP_CATEGORIES
from tensorgen.features.nest import program_statements
from tensorgen.features.statement import Statement
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams

__all__ = ["Analyzer", "StaticAnalyzer"]

_FLOAT_OPS = len(OP_CATEGORIES)


@dataclass(frozen=True)
class Analyzer:
    """A static analyzer of programs on `hw`: estimated latency (seconds), lower is better, only the order is used.
    On a GPU's `hw` (HardwareParams.is_gpu) it reads GPU kernels (bound loops, shared and local buffers)."""

    hw: HardwareParams

    def latency(self, state: State) -> float:
        """The latency of one program; inf for a state that is not a complete program."""
        return float(self.latencies([state])[0])

    def latencies(self, states: Sequence[State]) -> np.ndarray:
        """The latency of each program (inf where a state is not a complete program)."""
        programs: list[Sequence[Statement] | None] = []
        for state in states:
            try:
                programs.append(program_statements(state, gpu=self.hw.is_gpu))
            except TensorgenError:
                programs.append(None)
        return self.program_latencies(programs)

    def program_latencies(self, programs: Sequence[Sequence[Statement] | None]) -> np.ndarray:
        """The latency of each program given by its statements (None: inf)."""
        raise NotImplementedError


@dataclass(frozen=True)
class StaticAnalyzer(Analyzer):
    """Estimated latency (seconds) of programs on a CPU `hw`; lower is better, only the order is used.

    `registers`: vector registers (default 32 with 64-byte SIMD, else 16); `fma_chain`: independent
    accumulators that keep the FMA units busy (latency 4 x 2 ports); `window`: instructions the out-of-order core
    overlaps (its reorder buffer); `unroll`: the most steps (vector FMAs) of an innermost reduction the compiler
    unrolls completely (gcc: up to 16 iterations); `miss_gbs`: bandwidth of traffic that
    misses L2 (default 20 GB/s per core); `peak_gflops` defaults to the measured peak or 2 FMA ports x lanes
    x 2 flops x 2.5 GHz per core.
    """

    registers: int | None = None
    fma_chain: int = 8
    window: int = 224
    unroll: int = 32
    miss_gbs: float | None = None

    @property
    def lanes(self) -> int:
        return self.hw.float_lanes

    def peak(self) -> float:
        return self.hw.peak_gflops or self.hw.cores * self.lanes * 2 * 2 * 2.5

    def program_latencies(self, programs: Sequence[Sequence[Statement] | None]) -> np.ndarray:
        """The latency of each program given by its statements (None: inf), all statements at once
        (`statement_stacks`)."""
        out = np.array([0.0 if p is not None else math.inf for p in programs])
        for group in statement_stacks(programs):
            np.add.at(out, group.program, np.maximum(self._compute(group.stack), self._memory(group.stack)))
        return out

    def _compute(self, s: StatementStack) -> np.ndarray:
        n, L, lanes, ext = len(s.ext), s.ext.shape[1], self.lanes, s.ext
        rows = np.arange(n)
        vec = _last(s.kinds == "vectorize")
        reads = ~s.same_as_store[1:]  # accesses after the store to other buffers
        updates = bool(s.same_as_store[1:].any())
        if L:  # gcc -O3 vectorizes a unit-stride innermost loop by itself, and codegen.vector an innermost reduction
            # into one element over reads contiguous or invariant in it (at least 4 lanes, one read contiguous)
            inner_reads = s.coef[:, 1:, -1][:, reads]
            reduction = (s.coef[:, 0, -1] == 0) & (ext[:, -1] >= 4) & updates \
                & np.all((inner_reads == 0) | (inner_reads == 1), axis=1) & np.any(inner_reads == 1, axis=1)
            vec = np.where((vec < 0) & (((ext[:, -1] > 1) & (s.coef[:, 0, -1] == 1)) | reduction), L - 1, vec)
        vec_ext = ext[rows, np.maximum(vec, 0)] if L else np.ones(n)
        fill = np.where(vec >= 0, vec_ext / np.ceil(vec_ext / lanes), 1.0)  # lanes used per instruction
        p = np.prod(np.where(s.kinds == "parallel", ext, 1.0), axis=1)
        busy = p / np.ceil(p / self.hw.cores)  # cores kept busy on average
        work = np.maximum(s.ops[:, :_FLOAT_OPS].sum(1), 1.0) * ext.prod(1)  # a copy still costs a store each
        loop = np.arange(L)
        # the loops of the accumulator's chains: those its index ignores, inside the loops it is initialized in
        reduce = updates & (s.coef[:, 0, :] == 0) & (ext > 1) & (loop >= s.chain_start[:, None])
        has_reduce = reduce.any(1)
        last = np.where(has_reduce, _last(reduce), L)  # the innermost reduction loop
        inner = loop[None, :] > last[:, None]  # the register tile: loops inside it
        in_vec = (vec >= 0) & (vec > last)
        acc = np.prod(np.where(inner, ext, 1.0), axis=1) / np.where(in_vec, fill, 1.0)
        coef_r = s.coef[:, 1:, :][:, reads, :]  # (n, reads, L)
        pts = np.prod(np.where(inner[:, None, :] & (coef_r != 0), ext[:, None, :], 1.0), axis=2)
        unit_vec = coef_r[rows, :, np.maximum(vec, 0)] == 1 if L else np.zeros(pts.shape, bool)
        vec_read = in_vec[:, None] & unit_vec  # the read's points along the vector loop are whole vectors
        per_step = np.where(vec_read, pts / fill[:, None], pts)  # each read's loads per step of the reduction
        loads = per_step.sum(axis=1)
        # registers a read holds: its points inside the outermost tile loop it does not move with (kept across that
        # loop's iterations: a GEMM tile's row of B; one streamed register if it moves with every tile loop: A's)
        held_from = np.where((inner & (ext > 1))[:, None, :] & (coef_r == 0), loop, L).min(axis=2, initial=L)
        inside = loop > held_from[..., None]
        held = np.prod(np.where(inside & (coef_r != 0), ext[:, None, :], 1.0), axis=2)
        held = np.where(vec_read & (vec[:, None] > held_from), held / fill[:, None], held)
        regs = self.registers or self.hw.vector_registers
        # a short innermost reduction the compiler unrolls inside spatial loops: what those loops do not move stays in
        # registers across them (a weight-stationary tile: a conv's 4 input channels x 2 vectors of weights held
        # while 16 output pixels pass), what they move is loaded with the accumulators once per pass; the compiler
        # keeps whichever of the two tiles loads less (the held reads that do not fit beside the accumulators reload)
        prev = np.where(reduce & (loop < last[:, None]), loop, -1).max(axis=1, initial=-1)
        around = (loop > prev[:, None]) & (loop < last[:, None]) & (ext > 1)  # the spatial loops around it
        moved = np.any(around[:, None, :] & (coef_r != 0), axis=2)  # (n, reads)
        last_ext = ext[rows, np.minimum(last, L - 1)] if L else np.ones(n)
        moves_in_last = coef_r[rows, :, np.minimum(last, L - 1)] != 0 if L else np.zeros(pts.shape, bool)
        per_pass = per_step * np.where(moves_in_last, last_ext[:, None], 1.0)  # each read's loads in one pass
        steps_pass = last_ext * acc
        stationary = np.sum(np.where(moved, 0.0, per_pass), axis=1)
        pass_loads = np.sum(np.where(moved, per_pass, 0.0), axis=1) + acc + np.maximum(stationary + acc - regs, 0.0)
        unrolls = has_reduce & around.any(1) & (steps_pass <= self.unroll)
        alpha = np.where(unrolls, np.minimum(1 + loads / acc, 1 + pass_loads / steps_pass), 1 + loads / acc)
        tile = alpha * np.maximum((acc + held.sum(1)) / regs, 1.0)
        thread = np.where(has_reduce, tile, 1.0 + int(reads.sum()))
        # a chain: the reduction loops from the innermost one out to the first loop that moves the accumulator or
        # encloses its initialization
        ends = (loop[None, :] <= last[:, None]) & ~reduce & (ext > 1)
        steps = np.prod(np.where(reduce & (loop > _last(ends)[:, None]), ext, 1.0), axis=1)
        in_flight = acc * np.maximum(self.window / (steps * (acc + loads)), 1.0)
        chains = np.where(has_reduce, np.maximum(self.fma_chain / in_flight, 1.0), 1.0)
        return work / (self.peak() * 1e9) * (lanes / fill) * (self.hw.cores / busy) * thread * chains

    def _memory(self, s: StatementStack) -> np.ndarray:
        n, A, L = s.coef.shape
        line, ext = float(self.hw.cache_line_bytes), s.ext[:, None, :]
        feet = self._footprints(s, s.ext)
        fits = feet.sum(1) <= self.hw.l2_bytes  # (n, L + 1); the last level always fits or nothing does
        level = np.where(fits.any(1), np.argmax(fits, axis=1), L)
        levels = np.arange(L)[None, :]
        # the loop just outside that level (`outer`) fetches the first iteration's footprint and then what each
        # iteration adds to the previous one's, which is still cached (the rows a sliding window moves on; nothing
        # if the access does not move: a 1x1 conv's weights, read whole by every parallel iteration; a whole
        # footprint if it moves to disjoint data); the body of a loop around it does not fit, so each of its
        # iterations fetches that again
        outer = level - 1
        n_outer = np.prod(np.where(levels == outer[:, None], s.ext, 1.0), axis=1)[:, None]  # 1: no loop outside
        two = self._footprints(s, np.where(levels == outer[:, None], np.minimum(s.ext, 2.0), s.ext))
        foot = np.take_along_axis(feet, level[:, None, None].repeat(A, 1), axis=2)[..., 0]
        pair = np.take_along_axis(two, np.maximum(outer, 0)[:, None, None].repeat(A, 1), axis=2)[..., 0]
        fetched = foot + (n_outer - 1) * np.maximum(pair - foot, 0.0)
        around = np.prod(np.where(levels < outer[:, None], s.ext, 1.0), axis=1)[:, None]
        below = (levels >= level[:, None])[:, None, :]  # (n, 1, L)
        moves = np.any(below & (s.coef != 0), axis=2)  # the access changes inside the cached level
        unit = np.max(np.where(below & (s.coef == 1), ext, 1.0), axis=2, initial=1.0)
        use = np.where(moves, np.minimum(line, s.elem * unit) / line, 1.0)  # share of each cache line used
        traffic = np.sum(fetched * around / use, axis=1)
        return traffic / ((self.miss_gbs or 20.0 * self.hw.cores) * 1e9)

    @staticmethod
    def _footprints(s: StatementStack, ext: np.ndarray) -> np.ndarray:
        """Bytes each access touches under each loop level (n, A, L + 1; level L: one execution), one access per
        (buffer, strides)."""
        feet = np.minimum(window_footprints(s.coef, ext), s.size[..., None]) * s.elem[..., None]
        return np.where(s.distinct[..., None], feet, 0.0)


@dataclass(frozen=True)
class StatementGroup:
    """Statements of one shape from many programs: each one's `program` and `statement` (its index there), the
    statements, and their `stack`."""

    program: np.ndarray
    statement: np.ndarray
    statements: list[Statement]
    stack: StatementStack


def statement_stacks(programs: Sequence[Sequence[Statement] | None]) -> list[StatementGroup]:
    """The statements of `programs` (None: none) grouped by shape (loop count, accessed buffers in order) and
    stacked, so that an analyzer computes every term of a group in one array operation."""
    groups: dict[tuple, list[tuple[int, int, Statement, int]]] = {}
    for p, stmts in enumerate(programs):
        for k, (st, start) in enumerate(zip(stmts or (), chain_starts(stmts or ()))):
            key = (len(st.extents), tuple(a.buffer.name for a in st.accesses))
            groups.setdefault(key, []).append((p, k, st, start))
    out = []
    for (n_loops, names), members in groups.items():
        stmts = [st for _, _, st, _ in members]
        out.append(StatementGroup(np.array([m[0] for m in members]), np.array([m[1] for m in members]), stmts,
                                  StatementStack.of(stmts, n_loops, names, [m[3] for m in members])))
    return out


def chain_starts(stmts: Sequence[Statement]) -> list[int]:
    """For each statement of a program, the number of loops around it that also enclose the statement that last
    initialized its store's buffer (where an accumulator's chains start; 0 for a statement that does not read its
    own buffer, or whose buffer nothing initialized)."""
    out, init = [], {}
    for st in stmts:
        name = st.accesses[0].buffer.name
        if not any(a.buffer.name == name for a in st.accesses[1:]):
            init[name] = st.ids
            out.append(0)
            continue
        shared = init.get(name, ())
        out.append(next((k for k, (a, b) in enumerate(zip(st.ids, shared)) if a != b), min(len(st.ids), len(shared))))
    return out


def _last(mask: np.ndarray) -> np.ndarray:
    """The index of each row's last set entry (-1: none)."""
    return np.where(mask, np.arange(mask.shape[1]), -1).max(axis=1, initial=-1)


@dataclass(frozen=True)
class StatementStack:
    """Statements of one shape as arrays: `ext` (n, L), `kinds` (n, L), `coef` (n, A, L), per access `size`
    (elements), `elem` (bytes per element) and `distinct` (not a repeat of an earlier access's buffer and
    strides), `ops` (n, N_OPS); `same_as_store` (A,): the access is to the store's buffer; `chain_start` (n,): the
    loops around where the accumulator is initialized (`chain_starts`)."""

    ext: np.ndarray
    kinds: np.ndarray
    coef: np.ndarray
    size: np.ndarray
    elem: np.ndarray
    distinct: np.ndarray
    ops: np.ndarray
    same_as_store: np.ndarray
    chain_start: np.ndarray

    @classmethod
    def of(cls, stmts: Sequence[Statement], n_loops: int, names: tuple[str, ...],
           chain_start: Sequence[int]) -> StatementStack:
        n, A, L = len(stmts), len(names), n_loops
        coef = np.array([[a.coef for a in st.accesses] for st in stmts], dtype=float).reshape(n, A, L)
        size = np.array([[a.buffer.size for a in st.accesses] for st in stmts], dtype=float).reshape(n, A)
        nbytes = np.array([[a.buffer.nbytes for a in st.accesses] for st in stmts], dtype=float).reshape(n, A)
        distinct = np.ones((n, A), bool)
        for j in range(A):
            for i in range(j):
                if names[i] == names[j]:
                    distinct[:, j] &= ~np.all(coef[:, i] == coef[:, j], axis=1)
        return cls(np.array([st.extents for st in stmts], dtype=float).reshape(n, L),
                   np.array([st.kinds for st in stmts], dtype=object).reshape(n, L), coef, np.maximum(size, 0.0),
                   nbytes / np.maximum(size, 1.0), distinct, np.array([st.ops for st in stmts], dtype=float),
                   np.array([nm == names[0] for nm in names]), np.array(chain_start, dtype=float))
