"""Writes ONNX graphs the way torch.onnx exports them, for the model zoo.

Names follow the exporter (`/layer1/layer1.0/conv1/Conv` nodes, `layer1.0.conv1.weight` initializers),
every attribute is written out explicitly, weights are initializers and small scalars/shapes are
`Constant` nodes — the patterns an importer meets in real files.

Random weights come from one seeded Generator, drawn in build order, so a seed fixes the model. Scales
keep activations near unit range (He/Xavier fan-in scaling, BatchNorm running stats that are close to
identity, damped residual branches) so that two float32 runtimes agree to ~1e-3 relative.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the lowest IR version opset 17 needs; every onnxruntime since 1.11 loads it


class OnnxBuilder:
    """Accumulates nodes and initializers under a stack of name scopes."""

    def __init__(self, name: str, seed: int):
        self.rng = np.random.default_rng(seed)
        # weights go straight into the ModelProto: copying hundreds of MB of protobuf costs seconds
        self._model = onnx.ModelProto()
        self.graph = self._model.graph
        self.graph.name = name
        self._scopes: list[str] = []
        self._taken: set[str] = set()

    @contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self._scopes.append(name)
        try:
            yield
        finally:
            self._scopes.pop()

    def _unique(self, name: str) -> str:
        base, k = name, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def input(self, name: str, shape: Sequence[int], dtype: int = TensorProto.FLOAT) -> str:
        self.graph.input.append(helper.make_tensor_value_info(name, dtype, list(shape)))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        """A float32 initializer named like a torch state-dict entry: `scope.name`."""
        tensor = self.graph.initializer.add()
        tensor.name = self._unique(".".join([*(s for s in self._scopes if s), name]))
        tensor.data_type = TensorProto.FLOAT
        tensor.dims.extend(array.shape)
        tensor.raw_data = np.ascontiguousarray(array, dtype="<f4").tobytes()
        return tensor.name

    def op(self, op_type: str, inputs: Sequence[str], **attrs) -> str:
        """Append one single-output node; its name and output name follow torch.onnx."""
        path = "/".join(s for s in self._scopes if s)
        node_name = self._unique(f"/{path}/{op_type}" if path else f"/{op_type}")
        out = f"{node_name}_output_0"
        self.graph.node.append(helper.make_node(op_type, list(inputs), [out], name=node_name, **attrs))
        return out

    def const(self, value: float | Sequence[int], dtype: type = np.float32) -> str:
        """A Constant node holding a scalar or a 1-D shape (torch.onnx emits these for literals)."""
        array = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], value=numpy_helper.from_array(array))

    # random tensors -----------------------------------------------------------------------------
    def normal(self, shape: Sequence[int], std: float) -> np.ndarray:
        return self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(std)

    def uniform(self, shape: Sequence[int], low: float, high: float) -> np.ndarray:
        return self.rng.uniform(low, high, tuple(shape)).astype(np.float32)

    def model(self, output: str, doc: str) -> onnx.ModelProto:
        """Finish: the value `output` becomes the graph output "output", its type found by shape inference."""
        for node in self.graph.node:
            node.output[:] = ["output" if o == output else o for o in node.output]
            node.input[:] = ["output" if i == output else i for i in node.input]
        self.graph.output.append(helper.make_value_info("output", self._infer_type("output")))
        self._model.ir_version = IR_VERSION
        self._model.opset_import.append(helper.make_opsetid("", OPSET))
        self._model.producer_name = "tensorgen.zoo"
        self._model.doc_string = doc
        return self._model

    def _infer_type(self, name: str) -> onnx.TypeProto:
        """Strict shape inference on a weightless copy (initializers declared as inputs): cheap for any size."""
        declared = [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in self.graph.initializer]
        light = helper.make_graph(self.graph.node, "shapes", [*self.graph.input, *declared], [])
        light_model = helper.make_model(light, opset_imports=[helper.make_opsetid("", OPSET)])
        light_model.ir_version = IR_VERSION
        inferred = onnx.shape_inference.infer_shapes(light_model, strict_mode=True)
        return next(v.type for v in inferred.graph.value_info if v.name == name)


# layers shared by the model families -----------------------------------------------------------


def conv(
    b: OnnxBuilder,
    x: str,
    cin: int,
    cout: int,
    kernel: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
    *,
    groups: int = 1,
    gain: float = 2.0,
    bias: bool = False,
) -> str:
    """Conv with He-normal weights (gain 2 for a ReLU-fed input); torchvision convs have no bias."""
    fan_in = cin // groups * int(np.prod(kernel))
    inputs = [x, b.weight("weight", b.normal((cout, cin // groups, *kernel), np.sqrt(gain / fan_in)))]
    if bias:
        inputs.append(b.weight("bias", b.normal((cout,), 0.01)))
    return b.op(
        "Conv",
        inputs,
        dilations=[1] * len(kernel),
        group=groups,
        kernel_shape=list(kernel),
        pads=list(pad) * 2,
        strides=list(stride),
    )


def batch_norm(b: OnnxBuilder, x: str, channels: int, gamma: tuple[float, float] = (0.8, 1.2)) -> str:
    """Inference BatchNormalization whose running stats roughly normalize (mean≈0, var≈1)."""
    scale = b.weight("weight", b.uniform((channels,), *gamma))
    shift = b.weight("bias", b.normal((channels,), 0.05))
    mean = b.weight("running_mean", b.normal((channels,), 0.05))
    var = b.weight("running_var", b.uniform((channels,), 0.8, 1.2))
    return b.op("BatchNormalization", [x, scale, shift, mean, var], epsilon=1e-5, momentum=0.9)


def conv_bn(
    b: OnnxBuilder,
    name: str,
    bn_name: str,
    x: str,
    cin: int,
    cout: int,
    kernel: Sequence[int],
    stride: Sequence[int],
    pad: Sequence[int],
    *,
    groups: int = 1,
    gamma: tuple[float, float] = (0.8, 1.2),
) -> str:
    """Conv(bias=False) named `name` followed by BatchNormalization named `bn_name`, as torchvision builds them."""
    with b.scope(name):
        y = conv(b, x, cin, cout, kernel, stride, pad, groups=groups)
    with b.scope(bn_name):
        return batch_norm(b, y, cout, gamma)


def relu(b: OnnxBuilder, x: str, name: str = "relu") -> str:
    with b.scope(name):
        return b.op("Relu", [x])


def classifier(b: OnnxBuilder, x: str, features: int, classes: int, name: str = "fc") -> str:
    """GlobalAveragePool → Flatten → Gemm (transB=1), the torchvision head after torch.onnx."""
    with b.scope("avgpool"):
        x = b.op("GlobalAveragePool", [x])
    x = b.op("Flatten", [x], axis=1)
    with b.scope(name):
        w = b.weight("weight", b.normal((classes, features), np.sqrt(1.0 / features)))
        bias = b.weight("bias", b.normal((classes,), 0.01))
        return b.op("Gemm", [x, w, bias], alpha=1.0, beta=1.0, transB=1)
