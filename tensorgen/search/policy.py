"""The search-policy protocol: propose unmeasured candidates, learn from measured ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tensorgen.measure.types import MeasureInput, MeasureResult
from tensorgen.schedule.state import State


def state_key(state: State) -> str:
    """Identity of a program for dedupe: its canonical step list."""
    return state.to_json()


class SearchPolicy(Protocol):
    """One task's search. `next_batch` never returns a state already measured or proposed.

    Made by a factory registered in tensorgen.tuning.registry.POLICIES, called as
    `factory(task, *, cost_model, seed, skips, **options)`. Subclass this protocol to inherit the defaults
    of its optional methods (`offer`, `close`)."""

    def next_batch(self, n: int) -> list[State]: ...

    def update(self, inputs: list[MeasureInput], results: list[MeasureResult]) -> None:
        """Measured results (also those loaded from a database on resume)."""
        ...

    def offer(self, states: Sequence[State]) -> None:
        """Programs of this task made elsewhere (adapted from similar tasks' best, tensorgen.search.transfer),
        before a round; the default ignores them."""

    def close(self) -> None:
        """Release what the policy holds between rounds (worker processes); it must still work afterwards.
        The default holds nothing."""
