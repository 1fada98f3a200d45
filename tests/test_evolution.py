"""Evolutionary search (Ansor §5.1): mutation rules, node-based crossover, the evolution loop, SketchPolicy.

Mutated and crossed programs must stay valid programs of the same computation, so every result is
lowered and a sample of them is compiled and compared against the naive program.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm

from tensorgen.build import build
from tensorgen.costmodel import RandomModel
from tensorgen.errors import TuneError
from tensorgen.features.extractor import FeatureExtractor
from tensorgen.features.layout import INDEX
from tensorgen.measure.types import ErrorKind, MeasureInput, MeasureResult
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import ComputeAtStep, PragmaStep, SplitStep
from tensorgen.search.annotate import is_valid, sample_initial_population
from tensorgen.search.crossover import crossover, match_sketch, step_owners
from tensorgen.search.evolution import EvolutionarySearch, EvolutionConfig
from tensorgen.search.mutations import (
    DEFAULT_MUTATIONS,
    ComputeLocationMutation,
    ParallelMutation,
    PragmaMutation,
    TileSizeMutation,
    mutate,
)
from tensorgen.search.policy import state_key
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.sketch_policy import MIN_GENERATION, SketchConfig, SketchPolicy
from tensorgen.task import SearchTask

TASKS = {"gmm": gmm, "c2d_relu": c2d_relu}
_CACHE: dict[str, tuple[SearchTask, list[State], list[State]]] = {}


class EvolvingRandomModel(RandomModel):
    """Random scores the policy takes as informative, so that these tests exercise the evolution."""

    trained = True


def setup(name: str) -> tuple[SearchTask, list[State], list[State]]:
    """(task, sketches, a 24-state random population), shared by the tests of one module run."""
    if name not in _CACHE:
        task = TASKS[name]()
        sketches = generate_sketches(task)
        _CACHE[name] = task, sketches, sample_initial_population(task, sketches, 24, np.random.default_rng(11))
    return _CACHE[name]


def check_same_program(task: SearchTask, states: list[State]) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.random(t.shape, dtype=np.float32) for t in task.dag.inputs]
    expected = build(State(task.dag)).run(*inputs)
    for s in states:
        for got, want in zip(build(s).run(*inputs), expected):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(s))


class VecModel:
    """Synthetic cost model: longer vectorized innermost loops are better (sum of log vector lengths)."""

    def update(self, features, throughputs, groups=None) -> None:
        pass

    def predict(self, features) -> np.ndarray:
        return np.array([float(f[:, INDEX["vec_len"]].sum()) if len(f) else 0.0 for f in features])


# ---------------------------------------------------------------------------------------------
# mutations


@pytest.mark.parametrize("name", sorted(TASKS))
@pytest.mark.parametrize("rule", DEFAULT_MUTATIONS, ids=lambda r: r.name)
def test_mutation_keeps_programs_valid(name, rule):
    task, _, pop = setup(name)
    rng = np.random.default_rng(1)
    applicable = [s for s in pop if rule.applicable(task, s)]
    pairs = [(m, s) for s in applicable if (m := rule.apply(task, s, rng)) is not None]
    if name == "gmm" and isinstance(rule, ComputeLocationMutation):  # GMM's only flexible stage
        assert all(s.stage("B_packed").location != "inline" for s in applicable)
    assert len(applicable) >= len(pop) // 4 and len(pairs) >= len(applicable) // 2, \
        f"{rule.name} failed too often on {name}"
    assert all(is_valid(m) and m.steps != s.steps for m, s in pairs)
    check_same_program(task, [m for m, _ in pairs[:2]])


def test_tile_size_mutation_keeps_products_and_bounds():
    task, _, pop = setup("c2d_relu")
    rule, rng = TileSizeMutation(), np.random.default_rng(2)
    changed = 0
    mutated = [(s, m) for s in pop if (m := rule.apply(task, s, rng)) is not None]
    assert len(mutated) >= len(pop) - 2  # None: every factor would leave the parallel loop
    for s, m in mutated:
        for old, new in zip(s.steps, m.steps):
            assert type(old) is type(new)
            if isinstance(new, SplitStep):
                assert new.extent % math.prod(new.lengths) == 0 and new.lengths[-1] <= rule.policy.max_innermost
                changed += old.lengths != new.lengths
        assert sum(isinstance(a, SplitStep) and a != b for a, b in zip(s.steps, m.steps)) == 1
    assert changed == len(mutated)


def test_parallel_pragma_and_location_mutations_change_their_decision():
    task, _, pop = setup("c2d_relu")
    rng = np.random.default_rng(3)
    for s in pop[:8]:
        m = PragmaMutation().apply(task, s, rng)
        assert [st.pragma for st in m.steps if isinstance(st, PragmaStep)] != \
            [st.pragma for st in s.steps if isinstance(st, PragmaStep)]
        p = ParallelMutation().apply(task, s, rng)
        if p is not None:  # the parallel loop covers a different set of loops
            assert [it.name for st in p.stages for it in st.iters if it.annotation == "parallel"] != \
                [it.name for st in s.stages for it in st.iters if it.annotation == "parallel"]
        c = ComputeLocationMutation().apply(task, s, rng)
        if c is not None:  # pad's or the packed weight's location changed
            assert [(st.location, st.attach) for st in c.stages] != [(st.location, st.attach) for st in s.stages]


def test_mutate_picks_applicable_rules_by_weight():
    task, _, pop = setup("gmm")
    pop = [s for s in pop if not any(st.name == "B_packed" for st in s.stages)]
    rng = np.random.default_rng(4)
    names = [mutate(task, pop[n % len(pop)], rng)[1].name for n in range(200)]
    assert "compute_location" not in names  # not applicable to GMM unless B is packed
    assert names.count("tile_size") > 150 and len(set(names)) >= 2


# ---------------------------------------------------------------------------------------------
# crossover


def test_crossover_mixes_parents_and_stays_valid():
    task, sketches, pop = setup("c2d_relu")
    rng = np.random.default_rng(5)
    children = []
    for a in pop:
        for b in pop:
            k = match_sketch(a, sketches)
            if a is b or k is None or k != match_sketch(b, sketches) or a.steps == b.steps:
                continue
            c = crossover(task, a, b, len(sketches[k].steps), step_owners(sketches[k]), rng)
            if c is not None and is_valid(c):
                children.append((c, a, b))
    assert len(children) >= 20
    mixed = [(c, a, b) for c, a, b in children if c.steps not in (a.steps, b.steps)]
    assert len(mixed) >= len(children) // 3
    for c, a, b in mixed:  # every step comes from one of the parents
        assert set(c.steps) <= set(a.steps) | set(b.steps)
    check_same_program(task, [c for c, _, _ in mixed[:2]])


# ---------------------------------------------------------------------------------------------
# evolution


@pytest.mark.parametrize("crossover_prob", [0.0, 0.2])
def test_evolution_improves_predicted_fitness(crossover_prob):
    task, sketches, pop = setup("gmm")
    es = EvolutionarySearch(task, VecModel(), FeatureExtractor(task.hw), np.random.default_rng(6),
                            EvolutionConfig(population=96, generations=3, crossover_prob=crossover_prob),
                            sketches=sketches)
    best = es.search(pop, 8)
    init_scores = np.sort(es.score(pop))[::-1][:8]
    scores = es.score(best)
    assert len(best) == 8 and len({s.steps for s in best}) == 8
    assert list(scores) == sorted(scores, reverse=True)
    assert scores.mean() > init_scores.mean() + 1.0
    assert es.history[-1].best_k_mean >= es.history[0].best_k_mean
    assert sum(h.mutated for h in es.history) > 0
    assert (sum(h.crossed for h in es.history) > 0) == (crossover_prob > 0)
    excluded = es.search(pop, 8, exclude={state_key(s) for s in best})
    assert not {s.steps for s in excluded} & {s.steps for s in best}


# ---------------------------------------------------------------------------------------------
# SketchPolicy


def fake_results(states: list[State], rng: np.random.Generator) -> list[MeasureResult]:
    return [MeasureResult((float(rng.uniform(1e-4, 1e-3)),)) if n % 5 else
            MeasureResult((), ErrorKind.RUNTIME_ERROR, "boom") for n, s in enumerate(states)]


def run_policy(seed: int, rounds: int = 3) -> list[list[str]]:
    task = gmm(32)
    policy = SketchPolicy.from_options(task, EvolvingRandomModel(seed), seed=seed, population=48, generations=2,
                                       init_population=24)
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(rounds):
        batch = policy.next_batch(8)
        batches.append([state_key(s) for s in batch])
        policy.update([MeasureInput(task, s) for s in batch], fake_results(batch, rng))
    return batches


def test_sketch_policy_never_repeats_and_is_deterministic():
    a = run_policy(0)
    keys = [k for b in a for k in b]
    assert [len(b) for b in a] == [8, 8, 8] and len(set(keys)) == len(keys)
    assert run_policy(0) == a
    assert run_policy(1) != a


def test_sketch_policy_excludes_measured_states_and_seeds_from_the_best():
    task = gmm(32)
    policy = SketchPolicy.from_options(task, EvolvingRandomModel(0), population=32, generations=1, init_population=16)
    earlier = sample_initial_population(task, policy.sketches, 12, np.random.default_rng(9))
    costs = [MeasureResult((1e-3 / (n + 1),)) for n in range(len(earlier))]
    policy.update([MeasureInput(task, s) for s in earlier], costs)  # as a resumed tuner replays its database
    assert policy.best_measured(1)[0] is earlier[-1]
    batch = policy.next_batch(10)
    assert len(batch) == 10
    assert not {state_key(s) for s in batch} & {state_key(s) for s in earlier}
    assert all(is_valid(s) for s in batch)
    assert any(isinstance(st, ComputeAtStep) or isinstance(st, SplitStep) for s in batch for st in s.steps)


def test_sketch_policy_shares_one_feature_cache():
    """An empty extractor is falsy (len 0): it must still be the one the evolution uses."""
    task = gmm()
    ex = FeatureExtractor(task.hw)
    policy = SketchPolicy.from_options(task, cost_model=EvolvingRandomModel(0), extractor=ex,
                                       population=32, generations=1)
    assert policy.extractor is ex and policy.evolution.extractor is ex
    policy.next_batch(4)
    assert ex.stats["hits"] > 0 and ex.stats["misses"] == len(ex)


def test_worker_processes_make_the_same_children():
    """Each child job carries its seed: forked workers give the batch a single process gives."""
    task = gmm()
    batches = []
    for workers in (1, 2):
        policy = SketchPolicy.from_options(task, cost_model=EvolvingRandomModel(0), seed=5, population=96,
                                           generations=2, init_population=32, workers=workers)
        batches.append([s.steps for s in policy.next_batch(8)])
        assert (policy.evolution._pool is not None) == (workers > 1)
        policy.evolution.close()
    assert batches[0] == batches[1] and len(batches[0]) == 8


def test_sketch_policy_samples_without_evolving_while_the_model_is_untrained():
    """Random scores carry nothing to evolve towards (TVM's SketchPolicy skips the search too)."""
    task = gmm(32)
    policy = SketchPolicy.from_options(task, RandomModel(0), population=32, generations=2, init_population=16)
    batch = policy.next_batch(8)
    assert len(batch) == 8 and all(is_valid(s) for s in batch)
    assert policy.evolution.history == []
    informed = SketchPolicy.from_options(task, EvolvingRandomModel(0), population=32, generations=2, init_population=16)
    informed.next_batch(8)
    assert len(informed.evolution.history) == 3


def test_tile_size_mutation_never_leaves_the_parallel_loop_one_iteration():
    """Moving every factor out of the fused parallel loop would leave one core doing all the work."""
    from dataclasses import replace

    from tensorgen.search.annotate import shares_work
    from tensorgen.search.mutations import replay

    task, _, pop = setup("c2d_relu")
    rule = TileSizeMutation()
    assert all(shares_work(s) for s in pop)
    serial = 0  # children the move would make without the check
    for s in pop:
        for n in rule.candidates(s):
            lengths = rule.mutate_lengths(s.steps[n], np.random.default_rng(n))
            steps = list(s.steps)
            steps[n] = replace(steps[n], lengths=lengths)
            kid = replay(task, steps) if lengths else None
            serial += kid is not None and not shares_work(kid)
    assert serial > 0
    rng = np.random.default_rng(5)
    kids = [rule.apply(task, s, rng) for s in pop for _ in range(16)]
    assert all(shares_work(k) for k in kids if k is not None) and sum(k is not None for k in kids) > len(kids) // 2


def test_each_generation_holds_32_programs_per_measured_program_within_its_bounds():
    """Ansor's 2048 for a round of 64 measurements; a model's task round of 16 evolves 512, a small batch
    MIN_GENERATION; None keeps the configured population whatever the batch."""
    config = SketchConfig.of(population=2048)
    assert [config.generation_size(n) for n in (1, 16, 64, 200)] == [MIN_GENERATION, 512, 2048, 2048]
    assert SketchConfig.of(population=2048, population_per_trial=None).generation_size(1) == 2048
    with pytest.raises(TuneError, match="population_per_trial"):
        SketchConfig.of(population_per_trial=0)
    policy = SketchPolicy.from_options(gmm(32), EvolvingRandomModel(0), population=2048, generations=1,
                                       init_population=16, workers=1)
    policy.next_batch(9)
    assert [h.size for h in policy.evolution.history][1:] == [min(2048, 32 * 9)]
