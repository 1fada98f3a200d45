"""A compiled model under load: its call-time distribution alone and next to one competing CPU-bound process,
next to ONNX Runtime's, for a few spin times of the model's thread pool (tensorgen/codegen/pool.py).

    python bench/wait_policy.py [--models mlp,mobilenet_v2] [--spins 30,5,400] [--seconds 3] [--rounds 2]
                                [--db FILE] [--json FILE]

Each engine runs in a fresh process (the pool reads TENSORGEN_POOL_SPIN_US once) with 2 threads, calls the
model back to back for `--seconds` and reports the median, mean, 90th percentile and maximum call time, alone
and next to one competing CPU-bound process (bench/timing.competing_load); engines alternate within each round.
Models: "mlp" (three 512-1024 Gemm + Relu layers, a model of ~0.2 ms) and zoo names, built from `--db` (default
schedules without one). What it shows is the distribution, not one statistic: under load a thread that waits
for a core can hold up a whole loop, and one that spins takes a core from the thread it waits for. The slowdown
under load (loaded / idle, per statistic) is what to compare with ONNX Runtime's.
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

from tensorgen.timing import competing_load, describe_load


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

    from tensorgen.graph.backend.build import build_model
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


def slowdowns(rows: list[dict]) -> list[str]:
    """Per model and engine: each statistic's median over rounds, idle and loaded, and loaded / idle."""
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        for engine in dict.fromkeys(r["engine"] for r in rows):
            cells = []
            for stat in ("median_ms", "mean_ms", "p90_ms", "max_ms"):
                idle, load = (float(np.median([r[stat] for r in rows if r["model"] == model and r["engine"] == engine
                                               and r["load"]["competing_process"] == loaded]))
                              for loaded in (False, True))
                cells.append(f"{stat[:-3]} {idle:.3f} -> {load:.3f} ms ({load / idle:.2f}x)")
            lines.append(f"{model:14s} {engine:22s} " + "  ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mlp,mobilenet_v2")
    parser.add_argument("--spins", default="30", help="pool spin times to compare (microseconds)")
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
    settings = {f"spin {us} us": {"TENSORGEN_POOL_SPIN_US": us} for us in args.spins.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            directory = Path(tmp) / name
            directory.mkdir()
            prepare(name, directory, args.db)
            for loaded in (False, True):
                with competing_load(loaded) as pid:
                    for rnd in range(args.rounds):
                        for engine, env in [("onnxruntime", {})] + [(f"tensorgen {k}", v) for k, v in settings.items()]:
                            proc = subprocess.run(
                                [sys.executable, __file__, "--child", engine.split()[0], str(directory),
                                 str(args.seconds)],
                                env={**os.environ, **env, "OMP_NUM_THREADS": "2"}, capture_output=True, text=True,
                                check=True)
                            ms = np.array(json.loads(proc.stdout.splitlines()[-1])) * 1e3
                            row = {"model": name, "load": describe_load(pid), "round": rnd, "engine": engine,
                                   "calls": len(ms), "median_ms": float(np.median(ms)), "mean_ms": float(ms.mean()),
                                   "p90_ms": float(np.percentile(ms, 90)), "max_ms": float(ms.max())}
                            rows.append(row)
                            print(f"{name:14s} {'load' if loaded else 'idle'} r{rnd} {engine:22s} median "
                                  f"{row['median_ms']:8.3f} ms  mean {row['mean_ms']:8.3f}  p90 {row['p90_ms']:8.3f}"
                                  f"  max {row['max_ms']:8.2f}", flush=True)
    summary = slowdowns(rows)
    for line in summary:
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "settings": settings, "seconds": args.seconds,
                                                "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
