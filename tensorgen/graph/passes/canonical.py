"""One form for what frontends write differently: the rewrites that make a PyTorch graph and its ONNX twin the
same graph, so they make the same tuning tasks and one database serves both.

A `Rewrite` is a small rule: at a node of its `op` (the last node of its pattern), `apply` looks back through the
producers and returns the nodes that replace that node — writing the same outputs from the pattern's inputs — or
None where the pattern does not hold. The pattern's earlier nodes, which every rule requires nothing else to
read, are dropped with it. `canonicalize(graph, rewrites)` takes a user's own table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.graph.frontend.normalize import add_constant, add_value
from tensorgen.graph.ir import Graph, Node


@dataclass
class Uses:
    """Who writes and how many read each value of a graph (kept current by canonicalize)."""

    graph: Graph
    producers: dict[str, Node]
    readers: dict[str, int]

    @classmethod
    def of(cls, graph: Graph) -> Uses:
        return cls(graph, graph.producers(), {k: len(v) for k, v in graph.consumers().items()})

    def inner(self, name: str) -> Node | None:
        """The producer of `name` when one node reads it and it is no graph output: a pattern's inside."""
        if not name or name in self.graph.outputs or self.readers.get(name) != 1:
            return None
        return self.producers.get(name)


@dataclass(frozen=True)
class Rewrite:
    """At a node of `op`, `apply(uses, node)` gives its replacement nodes, or None."""

    name: str
    op: str
    apply: Callable[[Uses, Node], list[Node] | None]


# ---- nn.Linear on N-D input: Reshape -> Gemm -> Reshape  ==>  MatMul + Add -------------------------------


def _linear_as_matmul(uses: Uses, out: Node) -> list[Node] | None:
    """torch.export writes a Linear on a 3-D input as view -> addmm -> view; torch.onnx as MatMul by W^T and Add."""
    g = uses.graph
    gemm = uses.inner(out.inputs[0])
    if gemm is None or gemm.op != "Gemm" or gemm.attrs["transA"] or gemm.attrs["alpha"] != 1.0:
        return None
    flat, weight = uses.inner(gemm.inputs[0]), g.constants.get(gemm.inputs[1])
    has_bias = len(gemm.inputs) > 2 and bool(gemm.inputs[2])
    bias = g.constants.get(gemm.inputs[2]) if has_bias else None
    if flat is None or flat.op != "Reshape" or weight is None or (has_bias and (bias is None or bias.ndim > 1)):
        return None
    x, y = g.value(flat.inputs[0]), g.value(out.outputs[0])
    w = weight.T if gemm.attrs["transB"] else weight
    (k, m), dtype = w.shape, y.dtype
    lead = x.shape[:-1] if len(x.shape) > 2 and x.shape[-1] == k else \
        y.shape[:-1] if len(y.shape) > 2 and y.shape[-1] == m else None
    if lead is None:
        return None
    nodes = [Node("Reshape", flat.name, [flat.inputs[0]], [add_value(g.values, f"{gemm.name}_rows", (*lead, k), dtype)],
                  {"shape": (*lead, k)})]  # Reshapes to the same shape go with remove_noops
    w_name = add_constant(g.values, g.constants, f"{gemm.name}_weight", np.ascontiguousarray(w))
    nodes.append(Node("MatMul", gemm.name, [nodes[-1].outputs[0], w_name],
                      [add_value(g.values, f"{gemm.name}_matmul", (*lead, m), dtype)]))
    if bias is not None:
        scaled = (bias * gemm.attrs["beta"]).astype(bias.dtype)
        b_name = add_constant(g.values, g.constants, f"{gemm.name}_bias", scaled)
        nodes.append(Node("Add", f"{gemm.name}_add", [nodes[-1].outputs[0], b_name],
                          [add_value(g.values, f"{gemm.name}_biased", (*lead, m), dtype)]))
    nodes.append(Node("Reshape", out.name, [nodes[-1].outputs[0]], list(out.outputs), {"shape": y.shape}))
    return nodes


# ---- batched matmul through merged batch dimensions  ==>  one N-D MatMul -------------------------------------


def _unmerged_matmul(uses: Uses, out: Node) -> list[Node] | None:
    """torch.matmul on 4-D tensors exports as view(B, m, k) / view(B, k, n) -> bmm -> view(b, h, m, n)."""
    g = uses.graph
    mm = uses.inner(out.inputs[0])
    if mm is None or mm.op != "MatMul":
        return None
    sides = [uses.inner(name) for name in mm.inputs]
    if any(s is None or s.op != "Reshape" for s in sides):
        return None
    merged, y = g.value(mm.outputs[0]).shape, g.value(out.outputs[0]).shape
    batch = y[:-2]
    if len(merged) != 3 or len(batch) < 2 or y[-2:] != merged[-2:] or math.prod(batch) != merged[0]:
        return None
    for s in sides:  # each side's reshape only merges the batch dimensions: (*batch, m, k) -> (B, m, k)
        source, target = g.value(s.inputs[0]).shape, g.value(s.outputs[0]).shape
        if source[:-2] != batch or target != (merged[0], *source[-2:]):
            return None
    return [Node("MatMul", mm.name, [s.inputs[0] for s in sides], list(out.outputs))]


# ---- GELU written out with erf  ==>  Gelu ---------------------------------------------------------------


def _factors(uses: Uses, node: Node) -> list[str]:
    """The leaves of the product tree of Mul nodes ending at `node` (inner Muls read by nothing else)."""
    leaves = []
    for name in node.inputs:
        inner = uses.inner(name)
        leaves.extend(_factors(uses, inner) if inner is not None and inner.op == "Mul" else [name])
    return leaves


def _is(uses: Uses, name: str, value: float) -> bool:
    array = uses.graph.constants.get(name)
    return array is not None and array.size == 1 and math.isclose(float(array.reshape(-1)[0]), value, rel_tol=1e-5)


def _erf_gelu(uses: Uses, mul: Node) -> list[Node] | None:
    """x * 0.5 * (1 + erf(x / sqrt 2)) in any order of its products, as ONNX exporters write F.gelu (not where a
    constant of higher rank broadcasts x to another shape)."""
    factors = _factors(uses, mul)
    halves = [f for f in factors if _is(uses, f, 0.5)]
    if len(factors) != 3 or len(halves) != 1:
        return None
    shape = uses.graph.value(mul.outputs[0]).shape
    rest = [f for f in factors if f != halves[0]]
    for one_plus, x in (rest, rest[::-1]):
        add = uses.inner(one_plus)
        if add is None or add.op != "Add" or sum(_is(uses, i, 1.0) for i in add.inputs) != 1:
            continue
        erf = uses.inner(next(i for i in add.inputs if not _is(uses, i, 1.0)))
        scaled = uses.inner(erf.inputs[0]) if erf is not None and erf.op == "Erf" else None
        if scaled is not None and scaled.inputs[0] == x and uses.graph.value(x).shape == shape and (
                (scaled.op == "Div" and _is(uses, scaled.inputs[1], math.sqrt(2)))
                or (scaled.op == "Mul" and _is(uses, scaled.inputs[1], math.sqrt(0.5)))):
            return [Node("Gelu", mul.name, [x], list(mul.outputs), {"approximate": "none"})]
    return None


# ---- commutative ops read their constant second -------------------------------------------------------------


def _constant_second(uses: Uses, node: Node) -> list[Node] | None:
    """Add(b, x) and Mul(c, x) with a constant first become Add(x, b), Mul(x, c): exporters write either."""
    a, b = node.inputs
    constants = uses.graph.constants
    return [Node(node.op, node.name, [b, a], list(node.outputs), dict(node.attrs))] \
        if a in constants and b not in constants else None


REWRITES: tuple[Rewrite, ...] = (
    Rewrite("linear-as-matmul", "Reshape", _linear_as_matmul),
    Rewrite("unmerged-batched-matmul", "Reshape", _unmerged_matmul),
    Rewrite("erf-gelu", "Mul", _erf_gelu),
    Rewrite("constant-second", "Add", _constant_second),
    Rewrite("constant-second", "Mul", _constant_second),
)


def canonicalize(graph: Graph, rewrites: Sequence[Rewrite] = REWRITES) -> Graph:
    """Apply the first matching rewrite at each node, in order; the nodes a rewrite leaves unread go at once."""
    g = graph.copy()
    g.nodes = g.live_nodes()  # a dead reader would hide a pattern's single use
    by_op: dict[str, list[Rewrite]] = {}
    for rule in rewrites:
        by_op.setdefault(rule.op, []).append(rule)
    uses, i = Uses.of(g), 0
    while i < len(g.nodes):
        node = g.nodes[i]
        replacement = next((r for rule in by_op.get(node.op, ()) if (r := rule.apply(uses, node)) is not None), None)
        if replacement is not None:
            g.nodes[i:i + 1] = replacement
            g.nodes = g.live_nodes()
            i = next(k for k, n in enumerate(g.nodes) if n is replacement[-1])
            uses = Uses.of(g)
        i += 1
    return g.prune()

