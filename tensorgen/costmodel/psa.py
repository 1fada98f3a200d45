"""Pruner's Parameterized Static Analyzer (PSA, Pruner §2.3) for CPUs: a formula latency, no training.

The learned model only ranks well what it has seen; a random sample of a large space is mostly programs no
one would write (one accumulator, partial vectors, a serial outer loop), and the first rounds spend their
measurements on them. PSA estimates each innermost statement's compute and memory latency from hardware
parameters and a few penalty terms, so the search can drop such programs before anything is measured.

Pruner's terms are written for GPUs; on a CPU they become
- thread level: the register tile (the loops inside the innermost reduction loop) against the vector
  registers, P_reg = max(n_r / n_r*, 1) with n_r = accumulators + operands, times
  alpha = 1 + loads / accumulators (the memory-to-compute ratio of the tile);
- warp level: the lane fill of the vectorized loop (a 24-element loop fills two 16-lane vectors 75%), and
  the dependency chains: fewer independent accumulators than `fma_chain` (FMA latency x FMA ports) stall;
- kernel level: parallel iterations against cores, p / (ceil(p / cores) * cores) (1 / cores if serial);
- memory: cache-line use of the contiguous run of each access, against the traffic that misses L2 (the
  footprint under the outermost loop level that fits, times the iterations around it).
An out-of-order core overlaps compute and memory, so a statement costs max(L_com, L_mem) where Pruner
(for GPUs) adds them; the program's latency is the sum over statements.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.features.layout import OP_CATEGORIES
from tensorgen.features.nest import program_statements
from tensorgen.features.statement import Statement
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams

__all__ = ["StaticAnalyzer"]

_FLOAT_OPS = len(OP_CATEGORIES)


@dataclass(frozen=True)
class StaticAnalyzer:
    """Estimated latency (seconds) of programs on `hw`; lower is better, only the order is used.

    `registers`: vector registers (default 32 with 64-byte SIMD, else 16); `fma_chain`: independent
    accumulators that keep the FMA units busy (latency 4 x 2 ports); `miss_gbs`: bandwidth of traffic that
    misses L2 (default 20 GB/s per core); `peak_gflops` defaults to the measured peak or 2 FMA ports x lanes
    x 2 flops x 2.5 GHz per core.
    """

    hw: HardwareParams
    registers: int | None = None
    fma_chain: int = 8
    miss_gbs: float | None = None

    @property
    def lanes(self) -> int:
        return self.hw.float_lanes

    def peak(self) -> float:
        return self.hw.peak_gflops or self.hw.cores * self.lanes * 2 * 2 * 2.5

    def latency(self, state: State) -> float:
        """PSA latency of one program; inf for a state that is not a complete program."""
        try:
            stmts = program_statements(state)
        except TensorgenError:
            return math.inf
        return sum(self.statement_latency(st) for st in stmts)

    def latencies(self, states: Sequence[State]) -> np.ndarray:
        return np.array([self.latency(s) for s in states], dtype=np.float64)

    def statement_latency(self, st: Statement) -> float:
        ext = np.asarray(st.extents, dtype=np.float64)
        work = max(float(st.ops[:_FLOAT_OPS].sum()), 1.0) * float(ext.prod())  # a copy still costs a store each
        return max(self._compute(st, ext, work), self._memory(st, ext))

    def _compute(self, st: Statement, ext: np.ndarray, work: float) -> float:
        n, lanes, kinds = len(ext), self.lanes, st.kinds
        vec = max((k for k in range(n) if kinds[k] == "vectorize"), default=None)
        if vec is None and n and ext[-1] > 1 and st.accesses[0].coef[-1] == 1:
            vec = n - 1  # gcc -O3 vectorizes a unit-stride innermost loop by itself
        fill = ext[vec] / math.ceil(ext[vec] / lanes) if vec is not None else 1.0  # lanes used per instruction
        par = [ext[k] for k in range(n) if kinds[k] == "parallel"]
        p = float(np.prod(par)) if par else 1.0
        busy = p / math.ceil(p / self.hw.cores)  # cores kept busy on average
        store = st.accesses[0]
        reads = [a for a in st.accesses[1:] if a.buffer.name != store.buffer.name]
        updates = any(a.buffer.name == store.buffer.name for a in st.accesses[1:])
        reduce = [k for k in range(n) if updates and store.coef[k] == 0 and ext[k] > 1]
        if reduce:  # the register tile: loops inside the innermost reduction loop
            inner = range(reduce[-1] + 1, n)
            in_vec = vec is not None and vec > reduce[-1]
            acc = float(np.prod([ext[k] for k in inner])) / (fill if in_vec else 1.0)
            loads = 0.0
            for a in reads:
                pts = float(np.prod([ext[k] for k in inner if a.coef[k] != 0]))
                loads += pts / fill if in_vec and a.coef[vec] == 1 else pts
            regs = self.registers or self.hw.vector_registers
            thread = (1 + loads / acc) * max((acc + loads) / regs, 1.0)
            chains = max(self.fma_chain / acc, 1.0)
        else:
            thread, chains = 1.0 + len(reads), 1.0
        return work / (self.peak() * 1e9) * (lanes / fill) * (self.hw.cores / busy) * thread * chains

    def _memory(self, st: Statement, ext: np.ndarray) -> float:
        n, line = len(ext), float(self.hw.cache_line_bytes)
        accesses = list({(a.buffer.name, tuple(a.coef)): a for a in st.accesses}.values())
        feet = []
        for a in accesses:  # bytes touched under each loop level (level n: one execution)
            span = np.append(np.cumsum((a.coef * (ext - 1))[::-1])[::-1] + 1, 1.0)
            points = np.append(np.cumprod(np.where(a.coef > 0, ext, 1.0)[::-1])[::-1], 1.0)
            feet.append(np.minimum(np.minimum(span, points), a.buffer.size) * a.buffer.nbytes / max(a.buffer.size, 1))
        fits = np.nonzero(np.sum(feet, axis=0) <= self.hw.l2_bytes)[0]
        level = int(fits[0]) if fits.size else n
        around = float(ext[:level].prod())
        traffic = 0.0
        for a, foot in zip(accesses, feet):
            if np.any(a.coef[level:] != 0):  # lines used: the contiguous run inside the cached level
                unit = [ext[k] for k in range(level, n) if a.coef[k] == 1]
                elem = a.buffer.nbytes / max(a.buffer.size, 1)
                use = min(line, elem * max(unit, default=1.0)) / line
            else:
                use = 1.0
            traffic += foot[level] * around / use
        return traffic / ((self.miss_gbs or 20.0 * self.hw.cores) * 1e9)
