"""The schedule fuzzer (tests/fuzz_schedules.py) on fixed seeds, and the bugs it found, each kept as the
smallest program that showed it. `python bench/fuzz.py --schedules --minutes N` runs it longer."""

from __future__ import annotations

import pytest
from fuzz_schedules import check_schedule

SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_schedules_raise_schedule_error_or_compute_the_dag(seed):
    outcome = check_schedule(seed)
    assert outcome.failure is None, f"{outcome.stage}:\n{outcome.program}\n{outcome.failure}"


def test_the_fuzzer_applies_and_rejects_steps():
    """Over the seeds, most steps are applied and some are rejected: the fuzz reaches both outcomes."""
    outcomes = [check_schedule(seed) for seed in range(8)]
    assert sum(o.rejected for o in outcomes) > 0
    assert sum(o.program.count("\ns.") for o in outcomes) > 8 * 2

