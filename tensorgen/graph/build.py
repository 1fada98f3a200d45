"""build_model: a whole model to one shared library (all kernels + the executor) and a weights file.

Every subgraph gets its best record from the database, replayed on its own DAG; one without a record
gets the best program of the tuned subgraph of the same structure and the closest size, adapted to its
shapes (tensorgen.search.transfer), else the default schedule. The output directory holds:
    model.so        kernels + executor, C ABI in tensorgen/graph/executor.py
    model.c         its source, for people to read
    weights.bin     the constants, at the offsets the executor uses
    model.json      inputs, outputs, kernels and which of them were tuned
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tensorgen.codegen.c import render_module, team_compatible
from tensorgen.codegen.toolchain import compile_source, preflight
from tensorgen.errors import TensorgenError
from tensorgen.graph.align import align_partitions
from tensorgen.graph.default_schedule import default_schedule
from tensorgen.graph.executor import executor_source, pack_weights, plan_memory
from tensorgen.graph.fusion import Partition, Subgraph, partition
from tensorgen.graph.ir import Graph, Value
from tensorgen.graph.load import load_graph
from tensorgen.graph.select import CANDIDATE_POOL, candidate_records, select_in_model
from tensorgen.hardware import hardware_for
from tensorgen.records.database import Database
from tensorgen.schedule.layout_rewrite import rewrite_layout
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.search.transfer import transfer_candidates
from tensorgen.target import Target

MANIFEST = "model.json"
# Kernels shorter than this run in one thread team per run of them instead of forking each (a fork and join
# is 1-2 us: MobileNet-V2 1.7% faster); longer ones keep the code they were tuned as, since the team form
# compiles differently (ResNet-50's 1x1 convs ran up to 10% slower as team code, 1% in all).
TEAM_MAX_S = 200e-6


@dataclass(frozen=True)
class KernelInfo:
    name: str
    workload_key: str
    nodes: int
    tuned: bool
    cost: float | None  # seconds, of the record used
    schedule: str  # "tuned" | "transferred" (from a similar subgraph's record) | "default"
    rank: int = 0  # which of the task's candidate records, 0 = the fastest alone (see tensorgen.graph.select)


def schedule_subgraphs(subs: Sequence[Subgraph], target: Target, db: Database | None, cores: int,
                       ranks: Sequence[int] | None = None,
                       pools: dict[str, tuple[int, list]] | None = None) -> list[tuple[State, float | None, str]]:
    """(state, its recorded cost or None, how it was chosen) per subgraph: its best record on `target` (or
    its `ranks[i]`-th candidate, see select.candidate_records; `pools` caches each task's candidates with
    how many were asked for), else one adapted from the tuned subgraph of the same structure and closest
    size, else the default schedule."""
    pools = {} if pools is None else pools

    def record(sub: Subgraph, rank: int):
        if db is None:
            return None
        if rank == 0:
            return db.best(sub.workload_key, str(target))
        asked, pool = pools.get(sub.workload_key, (0, []))
        if asked <= rank:  # one query and replay per task for all the ranks of a selection
            asked = max(rank + 1, CANDIDATE_POOL)
            pool = candidate_records(db, sub.workload_key, str(target), asked)
            pools[sub.workload_key] = asked, pool
        return pool[min(rank, len(pool) - 1)] if pool else None

    records = [record(sub, ranks[i] if ranks else 0) for i, sub in enumerate(subs)]
    tuned = {i: (r.state(sub.dag), r.result.median_cost) for i, (sub, r) in enumerate(zip(subs, records))
             if r is not None}
    donors = [(state, subs[i].dag.flop_count / cost) for i, (state, cost) in tuned.items() if cost > 0]
    out = []
    for i, sub in enumerate(subs):
        if i in tuned:
            out.append((*tuned[i], "tuned"))
        elif adapted := transfer_candidates(sub.dag, donors, limit=1):
            out.append((adapted[0], None, "transferred"))
        else:
            out.append((default_schedule(sub.dag, cores), None, "default"))
    return out


def build_model(model: object, out_dir: str | os.PathLike[str], *, target: str | Target = "cpu",
                db: Database | None = None, batch: int = 1, march: str | None = "native",
                candidates: int = 1, ranks: Sequence[int] | None = None,
                progress: Callable[[str], None] | None = None) -> Path:
    """Compile `model` (ONNX file, ModelProto, zoo name or Graph) into `out_dir`; returns that directory.

    Every kernel uses its task's fastest record, or its `ranks[i]`-th candidate (select.candidate_records);
    `candidates` > 1 picks the ranks by timing the model built with each of the first `candidates`
    (tensorgen.graph.select; the model is built and profiled candidates + 1 times more)."""
    if candidates < 1:
        raise TensorgenError(f"need at least 1 candidate record per kernel, got {candidates}")
    target = Target.parse(target)
    hw = hardware_for(target)
    graph = model if isinstance(model, Graph) else load_graph(model, batch=batch)
    preflight(march=march)
    pools: dict[str, tuple[int, list]] = {}  # the builds of one selection share their candidate records
    if candidates > 1 and db is not None and ranks is None:
        def build(ranks: Sequence[int], directory: Path) -> Path:
            return _build(graph, directory, target, db, march, ranks, pools, None)

        ranks = select_in_model(build, len(partition(graph).subgraphs), candidates, threads=hw.cores,
                                progress=progress).ranks
    return _build(graph, out_dir, target, db, march, ranks, pools, progress)


def _build(graph: Graph, out_dir: str | os.PathLike[str], target: Target, db: Database | None, march: str | None,
           ranks: Sequence[int] | None, pools: dict[str, tuple[int, list]],
           progress: Callable[[str], None] | None) -> Path:
    hw = hardware_for(target)
    graph = replace(graph, values=dict(graph.values), constants=dict(graph.constants))  # gains repacked weights
    part = partition(graph)
    graph = part.graph  # the partitioned graph (channels-last convs) is the one the kernels read
    funcs, kernels = [], []
    schedules = schedule_subgraphs(part.subgraphs, target, db, hw.cores, ranks, pools)
    for i, (sub, (state, cost, how)) in enumerate(zip(part.subgraphs, schedules)):
        state = _repack_weights(graph, sub, state, f"k{i}")
        name = f"k{i}_{sub.name.rsplit('_', 1)[0]}"
        funcs.append(lower(state, name))
        kernels.append(KernelInfo(name, sub.workload_key, len(sub.nodes), how == "tuned", cost, how,
                                  ranks[i] if ranks and how == "tuned" else 0))
    if progress:
        tuned = sum(k.tuned for k in kernels)
        transferred = sum(k.schedule == "transferred" for k in kernels)
        progress(f"{graph.name}: {len(kernels)} kernels ({tuned} tuned, {transferred} adapted from tuned ones), "
                 "compiling")
    blob, weight_offsets = pack_weights(part)
    plan = plan_memory(part, _in_place(part))
    for k, victim in plan.overwritten.items():
        args = funcs[k].args
        shared = (args[part.subgraphs[k].inputs.index(victim)].name, args[-1].name)
        funcs[k] = replace(funcs[k], attrs={**funcs[k].attrs, "shared_args": shared})
    funcs = align_partitions(funcs, [[part.aliases.get(n, n) for n in sub.inputs + sub.outputs]
                                     for sub in part.subgraphs], hw.cores)
    team = [team_compatible(f) and (k.cost is None or k.cost < TEAM_MAX_S) for f, k in zip(funcs, kernels)]
    funcs = [replace(f, attrs={**f.attrs, "team": True}) if t else f for f, t in zip(funcs, team)]
    executor = executor_source(part, [k.name for k in kernels], weight_offsets, len(blob), plan, team)
    source = render_module(funcs, hw.simd_bytes, executor, scratch=True)
    library = compile_source(source, march=march)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, out / "model.so")
    (out / "model.c").write_text(source)
    (out / "weights.bin").write_bytes(blob)
    (out / MANIFEST).write_text(json.dumps(_manifest(graph, part, kernels, plan, target), indent=1))
    return out


def _repack_weights(graph: Graph, sub: Subgraph, state: State, tag: str) -> State:
    """`state` with its constants' layouts rewritten (as it was measured); the repacked data become new
    constants of `graph` that `sub` reads instead (the originals are then not saved unless still read)."""
    state, plans = rewrite_layout(state)
    names = [t.name for t in state.dag.inputs]
    for plan in plans:
        k = names.index(plan.name)
        value = graph.value(sub.inputs[k])
        packed = f"{value.name}.{tag}"
        graph.constants[packed] = plan.pack(np.asarray(graph.constants[value.name]))
        graph.values[packed] = Value(packed, plan.new_shape, value.dtype)
        sub.inputs[k] = packed
    return state


def _in_place(part: Partition) -> set[str]:
    graph = part.graph
    return set(graph.inputs) | set(graph.constants) | {part.aliases.get(n, n) for n in graph.outputs}


def _manifest(graph: Graph, part: Partition, kernels: list[KernelInfo], plan, target: Target) -> dict:
    def values(names: list[str]) -> list[dict]:
        return [{"name": n, "shape": list(graph.value(n).shape), "dtype": graph.value(n).dtype} for n in names]

    return {
        "format": 3, "model": graph.name, "target": str(target),
        "inputs": values(graph.inputs), "outputs": values(graph.outputs),
        "kernels": [k.__dict__ for k in kernels],
        "arena_bytes": plan.arena_bytes, "unshared_bytes": plan.naive_bytes,
    }
