"""`tensorgen tune MODEL|OP` and `tensorgen show OP --shape ...`: tune a model (see cli.graph.tune_model) or a suite
operator, show an operator's best program."""

from __future__ import annotations

import argparse
import inspect
import math
import os
import sys
import time

from tensorgen.cli.args import examples, local_target, nonneg_int, output_file, positive_int, write_json
from tensorgen.cli.records import DEFAULT_DB, interrupted_line, open_existing
from tensorgen.cli.report import report_hint
from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError
from tensorgen.target import Target
from tensorgen.tuning.registry import COST_MODELS, POLICIES
from tensorgen.tuning.scheduler import STRATEGIES
from tensorgen.tuning.tune import ABLATIONS, TuneResult


def cost_model_arg(text: str) -> str:
    """A --cost-model value: "auto" or a registered name, optionally with the path of an existing saved model."""
    name, colon, path = text.partition(":")
    if text == "auto":
        return text
    if name not in COST_MODELS:
        raise argparse.ArgumentTypeError(f"unknown cost model {name!r}; choose one of {', '.join(COST_MODELS.names())}")
    if colon and not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no model file {path!r}")
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `tune` and `show` commands to a `tensorgen` argument parser's subparsers."""

    def workload(p: argparse.ArgumentParser, what: str, metavar: str) -> argparse.ArgumentParser:
        p.add_argument("op", metavar=metavar, help=what)
        p.add_argument("--shape", help="an operator's shape config, comma separated, e.g. 1024,1024,1024; for a "
                                       "model, its inputs' symbolic dimensions, e.g. input_ids=1x64 (see `tensorgen "
                                       "info MODEL`)")
        p.add_argument("--batch", type=positive_int, default=1, metavar="N",
                       help="the batch size of the workload's input: a zoo model's or an operator's first dimension "
                            "(default 1). Not --batch-size")
        p.add_argument("--db", default=DEFAULT_DB, help=f"the tuning database (default {DEFAULT_DB})")
        p.add_argument("--target", type=local_target, default="cpu",
                       help="the target (default cpu), e.g. 'cpu -cores=2'")
        return p

    tune = workload(subparsers.add_parser(
        "tune", help="tune a model (every task of it) or one suite operator: search fast programs, measure them, "
                     "keep them in the database",
        description="Search fast programs for a model (a zoo name or an .onnx file: each of its fused subgraphs is "
                    "a task, and the task scheduler gives rounds of trials to the tasks where they gain most) or "
                    "for one suite operator, measure them on this machine and store every measurement in the "
                    "database. It resumes: run it again to add trials. Timings need a quiet machine; a small "
                    "budget leaves tasks at their default programs (give a model about 20 trials per task).",
        epilog=examples("tensorgen tune bert_tiny --trials 256          # a zoo model; then: tensorgen bench bert_tiny",
                        "tensorgen tune model.onnx --shape input_ids=1x64 --trials 500 --db my.db",
                        "tensorgen tune resnet50 --batch 8 --policy pruner --trials 2000",
                        "tensorgen tune gmm --shape 1024,1024,1024 --trials 64   # an operator (see `tensorgen ops`)")),
        "a model (a zoo name, see `tensorgen models`, or an .onnx file) or a suite operator (see `tensorgen ops`), "
        "e.g. bert_tiny, model.onnx, gmm, c2d", "MODEL|OP")
    tune.add_argument("--trials", type=nonneg_int, default=256, help="programs to measure in this run (default 256)")
    tune.add_argument("--policy", choices=POLICIES.names(), default="ansor", help="search policy (default ansor)")
    tune.add_argument("--cost-model", type=cost_model_arg, default="auto", metavar="NAME[:FILE]",
                      help=f"the cost model of a learning policy: auto, {', '.join(COST_MODELS.names())}; NAME:FILE "
                           "starts from a saved model, e.g. pacm:model.pt (a pretrained PaCM). Default auto: xgb; "
                           "with --policy pruner (and PyTorch installed) PaCM, starting from the model pretrained for "
                           "this kind of CPU that ships with tensorgen where there is one (Intel or AMD x86)")
    tune.add_argument("--ablation", choices=ABLATIONS, default=None,
                      help="operators: a search variant of Ansor's ablation (Figure 7), in place of --policy: "
                           "ansor = the full search; no-crossover = evolution by mutations only; no-fine-tuning = no "
                           "evolution, the cost model ranks random programs; limited-space = only the plain "
                           "multi-level tiling sketch (no cache write, fusion or rfactor); uniform-tiles = tile "
                           "sizes drawn uniformly (no preference for register-sized tiles); random = random "
                           "programs, no cost model")
    tune.add_argument("--prefilter", choices=("psa",), default=None,
                      help="operators, policy ansor: keep the best of 4x as many random programs per round by "
                           "Pruner's static analyzer (default: none, Ansor as published)")
    tune.add_argument("--seed", type=nonneg_int, default=0, help="random seed (default 0)")
    tune.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                      help="candidate programs measured per round (default 64 for an operator, 16 per task round "
                           "for a model). Not --batch, the workload's input batch")
    tune.add_argument("--warmup-trials", type=positive_int, default=None, metavar="N",
                      help="models: programs measured in each task's first round (default: the batch size); the "
                           "model has an estimate once every task has had one")
    tune.add_argument("--json", type=output_file, metavar="FILE", help="also write the result to this JSON file")
    tune.add_argument("--early-stopping", type=positive_int, metavar="ROUNDS",
                      help="models: stop tuning a task after this many of its rounds without a faster program (the "
                           "scheduler then counts it at its best: Ansor's objective f4, early stopping)")
    tune.add_argument("--strategy", choices=STRATEGIES.names(), default="gradient",
                      help="models: how rounds are given to tasks (default: Ansor's gradient scheduler)")
    tune.add_argument("--no-transfer", dest="transfer", action="store_false",
                      help="models: do not seed tasks with the best programs of similar tasks (Ansor as published)")
    tune.add_argument("--ray", metavar="ADDRESS",
                      help="build and time candidates on a Ray cluster (its head's HOST:PORT), on its nodes "
                           "started with `tensorgen worker --ray ADDRESS --target` this --target")
    tune.set_defaults(fn=_tune)
    show = workload(subparsers.add_parser(
        "show", help="print the best tuned program of a suite operator",
        description="The fastest program the database holds for a suite operator: its schedule steps (Python) and "
                    "its generated C.",
        epilog=examples("tensorgen tune gmm --shape 1024,1024,1024 --trials 64 && "
                        "tensorgen show gmm --shape 1024,1024,1024")),
        "a suite operator (see `tensorgen ops`), e.g. gmm, c2d, nrm", "OP")
    show.set_defaults(fn=_show)


# ---------------------------------------------------------------------------------------------
# the workload named on the command line


def _suite_entry(op: str) -> tuple[str, object, list[tuple[int, ...]]]:
    from tensorgen.te.ops.suite import SUITE

    names = {name.lower(): name for name in SUITE}
    if op.lower() not in names:
        raise TensorgenError(f"unknown operator {op!r}; the suite has {', '.join(SUITE)} (see `tensorgen ops`)")
    name = names[op.lower()]
    make, configs = SUITE[name]
    return name, make, configs


def parse_workload(op: str, shape: str | None, batch: int = 1) -> tuple[str, tuple[int, ...], ComputeDAG]:
    """(suite name, shape config, DAG) for `OP --shape a,b,c`, with errors that show valid configs."""
    name, make, configs = _suite_entry(op)
    if shape is None:
        examples = "; ".join(",".join(map(str, c)) for c in configs)
        raise TensorgenError(f"{name} needs --shape; its suite configs: {examples}")
    params = [p.name for p in inspect.signature(make).parameters.values() if p.default is inspect.Parameter.empty]
    examples = "; ".join(",".join(map(str, c)) for c in configs)
    usage = f"{name} takes {len(params)} shape values ({', '.join(params)}), e.g. --shape {examples.split(';')[0]}"
    try:
        config = tuple(int(v) for v in shape.replace(" ", "").split(","))
    except ValueError:
        raise TensorgenError(f"--shape {shape!r} is not a comma-separated list of integers; {usage} "
                             f"(suite configs: {examples})") from None
    if len(config) != len(params):
        raise TensorgenError(f"--shape {shape!r} has {len(config)} values; {usage} (suite configs: {examples})")
    if batch < 1 or any(v < 0 for v in config):  # 0 is a valid padding; the operators reject empty sizes
        raise TensorgenError(f"--shape {shape!r} --batch {batch}: the batch must be positive and no value negative")
    try:
        inputs, outputs = make(*config, batch=batch)
    except TensorgenError as err:
        raise TensorgenError(f"--shape {shape!r} --batch {batch}: {err} (suite configs: {examples})") from None
    return name, config, ComputeDAG(list(inputs) + list(outputs))


def _desc(name: str, config: tuple[int, ...], batch: int) -> str:
    return f"{name}({','.join(map(str, config))})" + (f" batch={batch}" if batch != 1 else "")


# ---------------------------------------------------------------------------------------------
# the summary


def summary_table(result: TuneResult, db: str) -> str:
    """The result as aligned `key  value` rows."""
    cost = result.best_cost
    errors = ", ".join(f"{n} {k}" for k, n in result.errors.items()) or "none"
    skipped = ", ".join(f"{n} {k}" for k, n in result.skipped.items()) or "none"
    rows = [
        ("workload", f"{result.task.desc} [{result.task.workload_key}]"),
        ("target", str(result.task.target)),
        ("trials", f"{result.trials} this run, {result.total_trials} in the database"
                   + (" (interrupted)" if result.interrupted else "")),
        ("best time", f"{cost * 1e3:.4f} ms" if math.isfinite(cost) else "- (no successful measurement)"),
        ("best speed", f"{result.best_gflops:.2f} GFLOP/s" if result.best_gflops > 0 else "-"),
        ("wall time", f"{result.tuning_wall_s:.1f} s"),
        ("  build", f"{result.build_s:.1f} s"),
        ("  run", f"{result.run_s:.1f} s"),
        ("  search overhead", f"{result.search_overhead_s:.1f} s"),
        ("errors (this run)", errors),
        ("skipped (search faults)", skipped),
        ("database", db),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


# ---------------------------------------------------------------------------------------------
# commands


def _is_operator(op: str) -> bool:
    from tensorgen.te.ops.suite import SUITE

    return op.lower() in {name.lower() for name in SUITE}


def _tune(args: argparse.Namespace) -> int:
    from tensorgen.tuning.tune import MeasureConfig, ablation_policy, make_task, tune

    # a model takes --shape NAME=DIMS (its inputs' symbolic dimensions); an operator's --shape is a config
    if not _is_operator(args.op) and (args.shape is None or "=" in args.shape):
        from tensorgen.cli.graph import tune_model

        if args.ablation:  # it was ignored for a model, in silence
            raise TensorgenError(f"--ablation is a variant of one operator's search (Ansor's Figure 7), not for a "
                                 f"model such as {args.op!r}; a model's search is chosen with --policy")
        return tune_model(args)
    name, config, dag = parse_workload(args.op, args.shape, args.batch)
    task = make_task(dag, Target.parse(args.target), desc=_desc(name, config, args.batch))
    policy, options = args.policy, {}
    if args.ablation:
        policy, options = ablation_policy(args.ablation, task)
    if args.prefilter:
        if policy != "ansor":
            raise TensorgenError(f"--prefilter prunes the ansor policy's random programs; not for {policy!r}")
        options = {**options, "prefilter": args.prefilter}
    measure = MeasureConfig().on_ray(args.ray) if args.ray else MeasureConfig()
    started = time.time()
    result = tune(task, trials=args.trials, db=args.db, policy=policy, cost_model=args.cost_model, seed=args.seed,
                  batch_size=args.batch_size or 64, progress=True, policy_options=options, measure=measure)
    print(summary_table(result, args.db))
    print(report_hint(args.db))
    if warning := result.busy.warning():
        print(f"tensorgen: warning: {warning}", file=sys.stderr)
    if args.json:
        data = {**result.to_dict(), "op": name, "shape": list(config), "batch": args.batch, "policy": policy,
                "ablation": args.ablation, "prefilter": args.prefilter,
                "seed": args.seed, "db": args.db}
        write_json(args.json, data)
    if result.interrupted:
        print(interrupted_line(result.trials, args.db, started), file=sys.stderr)
        return 130
    return 0


def _show(args: argparse.Namespace) -> int:
    from tensorgen.build import build
    from tensorgen.hardware import hardware_for

    name, config, dag = parse_workload(args.op, args.shape, args.batch)
    target = Target.parse(args.target)
    desc = _desc(name, config, args.batch)
    with open_existing(args.db) as db:
        record = db.best(dag.workload_key, str(target))
        if record is None:
            n = len(db.records(dag.workload_key, str(target)))
            why = f"only {n} failed measurements" if n else "no records"
            raise TensorgenError(f"{args.db} has {why} for {desc} on target '{target}'; "
                                 f"tune it first: tensorgen tune {name.lower()} --shape {args.shape} --db {args.db}")
    state = record.state(dag)
    gflops = dag.flop_count / record.cost / 1e9
    print(f"# best of {desc} on '{target}': {record.cost * 1e3:.4f} ms, {gflops:.2f} GFLOP/s "
          f"[{dag.workload_key}]")
    print("# schedule steps (Python)")
    print(state)
    print("\n# generated C")
    hw = hardware_for(target)
    print(build(state, simd_bytes=hw.simd_bytes, march=target.march).source)
    return 0
