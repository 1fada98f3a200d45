"""Normalizers for the windowed ops (Conv, ConvTranspose, pooling) and Resize: auto_pad, output_shape
and sizes are resolved here into explicit pads and scales, so the lowering never sees them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tensorgen.graph.frontend.normalize import OnnxNode, normalizer
from tensorgen.graph.ir import Node

_SAME = ("SAME_UPPER", "SAME_LOWER")


def _split_total(total: int, more_at_end: bool) -> tuple[int, int]:
    """(begin, end) padding summing to `total`; the odd unit goes to the end or the beginning."""
    small = total // 2
    return (small, total - small) if more_at_end else (total - small, small)


def _as_pads(pairs: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(b for b, _ in pairs) + tuple(e for _, e in pairs)


def _window_pads(n: OnnxNode, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilations: Sequence[int]) -> tuple[int, ...]:
    """Explicit pads of a Conv/pool: SAME makes the output ceil(in / stride) long."""
    auto = n.attrs.get("auto_pad", "NOTSET")
    if auto in _SAME:
        pairs = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            out = -(-size // s)
            pairs.append(_split_total(max(0, (out - 1) * s + (k - 1) * d + 1 - size), auto == "SAME_UPPER"))
        return _as_pads(pairs)
    if auto == "VALID":
        return (0,) * (2 * len(spatial))
    if auto != "NOTSET":
        raise n.error(f"auto_pad={auto!r} is not an ONNX auto_pad value")
    return n.ints("pads", 0, 2 * len(spatial))


def _transpose_pads(n: OnnxNode, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                    dilations: Sequence[int], output_padding: Sequence[int]) -> tuple[int, ...]:
    """Explicit pads of a ConvTranspose: output_shape (or SAME: in * stride) fixes the total padding,
    split as the ONNX spec says (the odd unit at the end for SAME_UPPER, at the beginning otherwise)."""
    auto, target = n.attrs.get("auto_pad", "NOTSET"), n.attrs.get("output_shape")
    if target is None and auto not in _SAME:
        return _window_pads(n, spatial, kernel, strides, dilations)
    target = target[-len(spatial):] if target is not None else [i * s for i, s in zip(spatial, strides)]
    pairs = []
    for size, k, s, d, extra, want in zip(spatial, kernel, strides, dilations, output_padding, target):
        total = s * (size - 1) + extra + (k - 1) * d + 1 - want  # negative: zeros beyond the full result
        pairs.append(_split_total(total, auto == "SAME_UPPER"))
    return _as_pads(pairs)


@normalizer("Conv", "ConvTranspose")
def _conv(n: OnnxNode) -> Node:
    x, w = n.shape(0), n.shape(1)
    rank = len(x) - 2
    kernel = n.ints("kernel_shape", 0, rank) if "kernel_shape" in n.attrs else tuple(w[2:])
    strides, dilations = n.ints("strides", 1, rank), n.ints("dilations", 1, rank)
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": int(n.attrs["group"])}
    if n.op == "Conv":
        attrs["pads"] = _window_pads(n, x[2:], kernel, strides, dilations)
    else:
        attrs["output_padding"] = n.ints("output_padding", 0, rank)
        attrs["pads"] = _transpose_pads(n, x[2:], kernel, strides, dilations, attrs["output_padding"])
        _check_transpose_output(n, x[2:], attrs)
    return n.make(attrs=attrs)


def _check_transpose_output(n: OnnxNode, spatial: Sequence[int], attrs: dict) -> None:
    """The explicit pads must give the inferred output size; ONNX shape inference and runtimes disagree
    on some combinations (SAME with output_padding), which are better refused than guessed."""
    rank, pads = len(spatial), attrs["pads"]
    implied = tuple(s * (i - 1) + o + (k - 1) * d + 1 - pads[a] - pads[rank + a] for a, (i, s, o, k, d) in enumerate(
        zip(spatial, attrs["strides"], attrs["output_padding"], attrs["kernel_shape"], attrs["dilations"])))
    if implied != n.out().shape[2:]:
        raise n.error(f"pads {pads} give spatial output {implied}, but ONNX shape inference gives "
                      f"{n.out().shape[2:]}; write explicit pads instead of auto_pad/output_shape")


def pooled_size(size: int, kernel: int, stride: int, dilation: int, begin: int, end: int, ceil: bool) -> int:
    """The output length of a pooling window sweep as ONNX Runtime (and PyTorch) computes it: with
    ceil_mode the last window may reach past the end padding, but it must start inside the input or
    the begin padding — a window wholly in the end padding would pool nothing."""
    span = size + begin + end - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil else span // stride) + 1
    return out - 1 if ceil and (out - 1) * stride >= size + begin else out


@normalizer("MaxPool", "AveragePool")
def _pool(n: OnnxNode) -> Node:
    """The output shape is computed here: ONNX shape inference lets a ceil_mode window start in the end
    padding (kernel 1, stride 2 on 2 elements: 2 outputs where ONNX Runtime gives 1)."""
    x = n.shape()
    kernel = tuple(int(k) for k in n.attrs["kernel_shape"])
    strides, dilations = n.ints("strides", 1, len(kernel)), n.ints("dilations", 1, len(kernel))
    pads = _window_pads(n, x[2:], kernel, strides, dilations)
    ceil = int(n.attrs["ceil_mode"])
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "pads": pads, "ceil_mode": ceil}
    if n.op == "AveragePool":
        attrs["count_include_pad"] = int(n.attrs["count_include_pad"])
    rank = len(kernel)
    spatial = tuple(pooled_size(*dims, bool(ceil)) for dims in zip(x[2:], kernel, strides, dilations, pads[:rank],
                                                                     pads[rank:]))
    if min(spatial, default=1) < 1:
        raise n.error(f"the window {list(kernel)} (dilations {list(dilations)}) is larger than the padded input "
                      f"{list(x[2:])} (pads {list(pads)})")
    out = n.out()
    n.state.values[out.name] = replace(out, shape=(*x[:2], *spatial))
    return n.make(attrs=attrs)


@normalizer("Resize")
def _resize(n: OnnxNode) -> Node:
    """Nearest-neighbour or linear; one scale per axis, from `scales` or as sizes / input size."""
    mode = n.attrs["mode"]
    if mode not in ("nearest", "linear"):
        raise n.error(f"mode {mode!r} is not supported (only 'nearest' and 'linear')")
    transform = n.attrs["coordinate_transformation_mode"]
    if transform == "tf_crop_and_resize":
        raise n.error("coordinate_transformation_mode 'tf_crop_and_resize' is not supported")
    shape = n.shape()
    axes = n.axis_list(n.attrs.get("axes", range(len(shape))), len(shape))
    scales, sizes = n.const(2), n.const(3)
    if scales is not None and scales.size:
        given = [float(s) for s in scales.tolist()]
    elif sizes is not None and sizes.size:
        given = [int(s) / shape[a] for s, a in zip(sizes.tolist(), axes)]
        policy = n.attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            given = [(min if policy == "not_larger" else max)(given)] * len(axes)
    else:
        raise n.error("needs a constant 'scales' or 'sizes' input")
    if len(given) != len(axes):
        raise n.error(f"{len(given)} scales/sizes for {len(axes)} axes")
    full = [1.0] * len(shape)
    for a, s in zip(axes, given):
        full[a] = s
    if mode == "linear" and n.attrs.get("antialias", 0) and min(full) < 1:
        raise n.error("antialiased linear downsampling is not supported")
    return n.make(attrs={"mode": mode, "scales": tuple(full), "coordinate_transformation_mode": transform,
                         "nearest_mode": n.attrs["nearest_mode"]})
