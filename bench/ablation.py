"""Ablation of the Ansor search on one C2D (paper Figure 7): best-so-far GFLOP/s vs. measurement trials.

    python bench/ablation.py [--shape-index 3 | --shape H,W,CI,CO,K,S,P] [--batch 1] [--trials 256]
                             [--variants ansor,no-crossover,...,uniform-tiles,random] [--seeds 0,1]
                             [--batch-size 32] [--population N] [--db-dir DIR] [--json FILE] [--points 8]

Every variant tunes the same C2D (`tensorgen.te.ops.suite` C2D shapes; default the last 3x3
convolution of ResNet-50, 7x7x512 -> 512; the paper uses it with batch 16) with the same trial budget
and seed, each in its own database (variants never see each other's measurements):

- ansor: the full policy — all sketches, random annotation, evolutionary fine-tuning, learned model;
- no-fine-tuning: evolution with 0 generations — each batch is random samples of the sketches ranked
  by the cost model (random sampling only);
- limited-space: the full search over a template-like space — only the plain multi-level-tiling
  sketch (no cache write / fusion / rfactor);
- uniform-tiles: the full policy with Ansor's uniform tile sizes (no register-tile prior);
- random: random annotations of all sketches, no cost model.

(see `tensorgen.tuning.tune.ablation_policy`; `tensorgen tune c2d --shape ... --ablation NAME` runs one.)
The curve is the best measured GFLOP/s after each trial, read back from the variant's database in
commit order (a variant resumed with `--db-dir` continues its curve; `--trials` is then the total).
Output: a table of the best GFLOP/s at `--points` trial counts (mean over seeds) and, relative to the
best program any variant found (Figure 7's y axis), the final one; `--json` writes all curves.
"""

from __future__ import annotations

import os
import sys

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen.cli.tune import parse_workload  # noqa: E402
from tensorgen.records import SQLiteDatabase  # noqa: E402
from tensorgen.records.record import best_cost_curve, first_records  # noqa: E402
from tensorgen.target import Target  # noqa: E402
from tensorgen.te.ops.suite import SUITE  # noqa: E402
from tensorgen.tuning.tune import ABLATIONS, TuneProgress, ablation_policy, make_task, tune  # noqa: E402

DEFAULT_SHAPE_INDEX = 3


def best_curve(db: SQLiteDatabase, workload_key: str, target: str, flops: float) -> list[float]:
    """Best GFLOP/s after each trial of the workload, in commit order (0 until one succeeded; a re-timed best
    program at its re-timed cost)."""
    return [flops / cost / 1e9 if 0 < cost < math.inf else 0.0
            for cost in best_cost_curve(db.records(workload_key, target))]


def run_variant(variant: str, seed: int, task: Any, args: argparse.Namespace) -> dict:
    """Tune `task` under one ablation variant; its curve and timing."""
    task = dataclasses.replace(task, desc=f"{task.desc} [{variant}, seed {seed}]")
    policy, options = ablation_policy(variant, task)
    if args.population is not None and policy == "ansor":
        options = {**options, "population": args.population}
    if args.db_dir:
        Path(args.db_dir).mkdir(parents=True, exist_ok=True)
        db = SQLiteDatabase(Path(args.db_dir) / f"ablation-{task.workload_key}-{variant}-s{seed}.db")
    else:
        db = SQLiteDatabase.in_memory()
    target = str(task.target)
    events: list[tuple[int, float, float]] = []

    def record(p: TuneProgress) -> None:
        events.append((p.total_trials, round(p.elapsed_s, 3), p.best_gflops))

    with db:
        trials = max(0, args.trials - len(first_records(db.records(task.workload_key, target))))
        result = tune(task, trials=trials, db=db, policy=policy, policy_options=options, seed=seed,
                      batch_size=args.batch_size, callbacks=[record], progress=not args.quiet)
        curve = best_curve(db, task.workload_key, target, task.dag.flop_count)
    n_sketches = len(options["sketches"]) if "sketches" in options else None
    return {
        "variant": variant, "seed": seed, "policy": policy,
        "options": {k: v for k, v in options.items() if k != "sketches"}, "sketches": n_sketches,
        "trials": result.trials, "total_trials": result.total_trials, "best_gflops": result.best_gflops,
        "tuning_wall_s": result.tuning_wall_s, "search_overhead_s": result.search_overhead_s,
        "build_s": result.build_s, "run_s": result.run_s, "errors": dict(result.errors),
        "curve": curve, "progress": events,
    }


def _mean_curve(curves: list[list[float]]) -> list[float]:
    n = min(len(c) for c in curves) if curves else 0
    return [float(np.mean([c[i] for c in curves])) for i in range(n)]


def checkpoints(budget: int, points: int) -> list[int]:
    """`points` trial counts spread evenly over 1..budget (the last is the budget)."""
    if budget <= 0:
        return []
    return sorted({max(1, round(budget * k / points)) for k in range(1, points + 1)})


def print_table(out: dict, points: int, stream: Any = None) -> None:
    stream = stream or sys.stdout
    best = out["best_gflops"] or 0.0
    budget = max((len(v["mean_curve"]) for v in out["variants"].values()), default=0)
    marks = checkpoints(budget, points)
    head = f"{'variant':<15} " + " ".join(f"{m:>7}" for m in marks) + f" {'rel':>5} {'tune s':>7} {'ovh s':>6}"
    print(f"best GFLOP/s so far after N trials ({out['desc']}; mean over seeds {out['seeds']}); "
          "rel = final best / best of all variants", file=stream)
    print(head, file=stream)
    print("-" * len(head), file=stream)
    for name, v in out["variants"].items():
        c = v["mean_curve"]
        cells = " ".join(f"{c[m - 1]:>7.2f}" if m <= len(c) else f"{'-':>7}" for m in marks)
        rel = c[-1] / best if c and best > 0 else 0.0
        print(f"{name:<15} {cells} {rel:>5.2f} {v['tuning_wall_s']:>7.1f} {v['search_overhead_s']:>6.1f}",
              file=stream)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes = SUITE["C2D"][1]
    parser.add_argument("--shape-index", type=int, default=DEFAULT_SHAPE_INDEX,
                        help=f"index into the suite's C2D shapes (default {DEFAULT_SHAPE_INDEX}: "
                             f"{','.join(map(str, shapes[DEFAULT_SHAPE_INDEX]))})")
    parser.add_argument("--shape", default=None, help="an explicit C2D config H,W,CI,CO,K,STRIDE,PAD instead")
    parser.add_argument("--batch", type=int, default=1, help="batch size (default 1; the paper uses 16)")
    parser.add_argument("--trials", type=int, default=256, help="trial budget of every variant (default 256)")
    parser.add_argument("--variants", default=",".join(ABLATIONS), help=f"comma separated, of {', '.join(ABLATIONS)}")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; curves are averaged (default 0)")
    parser.add_argument("--batch-size", type=int, default=32, help="programs measured per round (default 32)")
    parser.add_argument("--population", type=int, default=None, help="evolutionary population (default: policy's)")
    parser.add_argument("--target", default="cpu", help="tuning target (default cpu)")
    parser.add_argument("--db-dir", default=None, help="keep one database per variant and seed here (resumable)")
    parser.add_argument("--json", metavar="FILE", help="write every curve as JSON")
    parser.add_argument("--points", type=int, default=8, help="trial counts shown in the table (default 8)")
    parser.add_argument("--quiet", action="store_true", help="no tuning progress lines")
    args = parser.parse_args(argv)
    variants = [v.strip().lower() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in variants if v not in ABLATIONS]
    if bad or not variants:
        parser.error(f"--variants: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(ABLATIONS)}")
    args.variant_list = variants
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds {args.seeds!r} is not a comma-separated list of integers")
    if args.trials < 0 or args.batch_size < 1 or args.points < 1 or not args.seed_list:
        parser.error("need --trials >= 0, --batch-size >= 1, --points >= 1 and at least one seed")
    if args.shape is None and not 0 <= args.shape_index < len(shapes):
        parser.error(f"--shape-index must be in 0..{len(shapes) - 1}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    shape = args.shape or ",".join(map(str, SUITE["C2D"][1][args.shape_index]))
    name, config, dag = parse_workload("C2D", shape, args.batch)
    desc = f"{name}({','.join(map(str, config))}) batch={args.batch}"
    task = make_task(dag, Target.parse(args.target), desc=desc)
    start = time.perf_counter()
    out: dict[str, Any] = {
        "op": name, "shape": list(config), "batch": args.batch, "desc": desc, "workload_key": dag.workload_key,
        "flops": dag.flop_count, "trials": args.trials, "batch_size": args.batch_size,
        "population": args.population, "seeds": args.seed_list, "variants": {}, "best_gflops": 0.0,
    }
    for variant in args.variant_list:
        runs = [run_variant(variant, seed, task, args) for seed in args.seed_list]
        out["variants"][variant] = {
            "runs": runs, "mean_curve": _mean_curve([r["curve"] for r in runs]),
            "best_gflops": max(r["best_gflops"] for r in runs),
            "tuning_wall_s": float(np.mean([r["tuning_wall_s"] for r in runs])),
            "search_overhead_s": float(np.mean([r["search_overhead_s"] for r in runs])),
        }
        print(f"[ablation] {variant}: best {out['variants'][variant]['best_gflops']:.2f} GFLOP/s", file=sys.stderr,
              flush=True)
    best = max(v["best_gflops"] for v in out["variants"].values())
    out["best_gflops"] = best
    for v in out["variants"].values():
        v["relative_curve"] = [g / best if best > 0 else 0.0 for g in v["mean_curve"]]
    out["wall_s"] = time.perf_counter() - start
    print_table(out, args.points)
    print(f"(trials {args.trials} per variant, batch size {args.batch_size}; wall {out['wall_s']:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2, default=str)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
