"""The report's optional profile: the model built with the database's records and run, each kernel's share of the
time inside whole runs (with its GFLOP/s and share of the machine's peak), next to ONNX Runtime's per-node profile
of the same model on the same inputs when onnxruntime is installed. It builds and runs the model: seconds to
minutes, hence `tensorgen report --profile` only."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.ir import Graph
from tensorgen.records.database import Database
from tensorgen.runtime.model import CompiledModel

WARM_RUNS = 3
DISAGREE = 2.0  # a kernel this many times slower or faster in the model than its tuned time alone is flagged


@dataclass(frozen=True)
class KernelTime:
    """One kernel inside the model: median ms per run, share of the model's kernel time, speed."""

    name: str
    ms: float
    share: float
    gflops: float | None
    peak_share: float | None  # of the hardware's measured peak (None: not measured)
    schedule: str  # "tuned" | "transferred" | "default"
    tuned_ms: float | None  # what its record measured alone

    @property
    def disagreement(self) -> float | None:
        """How many times its time in the model and its tuned time differ (>= 1), where both are known."""
        if not self.tuned_ms or self.ms <= 0:
            return None
        return max(self.ms / self.tuned_ms, self.tuned_ms / self.ms)

    @property
    def flagged(self) -> bool:
        """Its tuned time and its time in the model disagree by more than DISAGREE times: one of them was measured
        on a busy machine, or the kernel runs in the model unlike alone (its inputs elsewhere in the caches)."""
        return (self.disagreement or 0.0) > DISAGREE


@dataclass(frozen=True)
class NodeTime:
    """One ONNX Runtime node: median ms per run and its share of the nodes' time."""

    name: str
    op: str
    ms: float
    share: float


@dataclass(frozen=True)
class Profile:
    model: str
    threads: int
    runs: int
    kernels: tuple[KernelTime, ...]
    nodes: tuple[NodeTime, ...] | None  # None: onnxruntime is not installed
    peak_gflops: float | None

    @property
    def total_ms(self) -> float:
        return sum(k.ms for k in self.kernels)

    @property
    def onnxruntime_ms(self) -> float | None:
        return None if self.nodes is None else sum(n.ms for n in self.nodes)


def profile_model(onnx_model: Any, graph: Graph, feed: Mapping[str, np.ndarray], db: Database | None,
                  flops: Mapping[str, float], threads: int, peak_gflops: float | None, runs: int = 20) -> Profile:
    """Build `graph` with `db`'s best records (no in-model selection), time its kernels over `runs` whole runs on
    `feed`, and ONNX Runtime's nodes the same way; `flops` maps workload keys to FLOPs (for GFLOP/s)."""
    inputs = [feed[name] for name in graph.inputs]
    with tempfile.TemporaryDirectory() as tmp:
        compiled = CompiledModel(build_model(graph, tmp, db=db, candidates=1), threads=threads)
        for _ in range(WARM_RUNS):
            compiled.run(inputs)
        timed = compiled.profile(inputs, repeat=runs)
        info = compiled.manifest["kernels"]
        nodes = onnxruntime_nodes(onnx_model, feed, threads, runs, tmp)
    total = sum(k["ms"] for k in timed) or 1.0
    kernels = []
    for k, meta in zip(timed, info):
        work = flops.get(meta["workload_key"], 0.0)
        gflops = work / (k["ms"] * 1e-3) / 1e9 if work and k["ms"] > 0 else None
        peak = gflops / peak_gflops if gflops is not None and peak_gflops else None
        kernels.append(KernelTime(k["kernel"], k["ms"], k["ms"] / total, gflops, peak, meta.get("schedule", "?"),
                                  k["tuned_ms"]))
    return Profile(graph.name, threads, runs, tuple(kernels), nodes, peak_gflops)


def onnxruntime_nodes(onnx_model: Any, feed: Mapping[str, np.ndarray], threads: int, runs: int,
                      out_dir: str) -> tuple[NodeTime, ...] | None:
    """Each node's median time over `runs` runs from ONNX Runtime's profiler (None without onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.enable_profiling, options.profile_file_prefix = True, str(Path(out_dir) / "onnxruntime")
    session = ort.InferenceSession(onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    given = {k: v for k, v in feed.items() if k in names}
    for _ in range(WARM_RUNS + runs):
        session.run(None, given)
    per_node: dict[str, list[float]] = {}
    ops: dict[str, str] = {}
    suffix = "_kernel_time"
    events = sorted((e for e in json.loads(Path(session.end_profiling()).read_text())
                     if e.get("cat") == "Node" and e.get("name", "").endswith(suffix)), key=lambda e: e["ts"])
    per_run = max(len(events) // (WARM_RUNS + runs), 1)  # every run emits one event per node, in order
    for i, e in enumerate(events):
        op = e.get("args", {}).get("op_name", "?")
        node = e["name"][: -len(suffix)] or f"{op} #{i % per_run}"  # a node without a name: its place in a run
        ops.setdefault(node, op)
        per_node.setdefault(node, []).append(e["dur"] / 1e3)
    medians = {n: float(np.median(v[-runs:])) for n, v in per_node.items()}  # the warm-up runs left out
    total = sum(medians.values()) or 1.0
    return tuple(NodeTime(n, ops[n], ms, ms / total) for n, ms in medians.items())
