"""Networks (Ansor §7.3): tune each model with the task scheduler, then time the compiled model next to
ONNX Runtime, PyTorch eager and PyTorch under torch.compile (Inductor), in one run.

    python bench/networks.py [--models resnet50,mobilenet_v2,bert_base,dcgan] [--batches 1]
                             [--trials 512] [--round-trials 16] [--db networks.db] [--threads 2]
                             [--candidates K] [--option image_size=224] [--no-compile] [--frontend torch]
                             [--compare-db DB2]
                             [--rounds 3] [--max-rounds 9] [--bound 0.1] [--repeat 5] [--pause 0.5] [--load]
                             [--json FILE]

`--trials` is the budget per model (all its tasks together); `--trials 0` benchmarks what the database
already holds. Tuning resumes from --db, so a run can be extended later. `--compare-db DB` (repeatable) builds the
model from another database too and times that build as one more engine of the same comparison (the builds of two
searches side by side, alternating with the peers).

The peers run the model as their users do, with `--threads` threads each: ONNX Runtime on the zoo's
ONNX file (io_binding, inputs and outputs bound once to preallocated buffers), and the zoo model
written as a PyTorch nn.Module with the same weights (tensorgen/graph/reference/torch_zoo.py) under
torch.inference_mode (entered once, outside the timed calls), eager and compiled by torch.compile (a
failed compile is reported in its row). `--frontend torch` adds `torch.compile(module, backend="tensorgen")`:
the PyTorch module imported by tensorgen's PyTorch frontend and built from the same database (its tasks are
the ONNX model's), each kernel with its task's best record.
tensorgen writes into preallocated outputs too (`CompiledModel.run(..., out=)`); PyTorch allocates its
outputs each call (a module has no output argument; one allocation per output against milliseconds of work).

Every engine's output is compared with ONNX Runtime's first (tolerance: graph.compare.OUTPUT_RTOL of
the largest |output|): an engine that differs is not timed, and a row whose tensorgen output differs
reports "wrong output" with the errors and no speedup. Timing follows tensorgen/timing.py (alternating
blocks, ratios of medians over rounds, rounds re-measured until they agree within --bound, else the row
is marked unreliable); `--load` runs one competing CPU-bound process while timing. Each model is timed
in a fresh interpreter, as `tensorgen bench` runs it, not in the one that tuned it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.graph.reference.compare import OUTPUT_RTOL, onnxruntime_engine, output_error
from tensorgen.graph.zoo import MODELS
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.module import aligned_empty
from tensorgen.timing import Protocol, add_arguments, compare, competing_load, describe_load, protocol_from
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler
from tensorgen.tuning.tune import MeasureConfig

DEFAULT_MODELS = "resnet50,mobilenet_v2,bert_base,dcgan"
ENGINES = ("tensorgen", "tensorgen_torch", "onnxruntime", "torch", "torch_compile")


def tune_model(name: str, batch: int, options: dict[str, int], trials: int, db: str, seed: int, round_trials: int,
               strategy: str, transfer: bool, hot_weights: bool = False) -> dict:
    from tensorgen.graph.zoo import build_model

    graph = load_graph(build_model(name, batch, **options))
    tasks = extract_tasks(graph)
    if trials <= 0:
        return {"tasks": len(tasks), "trials": 0, "tuning_wall_s": 0.0}
    start = time.perf_counter()
    scheduler = TaskScheduler.from_models({graph.name: tasks}, seed=seed, config=SchedulerConfig(
        round_trials=round_trials, strategy=strategy, transfer=transfer))
    measure = MeasureConfig(runner_options={"evict_weights": not hot_weights})
    result = scheduler.tune(trials, db=db, measure=measure, progress=True)
    return {"tasks": len(tasks), "trials": result.trials, "tuning_wall_s": time.perf_counter() - start,
            "estimated_ms": (result.models.get(graph.name) or 0) * 1e3 or None}


def _one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"[:300]


def measure(name: str, batch: int, options: dict[str, int], db: str, threads: int, candidates: int,
            protocol: Protocol, load: bool, with_compile: bool, frontend: str = "onnx",
            compare_dbs: tuple[str, ...] = ()) -> dict:
    """Build, check and time one model (in the calling process; see measure_fresh); the builds from `compare_dbs`
    are more engines of the same comparison, `tensorgen:<file stem>`."""
    import torch

    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.frontend.onnx_inputs import random_inputs
    from tensorgen.graph.reference.torch_zoo import torch_model
    from tensorgen.runtime.model import CompiledModel

    torch.set_num_threads(threads)
    module, onnx_model = torch_model(name, batch, **options)
    graph = load_graph(onnx_model)
    feeds = random_inputs(onnx_model)
    row: dict[str, Any] = {"model": name, "batch": batch, "options": options, "threads": threads,
                           "torch_version": torch.__version__, "output_rtol": OUTPUT_RTOL, "errors": {}}
    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for engine, path in {"tensorgen": db, **{f"tensorgen:{Path(d).stem}": d for d in compare_dbs}}.items():
            start = time.perf_counter()
            with SQLiteDatabase(path) as records:
                builds[engine] = CompiledModel(build_model(graph, Path(tmp) / str(len(builds)), db=records,
                                                           candidates=candidates), threads=threads)
            if engine == "tensorgen":
                row["build_s"] = time.perf_counter() - start
        compiled = builds["tensorgen"]
        kernels = compiled.manifest["kernels"]
        row["tuned_tasks"] = len({k["workload_key"] for k in kernels if k["tuned"]})
        row["total_tasks"] = len({k["workload_key"] for k in kernels})

        inputs = [feeds[n] for n in graph.inputs]
        ort_run, reference = onnxruntime_engine(onnx_model, feeds, threads)
        tensors = [torch.from_numpy(feeds[n]) for n in graph.inputs]

        def eager() -> list:
            return [module(*tensors).numpy()]

        runs: dict[str, Callable[[], list]] = {engine: _run_into(build, inputs) for engine, build in builds.items()}
        runs.update(onnxruntime=ort_run, torch=eager)
        if with_compile:
            compiled_module = torch.compile(module)

            def compiled_torch() -> list:
                return [compiled_module(*tensors).numpy()]

            runs["torch_compile"] = compiled_torch
        if frontend == "torch":
            through_tensorgen = torch.compile(module, backend="tensorgen", options={"db": db})

            def tensorgen_torch() -> list:
                return [through_tensorgen(*tensors).numpy()]

            runs["tensorgen_torch"] = tensorgen_torch
        with torch.inference_mode():  # entered once, outside the timed calls
            check_and_time(runs, reference, protocol, load, row)
    return row


def _run_into(compiled: Any, inputs: list) -> Callable[[], list]:
    """A call of `compiled` on `inputs` into preallocated outputs."""
    outs = [aligned_empty(shape, dtype) for _, shape, dtype in compiled.outputs]
    return lambda: compiled.run(inputs, out=outs)


def check_and_time(runs: dict[str, Callable[[], list]], reference: list, protocol: Protocol, load: bool,
                   row: dict) -> None:
    """Check every engine's output against `reference`, then time those that are right, into `row`:
    status "ok", or "wrong output"/"error" (tensorgen is wrong or failed) and no times at all."""
    row["output_error"], engines = {}, {}
    for engine, run in runs.items():
        try:
            start = time.perf_counter()
            got = run()
            if engine == "torch_compile":
                row["torch_compile_s"] = time.perf_counter() - start  # the first call compiles
        except Exception as err:  # a peer that cannot run is a row note, never the end of the benchmark
            row["errors"][engine] = f"{'torch.compile' if engine == 'torch_compile' else engine} failed: " \
                                    f"{_one_line(err)}"
            continue
        abs_err, rel_err = output_error(got, reference)
        row["output_error"][engine] = {"max_abs": abs_err, "max_rel": rel_err}
        if rel_err > OUTPUT_RTOL:
            row["errors"][engine] = f"wrong output: max |{engine} - onnxruntime| = {abs_err:.3g} " \
                                    f"({rel_err:.3g} of max |onnxruntime|, tolerance {OUTPUT_RTOL:g})"
        else:
            engines[engine] = run
    row["status"] = "ok" if "tensorgen" in engines else "wrong output" \
        if "tensorgen" in row["output_error"] else "error"
    if row["status"] != "ok":
        return
    with competing_load(load) as pid:
        row["load"] = describe_load(pid)
        timed = compare(engines, protocol, reference="tensorgen")
    row["ms"] = {engine: s * 1e3 for engine, s in timed.seconds.items()}
    row["speedup"] = timed.ratios  # peer time over tensorgen's (> 1: tensorgen is faster)
    row.update(reliable=timed.reliable, disagreement=timed.disagreement(), timing=timed.to_json())


def measure_fresh(*args: Any) -> dict:
    """`measure` in a new interpreter: timed in the process that had just tuned ResNet-50, the model ran
    at 34.8-35.8 ms; in a fresh one, as `tensorgen bench` runs it, at 32.5 (ONNX Runtime 30.8 and 30.1)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def row_line(row: dict) -> str:
    """One line per model: every engine's ms and speedup, or why there is none."""
    head = f"{row['model']} b{row['batch']}"
    if row["status"] != "ok":
        return f"{head}: {row['status'].upper()}: {'; '.join(row['errors'].values())}"
    parts = [f"tensorgen {row['ms']['tensorgen']:.2f} ms"]
    for engine in [*ENGINES[1:], *(e for e in row["output_error"] if e not in ENGINES)]:
        if engine in row["ms"]:
            parts.append(f"{engine} {row['ms'][engine]:.2f} ms ({row['speedup'][engine]:.2f}x)")
        elif engine in row["errors"]:
            parts.append(row["errors"][engine])
    verdict = "" if row["reliable"] else f"  UNRELIABLE: {row['disagreement']}"
    return f"{head}: {', '.join(parts)}; {row['timing']['rounds']} rounds{verdict}"


def _options(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"--option {item!r}: expected name=positive integer, e.g. image_size=224")
        out[key] = int(value)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"zoo names (default {DEFAULT_MODELS})")
    parser.add_argument("--batches", default="1", help="comma separated batch sizes (default 1)")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                        help="a zoo model option for every model that has it, e.g. image_size=112 (repeatable)")
    parser.add_argument("--trials", type=int, default=512, help="measurement trials per model (default 512)")
    parser.add_argument("--db", default="networks.db", help="tuning database (default networks.db)")
    parser.add_argument("--compare-db", action="append", default=[], metavar="DB",
                        help="also build the model from DB and time it in the same comparison (engine "
                             "tensorgen:<DB's file stem>; repeatable): builds of different searches side by side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", choices=("gradient", "round-robin"), default="gradient",
                        help="task scheduler (round-robin: the 'no task scheduler' ablation of Figure 10)")
    parser.add_argument("--no-transfer", dest="transfer", action="store_false",
                        help="do not seed tasks with adapted best programs of similar tasks (Ansor as published)")
    parser.add_argument("--round-trials", type=int, default=16,
                        help="trials per scheduler round (default 16: networks have dozens of tasks)")
    parser.add_argument("--hot-weights", action="store_true",
                        help="time candidates with their weights in the caches (the ablation: a model's tasks are "
                             "timed with their weights evicted, as a model runs them)")
    parser.add_argument("--candidates", type=int, default=4, metavar="K",
                        help="in-model selection among each task's K best records when building (default 4; "
                             "1: every kernel with its task's best record)")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the torch.compile column (its compile takes a minute or more per model)")
    add_arguments(parser)
    parser.add_argument("--frontend", choices=("onnx", "torch"), default="onnx",
                        help="torch: also time torch.compile(module, backend='tensorgen') (default onnx: not)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(MODELS)}")
    if args.threads < 1 or args.trials < 0:
        parser.error("need --threads >= 1 and --trials >= 0")
    try:
        args.protocol = protocol_from(args)
    except ValueError as err:
        parser.error(str(err))
    args.options = _options(args.option)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = []
    for name in args.models.split(","):
        options = {k: v for k, v in args.options.items() if k in MODELS[name].options}
        for batch in (int(b) for b in args.batches.split(",")):
            tuning = tune_model(name, batch, options, args.trials, args.db, args.seed, args.round_trials,
                                args.strategy, args.transfer, args.hot_weights)
            row = measure_fresh(name, batch, options, args.db, args.threads, args.candidates, args.protocol,
                                args.load, args.compile, args.frontend, tuple(args.compare_db))
            row.update(tuning, strategy=args.strategy, transfer=args.transfer, hot_weights=args.hot_weights,
                       candidates=args.candidates)
            rows.append(row)
            print(f"{row_line(row)}; {tuning['trials']} trials in {tuning['tuning_wall_s']:.0f} s; "
                  f"{row['tuned_tasks']}/{row['total_tasks']} tasks tuned", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"protocol": args.protocol.to_json(), "load": args.load, "rows": rows},
                                              indent=1, default=str))
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
