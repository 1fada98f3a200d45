"""Stages and iterators: the immutable pieces a State is made of."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorgen.errors import ScheduleError
from tensorgen.memo import by_identity
from tensorgen.te.expr import Load, walk
from tensorgen.te.tensor import Tensor

ANNOTATIONS = (
    "none", "parallel", "vectorize", "unroll", "vthread",
    "blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z",
)
GPU_ANNOTATIONS = ANNOTATIONS[4:]


@dataclass(frozen=True)
class Iterator:
    name: str
    extent: int | None  # None while a split length is unfilled (sketches)
    kind: str  # spatial | reduce | mixed
    annotation: str = "none"


@dataclass(frozen=True)
class Split:
    """`parent` = children combined; `lengths` are the split factors as given by the step."""

    parent: str
    children: tuple[str, ...]
    lengths: tuple[int | None, ...]
    inner_to_outer: bool


@dataclass(frozen=True)
class Fuse:
    parents: tuple[str, ...]
    child: str


@dataclass(frozen=True)
class Stage:
    """One tensor of the program with its loop structure.

    `iters` are the leaf loops in nesting order; `relations` record how they derive from the root
    axes (`root_names`, spatial then reduce). `location` is root | inline | at, with the attach
    point in `attach` as (stage name, iterator name).
    """

    tensor: Tensor = field(compare=False)
    iters: tuple[Iterator, ...]
    root_names: tuple[str, ...]
    relations: tuple[Split | Fuse, ...] = ()
    location: str = "root"
    attach: tuple[str, str] | None = None
    auto_unroll_max_step: int = 0
    storage_align: tuple[tuple[int, int, int], ...] = ()  # (dim, factor, offset)
    body_text: str = ""

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def is_placeholder(self) -> bool:
        return self.tensor.is_placeholder

    def iter_index(self, it: int | str) -> int:
        if isinstance(it, int) and not isinstance(it, bool):
            if not 0 <= it < len(self.iters):
                raise ScheduleError(
                    f"stage {self.name} has {len(self.iters)} iterators "
                    f"({', '.join(i.name for i in self.iters)}); index {it} is out of range"
                )
            return it
        for n, i in enumerate(self.iters):
            if i.name == it:
                return n
        raise ScheduleError(
            f"stage {self.name} has no iterator {it!r}; its iterators are "
            f"{', '.join(i.name for i in self.iters) or '(none)'}"
        )

    def fresh_names(self, *bases: str) -> list[str]:
        """Iterator names not yet used by this stage (current, root or intermediate)."""
        taken = {i.name for i in self.iters} | set(self.root_names)
        taken |= {c for r in self.relations for c in (r.children if isinstance(r, Split) else (r.child,))}
        out = []
        for base in bases:
            name, n = base, 0
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            taken.add(name)
            out.append(name)
        return out

    def with_(self, **changes) -> Stage:
        """A copy with `changes` (fields only; ~10x cheaper than dataclasses.replace, which replay
        calls for almost every step of every state the search builds)."""
        new = object.__new__(Stage)
        new.__dict__.update(self.__dict__)
        new.__dict__.update(changes)
        return new


@by_identity()
def make_stage(tensor: Tensor) -> Stage:
    """A fresh stage: one loop per spatial axis, then one per reduce axis (memoized per tensor: stages
    are immutable, and replay rebuilds the same ones for every state of a DAG)."""
    return _fresh_stage(tensor)


@by_identity()
def producers_of(tensor: Tensor) -> tuple[str, ...]:
    """Names of the tensors `tensor`'s body reads, in first-read order (memoized per tensor: the
    search asks for every state it builds)."""
    if tensor.body is None:
        return ()
    return tuple(dict.fromkeys(n.tensor.name for n in walk(tensor.body) if isinstance(n, Load)))


def _fresh_stage(tensor: Tensor) -> Stage:
    if tensor.is_placeholder:
        return Stage(tensor, (), (), location="root")
    iters: list[Iterator] = []
    taken: set[str] = set()
    for ax in tensor.axes + tensor.reduce_axes:
        name = ax.name
        while name in taken:
            name += "_r" if ax.reduce else "_s"
        taken.add(name)
        iters.append(Iterator(name, ax.extent, "reduce" if ax.reduce else "spatial"))
    return Stage(tensor, tuple(iters), tuple(i.name for i in iters), body_text=str(tensor.body))
