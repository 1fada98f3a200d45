"""In-model selection: every kernel's program picked among its task's few best records by its time
inside the model.

Tuning times a kernel alone: its inputs are what its previous call left in the caches, its weights are
evicted. Inside the model its inputs were just written by the kernel before it (half of them by the other
core) and the kernel after it reads its output, so the program that was fastest alone is not always the
fastest there: MobileNet-V2's kernels summed to 2.74 ms in the model against 2.48 ms alone. A task's
candidates are its fastest records, the fastest of each thread partition first (`candidate_records`):
nearly as fast alone, they split and write their data differently. Building the model once per rank
(every kernel with its task's rank-th candidate) and profiling each build gives every kernel's in-model
time under each candidate; every kernel then takes its fastest, and that mix is kept only when the whole
model runs faster with it than with the best single-rank build (changing a kernel also changes what its
neighbours find in the caches).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorgen.records.database import Database
from tensorgen.records.record import Record
from tensorgen.runtime.model import CompiledModel
from tensorgen.schedule.state import State

CANDIDATE_POOL = 32  # fastest records of a task considered for its candidates
WARMUP_S = 0.2  # before each profile: a model loaded or left idle runs its first calls up to 1.6x slower


@dataclass(frozen=True)
class Selection:
    ranks: list[int]  # per kernel: which of its task's candidates (0 = the best record alone) it uses
    rank_ms: np.ndarray  # (candidates, kernels): each kernel's median time (ms) in the build of each rank
    mixed_ms: np.ndarray  # (2, kernels): the best single-rank build and the mix of per-kernel fastest ranks, retimed
    mixed: bool  # whether `ranks` is that mix (else the best single rank)


def partition_signature(state: State) -> tuple:
    """What a program's threads split: every parallel loop, by stage, name (its fused loops) and extent."""
    return tuple((st.name, it.name, it.extent) for st in state.stages for it in st.iters if it.annotation == "parallel")


def candidate_records(db: Database, workload_key: str, target: str, k: int, pool: int = CANDIDATE_POOL) -> list[Record]:
    """A task's `k` candidates, best first: among its `pool` fastest records, the fastest of each thread
    partition, then the others by speed. The next-best records mostly share the best one's partition, and a
    partition that matches the neighbours' is what a kernel most often lacks inside the model."""
    top = [r for r in db.top_k(workload_key, target, max(k, pool)) if not r.sets_layouts]  # see build.py
    fresh: list[Record] = []
    again: list[Record] = []
    seen: set[tuple] = set()
    for record in top:
        signature = partition_signature(record.state())
        (again if signature in seen else fresh).append(record)
        seen.add(signature)
    return (fresh + again)[:k]


def profile_inputs(model: CompiledModel, seed: int = 0) -> list[np.ndarray]:
    """Inputs to time a model with: normal floats; zeros for integers (valid indices for any Gather)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype)
            for _, shape, dtype in model.inputs]


def kernel_times(directories: Sequence[Path], threads: int | None, runs: int, rounds: int) -> np.ndarray:
    """(models, kernels): each kernel's median time (ms) in each built model, profiled in `rounds` rounds
    that take the models in turn (the machine drifts: a model is compared with the others of its round)."""
    models = [CompiledModel(d, threads=threads) for d in directories]
    inputs = profile_inputs(models[0])
    times = []
    for _ in range(rounds):
        row = []
        for model in models:
            start, calls = time.perf_counter(), 0
            while calls < 3 or time.perf_counter() - start < WARMUP_S:
                model.run(inputs)
                calls += 1
            row.append([k["ms"] for k in model.profile(inputs, repeat=runs)])
        times.append(row)
    return np.median(np.array(times), axis=0)


def _fastest(rank: int) -> str:
    """A record's rank in words: fastest, 2nd fastest, 3rd fastest, ..."""
    n = rank + 1
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return "fastest" if rank == 0 else f"{n}{suffix} fastest"


def select_in_model(build: Callable[[Sequence[int], Path], Path], kernels: int, candidates: int, *,
                    runs: int = 20, rounds: int = 3, threads: int | None = None,
                    progress: Callable[[str], None] | None = None) -> Selection:
    """Per-kernel record ranks in [0, candidates) for a model of `kernels` kernels; `build(ranks, dir)`
    builds the model with those ranks into `dir` and returns the built directory."""
    if candidates < 1 or kernels < 1:
        raise ValueError(f"need candidates >= 1 and kernels >= 1, got {candidates} and {kernels}")
    with tempfile.TemporaryDirectory() as tmp:
        builds = [build([rank] * kernels, Path(tmp) / f"rank{rank}") for rank in range(candidates)]
        rank_ms = kernel_times(builds, threads, runs, rounds)
        totals = rank_ms.sum(axis=1)
        if progress:
            progress(f"in-model selection: the model timed with each kernel's {candidates} fastest records (fastest "
                     "when timed alone): every kernel with its "
                     + ", ".join(f"{_fastest(r)} {t:.3f} ms" for r, t in enumerate(totals)))
        best, mix = int(totals.argmin()), [int(r) for r in rank_ms.argmin(axis=0)]
        mixed_ms = kernel_times([builds[best], build(mix, Path(tmp) / "mixed")], threads, runs, rounds)
    mixed = bool(mixed_ms[1].sum() < mixed_ms[0].sum())
    if progress:
        progress(f"in-model selection: {sum(r != 0 for r in mix)} of {kernels} kernels ran faster inside the model "
                 f"with a record other than their fastest alone; each kernel with the record that ran fastest inside "
                 f"the model {mixed_ms[1].sum():.3f} ms, every kernel with its {_fastest(best)} "
                 f"{mixed_ms[0].sum():.3f} ms: built with "
                 + ("each kernel's record that ran fastest inside the model" if mixed else
                    f"every kernel's {_fastest(best)} record"))
    return Selection(mix if mixed else [best] * kernels, rank_ms, mixed_ms, mixed)
