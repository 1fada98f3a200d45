"""The generated executor: a static memory plan and the C function that calls every kernel in order.

The C ABI of a compiled model (see examples/run_model.c):

    tensorgen_model* tensorgen_model_init(const void* weights);   // the weights file's bytes, kept until _free
    int tensorgen_model_run(tensorgen_model* m, const void* const* inputs, void* const* outputs);
    int tensorgen_model_run_timed(m, inputs, outputs, double* seconds);  // + each kernel's time
    const char* tensorgen_model_error(const tensorgen_model* m);  // why the last run returned nonzero
    void tensorgen_model_free(tensorgen_model* m);
    int tensorgen_model_num_inputs(void), tensorgen_model_num_outputs(void);
    long tensorgen_model_input_bytes(int i), tensorgen_model_output_bytes(int i);

A host model reads its weights where init is given them: the caller maps weights.bin read-only (page aligned,
so every weight is 64-byte aligned as tuning measured it; a buffer read from a file is 16-byte aligned, and every
vector load of a weight then splits a cache line: tuned 3x3 convs ran 1.3x slower) and keeps the mapping until
tensorgen_model_free. No process then holds a second copy of the weights (a copy in init made a built model take
2x its weights in memory), and the kernels never write them (they are const in the executor).
Intermediate values live in one arena allocated by init; values whose lifetimes do not overlap share memory.
Reshape-like values alias their source, graph outputs are written in place.

A CUDA model has the same ABI (inputs and outputs in host memory; executor_memory.DEVICE copies them to and from
the device, init copies the weights there; a failing CUDA call fails the run with CUDA's reason), and its
tensorgen_set_num_threads does nothing.

A run returns nonzero, with the reason in tensorgen_model_error, where an input would make a kernel read
outside a tensor: the indices of a Gather or GatherElements computed at run time are checked (in [-n, n), as
ONNX Runtime does) before the kernel that gathers with them, since a kernel has no way to fail. Those of a
ScatterElements or ScatterND are checked the same way (its kernel only compares them, so it could not read out of
bounds, but an update that lands nowhere would be a silent wrong answer).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tensorgen.codegen.c import CTYPES
from tensorgen.graph.backend.executor_memory import ALIGN, HOST, Memory
from tensorgen.graph.passes.fusion import GATHER_OPS, SCATTER_OPS, Partition, overwritable_input


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[str, int]  # arena byte offset of every intermediate root value
    arena_bytes: int
    naive_bytes: int  # what one buffer per value would take (for reporting reuse)
    overwritten: dict[int, str] = field(default_factory=dict)  # kernel index -> input its output is written over


def plan_memory(part: Partition, in_place: set[str]) -> MemoryPlan:
    """First-fit reuse of arena blocks by lifetime (kernel index of definition .. last use); an output
    takes the block of an input it may overwrite (fusion.overwritable_input) when that input dies there.

    `in_place` are root values that need no arena (graph inputs/outputs, constants).
    """
    graph = part.graph
    root = part.aliases.get
    last_use: dict[str, int] = {}
    for k, sub in enumerate(part.subgraphs):
        for name in sub.inputs:
            last_use[root(name, name)] = k
    free: list[tuple[int, int]] = []  # (offset, size) blocks, sorted by offset
    offsets: dict[str, int] = {}
    overwritten: dict[int, str] = {}
    top = naive = 0
    for k, sub in enumerate(part.subgraphs):
        handed: set[str] = set()  # inputs whose block an output took over
        victim = overwritable_input(sub, graph)
        old = root(victim, victim) if victim else None
        if old not in offsets or last_use[old] != k or sum(root(n, n) == old for n in sub.inputs) != 1:
            old = None  # still read later, or through another alias too: no hand-over
        for name in sub.outputs:
            if name in in_place:
                continue
            size = _aligned(graph.value(name).nbytes)
            naive += size
            if old is not None and size == _aligned(graph.value(old).nbytes):
                offsets[name] = offsets[old]
                overwritten[k] = victim
                handed.add(old)
                continue
            for i, (off, blk) in enumerate(free):
                if blk >= size:
                    offsets[name] = off
                    free[i:i + 1] = [(off + size, blk - size)] if blk > size else []
                    break
            else:
                offsets[name], top = top, top + size
        for name in {root(n, n) for n in sub.inputs} | set(sub.outputs):
            if name in offsets and name not in handed and last_use.get(name, k) <= k:
                free.append((offsets[name], _aligned(graph.value(name).nbytes)))
                free = _coalesce(free)
    return MemoryPlan(offsets, top, naive, overwritten)


def _coalesce(blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for off, size in sorted(blocks):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1] = (out[-1][0], out[-1][1] + size)
        else:
            out.append((off, size))
    return out


def weight_offsets(part: Partition) -> tuple[dict[str, int], int]:
    """Where each constant the kernels read lies in the weights file, at aligned offsets in the order they are
    read: (offset by name, the file's size)."""
    graph = part.graph
    offsets: dict[str, int] = {}
    size = 0
    read = [name for sub in part.subgraphs for name in sub.inputs]
    read += [part.aliases.get(name, name) for name in graph.outputs]
    for name in read:
        if graph.is_constant(name) and name not in offsets:
            offsets[name] = size
            size += _aligned(graph.value(name).nbytes)
    return offsets, size


def write_weights(part: Partition, offsets: dict[str, int], write: Callable[[object], None]) -> None:
    """Stream the constants at `offsets` (weight_offsets) to `write` (a file's write: bytes or a uint8 array), one
    constant at a time and without a copy of one already contiguous in its dtype: the build holds the weights once,
    not a second time in one blob and a third in its pieces."""
    graph = part.graph
    at = 0
    for name, offset in sorted(offsets.items(), key=lambda item: item[1]):
        write(bytes(offset - at))  # the previous constant's padding
        data = np.ascontiguousarray(graph.constants[name], dtype=graph.value(name).dtype).reshape(-1).view(np.uint8)
        write(data)
        at = offset + data.size
    write(bytes(_aligned(at) - at))


def executor_source(part: Partition, kernel_names: list[str], weight_offsets: dict[str, int], weight_bytes: int,
                    plan: MemoryPlan, memory: Memory = HOST) -> str:
    """Source of the model entry points, appended to the module holding the kernels: tensors in host memory (the
    kernels' parallel loops on the module's thread pool, codegen.pool) or, with `memory` DEVICE, a GPU's (the
    kernels CUDA host entry points; see executor_memory)."""
    graph = part.graph
    ident = _Identifiers()
    lines: list[str] = []
    where: dict[str, str] = {}  # root value -> C expression of its pointer
    arena = plan.arena_bytes  # graph inputs and outputs a device model copies through get slots after the plan's

    def declare(name: str, expr: str, const: bool) -> str:
        nonlocal arena
        if not expr:
            expr, arena = f"m->arena + {arena}", arena + _aligned(graph.value(name).nbytes)
        ctype = CTYPES[graph.value(name).dtype]
        var = ident(name)
        lines.append(f"  {'const ' if const else ''}{ctype}* {var} = ({'const ' if const else ''}{ctype}*)({expr});")
        where[name] = var
        return var

    for i, name in enumerate(graph.inputs):
        lines += memory.copy_in(declare(name, memory.input(i), memory.in_place), i, graph.value(name).nbytes)
    copies: list[tuple[int, str]] = []  # graph outputs copied at the end (on the host: copies of other values)
    for i, name in enumerate(graph.outputs):
        root = part.aliases.get(name, name)
        if root in where or graph.is_constant(root) or root in graph.inputs:
            copies.append((i, root))
        else:
            declare(root, memory.output(i), False)
            if not memory.in_place:
                copies.append((i, root))
    for name, off in weight_offsets.items():
        declare(name, f"m->weights + {off}", True)
    for name, off in plan.offsets.items():
        declare(name, f"m->arena + {off}", False)
    # where the host holds each value: everywhere in host memory, else the caller's inputs
    host = dict(where) if memory.in_place else {
        name: f"(const {CTYPES[graph.value(name).dtype]}*)inputs[{i}]" for i, name in enumerate(graph.inputs)}
    lines.append("")
    staging = 0

    def on_host(root: str, what: str) -> str:
        """A host pointer to the value `root` (its copy in m->staging where the host does not hold it)."""
        nonlocal staging
        if root in host:
            return host[root]
        value = graph.value(root)
        staging = max(staging, value.nbytes)
        lines.extend(memory.fetch(where[root], value.nbytes, what))
        return f"(const {CTYPES[value.dtype]}*)m->staging"

    for k, (sub, kernel) in enumerate(zip(part.subgraphs, kernel_names)):
        _index_checks(part, sub, on_host, lines)
        args = [where[part.aliases.get(n, n)] for n in sub.inputs + sub.outputs]
        lines.append(f"  TIMED({k}, {memory.call(kernel, ', '.join(args))});")
    lines += [memory.copy_out(i, where[root], graph.value(root).nbytes) for i, root in copies]
    body = "\n".join(lines)
    return memory.wrap(f"""
/* ---- executor: {graph.name}, {len(part.subgraphs)} kernels, arena {plan.arena_bytes} bytes ---- */
{memory.runtime(weight_bytes, arena, staging)}
const char* tensorgen_model_error(const tensorgen_model* m) {{ return m->error; }}

/* every index of `ids` (n of them) in [-dim, dim), else the run fails naming the first one that is not */
#define TENSORGEN_CHECK_INDICES(ids, n, dim, what) do {{ \
    for (long i_ = 0; i_ < (n); ++i_) {{ \
      long long v_ = (long long)(ids)[i_]; \
      if (v_ < -(long long)(dim) || v_ >= (long long)(dim)) {{ \
        snprintf(m->error, sizeof(m->error), "%s holds %lld at flat position %ld, outside [-%ld, %ld)", \
                 what, v_, i_, (long)(dim), (long)(dim)); \
        return 1; \
      }} }} }} while (0)

/* the same for indices whose last dim (k) holds coordinates, the j-th in [-dim j, dim j) (ScatterND) */
#define TENSORGEN_CHECK_ND_INDICES(ids, n, k, what, ...) do {{ \
    static const long dims_[] = {{__VA_ARGS__}}; \
    for (long i_ = 0; i_ < (n); ++i_) {{ \
      long long v_ = (long long)(ids)[i_]; long d_ = dims_[i_ % (k)]; \
      if (v_ < -(long long)d_ || v_ >= (long long)d_) {{ \
        snprintf(m->error, sizeof(m->error), "%s holds %lld at flat position %ld, outside [-%ld, %ld)", \
                 what, v_, i_, d_, d_); \
        return 1; \
      }} }} }} while (0)

static double tensorgen_now(void) {{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}}

/* seconds[k] += kernel k's time when `seconds` is given (a profile), else just the call */
#define TIMED(k, call) do {{ double t0_ = seconds ? tensorgen_now() : 0.0; call; \
                            if (seconds) {{ TENSORGEN_SYNC(k); seconds[k] += tensorgen_now() - t0_; }} }} while (0)

int tensorgen_model_run_timed(tensorgen_model* m, const void* const* inputs, void* const* outputs,
                              double* seconds) {{
  m->error[0] = 0;
  tensorgen_scratch = m->scratch;
{body}
  return 0;
}}

int tensorgen_model_run(tensorgen_model* m, const void* const* inputs, void* const* outputs) {{
  return tensorgen_model_run_timed(m, inputs, outputs, NULL);
}}

int tensorgen_model_num_inputs(void) {{ return {len(graph.inputs)}; }}
int tensorgen_model_num_outputs(void) {{ return {len(graph.outputs)}; }}
static const long input_bytes[] = {{{_sizes(graph, graph.inputs)}}};
static const long output_bytes[] = {{{_sizes(graph, graph.outputs)}}};
long tensorgen_model_input_bytes(int i) {{ return input_bytes[i]; }}
long tensorgen_model_output_bytes(int i) {{ return output_bytes[i]; }}
""")


def _index_dims(node, graph) -> tuple[int, ...] | None:
    """The sizes the indices (input 1) of `node` index: one for an index along an axis, one per coordinate of the
    indices' last dim for ScatterND; None for a node without indices."""
    if node.op in GATHER_OPS or node.op == "ScatterElements":
        return (graph.value(node.inputs[0]).shape[int(node.attrs["axis"])],)
    if node.op in SCATTER_OPS:
        return graph.value(node.inputs[0]).shape[:graph.value(node.inputs[1]).shape[-1]]
    return None


def _index_checks(part: Partition, sub, on_host: Callable[[str, str], str], lines: list[str]) -> None:
    """Append to `lines` the checks of the run-time indices `sub`'s Gathers (GatherElements, ScatterElements,
    ScatterND) read from other kernels or the model's inputs (fusion keeps their computation out of the node's
    kernel; constant ones were checked at import). `on_host(value, what)`: a host pointer to the value (after the
    lines that copy it there, if any)."""
    graph = part.graph
    for node in sub.nodes:
        dims = _index_dims(node, graph)
        indices = node.inputs[1] if dims is not None else None
        if indices is None or graph.is_constant(indices) or indices not in sub.inputs:
            continue
        root = part.aliases.get(indices, indices)
        what = f"{'input' if root in graph.inputs else 'value'} '{root}' (indices of {node.op} '{node.name}')"
        what = re.sub(r"[^ -~]", "?", what).replace("\\", "\\\\").replace('"', '\\"')  # a C string literal
        ids = on_host(root, what)
        size = graph.value(indices).size
        if node.op == "ScatterND":
            listed = ", ".join(f"{d}L" for d in dims)
            lines.append(f'  TENSORGEN_CHECK_ND_INDICES({ids}, {size}L, {len(dims)}, "{what}", {listed});')
        else:
            lines.append(f'  TENSORGEN_CHECK_INDICES({ids}, {size}L, {dims[0]}L, "{what}");')


def _sizes(graph, names: list[str]) -> str:
    return ", ".join(str(graph.value(n).nbytes) for n in names) or "0"


class _Identifiers:
    """C identifiers for graph value names: sanitized, unique, never a C keyword-like clash."""

    def __init__(self) -> None:
        self.of: dict[str, str] = {}
        self.taken: set[str] = {"m", "inputs", "outputs"}

    def __call__(self, name: str) -> str:
        if name not in self.of:
            base = "v_" + re.sub(r"\W", "_", name).strip("_")
            ident, n = base, 0
            while ident in self.taken:
                n += 1
                ident = f"{base}_{n}"
            self.taken.add(ident)
            self.of[name] = ident
        return self.of[name]
