"""ALT's joint layout and loop search of one task (§5) as a search policy: a joint stage, then a loop-only stage.

The task's own layout leads (OWN_LEAD trials: a task the task scheduler gives few trials is tuned as Ansor would,
and the layouts compete with a tuned program); then every other layout's search is offered the own layout's best
loops where they replay over its DAG (a layout of the operands keeps the loop nest), and the cost model, trained on
the lead, screens the other layouts (a layout whose best program among the seeds and a batch of random programs
is predicted below SCREEN of the own layout's best is not measured: its trials go to the loop-only stage); then the
joint stage explores layouts: each
candidate (the task's own layout first, then tilings sampled from a layout template, search.layouts) is the task's
DAG laid out (schedule.laid_out.lay_out), whose loops an Ansor search (SketchPolicy) tunes; the best program measured
is that layout's reward. The joint budget goes in one equal share per layout ("uniform"), in rungs of successive halving
("halving": the better half of the layouts goes on), or in generations of an evolution whose genes are the
template's tile sizes ("evolve": the better half goes on and the other half is replaced by its mutants, one tile
changed each). The loop-only stage gives every later trial to the best layout's search.

Every program it proposes is a program of the task itself: its layout steps, then the loop steps
(schedule.state.with_layouts), so its records are the task's, a model build follows their layouts
(graph.backend.layouts) and the task scheduler tunes layouts and loops of many tasks like any other policy.

This is the paper's cross exploration with its PPO layout actor replaced by sampling from the template's space (not
built: PPO).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgen.costmodel.base import CostModel
from tensorgen.errors import TensorgenError, TuneError
from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.state import State, loop_steps, state_layouts, with_layouts
from tensorgen.search.layouts import LAYOUT_TEMPLATES, Layouts, LayoutTemplate, TileSpace
from tensorgen.search.policy import SearchPolicy
from tensorgen.search.sketch_policy import SketchPolicy
from tensorgen.search.skips import Skips
from tensorgen.task import SearchTask

EXPLORATIONS = ("evolve", "halving", "uniform")
JOINT_TRIALS_PER_LAYOUT = 8  # the joint budget when none is given: this many trials per layout
OWN_LEAD = 48  # trials the task's own layout has before any other layout is tried (three rounds of the scheduler)
GENERATIONS = 3  # of the "evolve" exploration
SCREEN = 0.9  # a layout is measured where its predicted best program scores at least this share of the own layout's
SEEDS = 4  # of the own layout's best programs, replayed over every other layout as its search's first offer


def exploration_rungs(count: int, budget: int, exploration: str) -> list[int]:
    """Trials per surviving layout in each rung of the joint stage. "uniform": one rung, an equal share each.
    "halving" (successive halving): the better half of the layouts goes on to the next rung, each rung spends
    about the same trials in all, so the layouts that stay longest get the most."""
    if exploration == "uniform" or count == 1:
        return [max(1, budget // count)]
    alive, sizes = count, []
    while alive > 1:
        sizes.append(alive)
        alive = max(1, alive // 2)
    sizes.append(1)
    return [max(1, budget // len(sizes) // n) for n in sizes]


def layout_key(layouts: Layouts) -> str:
    return json.dumps(sorted((name, [p.to_json() for p in prims]) for name, prims in layouts.items() if prims))


def sampled_tiles(space: TileSpace | None, template: LayoutTemplate, task: SearchTask, count: int,
                  rng: np.random.Generator) -> list[dict[str, int]]:
    """Up to `count` tile choices from `space` whose layouts differ from each other and from the task's own."""
    found: list[dict[str, int]] = []
    seen = {layout_key({})}
    for _ in range(50 * count if space is not None else 0):
        if len(found) >= count:
            break
        tiles = space.sample(rng)
        key = layout_key(template.layouts(task.dag, tiles))
        if key not in seen:
            seen.add(key)
            found.append(tiles)
    return found


def layout_candidates(task: SearchTask, count: int, template: str, rng: np.random.Generator) -> list[Layouts]:
    """The task's own layout, then up to count - 1 distinct tilings from the template (fewer if it has fewer)."""
    tmpl = LAYOUT_TEMPLATES[template]
    return [{}, *(tmpl.layouts(task.dag, tiles) for tiles in sampled_tiles(tmpl.space(task.dag), tmpl, task,
                                                                          count - 1, rng))]


def laid_out_task(task: SearchTask, layouts: Layouts) -> SearchTask:
    if not layouts:
        return task
    return SearchTask(lay_out(task.dag, layouts), task.target, task.hw, desc=task.desc)


@dataclass(frozen=True)
class LayoutTrial:
    layouts: Layouts
    best_cost: float  # seconds; inf when nothing measured ran
    trials: int  # measured for this layout


class AltPolicy(SearchPolicy):
    """ALT's search of `task` (module docstring): `layouts` candidates from `template`, `joint_trials` in the joint
    stage (default 8 per layout) spread by `exploration`, after `own_lead` trials of the task's own layout (the
    layouts then compete with a tuned program, and a task the scheduler gives few trials is tuned as Ansor would),
    the other layouts measured only where the cost model predicts them within `screen` of the own layout (None: all
    measured); the other options are SketchPolicy's, for the search of every layout's loops (they share
    `cost_model`)."""

    def __init__(self, task: SearchTask, cost_model: CostModel | None = None, seed: int = 0, *,
                 skips: Skips | None = None, layouts: int = 4, joint_trials: int | None = None,
                 template: str = "tiling", exploration: str = "uniform", own_lead: int = OWN_LEAD,
                 screen: float | None = SCREEN, **knobs: Any) -> None:
        if layouts < 1 or template not in LAYOUT_TEMPLATES or exploration not in EXPLORATIONS \
                or (joint_trials is not None and joint_trials < 0) or own_lead < 0 \
                or (screen is not None and not screen >= 0):
            raise TuneError(f"bad ALT options (layouts={layouts}, joint_trials={joint_trials}, template={template!r}, "
                            f"exploration={exploration!r}, own_lead={own_lead}, screen={screen}): need layouts >= 1, "
                            f"joint_trials >= 0, own_lead >= 0, screen >= 0 or None, a template of "
                            f"{sorted(LAYOUT_TEMPLATES)} and an exploration of {EXPLORATIONS}")
        self.task, self.exploration = task, exploration
        self.screen = screen
        self.screened_out: list[int] = []  # the layouts the cost model kept from being measured
        self.knobs = knobs
        self.cost_model, self.seed, self.skips = cost_model, seed, skips
        self.rng = np.random.default_rng(seed)
        self.template = LAYOUT_TEMPLATES[template]
        self.space = self.template.space(task.dag)
        self.candidates: list[Layouts] = []
        self.genes: list[dict[str, int] | None] = []  # the template's tiles of each candidate (None: its own)
        self.variants: list[SearchTask] = []
        self.searches: list[SketchPolicy] = []
        self.index: dict[str, int] = {}
        self.assigned: list[int] = []  # trials each candidate is to have by the end of this rung
        self.proposed: list[int] = []
        self.measured: list[int] = []
        self.best: list[float] = []
        for genes in [None, *sampled_tiles(self.space, self.template, task, layouts - 1, self.rng)]:
            self._add(genes)
        count = len(self.candidates)
        joint = max(count, JOINT_TRIALS_PER_LAYOUT * count if joint_trials is None else joint_trials)
        self.rungs = [max(1, joint // count // GENERATIONS)] * GENERATIONS if exploration == "evolve" \
            else exploration_rungs(count, joint, exploration)
        model = self.searches[0].cost_model  # screening compares scores of one model, shared by every layout
        self.screened = screen is None or count == 1 or any(search.cost_model is not model for search in self.searches)
        self.opened = False  # whether the other layouts' searches were seeded (and screened)
        self.rung, self.alive = 0, list(range(count))
        self.assigned = [self.rungs[0]] * count
        self.assigned[0] += own_lead

    def _add(self, genes: dict[str, int] | None) -> int | None:
        """A new candidate with the template's `genes` (None: the task's own layout); None if it is known."""
        layouts = self.template.layouts(self.task.dag, genes) if genes is not None else {}
        if layout_key(layouts) in self.index:
            return None
        variant = laid_out_task(self.task, layouts)
        self.index[layout_key(layouts)] = len(self.candidates)
        self.candidates.append(layouts)
        self.genes.append(genes)
        self.variants.append(variant)
        self.searches.append(SketchPolicy.from_options(variant, self.cost_model, self.seed, skips=self.skips,
                                                       **self.knobs))
        for counts, start in ((self.assigned, 0), (self.proposed, 0), (self.measured, 0), (self.best, math.inf)):
            counts.append(start)
        return len(self.candidates) - 1

    # ---- proposing --------------------------------------------------------------------------

    @property
    def joint(self) -> bool:
        return self.rung < len(self.rungs)

    def _short(self) -> list[int]:
        """The alive layouts short of this rung's trials."""
        return [i for i in self.alive if self.proposed[i] < self.assigned[i]]

    def _next_rung(self) -> None:
        """Rank the alive layouts by their best program: the better half goes on ("halving"; "evolve": and the
        other half is replaced by mutants of it, one tile each), or all ("uniform": one rung)."""
        self.rung += 1
        if not self.joint:
            return
        ranked = sorted(self.alive, key=lambda i: self.best[i])
        kept = ranked[:max(1, len(ranked) // 2)]
        children = []
        if self.exploration == "evolve" and self.space is not None:
            for k in range(len(ranked) - len(kept)):
                parent = self.genes[kept[k % len(kept)]]
                genes = self.space.mutate(parent, self.rng) if parent is not None else self.space.sample(self.rng)
                child = self._add(genes)
                if child is not None:
                    children.append(child)
        self.alive = kept + children
        for i in self.alive:
            self.assigned[i] = self.proposed[i] + self.rungs[self.rung]

    def _candidate(self) -> int:
        """The layout whose search proposes next: an alive one short of the rung's trials (the other layouts
        seeded and screened first, once the own layout's are proposed), else (the rung done) the next rung's first,
        else the best layout (the loop-only stage, which samples as a plain search)."""
        while self.joint:
            short = self._short()
            if short and short[0] != 0 and not self.opened:
                self._open()
                continue
            if short:
                return short[0]
            self._next_rung()
        return self.chosen

    def _open(self) -> None:
        """Open the joint stage to the other layouts: each layout's search starts from the own layout's best loops
        where they replay over its DAG (a layout of the operands only keeps the loop nest: the layouts then compete
        at the same loops, not a tuned program against random ones); then the screen (`screen`)."""
        self.opened = True
        rivals = [i for i in self.alive if i != 0]
        own_best = self.searches[0].best_measured(SEEDS)
        seeds = {i: self._replayed(i, own_best) for i in rivals}
        for i in rivals:
            self.searches[i].offer(seeds[i])
        if self.screened:
            return
        self.screened = True
        if not rivals or not self.searches[0].cost_model.trained:
            return
        own = self._predicted_best(0, own_best)
        if not (np.isfinite(own) and own > 0):  # no scale to compare against
            return
        for i in rivals:
            if self._predicted_best(i, seeds[i]) < self.screen * own:
                self.alive.remove(i)
                self.assigned[i] = self.proposed[i]
                self.screened_out.append(i)

    def _replayed(self, i: int, states: Sequence[State]) -> list[State]:
        """The loops of `states` (programs of the own layout) over layout i's DAG, where they replay."""
        out = []
        for state in states:
            try:
                out.append(State.replay(self.variants[i].dag, loop_steps(state)))
            except TensorgenError:
                continue
        return out

    def _predicted_best(self, i: int, seeds: Sequence[State]) -> float:
        """The cost model's best score among `seeds` and a batch of random programs of layout i (no evolution: the
        screen costs one batch's sampling and scoring per layout, once per task)."""
        search = self.searches[i]
        init = search.evolution.sample(search.config.samples) + list(seeds)
        return float(np.max(search.evolution.score(init))) if init else -math.inf

    @property
    def chosen(self) -> int:
        return min(range(len(self.candidates)), key=lambda i: (self.best[i], i))

    def next_batch(self, n: int) -> list[State]:
        out: list[State] = []
        while len(out) < n:
            if out and self.joint and (not self._short() or (not self.screened and self._short()[0] != 0)):
                break  # the next rung ranks the layouts by what this batch measures; the screen learns from it
            i = self._candidate()
            want = min(n - len(out), self.assigned[i] - self.proposed[i]) if self.joint else n - len(out)
            batch = self.searches[i].next_batch(want)
            if not batch:  # this layout's space is exhausted
                if not self.joint:
                    break
                self.proposed[i] = self.assigned[i]
                continue
            self.proposed[i] += len(batch)
            out += [with_layouts(self.task.dag, self.candidates[i], s) for s in batch]
        return out

    def offer(self, states: Sequence[State]) -> None:
        routed: dict[int, list[State]] = {}
        for state in states:
            i, loops = self._route(state)
            if i is not None:
                routed.setdefault(i, []).append(loops)
        for i, loops in routed.items():
            self.searches[i].offer(loops)

    def close(self) -> None:
        for search in self.searches:
            search.close()

    # ---- learning ---------------------------------------------------------------------------

    def _route(self, state: State) -> tuple[int | None, State]:
        """The layout of the task's `state` and its loops as a state of that layout's DAG (None: none of ours)."""
        i = self.index.get(layout_key(state_layouts(state)))
        if i is None:
            return None, state
        return i, State.replay(self.variants[i].dag, loop_steps(state))

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        routed: dict[int, tuple[list[MeasureInput], list[MeasureResult]]] = {}
        for inp, res in zip(inputs, results):
            i, loops = self._route(inp.state)
            if i is None:
                continue
            ins, outs = routed.setdefault(i, ([], []))
            ins.append(MeasureInput(self.variants[i], loops))
            outs.append(res)
            self.measured[i] += 1
            self.proposed[i] = max(self.proposed[i], self.measured[i])  # records replayed on resume count
            if res.ok:
                self.best[i] = min(self.best[i], res.median_cost)
        for i, (ins, outs) in routed.items():
            self.searches[i].update(ins, outs)

    def explored(self) -> list[LayoutTrial]:
        return [LayoutTrial(c, self.best[i], self.measured[i]) for i, c in enumerate(self.candidates)]

    def __repr__(self) -> str:
        stage = f"joint rung {self.rung + 1}/{len(self.rungs)}" if self.joint else "loop-only"
        return f"AltPolicy({self.task}, {len(self.candidates)} layouts, {stage})"
