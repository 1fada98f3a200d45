"""Tune GMM (1024³ by default) with the Ansor policy, then time the best next to NumPy in the same run.

    python bench/tune_gmm.py [--size 1024] [--trials 128] [--batch-size 32] [--db FILE] [--json FILE]
                             [--rounds 3] [--bound 0.1] [--load] ...

Both runtimes use 2 threads and write into preallocated outputs; timing follows tensorgen/timing.py (the
ratio is the ratio of the GFLOP/s, both medians over rounds that must agree within --bound).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen import build, tune  # noqa: E402
from tensorgen.runtime import aligned, aligned_empty  # noqa: E402
from tensorgen.te.ops.suite import make_gmm  # noqa: E402
from tensorgen.timing import add_arguments, compare, competing_load, describe_load, protocol_from  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--db", default=None, help="tuning database (default: in memory)")
    parser.add_argument("--json", metavar="FILE")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        protocol = protocol_from(args)
    except ValueError as err:
        parser.error(str(err))
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
    c_numpy = np.empty_like(c)
    with competing_load(args.load) as pid:
        loaded = describe_load(pid)
        timed = compare({"tensorgen": lambda: func(a, b, c), "numpy": lambda: np.matmul(a, b, out=c_numpy)},
                        protocol)
    gflops = timed.gflops(2.0 * n**3)
    out = {**result.to_dict(), "tuned_gflops": gflops["tensorgen"], "numpy_gflops": gflops["numpy"],
           "ratio": timed.ratios["numpy"], "reliable": timed.reliable, "timing": timed.to_json(), "load": loaded}
    verdict = "" if timed.reliable else f"; UNRELIABLE: {timed.disagreement()}"
    print(f"GMM {n}: tuned {out['tuned_gflops']:.1f} GFLOP/s, NumPy {out['numpy_gflops']:.1f} "
          f"(ratio {out['ratio']:.2f}, {timed.rounds} rounds{verdict}); {result.trials} trials, "
          f"{result.tuning_wall_s:.0f} s tuning, {result.search_overhead_s:.0f} s search overhead")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
