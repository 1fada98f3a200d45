"""Independent NumPy implementations of the operator library (not derived from the TE definitions).

Convolutions use explicit `np.pad` plus sliding windows and einsum (grouped by reshaping);
the transposed convolution scatters each input pixel; everything computes in float64.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _f64(*arrays):
    return [np.asarray(a, dtype=np.float64) for a in arrays]


def _pads(padding, nd):
    """int | nd ints (symmetric) | 2*nd ints (befores, afters) -> (befores, afters)."""
    p = (padding,) * nd if isinstance(padding, int) else tuple(padding)
    if len(p) == nd:
        p = p + p
    return p[:nd], p[nd:]


def _tuple(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def pad(x, before, after=None, value=0.0):
    after = before if after is None else after
    return np.pad(np.asarray(x), list(zip(before, after)), constant_values=value)


def _to_channels_first(x, w, channels_last):
    if not channels_last:
        return x, w
    return np.moveaxis(x, -1, 1), np.moveaxis(w, (-1, -2), (0, 1))  # (k.., I, O) -> (O, I, k..)


def conv(x, w, stride=1, padding=0, dilation=1, groups=1, layout="NHWC"):
    """N-d grouped convolution; layouts as in tensorgen.te.ops.conv (NC... with OI..., N...C with ...IO)."""
    x, w = _f64(x, w)
    nd = x.ndim - 2
    cl = layout.endswith("C")
    x, w = _to_channels_first(x, w, cl)
    stride, dilation = _tuple(stride, nd), _tuple(dilation, nd)
    before, after = _pads(padding, nd)
    xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(before, after)))
    ksize = w.shape[2:]
    extent = [d * (k - 1) + 1 for k, d in zip(ksize, dilation)]
    win = sliding_window_view(xp, extent, axis=tuple(range(2, 2 + nd)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)
              + tuple(slice(None, None, d) for d in dilation)]
    n, c = x.shape[:2]
    o = w.shape[0]
    out_size = win.shape[2:2 + nd]
    win = win.reshape(n, groups, c // groups, *out_size, *ksize)
    wg = w.reshape(groups, o // groups, c // groups, *ksize)
    sp, ks = "xyz"[:nd], "uvw"[:nd]
    y = np.einsum(f"ngc{sp}{ks},gmc{ks}->ngm{sp}", win, wg).reshape(n, o, *out_size)
    return np.moveaxis(y, 1, -1) if cl else y


def conv2d_transpose(x, w, stride=1, padding=0, output_padding=0, layout="NHWC"):
    """Scatter form: input pixel (h, w) adds x * W[:, :, a, b] at output (h*s + a - pad, w*s + b - pad)."""
    x, w = _f64(x, w)
    cl = layout == "NHWC"
    if cl:
        x, w = np.moveaxis(x, -1, 1), np.moveaxis(w, (0, 1), (2, 3))  # (kh, kw, I, O) -> (I, O, kh, kw)
    sh, sw = _tuple(stride, 2)
    (pt, pl), (pb, pr) = _pads(padding, 2)
    oph, opw = _tuple(output_padding, 2)
    n, _, h, wd = x.shape
    co, kh, kw = w.shape[1:]
    full = np.zeros((n, co, (h - 1) * sh + kh + oph, (wd - 1) * sw + kw + opw))
    for a in range(kh):
        for b in range(kw):
            full[:, :, a:a + (h - 1) * sh + 1:sh, b:b + (wd - 1) * sw + 1:sw] += np.einsum(
                "nchw,co->nohw", x, w[:, :, a, b])
    oh = (h - 1) * sh - pt - pb + kh + oph
    ow = (wd - 1) * sw - pl - pr + kw + opw
    y = full[:, :, pt:pt + oh, pl:pl + ow]
    return np.moveaxis(y, 1, -1) if cl else y


def conv2d_capsule(x, w, stride=1, padding=0):
    x, w = _f64(x, w)
    sh, sw = _tuple(stride, 2)
    before, after = _pads(padding, 2)
    xp = np.pad(x, [(0, 0), *zip(before, after), (0, 0), (0, 0), (0, 0)])
    kh, kw = w.shape[:2]
    win = sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::sh, ::sw]  # n h w i k c a b
    return np.einsum("nhwikcab,abkjco->nhwijo", win, w)


def matrix_norm(a):
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 2:
        return np.array([np.linalg.norm(a)])
    return np.linalg.norm(a, axis=(1, 2))


def matmul(a, b, transpose_a=False, transpose_b=False):
    a, b = _f64(a, b)
    return (a.T if transpose_a else a) @ (b.T if transpose_b else b)


def batch_matmul(a, b, transpose_b=False):
    a, b = _f64(a, b)
    return a @ (np.swapaxes(b, -1, -2) if transpose_b else b)


def dense(x, w, bias=None):
    x, w = _f64(x, w)
    y = x @ w.T
    return y if bias is None else y + bias


def _pool_windows(x, kernel, stride, padding, layout, value):
    x = np.asarray(x, dtype=np.float64)
    cl = layout == "NHWC"
    if cl:
        x = np.moveaxis(x, -1, 1)
    before, after = _pads(padding, 2)
    stride = _tuple(kernel if stride is None else stride, 2)
    xp = np.pad(x, [(0, 0), (0, 0), *zip(before, after)], constant_values=value)
    win = sliding_window_view(xp, _tuple(kernel, 2), axis=(2, 3))[:, :, ::stride[0], ::stride[1]]
    return win, cl


def max_pool2d(x, kernel, stride=None, padding=0, layout="NHWC"):
    win, cl = _pool_windows(x, kernel, stride, padding, layout, -np.inf)
    y = win.max(axis=(-1, -2))
    return np.moveaxis(y, 1, -1) if cl else y


def avg_pool2d(x, kernel, stride=None, padding=0, layout="NHWC", count_include_pad=False):
    win, cl = _pool_windows(x, kernel, stride, padding, layout, 0.0)
    total = win.sum(axis=(-1, -2))
    if count_include_pad:
        y = total / math.prod(_tuple(kernel, 2))
    else:
        ones, _ = _pool_windows(np.ones(np.shape(x)), kernel, stride, padding, layout, 0.0)
        y = total / ones.sum(axis=(-1, -2))
    return np.moveaxis(y, 1, -1) if cl else y


def global_avg_pool2d(x, layout="NHWC"):
    axes = (1, 2) if layout == "NHWC" else (2, 3)
    return np.asarray(x, dtype=np.float64).mean(axis=axes, keepdims=True)


def softmax(x, axis=-1):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_norm(x, gamma=None, beta=None, epsilon=1e-5):
    x = np.asarray(x, dtype=np.float64)
    y = (x - x.mean(axis=-1, keepdims=True)) / np.sqrt(x.var(axis=-1, keepdims=True) + epsilon)
    if gamma is not None:
        y = y * gamma
    return y if beta is None else y + beta


def batch_norm(x, mean, var, gamma, beta, axis=-1, epsilon=1e-5):
    x = np.asarray(x, dtype=np.float64)
    shape = [1] * x.ndim
    shape[axis] = -1

    def per_channel(v):
        return np.asarray(v, dtype=np.float64).reshape(shape)

    scale = per_channel(gamma) / np.sqrt(per_channel(var) + epsilon)
    return (x - per_channel(mean)) * scale + per_channel(beta)


def relu(x):
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


def relu6(x):
    return np.minimum(relu(x), 6.0)


def clip(x, lo, hi):
    return np.clip(np.asarray(x, dtype=np.float64), lo, hi)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def tanh(x):
    return np.tanh(np.asarray(x, dtype=np.float64))


def gelu(x):
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def reduce(kind, x, axis=None, keepdims=False):
    fn = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[kind]
    y = fn(np.asarray(x, dtype=np.float64), axis=None if axis is None else tuple(np.atleast_1d(axis)),
           keepdims=keepdims)
    return np.reshape(y, (1,)) if np.ndim(y) == 0 else y


def conv_layer(x, w, mean, var, gamma, beta, stride=1, padding=0, layout="NHWC", epsilon=1e-5):
    y = conv(x, w, stride=stride, padding=padding, layout=layout)
    return relu(batch_norm(y, mean, var, gamma, beta, axis=-1 if layout == "NHWC" else 1, epsilon=epsilon))


def tbs(q, k, num_heads):
    q, k = _f64(q, k)
    b, s, width = q.shape
    heads_q = q.reshape(b, s, num_heads, width // num_heads).transpose(0, 2, 1, 3)
    heads_k = k.reshape(b, s, num_heads, width // num_heads).transpose(0, 2, 1, 3)
    return softmax(heads_q @ heads_k.transpose(0, 1, 3, 2), axis=-1)
