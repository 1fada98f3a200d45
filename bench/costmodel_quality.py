"""Cost-model quality on held-out measured programs (Ansor §7.5): pairwise accuracy, recall@k, RMSE, R².

Two phases, so the (slow) measurements are taken once and the (cheap) evaluation can be re-run whenever the
feature code or the cost model changes:

    python bench/costmodel_quality.py collect  [--n 1000] [--db /tmp/c2d_costmodel.db] [--op c2d --shape ...]
    python bench/costmodel_quality.py evaluate [--db /tmp/c2d_costmodel.db] [--json FILE] [--folds 5]

collect   measures N distinct random programs of one task (random annotation of its sketches, i.e.
          ``tune(..., policy="random")``) into a SQLite tuning database. It resumes: records already in the
          database for the task count towards N. The default task is the ResNet C2D of the issue: conv2d
          56x56, 64->64, 3x3, stride 1, padding 1, batch 1, NHWC.
evaluate  loads every record of the task from the database (replayed on the DAG embedded in the records),
          extracts features with a fresh FeatureExtractor (timed: states/s), labels each program with
          throughput = flop / median measured cost (0 for failed measurements), and runs a seeded K-fold
          cross-validation (default 5 folds = five 80/20 train/test splits, Ansor used one 80/20 split):
          XGBModel (and RandomModel as the zero-information baseline) is trained on the training part and
          predicts the held-out part. Metrics per fold, as in Ansor §7.5, on throughput normalized to the best
          program of the test fold (the paper's normalization; `tensorgen.costmodel.metrics.evaluate`):
          RMSE, R², pairwise comparison accuracy (chance 0.5) and recall@k of the top-k programs
          (|top-k by truth ∩ top-k by prediction| / k, chance about k / n_test). Default k = 10 (Ansor's
          Figure 3) and 30 (Ansor's §7.5 reports recall@30: 0.079 RMSE, 0.958 R², 0.851 pairwise, 0.624
          recall@30 on 5,000 test programs collected *during search*; random programs are a harder, more
          uniform sample, mostly slow, so the numbers are not directly comparable).

The table prints mean ± std over folds; ``--json`` also keeps every fold. The collection's wall time and rate are
read back from the records' commit timestamps, so they are reported even when evaluate runs much later.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_DB = "/tmp/c2d_costmodel.db"
DEFAULT_OP = "c2d"
DEFAULT_SHAPE = "56,56,64,64,3,1,1"  # ResNet-50 conv 3x3 (the C2D target), NHWC, batch 1
DEFAULT_KS = (10, 30)


# ---------------------------------------------------------------------------------------------
# the task


def make_dag(op: str, shape: str, batch: int = 1):
    """The ComputeDAG of a suite operator `op` with the comma-separated shape config `shape`."""
    from tensorgen.dag import ComputeDAG
    from tensorgen.te.ops.suite import SUITE

    names = {name.lower(): name for name in SUITE}
    if op.lower() not in names:
        raise SystemExit(f"unknown operator {op!r}; the suite has {', '.join(SUITE)}")
    make, _ = SUITE[names[op.lower()]]
    config = tuple(int(v) for v in shape.split(","))
    inputs, outputs = make(*config, batch=batch)
    return ComputeDAG(list(inputs) + list(outputs))


def make_task(args: argparse.Namespace):
    from tensorgen.tuning.tune import make_task as _make_task

    dag = make_dag(args.op, args.shape, args.batch)
    return _make_task(dag, args.target, desc=f"{args.op.upper()}({args.shape})"
                      + (f" batch={args.batch}" if args.batch != 1 else ""))


# ---------------------------------------------------------------------------------------------
# collect


def collect(args: argparse.Namespace) -> dict[str, Any]:
    """Measure random programs until the database holds `args.n` records of the task; return a summary."""
    from tensorgen.measure.runner import LocalRunner
    from tensorgen.records.database import SQLiteDatabase
    from tensorgen.records.record import first_records
    from tensorgen.tuning.tune import MeasureConfig, tune

    task = make_task(args)
    db = SQLiteDatabase(args.db)
    try:
        have = len(first_records(db.records(task.workload_key, str(task.target))))
        todo = max(0, args.n - have)
        print(f"[collect] {task.desc} ({task.workload_key}): {have} records in {args.db}, measuring {todo} more "
              f"(flop {task.dag.flop_count:.3g})", flush=True)
        measure = MeasureConfig(run_timeout=args.run_timeout)
        if args.number is not None or args.repeat is not None:
            # an explicit runner disables tune()'s slow-candidate timeout shrink; keep the run timeout modest
            measure = MeasureConfig(runner=LocalRunner(timeout=args.run_timeout, number=args.number or 3,
                                                       repeat=args.repeat or 3))
        t0 = time.perf_counter()

        def progress(p) -> None:
            rate = p.trials_done / p.elapsed_s if p.elapsed_s > 0 else 0.0
            print(f"[collect] {p.phase} {p.trials_done}/{p.trials} (+{p.total_trials - p.trials_done} resumed) "
                  f"best {p.best_gflops:.2f} GFLOP/s  errors {p.errors}  {p.elapsed_s:.0f}s  {rate:.2f} programs/s",
                  flush=True)

        result = tune(task, trials=todo, db=db, policy="random", seed=args.seed, batch_size=args.batch_size,
                      measure=measure, callbacks=[progress]) if todo else None
        wall = time.perf_counter() - t0
        total = len(first_records(db.records(task.workload_key, str(task.target))))
    finally:
        db.close()
    summary = {"db": args.db, "workload_key": task.workload_key, "desc": task.desc, "records": total,
               "measured_now": result.trials if result else 0, "wall_s": wall,
               "programs_per_s": (result.trials / wall) if result and wall > 0 else None,
               "tune": result.to_dict() if result else None}
    if result is not None:
        summary["tune"].pop("best_steps", None)
    print(f"[collect] done: {summary['measured_now']} measured in {wall:.0f}s, {total} records of the task in "
          f"{args.db}; errors {result.errors if result else {}}", flush=True)
    return summary


# ---------------------------------------------------------------------------------------------
# evaluate


def load_programs(db_path: str, workload_key: str | None) -> tuple[list, list, dict]:
    """(states, records, info) of one workload in the database; all targets of it, in commit order."""
    from tensorgen.errors import TensorgenError
    from tensorgen.records.database import SQLiteDatabase
    from tensorgen.records.record import first_records

    if not Path(db_path).exists():
        raise SystemExit(f"no database at {db_path}; run the collect phase first")
    db = SQLiteDatabase(db_path)
    try:
        workloads = db.workloads()
        if workload_key is None:
            if not workloads:
                raise SystemExit(f"{db_path} holds no records")
            workload_key = max(workloads, key=lambda w: w[2])[0]
        elif workload_key not in {w[0] for w in workloads}:
            listed = ", ".join(f"{k} ({n} records)" for k, _, n in workloads) or "none"
            raise SystemExit(f"{db_path} has no records of workload {workload_key}; it has: {listed}")
        t0 = time.perf_counter()
        records = first_records(db.records(workload_key))  # one sample per program
        states, kept, unreplayable = [], [], 0
        dag = records[0].compute_dag if records else None
        for rec in records:
            try:
                states.append(rec.state(dag))
            except TensorgenError:
                unreplayable += 1
                continue
            kept.append(rec)
        replay_s = time.perf_counter() - t0
    finally:
        db.close()
    info = {"workload_key": workload_key, "records": len(records), "unreplayable": unreplayable,
            "replay_s": replay_s, "collection": collection_timing(db_path, workload_key)}
    return states, kept, info


def collection_timing(db_path: str, workload_key: str) -> dict[str, Any]:
    """Wall time and rate of the collection, from the records' commit timestamps (first to last commit)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        n, first, last = conn.execute("SELECT COUNT(DISTINCT steps_hash), MIN(created), MAX(created) FROM records "
                                      "WHERE workload_key = ?", (workload_key,)).fetchone()  # re-timings not counted
    span = (last - first) if n else 0.0
    # n - 1 intervals between n commits; the first program's own measurement time is not in the span
    return {"records": n, "first_commit": first, "last_commit": last, "span_s": span,
            "programs_per_s": (n - 1) / span if n > 1 and span > 0 else None}


def throughputs(records: list, flop: float, cost: str = "median") -> np.ndarray:
    """flop / mean (or median) measured cost per record; 0 for failures (as the cost model is trained)."""
    reduce = {"mean": np.mean, "median": np.median}[cost]
    out = np.zeros(len(records))
    for i, rec in enumerate(records):
        costs = [c for c in rec.result.costs if math.isfinite(c) and c > 0]
        if rec.ok and costs:
            out[i] = flop / float(reduce(costs))
    return out


def extract_features(states: list, hw) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Features of every state with a fresh (cold) FeatureExtractor, timed."""
    from tensorgen.features.extractor import FeatureExtractor

    extractor = FeatureExtractor(hw)
    t0 = time.perf_counter()
    feats = extractor.extract(states)
    seconds = time.perf_counter() - t0
    stats = dict(extractor.stats)
    widths = sorted({f.shape[1] for f in feats})
    rows = [f.shape[0] for f in feats]
    return feats, {"seconds": seconds, "states_per_s": len(states) / seconds if seconds > 0 else None,
                   "lower_s": stats["lower_s"], "features_s": stats["features_s"],
                   "failures": stats["failures"], "n_features": widths,
                   "statements_per_program": {"min": min(rows, default=0), "mean": float(np.mean(rows or [0])),
                                              "max": max(rows, default=0)}}


def fold_indices(n: int, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded K-fold split of range(n): K (train, test) index pairs; every index is tested exactly once."""
    if folds < 2 or folds > n:
        raise SystemExit(f"need 2 <= folds <= number of programs ({n}), got {folds}")
    perm = np.random.default_rng(seed).permutation(n)
    parts = np.array_split(perm, folds)
    return [(np.sort(np.concatenate(parts[:i] + parts[i + 1:])), np.sort(parts[i])) for i in range(folds)]


def make_models(names: list[str], seed: int, num_rounds: int, nthread: int | None = None) -> dict[str, Any]:
    from tensorgen.costmodel.base import RandomModel
    from tensorgen.costmodel.xgb import XGBModel

    out: dict[str, Any] = {}
    for name in names:
        if name == "xgb":
            out[name] = XGBModel(seed=seed, num_rounds=num_rounds, min_samples=1, nthread=nthread)
        elif name == "random":
            out[name] = RandomModel(seed=seed)
        else:
            raise SystemExit(f"unknown model {name!r} (xgb, random)")
    return out


def cross_validate(feats: list[np.ndarray], y: np.ndarray, folds: int, seeds: list[int], ks: tuple[int, ...],
                   models: list[str], num_rounds: int, nthread: int | None = None) -> dict[str, Any]:
    """Per model: every fold's metrics and train/predict seconds, and their mean/std."""
    from tensorgen.costmodel.metrics import evaluate_at_ks, summarize_folds

    per_model: dict[str, list[dict[str, float]]] = {m: [] for m in models}
    for seed in seeds:
        for fold, (train, test) in enumerate(fold_indices(len(feats), folds, seed)):
            for name, model in make_models(models, seed * 1000 + fold, num_rounds, nthread).items():
                t0 = time.perf_counter()
                model.update([feats[i] for i in train], y[train])
                t1 = time.perf_counter()
                pred = model.predict([feats[i] for i in test])
                t2 = time.perf_counter()
                row = evaluate_at_ks(y[test], pred, ks=ks)
                row.update({"seed": seed, "fold": fold, "n_train": int(train.size), "n_test": int(test.size),
                            "train_s": t1 - t0, "predict_s": t2 - t1})
                per_model[name].append(row)
    return {name: {**summarize_folds(rows), "folds": rows} for name, rows in per_model.items()}


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Load, featurize, cross-validate; return the JSON-able report."""
    from tensorgen.costmodel.metrics import metric_names
    from tensorgen.target import HardwareParams

    key = args.workload
    if key is None and not args.any_workload:
        key = make_dag(args.op, args.shape, args.batch).workload_key
    states, records, info = load_programs(args.db, key)
    if len(states) < args.folds:
        raise SystemExit(f"only {len(states)} replayable programs of {info['workload_key']} in {args.db}")
    dag = states[0].dag
    hw = HardwareParams.from_dict(records[0].hw)
    y = throughputs(records, dag.flop_count, args.cost)
    feats, fx = extract_features(states, hw)
    # --ok-only drops failed measurements (their label 0 is partly an artifact of the run timeout)
    keep = np.flatnonzero(y > 0) if args.ok_only else np.arange(len(y))
    t0 = time.perf_counter()
    cv = cross_validate([feats[i] for i in keep], y[keep], args.folds, args.seeds, tuple(args.k), args.models,
                        args.num_rounds, args.nthread)
    ok = y > 0
    report = {
        "benchmark": "costmodel_quality", "db": str(args.db), **info,
        "programs": len(states), "ok": int(ok.sum()), "failed": int((~ok).sum()),
        "flop": dag.flop_count,
        "best_gflops": float(y.max() / 1e9) if y.size else 0.0,
        "median_gflops_ok": float(np.median(y[ok]) / 1e9) if ok.any() else 0.0,
        "label": f"throughput = flop / {args.cost}(costs), 0 for failures; normalized to the best of each test fold",
        "cost": args.cost,
        "features": fx, "folds": args.folds, "seeds": args.seeds, "ks": list(args.k),
        "xgb_num_rounds": args.num_rounds, "xgb_nthread": args.nthread, "ok_only": args.ok_only,
        "metrics": metric_names(tuple(args.k)), "models": cv,
        "cv_s": time.perf_counter() - t0, "hw": records[0].hw,
        "host": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count()},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    return report


def format_table(report: dict[str, Any]) -> str:
    """The per-model metrics as an aligned text table (mean ± std over folds), plus the context lines."""
    names = report["metrics"]
    header = ["model", *names]
    rows = [header]
    for model, res in report["models"].items():
        rows.append([model, *(f"{res['mean'][m]:.3f} ± {res['std'][m]:.3f}" for m in names)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    fx, coll = report["features"], report["collection"]
    rate = coll["programs_per_s"]
    n_test = report["models"][next(iter(report["models"]))]["folds"][0]["n_test"]
    context = [
        f"workload {report['workload_key']}: {report['programs']} programs ({report['ok']} ok, "
        f"{report['failed']} failed), best {report['best_gflops']:.2f} GFLOP/s, median ok "
        f"{report['median_gflops_ok']:.2f} GFLOP/s",
        f"{report['folds']}-fold CV x seeds {report['seeds']} (~{n_test} test programs per fold); "
        f"mean ± std over folds; label flop / {report['cost']} cost, "
        + ("failed programs left out" if report["ok_only"] else "failed programs = 0"),
        f"feature extraction: {fx['states_per_s']:.0f} states/s cold ({fx['seconds']:.2f} s for "
        f"{report['programs']}: lower {fx['lower_s']:.2f} s, features {fx['features_s']:.2f} s), "
        f"{fx['statements_per_program']['mean']:.1f} statements/program, width {fx['n_features']}",
        f"collection: {coll['records']} records over {coll['span_s']:.0f} s"
        + (f" ({rate:.2f} programs/s)" if rate else ""),
    ]
    return "\n".join(context + [""] + lines)


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="phase", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", default=DEFAULT_DB, help=f"the SQLite tuning database (default {DEFAULT_DB})")
        p.add_argument("--op", default=DEFAULT_OP, help=f"suite operator (default {DEFAULT_OP})")
        p.add_argument("--shape", default=DEFAULT_SHAPE, help=f"its shape config (default {DEFAULT_SHAPE})")
        p.add_argument("--batch", type=int, default=1)
        p.add_argument("--json", metavar="FILE", help="write the report/summary as JSON")

    c = sub.add_parser("collect", help="measure random programs of the task into the database")
    common(c)
    c.add_argument("--n", type=int, default=1000, help="records of the task wanted in the db (default 1000)")
    c.add_argument("--target", default="cpu")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--batch-size", type=int, default=64)
    c.add_argument("--run-timeout", type=float, default=10.0, help="seconds per candidate run (default 10)")
    c.add_argument("--number", type=int, default=None, help="runner calls per repeat (default: tune's runner, 3)")
    c.add_argument("--repeat", type=int, default=None, help="runner repeats (default: tune's runner, 3)")

    e = sub.add_parser("evaluate", help="cross-validate the cost models on the database's programs")
    common(e)
    e.add_argument("--workload", default=None, help="workload key to evaluate (default: the --op/--shape task)")
    e.add_argument("--any-workload", action="store_true", help="evaluate the workload with the most records")
    e.add_argument("--folds", type=int, default=5, help="K of the K-fold split (default 5: 80/20 splits)")
    e.add_argument("--seeds", type=int, nargs="+", default=[0], help="split seeds (default 0)")
    e.add_argument("--k", type=int, nargs="+", default=list(DEFAULT_KS), help="recall@k (default 10 30)")
    e.add_argument("--models", nargs="+", default=["xgb", "random"], help="models (default xgb random)")
    e.add_argument("--num-rounds", type=int, default=200, help="XGBModel boosting rounds (default 200)")
    e.add_argument("--cost", choices=("mean", "median"), default="median",
                   help="label = flop / this of the repeats' costs (default median, as the tuner and records)")
    e.add_argument("--ok-only", action="store_true", help="evaluate on successfully measured programs only")
    e.add_argument("--nthread", type=int, default=None,
                   help="XGBoost threads (default: XGBModel's, one per CPU; 1 is far faster on a busy machine)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.phase == "collect":
        out = collect(args)
    else:
        out = evaluate(args)
        print(format_table(out))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
