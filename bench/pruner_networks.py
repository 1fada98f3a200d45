"""Pruner's headline on this machine (Pruner §3.3, Fig. 10): the search time Pruner needs to reach the latency Ansor
reaches with its whole budget, on whole networks.

    python bench/pruner_networks.py --models resnet50,mobilenet_v2 --trials 2000 [--pretrained model.pt] \\
                                    [--variants ansor,pruner,pruner-mtl] [--warmup-trials N] [--dbs pruner_networks]
                                    [--baseline EARLIER.json] [--json F]

Variants, each from an empty database `<dbs>_<model>_<variant>.db`, one after the other in one run:

    ansor       Ansor: sketch policy, XGBoost learned online
    pruner      Pruner without transfer: draft-then-verify (policy "pruner"), PaCM learned online
    pruner-mtl  Pruner: draft-then-verify, PaCM pretrained (`--pretrained`, tensorgen costmodel train) with
                momentum transfer

Each run's curve is the task scheduler's estimated end-to-end latency (sum of each task's best measured latency
times its weight) against wall-clock seconds; Ansor runs first, and every other variant stops once its estimate
reaches Ansor's final one (`--full`: runs the whole budget). The figures: Ansor's final estimate and time; for
every other variant the first time its estimate is at or below Ansor's final one (and the ratio of Ansor's time to
it), and its final estimate. Time the compiled models next to ONNX Runtime with
bench/networks.py --trials 0 --db <the database>.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

from tensorgen.graph.backend.tasks import extract_tasks  # noqa: E402
from tensorgen.graph.load import load_graph  # noqa: E402
from tensorgen.tuning.progress import SchedulerProgress, StopTuning  # noqa: E402
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler  # noqa: E402

VARIANTS = {"ansor": ("ansor", "xgb"), "pruner": ("pruner", "pacm"), "pruner-mtl": ("pruner", "pacm:{pretrained}")}


def run_variant(model: str, variant: str, trials: int, db: str, pretrained: str | None, seed: int,
                config: SchedulerConfig, stop_ms: float | None = None) -> dict[str, Any]:
    """Tune `model` from an empty `db` with one variant under the scheduler's `config`; `stop_ms`: end the run
    once the estimate reaches it."""
    policy, cost_model = VARIANTS[variant]
    if "{pretrained}" in cost_model:
        if pretrained is None:
            raise SystemExit(f"variant {variant} needs --pretrained MODEL.pt (tensorgen costmodel train)")
        cost_model = cost_model.format(pretrained=pretrained)
    graph = load_graph(model)
    curve: list[tuple[float, int, float]] = []

    def record(p: SchedulerProgress) -> None:
        latency = p.models.get(graph.name)
        if p.phase == "round" and latency is not None:
            curve.append((p.elapsed_s, p.trials_done, latency))
            if len(curve) % 10 == 0:
                print(f"  {variant} {model}: {p.trials_done}/{p.trials} trials, {p.elapsed_s:.0f} s, estimate "
                      f"{latency * 1e3:.3f} ms", flush=True)
            if stop_ms is not None and latency * 1e3 <= stop_ms:
                raise StopTuning

    scheduler = TaskScheduler.from_models({graph.name: extract_tasks(graph)}, seed=seed, callbacks=[record],
                                          config=config)
    t0 = time.perf_counter()
    result = scheduler.tune(trials, db=db, policy=policy, cost_model=cost_model)
    return {"variant": variant, "policy": policy, "cost_model": cost_model, "db": db, "trials": result.trials,
            "round_trials": config.round_trials, "warmup_trials": config.warmup_trials,
            "stopped": result.stopped,
            "wall_s": time.perf_counter() - t0, "final_ms": curve[-1][2] * 1e3 if curve else None,
            "curve": [(round(t, 2), n, lat * 1e3) for t, n, lat in curve]}


def time_to_reach(curve: list, target_ms: float) -> tuple[float, int] | None:
    """(seconds, trials) at the first point of `curve` at or below `target_ms`; None if it never gets there."""
    return next(((t, n) for t, n, ms in curve if ms <= target_ms), None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet50,mobilenet_v2")
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--variants", default="ansor,pruner,pruner-mtl")
    p.add_argument("--pretrained", default=None, help="a PaCM file (tensorgen costmodel train) for pruner-mtl")
    p.add_argument("--dbs", default="pruner_networks", help="prefix of the databases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--round-trials", type=int, default=32,
                   help="programs per task round (default 32: MobileNet-V2's 33 tasks take 1056 trials to have an "
                        "estimate; the scheduler's 64 would take 2112)")
    p.add_argument("--warmup-trials", type=int, default=None,
                   help="the Pruner variants' first round per task (SchedulerConfig.warmup_trials; default: "
                        "--round-trials); Ansor's rounds are all --round-trials")
    p.add_argument("--full", action="store_true",
                   help="run every variant to the whole budget (default: stop one once it reaches Ansor's final)")
    p.add_argument("--baseline", default=None, metavar="JSON",
                   help="take Ansor's run of each model from this earlier report (--json) instead of running it "
                        "(on the same machine: its wall clock is the reference)")
    p.add_argument("--json", default=None)
    p.add_argument("--threads", default="2", help="(read by thread_env)")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or ("ansor" not in variants and args.baseline is None):
        raise SystemExit(f"--variants: need ansor (or --baseline) and any of {', '.join(VARIANTS)}; "
                         f"unknown: {unknown}")
    earlier = json.loads(Path(args.baseline).read_text())["models"] if args.baseline else {}
    report: dict[str, Any] = {"trials": args.trials, "round_trials": args.round_trials,
                              "warmup_trials": args.warmup_trials, "models": {}}
    ansor = SchedulerConfig(round_trials=args.round_trials)
    pruner = SchedulerConfig(round_trials=args.round_trials, warmup_trials=args.warmup_trials)
    for model in args.models.split(","):
        db = f"{args.dbs}_{model}_{{}}.db".format
        if args.baseline:
            if model not in earlier:
                raise SystemExit(f"--baseline {args.baseline} has no run of {model}")
            base = earlier[model]["runs"]["ansor"]
        else:
            base = run_variant(model, "ansor", args.trials, db("ansor"), args.pretrained, args.seed, ansor)
        stop = None if args.full else base["final_ms"]
        runs = {"ansor": base} | {v: run_variant(model, v, args.trials, db(v), args.pretrained, args.seed,
                                                 pruner, stop) for v in variants if v != "ansor"}
        rows = {}
        for v, run in runs.items():
            reach = time_to_reach(run["curve"], base["final_ms"]) if base["final_ms"] is not None else None
            rows[v] = {"final_ms": run["final_ms"], "wall_s": run["wall_s"],
                       "reaches_ansor_final_at_s": reach[0] if reach else None,
                       "reaches_ansor_final_at_trials": reach[1] if reach else None,
                       "time_ratio": reach[0] / base["wall_s"] if reach else None}
            final = f"{run['final_ms']:.3f} ms" if run["final_ms"] is not None else "- (a task has no program yet)"
            print(f"{model} {v}: final {final} in {run['wall_s']:.0f} s; reaches Ansor's final "
                  + (f"at {reach[0]:.0f} s ({reach[1]} trials, {reach[0] / base['wall_s']:.2f}x Ansor's time)"
                     if reach else "never"), flush=True)
        report["models"][model] = {"summary": rows, "runs": runs}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
