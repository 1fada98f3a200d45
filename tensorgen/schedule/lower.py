"""Lower a State to loop IR: loop nests per stage, attached stages in their consumers' loops,
inlined stages substituted, reductions split into init and update, guards where loops overshoot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensorgen.errors import LoweringError, ScheduleError
from tensorgen.loopir.nodes import Allocate, Buffer, BufLoad, For, If, PrimFunc, Stmt, Store, row_major, seq
from tensorgen.loopir.simplify import Ranges, SimplifyCache, bound, prove, simplify
from tensorgen.schedule.bound import Interval, interval, union
from tensorgen.schedule.relations import derive
from tensorgen.schedule.stage import GPU_ANNOTATIONS, Split, Stage
from tensorgen.te.expr import Expr, Load, Reduce, Var, all_of, binop, const, substitute, transform, walk
from tensorgen.te.tensor import identity_element

if TYPE_CHECKING:
    from tensorgen.schedule.state import State

#: Annotation -> loop kind: a GPU binding (blockIdx.x, threadIdx.y, vthread, ...) is a loop kind of its own.
LOOP_KINDS = {"none": "serial", "parallel": "parallel", "vectorize": "vectorize", "unroll": "unroll",
              **{a: a for a in GPU_ANNOTATIONS}}
#: Scopes a cache stage may ask for (cache_read/cache_write's `scope`) that lowering gives its buffer; any other
#: scope ("local", "global", ...) is a plain buffer of the function or of the loop it is computed at.
BUFFER_SCOPES = ("shared",)


def lower(state: State, name: str | None = None, gpu: bool = False) -> PrimFunc:
    """The loop program of `state`; raises LoweringError for states that are not complete programs, and for GPU
    bindings unless `gpu` (a CUDA target's)."""
    return _Lowerer(state, gpu).run(name)


def check_complete(state: State, gpu: bool = False) -> None:
    """Raise LoweringError unless every split length is filled and, unless `gpu`, no loop is bound to a GPU axis."""
    for s in state.stages:
        for it in s.iters:
            if it.extent is None:
                raise LoweringError(f"stage {s.name}: iterator {it.name} has an unfilled split length")
            if it.annotation in GPU_ANNOTATIONS and not gpu:
                raise LoweringError(
                    f"stage {s.name}: iterator {it.name} is bound to {it.annotation}; "
                    "GPU bindings need a CUDA target"
                )


@dataclass
class _Placed:
    """A stage being lowered: its buffer, the region it covers, and its root-axis values."""

    stage: Stage
    buffer: Buffer
    mins: tuple[Expr, ...]


class _Lowerer:
    def __init__(self, state: State, gpu: bool = False):
        self.state = state
        self.stages = {s.name: s for s in state.stages}
        self.ranges: Ranges = {}
        self.cache = SimplifyCache()
        self.placed: dict[str, _Placed] = {}
        self.attached: dict[tuple[str, str], list[str]] = {}
        self.thread_vars: dict[Var, int] = {}  # the variables of loops bound to threadIdx.*: a block's threads
        for s in state.stages:
            if s.location == "at":
                self.attached.setdefault(s.attach, []).append(s.name)
        check_complete(state, gpu)

    def run(self, name: str | None) -> PrimFunc:
        dag = self.state.dag
        args = []
        for t in dag.args:
            buf = Buffer(t.name, t.shape, t.dtype, "arg", row_major(t.shape))
            self.placed[t.name] = _Placed(self.stages[t.name], buf, tuple(const(0) for _ in t.shape))
            args.append(buf)
        globals_ = []
        for s in self.state.stages:
            if s.is_placeholder or s.location != "root" or s.name in self.placed:
                continue
            t = s.tensor
            buf = Buffer(s.name, t.shape, t.dtype, "global", row_major(t.shape, s.storage_align))
            self.placed[s.name] = _Placed(s, buf, tuple(const(0) for _ in t.shape))
            globals_.append(buf)
        body = seq(*(self.nest(s) for s in self.state.stages if s.location == "root" and not s.is_placeholder))
        for buf in reversed(globals_):
            body = Allocate(buf, body)
        fname = name or "_".join(t.name for t in dag.outputs) + "_kernel"
        unroll = {s.name: s.auto_unroll_max_step for s in self.state.stages if s.auto_unroll_max_step}
        constants = tuple(t.name for t in dag.args if t.attrs.get("constant") or t.attrs.get("repacked"))
        return PrimFunc(fname, tuple(args), body, {"n_outputs": len(dag.outputs), "auto_unroll": unroll,
                                                   "constants": constants})

    # ---- expressions ---------------------------------------------------------------------

    def to_buffers(self, e: Expr) -> Expr:
        """Tensor loads become flat buffer loads, offset into local regions."""

        def rewrite(n: Expr) -> Expr | None:
            if not isinstance(n, Load):
                return None
            p = self.placed.get(n.tensor.name)
            if p is None:
                raise ScheduleError(f"stage {n.tensor.name} is read where it is not computed (compute it at root, "
                                    f"or at a loop around every read)")
            return BufLoad(p.buffer, self.flat(p, n.indices), n.dtype)

        return transform(e, rewrite)

    def flat(self, p: _Placed, indices) -> Expr:
        terms = [(i - m) * s for i, m, s in zip(indices, p.mins, p.buffer.strides)]
        index = terms[0] if terms else const(0)
        for t in terms[1:]:
            index = index + t
        return simplify(index, self.ranges, self.cache)

    # ---- loop nests ----------------------------------------------------------------------

    def nest(self, s: Stage, region: list[Interval] | None = None) -> Stmt:
        t = s.tensor
        body = t.body
        red_axes = t.reduce_axes
        root_ext = {n: (region[k][1] if region else e) for k, (n, e) in enumerate(zip(s.root_names, t.shape))}
        root_ext.update(zip(s.root_names[t.ndim:], (a.extent for a in red_axes)))
        leaf_ext = derive(s, root_ext, {}).extents
        leaf: dict[str, Expr] = {}
        for it in s.iters:
            ext = leaf_ext[it.name]
            if ext == 1 and it.annotation == "none":
                leaf[it.name] = const(0)
            else:
                var = Var(it.name, "int32", ext)
                self.ranges[var] = (0, ext - 1)
                leaf[it.name] = var
                if it.annotation.startswith("threadIdx"):
                    self.thread_vars[var] = ext
        d = derive(s, root_ext, leaf)
        mins = self.placed[s.name].mins
        local = [simplify(d.values[n], self.ranges, self.cache) for n in s.root_names[: t.ndim]]
        values = [simplify(m + v, self.ranges, self.cache) for m, v in zip(mins, local)]
        red_values = [simplify(d.values[n], self.ranges, self.cache) for n in s.root_names[t.ndim:]]
        mapping = dict(zip(t.axes, values)) | dict(zip(red_axes, red_values))
        spatial_guards = self._guards(s, local, values, d, root_ext)
        red_guards = [v < a.extent for n, v, a in zip(s.root_names[t.ndim:], red_values, red_axes)
                      if d.covered[n] > a.extent]
        # a split loop nested in another non-divisible split reaches past its own extent while the root value may
        # still be in range: the update would add some terms twice (a reduction axis) or into a second copy of an
        # output element initialized once (a spatial one)
        red_guards += [simplify(d.values[n], self.ranges, self.cache) < d.extents[n]
                       for n in dict.fromkeys(rel.parent for rel in s.relations if isinstance(rel, Split))
                       if n not in s.root_names and d.extents[n] is not None and d.covered[n] > d.extents[n]]
        expanded = expand_inlined(body, self.stages)
        self._place_attached(s, leaf, substitute(expanded, mapping))
        buf = self.placed[s.name].buffer
        store_at = self.flat(self.placed[s.name], values)
        if isinstance(expanded, Reduce):
            src = self.to_buffers(substitute(expanded.source, mapping))
            acc = BufLoad(buf, store_at, buf.dtype)
            update: Stmt = Store(buf, store_at, _combine(expanded.combiner, acc, src))
            cond = [substitute(expanded.condition, mapping)] if expanded.condition is not None else []
            update = _guard(self.to_buffers(all_of(*cond, *red_guards)) if cond or red_guards else None, update,
                            self.ranges)
            init_value = expanded.init if expanded.init is not None else identity_element(
                expanded.combiner, expanded.dtype)
            init: Stmt | None = Store(buf, store_at, self.to_buffers(substitute(init_value, mapping)))
        else:
            update = Store(buf, store_at, self.to_buffers(substitute(expanded, mapping)))
            init = None
        update = _guard(all_of(*spatial_guards) if spatial_guards else None, update, self.ranges)
        if init is not None:
            init = _guard(all_of(*spatial_guards) if spatial_guards else None, init, self.ranges)
        return self._loops(s, leaf, 0, update, init)

    def _guards(self, s: Stage, local, values, d, root_ext) -> list[Expr]:
        out = []
        for k, n in enumerate(s.root_names[: s.tensor.ndim]):
            full = s.tensor.shape[k]
            if d.covered[n] > root_ext[n]:
                out.append(local[k] < root_ext[n])
            b = bound(values[k], self.ranges)
            if b is None or b[0] < 0:
                out.append(values[k] >= 0)
            if b is None or b[1] >= full:
                out.append(values[k] < full)
        return list(dict.fromkeys(out))

    def _loops(self, s: Stage, leaf: dict[str, Expr], pos: int, update: Stmt, init: Stmt | None) -> Stmt:
        if pos == len(s.iters):
            return update
        it = s.iters[pos]
        if init is not None and it.kind != "spatial":
            # first reduction loop: zero the accumulators over the remaining spatial loops first
            spatial = [i for i in s.iters[pos:] if i.kind == "spatial"]
            init_nest = init
            for i in reversed(spatial):
                init_nest = self._for(s, i, leaf, init_nest, fresh=True)
            return seq(init_nest, self._loops(s, leaf, pos, update, None))
        inner = self._loops(s, leaf, pos + 1, update, init)
        producers = [self._attached_nest(name) for name in self.attached.get((s.name, it.name), [])]
        inner = _allocate(producers, inner)
        return self._for(s, it, leaf, inner)

    def _for(self, s: Stage, it, leaf: dict[str, Expr], body: Stmt, fresh: bool = False) -> Stmt:
        var = leaf[it.name]
        if not isinstance(var, Var):
            return body
        kind = LOOP_KINDS[it.annotation]
        if fresh:  # the init nest repeats spatial loops; give them their own variables
            new = Var(var.name, "int32", var.extent)
            self.ranges[new] = self.ranges[var]
            body = _subst_stmt(body, {var: new})
            var = new
        hint = s.auto_unroll_max_step > 0 and kind == "serial" and _trip_count(body) * var.extent <= \
            s.auto_unroll_max_step
        return For(var, var.extent, kind, body, hint)

    # ---- attached stages -------------------------------------------------------------------

    def _place_attached(self, s: Stage, leaf: dict[str, Expr], body: Expr) -> None:
        """Infer the region of each stage computed inside `s` and give it a local buffer. A shared buffer is
        the whole block's: its region is what every thread reads, whatever loops bound to threadIdx are around."""
        for pos, it in enumerate(s.iters):
            for name in self.attached.get((s.name, it.name), []):
                p = self.stages[name]
                free = {v: v.extent for i in s.iters[pos + 1:] if isinstance(v := leaf[i.name], Var)}
                scope = p.tensor.attrs.get("scope")
                if scope == "shared":
                    free |= self.thread_vars
                region = self._region(p, body, free)
                shape = tuple(n for _, n in region)
                buf = Buffer(p.name, shape, p.tensor.dtype, scope if scope in BUFFER_SCOPES else "local",
                             row_major(shape, p.storage_align))
                self.placed[p.name] = _Placed(p, buf, tuple(m for m, _ in region))

    def _region(self, p: Stage, body: Expr, free: dict[Var, int]) -> list[Interval]:
        reads = [n for n in walk(body) if isinstance(n, Load) and n.tensor.name == p.name]
        region = []
        for d, full in enumerate(p.tensor.shape):
            parts = [interval(r.indices[d], free, self.ranges) for r in reads]
            merged = union(parts) if parts and None not in parts else None
            if merged is None or merged[1] >= full:  # covers it all anyway
                merged = (const(0), full)
            region.append((simplify(merged[0], self.ranges, self.cache), merged[1]))
        return region

    def _attached_nest(self, name: str) -> tuple[Buffer, Stmt]:
        p = self.placed[name]
        region = [(m, n) for m, n in zip(p.mins, p.buffer.shape)]
        return p.buffer, self.nest(p.stage, region)


def expand_inlined(e: Expr, stages: dict[str, Stage]) -> Expr:
    """`e` with the bodies of inlined stages (recursively) substituted for their loads."""

    def inline(n: Expr) -> Expr | None:
        if isinstance(n, Load):
            st = stages.get(n.tensor.name)
            if st is not None and st.location == "inline":
                t = st.tensor
                return expand_inlined(substitute(t.body, dict(zip(t.axes, n.indices))), stages)
        return None

    return transform(e, inline)


def _allocate(producers: list[tuple[Buffer, Stmt]], inner: Stmt) -> Stmt:
    body = seq(*(nest for _, nest in producers), inner)
    for buf, _ in reversed(producers):
        body = Allocate(buf, body)
    return body


def _combine(combiner: str, acc: Expr, value: Expr) -> Expr:
    op = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}[combiner]
    return binop(op, acc, value)


def _guard(cond: Expr | None, stmt: Stmt, ranges: Ranges) -> Stmt:
    if cond is None:
        return stmt
    cond = simplify(cond, ranges)
    verdict = prove(cond, ranges)
    if verdict is True:
        return stmt
    return If(cond, stmt)


def _trip_count(stmt: Stmt) -> int:
    """Statements executed by `stmt` (unrolling budget for auto_unroll_max_step)."""
    from tensorgen.loopir.nodes import Seq

    if isinstance(stmt, For):
        return stmt.extent * _trip_count(stmt.body)
    if isinstance(stmt, Seq):
        return sum(_trip_count(s) for s in stmt.stmts)
    if isinstance(stmt, (If, Allocate)):
        return _trip_count(stmt.then if isinstance(stmt, If) else stmt.body)
    return 1


def _subst_stmt(stmt: Stmt, mapping: dict[Var, Expr]) -> Stmt:
    from dataclasses import replace

    from tensorgen.loopir.nodes import Seq

    if isinstance(stmt, Store):
        return Store(stmt.buffer, substitute(stmt.index, mapping), substitute(stmt.value, mapping))
    if isinstance(stmt, If):
        return If(substitute(stmt.cond, mapping), _subst_stmt(stmt.then, mapping))
    if isinstance(stmt, For):
        return replace(stmt, body=_subst_stmt(stmt.body, mapping))
    if isinstance(stmt, Seq):
        return Seq(tuple(_subst_stmt(s, mapping) for s in stmt.stmts))
    if isinstance(stmt, Allocate):
        return Allocate(stmt.buffer, _subst_stmt(stmt.body, mapping))
    raise LoweringError(f"cannot substitute in {type(stmt).__name__}")

