"""ScatterElements and ScatterND (ONNX) and PyTorch's scatter family (scatter, scatter_add, scatter_reduce,
index_put, index_add, boolean-mask assignment): each model is compiled, run on generated inputs (random shapes,
axes and indices, negative ones, duplicates where the reduction defines them) and compared with ONNX Runtime or
eager PyTorch; the PyTorch peer (graph.reference.torch_eval) is checked on the same imported graphs."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgen.errors import RuntimeCallError
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import partition
from tensorgen.graph.reference.torch_eval import TorchModel
from tensorgen.runtime.model import CompiledModel

DTYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
          "int32": TensorProto.INT32, "bool": TensorProto.BOOL}
REDUCTIONS = ["none", "add", "mul", "max", "min"]


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], dtype: str,
           initializers: dict[str, np.ndarray] | None = None, opset: int = 18) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "scatter", [helper.make_tensor_value_info(k, DTYPES[a.dtype.name], a.shape) for k, a in inputs.items()],
        [helper.make_tensor_value_info("y", DTYPES[dtype], None)],
        [onnx.numpy_helper.from_array(a, k) for k, a in (initializers or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _scatter(op: str, feeds: dict[str, np.ndarray], initializers: dict[str, np.ndarray] | None = None,
             **attrs) -> onnx.ModelProto:
    names = [*feeds, *(initializers or {})]
    order = [n for n in ("x", "i", "u") if n in names]
    node = helper.make_node(op, order, ["y"], name=f"{op.lower()}_0", **attrs)
    return _model([node], feeds, feeds["x"].dtype.name, initializers)


def _ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # duplicates of reduction none: the updates in order, the last one stays
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _ours(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path) -> np.ndarray:
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    return model.run([feeds[n] for n in load_graph(proto).inputs])[0]


def _check(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path) -> None:
    """Compiled and PyTorch-peer results equal ONNX Runtime's."""
    want = _ort(proto, feeds)
    for got in (_ours(proto, feeds, tmp_path), TorchModel(import_onnx(proto)).run(feeds)[0]):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _data(rng: np.random.Generator, shape, dtype: str) -> np.ndarray:
    if dtype.startswith("int"):
        return rng.integers(-9, 10, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _distinct_along(rng: np.random.Generator, shape, axis: int, n: int) -> np.ndarray:
    """Indices of `shape` into an axis of size n, distinct along `axis` (reduction none leaves duplicates
    undefined), half of them negative."""
    lines = np.moveaxis(np.zeros(shape, np.int64), axis, -1)
    for pos in np.ndindex(lines.shape[:-1]):
        lines[pos] = rng.permutation(n)[:lines.shape[-1]]
    idx = np.moveaxis(lines, -1, axis)
    return np.where(rng.random(shape) < 0.5, idx - n, idx)


# ---- ScatterElements ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed", range(2))
def test_scatter_elements_matches_onnxruntime(reduction, seed, tmp_path):
    """Random rank, axis (given negative half the time), indices shape no larger than the data's, indices at run
    time: distinct along the axis for reduction none, with duplicates for the others."""
    rng = np.random.default_rng(seed)
    dtype = ["float32", "int64", "float64"][seed]
    shape = tuple(int(n) for n in rng.integers(2, 6, rng.integers(1, 4)))
    axis = int(rng.integers(len(shape)))
    ishape = tuple(int(rng.integers(1, n + 1)) for n in shape)
    n = shape[axis]
    if reduction == "none":
        idx = _distinct_along(rng, ishape, axis, n)
    else:
        idx = rng.integers(-n, n, ishape)
    feeds = {"x": _data(rng, shape, dtype), "i": idx.astype(np.int64), "u": _data(rng, ishape, dtype)}
    attr_axis = axis - len(shape) if seed % 2 else axis
    _check(_scatter("ScatterElements", feeds, axis=attr_axis, reduction=reduction), feeds, tmp_path)


def test_scatter_elements_duplicates_of_reduction_none_keep_the_last(tmp_path):
    """ONNX leaves them undefined; tensorgen keeps the last, as ONNX Runtime's CPU kernel does."""
    feeds = {"x": np.zeros((2, 4), np.float32), "i": np.array([[1, 1, -3], [0, 3, 0]], np.int64),
             "u": np.arange(1, 7, dtype=np.float32).reshape(2, 3)}
    proto = _scatter("ScatterElements", feeds, axis=1)
    np.testing.assert_array_equal(_ours(proto, feeds, tmp_path / "again"), [[0, 3, 0, 0], [6, 0, 0, 5]])
    _check(proto, feeds, tmp_path)


@pytest.mark.parametrize("dtype", [np.bool_, np.int32])
def test_scatter_elements_of_bool_and_int32_data(dtype, tmp_path):
    feeds = {"x": np.zeros((3, 4), dtype), "i": np.array([[0, 2], [1, -1]], np.int64), "u": np.ones((2, 2), dtype)}
    _check(_scatter("ScatterElements", feeds, axis=1), feeds, tmp_path)


def test_scatter_elements_at_opset_13_with_constant_int32_indices(tmp_path):
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "u": -np.ones((2, 4), np.float32)}
    proto = _scatter("ScatterElements", feeds, {"i": np.array([[2, -1, 0, 1], [0, 1, 2, -3]], np.int32)}, axis=0)
    proto.opset_import[0].version = 13
    _check(proto, feeds, tmp_path)


# ---- ScatterND -----------------------------------------------------------------------------------------------

def _nd_case(rng: np.random.Generator, dtype: str, distinct: bool):
    shape = tuple(int(n) for n in rng.integers(2, 5, rng.integers(1, 4)))
    k = int(rng.integers(1, len(shape) + 1))
    lead = tuple(int(n) for n in rng.integers(1, 4, rng.integers(1, 3)))
    count = int(np.prod(lead))
    cells = list(np.ndindex(shape[:k]))
    if distinct:
        count = min(count, len(cells))
        lead = (count,)
        picks = rng.permutation(len(cells))[:count]
    else:
        picks = rng.integers(0, len(cells), count)
    idx = np.array([cells[p] for p in picks], np.int64).reshape(*lead, k)
    idx = np.where(rng.random(idx.shape) < 0.5, idx - np.array(shape[:k]), idx)  # negative ones count from the end
    return {"x": _data(rng, shape, dtype), "i": idx, "u": _data(rng, lead + shape[k:], dtype)}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("seed", range(2))
def test_scatter_nd_matches_onnxruntime(reduction, seed, tmp_path):
    """Random rank, index depth k and leading index dims, indices at run time (distinct for reduction none)."""
    rng = np.random.default_rng(10 + seed)
    feeds = _nd_case(rng, ["float32", "int64", "float64"][seed], distinct=reduction == "none")
    _check(_scatter("ScatterND", feeds, reduction=reduction), feeds, tmp_path)


def test_scatter_nd_of_one_index_and_whole_slices(tmp_path):
    """indices of shape (k,) write one slice; k equal to the rank writes one element (0-d updates)."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for idx, upd in [(np.array([1, -1], np.int64), -np.ones(4, np.float32)),
                     (np.array([0, 2, 3], np.int64), np.array(-5, np.float32))]:
        feeds = {"x": x, "i": idx, "u": upd}
        _check(_scatter("ScatterND", feeds), feeds, tmp_path / str(idx.size))


def _kv_cache_model(cache_shape, new: int) -> onnx.ModelProto:
    """A KV cache (S, H, D) updated at run-time positions pos, pos+1, ...: indices = pos + [[0], [1], ...]."""
    nodes = [helper.make_node("Reshape", ["pos", "shape"], ["p"]), helper.make_node("Add", ["p", "steps"], ["i"]),
             helper.make_node("ScatterND", ["cache", "i", "k"], ["y"], name="kv_update")]
    inits = {"shape": np.array([1, 1], np.int64), "steps": np.arange(new, dtype=np.int64).reshape(new, 1)}
    feeds = {"cache": np.zeros(cache_shape, np.float32), "pos": np.zeros(1, np.int64),
             "k": np.zeros((new, *cache_shape[1:]), np.float32)}
    return _model(nodes, feeds, "float32", inits)


def test_kv_cache_update_at_run_time_positions(tmp_path):
    proto = _kv_cache_model((8, 2, 4), 2)
    rng = np.random.default_rng(0)
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    for pos in (0, 3, 6, -2):
        feeds = {"cache": rng.standard_normal((8, 2, 4)).astype(np.float32), "pos": np.array([pos], np.int64),
                 "k": rng.standard_normal((2, 2, 4)).astype(np.float32)}
        want = _ort(proto, feeds)
        np.testing.assert_array_equal(model.run([feeds["cache"], feeds["pos"], feeds["k"]])[0], want)
    with pytest.raises(RuntimeCallError, match=r"value 'i' \(indices of ScatterND 'kv_update'\) holds 8 at flat "
                                               r"position 1, outside \[-8, 8\)"):
        model.run([feeds["cache"], np.array([7], np.int64), feeds["k"]])


# ---- indices out of range, unsupported forms ---------------------------------------------------------------------

def test_run_time_scatter_elements_indices_out_of_range(tmp_path):
    feeds = {"x": np.zeros((3, 4), np.float32), "i": np.array([[0, 1]], np.int64), "u": np.ones((1, 2), np.float32)}
    model = CompiledModel(build_model(_scatter("ScatterElements", feeds, axis=1), tmp_path / "model"), threads=1)
    with pytest.raises(RuntimeCallError, match=r"input 'i' \(indices of ScatterElements 'scatterelements_0'\) "
                                               r"holds -5 at flat position 1"):
        model.run([feeds["x"], np.array([[0, -5]], np.int64), feeds["u"]])


def test_constant_indices_out_of_range_fail_at_import():
    feeds = {"x": np.zeros((3, 4), np.float32), "u": np.ones((1, 2), np.float32)}
    with pytest.raises(GraphError, match=r"ScatterElements\): indices 0\.\.4 out of range for axis 1 of size 4"):
        import_onnx(_scatter("ScatterElements", feeds, {"i": np.array([[0, 4]], np.int64)}, axis=1))
    feeds = {"x": np.zeros((3, 4), np.float32), "u": np.ones((1,), np.float32)}
    with pytest.raises(GraphError, match=r"ScatterND\): indices -4\.\.0 out of range for data of shape \[3, 4\]"):
        import_onnx(_scatter("ScatterND", feeds, {"i": np.array([[-4, 0]], np.int64)}))


def test_bool_data_has_no_arithmetic_reduction():
    feeds = {"x": np.zeros((3,), np.bool_), "i": np.array([0], np.int64), "u": np.ones((1,), np.bool_)}
    with pytest.raises(GraphError, match=r"ScatterElements.*reduction 'add' of bool data is not supported"):
        partition(import_onnx(_scatter("ScatterElements", feeds, axis=0, reduction="add")))


# ---- PyTorch -----------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")
from torch_fn import Fn  # noqa: E402

import tensorgen  # noqa: E402
from tensorgen.dynamo import compile_graph  # noqa: E402


def _index(seed: int, shape, high: int, dim: int) -> torch.Tensor:
    """Random indices in [0, high) (duplicates among them), distinct along `dim` for the plain scatter."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, shape, generator=g) if seed else torch.argsort(
        torch.rand(*shape[:dim], high, *shape[dim + 1:], generator=g), dim=dim).narrow(dim, 0, shape[dim])


def _scatter_reduce(x, i, s, reduce: str, self: bool):
    return x.scatter_reduce(1, i, s, reduce, include_self=self)


# (function of x (3, 5, 4), index, src) -> tensor; index (3, 2, 4) into dim 1 (size 5), src (3, 3, 4)
SCATTER_CASES = {
    "scatter_src": lambda x, i, s: x.scatter(1, i, s),
    "scatter_value": lambda x, i, s: x.scatter(-2, i, 2.5),
    "scatter_reduce_arg": lambda x, i, s: x.scatter(1, i, s, reduce="add") + x.scatter(1, i, 1.5, reduce="multiply"),
    "scatter_add": lambda x, i, s: x.scatter_add(1, i, s),
    **{f"scatter_reduce_{r}_{'self' if inc else 'noself'}": functools.partial(_scatter_reduce, reduce=r, self=inc)
       for r in ("sum", "prod", "amax", "amin", "mean") for inc in (True, False)},
    "index_add": lambda x, i, s: x.index_add(1, i[0, :, 0], s[:, :2]),
    "index_add_alpha": lambda x, i, s: x.index_add(1, i[0, :, 0], s[:, :2], alpha=-2.0),
    "index_put_accumulate": lambda x, i, s: x.transpose(0, 1).index_put((i[0, :, 0],), s[0, :1], accumulate=True),
}


@pytest.mark.parametrize("seed", [0])
@pytest.mark.parametrize("name", sorted(SCATTER_CASES))
def test_torch_scatter_family_equals_eager(name, seed):
    if seed and name in ("scatter_src", "scatter_value"):
        pytest.skip("a plain scatter's duplicates are undefined in PyTorch")
    torch.manual_seed(seed)
    x, s = torch.randn(3, 5, 4), torch.randn(3, 3, 4)
    i = _index(seed, (3, 2, 4), 5, 1)
    module = Fn(SCATTER_CASES[name]).eval()
    want = module(x, i, s)
    got = compile_graph(tensorgen.from_torch(module, (x, i, s))).run([x.numpy(), i.numpy(), s.numpy()])[0]
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


class KVCache(torch.nn.Module):
    """`cache[:, :, pos] = k` on a copy of the cache: index_put of one run-time index tensor on axis 2."""

    def forward(self, cache, pos, k):
        cache = cache.clone()
        cache[:, :, pos] = k
        return cache


class SetColumns(torch.nn.Module):
    """`x[:, idx] = v` with constant indices (one negative) and a broadcast value row."""

    def forward(self, x, v):
        x = x.clone()
        x[:, torch.tensor([4, -4])] = v
        return x


class MaskFill(torch.nn.Module):
    """Boolean-mask assignment and accumulation: Where."""

    def forward(self, x):
        y = x.clone()
        y[x > 0.5] = -1.0
        y[:, x[0] < 0] = 7.0
        z = x.t().index_put((x[0] < 0,), torch.tensor([1.0, 2.0, 3.0]), accumulate=True)
        return y + z.t()


class SliceAssign(torch.nn.Module):
    """Slice and single-position assignment: slice_scatter and select_scatter."""

    def forward(self, x):
        x = x.clone()
        x[:, 1:3] = x[:, 3:5] * 2
        x[:, ::2] = x[:, ::2] + 10
        x[1] = x[0] - 1
        x[:, -1] = 0.5
        return x


def _eager_and_ours(module: torch.nn.Module, xs: tuple) -> None:
    want = module(*xs)
    got = compile_graph(tensorgen.from_torch(module, xs)).run([x.numpy() for x in xs])[0]
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-6, atol=1e-6)


def test_torch_kv_cache_index_put_at_run_time_positions():
    cache, k = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 2, 4)
    compiled = compile_graph(tensorgen.from_torch(KVCache(), (cache, torch.tensor([0, 1]), k)))
    for pos in ([3, 4], [5, 0], [-1, 2]):
        pos = torch.tensor(pos)
        np.testing.assert_array_equal(compiled.run([cache.numpy(), pos.numpy(), k.numpy()])[0],
                                      KVCache()(cache, pos, k).numpy())


@pytest.mark.parametrize("module", [SetColumns(), MaskFill(), SliceAssign()], ids=lambda m: type(m).__name__)
def test_torch_index_put_forms_equal_eager(module):
    x = torch.randn(3, 5)
    _eager_and_ours(module, (x, torch.randn(2)) if isinstance(module, SetColumns) else (x,))


def test_torch_index_put_of_two_index_tensors_is_refused():
    class TwoIndices(torch.nn.Module):
        def forward(self, x, i):
            return x.index_put((i, i), torch.tensor(1.0))

    with pytest.raises(GraphError, match=r"index_put with 2 index tensors is not supported"):
        tensorgen.from_torch(TwoIndices(), (torch.zeros(4, 4), torch.tensor([1, 2])))
