"""Single-operator benchmark of the Ansor paper (Figure 6) and its two subgraphs (Figure 8), vs. PyTorch CPU.

    python bench/ops.py [--ops C2D,GMM,...] [--shapes 0,1,2,3] [--batch 1,16] [--trials 64]
                        [--db FILE] [--json FILE] [--seed 0] [--batch-size 64] [--population N]
                        [--generations N] [--prefilter psa]
                        [--threads 2] [--rounds 3] [--max-rounds 9] [--bound 0.1] [--repeat 5]
                        [--pause 0.5] [--load] [--config a,b,c] [--quiet]

For every case (operator x shape x batch) of `tensorgen.te.ops.suite.SUITE` selected on the command
line: tune with the Ansor policy (`tensorgen.tuning.tune`, `--trials` programs, seeded), build the best
program, check its output against PyTorch (float64, tolerance below) and only then time tensorgen,
PyTorch CPU (and NumPy for GMM) side by side in the same run with `--threads` threads each.

- Correctness first: a case whose output does not match is reported with status "error" and no
  tensorgen speed. The PyTorch float32 result is checked against the same reference, so a wrong
  reference composition shows up as an error too.
- Same work: every peer computes the same math on the same inputs, into a preallocated output where
  it has one: tensorgen always, NumPy `matmul(out=)`, PyTorch `bmm(out=)` (GMM), `linalg.vector_norm(out=)`
  (NRM) and `matmul(out=)` (TBS's scores; its softmax has no `out=`); PyTorch's convolutions
  (`conv1d/2d/3d`, `conv_transpose2d`, and ConvLayer's `batch_norm`) have no `out=` and allocate their
  result every call, as they do in any PyTorch program. PyTorch runs in its native
  channels-first layout (NCW / NCHW / NCDHW, kernels OI...); inputs are converted once, outside the
  timing, and the result converted back only for the check. Operators without a single PyTorch call:
  CAP (capsule conv2d: out[n,h,w,i,j,co] = sum_{rh,rw,k,rc} x[n,h*s+rh,w*s+rw,i,k,rc] w[rh,rw,k,j,rc,co])
  is one `conv2d` over batch (N*I) with channels (K*CI) -> (J*CO); NRM is `torch.linalg.vector_norm`
  over the last two dims (the Frobenius norm); ConvLayer is conv2d -> batch_norm (inference) -> relu
  (in place); TBS is softmax(Q_h @ K_h^T) per head with Q/K viewed as (batch, heads, seq, hidden).
- GFLOP/s of every framework use the FLOP count of the tensorgen DAG (`ComputeDAG.flop_count`), so
  ratios of GFLOP/s are ratios of time.
- Timing: the protocol of tensorgen/timing.py. Alternating blocks of every framework, a `--pause` sleep
  before each, `--repeat` samples per block of the same number of calls for every framework (enough
  for the fastest one's sample to last 1 ms, so short kernels run in batches); GFLOP/s are medians
  over rounds and `ratio` their ratio. Rounds are added (from `--rounds` up to `--max-rounds`) until
  every framework's rounds and the per-round ratios agree within `--bound`; a case that never agrees
  is marked UNRELIABLE in the table, `"reliable": false` (with the spreads) in the JSON, and left out
  of the geometric means. `--load` runs one competing CPU-bound process while timing.
- `--db FILE` makes the run resumable: `--trials` is then the total per case, and a case with
  records already in FILE measures only the missing ones (`tuning_wall_s` is this run's time).

Output: a table of throughput normalized to the best framework per case (Figure 6), the geometric
mean of the normalized throughput per operator and batch, and with `--json` every number (rewritten
after each case, so an interrupted run keeps what it finished).
"""

from __future__ import annotations

import os
import sys

import thread_env  # first: fixes the BLAS threads before NumPy and torch are imported

# isort: split

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen.build import build  # noqa: E402
from tensorgen.dag import ComputeDAG  # noqa: E402
from tensorgen.runtime import aligned, aligned_empty  # noqa: E402
from tensorgen.target import Target  # noqa: E402
from tensorgen.te.ops.suite import SUITE  # noqa: E402
from tensorgen.timing import add_arguments, compare, competing_load, describe_load, protocol_from  # noqa: E402
from tensorgen.tuning.tune import make_task, tune  # noqa: E402

RTOL = 1e-3  # per element, relative
ATOL = 1e-4  # times max |reference|: float32 sums of hundreds to thousands of terms
FRAMEWORKS = ("tensorgen", "torch", "numpy")


# ---------------------------------------------------------------------------------------------
# PyTorch references: the same math as the suite operator, in PyTorch's native layouts


@dataclass
class TorchRef:
    """How PyTorch computes one case: `prepare` maps the tensorgen inputs (by placeholder name, NumPy)
    to torch tensors once; `fn(*tensors, out=None)` is the timed call, writing into `out` when
    `writes_out` (a preallocated tensor shaped like its result; PyTorch's convolutions have no `out=`);
    `back` turns its result into the tensorgen output layout (NumPy) for the check."""

    prepare: Callable[[dict[str, Any]], tuple]
    fn: Callable[..., Any]
    back: Callable[[Any], np.ndarray]
    writes_out: bool = False


def _conv_ref(nd: int, stride: int, padding: int, dilation: int = 1, groups: int = 1) -> TorchRef:
    import torch
    import torch.nn.functional as F

    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    to_cf = (0, nd + 1, *range(1, nd + 1))  # N...C -> NC...
    w_perm = (nd + 1, nd, *range(nd))  # ...IO -> OI...
    to_cl = (0, *range(2, nd + 2), 1)

    def prepare(x):
        return (torch.from_numpy(x["data"]).permute(*to_cf).contiguous(),
                torch.from_numpy(x["weight"]).permute(*w_perm).contiguous())

    def fn(d, w, out=None):
        return conv(d, w, stride=stride, padding=padding, dilation=dilation, groups=groups)

    return TorchRef(prepare, fn, lambda y: y.permute(*to_cl).numpy())


def _gmm_ref() -> TorchRef:
    import torch

    return TorchRef(lambda x: (torch.from_numpy(x["A"]), torch.from_numpy(x["B"])), torch.bmm, lambda y: y.numpy(),
                    writes_out=True)


def _t2d_ref(stride: int, padding: int) -> TorchRef:
    import torch
    import torch.nn.functional as F

    def prepare(x):  # NHWC -> NCHW; weight (kh, kw, CI, CO) -> (CI, CO, kh, kw)
        return (torch.from_numpy(x["data"]).permute(0, 3, 1, 2).contiguous(),
                torch.from_numpy(x["weight"]).permute(2, 3, 0, 1).contiguous())

    return TorchRef(prepare, lambda d, w, out=None: F.conv_transpose2d(d, w, stride=stride, padding=padding),
                    lambda y: y.permute(0, 2, 3, 1).numpy())


def _cap_ref(stride: int, padding: int) -> TorchRef:
    """Capsule conv2d as one conv2d: batch (N, I), input channels (K, CI), output channels (J, CO)."""
    import torch
    import torch.nn.functional as F

    dims: list[int] = []

    def prepare(x):
        d, w = torch.from_numpy(x["data"]), torch.from_numpy(x["weight"])
        n, h, wd, cap_i, cap_k, ci = d.shape  # (N, H, W, I, K, CI)
        kh, kw, _, cap_j, _, co = w.shape  # (kh, kw, K, J, CI, CO)
        data = d.permute(0, 3, 4, 5, 1, 2).reshape(n * cap_i, cap_k * ci, h, wd).contiguous()
        weight = w.permute(3, 5, 2, 4, 0, 1).reshape(cap_j * co, cap_k * ci, kh, kw).contiguous()
        dims[:] = [n, cap_i, cap_j, co]
        return data, weight

    def back(y):
        n, cap_i, cap_j, co = dims
        oh, ow = y.shape[-2:]
        return y.reshape(n, cap_i, cap_j, co, oh, ow).permute(0, 4, 5, 1, 2, 3).numpy()

    return TorchRef(prepare, lambda d, w, out=None: F.conv2d(d, w, stride=stride, padding=padding), back)


def _nrm_ref() -> TorchRef:
    import torch

    return TorchRef(lambda x: (torch.from_numpy(x["A"]),),
                    lambda a, out=None: torch.linalg.vector_norm(a, ord=2, dim=(1, 2), out=out), lambda y: y.numpy(),
                    writes_out=True)


def _conv_layer_ref(stride: int, padding: int) -> TorchRef:
    import torch
    import torch.nn.functional as F

    base = _conv_ref(2, stride, padding)
    names = ("bn_mean", "bn_var", "bn_gamma", "bn_beta")

    def prepare(x):
        return (*base.prepare(x), *(torch.from_numpy(x[n]) for n in names))

    def fn(d, w, mean, var, gamma, beta, out=None):
        y = F.conv2d(d, w, stride=stride, padding=padding)
        return F.relu(F.batch_norm(y, mean, var, gamma, beta, training=False, eps=1e-5), inplace=True)

    return TorchRef(prepare, fn, base.back)


def _tbs_ref(heads: int) -> TorchRef:
    import torch

    def fn(q, k, out=None):
        """`out` holds the scores (matmul's output): softmax has no out= and allocates the result."""
        b, s, width = q.shape
        d = width // heads
        qt = q.view(b, s, heads, d).transpose(1, 2)  # (b, h, s, d)
        kt = k.view(b, s, heads, d).permute(0, 2, 3, 1)  # (b, h, d, s)
        return torch.softmax(torch.matmul(qt, kt, out=out), dim=-1)

    return TorchRef(lambda x: (torch.from_numpy(x["Q"]), torch.from_numpy(x["K"])), fn, lambda y: y.numpy(),
                    writes_out=True)


def torch_reference(op: str, config: Sequence[int]) -> TorchRef:
    """The PyTorch computation of suite operator `op` with shape config `config` (any batch)."""
    c = tuple(config)
    if op == "C1D":
        return _conv_ref(1, c[4], c[5])
    if op == "C2D":
        return _conv_ref(2, c[5], c[6])
    if op == "C3D":
        return _conv_ref(3, c[6], c[7])
    if op == "GRP":
        return _conv_ref(2, c[5], c[6], groups=c[7])
    if op == "DIL":
        return _conv_ref(2, c[5], c[6], dilation=c[7])
    if op == "DEP":
        return _conv_ref(2, c[4], c[5], groups=c[2])
    if op == "GMM":
        return _gmm_ref()
    if op == "T2D":
        return _t2d_ref(c[5], c[6])
    if op == "CAP":
        return _cap_ref(c[5], c[6])
    if op == "NRM":
        return _nrm_ref()
    if op == "ConvLayer":
        return _conv_layer_ref(c[5], c[6])
    if op == "TBS":
        return _tbs_ref(c[1])
    raise KeyError(f"no PyTorch reference for {op}")


def make_inputs(dag: ComputeDAG, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 inputs by placeholder name: uniform(-1, 1), variances uniform(0.5, 1.5)."""
    rng = np.random.default_rng(seed)
    out = {}
    for t in dag.inputs:
        lo, hi = (0.5, 1.5) if t.name.endswith("var") else (-1.0, 1.0)
        out[t.name] = aligned(rng.uniform(lo, hi, t.shape).astype(t.dtype))  # as every framework's
    return out  # own arrays are: see tensorgen.runtime.ALIGNMENT


# ---------------------------------------------------------------------------------------------
# checking and timing


def max_rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / max(float(np.abs(ref).max()), 1e-30))


def check(got: np.ndarray, ref: np.ndarray, what: str) -> str | None:
    """None if `got` matches `ref` within RTOL / ATOL * max|ref|, else why not."""
    if got.shape != ref.shape:
        return f"{what}: shape {got.shape} != reference {ref.shape}"
    if not np.all(np.isfinite(got)):
        return f"{what}: non-finite values in the output"
    try:
        np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL * float(np.abs(ref).max()))
    except AssertionError as err:
        lines = [ln for ln in str(err).splitlines() if ln.strip().startswith(("Mismatched", "Max"))]
        return f"{what}: output differs from the float64 reference ({'; '.join(lines)})"
    return None


# ---------------------------------------------------------------------------------------------
# one case


def policy_options(args: argparse.Namespace) -> dict[str, Any]:
    given = {"population": args.population, "generations": args.generations, "prefilter": args.prefilter}
    return {k: v for k, v in given.items() if v is not None}


def _existing_trials(db: str | None, workload_key: str, target: str) -> int:
    if not db or not os.path.exists(db):
        return 0
    from tensorgen.records import SQLiteDatabase
    from tensorgen.records.record import first_records

    with SQLiteDatabase(db) as database:
        return len(first_records(database.records(workload_key, target)))


def run_case(op: str, shape_index: int | None, config: tuple[int, ...], batch: int, args: argparse.Namespace,
             progress: bool = False) -> dict:
    """Tune, check and time one case; the JSON entry (status "ok" or "error")."""
    import torch

    make, _ = SUITE[op]
    inputs, outputs = make(*config, batch=batch)
    dag = ComputeDAG(list(inputs) + list(outputs))
    target = Target.parse(args.target)
    desc = f"{op}({','.join(map(str, config))}) batch={batch}"
    task = make_task(dag, target, desc=desc)
    entry: dict[str, Any] = {
        "op": op, "shape": list(config), "shape_index": shape_index, "batch": batch, "desc": desc,
        "workload_key": dag.workload_key, "flops": dag.flop_count, "trials": 0, "total_trials": 0,
        "tuning_wall_s": None, "search_overhead_s": None, "build_s": None, "run_s": None, "tuned_gflops": None,
        "tensorgen_gflops": None, "torch_gflops": None, "numpy_gflops": None, "ratio": None, "numpy_ratio": None,
        "normalized": {}, "correctness": {"checked": False, "rtol": RTOL, "atol_rel": ATOL},
        "status": "error", "error": None,
    }
    try:
        trials = args.trials
        if args.db:
            trials = max(0, args.trials - _existing_trials(args.db, dag.workload_key, str(target)))
        result = tune(task, trials=trials, db=args.db, policy="ansor", seed=args.seed, batch_size=args.batch_size,
                      policy_options=policy_options(args), progress=progress)
        entry.update(trials=result.trials, total_trials=result.total_trials, tuning_wall_s=result.tuning_wall_s,
                     search_overhead_s=result.search_overhead_s, build_s=result.build_s, run_s=result.run_s,
                     tuned_gflops=result.best_gflops or None, tune_errors=dict(result.errors))
        if result.best_state is None:
            entry["error"] = f"tuning found no working program in {result.total_trials} trials ({result.errors})"
            return entry
        func = build(result.best_state, simd_bytes=task.hw.simd_bytes, march=target.march)
        func.set_num_threads(args.threads)
        torch.set_num_threads(args.threads)

        arrays = make_inputs(dag, args.seed)
        ordered = [arrays[t.name] for t in dag.inputs]
        outs = [aligned_empty(t.shape, t.dtype) for t in dag.outputs]
        func(*ordered, *outs)
        ref = torch_reference(op, config)
        with torch.inference_mode():
            ref64 = ref.back(ref.fn(*ref.prepare({k: v.astype(np.float64) for k, v in arrays.items()})))
            tensors = ref.prepare(arrays)
            # the timed call, into its preallocated output (shaped like the result; TBS: like the scores)
            torch_buf = torch.empty_like(ref.fn(*tensors)) if ref.writes_out else None
            torch_out = ref.back(ref.fn(*tensors, out=torch_buf))
        entry["correctness"].update(checked=True, max_rel_error=max_rel_error(outs[0], ref64),
                                    torch_max_rel_error=max_rel_error(torch_out, ref64))
        why = check(torch_out, ref64, "torch (reference composition)") or check(outs[0], ref64, "tensorgen")
        if why:
            entry["error"] = why
            return entry

        fns: dict[str, Callable[[], Any]] = {"tensorgen": lambda: func(*ordered, *outs),
                                             "torch": lambda: ref.fn(*tensors, out=torch_buf)}
        if op == "GMM":
            a, b = arrays["A"], arrays["B"]
            c = np.empty_like(ref64, dtype=np.float32)
            entry["numpy_error"] = check(np.matmul(a, b, out=c), ref64, "numpy")  # a wrong peer is not timed
            if entry["numpy_error"] is None:
                fns["numpy"] = lambda: np.matmul(a, b, out=c)
        # inference mode is entered once, outside the timed calls, like any other engine's setup
        with competing_load(args.load) as load, torch.inference_mode():
            entry["load"] = describe_load(load)  # other processes on the cores distort OpenMP timings
            timed = compare(fns, protocol_from(args))
        entry.update(timing=timed.to_json(), reliable=timed.reliable, disagreement=timed.disagreement())
        for name, gflops in timed.gflops(dag.flop_count).items():
            entry[f"{name}_gflops"] = gflops
            entry[f"{name}_rounds"] = [round(dag.flop_count / t / 1e9, 3) for t in timed.rounds_s[name]]
        entry["ratio"] = timed.ratios["torch"]
        entry["numpy_ratio"] = timed.ratios.get("numpy")
        best = max(entry[f"{f}_gflops"] for f in FRAMEWORKS if entry[f"{f}_gflops"])
        entry["normalized"] = {f: entry[f"{f}_gflops"] / best for f in FRAMEWORKS if entry[f"{f}_gflops"]}
        entry["status"] = "ok"
    except KeyboardInterrupt:
        raise
    except Exception as err:  # one broken case must not end the suite
        entry["error"] = f"{type(err).__name__}: {err}"
        entry["traceback"] = traceback.format_exc()
    return entry


# ---------------------------------------------------------------------------------------------
# summary


def geomean(values: Sequence[float]) -> float | None:
    values = [v for v in values if v and v > 0]
    return float(math.exp(sum(math.log(v) for v in values) / len(values))) if values else None


def summarize(cases: Sequence[dict]) -> dict:
    """Geometric mean of the normalized throughput per operator and batch ("OP/bN") and per operator,
    over the cases that passed the check and whose timing rounds agreed (the others are left out for
    every framework)."""
    groups: dict[str, list[dict]] = {}
    for c in cases:
        if c["status"] == "ok" and c["reliable"]:
            groups.setdefault(f"{c['op']}/b{c['batch']}", []).append(c)
            groups.setdefault(c["op"], []).append(c)
    out = {}
    for key, group in groups.items():
        out[key] = {"cases": len(group)}
        for f in FRAMEWORKS:
            out[key][f] = geomean([c["normalized"].get(f, 0.0) for c in group])
        out[key]["ratio"] = geomean([c["ratio"] for c in group])
    return out


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _gf(v: float | None) -> str:
    """GFLOP/s: one decimal, or 3 significant digits below 1."""
    return "-" if v is None else format(v, ".1f" if v >= 1 else ".3g")


def print_table(cases: Sequence[dict], summary: dict, stream: Any = None) -> None:
    stream = stream or sys.stdout
    w = max([len(c["desc"]) for c in cases] + [4])
    head = (f"{'case':<{w}} {'trials':>6} {'tune s':>7} {'ovh s':>6} {'tg GF/s':>8} {'torch':>8} {'numpy':>8} "
            f"{'ratio':>6} {'rounds':>6} | {'norm tg':>7} {'torch':>6} {'numpy':>6}")
    print(head, file=stream)
    print("-" * len(head), file=stream)
    for c in cases:
        if c["status"] != "ok":
            print(f"{c['desc']:<{w}} {c['trials']:>6} {_fmt(c['tuning_wall_s']):>7} "
                  f"{_fmt(c['search_overhead_s']):>6}  ERROR: {c['error']}", file=stream)
            continue
        n = c["normalized"]
        print(f"{c['desc']:<{w}} {c['trials']:>6} {c['tuning_wall_s']:>7.1f} {c['search_overhead_s']:>6.1f} "
              f"{_gf(c['tensorgen_gflops']):>8} {_gf(c['torch_gflops']):>8} {_gf(c['numpy_gflops']):>8} "
              f"{c['ratio']:>6.2f} {c['timing']['rounds']:>6} | {n['tensorgen']:>7.2f} {n['torch']:>6.2f} "
              f"{_fmt(n.get('numpy'), '.2f'):>6}{'' if c['reliable'] else '  UNRELIABLE: ' + c['disagreement']}",
              file=stream)
    if summary:
        print("\ngeometric mean of throughput normalized to the best per case (1.00 = best on every case)",
              file=stream)
        print(f"{'operator':<14} {'cases':>5} {'tensorgen':>9} {'torch':>7} {'numpy':>7} {'tg/torch':>9}", file=stream)
        for key in sorted(summary, key=lambda k: (k.split("/")[0], "/" in k, k)):
            s = summary[key]
            print(f"{key:<14} {s['cases']:>5} {_fmt(s['tensorgen'], '.2f'):>9} {_fmt(s['torch'], '.2f'):>7} "
                  f"{_fmt(s['numpy'], '.2f'):>7} {_fmt(s['ratio'], '.2f'):>9}", file=stream)


# ---------------------------------------------------------------------------------------------


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise SystemExit(f"{what} {text!r} is not a comma-separated list of integers") from None


def select_cases(args: argparse.Namespace) -> list[tuple[str, int | None, tuple[int, ...], int]]:
    """(op, shape index or None, shape config, batch) of every selected case, in suite order."""
    names = {n.lower(): n for n in SUITE}
    ops = [n.strip() for n in args.ops.split(",") if n.strip()] if args.ops else list(SUITE)
    unknown = [o for o in ops if o.lower() not in names]
    if unknown:
        raise SystemExit(f"unknown operator(s) {', '.join(unknown)}; the suite has {', '.join(SUITE)}")
    ops = [names[o.lower()] for o in ops]
    batches = _ints(args.batch, "--batch")
    if not batches or any(b < 1 for b in batches):
        raise SystemExit(f"--batch {args.batch!r}: need positive batch sizes")
    cases = []
    for op in ops:
        make, configs = SUITE[op]
        if args.config:
            config = tuple(_ints(args.config, "--config"))
            n_params = sum(p.default is inspect.Parameter.empty for p in inspect.signature(make).parameters.values())
            if len(config) != n_params:
                raise SystemExit(f"--config {args.config!r}: {op} takes {n_params} shape values, e.g. "
                                 f"{','.join(map(str, configs[0]))}")
            chosen: list[tuple[int | None, tuple[int, ...]]] = [(None, config)]
        else:
            idx = _ints(args.shapes, "--shapes") if args.shapes else list(range(len(configs)))
            bad = [i for i in idx if not 0 <= i < len(configs)]
            if bad:
                raise SystemExit(f"--shapes {args.shapes!r}: {op} has shapes 0..{len(configs) - 1}")
            chosen = [(i, tuple(configs[i])) for i in idx]
        for batch in batches:
            cases.extend((op, i, cfg, batch) for i, cfg in chosen)
    return cases


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", default=None, help=f"comma-separated operators (default all: {','.join(SUITE)})")
    parser.add_argument("--shapes", default=None, help="comma-separated shape indices per operator (default all)")
    parser.add_argument("--config", default=None,
                        help="an explicit shape config (e.g. 32,32,32 for GMM) instead of --shapes")
    parser.add_argument("--batch", default="1,16", help="comma-separated batch sizes (default 1,16)")
    parser.add_argument("--trials", type=int, default=64, help="tuning trials per case (default 64)")
    parser.add_argument("--batch-size", type=int, default=64, help="programs measured per tuning round")
    parser.add_argument("--seed", type=int, default=0, help="seed of tuning and inputs (default 0)")
    parser.add_argument("--population", type=int, default=None,
                        help="evolutionary population of the Ansor policy (default: SketchPolicy's)")
    parser.add_argument("--generations", type=int, default=None,
                        help="evolutionary generations per round of the Ansor policy (default: SketchPolicy's)")
    parser.add_argument("--prefilter", choices=("psa",), default=None,
                        help="prune each round's random programs with Pruner's static analyzer (default: none)")
    parser.add_argument("--db", default=None,
                        help="tuning database; makes the run resumable (--trials is then the total per case)")
    parser.add_argument("--target", default="cpu", help="tuning target (default cpu)")
    parser.add_argument("--json", metavar="FILE", help="write every case as JSON")
    parser.add_argument("--threads", type=int, default=int(thread_env.THREADS), help="threads for every framework")
    add_arguments(parser)
    parser.add_argument("--quiet", action="store_true", help="no tuning progress lines")
    args = parser.parse_args(argv)
    if args.trials < 0 or args.batch_size < 1 or args.threads < 1:
        parser.error("need --trials >= 0, --batch-size >= 1 and --threads >= 1")
    try:
        protocol_from(args)
    except ValueError as err:
        parser.error(str(err))
    return args


def _write_json(path: str, args: argparse.Namespace, cases: list[dict], summary: dict, wall: float) -> None:
    import torch

    out = {
        "config": {"trials": args.trials, "batch_size": args.batch_size, "population": args.population,
                   "generations": args.generations, "prefilter": args.prefilter, "seed": args.seed,
                   "threads": args.threads, "timing": protocol_from(args).to_json(), "load": args.load,
                   "target": args.target, "db": args.db, "rtol": RTOL, "atol_rel": ATOL,
                   "torch_version": torch.__version__, "numpy_version": np.__version__,
                   "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "wall_s": wall, "cases": cases, "summary": summary,
    }
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2, default=str)
        fh.write("\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = select_cases(args)
    start = time.perf_counter()
    cases: list[dict] = []
    for op, index, config, batch in selected:
        cases.append(run_case(op, index, config, batch, args, progress=not args.quiet))
        c = cases[-1]
        status = (f"{c['tensorgen_gflops']:.1f} GFLOP/s vs torch {c['torch_gflops']:.1f} (ratio {c['ratio']:.2f}"
                  f"{'' if c['reliable'] else '; UNRELIABLE: ' + c['disagreement']})"
                  if c["status"] == "ok" else f"ERROR {c['error']}")
        print(f"[ops] {c['desc']}: {status}", file=sys.stderr, flush=True)
        if args.json:
            _write_json(args.json, args, cases, summarize(cases), time.perf_counter() - start)
    summary = summarize(cases)
    wall = time.perf_counter() - start
    print_table(cases, summary)
    ok = [c for c in cases if c["status"] == "ok"]
    print(f"({len(cases)} cases, {len(cases) - len(ok)} errors, {sum(not c['reliable'] for c in ok)} unreliable "
          f"(rounds never agreed within {args.bound:.0%}), {sum(c['timing']['rounds'] > args.rounds for c in ok)} "
          f"re-measured; {args.trials} trials per case; threads={args.threads}, "
          f"{'one competing process, ' if args.load else ''}wall {wall:.0f} s)")
    loaded = [c["desc"] for c in ok if c["load"]["loadavg_1m"] > (os.cpu_count() or 1)]
    if loaded:
        print(f"note: the 1-min load average exceeded the {os.cpu_count()} cores while timing {len(loaded)} case(s)")
    if args.json:
        _write_json(args.json, args, cases, summary, wall)
    return 1 if any(c["status"] != "ok" for c in cases) else 0


if __name__ == "__main__":
    sys.exit(main())
