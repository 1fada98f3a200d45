"""Run a tensorgen Graph eagerly with PyTorch: the PyTorch CPU peer of the model benchmarks.

Every node calls the torch operator an eager `nn.Module` would (conv2d, batch_norm, addmm,
layer_norm, ...), so the time measured is what a user running the model in PyTorch gets
(oneDNN/MKL underneath). The semantics are ONNX's as normalized by the frontend (see
tensorgen.graph.ir): where torch's operators differ (asymmetric pads, ceil-mode windows,
negative slice steps, Resize coordinate modes) the op is rewritten into torch primitives that
compute exactly the ONNX result instead of approximating it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgen.graph.ir import Graph, GraphError, Node

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is optional (the "torch" extra); available() says whether it is here
    torch = F = None

OpFn = Callable[[Node, list[Any], Graph], Any]  # (node, torch inputs (None if omitted), graph) -> tensor(s)
OPS: dict[str, OpFn] = {}


def available() -> bool:
    """Whether PyTorch is importable, i.e. whether TorchModel can run."""
    return torch is not None


def register(*ops: str) -> Callable[[OpFn], OpFn]:
    def add(fn: OpFn) -> OpFn:
        for op in ops:
            OPS[op] = fn
        return fn

    return add


def _opt(xs: list[Any], i: int) -> Any:
    """Optional input i (None when omitted)."""
    return xs[i] if i < len(xs) else None


def _out_shape(node: Node, graph: Graph) -> tuple[int, ...]:
    return graph.value(node.outputs[0]).shape


@functools.cache
def _torch_dtype(name: str) -> Any:
    """The torch dtype of a numpy dtype name."""
    return torch.from_numpy(np.zeros(0, np.dtype(name))).dtype


# --- element-wise -------------------------------------------------------------------------

# ops that are one torch function of their inputs (broadcasting as ONNX does), and the variadic ones folded pairwise
_DIRECT = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Sqrt": "sqrt",
           "Reciprocal": "reciprocal", "Exp": "exp", "Neg": "neg", "Abs": "abs", "Add": "add", "Sub": "sub",
           "Mul": "mul", "Where": "where", "Log": "log", "Floor": "floor", "Ceil": "ceil", "Round": "round",
           "Sign": "sign", "IsNaN": "isnan", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos",
           "Atan": "atan", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh"}
_VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add"}


def _torch_fn(name: str) -> OpFn:
    return lambda node, xs, graph: getattr(torch, name)(*xs)


def _fold(name: str) -> OpFn:
    return lambda node, xs, graph: functools.reduce(getattr(torch, name), xs)


for _op, _name in _DIRECT.items():
    register(_op)(_torch_fn(_name))
for _op, _name in _VARIADIC.items():
    register(_op)(_fold(_name))


@register("Identity")
def _identity(node, xs, graph):
    return xs[0]


@register("Div")
def _div(node, xs, graph):
    a, b = xs
    return torch.div(a, b) if a.is_floating_point() else torch.div(a, b, rounding_mode="trunc")  # C semantics


@register("IsInf")
def _is_inf(node, xs, graph):
    x = xs[0]
    return (torch.isposinf(x) & bool(node.attrs.get("detect_positive", 1))) | \
        (torch.isneginf(x) & bool(node.attrs.get("detect_negative", 1)))


@register("Mod")
def _mod(node, xs, graph):
    return (torch.fmod if node.attrs.get("fmod", 0) else torch.remainder)(*xs)


@register("Pow")
def _pow(node, xs, graph):
    x, y = xs
    if y.numel() == 1 and y.dim() <= x.dim():
        y = y.item()  # a scalar exponent takes torch's fast paths (x*x for 2, sqrt for 0.5)
    out = torch.pow(x, y)
    return out if out.dtype == x.dtype else out.to(x.dtype)  # ONNX: the result has the base's type


@register("Clip")
def _clip(node, xs, graph):
    lo, hi = node.attrs.get("min", -math.inf), node.attrs.get("max", math.inf)
    lo, hi = (None if math.isinf(lo) else lo), (None if math.isinf(hi) else hi)
    return xs[0] if lo is None and hi is None else torch.clamp(xs[0], lo, hi)


@register("LeakyRelu")
def _leaky_relu(node, xs, graph):
    return F.leaky_relu(xs[0], node.attrs.get("alpha", 0.01))


@register("HardSigmoid")
def _hard_sigmoid(node, xs, graph):
    return torch.clamp(xs[0] * node.attrs.get("alpha", 0.2) + node.attrs.get("beta", 0.5), 0.0, 1.0)


@register("HardSwish")
def _hard_swish(node, xs, graph):
    return F.hardswish(xs[0])


@register("Gelu")
def _gelu(node, xs, graph):
    return F.gelu(xs[0], approximate=node.attrs.get("approximate", "none"))


@register("Elu")
def _elu(node, xs, graph):
    return F.elu(xs[0], node.attrs.get("alpha", 1.0))


@register("Celu")
def _celu(node, xs, graph):
    return F.celu(xs[0], node.attrs.get("alpha", 1.0))


@register("Selu")
def _selu(node, xs, graph):
    alpha, gamma, x = node.attrs["alpha"], node.attrs["gamma"], xs[0]
    return torch.where(x > 0, x * gamma, (torch.exp(x) - 1) * (alpha * gamma))


@register("ThresholdedRelu")
def _thresholded_relu(node, xs, graph):
    x = xs[0]
    return torch.where(x > node.attrs.get("alpha", 1.0), x, torch.zeros_like(x))


@register("Shrink")
def _shrink(node, xs, graph):
    x, lambd, bias = xs[0], node.attrs["lambd"], node.attrs["bias"]
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))


@register("Softplus")
def _softplus(node, xs, graph):
    return F.softplus(xs[0], threshold=math.inf)


@register("Softsign")
def _softsign(node, xs, graph):
    return F.softsign(xs[0])


@register("Mish")
def _mish(node, xs, graph):
    return F.mish(xs[0])


@register("PRelu")
def _prelu(node, xs, graph):
    x, slope = xs
    return torch.where(x < 0, x * slope, x)  # the slope broadcasts as ONNX says (F.prelu wants it per channel)


@register("Mean")
def _mean(node, xs, graph):
    return functools.reduce(torch.add, xs) / len(xs)


@register("Cast")
def _cast(node, xs, graph):
    return xs[0].to(_torch_dtype(node.attrs["to"]))


# --- convolution and pooling --------------------------------------------------------------

def _spatial(node: Node, kind: str) -> int:
    n = len(node.attrs["kernel_shape"])
    if not 1 <= n <= 3:
        raise GraphError(f"{node}: {n}-d {kind} is not supported by torch (1 to 3 spatial dims)")
    return n


def _pads(node: Node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(begins, ends) of an explicit ONNX pads attribute."""
    pads = tuple(node.attrs["pads"])
    return pads[: len(pads) // 2], pads[len(pads) // 2:]


def _torch_pads(begins: Sequence[int], ends: Sequence[int]) -> list[int]:
    """F.pad's argument for the trailing len(begins) axes: last axis first, (begin, end) per axis."""
    return [p for b, e in reversed(list(zip(begins, ends))) for p in (b, e)]


@register("Conv")
def _conv(node, xs, graph):
    n = _spatial(node, "Conv")
    x, (begins, ends) = xs[0], _pads(node)
    padding: Sequence[int] = begins
    if begins != ends:  # torch pads symmetrically only
        x, padding = F.pad(x, _torch_pads(begins, ends)), (0,) * n
    conv = getattr(F, f"conv{n}d")
    return conv(x, xs[1], _opt(xs, 2), node.attrs["strides"], padding, node.attrs["dilations"], node.attrs["group"])


@register("ConvTranspose")
def _conv_transpose(node, xs, graph):
    n = _spatial(node, "ConvTranspose")
    begins, ends = _pads(node)
    common = tuple(min(b, e) for b, e in zip(begins, ends))
    conv = getattr(F, f"conv_transpose{n}d")
    y = conv(xs[0], xs[1], _opt(xs, 2), node.attrs["strides"], common, node.attrs.get("output_padding", (0,) * n),
             node.attrs["group"], node.attrs["dilations"])
    if begins == ends:
        return y
    crop = (slice(b - c, y.shape[2 + i] - (e - c)) for i, (b, e, c) in enumerate(zip(begins, ends, common)))
    return y[(slice(None), slice(None), *crop)]


@dataclass(frozen=True)
class _Windows:
    """The windows of a pooling node: torch's own padding/ceil_mode (native) or explicit padding."""

    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begins: tuple[int, ...]
    ends: tuple[int, ...]  # ONNX end pads
    extra: tuple[int, ...]  # end padding beyond `ends` that makes floor-mode windows cover the ceil-mode ones
    native: bool  # torch's padding=begins, ceil_mode reproduce the output shape exactly


def _torch_pool_size(size: int, k: int, s: int, d: int, p: int, ceil: bool) -> int:
    """Output length of a torch pooling op (aten's pooling_output_shape)."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    return out - 1 if ceil and (out - 1) * s >= size + p else out


@functools.cache
def _windows(kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...], pads: tuple[int, ...],
             ceil: bool, sizes: tuple[int, ...], outs: tuple[int, ...], dilation_ok: bool) -> _Windows:
    n = len(kernel)
    begins, ends = pads[:n], pads[n:]
    extra = tuple(max(0, (o - 1) * s + d * (k - 1) + 1 - (size + b + e))
                  for k, s, d, b, e, size, o in zip(kernel, strides, dilations, begins, ends, sizes, outs))
    native = (begins == ends and (dilation_ok or set(dilations) == {1})
              and all(p <= k // 2 for p, k in zip(begins, kernel))
              and outs == tuple(map(_torch_pool_size, sizes, kernel, strides, dilations, begins, (ceil,) * n)))
    return _Windows(kernel, strides, dilations, begins, ends, extra, native)


def _pool_windows(node: Node, x: Any, graph: Graph, dilation_ok: bool) -> _Windows:
    a = node.attrs
    return _windows(tuple(a["kernel_shape"]), tuple(a["strides"]), tuple(a["dilations"]), tuple(a["pads"]),
                    bool(a.get("ceil_mode", 0)), tuple(x.shape[2:]), _out_shape(node, graph)[2:], dilation_ok)


def _pad_windows(x: Any, w: _Windows, value: float) -> Any:
    return F.pad(x, _torch_pads(w.begins, [e + more for e, more in zip(w.ends, w.extra)]), value=value)


def _window_mean(x: Any, w: _Windows) -> Any:
    """Mean over each window of an already padded x (avg_pool has no dilation: a depthwise conv does)."""
    n = len(w.kernel)
    if set(w.dilations) == {1}:
        return getattr(F, f"avg_pool{n}d")(x, w.kernel, w.strides)
    ones = torch.full((x.shape[1], 1, *w.kernel), 1.0 / math.prod(w.kernel), dtype=x.dtype)
    return getattr(F, f"conv{n}d")(x, ones, None, w.strides, 0, w.dilations, x.shape[1])


@functools.cache
def _window_fraction(w: _Windows, sizes: tuple[int, ...], include_pad: bool, dtype: Any) -> Any:
    """Per window: the fraction of its positions that count toward the average (ceil overhang never does)."""
    if include_pad:
        mask = F.pad(torch.ones((1, 1, *(s + b + e for s, b, e in zip(sizes, w.begins, w.ends))), dtype=dtype),
                     _torch_pads([0] * len(sizes), w.extra))
    else:
        mask = _pad_windows(torch.ones((1, 1, *sizes), dtype=dtype), w, 0.0)
    return _window_mean(mask, w)


@register("MaxPool")
def _max_pool(node, xs, graph):
    pool = getattr(F, f"max_pool{_spatial(node, 'MaxPool')}d")
    x, w = xs[0], _pool_windows(node, xs[0], graph, dilation_ok=True)
    if w.native:
        return pool(x, w.kernel, w.strides, w.begins, w.dilations, ceil_mode=bool(node.attrs.get("ceil_mode", 0)))
    return pool(_pad_windows(x, w, -math.inf), w.kernel, w.strides, 0, w.dilations)


@register("AveragePool")
def _average_pool(node, xs, graph):
    n = _spatial(node, "AveragePool")
    x, w = xs[0], _pool_windows(node, xs[0], graph, dilation_ok=False)
    include_pad = bool(node.attrs.get("count_include_pad", 0))
    if w.native:
        return getattr(F, f"avg_pool{n}d")(x, w.kernel, w.strides, w.begins, bool(node.attrs.get("ceil_mode", 0)),
                                           include_pad)
    fraction = _window_fraction(w, tuple(x.shape[2:]), include_pad, x.dtype)
    return _window_mean(_pad_windows(x, w, 0.0), w) / fraction


@register("GlobalAveragePool")
def _global_average_pool(node, xs, graph):
    return xs[0].mean(dim=tuple(range(2, xs[0].dim())), keepdim=True)


@register("LRN")
def _lrn(node, xs, graph):
    """ONNX's window: floor((size - 1) / 2) channels before, the rest after (F.local_response_norm puts the larger
    half before)."""
    x, a = xs[0], node.attrs
    size = a["size"]
    squares = F.pad((x * x).movedim(1, -1), ((size - 1) // 2, size // 2))
    total = squares.unfold(-1, size, 1).sum(-1).movedim(-1, 1)
    return x / (a["bias"] + a["alpha"] / size * total) ** a["beta"]


@register("GlobalMaxPool")
def _global_max_pool(node, xs, graph):
    return xs[0].amax(dim=tuple(range(2, xs[0].dim())), keepdim=True)


# --- normalization, matrix products, softmax, reductions ----------------------------------

@register("BatchNormalization")
def _batch_norm(node, xs, graph):
    x, scale, bias, mean, var = xs
    return F.batch_norm(x, mean, var, scale, bias, False, 0.0, node.attrs.get("epsilon", 1e-5))


@register("LayerNormalization")
def _layer_norm(node, xs, graph):
    x, scale, bias = xs[0], _opt(xs, 1), _opt(xs, 2)
    shape, eps = tuple(x.shape[node.attrs["axis"]:]), node.attrs.get("epsilon", 1e-5)
    if all(t is None or tuple(t.shape) == shape for t in (scale, bias)):
        return F.layer_norm(x, shape, scale, bias, eps)
    y = F.layer_norm(x, shape, eps=eps)  # scale/bias that only broadcast to the normalized shape
    y = y if scale is None else y * scale
    return y if bias is None else y + bias


@register("Gemm")
def _gemm(node, xs, graph):
    a, b, c = xs[0], xs[1], _opt(xs, 2)
    a = a.t() if node.attrs.get("transA", 0) else a
    b = b.t() if node.attrs.get("transB", 0) else b
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    if c is not None:
        return torch.addmm(c, a, b, beta=beta, alpha=alpha)
    y = torch.mm(a, b)
    return y if alpha == 1.0 else y * alpha


@register("MatMul")
def _matmul(node, xs, graph):
    return torch.matmul(xs[0], xs[1])


@register("Softmax")
def _softmax(node, xs, graph):
    return torch.softmax(xs[0], node.attrs["axis"])


@register("LogSoftmax")
def _log_softmax(node, xs, graph):
    return torch.log_softmax(xs[0], node.attrs["axis"])


@register("ReduceMean")
def _reduce_mean(node, xs, graph):
    return torch.mean(xs[0], tuple(node.attrs["axes"]), keepdim=bool(node.attrs.get("keepdims", 1)))


@register("InstanceNormalization")
def _instance_norm(node, xs, graph):
    return F.instance_norm(xs[0], weight=xs[1], bias=xs[2], eps=node.attrs["epsilon"])


@register("ArgMax", "ArgMin")
def _arg_extreme(node, xs, graph):
    a, x = node.attrs, xs[0]
    if a["select_last_index"]:  # the first index from the end
        x = x.flip(a["axis"])
    fn = torch.argmax if node.op == "ArgMax" else torch.argmin
    index = fn(x, a["axis"], keepdim=bool(a["keepdims"]))
    return x.shape[a["axis"]] - 1 - index if a["select_last_index"] else index


@register("CumSum")
def _cumsum(node, xs, graph):
    a, x = node.attrs, xs[0]
    axis = a["axis"]
    x = x.flip(axis) if a["reverse"] else x
    y = torch.cumsum(x, axis, dtype=x.dtype)
    if a["exclusive"]:  # shifted by one: the sum of what comes before
        y = torch.cat([torch.zeros_like(x.narrow(axis, 0, 1)), y.narrow(axis, 0, x.shape[axis] - 1)], axis)
    return y.flip(axis) if a["reverse"] else y


@register("TopK")
def _top_k(node, xs, graph):
    """A stable sort (equal values by index, NaN the largest), then the first k."""
    a = node.attrs
    values, indices = torch.sort(xs[0], dim=a["axis"], descending=bool(a["largest"]), stable=True)
    return values.narrow(a["axis"], 0, a["k"]), indices.narrow(a["axis"], 0, a["k"])


@register("ReduceMax", "ReduceMin")
def _reduce_max_min(node, xs, graph):
    return (torch.amax if node.op == "ReduceMax" else torch.amin)(xs[0], tuple(node.attrs["axes"]),
                                                                   keepdim=bool(node.attrs.get("keepdims", 1)))


@register("ReduceSum")
def _reduce_sum(node, xs, graph):  # torch would widen integer sums to int64; ONNX keeps the type
    return torch.sum(xs[0], tuple(node.attrs["axes"]), keepdim=bool(node.attrs.get("keepdims", 1)), dtype=xs[0].dtype)


@register("ReduceProd")
def _reduce_prod(node, xs, graph):  # torch.prod takes one dim at a time (the last first, so the others keep theirs)
    x, keep = xs[0], bool(node.attrs.get("keepdims", 1))
    for axis in sorted(node.attrs["axes"], reverse=True):
        x = torch.prod(x, axis, keepdim=keep, dtype=x.dtype)
    return x


_NORM_REDUCTIONS = {"ReduceL1": lambda x, d, k: torch.sum(x.abs(), d, keepdim=k, dtype=x.dtype),
                    "ReduceL2": lambda x, d, k: torch.sqrt(torch.sum(x * x, d, keepdim=k)),
                    "ReduceSumSquare": lambda x, d, k: torch.sum(x * x, d, keepdim=k, dtype=x.dtype),
                    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k)}


@register(*_NORM_REDUCTIONS)
def _norm_reduction(node, xs, graph):
    return _NORM_REDUCTIONS[node.op](xs[0], tuple(node.attrs["axes"]), bool(node.attrs.get("keepdims", 1)))


# --- data movement ------------------------------------------------------------------------

@register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(node, xs, graph):
    return xs[0].reshape(_out_shape(node, graph))


@register("Expand")
def _expand(node, xs, graph):
    return xs[0].expand(_out_shape(node, graph))


@register("Tile")
def _tile(node, xs, graph):
    return xs[0].repeat(*(o // n for o, n in zip(_out_shape(node, graph), xs[0].shape)))


@register("Transpose")
def _transpose(node, xs, graph):
    return xs[0].permute(tuple(node.attrs["perm"]))


@register("Concat")
def _concat(node, xs, graph):
    return torch.cat(xs, node.attrs["axis"])


@register("Split")
def _split(node, xs, graph):
    return torch.split(xs[0], list(node.attrs["split"]), node.attrs["axis"])


@register("Slice")
def _slice(node, xs, graph):
    """Starts/ends are already clamped (ONNX rules); torch has no negative steps, so those axes are flipped."""
    x = xs[0]
    index = [slice(None)] * x.dim()
    a = node.attrs
    for axis, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        if step < 0:
            x, last = x.flip(axis), x.shape[axis] - 1
            start, end, step = last - start, last - end, -step
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


@register("Gather")
def _gather(node, xs, graph):
    x, idx = xs
    axis = node.attrs["axis"]
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)  # ONNX counts negative indices from the end
    flat = x.index_select(axis, idx.reshape(-1))
    return flat.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


@register("GatherElements")
def _gather_elements(node, xs, graph):
    x, idx = xs
    axis = node.attrs["axis"]
    return torch.gather(x, axis, torch.where(idx < 0, idx + x.shape[axis], idx).long())


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@register("ScatterElements")
def _scatter_elements(node, xs, graph):
    """torch.scatter (one update after another on the CPU: the last of duplicates wins) or scatter_reduce."""
    x, idx, upd = xs
    axis, reduction = node.attrs["axis"], node.attrs["reduction"]
    idx = torch.where(idx < 0, idx + x.shape[axis], idx).long()
    if reduction == "none":
        return x.scatter(axis, idx, upd)
    return x.scatter_reduce(axis, idx, upd, _SCATTER_REDUCE[reduction], include_self=True)


_ND_COMBINE: dict[str, Callable] = {"none": lambda old, new: new, "add": lambda old, new: old + new,
                                     "mul": lambda old, new: old * new,
                                     "max": lambda old, new: torch.maximum(old, new),
                                     "min": lambda old, new: torch.minimum(old, new)}


@register("ScatterND")
def _scatter_nd(node, xs, graph):
    """The updates written one after another, as ONNX's reference does (the last of duplicates wins)."""
    x, idx, upd = xs
    k, combine = idx.shape[-1], _ND_COMBINE[node.attrs["reduction"]]
    out = x.clone()
    dims = torch.tensor(x.shape[:k])
    for where, value in zip(idx.reshape(-1, k).long(), upd.reshape(-1, *x.shape[k:])):
        at = tuple(torch.where(where < 0, where + dims, where).tolist())
        out[at] = combine(out[at], value)
    return out


@register("Einsum")
def _einsum(node, xs, graph):
    return torch.einsum(node.attrs["equation"], *xs)


@register("DepthToSpace", "SpaceToDepth")
def _depth_space(node, xs, graph):
    """pixel_shuffle is DepthToSpace in CRD mode; DCR reorders the channels (block row, block column, channel)."""
    x, b, dcr = xs[0], node.attrs["blocksize"], node.attrs.get("mode", "DCR") == "DCR"  # SpaceToDepth: DCR
    n, c, h, w = x.shape
    if node.op == "DepthToSpace":
        if dcr:
            x = x.reshape(n, b * b, c // (b * b), h, w).transpose(1, 2).reshape(n, c, h, w)
        return F.pixel_shuffle(x, b)
    y = F.pixel_unshuffle(x, b)
    return y.reshape(n, c, b * b, h // b, w // b).transpose(1, 2).reshape(y.shape) if dcr else y


_TORCH_PAD_MODES = {"reflect": "reflect", "edge": "replicate"}


def _pad_index(n: int, begin: int, end: int, mode: str) -> np.ndarray:
    """Source index of every position of a padded (or cropped) axis of length n."""
    i = np.arange(-begin, n + end)
    if mode == "edge" or n == 1:
        return np.clip(i, 0, n - 1)
    i = np.abs(i) % (2 * (n - 1))  # reflect: the axis repeats mirrored with period 2(n-1)
    return np.where(i >= n, 2 * (n - 1) - i, i)


@register("Pad")
def _pad(node, xs, graph):
    x, mode = xs[0], node.attrs.get("mode", "constant")
    rank = x.dim()
    begins, ends = node.attrs["pads"][:rank], node.attrs["pads"][rank:]
    if mode == "constant":
        return F.pad(x, _torch_pads(begins, ends), value=float(node.attrs.get("value", 0.0)))
    if mode not in _TORCH_PAD_MODES:
        raise GraphError(f"{node}: pad mode {mode!r} is not supported (constant, reflect, edge)")
    padded = [i for i in range(rank) if begins[i] or ends[i]]
    if not padded:
        return x
    # torch's reflect/replicate pad the trailing 1-3 axes of a tensor with 1 or 2 leading (batch, channel) axes
    trailing = [k for k in (rank - 2, rank - 1) if rank - padded[0] <= k <= 3 and k >= 1]
    if trailing and min(node.attrs["pads"]) >= 0:
        k = trailing[0]
        return F.pad(x, _torch_pads(begins[rank - k:], ends[rank - k:]), mode=_TORCH_PAD_MODES[mode])
    for axis in padded:
        x = x.index_select(axis, torch.from_numpy(_pad_index(x.shape[axis], begins[axis], ends[axis], mode)))
    return x


# --- Resize (nearest) ---------------------------------------------------------------------
# Source coordinate of output position x along an axis (ONNX Resize), in float32 like ONNX Runtime:
# (x, scale, input length, output length) -> float32 array.
_COORDINATES: dict[str, Callable[[np.ndarray, np.float32, np.float32, np.float32], np.ndarray]] = {
    "asymmetric": lambda x, s, n, m: x / s,
    "half_pixel": lambda x, s, n, m: (x + 0.5) / s - 0.5,
    "pytorch_half_pixel": lambda x, s, n, m: (x + 0.5) / s - 0.5 if m > 1 else np.zeros_like(x),
    "align_corners": lambda x, s, n, m: x * (n - 1) / (m - 1) if m > 1 else np.zeros_like(x),
    "half_pixel_symmetric": lambda x, s, n, m: n / 2 * (1 - m / (s * n)) + (x + 0.5) / s - 0.5,
}
_NEAREST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda v: np.ceil(v - 0.5),
    "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    "floor": np.floor,
    "ceil": np.ceil,
}


@functools.cache
def _resize_indices(sizes: tuple[int, ...], outs: tuple[int, ...], scales: tuple[float, ...], coordinates: str,
                   nearest: str) -> tuple[np.ndarray | None, ...]:
    """Per axis, the source index of every output position (None where the axis is unchanged)."""
    result = []
    for n, m, s in zip(sizes, outs, scales):
        x = np.arange(m, dtype=np.float32)
        src = _COORDINATES[coordinates](x, np.float32(s), np.float32(n), np.float32(m))
        idx = np.clip(_NEAREST[nearest](src.astype(np.float32)), 0, n - 1).astype(np.int64)
        result.append(None if m == n and np.array_equal(idx, np.arange(n)) else idx)
    return tuple(result)


def _repeats(indices: tuple[np.ndarray | None, ...], sizes: tuple[int, ...]) -> list[int] | None:
    """Per-axis repeat counts when every axis just repeats each element r times (integer nearest upsampling)."""
    reps = []
    for idx, n in zip(indices, sizes):
        r = 1 if idx is None else len(idx) // n
        if idx is not None and (len(idx) != r * n or not np.array_equal(idx, np.arange(r * n) // r)):
            return None
        reps.append(r)
    return reps


def _linear_resize(x, sizes: tuple[int, ...], outs: tuple[int, ...], scales: tuple[float, ...], coordinates: str):
    """Linear Resize one axis after the other: the source coordinate clamped to [0, n - 1] in float32, the two
    elements around it weighted (ONNX Runtime's formula)."""
    for axis, (n, m, s) in enumerate(zip(sizes, outs, scales)):
        if n == m and s == 1.0:
            continue
        src = _COORDINATES[coordinates](np.arange(m, dtype=np.float32), np.float32(s), np.float32(n), np.float32(m))
        src = np.clip(src.astype(np.float32), 0, n - 1)
        low = np.floor(src)
        high_w = torch.from_numpy((src - low).astype(np.float32)).to(x.dtype).reshape([m] + [1] * (x.dim() - axis - 1))
        below = low.astype(np.int64)
        above = np.minimum(below + 1, n - 1)
        x = x.index_select(axis, torch.from_numpy(below)) * (1 - high_w) + \
            x.index_select(axis, torch.from_numpy(above)) * high_w
    return x


@register("Resize")
def _resize(node, xs, graph):
    a, x = node.attrs, xs[0]
    coordinates = a.get("coordinate_transformation_mode", "half_pixel")
    if a.get("mode", "nearest") == "linear" and coordinates in _COORDINATES:
        return _linear_resize(x, tuple(x.shape), _out_shape(node, graph), tuple(a["scales"]), coordinates)
    if a.get("mode", "nearest") != "nearest":
        raise GraphError(f"{node}: Resize mode {a['mode']!r} is not supported (nearest, linear)")
    nearest = a.get("nearest_mode", "round_prefer_floor")
    if coordinates not in _COORDINATES or nearest not in _NEAREST:
        raise GraphError(f"{node}: Resize coordinate_transformation_mode {coordinates!r} / nearest_mode "
                         f"{nearest!r} is not supported ({', '.join(_COORDINATES)} / {', '.join(_NEAREST)})")
    sizes, outs = tuple(x.shape), _out_shape(node, graph)
    indices = _resize_indices(sizes, outs, tuple(a["scales"]), coordinates, nearest)
    reps = _repeats(indices, sizes)
    if reps is not None:  # one copy: view every element as a 1-block, broadcast it r times, flatten
        shape = [d for n in sizes for d in (n, 1)]
        return x.reshape(shape).expand([d for n, r in zip(sizes, reps) for d in (n, r)]).reshape(outs)
    for axis, idx in enumerate(indices):
        if idx is not None:
            x = x.index_select(axis, torch.from_numpy(idx))
    return x


# --- the model ----------------------------------------------------------------------------

class TorchModel:
    """A Graph run node by node with torch operators under inference_mode, as an eager model runs.

    Constants become torch tensors once, here; `run` feeds numpy arrays and returns numpy arrays.
    """

    def __init__(self, graph: Graph, threads: int | None = None):
        if torch is None:
            raise GraphError("PyTorch is not installed; install it (pip install 'tensorgen[torch]') to run "
                             "the PyTorch peer")
        graph.validate()
        unsupported = [node for node in graph.nodes if node.op not in OPS]
        if unsupported:
            raise GraphError("; ".join(f"{node}: unsupported op" for node in unsupported)
                             + f" (the PyTorch peer supports {', '.join(sorted(OPS))})")
        self.graph = graph
        self.threads = threads  # torch's thread count is process-wide: run sets it each time it differs
        self.constants = {name: self._tensor(name, array) for name, array in graph.constants.items()}
        self._needed = {*graph.outputs, *(name for node in graph.nodes for name in node.inputs)}
        self._checked = False  # the first run checks every node's outputs against the graph's Values

    @staticmethod
    def _tensor(name: str, array: Any) -> Any:
        array = np.asarray(array)
        if not (array.flags.c_contiguous and array.flags.writeable):  # torch wants both; copy only then
            array = np.array(array, order="C")
        try:
            return torch.from_numpy(array)
        except TypeError as e:
            raise GraphError(f"value {name!r}: torch cannot hold dtype {array.dtype}: {e}") from None

    def _feed(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> dict[str, Any]:
        names = self.graph.inputs
        if isinstance(inputs, Mapping):
            missing = [n for n in names if n not in inputs]
            unknown = [n for n in inputs if n not in names]
            if missing or unknown:
                raise GraphError(f"graph {self.graph.name!r} inputs are {names}; missing {missing}, unknown {unknown}")
            arrays = [inputs[n] for n in names]
        else:
            arrays = list(inputs)
            if len(arrays) != len(names):
                raise GraphError(f"graph {self.graph.name!r} takes {len(names)} inputs {names}, got {len(arrays)}")
        feed = {}
        for name, array in zip(names, arrays):
            array, v = np.asarray(array), self.graph.value(name)
            if array.shape != v.shape or array.dtype != np.dtype(v.dtype):
                raise GraphError(f"input {name!r}: expected {v.dtype} {list(v.shape)}, got {array.dtype} "
                                 f"{list(array.shape)}")
            feed[name] = self._tensor(name, array)
        return feed

    def _call(self, node: Node, args: list[Any]) -> Sequence[Any]:
        try:
            out = OPS[node.op](node, args, self.graph)
        except GraphError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError) as e:
            raise GraphError(f"{node}: the PyTorch peer failed: {type(e).__name__}: {e}") from None
        return (out,) if isinstance(out, torch.Tensor) else out

    def _check(self, node: Node, outs: Sequence[Any]) -> None:
        for i, name in enumerate(node.outputs):
            if i >= len(outs):
                if name in self._needed:
                    raise GraphError(f"{node}: output {name!r} is used but the PyTorch peer computes only "
                                     f"{len(outs)} output(s)")
                continue
            v, t = self.graph.value(name), outs[i]
            if tuple(t.shape) != v.shape or t.dtype != _torch_dtype(v.dtype):
                raise GraphError(f"{node}: torch computed {name!r} as {t.dtype} {list(t.shape)}, the graph says "
                                 f"{v.dtype} {list(v.shape)}")

    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs (numpy arrays, in graph.outputs order) for inputs given as a list or by name."""
        env = {**self.constants, **self._feed(inputs)}
        if self.threads and torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        with torch.inference_mode():
            for node in self.graph.nodes:
                outs = self._call(node, [env[name] if name else None for name in node.inputs])
                if not self._checked:
                    self._check(node, outs)
                env.update(zip(node.outputs, outs))
        self._checked = True
        return [np.array(env[name].numpy(), order="C") for name in self.graph.outputs]
