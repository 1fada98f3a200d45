"""A/B of two builds of one model (`tensorgen build` output directories), in one process: whole-model
time in alternating blocks (each after a warm-up, see tensorgen.graph.compare.time_engines) and each
kernel's median time inside the model (CompiledModel.profile), with the outputs checked to agree.

    python bench/ab_models.py mobilenet_v2 DIR_A DIR_B [--blocks 8] [--threads 2] [--json FILE]

Both builds must hold the same kernels (the same model and database); what differs is how they were
built, e.g. by two versions of the compiler.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np

from tensorgen.graph.compare import time_engines
from tensorgen.graph.load import onnx_model_of
from tensorgen.graph.zoo import random_inputs
from tensorgen.runtime.model import CompiledModel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or .onnx the builds were made from (for the inputs)")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--profile-rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds of sleep before each block")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)

    feeds = random_inputs(onnx_model_of(args.model))
    models = {"a": CompiledModel(args.a, threads=args.threads), "b": CompiledModel(args.b, threads=args.threads)}
    inputs = [feeds[name] for name, _, _ in models["a"].inputs]
    outs = {k: m.run(inputs) for k, m in models.items()}
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(outs["a"], outs["b"]))
    blocks = time_engines({k: m.run for k, m in models.items()}, inputs, args.blocks, pause_s=args.pause,
                          warm_s=min(0.2, 0.4 * args.pause))
    ratio = statistics.median(a / b for a, b in zip(blocks["a"], blocks["b"]))
    kernels = {k: np.median([[x["ms"] for x in m.profile(inputs, repeat=10)] for _ in range(args.profile_rounds)],
                            axis=0) for k, m in models.items()}
    names = [k["name"] for k in models["a"].manifest["kernels"]]
    print(f"{args.model}: a {statistics.median(blocks['a']):.3f} ms, b {statistics.median(blocks['b']):.3f} ms, "
          f"a/b per block (median) {ratio:.3f}; kernel sums a {kernels['a'].sum():.3f} b {kernels['b'].sum():.3f}; "
          f"outputs differ by {diff:.2g}")
    for name, x, y in zip(names, kernels["a"], kernels["b"]):
        if abs(y - x) > 0.03 * x:
            print(f"  {name:28s} {x:.4f} -> {y:.4f} ms ({y / x:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "a": args.a, "b": args.b, "blocks_ms": blocks, "a_over_b": ratio,
                       "max_abs_diff": diff, "kernels_ms": {n: [float(x), float(y)]
                                                            for n, x, y in zip(names, kernels["a"], kernels["b"])}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
