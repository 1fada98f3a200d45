"""Schedule transfer: programs adapted from a task of the same structure are valid and correct on the new one."""

import math

import numpy as np
import pytest
from reference import conv
from search_tasks import make_task

from tensorgen import build
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import SplitStep
from tensorgen.search.annotate import sample_initial_population
from tensorgen.search.sketch import generate_sketches
from tensorgen.search.sketch_policy import SketchPolicy
from tensorgen.search.transfer import adapt, refit_lengths, structure_key, transfer_candidates
from tensorgen.te import ops


def c2d_relu(h, ci, co, kernel=3, stride=1):
    ins, (out,) = ops.make_c2d(h, h, ci, co, kernel, stride, kernel // 2)
    return make_task(ins, [ops.relu(out)], cores=2)


@pytest.mark.parametrize("extent, lengths", [(56, (1, 4, 7)), (28, (2, 8, 16)), (7, (1, 4, 16)), (64, (3, 5, 1)),
                                             (1, (4, 4))])
def test_refit_tiles_the_new_extent(extent, lengths):
    out = refit_lengths(extent, lengths)
    assert extent % math.prod(out) == 0 and len(out) == len(lengths)


def test_refit_keeps_what_fits_and_fits_the_innermost_first():
    assert refit_lengths(112, (2, 4, 7)) == (2, 4, 7)  # 56 | 112: unchanged
    assert refit_lengths(28, (1, 4, 8)) == (1, 4, 7)  # the vector length moves least: 8 -> 7, then 4 stays
    assert refit_lengths(64, (4, 16), inner_to_outer=False) == (4, 16)


def test_adapted_programs_are_valid_and_correct_on_the_new_shapes():
    donor, target = c2d_relu(8, 16, 32), c2d_relu(14, 8, 24)
    assert structure_key(donor.dag) == structure_key(target.dag)
    states = sample_initial_population(donor, generate_sketches(donor), 12, np.random.default_rng(1))
    adapted = [adapt(s, target.dag) for s in states]
    assert sum(a is not None for a in adapted) >= 10  # same sketches: (nearly) every program carries over
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 14, 14, 8)).astype(np.float32)
    w = rng.standard_normal((3, 3, 8, 24)).astype(np.float32)
    expected = np.maximum(conv(x, w, padding=1), 0)
    for a in [a for a in adapted if a is not None][:3]:
        assert a.dag is target.dag
        for step in a.steps:
            if isinstance(step, SplitStep) and step.extent:
                assert step.extent % math.prod(step.lengths) == 0  # perfect tiles, as the search samples them
        np.testing.assert_allclose(build(a).run(x, w)[0], expected, rtol=1e-4, atol=1e-4)


def test_other_structures_do_not_adapt():
    gmm = make_task(*ops.make_gmm(32, 32, 32))
    conv_task = c2d_relu(8, 16, 16)
    state = sample_initial_population(gmm, generate_sketches(gmm), 1, np.random.default_rng(0))[0]
    assert adapt(state, conv_task.dag) is None
    assert transfer_candidates(conv_task.dag, [(state, 1e9)]) == []
    assert adapt(state, gmm.dag) is state


def test_candidates_come_from_the_closest_donor_first():
    target = c2d_relu(14, 16, 16)
    near, far = c2d_relu(14, 16, 32), c2d_relu(8, 8, 8)
    donors = []
    for task, speed in ((far, 9e9), (near, 1e9)):
        donors.append((sample_initial_population(task, generate_sketches(task), 1, np.random.default_rng(2))[0],
                       speed))
    out = transfer_candidates(target.dag, donors, limit=1)
    assert len(out) == 1 and out[0].to_json() == adapt(donors[1][0], target.dag).to_json()


def test_offered_programs_are_measured_first_and_once():
    donor, target = c2d_relu(8, 16, 32), c2d_relu(14, 8, 24)
    states = sample_initial_population(donor, generate_sketches(donor), 6, np.random.default_rng(3))
    offered = [a for a in (adapt(s, target.dag) for s in states) if a is not None][:3]
    policy = SketchPolicy.from_options(target, seed=0, population=32, generations=1, init_population=16, workers=1)
    policy.offer(offered + offered[:1])
    batch = policy.next_batch(8)
    keys = [s.to_json() for s in batch]
    assert keys[:len(offered)] == [s.to_json() for s in offered] and len(set(keys)) == len(keys) == 8
    policy.offer(offered)  # already proposed: never again
    assert not {s.to_json() for s in policy.next_batch(8)} & set(keys)


def test_scheduler_offers_the_best_program_of_a_similar_task():
    from test_scheduler import FakeTuner

    from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler

    tasks = [c2d_relu(8, 16, 32), c2d_relu(14, 8, 24), make_task(*ops.make_gmm(16, 16, 16))]
    best = sample_initial_population(tasks[0], generate_sketches(tasks[0]), 1, np.random.default_rng(4))[0]

    class Offered(FakeTuner):
        def __init__(self, task, state=None):
            super().__init__(task, lambda r: 1e-3)
            self.best_state, self.offers = state, []

        def offer(self, states):
            self.offers.append(list(states))

    tuners = [Offered(tasks[0], best), Offered(tasks[1]), Offered(tasks[2])]
    for transfer in (True, False):
        for t in tuners[1:]:
            t.offers.clear()
        config = SchedulerConfig(round_trials=4, transfer=transfer, strategy="round-robin")
        TaskScheduler(tasks, config=config).run(tuners, 12)
        if transfer:
            (first, *rest) = tuners[1].offers
            assert [s.to_json() for s in first] == [adapt(best, tasks[1].dag).to_json()]
            assert rest == []  # the donor's best did not change: offered once
            assert all(not o for o in tuners[2].offers)  # a GMM gets nothing from convs
        else:
            assert not tuners[1].offers and not tuners[2].offers


def test_state_json_of_adapted_program_replays():
    donor, target = c2d_relu(8, 16, 32), c2d_relu(14, 8, 24)
    state = sample_initial_population(donor, generate_sketches(donor), 1, np.random.default_rng(5))[0]
    adapted = adapt(state, target.dag)
    assert State.from_json(target.dag, adapted.to_json()) == adapted
