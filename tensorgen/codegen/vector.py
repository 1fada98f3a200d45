"""Explicit SIMD for `vectorize` loops with GCC vector extensions.

A vectorized loop whose statements are stores of +, -, *, / (and exp, log where glibc's libmvec
provides vector versions, and selects whose condition is the same for every lane: an inlined pad's)
over loads that are contiguous (stride 1) or invariant (stride 0) in the loop variable becomes a loop
over whole vectors, then narrower vectors for the rest (24 lanes: 16 + 8), then scalars. Anything else
falls back to a scalar loop under `#pragma omp simd`, which the compiler vectorizes itself when it can
(it never vectorizes expf without -ffast-math: softmax spent most of its time in scalar expf).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tensorgen.codegen.toolchain import has_vector_math
from tensorgen.loopir.nodes import Buffer, BufLoad, For, Seq, Stmt, Store
from tensorgen.loopir.simplify import Ranges, linear, simplify
from tensorgen.te.expr import DTYPE_BYTES, BinOp, Call, Const, Expr, Select, Var, free_vars, substitute

VECTOR_DTYPES = {"float32": "float", "float64": "double"}
_OPS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_VECTOR_MATH = ("exp", "log", "erf", "tanh")  # libmvec's: exp, log from glibc 2.22, erf, tanh from 2.35
_ISA = {16: "b", 32: "d", 64: "e"}  # x86-64 vector-function ABI letter by vector width


class LoopWriter(Protocol):
    """What the vector emitter uses of the C writer it writes for (codegen.c)."""

    names: dict[Var, str]  # the C name of each loop variable in scope
    taken: set[str]
    ranges: Ranges

    def line(self, depth: int, text: str) -> None: ...
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

    def typedefs(self) -> str:
        out = []
        for ctype, lanes in sorted(self.used):
            name = f"{ctype}{lanes}"
            size = lanes * (4 if ctype == "float" else 8)
            out.append(f"typedef {ctype} {name} __attribute__((vector_size({size}), aligned({size // lanes})));\n")
        out += [f"{vtype} {fn}({vtype});  /* libmvec */\n" for fn, vtype in sorted(self.math)]
        return "".join(out)

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
        return width in _ISA and has_vector_math(width, e.name) and self._ok(e.args[0], var)

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
            fn = f"_ZGV{_ISA[lanes * DTYPE_BYTES[e.dtype]]}N{lanes}v_{e.name}{'f' if e.dtype == 'float32' else ''}"
            self.math.add((fn, vtype))
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

