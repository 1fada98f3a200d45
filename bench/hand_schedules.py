"""Hand-written schedules vs. vendor libraries: GMM 1024^3 vs NumPy, ResNet-50 conv2d vs PyTorch.

    python bench/hand_schedules.py [--json FILE] [--repeat N] [--rounds R] [--threads T]

The schedules are `tensorgen.demo.gmm_state` / `tensorgen.demo.conv2d_state` (one copy, shared
with the demo and the smoke test). Timing protocol (2 cores, both runtimes spin their worker
threads for a while after each call, so back-to-back interleaving of the two halves the speed of
whichever runs second): R rounds of alternating blocks (ours, peer, ours, peer, ...), a 0.5 s sleep
before every block, each block warmed up and reported as the median of N timed calls. GFLOP/s are
the medians over rounds; `ratio` is the median of the per-round ratios.
"""

from __future__ import annotations

import os
import sys

# Thread counts must be fixed before NumPy (OpenBLAS) and torch are imported: 2 unless --threads.
_THREADS = "2"
for _i, _arg in enumerate(sys.argv[:-1]):
    if _arg == "--threads":
        _THREADS = sys.argv[_i + 1]
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = _THREADS

import argparse  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402

from tensorgen.build import build  # noqa: E402
from tensorgen.demo import conv2d_nhwc_reference, conv2d_state, gmm_state, max_rel_error, median_seconds  # noqa: E402
from tensorgen.runtime import aligned  # noqa: E402

SLEEP_S = 0.5


RTOL = 1e-3  # relative to max |reference|


def _block(fn, repeat: int, warmup: int = 3) -> float:
    return median_seconds(fn, repeat, warmup, pause=SLEEP_S)


def compare(ours, peer, flops: float, repeat: int, rounds: int) -> dict:
    """Alternate blocks ours/peer for `rounds` rounds; GFLOP/s medians and the median per-round ratio."""
    g_ours, g_peer, ratios = [], [], []
    for _ in range(rounds):
        t_ours = _block(ours, repeat)
        g_ours.append(flops / t_ours / 1e9)
        if peer is not None:
            t_peer = _block(peer, repeat)
            g_peer.append(flops / t_peer / 1e9)
            ratios.append(t_peer / t_ours)
    return {
        "tensorgen_gflops": round(float(np.median(g_ours)), 2),
        "peer_gflops": round(float(np.median(g_peer)), 2) if g_peer else None,
        "ratio": round(float(np.median(ratios)), 3) if ratios else None,
        "tensorgen_rounds": [round(g, 1) for g in g_ours],
        "peer_rounds": [round(g, 1) for g in g_peer],
    }


def bench_gmm(repeat: int, rounds: int, threads: int, size: int = 1024) -> dict:
    # The program is the whole GMM including its two layout stages (A_packed, B_packed): they run
    # on every call and are part of the measured time, like the packing inside a BLAS call.
    state = gmm_state(size, size, size)
    func = build(state)
    func.set_num_threads(threads)
    rng = np.random.default_rng(0)
    a = aligned(rng.random((size, size), dtype=np.float32))
    b = aligned(rng.random((size, size), dtype=np.float32))
    (c,) = func.run(a, b)
    err = max_rel_error(c, a @ b)
    if err > RTOL:
        raise SystemExit(f"gmm_1024: tensorgen result differs from NumPy (max rel error {err:.2e})")
    res = compare(lambda: func(a, b, c), lambda: a @ b, 2.0 * size**3, repeat, rounds)
    res["numpy_gflops"] = res.pop("peer_gflops")
    res["numpy_rounds"] = res.pop("peer_rounds")
    res["max_rel_error"] = err
    return res


def _torch_conv(x_nhwc: np.ndarray, w_hwio: np.ndarray, threads: int):
    try:
        import torch
    except ImportError:
        return None, None
    torch.set_num_threads(threads)
    x = torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))  # NCHW, converted once
    w = torch.from_numpy(np.ascontiguousarray(w_hwio.transpose(3, 2, 0, 1)))  # OIHW
    conv = torch.nn.functional.conv2d

    def run():
        with torch.no_grad():
            return conv(x, w, padding=1)

    return run, torch.__version__


def bench_conv(repeat: int, rounds: int, threads: int) -> dict:
    n, h, w, ci, co = 1, 56, 56, 64, 64
    # 2 rows x 7 pixels x 8 channels = 14 accumulators: fits the 16 AVX2 registers once loads use base pointers
    state = conv2d_state(n, h, w, ci, co, kernel=3, padding=1, stride=1, tile_w=7, tile_h=2)
    func = build(state)
    func.set_num_threads(threads)
    rng = np.random.default_rng(1)
    x = aligned(rng.random((n, h, w, ci), dtype=np.float32))
    wt = aligned(rng.random((3, 3, ci, co), dtype=np.float32))
    (y,) = func.run(x, wt)
    ref = conv2d_nhwc_reference(x, wt, padding=1, stride=1)
    err = max_rel_error(y, ref)
    if err > RTOL:
        raise SystemExit(f"c2d_resnet: tensorgen result differs from the NumPy reference (max rel error {err:.2e})")
    peer, torch_version = _torch_conv(x, wt, threads)
    if peer is not None:
        terr = max_rel_error(peer().numpy().transpose(0, 2, 3, 1), ref)
        if terr > RTOL:
            raise SystemExit(f"c2d_resnet: torch disagrees with the reference ({terr:.2e}); layouts wrong?")
    res = compare(lambda: func(x, wt, y), peer, 2.0 * n * h * w * ci * co * 9, repeat, rounds)
    res["torch_gflops"] = res.pop("peer_gflops")
    res["torch_rounds"] = res.pop("peer_rounds")
    res["torch_version"] = torch_version
    res["max_rel_error"] = err
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per block (median taken)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating ours/peer rounds")
    parser.add_argument("--threads", type=int, default=int(_THREADS), help="threads for every runtime")
    args = parser.parse_args(argv)

    gmm = bench_gmm(args.repeat, args.rounds, args.threads)
    conv = bench_conv(args.repeat, args.rounds, args.threads)

    rows = [("gmm_1024", gmm["tensorgen_gflops"], "numpy", gmm["numpy_gflops"], gmm["ratio"]),
            ("c2d_resnet", conv["tensorgen_gflops"], "torch", conv["torch_gflops"], conv["ratio"])]
    print(f"{'op':<12} {'tensorgen GFLOP/s':>18} {'peer':>6} {'peer GFLOP/s':>13} {'ratio':>7}")
    for op, ours, peer_name, peer, ratio in rows:
        peer_s = "n/a" if peer is None else f"{peer:.1f}"
        ratio_s = "n/a" if ratio is None else f"{ratio:.2f}"
        print(f"{op:<12} {ours:>18.1f} {peer_name:>6} {peer_s:>13} {ratio_s:>7}")
    print(f"(threads={args.threads}, repeat={args.repeat}, rounds={args.rounds}; "
          "ratio = median of per-round tensorgen/peer speed ratios)")

    if args.json:
        out = {
            "gmm_1024": gmm,
            "c2d_resnet": conv,
            "threads": args.threads,
            "repeat": args.repeat,
            "rounds": args.rounds,
        }
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
