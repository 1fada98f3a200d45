"""Registries: the names of one extension point (search policies, cost models, builders, runners, task-scheduling
strategies) and the factory each stands for.

    from tensorgen.tuning.registry import POLICIES
    POLICIES.register("mine", MyPolicy)      # or @POLICIES.register("mine") on the class
    tensorgen.tune(dag, policy="mine", policy_options={"depth": 3})

A name resolves in one place (`create`), for the Python API and the `tensorgen` command alike, and an option the
factory does not take is one clear error naming the options it does take.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tensorgen.errors import TensorgenError

T = TypeVar("T")


class RegistryError(TensorgenError, ValueError):
    """An unknown name, a name registered twice, or an option the named factory does not take."""


class Registry(Generic[T]):
    """Names of `kind` ("search policy") -> factories making a T; `error` is the exception type a bad name or
    option raises (a subclass of RegistryError's bases the caller already handles)."""

    def __init__(self, kind: str, error: type[Exception] = RegistryError):
        self.kind = kind
        self.error = error
        self._factories: dict[str, Callable[..., T]] = {}

    def register(self, name: str, factory: Callable[..., T] | None = None, *, replace: bool = False) -> Any:
        """Register `factory` under `name` (case-insensitive) and return it; without `factory`, a decorator.
        A name already taken is an error unless `replace`."""
        def add(f: Callable[..., T]) -> Callable[..., T]:
            key = name.lower()
            if key in self._factories and not replace and self._factories[key] is not f:
                raise self.error(f"a {self.kind} named {name!r} is already registered (pass replace=True)")
            self._factories[key] = f
            return f

        return add if factory is None else add(factory)

    def names(self) -> tuple[str, ...]:
        return tuple(self._factories)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._factories

    def get(self, name: str) -> Callable[..., T]:
        try:
            return self._factories[name.lower()]
        except KeyError:
            raise self.error(f"unknown {self.kind} {name!r}; choose one of {', '.join(self._factories)}") from None

    def create(self, name: str, *args: Any, **options: Any) -> T:
        """The factory of `name` called with `args` and `options`; an option it does not take is an error naming
        the ones it does (a factory taking **kwargs accepts any)."""
        factory = self.get(name)
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):  # a builtin without a signature: let the call check
            params = {}
        if params and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            unknown = sorted(set(options) - set(params))
            if unknown:
                positional = list(params)[: len(args)]
                known = ", ".join(n for n in params if n not in positional and n != "self")
                raise self.error(f"{self.kind} {name!r} takes no option {', '.join(map(repr, unknown))}; "
                                 f"its options: {known}")
        return factory(*args, **options)
