"""Weight layout rewrite (Ansor §4.2): a constant input is repacked at build time into its tile layout.

A conv or dense schedule splits each axis of the weight into tile levels and interleaves them with
the other axes' levels; read in its original layout, the innermost loops then jump through memory.
Since a constant (`placeholder(..., constant=True)`) can be repacked once at build time, the rewrite
gives it one dimension per tile level, in the order the loops of its reading stage nest — e.g. OIHW
weights under an SSRSRS tiling become [co0, co1, ci0, kh, kw, co2, ci1, co3]. Ansor reports ~40% on
ResNet-50 from this alone.

The rewrite applies when the constant is read once, by one stage that is not inlined, with each index
a plain loop axis, and every split of those axes is perfect (what the search samples). The rewritten
State is the same steps replayed on a DAG whose placeholder has the new shape and whose read indexes it
by `(axis // place) % extent`, which lowering simplifies back to the tile loop variables. Candidates
are measured rewritten (measure/builder.py) and models built rewritten (graph/build.py); the cost
model's features stay those of the original state, as in TVM. The layouts themselves, and their
run-time counterpart for inputs that are not constant, are in schedule/packing.py.
"""

from __future__ import annotations

from tensorgen.dag import rebuild_loads
from tensorgen.schedule.packing import LayoutRewrite, tile_layout
from tensorgen.schedule.state import State, loop_state
from tensorgen.te.expr import Load, walk
from tensorgen.te.tensor import Tensor

__all__ = ["LayoutRewrite", "plan_layout_rewrites", "rewrite_layout"]


def plan_layout_rewrites(state: State) -> list[LayoutRewrite]:
    """The rewrites `state` admits, one per constant input it can repack (see the module docstring)."""
    out = []
    for t in state.dag.inputs:
        if t.attrs.get("constant"):
            plan = _plan(state, t)
            if plan is not None:
                out.append(plan)
    return out


def rewrite_layout(state: State) -> tuple[State, list[LayoutRewrite]]:
    """`state` on a DAG whose constants are repacked (itself and [] when none can be); the caller packs
    the constants' data with `LayoutRewrite.pack`."""
    plans = plan_layout_rewrites(state)
    if not plans:
        return state, []
    state = loop_state(state)  # the rewritten DAG is laid out already (ALT's layout steps)
    dag = state.dag
    by_name = {p.name: p for p in plans}
    new_inputs = {
        p.name: Tensor(p.new_shape, dag.by_name[p.name].dtype, p.name, attrs={"repacked": True}) for p in plans
    }  # no longer `constant`: a rewritten DAG is not rewritten again (code generation still treats it as one)

    def load(n: Load) -> Load:  # called for reads of the replaced placeholders only
        return Load(new_inputs[n.tensor.name], by_name[n.tensor.name].index(n.indices), n.dtype)

    new_dag = rebuild_loads(dag, new_inputs, load)
    return State.replay(new_dag, state.steps), plans


def _plan(state: State, t: Tensor) -> LayoutRewrite | None:
    readers = [s for s in state.stages if not s.is_placeholder and _reads(s.tensor, t.name)]
    if len(readers) != 1 or readers[0].location == "inline":
        return None
    return tile_layout(readers[0], t)


def _reads(t: Tensor, name: str) -> bool:
    return t.body is not None and any(isinstance(n, Load) and n.tensor.name == name for n in walk(t.body))
