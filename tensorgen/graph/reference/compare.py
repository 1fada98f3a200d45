"""Measure a compiled model side by side with ONNX Runtime and PyTorch, in one run, on the same inputs.

Engines are timed in alternating blocks (so a noisy neighbour hurts all of them alike) and the
median of the blocks is reported; a speedup is the median of the rounds' ratios (each round times every
engine once, seconds apart, so a load that comes and goes between rounds cancels); outputs are compared
with ONNX Runtime's.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensorgen.graph.ir import Graph

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]

# Two float32 programs of one model agree to this, relative to the largest |output| of ONNX Runtime: they
# sum in different orders (fusions, tiling), and the zoo's weights keep activations in range (zoo_builder).
OUTPUT_RTOL = 1e-3


def output_error(ours: list[np.ndarray], ref: list[np.ndarray]) -> tuple[float, float]:
    """(max |ours - ref|, that over max |ref|) over all outputs; inf when a shape differs or ours is not finite."""
    abs_err, scale = 0.0, 0.0
    for a, b in zip(ours, ref, strict=True):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape or not np.isfinite(a).all():
            return math.inf, math.inf
        abs_err = max(abs_err, float(np.max(np.abs(a - b), initial=0.0)))
        scale = max(scale, float(np.max(np.abs(b), initial=0.0)))
    return abs_err, abs_err / scale if scale > 0 else (0.0 if abs_err == 0 else math.inf)


@dataclass
class Comparison:
    model: str
    threads: int
    tensorgen_ms: float
    onnxruntime_ms: float | None
    torch_ms: float | None
    max_abs_err_vs_onnxruntime: float | None
    tuned_tasks: int
    total_tasks: int
    build_s: float
    kernels: list[dict] | None = None  # CompiledModel.profile, when asked for
    blocks_ms: dict[str, list[float]] | None = None  # each engine's per-run ms of every round, in order
    max_rel_err_vs_onnxruntime: float | None = None  # max_abs_err over max |ONNX Runtime output|

    @property
    def output_ok(self) -> bool | None:
        """Whether tensorgen's output equals ONNX Runtime's within OUTPUT_RTOL (None: no ONNX Runtime)."""
        rel = self.max_rel_err_vs_onnxruntime
        return None if rel is None else rel <= OUTPUT_RTOL

    def ratios(self) -> dict[str, float]:
        """Speedup of tensorgen over each peer (> 1: tensorgen is faster): the median over rounds of the
        round's ratio, or the ratio of the medians without block times."""
        out = {}
        for peer in ("onnxruntime", "torch"):
            ms = getattr(self, f"{peer}_ms")
            if ms is None:
                continue
            ours, theirs = (self.blocks_ms or {}).get("tensorgen"), (self.blocks_ms or {}).get(peer)
            out[peer] = statistics.median(p / t for t, p in zip(ours, theirs)) if ours and theirs \
                else ms / self.tensorgen_ms
        return out


def onnxruntime_runner(onnx_model, graph: Graph, threads: int) -> Runner | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    data = onnx_model.SerializeToString() if hasattr(onnx_model, "SerializeToString") else str(onnx_model)
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return lambda xs: session.run(None, dict(zip(names, xs)))


def torch_runner(graph: Graph, threads: int) -> Runner | None:
    try:
        from tensorgen.graph.reference.torch_eval import TorchModel, available
    except ImportError:
        return None
    if not available():
        return None
    model = TorchModel(graph, threads=threads)
    return model.run


def time_engines(engines: dict[str, Runner], inputs: list[np.ndarray], blocks: int = 5,
                 min_block_s: float = 0.2, pause_s: float = 0.5, warm_s: float = 0.2) -> dict[str, list[float]]:
    """Per-run milliseconds of each engine in each of `blocks` rounds of alternating blocks (after a warm-up).

    Each block starts after `pause_s` of sleep: thread pools spin-wait after their work (ONNX Runtime's
    by default), and on two cores the engine timed next ran against them (tensorgen after ORT on
    MobileNet-V2: 5.06 ms without the pause, 3.81 with; torch 27 ms against 15).
    Then the engine runs untimed for `warm_s`: after any idle pause the cores run slow for tens of
    milliseconds (MobileNet-V2 runs at 5-6 ms for its first 10-40 runs after a 0.5 s sleep, then 3.4),
    which a 0.2 s block would average in, pulling every ratio toward 1."""
    runs = {}
    for name, run in engines.items():
        start = time.perf_counter()
        run(inputs)
        once = time.perf_counter() - start
        runs[name] = max(1, math.ceil(min_block_s / max(once, 1e-6)))
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(blocks):
        for name, run in engines.items():
            time.sleep(pause_s)
            start = time.perf_counter()
            while time.perf_counter() - start < warm_s:
                run(inputs)
            start = time.perf_counter()
            for _ in range(runs[name]):
                run(inputs)
            samples[name].append((time.perf_counter() - start) / runs[name] * 1e3)
    return samples


def compare(model: object, db=None, threads: int = 2, batch: int = 1, blocks: int = 5,
            out_dir: str | None = None, seed: int = 0, with_torch: bool = True, profile: bool = False,
            candidates: int = 1) -> Comparison:
    """Build `model` (zoo name or .onnx path) with `db`'s records and time it next to its peers
    (`candidates`: see build_model)."""
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.load import load_graph, onnx_model_of
    from tensorgen.graph.zoo import random_inputs
    from tensorgen.runtime.model import CompiledModel

    onnx_model = onnx_model_of(model, batch=batch)
    graph = load_graph(onnx_model)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        directory = build_model(graph, out_dir or tmp, db=db, candidates=candidates)
        build_s = time.perf_counter() - start
        compiled = CompiledModel(directory, threads=threads)
        manifest = compiled.manifest
        feeds = random_inputs(onnx_model, seed)
        inputs = [feeds[name] for name in graph.inputs]
        engines: dict[str, Runner] = {"tensorgen": compiled.run}
        ort_run = onnxruntime_runner(onnx_model, graph, threads)
        if ort_run is not None:
            engines["onnxruntime"] = ort_run
        torch_run = torch_runner(graph, threads) if with_torch else None
        if torch_run is not None:
            engines["torch"] = torch_run
        err = rel_err = None
        if ort_run is not None:
            err, rel_err = output_error(compiled.run(inputs), ort_run(inputs))
        samples = time_engines(engines, inputs, blocks)
        ms = {name: statistics.median(v) for name, v in samples.items()}
        profiled = compiled.profile(inputs) if profile else None
    kernels = manifest["kernels"]
    keys = {k["workload_key"] for k in kernels}
    tuned = {k["workload_key"] for k in kernels if k["tuned"]}
    return Comparison(graph.name, threads, ms["tensorgen"], ms.get("onnxruntime"), ms.get("torch"), err,
                      len(tuned), len(keys), build_s, profiled, samples, rel_err)
