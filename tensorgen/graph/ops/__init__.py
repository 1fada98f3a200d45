"""Lowering graph nodes (ONNX op names and semantics) to tensor expressions.

`lower_node` turns one normalized node into te Tensors, one per output; `op_kind` tells the fusion
pass what a node is (compute-intensive, element-wise, injective or a reduction). The lowerings live
in ops_elemwise / ops_index / ops_nn / ops_reduce / ops_scan / ops_scatter / ops_shape and register themselves in
`LOWERINGS`.
"""

from __future__ import annotations

from collections.abc import Callable

from tensorgen.errors import TensorExprError
from tensorgen.graph.ir import Graph, GraphError, Node
from tensorgen.graph.ops import elemwise, index, nn, reduce, scan, scatter, shape  # noqa: F401 (they register lowerings)
from tensorgen.graph.ops.base import LOWERINGS, Args, OpRule, lowering, te_shape
from tensorgen.te.tensor import Tensor

SUPPORTED_OPS: frozenset[str] = frozenset(LOWERINGS)


def _rule(node: Node) -> OpRule:
    try:
        return LOWERINGS[node.op]
    except KeyError:
        raise GraphError(f"{node}: op {node.op} is not supported; supported ops: "
                         f"{', '.join(sorted(LOWERINGS))}") from None


def op_kind(node: Node) -> str:
    """"compute" (Conv, ConvTranspose, Gemm, MatMul), "elemwise", "injective" or "reduce"."""
    return _rule(node).kind


def lower_node(node: Node, graph: Graph, tensor_of: Callable[[str], Tensor]) -> list[Tensor | None]:
    """The te Tensors computing `node`'s outputs (None for an omitted optional output).

    `tensor_of(name)` gives the tensor of an input value: a placeholder, or an earlier node's output.
    Unsupported ops, dtypes and attribute combinations raise GraphError naming the node.
    """
    rule = _rule(node)
    args = Args(node, graph, tensor_of)
    for i, value in enumerate(args.inputs):
        if value is not None and value.dtype not in rule.reads:
            raise args.error(f"input {i} ({value.name!r}) has dtype {value.dtype}, which is not supported "
                             f"(supported: {', '.join(rule.reads)})")
    main = args.out(0)
    if main.dtype not in rule.dtypes:
        raise args.error(f"output {main.name!r} has dtype {main.dtype}; {node.op} supports {', '.join(rule.dtypes)}")
    for value in args.inputs + args.outputs:
        if value is not None and 0 in value.shape:
            raise args.error(f"{value.name!r} is empty (shape {list(value.shape)}); empty tensors are not supported")
    try:
        results = list(rule.fn(node, args))
    except TensorExprError as err:
        raise args.error(str(err)) from err
    _check_results(args, results)
    return results


def _check_results(args: Args, results: list[Tensor | None]) -> None:
    """A lowering must produce computed tensors matching the output Values (catches frontend/lowering drift)."""
    outputs = args.outputs
    if len(results) != len(outputs):
        raise args.error(f"lowering produced {len(results)} tensors for {len(outputs)} outputs")
    for value, t in zip(outputs, results):
        if value is None or t is None:
            if (value is None) != (t is None):
                raise args.error("lowering and node disagree on which optional outputs are present")
            continue
        if t.is_placeholder or t.shape != te_shape(value.shape) or t.dtype != value.dtype:
            raise args.error(f"lowering produced {t.dtype}{list(t.shape)} for output {value.name!r}, which is "
                             f"{value.dtype}{list(value.shape)}")


__all__ = ["LOWERINGS", "SUPPORTED_OPS", "Args", "lower_node", "lowering", "op_kind"]
