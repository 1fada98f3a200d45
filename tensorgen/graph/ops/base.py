"""The lowering registry: how a graph node becomes te Tensors, and what a lowering may ask about its inputs.

A lowering is a small function registered for one or more ONNX op names with `@lowering(...)`; it
receives the normalized node (see tensorgen.graph.ir for the attribute contract) and an `Args` view of
its inputs, and returns one te Tensor per node output (None for an omitted optional output).
te has no rank-0 tensors, so a rank-0 Value is lowered with shape (1,) (`te_shape`); executors view
such arrays accordingly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorgen.graph.ir import BOUNDARY_DTYPES, TENSOR_DTYPES, Graph, GraphError, Node, Value
from tensorgen.te.expr import Expr, Var, const, is_float
from tensorgen.te.tensor import Tensor

FLOATS = ("float32", "float64")
INTS = ("int32", "int64")
NUMERIC = FLOATS + INTS
#: dtypes a node may read; bool only as a condition (Where) or a Cast source
READABLE = TENSOR_DTYPES
#: what a Cast reads and writes: also the float16 of a model's inputs and outputs
CASTABLE = BOUNDARY_DTYPES
KINDS = ("compute", "elemwise", "injective", "reduce")

Lowering = Callable[[Node, "Args"], Sequence[Tensor | None]]


@dataclass(frozen=True)
class OpRule:
    """A registered lowering with what the fusion pass and the dtype check need to know about its op."""

    fn: Lowering
    kind: str  # one of KINDS
    dtypes: tuple[str, ...]  # dtypes the op's outputs may have
    reads: tuple[str, ...] = READABLE  # dtypes its inputs may have


LOWERINGS: dict[str, OpRule] = {}


def lowering(*ops: str, kind: str, dtypes: tuple[str, ...] = NUMERIC,
             reads: tuple[str, ...] = READABLE) -> Callable[[Lowering], Lowering]:
    """Register `fn(node, args) -> [Tensor, ...]` as the lowering of `ops` (ONNX op names), whose outputs may
    have `dtypes` and inputs `reads`."""
    if kind not in KINDS:
        raise ValueError(f"op kind {kind!r} is not one of {KINDS}")

    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"op {op} already has a lowering ({LOWERINGS[op].fn.__name__})")
            LOWERINGS[op] = OpRule(fn, kind, dtypes, reads)
        return fn

    return register


def te_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The te shape of a Value shape: rank 0 becomes (1,)."""
    return tuple(shape) or (1,)


def _snake(op: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op).lower()


@dataclass
class Args:
    """What a lowering may know about the inputs and outputs of `node`.

    `tensor(i)` goes through `tensor_of`, which the caller owns: it returns the te placeholder of a
    graph input or constant, or the tensor an earlier lowering produced.
    """

    node: Node
    graph: Graph
    tensor_of: Callable[[str], Tensor]

    def error(self, message: str) -> GraphError:
        return GraphError(f"{self.node}: {message}")

    def present(self, i: int) -> bool:
        return i < len(self.node.inputs) and self.node.inputs[i] != ""

    def _input(self, i: int) -> str:
        if not self.present(i):
            raise self.error(f"input {i} is missing ({len(self.node.inputs)} given)")
        return self.node.inputs[i]

    def value(self, i: int) -> Value:
        return self.graph.value(self._input(i))

    def tensor(self, i: int) -> Tensor:
        return self.tensor_of(self._input(i))

    def constant(self, i: int) -> np.ndarray | None:
        """The data of input i if it is a graph constant, else None."""
        return self.graph.constants.get(self.node.inputs[i]) if self.present(i) else None

    def scalar(self, i: int) -> int | float | None:
        """Input i as a Python number if it is a finite one-element constant (so it can be a literal)."""
        data = self.constant(i)
        if data is None or data.size != 1:
            return None
        item = data.reshape(()).item()
        return item if not isinstance(item, float) or math.isfinite(item) else None

    @property
    def inputs(self) -> list[Value | None]:
        return [self.value(i) if self.present(i) else None for i in range(len(self.node.inputs))]

    @property
    def outputs(self) -> list[Value | None]:
        """The node's output Values, None where an optional output is omitted."""
        return [self.graph.value(name) if name else None for name in self.node.outputs]

    def out(self, k: int = 0) -> Value:
        value = self.outputs[k] if k < len(self.node.outputs) else None
        if value is None:
            raise self.error(f"output {k} is missing")
        return value

    def out_shape(self, k: int = 0) -> tuple[int, ...]:
        """The te shape of output k."""
        return te_shape(self.out(k).shape)

    def expect_shape(self, k: int, shape: Sequence[int]) -> None:
        """A GraphError unless output k has `shape`, the one the inputs and attributes give."""
        if tuple(shape) != self.out(k).shape:
            raise self.error(f"output {k} is {list(self.out(k).shape)}, but the inputs and attributes give "
                             f"{list(shape)}")

    def attr(self, name: str) -> Any:
        try:
            return self.node.attrs[name]
        except KeyError:
            raise self.error(f"attribute {name!r} is missing (the frontend fills in every attribute)") from None

    def name(self, suffix: str = "") -> str:
        """A C-identifier stage name derived from the node name (and op, where the name is unusable)."""
        base = re.sub(r"\W+", "_", self.node.name, flags=re.ASCII).strip("_")
        if not base or base[0].isdigit():
            base = f"{_snake(self.node.op)}_{base}".rstrip("_")
        return f"{base}_{suffix}" if suffix else base

    def literal(self, value: int | float, dtype: str) -> Expr:
        """`value` as a constant of `dtype`; a GraphError where it does not fit (0.5 for an integer)."""
        if not is_float(dtype) and not float(value).is_integer():
            raise self.error(f"the constant {value} cannot be used with {dtype} tensors")
        return const(value, dtype)


def broadcast_index(shape: Sequence[int], idx: Sequence[Expr]) -> tuple:
    """Where a tensor of `shape` is read for output index `idx` under ONNX (NumPy) multidirectional
    broadcasting: right-aligned, size-1 dims read at 0 — unless the output dim is size 1 as well: then
    at the output's own axis, so an element-wise op on equal shapes reads its input at its own axes
    and the sketch rules see a fusible consumer (batch-1 conv -> bias -> clip)."""
    tail = idx[len(idx) - len(shape):]
    return tuple(i if n != 1 or (isinstance(i, Var) and i.extent == 1) else 0 for i, n in zip(tail, shape))


def broadcast_load(t: Tensor, idx: Sequence[Expr]) -> Expr:
    return t[broadcast_index(t.shape, idx)]


Operand = Callable[[Sequence[Expr]], Expr]


def operand(args: Args, i: int, dtype: str) -> Operand:
    """Input i as a function of the output index: a literal if it is a scalar constant, else a broadcast load."""
    value = args.scalar(i)
    if value is not None:
        lit = args.literal(value, dtype)
        return lambda idx: lit
    t = args.tensor(i)
    return lambda idx: broadcast_load(t, idx)
