"""The search-policy protocol: propose unmeasured candidates, learn from measured ones."""

from __future__ import annotations

from typing import Protocol

from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State


def state_key(state: State) -> str:
    """Identity of a program for dedupe: its canonical step list."""
    return state.to_json()


class SearchPolicy(Protocol):
    """One task's search. `next_batch` never returns a state already measured or proposed."""

    def next_batch(self, n: int) -> list[State]: ...

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        """Measured results (also those loaded from a database on resume)."""
        ...
