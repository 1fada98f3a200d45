"""Node-based crossover (Ansor §5.1): a child takes each stage's steps from one of two parents of
the same sketch. The paper has it; TVM's implementation never did."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tensorgen.schedule.state import State
from tensorgen.schedule.steps import SplitStep, Step
from tensorgen.search.mutations import ANNOTATION_STEPS, LOCATION_STEPS, is_flexible, replay
from tensorgen.task import SearchTask


def _same_skeleton(sketch_step: Step, step: Step) -> bool:
    """`step` is `sketch_step` with its tile sizes filled in (lengths may differ, nothing else)."""
    if type(sketch_step) is not type(step):
        return False
    if isinstance(step, SplitStep):
        return (sketch_step.stage_id, sketch_step.iter_id, len(sketch_step.lengths), sketch_step.inner_to_outer) \
            == (step.stage_id, step.iter_id, len(step.lengths), step.inner_to_outer)
    return sketch_step == step


def match_sketch(state: State, sketches: Sequence[State]) -> int | None:
    """Index of the sketch `state` was annotated from: the longest whose steps start the state's (a
    sketch can extend another, as rules.PackOperand's do) and are followed by annotation steps only.

    A program can be a sketch of this task's list extended by structural steps (a pack, cache or rfactor
    stage) when it was made from a sketch the list lacks: one adapted from a similar task whose rules gave
    it more sketches (a larger operand is packed), or a record of another version. Such a program has
    other stages than the sketch's annotated programs, so it matches none (no crossover partner)."""
    best = None
    for k, sk in enumerate(sketches):
        n = len(sk.steps)
        if len(state.steps) >= n and all(_same_skeleton(a, b) for a, b in zip(sk.steps, state.steps[:n])) \
                and all(isinstance(s, ANNOTATION_STEPS) for s in state.steps[n:]):
            if best is None or n > len(sketches[best].steps):
                best = k
    return best


def step_owners(sketch: State) -> list[str]:
    """The name of the stage each sketch step transforms (ids shift as cache_write/rfactor add stages)."""
    s, out = State(sketch.dag), []
    for step in sketch.steps:
        out.append(s.stages[step.stage_id].name)
        s.apply(step)
    return out


def crossover(task: SearchTask, a: State, b: State, sketch_len: int, owners: Sequence[str],
              rng: np.random.Generator) -> State | None:
    """Node-based crossover of two programs of the same sketch (`sketch_len` steps, `owners` their stages).

    Every stage takes its steps — its tile sizes and its annotations — from one parent picked at
    random. A flexible stage computed at another stage follows that stage's parent, because the
    consumer's annotations were chosen around that attach point. Location steps go first (in
    descending stage order, as annotation made them), then the rest of each parent's steps in order;
    the child is verified by replay (None when a step no longer applies). Parents whose stages differ
    (not both annotations of the sketch: see `match_sketch`) have no common nodes: None.
    """
    names = [st.name for st in a.stages]
    if [st.name for st in b.stages] != names:
        return None
    parent = {n: int(rng.integers(2)) for n in names}
    owned = set(owners) | {names[s.stage_id] for s in a.steps[sketch_len:] + b.steps[sketch_len:]}
    if len({parent[n] for n in owned}) < 2 and len(owned) > 1:
        flip = sorted(owned)[int(rng.integers(len(owned)))]
        parent[flip] = 1 - parent[flip]
    for i in range(len(names) - 1, -1, -1):
        src = (a, b)[parent[names[i]]]
        if src.stages[i].location == "at" and is_flexible(src, i):
            parent[names[i]] = parent[src.stages[i].attach[0]]
    steps: list[Step] = []
    for n, step in enumerate(a.steps[:sketch_len]):
        steps.append(b.steps[n] if isinstance(step, SplitStep) and parent[owners[n]] else step)
    mine = [[s for s in p.steps[sketch_len:] if parent[names[s.stage_id]] == k] for k, p in enumerate((a, b))]
    locations = sorted((s for m in mine for s in m if isinstance(s, LOCATION_STEPS)), key=lambda s: -s.stage_id)
    steps += locations + [s for m in mine for s in m if not isinstance(s, LOCATION_STEPS)]
    return replay(task, steps)
