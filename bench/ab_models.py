"""A/B of two builds of one model (`tensorgen build` output directories), in one process: whole-model
time on the protocol of tensorgen/timing.py (alternating blocks; a/b is the ratio of the medians over rounds,
which must agree within --bound or the result is marked unreliable) and each kernel's median time inside
the model (CompiledModel.profile), with the outputs checked to agree.

    python bench/ab_models.py mobilenet_v2 DIR_A DIR_B [--rounds 3] [--bound 0.1] [--threads 2] [--load]
                              [--json FILE]

Both builds must hold the same kernels (the same model and database); what differs is how they were
built, e.g. by two versions of the compiler.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.load import onnx_model_of
from tensorgen.runtime.model import CompiledModel
from tensorgen.timing import add_arguments, compare, competing_load, describe_load, protocol_from


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="zoo name or .onnx the builds were made from (for the inputs)")
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--profile-rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        protocol = protocol_from(args)
    except ValueError as err:
        parser.error(str(err))

    feeds = random_inputs(onnx_model_of(args.model))
    models = {"a": CompiledModel(args.a, threads=args.threads), "b": CompiledModel(args.b, threads=args.threads)}
    inputs = [feeds[name] for name, _, _ in models["a"].inputs]
    outs = {k: m.run(inputs) for k, m in models.items()}
    diff = max(float(np.max(np.abs(x - y))) for x, y in zip(outs["a"], outs["b"]))
    with competing_load(args.load) as pid:
        load = describe_load(pid)
        timed = compare({k: (lambda m=m: m.run(inputs)) for k, m in models.items()}, protocol, reference="b")
    ms = {k: v * 1e3 for k, v in timed.seconds.items()}
    ratio = timed.ratios["a"]
    kernels = {k: np.median([[x["ms"] for x in m.profile(inputs, repeat=10)] for _ in range(args.profile_rounds)],
                            axis=0) for k, m in models.items()}
    names = [k["name"] for k in models["a"].manifest["kernels"]]
    verdict = "" if timed.reliable else f" UNRELIABLE: {timed.disagreement()};"
    print(f"{args.model}: a {ms['a']:.3f} ms, b {ms['b']:.3f} ms, a/b {ratio:.3f} ({timed.rounds} rounds);{verdict} "
          f"kernel sums a {kernels['a'].sum():.3f} b {kernels['b'].sum():.3f}; outputs differ by {diff:.2g}")
    for name, x, y in zip(names, kernels["a"], kernels["b"]):
        if abs(y - x) > 0.03 * x:
            print(f"  {name:28s} {x:.4f} -> {y:.4f} ms ({y / x:.2f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "a": args.a, "b": args.b, "ms": ms, "a_over_b": ratio,
                       "reliable": timed.reliable, "timing": timed.to_json(), "load": load,
                       "max_abs_diff": diff, "kernels_ms": {n: [float(x), float(y)]
                                                            for n, x, y in zip(names, kernels["a"], kernels["b"])}},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
