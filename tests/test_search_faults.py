"""A search that survives its own bugs: an operation that raises (sketch rule, mutation, crossover, cost model)
or a search worker that dies is skipped, counted in the summary, and tuning goes on. Real rules, models and
worker processes, injected through the registries and constructor parameters."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
from search_tasks import gmm

from tensorgen.costmodel import RandomModel
from tensorgen.dag import ComputeDAG
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.search.annotate import AnnotationPolicy, sample_initial_population
from tensorgen.search.evolution import EvolutionarySearch, EvolutionConfig
from tensorgen.search.mutations import DEFAULT_MUTATIONS, Mutation
from tensorgen.search.rules import DEFAULT_RULES, Cond, SketchRule, with_rule
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.skips import Skips
from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.tune import MeasureConfig, make_task, tune

SMALL = {"population": 64, "generations": 1, "init_population": 32, "workers": 1}


class EvolvingRandomModel(RandomModel):
    """Random scores the policy takes as informative, so that the evolution runs from the first batch."""

    trained = True


class BrokenMutation(Mutation):
    name = "broken_mutation"

    def applicable(self, task, state):
        return True

    def apply(self, task, state, rng):
        raise RuntimeError("a bug in a mutation rule")


class BrokenRule(SketchRule):
    name = "broken_rule"

    def condition(self, task, state, i):
        return Cond.APPLY

    def apply(self, task, state, i):
        raise KeyError("a bug in a sketch rule")


class BrokenModel(EvolvingRandomModel):
    def update(self, features, throughputs, groups=None):
        raise ValueError("a bug in the cost model's update")

    def predict(self, features):
        raise FloatingPointError("a bug in the cost model's prediction")


class BrokenAnnotation(AnnotationPolicy):
    def factorizations(self, extent, n, inner_to_outer=True):
        raise ZeroDivisionError("a bug in random annotation")


class BatchShyExtractor(FeatureExtractor):
    """Fails on every batch of more than one program: each is then extracted on its own."""

    def extract(self, states):
        if len(states) > 1:
            raise RuntimeError("a bug in batched feature extraction")
        return super().extract(states)


@pytest.fixture(scope="module")
def task():
    inputs, outputs = make_gmm(32, 32, 32)
    return make_task(ComputeDAG(inputs + outputs))


def _tune(task, **kw):
    options = {**SMALL, **kw.pop("policy_options", {})}
    return tune(task, trials=8, batch_size=8, measure=MeasureConfig(run_timeout=5.0), policy_options=options,
                cost_model=kw.pop("cost_model", EvolvingRandomModel(0)), **kw)


def test_a_failing_mutation_rule_is_skipped_and_counted(task):
    result = _tune(task, policy_options={"mutations": [*DEFAULT_MUTATIONS, BrokenMutation(weight=50.0)]})
    assert result.trials == 8 and result.best_state is not None
    assert result.skipped.get("mutation", 0) > 0


def test_a_failing_sketch_rule_is_skipped_and_the_other_rules_still_make_sketches(task):
    plain = generate_sketches(task)
    rules = with_rule(BrokenRule(), before="always_inline")
    skips = Skips()
    assert [s.to_json() for s in generate_sketches(task, rules, skips=skips)] == [s.to_json() for s in plain]
    assert skips.counts["sketch rule"] > 0
    result = _tune(task, policy_options={"rules": rules})
    assert not any(isinstance(r, BrokenRule) for r in DEFAULT_RULES)
    assert result.trials == 8 and result.skipped.get("sketch rule", 0) > 0


def test_a_failing_cost_model_is_skipped_and_tuning_goes_on(task, caplog):
    result = _tune(task, cost_model=BrokenModel(0))
    assert result.trials == 8 and result.best_state is not None
    assert result.skipped.get("cost model predict", 0) > 0 and result.skipped.get("cost model update", 0) > 0
    logged = [r.getMessage() for r in caplog.records if "cost model update" in r.getMessage()]
    assert len(logged) == 1 and "BrokenModel" in logged[0] and "a bug in the cost model" in logged[0]


def test_failing_random_annotation_is_counted_and_tuning_ends_cleanly(task):
    result = tune(task, trials=4, batch_size=4, policy="random", policy_options={"annotation": BrokenAnnotation()})
    assert result.trials == 0 and result.skipped.get("random annotation", 0) > 0


def test_failing_feature_extraction_falls_back_to_one_program_at_a_time(task):
    result = _tune(task, policy_options={"extractor": BatchShyExtractor(task.hw)})
    assert result.trials == 8 and result.skipped.get("feature extraction", 0) > 0


def test_tune_cli_summary_lists_the_skips(task):
    from tensorgen.cli.tune import summary_table

    result = _tune(task, cost_model=BrokenModel(0))
    line = next(r for r in summary_table(result, "x.db").splitlines() if r.startswith("skipped"))
    assert "cost model update" in line and "cost model predict" in line


# ---------------------------------------------------------------------------------------------
# search workers


class ExitInWorker(Mutation):
    """Ends the process it runs in when that is not the search process: a search worker that dies mid-job."""

    name = "exit_in_worker"

    def __init__(self, parent: int):
        super().__init__(weight=1.0)
        self.parent = parent

    def applicable(self, task, state):
        return True

    def apply(self, task, state, rng):
        if os.getpid() != self.parent:
            os._exit(3)
        return None


def _evolution(workers: int, mutations=None, skips=None) -> EvolutionarySearch:
    t = gmm()
    return EvolutionarySearch(t, EvolvingRandomModel(0), rng=np.random.default_rng(7),
                              config=EvolutionConfig(population=96, generations=2), workers=workers,
                              mutations=mutations, skips=skips)


def _init(evo: EvolutionarySearch):
    return sample_initial_population(evo.task, evo.maker.sketches, 24, np.random.default_rng(1))


def test_a_killed_search_worker_is_restarted_and_the_children_are_the_same():
    reference = _evolution(1)
    init = _init(reference)
    want = [[s.steps for s in reference.search(init, 8)] for _ in range(2)]
    evo = _evolution(2)
    try:
        first = [s.steps for s in evo.search(init, 8)]
        assert evo._pool is not None
        victim = evo._pool.procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(timeout=5)
        second = [s.steps for s in evo.search(init, 8)]
        assert [first, second] == want
        assert evo.maker.skips.counts["search worker"] == 1
        assert all(p.is_alive() for p in evo._pool.procs) and victim not in evo._pool.procs
    finally:
        evo.close()


def test_a_worker_dying_mid_job_has_its_jobs_made_in_the_search_process():
    skips = Skips()
    evo = _evolution(2, mutations=[*DEFAULT_MUTATIONS, ExitInWorker(os.getpid())], skips=skips)
    try:
        best = evo.search(_init(evo), 8)
        assert best and skips.counts["search worker"] >= 2  # every worker died at least once
        assert all(p.is_alive() for p in evo._pool.procs)
    finally:
        evo.close()
