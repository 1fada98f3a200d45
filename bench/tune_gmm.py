"""Tune GMM (1024³ by default) with the Ansor policy, then time the best next to NumPy in the same run.

    python bench/tune_gmm.py [--size 1024] [--trials 128] [--batch-size 32] [--db FILE] [--json FILE]

Both runtimes use 2 threads; the ratio is the median of alternating blocks (see demo.median_seconds).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen import build, tune  # noqa: E402
from tensorgen.demo import median_seconds  # noqa: E402
from tensorgen.runtime import aligned, aligned_empty  # noqa: E402
from tensorgen.te.ops.suite import make_gmm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--db", default=None, help="tuning database (default: in memory)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    n = args.size
    inputs, outputs = make_gmm(n, n, n)
    result = tune(inputs + outputs, trials=args.trials, db=args.db, policy="ansor", batch_size=args.batch_size)
    func = build(result.best_state)
    func.set_num_threads(2)
    rng = np.random.default_rng(0)
    a, b = (aligned(rng.uniform(-1, 1, (1, n, n)).astype("float32")) for _ in range(2))
    c = aligned_empty((1, n, n), "float32")
    func(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-3, atol=1e-3 * n)
    flops = 2.0 * n**3
    ours, peer = [], []
    for _ in range(5):
        ours.append(flops / median_seconds(lambda: func(a, b, c), 5, 2, 0.5) / 1e9)
        peer.append(flops / median_seconds(lambda: a[0] @ b[0], 5, 2, 0.5) / 1e9)
    out = {**result.to_dict(), "tuned_gflops": float(np.median(ours)), "numpy_gflops": float(np.median(peer)),
           "ratio": float(np.median(np.array(ours) / np.array(peer)))}
    print(f"GMM {n}: tuned {out['tuned_gflops']:.1f} GFLOP/s, NumPy {out['numpy_gflops']:.1f} "
          f"(ratio {out['ratio']:.2f}); {result.trials} trials, {result.tuning_wall_s:.0f} s tuning, "
          f"{result.search_overhead_s:.0f} s search overhead")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
