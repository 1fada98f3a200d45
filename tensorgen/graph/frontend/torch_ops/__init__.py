"""Converters from Core ATen calls to graph-IR nodes, one small function per op, in a table.

A converter gets the import (`Emitter`: it makes constants and emits ONNX-vocabulary nodes that the ONNX
frontend's normalizers then check and complete), the call's arguments — run-time values, constant tensors or
Python values — and the (shape, dtype) of each output from the exported graph. It returns the name of its
output value (a tuple for ops with several; None where an output is one tensorgen does not compute, such as
batch norm's training statistics). Register your own with `@converts("aten.my_op")`.
"""

from tensorgen.graph.frontend.torch_ops import (  # noqa: F401  (register converters)
    elementwise,
    indexing,
    nn,
    numeric,
    reduce,
    scan,
    scatter,
    shape,
    special,
)
from tensorgen.graph.frontend.torch_ops.core import CONVERTERS, Converter, ConvertError, Emitter, arg, converts, operand

__all__ = ["CONVERTERS", "ConvertError", "Converter", "Emitter", "arg", "converts", "operand"]
