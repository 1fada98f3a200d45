"""Converters of ATen's data movement: views, permutes, concatenation, slicing, padding, indexing, fills."""

from __future__ import annotations

import numpy as np

from tensorgen.graph.frontend.torch_ops.core import (
    INT64_MAX,
    Converter,
    ConvertError,
    Emitter,
    Shape,
    arg,
    converts,
    operand,
    single,
)


@converts("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view_copy")
def _view(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("Reshape", [operand(cx, args[0], dtype)], shapes=[(shape, dtype)])[0]


@converts("aten.as_strided")
def _as_strided(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """A view reading its input's storage at offset + sum(index * stride): a Reshape where that is row-major order
    (torch.export writes one after a mean that keeps its axes: FocalNet's pooler), else a Gather of the flattened
    input. Only an input that owns its storage is read so; a view into another value's storage is refused."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    if not cx.owns_storage(x):
        raise ConvertError("its input is a view into another tensor's storage; call .contiguous() before it")
    stride = [int(s) for s in arg(args, kwargs, 2, "stride")]
    offset = int(arg(args, kwargs, 3, "storage_offset", 0) or 0)
    index = offset + sum(np.arange(n).reshape([-1 if a == d else 1 for a in range(len(shape))]) * s
                         for d, (n, s) in enumerate(zip(shape, stride)))
    index = np.broadcast_to(np.asarray(index, np.int64), shape)
    numel = int(np.prod(cx.value(x).shape))
    if index.size and (index.min() < 0 or index.max() >= numel):
        raise ConvertError(f"reads storage position {int(index.max())} of a tensor of {numel} elements")
    if index.size == numel and (index.ravel() == np.arange(numel)).all():
        return cx.emit("Reshape", [x], shapes=[(shape, dtype)])[0]
    (flat,) = cx.emit("Reshape", [x], shapes=[((numel,), dtype)])
    return cx.emit("Gather", [flat, cx.constant(index)], {"axis": 0}, shapes=[(shape, dtype)])[0]


@converts("aten.expand")
def _expand(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    if cx.value(x).shape == shape:
        return cx.emit("Identity", [x], shapes=[(shape, dtype)])[0]
    return cx.emit("Expand", [x], shapes=[(shape, dtype)])[0]


@converts("aten.repeat")
def _repeat(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """x.repeat(sizes): x with leading axes of 1 to the length of `sizes`, tiled."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    sizes = cx.value(x).shape
    lifted = (1,) * (len(shape) - len(sizes)) + tuple(sizes)
    if lifted != sizes:
        (x,) = cx.emit("Reshape", [x], shapes=[(lifted, dtype)])
    return cx.emit("Tile" if lifted != shape else "Identity", [x], shapes=[(shape, dtype)])[0]


@converts("aten.flip")
def _flip(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """A Slice from the last element through the first, step -1, on each axis in `dims`."""
    shape, dtype = single(shapes)
    axes = sorted({int(d) % len(shape) for d in arg(args, kwargs, 1, "dims", [])})
    x = operand(cx, args[0], dtype)
    if not axes:
        return x
    consts = [np.array(v, dtype=np.int64) for v in ([-1] * len(axes), [-INT64_MAX - 1] * len(axes), axes,
                                                    [-1] * len(axes))]
    return cx.emit("Slice", [x, *map(cx.tensor, consts)], shapes=[(shape, dtype)])[0]


@converts("aten.permute", "aten.t", "aten.transpose")
def _permute(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    rank = len(cx.value(x).shape)
    if len(args) == 1:  # t
        perm = list(range(rank))[::-1]
    elif len(args) == 3:  # transpose(x, dim0, dim1)
        perm = list(range(rank))
        a, b = (int(d) % rank for d in args[1:3])
        perm[a], perm[b] = perm[b], perm[a]
    else:
        perm = [int(d) % rank for d in args[1]]
    return cx.emit("Transpose", [x], {"perm": perm}, shapes=[(shape, dtype)])[0]


@converts("aten.unsqueeze")
def _unsqueeze(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    axes = cx.tensor(np.array([int(args[1]) % len(shape)], dtype=np.int64))
    return cx.emit("Unsqueeze", [operand(cx, args[0], dtype), axes], shapes=[(shape, dtype)])[0]


@converts("aten.squeeze")
def _squeeze(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """PyTorch ignores a squeezed axis whose size is not 1; ONNX refuses it, so only size-1 axes are named."""
    shape, dtype = single(shapes)
    x = operand(cx, args[0], dtype)
    before = cx.value(x).shape
    dims = arg(args, kwargs, 1, "dim")
    dims = range(len(before)) if dims is None else (dims if isinstance(dims, (list, tuple)) else [dims])
    axes = sorted({int(d) % max(len(before), 1) for d in dims if before and before[int(d)] == 1})
    if not axes:
        return cx.emit("Identity", [x], shapes=[(shape, dtype)])[0]
    return cx.emit("Squeeze", [x, cx.tensor(np.array(axes, dtype=np.int64))], shapes=[(shape, dtype)])[0]


@converts("aten.cat", "aten.concat")
def _cat(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    parts = [operand(cx, t, dtype) for t in args[0]]
    parts = [p for p in parts if cx.value(p).size] or parts[:1]  # PyTorch skips empty tensors
    axis = int(arg(args, kwargs, 1, "dim", 0))
    if len(parts) == 1:
        return cx.emit("Identity", parts, shapes=[(shape, dtype)])[0]
    return cx.emit("Concat", parts, {"axis": axis}, shapes=[(shape, dtype)])[0]


@converts("aten.slice")
def _slice(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    dim, start, end, step = (arg(args, kwargs, i, n, d) for i, n, d in
                             ((1, "dim", 0), (2, "start", None), (3, "end", None), (4, "step", 1)))
    consts = [np.array([v], dtype=np.int64) for v in (start if start is not None else 0,
                                                       min(end, INT64_MAX) if end is not None else INT64_MAX,
                                                       dim, step)]
    return cx.emit("Slice", [operand(cx, args[0], dtype), *map(cx.tensor, consts)], shapes=[(shape, dtype)])[0]


@converts("aten.select")
def _select(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    index = cx.tensor(np.array(int(args[2]), dtype=np.int64))
    return cx.emit("Gather", [operand(cx, args[0], dtype), index], {"axis": int(args[1])}, shapes=[(shape, dtype)])[0]


@converts("aten.split_with_sizes", "aten.split")
def _split(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> tuple:
    dtype = shapes[0][1]
    axis = int(arg(args, kwargs, 2, "dim", 0))
    return tuple(cx.emit("Split", [operand(cx, args[0], dtype)], {"axis": axis}, shapes=shapes))


@converts("aten.constant_pad_nd")
def _pad(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """PyTorch lists (begin, end) pairs from the last axis backwards; ONNX all begins, then all ends."""
    shape, dtype = single(shapes)
    pad = [int(p) for p in args[1]]
    rank = len(shape)
    if any(p < 0 for p in pad):
        raise ConvertError(f"negative padding {pad} (cropping) is not supported")
    pads = [0] * (2 * rank)
    for k in range(len(pad) // 2):
        axis = rank - 1 - k
        pads[axis], pads[rank + axis] = pad[2 * k], pad[2 * k + 1]
    value = np.array(float(arg(args, kwargs, 2, "value", 0.0)), dtype=dtype)
    inputs = [operand(cx, args[0], dtype), cx.tensor(np.array(pads, dtype=np.int64)), cx.tensor(value)]
    return cx.emit("Pad", inputs, {"mode": "constant"}, shapes=[(shape, dtype)])[0]


def _edge_pad(mode: str) -> Converter:
    """reflection_pad*d / replication_pad*d: the last axes padded by (begin, end) pairs, last axis first."""
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = single(shapes)
        rank, pad = len(shape), [int(p) for p in args[1]]
        pads = [0] * (2 * rank)
        for k in range(len(pad) // 2):
            pads[rank - 1 - k], pads[2 * rank - 1 - k] = pad[2 * k], pad[2 * k + 1]
        inputs = [operand(cx, args[0], dtype), cx.tensor(np.array(pads, dtype=np.int64))]
        return cx.emit("Pad", inputs, {"mode": mode}, shapes=[(shape, dtype)])[0]

    return convert


for _n in (1, 2, 3):
    converts(f"aten.reflection_pad{_n}d")(_edge_pad("reflect"))
    converts(f"aten.replication_pad{_n}d")(_edge_pad("edge"))


@converts("aten.embedding")
def _embedding(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("Gather", [operand(cx, args[0], dtype), cx.tensor(args[1])], {"axis": 0},
                   shapes=[(shape, dtype)])[0]


@converts("aten.index_select")
def _index_select(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    shape, dtype = single(shapes)
    return cx.emit("Gather", [operand(cx, args[0], dtype), cx.tensor(args[2])], {"axis": int(args[1])},
                   shapes=[(shape, dtype)])[0]


def _filled(fill: float | None) -> Converter:
    """`*_like` depends on its input's shape alone, which is static: a constant (`fill` None: full_like's)."""
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = single(shapes)
        value = arg(args, kwargs, 1, "fill_value") if fill is None else fill
        return cx.constant(np.full(shape, value, dtype=dtype), "filled")

    return convert


converts("aten.full_like")(_filled(None))
converts("aten.zeros_like")(_filled(0.0))
converts("aten.ones_like")(_filled(1.0))


@converts("aten.gather")
def _gather(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
    """torch.gather(x, dim, index): ONNX GatherElements (index no larger than x off `dim`, as in both)."""
    shape, dtype = single(shapes)
    index = cx.tensor(arg(args, kwargs, 2, "index"))
    return cx.emit("GatherElements", [operand(cx, args[0], dtype), index], {"axis": int(args[1])},
                   shapes=[(shape, dtype)])[0]
