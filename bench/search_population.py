"""The evolution's generation size against a model's tuning time: Ansor's policy with a generation of
`population_per_trial` programs per measured one (SketchConfig; none: the fixed population of 2048), the same trials,
the same seed, rounds of 16 per task as `tensorgen tune MODEL` does; the search, build and run seconds and the
scheduler's estimated model latency (the sum of its tasks' measured bests, weighted).

    python bench/search_population.py MODEL {none|32} SEED TRIALS [--db-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from tensorgen.graph import extract_tasks, load_graph
from tensorgen.tuning.scheduler import SchedulerConfig, TaskScheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("population_per_trial", help="programs per measured program in each generation, or none")
    parser.add_argument("seed", type=int)
    parser.add_argument("trials", type=int)
    parser.add_argument("--db-dir", default=".", help="where the tuning database goes (one per run)")
    args = parser.parse_args()
    per_trial = None if args.population_per_trial == "none" else int(args.population_per_trial)
    graph = load_graph(args.model)
    scheduler = TaskScheduler.from_models({graph.name: extract_tasks(graph)}, seed=args.seed,
                                          config=SchedulerConfig(round_trials=16))
    db = Path(args.db_dir) / f"{args.model}_per_trial_{args.population_per_trial}_{args.seed}.db"
    db.unlink(missing_ok=True)
    start = time.perf_counter()
    result = scheduler.tune(args.trials, db=db, policy="ansor", policy_options={"population_per_trial": per_trial})
    estimate = result.models[graph.name]
    print(json.dumps({"model": args.model, "population_per_trial": per_trial, "seed": args.seed,
                      "trials": result.trials, "wall_s": round(time.perf_counter() - start, 1),
                      "search_s": round(result.search_s, 1), "build_s": round(result.build_s, 1),
                      "run_s": round(result.run_s, 1), "estimated_ms": estimate * 1e3 if estimate else None}))


if __name__ == "__main__":
    main()
