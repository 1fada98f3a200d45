"""The Ansor single-operator benchmark suite (paper Appendix C) and its two subgraphs.

Each `make_<op>(*shape_config, batch=1, ...)` creates its placeholders and returns
`(inputs, outputs)`. `SUITE[name] = (make_fn, shape_configs)`. Convolutions default to the
channels-last layouts of Ansor's CPU benchmarks (NWC / NHWC / NDHWC, kernels WIO / HWIO / DHWIO).

Deviation from the paper: the first GRP configuration of Appendix C, (224, 224, 3, 64, 7, 2, 3, 4),
cannot exist (3 input channels do not split into 4 groups); like TVM's benchmark configs we use
(56, 56, 64, 128, 3, 2, 1, 4) in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tensorgen.errors import TensorExprError
from tensorgen.te.ops.common import INJECTIVE, check_same_dtype, check_tensor
from tensorgen.te.ops.conv import conv1d, conv2d, conv2d_capsule, conv2d_transpose, conv3d
from tensorgen.te.ops.linalg import batch_matmul, matrix_norm
from tensorgen.te.ops.math import relu
from tensorgen.te.ops.nn import batch_norm, softmax
from tensorgen.te.tensor import Tensor, compute, placeholder

Built = tuple[list[Tensor], list[Tensor]]

# ---------------------------------------------------------------------------------------------
# the two subgraphs


def conv_layer(data: Tensor, weight: Tensor, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor,
               stride: int = 1, padding: int = 0, layout: str = "NHWC", epsilon: float = 1e-5) -> Tensor:
    """ConvLayer: conv2d -> batch_norm (inference) -> relu.

    Stages: pad (if padding), conv2d, bn_scale, bn_shift, bn, relu.
    """
    out = conv2d(data, weight, stride=stride, padding=padding, layout=layout)
    axis = -1 if layout == "NHWC" else 1
    return relu(batch_norm(out, mean, var, gamma, beta, axis=axis, epsilon=epsilon))


def tbs(q: Tensor, k: Tensor, num_heads: int) -> Tensor:
    """TBS (multi-head attention scores): softmax(Q_h K_h^T) per head, without scaling.

    q, k: (batch, seq, heads * hidden). Stages: `q_transpose` (batch, heads, seq, hidden),
    `k_transpose` (batch, heads, hidden, seq), `batch_matmul` (batch, heads, seq, seq), then softmax.
    """
    check_tensor(q, "tbs", "q", ndim=3)
    check_tensor(k, "tbs", "k", ndim=3)
    check_same_dtype("tbs", q, k)
    if q.shape != k.shape:
        raise TensorExprError(f"tbs: q {q.name}{list(q.shape)} and k {k.name}{list(k.shape)} differ in shape")
    batch, seq, width = q.shape
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or width % num_heads:
        raise TensorExprError(f"tbs: num_heads {num_heads!r} must be a positive divisor of the width {width}")
    hidden = width // num_heads
    qt = compute((batch, num_heads, seq, hidden), lambda b, h, i, d: q[b, i, h * hidden + d],
                 name="q_transpose", tag=INJECTIVE)
    kt = compute((batch, num_heads, hidden, seq), lambda b, h, d, j: k[b, j, h * hidden + d],
                 name="k_transpose", tag=INJECTIVE)
    return softmax(batch_matmul(qt, kt))


# ---------------------------------------------------------------------------------------------
# shapes and placeholders


def _data(batch: int, channels: int, spatial: Sequence[int], layout: str, name: str = "data") -> Tensor:
    shape = (batch, *spatial, channels) if layout.endswith("C") else (batch, channels, *spatial)
    return placeholder(shape, name=name)


def _weight(co: int, ci_per_group: int, kernel: Sequence[int], layout: str, name: str = "weight") -> Tensor:
    if layout.endswith("C"):
        return placeholder((*kernel, ci_per_group, co), name=name)
    return placeholder((co, ci_per_group, *kernel), name=name)


def _conv(fn: Callable, nd: int, spatial, ci, co, kernel, stride, padding, batch, layout,
          dilation: int = 1, groups: int = 1) -> Built:
    data = _data(batch, ci, spatial, layout)
    weight = _weight(co, ci // groups or 1, (kernel,) * nd, layout)
    out = fn(data, weight, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    return [data, weight], [out]


def make_c1d(length, ci, co, kernel, stride, padding, batch=1, layout="NWC") -> Built:
    return _conv(conv1d, 1, (length,), ci, co, kernel, stride, padding, batch, layout)


def make_c2d(h, w, ci, co, kernel, stride, padding, batch=1, layout="NHWC") -> Built:
    return _conv(conv2d, 2, (h, w), ci, co, kernel, stride, padding, batch, layout)


def make_c3d(d, h, w, ci, co, kernel, stride, padding, batch=1, layout="NDHWC") -> Built:
    return _conv(conv3d, 3, (d, h, w), ci, co, kernel, stride, padding, batch, layout)


def make_gmm(n, m, k, batch=1) -> Built:
    """GMM (N, M, K): A (batch, N, K) @ B (batch, K, M); always a batch_matmul, as in Ansor."""
    a = placeholder((batch, n, k), name="A")
    b = placeholder((batch, k, m), name="B")
    return [a, b], [batch_matmul(a, b)]


def make_grp(h, w, ci, co, kernel, stride, padding, groups, batch=1, layout="NHWC") -> Built:
    return _conv(conv2d, 2, (h, w), ci, co, kernel, stride, padding, batch, layout, groups=groups)


def make_dil(h, w, ci, co, kernel, stride, padding, dilation, batch=1, layout="NHWC") -> Built:
    return _conv(conv2d, 2, (h, w), ci, co, kernel, stride, padding, batch, layout, dilation=dilation)


def make_dep(h, w, c, kernel, stride, padding, batch=1, layout="NHWC") -> Built:
    return _conv(conv2d, 2, (h, w), c, c, kernel, stride, padding, batch, layout, groups=c)


def make_t2d(h, w, ci, co, kernel, stride, padding, batch=1, layout="NHWC") -> Built:
    data = _data(batch, ci, (h, w), layout)
    shape = (kernel, kernel, ci, co) if layout == "NHWC" else (ci, co, kernel, kernel)
    weight = placeholder(shape, name="weight")
    return [data, weight], [conv2d_transpose(data, weight, stride=stride, padding=padding, layout=layout)]


def make_cap(h, w, ci, co, kernel, stride, padding, capsule, batch=1) -> Built:
    data = placeholder((batch, h, w, capsule, capsule, ci), name="data")
    weight = placeholder((kernel, kernel, capsule, capsule, ci, co), name="weight")
    return [data, weight], [conv2d_capsule(data, weight, stride=stride, padding=padding)]


def make_nrm(n, m, batch=1) -> Built:
    """NRM (N, M): sqrt(sum(A * A)) of each (N, M) matrix of A (batch, N, M); output (batch,)."""
    a = placeholder((batch, n, m), name="A")
    return [a], [matrix_norm(a)]


def make_conv_layer(h, w, ci, co, kernel, stride, padding, batch=1, layout="NHWC") -> Built:
    data = _data(batch, ci, (h, w), layout)
    weight = _weight(co, ci, (kernel, kernel), layout)
    params = [placeholder((co,), name=f"bn_{p}") for p in ("mean", "var", "gamma", "beta")]
    out = conv_layer(data, weight, *params, stride=stride, padding=padding, layout=layout)
    return [data, weight, *params], [out]


def make_tbs(seq, heads, hidden, batch=1) -> Built:
    q = placeholder((batch, seq, heads * hidden), name="Q")
    k = placeholder((batch, seq, heads * hidden), name="K")
    return [q, k], [tbs(q, k, heads)]


_CONV2D_SHAPES = [(224, 224, 3, 64, 7, 2, 3), (56, 56, 64, 64, 1, 1, 0), (14, 14, 256, 256, 3, 1, 1),
                  (7, 7, 512, 512, 3, 1, 1)]

SUITE: dict[str, tuple[Callable[..., Built], list[tuple[int, ...]]]] = {
    # C1D: (length, input channel, output channel, kernel size, stride, padding)
    "C1D": (make_c1d, [(256, 64, 128, 3, 2, 1), (128, 128, 256, 1, 2, 0), (64, 256, 256, 5, 1, 2),
                       (32, 512, 512, 3, 1, 1)]),
    # C2D: (height, width, input channel, output channel, kernel size, stride, padding)
    "C2D": (make_c2d, list(_CONV2D_SHAPES)),
    # C3D: (depth, height, width, input channel, output channel, kernel size, stride, padding)
    "C3D": (make_c3d, [(16, *s) for s in _CONV2D_SHAPES]),
    # GMM: (N, M, K)
    "GMM": (make_gmm, [(128, 128, 128), (512, 32, 512), (512, 512, 512), (1024, 1024, 1024)]),
    # GRP: C2D format + groups (first config replaced, see the module docstring)
    "GRP": (make_grp, [(56, 56, 64, 128, 3, 2, 1, 4)] + [(*s, 4) for s in _CONV2D_SHAPES[1:]]),
    # DIL: C2D format + dilation
    "DIL": (make_dil, [(*s, 2) for s in _CONV2D_SHAPES]),
    # DEP: (height, width, channel, kernel size, stride, padding)
    "DEP": (make_dep, [(112, 112, 32, 3, 1, 1), (112, 112, 64, 3, 2, 1), (14, 14, 512, 3, 2, 1),
                       (7, 7, 1024, 3, 1, 1)]),
    # T2D: (height, width, input channel, output channel, kernel size, stride, padding)
    "T2D": (make_t2d, [(4, 4, 512, 256, 4, 2, 1), (8, 8, 256, 128, 4, 2, 1), (16, 16, 128, 64, 4, 2, 1),
                       (32, 32, 64, 3, 4, 2, 1)]),
    # CAP: (height, width, input channel, output channel, kernel size, stride, padding, capsule size)
    "CAP": (make_cap, [(16, 16, 32, 32, 3, 2, 1, 4), (8, 8, 32, 32, 3, 1, 1, 4), (16, 16, 8, 16, 3, 2, 1, 4),
                       (8, 8, 16, 16, 3, 1, 1, 4)]),
    # NRM: (N, M)
    "NRM": (make_nrm, [(256, 256), (512, 512), (1024, 1024), (4096, 4096)]),
    # ConvLayer: C2D format
    "ConvLayer": (make_conv_layer, [(224, 224, 3, 64, 7, 2, 3), (56, 56, 64, 64, 3, 2, 1),
                                    (28, 28, 128, 256, 1, 2, 0), (7, 7, 512, 512, 3, 1, 1)]),
    # TBS: (sequence length, number of heads, hidden dimension)
    "TBS": (make_tbs, [(128, 12, 64), (128, 16, 64), (64, 12, 128), (128, 12, 128)]),
}
