"""Where a compiled model loses to ONNX Runtime: each kernel's time inside the model, next to the time
ONNX Runtime's profiler gives the node it matches, in one run.

    python bench/layers.py resnet50 --db networks.db [--runs 30] [--threads 2] [--rounds 3] [--bound 0.1]
                           [--load] [--json FILE]

Each kernel is timed inside whole runs of the model (`CompiledModel.profile`), in the state the model
leaves it: its weights come from memory, its inputs from the previous kernel. The harness estimate
(the record's cost) is printed beside it.
Convolution kernels are matched to ONNX Runtime's Conv nodes in order (both run the graph in
topological order); other kernels and nodes are listed without a match.

Timing follows tensorgen/timing.py: rounds alternate the two engines (each round `--runs` runs of the
model, after a `--pause` and warm-up runs); a kernel's or node's time is the median over rounds of its
per-round median, and a matched pair's ratio is the ratio of those. Rounds are added until every
matched pair and the two model totals agree within `--bound` (up to `--max-rounds`); a pair whose
rounds still disagree is marked unreliable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.load import load_graph, onnx_model_of
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.model import CompiledModel
from tensorgen.timing import Comparison, Protocol, add_arguments, competing_load, describe_load, protocol_from

WARM_RUNS = 5


def ours(model: str, db: str, threads: int, out_dir: str) -> tuple[Callable[[int], list[float]], list[dict]]:
    """A round of tensorgen (runs -> each kernel's median ms) and the kernels' names and estimates."""
    proto = onnx_model_of(model)
    graph = load_graph(proto)
    feeds = random_inputs(proto)
    inputs = [feeds[n] for n in graph.inputs]
    compiled = CompiledModel(build_model(graph, out_dir, db=SQLiteDatabase(db)), threads=threads)

    def round_ms(runs: int) -> list[float]:
        for _ in range(WARM_RUNS):
            compiled.run(inputs)
        return [k["ms"] for k in compiled.profile(inputs, repeat=runs)]

    kernels = [{"kernel": k["kernel"], "estimate_ms": k["tuned_ms"] or 0.0} for k in compiled.profile(inputs, 1)]
    return round_ms, kernels


def onnxruntime_round(model: str, threads: int, out_dir: str) -> Callable[[int], tuple[list[dict], list[float]]]:
    """A round of ONNX Runtime (runs -> the nodes {"node", "op"} in execution order, each node's median ms):
    a session with its profiler on per round, so that every round's events can be read at its end."""
    import onnxruntime as ort

    proto = onnx_model_of(model)
    data = proto.SerializeToString()
    feeds = random_inputs(proto)

    def round_ms(runs: int) -> tuple[list[dict], list[float]]:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.enable_profiling, options.profile_file_prefix = True, str(Path(out_dir) / "ort")
        session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feed = {k: v for k, v in feeds.items() if k in names}
        for _ in range(WARM_RUNS + runs):
            session.run(None, feed)
        events = [e for e in json.loads(Path(session.end_profiling()).read_text())
                  if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
        events.sort(key=lambda e: e["ts"])
        ops: dict[str, str] = {}  # node -> op, in execution order (every run emits one event per node)
        for event in events:
            ops.setdefault(event["name"][: -len("_kernel_time")], event["args"].get("op_name", "?"))
        per_run = np.array([e["dur"] / 1e3 for e in events]).reshape(WARM_RUNS + runs, len(ops))
        return [{"node": n, "op": op} for n, op in ops.items()], list(np.median(per_run[WARM_RUNS:], axis=0))

    return round_ms


def summarize(kernels: list[dict], nodes: list[dict], kernel_rounds: list[list[float]],
              node_rounds: list[list[float]], runs: int, protocol: Protocol) -> dict:
    """Medians over rounds of every kernel and node, each conv kernel next to its Conv node (in order)
    with the agreement of their rounds, and the two totals."""
    def pair(ours: list[float], theirs: list[float]) -> Comparison:
        return Comparison({"tensorgen": ours, "onnxruntime": theirs}, "tensorgen", runs, protocol)

    kernels = [{**k, "ms": float(np.median(r)), "onnxruntime": None} for k, r in zip(kernels, zip(*kernel_rounds))]
    nodes = [{**n, "ms": float(np.median(r)), "matched": False} for n, r in zip(nodes, zip(*node_rounds))]
    convs = iter(i for i, n in enumerate(nodes) if "Conv" in n["op"])
    for index, k in enumerate(kernels):
        match = next(convs, None) if "conv" in k["kernel"] else None
        if match is not None:
            timed = pair([r[index] for r in kernel_rounds], [r[match] for r in node_rounds])
            k["onnxruntime"] = {"node": nodes[match]["node"], "op": nodes[match]["op"], "ms": nodes[match]["ms"],
                                "reliable": timed.reliable, "disagreement": timed.disagreement(),
                                "timing": timed.to_json()}
            nodes[match]["matched"] = True
    totals = pair([sum(r) for r in kernel_rounds], [sum(r) for r in node_rounds])
    reliable = totals.reliable and all(k["onnxruntime"]["reliable"] for k in kernels if k["onnxruntime"])
    return {"kernels": kernels, "onnxruntime": nodes, "totals": totals.to_json(), "reliable": reliable}


def measure(model: str, db: str, threads: int, runs: int, protocol: Protocol, out_dir: str) -> dict:
    """Kernels and nodes timed in alternating rounds until every matched pair and the totals agree, or
    protocol.max_rounds rounds are measured."""
    kernel_round, kernels = ours(model, db, threads, out_dir)
    node_round = onnxruntime_round(model, threads, out_dir)
    kernel_rounds: list[list[float]] = []
    node_rounds: list[list[float]] = []
    while True:
        time.sleep(protocol.pause_s)
        kernel_rounds.append(kernel_round(runs))
        time.sleep(protocol.pause_s)
        nodes, node_ms = node_round(runs)
        node_rounds.append(node_ms)
        if len(kernel_rounds) >= protocol.rounds:
            result = summarize(kernels, nodes, kernel_rounds, node_rounds, runs, protocol)
            if result["reliable"] or len(kernel_rounds) >= protocol.max_rounds:
                return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a zoo name or an .onnx file")
    parser.add_argument("--db", required=True, help="tuning records to build with")
    parser.add_argument("--runs", type=int, default=30, help="runs of the model per round (default 30)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", metavar="FILE")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        protocol = protocol_from(args)
    except ValueError as err:
        parser.error(str(err))
    with tempfile.TemporaryDirectory() as tmp, competing_load(args.load) as pid:
        load = describe_load(pid)
        result = measure(args.model, args.db, args.threads, args.runs, protocol, tmp)
    for k in result["kernels"]:
        match = k["onnxruntime"]
        ort_ms = ""
        if match is not None:
            verdict = "" if match["reliable"] else f"  UNRELIABLE: {match['disagreement']}"
            ort_ms = f"{match['ms']:8.3f}  x{k['ms'] / match['ms']:5.2f}  {match['node']}{verdict}"
        print(f"{k['kernel']:30s} {k['ms']:8.3f} ms (estimate {k['estimate_ms']:7.3f})  {ort_ms}")
    for n in result["onnxruntime"]:
        if not n["matched"]:
            print(f"{'':30s} {'':8s}    {'':18s}  {n['ms']:8.3f}  {n['op']} {n['node']}")
    totals = result["totals"]
    verdict = "" if totals["reliable"] else " (UNRELIABLE: the rounds' totals disagree)"
    print(f"total: tensorgen kernels {totals['seconds']['tensorgen']:.2f} ms (estimate "
          f"{sum(k['estimate_ms'] for k in result['kernels']):.2f}), onnxruntime nodes "
          f"{totals['seconds']['onnxruntime']:.2f} ms; {totals['rounds']} rounds{verdict}")
    if args.json:
        Path(args.json).write_text(json.dumps({**result, "timing": protocol.to_json(), "load": load}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
