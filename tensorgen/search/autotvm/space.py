"""AutoTVM's configuration space (§2, §3): a template's knobs, and every program as one choice per knob.

A knob is a named, finite list of options. `SplitKnob` lists the ordered factorizations of a loop's extent into
`parts` factors (outermost first: the lengths of the loops a split makes); `OtherOptionKnob` lists anything else
(a loop order, an unroll depth, vectorize on or off). A `ConfigSpace` is the product of its knobs: a config is one
option index per knob, and configs are numbered in mixed radix (the first knob varies slowest), so `index <->
config` is exact and `size` is the product of the knobs' lengths. The search walks the space by `neighbours`:
one knob changed to another of its options. `features` are AutoTVM's "knob" features (`feature_type="knob"`):
log2 of each split factor and the index of every other option.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np

from tensorgen.errors import TuneError


def factorizations(extent: int, parts: int) -> tuple[tuple[int, ...], ...]:
    """Every ordered tuple of `parts` positive integers whose product is `extent`, in lexicographic order."""
    if parts == 1:
        return ((extent,),)
    return tuple((d, *rest) for d in divisors(extent) for rest in factorizations(extent // d, parts - 1))


def divisors(n: int) -> list[int]:
    """The divisors of `n`, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


class Knob(Protocol):
    """One dimension of a space: a name and its options; `features(option)` is the option's row of numbers."""

    name: str

    @property
    def options(self) -> tuple[Any, ...]: ...

    def features(self, option: Any) -> tuple[float, ...]: ...


@dataclass(frozen=True)
class SplitKnob:
    """The factorizations of a loop of `extent` into `parts` loops, outermost first; with `max_factor`, only those
    whose inner loops are no longer than it (AutoTVM's `define_split(..., max_factor=)`)."""

    name: str
    extent: int
    parts: int = 2
    max_factor: int | None = None

    def __post_init__(self) -> None:
        if self.extent < 1 or self.parts < 1:
            raise TuneError(f"split knob {self.name!r}: need extent >= 1 and parts >= 1, got {self.extent}, "
                            f"{self.parts}")

    @cached_property
    def options(self) -> tuple[tuple[int, ...], ...]:
        limit = self.max_factor if self.max_factor is not None else self.extent
        return tuple(f for f in factorizations(self.extent, self.parts) if max(f[1:], default=1) <= limit)

    def features(self, option: tuple[int, ...]) -> tuple[float, ...]:
        return tuple(math.log2(f) for f in option)


@dataclass(frozen=True)
class OtherOptionKnob:
    """A list of choices (any values: loop orders, unroll depths, booleans)."""

    name: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not self.choices:
            raise TuneError(f"knob {self.name!r} has no choices")

    @property
    def options(self) -> tuple[Any, ...]:
        return self.choices

    def features(self, option: Any) -> tuple[float, ...]:
        return (float(self.choices.index(option)),)


@dataclass(frozen=True)
class Config:
    """One point of a space: its index and the chosen option of every knob, by knob name (`config["tile_y"]`)."""

    index: int
    values: dict[str, Any] = field(hash=False)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise TuneError(f"config {self.index} has no knob {name!r}; its knobs: {', '.join(self.values)}") \
                from None


class ConfigSpace:
    """The product of `knobs` (names unique). Points are arrays of option indices, one per knob (`choices`)."""

    def __init__(self, knobs: Sequence[Knob]) -> None:
        names = [k.name for k in knobs]
        if len(set(names)) != len(names):
            raise TuneError(f"knob names repeat: {names}")
        self.knobs = tuple(knobs)
        self.lengths = np.array([len(k.options) for k in self.knobs], dtype=np.int64)
        # a knob's options as rows of features, so a batch of points is featurized by indexing
        self._tables = [np.array([k.features(o) for o in k.options], dtype=np.float32) for k in self.knobs]

    @property
    def size(self) -> int:
        return math.prod(int(n) for n in self.lengths)

    def choices(self, index: int) -> tuple[int, ...]:
        """The option index of every knob of config `index`."""
        if not 0 <= index < self.size:
            raise TuneError(f"config index {index} is outside the space of {self.size} configs")
        out = []
        for n in reversed(self.lengths.tolist()):
            index, c = divmod(index, n)
            out.append(c)
        return tuple(reversed(out))

    def index(self, choices: Sequence[int]) -> int:
        index = 0
        for c, n in zip(choices, self.lengths.tolist()):
            index = index * n + int(c)
        return index

    def config(self, index: int) -> Config:
        return Config(index, {k.name: k.options[c] for k, c in zip(self.knobs, self.choices(index))})

    def random(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """`n` uniformly random points, shape (n, number of knobs)."""
        return (rng.random((n, len(self.knobs))) * self.lengths).astype(np.int64)

    def neighbours(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each point with one knob (of more than one option) moved to another of its options: the walk of
        simulated annealing."""
        movable = np.flatnonzero(self.lengths > 1)
        out = points.copy()
        if not movable.size:
            return out
        rows = np.arange(len(points))
        knob = movable[rng.integers(movable.size, size=len(points))]
        step = 1 + (rng.random(len(points)) * (self.lengths[knob] - 1)).astype(np.int64)  # never 0: a real move
        out[rows, knob] = (points[rows, knob] + step) % self.lengths[knob]
        return out

    def features(self, points: np.ndarray) -> np.ndarray:
        """Knob features of every point, shape (n, sum of the knobs' feature widths)."""
        if not self.knobs:
            return np.zeros((len(points), 0), np.float32)
        return np.concatenate([t[points[:, k]] for k, t in enumerate(self._tables)], axis=1)

    def __repr__(self) -> str:
        return f"ConfigSpace({', '.join(f'{k.name}: {n}' for k, n in zip(self.knobs, self.lengths))}; {self.size})"


class SpaceBuilder:
    """What a template's `define` fills: `split` and `option` add knobs; `space()` is the ConfigSpace."""

    def __init__(self) -> None:
        self._knobs: list[Knob] = []

    def split(self, name: str, extent: int, parts: int = 2, max_factor: int | None = None) -> None:
        self._knobs.append(SplitKnob(name, extent, parts, max_factor))

    def option(self, name: str, choices: Sequence[Any]) -> None:
        self._knobs.append(OtherOptionKnob(name, tuple(choices)))

    def space(self) -> ConfigSpace:
        return ConfigSpace(self._knobs)
