"""Quantized ONNX models computed in float, on the integer grid they mean.

Two forms are common. QDQ (ONNX Runtime's quantize_static, PyTorch's and TensorFlow's exporters) keeps float ops and
marks where values are quantized: a QuantizeLinear (float to 8-bit integers) that only DequantizeLinear nodes read,
and DequantizeLinear nodes on integer weights. Integer ops (ONNX Runtime's quantize_dynamic, the usual way to
quantize a transformer for a CPU) quantize activations at run time with DynamicQuantizeLinear and multiply them by
integer weights in MatMulInteger or ConvInteger, whose int32 results a Cast takes back to float.

tensorgen has no 8-bit tensors. Before import, every integer value these ops pass to each other becomes a float
tensor holding the same integers (a *grid* value), and each op the float computation it means:

    QuantizeLinear          clip(round(x / scale) + zero_point, qmin, qmax)       round half to even; per axis too
    DynamicQuantizeLinear   scale = (max(x, 0) - min(x, 0)) / 255, zero_point = clip(round(-min(x, 0) / scale)),
                            then QuantizeLinear's formula onto 0..255
    DequantizeLinear        (q - zero_point) * scale                              a weight's folds at import
    MatMulInteger           (a - a_zero_point) @ (b - b_zero_point)              exact up to 2**24 per sum
    ConvInteger             conv(x - x_zero_point, w - w_zero_point)              padding reads the zero point
    Cast of a grid value    a Cast of the float grid

A value keeps its grid through every op, so the answer is ONNX Runtime's on the same graph run op by op (a grid
value at a step's edge may round the other way where two engines sum in different orders; the steps after it carry
that on). An integer value anything else reads (a MaxPool of int8 data, a model output, an 8-bit model input) is
left as it is and the model refused with the op's name in one line, as is blocked quantization (block_size).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper, shape_inference

from tensorgen.graph.frontend.normalize import unique_name

__all__ = ["INTEGER_RANGES", "QUANTIZED_OPS", "is_quantized", "quantized_in_float"]

#: the integers each quantized element type holds
INTEGER_RANGES: dict[int, tuple[int, int]] = {
    TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127), TensorProto.UINT16: (0, 65535),
    TensorProto.INT16: (-32768, 32767), TensorProto.UINT4: (0, 15), TensorProto.INT4: (-8, 7),
}
_INTEGER_TYPES = frozenset({*INTEGER_RANGES, TensorProto.INT32})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
# the ops rewritten, and which of their inputs hold integers (a grid value or an integer constant)
_INTEGER_INPUTS: dict[str, tuple[int, ...]] = {
    "QuantizeLinear": (2,), "DynamicQuantizeLinear": (), "DequantizeLinear": (0, 2),
    "MatMulInteger": (0, 1, 2, 3), "ConvInteger": (0, 1, 2, 3), "Cast": (0,),
}
# ...and which of their outputs are integers (grid values)
_INTEGER_OUTPUTS: dict[str, tuple[int, ...]] = {
    "QuantizeLinear": (0,), "DynamicQuantizeLinear": (0, 2), "MatMulInteger": (0,), "ConvInteger": (0,),
}
#: the quantized ops rewritten (those left after the rewrite could not be: see rewritable)
QUANTIZED_OPS = frozenset({"QuantizeLinear", "DynamicQuantizeLinear", "DequantizeLinear", "MatMulInteger",
                           "ConvInteger"})
# ops that move integers without changing them: on a grid value they give a grid value (an int8 embedding table's
# Gather, the Reshape / Transpose / MaxPool between a QuantizeLinear and its DequantizeLinear), all outputs integers;
# None: every input (Concat)
_MOVES: dict[str, tuple[int, ...] | None] = {
    "Gather": (0,), "Reshape": (0,), "Transpose": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,),
    "Slice": (0,), "Identity": (0,), "Expand": (0,), "Tile": (0,), "MaxPool": (0,), "Pad": (0, 2), "Split": (0,),
    "DepthToSpace": (0,), "SpaceToDepth": (0,), "Concat": None,
}


def _integer_slots(node: onnx.NodeProto) -> Sequence[int]:
    """Which inputs of `node` (one of _INTEGER_INPUTS or _MOVES) hold integers."""
    slots = _INTEGER_INPUTS.get(node.op_type, _MOVES.get(node.op_type, ()))
    return range(len(node.input)) if slots is None else slots


def is_quantized(model: onnx.ModelProto) -> bool:
    return any(n.op_type in QUANTIZED_OPS for n in model.graph.node)


def quantized_in_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose quantizing, dequantizing and integer ops compute in float on their integer grids
    (see the module docstring)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    rewrite = _Rewrite(g, _inferred(out))
    chosen = rewrite.rewritable()
    nodes = []
    for i, node in enumerate(rewrite.nodes):
        nodes.extend(rewrite.emit(node) if i in chosen else [node])
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(rewrite.constants)
    return out


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == name), default)


def _inferred(model: onnx.ModelProto) -> onnx.GraphProto:
    """`model`'s graph with the value types and shapes ONNX shape inference can tell."""
    try:
        return shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - an invalid model: the importer says what is wrong with it
        return model.graph


class _Rewrite:
    """Decides which nodes of one graph to rewrite and writes their float nodes, with fresh names."""

    def __init__(self, g: onnx.GraphProto, inferred: onnx.GraphProto):
        self.g = g
        self.nodes = list(g.node)
        declared = [vi for vi in (*inferred.input, *inferred.value_info, *inferred.output)
                    if vi.type.HasField("tensor_type")]
        self.types = {vi.name: vi.type.tensor_type.elem_type for vi in declared}
        self.ranks = {vi.name: len(vi.type.tensor_type.shape.dim) for vi in declared
                      if vi.type.tensor_type.HasField("shape")}
        self.types.update({t.name: t.data_type for t in g.initializer})
        self.ranks.update({t.name: len(t.dims) for t in g.initializer})
        self.sizes = {t.name: int(np.prod(t.dims)) for t in g.initializer}
        for node in g.node:
            for a in node.attribute:
                if node.op_type == "Constant" and a.name == "value":
                    self.types[node.output[0]] = a.t.data_type
                    self.ranks[node.output[0]] = len(a.t.dims)
                    self.sizes[node.output[0]] = int(np.prod(a.t.dims))
        for node in g.node:  # DynamicQuantizeLinear's scale and zero point are scalars
            if node.op_type == "DynamicQuantizeLinear":
                self.sizes.update(dict.fromkeys(node.output[1:], 1))
        self.const = {t.name for t in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
        self.taken = {*self.types, *(x for n in g.node for x in (*n.input, *n.output))}
        self.grid: dict[str, str] = {}  # an integer value -> the float value holding its integers
        self.constants: list[onnx.TensorProto] = []
        self.writers = {"QuantizeLinear": self.quantize_linear, "DynamicQuantizeLinear": self.dynamic_quantize_linear,
                        "DequantizeLinear": self.dequantize_linear, "MatMulInteger": self.mat_mul_integer,
                        "ConvInteger": self.conv_integer, "Cast": self.cast, **dict.fromkeys(_MOVES, self.move)}

    # ---- which nodes ------------------------------------------------------------------------------------

    def candidate(self, node: onnx.NodeProto) -> bool:
        if (node.op_type not in _INTEGER_INPUTS and node.op_type not in _MOVES) or _attr(node, "block_size", 0):
            return False
        if node.op_type == "Cast":  # only a Cast of a grid value to a float type is the grid's
            return _attr(node, "to", 0) in _FLOAT_TYPES
        if node.op_type == "QuantizeLinear":
            return self.integer_type(node) in INTEGER_RANGES
        if node.op_type in _MOVES:
            return self.types.get(node.input[0]) in _INTEGER_TYPES
        return True

    @staticmethod
    def integer_outputs(node: onnx.NodeProto) -> list[str]:
        if node.op_type in _MOVES:
            return [o for o in node.output if o]
        return [node.output[k] for k in _INTEGER_OUTPUTS.get(node.op_type, ()) if k < len(node.output)]

    def rewritable(self) -> set[int]:
        """The indices (in self.nodes) of the nodes to rewrite: candidates whose integer inputs are constants or
        outputs of chosen nodes, and whose integer outputs only chosen nodes read (none is a graph output)."""
        producer = {o: i for i, n in enumerate(self.nodes) for o in n.output}
        readers: dict[str, list[tuple[int, int]]] = {}  # value -> (node index, input slot) of each read
        for i, node in enumerate(self.nodes):
            for k, x in enumerate(node.input):
                readers.setdefault(x, []).append((i, k))
        returned = {o.name for o in self.g.output}
        chosen = {i for i, n in enumerate(self.nodes) if self.candidate(n)}
        changed = True
        while changed:
            changed = False
            for i in sorted(chosen):
                node = self.nodes[i]
                ins = [node.input[k] for k in _integer_slots(node) if k < len(node.input) and node.input[k]]
                fed = all(self.integer_constant(x) or producer.get(x) in chosen for x in ins)
                if node.op_type == "Cast":  # of a constant it folds as it is
                    fed = fed and producer.get(ins[0]) in chosen
                read = all(o not in returned and all(r in chosen and k in _integer_slots(self.nodes[r])
                                                     for r, k in readers.get(o, []))
                           for o in self.integer_outputs(node))
                if not (fed and read and self.shapes_known(node)):
                    chosen.discard(i)
                    changed = True
        return chosen

    def integer_constant(self, name: str) -> bool:
        return name in self.const and self.types.get(name) in _INTEGER_TYPES and name in self.ranks

    def shapes_known(self, node: onnx.NodeProto) -> bool:
        """Whether a scale or zero point with more than one element can be broadcast along the node's axis."""
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            return all(self.sizes.get(x) == 1 or node.input[0] in self.ranks for x in node.input[1:] if x)
        if node.op_type == "MatMulInteger":  # a zero point per row of a is not written out
            return len(node.input) < 3 or not node.input[2] or self.sizes.get(node.input[2]) == 1
        return True

    # ---- names, constants, integers ----------------------------------------------------------------------

    def fresh(self, name: str) -> str:
        return unique_name(name, self.taken)

    def constant(self, name: str, array: np.ndarray) -> str:
        name = self.fresh(name)
        self.constants.append(numpy_helper.from_array(array, name))
        self.sizes[name] = array.size
        return name

    def node(self, out: list[onnx.NodeProto], op: str, inputs: Iterable[str], name: str, **attrs) -> str:
        result = self.fresh(name)
        out.append(helper.make_node(op, list(inputs), [result], name=result, **attrs))
        return result

    def integer_type(self, q: onnx.NodeProto) -> int | None:
        if len(q.input) > 2 and q.input[2]:
            return self.types.get(q.input[2])
        return _attr(q, "output_dtype", 0) or TensorProto.UINT8

    def floats(self, name: str | None, like: str, out: list[onnx.NodeProto], float_type: int) -> str:
        """The integers of `name` (a grid value or an integer constant; None: a zero point left out) as a float
        tensor of `float_type` (a grid value as it is)."""
        if not name:
            return self.constant(f"{like}_zero", np.zeros((), helper.tensor_dtype_to_np_dtype(float_type)))
        if name in self.grid:
            return self.grid[name]
        wide = self.node(out, "Cast", [name], f"{name}_float", to=float_type)
        self.sizes[wide] = self.sizes.get(name, 0)
        return wide

    def along(self, node: onnx.NodeProto, x: str, tensor: str, out: list[onnx.NodeProto], axis: int) -> str:
        """`tensor` (per tensor, or one value per index of `axis` of `x`) shaped to broadcast against `x`."""
        if self.sizes.get(tensor) == 1:
            return tensor
        rank = self.ranks[x]
        axis = axis + rank if axis < 0 else axis
        shape = self.constant(f"{tensor}_shape", np.array([1] * axis + [-1] + [1] * (rank - axis - 1), np.int64))
        return self.node(out, "Reshape", [tensor, shape], f"{tensor}_along_axis")

    @staticmethod
    def _input(node: onnx.NodeProto, i: int) -> str | None:
        return node.input[i] if i < len(node.input) and node.input[i] else None

    # ---- the float computations --------------------------------------------------------------------------

    def emit(self, node: onnx.NodeProto) -> list[onnx.NodeProto]:
        """The float nodes in the place of `node` (one of the rewritable set)."""
        out: list[onnx.NodeProto] = []
        self.writers[node.op_type](node, out)
        return out

    def move(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        """The same op on the float grids of its integer inputs, its outputs grid values."""
        slots = _integer_slots(node)
        inputs = [self.floats(x, x, out, TensorProto.FLOAT) if k in slots and x else x
                  for k, x in enumerate(node.input)]
        outputs = []
        for o in node.output:
            self.grid[o] = self.fresh(f"{o}_grid") if o else ""
            outputs.append(self.grid[o])
        moved = helper.make_node(node.op_type, inputs, outputs, name=self.fresh(f"{node.name or node.op_type}_grid"))
        moved.attribute.extend(node.attribute)
        out.append(moved)

    def _quantize(self, x: str, scale: str, zero: str, bounds: tuple[int, int], float_type: int, base: str,
                  out: list[onnx.NodeProto]) -> str:
        np_type = helper.tensor_dtype_to_np_dtype(float_type)
        low, high = (self.constant(f"{base}_{end}", np.array(v, np_type)) for end, v in zip(("qmin", "qmax"), bounds))
        v = self.node(out, "Div", [x, scale], f"{base}_div")
        v = self.node(out, "Round", [v], f"{base}_round")
        v = self.node(out, "Add", [v, zero], f"{base}_add")
        return self.node(out, "Clip", [v, low, high], f"{base}_grid")

    def quantize_linear(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        x, scale = node.input[0], node.input[1]
        float_type = self.types.get(scale, TensorProto.FLOAT)
        axis = _attr(node, "axis", 1)
        zero = self.along(node, x, self.floats(self._input(node, 2), node.output[0], out, float_type), out, axis)
        scale = self.along(node, x, scale, out, axis)
        bounds = INTEGER_RANGES[self.integer_type(node)]  # type: ignore[index]
        self.grid[node.output[0]] = self._quantize(x, scale, zero, bounds, float_type, node.output[0], out)

    def dynamic_quantize_linear(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        x = node.input[0]
        y, scale_out, zero_out = node.output[0], node.output[1], node.output[2]
        nothing = self.constant(f"{y}_zero", np.zeros((), np.float32))
        low = self.node(out, "Min", [self.node(out, "ReduceMin", [x], f"{y}_min", keepdims=0), nothing], f"{y}_low")
        high = self.node(out, "Max", [self.node(out, "ReduceMax", [x], f"{y}_max", keepdims=0), nothing],
                         f"{y}_high")
        span = self.node(out, "Sub", [high, low], f"{y}_span")
        out.append(helper.make_node("Div", [span, self.constant(f"{y}_levels", np.array(255, np.float32))],
                                    [scale_out], name=scale_out))
        zero = self.node(out, "Neg", [self.node(out, "Div", [low, scale_out], f"{y}_low_steps")], f"{y}_shift")
        limits = [self.constant(f"{y}_{end}", np.array(v, np.float32)) for end, v in (("qmin", 0), ("qmax", 255))]
        zero = self.node(out, "Clip", [self.node(out, "Round", [zero], f"{y}_shift_round"), *limits], f"{y}_zero_grid")
        self.grid[zero_out] = zero
        self.grid[y] = self._quantize(x, scale_out, zero, (0, 255), TensorProto.FLOAT, y, out)

    def dequantize_linear(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        q, scale = node.input[0], node.input[1]
        float_type = self.types.get(scale, TensorProto.FLOAT)
        axis = _attr(node, "axis", 1)
        zero = self.along(node, q, self.floats(self._input(node, 2), node.output[0], out, float_type), out, axis)
        shifted = self.node(out, "Sub", [self.floats(q, q, out, float_type), zero], f"{node.output[0]}_shifted")
        out.append(helper.make_node("Mul", [shifted, self.along(node, q, scale, out, axis)], [node.output[0]],
                                    name=node.output[0]))

    def _integer_operands(self, node: onnx.NodeProto, out: list[onnx.NodeProto], weight_axis: int) -> list[str]:
        """(a - a_zero_point, b - b_zero_point) in float32, b's zero point along `weight_axis` of b."""
        a, b = node.input[0], node.input[1]
        a_zero = self.floats(self._input(node, 2), f"{node.output[0]}_a", out, TensorProto.FLOAT)
        b_zero = self.floats(self._input(node, 3), f"{node.output[0]}_b", out, TensorProto.FLOAT)
        b_zero = self.along(node, b, b_zero, out, weight_axis)
        return [self.node(out, "Sub", [self.floats(a, a, out, TensorProto.FLOAT), a_zero], f"{a}_shifted"),
                self.node(out, "Sub", [self.floats(b, b, out, TensorProto.FLOAT), b_zero], f"{b}_shifted")]

    def mat_mul_integer(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        operands = self._integer_operands(node, out, -1)  # b's zero point: one per column
        self.grid[node.output[0]] = self.node(out, "MatMul", operands, f"{node.output[0]}_float")

    def conv_integer(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        operands = self._integer_operands(node, out, 0)  # w's zero point: one per output channel
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self.grid[node.output[0]] = self.node(out, "Conv", operands, f"{node.output[0]}_float", **attrs)

    def cast(self, node: onnx.NodeProto, out: list[onnx.NodeProto]) -> None:
        out.append(helper.make_node("Cast", [self.grid[node.input[0]]], [node.output[0]], name=node.output[0],
                                    to=_attr(node, "to", 0)))
