"""Tensors, `placeholder`, `compute`, `reduce_axis` and reductions, validated at definition time."""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorgen.errors import TensorExprError
from tensorgen.te.expr import (
    COMBINERS,
    Const,
    Expr,
    ExprLike,
    Load,
    Reduce,
    Var,
    as_condition,
    as_expr,
    cast,
    check_dtype,
    const,
    is_int,
    walk,
)

_uid = itertools.count()


@dataclass(frozen=True, eq=False)
class Tensor:
    """A placeholder (input) or a computed tensor; identity-hashed like TVM tensors.

    A computed tensor has spatial `axes` (one per dimension) and a `body` that gives the value at
    those axes; a body may be a `Reduce` at its top level only (one reduction per stage).
    """

    shape: tuple[int, ...]
    dtype: str
    name: str
    axes: tuple[Var, ...] | None = None
    body: Expr | None = None
    tag: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_placeholder(self) -> bool:
        return self.body is None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def reduce_axes(self) -> tuple[Var, ...]:
        return self.body.axes if isinstance(self.body, Reduce) else ()

    def __getitem__(self, index: ExprLike | tuple[ExprLike, ...]) -> Load:
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) != self.ndim:
            raise TensorExprError(
                f"tensor {self.name} has {self.ndim} dimension(s) {list(self.shape)} "
                f"but was indexed with {len(idx)} index(es)"
            )
        exprs = []
        for dim, (i, extent) in enumerate(zip(idx, self.shape)):
            e = as_expr(i)
            if not is_int(e.dtype):
                raise TensorExprError(
                    f"index {dim} of {self.name} is {e} of type {e.dtype}; indices must be integers"
                )
            if isinstance(e, Const) and not 0 <= e.value < extent:
                raise TensorExprError(
                    f"constant index {e.value} out of range for dimension {dim} of {self.name} "
                    f"(extent {extent})"
                )
            exprs.append(e)
        return Load(self, tuple(exprs), self.dtype)

    def __repr__(self) -> str:
        kind = "placeholder" if self.is_placeholder else "compute"
        return f"Tensor({self.name}: {kind} {self.dtype}{list(self.shape)})"


def _check_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    if isinstance(shape, int):
        shape = (shape,)
    if len(shape) == 0:
        raise TensorExprError(f"{what}: zero-dimensional tensors are not supported; use shape (1,)")
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, int) or s <= 0:
            raise TensorExprError(f"{what}: shape {list(shape)} must hold positive integers")
        out.append(int(s))
    return tuple(out)


def _check_name(name: str) -> str:
    if not name or not (name[0].isalpha() or name[0] == "_") or not all(c.isalnum() or c == "_" for c in name):
        raise TensorExprError(f"tensor name {name!r} must be an identifier (letters, digits, _)")
    return name


def placeholder(shape: Sequence[int], dtype: str = "float32", name: str = "placeholder",
                constant: bool = False) -> Tensor:
    """An input. `constant` marks one that is the same on every call (a weight): its layout may then be
    rewritten at build time to suit the schedule (Ansor's layout rewrite, schedule/layout_rewrite.py)."""
    return Tensor(_check_shape(shape, f"placeholder {name}"), check_dtype(dtype), _check_name(name),
                  attrs={"constant": True} if constant else {})


def reduce_axis(extent: int | tuple[int, int], name: str = "k") -> Var:
    """A reduction axis over `range(extent)`; only valid inside a reduction (`te.sum(..., axis=k)`)."""
    if isinstance(extent, tuple):
        lo, hi = extent
        if lo != 0:
            raise TensorExprError(f"reduce_axis {name}: only ranges starting at 0 are supported")
        extent = hi
    if isinstance(extent, bool) or not isinstance(extent, int) or extent <= 0:
        raise TensorExprError(f"reduce_axis {name}: extent must be a positive integer, got {extent!r}")
    return Var(_check_name(name), "int32", extent, reduce=True)


def _reduction(combiner: str):
    def reduce_fn(
        source: ExprLike,
        axis: Var | Sequence[Var],
        where: ExprLike | None = None,
        init: ExprLike | None = None,
    ) -> Reduce:
        axes = (axis,) if isinstance(axis, Var) else tuple(axis)
        if not axes:
            raise TensorExprError(f"te.{combiner} needs at least one reduce axis")
        for a in axes:
            if not isinstance(a, Var) or not a.reduce:
                raise TensorExprError(f"te.{combiner}: {a} is not a reduce_axis")
        src = as_expr(source)
        cond = as_condition(where) if where is not None else None
        init_e = cast(init, src.dtype) if init is not None else None
        return Reduce(combiner, src, axes, cond, init_e, src.dtype)

    reduce_fn.__name__ = combiner
    reduce_fn.__doc__ = f"`{combiner}` reduction of `source` over `axis`, optionally `where` a condition holds."
    return reduce_fn


sum, max, min, prod = (_reduction(c) for c in COMBINERS)  # noqa: A001 - the TE names


def compute(
    shape: Sequence[int],
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    tag: str = "",
    attrs: dict[str, Any] | None = None,
    dtype: str | None = None,
) -> Tensor:
    """Define a tensor by a function from its indices to its value (TVM's `te.compute`)."""
    shape = _check_shape(shape, f"compute {name}")
    _check_name(name)
    params = list(inspect.signature(fcompute).parameters.values())
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        arg_names = [f"i{d}" for d in range(len(shape))]
    else:
        arg_names = [p.name for p in params]
        if len(arg_names) != len(shape):
            raise TensorExprError(
                f"compute {name}: shape has {len(shape)} dimension(s) but fcompute takes "
                f"{len(arg_names)} argument(s) ({', '.join(arg_names)})"
            )
    axes = tuple(Var(n, "int32", s) for n, s in zip(arg_names, shape))
    body = as_expr(fcompute(*axes))
    if dtype is not None:
        body = _cast_body(body, check_dtype(dtype))
    _validate_body(name, body, axes)
    return Tensor(shape, body.dtype, name, axes, body, tag, dict(attrs or {}))


def _cast_body(body: Expr, dtype: str) -> Expr:
    if isinstance(body, Reduce):
        init = cast(body.init, dtype) if body.init is not None else None
        return Reduce(body.combiner, cast(body.source, dtype), body.axes, body.condition, init, dtype)
    return cast(body, dtype)


def _validate_body(name: str, body: Expr, axes: tuple[Var, ...]) -> None:
    bound = set(axes)
    if isinstance(body, Reduce):
        dup = set(body.axes) & bound
        if dup or len(set(body.axes)) != len(body.axes):
            raise TensorExprError(f"compute {name}: a reduce axis is used twice")
        bound |= set(body.axes)
        nested = [body.source, body.condition, body.init]
    else:
        nested = [body]
    for part in nested:
        if part is None:
            continue
        for node in walk(part):
            if isinstance(node, Reduce):
                raise TensorExprError(
                    f"compute {name}: a reduction must be the whole body of a compute, not nested "
                    f"inside an expression; split it into its own compute stage"
                )
            if isinstance(node, Var) and node not in bound:
                if node.reduce:
                    raise TensorExprError(
                        f"compute {name}: reduce axis {node.name} is used outside a reduction over it"
                    )
                raise TensorExprError(f"compute {name}: variable {node.name} is not an axis of {name}")
    if isinstance(body, Reduce) and body.init is not None:
        for node in walk(body.init):
            if isinstance(node, Var) and node.reduce:
                raise TensorExprError(f"compute {name}: the initial value may not use reduce axis {node.name}")


def identity_element(combiner: str, dtype: str) -> Const:
    """The value a reduction starts from when no `init` is given."""
    if combiner == "sum":
        return const(0, dtype)
    if combiner == "prod":
        return const(1, dtype)
    big = {"float16": 65504.0, "int32": 2**31 - 1, "int64": 2**63 - 1}.get(dtype, float("inf"))
    return const(-big if combiner == "max" else big, dtype)
