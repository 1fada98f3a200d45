"""build_model: a whole model to one shared library (all kernels + the executor) and a weights file.

Every subgraph gets its best record from the database, replayed on its own DAG; one without a record
gets the best program of the tuned subgraph of the same structure and the closest size, adapted to its
shapes (tensorgen.search.transfer), else the default schedule. The output directory holds:
    model.so        kernels + executor, C ABI in tensorgen/graph/backend/executor.py
    model.c         its source, for people to read
    weights.bin     the constants, at the offsets the executor uses
    model.json      inputs, outputs, kernels and which of them were tuned
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tensorgen.codegen.backend import Backend, backend_for
from tensorgen.dag import ComputeDAG
from tensorgen.errors import CompileError, TensorgenError
from tensorgen.graph.backend import LAYOUT_MODES
from tensorgen.graph.backend.align import align_partitions
from tensorgen.graph.backend.default_schedule import default_schedule
from tensorgen.graph.backend.executor import executor_source, pack_weights, plan_memory
from tensorgen.graph.backend.layouts import (
    Absorb,
    LayoutPlan,
    Layouts,
    conversion_dag,
    default_laid_out,
    laid_out_dag,
    laid_out_state,
    plan_layouts,
)
from tensorgen.graph.backend.select import CANDIDATE_POOL, candidate_records, select_in_model
from tensorgen.graph.backend.tasks import ModelTask
from tensorgen.graph.ir import Graph, Value
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import Partition, Subgraph, partition
from tensorgen.hardware import hardware_for
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.records.database import Database
from tensorgen.schedule.layout import LayoutPrimitive, lay_out
from tensorgen.schedule.layout_rewrite import rewrite_layout
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State, loop_steps, state_layouts, with_layouts
from tensorgen.search.alt_policy import layout_key
from tensorgen.search.transfer import transfer_candidates
from tensorgen.target import HardwareParams, Target
from tensorgen.task import SearchTask

LOGGER = logging.getLogger("tensorgen.graph")
MANIFEST = "model.json"
# the speed (bytes moved per second) assumed of a kernel without a recorded time when layouts are charged for the
# kernels they add (_charged): MobileNet-V2's tuned conversion kernels moved 4-16 GB/s (2 cores, AVX-512)
UNTIMED_GBS = 8.0
Schedule = tuple[State, float | None, str]  # a kernel's program, its recorded cost (None: not timed), how chosen


@dataclass(frozen=True)
class KernelInfo:
    name: str
    workload_key: str
    nodes: int
    tuned: bool
    cost: float | None  # seconds, of the record used
    schedule: str  # "tuned" | "transferred" (from a similar subgraph's record) | "default"
    rank: int = 0  # which of the task's candidate records, 0 = the fastest alone (see tensorgen.graph.backend.select)
    fallback: str = ""  # why the kernel's record or adapted program was not used (it got the default schedule)


def schedule_subgraphs(subs: Sequence[Subgraph], target: Target, db: Database | None, cores: int,
                       ranks: Sequence[int] | None = None, pools: dict[str, tuple[int, list]] | None = None,
                       layouts: bool = True) -> list[Schedule]:
    """(state, its recorded cost or None, how it was chosen) per subgraph: its best record on `target` (or
    its `ranks[i]`-th candidate, see select.candidate_records; `pools` caches each task's candidates with
    how many were asked for), else one adapted from the tuned subgraph of the same structure and closest
    size, else the default schedule. Without `layouts`, records that lay out the kernel's arguments (ALT's)
    are passed over."""
    pools = {} if pools is None else pools

    def record(sub: Subgraph, rank: int):
        if db is None:
            return None
        if rank == 0:
            best = db.best(sub.workload_key, str(target))
            if best is None or layouts or not best.sets_layouts:
                return best
            return next((r for r in db.top_k(sub.workload_key, str(target), CANDIDATE_POOL) if not r.sets_layouts),
                        None)
        asked, pool = pools.get(sub.workload_key, (0, []))
        if asked <= rank:  # one query and replay per task for all the ranks of a selection
            asked = max(rank + 1, CANDIDATE_POOL)
            pool = candidate_records(db, sub.workload_key, str(target), asked)
            pools[sub.workload_key] = asked, pool
        return pool[min(rank, len(pool) - 1)] if pool else None

    records = [record(sub, ranks[i] if ranks else 0) for i, sub in enumerate(subs)]
    tuned = {}
    for i, (sub, r) in enumerate(zip(subs, records)):
        if r is not None:
            try:
                tuned[i] = r.state(sub.dag), r.result.median_cost
            except TensorgenError as err:  # a record an older or broken version wrote
                LOGGER.warning("kernel %d (%s): its record does not replay (%s); it is built without it", i,
                               sub.name, err)
    # a program whose arguments are laid out does not adapt: its layouts' tile sizes are those of its own shapes
    donors = [(state, subs[i].dag.flop_count / cost) for i, (state, cost) in tuned.items()
              if cost > 0 and not state_layouts(state)]
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
                db: Database | None = None, batch: int = 1, candidates: int = 1, ranks: Sequence[int] | None = None,
                layouts: str = "propagate", progress: Callable[[str], None] | None = None) -> Path:
    """Compile `model` (ONNX file, ModelProto, zoo name or Graph) into `out_dir`; returns that directory.

    Every kernel uses its task's fastest record, or its `ranks[i]`-th candidate (select.candidate_records);
    `candidates` > 1 picks the ranks by timing the model built with each of the first `candidates`
    (tensorgen.graph.backend.select; the model is built and profiled candidates + 1 times more). A fastest
    record that lays out its kernel's arguments (ALT) is followed by the model (`layouts`, LAYOUT_MODES:
    "propagate": with conversion kernels, the layouts propagated along element-wise kernels (graph.backend.layouts);
    "follow": conversion kernels only; "off": such records are passed over). A model that follows layouts is built
    with every kernel's fastest record (no selection of ranks: that compares builds kernel by kernel)."""
    if candidates < 1:
        raise TensorgenError(f"need at least 1 candidate record per kernel, got {candidates}")
    if layouts not in LAYOUT_MODES:
        raise TensorgenError(f"layouts must be one of {', '.join(LAYOUT_MODES)}, got {layouts!r}")
    target = Target.parse(target)
    hw = hardware_for(target)
    graph = model if isinstance(model, Graph) else load_graph(model, batch=batch)
    backend_for(target, hw).preflight()
    pools: dict[str, tuple[int, list]] = {}  # the builds of one selection share their candidate records
    if candidates > 1 and db is not None and ranks is None:
        subs = partition(graph).subgraphs
        if layouts != "off" and _sets_layouts(db, subs, target):
            if progress:
                progress("the fastest records lay out their kernels' arguments: built with them, no in-model "
                         "selection")
        else:
            def build(ranks: Sequence[int], directory: Path) -> Path:
                return _build(graph, directory, target, hw, db, ranks, pools, None)

            ranks = select_in_model(build, len(subs), candidates, threads=hw.cores, progress=progress).ranks
    return _build(graph, out_dir, target, hw, db, ranks, pools, progress, layouts=layouts)


def _sets_layouts(db: Database, subs: Sequence[Subgraph], target: Target) -> bool:
    return any((r := db.best(sub.workload_key, str(target))) is not None and r.sets_layouts for sub in subs)


def _build(graph: Graph, out_dir: str | os.PathLike[str], target: Target, hw: HardwareParams, db: Database | None,
           ranks: Sequence[int] | None, pools: dict[str, tuple[int, list]],
           progress: Callable[[str], None] | None, failed: dict[int, str] | None = None,
           layouts: str = "off") -> Path:
    """One build. A kernel whose program cannot be applied, lowered or compiled (a record of an older version,
    a bug the fuzzers have not found yet) gets the default schedule instead, with a warning: `failed` holds
    those kernels and why; a compile error names its kernels by compiling each alone, then the build restarts."""
    failed = {} if failed is None else failed
    backend = backend_for(target, hw)
    graph_in = graph
    graph = replace(graph, values=dict(graph.values), constants=dict(graph.constants))  # gains repacked weights
    part = partition(graph)
    follow = layouts != "off" and ranks is None
    schedules = schedule_subgraphs(part.subgraphs, target, db, hw.cores, ranks, pools, layouts=follow)
    if follow:
        part, schedules = _follow_layouts(part, schedules, target, db, hw.cores, layouts == "propagate")
    graph = part.graph  # the partitioned graph (channels-last convs, laid-out values) is the one the kernels read
    funcs, kernels = [], []
    for i, (sub, (state, cost, how)) in enumerate(zip(part.subgraphs, schedules)):
        name = f"k{i}_{sub.name.rsplit('_', 1)[0]}"
        if i not in failed:
            try:
                funcs.append(_kernel(graph, sub, state, name, f"k{i}"))
            except Exception as err:  # noqa: BLE001 - any failure of one program costs that program only
                failed[i] = f"{type(err).__name__}: {err}".splitlines()[0]
        if i in failed:
            LOGGER.warning("kernel %s: its %s program cannot be used (%s); it gets the default schedule", name,
                           how, failed[i])
            state, cost, how = default_laid_out(sub, hw.cores), None, "default"
            funcs.append(_kernel(graph, sub, state, name, f"k{i}"))
        kernels.append(KernelInfo(name, sub.workload_key, len(sub.nodes), how == "tuned", cost, how,
                                  ranks[i] if ranks and how == "tuned" else 0, failed.get(i, "")))
    if progress:
        tuned = sum(k.tuned for k in kernels)
        transferred = sum(k.schedule == "transferred" for k in kernels)
        fallbacks = f", {len(failed)} fell back to the default schedule" if failed else ""
        progress(f"{graph.name}: {len(kernels)} kernels ({tuned} tuned, {transferred} adapted from tuned ones"
                 f"{fallbacks}), compiling")
    blob, weight_offsets = pack_weights(part)
    plan = plan_memory(part, _in_place(part))
    for k, victim in plan.overwritten.items():
        args = funcs[k].args
        shared = (args[part.subgraphs[k].inputs.index(victim)].name, args[-1].name)
        funcs[k] = replace(funcs[k], attrs={**funcs[k].attrs, "shared_args": shared})
    funcs = align_partitions(funcs, [[part.aliases.get(n, n) for n in sub.inputs + sub.outputs]
                                     for sub in part.subgraphs], hw.cores)
    executor = executor_source(part, [k.name for k in kernels], weight_offsets, len(blob), plan)
    source = backend.render_module(funcs, executor)
    try:
        library = backend.compile(source)
    except CompileError:
        culprits = {i: err for i, f in enumerate(funcs) if i not in failed and (err := _compile_error(f, backend))}
        if not culprits:
            raise
        return _build(graph_in, out_dir, target, hw, db, ranks, pools, progress, {**failed, **culprits}, layouts)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(library, out / "model.so")
    (out / "model.c").write_text(source)
    (out / "weights.bin").write_bytes(blob)
    (out / MANIFEST).write_text(json.dumps(_manifest(graph, part, kernels, plan, target), indent=1))
    return out


def _follow_layouts(part: Partition, schedules: list[Schedule], target: Target, db: Database | None, cores: int,
                    propagate: bool) -> tuple[Partition, list[Schedule]]:
    """The partition laid out as its kernels' programs store their arguments (graph.backend.layouts; a layout
    kept only where it pays for the kernels it adds, _charged), with the programs of the kernels that plan adds or
    lays out: their records (by the laid-out DAG), else adapted or default ones."""
    schedules = _charged(part, schedules, target, db, cores, propagate)
    plan = _plan(part, schedules, propagate, _absorber(part, schedules, target, db, propagate, measured=True))
    if plan is None:
        return part, schedules
    todo = [i for i, o in enumerate(plan.origin) if o is None]
    laid = schedule_subgraphs([replace(plan.part.subgraphs[i], dag=laid_out_dag(plan.part.subgraphs[i])) for i in todo],
                              target, db, cores)
    found = dict(zip(todo, laid))
    out = []
    for i, (sub, origin) in enumerate(zip(plan.part.subgraphs, plan.origin)):
        if origin is not None:
            out.append(schedules[origin])
        else:
            state, cost, how = found[i]
            out.append((laid_out_state(sub, state), cost, how))
    return plan.part, out


def _plan(part: Partition, schedules: Sequence[Schedule], propagate: bool,
          absorb: Absorb | None = None) -> LayoutPlan | None:
    chosen = [state_layouts(state) for state, _, _ in schedules]
    return plan_layouts(part, chosen, propagate, absorb) if any(chosen) else None


def absorbed_state(dag: ComputeDAG, layouts: Layouts, state: State) -> State:
    """A state of `dag` storing its arguments in `layouts` (a program's own and inputs in their producers'
    layouts) with the loops of `state`, a program of `dag` (ScheduleError where they do not replay there)."""
    return with_layouts(dag, layouts, State.replay(lay_out(dag, layouts), loop_steps(state)))


def _absorber(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database | None, propagate: bool,
              measured: bool) -> Absorb | None:
    """plan_layouts' `absorb` (with propagation only): a kernel reads inputs in their producers' layouts where its
    loops replay and lower over the laid-out DAG and, `measured`, that DAG's best record costs less than the kernel's
    own program plus the conversions it saves. Without `measured`, every program that replays is accepted: the
    tasks worth tuning (layout_tasks)."""
    if not propagate or db is None:
        return None
    memo: dict[tuple[int, str], bool] = {}

    def absorb(i: int, layouts: Layouts) -> bool:
        key = (i, layout_key(layouts))
        if key not in memo:
            memo[key] = _absorbs(part.graph, part.subgraphs[i], schedules[i], layouts, target, db, measured)
        return memo[key]

    return absorb


def _absorbs(graph: Graph, sub: Subgraph, schedule: Schedule, layouts: Layouts, target: Target, db: Database,
             measured: bool) -> bool:
    state, cost, _ = schedule
    record = db.best(lay_out(sub.dag, layouts).workload_key, str(target)) if measured else None
    if measured and (record is None or cost is None):
        return False
    try:
        lower(absorbed_state(sub.dag, layouts, state))
    except TensorgenError:
        return False
    if record is None:
        return True
    own = state_layouts(state)
    saved = sum(_conversion_time(graph, x, layouts[t.name], target, db) for x, t in zip(sub.inputs, sub.dag.inputs)
                if t.name in layouts and t.name not in own)
    return record.result.median_cost < cost + saved


def _conversion_time(graph: Graph, x: str, layout: Sequence[LayoutPrimitive], target: Target, db: Database) -> float:
    """Seconds to convert value `x` from `layout` to plain: its conversion kernel's record, else its bytes moved at
    UNTIMED_GBS."""
    value = graph.value(x)
    dag = lay_out(conversion_dag(value.shape, value.dtype), {"input0": layout})
    record = db.best(dag.workload_key, str(target))
    return record.result.median_cost if record is not None else _bytes_time([value, value])


def _charged(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database | None, cores: int,
             propagate: bool) -> list[Schedule]:
    """`schedules` where each program that lays out its kernel's arguments stays only if the model is estimated
    faster with it than with the kernel's best plain record: a layout pays for the conversions it makes necessary
    (one kernel's gain can be lost to the copies its neighbours then read). Greedy, from the layout that gains
    least alone; a model's estimated time is the sum of its kernels' (_estimate)."""
    laid = [i for i, (state, _, _) in enumerate(schedules) if state_layouts(state)]
    if not laid or db is None:
        return list(schedules)
    plains = {i: schedule_subgraphs([part.subgraphs[i]], target, db, cores, layouts=False)[0] for i in laid}
    laid = [i for i in laid if plains[i][1] is not None]  # an untimed plain program is no known alternative

    def gain(i: int) -> float:
        return plains[i][1] - schedules[i][1]

    current, best = list(schedules), _estimate(part, schedules, target, db, propagate)
    for i in sorted(laid, key=gain):
        trial = [plains[i] if k == i else s for k, s in enumerate(current)]
        cost = _estimate(part, trial, target, db, propagate)
        if cost < best:
            current, best = trial, cost
    dropped = sum(not state_layouts(current[i][0]) for i in laid)
    if dropped:
        LOGGER.info("%d of %d kernels' layouts do not pay for the conversions they add: built plain", dropped,
                    len(laid))
    return current


def _estimate(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database,
              propagate: bool) -> float:
    """Seconds a model built with `schedules` takes, estimated as the sum of its kernels' recorded times; a kernel
    the layouts add without a record (a conversion, an element-wise kernel in a propagated layout) takes its
    plain counterpart's time, or moves its bytes at UNTIMED_GBS."""
    plan = _plan(part, schedules, propagate, _absorber(part, schedules, target, db, propagate, measured=True))
    if plan is None:
        return sum(_time(part.graph, sub, cost) for sub, (_, cost, _) in zip(part.subgraphs, schedules))
    total = 0.0
    for sub, origin, source in zip(plan.part.subgraphs, plan.origin, plan.source):
        if origin is not None:
            cost = schedules[origin][1]
        elif (record := db.best(laid_out_dag(sub).workload_key, str(target))) is not None:
            cost = record.result.median_cost
        else:
            cost = schedules[source][1] if source is not None else None
        total += _time(plan.part.graph, sub, cost)
    return total


def _time(graph: Graph, sub: Subgraph, cost: float | None) -> float:
    return cost if cost is not None else _bytes_time([graph.value(x) for x in sub.inputs + sub.outputs])


def _bytes_time(values: Sequence[Value]) -> float:
    return sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in values) / (UNTIMED_GBS * 1e9)


def layout_tasks(model: object, db: Database, target: str | Target = "cpu",
                 batch: int = 1) -> list[tuple[ModelTask, list[State]]]:
    """The tasks that a build following `db`'s layouts may add to `model` (graph.backend.layouts), each with the
    programs to start its search from: its conversion kernels, its element-wise kernels in propagated layouts and
    its kernels reading inputs in their producers' layouts (seeded with their own loops), their DAGs laid out
    (tuned after the model's other tasks, once the layouts are known; a build reads an input in its producer's
    layout only where the record pays, else converts it: both kinds are here)."""
    target = Target.parse(target)
    hw = hardware_for(target)
    graph = model if isinstance(model, Graph) else load_graph(model, batch=batch)
    part = partition(graph)
    schedules = _charged(part, schedule_subgraphs(part.subgraphs, target, db, hw.cores), target, db, hw.cores, True)
    found: dict[str, list] = {}
    for absorb in (None, _absorber(part, schedules, target, db, True, measured=False)):
        plan = _plan(part, schedules, True, absorb)
        if plan is None:  # no layouts at all
            return []
        for k, (sub, origin, source) in enumerate(zip(plan.part.subgraphs, plan.origin, plan.source)):
            if origin is None:
                dag = laid_out_dag(sub)
                entry = found.setdefault(dag.workload_key, [dag, sub.name.rsplit("_", 1)[0], set(), []])
                entry[2].add(sub.name)
                if k in plan.absorbed and not entry[3]:
                    entry[3].append(State.replay(dag, loop_steps(schedules[source][0])))
    return [(ModelTask(SearchTask(dag, target, hw, desc=desc), len(names), tuple(sorted(names))), seeds)
            for dag, desc, names, seeds in found.values()]


def _kernel(graph: Graph, sub: Subgraph, state: State, name: str, tag: str) -> PrimFunc:
    """Subgraph `sub` as function `name` under `state`, its constants repacked into the layouts it reads."""
    return lower(_repack_weights(graph, sub, state, tag), name)


def _compile_error(func: PrimFunc, backend: Backend) -> str:
    """The compiler's first error line for `func` compiled alone ("" when it compiles)."""
    try:
        backend.compile(backend.render_module([func]))
    except CompileError as err:
        return "CompileError: " + err.first_error()
    return ""


def _repack_weights(graph: Graph, sub: Subgraph, state: State, tag: str) -> State:
    """`state` with its constants' layouts rewritten (as it was measured); the repacked data become new
    constants of `graph` that `sub` reads instead (the originals are then not saved unless still read).
    All of them are packed before any is installed, so a failing one leaves `graph` and `sub` as they were."""
    state, plans = rewrite_layout(state)
    names = [t.name for t in state.dag.inputs]
    packed = []
    for plan in plans:
        k = names.index(plan.name)
        value = graph.value(sub.inputs[k])
        packed.append((k, value, plan.pack(np.asarray(graph.constants[value.name])), plan.new_shape))
    for k, value, data, shape in packed:
        name = f"{value.name}.{tag}"
        graph.constants[name] = data
        graph.values[name] = Value(name, shape, value.dtype)
        sub.inputs[k] = name
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
