"""Data layouts across a model's kernels (ALT §4.2): every kernel's arguments in the layouts its program chose,
those layouts propagated along element-wise kernels, and layout conversion kernels where a value's producer and
a reader disagree.

A tuned program may store its arguments in layouts of its own (ALT's records: layout steps, then loops).
`plan_layouts` makes the model follow them:
- a kernel writes each output in its layout: the buffer is a new value `<name>@<n>` of the laid-out shape;
- a reader that wants a value in another layout (the plain one included: a reshape aliasing it, a graph output, a
  kernel without layouts) reads a copy that a conversion kernel (`layout_transform`) writes just before it, one
  per value and layout, shared by all its readers; a constant is packed at build time instead;
- an element-wise kernel (every node element-wise, its outputs of one shape) whose input arrives in a tiling
  without padding or unfold (ALT's constraints: the same shape, no data expansion) takes that layout for all its
  tensors of that shape: it reads and writes without conversion, and the next element-wise kernel does the same;
- a lone Transpose of a value written in a layout of its own is absorbed: its output is that value in the layout
  `reorder(perm)` makes, so its readers' conversions start from the value itself (one copy instead of two);
- a kernel may read an input in the layout its producer writes (no unfold), its own loops over the laid-out DAG,
  when the caller's `absorb` accepts: the conversion is then folded into the reader (ALT's propagation between two
  complex operators: the reader's input layout is its producer's output layout);
- a constant that stores another (store_at: a bias in its weight's buffer) is packed with it, and the kernel takes
  no argument for the guest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from tensorgen.dag import ComputeDAG
from tensorgen.graph.backend.default_schedule import DefaultSchedule
from tensorgen.graph.ir import Value
from tensorgen.graph.ops import op_kind
from tensorgen.graph.ops.base import te_shape
from tensorgen.graph.passes.fusion import Partition, Subgraph
from tensorgen.schedule.laid_out import lay_out
from tensorgen.schedule.layout import Layout, LayoutPrimitive, Reorder
from tensorgen.schedule.state import State, with_layouts
from tensorgen.te.tensor import compute, placeholder

Layouts = Mapping[str, Sequence[LayoutPrimitive]]
# absorb(i, layouts): may plain kernel i store its arguments in `layouts` (its own, and inputs in their producers'
# layouts) and read those inputs without conversion?
Absorb = Callable[[int, Layouts], bool]
CONVERSION = "layout_transform"


def conversion_dag(shape: Sequence[int], dtype: str) -> ComputeDAG:
    """A copy of a tensor (input0 -> layout_transform): laid out at both ends, it converts between two layouts."""
    x = placeholder(te_shape(shape), dtype, "input0")
    return ComputeDAG([x, compute(x.shape, lambda *i: x[i], name=CONVERSION)])


def laid_out_dag(sub: Subgraph) -> ComputeDAG:
    """The DAG a subgraph's program runs: its own, its tensors in `sub.layouts`."""
    return lay_out(sub.dag, sub.layouts) if sub.layouts else sub.dag


def laid_out_state(sub: Subgraph, loops: State) -> State:
    """A state of `sub.dag`: its layout steps, then `loops`, a state of laid_out_dag(sub)."""
    return with_layouts(sub.dag, sub.layouts, loops) if sub.layouts else loops


def default_laid_out(sub: Subgraph, cores: int, schedule: DefaultSchedule) -> State:
    """The default schedule (of a kind of target) of a subgraph in its layouts."""
    return laid_out_state(sub, schedule(laid_out_dag(sub), cores))


@dataclass(frozen=True)
class LayoutPlan:
    part: Partition
    source: list[int | None]  # per subgraph: its index in the plain partition (None: a conversion kernel)
    propagated: frozenset[int]  # the subgraphs in layouts propagated to them (element-wise kernels)
    absorbed: frozenset[int]  # the subgraphs that read inputs in their producers' layouts (their own loops)

    @property
    def origin(self) -> list[int | None]:
        """Per subgraph: its index in the plain partition where its program stays that subgraph's (None: a
        conversion, or a DAG the layouts changed, which needs a program of its own)."""
        relaid = self.propagated | self.absorbed
        return [None if k in relaid else s for k, s in enumerate(self.source)]


def _key(primitives: Sequence[LayoutPrimitive]) -> str:
    return json.dumps([p.to_json() for p in primitives]) if primitives else ""


class _Planner:
    def __init__(self, part: Partition):
        self.part = part
        self.graph = replace(part.graph, values=dict(part.graph.values), constants=dict(part.graph.constants))
        self.subgraphs: list[Subgraph] = []
        self.source: list[int | None] = []
        self.propagated_to: set[int] = set()
        self.absorbed: set[int] = set()
        self.written: dict[str, tuple[LayoutPrimitive, ...]] = {}  # value -> the layout its producer writes
        self.versions: dict[tuple[str, str], str] = {(x, ""): x for x in self.graph.inputs}  # (value, layout)
        self.aliases = dict(part.aliases)
        self.views: dict[str, tuple[str, tuple[LayoutPrimitive, ...]]] = {}  # value -> (source, its layout there)

    def new_value(self, name: str, primitives: Sequence[LayoutPrimitive], data=None,
                  guests: Mapping[str, str] | None = None) -> str:
        v, n = self.graph.value(name), 0
        while f"{name}@{n}" in self.graph.values:
            n += 1
        new = f"{name}@{n}"
        layout = Layout.of(te_shape(v.shape), primitives)
        self.graph.values[new] = Value(new, layout.new_shape, v.dtype)
        if data is not None:
            stored = {g: self.graph.constants[value] for g, value in (guests or {}).items()}
            self.graph.constants[new] = layout.pack(data.reshape(layout.shape), stored)
        return new

    def read(self, x: str, primitives: Sequence[LayoutPrimitive], guests: Mapping[str, str] | None = None) -> str:
        """The buffer holding value `x` in the layout `primitives` make, converted or packed if need be; `guests`:
        the constant each tensor the layout stores (store_at) is (the primitives name a kernel's tensors)."""
        key = _key(primitives) + (json.dumps(sorted(guests.items())) if guests else "")
        if (x, key) in self.versions:
            return self.versions[(x, key)]
        if x in self.views:  # an absorbed Transpose: its source in the transposed layout, then in `primitives`
            source, view = self.views[x]
            buffer = self.read(source, (*view, *primitives))
            if not primitives:  # the plain value is that buffer's memory, and so are the reshapes of it
                root = self.aliases.get(buffer, buffer)
                for alias in [a for a, r in self.aliases.items() if r == x] + [x]:
                    self.aliases[alias] = root
                self.versions[(root, "")] = root
                buffer = x
            self.versions[(x, key)] = buffer
            return buffer
        if self.graph.is_constant(x):
            if not primitives:
                return x
            self.versions[(x, key)] = self.new_value(x, primitives, self.graph.constants[x], guests)
            return self.versions[(x, key)]
        root = self.aliases.get(x, x)
        if root != x:  # a reshape of `root`: the same memory, so `root` itself must exist plain
            self.read(root, ())
            self.versions[(x, "")] = x
            source: tuple[LayoutPrimitive, ...] = ()
        else:
            source = self.written.get(x, ())
        if key == _key(source):
            return self.versions[(x, key)]
        target = self.new_value(x, primitives) if primitives else x
        dag = conversion_dag(self.graph.value(x).shape, self.graph.value(x).dtype)
        layouts = {name: tuple(p) for name, p in (("input0", source), (CONVERSION, primitives)) if p}
        self.subgraphs.append(Subgraph(f"{CONVERSION}_{len(self.subgraphs)}", "layout", [],
                                       [self.versions[(x, _key(source))]], [target], dag, layouts))
        self.source.append(None)
        self.versions[(x, key)] = target
        return target

    def propagated(self, sub: Subgraph) -> dict[str, tuple[LayoutPrimitive, ...]]:
        """The layout an element-wise subgraph takes from its first input that arrives tiled (module docstring)."""
        g = self.graph
        shape = g.value(sub.outputs[0]).shape
        if not sub.nodes or any(op_kind(n) != "elemwise" for n in sub.nodes) \
                or any(g.value(o).shape != shape for o in sub.outputs):
            return {}
        for x in sub.inputs:
            primitives = self.written.get(x, ()) if g.value(x).shape == shape else ()
            layout = Layout.of(te_shape(shape), primitives)
            if primitives and not layout.is_padded and not layout.overlaps:
                args = zip([*sub.dag.inputs, *sub.dag.outputs], [*sub.inputs, *sub.outputs])
                return {t.name: primitives for t, name in args if g.value(name).shape == shape}
        return {}

    def readable(self, x: str) -> tuple[LayoutPrimitive, ...]:
        """The layout a reader may read computed value `x` in without a conversion: the one its producer writes,
        unless it is unfolded (a reader would have to name its tile); () for reshapes, views and constants."""
        primitives = self.written.get(x, ())
        if not primitives or x in self.views or self.aliases.get(x, x) != x:
            return ()
        return () if Layout.of(te_shape(self.graph.value(x).shape), primitives).overlaps else primitives

    def place(self, i: int, sub: Subgraph, chosen: Layouts, propagate: bool, absorb: Absorb | None) -> None:
        lone = sub.nodes[0] if len(sub.nodes) == 1 else None
        if propagate and lone is not None and lone.op == "Transpose" and self.written.get(sub.inputs[0]):
            self.views[sub.outputs[0]] = (sub.inputs[0], (Reorder(tuple(lone.attrs["perm"])),))
            return
        args = [*sub.dag.inputs, *sub.dag.outputs]
        layouts = {t.name: tuple(chosen[t.name]) for t in args if chosen.get(t.name)}
        planned = not layouts and propagate
        if planned:
            layouts = self.propagated(sub)
        absorbed = False
        if absorb is not None and not (planned and layouts):
            extra = {t.name: p for x, t in zip(sub.inputs, sub.dag.inputs)
                     if t.name not in layouts and (p := self.readable(x))}
            if extra and absorb(i, {**layouts, **extra}):
                layouts, absorbed = {**layouts, **extra}, True
        values = {t.name: x for x, t in zip(sub.inputs, sub.dag.inputs)}
        stored = {t.name: {g: values[g] for _, g in Layout.of(t.shape, layouts[t.name]).guests}
                  for t in sub.dag.inputs if t.name in layouts}
        guests = {g for of in stored.values() for g in of}  # read from their hosts' buffers (store_at)
        inputs = [self.read(x, layouts.get(t.name, ()), stored.get(t.name)) for x, t in zip(sub.inputs, sub.dag.inputs)
                  if t.name not in guests]
        outputs = []
        for o, t in zip(sub.outputs, sub.dag.outputs):
            self.written[o] = layouts.get(t.name, ())
            outputs.append(self.new_value(o, self.written[o]) if self.written[o] else o)
            self.versions[(o, _key(self.written[o]))] = outputs[-1]
        if absorbed:
            self.absorbed.add(len(self.subgraphs))
        if planned and layouts:
            self.propagated_to.add(len(self.subgraphs))
        self.subgraphs.append(replace(sub, inputs=inputs, outputs=outputs, layouts=layouts))
        self.source.append(i)


def plan_layouts(part: Partition, chosen: Sequence[Layouts], propagate: bool = True,
                 absorb: Absorb | None = None) -> LayoutPlan:
    """`part` with each subgraph's arguments in the layouts `chosen[i]` gives them (by DAG tensor name: a record's
    layout steps; tensors inside a kernel are its own business), propagated along element-wise kernels, inputs read
    in their producers' layouts where `absorb` accepts, and the conversion kernels and packed constants that makes
    necessary (module docstring). Graph inputs and outputs keep their names and plain layouts."""
    planner = _Planner(part)
    for i, (sub, layouts) in enumerate(zip(part.subgraphs, chosen)):
        planner.place(i, sub, layouts, propagate, absorb)
    for out in part.graph.outputs:
        planner.read(out, ())
    return LayoutPlan(Partition(planner.graph, planner.subgraphs, planner.aliases), planner.source,
                      frozenset(planner.propagated_to), frozenset(planner.absorbed))
