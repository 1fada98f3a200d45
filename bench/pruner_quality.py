"""Pruner's two quality tables on this machine (Pruner §3.2, Tables 1 and 2), from measured data sets
(bench/dataset.py):

    python bench/pruner_quality.py models --train-db dataset_avx2.db --test-db heldout.db [--online 64] [--json F]
    python bench/pruner_quality.py models --pretrained pacm.pt --test-db heldout.db [--train-db ...]
    python bench/pruner_quality.py psa --db dataset.db [--sizes 8,16,32] [--programs random|all] [--json F]

models  How well each cost model ranks the programs of tasks it was never trained on, in the online setting of a
        tuning run: a task's first `online` measured programs (commit order) are what the model may learn from,
        the rest are ranked. Models: Ansor's XGBoost from those programs alone; XGBoost pretrained on the training
        databases and then given them; PaCM from those programs alone; PaCM pretrained, without and with momentum
        transfer (MTL: fine-tuned from the pretrained copy on them); PaCM with MTL but without its data-flow
        branch (the ablation). Figures: mean pairwise accuracy and recall@10 over tasks, TenSet's top-1 / top-5
        (sum of the best latencies over the sum of the best latency among each model's k first picks), and the
        seconds to update and to predict. `--pretrained FILE`: the PaCMs start from that file (e.g. the one that
        ships, trained on another machine: the cross-ISA table) instead of one pretrained on --train-db; without
        --train-db the models that need it (XGBoost pretrained, the ablation) are left out.
psa     The static analyzer's pruned space against a random space of the same size (Best-k, Pruner Table 1): per
        task, the random programs measured for it (the `random` runs of bench/dataset.py) are the whole space; the
        target space is the `size` programs PSA estimates fastest, the random space `size` programs drawn at random
        (2000 draws). Best-k = a task's best latency / the k-th best latency in the space (0 where the space has
        fewer than k valid programs), the mean over tasks (and draws); and the mean over tasks of the Spearman
        rank correlation of PSA's estimates with the measured latencies. `--programs all`: every program measured
        for the task is the space (a tuning database's: the searched programs, the tail the draft must rank).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

# isort: split

import numpy as np  # noqa: E402

from tensorgen.costmodel.base import CostModelError  # noqa: E402
from tensorgen.costmodel.pacm import PaCM, PaCMConfig  # noqa: E402
from tensorgen.costmodel.psa import StaticAnalyzer  # noqa: E402
from tensorgen.costmodel.xgb import XGBModel  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402
from tensorgen.target import HardwareParams  # noqa: E402
from tensorgen.tuning.training import TaskData, TrainingSet, load_training_set, ranking_quality  # noqa: E402

# ---------------------------------------------------------------------------------------------
# cost models


def _models(pretrained: dict[str, Path], train: TrainingSet | None, seed: int) -> dict[str, Any]:
    """Fresh models for one held-out task, by name (the PaCMs start from the pretrained files, as `pacm:FILE`);
    without training databases, only the models that need none beyond the pretrained PaCM file."""
    models: dict[str, Any] = {"xgb (online)": XGBModel(seed=seed, min_samples=1)}
    if train is not None:
        models["xgb (pretrained + online)"] = XGBModel(seed=seed, min_samples=1)
        models["xgb (pretrained + online)"].update(*train.arrays())
    models |= {"pacm (online)": PaCM(seed=seed, config=PaCMConfig(min_samples=1)),
               "pacm (pretrained, no update)": PaCM(seed=seed, path=pretrained["pacm"]),
               "pacm + mtl": PaCM(seed=seed, path=pretrained["pacm"])}
    if "no data-flow" in pretrained:
        models["pacm + mtl, no data-flow branch"] = PaCM(seed=seed, path=pretrained["no data-flow"])
    return models


def _pretrain(args: argparse.Namespace, train: TrainingSet) -> tuple[dict[str, Path], dict[str, float]]:
    """PaCM pretrained on the training set, with and without its data-flow branch: their files, and seconds."""
    pretrained, pretrain_s = {}, {}
    for name, dataflow in (("pacm", True), ("no data-flow", False)):
        model = PaCM(seed=args.seed, config=PaCMConfig(dataflow=dataflow))
        t0 = time.perf_counter()
        model.fit(*train.arrays(), steps=args.steps)
        pretrain_s[name] = time.perf_counter() - t0
        pretrained[name] = Path(args.workdir) / f"pretrained_{name.replace(' ', '_')}.pt"
        model.save(pretrained[name])
    return pretrained, pretrain_s


def compare_models(args: argparse.Namespace) -> dict[str, Any]:
    if args.pretrained:
        PaCM(path=args.pretrained)  # a missing or foreign file fails here, before any database is replayed
    train = load_training_set(args.train_db) if args.train_db else None
    test = load_training_set(args.test_db)
    overlap = {t.workload_key for t in train.tasks} & {t.workload_key for t in test.tasks} if train else set()
    test = TrainingSet([t for t in test.tasks if t.workload_key not in overlap and len(t.features) > args.online + 4])
    if not test.tasks:
        raise SystemExit(f"no held-out task of {', '.join(args.test_db)} has more than {args.online + 4} programs")
    print(f"train: {f'{len(train.tasks)} tasks, {train.programs} programs' if train else args.pretrained}; "
          f"held out: {len(test.tasks)} tasks ({len(overlap)} shared with training left out)", flush=True)
    if args.pretrained:
        pretrained, pretrain_s = {"pacm": Path(args.pretrained)}, {}
    else:
        pretrained, pretrain_s = _pretrain(args, train)
    rows: dict[str, dict[str, list]] = {}
    for task in test.tasks:
        first = TaskData(task.workload_key, task.target, task.desc, task.flop, task.features[:args.online],
                         task.throughputs[:args.online])
        rest = TrainingSet([TaskData(task.workload_key, task.target, task.desc, task.flop,
                                     task.features[args.online:], task.throughputs[args.online:])])
        for name, model in _models(pretrained, train, args.seed).items():
            t0 = time.perf_counter()
            if "no update" not in name:
                model.update(*TrainingSet([first]).arrays())
            t1 = time.perf_counter()
            quality = ranking_quality(model, rest)
            row = rows.setdefault(name, {"quality": [], "update_s": [], "predict_s": []})
            row["quality"].append(quality)
            row["update_s"].append(t1 - t0)
            row["predict_s"].append(time.perf_counter() - t1)
    table = {}
    for name, row in rows.items():
        q = row["quality"]
        table[name] = {"pairwise": float(np.mean([x["pairwise"] for x in q])),
                       "recall@10": float(np.mean([x["recall@10"] for x in q])),
                       "top-1": _task_mean(q, "top-1"), "top-5": _task_mean(q, "top-5"),
                       "update_s": float(np.mean(row["update_s"])), "predict_s": float(np.mean(row["predict_s"]))}
    return {"train_dbs": args.train_db, "test_dbs": args.test_db, "online": args.online, "steps": args.steps,
            "train_tasks": len(train.tasks) if train else None, "train_programs": train.programs if train else None,
            "test_tasks": len(test.tasks),
            "pretrain_s": pretrain_s, "pretrained": {k: str(v) for k, v in pretrained.items()},
            "models": table}


def _task_mean(qualities: list[dict[str, float]], key: str) -> float:
    """The mean over tasks of a per-task ratio (each held-out task counted once)."""
    return float(np.mean([q[key] for q in qualities]))


# ---------------------------------------------------------------------------------------------
# PSA Best-k


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks of `x` from 0, ties sharing their mean rank (Spearman's correlation is Pearson's of these)."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - counts + (counts - 1) / 2)[inverse]


def best_k(args: argparse.Namespace) -> dict[str, Any]:
    sizes, ks = [int(s) for s in args.sizes.split(",")], (1, 5)
    target = {(s, k): [] for s in sizes for k in ks}
    random_space: dict[tuple[int, int], list[float]] = {key: [] for key in target}
    rng = np.random.default_rng(args.seed)
    spearman: list[float] = []
    for path in args.db:
        with SQLiteDatabase(path, readonly=True) as db:
            runs = {r.id: r.info.get("policy") for r in db.runs()}
            random_hashes = {m.steps_hash for m in db.measurements() if runs.get(m.run) == "random"}
            for key, tgt, _ in db.workloads():
                records = [r for r in db.records(key, tgt) if args.programs == "all" or r.steps_hash in random_hashes]
                lat = np.array([r.cost if r.ok else math.inf for r in records])
                if len(records) < max(sizes) * 2 or not np.isfinite(lat).any():
                    continue
                dag = records[0].compute_dag
                psa = StaticAnalyzer(HardwareParams.from_dict(records[0].hw)).latencies([r.state(dag) for r in records])
                ok = np.isfinite(lat) & np.isfinite(psa)
                if ok.sum() > 2 and np.ptp(psa[ok]) > 0 and np.ptp(lat[ok]) > 0:
                    spearman.append(float(np.corrcoef(ranks(psa[ok]), ranks(lat[ok]))[0, 1]))
                best = float(lat.min())
                order = np.argsort(psa, kind="stable")
                for s in sizes:  # a space without k valid programs scores 0 (best / inf)
                    draws = np.sort(np.stack([lat[rng.choice(len(lat), s, replace=False)] for _ in range(2000)]), 1)
                    kept = np.sort(lat[order[:s]])
                    for k in (k for k in ks if k <= s):
                        target[(s, k)].append(best / float(kept[k - 1]))
                        random_space[(s, k)].append(float(np.mean(best / draws[:, k - 1])))
    tasks = len(next(iter(target.values())))
    if not tasks:
        raise SystemExit(f"no task of {', '.join(args.db)} has {2 * max(sizes)} or more measured "
                         f"{'' if args.programs == 'all' else 'random '}programs")
    table = {f"size {s}": {f"{space} best-{k}": float(np.mean(ratios[(s, k)]))
                           for space, ratios in (("random", random_space), ("psa", target)) for k in ks if k <= s}
             for s in sizes}
    return {"dbs": args.db, "programs": args.programs, "tasks": tasks, "sizes": sizes, "best_k": table,
            "spearman": float(np.mean(spearman)) if spearman else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="phase", required=True)
    m = sub.add_parser("models")
    m.add_argument("--train-db", action="append", default=[])
    m.add_argument("--pretrained", default=None,
                   help="a PaCM file (tensorgen costmodel train) instead of pretraining on --train-db")
    m.add_argument("--test-db", action="append", required=True)
    m.add_argument("--online", type=int, default=64)
    m.add_argument("--steps", type=int, default=3000, help="pretraining steps")
    m.add_argument("--workdir", default=".", help="where the pretrained models are written")
    s = sub.add_parser("psa")
    s.add_argument("--db", action="append", required=True)
    s.add_argument("--sizes", default="8,16,32")
    s.add_argument("--programs", choices=("random", "all"), default="random",
                   help="the space: the programs of `random` runs (default) or every measured one")
    for q in (m, s):
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--json", default=None)
        q.add_argument("--threads", default="2", help="(read by thread_env)")
    args = p.parse_args(argv)
    if args.phase == "models" and not (args.train_db or args.pretrained):
        p.error("models needs --train-db or --pretrained")
    try:
        report = compare_models(args) if args.phase == "models" else best_k(args)
    except CostModelError as err:
        raise SystemExit(f"pruner_quality: {err}") from None
    print(json.dumps(report, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
