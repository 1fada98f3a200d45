"""Einsum, GatherElements, DepthToSpace and SpaceToDepth (ONNX), and torch.gather / pixel_shuffle: each model is
compiled, run and compared with ONNX Runtime (or eager PyTorch) on generated inputs; the PyTorch peer
(graph.reference.torch_eval) is checked on the same imported graphs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgen.errors import RuntimeCallError
from tensorgen.graph.backend.build import build_model
from tensorgen.graph.frontend.normalize_index import EinsumError, explicit_equation
from tensorgen.graph.frontend.onnx_import import import_onnx
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import partition
from tensorgen.graph.reference.torch_eval import TorchModel
from tensorgen.runtime.model import CompiledModel

DTYPES = {"float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
          "int32": TensorProto.INT32}


def _model(op: str, inputs: dict[str, np.ndarray], dtype: str = "float32", opset: int = 17,
           initializers: dict[str, np.ndarray] | None = None, **attrs) -> onnx.ModelProto:
    inits = initializers or {}
    node = helper.make_node(op, [*inputs, *inits], ["y"], name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node], "h1", [helper.make_tensor_value_info(k, DTYPES[a.dtype.name], a.shape) for k, a in inputs.items()],
        [helper.make_tensor_value_info("y", DTYPES[dtype], None)],
        [onnx.numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ours(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path) -> np.ndarray:
    model = CompiledModel(build_model(proto, tmp_path / "model"), threads=1)
    return model.run([feeds[n] for n in load_graph(proto).inputs])[0]


def _check(proto: onnx.ModelProto, feeds: dict[str, np.ndarray], tmp_path, rtol: float = 1e-5) -> None:
    """Compiled and PyTorch-peer results equal ONNX Runtime's."""
    want = _ort(proto, feeds)
    for got in (_ours(proto, feeds, tmp_path), TorchModel(import_onnx(proto)).run(feeds)[0]):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)


def _arrays(shapes, seed: int = 0, dtype: str = "float32") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return {f"x{k}": rng.integers(-4, 5, s).astype(dtype) for k, s in enumerate(shapes)}
    return {f"x{k}": rng.standard_normal(s).astype(dtype) for k, s in enumerate(shapes)}


# ---- Einsum -----------------------------------------------------------------------------------------------

EINSUMS = [
    ("ij,jk->ik", [(3, 5), (5, 4)]),
    ("bij,bjk->bik", [(2, 3, 5), (2, 5, 4)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(3, 4)]),
    ("ij->", [(3, 4)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ij,jk", [(3, 5), (5, 4)]),  # implicit output: ik
    ("kj,ji", [(3, 5), (5, 4)]),  # implicit output, alphabetical: ik, i.e. the transpose of the product
    ("i,i", [(7,), (7,)]),
    (" b i j , b j k -> b i k ", [(2, 3, 5), (2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 5), (1, 4, 5, 2)]),  # the ellipsis dims broadcast
    ("...ij,jk", [(2, 3, 3, 5), (5, 4)]),
    ("b...d,bd->b...", [(2, 3, 4, 6), (2, 6)]),
    ("ii->i", [(4, 4)]),  # a diagonal
    ("bii->b", [(3, 4, 4)]),  # traces
    ("...ii->...i", [(2, 3, 4, 4)]),
    ("ij,j->i", [(3, 1), (4,)]),  # a letter of size 1 broadcasts, as in ONNX Runtime
    ("nchw,oc->nohw", [(2, 3, 4, 5), (6, 3)]),
]


@pytest.mark.parametrize("equation, shapes", EINSUMS, ids=[e.replace(" ", "") for e, _ in EINSUMS])
def test_einsum_equals_onnxruntime(equation, shapes, tmp_path):
    inputs = _arrays(shapes, seed=len(equation))
    _check(_model("Einsum", inputs, equation=equation), inputs, tmp_path)


@pytest.mark.parametrize("dtype", ["int64", "float64"])
def test_einsum_of_other_dtypes(dtype, tmp_path):
    inputs = _arrays([(2, 3, 4), (2, 4, 5)], dtype=dtype)
    _check(_model("Einsum", inputs, dtype, equation="bij,bjk->bik"), inputs, tmp_path)


def test_einsum_with_a_constant_operand(tmp_path):
    inputs = _arrays([(2, 6, 8)])
    weight = {"w": np.random.default_rng(3).standard_normal((8, 4)).astype(np.float32)}
    _check(_model("Einsum", inputs, initializers=weight, equation="bsd,de->bse"), inputs, tmp_path)


def test_attention_scores_by_einsum_then_softmax(tmp_path):
    """The elementwise scale after the Einsum fuses into its kernel; the softmax reads it."""
    inputs = _arrays([(1, 2, 4, 8), (1, 2, 6, 8)], seed=5)
    nodes = [helper.make_node("Einsum", ["x0", "x1"], ["s"], equation="bhqd,bhkd->bhqk"),
             helper.make_node("Mul", ["s", "c"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(k, TensorProto.FLOAT, a.shape) for k, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(8 ** -0.5, np.float32), "c")])
    _check(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), inputs, tmp_path)


def test_einsum_is_one_stage_with_its_reduce_axes():
    graph = import_onnx(_model("Einsum", _arrays([(2, 3, 4, 8), (2, 3, 5, 8)]), equation="...qd,...kd"))
    (node,) = graph.nodes
    assert node.op == "Einsum" and node.attrs == {"equation": "abqd,abkd->abkq"}
    (sub,) = partition(graph).subgraphs
    (stage,) = sub.dag.compute_tensors
    assert stage.shape == (2, 3, 5, 4) and [a.name for a in stage.reduce_axes] == ["rd"]


@pytest.mark.parametrize("equation, ranks, explicit", [
    ("ij,jk", (2, 2), "ij,jk->ik"),
    ("ba", (2,), "ba->ab"),
    ("Ab,bA", (2, 2), "Ab,bA->"),
    ("bB,Ba", (2, 2), "bB,Ba->ab"),
    ("...ii->...i", (4,), "abii->abi"),  # letters the equation leaves unused
    ("...i,...i", (3, 1), "abi,i->ab"),
    ("...i->...i", (1,), "i->i"),
    ("->", (0,), "->"),
])
def test_einsum_equations_made_explicit(equation, ranks, explicit):
    assert explicit_equation(equation, ranks) == explicit


@pytest.mark.parametrize("equation, ranks, message", [
    ("ij,jk->il", (2, 2), "output letter 'l' is in no operand"),
    ("ij->ii", (2,), "output letter 'i' is repeated"),
    ("ij,jk", (2,), "2 operands, but the node has 1 inputs"),
    ("ijk->i", (2,), "operand 0 has rank 2; its subscripts 'ijk' name 3 dims"),
    ("ij->i", (3,), "operand 0 has rank 3"),
    ("...i->i", (3,), "ellipsis spans 2 dims, but the output 'i' has no '...'"),
    ("i.j->i", (2,), "may hold only letters and one '...'"),
    ("i1->i", (2,), "may hold only letters"),
])
def test_bad_einsum_equations_are_one_line(equation, ranks, message):
    with pytest.raises(EinsumError, match=message.replace("(", r"\(").replace(".", r"\.")):
        explicit_equation(equation, ranks)


def test_bad_einsum_node_names_the_node():
    with pytest.raises(GraphError, match=r"node 'einsum_0' \(Einsum\): .*has no '\.\.\.'"):
        import_onnx(_model("Einsum", _arrays([(2, 3, 4)]), equation="...i->i"))


# ---- GatherElements ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape, ishape, axis", [
    ((3, 4), (3, 4), 0), ((3, 4), (3, 2), 1), ((2, 3, 4), (2, 5, 4), 1), ((2, 3, 4), (1, 2, 6), -1),
    ((5,), (8,), 0)])
@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_gather_elements_with_run_time_indices(shape, ishape, axis, dtype, tmp_path):
    rng = np.random.default_rng(sum(ishape))
    n = shape[axis]
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "i": rng.integers(-n, n, ishape).astype(dtype)}  # negative ones count from the end
    _check(_model("GatherElements", feeds, axis=axis), feeds, tmp_path)


def test_gather_elements_with_constant_indices(tmp_path):
    feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    indices = {"i": np.array([[-1, 0], [2, -3], [1, 1]], np.int64)}
    _check(_model("GatherElements", feeds, initializers=indices, axis=1), feeds, tmp_path)


def test_gather_elements_of_integers_after_an_op(tmp_path):
    """Indices computed by another kernel are checked before the gather runs: the Neg stays out of its kernel."""
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    idx = np.array([[0, 1, 2, 0], [1, 1, 0, 2]], np.int64)
    nodes = [helper.make_node("Neg", ["i"], ["m"]), helper.make_node("GatherElements", ["x", "m"], ["y"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, x.shape),
                                           helper.make_tensor_value_info("i", TensorProto.INT64, idx.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _check(proto, {"x": x, "i": idx}, tmp_path)
    model = CompiledModel(build_model(proto, tmp_path / "again"), threads=1)
    with pytest.raises(RuntimeCallError, match=r"value 'm' \(indices of GatherElements .*holds 4"):
        model.run([x, idx - 4])


def test_gather_elements_indices_out_of_range(tmp_path):
    feeds = {"x": np.zeros((3, 4), np.float32), "i": np.array([[0, 4]], np.int64)}
    model = CompiledModel(build_model(_model("GatherElements", feeds, axis=1), tmp_path / "model"), threads=1)
    with pytest.raises(RuntimeCallError, match=r"indices of GatherElements 'gatherelements_0'.*holds 4"):
        model.run([feeds["x"], feeds["i"]])
    with pytest.raises(GraphError, match=r"GatherElements\): indices -5\.\.0 out of range for axis 1 of size 4"):
        import_onnx(_model("GatherElements", {"x": feeds["x"]}, initializers={"i": np.array([[-5, 0]])}, axis=1))


# ---- DepthToSpace / SpaceToDepth --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize("shape, blocksize", [((1, 8, 2, 3), 2), ((2, 18, 3, 2), 3), ((1, 4, 1, 1), 2)])
def test_depth_to_space(mode, shape, blocksize, tmp_path):
    feeds = _arrays([shape])
    _check(_model("DepthToSpace", feeds, blocksize=blocksize, mode=mode), feeds, tmp_path)


@pytest.mark.parametrize("shape, blocksize", [((1, 2, 4, 6), 2), ((2, 3, 6, 3), 3), ((1, 5, 2, 2), 2)])
def test_space_to_depth(shape, blocksize, tmp_path):
    feeds = _arrays([shape])
    _check(_model("SpaceToDepth", feeds, blocksize=blocksize), feeds, tmp_path)


def test_depth_to_space_and_back_is_the_input(tmp_path):
    x = _arrays([(1, 3, 4, 6)])["x0"]
    nodes = [helper.make_node("SpaceToDepth", ["x"], ["d"], blocksize=2),
             helper.make_node("Relu", ["d"], ["r"]),
             helper.make_node("DepthToSpace", ["r"], ["y"], blocksize=2, mode="DCR")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    np.testing.assert_array_equal(_ours(proto, {"x": x}, tmp_path), np.maximum(x, 0))


def test_depth_to_space_of_a_3d_input_is_one_line():
    with pytest.raises(GraphError, match=r"\(DepthToSpace\): .*must be 4-dimensional"):
        import_onnx(_model("DepthToSpace", _arrays([(4, 2, 2)]), blocksize=2))


# ---- torch ------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


class _Gathers(torch.nn.Module):
    def forward(self, x, index, last):
        return torch.gather(x, 1, index), torch.gather(x.relu(), -1, last.transpose(0, 1))


class _Shuffles(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.pixel_shuffle(x, 2).sigmoid(), torch.nn.functional.pixel_unshuffle(x, 2)


def _torch_check(module, inputs):
    import tensorgen
    from tensorgen.dynamo import compile_graph

    graph = tensorgen.from_torch(module, inputs)
    got = compile_graph(graph).run([x.numpy() for x in inputs])
    with torch.no_grad():
        want = module(*inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6, atol=1e-6)
    return graph


def test_torch_gather_is_gather_elements():
    torch.manual_seed(0)
    x, index, last = torch.randn(2, 5, 3), torch.randint(0, 5, (2, 4, 3)), torch.randint(0, 3, (5, 2, 2))
    graph = _torch_check(_Gathers(), (x, index, last))
    assert sum(n.op == "GatherElements" for n in graph.nodes) == 2


def test_torch_pixel_shuffle_and_unshuffle():
    torch.manual_seed(0)
    _torch_check(_Shuffles(), (torch.randn(2, 8, 4, 6),))
