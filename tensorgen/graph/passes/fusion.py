"""Partition a graph into fused subgraphs the way Relay does, and turn each into a ComputeDAG.

- a compute-intensive op (conv, matmul, ...) absorbs the element-wise ops that consume it;
- element-wise and injective ops chain together, element-wise ops also follow reductions, and a reduction joins
  the element-wise or injective group that feeds it (RMSNorm's square and mean: one kernel), not one that starts
  with a reduction;
- reshape-like ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity) get no kernel at all: their
  output is the same row-major memory as their input, so the executor aliases it.
A node joins its producer's group only if the producer's output is read by that node alone and is
not a graph output, so every group has its outputs at its end and groups form a DAG.

Stage names inside a subgraph are derived from op types, not node names, so identical subgraphs
anywhere in a model have identical DAGs: one workload key, one task, and records that replay on all.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensorgen.dag import ComputeDAG, topological
from tensorgen.graph.ir import Graph, GraphError, Node
from tensorgen.graph.ops import lower_node, op_kind
from tensorgen.graph.ops.base import te_shape
from tensorgen.graph.passes.layout import to_channels_last
from tensorgen.runtime.module import DTYPES as KERNEL_DTYPES
from tensorgen.schedule.layout import LayoutPrimitive
from tensorgen.te.tensor import Tensor, placeholder

ALIAS_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
# ops whose input 1 holds indices into input 0 along attribute `axis`, checked by the executor when computed at run time
GATHER_OPS = frozenset({"Gather", "GatherElements"})
# ops whose input 1 holds indices into input 0 the executor checks the same way: along `axis` (ScatterElements), or
# one coordinate of input 0 per entry of the indices' last dim (ScatterND); a reduce-kind node, so never fused into
# the kernel that computes its indices
SCATTER_OPS = frozenset({"ScatterElements", "ScatterND"})
# which group kinds a node of each kind may join (the group's kind is its first node's)
JOINS = {"elemwise": {"compute", "elemwise", "injective", "reduce"}, "injective": {"elemwise", "injective"},
         "reduce": {"elemwise", "injective"}}


@dataclass
class Subgraph:
    """A fused group of nodes: one kernel. `inputs`/`outputs` are graph value names, in argument order."""

    name: str
    kind: str  # kind of the anchor (first) node: compute | elemwise | injective | reduce
    nodes: list[Node]
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    dag: ComputeDAG | None = None
    # the layouts its arguments are stored in, by DAG tensor name (graph.backend.layouts; empty: their own)
    layouts: dict[str, tuple[LayoutPrimitive, ...]] = field(default_factory=dict)

    @property
    def workload_key(self) -> str:
        assert self.dag is not None
        return self.dag.workload_key


@dataclass
class Partition:
    """The fused program of a graph: kernels in execution order plus the aliases between them."""

    graph: Graph
    subgraphs: list[Subgraph]
    aliases: dict[str, str]  # value -> the value whose memory it shares (resolved to the root)


def partition(graph: Graph, channels_last: bool = True) -> Partition:
    """Group the nodes of `graph` (already optimized) into subgraphs and lower each to a ComputeDAG;
    with `channels_last`, after rewriting its convolutions to NHWC (see graph.layout)."""
    if channels_last:
        graph = to_channels_last(graph)
    users = graph.consumers()
    outputs = set(graph.outputs)
    groups: list[Subgraph] = []
    group_of: dict[str, Subgraph] = {}  # value name -> group that produces it
    aliases: dict[str, str] = {}
    for node in graph.nodes:
        if node.op in ALIAS_OPS and not graph.is_constant(node.inputs[0]):
            src = node.inputs[0]
            aliases[node.outputs[0]] = aliases.get(src, src)
            continue
        kind = op_kind(node)
        group = _joinable(node, kind, graph, group_of, users, outputs, aliases)
        if group is None:
            group = Subgraph("", kind, [])
            groups.append(group)
        group.nodes.append(node)
        for out in node.outputs:
            group_of[out] = group
    groups = _in_dependency_order(groups, group_of, aliases)
    for i, group in enumerate(groups):
        group.name = str(i)
        _finish(group, graph, users, outputs, aliases)
    return Partition(graph, groups, aliases)


def _in_dependency_order(groups: list[Subgraph], group_of: dict[str, Subgraph],
                         aliases: dict[str, str]) -> list[Subgraph]:
    """Groups sorted so each runs after the groups it reads (a fused residual Add can read a group
    that was started after its own), otherwise in order of their first node."""
    needs = {id(g): {id(group_of[aliases.get(x, x)]) for n in g.nodes for x in n.inputs
                     if aliases.get(x, x) in group_of and group_of[aliases.get(x, x)] is not g} for g in groups}
    done: set[int] = set()
    order: list[Subgraph] = []
    while len(order) < len(groups):
        ready = next(g for g in groups if id(g) not in done and needs[id(g)] <= done)
        order.append(ready)
        done.add(id(ready))
    return order


def _joinable(node: Node, kind: str, graph: Graph, group_of: dict[str, Subgraph],
              users: dict[str, list[Node]], outputs: set[str], aliases: dict[str, str]) -> Subgraph | None:
    """The group `node` fuses into: that of its first tensor input made by a group it may join. A Gather (or
    GatherElements) joins the group of its data only: indices computed in its own kernel would escape the bounds
    check the executor makes on a kernel's inputs. A scatter (ScatterElements, ScatterND) joins none, for the same
    reason."""
    if node.op in SCATTER_OPS:
        return None
    for name in node.inputs[:1] if node.op in GATHER_OPS else node.inputs:
        if not name or graph.is_constant(name) or name in aliases:
            continue
        group = group_of.get(name)
        if (group is not None and group.kind in JOINS.get(kind, ()) and group.nodes[-1].outputs == [name]
                and len(users[name]) == 1 and name not in outputs):
            return group
    return None


def _finish(group: Subgraph, graph: Graph, users: dict[str, list[Node]], outputs: set[str],
            aliases: dict[str, str]) -> None:
    """Fix the group's arguments, lower its nodes to te and build its ComputeDAG."""
    inside = {id(n) for n in group.nodes}
    tensors: dict[str, Tensor] = {}
    stems: dict[int, str] = {}  # id(tensor) -> name stem, from the op that made it

    def tensor_of(name: str) -> Tensor:
        if name not in tensors:
            value = graph.value(name)
            dtype = value.dtype
            if dtype not in KERNEL_DTYPES:
                raise GraphError(f"{_reader(group, name)} reads {name!r} of type {value.dtype}; values passed "
                                 f"between kernels must be one of {', '.join(sorted(KERNEL_DTYPES))}")
            tensors[name] = placeholder(te_shape(value.shape), dtype, f"arg{len(group.inputs)}",
                                        constant=graph.is_constant(name))
            group.inputs.append(name)
        return tensors[name]

    def read_by_others(name: str) -> bool:
        return name in outputs or any(id(u) not in inside for u in users.get(name, ())) or _aliased_out(
            name, aliases, users, inside, outputs)

    for node in group.nodes:
        try:
            results = lower_node(node, graph, tensor_of)
        except GraphError:
            raise
        except Exception as err:  # a lowering bug must still name the node
            raise GraphError(f"{node}: cannot lower to a tensor expression: {err}") from err
        for out, t in zip(node.outputs, results):
            if t is not None:
                tensors[out] = t
                _name_new_stages(t, _snake(node.op), stems)
    group.outputs = [out for n in group.nodes for out in n.outputs if out in tensors and read_by_others(out)]
    if not group.outputs:
        group.outputs = [group.nodes[-1].outputs[0]]
    args = [tensors[name] for name in group.inputs] + [tensors[name] for name in group.outputs]
    group.dag = canonical_dag(args, stems)
    group.name = f"{'_'.join(_op_words(group.nodes))}_{group.name}"


def overwritable_input(group: Subgraph, graph: Graph) -> str | None:
    """An input the kernel reads only through element-wise ops at the index it writes its one output at,
    so the output may take the input's memory when nothing reads the input afterwards (the executor
    decides that). A residual Add fused into a conv then writes over the residual instead of pulling a
    cold buffer into the cache: ResNet-50's stage-1 blocks run 3% faster in a model."""
    if len(group.outputs) != 1 or not group.nodes or group.outputs[0] not in group.nodes[-1].outputs:
        return None
    out = graph.value(group.outputs[0])
    tail: set[int] = set()  # the element-wise nodes of out's shape that end the group
    for node in reversed(group.nodes):
        if op_kind(node) != "elemwise" or any(graph.value(o).shape != out.shape for o in node.outputs):
            break
        tail.add(id(node))
    for name in group.inputs:
        same = graph.value(name).shape == out.shape and graph.value(name).nbytes == out.nbytes
        readers = [n for n in group.nodes if name in n.inputs]  # none: the input is a laid-out copy of a value
        if same and readers and not graph.is_constant(name) and all(id(n) in tail for n in readers):
            return name
    return None


def _reader(group: Subgraph, name: str) -> Node:
    return next(n for n in group.nodes if name in n.inputs)


def _aliased_out(name: str, aliases: dict[str, str], users: dict[str, list[Node]], inside: set[int],
                 outputs: set[str]) -> bool:
    """Whether a value aliasing `name` (a reshape of it) is read outside the group or is a graph output."""
    return any(root == name and (alias in outputs or any(id(u) not in inside for u in users.get(alias, ())))
               for alias, root in aliases.items())


def _op_words(nodes: Sequence[Node]) -> list[str]:
    words: list[str] = []
    for n in nodes:
        word = _snake(n.op)
        if word not in words:
            words.append(word)
    return words[:4]


def _snake(op: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", op).lower()


def _name_new_stages(out: Tensor, op: str, stems: dict[int, str]) -> None:
    """Stem the stages a node's lowering created: its output is `op`, helpers `op_<last word>`."""
    for t in topological([out]):
        if t.is_placeholder or id(t) in stems:
            continue
        last = t.name.rsplit("_", 1)[-1].lower()
        stems[id(t)] = op if t is out or last.isdigit() or last == op else f"{op}_{last}"
    stems.setdefault(id(out), op)


def canonical_dag(args: list[Tensor], stems: dict[int, str]) -> ComputeDAG:
    """The DAG over `args` (inputs then outputs) with names that depend only on its structure:
    placeholders `input0..`, computed stages by their stem, numbered when repeated."""
    dag = ComputeDAG(args)
    names: dict[int, str] = {}
    counts: dict[str, int] = {}
    for t in dag.tensors:
        if t.is_placeholder:
            names[id(t)] = f"input{dag.inputs.index(t)}"
            continue
        stem = stems.get(id(t), "stage")
        counts[stem] = counts.get(stem, -1) + 1
        names[id(t)] = stem if counts[stem] == 0 else f"{stem}_{counts[stem]}"
    return dag.renamed(names)
