"""Per-op normalization of imported ONNX nodes into the contract of tensorgen.graph.ir.

Every op the importer keeps has a registered normalizer `(OnnxNode) -> Node`. Attributes arrive
with the ONNX schema's defaults already filled in; a normalizer makes the rest explicit (kernel
shapes, strides, pads with auto_pad resolved, non-negative axes), and turns the compile-time inputs
listed in CONST_INPUTS into attributes. Output Values (static shapes) are known before it runs.
Conv, pooling and Resize live in onnx_normalize_nn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorgen.graph.frontend.onnx_eval import np_dtype
from tensorgen.graph.ir import GraphError, Node, Value

# inputs that must be constants at import time, by op: index -> role. The normalizer turns them
# into attributes and the normalized node no longer reads them.
CONST_INPUTS: dict[str, dict[int, str]] = {
    "Reshape": {1: "shape"},
    "Expand": {1: "shape"},
    "Tile": {1: "repeats"},
    "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"},
    "Split": {1: "split"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Clip": {1: "min", 2: "max"},
    "ReduceMean": {1: "axes"},
    "ReduceSum": {1: "axes"},
    "ReduceMax": {1: "axes"},
    "ReduceMin": {1: "axes"},
    "ReduceProd": {1: "axes"},
    "ReduceSumSquare": {1: "axes"},
    "ReduceL1": {1: "axes"},
    "ReduceL2": {1: "axes"},
    "ReduceLogSumExp": {1: "axes"},
    "Resize": {1: "roi", 2: "scales", 3: "sizes"},
    "Dropout": {1: "ratio", 2: "training_mode"},
    "CumSum": {1: "axis"},
    **dict.fromkeys(("RNN", "GRU", "LSTM"), {1: "W", 2: "R", 3: "B", 4: "sequence_lens", 7: "P"}),
    "TopK": {1: "k"},
}


@dataclass
class ImportState:
    """What the importer knows so far: every value's Value, and the data of the constant ones."""

    values: dict[str, Value]
    constants: dict[str, np.ndarray]
    used: set[str] = field(default_factory=set)  # values some node reads, plus the graph outputs


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or the first of `base_1`, `base_2`, ... not in `taken`; claimed in `taken`."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def add_value(values: dict[str, Value], base: str, shape: tuple[int, ...], dtype: str) -> str:
    """Register a new value named after `base`, unique among `values`; returns its name."""
    name, k = base, 0
    while name in values:
        k += 1
        name = f"{base}_{k}"
    values[name] = Value(name, tuple(shape), dtype)
    return name


def add_constant(values: dict[str, Value], constants: dict[str, np.ndarray], base: str, array: np.ndarray) -> str:
    """Register a new constant named after `base`, unique among `values`; returns its name."""
    name = add_value(values, base, tuple(array.shape), array.dtype.name)
    constants[name] = array
    return name


@dataclass
class OnnxNode:
    """One ONNX node during import: parsed attributes (schema defaults filled) and typed inputs."""

    name: str  # the tensorgen node name (unique, C-identifier friendly)
    label: str  # how errors name it: "node '<onnx name>' (<op>)"
    op: str
    inputs: list[str]  # "" for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]
    state: ImportState

    def error(self, message: str) -> GraphError:
        return GraphError(f"{self.label}: {message}")

    def input(self, i: int) -> str:
        return self.inputs[i] if i < len(self.inputs) else ""

    def shape(self, i: int = 0) -> tuple[int, ...]:
        return self.state.values[self.inputs[i]].shape

    def out(self, i: int = 0) -> Value:
        return self.state.values[self.outputs[i]]

    def const(self, i: int) -> np.ndarray | None:
        """The data of input `i`; None when it is omitted or computed at run time (the importer has
        already rejected run-time values for the inputs in CONST_INPUTS)."""
        return self.state.constants.get(self.input(i))

    def scalar(self, i: int, default: float) -> float:
        """Constant scalar input `i` as a float (a Clip bound, a Pad value); `default` when omitted."""
        array = self.const(i)
        if array is None:
            return default
        if array.size != 1:
            raise self.error(f"input {self.inputs[i]!r} must be a scalar, not of shape {array.shape}")
        return float(array.reshape(-1)[0])

    def ints(self, attr: str, fill: int, count: int) -> tuple[int, ...]:
        """An int-list attribute of `count` entries, `fill` in each when absent."""
        values = self.attrs.get(attr)
        if values is None:
            return (fill,) * count
        if len(values) != count:
            raise self.error(f"attribute {attr}={list(values)} must have {count} entries")
        return tuple(int(v) for v in values)

    def axis(self, axis: int, rank: int, *, allow_end: bool = False) -> int:
        """`axis` made non-negative for a tensor of `rank` (rank itself allowed with allow_end, as in Flatten)."""
        if not -rank <= axis < (rank + 1 if allow_end else rank):
            raise self.error(f"axis {axis} is out of range for rank {rank}")
        return axis + rank if axis < 0 else axis

    def axis_list(self, axes: Sequence[int], rank: int) -> list[int]:
        """Non-negative axes in the given order; a repeated axis is an error."""
        result = [self.axis(int(a), rank) for a in axes]
        if len(set(result)) != len(result):
            raise self.error(f"axes {list(axes)} repeat an axis")
        return result

    def axes(self, axes: Sequence[int], rank: int) -> tuple[int, ...]:
        """Sorted non-negative axes."""
        return tuple(sorted(self.axis_list(axes, rank)))

    def make(self, op: str | None = None, attrs: dict[str, Any] | None = None,
             inputs: list[str] | None = None) -> Node:
        """The normalized node; by default the inputs that are not compile-time parameters."""
        if inputs is None:
            params = CONST_INPUTS.get(self.op, {})
            inputs = [name for i, name in enumerate(self.inputs) if i not in params]
        while inputs and not inputs[-1]:
            inputs = inputs[:-1]
        return Node(op or self.op, self.name, inputs, list(self.outputs), attrs or {})


    def temp(self, suffix: str, shape: Sequence[int], dtype: str | None = None) -> str:
        """A new intermediate value for a normalizer that writes several nodes (dtype: the first output's)."""
        return add_value(self.state.values, f"{self.outputs[0]}_{suffix}", tuple(shape), dtype or self.out().dtype)

    def constant(self, suffix: str, array: np.ndarray) -> str:
        return add_constant(self.state.values, self.state.constants, f"{self.name}_{suffix}", array)


class Steps:
    """The nodes a normalizer writes for one ONNX node, each named after it and a suffix; `last` adds the node that
    writes the ONNX node's outputs."""

    def __init__(self, n: OnnxNode) -> None:
        self.n, self.nodes = n, []

    def __call__(self, suffix: str, op: str, inputs: list[str], out_shape: Sequence[int], dtype: str | None = None,
                 **attrs: Any) -> str:
        out = self.n.temp(suffix, out_shape, dtype)
        self.nodes.append(Node(op, f"{self.n.name}_{suffix}", inputs, [out], dict(attrs)))
        return out

    def last(self, op: str, inputs: list[str], **attrs: Any) -> list[Node]:
        return [*self.nodes, self.n.make(op, dict(attrs), inputs)]


#: a normalizer returns the node, or several whose last writes the outputs (the importer makes their names unique)
Normalizer = Callable[[OnnxNode], Node | list[Node]]
NORMALIZERS: dict[str, Normalizer] = {}


def normalizer(*ops: str) -> Callable[[Normalizer], Normalizer]:
    def register(fn: Normalizer) -> Normalizer:
        for op in ops:
            NORMALIZERS[op] = fn
        return fn

    return register


def _keep(*attrs: str) -> Normalizer:
    return lambda n: n.make(attrs={a: n.attrs[a] for a in attrs})


# ops whose normalization is only keeping some schema-defaulted attributes
_PLAIN: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(["Relu", "Sigmoid", "Tanh", "Erf", "HardSwish", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt",
                     "Reciprocal", "Exp", "GlobalAveragePool", "MatMul", "Where", "Identity", "Neg", "Abs",
                     "Max", "Min", "Log", "Softplus", "Softsign", "Mish", "PRelu", "Sum", "Mean",
                     "GlobalMaxPool", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And",
                     "Or", "Xor", "Floor", "Ceil", "Round", "Sign", "IsNaN", "Sin", "Cos", "Tan", "Asin", "Acos",
                     "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh"], ()),
    "IsInf": ("detect_negative", "detect_positive"),
    "Mod": ("fmod",),
    "LeakyRelu": ("alpha",),
    "Elu": ("alpha",),
    "Celu": ("alpha",),
    "ThresholdedRelu": ("alpha",),
    "Selu": ("alpha", "gamma"),
    "Shrink": ("lambd", "bias"),
    "HardSigmoid": ("alpha", "beta"),
    "Gelu": ("approximate",),
    "Gemm": ("alpha", "beta", "transA", "transB"),
    "InstanceNormalization": ("epsilon",),
    "BatchNormalization": ("epsilon",),  # training_mode=1 fails shape inference with the one output kept
}
for _op, _attrs in _PLAIN.items():
    normalizer(_op)(_keep(*_attrs))


@normalizer("Softmax", "LogSoftmax", "Concat")
def _axis_op(n: OnnxNode) -> Node:
    return n.make(attrs={"axis": n.axis(n.attrs["axis"], len(n.out().shape))})


@normalizer("ArgMax", "ArgMin")
def _arg_extreme(n: OnnxNode) -> Node:
    return n.make(attrs={"axis": n.axis(n.attrs["axis"], len(n.shape())), "keepdims": int(n.attrs["keepdims"]),
                         "select_last_index": int(n.attrs["select_last_index"])})


@normalizer("CumSum")
def _cumsum(n: OnnxNode) -> Node:
    return n.make(attrs={"axis": n.axis(int(_one(n, 1)), len(n.shape())), "exclusive": int(n.attrs["exclusive"]),
                         "reverse": int(n.attrs["reverse"])})


@normalizer("TopK")
def _top_k(n: OnnxNode) -> Node:
    """K becomes an attribute (1..the axis' size: te has no empty tensors). sorted=0 leaves the order to the
    implementation, so the sorted order is a valid answer for it too."""
    axis = n.axis(n.attrs["axis"], len(n.shape()))
    k, size = int(_one(n, 1)), n.shape()[axis]
    if not 1 <= k <= size:
        raise n.error(f"K={k} is out of range for axis {axis} of size {size} (1..{size} supported)")
    return n.make(attrs={"axis": axis, "k": k, "largest": int(n.attrs["largest"])})


def _one(n: OnnxNode, i: int) -> int | float:
    """Constant input `i`, which must hold one number (a 0-d or 1-element tensor)."""
    array = n.const(i)
    if array is None or array.size != 1:
        raise n.error(f"input {n.input(i)!r} must hold one number, not {None if array is None else list(array.shape)}")
    return array.reshape(-1)[0].item()


@normalizer("Flatten")
def _flatten(n: OnnxNode) -> Node:
    return n.make(attrs={"axis": n.axis(n.attrs["axis"], len(n.shape()), allow_end=True)})


@normalizer("LayerNormalization")
def _layer_norm(n: OnnxNode) -> Node:
    return n.make(attrs={"axis": n.axis(n.attrs["axis"], len(n.shape())), "epsilon": n.attrs["epsilon"]})


@normalizer("Transpose")
def _transpose(n: OnnxNode) -> Node:
    rank = len(n.shape())
    perm = tuple(int(p) for p in n.attrs.get("perm", range(rank - 1, -1, -1)))
    if sorted(perm) != list(range(rank)):
        raise n.error(f"perm {list(perm)} is not a permutation of the {rank} axes")
    return n.make(attrs={"perm": perm})


def gather_inputs(n: OnnxNode, axis: int) -> list[str]:
    """The inputs of a Gather or GatherElements along `axis`: constant indices (input 1) are checked and made
    non-negative, so the lowering never wraps them."""
    inputs = list(n.inputs)
    indices, dim = n.const(1), n.shape()[axis]
    if indices is not None:
        if indices.size and (indices.min() < -dim or indices.max() >= dim):
            raise n.error(f"indices {indices.min()}..{indices.max()} out of range for axis {axis} of size {dim}")
        if indices.size and indices.min() < 0:
            inputs[1] = add_constant(n.state.values, n.state.constants, f"{n.name}_indices",
                                     np.where(indices < 0, indices + dim, indices))
    return inputs


@normalizer("Gather")
def _gather(n: OnnxNode) -> Node:
    axis = n.axis(n.attrs["axis"], len(n.shape()))
    return n.make(attrs={"axis": axis}, inputs=gather_inputs(n, axis))


@normalizer("Cast")
def _cast(n: OnnxNode) -> Node:
    return n.make(attrs={"to": np_dtype(n.attrs["to"])})


@normalizer("Dropout")
def _dropout(n: OnnxNode) -> Node:
    training = n.const(2)
    if training is not None and bool(training):
        raise n.error("training_mode=True is not supported (inference only)")
    return n.make("Identity")


@normalizer("Reshape")
def _reshape(n: OnnxNode) -> Node:
    return n.make(attrs={"shape": n.out().shape})


@normalizer("Expand")
def _expand(n: OnnxNode) -> Node:
    return n.make(attrs={"shape": n.out().shape})


@normalizer("Tile")
def _tile(n: OnnxNode) -> Node:
    """The repeats from the shapes (an output axis reads the input's at its index modulo the input's size)."""
    return n.make(attrs={"repeats": [o // i for o, i in zip(n.out().shape, n.shape())]})


@normalizer("Squeeze")
def _squeeze(n: OnnxNode) -> Node:
    shape, axes = n.shape(), n.const(1)
    axes = axes.tolist() if axes is not None else [i for i, d in enumerate(shape) if d == 1]
    return n.make(attrs={"axes": n.axes(axes, len(shape))})


@normalizer("Unsqueeze")
def _unsqueeze(n: OnnxNode) -> Node:
    return n.make(attrs={"axes": n.axes(n.const(1).tolist(), len(n.out().shape))})


@normalizer("Split")
def _split(n: OnnxNode) -> Node:
    """Sizes are read off the inferred outputs, which covers the split input, num_outputs and equal splits."""
    axis = n.axis(n.attrs["axis"], len(n.shape()))
    return n.make(attrs={"axis": axis, "split": tuple(n.out(i).shape[axis] for i in range(len(n.outputs)))})


def clamp_slice(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX Slice bounds for one axis: negatives wrap once, then clamp to [0, dim] (step > 0) or
    [0, dim-1] / [-1, dim-1] (step < 0, where end -1 means 'through index 0')."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    return min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)


@normalizer("Slice")
def _slice(n: OnnxNode) -> Node:
    shape = n.shape()
    starts, ends = n.const(1).tolist(), n.const(2).tolist()
    axes = n.const(3).tolist() if n.input(3) else list(range(len(starts)))
    steps = n.const(4).tolist() if n.input(4) else [1] * len(starts)
    axes = n.axis_list(axes, len(shape))
    bounds = [clamp_slice(int(s), int(e), int(t), shape[a]) for s, e, t, a in zip(starts, ends, steps, axes)]
    return n.make(attrs={"starts": tuple(b[0] for b in bounds), "ends": tuple(b[1] for b in bounds),
                         "axes": tuple(axes), "steps": tuple(int(t) for t in steps)})


@normalizer("Pad")
def _pad(n: OnnxNode) -> Node:
    rank, mode = len(n.shape()), n.attrs["mode"]
    if mode not in ("constant", "reflect", "edge"):
        raise n.error(f"mode {mode!r} is not supported (constant, reflect, edge)")
    given = [int(p) for p in n.const(1).tolist()]
    axes = n.axis_list(n.const(3).tolist(), rank) if n.input(3) else list(range(rank))
    if len(given) != 2 * len(axes):
        raise n.error(f"pads {given} must have 2 entries per padded axis ({len(axes)} axes)")
    pads = [0] * (2 * rank)
    for k, a in enumerate(axes):
        pads[a], pads[rank + a] = given[k], given[len(axes) + k]
    return n.make(attrs={"pads": tuple(pads), "mode": mode, "value": n.scalar(2, 0.0)})


@normalizer("Clip")
def _clip(n: OnnxNode) -> Node:
    return n.make(attrs={"min": n.scalar(1, -math.inf), "max": n.scalar(2, math.inf)})


#: what a reduction over no axes is with noop_with_empty_axes: the map each element goes through
_NOOP_REDUCE = {**dict.fromkeys(["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"],
                                "Identity"), "ReduceL1": "Abs", "ReduceL2": "Abs", "ReduceSumSquare": "Mul"}


@normalizer(*_NOOP_REDUCE)
def _reduce(n: OnnxNode) -> Node:
    """Axes from the attribute (before opset 18) or the input; none means all, or with noop_with_empty_axes no
    reduction at all: each element mapped as the reduction of one element maps it (|x| for ReduceL1, x * x ...)."""
    rank = len(n.shape())
    axes = n.attrs.get("axes")
    if axes is None and n.input(1):
        axes = n.const(1).tolist()
    if not axes:
        if n.attrs.get("noop_with_empty_axes", 0):  # an attribute since ReduceSum 13, the others 18
            op = _NOOP_REDUCE[n.op]
            return n.make(op, inputs=[n.inputs[0]] * (2 if op == "Mul" else 1))
        axes = range(rank)
    return n.make(attrs={"axes": n.axes(axes, rank), "keepdims": int(n.attrs["keepdims"])})
