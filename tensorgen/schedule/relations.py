"""How a stage's leaf loops relate to its root axes: extents pass down, index values pass up."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensorgen.schedule.stage import Split, Stage
from tensorgen.te.expr import Expr


@dataclass
class Derived:
    extents: dict[str, int | None]  # every iterator's loop extent
    values: dict[str, Expr]  # every iterator's value in terms of the leaf loop variables
    covered: dict[str, int]  # how far each value may reach (> extent for non-divisible splits)


def split_radices(extent: int | None, lengths: tuple[int | None, ...], inner_to_outer: bool) -> list[int | None]:
    """Place values of a split's loops, outermost first (the free part is ceil-divided): a loop advances
    the parent by the product of the radices inside it."""
    known = None not in lengths and extent is not None
    rest = math.ceil(extent / math.prod(lengths)) if known else None
    return [rest, *lengths] if inner_to_outer else [*lengths, rest]


def split_extents(extent: int | None, lengths: tuple[int | None, ...], inner_to_outer: bool) -> list[int | None]:
    """Loop extents of a split, outermost first: the radices, except that a loop never runs past what
    the parent needs — a stage computed inside a consumer's inner tile covers less than the product
    of its split factors, and its outer tile loops then shrink to 1 instead of running guarded."""
    radices = split_radices(extent, lengths, inner_to_outer)
    if None in radices or not inner_to_outer:
        return radices
    out, stride = [], 1
    for r in reversed(radices):
        out.append(min(r, math.ceil(extent / stride)))
        stride *= r
    return out[::-1]


def derive(stage: Stage, root_extents: dict[str, int], leaf_values: dict[str, Expr]) -> Derived:
    """Extents of all loops given the root extents, and root values given the leaf values.

    Root extents differ from the tensor shape when bound inference shrinks a stage computed at a
    consumer's loop; the split factors stay, the outer extents shrink.
    """
    extents: dict[str, int | None] = dict(root_extents)
    for rel in stage.relations:
        if isinstance(rel, Split):
            extents.update(zip(rel.children, split_extents(extents[rel.parent], rel.lengths, rel.inner_to_outer)))
        else:
            parts = [extents[p] for p in rel.parents]
            extents[rel.child] = None if None in parts else math.prod(parts)
    values: dict[str, Expr] = dict(leaf_values)
    if not leaf_values:
        return Derived(extents, values, {})
    covered: dict[str, int] = {n: extents[n] or 0 for n in leaf_values}
    for rel in reversed(stage.relations):
        if isinstance(rel, Split):
            value: Expr | None = None
            reach, stride = 0, 1
            radices = split_radices(extents[rel.parent], rel.lengths, rel.inner_to_outer)
            for child, radix in zip(reversed(rel.children), reversed(radices)):
                term = values[child] if stride == 1 else values[child] * stride
                value = term if value is None else term + value
                reach += (covered[child] - 1) * stride
                stride *= radix
            values[rel.parent] = value
            covered[rel.parent] = reach + 1
        else:
            fused = values[rel.child]
            inner = 1
            for k, parent in reversed(list(enumerate(rel.parents))):
                part = fused // inner if inner != 1 else fused
                ext = extents[parent]
                if k == 0:
                    values[parent] = part
                    covered[parent] = math.ceil(covered[rel.child] / inner)
                else:
                    values[parent] = part % ext
                    covered[parent] = ext
                inner *= ext
    return Derived(extents, values, covered)

