"""The operator library against independent NumPy references (tests/reference.py).

Every graph runs through the `evaluate` fixture (tests/conftest.py): the TE interpreter for now,
compiled kernels once they exist. Shapes stay tiny so the whole file is fast.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import reference as ref

from tensorgen import te
from tensorgen.errors import TensorExprError
from tensorgen.te import ops
from tensorgen.te.expr import loads

RTOL, ATOL = 1e-4, 1e-5


class Feed:
    """Placeholders with random float32 values."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.values: dict[te.Tensor, np.ndarray] = {}

    def __call__(self, shape, name="x", lo=-1.0, hi=1.0) -> te.Tensor:
        t = te.placeholder(shape, name=name)
        self.values[t] = self.rng.uniform(lo, hi, size=shape).astype(np.float32)
        return t

    def __getitem__(self, t: te.Tensor) -> np.ndarray:
        return self.values[t]


def check(evaluate, outputs, feed: Feed, expected, rtol=RTOL, atol=ATOL):
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    expected = expected if isinstance(expected, (list, tuple)) else [expected]
    got = evaluate(list(outputs), dict(feed.values))
    assert len(got) == len(outputs)
    for g, e, t in zip(got, expected, outputs):
        assert g.shape == t.shape == np.shape(e), (t.name, g.shape, t.shape, np.shape(e))
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"output {t.name}")


# ---------------------------------------------------------------------------------------------
# convolutions

CONV_FAMILIES = {1: ("NWC", "NCW"), 2: ("NHWC", "NCHW"), 3: ("NDHWC", "NCDHW")}
CONV_FNS = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}
# id, spatial size, ci, co, kernel, stride, padding, dilation, groups
CONV_CASES = [
    ("c1d", (9,), 4, 6, 3, 2, 1, 1, 1),
    ("c1d_dil_grp", (10,), 4, 6, 3, 1, 2, 2, 2),
    ("c2d", (7, 6), 3, 5, 3, 2, 1, 1, 1),
    ("c2d_dil", (8, 8), 4, 4, 3, 1, 2, 2, 1),
    ("c2d_grp", (6, 6), 4, 6, 3, 1, 1, 1, 2),
    ("c2d_dep_mult2", (6, 5), 3, 6, 3, 2, 1, 1, 3),
    ("c2d_1x1", (5, 5), 4, 3, 1, 1, 0, 1, 1),
    ("c2d_asym", (6, 7), 2, 3, (3, 2), (2, 1), (1, 0, 2, 1), 1, 1),
    ("c3d", (4, 5, 5), 2, 3, 3, 2, 1, 1, 1),
]


def _conv_params(case, layout):
    _, size, ci, co, k, stride, padding, dil, groups = case
    nd = len(size)
    ks = (k,) * nd if isinstance(k, int) else k
    cl = layout.endswith("C")
    dshape = (2, *size, ci) if cl else (2, ci, *size)
    wshape = (*ks, ci // groups, co) if cl else (co, ci // groups, *ks)
    kwargs = dict(stride=stride, padding=padding, dilation=dil, groups=groups, layout=layout)
    return nd, dshape, wshape, kwargs


@pytest.mark.parametrize("layout_idx", [0, 1], ids=["channels_last", "channels_first"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv(evaluate, case, layout_idx):
    nd = len(case[1])
    layout = CONV_FAMILIES[nd][layout_idx]
    nd, dshape, wshape, kw = _conv_params(case, layout)
    f = Feed()
    x, w = f(dshape, "data"), f(wshape, "weight")
    out = CONV_FNS[nd](x, w, **kw)
    check(evaluate, out, f, ref.conv(f[x], f[w], **kw))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_depthwise_conv2d(evaluate, layout):
    f = Feed()
    x = f((1, 6, 6, 4) if layout == "NHWC" else (1, 4, 6, 6), "data")
    w = f((3, 3, 1, 4) if layout == "NHWC" else (4, 1, 3, 3), "weight")
    out = ops.depthwise_conv2d(x, w, stride=2, padding=1, layout=layout)
    check(evaluate, out, f, ref.conv(f[x], f[w], stride=2, padding=1, groups=4, layout=layout))


# id, spatial, ci, co, kernel, stride, padding, output_padding
T2D_CASES = [
    ("k4s2p1", (4, 4), 3, 2, 4, 2, 1, 0),
    ("k3s1p0", (3, 5), 2, 3, 3, 1, 0, 0),
    ("k3s2p1_op1", (3, 4), 2, 2, 3, 2, 1, 1),
    ("asym", (3, 4), 2, 3, (3, 2), (2, 3), (1, 0, 2, 1), (1, 2)),
    # strides dividing the kernel: the gather formulation (no inserted zeros)
    ("k4s2p0_op1", (3, 4), 2, 3, 4, 2, 0, 1),
    ("k6s3p2", (3, 3), 2, 2, 6, 3, 2, 0),
    ("gather_asym", (3, 4), 2, 3, (4, 2), (2, 2), (1, 0, 1, 1), (1, 1)),
    # a 1x1 input (DCGAN's latent): a matmul against the kernel's taps
    ("point_k4s1p0", (1, 1), 5, 3, 4, 1, 0, 0),
    ("point_asym", (1, 1), 3, 2, (4, 3), (2, 1), (1, 0, 2, 0), (1, 0)),
]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", T2D_CASES, ids=[c[0] for c in T2D_CASES])
def test_conv2d_transpose(evaluate, case, layout):
    _, size, ci, co, k, stride, padding, opad = case
    kh, kw = (k, k) if isinstance(k, int) else k
    f = Feed()
    x = f((2, *size, ci) if layout == "NHWC" else (2, ci, *size), "data")
    w = f((kh, kw, ci, co) if layout == "NHWC" else (ci, co, kh, kw), "weight")
    out = ops.conv2d_transpose(x, w, stride=stride, padding=padding, output_padding=opad, layout=layout)
    expected = ref.conv2d_transpose(f[x], f[w], stride=stride, padding=padding, output_padding=opad,
                                    layout=layout)
    check(evaluate, out, f, expected)


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


@pytest.mark.parametrize("case", [c for c in T2D_CASES if ops.conv.gathers(_pair(c[5]), _pair(c[4]))],
                         ids=lambda c: c[0])
def test_conv2d_transpose_col2im(evaluate, case):
    """The matmul-then-gather form against the same reference, its weight (C, M, kh, kw) moved to (C, kh*kw*M)."""
    _, size, ci, co, k, stride, padding, opad = case
    kh, kw = _pair(k)
    f = Feed()
    x, w = f((2, *size, ci), "data"), f((ci, kh * kw * co), "weight")
    out = ops.conv2d_transpose_col2im(x, w, (kh, kw), stride=stride, padding=padding, output_padding=opad)
    hwio = f[w].reshape(ci, kh, kw, co).transpose(1, 2, 0, 3)
    check(evaluate, out, f, ref.conv2d_transpose(f[x], hwio, stride=stride, padding=padding, output_padding=opad))


@pytest.mark.parametrize("stride,padding", [(2, 1), (1, 0)])
def test_conv2d_capsule(evaluate, stride, padding):
    f = Feed()
    x, w = f((2, 5, 5, 2, 3, 3), "data"), f((3, 3, 3, 2, 3, 4), "weight")
    out = ops.conv2d_capsule(x, w, stride=stride, padding=padding)
    check(evaluate, out, f, ref.conv2d_capsule(f[x], f[w], stride=stride, padding=padding))


def test_pad(evaluate):
    f = Feed()
    x = f((2, 3, 4))
    out = ops.pad(x, (1, 0, 2), (0, 3, 1), value=1.5)
    assert out.name == "pad" and out.tag == ops.INJECTIVE
    check(evaluate, out, f, ref.pad(f[x], (1, 0, 2), (0, 3, 1), 1.5))


# ---------------------------------------------------------------------------------------------
# linear algebra


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul(evaluate, ta, tb):
    f = Feed()
    a = f((4, 5) if ta else (5, 4), "A")
    b = f((6, 4) if tb else (4, 6), "B")
    check(evaluate, ops.matmul(a, b, ta, tb), f, ref.matmul(f[a], f[b], ta, tb))


@pytest.mark.parametrize("shape_a,shape_b,tb",
                         [((3, 4, 5), (3, 5, 2), False), ((2, 3, 4, 5), (2, 3, 6, 5), True)])
def test_batch_matmul(evaluate, shape_a, shape_b, tb):
    f = Feed()
    a, b = f(shape_a, "A"), f(shape_b, "B")
    check(evaluate, ops.batch_matmul(a, b, transpose_b=tb), f, ref.batch_matmul(f[a], f[b], tb))


@pytest.mark.parametrize("with_bias", [False, True])
def test_dense(evaluate, with_bias):
    f = Feed()
    x, w = f((3, 5), "x"), f((4, 5), "w")
    bias = f((4,), "bias") if with_bias else None
    out = ops.dense(x, w, bias)
    check(evaluate, out, f, ref.dense(f[x], f[w], f[bias] if with_bias else None))


@pytest.mark.parametrize("shape", [(5, 6), (3, 4, 5)])
def test_matrix_norm(evaluate, shape):
    f = Feed()
    a = f(shape, "A")
    out = ops.matrix_norm(a)
    assert out.shape == ((1,) if len(shape) == 2 else (shape[0],))
    check(evaluate, out, f, ref.matrix_norm(f[a]))


# ---------------------------------------------------------------------------------------------
# pooling and normalisation

POOL_CASES = [("k3s2p1", 3, 2, 1), ("k2_nopad", 2, None, 0), ("k3s1_asym", (3, 2), 1, (1, 0, 0, 1))]


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_max_pool2d(evaluate, case, layout):
    _, k, s, p = case
    f = Feed()
    x = f((2, 5, 6, 3) if layout == "NHWC" else (2, 3, 5, 6))
    out = ops.max_pool2d(x, k, s, p, layout=layout)
    check(evaluate, out, f, ref.max_pool2d(f[x], k, s, p, layout))


@pytest.mark.parametrize("include_pad", [False, True])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_avg_pool2d(evaluate, case, layout, include_pad):
    _, k, s, p = case
    f = Feed()
    x = f((2, 5, 6, 3) if layout == "NHWC" else (2, 3, 5, 6))
    out = ops.avg_pool2d(x, k, s, p, layout=layout, count_include_pad=include_pad)
    check(evaluate, out, f, ref.avg_pool2d(f[x], k, s, p, layout, include_pad))


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_global_avg_pool2d(evaluate, layout):
    f = Feed()
    x = f((2, 4, 5, 3) if layout == "NHWC" else (2, 3, 4, 5))
    check(evaluate, ops.global_avg_pool2d(x, layout), f, ref.global_avg_pool2d(f[x], layout))


@pytest.mark.parametrize("shape,axis", [((3, 7), -1), ((2, 5, 3), 1), ((6,), 0), ((2, 3, 4), 0)])
def test_softmax(evaluate, shape, axis):
    f = Feed()
    x = f(shape, lo=-5, hi=5)
    out = ops.softmax(x, axis)
    check(evaluate, out, f, ref.softmax(f[x], axis))


@pytest.mark.parametrize("shape,affine", [((3, 8), True), ((2, 3, 5), False), ((7,), True)])
def test_layer_norm(evaluate, shape, affine):
    f = Feed()
    x = f(shape)
    g = f(shape[-1:], "gamma") if affine else None
    b = f(shape[-1:], "beta") if affine else None
    out = ops.layer_norm(x, g, b, epsilon=1e-5)
    check(evaluate, out, f, ref.layer_norm(f[x], f[g] if affine else None, f[b] if affine else None))


@pytest.mark.parametrize("shape,axis", [((2, 3, 4, 5), -1), ((2, 5, 3, 4), 1)])
def test_batch_norm(evaluate, shape, axis):
    f = Feed()
    c = shape[axis]
    x, mean, var = f(shape), f((c,), "mean"), f((c,), "var", 0.5, 1.5)
    gamma, beta = f((c,), "gamma"), f((c,), "beta")
    out = ops.batch_norm(x, mean, var, gamma, beta, axis=axis, epsilon=1e-3)
    expected = ref.batch_norm(f[x], f[mean], f[var], f[gamma], f[beta], axis=axis, epsilon=1e-3)
    check(evaluate, out, f, expected)


# ---------------------------------------------------------------------------------------------
# elementwise, broadcast, injective, reductions

UNARY = {
    "relu": (ops.relu, ref.relu),
    "relu6": (ops.relu6, ref.relu6),
    "clip": (lambda x: ops.clip(x, -2.0, 3.0), lambda x: ref.clip(x, -2.0, 3.0)),
    "sigmoid": (ops.sigmoid, ref.sigmoid),
    "tanh": (ops.tanh, ref.tanh),
    "gelu": (ops.gelu, ref.gelu),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(evaluate, name):
    op, fn = UNARY[name]
    f = Feed()
    x = f((3, 4, 5), lo=-8, hi=8)
    out = op(x)
    assert out.tag == ops.ELEMWISE and out.shape == x.shape
    check(evaluate, out, f, fn(f[x]))


BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
          "minimum": np.minimum}


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 1, 4), (3, 1)), ((4,), (2, 3, 4)), ((1,), (2, 2))])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_broadcast_binary(evaluate, name, shapes):
    f = Feed()
    a, b = f(shapes[0], "a", 0.5, 2.0), f(shapes[1], "b", 0.5, 2.0)
    out = getattr(ops, name)(a, b)
    assert out.tag == (ops.ELEMWISE if shapes[0] == shapes[1] else ops.BROADCAST)
    check(evaluate, out, f, BINARY[name](f[a].astype(np.float64), f[b]))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_scalar_binary(evaluate, name):
    f = Feed()
    a = f((2, 3), "a", 0.5, 2.0)
    left, right = getattr(ops, name)(1.5, a), getattr(ops, name)(a, 3)
    x = f[a].astype(np.float64)
    check(evaluate, [left, right], f, [BINARY[name](1.5, x), BINARY[name](x, 3.0)])


@pytest.mark.parametrize("axes", [None, (1, 2, 0), (0, 2, 1)])
def test_transpose(evaluate, axes):
    f = Feed()
    x = f((2, 3, 4))
    check(evaluate, ops.transpose(x, axes), f, np.transpose(f[x], axes))


@pytest.mark.parametrize("src,dst", [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, -1)), ((1, 6, 1, 4), (2, 1, 12)),
                                     ((5,), (1, 5, 1)), ((2, 6), (3, 2, 2))])
def test_reshape(evaluate, src, dst):
    f = Feed()
    x = f(src)
    check(evaluate, ops.reshape(x, dst), f, np.reshape(f[x], dst))


@pytest.mark.parametrize("axis,count", [(1, 3), (-1, 2), (0, 1)])
def test_concatenate(evaluate, axis, count):
    f = Feed()
    parts = [f((2, 2 + k, 3) if axis == 1 else (2, 3, 1 + k) if axis == -1 else (2, 3, 4), f"t{k}")
             for k in range(count)]
    out = ops.concatenate(parts, axis)
    check(evaluate, out, f, np.concatenate([f[p] for p in parts], axis))


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", [None, 1, (0, 2), -1])
@pytest.mark.parametrize("kind", ["sum", "mean", "max", "min"])
def test_reduce(evaluate, kind, axis, keepdims):
    f = Feed()
    x = f((2, 3, 4))
    out = getattr(ops, f"reduce_{kind}")(x, axis, keepdims)
    check(evaluate, out, f, ref.reduce(kind, f[x], axis, keepdims))


# ---------------------------------------------------------------------------------------------
# subgraphs and the benchmark suite


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv_layer(evaluate, layout):
    f = Feed()
    x = f((1, 6, 6, 3) if layout == "NHWC" else (1, 3, 6, 6), "data")
    w = f((3, 3, 3, 4) if layout == "NHWC" else (4, 3, 3, 3), "weight")
    mean, var, gamma, beta = f((4,), "mean"), f((4,), "var", 0.5, 1.5), f((4,), "gamma"), f((4,), "beta")
    out = ops.conv_layer(x, w, mean, var, gamma, beta, stride=2, padding=1, layout=layout)
    assert out.name == "relu"
    expected = ref.conv_layer(f[x], f[w], f[mean], f[var], f[gamma], f[beta], 2, 1, layout)
    check(evaluate, out, f, expected)


def test_tbs(evaluate):
    f = Feed()
    q, k = f((2, 5, 6), "Q", -2, 2), f((2, 5, 6), "K", -2, 2)
    out = ops.tbs(q, k, num_heads=3)
    assert out.shape == (2, 3, 5, 5)
    check(evaluate, out, f, ref.tbs(f[q], f[k], 3))


# Tiny configurations of every SUITE entry (same formats as Appendix C), checked numerically.
SMALL = {
    "C1D": (9, 4, 6, 3, 2, 1), "C2D": (6, 6, 3, 4, 3, 2, 1), "C3D": (3, 5, 5, 2, 3, 3, 2, 1),
    "GMM": (5, 6, 7), "GRP": (6, 6, 4, 6, 3, 1, 1, 2), "DIL": (7, 7, 3, 4, 3, 1, 1, 2),
    "DEP": (6, 6, 4, 3, 2, 1), "T2D": (3, 3, 4, 3, 4, 2, 1), "CAP": (5, 5, 3, 2, 3, 2, 1, 2),
    "NRM": (5, 6), "ConvLayer": (6, 6, 3, 4, 3, 2, 1), "TBS": (5, 2, 3),
}
CHANNELS_FIRST = {"C1D": "NCW", "C2D": "NCHW", "C3D": "NCDHW", "GRP": "NCHW", "DIL": "NCHW", "DEP": "NCHW",
                  "T2D": "NCHW", "ConvLayer": "NCHW"}


def _suite_reference(name, cfg, arrays, layout):
    if name in ("C1D", "C2D", "C3D"):
        k, s, p = cfg[-3:]
        return ref.conv(arrays[0], arrays[1], stride=s, padding=p, layout=layout)
    if name == "GMM":
        return ref.batch_matmul(arrays[0], arrays[1])
    if name == "GRP":
        return ref.conv(*arrays, stride=cfg[5], padding=cfg[6], groups=cfg[7], layout=layout)
    if name == "DIL":
        return ref.conv(*arrays, stride=cfg[5], padding=cfg[6], dilation=cfg[7], layout=layout)
    if name == "DEP":
        return ref.conv(*arrays, stride=cfg[4], padding=cfg[5], groups=cfg[2], layout=layout)
    if name == "T2D":
        return ref.conv2d_transpose(*arrays, stride=cfg[5], padding=cfg[6], layout=layout)
    if name == "CAP":
        return ref.conv2d_capsule(*arrays, stride=cfg[5], padding=cfg[6])
    if name == "NRM":
        return ref.matrix_norm(arrays[0].reshape(cfg[0], cfg[1]))
    if name == "ConvLayer":
        return ref.conv_layer(*arrays, stride=cfg[5], padding=cfg[6], layout=layout)
    return ref.tbs(*arrays, num_heads=cfg[1])


SMALL_IDS = [(n, None) for n in SMALL] + [(n, lay) for n, lay in CHANNELS_FIRST.items()]


@pytest.mark.parametrize("name,layout", SMALL_IDS, ids=[f"{n}-{lay or 'default'}" for n, lay in SMALL_IDS])
def test_suite_small(evaluate, name, layout):
    make, _ = ops.SUITE[name]
    cfg = SMALL[name]
    batch = 1 if name == "NRM" else 2
    inputs, outputs = make(*cfg, batch=batch, **({"layout": layout} if layout else {}))
    f = Feed()
    for t in inputs:
        lo, hi = (0.5, 1.5) if t.name == "bn_var" else (-1.0, 1.0)
        f.values[t] = f.rng.uniform(lo, hi, size=t.shape).astype(np.float32)
    default = {"C1D": "NWC", "C3D": "NDHWC"}.get(name, "NHWC")
    expected = _suite_reference(name, cfg, [f[t] for t in inputs], layout or default)
    check(evaluate, outputs, f, expected)


def _out(n, k, s, p, d=1):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def expected_output_shape(name, cfg, batch):
    if name == "C1D":
        n, _, co, k, s, p = cfg
        return (batch, _out(n, k, s, p), co)
    if name in ("C2D", "ConvLayer", "GRP", "DIL"):
        h, w, _, co, k, s, p = cfg[:7]
        d = cfg[7] if name == "DIL" else 1
        return (batch, _out(h, k, s, p, d), _out(w, k, s, p, d), co)
    if name == "C3D":
        dd, h, w, _, co, k, s, p = cfg
        return (batch, _out(dd, k, s, p), _out(h, k, s, p), _out(w, k, s, p), co)
    if name == "GMM":
        return (batch, cfg[0], cfg[1])
    if name == "DEP":
        h, w, c, k, s, p = cfg
        return (batch, _out(h, k, s, p), _out(w, k, s, p), c)
    if name == "T2D":
        h, w, _, co, k, s, p = cfg
        return (batch, (h - 1) * s - 2 * p + k, (w - 1) * s - 2 * p + k, co)
    if name == "CAP":
        h, w, _, co, k, s, p, cap = cfg
        return (batch, _out(h, k, s, p), _out(w, k, s, p), cap, cap, co)
    if name == "NRM":
        return (batch,)
    seq, heads, _ = cfg
    return (batch, heads, seq, seq)


def _graph(outputs):
    """Every tensor the outputs depend on."""
    seen, stack = {}, list(outputs)
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen[t] = None
        if not t.is_placeholder:
            stack.extend(ld.tensor for ld in loads(t.body))
            if t.body.__class__.__name__ == "Reduce" and t.body.condition is not None:
                stack.extend(ld.tensor for ld in loads(t.body.condition))
    return list(seen)


def test_suite_contents():
    assert set(ops.SUITE) == {"C1D", "C2D", "C3D", "GMM", "GRP", "DIL", "DEP", "T2D", "CAP", "NRM",
                              "ConvLayer", "TBS"}
    for name, (make, configs) in ops.SUITE.items():
        assert callable(make) and len(configs) == 4, name
    assert ops.SUITE["C2D"][1][0] == (224, 224, 3, 64, 7, 2, 3)
    assert ops.SUITE["TBS"][1][2] == (64, 12, 128)
    assert ops.SUITE["CAP"][1][2] == (16, 16, 8, 16, 3, 2, 1, 4)


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("name", sorted(ops.SUITE))
def test_suite_builds(name, batch):
    make, configs = ops.SUITE[name]
    for cfg in configs:
        inputs, outputs = make(*cfg, batch=batch)
        assert len(outputs) == 1
        assert outputs[0].shape == expected_output_shape(name, cfg, batch), (name, cfg)
        assert outputs[0].dtype == "float32"
        graph = _graph(outputs)
        assert {t for t in graph if t.is_placeholder} == set(inputs)
        names = [t.name for t in graph]
        assert len(names) == len(set(names)), names
        assert all(t.tag for t in graph if not t.is_placeholder), name


# ---------------------------------------------------------------------------------------------
# bad arguments


def P(*shape, name="x", dtype="float32"):
    return te.placeholder(shape, dtype=dtype, name=name)


BAD = [
    ("conv_channels", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 4, 8)), "channel mismatch"),
    ("conv_layout", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 3, 8), layout="NHCW"), "unknown layout"),
    ("conv_kernel_big", lambda: ops.conv2d(P(1, 4, 4, 3), P(7, 7, 3, 8), padding=1), "larger than the pad"),
    ("conv_groups", lambda: ops.conv2d(P(1, 8, 8, 6), P(3, 3, 2, 8), groups=3), "groups must divide"),
    ("conv_ndim", lambda: ops.conv2d(P(8, 8, 3), P(3, 3, 3, 8)), "must have 4 dimension"),
    ("conv_stride", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 3, 8), stride=0), "stride"),
    ("conv_padding", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 3, 8), padding=-1), "padding"),
    ("conv_padding_len", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 3, 8), padding=(1, 1, 1)), "padding"),
    ("conv_dtype", lambda: ops.conv2d(P(1, 8, 8, 3), P(3, 3, 3, 8, dtype="float64")), "dtype"),
    ("conv_not_tensor", lambda: ops.conv2d(np.zeros((1, 8, 8, 3)), P(3, 3, 3, 8)), "must be a Tensor"),
    ("conv1d_layout", lambda: ops.conv1d(P(1, 8, 3), P(3, 3, 8), layout="NHWC"), "unknown layout"),
    ("conv3d_channels", lambda: ops.conv3d(P(1, 4, 4, 4, 2), P(3, 3, 3, 3, 4)), "channel mismatch"),
    ("t2d_channels", lambda: ops.conv2d_transpose(P(1, 4, 4, 3), P(3, 3, 4, 2)), "channel mismatch"),
    ("t2d_padding", lambda: ops.conv2d_transpose(P(1, 4, 4, 3), P(3, 3, 3, 2), padding=3), "padding"),
    ("t2d_outpad", lambda: ops.conv2d_transpose(P(1, 4, 4, 3), P(3, 3, 3, 2), 2, 1, 2), "output_padding"),
    ("t2d_layout", lambda: ops.conv2d_transpose(P(1, 4, 4, 3), P(3, 3, 3, 2), layout="HWCN"), "layout"),
    ("cap_mismatch", lambda: ops.conv2d_capsule(P(1, 5, 5, 4, 4, 3), P(3, 3, 4, 4, 2, 3)), "disagree"),
    ("cap_kernel_big", lambda: ops.conv2d_capsule(P(1, 2, 2, 4, 4, 3), P(3, 3, 4, 4, 3, 3)), "larger than"),
    ("pad_len", lambda: ops.pad(P(2, 3), (1,)), "pad_before"),
    ("pad_negative", lambda: ops.pad(P(2, 3), (1, -1)), "non-negative"),
    ("transpose_perm", lambda: ops.transpose(P(2, 3, 4), (0, 0, 1)), "not a permutation"),
    ("reshape_size", lambda: ops.reshape(P(2, 3), (4, 2)), "6 elements"),
    ("reshape_two_unknown", lambda: ops.reshape(P(2, 3), (-1, -1)), "more than one -1"),
    ("concat_shape", lambda: ops.concatenate([P(2, 3), P(3, 4, name="y")], axis=0), "does not match"),
    ("concat_empty", lambda: ops.concatenate([]), "at least one"),
    ("broadcast", lambda: ops.add(P(2, 3), P(4, name="y")), "cannot be broadcast"),
    ("binary_scalars", lambda: ops.add(1, 2), "at least one operand"),
    ("binary_dtype", lambda: ops.mul(P(2), P(2, dtype="float64", name="y")), "cast one of them"),
    ("matmul_k", lambda: ops.matmul(P(2, 3), P(4, 5, name="y")), "reduction lengths differ"),
    ("batch_matmul_batch", lambda: ops.batch_matmul(P(2, 3, 4), P(3, 4, 5, name="y")), "batch dimensions"),
    ("batch_matmul_rank", lambda: ops.batch_matmul(P(3, 4), P(4, 5, name="y")), "rank >= 3"),
    ("dense_features", lambda: ops.dense(P(2, 3), P(4, 5, name="w")), "input features"),
    ("dense_bias", lambda: ops.dense(P(2, 3), P(4, 3, name="w"), P(5, name="b")), "bias"),
    ("norm_rank", lambda: ops.matrix_norm(P(2, 3, 4, 5)), "dimension"),
    ("pool_padding", lambda: ops.max_pool2d(P(1, 8, 8, 3), 2, padding=2), "smaller than kernel"),
    ("pool_kernel", lambda: ops.avg_pool2d(P(1, 2, 2, 3), 3, padding=0), "larger than the padded"),
    ("pool_layout", lambda: ops.max_pool2d(P(1, 8, 8, 3), 2, layout="NCDHW"), "unknown layout"),
    ("softmax_axis", lambda: ops.softmax(P(2, 3), axis=2), "out of range"),
    ("softmax_int", lambda: ops.softmax(P(2, 3, dtype="int32")), "floating-point"),
    ("layer_norm_gamma", lambda: ops.layer_norm(P(2, 3), P(4, name="g")), "gamma"),
    ("batch_norm_channels", lambda: ops.batch_norm(P(1, 4, 4, 3), *[P(4, name=f"p{i}") for i in range(4)]),
     "does not match the 3 channels"),
    ("clip_range", lambda: ops.clip(P(2), 3, 1), "a_min"),
    ("reduce_axis", lambda: ops.reduce_sum(P(2, 3), axis=(0, 0)), "distinct"),
    ("reduce_axis_range", lambda: ops.reduce_max(P(2, 3), axis=3), "out of range"),
    ("tbs_heads", lambda: ops.tbs(P(1, 4, 6, name="q"), P(1, 4, 6, name="k"), 4), "num_heads"),
    ("tbs_shapes", lambda: ops.tbs(P(1, 4, 6, name="q"), P(1, 5, 6, name="k"), 2), "differ in shape"),
]


@pytest.mark.parametrize("make,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments(make, match):
    with pytest.raises(TensorExprError, match=match):
        make()


def test_stage_names_and_tags():
    x = P(1, 8, 8, 3, name="data")
    w = P(3, 3, 3, 4, name="weight")
    conv = ops.conv2d(x, w, padding=1)
    pad = conv.body.source.a.tensor  # pad[...] * weight[...]
    assert (pad.name, pad.tag) == ("pad", ops.INJECTIVE)
    assert (conv.name, conv.tag) == ("conv2d", ops.CONV2D)
    assert [a.name for a in conv.axes] == ["n", "h", "w", "co"]
    assert [a.name for a in conv.reduce_axes] == ["rh", "rw", "rc"]
    assert ops.conv2d(x, w).body.source.a.tensor is x  # no pad stage without padding
    sm = ops.softmax(P(2, 5))
    assert sm.tag == ops.BROADCAST
    assert {ld.tensor.name for ld in loads(sm.body)} == {"softmax_exp", "softmax_sum"}
    assert ops.reduce_sum(P(2, 3)).shape == (1,)
    assert math.isclose(ops.gelu(P(2)).body.a.b.value, 0.5)


def test_te_eval_interpreter():
    """The second oracle itself: masked reductions with init, bounds checking, missing feeds."""
    from te_eval import EvalError
    from te_eval import evaluate as te_evaluate

    x = P(4, 5)
    k = te.reduce_axis(5, "k")
    s = te.compute((4,), lambda i: te.sum(x[i, k], axis=k, where=k < 3, init=1.0), name="s")
    m = te.compute((4,), lambda i: te.max(x[i, k], axis=k, where=te.eq(k % 2, 0)), name="m")
    a = np.random.default_rng(1).uniform(-1, 1, (4, 5)).astype(np.float32)
    got_s, got_m = te_evaluate([s, m], {x: a})
    np.testing.assert_allclose(got_s, a[:, :3].sum(1) + 1, rtol=1e-6)
    np.testing.assert_allclose(got_m, a[:, ::2].max(1), rtol=1e-6)
    bad = te.compute((4,), lambda i: x[i + 1, 0], name="bad")
    with pytest.raises(EvalError, match="outside"):
        te_evaluate([bad], {x: a})
    with pytest.raises(EvalError, match="no value fed"):
        te_evaluate([s], {})
