"""Networks (Ansor §7.3): tune each model with the task scheduler, then time the compiled model next to
ONNX Runtime and PyTorch in the same run.

    python bench/networks.py [--models resnet50,mobilenet_v2,bert_base,dcgan] [--batches 1]
                             [--trials 512] [--round-trials 16] [--db networks.db] [--threads 2]
                             [--candidates K] [--json FILE]

`--trials` is the budget per model (all its tasks together); `--trials 0` benchmarks what the database
already holds. Tuning resumes from --db, so a run can be extended later.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tensorgen.graph.compare import Comparison, compare
from tensorgen.graph.load import load_graph
from tensorgen.graph.tasks import extract_tasks
from tensorgen.records.database import SQLiteDatabase
from tensorgen.search.scheduler import ProgressTable, TaskScheduler
from tensorgen.tune import default_runner

DEFAULT_MODELS = "resnet50,mobilenet_v2,bert_base,dcgan"


def tune_model(name: str, batch: int, trials: int, db: str, seed: int, round_trials: int, strategy: str,
               transfer: bool, hot_weights: bool = False) -> dict:
    graph = load_graph(name, batch=batch)
    tasks = extract_tasks(graph)
    if trials <= 0:
        return {"tasks": len(tasks), "trials": 0, "tuning_wall_s": 0.0}
    table = ProgressTable(stream=sys.stderr)
    start = time.perf_counter()
    try:
        scheduler = TaskScheduler.from_models({graph.name: tasks}, seed=seed, round_trials=round_trials,
                                              strategy=strategy, transfer=transfer, callbacks=[table])
        result = scheduler.tune(trials, db=db, runner=default_runner(evict_weights=not hot_weights))
    finally:
        table.close()
    return {"tasks": len(tasks), "trials": result.trials, "tuning_wall_s": time.perf_counter() - start,
            "estimated_ms": (result.models.get(graph.name) or 0) * 1e3 or None}


def _compare(name: str, db: str, threads: int, batch: int, blocks: int, candidates: int) -> Comparison:
    with SQLiteDatabase(db) as records:
        return compare(name, db=records, threads=threads, batch=batch, blocks=blocks, candidates=candidates)


def compare_fresh(name: str, db: str, threads: int, batch: int, blocks: int, candidates: int = 1) -> Comparison:
    """`compare` in a new interpreter: timed in the process that had just tuned ResNet-50, the model ran
    at 34.8-35.8 ms; in a fresh one, as `tensorgen bench` runs it, at 32.5 (ONNX Runtime 30.8 and 30.1)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_compare, name, db, threads, batch, blocks, candidates).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"zoo names (default {DEFAULT_MODELS})")
    parser.add_argument("--batches", default="1", help="comma separated batch sizes (default 1)")
    parser.add_argument("--trials", type=int, default=512, help="measurement trials per model (default 512)")
    parser.add_argument("--db", default="networks.db", help="tuning database (default networks.db)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=7, help="alternating timing blocks per engine")
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
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            tuning = tune_model(name, batch, args.trials, args.db, args.seed, args.round_trials, args.strategy,
                                args.transfer, args.hot_weights)
            result = compare_fresh(name, args.db, args.threads, batch, args.blocks, args.candidates)
            row = {**result.__dict__, "batch": batch, **tuning, "strategy": args.strategy,
                   "transfer": args.transfer, "hot_weights": args.hot_weights, "candidates": args.candidates,
                   "ratios": result.ratios()}
            rows.append(row)
            ratios = "  ".join(f"{k} {v:.2f}x" for k, v in row["ratios"].items())
            print(f"{name} b{batch}: tensorgen {result.tensorgen_ms:.2f} ms, onnxruntime {result.onnxruntime_ms} ms, "
                  f"torch {result.torch_ms} ms; speedup {ratios}; {tuning['trials']} trials in "
                  f"{tuning['tuning_wall_s']:.0f} s; {result.tuned_tasks}/{result.total_tasks} tasks tuned", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
