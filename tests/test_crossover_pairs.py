"""Node-based crossover meets any two programs of a task: those of one sketch, those of different sketches, and
programs made from a sketch the task's own list lacks (adapted from a similar task, read from a database)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from search_tasks import c2d_relu, gmm, make_task

from tensorgen.costmodel import RandomModel
from tensorgen.errors import ScheduleError
from tensorgen.schedule.packing import PackLayoutStep
from tensorgen.schedule.state import State
from tensorgen.search.annotate import is_valid, sample_state
from tensorgen.search.crossover import crossover, match_sketch, step_owners
from tensorgen.search.evolution import EvolutionarySearch, EvolutionConfig
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.transfer import transfer_candidates
from tensorgen.te import ops


class EvolvingRandomModel(RandomModel):
    trained = True


def _packed_donor_and_unpacked_task():
    """GMM 64 on a machine where its B is packed (rules.PackOperand) and GMM 16 on the same machine, whose B
    fits: the same structure, so GMM 64's programs transfer to GMM 16, but GMM 16 has no pack sketches."""
    donor = gmm(64)
    task = make_task(*ops.make_gmm(16, 16, 16), l2_bytes=donor.hw.l2_bytes)
    return donor, task


def _samples(task, sketches, n, seed):
    rng, out = np.random.default_rng(seed), []
    while len(out) < n:
        try:
            out.append(sample_state(task, sketches[int(rng.integers(len(sketches)))], rng))
        except ScheduleError:  # a sample the sketch cannot complete: draw another
            continue
    return out


DONOR, TASK = _packed_donor_and_unpacked_task()
DONOR_SKETCHES, SKETCHES = generate_sketches(DONOR), generate_sketches(TASK)
PACKED = _samples(DONOR, [k for k in DONOR_SKETCHES if isinstance(k.steps[-1], PackLayoutStep)], 12, 1)
ADAPTED = transfer_candidates(TASK.dag, [(s, 1.0) for s in PACKED], limit=12)
NATIVE = _samples(TASK, SKETCHES, 24, 2)


def test_programs_with_a_stage_past_the_sketch_match_no_sketch():
    assert not any(isinstance(k.steps[-1], PackLayoutStep) for k in SKETCHES)
    assert ADAPTED and all(len(s.stages) > len(SKETCHES[0].stages) for s in ADAPTED)
    assert all(match_sketch(s, SKETCHES) is None for s in ADAPTED)
    assert all(match_sketch(s, SKETCHES) is not None for s in NATIVE)


def test_evolution_crosses_transferred_packed_programs_without_failing():
    """Regression (issue 22, an ASPP head's dilated convs): a seed adapted from a task with packing extends one of
    the task's sketches by a pack stage; crossing it with a program of that sketch indexed one parent's stage
    names with the other's stage ids (IndexError in a search worker, EOFError out of `tensorgen tune`)."""
    evo = EvolutionarySearch(TASK, EvolvingRandomModel(0), rng=np.random.default_rng(3),
                             config=EvolutionConfig(population=48, generations=2, crossover_prob=1.0,
                                                    mutation_prob=0.0),
                             sketches=SKETCHES)
    best = evo.search(NATIVE + ADAPTED * 2, 8)
    assert best and all(is_valid(s) for s in best)
    assert sum(g.crossed for g in evo.history) > 0


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
POOLS = {"gmm16+transferred": (TASK, SKETCHES, NATIVE + ADAPTED)}


def _pool(name: str):
    if name not in POOLS:
        task = c2d_relu()
        sketches = generate_sketches(task)
        POOLS[name] = task, sketches, _samples(task, sketches, 24, 4)
    return POOLS[name]


@SETTINGS
@given(name=st.sampled_from(["gmm16+transferred", "c2d_relu"]), i=st.integers(0, 10**6), j=st.integers(0, 10**6),
       seed=st.integers(0, 2**32 - 1))
def test_crossover_of_any_two_programs_is_a_program_or_none(name, i, j, seed):
    task, sketches, pool = _pool(name)
    a, b = pool[i % len(pool)], pool[j % len(pool)]
    k = match_sketch(a, sketches)
    if k is None:  # crossover is asked about parents of a sketch of the task's own
        a, b = b, a
        k = match_sketch(a, sketches)
    if k is None:
        return
    child = crossover(task, a, b, len(sketches[k].steps), step_owners(sketches[k]), np.random.default_rng(seed))
    assert child is None or (isinstance(child, State) and child.dag is task.dag)
    if child is not None:
        assert set(child.steps) <= set(a.steps) | set(b.steps)
