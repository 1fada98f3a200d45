"""The ONNX frontend against ONNX Runtime: every supported op imports with ORT's shapes and dtypes and,
exported again, computes what ORT computes; the normalization contract, constant folding, errors.

The model-building and ORT helpers at the top are also used by test_passes.py."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tensorgen.graph import Graph, GraphError
from tensorgen.graph.frontend.normalize import CONST_INPUTS
from tensorgen.graph.frontend.onnx_eval import onnx_dtype
from tensorgen.graph.frontend.onnx_import import GRAPH_OPS, SUPPORTED_OPS, export_onnx, import_onnx

Spec = tuple[Sequence[int | str], str]  # (shape, numpy dtype) of a graph input


def make_model(nodes: Sequence[onnx.NodeProto], inputs: Mapping[str, Spec], outputs: Sequence[str],
               inits: Mapping[str, np.ndarray] | None = None, opset: int = 17, name: str = "test") -> onnx.ModelProto:
    graph = helper.make_graph(
        list(nodes), name,
        [helper.make_tensor_value_info(k, onnx_dtype(dt), list(shape)) for k, (shape, dt) in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), k) for k, a in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def node(op: str, inputs: Sequence[str], outputs: Sequence[str] = ("y",), name: str = "", **attrs) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), name=name or f"{op.lower()}_{outputs[0]}", **attrs)


def feeds_for(inputs: Mapping[str, Spec], seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for k, (shape, dtype) in inputs.items():
        if dtype == "bool":
            feeds[k] = rng.random(shape) < 0.5
        elif np.issubdtype(np.dtype(dtype), np.integer):
            feeds[k] = rng.integers(0, 3, shape).astype(dtype)
        else:
            feeds[k] = rng.uniform(-2, 2, shape).astype(dtype)
    return feeds


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run a tensorgen Graph with ONNX Runtime (through export_onnx)."""
    return run_ort(export_onnx(graph), {k: feeds[k] for k in graph.inputs})


def check_import(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6,
                 **kw) -> Graph:
    """Import `model`; every output Value must match ORT's shape and dtype, and the imported graph,
    exported again, must compute what ORT computes on the original."""
    graph = import_onnx(model, **kw)
    expected = run_ort(model, feeds)
    for name, ref in zip(graph.outputs, expected):
        assert graph.value(name).shape == ref.shape, name
        assert graph.value(name).dtype == ref.dtype.name, name
    for got, ref in zip(run_graph(graph, feeds), expected):
        np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    return graph


# ---------------------------------------------------------------------------------------------- cases
F = "float32"
X3 = {"x": ((2, 3, 4), F)}
X4 = {"x": ((1, 3, 8, 8), F)}
_rng = np.random.default_rng(1)


def w(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    id: str
    nodes: list[onnx.NodeProto]
    inputs: dict[str, Spec] = field(default_factory=lambda: X3)
    inits: dict[str, np.ndarray] = field(default_factory=dict)
    opset: int = 17
    outputs: tuple[str, ...] = ("y",)
    atol: float = 1e-6  # a sum of many terms, computed another way than ONNX Runtime's (DFT: its FFT), needs more

    def model(self) -> onnx.ModelProto:
        return make_model(self.nodes, self.inputs, self.outputs, self.inits, self.opset)


def unary(op: str, **attrs) -> Case:
    return Case(op, [node(op, ["x"], **attrs)])


CASES = [
    Case("Conv", [node("Conv", ["x", "w", "b"], pads=[1, 1, 1, 1], strides=[2, 2])], X4,
         {"w": w(4, 3, 3, 3), "b": w(4)}),
    Case("Conv_group_same_lower", [node("Conv", ["x", "w"], group=3, strides=[2, 2], auto_pad="SAME_LOWER")],
         X4, {"w": w(6, 1, 4, 4)}),
    Case("Conv_valid_1d", [node("Conv", ["x", "w"], auto_pad="VALID", strides=[2])], {"x": ((2, 3, 9), F)},
         {"w": w(4, 3, 4)}),
    Case("ConvTranspose", [node("ConvTranspose", ["x", "w", "b"], strides=[2, 2], pads=[1, 1, 1, 1],
                                output_padding=[1, 1])], X4, {"w": w(3, 2, 3, 3), "b": w(2)}),
    Case("ConvTranspose_output_shape", [node("ConvTranspose", ["x", "w"], strides=[2, 2], output_shape=[15, 16])],
         X4, {"w": w(3, 2, 3, 3)}),
    Case("BatchNormalization", [node("BatchNormalization", ["x", "s", "b", "m", "v"], epsilon=1e-3)], X4,
         {"s": w(3), "b": w(3), "m": w(3), "v": np.abs(w(3)) + 0.5}),
    *(unary(op) for op in ["Relu", "Sigmoid", "Tanh", "Erf", "HardSwish", "Exp", "Sqrt", "Reciprocal", "Identity",
                           "Softmax", "GlobalAveragePool"]),
    unary("LeakyRelu", alpha=0.2),
    unary("HardSigmoid", alpha=0.3),
    *(unary(op) for op in ["Selu", "Softplus", "Softsign", "LogSoftmax", "GlobalMaxPool"]),
    Case("Mish", [node("Mish", ["x"])], opset=18),
    unary("Elu", alpha=0.5), unary("Celu", alpha=2.0), unary("ThresholdedRelu", alpha=0.2),
    Case("Log", [node("Abs", ["x"], ["a"]), node("Log", ["a"])]),
    Case("PRelu", [node("PRelu", ["x", "c"])], inits={"c": w(4)}),
    Case("Sum", [node("Sum", ["x", "z", "c"])], {**X3, "z": ((3, 1), F)}, {"c": w(4)}),
    Case("Mean", [node("Mean", ["x", "c"])], inits={"c": w(4)}),
    Case("ReduceMax", [node("ReduceMax", ["x"], axes=[1], keepdims=1)]),
    Case("ArgMax", [node("ArgMax", ["x"], ["i"], axis=-1), node("Cast", ["i"], to=onnx.TensorProto.FLOAT)]),
    Case("ArgMin", [node("ArgMin", ["x"], ["i"], axis=1, keepdims=0), node("Cast", ["i"], to=onnx.TensorProto.FLOAT)]),
    Case("Einsum", [node("Einsum", ["x", "z"], equation="...ij,jk")], {**X3, "z": ((4, 5), F)}),
    Case("GatherElements", [node("GatherElements", ["x", "i"], axis=-2)], {**X3, "i": ((2, 2, 4), "int64")}),
    Case("DepthToSpace", [node("DepthToSpace", ["x"], blocksize=2, mode="CRD")], {"x": ((1, 8, 2, 3), F)}),
    Case("ScatterElements", [node("ScatterElements", ["x", "i", "u"], axis=-2, reduction="add")],
         {**X3, "i": ((2, 2, 4), "int64"), "u": ((2, 2, 4), F)}, opset=18),
    Case("ScatterND", [node("ScatterND", ["x", "i", "u"], reduction="none")], {**X3, "u": ((2, 4), F)},
         {"i": np.array([[1, -1], [0, 0]], np.int64)}, opset=18),
    Case("SpaceToDepth", [node("SpaceToDepth", ["x"], blocksize=2)], X4),
    Case("InstanceNormalization", [node("InstanceNormalization", ["x", "s", "b"], epsilon=1e-3)],
         inits={"s": w(3), "b": w(3)}),
    Case("ReduceProd", [node("ReduceProd", ["x", "a"], keepdims=1)], inits={"a": i64(-1)}, opset=18),
    Case("CumSum", [node("CumSum", ["x", "a"], exclusive=1, reverse=1)], inits={"a": np.array(-2, np.int64)}),
    Case("TopK", [node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0),
                  node("Cast", ["i"], ["c"], to=onnx.TensorProto.FLOAT), node("Add", ["v", "c"])], inits={"k": i64(2)}),
    Case("ReduceMin", [node("ReduceMin", ["x", "a"], keepdims=0)], inits={"a": i64(-1, 0)}, opset=18),
    *(Case(op, [node(op, ["x", "c"], ["b"]), node("Where", ["b", "x", "c"])], inits={"c": w(4)})
      for op in ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"]),
    *(Case(op, [node("Greater", ["x", "c"], ["p"]), node("Less", ["x", "d"], ["q"]), node(op, ["p", "q"], ["b"]),
                node("Where", ["b", "x", "d"])], inits={"c": w(4), "d": w(3, 1)}) for op in ["And", "Or", "Xor"]),
    Case("Not", [node("Greater", ["x", "c"], ["p"]), node("Not", ["p"], ["b"]), node("Where", ["b", "x", "c"])],
         inits={"c": w(4)}),
    Case("Gelu", [node("Gelu", ["x"], approximate="tanh")], opset=20),
    *(unary(op) for op in ["Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh"]),
    *(Case(op, [node("Tanh", ["x"], ["t"]), node(op, ["t"])]) for op in ["Asin", "Acos", "Atanh"]),
    Case("Acosh", [node("Abs", ["x"], ["a"]), node("Add", ["a", "c"], ["b"]), node("Acosh", ["b"])],
         inits={"c": np.float32(1.0)}),
    *(Case(op, [node("Div", ["x", "z"], ["q"]), node(op, ["q"], ["b"], **attrs), node("Where", ["b", "x", "z"])],
           {**X3, "z": ((3, 1), F)}) for op, attrs in [("IsNaN", {}), ("IsInf", {"detect_negative": 0})]),
    Case("Mod", [node("Mod", ["x", "c"], fmod=1)], inits={"c": np.abs(w(4)) + 0.5}),
    Case("Mod_int", [node("Mod", ["i", "c"]), ], {"i": ((2, 3), "int64")}, {"c": np.array([3, -2, 5], np.int64)}),
    Case("Tile", [node("Tile", ["x", "r"])], inits={"r": i64(2, 1, 3)}),
    *(Case(op, [node(op, ["x", "W", "R", "B"], ["y", "y_h"], hidden_size=5, direction="bidirectional")],
           inits={"W": w(2, gates * 5, 4), "R": w(2, gates * 5, 5), "B": w(2, 2 * gates * 5)}, outputs=("y", "y_h"))
      for op, gates in (("RNN", 1), ("GRU", 3), ("LSTM", 4))),
    Case("Clip", [node("Clip", ["x", "lo", "hi"])], inits={"lo": np.float32(-0.5), "hi": np.float32(0.7)}),
    Case("Add", [node("Add", ["x", "c"])], inits={"c": w(4)}),
    Case("Sub", [node("Sub", ["x", "z"])], {**X3, "z": ((3, 1), F)}),
    Case("Mul", [node("Mul", ["c", "x"])], inits={"c": w(3, 1)}),
    Case("Div", [node("Div", ["x", "c"])], inits={"c": np.abs(w(4)) + 1}),
    Case("Pow", [node("Pow", ["x", "e"])], inits={"e": np.float32(2.0)}),
    *(unary(op) for op in ["Neg", "Abs"]),
    Case("Max", [node("Max", ["x", "z", "c"])], {**X3, "z": ((3, 1), F)}, {"c": w(4)}),
    Case("Min", [node("Min", ["x", "c"])], inits={"c": w(4)}),
    Case("MaxPool", [node("MaxPool", ["x"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])], X4),
    Case("MaxPool_ceil", [node("MaxPool", ["x"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)],
         {"x": ((1, 2, 7, 7), F)}),
    Case("AveragePool", [node("AveragePool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1)], X4),
    Case("AveragePool_same", [node("AveragePool", ["x"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")],
         {"x": ((1, 2, 7, 7), F)}),
    Case("Gemm", [node("Gemm", ["a", "b", "c"], transB=1, alpha=0.5, beta=2.0)], {"a": ((3, 5), F)},
         {"b": w(4, 5), "c": w(4)}),
    Case("MatMul", [node("MatMul", ["x", "m"])], inits={"m": w(4, 5)}),
    Case("Flatten", [node("Flatten", ["x"], axis=2)], X4),
    Case("Flatten_negative", [node("Flatten", ["x"], axis=-1)]),
    Case("Reshape", [node("Reshape", ["x", "s"])], inits={"s": i64(0, -1)}),
    unary("Transpose"),
    Case("Transpose_perm", [node("Transpose", ["x"], perm=[0, 2, 1])]),
    Case("Squeeze", [node("Squeeze", ["x", "a"])], {"x": ((2, 1, 4, 1), F)}, {"a": i64(1, -1)}),
    Case("Squeeze_all", [node("Squeeze", ["x"])], {"x": ((2, 1, 4, 1), F)}),
    Case("Unsqueeze", [node("Unsqueeze", ["x", "a"])], inits={"a": i64(-1, 0)}),
    Case("Concat", [node("Concat", ["x", "c"], axis=-1)], inits={"c": w(2, 3, 2)}),
    Case("Split", [node("Split", ["x", "s"], ["y", "z"], axis=-1)], inits={"s": i64(1, 3)}, outputs=("y", "z")),
    Case("Split_equal", [node("Split", ["x"], ["y", "z"], axis=0)], outputs=("y", "z")),
    Case("Split_num_outputs", [node("Split", ["x"], ["y", "z", "t"], axis=1, num_outputs=3)], {"x": ((2, 7), F)},
         opset=18, outputs=("y", "z", "t")),
    Case("Slice", [node("Slice", ["x", "s", "e", "a", "t"])],
         inits={"s": i64(1, -1), "e": i64(1000, -4), "a": i64(2, 1), "t": i64(1, -1)}),
    Case("Slice_default_axes", [node("Slice", ["x", "s", "e"])], inits={"s": i64(1, 0), "e": i64(2, -1)}),
    Case("Gather", [node("Gather", ["x", "i"], axis=1)], inits={"i": np.array([[0, -1], [2, 1]], np.int64)}),
    Case("Gather_dynamic_indices", [node("Gather", ["e", "ids"])], {"ids": ((2, 5), "int64")}, {"e": w(3, 4)}),
    Case("LayerNormalization", [node("LayerNormalization", ["x", "s", "b"])], inits={"s": w(4), "b": w(4)}),
    Case("ReduceMean_attr", [node("ReduceMean", ["x"], axes=[-1])], opset=13),
    Case("ReduceMean_input", [node("ReduceMean", ["x", "a"], keepdims=0)], inits={"a": i64(0, 2)}, opset=18),
    Case("ReduceSum", [node("ReduceSum", ["x", "a"])], inits={"a": i64(1)}),
    Case("ReduceSum_all", [node("ReduceSum", ["x"], keepdims=0)]),
    Case("ReduceSum_noop", [node("ReduceSum", ["x"], noop_with_empty_axes=1)]),
    Case("Cast", [node("Cast", ["x"], to=onnx.TensorProto.INT32)]),
    Case("Expand", [node("Expand", ["x", "s"])], {"x": ((3, 1), F)}, {"s": i64(2, 3, 4)}),
    Case("Where", [node("Where", ["c", "x", "z"])], {**X3, "c": ((2, 3, 4), "bool")}, {"z": w(4)}),
    Case("Dropout", [node("Dropout", ["x", "r"])], inits={"r": np.float32(0.5)}),
    Case("Pad", [node("Pad", ["x", "p", "v"])], inits={"p": i64(0, 1, 2, 0, 0, 1), "v": np.float32(1.5)}),
    Case("Pad_reflect", [node("Pad", ["x", "p"], mode="reflect")], inits={"p": i64(0, 0, 1, 0, 0, 2)}),
    Case("Pad_edge", [node("Pad", ["x", "p"], mode="edge")], inits={"p": i64(0, 2, 1, 0, 1, 0)}),
    Case("Pad_axes", [node("Pad", ["x", "p", "", "a"])], inits={"p": i64(1, 2, 3, 4), "a": i64(-1, 0)}, opset=18),
    Case("Resize_scales", [node("Resize", ["x", "", "s"])], X4, {"s": np.array([1, 1, 2, 1.5], np.float32)}, opset=13),
    Case("Resize_sizes", [node("Resize", ["x", "", "", "s"], coordinate_transformation_mode="asymmetric",
                               nearest_mode="floor")], X4, {"s": i64(1, 3, 5, 12)}),
    Case("Resize_linear", [node("Resize", ["x", "", "s"], mode="linear",
                                coordinate_transformation_mode="align_corners")],
         X4, {"s": np.array([1, 1, 1.5, 0.5], np.float32)}),
    Case("Resize_axes", [node("Resize", ["x", "", "", "s"], axes=[2, 3])], X4, {"s": i64(4, 16)}, opset=19),
    *(Case(f"{op}_axes", [node(op, ["x", "a"], keepdims=0)], inits={"a": i64(-1, 0)}, opset=18)
      for op in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp")),
    Case("LpNormalization", [node("LpNormalization", ["x"], axis=1)]),
    unary("Shrink", lambd=0.7, bias=0.2),
    Case("OneHot", [node("OneHot", ["i", "d", "v"], axis=1)], {"i": ((2, 4), "int64")},
         {"d": i64(3), "v": np.array([-1.0, 2.0], np.float32)}),
    Case("Trilu", [node("Trilu", ["x", "k"], upper=0)], inits={"k": i64(1)}),
    Case("GatherND", [node("GatherND", ["x", "i"])], inits={"i": i64(1, -1, 0, 2, 1, 0).reshape(3, 2)}),
    Case("GatherND_batch_dims", [node("GatherND", ["x", "i"], batch_dims=1)],
         inits={"i": i64(2, 0, -1, 3).reshape(2, 1, 2)}),
    Case("Det_folded", [node("Det", ["m"], ["d"]), node("Mul", ["x", "d"])], inits={"m": w(2, 2)}),
    Case("DFT_real_onesided", [node("DFT", ["s"], axis=1, onesided=1)], {"s": ((2, 7, 1), F)}, atol=1e-5),
    Case("DFT_complex_inverse_padded", [node("DFT", ["s", "n"], axis=1, inverse=1)], {"s": ((2, 5, 3, 2), F)},
         {"n": np.array(7, np.int64)}, atol=1e-5),
    Case("DFT_cut_axis_input", [node("DFT", ["s", "n", "a"])], {"s": ((3, 6, 2), F)},
         {"n": np.array(4, np.int64), "a": np.array(-2, np.int64)}, opset=20, atol=1e-5),
    unary("Hardmax", axis=1),
    Case("EyeLike", [node("EyeLike", ["z"], ["e"], k=1), node("Add", ["z", "e"])], {"z": ((3, 4), F)}),
    unary("GlobalLpPool", p=2),
    Case("LpPool", [node("LpPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], p=1)], X4, opset=18),
    Case("MeanVarianceNormalization", [node("MeanVarianceNormalization", ["x"], axes=[0, 2])]),
    Case("LRN", [node("LRN", ["x"], size=3, alpha=0.1, beta=0.75, bias=1.5)], X4),
    Case("GroupNormalization", [node("GroupNormalization", ["x", "s", "b"], num_groups=3)], {"x": ((2, 6, 4), F)},
         {"s": w(6), "b": w(6)}, opset=21),
    Case("Constant", [node("Constant", [], ["k"], value=numpy_helper.from_array(w(4))), node("Add", ["x", "k"])]),
    Case("Shape_ConstantOfShape", [node("Shape", ["x"], ["s"], start=1), node("ConstantOfShape", ["s"], ["k"],
                                   value=numpy_helper.from_array(np.array([2.0], np.float32))),
                                   node("Mul", ["x", "k"])]),
]


def test_an_if_on_a_constant_reading_the_outer_graph_is_an_unsupported_op():
    """Ops outside the supported list pass the check before import when all their inputs are constants (they are
    folded: Det_folded above); an If's branches may read run-time values the node does not list, so it never does."""
    branch = [helper.make_graph([node(op, ["x"], [out])], out, [], [helper.make_tensor_value_info(out, 1, [2, 3, 4])])
              for op, out in (("Relu", "t"), ("Neg", "e"))]
    model = make_model([node("If", ["c"], then_branch=branch[0], else_branch=branch[1])], X3, ["y"],
                       {"c": np.array(True)})
    with pytest.raises(GraphError, match=r"node 'if\w*' \(If\): unsupported op"):
        import_onnx(model)


def test_cases_cover_every_supported_op():
    assert {n.op_type for c in CASES for n in c.nodes} >= SUPPORTED_OPS


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_imports_like_onnxruntime(case: Case):
    graph = check_import(case.model(), feeds_for(case.inputs), atol=case.atol)
    assert {n.op for n in graph} <= GRAPH_OPS
    assert all(isinstance(d, int) for v in graph.values.values() for d in v.shape)
    names = [n.name for n in graph]
    assert len(set(names)) == len(names) and all(re.fullmatch(r"[A-Za-z_]\w*", s) for s in names)


# ------------------------------------------------------------------------------- normalization contract
def imported(case: Case) -> Graph:
    """Import `case`, checked against ORT like every op case."""
    return check_import(case.model(), feeds_for(case.inputs))


@pytest.mark.parametrize(("auto_pad", "pads"), [("SAME_UPPER", (1, 1, 2, 2)), ("SAME_LOWER", (2, 2, 1, 1)),
                                                ("VALID", (0, 0, 0, 0))])
def test_conv_auto_pad_becomes_explicit_pads(auto_pad: str, pads: tuple[int, ...]):
    # 7 wide, kernel 4, stride 2: SAME gives ceil(7/2) = 4 outputs, which need 3 units of padding
    g = imported(Case("c", [node("Conv", ["x", "w"], strides=[2, 2], auto_pad=auto_pad)], {"x": ((1, 2, 7, 7), F)},
                      {"w": w(3, 2, 4, 4)}))
    (conv,) = g.nodes
    assert conv.attrs == {"kernel_shape": (4, 4), "strides": (2, 2), "dilations": (1, 1), "pads": pads, "group": 1}
    assert conv.inputs == ["x", "w"]


@pytest.mark.parametrize(("auto_pad", "pads"), [("SAME_UPPER", (0, 1)), ("SAME_LOWER", (1, 0))])
def test_conv_transpose_same_pads(auto_pad: str, pads: tuple[int, int]):
    # full output 2*(5-1) + 3 = 11, SAME wants 5*2 = 10: one unit of padding, at the end for SAME_UPPER
    g = imported(Case("ct", [node("ConvTranspose", ["x", "w"], strides=[2], auto_pad=auto_pad)],
                      {"x": ((1, 2, 5), F)}, {"w": w(2, 3, 3)}))
    (ct,) = g.nodes
    assert ct.attrs["pads"] == pads and ct.attrs["output_padding"] == (0,) and g.value("y").shape == (1, 3, 10)


def test_pool_defaults_filled():
    g = imported(Case("p", [node("MaxPool", ["x"], kernel_shape=[2, 2])], X4))
    assert g.nodes[0].attrs == {"kernel_shape": (2, 2), "strides": (1, 1), "dilations": (1, 1), "pads": (0, 0, 0, 0),
                                "ceil_mode": 0}


def test_slice_negative_steps_clamped():
    g = imported(Case("s", [node("Slice", ["x", "s", "e", "a", "t"])], {"x": ((5, 6, 7), F)},
                      {"s": i64(-1, 4, 2**62), "e": i64(-100, 0, 1), "a": i64(0, -2, 2), "t": i64(-1, -2, -3)}))
    (s,) = g.nodes
    assert s.inputs == ["x"]
    # axis 0: -1 -> 4, -100 -> -1 (through index 0); axis 2: a huge start clamps to dim - 1
    assert s.attrs == {"starts": (4, 4, 6), "ends": (-1, 0, 1), "axes": (0, 1, 2), "steps": (-1, -2, -3)}
    assert g.value("y").shape == (5, 2, 2)


def test_slice_positive_steps_clamped():
    g = imported(Case("s", [node("Slice", ["x", "s", "e"])], {"x": ((5, 6), F)},
                      {"s": i64(-9, 2), "e": i64(2**62, -1)}))
    assert g.nodes[0].attrs == {"starts": (0, 2), "ends": (5, 5), "axes": (0, 1), "steps": (1, 1)}


def test_split_by_num_outputs():
    g = imported(next(c for c in CASES if c.id == "Split_num_outputs"))
    (s,) = g.nodes
    assert s.inputs == ["x"] and s.attrs == {"axis": 1, "split": (3, 3, 1)}


def test_split_input_becomes_attribute():
    (s,) = imported(next(c for c in CASES if c.id == "Split")).nodes
    assert s.inputs == ["x"] and s.attrs == {"axis": 2, "split": (1, 3)}


def test_pad_axes_resolved_to_full_rank():
    (p,) = imported(next(c for c in CASES if c.id == "Pad_axes")).nodes
    # axes (-1, 0) with pads (1, 2 | 3, 4): axis 2 gets (1, 3), axis 0 gets (2, 4)
    assert p.inputs == ["x"] and p.attrs == {"pads": (2, 0, 1, 4, 0, 3), "mode": "constant", "value": 0.0}


def test_clip_inputs_become_attributes():
    (c,) = imported(next(c for c in CASES if c.id == "Clip")).nodes
    assert c.inputs == ["x"] and c.attrs == {"min": -0.5, "max": pytest.approx(0.7)}
    (c,) = imported(Case("c", [node("Clip", ["x", "", "hi"])], inits={"hi": np.float32(6)})).nodes
    assert c.inputs == ["x"] and c.attrs == {"min": -np.inf, "max": 6.0}


@pytest.mark.parametrize(("case_id", "attrs"), [
    ("Reshape", {"shape": (2, 12)}), ("Squeeze", {"axes": (1, 3)}), ("Squeeze_all", {"axes": (1, 3)}),
    ("Unsqueeze", {"axes": (0, 4)}), ("Expand", {"shape": (2, 3, 4)}), ("Flatten_negative", {"axis": 2}),
    ("Concat", {"axis": 2}), ("Softmax", {"axis": 2}), ("Transpose", {"perm": (2, 1, 0)}),
    ("LayerNormalization", {"axis": 2, "epsilon": pytest.approx(1e-5)}),
    ("ReduceMean_attr", {"axes": (2,), "keepdims": 1}), ("ReduceMean_input", {"axes": (0, 2), "keepdims": 0}),
    ("ReduceSum_all", {"axes": (0, 1, 2), "keepdims": 0}), ("Cast", {"to": "int32"}),
    ("Gemm", {"alpha": 0.5, "beta": 2.0, "transA": 0, "transB": 1}), ("LeakyRelu", {"alpha": pytest.approx(0.2)}),
    ("Gelu", {"approximate": "tanh"}), ("BatchNormalization", {"epsilon": pytest.approx(1e-3)}),
    ("Resize_sizes", {"mode": "nearest", "scales": (1.0, 1.0, 5 / 8, 1.5),
                      "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}),
    ("Resize_axes", {"mode": "nearest", "scales": (1.0, 1.0, 0.5, 2.0),
                     "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor"}),
])
def test_normalized_attributes(case_id: str, attrs: dict):
    case = next(c for c in CASES if c.id == case_id)
    (n,) = imported(case).nodes
    assert n.attrs == attrs
    if n.op in CONST_INPUTS:
        assert n.inputs == ["x"]  # compile-time parameters are attributes now


def test_dropout_and_noop_reduce_become_identity():
    for case_id in ("Dropout", "ReduceSum_noop"):
        (n,) = imported(next(c for c in CASES if c.id == case_id)).nodes
        assert n.op == "Identity" and n.inputs == ["x"]


def test_gather_negative_constant_indices_made_non_negative():
    g = imported(next(c for c in CASES if c.id == "Gather"))
    (n,) = g.nodes
    assert n.attrs == {"axis": 1}
    np.testing.assert_array_equal(g.constants[n.inputs[1]], [[0, 2], [2, 1]])


# ---------------------------------------------------------------------------------------- folding
def test_torch_style_shape_chain_folds_into_one_reshape():
    """x.view(x.size(0), -1) as torch exports it: Shape -> Gather -> Unsqueeze -> Concat -> Reshape."""
    nodes = [
        node("Shape", ["x"], ["shape"]),
        node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
        node("Gather", ["shape", "zero"], ["batch"], axis=0),
        node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        node("Concat", ["batch1", "minus1"], ["target"], axis=0),
        node("Reshape", ["x", "target"], ["flat"]),
        # torch's expand pattern: Where(Equal(shape, -1), ones, shape) feeding Expand
        node("ConstantOfShape", ["rank"], ["ones"], value=numpy_helper.from_array(np.array([1], np.int64))),
        node("Equal", ["want", "minus1_3"], ["is_default"]),
        node("Where", ["is_default", "ones", "want"], ["expand_to"]),
        node("Expand", ["bias", "expand_to"], ["bias_full"]),
        node("Add", ["flat", "bias_full"], ["y"]),
    ]
    inits = {"axes0": i64(0), "minus1": i64(-1), "rank": i64(2), "want": i64(2, -1), "minus1_3": i64(-1, -1),
             "bias": w(1, 48)}
    case = Case("chain", nodes, {"x": ((2, 3, 4, 4), F)}, inits)
    g = imported(case)
    assert [n.op for n in g] == ["Reshape", "Add"]
    assert g.nodes[0].inputs == ["x"] and g.nodes[0].attrs == {"shape": (2, 48)}
    assert g.is_constant("bias_full") and g.value("bias_full").shape == (2, 48)
    assert set(g.constants) == {"bias_full"} and set(g.values) == {"x", "flat", "bias_full", "y"}  # folded ones go


def test_shape_of_computed_value_is_constant():
    nodes = [node("Relu", ["x"], ["r"]), node("Shape", ["r"], ["s"]), node("Reshape", ["x", "s"], ["y"])]
    g = imported(Case("s", nodes))
    assert [n.op for n in g] == ["Relu", "Reshape"] and g.nodes[1].attrs == {"shape": (2, 3, 4)}


@pytest.mark.parametrize("opset", range(13, 22))
def test_every_supported_opset(opset: int):
    nodes = [node("Unsqueeze", ["x", "a"], ["u"]), node("Split", ["u", "sp"], ["s1", "s2"], axis=-1),
             node("Pad", ["s1", "p"], ["pd"]), node("Clip", ["pd", "lo"], ["c"]), node("Squeeze", ["c", "a"], ["q"]),
             node("ReduceSum", ["q", "ax"], ["y"], keepdims=0)]
    inits = {"a": i64(0), "sp": i64(1, 3), "p": i64(0, 0, 0, 1, 0, 0, 0, 2), "lo": np.float32(0), "ax": i64(-1)}
    g = imported(Case("opsets", nodes, inits=inits, opset=opset))
    assert [n.op for n in g] == ["Unsqueeze", "Split", "Pad", "Clip", "Squeeze", "ReduceSum"]


def test_initializer_graph_inputs_are_constants():
    model = make_model([node("Add", ["x", "c"])], {**X3, "c": ((4,), F)}, ["y"], {"c": w(4)})
    g = check_import(model, feeds_for(X3))
    assert g.inputs == ["x"] and g.is_constant("c")


def test_model_from_file_and_input_shapes_override(tmp_path):
    model = make_model([node("Relu", ["x"])], {"x": (("batch", 3), F)}, ["y"])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    with pytest.raises(GraphError, match=r"graph input 'x' has a dynamic shape \('batch', 3\).*input_shapes"):
        import_onnx(path)
    g = import_onnx(str(path), input_shapes={"x": (5, 3)})
    assert g.value("x").shape == (5, 3) and g.value("y").shape == (5, 3)
    np.testing.assert_array_equal(run_graph(g, {"x": np.ones((5, 3), np.float32)})[0], np.ones((5, 3)))
    with pytest.raises(GraphError, match=r"input_shapes names \['z'\]"):
        import_onnx(model, input_shapes={"z": (1,)})


def test_local_functions_are_inlined():
    fn = helper.make_function("custom", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 17)])
    model = make_model([helper.make_node("Double", ["x"], ["y"], domain="custom")], X3, ["y"])
    model.opset_import.append(helper.make_opsetid("custom", 1))
    model.functions.append(fn)
    g = import_onnx(model)
    assert [n.op for n in g] == ["Add"]


# ------------------------------------------------------------------------------------------ errors
def test_all_unsupported_ops_reported_at_once():
    nodes = [node("Relu", ["x"], ["r"]), node("NonZero", ["r"], ["nz"], name="my_nonzero"),
             node("Det", ["r"], ["d1"], name="det1"), node("Det", ["d1"], ["y"], name="det2")]
    model = make_model(nodes, {"x": ((3, 3, 3, 3), F)}, ["y"])
    with pytest.raises(GraphError) as err:
        import_onnx(model)
    message = str(err.value)
    assert "node 'my_nonzero' (NonZero): unsupported op" in message
    assert "node 'det1' (Det): unsupported op (and 1 more Det nodes)" in message
    assert "supported: Abs, Acos, Acosh, Add, And, ArgMax, ArgMin" in message


def test_unknown_domain_rejected():
    model = make_model([helper.make_node("FusedConv", ["x"], ["y"], name="fc", domain="com.microsoft")], X3, ["y"])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(GraphError, match=r"node 'fc' \(com.microsoft.FusedConv\): op of domain 'com.microsoft'"):
        import_onnx(model)


def test_a_newer_opset_is_read_at_21_when_it_means_the_same():
    """Opsets 22-25 mostly gave ops new element types: a model valid at opset 21 is read there (checked against
    ONNX Runtime running it at its own opset); one that is not, or a ceil_mode pool (its output size changed in
    22), is refused in one line."""
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Sin", ["c"], ["s"]),
             node("Transpose", ["s"], ["t"], perm=[0, 2, 3, 1]), node("Reshape", ["t", "shape"], ["y"])]
    consts = {"w": w(4, 3, 3, 3), "shape": np.array([1, -1], np.int64)}
    for opset in (22, 23, 25):
        check_import(make_model(nodes, X4, ["y"], consts, opset=opset), feeds_for(X4))
    cast = make_model([node("Cast", ["x"], ["y"], to=onnx.TensorProto.FLOAT4E2M1)], X3, ["y"], opset=23)
    with pytest.raises(GraphError, match="opset 23; tensorgen imports opsets 13–21, and it is not the same model at "
                                         "opset 21: ") as err:
        import_onnx(cast)
    assert "\n" not in str(err.value)
    pool = make_model([node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], ceil_mode=1)], X4, ["y"], opset=22)
    with pytest.raises(GraphError, match="ceil_mode=1, whose output size changed in opset 22"):
        import_onnx(pool)


def test_an_older_opset_is_upgraded_and_computes_what_onnxruntime_does_on_the_original():
    """Opset 9: Clip's bounds, Pad's, Slice's, ReduceSum's, Squeeze's and Unsqueeze's axes as attributes, and
    Upsample (Resize since opset 10): ONNX's version converter moves them to opset 13, checked against ONNX Runtime
    running the opset-9 model itself."""
    nodes = [node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), node("Clip", ["c"], ["cl"], min=-1.0, max=1.0),
             node("Upsample", ["cl", "sc"], ["u"], mode="nearest"),
             node("Pad", ["u"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1], mode="constant", value=0.5),
             node("Slice", ["p"], ["s"], starts=[1], ends=[17], axes=[2]),
             node("ReduceSum", ["s"], ["r"], axes=[3], keepdims=1), node("Squeeze", ["r"], ["q"], axes=[3]),
             node("Unsqueeze", ["q"], ["y"], axes=[0])]
    model = make_model(nodes, X4, ["y"], {"w": w(4, 3, 3, 3), "sc": np.array([1, 1, 2, 2], np.float32)}, opset=9)
    graph = check_import(model, feeds_for(X4))
    assert "Resize" in {n.op for n in graph}


def test_an_older_opset_the_converter_cannot_upgrade_is_one_line():
    with pytest.raises(GraphError, match=r"opset 9; tensorgen imports opsets 13–21, and ONNX's version converter "
                                         r"cannot upgrade it: RuntimeError: .*Det"):
        import_onnx(make_model([node("Det", ["x"])], {"x": ((2, 3, 3), F)}, ["y"], opset=9))


def test_bad_and_missing_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07 this is not a protobuf \xff\xff")
    with pytest.raises(GraphError, match="bad.onnx"):
        import_onnx(bad)
    with pytest.raises(GraphError, match=r"ONNX file '.*missing.onnx' does not exist"):
        import_onnx(tmp_path / "missing.onnx")


SCALES = {"s": np.array([1, 1, 2, 2], np.float32)}


@pytest.mark.parametrize(("nodes", "inputs", "inits", "message"), [
    ([node("Reshape", ["x", "s"], name="r")], {**X3, "s": ((2,), "int64")}, {},
     r"node 'r' \(Reshape\): input 's' \(shape\) must be a constant"),
    ([node("Range", ["s", "n", "d"], name="rg")], {"n": ((), F)}, {"s": np.float32(0), "d": np.float32(1)},
     r"node 'rg' \(Range\): supported only when all its inputs are constants.*'n' is computed at run time"),
    ([node("MaxPool", ["x"], ["y", "idx"], name="mp", kernel_shape=[2, 2])], X4, {},
     r"node 'mp' \(MaxPool\): output 'idx' \(Indices\) is used"),
    ([node("BatchNormalization", ["x", "g", "g", "g", "g"], name="bn", training_mode=1)], X3, {"g": w(3)},
     r"node 'bn' \(BatchNormalization\): shape inference failed.*Training_mode = True"),
    ([node("Dropout", ["x", "", "t"], name="do")], X3, {"t": np.array(True)}, r"node 'do' \(Dropout\): training_mode"),
    ([node("Resize", ["x", "", "s"], name="rz", mode="cubic")], X4, SCALES, r"node 'rz' \(Resize\): mode 'cubic'"),
    ([node("Resize", ["x", "", "s"], name="rz", coordinate_transformation_mode="tf_crop_and_resize")], X4, SCALES,
     r"node 'rz' \(Resize\): coordinate_transformation_mode 'tf_crop_and_resize'"),
    ([node("ConvTranspose", ["x", "cw"], name="ct", strides=[2], auto_pad="SAME_UPPER", output_padding=[1])],
     {"x": ((1, 2, 5), F)}, {"cw": w(2, 3, 3)}, r"node 'ct' \(ConvTranspose\): pads \(1, 1\) give spatial output"),
    ([node("Clip", ["x", "lo"], name="clip")], {**X3, "lo": ((), F)}, {}, r"node 'clip' \(Clip\): input 'lo' \(min\)"),
    ([node("Clip", ["x", "lo"], name="clip")], X3, {"lo": w(3)}, r"node 'clip' \(Clip\): input 'lo' must be a scalar"),
    ([node("Gather", ["x", "i"], name="ga")], X3, {"i": i64(2)}, r"node 'ga' \(Gather\): indices 2..2 out of range"),
    ([node("Slice", ["x", "s", "e", "a", "t"], name="sl")], X3,
     {"s": i64(0), "e": i64(1), "a": i64(0), "t": i64(0)}, r"node 'sl' \(Slice\): .*'step' cannot be 0"),
    ([node("Transpose", ["x"], name="tr", perm=[1, 0])], X3, {}, r"node 'tr' \(Transpose\): perm \[1, 0\] is not"),
    ([node("ReduceSum", ["x", "a"], name="rs")], X3, {"a": i64(0, -3)},
     r"node 'rs' \(ReduceSum\): axes \[0, -3\] repeat"),
    ([node("Relu", ["nowhere"], name="relu")], X3, {}, r"node 'relu' \(Relu\) reads 'nowhere'"),
    ([node("Gelu", ["x"], name="g")], X3, {}, r"node 'g' \(Gelu\): Gelu is not defined in ONNX opset 17"),
    ([node("Add", ["x", "z"], name="add")], {**X3, "z": ((5,), F)}, {}, r"node 'add' \(Add\): shape inference failed"),
])
def test_errors_name_node_and_op(nodes, inputs, inits, message):
    model = make_model(nodes, inputs, [o for o in nodes[-1].output if o], inits)
    with pytest.raises(GraphError, match=message):
        import_onnx(model)
