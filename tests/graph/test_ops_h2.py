"""CumSum and TopK at run time (ONNX, against ONNX Runtime) and torch cumsum / topk / sort / argsort (against eager
PyTorch): random shapes, axes and attributes, built and run as whole models; ties and NaN where the order is
defined by them."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.graph.reference.torch_eval import TorchModel
from tensorgen.runtime.model import CompiledModel

torch = pytest.importorskip("torch")

import tensorgen  # noqa: E402
from tensorgen.dynamo import compile_graph  # noqa: E402

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int32": TensorProto.INT32,
              "int64": TensorProto.INT64}


def _model(node: onnx.NodeProto, x: np.ndarray, outputs: list[tuple[str, str]], inits=()) -> onnx.ModelProto:
    graph = helper.make_graph([node], "h2", [helper.make_tensor_value_info("x", ONNX_TYPES[x.dtype.name], x.shape)],
                              [helper.make_tensor_value_info(n, ONNX_TYPES[t], None) for n, t in outputs],
                              list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str, ties: bool = False) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-5 if ties else -1000, 5 if ties else 1000, shape).astype(dtype)
    x = rng.standard_normal(shape)
    return (np.round(x, 1) if ties else x).astype(dtype)


def _ours_and_ort(proto: onnx.ModelProto, x: np.ndarray, tmp_path) -> tuple[list, list]:
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([x])
    torch_ref = TorchModel(import_onnx(proto)).run([x])  # the PyTorch peer agrees as well
    for a, b in zip(torch_ref, ref):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)
    return ours, ref


def _cumsum_cases(count: int) -> list[tuple]:
    rng = np.random.default_rng(38)
    cases = []
    for i in range(count):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(1, 7, rank))
        axis = int(rng.integers(-rank, rank))
        dtype = ("float32", "int64", "int32", "float64")[i % 4]
        cases.append((shape, axis, int(rng.integers(0, 2)), int(rng.integers(0, 2)), dtype, i))
    return cases


@pytest.mark.parametrize("shape, axis, exclusive, reverse, dtype, seed", _cumsum_cases(6))
def test_cumsum_matches_onnxruntime(shape, axis, exclusive, reverse, dtype, seed, tmp_path):
    x = _data(np.random.default_rng(seed), shape, dtype)
    axis_init = numpy_helper.from_array(np.array(axis, np.int64), "axis")
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    ours, ref = _ours_and_ort(_model(node, x, [("y", dtype)], [axis_init]), x, tmp_path)
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


def test_cumsum_of_constants_still_folds():
    x = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    nodes = [helper.make_node("CumSum", ["c", "axis"], ["s"], reverse=1), helper.make_node("Add", ["x", "s"], ["y"])]
    graph = helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [x, numpy_helper.from_array(np.array(1, np.int64), "axis")])
    g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [n.op for n in g] == ["Add"]
    np.testing.assert_array_equal(g.constants[g.nodes[0].inputs[1]], [[3, 3, 2], [12, 9, 5]])


def _top_k_cases(count: int) -> list[tuple]:
    rng = np.random.default_rng(39)
    cases = []
    for i in range(count):
        rank = int(rng.integers(1, 4))
        shape = tuple(int(n) for n in rng.integers(2, 9, rank))
        axis = int(rng.integers(-rank, rank))
        k = int(rng.integers(1, shape[axis] + 1))
        cases.append((shape, axis, k, int(rng.integers(0, 2)), ("float32", "int64", "float64", "int32")[i % 4], i))
    return cases


@pytest.mark.parametrize("shape, axis, k, largest, dtype, seed", _top_k_cases(6))
def test_top_k_matches_onnxruntime_with_ties(shape, axis, k, largest, dtype, seed, tmp_path):
    """Values rounded to one decimal (or small integers), so many are equal: the lower index first, as the spec
    and ONNX Runtime have it."""
    x = _data(np.random.default_rng(seed), shape, dtype, ties=True)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)
    k_init = numpy_helper.from_array(np.array([k], np.int64), "k")
    ours, ref = _ours_and_ort(_model(node, x, [("v", dtype), ("i", "int64")], [k_init]), x, tmp_path)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_top_k_with_a_run_time_k_or_too_large_k_is_refused():
    x = np.zeros((2, 3), np.float32)
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    for k, message in ((4, "requested k elements"), (0, "K=0 is out of range for axis 1 of size 3")):
        proto = _model(node, x, [("v", "float32"), ("i", "int64")], [numpy_helper.from_array(np.array([k]), "k")])
        with pytest.raises(GraphError, match=rf"\(TopK\): .*{message}"):
            import_onnx(proto)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                            helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("v", TensorProto.FLOAT, None)])
    with pytest.raises(GraphError, match=r"TopK\): input 'k' \(k\) must be a constant"):
        import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


# ---- PyTorch --------------------------------------------------------------------------------------------------


def _compiled(module: torch.nn.Module, *xs: torch.Tensor) -> list[np.ndarray]:
    graph = tensorgen.from_torch(module, xs)
    return compile_graph(graph).run([x.numpy() for x in xs])


class _Positions(torch.nn.Module):
    def forward(self, mask):
        return (mask.cumsum(-1) - 1) * mask, mask.bool().cumsum(0), torch.cumsum(mask, 1, dtype=torch.float32)


@pytest.mark.parametrize("shape", [(2, 7), (3, 33)])
def test_hf_position_ids_from_a_mask(shape):
    mask = (torch.rand(shape, generator=torch.Generator().manual_seed(shape[1])) > 0.3).long()
    with torch.no_grad():
        want = [t.numpy() for t in _Positions()(mask)]
    for got, ref in zip(_compiled(_Positions(), mask), want):
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref)


class _CumsumFloat(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x, self.dim) * 0.5, torch.cumsum(x, self.dim, dtype=torch.float64)


@pytest.mark.parametrize("dim", [0, -1, 1])
def test_cumsum_matches_eager(dim):
    x = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(dim + 5))
    with torch.no_grad():
        want = [t.numpy() for t in _CumsumFloat(dim)(x)]
    for got, ref in zip(_compiled(_CumsumFloat(dim), x), want):
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


class _Orders(torch.nn.Module):
    def __init__(self, dim: int, k: int, descending: bool):
        super().__init__()
        self.dim, self.k, self.descending = dim, k, descending

    def forward(self, x):
        values, indices = torch.topk(x, self.k, dim=self.dim, largest=self.descending)
        s, si = torch.sort(x, dim=self.dim, descending=self.descending)
        return values, indices, s, si, torch.argsort(x, dim=self.dim, descending=self.descending)


def _stable(x: torch.Tensor, dim: int, k: int, descending: bool) -> list[np.ndarray]:
    """What the _Orders module gives under a stable sort: equal values by index."""
    s, si = torch.sort(x, dim=dim, descending=descending, stable=True)
    return [t.numpy() for t in (s.narrow(dim, 0, k), si.narrow(dim, 0, k), s, si, si)]


@pytest.mark.parametrize("shape, dim, k, descending", [((4, 6, 5), 1, 3, True), ((3, 9), -1, 9, False),
                                                       ((5, 2, 4), 0, 2, False), ((40,), 0, 7, True)])
def test_topk_sort_and_argsort_are_stable(shape, dim, k, descending):
    gen = torch.Generator().manual_seed(len(shape) + k)
    x = torch.round(torch.randn(shape, generator=gen) * 10) / 10  # many equal values
    module = _Orders(dim, k, descending)
    got = _compiled(module, x)
    with torch.no_grad():
        eager = [t.numpy() for t in module(x)]
    for ours, stable, ref in zip(got, _stable(x, dim, k, descending), eager):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape
        np.testing.assert_array_equal(ours, stable)
        if ref.dtype == np.float32:  # values do not depend on how ties are ordered
            np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("descending", [True, False])
def test_sort_puts_nan_where_pytorch_does(descending):
    x = torch.tensor([[1.0, float("nan"), -2.0, float("nan"), 1.0, float("inf")],
                      [0.0, -0.0, float("-inf"), 3.0, float("nan"), 0.0]])
    module = _Orders(1, 4, descending)
    for ours, stable in zip(_compiled(module, x), _stable(x, 1, 4, descending)):
        np.testing.assert_array_equal(ours, stable)


def test_sort_of_integers_via_torch_compile():
    torch._dynamo.reset()
    x = torch.randint(-3, 3, (4, 8), generator=torch.Generator().manual_seed(1))

    def fn(t):
        return torch.sort(t, dim=-1, descending=True, stable=True)

    got = torch.compile(fn, backend="tensorgen", options={"trials": 0})(x)
    want = fn(x)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    torch._dynamo.reset()


# ---- running extremes and products ----------------------------------------------------------------------------


class _Running(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        high, low = torch.cummax(x, self.dim), torch.cummin(x, self.dim)
        return high.values, high.indices, low.values, low.indices


@pytest.mark.parametrize("shape, dim, dtype", [((3, 6, 4), 1, torch.float32), ((5, 7), -1, torch.float32),
                                               ((8, 3), 0, torch.int64), ((2, 9), 1, torch.int32)])
def test_cummax_and_cummin_match_eager_with_ties_and_nan(shape, dim, dtype):
    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.round(torch.randn(shape, generator=gen) * 2) / 2) if dtype.is_floating_point else \
        torch.randint(-3, 3, shape, generator=gen, dtype=dtype)
    if dtype.is_floating_point:
        flat = x.view(-1)
        flat[[1, 4, 7]] = float("nan")
        flat[5] = float("-inf")
    with torch.no_grad():
        want = [t.numpy() for t in _Running(dim)(x)]
    for got, ref in zip(_compiled(_Running(dim), x), want):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)


class _Products(torch.nn.Module):
    def forward(self, x, i):
        return torch.prod(x, 1), x.prod(-1, keepdim=True), torch.prod(i), torch.prod(i, 0, dtype=torch.float32)


def test_prod_matches_eager():
    gen = torch.Generator().manual_seed(3)
    x, i = torch.rand(3, 5, 4, generator=gen) + 0.5, torch.randint(-2, 3, (4, 3), generator=gen, dtype=torch.int32)
    with torch.no_grad():
        want = [t.numpy() for t in _Products()(x, i)]
    for got, ref in zip(_compiled(_Products(), x, i), want):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_allclose(got, ref, rtol=1e-5)


@pytest.mark.parametrize("axes, keepdims, dtype", [([1], 1, "float32"), ([-1, 0], 0, "float64"), (None, 0, "int64"),
                                                   ([2], 0, "int32")])
def test_reduce_prod_matches_onnxruntime(axes, keepdims, dtype, tmp_path):
    rng = np.random.default_rng(len(axes or ()) + keepdims)
    x = (rng.integers(-2, 3, (3, 4, 2)) if dtype.startswith("int") else rng.uniform(0.5, 1.5, (3, 4, 2))).astype(dtype)
    inputs = ["x", "axes"] if axes is not None else ["x"]
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")] if axes is not None else []
    node = helper.make_node("ReduceProd", inputs, ["y"], keepdims=keepdims)
    proto = _model(node, x, [("y", dtype)], inits)
    proto.opset_import[0].version = 18  # axes an input
    ours, ref = _ours_and_ort(proto, x, tmp_path)
    assert ours[0].dtype == ref[0].dtype and ours[0].shape == ref[0].shape
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5)
