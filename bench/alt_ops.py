"""ALT against tensorgen's Ansor on single operators at the same trial budget, next to PyTorch, in one run.

    python bench/alt_ops.py [--cases GMM:2,C2D:3,TBS:0] [--trials 64] [--layouts 4] [--batch 1]
                            [--explorations uniform,halving,evolve] [--threads 2] [--seed 0] [--json FILE]
                            [timing options of tensorgen.timing]

Each case (`OP:SHAPE_INDEX` of tensorgen.te.ops.suite.SUITE) is tuned from scratch by both engines with the same
budget: Ansor (`tune`, the "ansor" policy) and ALT (`tune_alt`: a joint stage over --layouts layouts of the
tiling template, the task's own first, then the loop-only stage on the best; once per exploration of the joint
stage, engine `alt-<exploration>`). The best programs and PyTorch are then timed alternately
(tensorgen.timing.compare; ratios are PyTorch's time over each engine's).

ALT's program reads its operands in their tuned layouts and writes its output in its own: operands are packed
once outside the timed calls, and the output unpacked for the correctness check only. Converting layouts is not
in its time, as in the paper's operator figures: in a model the layouts propagate to the neighbours (ALT §4.2)
or a conversion kernel runs, timed as a kernel of its own.
"""

from __future__ import annotations

import sys

import thread_env  # noqa: F401  (first: fixes the BLAS threads before NumPy and torch are imported)

# isort: split

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from ops import check, make_inputs, torch_reference  # noqa: E402

from tensorgen.build import build  # noqa: E402
from tensorgen.dag import ComputeDAG  # noqa: E402
from tensorgen.runtime import aligned, aligned_empty  # noqa: E402
from tensorgen.schedule.layout import Layout  # noqa: E402
from tensorgen.te.ops.suite import SUITE  # noqa: E402
from tensorgen.timing import add_arguments, compare, protocol_from  # noqa: E402
from tensorgen.tuning.alt import AltConfig, tune_alt  # noqa: E402
from tensorgen.tuning.tune import make_task, tune  # noqa: E402


def run_case(op: str, index: int, args: argparse.Namespace) -> dict:
    import torch

    make, shapes = SUITE[op]
    config = shapes[index]
    inputs, outputs = make(*config, batch=args.batch)
    dag = ComputeDAG(list(inputs) + list(outputs))
    task = make_task(dag, "cpu", desc=f"{op}{config} batch={args.batch}")
    t0 = time.perf_counter()
    ansor = tune(task, args.trials, seed=args.seed, batch_size=16)
    ansor_s = time.perf_counter() - t0
    entry = {"op": op, "shape": list(config), "batch": args.batch, "trials": args.trials, "flops": dag.flop_count,
             "ansor_tuning_s": ansor_s, "ansor_tuned_ms": ansor.best_cost * 1e3}
    alts = {}
    for exploration in args.explorations.split(","):
        name = f"alt-{exploration}"
        alt = alts[name] = tune_alt(task, args.trials, config=AltConfig(layouts=args.layouts, exploration=exploration),
                                    seed=args.seed)
        entry[name] = {"tuning_s": alt.tuning_wall_s, "tuned_ms": alt.best_cost * 1e3,
                       "layouts": {k: [p.to_json() for p in v] for k, v in alt.layouts.items()},
                       "explored": [{"layouts": {k: [p.to_json() for p in v] for k, v in t.layouts.items()},
                                     "trials": t.trials, "best_ms": t.best_cost * 1e3} for t in alt.explored]}
    arrays = make_inputs(dag, args.seed)
    ref = torch_reference(op, config)
    torch.set_num_threads(args.threads)
    with torch.inference_mode():
        ref64 = ref.back(ref.fn(*ref.prepare({k: v.astype(np.float64) for k, v in arrays.items()})))
        tensors = ref.prepare(arrays)
        torch_buf = torch.empty_like(ref.fn(*tensors)) if ref.writes_out else None
    fns = {"torch": lambda: ref.fn(*tensors, out=torch_buf)}
    for name, state in (("ansor", ansor.best_state), *((n, a.best_state) for n, a in alts.items())):
        func = build(state, simd_bytes=task.hw.simd_bytes)
        func.set_num_threads(args.threads)
        layouts = alts[name].layouts if name in alts else {}
        ins = [aligned(Layout.of(t.shape, layouts[t.name]).pack(arrays[t.name])) if t.name in layouts
               else arrays[t.name] for t in dag.inputs]
        outs = [aligned_empty(t.shape, t.dtype) for t in state.dag.outputs]
        func(*ins, *outs)
        out = outs[0]
        name_out = dag.outputs[0].name
        if name_out in layouts:
            out = Layout.of(dag.outputs[0].shape, layouts[name_out]).unpack(out)
        why = check(out, ref64, name)
        if why:
            entry[f"{name}_error"] = why
            continue
        fns[name] = (lambda f, i, o: lambda: f(*i, *o))(func, ins, outs)
    with torch.inference_mode():
        timed = compare(fns, protocol_from(args), reference="torch")
    entry.update(timing=timed.to_json(), reliable=timed.reliable, disagreement=timed.disagreement(),
                 gflops=timed.gflops(dag.flop_count))
    return entry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="GMM:2,C2D:3,TBS:0")
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--layouts", type=int, default=4)
    p.add_argument("--explorations", default="uniform", help="of ALT's joint stage, comma separated (default uniform)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the entries here")
    add_arguments(p)
    args = p.parse_args()
    entries = []
    for case in args.cases.split(","):
        op, index = case.split(":")
        entry = run_case(op, int(index), args)
        entries.append(entry)
        g = entry.get("gflops", {})
        alts = ", ".join(f"{n} {g.get(n, 0):.1f} ({g.get(n, 0) / max(g.get('ansor', 1e-9), 1e-9):.2f}x ansor, "
                         f"tuned in {entry[n]['tuning_s']:.0f} s)" for n in entry if n.startswith("alt-"))
        print(f"{op}{entry['shape']}: GFLOP/s torch {g.get('torch', 0):.1f}, ansor {g.get('ansor', 0):.1f} (tuned in "
              f"{entry['ansor_tuning_s']:.0f} s), {alts}; "
              f"{'' if entry.get('reliable') else 'UNRELIABLE: ' + str(entry.get('disagreement'))}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps(entries, indent=1, default=str))


if __name__ == "__main__":
    main()
