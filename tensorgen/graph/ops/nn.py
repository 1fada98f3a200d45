"""Lowerings of the compute-intensive ops: Conv, ConvTranspose (N-d, groups, dilation), Gemm, MatMul.

ONNX layouts are channels-first (NCW / NCHW / NCDHW data, OIW / OIHW / OIDHW kernels), so the te
convolutions are called with those layouts. A bias or a Gemm epilogue is its own broadcast stage after
the compute stage, the shape the fusion pass and the sketch rules expect.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.graph.ir import Node
from tensorgen.graph.ops.base import FLOATS, Args, broadcast_index, lowering, operand
from tensorgen.te import expr as E
from tensorgen.te.ops import broadcast_shape, matmul
from tensorgen.te.ops.common import BATCH_MATMUL, BROADCAST, CONV1D, CONV2D, CONV3D, INJECTIVE, MATMUL, named, offset
from tensorgen.te.ops.conv import conv2d_transpose, conv2d_transpose_col2im, conv_nd, gathers, plain_transpose
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import sum as te_sum

LAYOUTS = {1: "NCW", 2: "NCHW", 3: "NCDHW"}
CONV_TAGS = {1: CONV1D, 2: CONV2D, 3: CONV3D}


def _geometry(args: Args, x: Tensor, w: Tensor,
              channels_last: bool = False) -> tuple[int, Sequence[int], Sequence[int], Sequence[int], int]:
    """(spatial rank, strides, dilations, pads, group), checked against the tensors."""
    nd = x.ndim - 2
    if nd not in LAYOUTS or w.ndim != x.ndim:
        raise args.error(f"data {list(x.shape)} and weight {list(w.shape)} are not a 1-D, 2-D or 3-D convolution")
    kernel = tuple(args.attr("kernel_shape"))
    if kernel != (w.shape[:nd] if channels_last else w.shape[2:]):
        raise args.error(f"kernel_shape {list(kernel)} disagrees with the weight shape {list(w.shape)}")
    return nd, args.attr("strides"), args.attr("dilations"), args.attr("pads"), int(args.attr("group"))


def _with_bias(args: Args, y: Tensor, channel_axis: int = 1) -> Tensor:
    """`y + B[channel]` when the optional bias input is present."""
    if not args.present(2):
        return y
    bias = args.tensor(2)
    if bias.shape != (y.shape[channel_axis],):
        raise args.error(f"bias {list(bias.shape)} does not match the {y.shape[channel_axis]} output channels")
    return compute(y.shape, lambda *idx: y[idx] + bias[idx[channel_axis]], name=args.name("bias"), tag=BROADCAST)


@lowering("Conv", kind="compute", dtypes=FLOATS)
def _conv(node: Node, args: Args) -> list[Tensor]:
    """ONNX's channels-first Conv, or with attribute `layout` (set by graph.layout.to_channels_last) a
    channels-last one: data (N, spatial..., C), weight (kernel..., C/group, M)."""
    x, w = args.tensor(0), args.tensor(1)
    layout = node.attrs.get("layout")
    channels_last = layout is not None
    nd, strides, dilations, pads, group = _geometry(args, x, w, channels_last)
    if layout is None:
        layout = LAYOUTS[nd]
    y = conv_nd(x, w, strides, pads, dilations, group, layout, nd, "Conv", args.name(), CONV_TAGS[nd])
    return [_with_bias(args, y, nd + 1 if channels_last else 1)]


@lowering("ConvTranspose", kind="compute", dtypes=FLOATS)
def _conv_transpose(node: Node, args: Args) -> list[Tensor]:
    """A convolution of the stride-dilated, padded input with the flipped kernel.

    Stages: `<name>_dilate` (input pixels `stride` apart with `dilation * (k - 1) - pad` zeros around,
    cropping where a pad is larger), `<name>_weight` (the kernel flipped and regrouped into OI... order),
    then a stride-1 grouped, dilated convolution. A 2-D one without groups or dilation whose strides
    divide the kernel (DCGAN's k4 s2) is te's conv2d_transpose instead, which gathers without the zeros;
    so is a channels-last one (attribute `layout`, set by graph.layout): data NHWC, weight (kh, kw, C, M),
    or with `method` col2im te's conv2d_transpose_col2im, weight (C, kh * kw * M).
    """
    x, w = args.tensor(0), args.tensor(1)
    layout = node.attrs.get("layout")
    if node.attrs.get("method") == "col2im":  # graph.layout's choice where the strides divide the kernel
        y = conv2d_transpose_col2im(x, w, args.attr("kernel_shape"), args.attr("strides"), tuple(args.attr("pads")),
                                    tuple(args.attr("output_padding")), name=args.name())
        return [_with_bias(args, y, 3)]
    nd, strides, dilations, pads, group = _geometry(args, x, w, layout is not None)
    out_pad = args.attr("output_padding")
    if layout is not None:
        if nd != 2 or group != 1 or set(dilations) != {1}:
            raise args.error(f"a {layout} ConvTranspose is 2-D without groups or dilation")
        y = conv2d_transpose(x, w, strides, tuple(pads), tuple(out_pad), layout=layout, name=args.name())
        return [_with_bias(args, y, 3)]
    size, kernel = x.shape[2:], w.shape[2:]
    ci, opg = x.shape[1], w.shape[1]
    if w.shape[0] != ci or ci % group:
        raise args.error(f"weight {list(w.shape)} does not match {ci} input channels in {group} group(s)")
    if plain_transpose(kernel, strides, pads, out_pad, group, dilations) and gathers(strides, kernel):
        y = conv2d_transpose(x, w, strides, tuple(pads), tuple(out_pad), layout="NCHW", name=args.name())
        return [_with_bias(args, y)]
    ipg = ci // group
    lo = [dl * (k - 1) - b for dl, k, b in zip(dilations, kernel, pads[:nd])]
    hi = [dl * (k - 1) - e + p for dl, k, e, p in zip(dilations, kernel, pads[nd:], out_pad)]
    spread = [(n - 1) * s + 1 for n, s in zip(size, strides)]
    dilated = tuple(lo[d] + spread[d] + hi[d] for d in range(nd))

    def dilate(n, c, *sp):
        conds, src = [], []
        for d, i in enumerate(sp):
            j = offset(i, -lo[d])
            if lo[d] > 0:
                conds.append(i >= lo[d])
            if hi[d] > 0:
                conds.append(i < lo[d] + spread[d])
            if strides[d] > 1:
                conds.append(E.eq(j % strides[d], 0))
            src.append(j // strides[d] if strides[d] > 1 else j)
        inner = x[(n, c, *src)]
        return E.select(E.all_of(*conds), inner, 0.0) if conds else inner

    axes = [f"i{d}" for d in range(nd)]
    dp = x if not any(lo) and not any(hi) and set(strides) == {1} else compute(
        (x.shape[0], ci, *dilated), named(dilate, ["n", "c", *axes]), name=args.name("dilate"), tag=INJECTIVE)

    def flipped(o, c, *ks):
        src_c, src_o = (c, o) if group == 1 else ((o // opg) * ipg + c, o % opg)
        return w[(src_c, src_o, *(k - 1 - r for k, r in zip(kernel, ks)))]

    wt = compute((opg * group, ipg, *kernel), named(flipped, ["o", "c", *(f"k{d}" for d in range(nd))]),
                 name=args.name("weight"), tag=INJECTIVE)
    tag = f"conv{nd}d_transpose"
    y = conv_nd(dp, wt, 1, 0, dilations, group, LAYOUTS[nd], nd, "ConvTranspose", args.name(), tag)
    return [_with_bias(args, y)]


@lowering("Gemm", kind="compute")
def _gemm(node: Node, args: Args) -> list[Tensor]:
    """`alpha * A' B' + beta * C`: a matmul stage, then an epilogue stage where alpha, beta or C need one."""
    a, b = args.tensor(0), args.tensor(1)
    if a.ndim != 2 or b.ndim != 2:
        raise args.error(f"A {list(a.shape)} and B {list(b.shape)} must be matrices")
    alpha, beta = float(args.attr("alpha")), float(args.attr("beta"))
    core = matmul(a, b, bool(args.attr("transA")), bool(args.attr("transB")), name=args.name())
    with_c = args.present(2) and beta != 0.0
    if alpha == 1.0 and not with_c:
        return [core]
    dtype = core.dtype
    c = operand(args, 2, dtype) if with_c else None

    def epilogue(i, j):
        v = core[i, j] if alpha == 1.0 else core[i, j] * args.literal(alpha, dtype)
        if c is None:
            return v
        cv = c((i, j))
        return v + (cv if beta == 1.0 else cv * args.literal(beta, dtype))

    return [compute(core.shape, epilogue, name=args.name("epilogue"), tag=BROADCAST)]


def _batch_index(t: Tensor, n: int, batch: Sequence[E.Expr]) -> tuple:
    """Index of `t`'s `n` leading (batch) dims, broadcast against the output's batch index."""
    return broadcast_index(t.shape[:n], batch) if n > 0 else ()


@lowering("MatMul", kind="compute")
def _matmul(node: Node, args: Args) -> list[Tensor]:
    """NumPy matmul: 1-D operands gain (and lose) a unit dim, batch dims broadcast."""
    a, b = args.tensor(0), args.tensor(1)
    ka, kb = a.shape[-1], b.shape[0] if b.ndim == 1 else b.shape[-2]
    if ka != kb:
        raise args.error(f"inner dimensions differ: {list(a.shape)} @ {list(b.shape)}")
    rows, cols = a.ndim >= 2, b.ndim >= 2
    batch_shape = broadcast_shape(a.shape[:-2], b.shape[:-2])
    args.expect_shape(0, batch_shape + a.shape[-2:-1] + b.shape[-1:] if cols else batch_shape + a.shape[-2:-1])
    nbatch = len(batch_shape)
    k = reduce_axis(ka, "k")

    def body(*idx):
        batch = idx[:nbatch]
        ai = _batch_index(a, a.ndim - 2, batch) + ((idx[nbatch], k) if rows else (k,))
        bi = _batch_index(b, b.ndim - 2, batch) + ((k, idx[-1]) if cols else (k,))
        return te_sum(a[ai] * b[bi], axis=k)

    tag = BATCH_MATMUL if nbatch else MATMUL
    return [compute(args.out_shape(), body, name=args.name(), tag=tag)]

