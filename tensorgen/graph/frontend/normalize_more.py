"""Normalizers that write smaller ONNX ops as a few IR nodes of ops tensorgen already has: OneHot (a comparison of
the indices with the positions), Trilu at run time (a Where with a constant mask), Hardmax (ArgMax, then a
comparison), GlobalLpPool (a ReduceSum of |x|^p over the spatial axes, its p-th root) and LpPool (an
AveragePool of |x|^p times the window's size, its p-th root), DFT (the real and imaginary parts, each multiplied by
constant cosine and sine matrices). EyeLike needs only its input's shape and is folded by the importer."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tensorgen.graph.frontend.normalize import CONST_INPUTS, NORMALIZERS, OnnxNode, Steps, normalizer
from tensorgen.graph.frontend.onnx_eval import np_dtype
from tensorgen.graph.ir import Node, Value

CONST_INPUTS.update({"OneHot": {1: "depth", 2: "values"}, "Trilu": {1: "k"}, "DFT": {1: "dft_length", 2: "axis"}})


def _positions(n: OnnxNode, count: int, axis: int, rank: int, dtype: str = "int64") -> str:
    """0..count-1 along `axis` of a tensor of `rank` dims, laid out to broadcast against it."""
    return n.constant("positions", np.arange(count, dtype=dtype).reshape((count,) + (1,) * (rank - axis - 1)))


@normalizer("OneHot")
def _one_hot(n: OnnxNode) -> list[Node]:
    """values[1] where the (int64) index, counted from the end when negative, equals the position along `axis`,
    values[0] elsewhere (so an index out of [-depth, depth) gives a row of values[0], as ONNX Runtime does)."""
    depth, values = n.const(1), n.const(2)
    if depth.size != 1 or values.size != 2:
        raise n.error(f"depth must hold one number and values two, not {list(depth.shape)} and {list(values.shape)}")
    depth = int(depth.reshape(-1)[0])
    shape, out = n.shape(), n.out().shape
    if depth < 1:
        raise n.error(f"depth={depth} is not supported (at least 1)")
    axis = n.axis(n.attrs["axis"], len(out))
    step = Steps(n)
    index = n.inputs[0]
    if n.state.values[index].dtype != "int64":
        index = step("index", "Cast", [index], shape, "int64", to="int64")
    size = n.constant("depth", np.array(depth, np.int64))
    negative = step("negative", "Less", [index, n.constant("zero", np.array(0, np.int64))], shape, "bool")
    index = step("wrapped", "Where", [negative, step("shifted", "Add", [index, size], shape, "int64"), index],
                 shape, "int64")
    column = step("column", "Unsqueeze", [index], tuple(1 if d == axis else s for d, s in enumerate(out)), "int64",
                  axes=(axis,))
    hot = step("hot", "Equal", [column, _positions(n, depth, axis, len(out))], out, "bool")
    off, on = (n.constant(name, values.reshape(-1)[i].astype(values.dtype)) for i, name in ((0, "off"), (1, "on")))
    return step.last("Where", [hot, on, off])


@normalizer("Trilu")
def _trilu(n: OnnxNode) -> Node | list[Node]:
    """x where the constant mask of the last two dims holds (j - i >= k for upper, <= k for lower), else 0."""
    shape = n.shape()
    if len(shape) < 2:
        raise n.error(f"input {list(shape)} has fewer than 2 dims")
    k = int(n.const(1).reshape(-1)[0]) if n.input(1) else 0
    rows, cols = shape[-2:]
    ones = np.ones((rows, cols), dtype=bool)
    mask = np.triu(ones, k) if int(n.attrs["upper"]) else np.tril(ones, k)
    zero = n.constant("zero", np.zeros((), n.out().dtype))
    return n.make("Where", inputs=[n.constant("mask", mask), n.inputs[0], zero])


@normalizer("Hardmax")
def _hardmax(n: OnnxNode) -> list[Node]:
    """1 at the first largest element along `axis`, 0 elsewhere: ArgMax (keepdims), Equal with the positions,
    Cast."""
    shape, dtype = n.shape(), n.out().dtype
    axis = n.axis(n.attrs["axis"], len(shape))
    step = Steps(n)
    kept = tuple(1 if d == axis else s for d, s in enumerate(shape))
    best = step("argmax", "ArgMax", [n.inputs[0]], kept, "int64", axis=axis, keepdims=1, select_last_index=0)
    hot = step("hot", "Equal", [best, _positions(n, shape[axis], axis, len(shape))], shape, "bool")
    return step.last("Cast", [hot], to=dtype)


def _p(n: OnnxNode) -> int:
    p = int(n.attrs.get("p", 2))
    if p < 1:
        raise n.error(f"p={p} is not supported (p >= 1)")
    return p


def _powered(n: OnnxNode, step: Steps, p: int) -> str:
    """|x|^p: Abs, x * x or Pow of |x|."""
    x, shape = n.inputs[0], n.shape()
    if p == 2:
        return step("square", "Mul", [x, x], shape)
    magnitude = step("abs", "Abs", [x], shape)
    if p == 1:
        return magnitude
    return step("power", "Pow", [magnitude, n.constant("p", np.array(p, n.out().dtype))], shape)


def _root(n: OnnxNode, step: Steps, total: str, p: int) -> list[Node]:
    """The p-th root of the last node's sum."""
    if p == 1:
        return step.last("Identity", [total])
    if p == 2:
        return step.last("Sqrt", [total])
    return step.last("Pow", [total, n.constant("root", np.array(1 / p, n.out().dtype))])


@normalizer("GlobalLpPool")
def _global_lp_pool(n: OnnxNode) -> list[Node]:
    """(sum of |x|^p over the spatial axes)^(1/p)."""
    p, step = _p(n), Steps(n)
    axes = tuple(range(2, len(n.shape())))
    total = step("sum", "ReduceSum", [_powered(n, step, p)], n.out().shape, axes=axes, keepdims=1)
    return _root(n, step, total, p)


@normalizer("LpPool")
def _lp_pool(n: OnnxNode) -> list[Node]:
    """(AveragePool(|x|^p) * K)^(1/p), K the window's size and padding counted (its zeros add nothing)."""
    p, step = _p(n), Steps(n)
    pooled = n.temp("mean", n.out().shape)
    attrs = {"ceil_mode": 0, **{k: v for k, v in n.attrs.items() if k != "p"}, "count_include_pad": 1}
    step.nodes.append(NORMALIZERS["AveragePool"](OnnxNode(f"{n.name}_mean", n.label, "AveragePool",
                                                          [_powered(n, step, p)], [pooled], attrs, n.state)))
    pooled_shape = n.state.values[pooled].shape  # the pool's normalizer settles ceil_mode's output size
    n.state.values[n.outputs[0]] = replace(n.out(), shape=pooled_shape)
    window = n.constant("window", np.array(np.prod(n.attrs["kernel_shape"]), n.out().dtype))
    return _root(n, step, step("sum", "Mul", [pooled, window], pooled_shape), p)


def eye_like(value: Value, attrs: dict) -> np.ndarray:
    """EyeLike from its input's shape alone: ones on diagonal k of a 2-D tensor, in `dtype` (else the input's)."""
    if len(value.shape) != 2:
        raise ValueError(f"EyeLike of a {len(value.shape)}-d input (2-d only)")
    dtype = np_dtype(attrs["dtype"]) if attrs.get("dtype") else value.dtype
    return np.eye(*value.shape, k=int(attrs.get("k", 0)), dtype=dtype)


@normalizer("DFT")
def _dft(n: OnnxNode) -> list[Node]:
    """Y[k] = scale * sum_n X[n] e^(sign 2 pi i k n / L) along `axis` as matrix products: each part of Y (real,
    imaginary) is a sum of each part of X times a constant matrix (cosines or sines), the transformed axis moved last
    and back. L is dft_length (the signal cut or padded with zeros to it); onesided keeps k <= L / 2 of a forward
    transform (FNet mixes its tokens with one), and of an inverse reads that half spectrum and gives the real signal
    (numpy's irfft: the other half is its mirror image)."""
    shape, out = n.shape(), n.out().shape
    rank, dtype = len(shape), n.out().dtype
    if rank < 2 or shape[-1] not in (1, 2):
        raise n.error(f"input {list(shape)} must end in a dim of 1 (real) or 2 (complex)")
    axis = n.attrs["axis"] if "axis" in n.attrs else int(n.const(2).reshape(-1)[0]) if n.input(2) else -2
    axis = n.axis(axis, rank)
    if axis == rank - 1:
        raise n.error("the transformed axis is the last one, which holds the real and imaginary parts")
    inverse, onesided = bool(n.attrs.get("inverse", 0)), bool(n.attrs.get("onesided", 0))
    matrices = _dft_matrices(shape[axis], out[axis], int(n.const(1).reshape(-1)[0]) if n.input(1) else None,
                             inverse, onesided)
    step = Steps(n)
    perm = list(range(rank))
    perm[axis], perm[-1] = rank - 1, axis
    part_shape = (*shape[:-1], 1)
    moved = tuple(part_shape[p] for p in perm)  # the transformed axis last, the part's unit dim in its place
    product = (*moved[:-1], out[axis])
    parts = []
    for k in range(shape[-1]):
        part = step(f"part{k}", "Slice", [n.inputs[0]], part_shape, starts=(k,), ends=(k + 1,), axes=(rank - 1,),
                    steps=(1,))
        parts.append(step(f"moved{k}", "Transpose", [part], moved, perm=tuple(perm)))
    results = []
    for q, name in zip(range(out[-1]), ("re", "im")):
        total = ""
        for k, x in enumerate(parts):
            term = step(f"{name}{k}", "MatMul", [x, n.constant(f"{name}{k}", matrices[k][q].astype(dtype))], product)
            total = step(f"{name}_sum", "Add", [total, term], product) if total else term
        results.append(step(f"{name}_back", "Transpose", [total], tuple(product[p] for p in perm), perm=tuple(perm)))
    return step.last("Concat", results, axis=rank - 1) if len(results) == 2 else step.last("Identity", results)


def _dft_matrices(n: int, bins: int, length: int | None, inverse: bool, onesided: bool) -> list[list[np.ndarray]]:
    """[input part][output part] matrices (n, bins) of a DFT along an axis of n (see _dft)."""
    if inverse and onesided:  # irfft: n entries of a half spectrum in, `bins` real samples out
        length = length or 2 * (n - 1)
        k = np.arange(min(n, length // 2 + 1))
        weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0)[:, None] / length
        angle = 2 * np.pi * np.outer(k, np.arange(bins)) / length
        re, im = np.zeros((2, n, bins))
        re[:len(k)], im[:len(k)] = weight * np.cos(angle), -weight * np.sin(angle)
        return [[re], [im]]
    length = length or n
    angle = 2 * np.pi * np.outer(np.arange(min(n, length)), np.arange(bins)) / length
    scale, sign = (1.0 / length, 1.0) if inverse else (1.0, -1.0)
    cos, sin = np.zeros((2, n, bins))
    cos[:angle.shape[0]], sin[:angle.shape[0]] = scale * np.cos(angle), scale * sign * np.sin(angle)
    return [[cos, sin], [-sin, cos]]
