"""Run ONNX's own machinery on one node: shape inference for its outputs, evaluation for folding.

Both the importer (on raw ONNX nodes) and the graph passes (on exported tensorgen nodes) fold and
infer through these two functions, so a node means the same thing to both. Each wraps the node in a
one-node model: cheap (~10 µs to infer, a few ms to evaluate) and exactly ONNX's semantics.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from tensorgen.graph.ir import GraphError, Value

# constants up to this many elements are handed to shape inference by value (a Reshape's shape, a
# Slice's starts...); bigger ones (weights) only by type, since their values never decide a shape
_INFER_BY_VALUE = 4096
# ops whose output is their first input's type and shape, where ONNX's inference gives nothing (GroupNormalization,
# a function without an inference function) or fails inside the function body (MeanVarianceNormalization)
_SHAPE_OF_INPUT = frozenset({"GroupNormalization", "MeanVarianceNormalization"})


def np_dtype(elem_type: int) -> str:
    """The numpy dtype name of an ONNX tensor element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


def onnx_dtype(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _model(node: onnx.NodeProto, opset: int, inputs: list[onnx.ValueInfoProto],
           initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    outputs = [helper.make_empty_tensor_value_info(name) for name in node.output if name]
    graph = helper.make_graph([node], "one_node", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def infer_outputs(node: onnx.NodeProto, label: str, opset: int, values: Mapping[str, Value],
                  constants: Mapping[str, np.ndarray]) -> dict[str, Value]:
    """Static output Values of `node` by ONNX shape inference; GraphError unless all are fully known."""
    if node.op_type in _SHAPE_OF_INPUT:
        x = values[node.input[0]]
        return {node.output[0]: Value(node.output[0], x.shape, x.dtype)}
    inputs, initializers = [], []
    for name in dict.fromkeys(i for i in node.input if i):
        array = constants.get(name)
        if array is not None and array.size <= _INFER_BY_VALUE:
            initializers.append(numpy_helper.from_array(array, name))
        else:
            v = values[name]
            inputs.append(helper.make_tensor_value_info(name, onnx_dtype(v.dtype), list(v.shape)))
    model = _model(node, opset, inputs, initializers)
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=True)
    except (shape_inference.InferenceError, onnx.checker.ValidationError) as e:
        raise GraphError(f"{label}: shape inference failed: {str(e).strip()}") from None
    found = {vi.name: vi.type.tensor_type for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    result = {}
    for name in node.output:
        if not name:
            continue
        t = found.get(name)
        if t is None or not t.elem_type or not t.HasField("shape"):
            raise GraphError(f"{label}: cannot infer the type and shape of output {name!r}")
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
        if not all(isinstance(d, int) for d in dims):
            raise GraphError(f"{label}: output {name!r} has no static shape (inferred {dims}); "
                             "its shape depends on data only known at run time")
        result[name] = Value(name, dims, np_dtype(t.elem_type))
    return result


class GatherElements(OpRun):
    """onnx.reference's own goes through np.choose, which takes at most 64 choices: an axis of 64 or more failed
    (BERT's token type ids, exported as a 64-position buffer gathered along its positions)."""

    def _run(self, data, indices, axis=None):
        axis = (axis or 0) % data.ndim
        return (np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis], indices), axis=axis),)


_FIXED_OPS = [GatherElements]  # replace onnx.reference's implementations (the class name is the op type)


def evaluate(node: onnx.NodeProto, label: str, opset: int, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate `node` on constant inputs with onnx.reference; outputs by name (omitted ones skipped)."""
    used = [i for i in dict.fromkeys(node.input) if i]
    model = _model(node, opset, [], [numpy_helper.from_array(np.asarray(inputs[i]), i) for i in used])
    names = [o for o in node.output if o]
    try:
        results = ReferenceEvaluator(model, new_ops=_FIXED_OPS).run(names, {})
    except Exception as e:  # the reference runtime raises whatever numpy raises
        raise GraphError(f"{label}: constant folding failed: {type(e).__name__}: {e}") from None
    return {name: np.asarray(r) for name, r in zip(names, results)}
