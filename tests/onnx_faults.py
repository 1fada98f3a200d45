"""Malformed, truncated and adversarial ONNX files, each written by the onnx helper API (or by hand where the
API refuses), for the fault tests; FAULTS maps a name to (writer, what the one-line error must say)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, initializers=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fault", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name: str, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, F, shape)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def _relu(shape) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape)], [_vi("y", shape)])


def huge_matmul(path: Path) -> Path:
    n = 100_000
    return _save(_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [_vi("a", [n, n]), _vi("b", [n, n])],
                        [_vi("y", [n, n])]), path)


def huge_relu(path: Path) -> Path:
    return _save(_relu([100_000, 100_000]), path)


def huge_constant_of_shape(path: Path) -> Path:
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [100_000, 100_000])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])]
    return _save(_model(nodes, [_vi("x", [1, 1])], [_vi("y", [100_000, 100_000])], [shape]), path)


def huge_initializer(path: Path) -> Path:
    """An initializer that declares 10^10 floats and holds 4 bytes."""
    w = TensorProto(name="w", data_type=F, dims=[100_000, 100_000], raw_data=b"\0\0\0\0")  # the API checks sizes
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    return _save(_model(nodes, [_vi("x", [1, 1])], [_vi("y", [100_000, 100_000])], [w]), path)


def truncated(path: Path) -> Path:
    w = helper.make_tensor("w", F, [64, 64], np.ones((64, 64), np.float32))
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 64])], [_vi("y", [1, 64])], [w])
    data = model.SerializeToString()
    path.write_bytes(data[:len(data) // 2])
    return path


def random_bytes(path: Path) -> Path:
    path.write_bytes(np.random.default_rng(0).bytes(4096))
    return path


def empty_file(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def cycle(path: Path) -> Path:
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Relu", ["a"], ["y"])]
    return _save(_model(nodes, [_vi("x", [2, 2])], [_vi("y", [2, 2])]), path)


def mismatched_matmul(path: Path) -> Path:
    return _save(_model([helper.make_node("MatMul", ["a", "b"], ["y"])], [_vi("a", [2, 3]), _vi("b", [4, 5])],
                        [_vi("y", [2, 5])]), path)


def negative_dim(path: Path) -> Path:
    return _save(_relu([-3, 4]), path)


def _external(location: str) -> onnx.ModelProto:
    w = TensorProto(name="w", data_type=F, dims=[4])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [4])], [_vi("y", [4])], [w])


def external_outside(path: Path) -> Path:
    return _save(_external("../../../../../../etc/passwd"), path)


def external_absolute(path: Path) -> Path:
    return _save(_external("/etc/passwd"), path)


def external_missing(path: Path) -> Path:
    return _save(_external("weights.bin"), path)


def unsupported_op(path: Path) -> Path:
    return _save(_model([helper.make_node("NonMaxSuppression", ["x", "s"], ["y"])],
                        [_vi("x", [1, 4, 4]), _vi("s", [1, 1, 4])], [helper.make_tensor_value_info("y", 7, [1, 3])]),
                 path)


def opset_old(path: Path) -> Path:
    """Opset 9 with an op ONNX's version converter has no adapter for (older opsets are upgraded on import)."""
    model = _model([helper.make_node("Det", ["x"], ["y"])], [_vi("x", [2, 3, 3])], [_vi("y", [2])])
    model.opset_import[0].version = 9
    return _save(model, path)


def uint8_passed_along(path: Path) -> Path:
    """A uint8 input that only an Identity reads: no lowering checked its type (a KeyError in the executor)."""
    u8 = helper.make_tensor_value_info("u", onnx.TensorProto.UINT8, [2])
    z8 = helper.make_tensor_value_info("z", onnx.TensorProto.UINT8, [2])
    return _save(_model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["u"], ["z"])],
                        [_vi("x", [2]), u8], [_vi("y", [2]), z8]), path)


def opset_new(path: Path) -> Path:
    model = _relu([2, 2])
    model.opset_import[0].version = 99
    return _save(model, path)


def empty_graph(path: Path) -> Path:
    return _save(_model([], [], []), path)


def duplicate_outputs(path: Path) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])]
    return _save(_model(nodes, [_vi("x", [2, 2])], [_vi("y", [2, 2])]), path)


def undefined_input(path: Path) -> Path:
    return _save(_model([helper.make_node("Relu", ["nowhere"], ["y"])], [_vi("x", [2])], [_vi("y", [2])]), path)


#: name -> (writer, a fragment the one-line error must contain)
FAULTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "huge_matmul": (huge_matmul, "the limit is"),
    "huge_relu": (huge_relu, "the limit is"),
    "huge_constant_of_shape": (huge_constant_of_shape, "the limit is"),
    "huge_initializer": (huge_initializer, "w"),
    "truncated": (truncated, "cannot be read"),
    "random_bytes": (random_bytes, "cannot be read"),
    "empty_file": (empty_file, "not an ONNX model"),
    "cycle": (cycle, "cycle"),
    "mismatched_matmul": (mismatched_matmul, "shape inference failed"),
    "negative_dim": (negative_dim, "dimension"),
    "external_outside": (external_outside, "outside"),
    "external_absolute": (external_absolute, "outside"),
    "external_missing": (external_missing, "weights.bin"),
    "unsupported_op": (unsupported_op, "unsupported op"),
    "opset_old": (opset_old, "opset 9; tensorgen imports opsets 13–21, and ONNX's version converter cannot"),
    "opset_new": (opset_new, "opset 99"),
    "uint8_passed_along": (uint8_passed_along, "graph input 'u' is uint8"),
    "empty_graph": (empty_graph, "no"),
    "duplicate_outputs": (duplicate_outputs, "'y'"),
    "undefined_input": (undefined_input, "'nowhere'"),
}
