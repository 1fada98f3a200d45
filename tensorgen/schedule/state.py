"""State: a ComputeDAG plus the ordered steps applied to it. The step list is the program."""

from __future__ import annotations

import json
from collections.abc import Sequence

from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError
from tensorgen.schedule.laid_out import TransformLayoutStep
from tensorgen.schedule.layout import LayoutPrimitive
from tensorgen.schedule.packing import PackLayoutStep
from tensorgen.schedule.stage import Stage, make_stage, producers_of
from tensorgen.schedule.steps import (
    AnnotationStep,
    CacheReadStep,
    CacheWriteStep,
    ComputeAtStep,
    ComputeInlineStep,
    ComputeRootStep,
    FollowFusedSplitStep,
    FollowSplitStep,
    FuseStep,
    PragmaStep,
    ReorderStep,
    RfactorStep,
    SplitStep,
    Step,
    StorageAlignStep,
)
from tensorgen.te.tensor import Tensor

StageRef = int | str | Tensor
IterRef = int | str


class State:
    """Mutable handle over immutable stages; every method appends one step or raises and changes nothing.

    Stages and iterators may be named by index, by name, or (stages) by Tensor; `print(state)`
    shows the steps as Python calls against a state `s`.
    """

    def __init__(self, dag: ComputeDAG | Tensor | Sequence[Tensor]):
        self.dag = dag if isinstance(dag, ComputeDAG) else ComputeDAG(dag)
        self.source = self.dag  # what the steps replay from: `dag` differs after a layout step (schedule.laid_out)
        self.stages: tuple[Stage, ...] = tuple(make_stage(t) for t in self.dag.tensors)
        self.steps: tuple[Step, ...] = ()

    # ---- core ----------------------------------------------------------------------------

    def apply(self, step: Step) -> State:
        stages, dag = step.apply(self), step.new_dag(self)
        self.stages, self.dag = stages, dag if dag is not None else self.dag
        self.steps = self.steps + (step,)
        return self

    def copy(self) -> State:
        new = State.__new__(State)
        new.dag, new.source, new.stages, new.steps = self.dag, self.source, self.stages, self.steps
        return new

    @classmethod
    def replay(cls, dag: ComputeDAG, steps: Sequence[Step]) -> State:
        state = cls(dag)
        for step in steps:
            state.apply(step)
        return state

    def to_json(self) -> str:
        return json.dumps([s.to_json() for s in self.steps], separators=(",", ":"))

    @classmethod
    def from_json(cls, dag: ComputeDAG, text: str) -> State:
        return cls.replay(dag, [Step.from_json(s) for s in json.loads(text)])

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, State)
            and self.dag.workload_key == other.dag.workload_key
            and self.stages == other.stages
            and self.steps == other.steps
        )

    def __hash__(self) -> int:
        return hash((self.dag.workload_key, self.steps))

    def __str__(self) -> str:
        lines, replay = [], State(self.source)
        for step in self.steps:
            lines.append(step.to_python(replay))
            replay.apply(step)
        return "\n".join(lines) if lines else "# no steps: the naive program"

    __repr__ = __str__

    def to_loops(self) -> str:
        """The loop nest this state lowers to, as readable pseudo-code."""
        from tensorgen.loopir.printer import stmt_str
        from tensorgen.schedule.lower import lower

        return stmt_str(lower(self, gpu=True).body)

    # ---- lookups -------------------------------------------------------------------------

    def stage_id(self, stage: StageRef) -> int:
        if isinstance(stage, Tensor):
            stage = stage.name
        if isinstance(stage, int) and not isinstance(stage, bool):
            if not 0 <= stage < len(self.stages):
                raise ScheduleError(f"no stage with index {stage} (the state has {len(self.stages)} stages)")
            return stage
        for n, st in enumerate(self.stages):
            if st.name == stage:
                return n
        raise ScheduleError(f"no stage named {stage!r}; stages: {', '.join(s.name for s in self.stages)}")

    def stage(self, stage: StageRef) -> Stage:
        return self.stages[self.stage_id(stage)]

    def _ids(self, stage: StageRef, it: IterRef) -> tuple[int, int]:
        sid = self.stage_id(stage)
        return sid, self.stages[sid].iter_index(it)

    def direct_producers(self, name: str) -> list[str]:
        st = self.stage(name)
        if st.is_placeholder:
            return []
        return list(producers_of(st.tensor))

    def consumers(self, name: str) -> list[str]:
        return [s.name for s in self.stages if name in self.direct_producers(s.name)]

    def effective_consumers(self, name: str) -> list[str]:
        """Consumers after looking through inlined stages."""
        out: list[str] = []
        for c in self.consumers(name):
            more = self.effective_consumers(c) if self.stage(c).location == "inline" else [c]
            out.extend(m for m in more if m not in out)
        return out

    # ---- the schedule primitives, one step each --------------------------------------------

    def split(self, stage: StageRef, it: IterRef, lengths: Sequence[int | None], inner_to_outer: bool = True):
        sid, iid = self._ids(stage, it)
        extent = self.stages[sid].iters[iid].extent
        return self.apply(SplitStep(sid, iid, extent, tuple(lengths), inner_to_outer))

    def follow_split(self, stage: StageRef, it: IterRef, src_step_id: int, n_split: int):
        return self.apply(FollowSplitStep(*self._ids(stage, it), src_step_id, n_split))

    def follow_fused_split(self, stage: StageRef, it: IterRef, src_step_ids: Sequence[int], level: int,
                           factor_or_nparts: bool):
        return self.apply(FollowFusedSplitStep(*self._ids(stage, it), tuple(src_step_ids), level, factor_or_nparts))

    def fuse(self, stage: StageRef, iters: Sequence[IterRef]):
        sid = self.stage_id(stage)
        return self.apply(FuseStep(sid, tuple(self.stages[sid].iter_index(i) for i in iters)))

    def reorder(self, stage: StageRef, order: Sequence[IterRef]):
        sid = self.stage_id(stage)
        return self.apply(ReorderStep(sid, tuple(self.stages[sid].iter_index(i) for i in order)))

    def annotate(self, stage: StageRef, it: IterRef, annotation: str):
        return self.apply(AnnotationStep(*self._ids(stage, it), annotation))

    def parallel(self, stage: StageRef, it: IterRef):
        return self.annotate(stage, it, "parallel")

    def vectorize(self, stage: StageRef, it: IterRef):
        return self.annotate(stage, it, "vectorize")

    def unroll(self, stage: StageRef, it: IterRef):
        return self.annotate(stage, it, "unroll")

    def bind(self, stage: StageRef, it: IterRef, thread_axis: str):
        return self.annotate(stage, it, thread_axis)

    def pragma(self, stage: StageRef, it: IterRef, pragma: str):
        return self.apply(PragmaStep(*self._ids(stage, it), pragma))

    def storage_align(self, stage: StageRef, it: IterRef, factor: int, offset: int):
        return self.apply(StorageAlignStep(*self._ids(stage, it), factor, offset))

    def compute_at(self, stage: StageRef, target: StageRef, target_iter: IterRef):
        return self.apply(ComputeAtStep(self.stage_id(stage), *self._ids(target, target_iter)))

    def compute_inline(self, stage: StageRef):
        return self.apply(ComputeInlineStep(self.stage_id(stage)))

    def compute_root(self, stage: StageRef):
        return self.apply(ComputeRootStep(self.stage_id(stage)))

    def cache_read(self, stage: StageRef, scope: str, readers: Sequence[StageRef]):
        return self.apply(CacheReadStep(self.stage_id(stage), scope, tuple(self.stage_id(r) for r in readers)))

    def cache_write(self, stage: StageRef, scope: str = "local"):
        return self.apply(CacheWriteStep(self.stage_id(stage), scope))

    def transform_layout(self, stage: StageRef, primitives: Sequence[LayoutPrimitive]):
        """Store tensor `stage` in the layout `primitives` make (schedule.layout): before any loop step."""
        return self.apply(TransformLayoutStep(self.stage_id(stage), tuple(p.to_json() for p in primitives)))

    def pack_layout(self, stage: StageRef, reader: StageRef):
        return self.apply(PackLayoutStep(self.stage_id(stage), self.stage_id(reader)))

    def rfactor(self, stage: StageRef, it: IterRef, factor_iter_id: int):
        return self.apply(RfactorStep(*self._ids(stage, it), factor_iter_id))


def state_layouts(state: State) -> dict[str, list[LayoutPrimitive]]:
    """The layout each of `state`'s layout steps gives a tensor of its source DAG, by name (two steps on one tensor
    compose): a kernel's argument layouts."""
    layouts: dict[str, list[LayoutPrimitive]] = {}
    for step in state.steps:
        if isinstance(step, TransformLayoutStep):
            layouts.setdefault(state.source.tensors[step.stage_id].name, []).extend(step.layout_primitives())
    return layouts


def with_layouts(dag: ComputeDAG, layouts: dict[str, Sequence[LayoutPrimitive]], loops: State | None = None) -> State:
    """A state of `dag`: a layout step per tensor of `layouts`, then the steps of `loops`, a state of
    `lay_out(dag, layouts)` (steps that name earlier steps are renumbered)."""
    state = State(dag)
    for name, primitives in layouts.items():
        state.transform_layout(name, primitives)
    for step in loops.steps if loops is not None else ():
        state.apply(step.shifted(len(layouts)))
    return state


def loop_steps(state: State) -> list[Step]:
    """`state`'s steps after its layout steps, numbered as on the DAG those make."""
    n = sum(isinstance(step, TransformLayoutStep) for step in state.steps)
    return [s.shifted(-n) for s in state.steps[n:]]


def loop_state(state: State) -> State:
    """`state` without its layout steps: its loop steps replayed on the DAG those made (the same program)."""
    n = len(state.steps) - len(loop_steps(state))
    if not n:
        return state
    return State.replay(State.replay(state.source, state.steps[:n]).dag, loop_steps(state))
