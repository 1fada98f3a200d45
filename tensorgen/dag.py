"""ComputeDAG: an operator or subgraph as stages in topological order, with the analyses search needs."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import (
    BinOp,
    Call,
    Cmp,
    Const,
    Expr,
    Load,
    Reduce,
    Select,
    Var,
    expr_str,
    is_float,
    substitute,
    transform,
    walk,
)
from tensorgen.te.tensor import Tensor

EXPENSIVE_INTRINSICS = frozenset({"exp", "log", "tanh", "erf", "sigmoid", "pow", "sqrt", "rsqrt", "sin", "cos", "tan",
                                  "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"})


@dataclass(frozen=True)
class Access:
    """One read of `tensor` by a stage, at `indices` (expressions of the stage's axes)."""

    tensor: Tensor
    indices: tuple[Expr, ...]


class ComputeDAG:
    """The tensors reachable from `tensors`, in topological order, with unique names.

    Placeholders among `tensors` fix the argument order of the compiled function; computed tensors
    among them (and computed tensors nobody reads) are the outputs.
    """

    def __init__(self, tensors: Tensor | Sequence[Tensor]):
        given = [tensors] if isinstance(tensors, Tensor) else list(tensors)
        if not given or not all(isinstance(t, Tensor) for t in given):
            raise TensorExprError("ComputeDAG needs a tensor or a list of tensors")
        original = topological(given)
        order = _uniquify_names(original)
        renamed = {id(old): new for old, new in zip(original, order)}
        self.tensors: tuple[Tensor, ...] = tuple(order)
        outs = [renamed[id(t)] for t in given if not t.is_placeholder]
        read = {id(a.tensor) for t in order if not t.is_placeholder for a in _accesses(t)}
        outs += [t for t in order if not t.is_placeholder and id(t) not in read and t not in outs]
        if not outs:
            raise TensorExprError("ComputeDAG has no computed output tensor")
        ins = [renamed[id(t)] for t in given if t.is_placeholder]
        ins += [t for t in order if t.is_placeholder and t not in ins]
        self.inputs: tuple[Tensor, ...] = tuple(ins)
        self.outputs: tuple[Tensor, ...] = tuple(outs)
        self.by_name: dict[str, Tensor] = {t.name: t for t in order}

    @classmethod
    def from_parts(cls, tensors: Sequence[Tensor], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> ComputeDAG:
        """A DAG with exactly this tensor and argument order (deserialization); the caller checks it."""
        dag = cls.__new__(cls)
        dag.tensors, dag.inputs, dag.outputs = tuple(tensors), tuple(inputs), tuple(outputs)
        dag.by_name = {t.name: t for t in dag.tensors}
        return dag

    def renamed(self, names: dict[int, str]) -> ComputeDAG:
        """This DAG with tensors renamed (`names`: id(tensor) -> new name; names must stay unique)."""
        order = _rebuild(list(self.tensors), names)
        new_of = {id(old): new for old, new in zip(self.tensors, order)}
        if len({t.name for t in order}) != len(order):
            raise TensorExprError("renamed DAG has duplicate tensor names")
        return ComputeDAG.from_parts(order, [new_of[id(t)] for t in self.inputs], [new_of[id(t)] for t in self.outputs])

    # ---- structure -------------------------------------------------------------------------

    @property
    def args(self) -> tuple[Tensor, ...]:
        """Arguments of the compiled function: inputs, then outputs."""
        return self.inputs + self.outputs

    @property
    def compute_tensors(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if not t.is_placeholder)

    @cached_property
    def accesses(self) -> dict[str, tuple[Access, ...]]:
        """Reads of each computed tensor, by name."""
        return {t.name: tuple(_accesses(t)) for t in self.compute_tensors}

    @cached_property
    def consumers(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {t.name: [] for t in self.tensors}
        for name, accs in self.accesses.items():
            for producer in dict.fromkeys(a.tensor.name for a in accs):
                out[producer].append(name)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def producers(self) -> dict[str, tuple[str, ...]]:
        return {
            t.name: tuple(dict.fromkeys(a.tensor.name for a in self.accesses.get(t.name, ())))
            for t in self.tensors
        }

    def is_output(self, name: str) -> bool:
        return any(t.name == name for t in self.outputs)

    # ---- cost and identity -----------------------------------------------------------------

    @cached_property
    def flop_count(self) -> float:
        return float(sum(stage_flops(t) for t in self.compute_tensors))

    @cached_property
    def canonical_text(self) -> str:
        """Printing with names normalized by position, the basis of `workload_key`."""
        names: dict[int, str] = {}
        lines = []
        for n, t in enumerate(self.tensors):
            names[id(t)] = f"T{n}"
            if t.is_placeholder:
                role = f"input{self.inputs.index(t)}"
                const = " constant" if t.attrs.get("constant") else ""
                lines.append(f"T{n} = placeholder({t.dtype}, {list(t.shape)}) {role}{const}")
                continue
            for d, ax in enumerate(t.axes):
                names[id(ax)] = f"i{d}"
            for d, ax in enumerate(t.reduce_axes):
                names[id(ax)] = f"r{d}"
            body = expr_str(t.body, lambda obj: names[id(obj)])
            attrs = json.dumps(t.attrs, sort_keys=True, default=str)
            out = f" output{self.outputs.index(t)}" if t in self.outputs else ""
            lines.append(f"T{n} = compute({t.dtype}, {list(t.shape)}, {body}) tag={t.tag} {attrs}{out}")
        return "\n".join(lines)

    @cached_property
    def workload_key(self) -> str:
        return hashlib.sha256(self.canonical_text.encode()).hexdigest()[:24]

    def __repr__(self) -> str:
        return "\n".join(f"{t.name} = {t.body if t.body is not None else 'placeholder'}" for t in self.tensors)

    # ---- predicates used by the sketch rules ----------------------------------------------

    def is_strict_inlinable(self, name: str) -> bool:
        """Element-wise without reduction, branches or expensive intrinsics: inlining is free."""
        t = self.by_name[name]
        if t.is_placeholder or isinstance(t.body, Reduce):
            return False
        for node in walk(t.body):
            if isinstance(node, Select) or (isinstance(node, Call) and node.name in EXPENSIVE_INTRINSICS):
                return False
        return True

    def is_injective(self, name: str) -> bool:
        t = self.by_name[name]
        return not t.is_placeholder and not isinstance(t.body, Reduce)

    def has_data_reuse(self, name: str) -> bool:
        """Some input is read across a loop it does not depend on (Ansor's multi-level tiling test)."""
        t = self.by_name[name]
        if t.is_placeholder:
            return False
        all_axes = set(t.axes) | set(t.reduce_axes)
        for access in self.accesses[name]:
            used = {v for idx in access.indices for v in walk(idx) if isinstance(v, Var)}
            missing = len(all_axes - used)
            if missing >= 2 or (missing >= 1 and t.reduce_axes):
                return True
        return False

    def fusible_consumer(self, name: str) -> str | None:
        """The single element-wise consumer that reads `name` at exactly its own axes, if any."""
        consumers = self.consumers[name]
        if len(consumers) != 1 or self.is_output(name):
            return None
        c = self.by_name[consumers[0]]
        producer = self.by_name[name]
        if not self.is_injective(c.name) or c.shape != producer.shape:
            return None
        reads = [a for a in self.accesses[c.name] if a.tensor.name == name]
        if all(at_own_axes(a.indices, c.axes) for a in reads):
            return c.name
        return None

    def has_fusible_consumer(self, name: str) -> bool:
        return self.fusible_consumer(name) is not None

    def space_and_reduce_length(self, name: str) -> tuple[int, int]:
        t = self.by_name[name]
        return _prod(t.shape), _prod(a.extent for a in t.reduce_axes)

    def has_more_reduction_parallel(self, name: str) -> bool:
        space, red = self.space_and_reduce_length(name)
        return red > 1 and red > space

    def needs_rfactor(self, name: str, num_cores: int) -> bool:
        """Ansor's condition for the reduction-factorization rule on a CPU with `num_cores`."""
        space, red = self.space_and_reduce_length(name)
        if red <= 1:
            return False
        if self.has_data_reuse(name):
            return not (space > red or space > num_cores * 16)
        return red > num_cores


def _prod(values) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def topological(given: list[Tensor]) -> list[Tensor]:
    order: list[Tensor] = []
    state: dict[int, int] = {}

    def visit(t: Tensor) -> None:
        mark = state.get(id(t))
        if mark == 2:
            return
        if mark == 1:
            raise TensorExprError(f"tensor {t.name} depends on itself")
        state[id(t)] = 1
        for a in _accesses(t):
            visit(a.tensor)
        state[id(t)] = 2
        order.append(t)

    for t in given:
        visit(t)
    return order


def _accesses(t: Tensor) -> list[Access]:
    if t.is_placeholder:
        return []
    return [Access(n.tensor, n.indices) for n in walk(t.body) if isinstance(n, Load)]


def _uniquify_names(order: list[Tensor]) -> list[Tensor]:
    """Rebuild tensors whose names collide (they become C identifiers) as name_1, name_2, ..."""
    seen: dict[str, int] = {}
    names: dict[int, str] = {}
    for t in order:
        name = t.name
        if name in seen:
            seen[name] += 1
            while f"{t.name}_{seen[name]}" in seen:
                seen[name] += 1
            name = f"{t.name}_{seen[t.name]}"
        seen.setdefault(name, 0)
        names[id(t)] = name
    return _rebuild(order, names)


def rebuild_loads(dag: ComputeDAG, replaced: dict[str, Tensor], load: Callable[[Load], Load | None]) -> ComputeDAG:
    """`dag` with the placeholders named in `replaced` swapped for those tensors, every read of them
    rewritten by `load` (e.g. into a new layout), and every other tensor as it was."""
    order = _rebuild(list(dag.tensors), {}, replaced, load)
    new_of = {id(old): new for old, new in zip(dag.tensors, order)}
    return ComputeDAG.from_parts(order, [new_of[id(t)] for t in dag.inputs], [new_of[id(t)] for t in dag.outputs])


def _rebuild(order: list[Tensor], names: dict[int, str], replaced: dict[str, Tensor] | None = None,
             load: Callable[[Load], Load | None] | None = None) -> list[Tensor]:
    """The tensors of `order` (topological) renamed by `names` (id -> name), sharing what is unchanged;
    placeholders in `replaced` (by name) are swapped and their reads rewritten by `load`."""
    new_of: dict[int, Tensor] = {}
    out = []

    def visit(n: Expr) -> Expr | None:
        if not isinstance(n, Load):
            return None
        if load is not None and replaced and n.tensor.is_placeholder and n.tensor.name in replaced:
            return load(n)
        return Load(new_of[id(n.tensor)], n.indices, n.dtype) if new_of[id(n.tensor)] is not n.tensor else None

    for t in order:
        name = names.get(id(t), t.name)
        body = t.body
        if body is not None:
            body = transform(body, visit)
        if replaced and t.is_placeholder and t.name in replaced:
            new = replaced[t.name]
        elif name == t.name and body is t.body:
            new = t
        else:
            new = Tensor(t.shape, t.dtype, name, t.axes, body, t.tag, t.attrs)
        new_of[id(t)] = new
        out.append(new)
    return out


def count_ops(expr: Expr) -> int:
    """Floating-point operations in one evaluation of `expr` (loads and index math are free)."""
    n = 0
    for node in walk(expr):
        if isinstance(node, (BinOp, Cmp)) and (is_float(node.dtype) or is_float(node.a.dtype)):
            n += 1
        elif isinstance(node, Call):
            n += 1
    return n


def stage_flops(t: Tensor) -> int:
    space = _prod(t.shape)
    body = t.body
    if isinstance(body, Reduce):
        per_iter = count_ops(body.source) + (1 if is_float(body.dtype) else 0)
        if body.condition is not None:
            per_iter += count_ops(body.condition)
        return space * _prod(a.extent for a in body.axes) * per_iter
    return space * count_ops(body)


def rebind_axes(t: Tensor, axes: Sequence[Var]) -> Expr:
    """`t`'s body with its spatial axes replaced by `axes` (used when a step rebuilds a stage)."""
    return substitute(t.body, dict(zip(t.axes, axes)))


def at_own_axes(indices: Sequence[Expr], axes: Sequence[Var]) -> bool:
    """`indices` name exactly `axes` (an axis of extent 1 may read as 0: a laid-out tensor's simplified index)."""
    return len(indices) == len(axes) and all(
        i is a or (a.extent == 1 and isinstance(i, Const) and i.value == 0) for i, a in zip(indices, axes))
