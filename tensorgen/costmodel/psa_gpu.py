"""Pruner's Parameterized Static Analyzer (PSA, Pruner §2.3) for CUDA kernels: the paper's formula on its own ground.

Each statement of a kernel costs L_com + L_mem (Pruner Eq. 4), the program the sum over its statements:

    L_com = n_ops * P_thread / (T_p * P_kernel * P_warp)        L_mem = n_m / (T_m * P_mem) + n_s / T_s

- n_ops: the statement's float operations (a copy: one per element stored) over every execution: a loop bound to
  threadIdx.* or blockIdx.* runs once per thread or block (a block-stride loop inside another of the same axis, a
  cooperative fetch's, runs its extent over the block's threads, not times them); T_p, T_m: the GPU's peak FP32
  FLOP/s and DRAM bandwidth.
- thread level, P_thread = alpha * P_reg: P_reg = max(n_r / n_r*, 1), n_r the registers a thread needs (its local
  arrays, the operands its register tile holds per reduction step, `base_registers` for indices and addresses)
  against the registers a thread may have (n_r* = 255); alpha = 1 + n_reg / n_com the register tile's
  memory-to-compute ratio. The register tile is what nvcc unrolls completely (`RegisterTile`): the innermost loops
  of at most `unroll` steps together (or the stage's auto_unroll_max_step); inside it each operand is loaded once
  per point it moves to (a GEMM's 4 x 4 x 8 tile: 32 of A and 32 of B for 128 updates, alpha 1.5; 1 x 1 x 8: 2
  loads per update, alpha 3), a copy loads each element once (alpha 2).
- warp level, P_warp = n_t / (ceil(n_T / 32) * 32): the threads that run the statement against the warps its
  block occupies (n_T: the block's threads; the paper's lane alignment where all run it).
- kernel level, P_kernel: blocks per SM at once (occupancy) n_b = the fewest that threads, registers and shared
  memory per block allow (max_threads_per_sm, registers_per_sm, shared memory per SM, max_blocks_per_sm); B* = n_sm
  * n_b. A kernel of B >= B* blocks runs in waves, B / (ceil(B / B*) * B*) (Eq. 3's first case); one of fewer runs
  a partial wave of s = ceil(B / n_sm) blocks on the busiest SM, B / (n_sm * s). Either is scaled by
  min(1, s * warps per block / n_w), s = n_b in full waves: the share of the `busy_warps` an SM needs resident to
  keep its pipelines busy (Eq. 3's second case counts warps against n_w too). Here n_w is the warps that keep an SM
  busy (the reference implementation takes 4, one per scheduler; the default 16 hides some latency too), where the
  paper's text has the most an SM holds: read that way a kernel one block short of a full wave would cost 1 /
  occupancy times one with a full wave.
- memory, P_mem: what a warp's load or store of global memory uses of the `sector_bytes` sectors it moves (the
  paper's n_l / (ceil(n_l / n_l*) * n_l*) for the run of consecutive elements along the innermost thread axis:
  lanes read from each warp lane's index (features.access.warp_lanes, Access.lanes), so a fetch whose threads walk
  down a column uses 4 of every 32 bytes); n_m: the bytes the warps use, each access issued as often as the
  register tile loads it, so the global traffic of shared-memory fetches is their tiles times the
  blocks, and an uncached operand is fetched again by every thread and step. n_s / T_s: shared-memory traffic,
  wavefronts of 128 bytes per warp access (bank conflicts serialize), against T_s = `shared_bytes_per_flop` x T_p x
  P_kernel (each SM has its own, as its FP32 units; DRAM serves whichever SMs ask); local arrays are registers.
Blocks of more than max_threads_per_block threads, or more shared memory than a block may have: inf (the code
generator refuses them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.costmodel.psa import Analyzer, StatementGroup, statement_stacks
from tensorgen.features.access import THREAD_AXES, warp_lanes
from tensorgen.features.layout import OP_CATEGORIES
from tensorgen.features.statement import Statement

__all__ = ["GpuStaticAnalyzer", "Kernels"]

GRID_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
_AXES = GRID_AXES + THREAD_AXES
_FLOAT_OPS = len(OP_CATEGORIES)
_BANKS, _BANK_BYTES = 32, 4


@dataclass(frozen=True)
class Kernels:
    """The kernels of many programs (one per root loop nest), as arrays: `dims` (K, 6) the launch's grid and block
    per axis (the largest extent bound to it), `shared` shared-memory bytes per block, `threads` and `blocks`,
    `registers` a thread needs, `occupancy` (blocks per SM at once, 0: does not fit), `p_kernel`, `p_reg`."""

    dims: np.ndarray
    shared: np.ndarray
    threads: np.ndarray
    blocks: np.ndarray
    registers: np.ndarray
    occupancy: np.ndarray
    p_kernel: np.ndarray
    p_reg: np.ndarray


@dataclass(frozen=True)
class GpuStaticAnalyzer(Analyzer):
    """Estimated latency (seconds) of CUDA programs on a GPU `hw` (module docstring); lower is better, only the
    order is used. `busy_warps`: resident warps that keep an SM busy (n_w); `unroll`: the most steps of innermost
    loops nvcc unrolls completely by itself; `base_registers`: a thread's registers besides its arrays and operands;
    `sector_bytes`: a global-memory transaction; `shared_bytes_per_flop`: shared memory's bandwidth against the FP32
    peak (128 bytes per clock per SM, 2 x 128 flops on sm_80+ parts)."""

    busy_warps: int = 16
    unroll: int = 128
    base_registers: int = 16
    sector_bytes: int = 32
    shared_bytes_per_flop: float = 0.5

    def program_latencies(self, programs: Sequence[Sequence[Statement] | None]) -> np.ndarray:
        """The latency of each program given by its statements (None: inf), all statements at once
        (psa.statement_stacks), kernels first (`kernels`)."""
        out = np.array([0.0 if p is not None else math.inf for p in programs])
        groups = statement_stacks(programs)
        kernel_of = self._kernel_ids(programs)
        ids = [np.array([kernel_of[p][k] for p, k in zip(g.program, g.statement)], dtype=int) for g in groups]
        tiles = [RegisterTile.of(g, self.unroll) for g in groups]
        kernels = self.kernels(groups, ids, tiles, max((max(k, default=-1) for k in kernel_of), default=-1) + 1)
        for g, kid, tile in zip(groups, ids, tiles):
            np.add.at(out, g.program, self._statement_latency(g, kid, tile, kernels))
        return out

    @staticmethod
    def _kernel_ids(programs: Sequence[Sequence[Statement] | None]) -> list[list[int]]:
        """A global kernel index for each statement: statements under one root loop share a kernel."""
        out, count = [], 0
        for stmts in programs:
            seen: dict = {}
            ids = []
            for k, st in enumerate(stmts or ()):
                key = st.ids[0] if st.ids else ("scalar", k)
                if key not in seen:
                    seen[key], count = count, count + 1
                ids.append(seen[key])
            out.append(ids)
        return out

    def kernels(self, groups: Sequence[StatementGroup], ids: Sequence[np.ndarray], tiles: Sequence[RegisterTile],
                n: int) -> Kernels:
        """The kernels (Kernels) of the statements in `groups`, `ids` their kernel indices (n kernels), `tiles` their
        register tiles."""
        hw, extra = self.hw, self.hw.extra
        dims, held = np.ones((n, len(_AXES))), np.zeros(n)
        local: dict[int, dict[str, float]] = {}
        shared: dict[int, dict[str, float]] = {}
        for g, kid, tile in zip(groups, ids, tiles):
            s = g.stack
            for a, axis in enumerate(_AXES):
                np.maximum.at(dims[:, a], kid, np.where(s.kinds == axis, s.ext, 1.0).max(1, initial=1.0))
            np.maximum.at(held, kid, tile.held)
            for k, st in zip(kid, g.statements):
                for acc in st.accesses:
                    into = {"local": local, "shared": shared}.get(acc.buffer.scope)
                    if into is not None:
                        into.setdefault(int(k), {})[acc.buffer.name] = float(acc.buffer.nbytes)
        words = np.array([sum(local.get(k, {}).values()) / 4 for k in range(n)])
        smem = np.array([sum(shared.get(k, {}).values()) for k in range(n)])
        threads, blocks = dims[:, 3:].prod(1), dims[:, :3].prod(1)
        warps = np.ceil(threads / hw.warp_size)
        registers = words + held + self.base_registers
        allocated = np.minimum(np.ceil(registers / 8) * 8, hw.registers_per_thread)  # in units of 8 per thread
        shared_per_sm = hw.l1_bytes
        fits = (threads <= hw.max_threads_per_block) & (smem <= min(hw.shared_mem_per_block, shared_per_sm))
        occupancy = np.where(fits, np.minimum.reduce([
            np.full(n, float(extra.get("max_blocks_per_sm", 32))),
            np.floor(extra.get("max_threads_per_sm", 2048) / (warps * hw.warp_size)),
            np.floor(extra.get("registers_per_sm", 65536) / (allocated * warps * hw.warp_size)),
            np.floor(shared_per_sm / np.maximum(smem, 1.0))]), 0.0)
        sms = float(hw.sm_count or hw.cores)
        per_sm = np.minimum(np.ceil(blocks / sms), np.maximum(occupancy, 1.0))  # blocks an SM runs at once
        waves = np.ceil(blocks / (sms * per_sm))
        p_kernel = blocks / (waves * sms * per_sm) * np.minimum(1.0, per_sm * warps / self.busy_warps)
        p_reg = np.maximum(registers / hw.registers_per_thread, 1.0)
        return Kernels(dims, smem, threads, blocks, registers, occupancy, p_kernel, p_reg)

    def _statement_latency(self, g: StatementGroup, kid: np.ndarray, tile: RegisterTile, k: Kernels) -> np.ndarray:
        s, hw = g.stack, self.hw
        dims = k.dims[kid]  # (n, 6)
        bound = s.kinds[:, :, None] == np.array(_AXES, dtype=object)  # (n, L, 6)
        ext = s.ext[:, :, None]
        active = np.where(bound, ext, np.inf).min(1)  # the threads (blocks) that run it, per axis
        active = np.where(np.isfinite(active), active, 1.0)
        trips = np.where(bound, np.ceil(ext / dims[:, None, :]), 1.0).prod((1, 2))  # block-stride loops' turns
        per_thread = np.where(bound.any(2), 1.0, s.ext).prod(1) * trips
        threads, blocks = active[:, 3:].prod(1), active[:, :3].prod(1)
        warps = np.ceil(k.threads[kid] / hw.warp_size)
        work = np.maximum(s.ops[:, :_FLOAT_OPS].sum(1), 1.0) * per_thread * threads * blocks
        alpha = 1.0 + tile.loads[:, 1:].sum(1) / tile.steps
        p_warp = threads / (warps * hw.warp_size)
        compute = work * alpha * k.p_reg[kid] / (hw.peak_gflops * 1e9 * k.p_kernel[kid] * p_warp)
        loads = per_thread[:, None] / tile.steps[:, None] * tile.loads  # each access's loads per thread
        accesses = loads * blocks[:, None] * np.ceil(threads / hw.warp_size)[:, None]  # warp instructions
        scope = np.array([[a.buffer.scope for a in st.accesses] for st in g.statements], dtype=object)
        glob = (scope == "arg") | (scope == "global")
        index = self._lanes(g) * s.elem[..., None]  # bytes (n, A, lanes)
        sectors = _distinct(np.floor(index / self.sector_bytes))
        traffic = np.where(glob, accesses * sectors * self.sector_bytes, 0.0).sum(1)
        wavefronts = _wavefronts(np.floor(index / _BANK_BYTES))
        shared = np.where(scope == "shared", accesses * wavefronts * _BANKS * _BANK_BYTES, 0.0).sum(1)
        t_shared = self.shared_bytes_per_flop * hw.peak_gflops * 1e9 * k.p_kernel[kid]  # the SMs' own, as their FPUs
        memory = traffic / (hw.bandwidth_gbs * 1e9) + shared / t_shared
        return np.where(k.occupancy[kid] > 0, compute + memory, math.inf)

    @staticmethod
    def _lanes(g: StatementGroup) -> np.ndarray:
        """Each access's index at each lane of the first warp (n, A, lanes): Access.lanes where the statements came
        from lowering, else from the strides and the offset."""
        s = g.stack
        out = np.einsum("nal,nlw->naw", s.coef, warp_lanes(s.kinds, s.ext))
        for i, st in enumerate(g.statements):
            for a, acc in enumerate(st.accesses):
                out[i, a] = acc.lanes if acc.lanes is not None else out[i, a] + acc.offset
        return out


@dataclass(frozen=True)
class RegisterTile:
    """What a thread's compiler unrolls completely: the innermost loops (not bound to threads or blocks) of at most
    `unroll` steps together, or of the stage's auto_unroll_max_step. `steps` (n,): its steps; `loads` (n, A): the
    points each access moves to in it (loaded once each, kept in registers while the tile uses them); `held` (n,):
    the operand registers per step of its reductions (the reads' loads over the steps of the loops the store does
    not move with)."""

    steps: np.ndarray
    loads: np.ndarray
    held: np.ndarray

    @classmethod
    def of(cls, g: StatementGroup, unroll: int) -> RegisterTile:
        s = g.stack
        budget = np.maximum([st.unroll for st in g.statements], unroll)
        free = ~np.isin(s.kinds, _AXES)
        inner = np.cumprod(np.where(free, s.ext, np.inf)[:, ::-1], axis=1)[:, ::-1]  # steps of loops k.. (bound: inf)
        tile = inner <= budget[:, None]
        ext = np.where(tile, s.ext, 1.0)
        steps = ext.prod(1)
        loads = np.where(s.coef != 0, ext[:, None, :], 1.0).prod(2)
        reduction = np.where(s.coef[:, 0, :] == 0, ext, 1.0).prod(1)
        return cls(steps, loads, loads[:, 1:][:, ~s.same_as_store[1:]].sum(1) / reduction)


def _distinct(values: np.ndarray) -> np.ndarray:
    """Distinct values along the last axis."""
    v = np.sort(values, axis=-1)
    return 1.0 + (np.diff(v, axis=-1) != 0).sum(-1)


def _wavefronts(words: np.ndarray) -> np.ndarray:
    """Shared-memory wavefronts of a warp access to `words` (..., lanes): the most distinct words in one bank."""
    v = np.sort(words, axis=-1)
    first = np.concatenate([np.ones(v.shape[:-1] + (1,), bool), np.diff(v, axis=-1) != 0], axis=-1)
    banks = (v % _BANKS)[..., None] == np.arange(_BANKS)
    return (banks & first[..., None]).sum(-2).max(-1).astype(float)

