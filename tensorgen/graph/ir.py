"""The graph IR every frontend produces: ONNX-named ops over statically shaped values.

The op vocabulary is ONNX's (op type names and attribute meanings), because that is what users
bring; frontends normalize it so the rest of tensorgen never looks at an opset:
- every attribute default is filled in;
- inputs that must be known at compile time (a Reshape's shape, Slice's starts/ends/axes/steps,
  Pad's pads, Clip's min/max, Split's split, (Un)Squeeze's and Reduce*'s axes, Resize's scales)
  become attributes, so node.inputs lists only tensors the program reads;
- Shape/ConstantOfShape/Expand-of-constant and other all-constant subgraphs are folded.
Weights and other constants live in `Graph.constants`, not in nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorgen.errors import TensorgenError


class GraphError(TensorgenError, ValueError):
    """A model cannot be imported or compiled; the message names the node and op at fault."""


#: element types of the values kernels compute
TENSOR_DTYPES = ("float32", "float64", "int32", "int64", "bool")
#: element types of the values a model reads and returns: float16 only crosses the boundary, a Cast from a
#: graph input or to a graph output (see tensorgen.graph.frontend.half)
BOUNDARY_DTYPES = (*TENSOR_DTYPES, "float16")


@dataclass(frozen=True)
class Value:
    """A tensor of the graph: a model input, a constant, or a node output."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name: float32, int64, bool, ...

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass
class Node:
    op: str  # ONNX op type, e.g. "Conv"
    name: str  # unique within the graph; used in error messages and generated C names
    inputs: list[str]  # value names; "" for an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"node {self.name!r} ({self.op})"


@dataclass
class Graph:
    """Nodes in topological order over named values; `constants` holds the data of constant values."""

    name: str
    inputs: list[str]
    outputs: list[str]
    nodes: list[Node]
    values: dict[str, Value]
    constants: dict[str, np.ndarray] = field(default_factory=dict)

    def copy(self) -> Graph:
        """A graph a pass may change without changing this one (nodes and values are shared, not copied)."""
        return Graph(self.name, list(self.inputs), list(self.outputs), list(self.nodes), dict(self.values),
                     dict(self.constants))

    def value(self, name: str) -> Value:
        try:
            return self.values[name]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no value {name!r}") from None

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {name: [] for name in self.values}
        for n in self.nodes:
            for name in n.inputs:
                if name:
                    users.setdefault(name, []).append(n)
        return users

    def live_nodes(self) -> list[Node]:
        """The nodes some of whose outputs reach a graph output, in order."""
        needed, kept = set(self.outputs), []
        for node in reversed(self.nodes):
            if needed.intersection(node.outputs):
                kept.append(node)
                needed.update(x for x in node.inputs if x)
        return kept[::-1]

    def prune(self) -> Graph:
        """Drop (in place) the values and constants that nothing refers to any more; returns self."""
        live = {*self.inputs, *self.outputs, *(x for n in self.nodes for x in (*n.inputs, *n.outputs) if x)}
        self.values = {k: v for k, v in self.values.items() if k in live}
        self.constants = {k: v for k, v in self.constants.items() if k in live}
        return self

    def is_constant(self, name: str) -> bool:
        return name in self.constants

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def validate(self) -> None:
        """Raise GraphError unless every read value is defined before use and has a known Value, and the model's
        inputs and outputs have element types kernels take (one the model only passes along reached no lowering's
        check: a uint8 input a KeyError in the executor)."""
        defined = set(self.inputs) | set(self.constants)
        for name in defined:
            self.value(name)
        for kind, names in (("input", self.inputs), ("output", self.outputs)):
            for name in names:
                if name in self.values and self.values[name].dtype not in BOUNDARY_DTYPES:
                    raise GraphError(f"graph {kind} {name!r} is {self.values[name].dtype}; tensorgen takes "
                                     f"{', '.join(BOUNDARY_DTYPES)}")
        for node in self.nodes:
            for name in node.inputs:
                if name and name not in defined:
                    raise GraphError(f"{node} reads {name!r}, which no earlier node, input or constant defines")
            for name in node.outputs:
                if not name:  # an optional output left out (LayerNormalization's Mean)
                    continue
                if name not in self.values:
                    raise GraphError(f"{node} output {name!r} has no shape/dtype")
                defined.add(name)
        for name in self.outputs:
            if name not in defined:
                raise GraphError(f"graph output {name!r} is never computed")

    def summary(self) -> str:
        ops: dict[str, int] = {}
        for n in self.nodes:
            ops[n.op] = ops.get(n.op, 0) + 1
        weights = sum(a.nbytes for a in self.constants.values())
        listing = ", ".join(f"{op}×{k}" for op, k in sorted(ops.items(), key=lambda kv: -kv[1]))
        return f"{self.name}: {len(self.nodes)} nodes ({listing}); {weights / 2**20:.1f} MiB of constants"
