"""`tensorgen models`, `tensorgen build MODEL`, `tensorgen bench MODEL`, `tensorgen run MODEL`: whole models from
the command line.

MODEL is a zoo name (see `tensorgen models`) or a path to an .onnx file.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tensorgen.cli.args import (
    examples,
    local_target,
    output_file,
    positive_int,
    thread_count,
    usable_cpus,
    write_json,
)
from tensorgen.cli.inputs import add_input_args, model_inputs, parse_input_shapes
from tensorgen.cli.records import DEFAULT_DB, interrupted_line, open_existing, report_unreadable
from tensorgen.cli.report import report_hint
from tensorgen.errors import TensorgenError
from tensorgen.graph.backend import LAYOUT_MODES
from tensorgen.records.database import SQLiteDatabase


def register(subparsers: argparse._SubParsersAction) -> None:
    subparsers.add_parser("models", help="list the built-in model zoo",
                          epilog=examples("tensorgen models",
                                          "tensorgen info bert_tiny     # one model's inputs and outputs")
                          ).set_defaults(fn=_models)

    def model_args(p: argparse.ArgumentParser, inputs_required: bool = False, candidates: int = 4,
                   target: Callable[[str], str] | None = None) -> argparse.ArgumentParser:
        p.add_argument("model", metavar="MODEL", help="a zoo name (see `tensorgen models`) or an .onnx file")
        p.add_argument("--db", help=f"tuning records to use, a file that must exist (default: {DEFAULT_DB} if it "
                                    "exists, else none); untuned subgraphs get a default schedule")
        p.add_argument("--batch", type=positive_int, default=1, metavar="N",
                       help="the batch size of a zoo model: its inputs' first dimension (default 1)")
        p.add_argument("--candidates", type=positive_int, default=None, metavar="K",
                       help="pick each kernel's program among its task's K best records by timing the model built "
                            f"with each (in-model selection: K + 1 more builds; default {candidates}, 1 under "
                            "-emulate=1; 1: the best alone)")
        p.add_argument("--layouts", choices=LAYOUT_MODES, default=None,
                       help="records that store their kernel's arguments in layouts of their own (--policy alt): "
                            "propagate = follow them, with conversion kernels, and propagate the layouts along "
                            "element-wise kernels (default on a CPU); follow = conversion kernels only; off = pass "
                            "them over (the only choice for cuda)")
        p.set_defaults(default_candidates=candidates)
        if target is not None:
            p.add_argument("--target", type=target, default=None,
                           help="what to build for (default cpu): 'cpu -mcpu=...', 'cuda -arch=sm_90', or "
                                "'cuda -emulate=1' (CUDA kernels run on this CPU's emulation, to check them)")
        add_input_args(p, required=inputs_required)
        return p

    build = model_args(subparsers.add_parser(
        "build", help="compile a model into one shared library", description="Compile a model with the best "
        "programs of the tuning database into DIR: model.so (one shared library with a small C ABI), weights.bin, "
        "the generated source and model.json. A kernel without a record gets a default schedule.",
        epilog=examples("tensorgen build bert_tiny -o bert_tiny_build          # with tuning.db",
                        "tensorgen build model.onnx --shape input_ids=1x64 --db my.db -o out",
                        "tensorgen run bert_tiny_build --inputs inputs.npz -o outputs.npz   # run what it built")),
                       target=local_target)
    build.add_argument("-o", "--out", required=True, help="output directory (model.so, weights.bin, ...)")
    build.set_defaults(fn=_build)
    bench = model_args(subparsers.add_parser(
        "bench", help="time a compiled model next to ONNX Runtime, in one run (outputs checked against it)",
        description="Build the model with the tuning database's programs and time it next to ONNX Runtime, engines "
                    "taking turns, on the same inputs; the outputs are checked against ONNX Runtime's first. Timings "
                    "need a quiet machine: rounds that disagree by more than 10% are marked UNRELIABLE.",
        epilog=examples("tensorgen bench bert_tiny                     # after tensorgen tune bert_tiny",
                        "tensorgen bench resnet50 --batch 8 --threads 1 --profile",
                        "tensorgen bench model.onnx --inputs inputs.npz --db my.db")))
    bench.add_argument("--threads", type=thread_count, default=usable_cpus(), help="threads for every engine")
    bench.add_argument("--blocks", type=positive_int, default=3,
                       help="rounds of alternating blocks before their agreement is checked (default 3, at least 2); "
                            "rounds are added, up to 9, until they agree within 10%%, else the result is marked "
                            "UNRELIABLE")
    bench.add_argument("--json", type=output_file, metavar="FILE", help="also write the result to this JSON file")
    bench.add_argument("--profile", action="store_true",
                       help="also time every kernel inside the model, beside its tuned cost")
    bench.set_defaults(fn=_bench)
    run = model_args(subparsers.add_parser(
        "run", help="run a model once on your inputs (.npz in, .npz out); MODEL may also be a `tensorgen build` "
                    "directory",
        epilog=examples("tensorgen info bert_tiny                     # the inputs' names, shapes, types",
                        "python -c \"import numpy as np; np.savez('in.npz', input_ids=np.zeros((1, 128), 'int64'))\"",
                        "tensorgen run bert_tiny --inputs in.npz -o out.npz",
                        "tensorgen run bert_tiny_build --inputs in.npz -o out.npz   # a `tensorgen build` directory")),
        inputs_required=True, candidates=1, target=local_target)
    run.add_argument("-o", "--out", required=True, type=output_file, metavar="FILE.npz",
                     help="where to write the outputs, by name")
    run.set_defaults(fn=_run)


def tune_model(args: argparse.Namespace) -> int:
    """`tensorgen tune MODEL` (the tune command's arguments, its OP a model): all tasks of the model under the task
    scheduler, into the database."""
    from tensorgen.graph.backend.tasks import extract_tasks
    from tensorgen.graph.load import load_graph
    from tensorgen.target import Target
    from tensorgen.tuning.progress import ProgressTable
    from tensorgen.tuning.scheduler import MODEL_MEASURE, SchedulerConfig, TaskScheduler

    shapes = parse_input_shapes([args.shape] if args.shape else [])
    graph = load_graph(args.op, batch=args.batch, input_shapes=shapes)
    tasks = extract_tasks(graph, Target.parse(args.target))
    print(f"{graph.summary()}\n{len(tasks)} tasks; tuning {args.trials} trials into {args.db}")
    config = SchedulerConfig(strategy=args.strategy, round_trials=args.batch_size or 16,
                             warmup_trials=args.warmup_trials, early_stopping=args.early_stopping,
                             transfer=args.transfer)
    measure = MODEL_MEASURE.on_ray(args.ray) if args.ray else None

    def tune(trials: int):
        table = ProgressTable()
        scheduler = TaskScheduler.from_models({graph.name: tasks}, seed=args.seed, callbacks=[table], config=config)
        try:
            return scheduler.tune(trials, db=args.db, policy=args.policy, cost_model=args.cost_model,
                                  policy_options={"prefilter": args.prefilter} if args.prefilter else None,
                                  measure=measure, progress=False)  # the table above, on stdout
        finally:
            table.close()

    # ALT: the layouts found lay out the model's values; the conversion and propagated kernels that adds are
    # tasks of their own, known once the layouts are, tuned (their loops) with the last tenth of the budget; where
    # no layout was kept, the model's tasks get that tenth too (resumed from the database)
    layout_share = args.trials // 10 if args.policy == "alt" else 0
    started = time.time()
    result = tune(args.trials - layout_share)
    extra = _tune_layout_tasks(graph, args, layout_share, config, measure) \
        if layout_share and not result.interrupted else None
    if layout_share and extra is None and not result.interrupted:
        more = tune(layout_share)
        result = replace(more, trials=result.trials + more.trials, rounds=result.rounds + more.rounds,
                         wall_s=result.wall_s + more.wall_s, search_s=result.search_s + more.search_s,
                         build_s=result.build_s + more.build_s, run_s=result.run_s + more.run_s)
    latency = result.models.get(graph.name)
    print(f"estimated end-to-end latency: {latency * 1e3:.3f} ms" if latency else
          "estimated end-to-end latency: - (some task has no valid program yet)")
    print(f"{result.trials} trials in {result.wall_s:.1f} s ({result.stopped}): search {result.search_s:.1f} s, "
          f"build {result.build_s:.1f} s, run {result.run_s:.1f} s")
    if extra is not None:
        print(f"layout tasks: {extra.trials} trials in {extra.wall_s:.1f} s ({extra.stopped})")
    print(report_hint(args.db, args.op, args.batch, args.shape))
    if warning := result.busy.warning():
        print(f"tensorgen: warning: {warning}", file=sys.stderr)
    if result.skipped:
        print("skipped (search faults): " + ", ".join(f"{n} {k}" for k, n in result.skipped.items()))
    if args.json:
        write_json(args.json, {**result.to_dict(), "model": graph.name, "db": args.db}, indent=1)
    if result.interrupted or (extra is not None and extra.interrupted):
        print(interrupted_line(result.trials, args.db, started), file=sys.stderr)
        return 130
    return 0


def _tune_layout_tasks(graph, args: argparse.Namespace, trials: int, config, measure):
    """The tasks a build following the database's layouts may add (graph.backend.layout_choice.layout_tasks), tuned with
    `trials`, each search starting from the programs layout_tasks gives; their scheduler's result, or None when
    there are none."""
    from tensorgen.graph.backend.layout_choice import layout_tasks
    from tensorgen.tuning.progress import ProgressTable
    from tensorgen.tuning.scheduler import TaskScheduler
    from tensorgen.tuning.tune import make_cost_model, make_policy

    with SQLiteDatabase(args.db) as db:
        found = layout_tasks(graph, db, args.target)
    if not found:
        return None
    seeds = {t.task.workload_key: states for t, states in found}
    model = make_cost_model(args.cost_model, args.seed, args.target, "ansor")

    def policy(task):
        search = make_policy(task, "ansor", model, args.seed)
        search.offer(seeds.get(task.workload_key, []))
        return search

    print(f"{len(found)} tasks of layout conversions, propagated layouts and inputs read in their producers' "
          f"layouts; tuning {trials} trials")
    table = ProgressTable()
    try:
        return TaskScheduler.from_models({graph.name: [t for t, _ in found]}, seed=args.seed, callbacks=[table],
                                         config=config).tune(trials, db=args.db, policy=policy, measure=measure,
                                                             progress=False)
    finally:
        table.close()


def _models(args: argparse.Namespace) -> int:
    from tensorgen.graph.zoo import list_models

    for name, desc in list_models():
        print(f"{name:14s} {desc}")
    return 0


def _records(path: str | None) -> SQLiteDatabase | None:
    """The database `--db` names (it must exist: a misspelt name must not build untuned in silence), else the
    default one if it exists, else none."""
    if path is not None:
        return open_existing(path)
    if os.path.exists(DEFAULT_DB):
        return open_existing(DEFAULT_DB)
    print(f"no tuning database ({DEFAULT_DB} does not exist, and no --db): every kernel gets a default schedule")
    return None


def _build_options(args: argparse.Namespace) -> dict:
    """build_model's keywords from the model arguments: the target, and as many candidates as it may time."""
    from tensorgen.graph.backend.model_target import times_kernels

    target = args.target or "cpu"
    candidates = args.candidates or (args.default_candidates if times_kernels(target) else 1)
    return {"target": target, "candidates": candidates, "layouts": args.layouts}


def _build(args: argparse.Namespace) -> int:
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.backend.model_target import model_target

    options = _build_options(args)
    graph = model_inputs(args.model, args.batch, args.shape, args.inputs).graph()
    db = _records(args.db)
    out = build_model(graph, args.out, db=db, progress=print, **options)
    if db is not None:
        report_unreadable(db)
    print(f"wrote {out}/model.so, weights.bin, {model_target(options['target']).source}, model.json")
    return 0


PROFILE_LINES = 20


def _bench(args: argparse.Namespace) -> int:
    from tensorgen.graph.reference.compare import compare
    from tensorgen.timing import Protocol

    # PyTorch as its users run a model is bench/networks.py's peer; graph/reference/torch_eval.py is an oracle
    given = model_inputs(args.model, args.batch, args.shape, args.inputs)
    db = _records(args.db)
    rounds = max(2, args.blocks)
    result = compare(given.model, db=db, threads=args.threads, inputs=given.feed, input_shapes=given.shapes,
                     protocol=Protocol(rounds=rounds, max_rounds=max(rounds, Protocol.max_rounds)),
                     profile=args.profile, candidates=args.candidates or args.default_candidates,
                     layouts=args.layouts, with_torch=False)
    if db is not None:
        report_unreadable(db)
    print(f"{result.model}: {result.tuned_tasks}/{result.total_tasks} tasks tuned, {args.threads} threads")
    print(f"  tensorgen    {result.tensorgen_ms:9.3f} ms")
    # one statistic: the speedup is the ratio of the medians printed beside it; none for a wrong answer
    ratios = result.ratios() if result.output_ok is not False else {}
    if result.onnxruntime_ms is not None:
        speedup = f"   tensorgen is {ratios['onnxruntime']:.2f}x as fast" if ratios else ""
        print(f"  onnxruntime  {result.onnxruntime_ms:9.3f} ms{speedup}")
    else:
        print("  onnxruntime  not installed: no time to compare with, no outputs to check against "
              "(pip install onnxruntime, or tensorgen's [bench] extra)")
    if result.output_ok is not None:
        print(f"  max |tensorgen - onnxruntime| = {result.max_abs_err_vs_onnxruntime:.3g} "
              f"({result.max_rel_err_vs_onnxruntime:.3g} of max |onnxruntime|; tolerance {result.output_rtol:g})")
    if result.reliable is False:
        print(f"  UNRELIABLE: the timing rounds never agreed within {Protocol.bound:.0%} ({result.disagreement}); "
              f"re-run on a quieter machine")
    if result.output_ok is False:
        print("  WRONG OUTPUT: tensorgen differs from ONNX Runtime beyond that tolerance; no speedup reported")
    if result.kernels:
        total = sum(k["ms"] for k in result.kernels)
        print(f"  kernels inside the model, slowest first ({total:.3f} ms in all):")
        slowest = sorted(result.kernels, key=lambda k: -k["ms"])
        for k in slowest[:PROFILE_LINES]:
            tuned = "untuned" if k["tuned_ms"] is None else f"tuned alone {k['tuned_ms']:.3f} ms"
            print(f"    {k['kernel']:32s} {k['ms']:8.3f} ms  {100 * k['ms'] / total:5.1f}%  ({tuned})")
        if len(slowest) > PROFILE_LINES:
            print(f"    ... {len(slowest) - PROFILE_LINES} more (all of them in --json)")
    if args.json:
        write_json(args.json, {**result.__dict__, "ratios": ratios, "output_ok": result.output_ok}, indent=1)
    return 1 if result.output_ok is False else 0


def _build_for_run(args: argparse.Namespace, directory: Path) -> tuple[Path, dict | None]:
    """The model `tensorgen run` names built into `directory`, and its inputs. Neither the ONNX model nor its graph
    outlives the call: each holds a copy of the weights."""
    from tensorgen.graph.backend.build import build_model

    given = model_inputs(args.model, args.batch, args.shape, args.inputs)
    graph, feed = given.graph(), given.feed
    del given  # the ONNX model's copy, not needed while building
    return build_model(graph, directory, db=_records(args.db), **_build_options(args)), feed


def _run(args: argparse.Namespace) -> int:
    """`tensorgen run MODEL --inputs in.npz -o out.npz`: the model's outputs on a user's inputs, by output name."""
    import numpy as np

    from tensorgen.graph.frontend.onnx_inputs import load_npz
    from tensorgen.runtime.model import CompiledModel
    from tensorgen.runtime.model_files import MANIFEST
    from tensorgen.tempdirs import owned_tempdir

    with owned_tempdir("tensorgen-run-") as tmp:  # and those of runs killed by SIGKILL are removed
        if (Path(args.model) / MANIFEST).is_file():  # a `tensorgen build` directory: its shapes are fixed
            if args.shape or args.batch != 1 or args.target:
                raise TensorgenError(f"{args.model} is a built model with fixed shapes and target; --shape, --batch "
                                     "and --target apply to zoo models and .onnx files")
            compiled, feed = CompiledModel(args.model), load_npz(args.inputs)
        else:
            built, feed = _build_for_run(args, tmp)
            compiled = CompiledModel(built)  # after the graph's weights are freed: it maps the built copy
        outputs = compiled.run(feed)
    named = {name: array for (name, _, _), array in zip(compiled.outputs, outputs)}
    with open(args.out, "wb") as f:
        np.savez(f, **named)
    print(f"wrote {args.out}: " + ", ".join(f"{name} {a.dtype.name}{list(a.shape)}" for name, a in named.items()))
    return 0
