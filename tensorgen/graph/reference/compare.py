"""Measure a compiled model side by side with ONNX Runtime, in one run, on the same inputs (`tensorgen bench`).

Timing follows tensorgen.timing: alternating blocks, every engine writing into preallocated outputs
(tensorgen `run(out=)`, ONNX Runtime io_binding), medians over rounds and their ratio as the one statistic,
rounds added until they agree within the protocol's bound, else the result is marked unreliable. Outputs are
compared with ONNX Runtime's first; `tensorgen bench` reports no speedup for a wrong one.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgen import timing
from tensorgen.graph.frontend.onnx_quantized import is_quantized
from tensorgen.graph.ir import Graph, GraphError
from tensorgen.timing import Protocol

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]

# Two float32 programs of one model agree to this, relative to the largest |output| of ONNX Runtime: they
# sum in different orders (fusions, tiling), and the zoo's weights keep activations in range (zoo_builder).
OUTPUT_RTOL = 1e-3
# a model with a float16 output: each engine rounds to float16 (2**-11 relative) where its computation ends, and
# ONNX Runtime rounds at every Cast to float16 inside it as well (tensorgen computes on in float32)
HALF_OUTPUT_RTOL = 1e-2
# a quantized model: a value near the edge of a step of its 8-bit grid (1/255 of the range) rounds either way
# in two engines that sum in different orders, and the step carries on through the layers after it. ONNX Runtime
# against itself on an input changed by 1e-6, quantize_static models: MobileNet-V2 2.3%, ResNet-18 0.8%, ViT-S 6.7%;
# on float weights changed by 1e-6, quantize_dynamic BERT-tiny: 1.1% (tests/graph/test_qdq.py checks each op
# exactly); a wrong scale or zero point is off by the order of the output
QUANTIZED_OUTPUT_RTOL = 0.1
DEFAULT_PROTOCOL = Protocol()


def output_rtol(onnx_model: Any, graph: Graph) -> float:
    """How far two engines' outputs of `graph` (imported from `onnx_model`) may differ, relative to the largest
    |output|: OUTPUT_RTOL, QUANTIZED_OUTPUT_RTOL for a quantized model, HALF_OUTPUT_RTOL when an output is float16."""
    if is_quantized(onnx_model):
        return QUANTIZED_OUTPUT_RTOL
    return HALF_OUTPUT_RTOL if any(graph.value(n).dtype == "float16" for n in graph.outputs) else OUTPUT_RTOL


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
    blocks_ms: dict[str, list[float]] | None = None  # each engine's ms per run in every round, in order
    max_rel_err_vs_onnxruntime: float | None = None  # max_abs_err over max |ONNX Runtime output|
    reliable: bool | None = None  # the rounds agreed within the protocol's bound (tensorgen.timing)
    disagreement: str = ""  # what exceeded the bound when they did not
    output_rtol: float = OUTPUT_RTOL  # the bound on max_rel_err_vs_onnxruntime (see output_rtol)

    @property
    def output_ok(self) -> bool | None:
        """Whether tensorgen's output equals ONNX Runtime's within `output_rtol` (None: no ONNX Runtime)."""
        rel = self.max_rel_err_vs_onnxruntime
        return None if rel is None else rel <= self.output_rtol

    def ratios(self) -> dict[str, float]:
        """Speedup of tensorgen over each peer (> 1: tensorgen is faster): the ratio of the medians, the same
        numbers the ms columns show."""
        peers = {"onnxruntime": self.onnxruntime_ms, "torch": self.torch_ms}
        return {peer: ms / self.tensorgen_ms for peer, ms in peers.items() if ms is not None}


def _ort_session(onnx_model: Any, threads: int) -> Any:
    """An ONNX Runtime CPU session of `onnx_model` (a ModelProto or a path) on `threads` threads; None without
    onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    data = onnx_model.SerializeToString() if hasattr(onnx_model, "SerializeToString") else str(onnx_model)
    try:
        return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - onnxruntime's Fail, InvalidGraph, NotImplemented, ...
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        raise GraphError(f"ONNX Runtime, the peer it is compared with, cannot load the model: {first[:300]}") from None


def onnxruntime_runner(onnx_model, graph: Graph, threads: int) -> Runner | None:
    session = _ort_session(onnx_model, threads)
    if session is None:
        return None
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


def onnxruntime_engine(onnx_model: Any, feeds: dict, threads: int) -> tuple[Callable[[], list], list] | None:
    """A run with io_binding (inputs and preallocated outputs bound once) that returns the outputs it
    fills, and the outputs of a plain `session.run` (the reference every engine is checked against); None
    without onnxruntime."""
    session = _ort_session(onnx_model, threads)
    if session is None:
        return None
    import onnxruntime as ort

    binding = session.io_binding()
    for value in session.get_inputs():
        binding.bind_ortvalue_input(value.name, ort.OrtValue.ortvalue_from_numpy(feeds[value.name]))
    reference = session.run(None, feeds)
    outs = [np.empty_like(r) for r in reference]
    for value, out in zip(session.get_outputs(), outs):
        binding.bind_ortvalue_output(value.name, ort.OrtValue.ortvalue_from_numpy(out))

    def run() -> list:
        session.run_with_iobinding(binding)
        return outs

    return run, reference


def compare(model: object, db=None, threads: int = 2, batch: int = 1, protocol: Protocol = DEFAULT_PROTOCOL,
            out_dir: str | None = None, seed: int = 0, with_torch: bool = True, profile: bool = False,
            candidates: int = 1, inputs: Mapping[str, np.ndarray] | None = None,
            input_shapes: Mapping[str, Sequence[int]] | None = None, layouts: str | None = None) -> Comparison:
    """Build `model` (zoo name, .onnx path or ModelProto) with `db`'s records and time it next to its peers, every
    engine on `inputs` (arrays by input name; default: onnx_inputs.random_inputs drawn from `seed`, with
    `input_shapes` fixing symbolic dimensions) (`candidates`, `layouts`: see build_model)."""
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.frontend.onnx_inputs import fixed_inputs, random_inputs
    from tensorgen.graph.load import load_graph, onnx_model_of
    from tensorgen.runtime.model import CompiledModel

    onnx_model = onnx_model_of(model, batch=batch)
    shapes, feeds = fixed_inputs(onnx_model, inputs, input_shapes)
    graph = load_graph(onnx_model, input_shapes=shapes)  # the memory budget is checked before inputs are drawn
    feeds = random_inputs(onnx_model, seed, shapes) if feeds is None else feeds
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        directory = build_model(graph, out_dir or tmp, db=db, candidates=candidates, layouts=layouts)
        build_s = time.perf_counter() - start
        compiled = CompiledModel(directory, threads=threads)
        manifest = compiled.manifest
        inputs = [feeds[name] for name in graph.inputs]
        outs = compiled.run(inputs)
        engines: dict[str, Callable[[], object]] = {"tensorgen": lambda: compiled.run(inputs, out=outs)}
        err = rel_err = None
        ort_engine = onnxruntime_engine(onnx_model, feeds, threads)
        if ort_engine is not None:
            engines["onnxruntime"], reference = ort_engine
            err, rel_err = output_error(outs, reference)
        torch_run = torch_runner(graph, threads) if with_torch else None
        if torch_run is not None:
            engines["torch"] = lambda: torch_run(inputs)
        timed = timing.compare(engines, protocol, reference="tensorgen")
        ms = {name: s * 1e3 for name, s in timed.seconds.items()}
        blocks_ms = {name: [s * 1e3 for s in v] for name, v in timed.rounds_s.items()}
        profiled = compiled.profile(inputs) if profile else None
    kernels = manifest["kernels"]
    keys = {k["workload_key"] for k in kernels}
    tuned = {k["workload_key"] for k in kernels if k["tuned"]}
    return Comparison(graph.name, threads, ms["tensorgen"], ms.get("onnxruntime"), ms.get("torch"), err,
                      len(tuned), len(keys), build_s, profiled, blocks_ms, rel_err, timed.reliable,
                      timed.disagreement(), output_rtol(onnx_model, graph))
