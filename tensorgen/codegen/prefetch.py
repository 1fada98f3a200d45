"""Software prefetch of the weight panel a parallel loop's next iteration reads.

A layer whose parallel loop splits its weights into panels (one contiguous panel per iteration, as a
packed weight read by output-channel blocks is) streams each panel from memory when its iteration
starts: a burst the core waits for, then compute with the memory idle. Prefetching the next
iteration's panel, a few lines per trip of a loop inside the iteration, overlaps the two. ResNet-50's
layer-4 1x1 conv (4 MB of weights, 16 panels) ran 0.50 -> 0.42 ms in the model with it by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from tensorgen.codegen.rebase import buffer_loads
from tensorgen.loopir.nodes import Buffer, BufLoad, For, Stmt, children
from tensorgen.loopir.simplify import linear
from tensorgen.te.expr import DTYPE_BYTES, Var, free_vars

LINE = 64
MIN_PANEL, MAX_PANEL = 4 * 1024, 1024 * 1024  # bytes: smaller panels need no help, larger ones evict the L2

HELPER = """static inline void prefetch_lines(const void* base, int32_t first, int32_t count, int32_t lines) {
  for (int32_t l = first; l < first + count && l < lines; ++l)
    __builtin_prefetch((const char*)base + (size_t)l * 64, 0, 2);
}
"""


@dataclass(frozen=True)
class Panel:
    buffer: Buffer
    stride: int  # elements from one parallel iteration's panel to the next
    lines: int  # cache lines of a panel
    per_trip: int  # lines to prefetch per trip of the host loop...
    every: int  # ...on every `every`-th trip (spread over the whole iteration: a burst stalls the loads it races)


@dataclass(frozen=True)
class Plan:
    """Prefetch `panels` at the top of `host`'s body; `path` are the loops from the parallel loop's body
    down to `host` (inclusive), whose trips number the prefetched lines."""

    parallel: For
    host: For
    path: tuple[For, ...]
    panels: tuple[Panel, ...]


def _loops(s: Stmt, path: tuple[For, ...] = ()) -> Iterator[tuple[For, ...]]:
    """Every loop in `s` (itself included) with the loops from the outermost down to it."""
    if isinstance(s, For):
        path = (*path, s)
        yield path
    for c in children(s):
        yield from _loops(c, path)


def _panel(loop: For, buf: Buffer, loads: list[BufLoad]) -> tuple[int, int] | None:
    """(stride, lines) when every load of `buf` reads `loop.var * stride + (terms without it)` and the
    panels tile the buffer."""
    strides = set()
    for load in loads:
        terms, _ = linear(load.index)
        stride = terms.get(loop.var, 0)
        if stride <= 0 or any(loop.var in free_vars(atom) for atom in terms if atom is not loop.var):
            return None
        strides.add(stride)
    if len(strides) != 1:
        return None
    (stride,) = strides
    nbytes = stride * DTYPE_BYTES[buf.dtype]
    if stride * loop.extent != buf.size or not MIN_PANEL <= nbytes <= MAX_PANEL:
        return None
    return stride, math.ceil(nbytes / LINE)


def plan(loop: For, constants: set[str]) -> Plan | None:
    """What to prefetch for the parallel loop `loop`, whose `constants` (weight arguments) stay put."""
    if loop.extent < 2:
        return None
    by_buffer: dict[Buffer, list[BufLoad]] = {}
    for load in buffer_loads(loop.body):
        if load.buffer.scope == "arg" and load.buffer.name in constants:
            by_buffer.setdefault(load.buffer, []).append(load)
    panels = [(buf, p) for buf, loads in by_buffer.items() if (p := _panel(loop, buf, loads))]
    if not panels:
        return None
    lines = max(n for _, (_, n) in panels)
    prefetched = {buf for buf, _ in panels}
    for path in _loops(loop.body):
        host = path[-1]
        if any(f.kind == "vectorize" for f in path) or host.kind != "serial":
            continue  # no call inside a simd loop
        trips = math.prod(f.extent for f in path)
        if trips * 4 >= lines and any(ld.buffer in prefetched for ld in buffer_loads(host)):
            return Plan(loop, host, path, tuple(Panel(b, s, n, math.ceil(n / trips), max(trips // n, 1))
                                                for b, (s, n) in panels))
    return None


def trip_index(path: tuple[For, ...], name: dict[Var, str]) -> str:
    """C expression numbering the trips of the last loop of `path` within one iteration of the first's parent."""
    out = ""
    for f in path:
        out = name[f.var] if not out else f"({out}) * {f.extent} + {name[f.var]}"
    return out
