"""Write a tensorgen Graph back as an ONNX model (opset 21), so ONNX Runtime or onnx.reference can run it.

The inverse of normalization: attributes that were compile-time inputs in ONNX (a Reshape's shape,
Slice's bounds, Pad's pads, ...) become initializer inputs again. Used by tests and debugging, and by
the graph passes to evaluate a normalized node on constant inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorgen.graph.frontend.onnx_eval import evaluate, onnx_dtype
from tensorgen.graph.ir import Graph, Node, Value

EXPORT_OPSET = 21
IR_VERSION = 10  # the IR version that came with opset 21

Input = str | np.ndarray  # a value name, or constant data that becomes an initializer
Exporter = Callable[[Node, Graph], tuple[list[Input], dict[str, Any]]]


def _i64(values) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _slice(n: Node, g: Graph) -> tuple[list[Input], dict[str, Any]]:
    # a clamped end of -1 with a negative step means "through index 0"; as an ONNX input -1 would wrap
    ends = [np.iinfo(np.int64).min if e == -1 and s < 0 else e for e, s in zip(n.attrs["ends"], n.attrs["steps"])]
    return [n.inputs[0], _i64(n.attrs["starts"]), _i64(ends), _i64(n.attrs["axes"]), _i64(n.attrs["steps"])], {}


def _pad(n: Node, g: Graph) -> tuple[list[Input], dict[str, Any]]:
    value = np.array(n.attrs["value"], dtype=g.value(n.inputs[0]).dtype)
    return [n.inputs[0], _i64(n.attrs["pads"]), value], {"mode": n.attrs["mode"]}


def _clip(n: Node, g: Graph) -> tuple[list[Input], dict[str, Any]]:
    dtype = g.value(n.inputs[0]).dtype
    bounds = [np.array(n.attrs[b], dtype=dtype) if np.isfinite(n.attrs[b]) else "" for b in ("min", "max")]
    return [n.inputs[0], *bounds], {}


def _resize(n: Node, g: Graph) -> tuple[list[Input], dict[str, Any]]:
    """Sizes where out == in * scale (scales that came from sizes, or exact ones), so ONNX's
    floor(in * float32(scale)) cannot round a size down; the scales themselves otherwise."""
    shape, out = g.value(n.inputs[0]).shape, g.value(n.outputs[0]).shape
    scales = n.attrs["scales"]
    attrs = {k: n.attrs[k] for k in ("mode", "coordinate_transformation_mode", "nearest_mode")}
    if all(abs(o - i * s) <= 1e-6 * max(o, 1) for i, o, s in zip(shape, out, scales)):
        return [n.inputs[0], "", "", _i64(out)], attrs
    return [n.inputs[0], "", np.array(scales, dtype=np.float32)], attrs


_EXPORTERS: dict[str, Exporter] = {
    "Reshape": lambda n, g: ([n.inputs[0], _i64(n.attrs["shape"])], {"allowzero": int(0 in n.attrs["shape"])}),
    "Expand": lambda n, g: ([n.inputs[0], _i64(n.attrs["shape"])], {}),
    "Tile": lambda n, g: ([n.inputs[0], _i64(n.attrs["repeats"])], {}),
    "Squeeze": lambda n, g: ([n.inputs[0], _i64(n.attrs["axes"])], {}),
    "Unsqueeze": lambda n, g: ([n.inputs[0], _i64(n.attrs["axes"])], {}),
    "Split": lambda n, g: ([n.inputs[0], _i64(n.attrs["split"])], {"axis": n.attrs["axis"]}),
    **dict.fromkeys(("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                     "ReduceSumSquare", "ReduceLogSumExp"),
                    lambda n, g: ([n.inputs[0], _i64(n.attrs["axes"])], {"keepdims": n.attrs["keepdims"]})),
    "Cast": lambda n, g: (list(n.inputs), {"to": onnx_dtype(n.attrs["to"])}),
    "CumSum": lambda n, g: ([n.inputs[0], _i64(n.attrs["axis"])],
                            {"exclusive": n.attrs["exclusive"], "reverse": n.attrs["reverse"]}),
    "TopK": lambda n, g: ([n.inputs[0], _i64([n.attrs["k"]])],
                          {"axis": n.attrs["axis"], "largest": n.attrs["largest"]}),
    "Slice": _slice,
    "Pad": _pad,
    "Clip": _clip,
    "Resize": _resize,
}


def export_node(node: Node, graph: Graph) -> tuple[onnx.NodeProto, dict[str, np.ndarray]]:
    """The ONNX node for `node`, and the parameter constants it reads (named after the node)."""
    inputs, attrs = _EXPORTERS.get(node.op, lambda n, g: (list(n.inputs), dict(n.attrs)))(node, graph)
    names, params = [], {}
    for k, x in enumerate(inputs):
        if isinstance(x, np.ndarray):
            name = f"{node.name}_param{k}"
            while name in graph.values:
                name += "_"
            params[name], x = x, name
        names.append(x)
    return helper.make_node(node.op, names, node.outputs, name=node.name, **attrs), params


def evaluate_node(node: Node, graph: Graph) -> dict[str, np.ndarray]:
    """Outputs of `node`, all of whose inputs are constants of `graph`, computed by onnx.reference."""
    proto, params = export_node(node, graph)
    feed = {x: graph.constants[x] for x in node.inputs if x} | params
    return evaluate(proto, str(node), EXPORT_OPSET, feed)


def _info(v: Value) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(v.name, onnx_dtype(v.dtype), list(v.shape))


def export_onnx(graph: Graph) -> onnx.ModelProto:
    """`graph` as an ONNX model that ONNX Runtime and onnx.reference run; names are kept."""
    nodes, initializers = [], []
    for name, array in graph.constants.items():
        if name in graph.outputs:  # an output cannot be an initializer: produce it with a Constant node
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(array)))
        else:
            initializers.append(numpy_helper.from_array(array, name))
    for node in graph.nodes:
        proto, params = export_node(node, graph)
        nodes.append(proto)
        initializers += [numpy_helper.from_array(a, k) for k, a in params.items()]
    inner = [graph.value(x) for n in graph.nodes for x in n.outputs if x not in graph.outputs]
    g = helper.make_graph(nodes, graph.name, [_info(graph.value(x)) for x in graph.inputs],
                          [_info(graph.value(x)) for x in graph.outputs], initializers, value_info=map(_info, inner))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", EXPORT_OPSET)], ir_version=IR_VERSION,
                             producer_name="tensorgen")
