"""One entry for every way a user names a model: a zoo name, an .onnx path, a ModelProto or a Graph."""

from __future__ import annotations

import os
from pathlib import Path

from tensorgen.graph.ir import Graph, GraphError


def onnx_model_of(model: object, batch: int = 1):
    """The onnx.ModelProto of a zoo name (built at `batch`) or an .onnx path; a ModelProto passes through."""
    if type(model).__name__ == "ModelProto":
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise GraphError(f"cannot load a model from {type(model).__name__}; pass a zoo name, an .onnx path, "
                         "an onnx.ModelProto or a tensorgen Graph")
    from tensorgen.graph.zoo import load_model

    proto = load_model(str(model), batch=batch)
    if not Path(model).suffix and not Path(model).exists() and not proto.graph.name:
        proto.graph.name = str(model)
    return proto


def load_graph(model: object, batch: int = 1, optimize: bool = True) -> Graph:
    """The optimized graph of `model` (zoo models are built at `batch`; files keep their own shapes)."""
    from tensorgen.graph.onnx_frontend import import_onnx
    from tensorgen.graph.passes import optimize as optimize_graph

    graph = model if isinstance(model, Graph) else import_onnx(onnx_model_of(model, batch))
    return optimize_graph(graph) if optimize else graph
