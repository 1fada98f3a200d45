"""AutoTVM's templates (§2): a schedule written once with knobs in place of its numbers and choices.

A template says which DAGs it applies to (`condition`), which knobs it has for one of them (`define`, filling a
SpaceBuilder) and the State a config of that space makes (`apply`): ordinary tensorgen steps, so a tuned program
replays from its record like any other. `TEMPLATES` holds them by name; `template_for(dag)` picks the first whose
condition holds, in registration order: the specific ones first, `generic` last (it applies to every DAG).

* `dense`: one stage, a reduction over k into [batch,] y, x (matmul, batch_matmul, dense without bias) — the
  classic CPU recipe of examples.gmm_state: a register tile in a `cache_write` accumulator computed at the tile
  loop, y and x split in three, k in two, the outer tiles fused and parallel, the tile's x vectorized.
* `conv2d`: an NHWC conv2d (te.ops.conv2d, groups 1), with or without its pad stage — examples.conv2d_state's
  recipe: tiles of h, w and co, the outer loops fused and parallel in one of two orders, the accumulator's reduction
  loops outside its tile, co vectorized; pad inlined or its own parallel stage.
* `generic`: any DAG: each stage's spatial loops fused, split in two (the inner at most 64 long), the outer
  parallel; the inner vectorized, unrolled or left alone (stages with a reduction: the reduction inside or outside
  it); element-wise stages inlined or not.

Users add their own: `TEMPLATES.register("mine", MyTemplate)` (a class with the three methods, made without
arguments); it is tried before `generic`, which is always last.
"""

from __future__ import annotations

from typing import Protocol

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TuneError
from tensorgen.registry import Registry
from tensorgen.schedule.stage import Fuse, Split, Stage
from tensorgen.schedule.state import State
from tensorgen.search.autotvm.space import Config, SpaceBuilder
from tensorgen.te.ops.common import CONV2D

AUTO_UNROLL = (0, 16, 64, 512)  # auto_unroll_max_step options, as AutoTVM's x86 templates
INNER_MAX = 64  # generic: the longest inner loop (it may be unrolled, and a long unrolled loop is a slow compile)


class Template(Protocol):
    """A schedule template; see the module docstring."""

    def condition(self, dag: ComputeDAG) -> bool: ...

    def define(self, space: SpaceBuilder, dag: ComputeDAG) -> None: ...

    def apply(self, dag: ComputeDAG, config: Config) -> State: ...


def split(s: State, stage: str, it: str, factors: tuple[int, ...]) -> list[str]:
    """Split `it` into loops of lengths `factors` (outermost first); the new loops' names."""
    s.split(stage, it, factors[1:])
    relation = s.stage(stage).relations[-1]
    assert isinstance(relation, Split)
    return list(relation.children)


def fuse(s: State, stage: str, iters: list[str]) -> str:
    """Fuse `iters` (one is left as it is); the fused loop's name."""
    if len(iters) == 1:
        return iters[0]
    s.fuse(stage, iters)
    relation = s.stage(stage).relations[-1]
    assert isinstance(relation, Fuse)
    return relation.child


def cache_write(s: State, stage: str) -> str:
    """A local accumulator of `stage` (inserted just before it); its name."""
    s.cache_write(stage, "local")
    return s.stages[s.stage_id(stage) - 1].name


def spatial(stage: Stage) -> list[str]:
    return [i.name for i in stage.iters if i.kind == "spatial"]


def reduction(stage: Stage) -> list[str]:
    return [i.name for i in stage.iters if i.kind == "reduce"]


def only_stage(dag: ComputeDAG) -> Stage | None:
    compute = dag.compute_tensors
    return State(dag).stage(compute[0].name) if len(compute) == 1 else None


class DenseTemplate:
    def condition(self, dag: ComputeDAG) -> bool:
        stage = only_stage(dag)
        return stage is not None and len(reduction(stage)) == 1 and len(spatial(stage)) in (2, 3)

    def define(self, space: SpaceBuilder, dag: ComputeDAG) -> None:
        stage = only_stage(dag)
        assert stage is not None
        *_, y, x, k = stage.iters
        space.split("tile_y", int(y.extent), 3)
        space.split("tile_x", int(x.extent), 3)
        space.split("tile_k", int(k.extent), 2)
        space.option("k_inside_rows", (False, True))  # the accumulator's k_1 outside or inside its rows
        space.option("vectorize", (True, False))
        space.option("auto_unroll", AUTO_UNROLL)

    def apply(self, dag: ComputeDAG, config: Config) -> State:
        s = State(dag)
        out = dag.compute_tensors[0].name
        *batch, y, x = spatial(s.stage(out))
        (k,) = reduction(s.stage(out))
        local = cache_write(s, out)
        ys, xs = split(s, out, y, config["tile_y"]), split(s, out, x, config["tile_x"])
        s.reorder(out, [*batch, ys[0], xs[0], ys[1], xs[1], ys[2], xs[2]])
        s.parallel(out, fuse(s, out, [*batch, ys[0], xs[0]]))
        s.compute_at(local, out, xs[1])  # the accumulator is the ys[2] x xs[2] register tile
        ks = split(s, local, k, config["tile_k"])
        rows = [y, ks[1]] if config["k_inside_rows"] else [ks[1], y]
        s.reorder(local, [*batch, ks[0], *rows, x])
        if config["vectorize"]:
            s.vectorize(local, x).vectorize(out, xs[2])
        if config["auto_unroll"]:
            s.pragma(local, s.stage(local).iters[0].name, f"auto_unroll_max_step${config['auto_unroll']}")
        return s


class Conv2dTemplate:
    AXES, REDUCE = ["n", "h", "w", "co"], ["rh", "rw", "rc"]

    def conv(self, dag: ComputeDAG) -> tuple[Stage, str | None] | None:
        """The conv2d stage and the name of its pad stage (None without padding), if the DAG is one."""
        compute = dag.compute_tensors
        if not 1 <= len(compute) <= 2 or compute[-1].tag != CONV2D:
            return None
        stage = State(dag).stage(compute[-1].name)
        if spatial(stage) != self.AXES or reduction(stage) != self.REDUCE:
            return None
        pad = compute[0].name if len(compute) == 2 else None
        return (stage, pad) if pad is None or dag.is_injective(pad) else None

    def condition(self, dag: ComputeDAG) -> bool:
        return self.conv(dag) is not None

    def define(self, space: SpaceBuilder, dag: ComputeDAG) -> None:
        found = self.conv(dag)
        assert found is not None
        stage, pad = found
        extents = {i.name: int(i.extent) for i in stage.iters}
        for axis in ("h", "w", "co"):
            space.split(f"tile_{axis}", extents[axis], 2)
        space.option("co_outer", (False, True))  # parallel over (n, h, w, co) tiles, or (n, co, h, w)
        space.option("vectorize", (True, False))
        space.option("auto_unroll", AUTO_UNROLL)
        if pad is not None:
            space.option("inline_pad", (True, False))

    def apply(self, dag: ComputeDAG, config: Config) -> State:
        found = self.conv(dag)
        assert found is not None
        stage, pad = found
        s, out = State(dag), stage.name
        local = cache_write(s, out)
        hs, ws, cs = (split(s, out, axis, config[f"tile_{axis}"]) for axis in ("h", "w", "co"))
        outer = ["n", cs[0], hs[0], ws[0]] if config["co_outer"] else ["n", hs[0], ws[0], cs[0]]
        s.reorder(out, [*outer, hs[1], ws[1], cs[1]])
        fused = fuse(s, out, outer)
        s.parallel(out, fused)
        s.compute_at(local, out, fused)
        s.reorder(local, ["n", *self.REDUCE, "h", "w", "co"])  # the reduction outside the register tile
        if config["vectorize"]:
            s.vectorize(local, "co").vectorize(out, cs[1])
        if config["auto_unroll"]:
            s.pragma(local, "n", f"auto_unroll_max_step${config['auto_unroll']}")
        if pad is not None:
            if config["inline_pad"]:
                s.compute_inline(pad)
            else:
                s.parallel(pad, fuse(s, pad, spatial(s.stage(pad))[:2]))
        return s


class GenericTemplate:
    INNER = ("none", "vectorize", "unroll")  # what the inner loop of a stage without a reduction gets
    INNER_REDUCE = ("reduce inside", "reduce outside", "reduce outside, vectorize")

    def inlinable(self, dag: ComputeDAG) -> list[str]:
        return [t.name for t in dag.compute_tensors if dag.is_strict_inlinable(t.name) and not dag.is_output(t.name)]

    def condition(self, dag: ComputeDAG) -> bool:
        return bool(dag.compute_tensors)

    def define(self, space: SpaceBuilder, dag: ComputeDAG) -> None:
        if self.inlinable(dag):
            space.option("inline", (True, False))
        state = State(dag)
        for t in dag.compute_tensors:
            stage = state.stage(t.name)
            if spatial(stage):
                extent = 1
                for it in stage.iters:
                    extent *= int(it.extent) if it.kind == "spatial" else 1
                space.split(f"tile_{t.name}", extent, 2, max_factor=INNER_MAX)
                space.option(f"inner_{t.name}", self.INNER_REDUCE if reduction(stage) else self.INNER)
        if any(reduction(state.stage(t.name)) for t in dag.compute_tensors):
            space.option("auto_unroll", AUTO_UNROLL)

    def apply(self, dag: ComputeDAG, config: Config) -> State:
        s = State(dag)
        inlined = self.inlinable(dag) if config.values.get("inline", False) else []
        for name in inlined:
            s.compute_inline(name)
        for t in dag.compute_tensors:
            stage = s.stage(t.name)
            if t.name in inlined or not spatial(stage):
                continue
            reduce = reduction(stage)
            outer, inner = split(s, t.name, fuse(s, t.name, spatial(stage)), config[f"tile_{t.name}"])
            s.parallel(t.name, outer)
            choice = config[f"inner_{t.name}"]
            if reduce and choice != "reduce inside":
                s.reorder(t.name, [outer, *reduce, inner])
            if choice in ("vectorize", "reduce outside, vectorize"):
                s.vectorize(t.name, inner)
            elif choice == "unroll":
                s.unroll(t.name, inner)
            if reduce and config["auto_unroll"]:
                s.pragma(t.name, outer, f"auto_unroll_max_step${config['auto_unroll']}")
        return s


TEMPLATES: Registry[Template] = Registry("autotvm template", TuneError)
TEMPLATES.register("dense", DenseTemplate)
TEMPLATES.register("conv2d", Conv2dTemplate)
TEMPLATES.register("generic", GenericTemplate)


def template_for(dag: ComputeDAG, name: str = "auto") -> tuple[str, Template]:
    """The template `name` (its condition must hold for `dag`), or with "auto" the first registered whose
    condition holds, `generic` last."""
    if name != "auto":
        template = TEMPLATES.create(name)
        if not template.condition(dag):
            raise TuneError(f"autotvm template {name!r} does not apply to the DAG of "
                            f"{', '.join(t.name for t in dag.compute_tensors)}; "
                            f"leave template='auto' to pick one that does")
        return name, template
    names = [n for n in TEMPLATES.names() if n != "generic"] + ["generic"]
    for n in names:
        template = TEMPLATES.create(n)
        if template.condition(dag):
            return n, template
    raise TuneError("no autotvm template applies to a DAG without compute stages")
