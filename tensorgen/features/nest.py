"""Statements straight from a State: the loop nest lowering would build, derived without building it.

The features need, per statement, its loops (extent, kind), the per-loop stride of each access and
its operation counts. For affine programs all of it follows arithmetically from the steps: a root
axis is a sum of leaf loops times split radices (a fused loop contributes each part with its average
slope), an access is an affine map of root axes, and a stage computed at a consumer's loop covers
the span its consumer reads inside that loop. Deriving this directly is an order of magnitude faster
than lowering and simplifying expressions, which is what lets the evolutionary search score
thousands of states per second. Programs outside the fragment (non-affine indices, splits of fused
loops) raise `NotAffine`; the extractor lowers those instead. Index arithmetic is counted as one
multiply per strided loop term and one add per term (the lowered C has about that after
simplification); tests compare everything else with features of the lowered program.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tensorgen.errors import TensorgenError
from tensorgen.features.access import Access
from tensorgen.features.layout import OP_CATEGORIES
from tensorgen.features.statement import OP_COLUMN, Statement, count_ops, ir_statements
from tensorgen.loopir.nodes import Buffer, row_major
from tensorgen.loopir.simplify import linear
from tensorgen.schedule.lower import BUFFER_SCOPES, LOOP_KINDS, check_complete, expand_inlined, lower
from tensorgen.schedule.relations import derive, split_radices
from tensorgen.schedule.stage import Fuse, Split, Stage
from tensorgen.schedule.state import State
from tensorgen.te.expr import BinOp, Const, Load, Reduce, binop, walk
from tensorgen.te.tensor import identity_element

_INT = len(OP_CATEGORIES)  # integer op columns follow the float ones


class NotAffine(TensorgenError):
    """The state is outside what `state_statements` derives; lower it instead."""


#: an index term `coef * (root // place) % extent` (extent 0: no modulo) of dimension `dim`: how a
#: reader addresses a tile layout (schedule/packing.py); it is linear in the loop components
TileTerm = tuple[int, int, int, int, int]  # (dim, coef, root, place, extent)
#: a read at `A @ roots + b` plus tile terms: (tensor, A (ndim, n_root), b (ndim), tile terms)
Read = tuple[str, np.ndarray, np.ndarray, tuple[TileTerm, ...]]


def _tile_term(atom, pos: dict[int, int]) -> tuple[int, int, int] | None:
    """(root, place, extent) when `atom` is `v // place`, `v % extent` or `(v // place) % extent` of a
    root axis v."""
    extent = 0
    if isinstance(atom, BinOp) and atom.op == "floormod" and isinstance(atom.b, Const):
        atom, extent = atom.a, int(atom.b.value)
    place = 1
    if isinstance(atom, BinOp) and atom.op == "floordiv" and isinstance(atom.b, Const):
        atom, place = atom.a, int(atom.b.value)
    k = pos.get(id(atom))
    return None if k is None or (place == 1 and extent == 0) else (k, place, extent)


@dataclass(frozen=True)
class _Body:
    """A stage's computation after inlining: reads as affine maps of its root axes, op counts."""

    reads: tuple[Read, ...]
    ops: np.ndarray  # per execution of the (update) statement, index arithmetic excluded
    init_ops: np.ndarray | None  # reductions: the init statement's


_BODY_CACHE: dict[tuple, _Body] = {}


def _body(state: State, s: Stage, by_name: dict[str, Stage]) -> _Body:
    inlined = tuple((st.name, st.body_text) for st in state.stages if st.location == "inline")
    key = (state.dag.workload_key, s.name, s.tensor.shape, s.body_text, inlined)
    hit = _BODY_CACHE.get(key)
    if hit is None:
        hit = _BODY_CACHE[key] = _analyse(s, by_name)
        if len(_BODY_CACHE) > 4096:
            _BODY_CACHE.pop(next(iter(_BODY_CACHE)))
    return hit


def _unclamped(form: tuple[dict, int]) -> tuple[dict, int]:
    """A linear form with each clamp `min(x, c)` / `max(x, c)` of its atoms read as `x` (a padded layout's places
    past the end repeat the last element: its accesses stride as `x` does everywhere else)."""
    terms, c = form
    if all(_clamp(atom) is None for atom in terms):
        return form
    out: dict = {}
    for atom, coef in terms.items():
        if (inner := _clamp(atom)) is not None:
            sub, k = _unclamped(linear(inner))
            c += coef * k
            for a, v in sub.items():
                out[a] = out.get(a, 0) + coef * v
        else:
            out[atom] = out.get(atom, 0) + coef
    return {a: v for a, v in out.items() if v}, c


def _clamp(atom) -> object | None:
    if isinstance(atom, BinOp) and atom.op in ("min", "max") and isinstance(atom.b, Const):
        return atom.a
    return None


def _analyse(s: Stage, by_name: dict[str, Stage]) -> _Body:
    t = s.tensor
    body = expand_inlined(t.body, by_name)
    pos = {id(v): k for k, v in enumerate(t.axes + t.reduce_axes)}
    reads = []
    for ld in (n for n in walk(body) if isinstance(n, Load)):
        a = np.zeros((len(ld.indices), len(pos)))
        b = np.zeros(len(ld.indices))
        tiles = []
        for d, idx in enumerate(ld.indices):
            terms, c = _unclamped(linear(idx))
            for atom, coef in terms.items():
                k = pos.get(id(atom))
                if k is not None:
                    a[d, k] += coef
                elif (tile := _tile_term(atom, pos)) is not None:
                    tiles.append((d, coef, *tile))
                else:
                    raise NotAffine(f"{ld.tensor.name}[{idx}] is not affine in {s.name}'s axes")
            b[d] = c
        reads.append((ld.tensor.name, a, b, tuple(tiles)))
    if isinstance(body, Reduce):
        acc = Load(t, t.axes, t.dtype)  # the accumulator read of `acc = acc op value`
        update = binop({"sum": "add", "prod": "mul", "max": "max", "min": "min"}[body.combiner], acc, body.source)
        init = body.init if body.init is not None else identity_element(body.combiner, body.dtype)
        conds = [body.condition] if body.condition is not None else []
        return _Body(tuple(reads), count_ops([update, *conds])[0], count_ops([init])[0])
    return _Body(tuple(reads), count_ops([body])[0], None)


@dataclass
class _Placed:
    """A stage in the nest: enclosing loops, root axes as multiples of loop components, its buffer."""

    loops: list[int]  # enclosing loop ids, outer to inner: the attach chain, then its own
    n_outer: int  # how many of `loops` belong to the attach chain
    after: dict[str, int]  # iterator name -> len(loops) up to and including it
    loop_of: dict[str, int | None]  # iterator name -> its loop id (None: extent 1, no loop)
    roots: np.ndarray  # (n_root, n_comps)
    root_const: np.ndarray
    buffer: Buffer
    mins: np.ndarray  # placement minimum of the buffer's dims: (ndim, n_comps) and constants
    min_const: np.ndarray
    alloc_outer: float | None


class _Deriver:
    """One pass over a state: place each stage (its loops, and its root axes as multiples of loop
    components: a split leaf is one component, each part of a fused loop another), then list the
    statements with their accesses' per-loop strides."""

    def __init__(self, state: State, exact: bool = True):
        self.state, self.exact = state, exact
        self.by_name = {s.name: s for s in state.stages}
        width = sum(len(s.iters) + sum(len(r.parents) for r in s.relations if isinstance(r, Fuse))
                    for s in state.stages)
        self.comp_loop = np.zeros(width, dtype=np.int64)
        self.comp_ext = np.zeros(width)
        self.comp_slope = np.zeros(width)
        self.n_comps = 0
        self.loop_ext: list[int] = []
        self.loop_kind: list[str] = []
        self.placed: dict[str, _Placed] = {}
        self.attached: dict[tuple[str, str], list[str]] = {}
        for s in state.stages:
            if s.location == "at":
                self.attached.setdefault(s.attach, []).append(s.name)
        self.width = width

    def _comp(self, loop: int, ext: int, slope: float) -> int:
        k = self.n_comps
        self.comp_loop[k], self.comp_ext[k], self.comp_slope[k] = loop, ext, slope
        self.n_comps += 1
        return k

    # ---- placing stages ------------------------------------------------------------------

    def run(self) -> list[Statement]:
        dag = self.state.dag
        arg_names = {t.name for t in dag.args}
        for s in reversed(self.state.stages):
            if s.is_placeholder or s.location == "inline":
                continue
            t = s.tensor
            if s.location == "root":
                scope = "arg" if s.name in arg_names else "global"
                buf = Buffer(s.name, t.shape, t.dtype, scope,
                             row_major(t.shape, s.storage_align if scope == "global" else ()))
                self._place(s, [], np.zeros((t.ndim, self.width)), np.zeros(t.ndim), buf,
                            None if scope == "arg" else 1.0)
        for name in arg_names:
            if name not in self.placed:  # inputs
                t = self.by_name[name].tensor
                buf = Buffer(name, t.shape, t.dtype, "arg", row_major(t.shape))
                self.placed[name] = _Placed([], 0, {}, {}, np.zeros((0, self.width)), np.zeros(0), buf,
                                            np.zeros((t.ndim, self.width)), np.zeros(t.ndim), None)
        out: list[Statement] = []
        for s in self.state.stages:
            if not s.is_placeholder and s.location == "root":
                self._statements(s, out)
        return out

    def _place(self, s: Stage, outer: list[int], mins: np.ndarray, min_const: np.ndarray,
               buf: Buffer, alloc_outer: float | None, region: list[int] | None = None) -> None:
        t = s.tensor
        red = t.reduce_axes
        root_ext = dict(zip(s.root_names, (region or list(t.shape)) + [a.extent for a in red]))
        ext = derive(s, root_ext, {}).extents
        loops = list(outer)
        after: dict[str, int] = {}
        loop_of: dict[str, int | None] = {}
        comps: dict[str, list[tuple[int, int]]] = {}  # iterator -> [(component, multiplier)]
        for it in s.iters:
            e = ext[it.name]
            if e != 1 or it.annotation != "none":
                lid = len(self.loop_ext)
                self.loop_ext.append(e)
                self.loop_kind.append(LOOP_KINDS[it.annotation])
                loops.append(lid)
                comps[it.name] = [(self._comp(lid, e, 1.0), 1)]
                loop_of[it.name] = lid
            else:
                comps[it.name] = []
                loop_of[it.name] = None
            after[it.name] = len(loops)
        for rel in reversed(s.relations):
            if isinstance(rel, Split):
                radices = split_radices(ext[rel.parent], rel.lengths, rel.inner_to_outer)
                acc, stride = [], 1
                for child, radix in zip(reversed(rel.children), reversed(radices)):
                    acc += [(c, m * stride) for c, m in comps.pop(child)]
                    stride *= radix
                comps[rel.parent] = acc
            else:
                fused = comps.pop(rel.child)
                if len(fused) > 1 or (fused and fused[0][1] != 1):
                    raise NotAffine(f"stage {s.name}: a fused loop is split again")
                lid = int(self.comp_loop[fused[0][0]]) if fused else None
                total = self.loop_ext[lid] if lid is not None else 1
                for p in rel.parents:
                    pe = ext[p]
                    if lid is not None and total == 1 and p == rel.parents[0]:  # an annotated loop of one
                        comps[p] = [(self._comp(lid, 1, 1.0), 1)]  # iteration: lowering indexes by it
                        continue
                    comps[p] = [] if lid is None or pe == 1 else \
                        [(self._comp(lid, pe, (pe - 1) / (total - 1)), 1)]
                if fused:  # the fused loop's own component is replaced by its parts
                    self.comp_slope[fused[0][0]] = 0.0
        roots = np.zeros((len(s.root_names), self.width))
        roots[: t.ndim] = mins
        for r, name in enumerate(s.root_names):
            for c, m in comps.get(name, ()):
                roots[r, c] += m
        root_const = np.concatenate([min_const, np.zeros(len(red))])
        self.placed[s.name] = _Placed(loops, len(outer), after, loop_of, roots, root_const, buf, mins, min_const,
                                      alloc_outer)
        body = _body(self.state, s, self.by_name)
        for it in s.iters:
            for name in self.attached.get((s.name, it.name), []):
                self._place_attached(self.by_name[name], s, body, after[it.name])

    def _place_attached(self, p: Stage, c: Stage, body: _Body, n_fixed: int) -> None:
        """`p` computed inside `c`'s first `n_fixed` loops: it covers what `c` reads in the loops inside."""
        if p.tensor.attrs.get("scope") in BUFFER_SCOPES:  # a block's shared tile: its region spans the threads
            raise NotAffine(f"{p.name} is a {p.tensor.attrs['scope']} buffer")
        cp = self.placed[c.name]
        t = p.tensor
        free = np.zeros(self.width, dtype=bool)
        own = set(cp.loops[n_fixed:])
        free[: self.n_comps] = [int(lp) in own for lp in self.comp_loop[: self.n_comps]]
        reads = [self._index(cp, read) for read in body.reads if read[0] == p.name]
        mins = np.zeros((t.ndim, self.width))
        min_const = np.zeros(t.ndim)
        region = []
        for d, full in enumerate(t.shape):
            coefs = [r[0][d] for r in reads]
            lo_hi = []
            for coef, const in ((r[0][d], r[1][d]) for r in reads):
                span = np.where(free, coef, 0.0) * (self.comp_ext - 1)
                lo_hi.append((const + span[span < 0].sum(), const + span[span > 0].sum() + 1))
            fixed = np.where(free, 0.0, coefs[0]) if coefs else None
            same = coefs and all(np.array_equal(np.where(free, 0.0, x), fixed) for x in coefs)
            lo = min(v for v, _ in lo_hi) if lo_hi else 0
            hi = max(v for _, v in lo_hi) if lo_hi else full
            if not same or hi - lo >= full:
                region.append(full)
            else:
                region.append(int(round(hi - lo)))
                mins[d], min_const[d] = fixed, lo
        shape = tuple(region)
        alloc = float(math.prod(self.loop_ext[lp] for lp in cp.loops[:n_fixed]))
        buf = Buffer(p.name, shape, t.dtype, "local", row_major(shape, p.storage_align))
        self._place(p, cp.loops[:n_fixed], mins, min_const, buf, alloc, region)

    # ---- statements ----------------------------------------------------------------------

    def _index(self, reader: _Placed, read: Read) -> tuple[np.ndarray, np.ndarray]:
        """A read's indices as multiples of loop components (ndim, width) plus constants. A tile term
        `(root // place) % extent` keeps the root's components of multiplier in [place, place * extent),
        divided by place: exact when the finer components stay below place and the coarser ones are
        multiples of it, which perfect splits guarantee. Loops that do not align with a layout's tiles (a
        laid-out DAG's loops split by other factors) are left to lowering when `exact`; else each component
        below place * extent steps the tile index by its average slope, m / place."""
        _, a, b, tiles = read
        coefs, const = a @ reader.roots, a @ reader.root_const + b
        for dim, coef, root, place, extent in tiles:
            m = reader.roots[root]
            used = m != 0
            fine, coarse = used & (np.abs(m) < place), used & (np.abs(m) >= place)
            aligned = not (np.any(m[coarse] % place) or (m[fine] * (self.comp_ext[fine] - 1)).sum() >= place)
            if reader.root_const[root] or np.any(m < 0) or (self.exact and not aligned):
                raise NotAffine(f"a tile index ({place}, {extent}) of root axis {root} does not align with its loops")
            keep = coarse if aligned else used
            keep = keep & (m < place * extent) if extent else keep
            coefs[dim] += coef * np.where(keep, m / place, 0.0)
        return coefs, const

    def _access(self, read: Read, write: bool, reader: _Placed, loops: list[int]) -> tuple[Access, int, int]:
        """The access `read` from a statement inside `loops`; with its index op counts."""
        name = read[0]
        target = self.placed.get(name)
        if target is None:
            raise NotAffine(f"{name} is read where it is not computed")
        buf = target.buffer
        strides = np.asarray(buf.strides, dtype=float)
        coefs, const = self._index(reader, read)
        comp_coef = strides @ (coefs - target.mins)
        offset = float(strides @ (const - target.min_const))
        n = self.n_comps
        per_loop = np.bincount(self.comp_loop[:n], np.abs(comp_coef[:n]) * self.comp_slope[:n], len(self.loop_ext))
        coef = per_loop[loops]
        terms = int(np.count_nonzero(coef))
        muls = int(np.count_nonzero((coef != 0) & (coef != 1)))
        adds = max(terms - 1, 0) + (offset != 0)
        return Access(buf, write, coef, int(offset)), muls, adds

    def _statements(self, s: Stage, out: list[Statement]) -> None:
        """`s`'s statements and those of stages computed inside it, in the lowered program's order."""
        pl = self.placed[s.name]
        body = _body(self.state, s, self.by_name)
        t = s.tensor
        store = (s.name, np.eye(t.ndim, len(s.root_names)), np.zeros(t.ndim), ())
        first_red = next((k for k, it in enumerate(s.iters) if it.kind != "spatial"), None)
        for pos, it in enumerate(s.iters):
            if pos == first_red and body.init_ops is not None:  # accumulators zeroed before the reduction
                n_before = pl.after[s.iters[pos - 1].name] if pos else pl.n_outer
                fresh = [pl.loop_of[i.name] for i in s.iters[pos:] if i.kind == "spatial"]
                fresh = [lp for lp in fresh if lp is not None]
                ids = [(lp, False) for lp in pl.loops[:n_before]] + [(lp, True) for lp in fresh]
                out.append(self._statement(s, pl, pl.loops[:n_before] + fresh, ids, body.init_ops, [store]))
            for name in self.attached.get((s.name, it.name), []):
                self._statements(self.by_name[name], out)
        accesses = [store, store, *body.reads] if body.init_ops is not None else [store, *body.reads]
        out.append(self._statement(s, pl, pl.loops, [(lp, False) for lp in pl.loops], body.ops, accesses))

    def _statement(self, s: Stage, pl: _Placed, loops: list[int], ids: list, ops: np.ndarray,
                   accesses: list[Read]) -> Statement:
        out, muls, adds = [], 0, 0
        for k, read in enumerate(accesses):
            acc, m, ad = self._access(read, k == 0, pl, loops)
            out.append(acc)
            muls, adds = muls + m, adds + ad
        ops = ops.copy()
        mad = min(muls, adds)
        ops[_INT + OP_COLUMN["mul"]] += muls
        ops[_INT + OP_COLUMN["mad"]] += mad
        ops[_INT + OP_COLUMN["addsub"]] += adds - mad
        return Statement(tuple(ids), np.array([self.loop_ext[lp] for lp in loops], dtype=float),
                         tuple(self.loop_kind[lp] for lp in loops), out, ops, pl.alloc_outer,
                         s.auto_unroll_max_step)


def state_statements(state: State, exact: bool = True, gpu: bool = False) -> list[Statement]:
    """The statements of `state`'s program (see the module docstring); NotAffine outside the fragment (a shared
    buffer among it), LoweringError for states that are not complete programs, and for GPU bindings unless `gpu`
    (a CUDA target's: a bound loop is a loop of its kind). Not `exact`: loops that do not align with a layout's
    tiles read it at an average slope (_Deriver._index) instead of raising NotAffine."""
    check_complete(state, gpu)
    return _Deriver(state, exact).run()


def program_statements(state: State, gpu: bool = False) -> list[Statement]:
    """`state_statements` (tile indices of misaligned loops at their average slope: lowering such a laid-out
    program costs 20x more, and the search scores thousands), or those of the lowered program where the state
    leaves the affine fragment (LoweringError for states that are not complete programs, and for GPU bindings
    unless `gpu`)."""
    try:
        return state_statements(state, exact=False, gpu=gpu)
    except NotAffine:
        return ir_statements(lower(state, gpu=gpu))
