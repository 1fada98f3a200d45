"""Where a compiled model loses to ONNX Runtime: each kernel's time inside the model, next to the time
ONNX Runtime's profiler gives the node it matches, in one run.

    python bench/layers.py resnet50 --db networks.db [--runs 30] [--threads 2] [--json FILE]

Each kernel is timed inside whole runs of the model (`CompiledModel.profile`), in the state the model
leaves it: its weights come from memory, its inputs from the previous kernel. The harness estimate
(the record's cost) is printed beside it.
Convolution kernels are matched to ONNX Runtime's Conv nodes in order (both run the graph in
topological order); other kernels and nodes are listed without a match.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from tensorgen.graph.build import build_model
from tensorgen.graph.load import load_graph, onnx_model_of
from tensorgen.graph.zoo import random_inputs
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.model import CompiledModel


def ours(model: str, db: str, threads: int, runs: int, out_dir: str) -> list[dict]:
    proto = onnx_model_of(model)
    graph = load_graph(proto)
    feeds = random_inputs(proto)
    inputs = [feeds[n] for n in graph.inputs]
    compiled = CompiledModel(build_model(graph, out_dir, db=SQLiteDatabase(db)), threads=threads)
    for _ in range(5):
        compiled.run(inputs)
    return [{"kernel": k["kernel"], "ms": k["ms"], "estimate_ms": k["tuned_ms"] or 0.0}
            for k in compiled.profile(inputs, repeat=runs)]


def onnxruntime_nodes(model: str, threads: int, runs: int, out_dir: str) -> list[dict]:
    import onnxruntime as ort

    proto = onnx_model_of(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling, options.profile_file_prefix = True, str(Path(out_dir) / "ort")
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {k: v for k, v in random_inputs(proto).items() if k in {i.name for i in session.get_inputs()}}
    for _ in range(5 + runs):
        session.run(None, feeds)
    times: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    for event in json.loads(Path(session.end_profiling()).read_text()):
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            node = event["name"][: -len("_kernel_time")]
            times.setdefault(node, []).append(event["dur"] / 1e3)
            ops[node] = event["args"].get("op_name", "?")
    return [{"node": n, "op": ops[n], "ms": statistics.median(t[-runs:])} for n, t in times.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo name or an .onnx file")
    parser.add_argument("--db", required=True, help="tuning records to build with")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = ours(args.model, args.db, args.threads, args.runs, tmp)
        nodes = onnxruntime_nodes(args.model, args.threads, args.runs, tmp)
    convs = iter(n for n in nodes if "Conv" in n["op"])
    for k in kernels:
        match = next(convs, None) if "conv" in k["kernel"] else None
        k["onnxruntime"] = match
        ort_ms = f"{match['ms']:8.3f}  x{k['ms'] / match['ms']:5.2f}  {match['node']}" if match else ""
        print(f"{k['kernel']:30s} {k['ms']:8.3f} ms (estimate {k['estimate_ms']:7.3f})  {ort_ms}")
    matched = {id(k["onnxruntime"]) for k in kernels if k["onnxruntime"]}
    for n in nodes:
        if id(n) not in matched:
            print(f"{'':30s} {'':8s}    {'':18s}  {n['ms']:8.3f}  {n['op']} {n['node']}")
    total_ours, total_ort = sum(k["ms"] for k in kernels), sum(n["ms"] for n in nodes)
    print(f"total: tensorgen kernels {total_ours:.2f} ms (estimate {sum(k['estimate_ms'] for k in kernels):.2f}), "
          f"onnxruntime nodes {total_ort:.2f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({"kernels": kernels, "onnxruntime": nodes}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
