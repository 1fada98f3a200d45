"""Explicit SIMD for `vectorize` loops with GCC vector extensions.

A vectorized loop whose statements are stores of +, -, *, / (and exp, log, erf, tanh, sigmoid where glibc's libmvec
provides vector versions, and selects whose condition is the same for every lane: an inlined pad's)
over loads that are contiguous (stride 1) or invariant (stride 0) in the loop variable becomes a loop
over whole vectors, then narrower vectors for the rest (24 lanes: 16 + 8), then scalars. Anything else
falls back to a scalar loop under `#pragma omp simd`, which the compiler vectorizes itself when it can
(it never vectorizes expf without -ffast-math: softmax spent most of its time in scalar expf).

An innermost serial loop that reduces into one element (`acc = acc + f(k)`, or max, min) over loads contiguous in
its variable becomes a vector of partial results, combined at the end: without -ffast-math gcc keeps a float sum's
order and so never vectorizes it, and a softmax's row max and sum, a norm's mean or a pool ran one element a cycle
at best. The sum's order changes (as rfactor's does); max and min are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tensorgen.codegen.toolchain import has_vector_math
from tensorgen.loopir.nodes import Buffer, BufLoad, For, Seq, Stmt, Store
from tensorgen.loopir.simplify import Ranges, linear, simplify
from tensorgen.te.expr import DTYPE_BYTES, BinOp, Call, Const, Expr, Select, Var, free_vars, substitute, walk

VECTOR_DTYPES = {"float32": "float", "float64": "double"}
_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_REDUCERS = ("add", "max", "min")  # what an innermost reduction loop may combine with (reductions of te: sum, max, min)
_MASKS = {"float": "int32_t", "double": "int64_t"}  # the integer lanes of a float vector's comparisons
_LANE_BYTES = {"float": 4, "int32_t": 4, "double": 8, "int64_t": 8}
# below this, exp is under the normal range and libmvec computes each such lane by a scalar call: a causal mask's
# -3.4e38 made a softmax 13x slower in Llama than on random inputs; such lanes are given 0 (exact below -103.97 for
# float, -745.1 for double; above, a result under the smallest normal number is flushed)
_EXP_FLOOR = {"float": "-87.0f", "double": "-708.0"}
# calls with a vector form, by the libmvec function it calls: exp, log from glibc 2.22, erf, tanh from 2.35; sigmoid as
# 1 / (1 + exp(-x)) (SiLU in Llama's MLP ran at one scalar expf an element)
_VECTOR_MATH = {"exp": "exp", "log": "log", "erf": "erf", "tanh": "tanh", "sigmoid": "exp"}
_ISA = {16: "b", 32: "d", 64: "e"}  # x86-64 vector-function ABI letter by vector width


class LoopWriter(Protocol):
    """What the vector emitter uses of the C writer it writes for (codegen.c)."""

    names: dict[Var, str]  # the C name of each loop variable in scope
    taken: set[str]
    ranges: Ranges

    def line(self, depth: int, text: str) -> None: ...
    def helper_call(self, op: str, dtype: str, a: str, b: str) -> str: ...
    def emit(self, s: Stmt, depth: int) -> None: ...
    def var_name(self, v: Var) -> str: ...
    def expr(self, e: Expr) -> str: ...
    def ref(self, buf: Buffer, index: Expr) -> str: ...


class VectorEmitter:
    def __init__(self, writer: LoopWriter, simd_bytes: int):
        self.w = writer
        self.simd_bytes = simd_bytes
        self.used: set[tuple[str, int]] = set()
        self.math: set[tuple[str, str]] = set()  # (libmvec function, vector type) called
        self._lanes = 0  # of the vectors being emitted
        self._lane: int | None = None  # their first lane, when fixed
        self.combiners: dict[str, str] = {}  # lane-wise max/min of vectors, by name

    def typedefs(self) -> str:
        out = []
        for ctype, lanes in sorted(self.used):
            name = f"{ctype}{lanes}"
            size = lanes * _LANE_BYTES[ctype]
            out.append(f"typedef {ctype} {name} __attribute__((vector_size({size}), aligned({size // lanes})));\n")
        out += [f"{vtype} {fn}({vtype});  /* libmvec */\n" for fn, vtype in sorted(self.math)]
        return "".join(out) + "".join(self.combiners.values())  # in the order made: each after what it calls

    def try_emit_reduction(self, loop: For, depth: int) -> bool:
        """`loop` as a reduction over vectors (module docstring) if its body is one store `acc = acc OP f(var)`
        into an element that does not move with the loop, f vectorizable and reading something contiguous."""
        store = loop.body.stmts[0] if isinstance(loop.body, Seq) and len(loop.body.stmts) == 1 else loop.body
        if not isinstance(store, Store) or store.buffer.dtype not in VECTOR_DTYPES:
            return False
        value, var = store.value, loop.var
        if not (isinstance(value, BinOp) and value.op in _REDUCERS and value.a == BufLoad(store.buffer, store.index,
                                                                                          store.buffer.dtype)):
            return False
        term = value.b
        loads = [n for n in walk(term) if isinstance(n, BufLoad)]
        if _stride(store.index, var) != 0 or any(ld.buffer is store.buffer for ld in loads) \
                or not any(_stride(ld.index, var) == 1 for ld in loads):
            return False
        lanes = min(self.simd_bytes // DTYPE_BYTES[store.buffer.dtype], _pow2_floor(loop.extent))
        self._lanes = lanes
        if lanes < 4 or not self._ok(term, var):
            return False
        w, ctype, dtype = self.w, VECTOR_DTYPES[store.buffer.dtype], store.buffer.dtype
        vtype = f"{ctype}{lanes}"
        self.used.add((ctype, lanes))
        name = w.var_name(var)
        acc, part = f"{name}_{value.op}", f"{name}_{value.op}s"
        w.line(depth, "{")
        self._lane = 0
        w.names[var] = "0"
        w.line(depth + 1, f"{vtype} {acc} = {_as_vector(*self._vexpr(term, var, vtype), vtype)};")
        self._lane = None
        full = loop.extent - loop.extent % lanes
        if full > lanes:
            w.names[var] = name
            w.line(depth + 1, f"for (int32_t {name} = {lanes}; {name} < {full}; {name} += {lanes}) {{")
            vec = _as_vector(*self._vexpr(term, var, vtype), vtype)
            w.line(depth + 2, f"{acc} = {self._combine(value.op, vtype, ctype, lanes, acc, vec)};")
            w.line(depth + 1, "}")
        w.line(depth + 1, f"{ctype} {part} = {self._lanes_of(value.op, ctype, lanes)}({acc});")
        w.names[var] = name
        if full < loop.extent:
            w.line(depth + 1, f"for (int32_t {name} = {full}; {name} < {loop.extent}; ++{name}) "
                              f"{part} = {self._scalar(value.op, dtype, part, w.expr(term))};")
        target = w.ref(store.buffer, store.index)
        w.line(depth + 1, f"{target} = {self._scalar(value.op, dtype, target, part)};")
        w.line(depth, "}")
        w.taken.discard(name)
        return True

    def _lanes_of(self, op: str, ctype: str, lanes: int) -> str:
        """The helper that combines the lanes of a vector of `lanes` by `op`, halving it down to 4 lanes."""
        vtype = f"{ctype}{lanes}"
        fn = f"{op}_lanes_{vtype}"
        if fn not in self.combiners:
            if lanes == 4:
                both = "r + v[i]" if op == "add" else f"r {'>' if op == 'max' else '<'} v[i] || r != r ? r : v[i]"
                body = f"{ctype} r = v[0]; for (int i = 1; i < 4; ++i) r = {both}; return r;"
            else:
                half, size = f"{ctype}{lanes // 2}", lanes // 2 * _LANE_BYTES[ctype]
                self.used.add((ctype, lanes // 2))
                inner = self._lanes_of(op, ctype, lanes // 2)
                body = (f"{half} lo, hi; __builtin_memcpy(&lo, &v, {size}); "
                        f"__builtin_memcpy(&hi, (char*)&v + {size}, {size}); "
                        f"return {inner}({self._combine(op, half, ctype, lanes // 2, 'lo', 'hi')});")
            self.combiners[fn] = f"static inline {ctype} {fn}({vtype} v) {{ {body} }}\n"
        return fn

    def _scalar(self, op: str, dtype: str, a: str, b: str) -> str:
        return f"{a} + {b}" if op == "add" else self.w.helper_call(op, dtype, a, b)

    def _combine(self, op: str, vtype: str, ctype: str, lanes: int, a: str, b: str) -> str:
        """Lane-wise `a op b` of two vectors; max and min as the scalar helpers (codegen.c): NaN wins."""
        if op == "add":
            return f"{a} + {b}"
        mtype = f"{_MASKS[ctype]}{lanes}"
        self.used.add((_MASKS[ctype], lanes))
        fn = f"{op}_{vtype}"
        cmp = ">" if op == "max" else "<"
        self.combiners.setdefault(fn, f"static inline {vtype} {fn}({vtype} a, {vtype} b) {{ "
                                      f"{mtype} m = (a {cmp} b) | (a != a); "
                                      f"return ({vtype})(((({mtype})a) & m) | ((({mtype})b) & ~m)); }}\n")
        return f"{fn}({a}, {b})"

    def _floored_exp(self, fn: str, ctype: str, lanes: int) -> str:
        """A helper calling libmvec's exp `fn` with the lanes below _EXP_FLOOR held at it, and giving them 0."""
        vtype, mtype, floor = f"{ctype}{lanes}", f"{_MASKS[ctype]}{lanes}", _EXP_FLOOR[ctype]
        name = f"exp_{vtype}"
        self.used.add((_MASKS[ctype], lanes))
        self.combiners.setdefault(name, f"static inline {vtype} {name}({vtype} x) {{ {mtype} keep = ~(x < {floor}); "
                                        f"{vtype} y = {fn}(({vtype})((({mtype})x & keep) | "
                                        f"(({mtype})(({vtype}){{}} + {floor}) & ~keep))); "
                                        f"return ({vtype})(({mtype})y & keep); }}\n")
        return name

    def try_emit(self, loop: For, depth: int) -> bool:
        stores = loop.body.stmts if isinstance(loop.body, Seq) else (loop.body,)
        if not all(isinstance(s, Store) for s in stores):
            return False
        dtypes = {s.buffer.dtype for s in stores}
        if len(dtypes) != 1 or (dtype := dtypes.pop()) not in VECTOR_DTYPES:
            return False
        lanes = min(self.simd_bytes // DTYPE_BYTES[dtype], _pow2_floor(loop.extent))
        if not self._fits(stores, loop.var, lanes):
            return False
        w, ctype = self.w, VECTOR_DTYPES[dtype]
        name = w.var_name(loop.var)
        full = loop.extent - loop.extent % lanes
        if full == lanes:  # one vector: no loop
            self._vectors(stores, loop.var, ctype, 0, depth)
        else:
            w.line(depth, f"for (int32_t {name} = 0; {name} < {full}; {name} += {lanes}) {{")
            self._vectors(stores, loop.var, ctype, None, depth + 1)
            w.line(depth, "}")
        # the rest in narrower vectors (24 lanes: 16 + 8), then scalars
        done = full
        while done < loop.extent and self._fits(stores, loop.var, _pow2_floor(loop.extent - done)):
            self._vectors(stores, loop.var, ctype, done, depth)
            done += self._lanes
        w.names[loop.var] = name
        if done < loop.extent:
            w.line(depth, f"for (int32_t {name} = {done}; {name} < {loop.extent}; ++{name}) {{")
            for s in stores:
                w.emit(s, depth + 1)
            w.line(depth, "}")
        w.taken.discard(name)
        return True

    def _fits(self, stores: Sequence[Store], var: Var, lanes: int) -> bool:
        self._lanes = lanes
        return lanes >= 2 and all(self._vectorizable(s, var) for s in stores)

    def _vectors(self, stores: Sequence[Store], var: Var, ctype: str, lane: int | None, depth: int) -> None:
        """The stores for `self._lanes` lanes from `var` (inside a vector loop) or from the fixed `lane`."""
        vtype = f"{ctype}{self._lanes}"
        self.used.add((ctype, self._lanes))
        self._lane = lane
        if lane is not None:
            self.w.names[var] = str(lane)
        for s in stores:
            value = _as_vector(*self._vexpr(s.value, var, vtype), vtype)
            self.w.line(depth, f"*({vtype}*)&{self.w.ref(s.buffer, self._at_lane(s.index, var))} = {value};")
        self._lane = None

    def _at_lane(self, index: Expr, var: Var) -> Expr:
        if self._lane is not None:
            return simplify(substitute(index, {var: Const(self._lane, "int32")}), self.w.ranges)
        return index

    def _vectorizable(self, s: Store, var: Var) -> bool:
        if _stride(s.index, var) != 1:
            return False
        return self._ok(s.value, var)

    def _ok(self, e: Expr, var: Var) -> bool:
        if isinstance(e, Const):
            return True
        if isinstance(e, BufLoad):
            return _stride(e.index, var) in (0, 1)
        if isinstance(e, BinOp) and e.op in _OPS and e.dtype in VECTOR_DTYPES:
            return self._ok(e.a, var) and self._ok(e.b, var)
        if isinstance(e, Select) and var not in free_vars(e.cond):
            return self._ok(e.true_value, var) and self._ok(e.false_value, var)
        if var not in free_vars(e):
            return True
        if not (isinstance(e, Call) and e.name in _VECTOR_MATH and e.dtype in VECTOR_DTYPES and len(e.args) == 1):
            return False
        width = self._lanes * DTYPE_BYTES[e.dtype]
        return width in _ISA and has_vector_math(width, _VECTOR_MATH[e.name]) and self._ok(e.args[0], var)

    def _vexpr(self, e: Expr, var: Var, vtype: str) -> tuple[str, bool]:
        """C text of `e` for a whole vector starting at lane `var`, and whether it is a vector."""
        if isinstance(e, BufLoad) and _stride(e.index, var) == 1:
            return f"*({vtype}*)&{self.w.ref(e.buffer, self._at_lane(e.index, var))}", True
        if isinstance(e, BinOp) and e.op in _OPS and var in free_vars(e):
            (a, va), (b, vb) = self._vexpr(e.a, var, vtype), self._vexpr(e.b, var, vtype)
            return f"({a} {_OPS[e.op]} {b})", va or vb
        if isinstance(e, Select) and var in free_vars(e):  # one condition for every lane (an inlined pad's)
            a, b = (_as_vector(*self._vexpr(x, var, vtype), vtype) for x in (e.true_value, e.false_value))
            return f"({self.w.expr(e.cond)} ? {a} : {b})", True
        if isinstance(e, Call) and var in free_vars(e):
            arg = _as_vector(*self._vexpr(e.args[0], var, vtype), vtype)
            lanes = self._lanes
            name = _VECTOR_MATH[e.name]
            fn = f"_ZGV{_ISA[lanes * DTYPE_BYTES[e.dtype]]}N{lanes}v_{name}{'f' if e.dtype == 'float32' else ''}"
            self.math.add((fn, vtype))
            if name == "exp":
                fn = self._floored_exp(fn, VECTOR_DTYPES[e.dtype], lanes)
            if e.name == "sigmoid":
                one = _as_vector(self.w.expr(Const(1.0, e.dtype)), False, vtype)
                return f"({one} / ({one} + {fn}(-{arg})))", True
            return f"{fn}({arg})", True
        text = self.w.expr(e)  # the same for every lane; an operator's operand, so in parentheses unless atomic
        return (text if isinstance(e, (Const, Var, BufLoad)) else f"({text})"), False


def _as_vector(text: str, is_vec: bool, vtype: str) -> str:
    """C text of a vector: `text` itself, or a scalar broadcast to every lane."""
    return text if is_vec else f"(({vtype}){{}} + {text})"


def iterations_independent(loop: For) -> bool:
    """No loop-carried dependence: every store inside writes a different element per iteration."""

    def stores(s):
        if isinstance(s, Store):
            yield s
        for child in (getattr(s, "body", None), getattr(s, "then", None), *getattr(s, "stmts", ())):
            if child is not None:
                yield from stores(child)

    return all(loop.var in free_vars(st.index) for st in stores(loop.body))


def _stride(index: Expr, var: Var) -> int | None:
    terms, _ = linear(index)
    stride = 0
    for atom, coef in terms.items():
        if atom is var:
            stride = coef
        elif var in free_vars(atom):
            return None
    return stride


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p

