"""Smaller operators (session 38): PyTorch's adaptive max pooling, hypot, copysign, signbit, addmv, erfinv,
bucketize, searchsorted, cdist, median and kthvalue against eager PyTorch; ONNX OneHot, Trilu at run time,
Hardmax, EyeLike and Lp pooling against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper, shape_inference

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.runtime.model import CompiledModel

torch = pytest.importorskip("torch")
from torch_fn import Fn  # noqa: E402

import tensorgen  # noqa: E402
from tensorgen.dynamo import compile_graph  # noqa: E402

F = torch.nn.functional
TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
         np.int32: TensorProto.INT32, np.bool_: TensorProto.BOOL}



def _torch_outputs(fn, *xs: torch.Tensor) -> tuple[list[np.ndarray], list[torch.Tensor]]:
    """Ours (compiled) and eager PyTorch's outputs of fn(*xs)."""
    want = fn(*xs)
    want = list(want) if isinstance(want, tuple) else [want]
    got = compile_graph(tensorgen.from_torch(Fn(fn), xs)).run([x.numpy() for x in xs])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == tuple(w.shape) and g.dtype == w.numpy().dtype
    return got, want


def _torch_matches(fn, *xs: torch.Tensor, rtol: float = 2e-6, atol: float = 2e-6) -> None:
    got, want = _torch_outputs(fn, *xs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=rtol, atol=atol)


def _edgy(seed: int, shape, scale: float = 3.0) -> torch.Tensor:
    """Random float32 values with zeros of both signs, infinities and equal values among them."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    x.flat[:6] = [0.0, -0.0, np.inf, -np.inf, 1.5, 1.5]
    return torch.from_numpy(x)


# ---- adaptive max pooling ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "out"), [((8, 12), (4, 3)), ((7, 9), (3, 4)), ((5, 5), (5, 2)), ((6, 7), (1, 1))])
def test_adaptive_max_pool2d_matches_torch(size, out):
    x = torch.randn(2, 3, *size)
    x[0, 0, 0, :3] = 9.0  # ties
    x[1, 2, 1, 1] = float("nan")  # propagates to every window holding it
    _torch_matches(lambda t: F.adaptive_max_pool2d(t, out), x)


def test_adaptive_max_pool1d_and_unbatched_match_torch():
    _torch_matches(lambda t: F.adaptive_max_pool1d(t, 4), torch.randn(2, 3, 11))
    _torch_matches(lambda t: F.adaptive_max_pool2d(t, (2, 3)), torch.randn(3, 5, 7))


@pytest.mark.parametrize(("size", "out"), [((1, 1), (2, 3)), ((1, 1), (6, 6)), ((7, 9), (3, 4)), ((5, 5), (5, 2)),
                                           ((8, 12), (4, 3)), ((6, 7), (1, 1))])
def test_adaptive_avg_pool2d_matches_torch(size, out):
    """Any output size, larger than the input's too (UperNet's pyramid pools a 1 x 1 map to 2 x 2, 3 x 3, 6 x 6);
    an infinity or NaN reaches only the windows holding it."""
    x = torch.randn(2, 3, *size)
    x[1, 2, -1, -1] = float("inf")
    x[0, 1, 0, 0] = float("nan")
    _torch_matches(lambda t: F.adaptive_avg_pool2d(t, out), x)


def test_adaptive_avg_pool3d_and_unbatched_match_torch():
    _torch_matches(lambda t: F.adaptive_avg_pool3d(t, (2, 3, 2)), torch.randn(1, 2, 5, 4, 3))
    _torch_matches(lambda t: F.adaptive_avg_pool2d(t, (2, 3)), torch.randn(3, 5, 7))


def test_adaptive_max_pool_indices_used_is_refused():
    module = Fn(lambda t: F.adaptive_max_pool2d(t, (2, 2), return_indices=True)[1].float() + t[..., :2, :2])
    with pytest.raises(GraphError) as err:  # the indices are not computed: reading them fails in one line
        tensorgen.from_torch(module, (torch.randn(1, 2, 4, 4),))
    assert "\n" not in str(err.value)


# ---- element-wise functions -------------------------------------------------------------------------------------


def test_hypot_matches_torch():
    a, b = _edgy(1, (4, 33)), _edgy(2, (4, 33), scale=1e20)
    b.view(-1)[6:10] = torch.tensor([0.0, float("nan"), 3e38, 1e-30])
    a.view(-1)[6:10] = torch.tensor([0.0, float("inf"), 3e38, 1e-30])
    _torch_matches(torch.hypot, a, b)


def test_copysign_and_signbit_see_negative_zero():
    a, b = _edgy(3, (3, 20)), _edgy(4, (3, 20))
    b.view(-1)[6:9] = torch.tensor([-0.0, 0.0, -0.0])
    got, want = _torch_outputs(lambda x, y: (torch.copysign(x, y), torch.signbit(y)), a, b)
    np.testing.assert_array_equal(got[0], want[0].numpy())
    np.testing.assert_array_equal(np.signbit(got[0]), np.signbit(want[0].numpy()))
    np.testing.assert_array_equal(got[1], want[1].numpy())
    assert got[1].flat[1] and got[1].flat[6]  # -0.0


def test_signbit_of_integers_and_copysign_broadcast():
    _torch_matches(torch.signbit, torch.arange(-4, 5))
    _torch_matches(lambda x: torch.copysign(x, torch.tensor([-1.0, 0.0, -0.0])), torch.randn(4, 3))


@pytest.mark.parametrize(("beta", "alpha"), [(1, 1), (0.5, 2.0), (0, 1)])
def test_addmv_matches_torch(beta, alpha):
    bias = torch.randn(6)
    if beta == 0:
        bias[0] = float("nan")  # not read
    _torch_matches(lambda b, m, v: torch.addmv(b, m, v, beta=beta, alpha=alpha), bias, torch.randn(6, 5),
                   torch.randn(5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_erfinv_matches_torch(dtype):
    x = torch.linspace(-0.999, 0.999, 4001, dtype=dtype)
    x = torch.cat([x, torch.tensor([0.0, -0.0, 1.0, -1.0, 1.5, float("nan"), 1e-30, 0.9999999], dtype=dtype)])
    got, want = _torch_outputs(torch.erfinv, x)
    tol = 1e-6 if dtype == torch.float32 else 1e-11  # float64 near ±1: erf(y) - x cancels to 1e-16 / slope
    np.testing.assert_allclose(got[0], want[0].numpy(), rtol=tol, atol=0)


# ---- counting boundaries ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("right", [False, True])
def test_bucketize_matches_torch(right):
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])
    x = torch.tensor([[-3.0, -1.0, 0.0, -0.0, 0.25, 0.5], [2.0, 9.0, float("inf"), float("-inf"), float("nan"), -1.0]])
    _torch_matches(lambda t: torch.bucketize(t, boundaries, right=right), x)
    _torch_matches(lambda t: torch.bucketize(t, boundaries, right=right, out_int32=True), x)


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_matches_torch(side):
    sequence = torch.randint(-4, 5, (3, 7)).float().sort().values
    values = torch.randint(-5, 6, (3, 9)).float()
    _torch_matches(lambda s, v: torch.searchsorted(s, v, side=side), sequence, values)
    _torch_matches(lambda s, v: torch.searchsorted(s, v, right=side == "right"), sequence[0], values)


def test_cdist_matches_torch():
    """Norms 2, 1, inf, 0 and 3, as the outputs of one module (one build)."""
    a, b = torch.randn(2, 30, 5), torch.randn(2, 27, 5)
    b[0, 0] = a[0, 0]  # a zero distance
    _torch_matches(lambda x, y: tuple(torch.cdist(x, y, p=p) for p in (2.0, 1.0, float("inf"), 0.0, 3.0)), a, b,
                   rtol=2e-5, atol=2e-5)


# ---- order statistics -------------------------------------------------------------------------------------------


def _check_order(got: list[np.ndarray], want: list[torch.Tensor], x: torch.Tensor, dim: int, keepdim: bool) -> None:
    """Values equal; the index (equal values may be found at any of theirs) holds the value."""
    np.testing.assert_array_equal(got[0], want[0].numpy())
    index = got[1] if keepdim else np.expand_dims(got[1], dim)
    picked = np.take_along_axis(x.numpy(), index, dim)
    np.testing.assert_array_equal(picked if keepdim else picked.squeeze(dim), got[0])


@pytest.mark.parametrize(("dim", "keepdim", "n"), [(1, False, 7), (0, True, 6), (-1, False, 8)])
def test_median_dim_matches_torch(dim, keepdim, n):
    x = torch.randint(-3, 4, (6, n)).float()  # many ties
    x[1, 0] = float("nan")
    x[2, 1] = x[2, 3] = float("nan")
    got, want = _torch_outputs(lambda t: torch.median(t, dim, keepdim=keepdim), x)
    np.testing.assert_array_equal(got[0], want[0].numpy())
    rows = ~np.isnan(got[0])
    index = got[1] if keepdim else np.expand_dims(got[1], dim % 2)
    picked = np.take_along_axis(x.numpy(), index, dim % 2)
    picked = picked if keepdim else picked.squeeze(dim % 2)
    np.testing.assert_array_equal(picked[rows], got[0][rows])
    np.testing.assert_array_equal(got[1][~rows], want[1].numpy()[~rows])  # the first NaN


def test_median_of_all_elements_matches_torch():
    _torch_matches(torch.median, torch.randn(4, 5))
    _torch_matches(torch.median, torch.randint(-9, 9, (3, 6)))
    x = torch.randn(3, 4)
    x[1, 2] = float("nan")
    got, _ = _torch_outputs(torch.median, x)
    assert np.isnan(got[0])


@pytest.mark.parametrize(("k", "dim", "keepdim"), [(1, -1, False), (3, 1, True), (6, 0, False)])
def test_kthvalue_matches_torch(k, dim, keepdim):
    x = torch.randint(-3, 4, (6, 9)).float()
    got, want = _torch_outputs(lambda t: torch.kthvalue(t, k, dim, keepdim), x)
    _check_order(got, want, x, dim % 2, keepdim)


def test_kthvalue_out_of_range_is_refused():
    with pytest.raises(GraphError, match="out of range"):
        tensorgen.from_torch(Fn(lambda t: torch.kthvalue(t, 2, 0)[0] * 2), (torch.randn(1, 3),))


# ---- ONNX -------------------------------------------------------------------------------------------------------


def _onnx_matches_ort(op: str, feeds: dict[str, np.ndarray], tmp_path, inits: dict[str, np.ndarray] | None = None,
                      opset: int = 17, then_add: bool = False, **attrs) -> np.ndarray:
    """The one-node model (constant inputs as initializers; `then_add`: its output plus the first input) built
    and run, against ONNX Runtime."""
    inits = inits or {}
    inputs = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], list(v.shape)) for k, v in feeds.items()]
    nodes = [helper.make_node(op, [*feeds, *inits], ["z" if then_add else "y"], **attrs)]
    if then_add:
        nodes.append(helper.make_node("Add", [next(iter(feeds)), "z"], ["y"]))
    graph = helper.make_graph(nodes, "more", inputs, [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    inferred = shape_inference.infer_shapes(proto).graph.value_info
    proto.graph.output[0].CopyFrom(next((v for v in inferred if v.name == "y"), proto.graph.output[0]))
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    directory = tmp_path / f"model_{len(list(tmp_path.iterdir()))}"  # a new one: a library is loaded once per path
    ours = CompiledModel(build_model(proto, directory), threads=1).run(list(feeds.values()))[0]
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=2e-6)
    return ours


@pytest.mark.parametrize(("axis", "dtype", "values"), [(-1, np.int64, [0, 1]), (0, np.int32, [-2.5, 4.0]),
                                                       (1, np.float32, [3, 7])])
def test_one_hot_matches_onnxruntime(axis, dtype, values, tmp_path):
    """Negative indices count from the end; out-of-range ones give a row of the off value."""
    indices = np.array([[0, 4, -1, -5], [5, -6, 2, 3], [1, 1, -2, 0]], dtype)
    depth = np.array(5, np.int64 if dtype == np.int64 else dtype)  # the kernels ONNX Runtime has
    hot = _onnx_matches_ort("OneHot", {"i": indices}, tmp_path, {"d": depth,
                            "v": np.array(values, np.float32)}, axis=axis)
    assert (hot == values[1]).sum() == 10


@pytest.mark.parametrize(("upper", "k"), [(1, 0), (0, 0), (1, -2), (0, 3), (1, 9)])
def test_trilu_at_run_time_matches_onnxruntime(upper, k, tmp_path):
    x = np.random.default_rng(5).standard_normal((2, 4, 6)).astype(np.float32)
    _onnx_matches_ort("Trilu", {"x": x}, tmp_path, {"k": np.array(k, np.int64)}, upper=upper)


def test_trilu_of_integers_without_k_matches_onnxruntime(tmp_path):
    _onnx_matches_ort("Trilu", {"x": np.arange(30, dtype=np.int64).reshape(5, 6)}, tmp_path, upper=0)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_hardmax_picks_the_first_largest(axis, tmp_path):
    x = np.random.default_rng(6).integers(-2, 3, (3, 5, 4)).astype(np.float32)  # many ties
    _onnx_matches_ort("Hardmax", {"x": x}, tmp_path, axis=axis)


@pytest.mark.parametrize(("k", "dtype", "x"), [(0, None, np.float32), (2, TensorProto.INT64, np.int64),
                                              (-1, TensorProto.DOUBLE, np.float64)])
def test_eye_like_folds_from_the_shape(k, dtype, x, tmp_path):
    """Added to its run-time input (a graph whose output is a constant is another matter)."""
    attrs = {"k": k, **({"dtype": dtype} if dtype else {})}
    _onnx_matches_ort("EyeLike", {"x": np.arange(15).reshape(3, 5).astype(x)}, tmp_path, then_add=True, **attrs)


def test_eye_like_of_3d_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])
    graph = helper.make_graph([helper.make_node("EyeLike", ["x"], ["y"])], "eye", [x], [x])
    with pytest.raises(GraphError, match=r"\(EyeLike\): EyeLike of a 3-d input \(2-d only\)"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8))


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pools_match_onnxruntime(p, tmp_path):
    x = np.random.default_rng(7).standard_normal((1, 2, 7, 6)).astype(np.float32)
    _onnx_matches_ort("GlobalLpPool", {"x": x}, tmp_path, p=p)
    _onnx_matches_ort("LpPool", {"x": x}, tmp_path, opset=18, p=p, kernel_shape=[3, 2], strides=[2, 1],
                      pads=[1, 0, 1, 1])
