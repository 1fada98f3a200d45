"""The extension points of tuning by name, in one place: search policies, cost models, builders and runners.

Every name the Python API (`tune(policy="ansor", cost_model="xgb")`, `TaskScheduler.tune`) and the `tensorgen`
command accept resolves here. Add your own without touching this module:

    from tensorgen.tuning.registry import COST_MODELS, POLICIES
    POLICIES.register("mine", MyPolicy)       # MyPolicy(task, *, cost_model, seed, skips, **options)
    COST_MODELS.register("mine", MyModel)     # MyModel(*, seed)

A policy factory is called with the task, the session's cost model (policies that learn nothing ignore it), a
seed and the Skips counter of failed search operations, then the user's `policy_options`. The task-scheduling
strategies are registered in tuning.scheduler (STRATEGIES), next to the scheduler they drive, and the search
spaces in search.sketch (SPACES), next to the sketch generation.
"""

from __future__ import annotations

from typing import Any

from tensorgen.costmodel.base import CostModel, RandomModel
from tensorgen.costmodel.pacm import PaCM
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.errors import TuneError
from tensorgen.measure.builder import Builder, LocalBuilder
from tensorgen.measure.ray import RayBuilder, RayRunner
from tensorgen.measure.runner import LocalRunner, Runner
from tensorgen.registry import Registry
from tensorgen.search.alt_policy import AltPolicy
from tensorgen.search.autotvm.tuner import AutoTVMPolicy
from tensorgen.search.policy import SearchPolicy
from tensorgen.search.pruner_policy import PrunerPolicy
from tensorgen.search.random_policy import RandomPolicy
from tensorgen.search.sketch_policy import SketchPolicy

POLICIES: Registry[SearchPolicy] = Registry("search policy", TuneError)
POLICIES.register("ansor", SketchPolicy.from_options)
POLICIES.register("random", RandomPolicy)
POLICIES.register("alt", AltPolicy)  # ALT's joint layout + loop search (search.alt_policy)
POLICIES.register("pruner", PrunerPolicy.from_options)  # Pruner's draft-then-verify (search.pruner_policy)
POLICIES.register("autotvm", AutoTVMPolicy.from_options)  # AutoTVM's templates + annealing (search.autotvm)

COST_MODELS: Registry[CostModel] = Registry("cost model", TuneError)
COST_MODELS.register("xgb", XGBModel)
COST_MODELS.register("random", RandomModel)
COST_MODELS.register("pacm", PaCM)  # Pruner's pattern-aware model; "pacm:FILE" starts from a pretrained one

BUILDERS: Registry[Builder] = Registry("builder", TuneError)
BUILDERS.register("local", LocalBuilder)
BUILDERS.register("ray", RayBuilder)  # on the Ray cluster the ray runner connects to (measure.ray)

SLOW_FACTOR = 20.0  # the local runner kills candidates this many times slower than the fastest so far
GIVE_UP_FACTOR = 4.0  # ... and times those this many times slower by their first call


def local_runner(timeout: float = 10.0, **options: Any) -> LocalRunner:
    """LocalRunner with tuning's settings (see tuning.tune.MeasureConfig); `options` change LocalRunner's fields."""
    settings = {"number": 1, "repeat": 3, "min_repeat_ms": 10.0, "check_correctness": True,
                "give_up_factor": GIVE_UP_FACTOR, "timeout_factor": SLOW_FACTOR, **options}
    return (RayRunner if "address" in options else LocalRunner)(timeout=timeout, **settings)


def ray_runner(address: str, timeout: float = 10.0, **options: Any) -> RayRunner:
    """local_runner's settings, measured on the nodes of the Ray cluster at `address` (measure.ray.RayRunner)."""
    return local_runner(timeout, address=address, **options)  # type: ignore[return-value]


RUNNERS: Registry[Runner] = Registry("runner", TuneError)
RUNNERS.register("local", local_runner)
RUNNERS.register("ray", ray_runner)
