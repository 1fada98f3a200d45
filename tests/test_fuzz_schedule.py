"""The schedule fuzzer (tests/fuzz_schedules.py) on fixed seeds, and the bugs it found, each kept as the
smallest program that showed it. `python bench/fuzz.py --schedules --minutes N` runs it longer."""

from __future__ import annotations

import numpy as np
import pytest
from fuzz_schedules import check_schedule

from tensorgen import State, build, te

SEEDS = range(30)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_schedules_raise_schedule_error_or_compute_the_dag(seed):
    outcome = check_schedule(seed)
    assert outcome.failure is None, f"{outcome.stage}:\n{outcome.program}\n{outcome.failure}"


def test_the_fuzzer_applies_and_rejects_steps():
    """Over the seeds, most steps are applied and some are rejected: the fuzz reaches both outcomes."""
    outcomes = [check_schedule(seed) for seed in range(8)]
    assert sum(o.rejected for o in outcomes) > 0
    assert sum(o.applied for o in outcomes) > sum(o.rejected for o in outcomes) / 2


def test_sigmoid_of_a_sum_negates_the_whole_sum():
    """The C of sigmoid(x) was `1 / (1 + exp(-x))` with x pasted in: exp(-a * 0.5 + b) for x = a * 0.5 + b."""
    a = te.placeholder((4,), name="a")
    b = te.placeholder((4,), name="b")
    y = te.compute((4,), lambda i: te.sigmoid(a[i] * 0.5 + b[i]), name="y")
    xa, xb = np.linspace(-1, 1, 4, dtype=np.float32), np.linspace(2, -2, 4, dtype=np.float32)
    (got,) = build(State([a, b, y])).run(xa, xb)
    np.testing.assert_allclose(got, 1 / (1 + np.exp(-(xa * 0.5 + xb))), rtol=1e-6)
