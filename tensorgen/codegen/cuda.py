"""Render loop IR as CUDA C: one `__global__` kernel per root loop nest, launched in order by a host entry point.

A loop bound to `blockIdx.*` or `threadIdx.*` becomes a grid- or block-stride loop over that index, so every
bound loop covers its whole range whatever the launch: a kernel's grid and block take, per axis, the largest
extent bound to it, and a loop of that extent runs once per block or thread. A `vthread` loop is a serial
loop (unrolled). Buffers of scope `shared` are the block's shared memory, fetched between two
`__syncthreads()`; `local` buffers are per-thread arrays (registers when small); the function's `global`
buffers (intermediate tensors) are device workspaces the host entry point passes to the kernels.

The source compiles with nvcc, or with g++ on a machine without a GPU under the emulation of
`codegen.cuda_emu` (`TENSORGEN_CUDA_EMULATION`), which runs every CUDA thread as a fiber.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tensorgen.codegen.c import CTYPES, RESERVED, CWriter
from tensorgen.errors import LoweringError
from tensorgen.loopir.nodes import (
    Allocate,
    Buffer,
    BufLoad,
    For,
    If,
    PrimFunc,
    Seq,
    Stmt,
    Store,
    statements,
    stmt_exprs,
)
from tensorgen.te.expr import walk

GRID_AXES = ("blockIdx.x", "blockIdx.y", "blockIdx.z")
BLOCK_AXES = ("threadIdx.x", "threadIdx.y", "threadIdx.z")
_DIM = {"blockIdx": "gridDim", "threadIdx": "blockDim"}
#: the most bytes one thread's local array may take (more spills to local memory, and is never the program
#: the search is after)
LOCAL_LIMIT = 16 * 1024

#: identifiers a buffer may not have in CUDA source, on top of C's: C++'s keywords and alternative tokens (ONNX's
#: And made a stage `and`, and `and[i] = ...` does not compile), CUDA's built-in variables and types, and the
#: device functions the emulation header and the CUDA headers define
CUDA_RESERVED = RESERVED | frozenset({
    "alignas", "alignof", "and", "and_eq", "asm", "bitand", "bitor", "catch", "char8_t", "char16_t", "char32_t",
    "class", "compl", "concept", "consteval", "constexpr", "constinit", "const_cast", "co_await", "co_return",
    "co_yield", "decltype", "delete", "dynamic_cast", "explicit", "export", "friend", "mutable", "namespace", "new",
    "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "private", "protected", "public",
    "reinterpret_cast", "requires", "static_assert", "static_cast", "template", "this", "thread_local", "throw",
    "try", "typeid", "typename", "using", "virtual", "wchar_t", "xor", "xor_eq",
    "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize", "dim3", "uint3", "float2", "float4", "make_float2",
    "make_float4", "min", "max", "atomicAdd"})


def cuda_name(name: str) -> str:
    """The name in CUDA source of a buffer named `name`: its own, with a `_` after it where C++ or CUDA uses it."""
    return f"{name}_" if name in CUDA_RESERVED else name


PRELUDE = """\
#ifndef TENSORGEN_CUDA_EMULATION
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define _Float16 __half /* a model's float16 inputs and outputs: nvcc has no _Float16, CUDA's half converts alike */
#define TG_LAUNCH(kernel, grid, block, ...) kernel<<<(grid), (block)>>>(__VA_ARGS__)
#endif
#include <math.h>
#include <stdint.h>
"""


@dataclass(frozen=True)
class Launch:
    """A kernel's grid and block dimensions (x, y, z)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]

    @property
    def threads(self) -> int:
        return math.prod(self.block)


def launch_of(nest: Stmt) -> Launch:
    """Per axis, the largest extent of the loops of `nest` bound to it (1 where none is)."""
    dims = dict.fromkeys(GRID_AXES + BLOCK_AXES, 1)
    for s in statements(nest):
        if isinstance(s, For) and s.kind in dims:
            dims[s.kind] = max(dims[s.kind], s.extent)
    grid = tuple(dims[a] for a in GRID_AXES)
    block = tuple(dims[a] for a in BLOCK_AXES)
    return Launch(grid, block)  # type: ignore[arg-type]


def split_kernels(body: Stmt) -> tuple[list[Buffer], list[Stmt]]:
    """The function's global buffers and its root loop nests, in order: one kernel each."""
    buffers: list[Buffer] = []
    nests: list[Stmt] = []

    def walk(s: Stmt) -> None:
        if isinstance(s, Allocate) and s.buffer.scope == "global":
            buffers.append(s.buffer)
            walk(s.body)
        elif isinstance(s, Seq):
            for x in s.stmts:
                walk(x)
        else:
            nests.append(s)

    walk(body)
    return buffers, nests


@dataclass(frozen=True)
class RenderedCuda:
    """One function rendered: the helpers its kernels call (by name), its kernels and host entry point, and the
    bytes of the module's scratch its workspaces take (render_cuda_function(scratch=True))."""

    helpers: dict[str, str]
    text: str
    scratch_bytes: int = 0


def render_cuda(func: PrimFunc, max_threads: int = 1024, shared_bytes: int = 48 * 1024) -> str:
    """CUDA source of `func`: its kernels and the host entry point `func.name` (device pointers in, the CUDA
    error code out), its workspaces allocated on first use. Raises LoweringError for programs no GPU can run as
    written: a block of more than `max_threads` threads, more than `shared_bytes` of shared memory, a
    `__syncthreads()` under a condition some threads of the block skip, a local array over LOCAL_LIMIT."""
    rendered = render_cuda_function(func, max_threads, shared_bytes)
    return PRELUDE + "".join(rendered.helpers.values()) + "\n" + rendered.text


def render_cuda_module(funcs: Sequence[PrimFunc], max_threads: int = 1024, shared_bytes: int = 48 * 1024,
                       tail: str = "") -> str:
    """One CUDA source of a model: the prelude, the helpers of all `funcs` once each, their kernels and host entry
    points, then `tail` (the executor). The functions run one after another, so their workspaces share one device
    scratch area: `tail` points `tensorgen_scratch` at TENSORGEN_SCRATCH_BYTES of device memory before calling
    them."""
    rendered = [render_cuda_function(f, max_threads, shared_bytes, scratch=True) for f in funcs]
    helpers: dict[str, str] = {}
    for r in rendered:
        helpers.update(r.helpers)
    scratch = (f"static char* tensorgen_scratch;\n"
               f"#define TENSORGEN_SCRATCH_BYTES {max((r.scratch_bytes for r in rendered), default=0)}\n")
    return PRELUDE + scratch + "".join(helpers.values()) + "\n" + "\n".join(r.text for r in rendered) + "\n" + tail


def render_cuda_function(func: PrimFunc, max_threads: int = 1024, shared_bytes: int = 48 * 1024,
                         scratch: bool = False) -> RenderedCuda:
    """`func` as kernels and a host entry point (see render_cuda); with `scratch`, its workspaces lie in the
    module's device scratch area (render_cuda_module) instead of buffers of their own."""
    globals_, nests = split_kernels(func.body)
    helpers: dict[str, str] = {}
    kernels, launches = [], []
    for k, nest in enumerate(nests):
        launch = launch_of(nest)
        if launch.threads > max_threads:
            raise LoweringError(f"{func.name}: kernel {k} has blocks of {launch.threads} threads "
                                f"(block {'x'.join(map(str, launch.block))}); the most is {max_threads}")
        used = buffers_used(nest)
        params = tuple(b for b in (*func.args, *globals_) if b in used)
        stored = {s.buffer.name for s in statements(nest) if isinstance(s, Store)}
        kernel = PrimFunc(f"{func.name}_kernel{k}", params, nest, func.attrs | {"stored": stored})
        writer = CudaWriter(kernel, 0, launch=launch, shared_limit=shared_bytes)
        kernels.append(writer.render_kernel())
        helpers.update(writer.helpers)
        launches.append((kernel, launch))
    workspaces, binds, offset = "", [], 0
    for b in globals_:
        ctype, nbytes = CTYPES[b.dtype], math.ceil(b.nbytes / 256) * 256
        if scratch:
            binds.append(f"  {ctype}* {cuda_name(b.name)} = ({ctype}*)(tensorgen_scratch + {offset});")
            offset += nbytes
        else:
            workspaces += (f"static {ctype}* {func.name}_{b.name}_workspace(void) {{\n"
                           f"  static {ctype}* buffer;\n"
                           f"  if (!buffer) cudaMalloc((void**)&buffer, {nbytes});\n"
                           f"  return buffer;\n}}\n")
            binds.append(f"  {ctype}* {cuda_name(b.name)} = {func.name}_{b.name}_workspace();")
    return RenderedCuda(helpers, "\n".join(kernels) + "\n" + workspaces + _host_entry(func, binds, launches), offset)


def buffers_used(nest: Stmt) -> set[Buffer]:
    """The buffers `nest` loads or stores."""
    used = set()
    for s in statements(nest):
        if isinstance(s, Store):
            used.add(s.buffer)
        for e in stmt_exprs(s):
            used.update(n.buffer for n in walk(e) if isinstance(n, BufLoad))
    return used


def _host_entry(func: PrimFunc, binds: list[str], launches: list[tuple[PrimFunc, Launch]]) -> str:
    """The host entry point: `binds` (the workspaces' pointers), then every kernel's launch, in order."""
    outs = {b.name for b in func.args[-func.attrs.get("n_outputs", 1):]}
    params = ", ".join(f"{'' if b.name in outs else 'const '}{CTYPES[b.dtype]}* {cuda_name(b.name)}"
                       for b in func.args)
    lines = [f"extern \"C\" int {func.name}({params}) {{", *binds]
    for kernel, launch in launches:
        grid, block = (", ".join(map(str, d)) for d in (launch.grid, launch.block))
        names = "".join(f", {cuda_name(b.name)}" for b in kernel.args)
        lines.append(f"  TG_LAUNCH({kernel.name}, dim3({grid}), dim3({block}){names});")
    lines.append("  return (int)cudaGetLastError();\n}\n")
    return "\n".join(lines)


@dataclass
class CudaWriter(CWriter):
    """One kernel: CWriter's expressions and helpers, CUDA's loops and memory."""

    INLINE: ClassVar[str] = "static __device__ inline"
    launch: Launch = field(default_factory=lambda: Launch((1, 1, 1), (1, 1, 1)))
    shared_limit: int = 48 * 1024
    shared_used: int = 0
    uniform: list[bool] = field(default_factory=list)  # per enclosing loop or condition: do all threads take it?

    def cname(self, buf: Buffer) -> str:
        return cuda_name(buf.name)

    def render_kernel(self) -> str:
        self.taken.update(CUDA_RESERVED)
        params = []
        for buf in self.func.args:
            name = self.cname(buf)
            self.taken.add(name)
            const = "" if buf.name in self.func.attrs["stored"] else "const "
            restrict = "" if buf.name in self.func.attrs.get("shared_args", ()) else " __restrict__"
            self.types[name] = f"{const}{CTYPES[buf.dtype]}*{restrict}"
            params.append(f"{self.types[name]} {name}")
        self.emit(self.func.body, 1)
        body = "\n".join(self.lines)
        return (f"extern \"C\" __global__ void __launch_bounds__({self.launch.threads}) "
                f"{self.func.name}({', '.join(params)}) {{\n{body}\n}}\n")

    def emit(self, s: Stmt, depth: int) -> None:
        if isinstance(s, If):
            self.uniform.append(False)
            super().emit(s, depth)
            self.uniform.pop()
        else:
            super().emit(s, depth)

    def emit_for(self, s: For, depth: int) -> None:
        self.ranges[s.var] = (0, s.extent - 1)
        name = self.var_name(s.var)
        axis, _, dim = s.kind.partition(".")
        if axis in _DIM:
            launched = dict(zip(GRID_AXES + BLOCK_AXES, self.launch.grid + self.launch.block))[s.kind]
            self.uniform.append(s.extent == launched)
            self.emit_loop(s, depth, name, f"{s.kind}", str(s.extent), False, False, step=f"{_DIM[axis]}.{dim}")
            self.uniform.pop()
        else:
            if s.kind in ("unroll", "vthread") or s.unroll_hint:
                self.line(depth, "#pragma unroll")
            self.emit_loop(s, depth, name, "0", str(s.extent), False, False)
        self.taken.discard(name)

    def emit_allocate(self, s: Allocate, depth: int) -> None:
        buf = s.buffer
        name = self.declare(self.cname(buf))
        ctype = CTYPES[buf.dtype]
        self.types[name] = f"{ctype}*"
        if buf.scope != "shared":
            if buf.nbytes > LOCAL_LIMIT:
                raise LoweringError(f"{self.func.name}: {buf.name} needs {buf.nbytes} bytes per thread; "
                                    f"a thread's local arrays may take {LOCAL_LIMIT}")
            self.line(depth, f"{ctype} {name}[{buf.size}];")
            self.emit(s.body, depth)
            return
        self.shared_used += buf.nbytes
        if self.shared_used > self.shared_limit:
            raise LoweringError(f"{self.func.name}: shared memory of {self.shared_used} bytes "
                                f"(at {buf.name}); a block may use {self.shared_limit}")
        self.line(depth, f"__shared__ {ctype} {name}[{buf.size}];")
        if isinstance(s.body, Allocate) and s.body.buffer.scope == "shared":
            self.emit_allocate(s.body, depth)  # the next tile fetched at the same loop
            return
        self.emit_fetched(s.body, depth)

    def emit_fetched(self, body: Stmt, depth: int) -> None:
        """`body`: the nests that fill this loop's shared tiles, then their readers; the tiles are filled
        between two barriers (the first waits for the readers of the previous trip)."""
        stmts = list(body.stmts) if isinstance(body, Seq) else [body]
        fills = [i for i, st in enumerate(stmts)
                 if any(isinstance(x, Store) and x.buffer.scope == "shared" for x in statements(st))]
        if not fills:
            self.emit(body, depth)
            return
        if not all(self.uniform):
            raise LoweringError(f"{self.func.name}: a shared tile is filled where only some threads of the block "
                                "run (under a condition or a thread loop shorter than the block), so its barrier "
                                "would hang")
        first, last = fills[0], fills[-1]
        for st in stmts[:first]:
            self.emit(st, depth)
        self.line(depth, "__syncthreads();")
        for st in stmts[first:last + 1]:
            self.emit(st, depth)
        self.line(depth, "__syncthreads();")
        for st in stmts[last + 1:]:
            self.emit(st, depth)
