"""Quantized ONNX models in QDQ form (ONNX Runtime's quantize_static, PyTorch's and TensorFlow's exporters)
computed in float.

A QDQ model keeps float ops and marks where values are quantized: a QuantizeLinear (float to 8-bit integers)
whose output only DequantizeLinear nodes read (back to float), and DequantizeLinear nodes on integer weights.
tensorgen has no 8-bit tensors; it computes what the pair means, in float, before import: each QuantizeLinear and
the DequantizeLinear nodes that read it become

    y = (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point') * scale'

(round half to even, as QuantizeLinear; qmin and qmax the integer type's range; a per-axis scale broadcast along
its axis), and a DequantizeLinear of a constant weight folds at import like any constant op. Every value then keeps
the integer grid the quantized model puts it on, so the answer is ONNX Runtime's on the same graph run op by op.
ONNX Runtime's fused integer kernels (QLinearConv, its default on a CPU) requantize in their own arithmetic and
may land one step of the grid away on some elements.

A QuantizeLinear read by anything but DequantizeLinear, or returned, and a DequantizeLinear of a run-time integer
tensor (an 8-bit model input) are left as they are and refused with the op's name in one line; so is blocked
quantization (block_size).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

__all__ = ["INTEGER_RANGES", "has_qdq", "qdq_in_float"]

#: the integers each quantized element type holds
INTEGER_RANGES: dict[int, tuple[int, int]] = {
    TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
    TensorProto.INT16: (-32768, 32767), TensorProto.UINT4: (0, 15), TensorProto.INT4: (-8, 7),
}


def has_qdq(model: onnx.ModelProto) -> bool:
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def qdq_in_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every QuantizeLinear read only by DequantizeLinear nodes, and those nodes, written as
    the float computation they mean (see the module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    returned = {o.name for o in g.output}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in g.node:
        for x in node.input:
            readers.setdefault(x, []).append(node)
    ranks = _ranks(out)
    rewrite = _Rewrite(g, ranks)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # id of a node -> the nodes in its place
    for node in g.node:
        users = readers.get(node.output[0], []) if node.op_type == "QuantizeLinear" else []
        if not users or node.output[0] in returned or any(u.op_type != "DequantizeLinear" for u in users):
            continue
        if any(_attr(n, "block_size", 0) for n in (node, *users)):
            continue
        grid = rewrite.quantize(node)
        if grid is None:
            continue
        replaced[id(node)] = grid
        for user in users:
            replaced[id(user)] = rewrite.dequantize(user, grid[-1].output[0], node.input[0])
    for node in g.node:  # a weight's DequantizeLinear: folded at import (onnx.reference has none before opset 19)
        if node.op_type == "DequantizeLinear" and id(node) not in replaced and not _attr(node, "block_size", 0):
            wide = rewrite.widened(node.input[0], node)
            if wide is not None:
                replaced[id(node)] = [wide[0], *rewrite.dequantize(node, wide[1], node.input[0])]
    nodes = [m for n in g.node for m in replaced.get(id(n), [n])]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(rewrite.constants)
    return out


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every value ONNX shape inference can tell."""
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - an invalid model: the importer says what is wrong with it
        return {}
    g = inferred.graph
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in (*g.input, *g.value_info, *g.output)
             if vi.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in g.initializer})
    for node in g.node:
        for a in node.attribute:
            if node.op_type == "Constant" and a.name == "value":
                ranks[node.output[0]] = len(a.t.dims)
    return ranks


class _Rewrite:
    """Writes the float nodes of one model's QuantizeLinear / DequantizeLinear nodes, with fresh names."""

    def __init__(self, g: onnx.GraphProto, ranks: dict[str, int]):
        self.g, self.ranks = g, ranks
        self.types = {t.name: t.data_type for t in g.initializer}
        self.types.update({vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.value_info)})
        for node in g.node:
            if node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.types[node.output[0]] = value.data_type
        self.constants: list[onnx.TensorProto] = []
        self.sizes = {t.name: int(np.prod(t.dims)) for t in g.initializer}
        self.sizes.update({n.output[0]: int(np.prod(a.t.dims)) for n in g.node if n.op_type == "Constant"
                           for a in n.attribute if a.name == "value"})
        self.taken = {*self.types, *(x for n in g.node for x in (*n.input, *n.output))}

    def fresh(self, name: str) -> str:
        out, k = name, 1
        while out in self.taken:
            out, k = f"{name}_{k}", k + 1
        self.taken.add(out)
        return out

    def constant(self, name: str, array: np.ndarray) -> str:
        name = self.fresh(name)
        self.constants.append(numpy_helper.from_array(array, name))
        self.sizes[name] = array.size
        return name

    def integer_type(self, q: onnx.NodeProto) -> int | None:
        if len(q.input) > 2 and q.input[2]:
            return self.types.get(q.input[2])
        return _attr(q, "output_dtype", 0) or TensorProto.UINT8

    def broadcast(self, node: onnx.NodeProto, x: str, tensor: str, nodes: list[onnx.NodeProto]) -> str | None:
        """`tensor` (a scale or zero point, scalar or per axis) shaped to broadcast against `x` along the node's
        axis; None when `x`'s rank is unknown."""
        if self.sizes.get(tensor) == 1:  # per tensor: broadcasts as it is
            return tensor
        rank = self.ranks.get(x)
        if rank is None:
            return None
        axis = _attr(node, "axis", 1)
        axis = axis + rank if axis < 0 else axis
        shape = self.constant(f"{node.output[0]}_{tensor}_shape", np.array(
            [1] * axis + [-1] + [1] * (rank - axis - 1), np.int64) if rank else np.zeros(0, np.int64))
        out = self.fresh(f"{node.output[0]}_{tensor}_along_axis")
        nodes.append(helper.make_node("Reshape", [tensor, shape], [out], name=out))
        return out

    def scale_and_zero(self, node: onnx.NodeProto, x: str, nodes: list[onnx.NodeProto]) -> tuple[str, str] | None:
        """The node's scale and its zero point as float (0 when absent), each shaped to broadcast against `x`."""
        scale = node.input[1]
        zero = node.input[2] if len(node.input) > 2 and node.input[2] else None
        base = node.output[0]
        float_type = self.types.get(scale, TensorProto.FLOAT)
        if zero is None:
            zero_float = self.constant(f"{base}_zero_point", np.zeros((), helper.tensor_dtype_to_np_dtype(float_type)))
        else:
            zero_float = self.fresh(f"{base}_zero_point_float")
            nodes.append(helper.make_node("Cast", [zero], [zero_float], name=zero_float, to=float_type))
            if zero in self.sizes:
                self.sizes[zero_float] = self.sizes[zero]
        scale = self.broadcast(node, x, scale, nodes)
        zero_float = self.broadcast(node, x, zero_float, nodes)
        return None if scale is None or zero_float is None else (scale, zero_float)

    def quantize(self, q: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        """clip(round(x / scale) + zero point, qmin, qmax): the integers, in float, as `<output>_grid`."""
        kind = self.integer_type(q)
        if kind not in INTEGER_RANGES:
            return None
        nodes: list[onnx.NodeProto] = []
        found = self.scale_and_zero(q, q.input[0], nodes)
        if found is None:
            return None
        scale, zero = found
        base = q.output[0]
        float_type = self.types.get(q.input[1], TensorProto.FLOAT)
        low, high = (self.constant(f"{base}_{end}", np.array(v, helper.tensor_dtype_to_np_dtype(float_type)))
                     for end, v in zip(("qmin", "qmax"), INTEGER_RANGES[kind]))
        steps: Sequence[tuple[str, list[str]]] = (
            ("Div", [q.input[0], scale]), ("Round", []), ("Add", [zero]), ("Clip", [low, high]))
        last = None
        for op, rest in steps:
            out = self.fresh(f"{base}_{op.lower()}" if op != "Clip" else f"{base}_grid")
            nodes.append(helper.make_node(op, ([last] if last else []) + rest, [out], name=out))
            last = out
        return nodes

    def widened(self, x: str, dq: onnx.NodeProto) -> tuple[onnx.NodeProto, str] | None:
        """A Cast of the integers `x` to the float type of `dq`'s scale, and its output; None for a type that is not
        one of INTEGER_RANGES or int32 (a bias), or a rank that is unknown."""
        if self.types.get(x) not in {*INTEGER_RANGES, TensorProto.INT32} or x not in self.ranks:
            return None
        out = self.fresh(f"{x}_float")
        return helper.make_node("Cast", [x], [out], name=out, to=self.types.get(dq.input[1], TensorProto.FLOAT)), out

    def dequantize(self, dq: onnx.NodeProto, grid: str, x: str) -> list[onnx.NodeProto]:
        """(grid - zero point) * scale, written to the DequantizeLinear's own output (`x`: the float value the
        grid was quantized from, of the same shape)."""
        nodes: list[onnx.NodeProto] = []
        found = self.scale_and_zero(dq, x, nodes)
        assert found is not None  # `x` has a known rank: quantize() found it
        scale, zero = found
        shifted = self.fresh(f"{dq.output[0]}_shifted")
        nodes.append(helper.make_node("Sub", [grid, zero], [shifted], name=shifted))
        nodes.append(helper.make_node("Mul", [shifted, scale], [dq.output[0]], name=dq.output[0]))
        return nodes
