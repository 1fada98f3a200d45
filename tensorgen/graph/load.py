"""One entry for every way a user names a model: a zoo name, an .onnx path, a ModelProto or a Graph."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tensorgen.graph.ir import Graph, GraphError


def onnx_model_of(model: object, batch: int = 1):
    """The onnx.ModelProto of a zoo name (built at `batch`) or an .onnx path; a ModelProto passes through."""
    if type(model).__name__ == "ModelProto":
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise GraphError(f"cannot load a model from {type(model).__name__}; pass a zoo name, an .onnx path, "
                         "an onnx.ModelProto or a tensorgen Graph")
    from tensorgen.graph.frontend.onnx_import import read_onnx
    from tensorgen.graph.zoo import MODELS, load_model

    if str(model) not in MODELS and Path(model).is_file():
        if batch != 1:
            raise GraphError(f"batch applies to zoo models only; {model} keeps the shapes stored in it")
        return read_onnx(model)
    proto = load_model(str(model), batch=batch)
    if not Path(model).suffix and not Path(model).exists() and not proto.graph.name:
        proto.graph.name = str(model)
    return proto


def load_graph(model: object, batch: int = 1, optimize: bool = True,
               input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """The optimized graph of `model` (zoo models are built at `batch`; files keep their own shapes, but for
    their symbolic dimensions, which `input_shapes` fixes: {"input_ids": (1, 16)})."""
    from tensorgen.graph.frontend.onnx_import import import_onnx
    from tensorgen.graph.frontend.onnx_inputs import static_shapes
    from tensorgen.graph.passes import optimize as optimize_graph

    if isinstance(model, Graph):
        if input_shapes:
            raise GraphError(f"input shapes apply to ONNX models; graph {model.name!r} has static shapes already")
        graph = model
    else:
        proto = onnx_model_of(model, batch)
        graph = import_onnx(proto, input_shapes=static_shapes(proto, input_shapes))
    check_memory(graph)
    return optimize_graph(graph) if optimize else graph


def memory_needed(graph: Graph) -> int:
    """Bytes any engine needs to run `graph` at least: its weights, inputs and outputs, and the values of the
    node that touches the most bytes besides them."""
    def size(names: set[str]) -> int:
        return sum(math.prod(graph.value(n).shape) * np.dtype(graph.value(n).dtype).itemsize for n in names if n)

    fixed = set(graph.constants) | set(graph.inputs) | set(graph.outputs)
    step = max((size({*n.inputs, *n.outputs} - fixed) for n in graph.nodes), default=0)
    return size(fixed) + step


def check_memory(graph: Graph) -> None:
    """MemoryBudgetError with the figures when `graph` needs more than the memory budget (hardware.memory_limit),
    before anything of its size (inputs, buffers, an analysis per element) is allocated."""
    from tensorgen.hardware import check_memory_budget, format_bytes

    need = memory_needed(graph)
    check_memory_budget(need, f"model {graph.name!r} needs {format_bytes(need)} for its weights, inputs, outputs and "
                      "buffers")
