"""Which layouts a model build follows (ALT §4.2 with a price): a kernel's laid-out record is kept only where it
pays for the conversions it makes necessary (`charged`), and a kernel reads an input in its producer's layout where
that program's record says it is faster than a conversion (`absorber`); `layout_tasks` names the kernels those
choices need timed.

A model's time is estimated as the sum of its kernels' recorded times; a kernel without one (a conversion or an
element-wise kernel in a propagated layout not tuned yet) takes its plain counterpart's time, or moves its bytes at
UNTIMED_GBS.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError
from tensorgen.graph.backend.layouts import Absorb, LayoutPlan, Layouts, conversion_dag, laid_out_dag, plan_layouts
from tensorgen.graph.backend.programs import Schedule, schedule_subgraphs
from tensorgen.graph.backend.tasks import ModelTask
from tensorgen.graph.ir import Graph, Value
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import Partition, Subgraph, partition
from tensorgen.hardware import hardware_for
from tensorgen.records.database import Database
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.layout import LayoutPrimitive
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State, loop_steps, state_layouts, with_layouts
from tensorgen.search.alt_policy import layout_key
from tensorgen.target import Target
from tensorgen.task import SearchTask

LOGGER = logging.getLogger("tensorgen.graph")
# the speed (bytes moved per second) assumed of a kernel without a recorded time: MobileNet-V2's tuned conversion
# kernels moved 4-16 GB/s (2 cores, AVX-512)
UNTIMED_GBS = 8.0


def plan_for(part: Partition, schedules: Sequence[Schedule], propagate: bool,
             absorb: Absorb | None = None) -> LayoutPlan | None:
    """The layout plan of a build with `schedules` (None when no program lays out anything)."""
    chosen = [state_layouts(state) for state, _, _ in schedules]
    return plan_layouts(part, chosen, propagate, absorb) if any(chosen) else None


def charged(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database | None, cores: int,
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

    memo: dict = {}  # absorber verdicts, shared by the trial builds (which reuse most kernels' programs)
    current, best = list(schedules), _estimate(part, schedules, target, db, propagate, memo)
    for i in sorted(laid, key=gain):
        trial = [plains[i] if k == i else s for k, s in enumerate(current)]
        cost = _estimate(part, trial, target, db, propagate, memo)
        if cost < best:
            current, best = trial, cost
    dropped = sum(not state_layouts(current[i][0]) for i in laid)
    if dropped:
        LOGGER.info("%d of %d kernels' layouts do not pay for the conversions they add: built plain", dropped,
                    len(laid))
    return current


def _estimate(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database, propagate: bool,
              memo: dict) -> float:
    """Seconds a model built with `schedules` takes, estimated as the sum of its kernels' recorded times; a kernel
    the layouts add without a record (a conversion, an element-wise kernel in a propagated layout) takes its
    plain counterpart's time, or moves its bytes at UNTIMED_GBS. `memo`: the absorber's, kept across calls."""
    plan = plan_for(part, schedules, propagate, absorber(part, schedules, target, db, propagate, True, memo))
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


def own_loops(laid: ComputeDAG, state: State) -> State:
    """The loops of `state`, a program of a DAG, over `laid`, that DAG laid out (ScheduleError where they do not
    replay there): a reader's own program reading inputs in their producers' layouts."""
    return State.replay(laid, loop_steps(state))


def absorbed_state(dag: ComputeDAG, layouts: Layouts, state: State) -> State:
    """own_loops as a state of `dag` itself: its layout steps, then the loops over `dag` in `layouts`."""
    return with_layouts(dag, layouts, own_loops(lay_out(dag, layouts), state))


def absorber(part: Partition, schedules: Sequence[Schedule], target: Target, db: Database | None, propagate: bool,
             measured: bool, memo: dict | None = None) -> Absorb | None:
    """plan_layouts' `absorb` (with propagation only): a kernel reads inputs in their producers' layouts where its
    loops replay and lower over the laid-out DAG and, `measured`, that DAG's best record costs less than the kernel's
    own program plus the conversions it saves. Without `measured`, every program that replays is accepted: the
    tasks worth tuning (layout_tasks). `memo` keeps verdicts across calls whose `schedules` share programs (keyed
    by the program object, so its owner keeps the schedules alive as long as the memo)."""
    if not propagate or db is None:
        return None
    memo = {} if memo is None else memo

    def absorb(i: int, layouts: Layouts) -> bool:
        key = (i, id(schedules[i][0]), layout_key(layouts), measured)
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
    schedules = charged(part, schedule_subgraphs(part.subgraphs, target, db, hw.cores), target, db, hw.cores, True)
    found: dict[str, list] = {}
    for absorb in (None, absorber(part, schedules, target, db, True, measured=False)):
        plan = plan_for(part, schedules, True, absorb)
        if plan is None:  # no layouts at all
            return []
        for k, (sub, origin, source) in enumerate(zip(plan.part.subgraphs, plan.origin, plan.source)):
            if origin is None:
                dag = laid_out_dag(sub)
                entry = found.setdefault(dag.workload_key, [dag, sub.name.rsplit("_", 1)[0], set(), []])
                entry[2].add(sub.name)
                if k in plan.absorbed and not entry[3]:
                    entry[3].append(own_loops(dag, schedules[source][0]))
    return [(ModelTask(SearchTask(dag, target, hw, desc=desc), len(names), tuple(sorted(names))), seeds)
            for dag, desc, names, seeds in found.values()]
