"""Graph-to-graph optimizations run between import and fusion; `optimize` runs them all in order.

Every pass returns a new Graph and leaves its argument unchanged: it edits a shallow copy (new node
list, value and constant dicts) and replaces Nodes rather than mutating them, so the two graphs may
share Node objects and arrays. Graph inputs and outputs keep their names through every pass. Each
pass drops the values and constants no node, input or output refers to any more.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from tensorgen.graph.frontend.normalize import add_constant
from tensorgen.graph.frontend.onnx_export import evaluate_node
from tensorgen.graph.ir import Graph, GraphError, Node
from tensorgen.graph.passes.canonical import canonicalize

IDENTITY_OPS = frozenset({"Identity", "Dropout"})
# ops whose output is their input's data, row-major, under another shape
RESHAPE_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def remove_empty_tensors(graph: Graph) -> Graph:
    """A value with no elements is known without running anything: the outputs of a node that are all empty
    become constants, and a Concat drops its empty inputs (GPT-J's rotary embedding with rotary_dim equal to the
    head size slices off an empty pass-through part and concatenates it back)."""
    g = graph.copy()
    kept = []
    for node in g.nodes:
        outputs = [g.value(x) for x in node.outputs if x]
        if outputs and all(v.size == 0 for v in outputs):
            g.constants.update((v.name, np.zeros(v.shape, v.dtype)) for v in outputs)
            continue
        if node.op == "Concat":
            node = replace(node, inputs=[x for x in node.inputs if g.value(x).size > 0])
        kept.append(node)
    g.nodes = kept
    return g.prune()


def fold_constants(graph: Graph) -> Graph:
    """Evaluate (with onnx.reference) every node whose inputs are all constants; its outputs become constants."""
    g = graph.copy()
    kept = []
    for node in g.nodes:
        if any(x and x not in g.constants for x in node.inputs):
            kept.append(node)
            continue
        for name, array in evaluate_node(node, g).items():
            value = g.value(name)
            if array.shape != value.shape:
                raise GraphError(f"{node}: folding gave output {name!r} shape {array.shape}, expected {value.shape}")
            g.constants[name] = array.astype(value.dtype, copy=False)
    g.nodes = kept
    return g.prune()


def remove_identities(graph: Graph) -> Graph:
    """Remove Identity (and single-output Dropout) nodes by merging their input and output into one value.

    The merged value takes the name that must survive (a graph input, output or constant) if there is
    one, so the producer of an Identity that feeds a graph output is renamed to write that output.
    An Identity between two such names (an input passed straight to an output) stays.
    """
    g = graph.copy()
    pinned = {*g.inputs, *g.outputs, *g.constants}
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while name in parent:
            name = parent[name]
        return name

    kept = []
    for node in g.nodes:
        if node.op in IDENTITY_OPS and len(node.outputs) == 1:
            src, dst = find(node.inputs[0]), find(node.outputs[0])
            if not (src in pinned and dst in pinned):
                survivor, merged = (dst, src) if dst in pinned else (src, dst)
                parent[merged] = survivor
                continue
        kept.append(node)
    g.nodes = [_renamed(n, find) for n in kept]
    return g.prune()


def _renamed(node: Node, find: Callable[[str], str]) -> Node:
    inputs, outputs = [find(x) if x else x for x in node.inputs], [find(x) for x in node.outputs]
    return node if (inputs, outputs) == (node.inputs, node.outputs) else replace(node, inputs=inputs, outputs=outputs)


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output."""
    g = graph.copy()
    g.nodes = g.live_nodes()
    return g.prune()


# --------------------------------------------------------------------------------- batch norm folding
# A folder gets the graph, the node producing the BatchNormalization's input, the per-channel affine map
# y = x * scale + shift the BN computes, and the BN node. It returns replacements for nodes (by name)
# whose last node writes the BN's output, or None when the pattern does not apply.
BNFolder = Callable[[Graph, Node, np.ndarray, np.ndarray, Node], dict[str, list[Node]] | None]


def _const(g: Graph, base: str, array: np.ndarray, like: np.ndarray) -> str:
    return add_constant(g.values, g.constants, base, np.ascontiguousarray(array, dtype=like.dtype))


def _input_const(g: Graph, node: Node, i: int) -> np.ndarray | None:
    return g.constants.get(node.inputs[i]) if i < len(node.inputs) and node.inputs[i] else None


def _scale_conv_weight(w: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray | None:
    """Conv weight (M, C/group, k...): output channel m is row m."""
    return w * scale.reshape(-1, *[1] * (w.ndim - 1)) if w.shape[0] == len(scale) else None


def _scale_conv_transpose_weight(w: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray | None:
    """ConvTranspose weight (C, M/group, k...): output channel g*(M/group) + j is column j of group g's rows."""
    per_group = w.shape[1]
    if per_group * group != len(scale):
        return None
    grouped = w.reshape(group, -1, *w.shape[1:]) * scale.reshape(group, 1, per_group, *[1] * (w.ndim - 2))
    return grouped.reshape(w.shape)


_WEIGHT_SCALERS = {"Conv": _scale_conv_weight, "ConvTranspose": _scale_conv_transpose_weight}


def _into_conv(g: Graph, conv: Node, scale: np.ndarray, shift: np.ndarray, bn: Node) -> dict[str, list[Node]] | None:
    w = _input_const(g, conv, 1)
    scaled = None if w is None else _WEIGHT_SCALERS[conv.op](w, scale, conv.attrs["group"])
    bias = _input_const(g, conv, 2) if len(conv.inputs) > 2 else np.zeros(len(scale), np.float32)
    if scaled is None or bias is None:
        return None
    inputs = [conv.inputs[0], _const(g, f"{conv.name}_weight_bn", scaled, w),
              _const(g, f"{conv.name}_bias_bn", bias * scale + shift, w)]
    return {conv.name: [replace(conv, inputs=inputs, outputs=list(bn.outputs))]}


def _into_gemm(g: Graph, gemm: Node, scale: np.ndarray, shift: np.ndarray, bn: Node) -> dict[str, list[Node]] | None:
    b, trans = _input_const(g, gemm, 1), gemm.attrs["transB"]
    if b is None or b.shape[0 if trans else 1] != len(scale):
        return None
    c = _input_const(g, gemm, 2) if len(gemm.inputs) > 2 else np.zeros((), b.dtype)
    if c is None:
        return None
    inputs = [gemm.inputs[0], _const(g, f"{gemm.name}_B_bn", b * (scale[:, None] if trans else scale), b),
              _const(g, f"{gemm.name}_C_bn", gemm.attrs["beta"] * c * scale + shift, b)]
    attrs = {**gemm.attrs, "beta": 1.0}
    return {gemm.name: [replace(gemm, inputs=inputs, outputs=list(bn.outputs), attrs=attrs)]}


def _scaled_matmul(g: Graph, mm: Node, scale: np.ndarray) -> Node | None:
    """The 2-D MatMul with constant weight `mm`, its output columns scaled."""
    w = _input_const(g, mm, 1)
    if mm.op != "MatMul" or w is None or w.ndim != 2 or len(g.value(mm.outputs[0]).shape) != 2:
        return None
    return replace(mm, inputs=[mm.inputs[0], _const(g, f"{mm.name}_weight_bn", w * scale, w)])


def _into_matmul(g: Graph, mm: Node, scale: np.ndarray, shift: np.ndarray, bn: Node) -> dict[str, list[Node]] | None:
    scaled = _scaled_matmul(g, mm, scale)
    if scaled is None:
        return None
    shift_name = _const(g, f"{bn.name}_shift", shift, g.constants[mm.inputs[1]])
    return {mm.name: [scaled, Node("Add", bn.name, [mm.outputs[0], shift_name], list(bn.outputs))]}


def _into_matmul_add(g: Graph, add: Node, scale: np.ndarray, shift: np.ndarray,
                     bn: Node) -> dict[str, list[Node]] | None:
    """Add(MatMul(x, W), b) with constant W and b (a bias over the output columns)."""
    k = 1 if add.inputs[1] in g.constants else 0
    x, bias = add.inputs[1 - k], g.constants.get(add.inputs[k])
    mm = g.producers().get(x)
    if bias is None or mm is None or x in g.outputs or len(g.consumers()[x]) != 1 or bias.size not in (1, len(scale)):
        return None
    scaled = _scaled_matmul(g, mm, scale)
    if scaled is None or bias.ndim > 2:
        return None
    bias_name = _const(g, f"{add.name}_bias_bn", bias * scale + shift, bias)
    return {mm.name: [scaled], add.name: [replace(add, inputs=[x, bias_name], outputs=list(bn.outputs))]}


BN_FOLDERS: dict[str, BNFolder] = {"Conv": _into_conv, "ConvTranspose": _into_conv, "Gemm": _into_gemm,
                                   "MatMul": _into_matmul, "Add": _into_matmul_add}


def fold_batch_norm(graph: Graph) -> Graph:
    """Fold inference BatchNormalization into the Conv / ConvTranspose / Gemm / MatMul(+Add) with constant weights that
    produces its input, when nothing else reads that input: weights and bias are rescaled at compile
    time. Other BatchNormalizations stay (the lowering computes them element-wise)."""
    g = graph.copy()
    for bn in [n for n in g.nodes if n.op == "BatchNormalization"]:
        stats = [_input_const(g, bn, i) for i in range(1, 5)]
        x = bn.inputs[0]
        producer = g.producers().get(x)
        if any(s is None for s in stats) or producer is None or x in g.outputs or len(g.consumers()[x]) != 1:
            continue
        gamma, beta, mean, var = (s.astype(np.float64) for s in stats)
        scale = gamma / np.sqrt(var + bn.attrs["epsilon"])
        folder = BN_FOLDERS.get(producer.op)
        replacements = folder(g, producer, scale, beta - mean * scale, bn) if folder else None
        if replacements is not None:
            g.nodes = [r for n in g.nodes if n is not bn for r in replacements.get(n.name, [n])]
    return g.prune()


# ------------------------------------------------------------------------- no-ops, reshape / transpose chains
def _same_shape(g: Graph, n: Node) -> bool:
    return g.value(n.inputs[0]).shape == g.value(n.outputs[0]).shape


# when a node's output is its input, unchanged
NOOPS: dict[str, Callable[[Graph, Node], bool]] = {
    **dict.fromkeys(RESHAPE_OPS | {"Expand"}, _same_shape),
    "Transpose": lambda g, n: list(n.attrs["perm"]) == sorted(n.attrs["perm"]),
    "Cast": lambda g, n: g.value(n.inputs[0]).dtype == n.attrs["to"],
    "Slice": lambda g, n: _same_shape(g, n) and all(s > 0 for s in n.attrs["steps"]),
    "Pad": lambda g, n: not any(n.attrs["pads"]),
    "Concat": lambda g, n: len(n.inputs) == 1,
}


def remove_noops(graph: Graph) -> Graph:
    """Remove the nodes NOOPS recognizes (a reshape to the same shape, an identity permutation, ...),
    like Identity nodes (see remove_identities)."""
    g = graph.copy()
    g.nodes = [Node("Identity", n.name, [n.inputs[0]], list(n.outputs)) if n.op in NOOPS and NOOPS[n.op](g, n) else n
               for n in g.nodes]
    return remove_identities(g)


def simplify_reshapes(graph: Graph) -> Graph:
    """Collapse chains of reshape-like ops into one Reshape and of Transposes into one Transpose: the
    last node of a chain reads the chain's input directly. Earlier members that nothing else reads are
    left for eliminate_dead_code, and a chain that ends where it began for remove_noops."""
    g = graph.copy()
    producer: dict[str, Node] = {}
    nodes = []
    for node in g.nodes:
        src = producer.get(node.inputs[0]) if node.inputs else None
        if node.op in RESHAPE_OPS and src is not None and src.op in RESHAPE_OPS:
            node = Node("Reshape", node.name, [src.inputs[0]], list(node.outputs),
                        {"shape": g.value(node.outputs[0]).shape})
        elif node.op == "Transpose" and src is not None and src.op == "Transpose":
            perm = tuple(src.attrs["perm"][p] for p in node.attrs["perm"])
            node = replace(node, inputs=[src.inputs[0]], attrs={"perm": perm})
        nodes.append(node)
        producer.update(dict.fromkeys(node.outputs, node))
    g.nodes = nodes
    return g.prune()


PASSES: tuple[Callable[[Graph], Graph], ...] = (
    remove_empty_tensors, fold_constants, remove_identities, fold_batch_norm, simplify_reshapes, remove_noops,
    canonicalize, simplify_reshapes, remove_noops, eliminate_dead_code)


def optimize(graph: Graph, passes: Sequence[Callable[[Graph], Graph]] = PASSES) -> Graph:
    """Run `passes` in order (all of PASSES by default) and validate the result."""
    for run in passes:
        graph = run(graph)
    graph.validate()
    return graph
