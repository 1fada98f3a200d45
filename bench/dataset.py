"""A TenSet-style data set of measured programs (Pruner §3.2, TenSet): the zoo's tasks, a few hundred programs each,
measured on this machine into one tuning database (every record carries the hardware parameters and the target).

    python bench/dataset.py --models resnet18,dcgan,bert_tiny,convnext_tiny,vit_small --programs 128 \\
                            [--target "cpu -mcpu=haswell"] [--db dataset.db] [--random-share 0.5] [--minutes 60]

Each task (distinct subgraph of the models, in order of first occurrence) gets `programs` measured programs:
`random-share` of them random programs of its sketches (the space as it is), the rest from Ansor's search, which
learns from them (the programs a search measures: fast ones). `--target "cpu -mcpu=haswell"` measures AVX2 programs
on an AVX-512 machine (the other ISA, for transfer). It resumes from the database, and stops between tasks after
`--minutes`. Train a model on it with `tensorgen costmodel train --db dataset.db -o model.pt`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

from tensorgen.graph.backend.tasks import extract_tasks  # noqa: E402
from tensorgen.graph.load import load_graph  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402
from tensorgen.records.record import first_records  # noqa: E402
from tensorgen.target import Target  # noqa: E402
from tensorgen.tuning.tune import tune  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet18,dcgan,bert_tiny,convnext_tiny,vit_small")
    p.add_argument("--programs", type=int, default=128, help="measured programs per task")
    p.add_argument("--random-share", type=float, default=0.5, help="share of random programs (the rest: searched)")
    p.add_argument("--target", default="cpu")
    p.add_argument("--db", default="dataset.db")
    p.add_argument("--minutes", type=float, default=None, help="stop between tasks after this long")
    p.add_argument("--threads", default="2", help="(read by thread_env)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    target = Target.parse(args.target)
    tasks, seen = [], set()
    for model in args.models.split(","):
        for mt in extract_tasks(load_graph(model), target):
            if mt.task.workload_key not in seen:
                seen.add(mt.task.workload_key)
                tasks.append((model, mt.task))
    print(f"{len(tasks)} distinct tasks of {args.models}; {args.programs} programs each into {args.db} "
          f"(target {target})", flush=True)
    start = time.perf_counter()
    for n, (model, task) in enumerate(tasks):
        if n and args.minutes is not None and time.perf_counter() - start > 60 * args.minutes:
            print(f"stopped after {args.minutes} minutes, {n} of {len(tasks)} tasks done", flush=True)
            break
        with SQLiteDatabase(args.db) as db:
            have = len(first_records(db.records(task.workload_key, str(task.target))))
        random_goal = int(round(args.random_share * args.programs))
        t0 = time.perf_counter()
        for policy, goal in (("random", random_goal), ("ansor", args.programs)):
            if have < goal:
                result = tune(task, trials=goal - have, db=args.db, policy=policy, seed=args.seed, batch_size=16)
                have += result.trials
                if result.interrupted:
                    return 130
        print(f"[{n + 1}/{len(tasks)}] {model}: {task.desc} ({task.dag.flop_count / 1e6:.1f} MFLOP): {have} "
              f"programs, {time.perf_counter() - t0:.0f} s; {time.perf_counter() - start:.0f} s in all", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
