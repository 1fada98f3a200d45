"""The converter table's core: the registry, the import's protocol and the argument helpers every converter uses.

A converter gets the import (`Emitter`: it makes constants and emits ONNX-vocabulary nodes that the ONNX
frontend's normalizers then check and complete), the call's arguments — run-time values, constant tensors or
Python values — and the (shape, dtype) of each output from the exported graph. It returns the name of its
output value (a tuple for ops with several; None where an output is one tensorgen does not compute, such as
batch norm's training statistics). Register your own with `@converts("aten.my_op")`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tensorgen.graph.ir import GraphError, Value

Shape = tuple[tuple[int, ...], str]  # (shape, dtype) of an output
INT64_MAX = np.iinfo(np.int64).max


class ConvertError(GraphError):
    """An ATen call the IR cannot express (an unsupported argument value)."""


class Emitter(Protocol):
    """What a converter may ask of the import (tensorgen.graph.frontend.torch_import.TorchImport)."""

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None, *,
             shapes: Sequence[Shape], label: str = "") -> list[str]: ...

    def tensor(self, x: Any, dtype: str | None = None) -> str: ...

    def constant(self, array: Any, base: str = "const") -> str: ...

    def value(self, name: str) -> Value: ...

    def is_runtime(self, x: Any) -> bool: ...

    def owns_storage(self, name: str) -> bool: ...


Converter = Callable[[Emitter, tuple, dict, list[Shape]], Any]
CONVERTERS: dict[str, Converter] = {}


def converts(*ops: str) -> Callable[[Converter], Converter]:
    """Register a converter for ATen overload packets ("aten.relu")."""
    def register(fn: Converter) -> Converter:
        for op in ops:
            CONVERTERS[op] = fn
        return fn

    return register


def arg(args: tuple, kwargs: dict, i: int, name: str, default: Any = None) -> Any:
    """Argument `i` (or keyword `name`) of a call, `default` when absent."""
    return args[i] if i < len(args) else kwargs.get(name, default)


def operand(cx: Emitter, x: Any, dtype: str) -> str:
    """`x` as a value of `dtype`: run-time values of another dtype are Cast, constants converted."""
    if x is None:
        raise ConvertError("reads an output tensorgen does not compute (training statistics or pooling indices)")
    if not cx.is_runtime(x):
        return cx.tensor(x, dtype)
    name = cx.tensor(x)
    value = cx.value(name)
    if value.dtype == dtype:
        return name
    return cx.emit("Cast", [name], {"to": onnx_type(dtype)}, shapes=[(value.shape, dtype)])[0]


def onnx_type(dtype: str) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def single(shapes: list[Shape]) -> Shape:
    return shapes[0]


def unary(op: str, **attrs: Any) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = single(shapes)
        return cx.emit(op, [operand(cx, args[0], dtype)], attrs, shapes=[(shape, dtype)])[0]

    return convert


#: arithmetic PyTorch allows on bool tensors, as the logic op it is (`mask_a * mask_b` is and)
BOOL_ARITHMETIC = {"Mul": "And", "Add": "Or", "Max": "Or", "Min": "And"}


def binary(op: str) -> Converter:
    def convert(cx: Emitter, args: tuple, kwargs: dict, shapes: list[Shape]) -> str:
        shape, dtype = single(shapes)
        if dtype == "bool":
            if op not in BOOL_ARITHMETIC:
                raise ConvertError(f"{op} of bool tensors")
            return cx.emit(BOOL_ARITHMETIC[op], [operand(cx, x, dtype) for x in args[:2]], shapes=[(shape, dtype)])[0]
        a, b = operand(cx, args[0], dtype), operand(cx, args[1], dtype)
        alpha = arg(args, kwargs, 2, "alpha", 1)
        if alpha != 1:
            b = cx.emit("Mul", [b, cx.tensor(np.array(alpha, dtype=dtype))],
                        shapes=[(cx.value(b).shape, dtype)])[0]
        return cx.emit(op, [a, b], shapes=[(shape, dtype)])[0]

    return convert


@dataclass(frozen=True)
class Formula:
    """Writes a converter's formula node by node: `f("Add", a, b)` emits one node whose output has the inputs'
    broadcast shape (or `shape=`) and `dtype` (or `out=`); other keywords are attributes. `f.const(v)` is a scalar
    constant of `dtype`."""

    cx: Emitter
    dtype: str

    def __call__(self, op: str, *inputs: str, out: str | None = None, shape: tuple[int, ...] | None = None,
                 **attrs: Any) -> str:
        if shape is None:
            shape = tuple(np.broadcast_shapes(*(self.cx.value(x).shape for x in inputs)))
        return self.cx.emit(op, list(inputs), attrs or None, shapes=[(shape, out or self.dtype)])[0]

    @classmethod
    def of(cls, cx: Emitter, shapes: list[Shape]) -> Formula:
        """A formula in the dtype of a converter's single output."""
        return cls(cx, single(shapes)[1])

    def const(self, value: float) -> str:
        return self.cx.tensor(np.array(value, dtype=self.dtype))

    def reduce(self, op: str, x: str, axis: int, keepdims: bool = False, out: str | None = None) -> str:
        """`op` (ReduceMax, ReduceSum, ...) of `x` over one axis (negative: from the end)."""
        shape = list(self.cx.value(x).shape)
        axis %= len(shape)
        shape[axis:axis + 1] = [1] if keepdims else []
        return self(op, x, shape=tuple(shape), out=out, axes=[axis], keepdims=int(keepdims), noop_with_empty_axes=0)
