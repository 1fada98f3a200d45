"""Memoization by identity for pure functions of immutable objects (tensors, stages).

Replay rebuilds the same stages and tensors for every state the search makes; these objects hash
structurally (slowly) or not at all, so the memo is keyed by their ids and keeps them alive, which
keeps each id unique while its entry exists. Plain values (str, int, ...) in the arguments are keyed
by value.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])
_PLAIN = (str, int, float, bool, type(None))


def by_identity(maxsize: int = 65536) -> Callable[[F], F]:
    """Decorator: memoize on the identity of object arguments (cleared when `maxsize` entries)."""

    def decorate(fn: F) -> F:
        table: dict[Any, tuple[tuple, Any]] = {}

        @functools.wraps(fn)
        def memoized(*args):
            if len(args) == 1:  # the hot case (make_stage): no key tuple
                hit = table.get(id(args[0]))
                if hit is not None and hit[0][0] is args[0]:
                    return hit[1]
                key: Any = id(args[0])
            else:
                key = tuple(a if isinstance(a, _PLAIN) else id(a) for a in args)
                hit = table.get(key)
                if hit is not None and all(x is y for x, y in zip(hit[0], args)):
                    return hit[1]
            if len(table) >= maxsize:
                table.clear()
            out = fn(*args)
            table[key] = (args, out)
            return out

        memoized.cache_clear = table.clear  # type: ignore[attr-defined]
        return memoized  # type: ignore[return-value]

    return decorate
