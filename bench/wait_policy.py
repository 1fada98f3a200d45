"""A compiled model under load: how libgomp's wait policy changes its call-time distribution, next to ONNX Runtime.

    python bench/wait_policy.py [--models mlp,mobilenet_v2] [--seconds 3] [--rounds 2] [--db FILE] [--json FILE]

Each engine runs in a fresh process (libgomp reads OMP_WAIT_POLICY / GOMP_SPINCOUNT once, when it loads) with
2 threads, calls the model back to back for `--seconds` and reports the median, 90th percentile and maximum
call time, alone and next to one competing CPU-bound process (bench/timing.competing_load); engines alternate
within each round. Models: "mlp" (three 512-1024 Gemm + Relu layers, a model of ~0.2 ms) and zoo names, built
from `--db` (default schedules without one). What it shows is the distribution, not one statistic: under load a
team thread that waits for a core holds up every barrier of the model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from timing import competing_load, describe_load

SETTINGS = {"default": {}, "spin10k": {"GOMP_SPINCOUNT": "10000"}, "passive": {"OMP_WAIT_POLICY": "passive"}}


def mlp_model():
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i, (a, b) in enumerate([(512, 1024), (1024, 1024), (1024, 512)]):
        weights += [numpy_helper.from_array((rng.standard_normal((a, b)) * 0.03).astype(np.float32), f"w{i}"),
                    numpy_helper.from_array(np.zeros(b, np.float32), f"b{i}")]
        nodes += [helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [f"g{i}"]),
                  helper.make_node("Relu", [f"g{i}"], [f"r{i}"])]
        x = f"r{i}"
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 512])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def prepare(name: str, directory: Path, db: str | None) -> None:
    """`directory`/model.onnx and the compiled model in `directory`/tg."""
    import onnx

    from tensorgen.graph.build import build_model
    from tensorgen.graph.zoo import build_model as zoo_model
    from tensorgen.records import SQLiteDatabase

    onnx.save(mlp_model() if name == "mlp" else zoo_model(name), directory / "model.onnx")
    database = SQLiteDatabase(db, readonly=True) if db else None
    build_model(directory / "model.onnx", directory / "tg", db=database)


def child(engine: str, directory: Path, seconds: float) -> list[float]:
    """Call times (s) of one engine on one model in this process."""
    rng = np.random.default_rng(0)
    if engine == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
        session = ort.InferenceSession(str(directory / "model.onnx"), options, providers=["CPUExecutionProvider"])
        feed = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in session.get_inputs()}
        call = lambda: session.run(None, feed)  # noqa: E731
    else:
        from tensorgen.runtime.model import CompiledModel

        model = CompiledModel(directory / "tg", threads=2)
        feed = [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in model.inputs]
        call = lambda: model.run(feed)  # noqa: E731
    for _ in range(20):
        call()
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,mobilenet_v2")
    parser.add_argument("--seconds", type=float, default=3.0, help="calls per engine and round, in seconds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--db", help="tuning database for the compiled models (default schedules without)")
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]), float(args.child[2]))))
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            directory = Path(tmp) / name
            directory.mkdir()
            prepare(name, directory, args.db)
            for loaded in (False, True):
                with competing_load(loaded) as pid:
                    for rnd in range(args.rounds):
                        for engine, env in [("onnxruntime", {})] + [(f"tensorgen {k}", v) for k, v in SETTINGS.items()]:
                            proc = subprocess.run(
                                [sys.executable, __file__, "--child", engine, str(directory), str(args.seconds)],
                                env={**os.environ, **env, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True,
                                check=True)
                            ms = np.array(json.loads(proc.stdout.splitlines()[-1])) * 1e3
                            row = {"model": name, "load": describe_load(pid), "round": rnd, "engine": engine,
                                   "calls": len(ms), "median_ms": float(np.median(ms)),
                                   "p90_ms": float(np.percentile(ms, 90)), "max_ms": float(ms.max())}
                            rows.append(row)
                            print(f"{name:14s} {'load' if loaded else 'idle'} r{rnd} {engine:18s} median "
                                  f"{row['median_ms']:8.3f} ms  p90 {row['p90_ms']:8.3f}  max {row['max_ms']:8.2f}",
                                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "settings": SETTINGS, "seconds": args.seconds}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
