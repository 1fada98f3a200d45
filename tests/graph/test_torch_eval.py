"""The PyTorch peer (tensorgen.graph.reference.torch_eval) against ONNX Runtime.

Every case is one ONNX node: ONNX Runtime runs the ONNX model, and TorchModel runs both a hand-built
tensorgen Graph of the same node (attributes written out in normalized form, so these tests do not
need the frontend) and, where the frontend imports, the imported model. Whole models follow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tensorgen.graph import Graph, GraphError, Node, Value, load, zoo
from tensorgen.graph.frontend import onnx_import as frontend
from tensorgen.graph.frontend import onnx_inputs
from tensorgen.graph.reference.torch_eval import TorchModel, available

if not available():
    pytest.skip("PyTorch is not installed", allow_module_level=True)

RTOL, ATOL = 1e-4, 1e-5
rng = np.random.default_rng(0)


def r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def positive(*shape: int) -> np.ndarray:
    return np.abs(r(*shape)) + 0.5


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


@dataclass
class Case:
    """One ONNX node and the normalized tensorgen node that means the same."""

    id: str
    op: str
    inputs: dict[str, np.ndarray]  # graph inputs, fed at run time
    attrs: dict[str, Any] = field(default_factory=dict)  # the tensorgen node's (normalized) attributes
    consts: dict[str, np.ndarray] = field(default_factory=dict)  # weights: initializers / Graph.constants
    onnx_attrs: dict[str, Any] | None = None  # the ONNX node's attributes (default: attrs)
    params: dict[str, Any] = field(default_factory=dict)  # ONNX-only constant inputs after the tensors (None: "")
    order: list[str] | None = None  # the tensor inputs in node order (default: inputs, then consts)
    outputs: int = 1
    opset: int = 18

    @property
    def tensor_inputs(self) -> list[str]:
        return self.order or [*self.inputs, *self.consts]

    @property
    def output_names(self) -> list[str]:
        return [f"y{i}" for i in range(self.outputs)]

    def onnx_model(self) -> onnx.ModelProto:
        params = {f"p_{k}": v for k, v in self.params.items()}
        param_inputs = [k if v is not None else "" for k, v in params.items()]
        node = helper.make_node(self.op, [*self.tensor_inputs, *param_inputs],
                                self.output_names, name=f"{self.op.lower()}_0",
                                **(self.attrs if self.onnx_attrs is None else self.onnx_attrs))
        inits = {**self.consts, **{k: np.asarray(v) for k, v in params.items() if v is not None}}
        graph = helper.make_graph(
            [node], self.id,
            [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
             for k, a in self.inputs.items()],
            [helper.make_empty_tensor_value_info(o) for o in self.output_names],
            [numpy_helper.from_array(a, k) for k, a in inits.items()])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=9)

    def graph(self, reference: list[np.ndarray]) -> Graph:
        """The hand-built tensorgen graph; output Values take ONNX Runtime's shapes and dtypes."""
        values = {k: Value(k, a.shape, a.dtype.name) for k, a in {**self.inputs, **self.consts}.items()}
        values.update({k: Value(k, a.shape, a.dtype.name) for k, a in zip(self.output_names, reference)})
        node = Node(self.op, f"{self.op.lower()}_0", self.tensor_inputs, self.output_names, dict(self.attrs))
        return Graph(self.id, list(self.inputs), self.output_names, [node], values, dict(self.consts))


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def assert_matches(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def conv(k, s=1, d=1, pads=None, group=1, n=2, **extra) -> dict[str, Any]:
    """Normalized Conv/pool attributes; ints stand for the same value on every spatial axis."""
    tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * n
    return {"kernel_shape": tup(k), "strides": tup(s), "dilations": tup(d), "pads": tuple(pads or (0,) * (2 * n)),
            **({"group": group} if group else {}), **extra}


def pool(k, s=1, d=1, pads=None, n=2, ceil=0, **extra) -> dict[str, Any]:
    return conv(k, s, d, pads, group=0, n=n, ceil_mode=ceil, **extra)


def unary(op: str, x: np.ndarray | None = None, opset: int = 18, **attrs) -> Case:
    suffix = "_".join(str(v) for v in attrs.values())
    return Case(f"{op}_{suffix}".rstrip("_"), op, {"x": r(2, 3, 4) if x is None else x}, attrs, opset=opset)


def resize(name: str, x: np.ndarray, scales: tuple[float, ...], coordinates: str, nearest: str,
           sizes: tuple[int, ...] | None = None, opset: int = 18) -> Case:
    onnx_attrs = {"mode": "nearest", "coordinate_transformation_mode": coordinates, "nearest_mode": nearest}
    params = {"roi": None, "scales": None if sizes else np.array(scales, np.float32)}
    if sizes:
        params["sizes"] = i64(*sizes)
    return Case(name, "Resize", {"x": x}, {"mode": "nearest", "scales": scales,
                                         "coordinate_transformation_mode": coordinates, "nearest_mode": nearest},
                onnx_attrs=onnx_attrs, params=params, opset=opset)


INT_A = rng.integers(-20, 20, (3, 4)).astype(np.int32)
INT_B = (rng.integers(1, 6, (4,)) * rng.choice([-1, 1], 4)).astype(np.int32)

CASES = [
    # convolutions: bias, groups, dilation, strides, asymmetric pads, 1-d/3-d, depthwise, auto_pad
    Case("conv2d_bias", "Conv", {"x": r(1, 3, 9, 9)}, conv(3, pads=(1, 1, 1, 1)), {"w": r(4, 3, 3, 3), "b": r(4)}),
    Case("conv2d_groups_dilation_strides", "Conv", {"x": r(2, 4, 11, 10)},
         conv((3, 2), s=(2, 1), d=(2, 3), pads=(2, 1, 2, 1), group=2), {"w": r(6, 2, 3, 2)}),
    Case("conv2d_asymmetric_pads", "Conv", {"x": r(1, 2, 7, 8)}, conv(3, s=2, pads=(0, 1, 2, 0)),
         {"w": r(3, 2, 3, 3), "b": r(3)}),
    Case("conv2d_same_upper", "Conv", {"x": r(1, 2, 8, 8)}, conv(4, s=1, pads=(1, 1, 2, 2)), {"w": r(3, 2, 4, 4)},
         onnx_attrs={"kernel_shape": (4, 4), "auto_pad": "SAME_UPPER"}),
    Case("conv2d_depthwise", "Conv", {"x": r(1, 4, 6, 6)}, conv(3, pads=(1, 1, 1, 1), group=4), {"w": r(4, 1, 3, 3)}),
    Case("conv1d", "Conv", {"x": r(2, 3, 12)}, conv(5, s=2, d=2, pads=(3, 1), n=1), {"w": r(4, 3, 5), "b": r(4)}),
    Case("conv3d", "Conv", {"x": r(1, 2, 5, 6, 5)}, conv((3, 1, 2), s=(1, 2, 1), pads=(1, 0, 0, 1, 0, 1), n=3),
         {"w": r(3, 2, 3, 1, 2)}),
    Case("conv_transpose2d_output_padding", "ConvTranspose", {"x": r(1, 4, 5, 6)},
         conv(3, s=2, pads=(1, 1, 1, 1), group=2, output_padding=(1, 1)), {"w": r(4, 3, 3, 3), "b": r(6)}),
    Case("conv_transpose2d_asymmetric_pads", "ConvTranspose", {"x": r(2, 3, 4, 5)},
         conv((3, 4), s=(2, 3), d=(1, 2), pads=(0, 2, 1, 0), output_padding=(1, 0)), {"w": r(3, 2, 3, 4)}),
    Case("conv_transpose1d", "ConvTranspose", {"x": r(1, 2, 7)}, conv(4, s=3, pads=(2, 2), n=1, output_padding=(0,)),
         {"w": r(2, 5, 4), "b": r(5)}),
    # pooling: ceil_mode, asymmetric pads, dilation, count_include_pad, 1-d/3-d
    Case("maxpool2d_ceil_pads", "MaxPool", {"x": r(1, 2, 10, 11)}, pool(3, s=2, pads=(1, 1, 1, 1), ceil=1)),
    Case("maxpool2d_ceil", "MaxPool", {"x": r(1, 2, 7, 9)}, pool(2, s=2, ceil=1)),
    Case("maxpool2d_asymmetric_dilated", "MaxPool", {"x": r(2, 3, 9, 8)},
         pool((3, 2), s=(2, 1), d=(2, 1), pads=(0, 1, 2, 0))),
    Case("maxpool2d_ceil_asymmetric", "MaxPool", {"x": r(1, 1, 9, 9)}, pool(3, s=2, pads=(1, 0, 0, 1), ceil=1)),
    Case("maxpool2d_pads_beyond_half_kernel", "MaxPool", {"x": r(1, 2, 7, 7)}, pool(3, s=2, pads=(2, 2, 2, 2))),
    Case("maxpool1d", "MaxPool", {"x": r(2, 3, 10)}, pool(3, s=2, pads=(1, 1), n=1)),
    Case("avgpool2d_ceil_include_pad", "AveragePool", {"x": r(1, 2, 10, 11)},
         pool(3, s=2, pads=(1, 1, 1, 1), ceil=1, count_include_pad=1), opset=19),
    Case("avgpool2d_exclude_pad", "AveragePool", {"x": r(1, 2, 6, 7)},
         pool(3, pads=(1, 1, 1, 1), count_include_pad=0), opset=19),
    Case("avgpool2d_ceil_asymmetric_include", "AveragePool", {"x": r(1, 2, 8, 9)},
         pool(3, s=2, pads=(0, 1, 1, 0), ceil=1, count_include_pad=1), opset=19),
    Case("avgpool2d_ceil_asymmetric_exclude", "AveragePool", {"x": r(1, 2, 8, 9)},
         pool(3, s=2, pads=(0, 1, 1, 0), ceil=1, count_include_pad=0), opset=19),
    Case("avgpool2d_pads_beyond_half_kernel", "AveragePool", {"x": r(1, 2, 7, 7)},
         pool(3, s=2, pads=(2, 2, 2, 2), count_include_pad=0), opset=19),
    Case("avgpool2d_dilated", "AveragePool", {"x": r(1, 3, 9, 9)},
         pool(2, s=2, d=2, pads=(1, 1, 1, 1), count_include_pad=0), opset=19),
    Case("avgpool3d", "AveragePool", {"x": r(1, 2, 6, 5, 6)}, pool(2, s=2, n=3, ceil=1, count_include_pad=0), opset=19),
    Case("global_avgpool", "GlobalAveragePool", {"x": r(2, 3, 5, 4)}),
    # normalization, products, softmax, reductions
    Case("batchnorm", "BatchNormalization", {"x": r(2, 3, 4, 5)}, {"epsilon": 1e-3},
         {"scale": r(3), "bias": r(3), "mean": r(3), "var": positive(3)}),
    Case("layernorm_last_axis", "LayerNormalization", {"x": r(2, 5, 8)}, {"axis": 2, "epsilon": 1e-5},
         {"scale": r(8), "bias": r(8)}, onnx_attrs={"axis": -1, "epsilon": 1e-5}),
    Case("layernorm_axis1_no_bias", "LayerNormalization", {"x": r(2, 5, 8)}, {"axis": 1, "epsilon": 1e-3},
         {"scale": r(5, 8)}),
    Case("layernorm_broadcast_scale", "LayerNormalization", {"x": r(2, 5, 8)}, {"axis": 1, "epsilon": 1e-5},
         {"scale": r(1, 8), "bias": r(8)}),
    Case("gemm_transB_bias", "Gemm", {"a": r(3, 5)}, {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 1},
         {"w": r(4, 5), "c": r(4)}),
    Case("gemm_transA_alpha_beta", "Gemm", {"a": r(5, 3), "b": r(5, 4), "c": r(3, 4)},
         {"alpha": 0.5, "beta": 2.0, "transA": 1, "transB": 0}),
    Case("gemm_no_c", "Gemm", {"a": r(3, 5), "b": r(5, 2)}, {"alpha": 2.0, "beta": 1.0, "transA": 0, "transB": 0}),
    Case("matmul_batch_broadcast", "MatMul", {"a": r(2, 1, 4, 5), "b": r(3, 5, 6)}),
    Case("matmul_vector", "MatMul", {"a": r(4, 5)}, consts={"v": r(5)}),
    Case("matmul_vector_left", "MatMul", {"v": r(5), "b": r(2, 5, 3)}),
    Case("softmax", "Softmax", {"x": r(2, 3, 4)}, {"axis": 1}),
    Case("reduce_mean", "ReduceMean", {"x": r(2, 3, 4)}, {"axes": (1, 2), "keepdims": 1}, onnx_attrs={"keepdims": 1},
         params={"axes": i64(-1, 1)}),
    Case("reduce_sum", "ReduceSum", {"x": r(2, 3, 4)}, {"axes": (0, 2), "keepdims": 0}, onnx_attrs={"keepdims": 0},
         params={"axes": i64(0, 2)}),
    Case("reduce_sum_int32", "ReduceSum", {"x": INT_A}, {"axes": (1,), "keepdims": 1}, onnx_attrs={},
         params={"axes": i64(1)}),
    Case("reduce_prod", "ReduceProd", {"x": positive(2, 3, 4)}, {"axes": (0, 2), "keepdims": 1},
         onnx_attrs={"keepdims": 1}, params={"axes": i64(-1, 0)}),
    Case("cumsum_exclusive_reverse", "CumSum", {"x": r(2, 3, 4)}, {"axis": 1, "exclusive": 1, "reverse": 1},
         onnx_attrs={"exclusive": 1, "reverse": 1}, params={"axis": np.array(-2, np.int64)}),
    Case("cumsum_int32", "CumSum", {"x": INT_A}, {"axis": 0, "exclusive": 0, "reverse": 0}, onnx_attrs={},
         params={"axis": np.array(0, np.int64)}),
    *(Case(f"top_k_{largest}", "TopK", {"x": np.round(r(3, 5, 4), 1)}, {"axis": 1, "k": 3, "largest": largest},
           onnx_attrs={"axis": -2, "largest": largest}, params={"k": i64(3)}, outputs=2) for largest in (0, 1)),
    *(Case(f"{op.lower()}", op, {"x": r(2, 3, 4)}, {"axes": (0, 2), "keepdims": 0}, onnx_attrs={"keepdims": 0},
           params={"axes": i64(0, 2)}) for op in ("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp")),
    # element-wise
    *(unary(op) for op in ("Relu", "Sigmoid", "Tanh", "Erf", "Reciprocal", "Exp", "Neg", "Abs", "HardSwish",
                           "Identity")),
    unary("Sqrt", positive(2, 3, 4)),
    unary("LeakyRelu", alpha=0.2),
    unary("HardSigmoid", alpha=0.3, beta=0.4),
    unary("Gelu", opset=20, approximate="none"),
    unary("Gelu", opset=20, approximate="tanh"),
    unary("Log", positive(2, 3, 4)),
    unary("Elu", alpha=0.5),
    unary("Celu", alpha=2.0),
    unary("Selu", alpha=1.5, gamma=1.1),
    unary("ThresholdedRelu", alpha=0.2),
    unary("Shrink", lambd=0.4, bias=0.1),
    *(unary(op) for op in ("Softplus", "Softsign", "Mish")),
    Case("prelu", "PRelu", {"x": r(2, 3, 4)}, consts={"slope": r(3, 1)}),
    Case("sum3", "Sum", {"a": r(2, 3, 4), "b": r(4), "c": r(3, 1)}),
    Case("mean2", "Mean", {"a": r(2, 3, 4), "b": r(4)}),
    Case("log_softmax", "LogSoftmax", {"x": r(2, 3, 4)}, {"axis": 1}),
    Case("global_max_pool", "GlobalMaxPool", {"x": r(2, 3, 4, 5)}),
    *(Case(f"{op.lower()}_{last}", op, {"x": r(2, 3, 4)}, {"axis": 1, "keepdims": 1, "select_last_index": last})
      for op in ("ArgMax", "ArgMin") for last in (0, 1)),
    Case("lrn", "LRN", {"x": r(2, 5, 3, 4)}, {"size": 3, "alpha": 0.1, "beta": 0.75, "bias": 1.5}),
    Case("instance_norm", "InstanceNormalization", {"x": r(2, 3, 4, 5)}, {"epsilon": 1e-5},
         consts={"s": r(3), "b": r(3)}),
    Case("clip", "Clip", {"x": r(2, 3, 4)}, {"min": -0.5, "max": 0.7}, onnx_attrs={},
         params={"min": np.float32(-0.5), "max": np.float32(0.7)}),
    Case("clip_max_only", "Clip", {"x": r(2, 3, 4)}, {"min": -math.inf, "max": 0.3}, onnx_attrs={},
         params={"min": None, "max": np.float32(0.3)}),
    Case("cast_float_int32", "Cast", {"x": r(3, 4) * 5}, {"to": "int32"}, onnx_attrs={"to": TensorProto.INT32}),
    Case("add_broadcast", "Add", {"a": r(2, 3, 4), "b": r(4)}),
    Case("sub_broadcast", "Sub", {"a": r(2, 1, 4), "b": r(3, 1)}),
    Case("mul_const", "Mul", {"a": r(2, 3)}, consts={"b": r(2, 1)}),
    Case("div", "Div", {"a": r(2, 3), "b": positive(3)}),
    Case("div_int_truncates", "Div", {"a": INT_A, "b": INT_B}),
    Case("pow_scalar", "Pow", {"x": r(2, 3)}, consts={"e": np.array(2.0, np.float32)}),
    Case("pow_int_exponent", "Pow", {"x": r(2, 3)}, consts={"e": np.array(3, np.int64)}),
    Case("pow_tensor", "Pow", {"x": positive(2, 3), "e": r(3)}),
    Case("max3", "Max", {"a": r(2, 3), "b": r(3), "c": r(1, 3)}),
    Case("min2", "Min", {"a": r(2, 3), "b": r(2, 1)}),
    Case("where", "Where", {"c": rng.random((2, 3)) > 0.5, "x": r(2, 3), "y": r(3)}),
    # data movement
    Case("flatten", "Flatten", {"x": r(2, 3, 4, 5)}, {"axis": 2}),
    Case("reshape", "Reshape", {"x": r(2, 3, 4)}, {"shape": (4, 6)}, onnx_attrs={}, params={"shape": i64(4, -1)}),
    Case("squeeze", "Squeeze", {"x": r(2, 1, 3, 1)}, {"axes": (1, 3)}, onnx_attrs={}, params={"axes": i64(1, -1)}),
    Case("unsqueeze", "Unsqueeze", {"x": r(2, 3)}, {"axes": (0, 3)}, onnx_attrs={}, params={"axes": i64(0, 3)}),
    Case("expand", "Expand", {"x": r(3, 1)}, {"shape": (2, 3, 4)}, onnx_attrs={}, params={"shape": i64(2, 1, 4)}),
    Case("transpose", "Transpose", {"x": r(2, 3, 4)}, {"perm": (2, 0, 1)}),
    Case("concat", "Concat", {"a": r(2, 1, 3), "b": r(2, 2, 3)}, {"axis": 1}, {"c": r(2, 3, 3)}),
    Case("split", "Split", {"x": r(2, 9)}, {"axis": 1, "split": (2, 3, 4)}, onnx_attrs={"axis": 1},
         params={"split": i64(2, 3, 4)}, outputs=3),
    Case("slice_steps", "Slice", {"x": r(5, 6, 7)}, {"starts": (1, 2), "ends": (5, 6), "axes": (0, 2), "steps": (2, 1)},
         onnx_attrs={}, params={"starts": i64(1, -5), "ends": i64(100, -1), "axes": i64(0, 2), "steps": i64(2, 1)}),
    Case("slice_negative_steps", "Slice", {"x": r(5, 6, 7)},
         {"starts": (5, 4), "ends": (-1, 0), "axes": (1, 2), "steps": (-1, -2)}, onnx_attrs={},
         params={"starts": i64(-1, 4), "ends": i64(-100, 0), "axes": i64(1, 2), "steps": i64(-1, -2)}),
    Case("gather_runtime_negative_indices", "Gather", {"x": r(3, 5, 2), "i": rng.integers(-5, 5, (2, 3))},
         {"axis": 1}),
    Case("gather_embedding", "Gather", {"ids": rng.integers(0, 10, (2, 3))}, {"axis": 0}, {"table": r(10, 4)},
         order=["table", "ids"]),
    Case("gather_scalar_index", "Gather", {"x": r(3, 5, 2)}, {"axis": 1}, {"i": np.array(2, np.int64)}),
    Case("pad_constant", "Pad", {"x": r(1, 2, 3, 4)}, {"pads": (0, 0, 1, 2, 0, 0, 2, 1), "mode": "constant",
                                                       "value": 1.5},
         onnx_attrs={"mode": "constant"}, params={"pads": i64(0, 0, 1, 2, 0, 0, 2, 1), "value": np.float32(1.5)}),
    Case("pad_reflect_nchw", "Pad", {"x": r(1, 2, 4, 5)}, {"pads": (0, 0, 1, 2, 0, 0, 3, 1), "mode": "reflect",
                                                           "value": 0.0},
         onnx_attrs={"mode": "reflect"}, params={"pads": i64(0, 0, 1, 2, 0, 0, 3, 1)}),
    Case("pad_reflect_width_only", "Pad", {"x": r(1, 2, 4, 5)}, {"pads": (0, 0, 0, 2, 0, 0, 0, 3), "mode": "reflect",
                                                                 "value": 0.0},
         onnx_attrs={"mode": "reflect"}, params={"pads": i64(0, 0, 0, 2, 0, 0, 0, 3)}),
    Case("pad_reflect_channels", "Pad", {"x": r(1, 3, 4, 5)}, {"pads": (0, 2, 0, 1, 0, 1, 1, 0), "mode": "reflect",
                                                               "value": 0.0},
         onnx_attrs={"mode": "reflect"}, params={"pads": i64(0, 2, 0, 1, 0, 1, 1, 0)}),
    Case("pad_reflect_rank2", "Pad", {"x": r(4, 5)}, {"pads": (1, 2, 3, 1), "mode": "reflect", "value": 0.0},
         onnx_attrs={"mode": "reflect"}, params={"pads": i64(1, 2, 3, 1)}),
    Case("pad_edge_rank2", "Pad", {"x": r(3, 4)}, {"pads": (1, 2, 2, 1), "mode": "edge", "value": 0.0},
         onnx_attrs={"mode": "edge"}, params={"pads": i64(1, 2, 2, 1)}),
    Case("pad_edge_axes", "Pad", {"x": r(1, 2, 3, 4)}, {"pads": (0, 0, 2, 0, 0, 0, 1, 0), "mode": "edge",
                                                        "value": 0.0},
         onnx_attrs={"mode": "edge"}, params={"pads": i64(2, 1), "value": None, "axes": i64(2)}),
    # Resize (nearest): every coordinate transformation and rounding mode, up and down, scales and sizes
    resize("resize_asymmetric_floor_x2", r(1, 2, 3, 4), (1.0, 1.0, 2.0, 2.0), "asymmetric", "floor"),
    *(Case(f"resize_linear_{mode}", "Resize", {"x": r(1, 2, 4, 5)},
           {"mode": "linear", "scales": (1.0, 1.0, 1.5, 0.6), "coordinate_transformation_mode": mode,
            "nearest_mode": "floor"}, onnx_attrs={"mode": "linear", "coordinate_transformation_mode": mode},
           params={"roi": None, "scales": np.array((1.0, 1.0, 1.5, 0.6), np.float32)})
      for mode in ("half_pixel", "align_corners", "asymmetric", "pytorch_half_pixel")),
    resize("resize_asymmetric_floor_x3", r(1, 2, 3, 4), (1.0, 1.0, 3.0, 1.0), "asymmetric", "floor"),
    resize("resize_asymmetric_round_x3", r(1, 2, 3, 4), (1.0, 1.0, 3.0, 3.0), "asymmetric", "round_prefer_floor"),
    resize("resize_half_pixel_fractional", r(1, 2, 4, 5), (1.0, 1.0, 1.5, 2.5), "half_pixel", "round_prefer_floor"),
    resize("resize_half_pixel_down", r(1, 2, 8, 9), (1.0, 1.0, 0.5, 0.4), "half_pixel", "round_prefer_ceil"),
    resize("resize_align_corners_sizes", r(1, 2, 3, 4), (1.0, 1.0, 2 / 3, 7 / 4), "align_corners",
           "round_prefer_ceil", sizes=(1, 2, 2, 7)),
    resize("resize_pytorch_half_pixel_sizes", r(1, 2, 3, 4), (1.0, 1.0, 1 / 3, 5 / 4), "pytorch_half_pixel", "ceil",
           sizes=(1, 2, 1, 5)),
    resize("resize_half_pixel_symmetric", r(1, 2, 5, 4), (1.0, 1.0, 1.7, 0.6), "half_pixel_symmetric", "floor",
           opset=19),
]


def case_ids(cases: list[Case]) -> list[str]:
    ids = [c.id for c in cases]
    assert len(set(ids)) == len(ids), "case ids must be unique"
    return ids


@pytest.fixture(scope="module", params=CASES, ids=case_ids(CASES))
def case_and_reference(request) -> tuple[Case, list[np.ndarray]]:
    case = request.param
    return case, run_ort(case.onnx_model(), case.inputs)


def test_hand_built_graph_matches_onnxruntime(case_and_reference):
    case, reference = case_and_reference
    assert_matches(TorchModel(case.graph(reference)).run(case.inputs), reference)


def test_imported_model_matches_onnxruntime(case_and_reference):
    case, reference = case_and_reference
    if case.op not in frontend.GRAPH_OPS:
        pytest.skip(f"the frontend folds {case.op} away (accepted only on constant inputs)")
    model = TorchModel(frontend.import_onnx(case.onnx_model()))
    assert_matches(model.run(case.inputs), reference)


# --- whole models through the frontend -------------------------------------------------------

def _model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str],
           inits: dict[str, np.ndarray], opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "model",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for k, a in inputs.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def small_cnn() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
        n("BatchNormalization", ["c1", "g", "beta", "mean", "var"], ["bn"]),
        n("Relu", ["bn"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
        n("Conv", ["p1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8),
        n("Clip", ["c2", "lo", "hi"], ["r6"]),
        n("Resize", ["r6", "", "scales"], ["up"], mode="nearest"),
        n("Pad", ["up", "pads"], ["padded"], mode="reflect"),
        n("AveragePool", ["padded"], ["p2"], kernel_shape=[2, 2], strides=[2, 2]),
        n("GlobalAveragePool", ["p2"], ["gap"]),
        n("Flatten", ["gap"], ["flat"]),
        n("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1),
        n("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    inits = {"w1": r(8, 3, 3, 3) * 0.3, "b1": r(8), "g": positive(8), "beta": r(8), "mean": r(8), "var": positive(8),
             "w2": r(8, 1, 3, 3) * 0.3, "lo": np.float32(0), "hi": np.float32(6),
             "scales": np.array([1, 1, 2, 2], np.float32), "pads": i64(0, 0, 1, 1, 0, 0, 1, 1),
             "fc_w": r(10, 8), "fc_b": r(10)}
    x = r(2, 3, 17, 15)
    return _model(nodes, {"x": x}, ["probs"], inits), {"x": x}


def attention_block() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A BERT-like layer the way torch exports it: shape arithmetic, embedding Gather, mask Where, Erf GELU."""
    b, s, h, heads = 2, 6, 16, 2
    n = helper.make_node
    nodes = [
        n("Gather", ["emb", "ids"], ["x"], axis=0),
        n("Shape", ["x"], ["shape"]),
        n("Gather", ["shape", "zero"], ["batch"], axis=0),
        n("Unsqueeze", ["batch", "axis0"], ["batch1"]),
        n("Concat", ["batch1", "split_shape"], ["qkv_shape"], axis=0),
        n("MatMul", ["x", "wqkv"], ["qkv_mm"]),
        n("Add", ["qkv_mm", "bqkv"], ["qkv"]),
        n("Split", ["qkv", "three"], ["q", "k", "v"], axis=2),
        *(n("Reshape", [t, "qkv_shape"], [f"{t}4"]) for t in "qkv"),
        n("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["scores"]),
        n("Div", ["scores", "sqrt_d"], ["scaled"]),
        n("Where", ["mask", "scaled", "neg_inf"], ["masked"]),
        n("Softmax", ["masked"], ["attn"], axis=3),
        n("MatMul", ["attn", "vt"], ["ctx"]),
        n("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "hidden_shape"], ["ctx2"]),
        n("Add", ["ctx2", "x"], ["res"]),
        n("LayerNormalization", ["res", "ln_g", "ln_b"], ["ln"], axis=-1, epsilon=1e-12),
        n("MatMul", ["ln", "w_ff"], ["ff"]),
        n("Div", ["ff", "sqrt2"], ["ff_s"]),
        n("Erf", ["ff_s"], ["erf"]),
        n("Add", ["erf", "one"], ["erf1"]),
        n("Mul", ["ff", "erf1"], ["gelu_2"]),
        n("Mul", ["gelu_2", "half"], ["gelu"]),
        n("ReduceMean", ["gelu"], ["pooled"], axes=[1], keepdims=0),
        n("Slice", ["gelu", "starts", "ends", "axes", "steps"], ["last_tokens"]),
        n("Cast", ["ids"], ["ids_f"], to=TensorProto.FLOAT),
    ]
    inits = {"emb": r(20, h), "zero": np.array(0, np.int64), "axis0": i64(0), "split_shape": i64(-1, heads, h // heads),
             "wqkv": r(h, 3 * h) * 0.3, "bqkv": r(3 * h), "three": i64(h, h, h), "sqrt_d": np.float32(np.sqrt(h)),
             "mask": np.tril(np.ones((s, s), bool)), "neg_inf": np.float32(-1e9), "hidden_shape": i64(b, s, h),
             "ln_g": positive(h), "ln_b": r(h), "w_ff": r(h, 2 * h) * 0.3, "sqrt2": np.float32(np.sqrt(2)),
             "one": np.float32(1), "half": np.float32(0.5), "starts": i64(-1), "ends": i64(-100), "axes": i64(1),
             "steps": i64(-2)}
    ids = rng.integers(0, 20, (b, s))
    return _model(nodes, {"ids": ids}, ["pooled", "last_tokens", "ids_f"], inits), {"ids": ids}


@pytest.mark.parametrize("build", [small_cnn, attention_block])
def test_model_matches_onnxruntime(build):
    model, feeds = build()
    assert_matches(TorchModel(frontend.import_onnx(model)).run(feeds), run_ort(model, feeds))


@pytest.mark.parametrize("name, options", [("mobilenet_v2", {"image_size": 32}), ("bert_tiny", {"seq_len": 16}),
                                           ("dcgan", {}), ("resnet18", {"image_size": 32}),
                                           ("resnet3d_18", {"frames": 4, "image_size": 32})])
def test_zoo_model_matches_onnxruntime(name, options):
    """The path `tensorgen bench` takes: zoo model, imported and optimized, run next to ONNX Runtime."""
    model = zoo.build_model(name, **options)
    feeds = onnx_inputs.random_inputs(model)
    got = TorchModel(load.load_graph(model), threads=2).run(feeds)
    want = run_ort(model, feeds)
    for g, w in zip(got, want):  # deep models accumulate float32 rounding differently
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4)


# --- API behaviour and errors ------------------------------------------------------------------

def graph_of(case: Case) -> tuple[Graph, list[np.ndarray]]:
    reference = run_ort(case.onnx_model(), case.inputs)
    return case.graph(reference), reference


def test_inputs_by_name_or_position_and_repeated_runs():
    case = next(c for c in CASES if c.id == "conv2d_bias")
    graph, reference = graph_of(case)
    weights = {k: v.copy() for k, v in graph.constants.items()}
    model = TorchModel(graph)
    first = model.run(case.inputs)
    assert_matches(model.run(list(case.inputs.values())), reference)
    assert_matches(first, reference)
    first[0][...] = 0  # outputs are the caller's: scribbling on them changes nothing inside
    assert_matches(model.run(case.inputs), reference)
    for name, array in weights.items():
        np.testing.assert_array_equal(graph.constants[name], array)


def test_graph_output_that_is_an_input_is_copied():
    graph = Graph("g", ["x"], ["x"], [], {"x": Value("x", (2,), "float32")})
    x = np.ones(2, np.float32)
    (y,) = TorchModel(graph).run([x])
    y[0] = 5
    np.testing.assert_array_equal(x, np.ones(2, np.float32))


def test_threads_sets_torch_threads():
    import torch

    before = torch.get_num_threads()
    try:
        case = next(c for c in CASES if c.id == "matmul_batch_broadcast")
        graph, reference = graph_of(case)
        model = TorchModel(graph, threads=1)
        torch.set_num_threads(2)  # someone else changed it: run sets it back
        assert_matches(model.run(case.inputs), reference)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def _relu_graph(op: str = "Relu", **attrs) -> Graph:
    values = {"x": Value("x", (2, 3), "float32"), "y": Value("y", (2, 3), "float32")}
    return Graph("g", ["x"], ["y"], [Node(op, "act_1", ["x"], ["y"], attrs)], values)


def test_unsupported_ops_are_all_named():
    graph = _relu_graph("Foo")
    graph.nodes.append(Node("Bar", "bar_2", ["y"], ["z"]))
    graph.values["z"] = Value("z", (2, 3), "float32")
    graph.outputs = ["z"]
    with pytest.raises(GraphError, match=r"node 'act_1' \(Foo\): unsupported op.*node 'bar_2' \(Bar\)"):
        TorchModel(graph)


@pytest.mark.parametrize("feed, message", [
    ([np.zeros((2, 4), np.float32)], r"input 'x': expected float32 \[2, 3\], got float32 \[2, 4\]"),
    ([np.zeros((2, 3), np.float64)], r"input 'x': expected float32 \[2, 3\], got float64"),
    ([], r"takes 1 inputs \['x'\], got 0"),
    ({"y": np.zeros((2, 3), np.float32)}, r"missing \['x'\], unknown \['y'\]"),
])
def test_bad_inputs_are_graph_errors(feed, message):
    with pytest.raises(GraphError, match=message):
        TorchModel(_relu_graph()).run(feed)


def test_torch_failure_names_the_node():
    values = {k: Value(k, shape, "float32") for k, shape in {"a": (2, 3), "b": (4, 5), "y": (2, 5)}.items()}
    graph = Graph("g", ["a", "b"], ["y"], [Node("MatMul", "mm_7", ["a", "b"], ["y"])], values)
    with pytest.raises(GraphError, match=r"node 'mm_7' \(MatMul\): the PyTorch peer failed: RuntimeError"):
        TorchModel(graph).run([np.zeros((2, 3), np.float32), np.zeros((4, 5), np.float32)])


def test_missing_attribute_names_the_node():
    with pytest.raises(GraphError, match=r"node 'act_1' \(Softmax\).*KeyError.*axis"):
        TorchModel(_relu_graph("Softmax")).run([np.zeros((2, 3), np.float32)])


def test_wrong_value_shape_in_graph_is_reported():
    graph = _relu_graph()
    graph.values["y"] = Value("y", (3, 2), "float32")
    with pytest.raises(GraphError, match=r"node 'act_1' \(Relu\): torch computed 'y' as torch.float32 \[2, 3\], "
                                         r"the graph says float32 \[3, 2\]"):
        TorchModel(graph).run([np.zeros((2, 3), np.float32)])


def test_unsupported_resize_mode_is_a_graph_error():
    graph = _relu_graph("Resize", scales=(1.0, 1.0), coordinate_transformation_mode="tf_crop_and_resize",
                        nearest_mode="floor")
    with pytest.raises(GraphError, match=r"node 'act_1' \(Resize\): .*'tf_crop_and_resize'"):
        TorchModel(graph).run([np.zeros((2, 3), np.float32)])
