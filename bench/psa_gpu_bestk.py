"""Best-k of the GPU static analyzer's pruned space against random spaces of the same size (Pruner Table 1, Eq. 6),
on a machine with an NVIDIA GPU and nvcc.

    python bench/psa_gpu_bestk.py [--target "cuda -device=h100"] [--shape 1024,1024,1024] [--space 1024]
                                  [--sizes 128,256,512] [--ks 1,5,10] [--json out.json] [--dry-run]

A space of `--space` distinct GPU matmul schedules (examples.gpu_gmm_state, every knob drawn at random) is measured
whole: each program is rendered (codegen.cuda), compiled by nvcc into a shared library (in parallel, one per
program) and timed through the CUDA runtime (median of `--repeat` launches after a warm-up). Best-k of a sub-space
S is (the best latency of the whole space) / (the k-th best latency in S): PSA's S is its `size` lowest estimates,
random S the mean over `--draws` random subsets. `--dry-run` draws the space and ranks it by PSA without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tensorgen.build import compile_state  # noqa: E402
from tensorgen.codegen.backend import CudaBackend, backend_for  # noqa: E402
from tensorgen.codegen.cuda import render_cuda  # noqa: E402
from tensorgen.costmodel.psa_gpu import GpuStaticAnalyzer  # noqa: E402
from tensorgen.errors import TensorgenError  # noqa: E402
from tensorgen.examples import gpu_gmm_state  # noqa: E402
from tensorgen.hardware import hardware_for  # noqa: E402
from tensorgen.runtime.cuda import CudaLibrary  # noqa: E402
from tensorgen.schedule.lower import lower  # noqa: E402
from tensorgen.schedule.state import State  # noqa: E402
from tensorgen.target import Target  # noqa: E402

POW2 = (1, 2, 4, 8, 16, 32)


def draw_space(m: int, n: int, k: int, size: int, rng: np.random.Generator, hw) -> list[tuple[dict, State]]:
    """`size` distinct schedules that render for `hw` (blocks within its limits), knobs drawn uniformly."""
    out: dict[str, tuple[dict, State]] = {}
    for _ in range(size * 50):
        if len(out) == size:
            break
        knobs = {"threads": tuple(int(x) for x in rng.choice(POW2, 2)),
                 "thread_tile": tuple(int(x) for x in rng.choice(POW2[:4], 2)),
                 "vthreads": tuple(int(x) for x in rng.choice(POW2[:3], 2)),
                 "k_tile": int(rng.choice((4, 8, 16, 32, 64))),
                 "fetch_threads": None if rng.random() < 0.7 else int(rng.choice((32, 64, 128, 256))),
                 "fetch_by_columns": bool(rng.random() < 0.2)}
        key = json.dumps(knobs, sort_keys=True)
        if key in out:
            continue
        try:
            state = gpu_gmm_state(m, n, k, **knobs)
            render_cuda(lower(state, "p", gpu=True), hw.max_threads_per_block, hw.shared_mem_per_block)
        except TensorgenError:
            continue
        out[key] = (knobs, state)
    return list(out.values())


def measure(states: list[State], backend: CudaBackend, repeat: int, jobs: int) -> np.ndarray:
    """Median seconds per call of each program (CUDA events, after a warm-up call; inf: failed to build or run),
    built by tensorgen's own pipeline in `jobs` threads (nvcc runs in its own processes)."""
    def build(state: State) -> Path | None:
        try:
            return compile_state(state, backend, "program").path
        except TensorgenError:
            return None

    with ThreadPoolExecutor(jobs) as pool:
        libs = list(pool.map(build, states))
    out = np.full(len(states), np.inf)
    rng = np.random.default_rng(0)
    arrays = [rng.random(t.shape, dtype=np.float32) for t in states[0].dag.args]
    device = None
    for i, path in enumerate(libs):
        if path is None:
            continue
        lib = CudaLibrary(path)
        device = device or [lib.runtime.to_device(a) for a in arrays]
        try:
            out[i] = lib.entry("program").time(*device, runs=repeat)
        except TensorgenError:
            continue
    return out


def best_k(latency: np.ndarray, subset: np.ndarray, k: int) -> float:
    """Pruner Eq. 6 for one task: the best latency of the space over the k-th best in `subset`."""
    chosen = np.sort(latency[subset])
    return float(latency.min() / chosen[k - 1]) if len(chosen) >= k and np.isfinite(chosen[k - 1]) else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cuda -device=h100")
    p.add_argument("--shape", default="1024,1024,1024")
    p.add_argument("--space", type=int, default=1024)
    p.add_argument("--sizes", default="128,256,512")
    p.add_argument("--ks", default="1,5,10")
    p.add_argument("--draws", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    m, n, k = (int(x) for x in args.shape.split(","))
    hw = hardware_for(args.target)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    space = draw_space(m, n, k, args.space, rng, hw)
    states = [s for _, s in space]
    t1 = time.perf_counter()
    estimate = GpuStaticAnalyzer(hw).latencies(states)
    t2 = time.perf_counter()
    print(f"{len(states)} programs drawn in {t1 - t0:.1f} s, PSA in {t2 - t1:.2f} s "
          f"({(t2 - t1) / len(states) * 1e3:.2f} ms per program, statements included)")
    if args.dry_run:
        for i in np.argsort(estimate)[:5]:
            print(f"  PSA {estimate[i] * 1e6:9.1f} us  {space[i][0]}")
        return 0
    latency = measure(states, backend_for(Target.parse(args.target), hw), args.repeat, args.jobs)
    t4 = time.perf_counter()
    print(f"compiled and measured in {t4 - t2:.0f} s; best {latency.min() * 1e6:.1f} us "
          f"({2 * m * n * k / latency.min() / 1e9:.0f} GFLOP/s); {int(np.isinf(latency).sum())} failed")
    order = np.argsort(estimate, kind="stable")
    ok = np.isfinite(latency) & np.isfinite(estimate)
    rank = np.corrcoef(np.argsort(np.argsort(estimate[ok])), np.argsort(np.argsort(latency[ok])))[0, 1]
    result = {"target": args.target, "shape": [m, n, k], "space": len(states), "spearman": float(rank), "best_k": {}}
    for size in (int(x) for x in args.sizes.split(",")):
        if size > len(states):
            continue
        for kk in (int(x) for x in args.ks.split(",")):
            psa = best_k(latency, order[:size], kk)
            rand = float(np.mean([best_k(latency, rng.choice(len(states), size, replace=False), kk)
                                  for _ in range(args.draws)]))
            result["best_k"][f"{size}/B-{kk}"] = {"psa": psa, "random": rand}
            print(f"size {size:4d}  Best-{kk:<2d}  PSA {psa:.3f}  random {rand:.3f}")
    print(f"Spearman(PSA, measured) = {rank:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
