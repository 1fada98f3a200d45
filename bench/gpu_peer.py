"""A matmul tuned by tensorgen for a GPU next to PyTorch's (cuBLAS) on the same GPU, in one run.

    python bench/gpu_peer.py --db DB [--shape 1024,1024,1024] [--target "cuda -device=h200"] [--json F]

The best record in DB of the suite's GMM (batch_matmul, batch 1: (1, N, K) @ (1, K, M)) for the target is built
(tensorgen.build) and timed next to torch.bmm in FP32 (TF32 off: the same work), both through tensorgen.timing.compare
(alternating blocks, rounds that must agree), every call synchronized. The outputs are compared first.
`--peer-device cpu` times PyTorch on the CPU instead (a smoke test where no GPU is at hand; not a comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorgen import ComputeDAG, build  # noqa: E402
from tensorgen.records.apply import apply_best  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402
from tensorgen.te.ops.suite import make_gmm  # noqa: E402
from tensorgen.timing import add_arguments, compare, protocol_from  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", required=True)
    parser.add_argument("--shape", default="1024,1024,1024", help="N,M,K as `tensorgen tune gmm --shape` takes it")
    parser.add_argument("--target", default="cuda -device=h200")
    parser.add_argument("--peer-device", default="cuda")
    parser.add_argument("--json")
    add_arguments(parser)
    args = parser.parse_args(argv)
    n, m, k = (int(x) for x in args.shape.split(","))
    inputs, outputs = make_gmm(n, m, k)
    dag = ComputeDAG(inputs + outputs)
    with SQLiteDatabase(args.db) as db:
        state = apply_best(dag, args.target, db)
    if state is None:
        parser.error(f"{args.db} has no record of GMM {args.shape} for {args.target}")
    f = build(state, target=args.target)
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (1, n, k)).astype("float32"), rng.uniform(-1, 1, (1, k, m)).astype("float32")
    arrays = {"A": a, "B": b}
    device = [f.library.runtime.to_device(arrays[t.name]) for t in f.dag.args[:-1]]
    out = f.library.runtime.empty((1, n, m), "float32")
    f.entry(*device, out)
    torch.backends.cuda.matmul.allow_tf32 = False
    ta, tb = torch.from_numpy(a).to(args.peer_device), torch.from_numpy(b).to(args.peer_device)
    tc = torch.empty((1, n, m), dtype=torch.float32, device=args.peer_device)
    torch.bmm(ta, tb, out=tc)
    error = float(np.abs(out.to_numpy() - tc.cpu().numpy()).max() / np.abs(a @ b).max())
    if error > 1e-4:
        raise SystemExit(f"outputs differ: max error {error:.3g} of max |A @ B|")
    sync = torch.cuda.synchronize if args.peer_device == "cuda" else (lambda: None)
    timed = compare({"tensorgen": lambda: f.entry(*device, out),
                     "torch": lambda: (torch.bmm(ta, tb, out=tc), sync())}, protocol_from(args))
    gflops = timed.gflops(2.0 * n * m * k)
    result = {"target": args.target, "shape": [n, m, k], "tensorgen_gflops": gflops["tensorgen"],
              "torch_gflops": gflops["torch"], "torch_over_tensorgen": timed.ratios["torch"],
              "reliable": timed.reliable, "rounds": timed.rounds, "max_error": error}
    verdict = "" if timed.reliable else f"; UNRELIABLE: {timed.disagreement()}"
    print(f"GMM {args.shape} on {args.target}: tensorgen {gflops['tensorgen']:.0f} GFLOP/s, torch "
          f"({args.peer_device}) {gflops['torch']:.0f} GFLOP/s; tensorgen is {timed.ratios['torch']:.2f}x as fast "
          f"({timed.rounds} rounds{verdict}); outputs agree to {error:.1e}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
