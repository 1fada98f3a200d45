"""Replay with shared prefixes: the search replays thousands of step lists that differ from a parent's
in one step, so the stages after every prefix are kept in a trie and only the differing tail runs.

A step's effect depends only on the stages and steps before it (and the DAG), so a prefix replayed
once gives the same stages every time. Failures are remembered too: a prefix that raised raises again.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensorgen.dag import ComputeDAG
from tensorgen.errors import ScheduleError
from tensorgen.schedule.state import State
from tensorgen.schedule.steps import Step


class _Node:
    __slots__ = ("stages", "children", "error")

    def __init__(self, stages, error: ScheduleError | None = None):
        self.stages, self.children, self.error = stages, {}, error


class PrefixReplayer:
    """`replayer(steps)` is `State.replay(dag, steps)`, reusing every prefix seen before; the trie is
    dropped when it holds `max_nodes` (the search's working set refills it within a generation)."""

    def __init__(self, dag: ComputeDAG, max_nodes: int = 200_000):
        self.dag, self.max_nodes = dag, max_nodes
        self._root = _Node(State(dag).stages)
        self.nodes = 0

    def __call__(self, steps: Sequence[Step]) -> State:
        if self.nodes >= self.max_nodes:
            self._root.children.clear()
            self.nodes = 0
        state = State(self.dag)
        node = self._root
        for n, step in enumerate(steps):
            child = node.children.get(step)
            if child is None:
                state.stages, state.steps = node.stages, tuple(steps[:n])
                try:
                    state.apply(step)
                    child = _Node(state.stages)
                except ScheduleError as err:
                    child = _Node(None, err)
                node.children[step] = child
                self.nodes += 1
            if child.error is not None:
                raise child.error
            node = child
        state.stages, state.steps = node.stages, tuple(steps)
        return state
