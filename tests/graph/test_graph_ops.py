"""Every supported op on a hand-built one-node Graph, run node by node (tensorgen.graph.reference.interpret) and
compared with ONNX Runtime running the equivalent ONNX model; attribute variants, errors, op kinds."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph.ir import Graph, GraphError, Node, Value
from tensorgen.graph.ops import SUPPORTED_OPS, lower_node, op_kind
from tensorgen.graph.reference import interpret
from tensorgen.graph.reference.interpret import run_nodewise
from tensorgen.te.expr import Call, Cast, walk
from tensorgen.te.tensor import placeholder

OPSET = 21
RNG = np.random.default_rng(0)


class C:
    """A constant input (an initializer in ONNX, a graph constant in tensorgen)."""

    def __init__(self, array):
        self.array = np.asarray(array)


def rand(*shape, dtype="float32", low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(dtype)


def _onnx_outputs(op, args, attrs, n_out):
    """Run `op` on `args` (arrays, C constants, None for omitted) with ONNX Runtime."""
    names, inits, graph_inputs, feeds = [], [], [], {}
    for k, a in enumerate(args):
        if a is None:
            names.append("")
            continue
        name = f"a{k}"
        names.append(name)
        if isinstance(a, C):
            inits.append(numpy_helper.from_array(a.array, name))
        else:
            dtype = helper.np_dtype_to_tensor_dtype(a.dtype)
            graph_inputs.append(helper.make_tensor_value_info(name, dtype, a.shape))
            feeds[name] = a
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs, [helper.make_value_info(o, helper.TypeProto()) for o in outs],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(op, args, attrs=None, onnx_attrs=None, onnx_args=None, outputs=1, rtol=1e-5, atol=1e-6):
    """The one-node Graph (normalized `attrs`) run node by node equals ONNX Runtime on the ONNX form
    (`onnx_attrs` / `onnx_args`, the same by default); returns tensorgen's outputs."""
    attrs = attrs or {}
    expected = _onnx_outputs(op, onnx_args if onnx_args is not None else args,
                             attrs if onnx_attrs is None else onnx_attrs, outputs)
    values, constants, inputs, feeds = {}, {}, [], {}
    for k, a in enumerate(args):
        if a is None:
            inputs.append("")
            continue
        name = f"a{k}"
        inputs.append(name)
        array = a.array if isinstance(a, C) else a
        values[name] = Value(name, array.shape, array.dtype.name)
        if isinstance(a, C):
            constants[name] = array
        else:
            feeds[name] = array
    outs = [f"y{k}" for k in range(outputs)]
    values.update({o: Value(o, e.shape, e.dtype.name) for o, e in zip(outs, expected)})
    graph = Graph("g", list(feeds), outs, [Node(op, f"{op.lower()}_1", inputs, outs, attrs)], values, constants)
    got = run_nodewise(graph, feeds)
    for o, e in zip(outs, expected):
        assert got[o].shape == e.shape and got[o].dtype == e.dtype
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(got[o], e)
        else:
            np.testing.assert_allclose(got[o], e, rtol=rtol, atol=atol)
    return [got[o] for o in outs]


# ---- element-wise -----------------------------------------------------------------------------

UNARY = ["Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "Identity", "HardSwish"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    check(op, [rand(2, 3, 5)])


@pytest.mark.parametrize("op", ["Sqrt", "Reciprocal"])
def test_unary_positive(op):
    check(op, [rand(4, 7, low=0.1, high=3.0)])


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs"])
def test_unary_int(op):
    check(op, [RNG.integers(-50, 50, (3, 4)).astype("int32")])


@pytest.mark.parametrize("op, attrs", [("LeakyRelu", {"alpha": 0.1}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                       ("Gelu", {"approximate": "none"}), ("Gelu", {"approximate": "tanh"})])
def test_unary_attrs(op, attrs):
    check(op, [rand(3, 8)], attrs)


@pytest.mark.parametrize("low, high", [(-0.5, 0.7), (-np.inf, 0.2), (-0.3, np.inf)])
def test_clip(low, high):
    x = rand(4, 5)
    bounds = [C(np.float32(v)) if np.isfinite(v) else None for v in (low, high)]
    check("Clip", [x], {"min": low, "max": high}, onnx_args=[x, *bounds], onnx_attrs={})


def test_clip_int():
    x = RNG.integers(-9, 9, (4, 5)).astype("int64")
    check("Clip", [x], {"min": -2.5, "max": 3.0}, onnx_args=[x, C(np.int64(-2)), C(np.int64(3))], onnx_attrs={})


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((1,), (2, 3))])
def test_binary_broadcast(op, shapes):
    a, b = rand(*shapes[0]), rand(*shapes[1], low=0.5, high=2.0)
    check(op, [a, b])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_scalar_constant_is_a_literal(op):
    x = rand(2, 5, low=0.5)
    check(op, [x, C(np.float32(0.75))])
    check(op, [C(np.float32(1.5)), x])
    node = Node(op, "n", ["x", "k"], ["y"])
    graph = Graph("g", ["x"], ["y"], [node], {"x": Value("x", (2, 5), "float32"), "k": Value("k", (), "float32"),
                                             "y": Value("y", (2, 5), "float32")}, {"k": np.array(0.75, "float32")})
    read = []
    (y,) = lower_node(node, graph, lambda name: read.append(name) or placeholder((2, 5), name=name))
    assert read == ["x"]  # the constant never becomes a tensor read


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_int(op):
    a = RNG.integers(-20, 20, (3, 4)).astype("int32")
    b = RNG.choice([-7, -3, -1, 2, 5], (4,)).astype("int32")
    check(op, [a, b])


def test_max_min_variadic():
    check("Max", [rand(2, 3), rand(3), rand(2, 1)])
    check("Min", [rand(2, 3), C(np.float32(0.1)), rand(1, 3)])
    check("Max", [rand(4)])


@pytest.mark.parametrize("exponent", [2.0, 0.5, 1.0, 3.0, -1.5])
def test_pow_scalar_exponent(exponent):
    check("Pow", [rand(3, 4, low=0.2, high=2.0), C(np.float32(exponent))], rtol=1e-5)


def test_pow_specializations():
    def calls(exponent):
        node = Node("Pow", "p", ["x", "e"], ["y"])
        values = {"x": Value("x", (4,), "float32"), "e": Value("e", (), "float32"), "y": Value("y", (4,), "float32")}
        graph = Graph("g", ["x"], ["y"], [node], values, {"e": np.array(exponent, "float32")})
        (y,) = lower_node(node, graph, lambda name: placeholder((4,), name=name))
        return {n.name for n in walk(y.body) if isinstance(n, Call)}

    assert calls(2.0) == set() and calls(1.0) == set()
    assert calls(0.5) == {"sqrt"} and calls(3.0) == {"pow"}


def test_pow_tensor_exponent_and_int_base():
    check("Pow", [rand(3, 4, low=0.5, high=2.0), rand(4, low=-2, high=2)])
    check("Pow", [np.array([1, 2, 3, -2], "int32"), np.array([4, 5, 2, 3], "int32")])


def test_cast():
    x = rand(3, 4, low=-50, high=50)
    check("Cast", [x], {"to": "int32"}, onnx_attrs={"to": TensorProto.INT32})
    check("Cast", [x], {"to": "float64"}, onnx_attrs={"to": TensorProto.DOUBLE})
    check("Cast", [np.array([True, False, True])], {"to": "float32"}, onnx_attrs={"to": TensorProto.FLOAT})


def test_where():
    cond = RNG.random((3, 4)) > 0.5
    check("Where", [cond, rand(3, 4), rand(4)])
    check("Where", [cond[:1], C(np.float32(1.0)), rand(3, 1)])


def test_batch_norm():
    c = 3
    stats = [rand(c), rand(c), rand(c), rand(c, low=0.5, high=2.0)]
    check("BatchNormalization", [rand(2, c, 4, 5), *map(C, stats)], {"epsilon": 1e-3})
    check("BatchNormalization", [rand(4, c), *map(C, stats)], {"epsilon": 1e-5})


# ---- compute-intensive ------------------------------------------------------------------------


def conv_attrs(kernel, strides=None, dilations=None, pads=None, group=1):
    nd = len(kernel)
    return {"kernel_shape": kernel, "strides": strides or (1,) * nd, "dilations": dilations or (1,) * nd,
            "pads": pads or (0,) * (2 * nd), "group": group}


@pytest.mark.parametrize("x, w, attrs, bias", [
    ((1, 3, 9, 9), (4, 3, 3, 3), conv_attrs((3, 3), pads=(1, 1, 1, 1)), True),
    ((2, 4, 10, 8), (6, 2, 3, 2), conv_attrs((3, 2), strides=(2, 1), pads=(0, 1, 2, 0), group=2), False),
    ((1, 4, 9, 9), (4, 1, 3, 3), conv_attrs((3, 3), dilations=(2, 2), pads=(2, 2, 2, 2), group=4), True),
    ((1, 2, 12), (3, 2, 3), conv_attrs((3,), strides=(2,), pads=(1, 0)), True),
    ((1, 2, 5, 6, 4), (3, 2, 3, 3, 2), conv_attrs((3, 3, 2), pads=(1, 0, 1, 0, 1, 0)), True),
], ids=["2d-bias", "grouped-strided-asym", "depthwise-dilated", "1d", "3d"])
def test_conv(x, w, attrs, bias):
    args = [rand(*x), C(rand(*w))] + ([C(rand(w[0]))] if bias else [])
    check("Conv", args, attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("x, w, attrs", [
    ((1, 3, 4, 5), (3, 2, 3, 3), conv_attrs((3, 3), strides=(2, 2))),
    ((1, 2, 5, 5), (2, 3, 3, 3), conv_attrs((3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ((1, 2, 4, 4), (2, 2, 3, 3), conv_attrs((3, 3), strides=(3, 2), pads=(1, 0, 2, 1))),
    ((1, 2, 4, 4), (2, 2, 2, 2), conv_attrs((2, 2), dilations=(2, 2))),
    ((1, 4, 3, 3), (4, 1, 3, 3), conv_attrs((3, 3), strides=(2, 2), group=2)),
    ((1, 2, 6), (2, 3, 4), conv_attrs((4,), strides=(2,), pads=(1, 2))),
    ((1, 1, 2, 3, 2), (1, 2, 2, 2, 2), conv_attrs((2, 2, 2), strides=(2, 1, 2))),
    ((1, 3, 3, 4), (3, 2, 4, 4), conv_attrs((4, 4), strides=(2, 2), pads=(1, 1, 1, 1))),  # gathered (k % s == 0)
    ((1, 2, 3, 3), (2, 2, 6, 4), conv_attrs((6, 4), strides=(3, 2), pads=(2, 0, 1, 3))),
], ids=["strided", "padded", "asym-pads", "dilated", "grouped", "1d", "3d", "k4s2", "gathered-asym"])
def test_conv_transpose(x, w, attrs):
    check("ConvTranspose", [rand(*x), C(rand(*w)), C(rand(w[1] * attrs["group"]))],
          {**attrs, "output_padding": (0,) * len(attrs["kernel_shape"])}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", [3, 4])
def test_conv_transpose_output_padding(k):
    attrs = {**conv_attrs((k, k), strides=(2, 2), pads=(1, 1, 1, 1)), "output_padding": (1, 1)}
    check("ConvTranspose", [rand(1, 2, 4, 4), C(rand(2, 3, k, k))], attrs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ta, tb, with_c, alpha, beta", [
    (0, 0, None, 1.0, 1.0), (1, 0, (5,), 1.0, 1.0), (0, 1, (4, 5), 0.5, 2.0), (1, 1, (4, 1), 1.0, 0.0),
    (0, 0, (), 2.0, 1.0)])
def test_gemm(ta, tb, with_c, alpha, beta):
    a = rand(*((6, 4) if ta else (4, 6)))
    b = rand(*((5, 6) if tb else (6, 5)))
    args = [a, C(b)] + ([] if with_c is None else [C(rand(*with_c))])
    check("Gemm", args, {"alpha": alpha, "beta": beta, "transA": ta, "transB": tb}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa, sb", [((4, 6), (6, 5)), ((2, 3, 4, 6), (6, 5)), ((2, 1, 4, 6), (3, 6, 5)),
                                    ((6,), (6, 5)), ((2, 4, 6), (6,)), ((6,), (6,))])
def test_matmul(sa, sb):
    check("MatMul", [rand(*sa), rand(*sb)], rtol=1e-5, atol=1e-5)


def test_matmul_int():
    check("MatMul", [RNG.integers(-5, 5, (3, 4)).astype("int64"), RNG.integers(-5, 5, (4, 2)).astype("int64")])


# ---- reductions -------------------------------------------------------------------------------


def pool_attrs(kernel, strides=None, dilations=None, pads=None, ceil_mode=0):
    nd = len(kernel)
    return {"kernel_shape": kernel, "strides": strides or (1,) * nd, "dilations": dilations or (1,) * nd,
            "pads": pads or (0,) * (2 * nd), "ceil_mode": ceil_mode}


POOLS = [
    ((1, 2, 8, 8), pool_attrs((2, 2), strides=(2, 2))),
    ((1, 2, 7, 9), pool_attrs((3, 3), strides=(2, 2), pads=(1, 1, 1, 1))),
    ((1, 2, 7, 7), pool_attrs((3, 2), strides=(2, 2), pads=(1, 0, 0, 1), ceil_mode=1)),
    ((1, 2, 9, 9), pool_attrs((2, 2), strides=(1, 2), dilations=(2, 2), pads=(1, 1, 1, 1))),
    ((2, 3, 11), pool_attrs((3,), strides=(2,), pads=(1, 1), ceil_mode=1)),
    ((1, 2, 5, 4, 6), pool_attrs((2, 2, 3), strides=(2, 1, 2), pads=(0, 1, 1, 1, 0, 1))),
]
POOL_IDS = ["2x2", "3x3-padded", "ceil-asym", "dilated", "1d-ceil", "3d"]


@pytest.mark.parametrize("shape, attrs", POOLS, ids=POOL_IDS)
def test_max_pool(shape, attrs):
    check("MaxPool", [rand(*shape)], attrs)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("shape, attrs", POOLS, ids=POOL_IDS)
def test_average_pool(shape, attrs, include_pad):
    check("AveragePool", [rand(*shape)], {**attrs, "count_include_pad": include_pad})


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 5, 6), (1, 2, 3, 4, 5)])
def test_global_average_pool(shape):
    check("GlobalAveragePool", [rand(*shape)])


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_softmax(axis):
    check("Softmax", [rand(2, 3, 4)], {"axis": axis})


@pytest.mark.parametrize("shape, axis, affine, stats", [
    ((4, 6), 1, "both", False), ((2, 3, 4), 1, "scale", True), ((2, 3, 4), 2, "broadcast", True),
    ((3, 5), 0, "scale", False)])
def test_layer_norm(shape, axis, affine, stats):
    inner = shape[axis:]
    args = [rand(*shape)]
    if affine != "none":
        args.append(C(rand(*(inner[-1:] if affine == "broadcast" else inner))))
    if affine in ("both", "broadcast"):
        args.append(C(rand(*inner)))
    check("LayerNormalization", args, {"axis": axis, "epsilon": 1e-5}, outputs=3 if stats else 1,
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean"])
@pytest.mark.parametrize("axes, keepdims", [((1,), 1), ((0, 2), 0), ((0, 1, 2), 0), ((2,), 0)])
def test_reduce(op, axes, keepdims):
    x = rand(3, 4, 5)
    check(op, [x], {"axes": axes, "keepdims": keepdims}, onnx_attrs={"keepdims": keepdims},
          onnx_args=[x, C(np.array(axes, "int64"))], rtol=1e-5, atol=1e-5)


def test_reduce_sum_int():
    x = RNG.integers(-9, 9, (3, 4)).astype("int64")
    check("ReduceSum", [x], {"axes": (0,), "keepdims": 0}, onnx_attrs={"keepdims": 0},
          onnx_args=[x, C(np.array([0], "int64"))])


# ---- injective --------------------------------------------------------------------------------


def test_reshape_family():
    x = rand(2, 3, 4)
    check("Reshape", [x], {"shape": (6, 4)}, onnx_args=[x, C(np.array([6, -1], "int64"))], onnx_attrs={})
    check("Flatten", [x], {"axis": 2})
    check("Flatten", [x], {"axis": 0})
    y = rand(2, 1, 4, 1)
    check("Squeeze", [y], {"axes": (1, 3)}, onnx_args=[y, C(np.array([1, 3], "int64"))], onnx_attrs={})
    check("Unsqueeze", [x], {"axes": (0, 4)}, onnx_args=[x, C(np.array([0, 4], "int64"))], onnx_attrs={})


def test_expand():
    x = rand(3, 1)
    check("Expand", [x], {"shape": (2, 3, 4)}, onnx_args=[x, C(np.array([2, 1, 4], "int64"))], onnx_attrs={})


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 0, 1), (0, 1, 2)])
def test_transpose(perm):
    check("Transpose", [rand(2, 3, 4)], {"perm": perm})


def test_concat():
    check("Concat", [rand(2, 3), C(rand(2, 1)), rand(2, 4)], {"axis": 1})
    check("Concat", [rand(1, 3), rand(2, 3)], {"axis": 0})


def test_split():
    x = rand(7, 4)
    check("Split", [x], {"axis": 0, "split": (2, 5)}, onnx_args=[x, C(np.array([2, 5], "int64"))], onnx_attrs={},
          outputs=2)
    check("Split", [x], {"axis": 1, "split": (2, 2)}, onnx_attrs={"axis": 1, "num_outputs": 2}, outputs=2)


@pytest.mark.parametrize("starts, ends, axes, steps", [
    ((1, 0), (3, 4), (0, 1), (1, 2)),
    ((4,), (-1,), (1,), (-1,)),     # whole axis reversed: an end of -1 means 'through index 0'
    ((3, 5), (0, 1), (0, 1), (-2, -3)),
    ((0,), (2,), (2,), (1,)),
])
def test_slice(starts, ends, axes, steps):
    x = rand(4, 6, 3)
    onnx_ends = [e if e >= 0 else -100 for e in ends]
    onnx_args = [x, *(C(np.array(v, "int64")) for v in (starts, onnx_ends, axes, steps))]
    check("Slice", [x], {"starts": starts, "ends": ends, "axes": axes, "steps": steps}, onnx_args=onnx_args,
          onnx_attrs={})


@pytest.mark.parametrize("axis, indices", [(0, np.array([[0, 2], [1, 0]])), (1, np.array([3, -1, 0])),
                                           (1, np.array(2)), (2, np.array([-2]))])
def test_gather(axis, indices):
    x = rand(3, 4, 5)
    check("Gather", [x, indices.astype("int64")], {"axis": axis})
    check("Gather", [x, C(indices.astype("int32"))], {"axis": axis})


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad(mode):
    x = rand(2, 4, 5)
    pads = (0, 1, 2, 1, 3, 0)
    onnx_args = [x, C(np.array(pads, "int64")), C(np.float32(1.5))]
    check("Pad", [x], {"pads": pads, "mode": mode, "value": 1.5}, onnx_args=onnx_args, onnx_attrs={"mode": mode})


def test_pad_negative_crops():
    x = rand(4, 5)
    pads = (-1, 2, 1, -2)
    check("Pad", [x], {"pads": pads, "mode": "constant", "value": 0.0},
          onnx_args=[x, C(np.array(pads, "int64"))], onnx_attrs={})


@pytest.mark.parametrize("scales, mode, nearest", [
    ((1, 1, 2, 2), "asymmetric", "floor"),
    ((1, 1, 2, 3), "half_pixel", "round_prefer_floor"),
    ((1, 1, 0.5, 0.5), "half_pixel", "round_prefer_ceil"),
    ((1, 1, 1.5, 2.5), "align_corners", "round_prefer_floor"),
    ((1, 1, 3, 0.75), "pytorch_half_pixel", "ceil"),
    ((1, 1, 1.7, 2), "half_pixel_symmetric", "round_prefer_ceil"),
    ((1, 1, 0.6, 1.3), "asymmetric", "round_prefer_floor"),
])
def test_resize_nearest(scales, mode, nearest):
    x = rand(1, 2, 4, 8)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": mode, "nearest_mode": nearest}
    check("Resize", [x], {"mode": "nearest", "scales": scales, "coordinate_transformation_mode": mode,
                          "nearest_mode": nearest},
          onnx_args=[x, None, C(np.array(scales, "float32"))], onnx_attrs=attrs)


# ---- kinds, errors, the interpreter ----------------------------------------------------------


def test_supported_ops_and_kinds():
    assert SUPPORTED_OPS == set(
        "Conv ConvTranspose BatchNormalization Relu LeakyRelu Clip Sigmoid Tanh Erf Gelu HardSigmoid HardSwish Add "
        "Sub Mul Div Pow Sqrt Reciprocal Exp Neg Abs Max Min MaxPool AveragePool GlobalAveragePool Gemm MatMul "
        "Flatten Reshape Transpose Squeeze Unsqueeze Concat Split Slice Gather Softmax LayerNormalization "
        "ReduceMean ReduceSum Cast Identity Pad Resize Expand Where Log Elu Selu Celu ThresholdedRelu Softplus "
        "Softsign Mish PRelu Sum Mean GlobalMaxPool LogSoftmax Equal Less Greater LessOrEqual GreaterOrEqual Not And "
        "Or Xor ReduceMax ReduceMin InstanceNormalization ArgMax ArgMin Floor Ceil Round Sign IsNaN IsInf Mod Sin Cos "
        "Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Tile CumSum TopK ReduceProd Einsum "
        "GatherElements DepthToSpace SpaceToDepth ReduceL1 ReduceL2 "
        "ReduceSumSquare ReduceLogSumExp LRN Shrink ScatterElements ScatterND".split())
    kinds = {op: op_kind(Node(op, "n", [], [])) for op in SUPPORTED_OPS}
    assert {op for op, k in kinds.items() if k == "compute"} == {"Conv", "ConvTranspose", "Gemm", "MatMul", "Einsum"}
    assert {op for op, k in kinds.items() if k == "reduce"} == {
        "Softmax", "LogSoftmax", "LayerNormalization", "ReduceMean", "ReduceSum", "MaxPool", "AveragePool",
        "GlobalAveragePool", "GlobalMaxPool", "ReduceMax", "ReduceMin", "InstanceNormalization", "ArgMax", "ArgMin",
        "CumSum", "TopK", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp", "LRN",
        "ScatterElements", "ScatterND"}
    assert {op for op, k in kinds.items() if k == "injective"} == {
        "Reshape", "Transpose", "Slice", "Concat", "Pad", "Gather", "Expand", "Resize", "Split", "Flatten",
        "Squeeze", "Unsqueeze", "Tile", "GatherElements", "DepthToSpace", "SpaceToDepth"}
    assert kinds["BatchNormalization"] == kinds["Cast"] == kinds["Add"] == "elemwise"


def _lower(op, inputs, outputs, attrs=None, constants=None, name="my/node.1"):
    values = {n: Value(n, s, d) for n, (s, d) in {**inputs, **outputs}.items()}
    node = Node(op, name, list(inputs), list(outputs), attrs or {})
    graph = Graph("g", list(inputs), list(outputs), [node], values, constants or {})
    return lower_node(node, graph, lambda n: placeholder(values[n].shape or (1,), values[n].dtype, n))


def test_stage_names_and_tags():
    (y,) = _lower("Conv", {"x": ((1, 3, 8, 8), "float32"), "w": ((4, 3, 3, 3), "float32")},
                  {"y": ((1, 4, 8, 8), "float32")}, conv_attrs((3, 3), pads=(1, 1, 1, 1)))
    assert y.name == "my_node_1" and y.tag == "conv2d"
    (m,) = _lower("MatMul", {"a": ((2, 3, 4), "float32"), "b": ((4, 5), "float32")}, {"m": ((2, 3, 5), "float32")},
                  name="7")
    assert m.name == "mat_mul_7" and m.tag == "batch_matmul"


@pytest.mark.parametrize("op, inputs, outputs, attrs, message", [
    ("Hardmax", {"x": ((3,), "float32")}, {"y": ((3,), "float32")}, {}, "not supported"),
    ("Relu", {"x": ((3,), "float16")}, {"y": ((3,), "float16")}, {}, "float16"),
    ("Sigmoid", {"x": ((3,), "int32")}, {"y": ((3,), "int32")}, {}, "Sigmoid supports float32, float64"),
    ("Gelu", {"x": ((3,), "float32")}, {"y": ((3,), "float32")}, {"approximate": "erf"}, "approximate"),
    ("LeakyRelu", {"x": ((3,), "float32")}, {"y": ((3,), "float32")}, {}, "attribute 'alpha' is missing"),
    ("MaxPool", {"x": ((1, 1, 4, 4), "float32")}, {"y": ((1, 1, 2, 2), "float32"), "i": ((1, 1, 2, 2), "int64")},
     pool_attrs((2, 2), strides=(2, 2)), "Indices"),
    ("Pad", {"x": ((3, 4), "float32")}, {"y": ((3, 9), "float32")},
     {"pads": (0, 0, 0, 5), "mode": "reflect", "value": 0.0}, "smaller than the dims"),
    ("Slice", {"x": ((3, 4), "float32")}, {"y": ((3, 0), "float32")},
     {"starts": (2,), "ends": (2,), "axes": (1,), "steps": (1,)}, "empty"),
    ("Conv", {"x": ((1, 3, 8, 8), "float32"), "w": ((4, 2, 3, 3), "float32")}, {"y": ((1, 4, 6, 6), "float32")},
     conv_attrs((3, 3)), "channel mismatch"),
    ("Add", {"a": ((3,), "float32"), "b": ((3,), "float32")}, {"y": ((4,), "float32")}, {}, "do not broadcast"),
    ("Transpose", {"x": ((2, 3), "float32")}, {"y": ((2, 3), "float32")}, {"perm": (1, 0)},
     r"produced float32\[3, 2\] for output 'y'"),
])
def test_errors_name_the_node(op, inputs, outputs, attrs, message):
    with pytest.raises(GraphError, match=message) as err:
        _lower(op, inputs, outputs, attrs)
    assert f"'my/node.1' ({op})" in str(err.value)


def _add_graph():
    values = {"x": Value("x", (2, 3), "float32"), "y": Value("y", (2, 3), "float32")}
    return Graph("g", ["x"], ["y"], [Node("Relu", "r", ["x"], ["y"])], values)


@pytest.mark.parametrize("feeds, message", [
    ({}, "input 'x' .* is missing"),
    ({"x": np.zeros((2, 3), "float32"), "z": np.zeros(1)}, "no input"),
    ({"x": np.zeros((3, 2), "float32")}, r"must be float32\[2, 3\]"),
    ({"x": np.zeros((2, 3), "float64")}, r"must be float32\[2, 3\]"),
])
def test_interpreter_checks_inputs(feeds, message):
    with pytest.raises(GraphError, match=message):
        run_nodewise(_add_graph(), feeds)


def test_interpreter_chains_nodes_and_compiles_each_program_once():
    values = {n: Value(n, (2, 3), "float32") for n in ("x", "a", "b", "c")}
    nodes = [Node("Relu", "r1", ["x"], ["a"]), Node("Neg", "n1", ["a"], ["b"]), Node("Relu", "r2", ["b"], ["c"])]
    graph = Graph("g", ["x"], ["c", "a"], nodes, values)
    x = rand(2, 3)
    before = len(interpret._COMPILED)
    out = run_nodewise(graph, {"x": x})
    np.testing.assert_array_equal(out["c"], np.maximum(-np.maximum(x, 0), 0))
    np.testing.assert_array_equal(out["a"], np.maximum(x, 0))
    assert len(interpret._COMPILED) - before <= 2  # the two Relus are one program


def test_rank0_values():
    x = rand(3, 4)
    (total,) = check("ReduceSum", [x], {"axes": (0, 1), "keepdims": 0}, onnx_attrs={"keepdims": 0},
                     onnx_args=[x, C(np.array([0, 1], "int64"))], atol=1e-5)
    assert total.shape == ()
    check("Add", [np.array(2.5, "float32"), np.array(1.5, "float32")])
    check("Gather", [rand(5), np.array(3, "int64")], {"axis": 0})


def test_conv_transpose_negative_pads_extend_the_output():
    """output_shape beyond the full transposed convolution: negative pads, the extra border is zero."""
    attrs = {**conv_attrs((3, 3), strides=(3, 2), pads=(0, 0, -1, -1)), "output_padding": (0, 0)}
    onnx_attrs = {"kernel_shape": (3, 3), "strides": (3, 2), "output_shape": (10, 8)}
    (y,) = check("ConvTranspose", [rand(1, 1, 3, 3), C(rand(1, 2, 3, 3))], attrs, onnx_attrs=onnx_attrs,
                 rtol=1e-4, atol=1e-5)
    assert y.shape == (1, 2, 10, 8) and not y[:, :, -1].any() and not y[:, :, :, -1].any()


def test_resize_integer_scales_index_with_integer_arithmetic():
    attrs = {"mode": "nearest", "scales": (1.0, 1.0, 2.0, 0.5), "coordinate_transformation_mode": "half_pixel",
             "nearest_mode": "round_prefer_floor"}
    (y,) = _lower("Resize", {"x": ((1, 2, 4, 8), "float32")}, {"y": ((1, 2, 8, 4), "float32")}, attrs)
    assert not [n for n in walk(y.body) if isinstance(n, (Call, Cast))]
