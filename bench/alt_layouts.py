"""ALT Table 3 on this CPU: one convolution under fixed data layouts and under ALT's tuned layout, each with the
same tuning budget, timed alternately in one run.

    python bench/alt_layouts.py [--conv 224,224,3,64,7,2,3] [--trials 64] [--layouts 4] [--threads 2]
                                [--json FILE] [timing options of tensorgen.timing]

Layouts (the paper's names: N batch, O output channels, H W rows and columns):
  NHWO     data NHWC, weight HWIO, output NHWO (tensorgen's default for convolutions)
  NOHW     data NCHW, weight OIHW, output NOHW
  NCHW16c  NOHW with the output channels blocked by 16 (output N, O/16, H, W, 16; weight O/16, I, H, W, 16)
  ALT      NHWO's DAG with the layouts tune_alt picks (the tiling template: output, weight and the padded input
           tiled, tiles innermost), joint stage over --layouts layouts, then loop-only
Every variant gets --trials trials of the same Ansor search. The convolution (default: ResNet-18's first,
224x224x3 -> 64, 7x7, stride 2, padding 3) is checked against PyTorch in each layout before it is timed; operands
are packed outside the timed calls.
"""

from __future__ import annotations

import thread_env  # noqa: F401  (first: fixes the BLAS threads before NumPy and torch are imported)

# isort: split

import argparse  # noqa: E402
import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen.build import build  # noqa: E402
from tensorgen.dag import ComputeDAG  # noqa: E402
from tensorgen.runtime import aligned, aligned_empty  # noqa: E402
from tensorgen.schedule.laid_out import lay_out  # noqa: E402
from tensorgen.schedule.layout import Layout, Reorder, Split  # noqa: E402
from tensorgen.te.ops.suite import make_c2d  # noqa: E402
from tensorgen.timing import add_arguments, compare, protocol_from  # noqa: E402
from tensorgen.tuning.alt import AltConfig, tune_alt  # noqa: E402
from tensorgen.tuning.tune import make_task, tune  # noqa: E402

# NCHW data and output, OIHW weight -> each variant's own arrays
TO_BASE = {"NHWC": {"data": (0, 2, 3, 1), "weight": (2, 3, 1, 0), "out": (0, 2, 3, 1)},
           "NCHW": {"data": (0, 1, 2, 3), "weight": (0, 1, 2, 3), "out": (0, 1, 2, 3)}}


def variant(conv: tuple[int, ...], base: str, blocked: bool) -> tuple[ComputeDAG, dict]:
    inputs, outputs = make_c2d(*conv, layout=base)
    dag = ComputeDAG(list(inputs) + list(outputs))
    if not blocked:
        return dag, {}
    co = conv[3]
    out = dag.outputs[0].name
    layouts = {out: [Split(1, (co // 16, 16)), Reorder((0, 1, 3, 4, 2))],
               "weight": [Split(0, (co // 16, 16)), Reorder((0, 2, 3, 4, 1))]}
    return lay_out(dag, layouts), layouts


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--conv", default="224,224,3,64,7,2,3", help="h,w,ci,co,kernel,stride,padding")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--layouts", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    add_arguments(p)
    args = p.parse_args()
    conv = tuple(int(v) for v in args.conv.split(","))
    h, w, ci, co, k, stride, pad = conv
    rng = np.random.default_rng(args.seed)
    x = rng.uniform(-1, 1, (1, ci, h, w)).astype(np.float32)
    wt = rng.uniform(-1, 1, (co, ci, k, k)).astype(np.float32)
    ref = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(wt), stride=stride, padding=pad).numpy()
    entry: dict = {"conv": list(conv), "trials": args.trials, "variants": {}}
    fns = {}
    for name, base, blocked in (("NHWO", "NHWC", False), ("NOHW", "NCHW", False), ("NCHW16c", "NCHW", True),
                                ("ALT", "NHWC", False)):
        dag, layouts = variant(conv, base, blocked)
        task = make_task(dag, "cpu", desc=f"conv {name}")
        if name == "ALT":
            result = tune_alt(task, args.trials, config=AltConfig(layouts=args.layouts), seed=args.seed)
            layouts = result.layouts
            state, cost = result.best_state, result.best_cost
        else:
            result = tune(task, args.trials, seed=args.seed, batch_size=16)
            state, cost = result.best_state, result.best_cost
        perm = TO_BASE[base]
        arrays = {"data": np.ascontiguousarray(x.transpose(perm["data"])),
                  "weight": np.ascontiguousarray(wt.transpose(perm["weight"]))}
        ins = [aligned(Layout.of(arrays[t.name].shape, layouts[t.name]).pack(arrays[t.name]) if t.name in layouts
                       else arrays[t.name]) for t in dag.inputs]
        func = build(state, simd_bytes=task.hw.simd_bytes)
        func.set_num_threads(args.threads)
        outs = [aligned_empty(t.shape, t.dtype) for t in state.dag.outputs]
        func(*ins, *outs)
        out_name = dag.outputs[0].name
        got = outs[0]
        if out_name in layouts:
            got = Layout.of(ref.transpose(perm["out"]).shape, layouts[out_name]).unpack(got)
        err = float(np.abs(got - ref.transpose(perm["out"])).max() / np.abs(ref).max())
        entry["variants"][name] = {"tuned_ms": cost * 1e3, "max_rel_error": err,
                                   "layouts": {n: [q.to_json() for q in v] for n, v in layouts.items()}}
        print(f"{name}: tuned {cost * 1e3:.3f} ms, error {err:.1e}", flush=True)
        if err < 1e-3:
            fns[name] = (lambda f, i, o: lambda: f(*i, *o))(func, ins, outs)
    timed = compare(fns, protocol_from(args), reference="NHWO")
    entry.update(timing=timed.to_json(), reliable=timed.reliable, disagreement=timed.disagreement())
    flops = 2 * co * ci * k * k * ((h + 2 * pad - k) // stride + 1) * ((w + 2 * pad - k) // stride + 1)
    for name, gflops in timed.gflops(flops).items():
        print(f"  {name:8s} {gflops:7.1f} GFLOP/s  (time / NHWO's: {timed.ratios.get(name, 1.0):.2f})")
    if not timed.reliable:
        print(f"  UNRELIABLE: {timed.disagreement()}")
    if args.json:
        Path(args.json).write_text(json.dumps(entry, indent=1, default=str))


if __name__ == "__main__":
    main()
