"""Run a Graph node by node, each node compiled on its own as the naive program: the reference
executor for debugging a model and for op conformance (no fusion, no schedule, no memory plan)."""

from __future__ import annotations

import numpy as np

from tensorgen.build import CompiledFunction, build
from tensorgen.dag import ComputeDAG
from tensorgen.graph.ir import Graph, GraphError, Node
from tensorgen.graph.ops import lower_node
from tensorgen.graph.ops.base import te_shape
from tensorgen.te.tensor import Tensor, placeholder

# Compiled nodes by the canonical text of their DAG: it covers op, attributes, shapes, dtypes and
# every constant a lowering specialized on, so nodes that lower to the same program compile once.
_COMPILED: dict[str, CompiledFunction] = {}

def run_nodewise(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph outputs for `inputs` (by graph input name), executing one compiled kernel per node."""
    graph.validate()
    env = _checked_inputs(graph, inputs)
    env.update(graph.constants)
    for node in graph.nodes:
        env.update(_run_node(node, graph, env))
    return {name: env[name] for name in graph.outputs}


def _checked_inputs(graph: Graph, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    unknown = sorted(set(inputs) - set(graph.inputs))
    if unknown:
        raise GraphError(f"graph {graph.name!r} has no input(s) {unknown}; its inputs are {graph.inputs}")
    env = {}
    for name in graph.inputs:
        value = graph.value(name)
        if name not in inputs:
            raise GraphError(f"graph {graph.name!r}: input {name!r} ({value.dtype}{list(value.shape)}) is missing")
        array = np.asarray(inputs[name])
        if array.shape != value.shape or array.dtype != np.dtype(value.dtype):
            raise GraphError(f"graph {graph.name!r}: input {name!r} must be {value.dtype}{list(value.shape)}, "
                             f"got {array.dtype}{list(array.shape)}")
        env[name] = array
    return env


def _run_node(node: Node, graph: Graph, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    feeds: list[str] = []
    tensors: dict[str, Tensor] = {}

    def tensor_of(name: str) -> Tensor:
        if name not in tensors:
            value = graph.value(name)
            tensors[name] = placeholder(te_shape(value.shape), value.dtype, f"input{len(feeds)}")
            feeds.append(name)
        return tensors[name]

    results = lower_node(node, graph, tensor_of)
    produced = [(name, t) for name, t in zip(node.outputs, results) if t is not None]
    dag = ComputeDAG([tensors[name] for name in feeds] + [t for _, t in produced])
    fn = _COMPILED.get(dag.canonical_text)
    if fn is None:
        fn = _COMPILED[dag.canonical_text] = build(dag)
    arrays = [np.ascontiguousarray(env[name], dtype=t.dtype).reshape(t.shape)
              for name, t in zip(feeds, dag.inputs)]
    outs = fn.run(*arrays)
    return {name: out.reshape(graph.value(name).shape) for (name, _), out in zip(produced, outs)}
