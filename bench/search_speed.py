"""How fast the Ansor search proposes programs: states scored per second by the evolutionary search.

    python bench/search_speed.py [--ops GMM,C2D] [--population 2048] [--generations 4] [--json FILE]

Each case builds a SketchPolicy (random cost model: no training in the timing) and times one
`next_batch(64)`: random sampling, evolution, feature extraction and prediction. Reported per case:
wall seconds, new states (programs whose features had to be computed) per second, states scored per second (the cost
model's predictions, cache hits included). With workers (default: one per core) the new states are
counted as the children the workers made plus what this process extracted.
"""

from __future__ import annotations

import argparse
import json
import time

from tensorgen.costmodel.base import RandomModel
from tensorgen.search.sketch_policy import SketchPolicy
from tensorgen.te.ops import suite
from tensorgen.tuning.tune import make_task

CASES = {
    "GMM": lambda: suite.make_gmm(1024, 1024, 1024),
    "C2D": lambda: suite.make_c2d(56, 56, 64, 64, 3, 1, 1),
    "NRM": lambda: suite.make_nrm(256, 256),
}


class _Counting(RandomModel):
    """RandomModel that counts how many states it scored (and claims to be trained, so that the
    policy runs the evolutionary search instead of sampling)."""

    scored = 0
    trained = True

    def predict(self, features):
        self.scored += len(features)
        return super().predict(features)


def measure(name: str, population: int, generations: int, seed: int = 0, workers: int | None = None) -> dict:
    ins, outs = CASES[name]()
    task = make_task(ins + outs)
    model = _Counting(seed)
    policy = SketchPolicy.from_options(task, cost_model=model, seed=seed, population=population,
                                     generations=generations,
                          workers=workers)
    t0 = time.perf_counter()
    batch = policy.next_batch(64)
    wall = time.perf_counter() - t0
    st = policy.extractor.stats
    policy.evolution.close()
    new = st["misses"] + st["added"]
    return {"op": name, "population": population, "generations": generations, "workers": policy.evolution.workers,
            "proposed": len(batch),
            "wall_s": wall, "new_states": new, "new_states_per_s": new / wall,
            "scored": model.scored, "scored_per_s": model.scored / wall}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="GMM,C2D,NRM")
    parser.add_argument("--population", type=int, default=2048)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--workers", type=int, default=None, help="child-making processes (default: one per core)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    rows = [measure(op, args.population, args.generations, workers=args.workers) for op in args.ops.split(",")]
    print(f"{'op':5} {'workers':>7} {'wall s':>7} {'new/s':>7} {'scored/s':>9}")
    for r in rows:
        print(f"{r['op']:5} {r['workers']:7d} {r['wall_s']:7.2f} {r['new_states_per_s']:7.0f} {r['scored_per_s']:9.0f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
