"""A graph fuzzer: random small ONNX models (opset 17, 18 or 21, float32) drawn from the operators tensorgen imports.

`random_model(rng)` writes a valid model: every node is added to a growing graph whose shapes ONNX shape
inference gives (so the next node is built for the shape the last one has), the draw is retried when a
tensor would exceed MAX_ELEMENTS, and `validate` checks the result with onnx.checker, strict shape
inference and ONNX Runtime. The ops are chosen to meet what exported models do to an importer and a
code generator: constants broadcast from every rank with size-1 axes, parallel branches joined by
Concat or Add, dilated / strided / grouped / depthwise convolutions with asymmetric pads, transposed
convolutions, pools with ceil_mode and padding, layout changes between them, LayerNorm / Softmax / GELU
chains, batched MatMul with broadcasting, embeddings gathered by int64 ids, reductions. Less often (a
quarter of the draws) the ops tensorgen imported later: trigonometric, hyperbolic and rounding functions on
the values they are defined for, integer and float Mod, comparisons and masks, Einsum in the equations
models write, TopK / ArgMax / Hardmax, CumSum, Tile, GatherElements, ScatterElements / ScatterND with their
reductions, OneHot, Trilu, DepthToSpace / SpaceToDepth, Lp / LRN / instance / group / mean-variance
normalization, LpPool, Resize, Split (GLU), the Shape-Gather-Concat-Reshape of a traced view, and RNN / GRU /
LSTM in every direction. No NaN reaches an op whose answer on it is ONNX Runtime's own (_NAN_UNDEFINED).

tests/fuzz_graph_check.py takes each model through tensorgen and compares it with ONNX Runtime.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# 18: Reduce* take axes as an input, Split num_outputs, scatter max / min, LpPool ceil_mode; 21: GroupNormalization
# (its scale and bias per channel; onnx.checker refuses opset 18's, per group, as deprecated)
OPSETS = (17, 18, 21)
MAX_ELEMENTS = 4096  # per tensor: every kernel compiles and runs in well under a second


# ops whose answer on NaN is ONNX Runtime's own: its max-like reductions and pools take a NaN or not by where it
# lies, a NaN cast to an integer is undefined; NaN may reach none of them (see _Builder.nan)
_NAN_UNDEFINED = frozenset({"ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool", "ArgMax", "ArgMin", "TopK",
                            "Hardmax"})


class Rejected(Exception):
    """The drawn op does not fit the tensor it was drawn for; the generator draws another."""


@dataclass
class _Builder:
    """A growing ONNX graph whose value shapes come from ONNX shape inference after every node."""

    rng: np.random.Generator
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    unsure: set[str] = field(default_factory=set)  # values whose inferred shape ONNX Runtime does not agree with
    nan: set[str] = field(default_factory=set)  # values that may hold NaN (from nan_source)
    count: int = 0
    opset: int = OPSETS[-1]
    ops: Sequence[str] = ()  # the OPS the model draws from (all when empty)

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}{self.count}"

    def input(self, shape: Sequence[int], dtype: int = TensorProto.FLOAT) -> str:
        name = f"in{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        self.shapes[name] = tuple(shape)
        return name

    def const(self, array: np.ndarray | float, base: str = "c") -> str:
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(array, name))
        self.shapes[name] = tuple(array.shape)
        return name

    def uniform(self, shape: Sequence[int], low: float = -1.0, high: float = 1.0, base: str = "w") -> str:
        return self.const(self.rng.uniform(low, high, tuple(shape)).astype(np.float32), base)

    def ints(self, values: Sequence[int]) -> str:
        return self.const(np.array(list(values), dtype=np.int64), "i")

    def scalar(self, value: float) -> str:
        return self.const(np.float32(value))

    def op(self, op: str, inputs: Sequence[str], n_outputs: int = 1, shape: tuple[int, ...] | None = None,
           **attrs) -> str | list[str]:
        """Add a node; its outputs get the shapes ONNX infers (`shape` where it infers none: ONNX does not infer
        through some function ops). Rejected if it is invalid or too large."""
        outs = [self.fresh(op.lower()) for _ in range(n_outputs)]
        if self.nan.intersection(inputs):
            if op in _NAN_UNDEFINED or attrs.get("reduction") in ("max", "min") or (
                    op == "Cast" and attrs["to"] != TensorProto.FLOAT):
                raise Rejected(f"{op} of a value that may be NaN")
            self.nan.update(outs)
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.fresh(f"{op}_"), **attrs))
        try:
            shapes = [shape if s is None else s for s in _inferred(self.model([]), outs)]
        except Exception as err:
            self.nodes.pop()
            raise Rejected(f"{op}: {err}") from None
        if any(s is None or min(s, default=1) < 1 or math.prod(s) > MAX_ELEMENTS for s in shapes):
            self.nodes.pop()
            raise Rejected(f"{op}: output shapes {shapes}")
        self.shapes.update(zip(outs, shapes))
        return outs[0] if n_outputs == 1 else outs

    def model(self, outputs: Sequence[str] | None = None) -> onnx.ModelProto:
        names = list(outputs if outputs is not None else self.outputs)
        # an output whose shape ONNX Runtime computes otherwise (see pool) gets symbolic dims
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [
            f"{n}_{i}" for i in range(len(self.shapes[n]))] if n in self.unsure else self.shapes[n]) for n in names]
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, outs, self.initializers)
        opsets = [helper.make_opsetid("", self.opset)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))

    def snapshot(self) -> tuple[int, int, int]:
        return len(self.nodes), len(self.initializers), len(self.outputs)

    def restore(self, mark: tuple[int, int, int]) -> None:
        del self.nodes[mark[0]:], self.initializers[mark[1]:], self.outputs[mark[2]:]


def _inferred(model: onnx.ModelProto, names: Sequence[str]) -> list[tuple[int, ...] | None]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    found = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
    shapes = []
    for name in names:
        t = found[name].type.tensor_type if name in found else None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim] if t and t.HasField(
            "shape") else None
        shapes.append(tuple(dims) if dims is not None and None not in dims else None)
    return shapes


# ---------------------------------------------------------------------------------------------
# ops: each takes the builder and a value and returns a new value (or raises Rejected)

Op = Callable[[_Builder, str], str]


def _pick(rng: np.random.Generator, items: Sequence):
    return items[int(rng.integers(len(items)))]


def _broadcast_shape(b: _Builder, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A constant's shape that broadcasts against `shape`: rank 0..4, each axis the matching size or 1."""
    rank = int(b.rng.integers(0, max(len(shape), 4) + 1))
    padded = (1,) * max(0, rank - len(shape)) + shape[max(0, len(shape) - rank):]
    return tuple(d if b.rng.random() < 0.6 else 1 for d in padded)


def binary_const(b: _Builder, x: str) -> str:
    op = _pick(b.rng, ["Add", "Mul", "Sub", "Div", "Max", "Min", "Add", "Mul"])
    shape = _broadcast_shape(b, b.shapes[x])
    if op == "Div":  # away from zero
        c = b.const(b.rng.uniform(0.5, 1.5, shape) * b.rng.choice([-1.0, 1.0], shape))
    else:
        c = b.uniform(shape)
    return b.op(op, [c, x] if b.rng.random() < 0.3 else [x, c])


def unary(b: _Builder, x: str) -> str:
    op = _pick(b.rng, ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Erf", "LeakyRelu", "HardSigmoid", "HardSwish",
                       "Exp", "Sqrt", "Pow", "Reciprocal", "Clip"])
    if op == "LeakyRelu":
        return b.op(op, [x], alpha=float(b.rng.uniform(0.01, 0.3)))
    if op == "Exp":
        return b.op("Exp", [_domain(b, x, "bounded")])
    if op in ("Sqrt", "Reciprocal"):  # of |x| + a positive constant
        return b.op(op, [_domain(b, x, "positive")])
    if op == "Pow":
        if b.rng.random() < 0.5:
            return b.op("Pow", [x, b.scalar(_pick(b.rng, [2.0, 3.0]))])
        base = b.op("Add", [b.op("Abs", [x]), b.scalar(0.5)])
        return b.op("Pow", [base, b.uniform(_broadcast_shape(b, b.shapes[base]), 0.5, 1.5)])
    if op == "Clip":
        lo, hi = sorted(b.rng.uniform(-1.5, 1.5, 2))
        bounds = _pick(b.rng, [[b.scalar(lo), b.scalar(hi)], [b.scalar(lo)], ["", b.scalar(hi)]])
        return b.op("Clip", [x, *bounds])
    return b.op(op, [x])


def gelu(b: _Builder, x: str) -> str:
    """GELU as exporters write it at opset 17: the Erf form or the tanh approximation."""
    half = b.op("Mul", [x, b.scalar(0.5)])
    if b.rng.random() < 0.5:
        inner = b.op("Erf", [b.op("Div", [x, b.scalar(math.sqrt(2))])])
    else:
        cube = b.op("Mul", [b.op("Pow", [x, b.scalar(3)]), b.scalar(0.044715)])
        inner = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, cube]), b.scalar(math.sqrt(2 / math.pi))])])
    return b.op("Mul", [half, b.op("Add", [inner, b.scalar(1)])])


def swish_like(b: _Builder, x: str) -> str:
    """x combined with a function of itself: two runtime inputs to one element-wise op."""
    op = _pick(b.rng, ["Mul", "Add", "Div", "Sub"])
    other = b.op(_pick(b.rng, ["Sigmoid", "Tanh", "Relu"]), [x])
    if op == "Div":
        other = b.op("Add", [b.op("Abs", [other]), b.scalar(1)])
    return b.op(op, [x, other])


def nan_source(b: _Builder, x: str) -> str:
    """Sqrt of a value that is negative in places, often into a max-like op: each engine must propagate NaN alike."""
    y = b.op("Sqrt", [x])
    b.nan.add(y)
    then = _pick(b.rng, ["Relu", "Clip", "Max", "none"])
    if then == "Clip":
        return b.op("Clip", [y, b.scalar(0), b.scalar(1)])
    if then == "Max":
        return b.op("Max", [y, b.uniform(_broadcast_shape(b, b.shapes[y]))])
    return b.op("Relu", [y]) if then == "Relu" else y


def softmax(b: _Builder, x: str) -> str:
    rank = len(b.shapes[x])
    return b.op("Softmax", [x], axis=int(b.rng.integers(-rank, rank)))


def layer_norm(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    axis = int(b.rng.integers(-len(shape), len(shape))) if b.rng.random() < 0.5 else -1
    tail = shape[axis:]
    inputs = [x, b.uniform(tail, 0.5, 1.5)] + ([b.uniform(tail)] if b.rng.random() < 0.7 else [])
    return b.op("LayerNormalization", inputs, axis=axis, epsilon=float(_pick(b.rng, [1e-5, 1e-3])))


def _signed(b: _Builder, axis: int, rank: int) -> int:
    """`axis`, or three times in ten the same axis counted from the end."""
    return axis - rank if b.rng.random() < 0.3 else axis


def _some_axes(b: _Builder, rank: int) -> list[int]:
    """1..rank distinct axes, in order, some counted from the end."""
    axes = sorted(b.rng.choice(rank, int(b.rng.integers(1, rank + 1)), replace=False).tolist())
    return [_signed(b, a, rank) for a in axes]


def reduction(b: _Builder, op: str, x: str, axes: Sequence[int] | None, keepdims: int) -> str:
    """A Reduce* node over `axes` (None: all), written as the model's opset has it: axes an input from opset 18
    (ReduceSum's from 13), an attribute before."""
    if axes is None:
        return b.op(op, [x], keepdims=keepdims)
    if op == "ReduceSum" or b.opset >= 18:
        return b.op(op, [x, b.ints(axes)], keepdims=keepdims)
    return b.op(op, [x], axes=list(axes), keepdims=keepdims)


def reduce(b: _Builder, x: str) -> str:
    axes = _some_axes(b, len(b.shapes[x]))
    keepdims = int(b.rng.random() < 0.5)
    return reduction(b, "ReduceMean" if b.rng.random() < 0.5 else "ReduceSum", x, axes, keepdims)


def transpose(b: _Builder, x: str) -> str:
    rank = len(b.shapes[x])
    if rank < 2:
        raise Rejected("rank < 2")
    return b.op("Transpose", [x], perm=b.rng.permutation(rank).tolist())


def _factor(rng: np.random.Generator, n: int, parts: int) -> list[int]:
    dims = [1] * parts
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
            dims[int(rng.integers(parts))] *= p
    dims[int(rng.integers(parts))] *= n
    return dims


def reshape(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    kind = _pick(b.rng, ["Reshape", "Reshape", "Flatten", "Squeeze", "Unsqueeze"])
    if kind == "Flatten":
        return b.op("Flatten", [x], axis=int(b.rng.integers(0, len(shape) + 1)))
    if kind == "Squeeze":
        ones = [i for i, d in enumerate(shape) if d == 1]
        if not ones:
            raise Rejected("no size-1 axis")
        return b.op("Squeeze", [x, b.ints(ones)] if b.rng.random() < 0.8 else [x])
    if kind == "Unsqueeze":
        if len(shape) >= 5:
            raise Rejected("rank 5")
        return b.op("Unsqueeze", [x, b.ints([int(b.rng.integers(-len(shape) - 1, len(shape) + 1))])])
    target = _factor(b.rng, math.prod(shape), int(b.rng.integers(1, 5)))
    if b.rng.random() < 0.3:
        target[int(b.rng.integers(len(target)))] = -1
    return b.op("Reshape", [x, b.ints(target)])


def slice_(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    axes = sorted(b.rng.choice(len(shape), int(b.rng.integers(1, min(2, len(shape)) + 1)), replace=False).tolist())
    starts, ends, steps = [], [], []
    for a in axes:
        d = shape[a]
        step = int(_pick(b.rng, [1, 1, 2, -1]))
        start, end = sorted(int(v) for v in b.rng.integers(0, d + 1, 2))
        end = max(end, start + 1)
        if step < 0:
            start, end = end - 1, start - 1
        if b.rng.random() < 0.3 and step > 0:
            start -= d  # negative indices count from the end
        if b.rng.random() < 0.2:
            end = 2**62 if step > 0 else -(2**62)
        starts.append(start)
        ends.append(end)
        steps.append(step)
    return b.op("Slice", [x, b.ints(starts), b.ints(ends), b.ints(axes), b.ints(steps)])


def pad(b: _Builder, x: str) -> str:
    rank = len(b.shapes[x])
    pads = b.rng.integers(0, 3, 2 * rank).tolist()
    mode = _pick(b.rng, ["constant", "reflect", "edge"])
    if mode == "reflect":
        pads = [min(p, b.shapes[x][i % rank] - 1) for i, p in enumerate(pads)]
    inputs = [x, b.ints(pads)] + ([b.scalar(b.rng.uniform(-1, 1))] if mode == "constant" else [])
    return b.op("Pad", inputs, mode=mode)


def gather(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    d = shape[axis]
    kind = b.rng.integers(3)
    size = () if kind == 0 else (int(b.rng.integers(1, 4)),) if kind == 1 else (2, int(b.rng.integers(1, 3)))
    indices = b.rng.integers(-d, d, size).astype(np.int64)
    return b.op("Gather", [x, b.const(indices, "idx")], axis=_signed(b, axis, len(shape)))


def expand(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    ones = [i for i, d in enumerate(shape) if d == 1]
    if not ones:
        raise Rejected("no size-1 axis")
    target = [int(b.rng.integers(2, 4)) if i in ones and b.rng.random() < 0.7 else 1 for i in range(len(shape))]
    return b.op("Expand", [x, b.ints(target)])


def matmul(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) == 1 or b.rng.random() < 0.7:
        left = len(shape) > 1 and b.rng.random() < 0.2  # W @ x
        k, n = shape[-2] if left else shape[-1], int(b.rng.integers(1, 17))
        batch = tuple(d if b.rng.random() < 0.5 else 1 for d in shape[:-2]) if b.rng.random() < 0.5 else ()
        if len(shape) == 2 and b.rng.random() < 0.3:
            batch = (int(b.rng.integers(1, 3)),)  # a batched weight broadcasts the matrix
        w = b.uniform((*batch, *((n, k) if left else (k, n))), -1 / math.sqrt(k), 1 / math.sqrt(k))
        return b.op("MatMul", [w, x] if left else [x, w])
    perm = list(range(len(shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    xt = b.op("Transpose", [x], perm=perm)
    return b.op("MatMul", [x, xt] if b.rng.random() < 0.5 else [xt, x])


def gemm(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) != 2:
        x = b.op("Flatten", [x], axis=int(b.rng.integers(1, len(shape)))) if len(shape) > 1 else b.op(
            "Unsqueeze", [x, b.ints([0])])
        shape = b.shapes[x]
    m, k = shape
    n = int(b.rng.integers(1, 17))
    trans_a, trans_b = int(b.rng.random() < 0.3), int(b.rng.random() < 0.5)
    if trans_a:
        x = b.op("Transpose", [x], perm=[1, 0])
    w = b.uniform((n, k) if trans_b else (k, n), -1 / math.sqrt(k), 1 / math.sqrt(k))
    inputs = [x, w]
    if b.rng.random() < 0.7:
        inputs.append(b.uniform(_pick(b.rng, [(n,), (1, n), (m, 1), (m, n), ()])))
    return b.op("Gemm", inputs, alpha=float(_pick(b.rng, [1.0, 0.5])), beta=float(_pick(b.rng, [1.0, 2.0])),
                transA=trans_a, transB=trans_b)


def where(b: _Builder, x: str) -> str:
    shape = _broadcast_shape(b, b.shapes[x])
    cond = b.const(b.rng.random(shape) < 0.5, "mask")
    return b.op("Where", [cond, x, b.uniform(_broadcast_shape(b, b.shapes[x]))])


# --- NCHW ops -------------------------------------------------------------------------------------


def _image(b: _Builder, x: str) -> tuple[int, ...]:
    shape = b.shapes[x]
    if len(shape) != 4:
        raise Rejected("not NCHW")
    return shape


def conv(b: _Builder, x: str, dilation: int | None = None, same: bool = False, cout: int | None = None) -> str:
    n, c, h, w = _image(b, x)
    kind = _pick(b.rng, ["plain", "grouped", "depthwise", "plain"]) if cout is None else "plain"
    group = 1 if kind == "plain" else c if kind == "depthwise" else _pick(
        b.rng, [g for g in range(1, c + 1) if c % g == 0])
    if cout is None:
        cout = group * int(b.rng.integers(1, max(2, 9 // group) + 1)) if kind != "depthwise" else c * int(
            b.rng.integers(1, 3))
    kernel = [int(b.rng.integers(1, 4)), int(b.rng.integers(1, 4))] if b.rng.random() < 0.4 else [3, 3]
    strides = [1, 1] if same else [int(b.rng.integers(1, 3)) for _ in range(2)]
    dilations = [dilation] * 2 if dilation else [int(_pick(b.rng, [1, 1, 2])) for _ in range(2)]
    if same:
        pads = [(k - 1) * d // 2 for k, d in zip(kernel, dilations)]
        pads = pads + [(k - 1) * d - p for k, d, p in zip(kernel, dilations, pads)]
    else:
        pads = [int(b.rng.integers(0, (k - 1) * d + 1)) for k, d in zip(kernel * 2, dilations * 2)]
    attrs = {"group": group, "kernel_shape": kernel, "strides": strides, "dilations": dilations}
    if not same and dilations == [1, 1] and b.rng.random() < 0.15:  # ORT: no auto_pad with dilations
        attrs["auto_pad"] = _pick(b.rng, ["SAME_UPPER", "SAME_LOWER", "VALID"])
        pads = [0] * 4 if attrs["auto_pad"] == "VALID" else kernel * 2  # SAME pads whatever a window needs
    else:
        attrs["pads"] = pads
    _check_window((h, w), kernel, dilations, pads)
    fan_in = c // group * math.prod(kernel)
    weight = b.uniform((cout, c // group, *kernel), -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
    inputs = [x, weight] + ([b.uniform((cout,))] if b.rng.random() < 0.6 else [])
    return b.op("Conv", inputs, **attrs)


def _check_window(spatial: Sequence[int], kernel: Sequence[int], dilations: Sequence[int], pads: Sequence[int]):
    """The padded input must hold one whole window (ONNX shape inference rounds a negative size up to 1)."""
    rank = len(spatial)
    if any(size + pads[a] + pads[a + rank] < (kernel[a] - 1) * dilations[a] + 1 for a, size in enumerate(spatial)):
        raise Rejected("the window is larger than the padded input")


def conv_transpose(b: _Builder, x: str) -> str:
    n, c, h, w = _image(b, x)
    group = _pick(b.rng, [g for g in (1, 2, c) if c % g == 0])
    cout = group * int(b.rng.integers(1, 4))
    kernel = [int(b.rng.integers(1, 4)) for _ in range(2)]
    strides = [int(b.rng.integers(1, 3)) for _ in range(2)]
    pads = [int(b.rng.integers(0, k)) for k in kernel * 2]
    output_padding = [int(b.rng.integers(0, s)) for s in strides]
    weight = b.uniform((c, cout // group, *kernel), -0.5, 0.5)
    inputs = [x, weight] + ([b.uniform((cout,))] if b.rng.random() < 0.5 else [])
    return b.op("ConvTranspose", inputs, group=group, kernel_shape=kernel, strides=strides, pads=pads,
                output_padding=output_padding)


def pool(b: _Builder, x: str) -> str:
    n, c, h, w = _image(b, x)
    op = _pick(b.rng, ["MaxPool", "AveragePool", "GlobalAveragePool", "MaxPool", "AveragePool"])
    if op == "GlobalAveragePool":
        return b.op(op, [x])
    kernel = [int(b.rng.integers(1, 4)) for _ in range(2)]
    strides = [int(b.rng.integers(1, 3)) for _ in range(2)]
    pads = [int(b.rng.integers(0, k)) for k in kernel * 2]
    ceil = int(b.rng.random() < 0.5)
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": ceil}
    if op == "AveragePool":
        attrs["count_include_pad"] = int(b.rng.random() < 0.5)
    elif b.rng.random() < 0.3:
        attrs["dilations"] = [int(b.rng.integers(1, 3)) for _ in range(2)]
    return _windowed(b, x, op, attrs)


def _windowed(b: _Builder, x: str, op: str, attrs: dict) -> str:
    """A pool of `x` with `attrs` (kernel_shape, strides, pads, maybe ceil_mode and dilations)."""
    spatial = b.shapes[x][2:]
    _check_window(spatial, attrs["kernel_shape"], attrs.get("dilations", [1] * len(spatial)), attrs["pads"])
    y = b.op(op, [x], **attrs)
    if attrs.get("ceil_mode") and b.shapes[y][2:] != _ort_pool_shape(spatial, attrs):
        # ONNX shape inference keeps a last window that starts in the padding, ONNX Runtime drops it: the
        # pool becomes a graph output (its shape is what ORT says) and the chain goes on from its input
        b.outputs.append(y)
        b.unsure.add(y)
        return x
    return y


def _ort_pool_shape(spatial: Sequence[int], attrs: dict) -> tuple[int, ...]:
    """ONNX Runtime's pooled size in ceil mode: a last window starting at or past the end of the padded-at-begin
    input is dropped."""
    dims = []
    rank = len(spatial)
    for a, size in enumerate(spatial):
        k, s = attrs["kernel_shape"][a], attrs["strides"][a]
        d = attrs.get("dilations", [1] * rank)[a]
        begin, end = attrs["pads"][a], attrs["pads"][a + rank]
        out = -(-(size + begin + end - (k - 1) * d - 1) // s) + 1
        if (out - 1) * s >= size + begin:
            out -= 1
        dims.append(out)
    return tuple(dims)


def batch_norm(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) < 2:
        raise Rejected("rank < 2")
    c = shape[1]
    stats = [b.uniform((c,), 0.5, 1.5), b.uniform((c,)), b.uniform((c,), -0.5, 0.5), b.uniform((c,), 0.5, 2.0)]
    return b.op("BatchNormalization", [x, *stats], epsilon=float(_pick(b.rng, [1e-5, 1e-3])))


def aspp(b: _Builder, x: str) -> str:
    """Dilated 3x3 convs of one input in parallel, concatenated over channels, then a 1x1 conv: an
    ASPP head, the shape that once broke crossover in tuning."""
    n, c, h, w = _image(b, x)
    cout = int(b.rng.integers(2, 9))
    branches = [conv(b, x, dilation=d, same=True, cout=cout) for d in range(1, int(b.rng.integers(2, 4)) + 1)]
    branches = [b.op("Relu", [y]) for y in branches]
    joined = b.op("Concat", branches, axis=1)
    k = len(branches) * cout
    return b.op("Conv", [joined, b.uniform((cout, k, 1, 1), -1 / math.sqrt(k), 1 / math.sqrt(k))])


# --- the ops tensorgen imported later: math, index, scatter, normalization, recurrent ---------------------------

# element-wise functions by the inputs they are drawn on: any value, a value clipped to [-4, 4] (sinh, cosh grow
# fast), squashed into (-1, 1) by Tanh (tan, acos, asin), inside it (atanh), positive, at least 1 (acosh)
_DOMAINS = {"Sin": "any", "Cos": "any", "Atan": "any", "Asinh": "any", "Softplus": "any", "Softsign": "any",
            "Mish": "any", "Sinh": "bounded", "Cosh": "bounded", "Tan": "squashed", "Acos": "squashed",
            "Asin": "squashed", "Atanh": "inside", "Log": "positive", "Acosh": "from_one", "Elu": "any",
            "Selu": "any", "Celu": "any", "ThresholdedRelu": "any", "Shrink": "any"}
_ATTRS: dict[str, Callable[[np.random.Generator], dict]] = {
    "Elu": lambda rng: {"alpha": float(rng.uniform(0.1, 2))},
    "Celu": lambda rng: {"alpha": float(rng.uniform(0.1, 2))},
    "Selu": lambda rng: {"alpha": float(rng.uniform(1, 2)), "gamma": float(rng.uniform(0.5, 1.5))},
    "ThresholdedRelu": lambda rng: {"alpha": float(rng.uniform(-0.5, 1))},
    "Shrink": lambda rng: {"lambd": float(rng.uniform(0, 1)), "bias": float(rng.uniform(0, 1))},
    "Gelu": lambda rng: {"approximate": _pick(rng, ["none", "tanh"])},
}


def _domain(b: _Builder, x: str, domain: str) -> str:
    """`x` brought into `domain` (see _DOMAINS)."""
    if domain == "bounded":
        return b.op("Clip", [x, b.scalar(-4), b.scalar(4)])
    if domain in ("squashed", "inside"):
        y = b.op("Tanh", [x])
        return b.op("Mul", [y, b.scalar(0.9)]) if domain == "inside" else y
    if domain in ("positive", "from_one"):
        return b.op("Add", [b.op("Abs", [x]), b.scalar(1 if domain == "from_one" else b.rng.uniform(0.1, 1))])
    return x


def math_(b: _Builder, x: str) -> str:
    """A trigonometric, hyperbolic, logarithmic or newer activation function, on the values it is defined for, or a
    PRelu with a slope that broadcasts, or (from opset 20) Gelu."""
    op = _pick(b.rng, [*_DOMAINS, "PRelu"] + (["Gelu"] if b.opset >= 20 else []))
    if op == "PRelu":  # the slope broadcasts to x: of no higher rank
        slope = _broadcast_shape(b, b.shapes[x])
        return b.op(op, [x, b.uniform(slope[max(0, len(slope) - len(b.shapes[x])):], 0, 0.5)])
    return b.op(op, [_domain(b, x, _DOMAINS.get(op, "any"))], **_ATTRS.get(op, lambda rng: {})(b.rng))


def rounding(b: _Builder, x: str) -> str:
    """Floor / Ceil / Round of a scaled value (as fake quantization writes it, scaled back), Sign, or Mod: fmod=1
    of floats by a nonzero constant, fmod=0 (integer) of the value cast to int64 or int32 and back."""
    op = _pick(b.rng, ["Floor", "Ceil", "Round", "Sign", "Mod", "Mod"])
    scale = float(_pick(b.rng, [1.0, 2.0, 4.0, 10.0]))
    if op == "Sign":
        return b.op("Sign", [x])
    if op != "Mod":
        y = b.op(op, [b.op("Mul", [x, b.scalar(scale)])])
        return b.op("Div", [y, b.scalar(scale)]) if b.rng.random() < 0.5 else y
    shape = _broadcast_shape(b, b.shapes[x])
    if b.rng.random() < 0.5:
        divisor = b.const(b.rng.uniform(0.3, 2, shape) * b.rng.choice([-1.0, 1.0], shape))
        return b.op("Mod", [x, divisor], fmod=1)
    dtype = _pick(b.rng, [(TensorProto.INT64, np.int64), (TensorProto.INT32, np.int32)])
    whole = b.op("Cast", [b.op("Mul", [x, b.scalar(scale)])], to=dtype[0])
    divisor = b.const((b.rng.integers(1, 6, shape) * b.rng.choice([-1, 1], shape)).astype(dtype[1]), "div")
    return b.op("Cast", [b.op("Mod", [whole, divisor], fmod=0)], to=TensorProto.FLOAT)


def mask(b: _Builder, x: str) -> str:
    """A run-time condition (comparisons of x, combined by And / Or / Xor, maybe negated; or a NaN / Inf guard)
    choosing between x and another value, or multiplying x as a float mask."""
    compare = ["Greater", "Less", "GreaterOrEqual", "LessOrEqual"]
    if b.rng.random() < 0.15:
        cond = b.op("Or", [b.op("IsNaN", [x]), b.op("IsInf", [x])])
        return b.op("Where", [cond, b.scalar(0), x])
    if b.rng.random() < 0.15:  # equality only of whole numbers
        cond = b.op("Equal", [b.op("Round", [x]), b.scalar(_pick(b.rng, [-1.0, 0.0, 1.0]))])
    else:
        cond = b.op(_pick(b.rng, compare), [x, b.uniform(_broadcast_shape(b, b.shapes[x]), -0.5, 0.5)])
    if b.rng.random() < 0.3:
        other = b.op(_pick(b.rng, compare), [x, b.scalar(b.rng.uniform(-1, 1))])
        cond = b.op(_pick(b.rng, ["And", "Or", "Xor"]), [cond, other])
    if b.rng.random() < 0.3:
        cond = b.op("Not", [cond])
    if b.rng.random() < 0.5:
        return b.op("Mul", [x, b.op("Cast", [cond], to=TensorProto.FLOAT)])
    return b.op("Where", [cond, x, b.op(_pick(b.rng, ["Neg", "Sigmoid", "Relu"]), [x])])


def variadic(b: _Builder, x: str) -> str:
    """Sum / Mean / Max / Min of x, a function of it and maybe a broadcast constant."""
    inputs = [x, b.op(_pick(b.rng, ["Tanh", "Neg", "Sigmoid"]), [x])]
    if b.rng.random() < 0.5:
        inputs.append(b.uniform(_broadcast_shape(b, b.shapes[x])))
    return b.op(_pick(b.rng, ["Sum", "Mean", "Max", "Min"]), inputs)


def tile(b: _Builder, x: str) -> str:
    repeats = [int(_pick(b.rng, [1, 1, 2, 3])) for _ in b.shapes[x]]
    return b.op("Tile", [x, b.ints(repeats)])


def cumsum(b: _Builder, x: str) -> str:
    rank = len(b.shapes[x])
    axis = _signed(b, int(b.rng.integers(rank)), rank)
    axis_input = b.const(np.array(axis, dtype=_pick(b.rng, [np.int64, np.int32])), "axis")
    return b.op("CumSum", [x, axis_input], exclusive=int(b.rng.random() < 0.4), reverse=int(b.rng.random() < 0.4))


def top_k(b: _Builder, x: str) -> str:
    """TopK along an axis: its values, its indices cast to float, or their sum. Unsorted, its order is the
    engine's: a max or sum over the axis follows."""
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    k = int(b.rng.integers(1, shape[axis] + 1))
    is_sorted = int(b.rng.random() < 0.8)
    values, indices = b.op("TopK", [x, b.ints([k])], n_outputs=2, axis=_signed(b, axis, len(shape)),
                           largest=int(b.rng.random() < 0.7), sorted=is_sorted)
    use = _pick(b.rng, ["values", "indices", "both"])
    index = b.op("Cast", [indices], to=TensorProto.FLOAT) if use != "values" else values
    y = b.op("Add", [values, index]) if use == "both" else index
    return y if is_sorted else reduction(b, _pick(b.rng, ["ReduceMax", "ReduceSum"]), y, [axis], 1)


def arg_extreme(b: _Builder, x: str) -> str:
    """ArgMax / ArgMin (first or last of equal ones) as a float, or Hardmax, or LogSoftmax."""
    rank = len(b.shapes[x])
    axis = _signed(b, int(b.rng.integers(rank)), rank)
    op = _pick(b.rng, ["ArgMax", "ArgMin", "Hardmax", "LogSoftmax"])
    if op in ("Hardmax", "LogSoftmax"):
        return b.op(op, [x], axis=axis)
    found = b.op(op, [x], axis=axis, keepdims=int(b.rng.random() < 0.5), select_last_index=int(b.rng.random() < 0.3))
    return b.op("Cast", [found], to=TensorProto.FLOAT)


def reduce_more(b: _Builder, x: str) -> str:
    """The other reductions over some axes (all, now and then), keepdims 0 or 1. ReduceProd only of a few
    elements (a product of thousands overflows)."""
    shape = b.shapes[x]
    op = _pick(b.rng, ["ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "ReduceMax",
                       "ReduceMin"])
    axes = _some_axes(b, len(shape)) if b.rng.random() < 0.85 else None
    if op == "ReduceProd" and math.prod(shape[a] for a in (range(len(shape)) if axes is None else axes)) > 16:
        raise Rejected("a product of many elements")
    return reduction(b, op, x, axes, int(b.rng.random() < 0.5))


# equations exported models write, by the rank of the first operand; the second is x itself or a constant
_EINSUM = {2: [("ij->ji", ""), ("ij,jk->ik", "w"), ("ij,kj->ik", "x"), ("ij,ij->i", "x")],
           3: [("bij,bjk->bik", "w"), ("bij->bji", ""), ("bij,bkj->bik", "x"), ("bij,jk->bik", "w"),
               ("...ij,jk->...ik", "w")],
           4: [("bhqd,bhkd->bhqk", "x"), ("bhqk,bhkd->bhqd", "w"), ("nchw->nhwc", ""), ("...ij,jk->...ik", "w"),
               ("bhqd,bhqd->bhq", "x")]}


def einsum(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    if len(shape) not in _EINSUM:
        raise Rejected("no equation for this rank")
    equation, second = _pick(b.rng, _EINSUM[len(shape)])
    terms = equation.split("->")[0].split(",")
    first = terms[0].replace("...", "")
    sizes = dict(zip(first, shape[len(shape) - len(first):]))
    if second == "x":  # each equation with x twice names x's sizes alike in both
        return b.op("Einsum", [x, x], equation=equation)
    if second == "w":
        dims = [sizes.get(c) or int(b.rng.integers(1, 9)) for c in terms[1]]
        return b.op("Einsum", [x, b.uniform(dims, -0.5, 0.5)], equation=equation)
    return b.op("Einsum", [x], equation=equation)


def gather_elements(b: _Builder, x: str) -> str:
    """GatherElements by constant int64 indices in range, some negative, 1..size + 2 of them along the axis."""
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    d = shape[axis]
    size = tuple(int(b.rng.integers(1, d + 3)) if a == axis else n for a, n in enumerate(shape))
    indices = b.rng.integers(-d, d, size).astype(np.int64)
    return b.op("GatherElements", [x, b.const(indices, "idx")], axis=_signed(b, axis, len(shape)))


def _reductions(b: _Builder) -> list[str]:
    """The scatter reductions the model's opset has (max and min from 18)."""
    return ["none", "none", "add", "mul"] + (["max", "min"] if b.opset >= 18 else [])


def scatter_elements(b: _Builder, x: str) -> str:
    """x.scatter(axis, idx, updates): unique indices along the axis (some negative); the updates a constant or
    a function of x gathered at the same indices (scatter_add of a gather, as models write it)."""
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    d = shape[axis]
    order = np.argsort(b.rng.random(shape), axis=axis)  # a permutation of the axis at every position
    indices = np.take(order, np.arange(int(b.rng.integers(1, d + 1))), axis=axis).astype(np.int64)
    indices = np.where(b.rng.random(indices.shape) < 0.3, indices - d, indices)
    idx = b.const(indices, "idx")
    signed = _signed(b, axis, len(shape))
    if b.rng.random() < 0.5:
        updates = b.uniform(indices.shape)
    else:
        updates = b.op("Tanh", [b.op("GatherElements", [x, idx], axis=signed)])
    return b.op("ScatterElements", [x, idx, updates], axis=signed, reduction=_pick(b.rng, _reductions(b)))


def scatter_nd(b: _Builder, x: str) -> str:
    """ScatterND at distinct index tuples over the first k axes (some negative), a constant update each."""
    shape = b.shapes[x]
    k = int(b.rng.integers(1, len(shape) + 1))
    cells = math.prod(shape[:k])
    flat = b.rng.choice(cells, int(b.rng.integers(1, min(cells, 6) + 1)), replace=False)
    indices = np.stack(np.unravel_index(flat, shape[:k]), axis=-1).astype(np.int64)
    indices = np.where(b.rng.random(indices.shape) < 0.3, indices - np.array(shape[:k]), indices)
    updates = b.uniform((len(flat), *shape[k:]))
    return b.op("ScatterND", [x, b.const(indices, "idx"), updates], reduction=_pick(b.rng, _reductions(b)))


def one_hot(b: _Builder, x: str) -> str:
    """OneHot of x scaled and cast to int64 (negative ids count from the end, ids past the depth give a row of
    the off value) on a new axis, mixed back by a MatMul when that axis is last."""
    rank = len(b.shapes[x])
    if rank >= 4:
        raise Rejected("rank 4")
    depth = int(b.rng.integers(2, 7))
    ids = b.op("Cast", [b.op("Mul", [x, b.scalar(depth / 2)])], to=TensorProto.INT64)
    values = b.const(np.array(sorted(b.rng.uniform(-1, 1, 2)), np.float32), "values")
    depth_input = b.const(np.array(depth if b.rng.random() < 0.5 else [depth], np.int64), "depth")
    axis = int(b.rng.integers(-rank - 1, rank + 1))
    y = b.op("OneHot", [ids, depth_input, values], axis=axis)
    if axis in (-1, rank):
        y = b.op("MatMul", [y, b.uniform((depth, int(b.rng.integers(1, 9))))])
    return y


def trilu(b: _Builder, x: str) -> str:
    if len(b.shapes[x]) < 2:
        raise Rejected("rank < 2")
    k = [b.const(np.array(int(b.rng.integers(-2, 3)), np.int64), "k")] if b.rng.random() < 0.6 else []
    return b.op("Trilu", [x, *k], upper=int(b.rng.random() < 0.5))


def depth_space(b: _Builder, x: str) -> str:
    """DepthToSpace (DCR or CRD) after a conv to block² times the channels (a pixel shuffle), or SpaceToDepth."""
    n, c, h, w = _image(b, x)
    blocks = [k for k in (2, 3) if h % k == 0 and w % k == 0]
    if blocks and b.rng.random() < 0.4:
        return b.op("SpaceToDepth", [x], blocksize=_pick(b.rng, blocks))
    block = int(_pick(b.rng, [2, 2, 3]))
    if c % (block * block):
        x = conv(b, x, same=True, cout=block * block * int(b.rng.integers(1, 3)))
    return b.op("DepthToSpace", [x], blocksize=block, mode=_pick(b.rng, ["DCR", "CRD"]))


def normalization(b: _Builder, x: str) -> str:
    """LpNormalization along an axis, LRN, InstanceNormalization, GroupNormalization (opset 21: scale and bias
    per channel) or MeanVarianceNormalization over some axes."""
    shape = b.shapes[x]
    rank = len(shape)
    fits = ["LpNormalization", "MeanVarianceNormalization"] + (["InstanceNormalization"] if rank >= 3 else []) + (
        ["LRN"] if rank == 4 else []) + (["GroupNormalization"] * 2 if rank >= 3 and b.opset >= 21 else [])
    op = _pick(b.rng, fits)  # (ONNX Runtime's LRN: NCHW only, an odd size)
    if op == "LpNormalization":
        return b.op(op, [x], axis=_signed(b, int(b.rng.integers(rank)), rank), p=int(b.rng.integers(1, 3)))
    if op == "MeanVarianceNormalization":
        axes = _some_axes(b, rank)
        if math.prod(shape[a] for a in axes) < 2:  # ONNX Runtime: NaN (0 / 0), its function body: 0 / 1e-9
            raise Rejected("the variance of one element")
        return b.op(op, [x], axes=axes)
    c, epsilon = shape[1], float(_pick(b.rng, [1e-5, 1e-3]))
    if op == "LRN":
        return b.op(op, [x], size=int(_pick(b.rng, [1, 3, 5])), alpha=float(b.rng.uniform(1e-4, 1e-2)),
                    beta=float(b.rng.uniform(0.5, 1)), bias=float(b.rng.uniform(1, 2)))
    if op == "InstanceNormalization":
        return b.op(op, [x, b.uniform((c,), 0.5, 1.5), b.uniform((c,))], epsilon=epsilon)
    groups = _pick(b.rng, [g for g in range(1, c + 1) if c % g == 0])
    return b.op(op, [x, b.uniform((c,), 0.5, 1.5), b.uniform((c,))], shape=shape, num_groups=groups, epsilon=epsilon)


def lp_pool(b: _Builder, x: str) -> str:
    """LpPool (ceil_mode and dilations from opset 18), GlobalLpPool or GlobalMaxPool."""
    n, c, h, w = _image(b, x)
    op = _pick(b.rng, ["LpPool", "LpPool", "GlobalLpPool", "GlobalMaxPool"])
    if op == "GlobalMaxPool":
        return b.op(op, [x])
    p = int(_pick(b.rng, [1, 2, 2, 3]))
    if op == "GlobalLpPool":
        return b.op(op, [x], p=p)
    kernel = [int(b.rng.integers(1, 4)) for _ in range(2)]
    attrs = {"kernel_shape": kernel, "strides": [int(b.rng.integers(1, 3)) for _ in range(2)],
             "pads": [int(b.rng.integers(0, k)) for k in kernel * 2], "p": p}
    if b.opset >= 18:
        attrs["ceil_mode"] = int(b.rng.random() < 0.3)
        if b.rng.random() < 0.3:
            attrs["dilations"] = [int(b.rng.integers(1, 3)) for _ in range(2)]
    return _windowed(b, x, op, attrs)


def recurrent(b: _Builder, x: str) -> str:
    """RNN / GRU / LSTM over a (T, B, I) sequence, forward, reverse or bidirectional, a small hidden size; Y viewed
    back as (T, B, D * H) as exporters write it, or the last hidden (or cell) state. (Never batch first, layout=1:
    ONNX Runtime does not run it.)"""
    if len(b.shapes[x]) == 2:  # (T, I): a batch of one
        x = b.op("Unsqueeze", [x, b.ints([1])])
    shape = b.shapes[x]
    if len(shape) != 3:
        raise Rejected("not a sequence")
    op = _pick(b.rng, ["LSTM", "GRU", "RNN"])
    steps, batch, size = shape
    if steps > 8:
        raise Rejected("a long sequence")
    direction = _pick(b.rng, ["forward", "forward", "reverse", "bidirectional"])
    dirs, hidden, gates = 1 + (direction == "bidirectional"), int(b.rng.integers(1, 9)), {"RNN": 1, "GRU": 3,
                                                                                       "LSTM": 4}[op]
    scale = 1 / math.sqrt(hidden)
    state = (dirs, batch, hidden)
    # the optional inputs B, sequence_lens (never), initial_h, and LSTM's initial_c and peepholes P
    optional = [((dirs, 2 * gates * hidden), scale), None, (state, 1.0)] + [(state, 1.0), ((dirs, 3 * hidden), scale)]
    given = [spec is not None and b.rng.random() < 0.6 for spec in optional[:5 if op == "LSTM" else 3]]
    inputs = [x, b.uniform((dirs, gates * hidden, size), -scale, scale),
              b.uniform((dirs, gates * hidden, hidden), -scale, scale)]
    inputs += [b.uniform(optional[i][0], -optional[i][1], optional[i][1]) if g else "" for i, g in enumerate(given)]
    while inputs[-1] == "":
        inputs.pop()
    attrs = {"hidden_size": hidden, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = int(b.rng.random() < 0.5)
    if b.rng.random() < 0.2:
        attrs["clip"] = float(b.rng.uniform(0.5, 3))
    outs = b.op(op, inputs, n_outputs=3 if op == "LSTM" else 2, **attrs)
    use = int(b.rng.integers(len(outs)))
    if use:  # the final hidden (or cell) state (D, B, H) as (B, D * H)
        return b.op("Reshape", [b.op("Transpose", [outs[use]], perm=[1, 0, 2]), b.ints([batch, dirs * hidden])])
    y = b.op("Transpose", [outs[0]], perm=[0, 2, 1, 3])  # (T, D, B, H) -> (T, B, D, H)
    return b.op("Reshape", [y, b.ints([0, 0, -1])])


def resize(b: _Builder, x: str) -> str:
    """Upsampling as exported: nearest (asymmetric, floor) or linear (half_pixel, align_corners, ...), by scales
    or sizes of the spatial axes."""
    n, c, h, w = _image(b, x)
    mode = _pick(b.rng, ["nearest", "linear"])
    scales = [float(_pick(b.rng, [2.0, 2.0, 1.5, 0.5])) for _ in range(2)]
    attrs = {"mode": mode, "coordinate_transformation_mode": _pick(
        b.rng, ["asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel"])}
    if mode == "nearest":
        attrs["nearest_mode"] = _pick(b.rng, ["floor", "round_prefer_floor", "round_prefer_ceil"])
    if b.rng.random() < 0.5:
        return b.op("Resize", [x, "", b.const(np.array([1, 1, *scales], np.float32), "scales")], **attrs)
    sizes = [n, c] + [max(1, int(d * s)) for d, s in zip((h, w), scales)]
    return b.op("Resize", [x, "", "", b.ints(sizes)], **attrs)


def split(b: _Builder, x: str) -> str:
    """Split in two along an axis: a GLU (one half times the sigmoid of the other) where the halves match, else
    the parts concatenated back the other way round."""
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    if shape[axis] < 2:
        raise Rejected("nothing to split")
    first = shape[axis] // 2 if b.rng.random() < 0.6 else int(b.rng.integers(1, shape[axis]))
    sizes = [first, shape[axis] - first]
    signed = _signed(b, axis, len(shape))
    if b.opset >= 18 and sizes[0] == sizes[1] and b.rng.random() < 0.5:
        a, c = b.op("Split", [x], n_outputs=2, axis=signed, num_outputs=2)
    else:
        a, c = b.op("Split", [x, b.ints(sizes)], n_outputs=2, axis=signed)
    if sizes[0] == sizes[1]:
        return b.op("Mul", [a, b.op("Sigmoid", [c])])
    return b.op("Concat", [c, a], axis=signed)


def view(b: _Builder, x: str) -> str:
    """x.view(x.size(0), -1) as exporters trace it (Shape, Gather, Unsqueeze, Concat, Reshape), or a node that
    does nothing at inference (Identity, Dropout, Cast to float)."""
    kind = _pick(b.rng, ["view", "view", "Identity", "Dropout", "Cast"])
    if kind == "Cast":
        return b.op("Cast", [x], to=TensorProto.FLOAT)
    if kind != "view":
        return b.op(kind, [x])
    size = b.op("Unsqueeze", [b.op("Gather", [b.op("Shape", [x]), b.const(np.array(0, np.int64), "i")], axis=0),
                              b.ints([0])])
    return b.op("Reshape", [x, b.op("Concat", [size, b.ints([-1])], axis=0)])


_FIRST: dict[str, tuple[float, Op]] = {  # name: (weight, op)
    "binary_const": (3, binary_const), "unary": (3, unary), "gelu": (1, gelu), "swish_like": (1, swish_like),
    "nan_source": (0.3, nan_source),
    "softmax": (1, softmax), "layer_norm": (1, layer_norm), "reduce": (1, reduce), "transpose": (1, transpose),
    "reshape": (1.5, reshape), "slice": (1, slice_), "pad": (0.5, pad), "gather": (0.7, gather),
    "expand": (0.5, expand), "matmul": (1.5, matmul), "gemm": (0.7, gemm), "where": (0.4, where),
    "conv": (4, conv), "conv_transpose": (1, conv_transpose), "pool": (3, pool), "batch_norm": (1, batch_norm),
    "aspp": (1, aspp),
}
_LATER: dict[str, tuple[float, Op]] = {  # a third of the weight of the first, each op a little
    "math": (1.5, math_), "rounding": (0.4, rounding), "mask": (0.5, mask), "variadic": (0.4, variadic),
    "tile": (0.3, tile), "cumsum": (0.4, cumsum), "top_k": (0.4, top_k), "arg_extreme": (0.4, arg_extreme),
    "reduce_more": (0.6, reduce_more), "einsum": (0.6, einsum), "gather_elements": (0.3, gather_elements),
    "scatter_elements": (0.3, scatter_elements), "scatter_nd": (0.3, scatter_nd), "one_hot": (0.2, one_hot),
    "trilu": (0.3, trilu), "depth_space": (0.6, depth_space), "normalization": (0.8, normalization),
    "lp_pool": (0.6, lp_pool), "recurrent": (0.5, recurrent), "resize": (0.5, resize), "split": (0.4, split),
    "view": (0.4, view),
}
OPS = {**_FIRST, **_LATER}
# the ops of the first generator: the seeds tests/test_fuzz_graph.py keeps because they found bugs draw from these
# alone, at opset 17, and so still draw the models that found them
FIRST_OPS = tuple(_FIRST)

SCALAR_OPS = ("binary_const", "unary", "swish_like", "reshape", "where", "math", "rounding", "mask", "variadic")


def _apply_random(b: _Builder, x: str) -> str:
    """One op drawn by weight among the model's ops that accepts `x`; x itself after 20 rejections."""
    names = [n for n in b.ops or OPS if b.shapes[x] or n in SCALAR_OPS]
    weights = np.array([OPS[n][0] for n in names], dtype=float)
    for _ in range(20):
        name = names[int(b.rng.choice(len(names), p=weights / weights.sum()))]
        mark = b.snapshot()
        try:
            return OPS[name][1](b, x)
        except Rejected:
            b.restore(mark)
    return x


def _join(b: _Builder, left: str, right: str) -> str:
    """Two branches into one: Add where they broadcast, Concat where they differ on one axis only."""
    s, t = b.shapes[left], b.shapes[right]
    differ = [i for i, (p, q) in enumerate(zip(s, t)) if p != q]
    try:
        if len(s) == len(t) and s and (len(differ) == 1 or (not differ and b.rng.random() < 0.5)):
            axis = differ[0] if differ else int(b.rng.integers(len(s)))
            return b.op("Concat", [left, right], axis=_signed(b, axis, len(s)))
        np.broadcast_shapes(s, t)
        return b.op(_pick(b.rng, ["Add", "Mul", "Sub"]), [left, right])
    except (ValueError, Rejected):  # they neither concatenate nor broadcast: both become outputs
        b.outputs.append(right)
        return left


def _start(b: _Builder) -> str:
    """The model's input: an NCHW image, a token sequence through an embedding, a sequence, a matrix."""
    kind = _pick(b.rng, ["image", "image", "image", "sequence", "embedding", "matrix", "vector"])
    rng = b.rng
    if kind == "image":
        return b.input((int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(2, 11)),
                        int(rng.integers(2, 11))))
    if kind == "sequence":
        return b.input((int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(2, 17))))
    if kind == "matrix":
        return b.input((int(rng.integers(1, 9)), int(rng.integers(1, 17))))
    if kind == "vector":
        return b.input((int(rng.integers(1, 17)),))
    batch, seq, vocab, dim = int(rng.integers(1, 3)), int(rng.integers(1, 9)), int(rng.integers(2, 20)), int(
        rng.integers(2, 17))
    ids = b.input((batch, seq), TensorProto.INT64)
    x = b.op("Gather", [b.uniform((vocab, dim), base="table"), ids], axis=0)
    if rng.random() < 0.6:  # a position embedding broadcast over the batch
        x = b.op("Add", [x, b.uniform(((1,) if rng.random() < 0.5 else ()) + (seq, dim))])
    return x


def random_model(rng: np.random.Generator, steps: int | None = None, ops: Sequence[str] = (),
                 opset: int | None = None) -> onnx.ModelProto:
    """A valid random model: an input, then `steps` (default 2..6) random ops (of `ops`, default all of OPS) or
    pairs of branches joined; at `opset` (default one of OPSETS, drawn)."""
    b = _Builder(rng, opset=opset or int(rng.choice(OPSETS, p=[0.4, 0.3, 0.3])), ops=ops)
    x = _start(b)
    if b.rng.random() < 0.2:  # a second float input of the same shape, joined later
        other = b.input(b.shapes[x])
        x = b.op(_pick(b.rng, ["Add", "Mul", "Sub"]), [x, other])
    for _ in range(steps if steps is not None else int(rng.integers(2, 7))):
        if rng.random() < 0.25:
            left = _apply_random(b, _apply_random(b, x))
            right = _apply_random(b, x)
            x = _join(b, left, right)
        else:
            x = _apply_random(b, x)
    b.outputs.insert(0, x)
    model = b.model(list(dict.fromkeys(b.outputs)))
    model.graph.name = "fuzz"
    return model
