"""Sketch generation (Ansor §4.1): derive program structures by applying rules from output to input.

The derivation state is (S, i): a State and the index of the stage being worked on. Starting from
the naive program and the last stage, every rule of the ordered table is asked in turn; each that
applies turns (S, i) into successors (S', i' <= i), and one that answers APPLY_AND_SKIP_REST stops
the rest of the table for that state. States with i < 0 are finished sketches. Tile sizes are left
unfilled (None) for random annotation (`tensorgen.search.annotate`) to sample.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence

from tensorgen.errors import ScheduleError, TuneError
from tensorgen.registry import Registry
from tensorgen.schedule.state import State
from tensorgen.search.rules import (
    AlwaysInline,
    Cond,
    Derivation,
    MultiLevelTiling,
    SketchRule,
    SkipStage,
)
from tensorgen.search.skips import Skips
from tensorgen.search.targets import for_target
from tensorgen.task import SearchTask

LOGGER = logging.getLogger("tensorgen.search")


def derive(task: SearchTask, state: State, i: int, rules: Sequence[SketchRule],
           skips: Skips | None = None) -> list[Derivation]:
    """The successors of one derivation state under `rules` (inlined stages are passed over).

    A rule whose application raises ScheduleError contributes nothing: a rule may be offered a
    stage it cannot transform (e.g. a user rule meeting a stage an earlier rule already changed).
    A rule that fails otherwise (a bug) is skipped for this state and counted in `skips`.
    """
    if state.stages[i].location == "inline":
        return [(state, i - 1)]
    skips = skips if skips is not None else Skips()
    out: list[Derivation] = []
    for rule in rules:
        cond, succ = Cond.SKIP, []  # what a failing rule amounts to
        with skips.guard("sketch rule", f"{rule.name} at stage {state.stages[i].name} of {task}"):
            answer = rule.condition(task, state, i)
            if answer is not Cond.SKIP:
                try:
                    succ = rule.apply(task, state, i)
                except ScheduleError:
                    succ = []
            cond = answer
        if cond is Cond.SKIP:
            continue
        if any(j > i for _, j in succ):
            raise ValueError(f"rule {rule.name} moved the derivation forward from stage {i}; i must not increase")
        out.extend(succ)
        if cond is Cond.APPLY_AND_SKIP_REST:
            break
    return out


class TooManySketches(RuntimeError):
    """The derivation passed its bound: a runaway rule, or a DAG whose stages multiply the rules' choices."""


def generate_sketches(task: SearchTask, rules: Sequence[SketchRule] | None = None,
                      max_sketches: int = 4096, skips: Skips | None = None) -> list[State]:
    """All sketches of `task.dag` under `rules` (default: the table of the task's target kind, search.targets:
    rules.DEFAULT_RULES for CPUs, gpu_rules.GPU_RULES for CUDA),
    deduplicated by their step list and in derivation order.

    A rule returning (S, i) with the same i must make progress on its own (like cache_write, which
    moves the work to a new stage); `max_sketches` bounds a runaway user rule (TooManySketches), and the product
    of the choices of many stages: a fused group of several chained reductions (a pool, an ArgMin's two, an
    instance norm's two) has a few choices each, 1350 sketches in all for five. A rule that raises (other than
    ScheduleError) is skipped where it failed and counted in `skips` (see tensorgen.search.skips).
    """
    rules = list(for_target(task).rules if rules is None else rules)
    start = State(task.dag)
    queue: deque[Derivation] = deque([(start, len(start.stages) - 1)])
    sketches: dict[str, State] = {}
    expanded = 0
    while queue:
        state, i = queue.popleft()
        if i < 0:
            sketches.setdefault(state.to_json(), state)
            if len(sketches) > max_sketches:
                raise TooManySketches(f"sketch derivation passed {max_sketches} sketches")
            continue
        expanded += 1
        if expanded > max_sketches * 100:
            raise TooManySketches(f"sketch derivation did not terminate within {max_sketches} sketches")
        queue.extend(derive(task, state, i, rules, skips))
    return list(sketches.values())


def sketch_space(task: SearchTask, rules: Sequence[SketchRule] | None = None,
                 skips: Skips | None = None) -> list[State]:
    """Ansor's search space: every sketch the rules derive (default: the target kind's table). Where the default
    rules derive too many (TooManySketches), the limited space: tuning goes on, warned, in a smaller space; given
    rules that run away raise."""
    try:
        return generate_sketches(task, rules, skips=skips)
    except TooManySketches as err:
        if rules is not None:
            raise TooManySketches(f"{err}; check the rules") from None
        LOGGER.warning("%s: %s; searching the plain multi-level tiling sketch (the 'limited' space) instead", task, err)
        return limited_space(task, skips=skips)


def limited_space(task: SearchTask, rules: Sequence[SketchRule] | None = None,
                  skips: Skips | None = None) -> list[State]:
    """A template-like space (the "limited space" of Ansor's Figure 7): the plain multi-level tiling sketch alone
    (AlwaysInline, MultiLevelTiling, SkipStage: no cache write, fusion or rfactor)."""
    if rules is not None:
        raise TuneError("the 'limited' space has its own rules; give rules to the 'sketch' space")
    return generate_sketches(task, (AlwaysInline(), MultiLevelTiling(), SkipStage()), skips=skips)


#: Search spaces by name: space(task, rules=None, skips=None) -> the sketches a policy samples and evolves.
#: Register your own (`SPACES.register("mine", fn)`) and name it: `policy_options={"space": "mine"}`.
SPACES: Registry[list[State]] = Registry("search space", TuneError)
SPACES.register("sketch", sketch_space)
SPACES.register("limited", limited_space)


def print_sketches(sketches: Sequence[State]) -> str:
    """The sketches as numbered Python programs (unfilled lengths print as None)."""
    return "\n\n".join(f"# sketch {n}\n{s}" for n, s in enumerate(sketches))
