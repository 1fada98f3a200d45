"""Convolutions: 1-D/2-D/3-D (stride, padding, dilation, groups), transposed 2-D, capsule 2-D.

Layouts: data `NCW/NCHW/NCDHW` take kernels `OIW/OIHW/OIDHW` (O = out channels, I = in channels per
group); data `NWC/NHWC/NDHWC` take kernels `WIO/HWIO/DHWIO`. Padding is an int, one int per spatial
dim (symmetric), or 2 * ndim ints (befores, then afters); padded inputs are a separate `pad` stage.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import Expr, all_of, eq, select
from tensorgen.te.ops.common import (
    CONV1D,
    CONV2D,
    CONV2D_CAPSULE,
    CONV2D_TRANSPOSE,
    CONV3D,
    INJECTIVE,
    check_same_dtype,
    check_tensor,
    int_tuple,
    named,
    offset,
    padding_pairs,
    scaled,
)
from tensorgen.te.ops.transform import pad
from tensorgen.te.tensor import Tensor, compute, reduce_axis
from tensorgen.te.tensor import sum as te_sum

IntOrSeq = int | Sequence[int]
LAYOUTS = {1: ("NCW", "NWC"), 2: ("NCHW", "NHWC"), 3: ("NCDHW", "NDHWC")}
KERNEL_LAYOUTS = {
    "NCW": "OIW", "NWC": "WIO", "NCHW": "OIHW", "NHWC": "HWIO", "NCDHW": "OIDHW", "NDHWC": "DHWIO",
}


def is_channels_last(layout: str, nd: int, op: str) -> bool:
    """Whether `layout` (checked to be one of LAYOUTS[nd]) puts channels last."""
    if layout not in LAYOUTS[nd]:
        raise TensorExprError(f"{op}: unknown layout {layout!r}; expected one of {', '.join(LAYOUTS[nd])}")
    return layout.endswith("C")


def split_nc(values: Sequence, channels_last: bool) -> tuple:
    """(batch, channel, spatial...) of a shape or index tuple in either layout family."""
    if channels_last:
        return values[0], values[-1], tuple(values[1:-1])
    return values[0], values[1], tuple(values[2:])


def join_nc(n, c, spatial: Sequence, channels_last: bool) -> tuple:
    """The inverse of split_nc."""
    return (n, *spatial, c) if channels_last else (n, c, *spatial)


def pad_spatial(data: Tensor, before: Sequence[int], after: Sequence[int], channels_last: bool,
                name: str = "pad", value: float = 0.0) -> Tensor:
    """`data` padded on its spatial axes only (itself when there is no padding)."""
    if not any(before) and not any(after):
        return data
    return pad(data, join_nc(0, 0, before, channels_last), join_nc(0, 0, after, channels_last), value, name)


def conv_nd(data: Tensor, weight: Tensor, stride: IntOrSeq, padding: IntOrSeq, dilation: IntOrSeq,
            groups: int, layout: str, nd: int, op: str, name: str, tag: str) -> Tensor:
    """The convolution all the N-d variants share (see the module docstring for layouts)."""
    cl = is_channels_last(layout, nd, op)
    check_tensor(data, op, "data", ndim=nd + 2)
    check_tensor(weight, op, "weight", ndim=nd + 2)
    check_same_dtype(op, data, weight)
    batch, ci, size = split_nc(data.shape, cl)
    if cl:
        ksize, (cig, co) = weight.shape[:nd], weight.shape[nd:]
    else:
        (co, cig), ksize = weight.shape[:2], weight.shape[2:]
    strides = int_tuple(stride, nd, op, "stride")
    dils = int_tuple(dilation, nd, op, "dilation")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise TensorExprError(f"{op}: groups must be a positive integer, got {groups!r}")
    before, after = padding_pairs(padding, nd, op)
    if ci % groups or co % groups:
        raise TensorExprError(
            f"{op}: {groups} groups must divide both the {ci} input channels of {data.name} and the "
            f"{co} output channels of {weight.name}"
        )
    if ci // groups != cig:
        raise TensorExprError(
            f"{op}: channel mismatch: data {data.name}{list(data.shape)} ({layout}) has {ci} channels in "
            f"{groups} group(s) ({ci // groups} per group) but weight {weight.name}{list(weight.shape)} "
            f"({KERNEL_LAYOUTS[layout]}) expects {cig} input channels per group"
        )
    out_size = []
    for d in range(nd):
        padded = size[d] + before[d] + after[d]
        extent = dils[d] * (ksize[d] - 1) + 1
        if extent > padded:
            raise TensorExprError(
                f"{op}: kernel {list(ksize)} (dilated extent {extent} in spatial dim {d}) is larger than "
                f"the padded input ({padded} = {size[d]} + {before[d]} + {after[d]})"
            )
        out_size.append((padded - extent) // strides[d] + 1)
    src = pad_spatial(data, before, after, cl)
    ipg, opg = ci // groups, co // groups
    letters = [ch.lower() for ch in layout if ch not in "NC"]
    rc = reduce_axis(ipg, "rc") if ipg > 1 else None
    rks = [reduce_axis(k, f"r{letter}") for k, letter in zip(ksize, letters)]
    raxes = rks + [rc] if cl else [rc] + rks
    raxes = [r for r in raxes if r is not None]

    def body(*idx):
        n, o, osp = split_nc(idx, cl)
        base = 0
        if groups > 1:
            g = o if opg == 1 else o // opg
            base = scaled(g, ipg)
        chan = base if rc is None else (rc if groups == 1 else base + rc)
        pos = [scaled(x, s) + scaled(r, dl) for x, s, r, dl in zip(osp, strides, rks, dils)]
        wc = 0 if rc is None else rc
        widx = (*rks, wc, o) if cl else (o, wc, *rks)
        return te_sum(src[join_nc(n, chan, pos, cl)] * weight[widx], axis=raxes)

    names = join_nc("n", "co", letters, cl)
    attrs = {"layout": layout, "stride": strides, "padding": (before, after), "dilation": dils,
             "groups": groups}
    return compute(join_nc(batch, co, out_size, cl), named(body, names), name=name, tag=tag, attrs=attrs)


def conv1d(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
           dilation: IntOrSeq = 1, groups: int = 1, layout: str = "NWC", name: str = "conv1d") -> Tensor:
    return conv_nd(data, weight, stride, padding, dilation, groups, layout, 1, "conv1d", name, CONV1D)


def conv2d(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
           dilation: IntOrSeq = 1, groups: int = 1, layout: str = "NHWC", name: str = "conv2d") -> Tensor:
    """2-D convolution; `groups` covers group convolution and (groups = channels) depthwise."""
    return conv_nd(data, weight, stride, padding, dilation, groups, layout, 2, "conv2d", name, CONV2D)


def conv3d(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
           dilation: IntOrSeq = 1, groups: int = 1, layout: str = "NDHWC", name: str = "conv3d") -> Tensor:
    return conv_nd(data, weight, stride, padding, dilation, groups, layout, 3, "conv3d", name, CONV3D)


def depthwise_conv2d(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
                     dilation: IntOrSeq = 1, layout: str = "NHWC", name: str = "depthwise_conv2d") -> Tensor:
    """conv2d with one group per input channel; weight HWIO (kh, kw, 1, C*m) or OIHW (C*m, 1, kh, kw)."""
    check_tensor(data, "depthwise_conv2d", "data", ndim=4)
    channels = data.shape[-1] if is_channels_last(layout, 2, "depthwise_conv2d") else data.shape[1]
    return conv_nd(data, weight, stride, padding, dilation, channels, layout, 2, "depthwise_conv2d", name,
                   CONV2D)


def conv2d_transpose(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
                     output_padding: IntOrSeq = 0, layout: str = "NHWC",
                     name: str = "conv2d_transpose") -> Tensor:
    """Transposed 2-D convolution (the gradient of conv2d wrt its input), groups = 1.

    Weight: NCHW takes (CI, CO, kh, kw), NHWC takes (kh, kw, CI, CO). Output size per dim is
    `(in - 1) * stride - pad_before - pad_after + k + output_padding`. Where each stride divides its
    kernel size, output pixel y gathers from the k / stride taps of its phase (see _gathered); otherwise
    it is built as a `dilate_pad` stage (zeros between input pixels, `k - 1 - pad` around) and a
    stride-1 convolution with the flipped kernel, which multiplies stride^2 times as many terms, most of them zeros.
    """
    op = "conv2d_transpose"
    cl = is_channels_last(layout, 2, op)
    check_tensor(data, op, "data", ndim=4)
    check_tensor(weight, op, "weight", ndim=4)
    check_same_dtype(op, data, weight)
    batch, ci, size = split_nc(data.shape, cl)
    ksize, (wci, co) = (weight.shape[:2], weight.shape[2:]) if cl else (weight.shape[2:], weight.shape[:2])
    if wci != ci:
        raise TensorExprError(
            f"{op}: channel mismatch: data {data.name}{list(data.shape)} ({layout}) has {ci} channels but "
            f"weight {weight.name}{list(weight.shape)} ({'HWIO' if cl else 'IOHW'}) expects {wci}"
        )
    strides, before, after, opad, out_size = _transposed_geometry(op, size, ksize, stride, padding, output_padding)
    lo = [k - 1 - b for k, b in zip(ksize, before)]
    hi = [k - 1 - a + p for k, a, p in zip(ksize, after, opad)]
    dil = [(n - 1) * s + 1 for n, s in zip(size, strides)]
    dp_size = [lo[d] + dil[d] + hi[d] for d in range(2)]

    attrs = {"layout": layout, "stride": strides, "padding": (before, after), "output_padding": opad}
    if tuple(size) == (1, 1) and all(p <= a for p, a in zip(opad, after)):
        return _of_a_point(data, weight, before, out_size, cl, name, attrs)
    if gathers(strides, ksize):
        return _gathered(data, weight, strides, before, out_size, cl, name, attrs)

    def dilate_pad(*idx):
        n, c, sp = split_nc(idx, cl)
        conds, src = [], []
        for d, (i, s) in enumerate(zip(sp, strides)):
            j = offset(i, -lo[d])
            if lo[d] > 0:
                conds.append(i >= lo[d])
            if hi[d] > 0:
                conds.append(i < lo[d] + dil[d])
            if s > 1:
                conds.append(eq(j % s, 0))
            src.append(j if s == 1 else j // s)
        inner = data[join_nc(n, c, src, cl)]
        return select(all_of(*conds), inner, 0.0) if conds else inner

    dp = compute(join_nc(batch, ci, dp_size, cl), named(dilate_pad, join_nc("n", "c", "hw", cl)),
                 name="dilate_pad", tag=INJECTIVE)
    rc = reduce_axis(ci, "rc")
    rh, rw = reduce_axis(ksize[0], "rh"), reduce_axis(ksize[1], "rw")
    kh, kw = ksize

    def body(n: Expr, o: Expr, h: Expr, w: Expr) -> Expr:
        wv = weight[kh - 1 - rh, kw - 1 - rw, rc, o] if cl else weight[rc, o, kh - 1 - rh, kw - 1 - rw]
        axes = [rh, rw, rc] if cl else [rc, rh, rw]
        return te_sum(dp[join_nc(n, rc, (h + rh, w + rw), cl)] * wv, axis=axes)

    fn = named(lambda *idx: body(*_join_order(idx, cl)), join_nc("n", "co", "hw", cl))
    return compute(join_nc(batch, co, out_size, cl), fn, name=name, tag=CONV2D_TRANSPOSE, attrs=attrs)


def _transposed_geometry(op: str, size: Sequence[int], ksize: Sequence[int], stride: IntOrSeq, padding: IntOrSeq,
                         output_padding: IntOrSeq) -> tuple:
    """(strides, pads before, pads after, output_padding, output size) of a transposed 2-D conv, checked:
    each pad below its kernel size, each output_padding below its stride, a non-empty output."""
    strides = int_tuple(stride, 2, op, "stride")
    before, after = padding_pairs(padding, 2, op)
    opad = int_tuple(output_padding, 2, op, "output_padding", minimum=0)
    for d in range(2):
        if max(before[d], after[d]) > ksize[d] - 1:
            raise TensorExprError(f"{op}: padding {before[d]}/{after[d]} must be < kernel size {ksize[d]}")
        if opad[d] >= strides[d]:
            raise TensorExprError(f"{op}: output_padding {opad[d]} must be smaller than stride {strides[d]}")
    out_size = [(n - 1) * s - b - a + k + p for n, s, b, a, k, p in zip(size, strides, before, after, ksize, opad)]
    if min(out_size) < 1:
        raise TensorExprError(f"{op}: padding {padding!r} leaves an empty output ({out_size})")
    return strides, before, after, opad, out_size


def plain_transpose(kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int], output_padding: Sequence[int],
                    group: int, dilations: Sequence[int]) -> bool:
    """Whether conv2d_transpose (and, where it gathers, conv2d_transpose_col2im) takes an ONNX ConvTranspose:
    2-D, one group, no dilation, each pad below its kernel size and each output_padding below its stride."""
    return (len(kernel) == 2 and group == 1 and set(dilations) == {1}
            and all(p < k for p, k in zip(pads, 2 * tuple(kernel)))
            and all(p < s for p, s in zip(output_padding, strides)))


def gathers(strides: Sequence[int], ksize: Sequence[int]) -> bool:
    """Whether conv2d_transpose gathers (every stride > 1 divides its kernel size)."""
    return all(s > 1 and k % s == 0 for s, k in zip(strides, ksize))


def _gathered(data: Tensor, weight: Tensor, strides: Sequence[int], before: Sequence[int], out_size: Sequence[int],
              cl: bool, name: str, attrs: dict) -> Tensor:
    """Transposed conv as a gather: y = x * s + k - pad, so with q, r = divmod(y + pad, s) output y reads
    input q - t with weight tap r + t * s for t < k / s — no multiplications by inserted zeros."""
    batch, ci, size = split_nc(data.shape, cl)
    ksize = weight.shape[:2] if cl else weight.shape[2:]
    co = weight.shape[-1] if cl else weight.shape[1]
    taps = [k // s for k, s in zip(ksize, strides)]
    lo = [max(0, t - 1 - b // s) for t, b, s in zip(taps, before, strides)]
    hi = [max(0, (o - 1 + b) // s - (n - 1)) for o, b, s, n in zip(out_size, before, strides, size)]
    src = pad_spatial(data, lo, hi, cl)
    rc = reduce_axis(ci, "rc")
    th, tw = reduce_axis(taps[0], "th"), reduce_axis(taps[1], "tw")

    def body(n: Expr, o: Expr, h: Expr, w: Expr) -> Expr:
        (qh, rh), (qw, rw) = [((y + b) // s, (y + b) % s) for y, b, s in zip((h, w), before, strides)]
        pos = (qh - th + lo[0], qw - tw + lo[1])
        kh, kw = rh + th * strides[0], rw + tw * strides[1]
        wv = weight[kh, kw, rc, o] if cl else weight[rc, o, kh, kw]
        return te_sum(src[join_nc(n, rc, pos, cl)] * wv, axis=[th, tw, rc] if cl else [rc, th, tw])

    fn = named(lambda *idx: body(*_join_order(idx, cl)), join_nc("n", "co", "hw", cl))
    return compute(join_nc(batch, co, out_size, cl), fn, name=name, tag=CONV2D_TRANSPOSE, attrs=attrs)


def conv2d_transpose_col2im(data: Tensor, columns_weight: Tensor, kernel: Sequence[int], stride: IntOrSeq,
                            padding: IntOrSeq = 0, output_padding: IntOrSeq = 0,
                            name: str = "conv2d_transpose") -> Tensor:
    """Transposed 2-D convolution, NHWC, as a matmul and a gather (ONNX Runtime's col2im): first
    `columns[n, i, j, (kh, kw, m)] = sum_c data[n, i, j, c] * columns_weight[c, (kh, kw, m)]`, then output
    pixel y sums the k / stride columns whose taps land on it. The matmul vectorizes along kh * kw * M,
    where the direct form has only the M output channels (3 for an RGB image), and every weight tap is a
    plain matrix column, where the direct form picks taps by the output pixel's parity. Each stride must
    divide its kernel size; `columns_weight` is the (C, M, kh, kw) weight moved to (C, kh * kw * M).
    """
    op = "conv2d_transpose_col2im"
    check_tensor(data, op, "data", ndim=4)
    check_tensor(columns_weight, op, "columns_weight", ndim=2)
    check_same_dtype(op, data, columns_weight)
    batch, size, ci = data.shape[0], data.shape[1:3], data.shape[3]
    kh, kw = int_tuple(kernel, 2, op, "kernel")
    strides, before, after, opad, out_size = _transposed_geometry(op, size, (kh, kw), stride, padding, output_padding)
    if not gathers(strides, (kh, kw)):
        raise TensorExprError(f"{op}: each stride {list(strides)} must be > 1 and divide its kernel size {[kh, kw]}")
    co, rem = divmod(columns_weight.shape[1], kh * kw)
    if columns_weight.shape[0] != ci or rem:
        raise TensorExprError(f"{op}: columns_weight {list(columns_weight.shape)} is not ({ci}, {kh}*{kw}*M)")
    rc = reduce_axis(ci, "rc")

    def matmul(n: Expr, i: Expr, j: Expr, t: Expr) -> Expr:
        return te_sum(data[n, i, j, rc] * columns_weight[rc, t], axis=[rc])

    columns = compute((batch, *size, kh * kw * co), matmul, name=f"{name}_columns", tag=CONV2D_TRANSPOSE)
    taps = [k // s for k, s in zip((kh, kw), strides)]

    def gather(n: Expr, h: Expr, w: Expr, o: Expr) -> Expr:
        (qh, rh), (qw, rw) = [(offset(y, b) // s, offset(y, b) % s) for y, b, s in zip((h, w), before, strides)]
        total = None
        for th in range(taps[0]):
            for tw in range(taps[1]):
                i, j = offset(qh, -th), offset(qw, -tw)
                tap = ((rh + th * strides[0]) * kw + rw + tw * strides[1]) * co + o
                term = select(all_of(i >= 0, i < size[0], j >= 0, j < size[1]), columns[n, i, j, tap], 0.0)
                total = term if total is None else total + term
        return total

    attrs = {"layout": "NHWC", "stride": strides, "padding": (before, after), "output_padding": opad}
    return compute((batch, *out_size, co), named(gather, ("n", "h", "w", "co")), name=name, tag=INJECTIVE,
                   attrs=attrs)


def _of_a_point(data: Tensor, weight: Tensor, before: Sequence[int], out_size: Sequence[int], cl: bool, name: str,
                attrs: dict) -> Tensor:
    """Transposed conv of a 1x1 input (DCGAN's latent): output pixel y is the input times weight tap
    y + pad, a matmul over the channels. Padding it to the kernel's size multiplied k^2 - 1 zeros per term."""
    batch, ci, _ = split_nc(data.shape, cl)
    co = weight.shape[-1] if cl else weight.shape[1]
    rc = reduce_axis(ci, "rc")

    def body(n: Expr, o: Expr, h: Expr, w: Expr) -> Expr:
        kh, kw = offset(h, before[0]), offset(w, before[1])
        wv = weight[kh, kw, rc, o] if cl else weight[rc, o, kh, kw]
        return te_sum(data[join_nc(n, rc, (0, 0), cl)] * wv, axis=[rc])

    fn = named(lambda *idx: body(*_join_order(idx, cl)), join_nc("n", "co", "hw", cl))
    return compute(join_nc(batch, co, out_size, cl), fn, name=name, tag=CONV2D_TRANSPOSE, attrs=attrs)


def _join_order(idx: tuple, cl: bool) -> tuple:
    n, c, sp = split_nc(idx, cl)
    return (n, c, *sp)


def conv2d_capsule(data: Tensor, weight: Tensor, stride: IntOrSeq = 1, padding: IntOrSeq = 0,
                   name: str = "conv2d_capsule") -> Tensor:
    """Capsule convolution in Ansor's NHWIJC layout (matrix capsules with EM routing).

    data (N, H, W, I, K, CI), weight (kh, kw, K, J, CI, CO) -> out (N, OH, OW, I, J, CO) with
    `out[n,h,w,i,j,co] = sum_{rh,rw,k,rc} pad(data)[n, h*s+rh, w*s+rw, i, k, rc] * weight[rh,rw,k,j,rc,co]`.
    """
    op = "conv2d_capsule"
    check_tensor(data, op, "data", ndim=6)
    check_tensor(weight, op, "weight", ndim=6)
    check_same_dtype(op, data, weight)
    batch, h_in, w_in, cap_i, cap_k, ci = data.shape
    kh, kw, wcap_k, cap_j, wci, co = weight.shape
    if wci != ci or wcap_k != cap_k:
        raise TensorExprError(
            f"{op}: data {data.name}{list(data.shape)} (N, H, W, I, K, CI) and weight "
            f"{weight.name}{list(weight.shape)} (kh, kw, K, J, CI, CO) disagree on K or CI"
        )
    strides = int_tuple(stride, 2, op, "stride")
    before, after = padding_pairs(padding, 2, op)
    out_size = []
    for d, (n, k) in enumerate(((h_in, kh), (w_in, kw))):
        padded = n + before[d] + after[d]
        if k > padded:
            raise TensorExprError(f"{op}: kernel {k} is larger than the padded input {padded} (dim {d})")
        out_size.append((padded - k) // strides[d] + 1)
    src = data
    if any(before) or any(after):
        src = pad(data, (0, *before, 0, 0, 0), (0, *after, 0, 0, 0))
    rh, rw = reduce_axis(kh, "rh"), reduce_axis(kw, "rw")
    rk, rc = reduce_axis(cap_k, "cap_k"), reduce_axis(ci, "rc")
    sh, sw = strides

    def body(n, h, w, cap_i, cap_j, co):
        x = src[n, scaled(h, sh) + rh, scaled(w, sw) + rw, cap_i, rk, rc]
        return te_sum(x * weight[rh, rw, rk, cap_j, rc, co], axis=[rh, rw, rk, rc])

    attrs = {"layout": "NHWIJC", "stride": strides, "padding": (before, after)}
    return compute((batch, *out_size, cap_i, cap_j, co), body, name=name, tag=CONV2D_CAPSULE, attrs=attrs)
