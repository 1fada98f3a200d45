"""Hand-written schedules vs. vendor libraries: GMM 1024^3 vs NumPy, ResNet-50 conv2d vs PyTorch.

    python bench/hand_schedules.py [--json FILE] [--threads T] [--rounds R] [--bound B] [--load] ...

The schedules are `tensorgen.examples.gmm_state` / `tensorgen.examples.conv2d_state` (one copy, shared
with the demo and the smoke test). Timing: the protocol of tensorgen/timing.py (alternating blocks,
GFLOP/s the medians over rounds and `ratio` their ratio, rows whose rounds never agree within
--bound marked unreliable). NumPy writes into a preallocated output (`matmul(out=)`) as tensorgen
does; PyTorch's conv2d has no `out=` and allocates its result.
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
from tensorgen.examples import conv2d_nhwc_reference, conv2d_state, gmm_state, max_rel_error  # noqa: E402
from tensorgen.runtime import aligned  # noqa: E402
from tensorgen.timing import Protocol, add_arguments, compare, competing_load, describe_load, protocol_from  # noqa: E402

RTOL = 1e-3  # relative to max |reference|


def compare_peer(ours, peer, peer_name: str, flops: float, protocol: Protocol, load: bool) -> dict:
    """tensorgen and its peer (None: tensorgen alone) under the protocol: GFLOP/s, ratio, agreement."""
    engines = {"tensorgen": ours, **({peer_name: peer} if peer is not None else {})}
    with competing_load(load) as pid:
        loaded = describe_load(pid)
        timed = compare(engines, protocol)
    gflops = timed.gflops(flops)
    return {"tensorgen_gflops": gflops["tensorgen"], f"{peer_name}_gflops": gflops.get(peer_name),
            "ratio": timed.ratios.get(peer_name), "reliable": timed.reliable, "disagreement": timed.disagreement(),
            "timing": timed.to_json(), "load": loaded}


def bench_gmm(protocol: Protocol, load: bool, threads: int, size: int = 1024) -> dict:
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
    c_numpy = np.empty_like(c)
    res = compare_peer(lambda: func(a, b, c), lambda: np.matmul(a, b, out=c_numpy), "numpy", 2.0 * size**3,
                       protocol, load)
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

    return (lambda: conv(x, w, padding=1)), torch.__version__  # no input requires grad: autograd records nothing


def bench_conv(protocol: Protocol, load: bool, threads: int) -> dict:
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
    res = compare_peer(lambda: func(x, wt, y), peer, "torch", 2.0 * n * h * w * ci * co * 9, protocol, load)
    res["torch_version"] = torch_version
    res["max_rel_error"] = err
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON")
    parser.add_argument("--threads", type=int, default=int(_THREADS), help="threads for every runtime")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        protocol = protocol_from(args)
    except ValueError as err:
        parser.error(str(err))

    gmm = bench_gmm(protocol, args.load, args.threads)
    conv = bench_conv(protocol, args.load, args.threads)

    rows = [("gmm_1024", gmm, "numpy"), ("c2d_resnet", conv, "torch")]
    print(f"{'op':<12} {'tensorgen GFLOP/s':>18} {'peer':>6} {'peer GFLOP/s':>13} {'ratio':>7} {'rounds':>6}")
    for op, res, peer_name in rows:
        peer = res[f"{peer_name}_gflops"]
        peer_s = "n/a" if peer is None else f"{peer:.1f}"
        ratio_s = "n/a" if res["ratio"] is None else f"{res['ratio']:.2f}"
        verdict = "" if res["reliable"] else f"  UNRELIABLE: {res['disagreement']}"
        print(f"{op:<12} {res['tensorgen_gflops']:>18.1f} {peer_name:>6} {peer_s:>13} {ratio_s:>7} "
              f"{res['timing']['rounds']:>6}{verdict}")
    print(f"(threads={args.threads}; GFLOP/s: medians over rounds, ratio: their ratio; tensorgen/timing.py)")

    if args.json:
        out = {"gmm_1024": gmm, "c2d_resnet": conv, "threads": args.threads, "timing": protocol.to_json(),
               "load": args.load}
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
