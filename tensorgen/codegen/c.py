"""Render loop IR as C: OpenMP for `parallel` (the thread pool of codegen.pool in a model's module), GCC vector
extensions for `vectorize`, pragmas for unroll.

The output is meant to be read: names come from the DAG, one function per program, and the only
helpers are a few inline functions for min/max/floor division that C lacks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import ClassVar

from tensorgen.codegen import prefetch
from tensorgen.codegen.pool import POOL_C
from tensorgen.codegen.rebase import allocates, encloses_micro_kernel, invariant_bases, rebased_index
from tensorgen.codegen.vector import VectorEmitter, iterations_independent
from tensorgen.loopir.nodes import Allocate, Buffer, BufLoad, For, If, PrimFunc, Seq, Stmt, Store
from tensorgen.loopir.simplify import Ranges, bound
from tensorgen.te.expr import BinOp, Call, Cast, Cmp, Const, Expr, Logic, Select, Var, infix, is_float, walk

CTYPES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t",
          "float16": "_Float16", "bool": "uint8_t"}  # bool: one byte, as NumPy and DTYPE_BYTES hold it
# bytes; larger local buffers go to the heap. GCC keeps a register tile's accumulators in registers
# only in a stack array: in a heap buffer (a pointer) it loads and stores them around every FMA (a
# 4x64 GMM tile with a 128 KB accumulator buffer ran at 92 GFLOP/s), so the limit is generous; threads
# have MBs of stack.
STACK_LIMIT = 256 * 1024
_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_MATH = {"exp": "exp", "log": "log", "sqrt": "sqrt", "tanh": "tanh", "erf": "erf", "pow": "pow",
         "abs": "fabs", "floor": "floor", "ceil": "ceil", "round": "rint", "trunc": "trunc", "fmod": "fmod",
         **{f: f for f in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")}}
#: identifiers the generated code refers to, which no buffer may shadow (a stage named `log` made
#: `log[i] = log(x[i])`): C keywords and types, the math and memory functions it calls
RESERVED = frozenset({
    *_MATH.values(), *(f"{f}f" for f in _MATH.values()), "expm1", "log1p", "fmax", "fmin", "malloc", "free",
    "aligned_alloc", "memcpy", "memset", "auto", "break", "case", "char", "const", "continue", "default", "do",
    "double", "else", "enum", "extern", "float", "for", "goto", "if", "inline", "int", "long", "register",
    "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned",
    "void", "volatile", "while", "int32_t", "int64_t", "uint8_t", "_Float16", "_Bool", "bool", "true", "false"})

PRELUDE = """\
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <omp.h>
"""


def render_c(func: PrimFunc, simd_bytes: int = 32) -> str:
    """C source of `func` plus the thread-control entry points every module exports."""
    return render_module([func], simd_bytes)


@dataclass(frozen=True)
class CFunction:
    """One rendered function: its definition, and the file-scope helpers it needs keyed by name
    (identical keys mean identical text, so a module of many functions defines each helper once)."""

    text: str
    helpers: dict[str, str]
    scratch_bytes: int = 0  # of the module's shared scratch (render_module(scratch=True))


def render_function(func: PrimFunc, simd_bytes: int = 32, scratch: bool = False) -> CFunction:
    return CWriter(func, simd_bytes, scratch=scratch).render()


def render_module(funcs: list[PrimFunc], simd_bytes: int = 32, tail: str = "", scratch: bool = False) -> str:
    """One C file: the prelude, the helpers of all `funcs` once each, the functions, then `tail`.

    With `scratch`, the heap buffers a function needs outside its parallel loops live in one scratch
    area all functions share (they run one after another, as a model's kernels do): `tail` must point
    `tensorgen_scratch` at TENSORGEN_SCRATCH_BYTES of memory before calling them.
    A model then keeps one hot scratch instead of a cold buffer per kernel (MobileNet-V2: 49 of them, 30 MB).
    Every parallel loop becomes a function of the iterations it is given, `{function}_loop{k}`; such a module
    calls it through its own thread pool (codegen.pool, `tensorgen_parallel_for`), one without scratch from an
    OpenMP team, so that the kernels tuning times and the model's run the same function.
    """
    rendered = [render_function(f, simd_bytes, scratch) for f in funcs]
    helpers: dict[str, str] = {}
    for r in rendered:
        helpers.update(r.helpers)
    threads = ("void tensorgen_set_num_threads(int n) { omp_set_num_threads(n); }\n"
               "int tensorgen_get_max_threads(void) { return omp_get_max_threads(); }\n")
    if scratch:
        threads = ""  # the pool's
        helpers = {"tensorgen_scratch": f"static char* tensorgen_scratch;\n#define TENSORGEN_SCRATCH_BYTES "
                                        f"{max((r.scratch_bytes for r in rendered), default=0)}\n",
                   "pool": POOL_C, **helpers}
    return PRELUDE + "".join(helpers.values()) + "\n" + "\n".join(r.text for r in rendered) + "\n" + threads + tail


@dataclass
class CWriter:
    """Renders one PrimFunc as a C function; the CUDA writer (codegen.cuda) reuses its expressions and helpers."""

    #: how helper functions are declared (CUDA's are device functions)
    INLINE: ClassVar[str] = "static inline"
    func: PrimFunc
    simd_bytes: int
    scratch: bool = False  # a model's module: shared scratch, parallel loops on the pool
    scratch_bytes: int = 0
    lines: list[str] = field(default_factory=list)
    names: dict[Var, str] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    scopes: list[list[str]] = field(default_factory=lambda: [[]])  # names declared in each open loop body
    types: dict[str, str] = field(default_factory=dict)  # C type of each declared name, as a pooled loop takes it
    loop_vars: list[str] = field(default_factory=list)  # of the loops around the statement being emitted
    pooled: int = 0  # parallel loops given to the pool so far
    helpers: dict[str, str] = field(default_factory=dict)
    ranges: Ranges = field(default_factory=dict)
    in_parallel: bool = False
    in_simd: bool = False
    loops: int = 0  # loops around the statement being emitted
    rebased: dict[Buffer, tuple[str, Expr]] = field(default_factory=dict)  # buffer -> (base pointer, offset)
    prefetching: prefetch.Plan | None = None

    def cname(self, buf: Buffer) -> str:
        """The C name of a buffer: its own, with a `_` after it where C or the code around it uses the name."""
        return f"{buf.name}_" if buf.name in RESERVED else buf.name

    def render(self) -> CFunction:
        self.taken.update(RESERVED)
        outs = {b.name for b in self.func.args[-self.func.attrs.get("n_outputs", 1):]}
        for buf in self.func.args:
            name = self.cname(buf)
            self.taken.add(name)
            const = "" if buf.name in outs else "const "
            self.types[name] = f"{const}{CTYPES[buf.dtype]}*{self.restrict(buf.name)}"
        params = ", ".join(f"{self.types[self.cname(b)]} {self.cname(b)}" for b in self.func.args)
        self.vec = VectorEmitter(self, self.simd_bytes)
        self.emit(self.func.body, 1)
        body = "\n".join(self.lines)
        helpers = {line: line for line in self.vec.typedefs().splitlines(keepends=True)}  # before pooled loops
        helpers.update(self.helpers)
        return CFunction(f"void {self.func.name}({params}) {{\n{body}\n}}\n", helpers, self.scratch_bytes)

    def restrict(self, arg: str) -> str:
        """Arguments a model passes the same memory (attr `shared_args`: an output written over an input)
        must not be declared restrict."""
        return "" if arg in self.func.attrs.get("shared_args", ()) else " restrict"

    # ---- statements ----------------------------------------------------------------------

    def line(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def emit(self, s: Stmt, depth: int) -> None:
        if isinstance(s, Seq):
            for x in s.stmts:
                self.emit(x, depth)
        elif isinstance(s, For):
            self.emit_for(s, depth)
        elif isinstance(s, Store):
            self.line(depth, f"{self.ref(s.buffer, s.index)} = {self.expr(s.value)};")
        elif isinstance(s, If):
            self.line(depth, f"if ({self.expr(s.cond)}) {{")
            self.emit(s.then, depth + 1)
            if s.orelse is not None:
                self.line(depth, "} else {")
                self.emit(s.orelse, depth + 1)
            self.line(depth, "}")
        elif isinstance(s, Allocate):
            self.emit_allocate(s, depth)
        else:
            raise TypeError(f"cannot render {type(s).__name__}")

    def emit_allocate(self, s: Allocate, depth: int) -> None:
        buf = s.buffer
        name = self.declare(self.cname(buf))
        if name != self.cname(buf):
            raise ValueError(f"buffer name {buf.name} is used twice")
        ctype = CTYPES[buf.dtype]
        self.types[name] = f"{ctype}* restrict"
        if buf.scope == "global" or buf.nbytes > STACK_LIMIT:
            workspace = f"{self.func.name}_{name}_workspace"
            nbytes = math.ceil(buf.nbytes / 64) * 64
            if self.scratch and not self.in_parallel:
                at = f"({ctype}*)(tensorgen_scratch + {self.scratch_bytes})"
                self.helpers[workspace] = f"static {ctype}* {workspace}(void) {{ return {at}; }}\n"
                self.scratch_bytes += nbytes
            else:
                self.helpers[workspace] = _workspace(workspace, ctype, nbytes)
            self.line(depth, f"{ctype}* restrict {name} = {workspace}();")
        else:
            self.line(depth, f"{ctype} {name}[{buf.size}] __attribute__((aligned(64)));")
        self.emit(s.body, depth)

    def emit_for(self, s: For, depth: int) -> None:
        self.ranges[s.var] = (0, s.extent - 1)
        if s.kind == "vectorize" and self.vec.try_emit(s, depth):
            return
        if s.kind != "parallel" and not self.in_simd and self.vec.try_emit_reduction(s, depth):
            return
        bases = invariant_bases(s) if encloses_micro_kernel(s) and not self.rebased else {}
        for buf, base in bases.items():
            ptr = self.declare(f"{buf.name}_at")
            self.types[ptr] = f"const {CTYPES[buf.dtype]}*{self.restrict(buf.name)}"
            self.line(depth, f"{self.types[ptr]} {ptr} = &{self.cname(buf)}[{self.expr(base)}];")
            self.rebased[buf] = (ptr, base)
        name = self.var_name(s.var)
        # OpenMP allows no construct inside a simd loop, and only the outermost parallel loop forks
        parallel = s.kind == "parallel" and not self.in_parallel and not self.in_simd
        simd = s.kind == "vectorize" and not self.in_simd and iterations_independent(s)
        if parallel:
            self.prefetching = prefetch.plan(s, set(self.func.attrs.get("constants", ())))
        if parallel:
            self.emit_outlined(s, depth, name)
        else:
            if simd:
                self.line(depth, "#pragma omp simd")
            elif (s.kind in ("unroll", "vectorize") or s.unroll_hint) and not allocates(s.body):
                # gcc 12 -O3 miscompiles fully unrolled loops around local arrays (ivopts; found by the property
                # tests); unrolling a loop that holds a whole tile is never the point, so those stay rolled
                self.line(depth, f"#pragma GCC unroll {s.extent}")
            self.emit_loop(s, depth, name, "0", str(s.extent), parallel, simd)
        self.taken.discard(name)
        for buf in bases:
            del self.rebased[buf]

    def emit_loop(self, s: For, depth: int, name: str, begin: str, end: str, parallel: bool, simd: bool,
                  step: str = "") -> None:
        advance = f"{name} += {step}" if step else f"++{name}"
        self.line(depth, f"for (int32_t {name} = {begin}; {name} < {end}; {advance}) {{")
        if self.prefetching is not None and s is self.prefetching.host:
            self.emit_prefetch(self.prefetching, depth + 1)
        outer = (self.in_parallel, self.in_simd)
        self.in_parallel, self.in_simd = self.in_parallel or parallel, self.in_simd or simd
        self.loops += 1
        self.scopes.append([])
        self.loop_vars.append(name)
        self.emit(s.body, depth + 1)
        self.loop_vars.pop()
        for gone in self.scopes.pop():
            self.taken.discard(gone)
            self.types.pop(gone, None)
        self.loops -= 1
        self.in_parallel, self.in_simd = outer
        self.line(depth, "}")

    def emit_outlined(self, s: For, depth: int, name: str) -> None:
        """Parallel loop `s` as a function of the iterations [begin, end) it is given, taking the variables it reads
        from the enclosing code as parameters (gcc honours `restrict` on parameters, not on locals loaded from a
        struct: 1.33x), and what runs it: in a model's module a call on the pool (codegen.pool), through a task that
        unpacks them from a struct; alone, an OpenMP team whose threads each call it on the share of iterations
        `schedule(static)` gives them (the pool's shares). Both run the same function, so a model runs the machine
        code its kernels were timed with: inlined into OpenMP's outlined body, where the pointers come from a struct,
        a conv tile measured 1.04 ms and ran 1.78 ms in the model, whose restrict parameters made gcc spill its
        accumulators."""
        loop = f"{self.func.name}_loop{self.pooled}"
        self.pooled += 1
        outer, self.lines = self.lines, []
        self.emit_loop(s, 1, name, "begin", "end", True, False)
        body, self.lines = self.lines, outer
        text = "\n".join(body)
        visible = [n for n in self.types if n in self.taken] + [v for v in self.loop_vars if v not in self.types]
        used = [n for n in visible if re.search(rf"\b{re.escape(n)}\b", text)]
        ctype = {n: self.types.get(n, "int32_t") for n in used}
        params = "".join(f"{ctype[n]} {n}, " for n in used)
        function = f"static __attribute__((noinline)) void {loop}({params}int64_t begin, int64_t end) {{\n{text}\n}}\n"
        if not self.scratch:
            self.helpers[loop] = function
            n, t, first = (self.unique(base) for base in ("threads", "thread", "first"))
            q, r = f"{s.extent} / {n}", f"{s.extent} % {n}"  # thread t's share: q iterations, one more if t < r
            self.line(depth, "#pragma omp parallel")
            self.line(depth, "{")
            self.line(depth + 1, f"int64_t {n} = omp_get_num_threads(), {t} = omp_get_thread_num();")
            self.line(depth + 1, f"int64_t {first} = {t} * ({q}) + ({t} < {r} ? {t} : {r});")
            self.line(depth + 1, f"{loop}({''.join(f'{u}, ' for u in used)}{first}, {first} + {q} + ({t} < {r}));")
            self.line(depth, "}")
            self.taken -= {n, t, first}
            return
        fields = "".join(f" {ctype[n].replace(' restrict', '')} {n};" for n in used)
        unpack = "".join(f"a->{n}, " for n in used)
        self.helpers[loop] = (function + f"typedef struct {{{fields or ' char unused;'} }} {loop}_args;\n"
                              f"static void {loop}_task(void* args, int64_t begin, int64_t end) {{\n"
                              f"  const {loop}_args* a = (const {loop}_args*)args;\n"
                              f"  {'(void)a; ' if not used else ''}{loop}({unpack}begin, end);\n}}\n")
        self.line(depth, f"{loop}_args {loop}_in = {{{', '.join(used) or '0'}}};")
        self.line(depth, f"tensorgen_parallel_for({loop}_task, &{loop}_in, {s.extent});")

    def emit_prefetch(self, plan: prefetch.Plan, depth: int) -> None:
        """The next parallel iteration's weight panels, a few lines per trip of this loop."""
        self.helpers["prefetch_lines"] = prefetch.HELPER
        p, extent = self.names[plan.parallel.var], plan.parallel.extent
        trip = prefetch.trip_index(plan.path, self.names)
        for panel in plan.panels:
            nxt = f"&{self.cname(panel.buffer)}[({p} + 1) * {panel.stride}]"
            if panel.every > 1:
                when, first = f" && ({trip}) % {panel.every} == 0", f"({trip}) / {panel.every}"
            else:
                when, first = "", f"({trip}) * {panel.per_trip}" if panel.per_trip > 1 else trip
            count = f"{panel.per_trip}, {panel.lines}"
            self.line(depth, f"if ({p} < {extent - 1}{when}) prefetch_lines({nxt}, {first}, {count});")

    # ---- names ---------------------------------------------------------------------------

    def unique(self, base: str) -> str:
        name, n = base, 0
        while name in self.taken:
            n += 1
            name = f"{base}_{n}"
        self.taken.add(name)
        return name

    def declare(self, base: str) -> str:
        """A unique name for a variable declared before the statement being emitted: it lives until the
        enclosing loop body closes, so two sibling loops that hoist the same buffer get two names."""
        name = self.unique(base)
        self.scopes[-1].append(name)
        return name

    def var_name(self, v: Var) -> str:
        if v not in self.names:
            self.names[v] = self.unique(v.name)
        else:
            self.taken.add(self.names[v])
        return self.names[v]

    # ---- expressions ---------------------------------------------------------------------

    def expr(self, e: Expr) -> str:
        if isinstance(e, Const):
            return const_c(e)
        if isinstance(e, Var):
            return self.names.get(e, e.name)
        if isinstance(e, BufLoad):
            return self.ref(e.buffer, e.index)
        if isinstance(e, BinOp):
            a, b = self.expr(e.a), self.expr(e.b)
            if e.op in ("max", "min") and isinstance(e.b, Const) and not isinstance(e.a, Const):
                a, b = b, a  # the constant first: the helper's NaN test on it folds away (see helper_call)
            if e.op in _INFIX:
                return infix(e, a, b, _INFIX[e.op])
            if e.op in ("floordiv", "floormod") and self.nonneg(e.a) and self.positive(e.b):
                return infix(e, a, b, "/" if e.op == "floordiv" else "%")
            return self.helper_call(e.op, e.dtype, a, b)
        if isinstance(e, Cmp):
            return f"({self.expr(e.a)} {_CMP[e.op]} {self.expr(e.b)})"
        if isinstance(e, Logic):
            if e.op == "not":
                return f"(!{self.expr(e.args[0])})"
            return "(" + (" && " if e.op == "and" else " || ").join(self.expr(a) for a in e.args) + ")"
        if isinstance(e, Select):
            cond, a, b = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
            return self.select_call(e.dtype, cond, a, b) if data_select(e) else f"({cond} ? {a} : {b})"
        if isinstance(e, Cast):
            return f"(({CTYPES[e.dtype]})({self.expr(e.value)}))"
        if isinstance(e, Call):
            return self.call(e)
        raise TypeError(f"cannot render {type(e).__name__} as C")

    def ref(self, buf: Buffer, index: Expr) -> str:
        """`buf[index]`, through a hoisted base pointer when one is in scope."""
        if buf in self.rebased:
            ptr, base = self.rebased[buf]
            return f"{ptr}[{self.expr(rebased_index(index, base))}]"
        return f"{self.cname(buf)}[{self.expr(index)}]"

    def nonneg(self, e: Expr) -> bool:
        b = bound(e, self.ranges)
        return b is not None and b[0] >= 0

    def positive(self, e: Expr) -> bool:
        b = bound(e, self.ranges)
        return b is not None and b[0] >= 1

    def call(self, e: Call) -> str:
        args = [self.expr(a) for a in e.args]
        suffix = "f" if e.dtype == "float32" else ""
        if e.name == "sigmoid":
            return f"(1{'.0f' if suffix else '.0'} / (1 + exp{suffix}(-({args[0]}))))"
        if e.name == "rsqrt":
            return f"(1{'.0f' if suffix else '.0'} / sqrt{suffix}({args[0]}))"
        if e.name == "abs" and not is_float(e.dtype):
            return f"llabs({args[0]})"
        return f"{_MATH[e.name]}{suffix}({', '.join(args)})"

    def select_call(self, dtype: str, cond: str, a: str, b: str) -> str:
        """A select on data (module-level data_select) through a function, whose arguments C evaluates before the
        call: the arms' loads are unconditional, so the vectorizer blends instead of masking them. gcc 12's
        AVX-512 masked loads in if-converted, unrolled loop nests took the wrong mask (PRelu over 3x4x5 gave
        -0 for a fifth of the negative inputs)."""
        ctype = CTYPES[dtype]
        name = f"select_{dtype}"
        if name not in self.helpers:
            self.helpers[name] = f"{self.INLINE} {ctype} {name}(int c, {ctype} a, {ctype} b) {{ return c ? a : b; }}\n"
        return f"{name}({cond}, {a}, {b})"

    def helper_call(self, op: str, dtype: str, a: str, b: str) -> str:
        """Float max and min return NaN when either operand is NaN, as ONNX Runtime's Relu, Max, Min and Clip
        do (reductions too, so that their result does not depend on the schedule's order): `a` when it is
        NaN, else `a > b ? a : b`, which yields `b` when `b` is. With a constant `a` (Relu's 0) the NaN
        test folds away, leaving the compare-and-select the vectorizer makes one or two instructions. Integer
        floor division and modulo by 0 give 0 (ONNX leaves it undefined; a trap would end the whole program, and the
        measurement harness fills integer inputs with 0)."""
        ctype = CTYPES[dtype]
        name = f"{op}_{dtype}"
        if name not in self.helpers:
            nan = " || a != a" if is_float(dtype) else ""
            body = {
                "min": f"return a < b{nan} ? a : b;",
                "max": f"return a > b{nan} ? a : b;",
                "floordiv": "return b == 0 ? 0 : (a >= 0) == (b >= 0) || a % b == 0 ? a / b : a / b - 1;",
                "floormod": "return b == 0 ? 0 : (a % b + b) % b;",
            }[op]
            self.helpers[name] = f"{self.INLINE} {ctype} {name}({ctype} a, {ctype} b) {{ {body} }}\n"
        return f"{name}({a}, {b})"


def _outside_loads(e: Expr) -> list[Expr]:
    """The nodes of `e` not inside a load's index."""
    return [e] if isinstance(e, BufLoad) else [e, *(n for kid in e.children() for n in _outside_loads(kid))]


def data_select(e: Select) -> bool:
    """Whether both arms of `e` may be evaluated whatever its condition: the condition reads data and no loop
    variable (so it guards no index: a pad's condition does), and no arm reads at an index computed from data (a
    gather's)."""
    cond = _outside_loads(e.cond)
    arm_loads = [n for arm in (e.true_value, e.false_value) for n in walk(arm) if isinstance(n, BufLoad)]
    return (any(isinstance(n, BufLoad) for n in cond) and not any(isinstance(n, Var) for n in cond)
            and not any(isinstance(n, BufLoad) for load in arm_loads for n in walk(load.index)))


def _workspace(name: str, ctype: str, nbytes: int) -> str:
    """A heap buffer allocated once per calling thread and reused: shapes are static, and a fresh
    allocation per call costs page faults that dominate large kernels (15-25% on GMM 1024)."""
    return (
        f"static {ctype}* {name}(void) {{\n"
        f"  static __thread {ctype}* buffer;\n"
        f"  if (!buffer) buffer = ({ctype}*)aligned_alloc(64, {nbytes});\n"
        f"  return buffer;\n}}\n"
    )


def const_c(e: Const) -> str:
    v = e.value
    if e.dtype == "bool":
        return "1" if v else "0"
    if is_float(e.dtype):
        if math.isinf(v):
            return ("-" if v < 0 else "") + "INFINITY"
        text = repr(float(v))
        return text + ("f" if e.dtype == "float32" else "")
    return f"{int(v)}LL" if e.dtype == "int64" else str(int(v))
