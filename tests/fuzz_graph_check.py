"""One graph fuzz case end to end: a model from tests/fuzz_graphs.py, every task tuned a few trials with one
policy, the model built with the database, run, and compared with ONNX Runtime run node by node.

`check_model` returns a `Failure` naming the stage that failed (a failed candidate measured while tuning is
a failure too, as is an out-of-range id that runs without an error), or None. tests/test_fuzz_graph.py runs
a fixed-seed budget of it; bench/fuzz.py runs it for minutes and saves reproducers.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

# the policies a fuzz case tunes with: (tune policy name, policy_options). The Ansor policy runs a small
# evolution with crossover often, so that a few trials already mutate and cross programs.
POLICIES: dict[str, tuple[str, dict | None]] = {
    "ansor": ("ansor", {"population": 48, "generations": 2, "crossover_prob": 0.5}),
    "random": ("random", None),
    "ansor-psa": ("ansor", {"population": 48, "generations": 1, "prefilter": "psa"}),
    # ALT: two layouts a trial each (the task's own, a tiling), so the model builds follow tiled layouts too
    "alt": ("alt", {"layouts": 2, "joint_trials": 2, "own_lead": 0, "population": 48, "generations": 1}),
    # Pruner: the static analyzer drafts, the shipped PaCM (cost model "auto") verifies
    "pruner": ("pruner", {"population": 48, "generations": 1, "potential": 16, "draft_population": 48,
                          "draft_generations": 1}),
}
# measurement outcomes that say the generated program is wrong (timeouts and unknown errors may be load)
PROGRAM_ERRORS = ("instantiation", "compile_error", "runtime_error", "wrong_answer")


@dataclass
class Failure:
    """What went wrong with one model: the stage, the error (a traceback or a mismatch report)."""

    seed: int
    policy: str
    # "generate" | "import" | "tune" | "measure" | "build" | "run" | "mismatch" | "bounds" (bench/fuzz.py:
    # "crash" | "hang")
    stage: str
    error: str
    # a "measure" failure's programs as record JSON lines, replayable elsewhere (`tensorgen db import`): a wrong
    # answer that depends on timing (which candidates the search makes) is gone when the case runs again
    records: list[str] = field(default_factory=list)

    def headline(self) -> str:
        lines = [line.strip() for line in self.error.strip().splitlines() if line.strip()]
        errors = [line for line in lines if ": error: " in line]  # a compiler's first error says more than its last
        return f"seed {self.seed} [{self.policy}] {self.stage}: {(errors or lines or [''])[0 if errors else -1]}"[:400]


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    from tensorgen.graph.frontend.onnx_inputs import random_inputs

    return random_inputs(model, seed)


def validate(model: onnx.ModelProto) -> list[np.ndarray]:
    """Check the model as ONNX and return ONNX Runtime's outputs on `feeds(model)` (raises if invalid)."""
    onnx.checker.check_model(model, full_check=True)
    return onnxruntime_outputs(model, feeds(model))


def onnxruntime_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime's outputs of `model` on `inputs`, run node by node: ORT's fusions (FastGelu, ...) have rejected
    valid fuzz models, and they are not the reference."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def tensorgen_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray], workdir: Path,
                      target: str = "cpu") -> list[np.ndarray]:
    """`model` built with default schedules under `workdir` for `target`, run on `inputs`."""
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.load import load_graph
    from tensorgen.runtime.model import CompiledModel

    graph = load_graph(model)
    built = build_model(graph, workdir / "model", target=target)
    return CompiledModel(built, threads=2).run([inputs[n] for n in graph.inputs])


def compare(ours: Sequence[np.ndarray], ref: Sequence[np.ndarray], rtol: float = 1e-3) -> str | None:
    """None when every output matches ONNX Runtime's within float32 tolerance, else what differs."""
    if len(ours) != len(ref):
        return f"{len(ours)} outputs, ONNX Runtime has {len(ref)}"
    for i, (a, r) in enumerate(zip(ours, ref)):
        a, r = np.asarray(a), np.asarray(r)
        if a.shape != r.shape:
            return f"output {i}: shape {a.shape}, ONNX Runtime gives {r.shape}"
        nan = np.isnan(a) != np.isnan(r)
        if nan.any():
            k = np.argwhere(nan)[0]
            return f"output {i}: NaN at {tuple(k)} in one engine only (tensorgen {a[tuple(k)]}, ORT {r[tuple(k)]})"
        finite = np.isfinite(r)
        scale = float(np.abs(r[finite]).max()) if finite.any() else 0.0
        bad = ~np.isclose(a, r, rtol=rtol, atol=rtol * max(scale, 1e-2), equal_nan=True)
        if bad.any():
            k = tuple(np.argwhere(bad)[0])
            return (f"output {i} {r.shape}: {int(bad.sum())} elements differ, first at {k}: tensorgen {a[k]!r}, "
                    f"ONNX Runtime {r[k]!r} (max |ref| {scale:.3g})")
    return None


def check_model(model: onnx.ModelProto, seed: int, policy: str, trials: int, workdir: Path,
                reference: list[np.ndarray] | None = None, target: str = "cpu",
                inputs: dict[str, np.ndarray] | None = None, rtol: float = 1e-3) -> Failure | None:
    """Tune every task of `model` for `trials` with `policy` (a POLICIES key) on `target`, build it with the
    database, run it on `inputs` (default `feeds(model)`) and compare with ONNX Runtime within `rtol`
    (`reference`: its outputs on those inputs, computed when not given)."""
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.backend.tasks import extract_tasks
    from tensorgen.graph.load import load_graph
    from tensorgen.records.database import SQLiteDatabase
    from tensorgen.runtime.model import CompiledModel
    from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler

    workdir.mkdir(parents=True, exist_ok=True)
    name, options = POLICIES[policy]
    stage = "import"
    try:
        graph = load_graph(model)
        tasks = extract_tasks(graph, target)
        db = SQLiteDatabase(workdir / "tuning.db")
        try:
            stage = "tune"
            if trials:  # every task gets `trials` in rounds of 2 (the evolution runs between them), whatever it timed
                scheduler = TaskScheduler.from_models(
                    {"fuzz": tasks}, seed=seed,
                    config=SchedulerConfig(round_trials=min(trials, 2), strategy="round-robin"))
                scheduler.tune(trials * len(tasks), db=db, policy=name, policy_options=options)
            bad = [r for t in tasks for r in db.records(t.task.workload_key)
                   if r.result.error_kind.value in PROGRAM_ERRORS]
            if bad:
                return Failure(seed, policy, "measure", "\n".join(
                    f"{r.result.error_kind.value}: {r.result.error_msg.strip()[-600:]}" for r in bad[:3]),
                    [r.to_json_line() for r in bad[:3]])
            stage = "build"
            out = build_model(graph, workdir / "model", target=target, db=db)
        finally:
            db.close()
        stage = "run"
        inputs = inputs if inputs is not None else feeds(model)
        ours = CompiledModel(out, threads=2).run([inputs[n] for n in graph.inputs])
    except Exception:
        return Failure(seed, policy, stage, traceback.format_exc())
    reference = reference if reference is not None else validate(model)
    mismatch = compare(ours, reference, rtol)
    if mismatch:
        return Failure(seed, policy, "mismatch", mismatch)
    return _check_bounds(model, graph.inputs, inputs, out, seed, policy)


def _check_bounds(model: onnx.ModelProto, names: Sequence[str], inputs: dict[str, np.ndarray], out: Path, seed: int,
                  policy: str) -> Failure | None:
    """An id one past the end of the table it gathers from is an error in ONNX Runtime; so must it be here."""
    from tensorgen.runtime.model import CompiledModel

    ids = [n for n in names if inputs[n].dtype == np.int64]
    if not ids:
        return None
    tables = {t.name: t.dims[0] for t in model.graph.initializer if t.dims}
    vocab = next((tables[node.input[0]] for node in model.graph.node
                  if node.op_type == "Gather" and node.input[1] == ids[0] and node.input[0] in tables), None)
    if vocab is None:  # the ids reach their table through other nodes (GPT-2 reshapes them first)
        return None
    bad = dict(inputs)
    bad[ids[0]] = inputs[ids[0]].copy()
    bad[ids[0]].flat[-1] = vocab
    try:
        CompiledModel(out, threads=2).run([bad[n] for n in names])
    except Exception:
        return None
    return Failure(seed, policy, "bounds", f"id {vocab} in input {ids[0]!r}, past the end of a table of {vocab} rows, "
                                           "ran without an error (ONNX Runtime: INVALID_ARGUMENT)")


# bugs other work on issue 22 fixes: a failure matching one is reported as that bug (pattern in the error text)
KNOWN_BUGS = {
    r"crossover\.py.*IndexError|IndexError[\s\S]*crossover|EOFError": "crossover indexes a stage id from the other "
                                                                      "parent (concat of dilated-conv branches)",
    r"cannot reshape array of size \d+ into shape": "a broadcast constant repacked as if it had the full shape",
    r"redefinition of .\w+_at.": "base-pointer hoisting emits one name twice (gcc: redefinition of 'input0_at')",
    r"NaN at .* in one engine only": "NaN does not propagate through max/min (Relu, Max, Min, Clip)",
    r"shape \(\d+, \d+, \d+, \d+\), ONNX Runtime gives": "pool ceil_mode keeps a last window lying in the padding",
    r"past the end of a table": "Gather does not check its indices",
}


def known_bug(failure: Failure | None) -> str | None:
    """The known bug (KNOWN_BUGS) this failure shows, if any."""
    if failure is None:
        return None
    return next((bug for pattern, bug in KNOWN_BUGS.items() if re.search(pattern, failure.error)), None)
