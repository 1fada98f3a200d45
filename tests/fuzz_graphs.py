"""A graph fuzzer: random small ONNX models (opset 17, float32) drawn from the operators tensorgen imports.

`random_model(rng)` writes a valid model: every node is added to a growing graph whose shapes ONNX shape
inference gives (so the next node is built for the shape the last one has), the draw is retried when a
tensor would exceed MAX_ELEMENTS, and `validate` checks the result with onnx.checker, strict shape
inference and ONNX Runtime. The ops are chosen to meet what exported models do to an importer and a
code generator: constants broadcast from every rank with size-1 axes, parallel branches joined by
Concat or Add, dilated / strided / grouped / depthwise convolutions with asymmetric pads, transposed
convolutions, pools with ceil_mode and padding, layout changes between them, LayerNorm / Softmax / GELU
chains, batched MatMul with broadcasting, embeddings gathered by int64 ids, reductions.

tests/fuzz_graph_check.py takes each model through tensorgen and compares it with ONNX Runtime.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
MAX_ELEMENTS = 4096  # per tensor: every kernel compiles and runs in well under a second


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
    count: int = 0

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

    def op(self, op: str, inputs: Sequence[str], n_outputs: int = 1, **attrs) -> str | list[str]:
        """Add a node; its outputs get the shapes ONNX infers. Rejected if it is invalid or too large."""
        outs = [self.fresh(op.lower()) for _ in range(n_outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), outs, name=self.fresh(f"{op}_"), **attrs))
        try:
            shapes = _inferred(self.model([]), outs)
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
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)

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
        return b.op("Exp", [b.op("Clip", [x, b.const(np.float32(-4)), b.const(np.float32(4))])])
    if op in ("Sqrt", "Reciprocal"):  # of |x| + a positive constant
        return b.op(op, [b.op("Add", [b.op("Abs", [x]), b.const(np.float32(b.rng.uniform(0.1, 1)))])])
    if op == "Pow":
        if b.rng.random() < 0.5:
            return b.op("Pow", [x, b.const(np.float32(_pick(b.rng, [2.0, 3.0])))])
        base = b.op("Add", [b.op("Abs", [x]), b.const(np.float32(0.5))])
        return b.op("Pow", [base, b.uniform(_broadcast_shape(b, b.shapes[base]), 0.5, 1.5)])
    if op == "Clip":
        lo, hi = sorted(b.rng.uniform(-1.5, 1.5, 2))
        bounds = _pick(b.rng, [[b.const(np.float32(lo)), b.const(np.float32(hi))], [b.const(np.float32(lo))],
                               ["", b.const(np.float32(hi))]])
        return b.op("Clip", [x, *bounds])
    return b.op(op, [x])


def gelu(b: _Builder, x: str) -> str:
    """GELU as exporters write it at opset 17: the Erf form or the tanh approximation."""
    half = b.op("Mul", [x, b.const(np.float32(0.5))])
    if b.rng.random() < 0.5:
        inner = b.op("Erf", [b.op("Div", [x, b.const(np.float32(math.sqrt(2)))])])
    else:
        cube = b.op("Mul", [b.op("Pow", [x, b.const(np.float32(3))]), b.const(np.float32(0.044715))])
        inner = b.op("Tanh", [b.op("Mul", [b.op("Add", [x, cube]), b.const(np.float32(math.sqrt(2 / math.pi)))])])
    return b.op("Mul", [half, b.op("Add", [inner, b.const(np.float32(1))])])


def swish_like(b: _Builder, x: str) -> str:
    """x combined with a function of itself: two runtime inputs to one element-wise op."""
    op = _pick(b.rng, ["Mul", "Add", "Div", "Sub"])
    other = b.op(_pick(b.rng, ["Sigmoid", "Tanh", "Relu"]), [x])
    if op == "Div":
        other = b.op("Add", [b.op("Abs", [other]), b.const(np.float32(1))])
    return b.op(op, [x, other])


def nan_source(b: _Builder, x: str) -> str:
    """Sqrt of a value that is negative in places, often into a max-like op: each engine must propagate NaN alike."""
    y = b.op("Sqrt", [x])
    then = _pick(b.rng, ["Relu", "Clip", "Max", "none"])
    if then == "Clip":
        return b.op("Clip", [y, b.const(np.float32(0)), b.const(np.float32(1))])
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


def reduce(b: _Builder, x: str) -> str:
    rank = len(b.shapes[x])
    axes = sorted(b.rng.choice(rank, int(b.rng.integers(1, rank + 1)), replace=False).tolist())
    axes = [a - rank if b.rng.random() < 0.3 else a for a in axes]
    keepdims = int(b.rng.random() < 0.5)
    if b.rng.random() < 0.5:
        return b.op("ReduceMean", [x], axes=axes, keepdims=keepdims)
    return b.op("ReduceSum", [x, b.ints(axes)], keepdims=keepdims)


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
    inputs = [x, b.ints(pads)] + ([b.const(np.float32(b.rng.uniform(-1, 1)))] if mode == "constant" else [])
    return b.op("Pad", inputs, mode=mode)


def gather(b: _Builder, x: str) -> str:
    shape = b.shapes[x]
    axis = int(b.rng.integers(len(shape)))
    d = shape[axis]
    kind = b.rng.integers(3)
    size = () if kind == 0 else (int(b.rng.integers(1, 4)),) if kind == 1 else (2, int(b.rng.integers(1, 3)))
    indices = b.rng.integers(-d, d, size).astype(np.int64)
    return b.op("Gather", [x, b.const(indices, "idx")], axis=axis - len(shape) if b.rng.random() < 0.3 else axis)


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
    _check_window((h, w), kernel, attrs.get("dilations", [1, 1]), pads)
    y = b.op(op, [x], **attrs)
    if ceil and b.shapes[y][2:] != _ort_pool_shape((h, w), attrs):
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


OPS: dict[str, tuple[float, Op]] = {  # name: (weight, op)
    "binary_const": (3, binary_const), "unary": (3, unary), "gelu": (1, gelu), "swish_like": (1, swish_like),
    "nan_source": (0.3, nan_source),
    "softmax": (1, softmax), "layer_norm": (1, layer_norm), "reduce": (1, reduce), "transpose": (1, transpose),
    "reshape": (1.5, reshape), "slice": (1, slice_), "pad": (0.5, pad), "gather": (0.7, gather),
    "expand": (0.5, expand), "matmul": (1.5, matmul), "gemm": (0.7, gemm), "where": (0.4, where),
    "conv": (4, conv), "conv_transpose": (1, conv_transpose), "pool": (3, pool), "batch_norm": (1, batch_norm),
    "aspp": (1, aspp),
}

SCALAR_OPS = ("binary_const", "unary", "swish_like", "reshape", "where")


def _apply_random(b: _Builder, x: str, names: Sequence[str] | None = None) -> str:
    """One op drawn by weight among `names` (default all) that accepts `x`; x itself after 20 rejections."""
    names = [n for n in names or OPS if b.shapes[x] or n in SCALAR_OPS]
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
            return b.op("Concat", [left, right], axis=axis - len(s) if b.rng.random() < 0.3 else axis)
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


def random_model(rng: np.random.Generator, steps: int | None = None) -> onnx.ModelProto:
    """A valid random model: an input, then `steps` (default 2..6) random ops or pairs of branches joined."""
    b = _Builder(rng)
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
