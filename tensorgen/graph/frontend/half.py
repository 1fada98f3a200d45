"""Half-precision models (float16, bfloat16) computed in float32.

tensorgen's kernels compute in float32 and float64. Both frontends import a half-precision model (an ONNX model
exported with `.half()` or converted by onnxconverter-common's float16 pass, a torch module in `.half()`) as it is
written and then widen it here: every float16 or bfloat16 value and constant becomes float32, and a Cast to a half
type casts to float32. The model's own float16 inputs and outputs keep their type: each float16 input is cast to
float32 where the graph starts and each float16 output is cast back where it ends, so the compiled model takes and
returns float16 arrays, as ONNX Runtime and PyTorch do.

The answer is the float32 computation's, rounded to float16 once at the end: at least as accurate as the model run
in half precision (ONNX Runtime's CPU kernels widen most float16 ops to float32 too), not bit-equal to it, since a
Cast to float16 in the middle of the graph no longer rounds. bfloat16 inputs and outputs are refused in one line
(NumPy has no bfloat16 array type to pass them in); bfloat16 weights and values inside the graph are widened.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tensorgen.graph.frontend.normalize import unique_name
from tensorgen.graph.ir import Graph, GraphError, Node, Value

__all__ = ["HALF_DTYPES", "compute_in_float32"]

#: element types computed in float32
HALF_DTYPES = frozenset({"float16", "bfloat16"})


def compute_in_float32(graph: Graph) -> Graph:
    """`graph` with its half-precision values computed in float32 and its float16 inputs and outputs cast at the
    boundary (see the module docstring); `graph` itself when it has no half-precision value."""
    if not any(v.dtype in HALF_DTYPES for v in graph.values.values()):
        return graph
    for kind, names in (("input", graph.inputs), ("output", graph.outputs)):
        for name in names:
            if graph.value(name).dtype == "bfloat16":
                raise GraphError(f"graph {kind} {name!r} is bfloat16, which NumPy cannot pass; tensorgen takes "
                                 "float16 or float32 at the model's boundary")
    read = {x for node in graph.nodes for x in node.inputs}
    ends = [n for n in graph.inputs if graph.value(n).dtype == "float16" and n in read]  # read where it starts
    ends += [n for n in graph.outputs if graph.value(n).dtype == "float16" and n not in graph.inputs]
    taken = {*graph.values, *graph.constants}
    wide = {name: unique_name(f"{name}_float32", taken) for name in dict.fromkeys(ends)}
    values = {wide.get(k, k): Value(wide.get(k, k), v.shape, _widened(v.dtype)) for k, v in graph.values.items()}
    # the boundary keeps its float16 (an input no node reads, an input returned as it is, too)
    values.update({k: v for k, v in graph.values.items() if k in (*graph.inputs, *graph.outputs)})
    constants = {wide.get(k, k): a.astype(np.float32) if a.dtype.name in HALF_DTYPES else a
                 for k, a in graph.constants.items()}
    nodes = [replace(n, inputs=[wide.get(x, x) for x in n.inputs], outputs=[wide.get(x, x) for x in n.outputs],
                     attrs={k: _widened(a) if isinstance(a, str) else a for k, a in n.attrs.items()})
             for n in graph.nodes]
    node_names = {n.name for n in graph.nodes}
    first = [Node("Cast", unique_name(f"{n}_to_float32", node_names), [n], [wide[n]], {"to": "float32"})
             for n in graph.inputs if n in wide]
    last = [Node("Cast", unique_name(f"{n}_to_float16", node_names), [wide[n]], [n], {"to": "float16"})
            for n in dict.fromkeys(graph.outputs) if n in wide and n not in graph.inputs]
    return Graph(graph.name, list(graph.inputs), list(graph.outputs), [*first, *nodes, *last], values, constants)


def _widened(dtype: str) -> str:
    return "float32" if dtype in HALF_DTYPES else dtype
