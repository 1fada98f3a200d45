"""Half-precision models (tensorgen.graph.frontend.half): float16 / bfloat16 weights and values computed in float32,
float16 inputs and outputs at the boundary, from ONNX (onnxconverter-common's float16 pass over the graph fuzzer's
models and the zoo, hand-written boundary cases) and from PyTorch (`.half()` modules).

The reference for a model converted to float16 is the float32 original run by ONNX Runtime with its weights and
inputs rounded to float16, so it does the same work on the same numbers; tensorgen's answer then differs from it by
the one rounding of each output to float16. ONNX Runtime running the float16 model itself is a looser second check.
"""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from fuzz_graph_check import check_model, compare, feeds, onnxruntime_outputs, tensorgen_outputs
from fuzz_graphs import random_model
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

from tensorgen.graph.backend.build import build_model
from tensorgen.graph.ir import GraphError
from tensorgen.graph.load import load_graph
from tensorgen.graph.zoo import build_model as zoo_model
from tensorgen.runtime.cuda import cuda_available
from tensorgen.runtime.model import CompiledModel

HALF_RTOL = 4e-3  # a float16 output is within half an ulp (2**-11) of the float32 answer, plus float32 noise


def float32_reference(model: onnx.ModelProto, half: onnx.ModelProto,
                       inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime on `model`, the float32 original of `half`, with its weights and `inputs` rounded to float16 as
    `half` has them, each output rounded to the type `half` declares (a float32 answer past 65504 is inf)."""
    wide = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in inputs.items()}
    outs = onnxruntime_outputs(_rounded_to_half(model), wide)
    types = [helper.tensor_dtype_to_np_dtype(o.type.tensor_type.elem_type) for o in half.graph.output]
    return [o.astype(t) for o, t in zip(outs, types)]


def _rounded_to_half(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (float32) with every float32 initializer rounded to float16 and back."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            rounded = numpy_helper.to_array(t).astype(np.float16).astype(np.float32)
            t.CopyFrom(numpy_helper.from_array(rounded, t.name))
    return out


def _model(nodes, inputs, outputs, initializers=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "half", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("keep_io_types", [False, True])
@pytest.mark.parametrize("seed", [3, 8, 17, 29, 148])
def test_random_models_converted_to_float16(seed, keep_io_types, tmp_path):
    """onnxconverter-common's float16 pass over the graph fuzzer's models: float16 throughout (keep_io_types
    False: the model takes and returns float16) or inside float32 inputs and outputs."""
    model = random_model(np.random.default_rng(seed))
    half = float16.convert_float_to_float16(model, keep_io_types=keep_io_types)
    assert any(t.data_type == TensorProto.FLOAT16 for t in half.graph.initializer)
    inputs = feeds(half, seed)
    reference = float32_reference(model, half, inputs)
    failure = check_model(half, seed, "random", 0, tmp_path, reference=reference, inputs=inputs, rtol=HALF_RTOL)
    assert failure is None, f"{failure.headline()}\n{failure.error}"


def test_a_float16_zoo_model_equals_its_float32_computation_and_onnxruntime(tmp_path):
    """A whole network (BERT-tiny) converted to float16: tensorgen against the float32 computation on the same
    weights (tight), and against ONNX Runtime running it in float16 (within float16's own error)."""
    model = zoo_model("bert_tiny")
    half = float16.convert_float_to_float16(model)
    inputs = feeds(half, 0)
    ours = tensorgen_outputs(half, inputs, tmp_path)
    assert all(o.dtype == np.float16 for o in ours if o.dtype.kind == "f")
    assert compare(ours, float32_reference(model, half, inputs), rtol=HALF_RTOL) is None
    assert compare(ours, onnxruntime_outputs(half, inputs), rtol=3e-2) is None


def test_boundary_cases(tmp_path):
    """A float16 input returned as it is and also computed on, a float16 output that is a weight, a float32 model
    with a Cast to float16 and back inside, and bfloat16 weights."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [3, 4])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT16, [4])
    weight = numpy_helper.from_array(np.linspace(-1, 1, 4).astype(np.float16), "w")
    model = _model([helper.make_node("Mul", ["x", "x"], ["y"])], [x], [x, y, w], [weight])
    inputs = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float16)}
    same, square, out_w = tensorgen_outputs(model, inputs, tmp_path / "a")
    np.testing.assert_array_equal(same, inputs["x"])
    assert square.dtype == np.float16 and out_w.dtype == np.float16
    np.testing.assert_array_equal(square, (inputs["x"].astype(np.float32) ** 2).astype(np.float16))
    np.testing.assert_array_equal(out_w, numpy_helper.to_array(weight))

    # float32 in and out, float16 inside (what a mixed-precision export writes), and bfloat16 weights
    xf = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    yf = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])
    bf = helper.make_tensor("b", TensorProto.BFLOAT16, [4], [0.5, 1.5, -2.0, 4.0])
    model = _model([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                    helper.make_node("Cast", ["b"], ["bh"], to=TensorProto.FLOAT16),
                    helper.make_node("Add", ["h", "bh"], ["s"]),
                    helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)], [xf], [yf], [bf])
    inputs = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)}
    (ours,) = tensorgen_outputs(model, inputs, tmp_path / "b")
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, inputs["x"] + np.array([0.5, 1.5, -2.0, 4.0], np.float32), rtol=1e-6)
    (theirs,) = onnxruntime_outputs(model, inputs)  # ONNX Runtime rounds to float16 in the middle; tensorgen does not
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-3)


def test_float16_constants_and_type_attributes(tmp_path):
    """Constant and ConstantOfShape values and EyeLike's dtype attribute in float16, folded at import, then
    computed on."""
    half = numpy_helper.from_array(np.full((2, 2), 0.5, np.float16))
    model = _model([helper.make_node("Constant", [], ["r"], value=half),
                    helper.make_node("EyeLike", ["r"], ["e"], dtype=TensorProto.FLOAT16),
                    helper.make_node("ConstantOfShape", ["shape"], ["z"],
                                     value=numpy_helper.from_array(np.array([2], np.float16))),
                    helper.make_node("Sum", ["x", "r", "e", "z"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2, 2])],
                   [numpy_helper.from_array(np.array([2, 2], np.int64), "shape")])
    inputs = {"x": np.random.default_rng(2).standard_normal((2, 2)).astype(np.float16)}
    (ours,) = tensorgen_outputs(model, inputs, tmp_path)
    expected = (inputs["x"].astype(np.float32) + 0.5 + np.eye(2) + 2).astype(np.float16)
    np.testing.assert_array_equal(ours, expected)


def test_torch_half_modules_equal_their_float32_computation(tmp_path):
    """A `.half()` module through tensorgen.from_torch, float16 in and out, and one that casts to float16 inside
    a float32 model, against eager PyTorch computing the same in float32."""
    torch = pytest.importorskip("torch")
    from tensorgen import from_torch

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.GELU(),
                              torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10), torch.nn.LayerNorm(10)).eval()
    x = torch.randn(2, 3, 6, 6)
    half = net.half()
    graph = from_torch(half, (x.half(),))
    (ours,) = CompiledModel(build_model(graph, tmp_path / "a"), threads=2).run([x.half().numpy()])
    assert ours.dtype == np.float16
    with torch.no_grad():
        expected = net.float()(x.half().float()).half().numpy()
    assert compare([ours], [expected], rtol=HALF_RTOL) is None

    class Mixed(torch.nn.Module):
        def forward(self, a):
            return (a.half() * 3).float().softmax(-1)

    a = torch.randn(4, 16)
    (ours,) = CompiledModel(build_model(from_torch(Mixed(), (a,)), tmp_path / "b"), threads=2).run([a.numpy()])
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, (a * 3).softmax(-1).numpy(), rtol=1e-5, atol=1e-6)


def test_bfloat16_inputs_are_refused_in_one_line():
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2])
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [x],
                   [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2])])
    with pytest.raises(GraphError, match="input 'x' is bfloat16") as err:
        load_graph(model)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("target", ["cuda -emulate=1", pytest.param("cuda -arch=sm_90", marks=pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="no nvcc"))])
def test_a_float16_model_for_cuda(target, tmp_path):
    """A float16 graph fuzz model built for a GPU: CUDA's __half at the boundary (nvcc has no _Float16), run under
    the emulator (or on a GPU where there is one); nvcc compiles it either way."""
    model = random_model(np.random.default_rng(5))
    half = float16.convert_float_to_float16(model)
    inputs = feeds(half, 5)
    if target.endswith("emulate=1") or cuda_available():
        ours = tensorgen_outputs(half, inputs, tmp_path, target)
        assert compare(ours, float32_reference(model, half, inputs), rtol=HALF_RTOL) is None
    else:
        built = build_model(load_graph(half), tmp_path / "model", target=target)
        assert "__half" in (built / "model.cu").read_text() and (built / "model.so").stat().st_size > 0


def test_torch_bfloat16_weights_compute_in_float32_and_bfloat16_inputs_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from tensorgen import from_torch

    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(8, 4).bfloat16()

        def forward(self, x):
            return self.linear(x.bfloat16()).float()

    torch.manual_seed(1)
    module, x = Mixed(), torch.randn(3, 8)
    (ours,) = CompiledModel(build_model(from_torch(module, (x,)), tmp_path), threads=2).run([x.numpy()])
    with torch.no_grad():  # the bfloat16 weights exactly, the input not rounded to bfloat16 (see the module's doc)
        expected = torch.nn.functional.linear(x, module.linear.weight.float(), module.linear.bias.float()).numpy()
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(GraphError, match="input 'input' is bfloat16") as err:
        from_torch(module.linear, (x.bfloat16(),))
    assert "\n" not in str(err.value)
