"""`tensorgen demo`: the hand-written schedules of tensorgen.examples compiled, checked against NumPy and timed
next to it, with each schedule (`print(state)`) and the head of its generated C."""

from __future__ import annotations

import argparse
import time

import numpy as np

from tensorgen.build import CompiledFunction, build
from tensorgen.examples import conv2d_nhwc_im2col, conv2d_nhwc_reference, conv2d_state, gmm_state, max_rel_error
from tensorgen.schedule import State

PAUSE_S = 0.5  # quiet time before each timing block (see median_seconds)


def median_seconds(fn, repeat: int = 10, warmup: int = 3, pause: float = 0.0) -> float:
    """Median of `repeat` timed calls after `warmup` ones. `pause` first sleeps: OpenBLAS and OpenMP
    worker threads spin for a while after a call and steal the cores from whatever runs next."""
    time.sleep(pause)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# ---------------------------------------------------------------------------------------------


def _show(title: str, state: State, func: CompiledFunction, c_lines: int) -> None:
    print(f"--- {title}: schedule (print(state)) ---")
    print(state)
    print(f"--- {title}: generated C (first {c_lines} lines of {len(func.source.splitlines())}) ---")
    print("\n".join(func.source.splitlines()[:c_lines]))


def _report(name: str, flops: float, ours: float, peer_name: str, peer: float, err: float) -> None:
    g_ours, g_peer = flops / ours / 1e9, flops / peer / 1e9
    print(f"{name}: max rel error {err:.2e} | tensorgen {g_ours:7.1f} GFLOP/s | {peer_name} {g_peer:7.1f} GFLOP/s"
          f" | ratio {g_ours / g_peer:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tensorgen demo", description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512, help="matmul size (M = N = K), default 512")
    parser.add_argument("--threads", type=int, default=None, help="OpenMP threads (default: all)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--c-lines", type=int, default=40, help="lines of generated C to print")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    status = 0

    # matmul
    size = args.size
    state = gmm_state(size, size, size)
    func = build(state)
    if args.threads:
        func.set_num_threads(args.threads)
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    (c,) = func.run(a, b)
    err = max_rel_error(c, a @ b)
    ours = median_seconds(lambda: func(a, b, c), args.repeat, pause=PAUSE_S)
    peer = median_seconds(lambda: a @ b, args.repeat, pause=PAUSE_S)
    _show(f"matmul {size}x{size}x{size}", state, func, args.c_lines)
    _report(f"matmul {size}^3", 2.0 * size**3, ours, "numpy a @ b", peer, err)
    status |= int(err > 1e-3)

    # conv2d: the ResNet-50 layer, NHWC 56x56x64 -> 64, 3x3, pad 1
    n, h, w, ci, co = 1, 56, 56, 64, 64
    state = conv2d_state(n, h, w, ci, co)
    func = build(state)
    if args.threads:
        func.set_num_threads(args.threads)
    x = rng.random((n, h, w, ci), dtype=np.float32)
    wt = rng.random((3, 3, ci, co), dtype=np.float32)
    (y,) = func.run(x, wt)
    err = max_rel_error(y, conv2d_nhwc_reference(x, wt))
    ours = median_seconds(lambda: func(x, wt, y), args.repeat, pause=PAUSE_S)
    peer = median_seconds(lambda: conv2d_nhwc_im2col(x, wt), args.repeat, pause=PAUSE_S)
    print()
    _show("conv2d NHWC 1x56x56x64 -> 64, 3x3, pad 1", state, func, args.c_lines)
    _report("conv2d resnet", 2.0 * n * h * w * ci * co * 9, ours, "numpy im2col+matmul", peer, err)
    status |= int(err > 1e-3)
    if status:
        print("MISMATCH against the NumPy reference")
    return int(status)
