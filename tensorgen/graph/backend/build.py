"""build_model: a whole model to one shared library (all kernels + the executor) and a weights file.

Every subgraph gets its best record from the database, replayed on its own DAG; one without a record
gets the best program of the tuned subgraph of the same structure and the closest size, adapted to its
shapes (tensorgen.search.transfer), else the default schedule. What differs per kind of target (CPU, CUDA) is
declared in model_target. The output directory holds:
    model.so        kernels + executor, C ABI in tensorgen/graph/backend/executor.py
    model.c         its source, for people to read (model.cu for CUDA)
    weights.bin     the constants, at the offsets the executor uses
    model.json      inputs, outputs, kernels and which of them were tuned; the size and SHA-256 of weights.bin
                    and model.so (runtime.model_files: the loader checks them), written last
Every file is written under a temporary name and renamed into place (runtime.model_files.commit): a build killed
at any point leaves the directory's earlier build, the new one, or one the loader refuses in one line.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from tensorgen.codegen.backend import Backend, backend_for
from tensorgen.errors import CompileError, LoweringError, TensorgenError
from tensorgen.graph.backend import LAYOUT_MODES
from tensorgen.graph.backend.align import align_partitions
from tensorgen.graph.backend.executor import executor_source, plan_memory, weight_offsets, write_weights
from tensorgen.graph.backend.layout_choice import absorber, charged, plan_for
from tensorgen.graph.backend.layouts import default_laid_out, laid_out_dag, laid_out_state
from tensorgen.graph.backend.model_target import model_target, times_kernels
from tensorgen.graph.backend.programs import Schedule, schedule_subgraphs
from tensorgen.graph.backend.select import select_in_model
from tensorgen.graph.ir import Graph, Value
from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.fusion import Partition, Subgraph, partition
from tensorgen.hardware import hardware_for
from tensorgen.loopir.nodes import PrimFunc
from tensorgen.records.database import Database
from tensorgen.runtime.model_files import FORMAT, LIBRARY, PARTIAL, WEIGHTS, StagedFile, commit, digests
from tensorgen.schedule.layout_rewrite import rewrite_layout
from tensorgen.schedule.lower import lower
from tensorgen.schedule.state import State
from tensorgen.target import HardwareParams, Target
from tensorgen.tempdirs import sweep_dead

LOGGER = logging.getLogger("tensorgen.graph")


@dataclass(frozen=True)
class KernelInfo:
    name: str
    workload_key: str
    nodes: int
    tuned: bool
    cost: float | None  # seconds, of the record used
    schedule: str  # "tuned" | "transferred" (from a similar subgraph's record) | "default"
    rank: int = 0  # which of the task's candidate records, 0 = the fastest alone (see tensorgen.graph.backend.select)
    fallback: str = ""  # why the kernel's record or adapted program was not used (it got the default schedule)



def build_model(model: object, out_dir: str | os.PathLike[str], *, target: str | Target = "cpu",
                db: Database | None = None, batch: int = 1, candidates: int = 1, ranks: Sequence[int] | None = None,
                layouts: str | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """Compile `model` (ONNX file, ModelProto, zoo name or Graph) into `out_dir`; returns that directory.

    Every kernel uses its task's fastest record, or its `ranks[i]`-th candidate (select.candidate_records);
    `candidates` > 1 picks the ranks by timing the model built with each of the first `candidates`
    (tensorgen.graph.backend.select; the model is built and profiled candidates + 1 times more). A fastest
    record that lays out its kernel's arguments (ALT) is followed by the model (`layouts`, LAYOUT_MODES:
    "propagate": with conversion kernels, the layouts propagated along element-wise kernels (graph.backend.layouts);
    "follow": conversion kernels only; "off": such records are passed over; None: "propagate" where the target
    follows layouts, else "off"). A model that follows layouts is built with every kernel's fastest record (no
    selection of ranks: that compares builds kernel by kernel).

    For `cuda` targets the model's tensors live in device memory and its kernels are GPU programs
    (model_target: no channels-last rewrite, no partition alignment, no layouts); `cuda -emulate=1` builds it to
    run on this CPU under codegen.cuda_emu, with the same C ABI."""
    target = Target.parse(target)
    kind = model_target(target)
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise TensorgenError(f"cannot build into {out_dir}: it is a file, not a directory")
    if candidates < 1:
        raise TensorgenError(f"need at least 1 candidate record per kernel, got {candidates}")
    if candidates > 1 and not times_kernels(target):
        raise TensorgenError("in-model selection times the model built with each candidate; under -emulate=1 the "
                             "kernels run on the CPU's emulation, whose times say nothing of a GPU: use 1 candidate")
    layouts = layouts or ("propagate" if kind.follows_layouts else "off")
    if layouts not in LAYOUT_MODES:
        raise TensorgenError(f"layouts must be one of {', '.join(LAYOUT_MODES)}, got {layouts!r}")
    if layouts != "off" and not kind.follows_layouts:
        raise TensorgenError(f"a {target.kind} model does not follow the layouts of records (layouts={layouts!r}); "
                             "use layouts='off'")
    hw = hardware_for(target)
    graph = model if isinstance(model, Graph) else load_graph(model, batch=batch)
    backend_for(target, hw).preflight()
    pools: dict[str, tuple[int, list]] = {}  # the builds of one selection share their candidate records
    if candidates > 1 and db is not None and ranks is None:
        subs = partition(graph, kind.channels_last).subgraphs
        offered = max((len(db.top_k(sub.workload_key, str(target), candidates)) for sub in subs), default=0)
        if layouts != "off" and _sets_layouts(db, subs, target):
            if progress:
                progress("the fastest records lay out their kernels' arguments: built with them, no in-model "
                         "selection")
        elif offered > 1:  # else every build of a selection would be the same model (no task has 2 records)
            candidates = min(candidates, offered)

            def build(ranks: Sequence[int], directory: Path) -> Path:
                return _build(graph, directory, target, hw, db, ranks, pools, None)

            ranks = select_in_model(build, len(subs), candidates, threads=hw.cores, progress=progress).ranks
    return _build(graph, out_dir, target, hw, db, ranks, pools, progress, layouts=layouts)


def _sets_layouts(db: Database, subs: Sequence[Subgraph], target: Target) -> bool:
    return any((r := db.best(sub.workload_key, str(target))) is not None and r.sets_layouts for sub in subs)


def _build(graph: Graph, out_dir: str | os.PathLike[str], target: Target, hw: HardwareParams, db: Database | None,
           ranks: Sequence[int] | None, pools: dict[str, tuple[int, list]],
           progress: Callable[[str], None] | None, failed: dict[int, str] | None = None,
           layouts: str = "off") -> Path:
    """One build. A kernel whose program cannot be applied, lowered, rendered or compiled (a record of an older
    version, a GPU program adapted past the block's limits, a bug the fuzzers have not found yet) gets the default
    schedule instead, with a warning: `failed` holds those kernels and why; a render or compile error names its
    kernels by building each alone, then the build restarts."""
    failed = {} if failed is None else failed
    backend, kind = backend_for(target, hw), model_target(target)
    graph_in = graph
    graph = replace(graph, values=dict(graph.values), constants=dict(graph.constants))  # gains repacked weights
    part = partition(graph, kind.channels_last)
    follow = layouts != "off" and ranks is None
    schedules = schedule_subgraphs(part.subgraphs, target, db, hw.cores, ranks, pools, layouts=follow)
    if follow:
        part, schedules = _follow_layouts(part, schedules, target, db, hw.cores, layouts == "propagate")
    graph = part.graph  # the partitioned graph (channels-last convs, laid-out values) is the one the kernels read
    funcs, kernels = [], []
    for i, (sub, (state, cost, how)) in enumerate(zip(part.subgraphs, schedules)):
        name = f"k{i}_{sub.name.rsplit('_', 1)[0]}"
        if i not in failed:
            try:
                funcs.append(_kernel(graph, sub, state, name, f"k{i}", backend))
            except Exception as err:  # noqa: BLE001 - any failure of one program costs that program only
                failed[i] = f"{type(err).__name__}: {err}".splitlines()[0]
        if i in failed:
            LOGGER.warning("kernel %s: its %s program cannot be used (%s); it gets the default schedule", name,
                           how, failed[i])
            state, cost, how = default_laid_out(sub, hw.cores, kind.schedule), None, "default"
            funcs.append(_kernel(graph, sub, state, name, f"k{i}", backend))
        kernels.append(KernelInfo(name, sub.workload_key, len(sub.nodes), how == "tuned", cost, how,
                                  ranks[i] if ranks and how == "tuned" else 0, failed.get(i, "")))
    if progress:  # every kernel is in one of the counts, so they add up to the total
        tuned = sum(k.tuned for k in kernels)
        transferred = sum(k.schedule == "transferred" for k in kernels)
        counts = {f"{tuned} tuned": tuned,
                  f"{transferred} adapted from the tuned program of a similar kernel": transferred,
                  f"{len(kernels) - tuned - transferred - len(failed)} with the default schedule (no record)":
                      len(kernels) - tuned - transferred - len(failed),
                  f"{len(failed)} with the default schedule (their program failed to build: see the warnings)":
                      len(failed)}
        progress(f"{graph.name}: {len(kernels)} kernel{'s' * (len(kernels) != 1)}: "
                 f"{', '.join(text for text, n in counts.items() if n)}; compiling")
    offsets, weight_bytes = weight_offsets(part)
    plan = plan_memory(part, _in_place(part))
    for k, victim in plan.overwritten.items():
        args = funcs[k].args
        shared = (args[part.subgraphs[k].inputs.index(victim)].name, args[-1].name)
        funcs[k] = replace(funcs[k], attrs={**funcs[k].attrs, "shared_args": shared})
    if kind.aligns_partitions:
        funcs = align_partitions(funcs, [[part.aliases.get(n, n) for n in sub.inputs + sub.outputs]
                                         for sub in part.subgraphs], hw.cores)
    executor = executor_source(part, [k.name for k in kernels], offsets, weight_bytes, plan, kind.memory)
    try:
        source = backend.render_module(funcs, executor)  # a GPU program over the block's limits fails here
        library = backend.compile(source)
    except (CompileError, LoweringError):
        culprits = {i: err for i, f in enumerate(funcs) if i not in failed and (err := _compile_error(f, backend))}
        if not culprits:
            raise
        return _build(graph_in, out_dir, target, hw, db, ranks, pools, progress, {**failed, **culprits}, layouts)
    out = Path(out_dir)
    _write(out, part, offsets, library, kind.source, source, _manifest(graph, part, kernels, plan, target))
    return out


def _write(out: Path, part: Partition, offsets: dict[str, int], library: Path, source_name: str, source: str,
           manifest: dict) -> None:
    """The build's files into `out`, each under a temporary name until all are written, then put in place with
    `manifest` (completed with the files' digests) last. Replaced, not overwritten: a process running the old
    build keeps its files. TensorgenError where they cannot be written (a full disk, no permission): what was
    written of them is removed, the directory's earlier build is left as it was."""
    staged: list[StagedFile] = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        sweep_dead(out, PARTIAL)  # what builds killed here left
        for name in (WEIGHTS, LIBRARY, source_name):
            staged.append(StagedFile(out, name))
        write_weights(part, offsets, staged[0].write)
        staged[1].copy_from(library)
        staged[2].write(source.encode())
        files = {f.name: f.close() for f in staged}
        commit(out, staged, {**manifest, "files": digests({name: files[name] for name in (WEIGHTS, LIBRARY)})})
    except BaseException as err:
        for f in staged:
            f.discard()
        if isinstance(err, OSError):
            raise TensorgenError(f"cannot write the build into {out}: {err.strerror or err}") from None
        raise


def _follow_layouts(part: Partition, schedules: list[Schedule], target: Target, db: Database | None, cores: int,
                    propagate: bool) -> tuple[Partition, list[Schedule]]:
    """The partition laid out as its kernels' programs store their arguments (graph.backend.layouts; a layout
    kept only where it pays for the kernels it adds, layout_choice), with the programs of the kernels that plan adds or
    lays out: their records (by the laid-out DAG), else adapted or default ones."""
    schedules = charged(part, schedules, target, db, cores, propagate)
    plan = plan_for(part, schedules, propagate, absorber(part, schedules, target, db, propagate, measured=True))
    if plan is None:
        return part, schedules
    todo = [i for i, o in enumerate(plan.origin) if o is None]
    laid = schedule_subgraphs([replace(plan.part.subgraphs[i], dag=laid_out_dag(plan.part.subgraphs[i])) for i in todo],
                              target, db, cores)
    found = dict(zip(todo, laid))
    out = []
    for i, (sub, origin) in enumerate(zip(plan.part.subgraphs, plan.origin)):
        if origin is not None:
            out.append(schedules[origin])
        else:
            state, cost, how = found[i]
            out.append((laid_out_state(sub, state), cost, how))
    return plan.part, out












def _kernel(graph: Graph, sub: Subgraph, state: State, name: str, tag: str, backend: Backend) -> PrimFunc:
    """Subgraph `sub` as function `name` under `state`, its constants repacked into the layouts it reads."""
    return lower(_repack_weights(graph, sub, state, tag), name, gpu=backend.binds_threads)


def _compile_error(func: PrimFunc, backend: Backend) -> str:
    """The renderer's error or the compiler's first error line for `func` rendered and compiled alone ("" when it
    compiles)."""
    try:
        backend.compile(backend.render_module([func]))
    except LoweringError as err:
        return f"LoweringError: {err}"
    except CompileError as err:
        return "CompileError: " + err.first_error()
    return ""


def _repack_weights(graph: Graph, sub: Subgraph, state: State, tag: str) -> State:
    """`state` with its constants' layouts rewritten (as it was measured); the repacked data become new
    constants of `graph` that `sub` reads instead (the originals are then not saved unless still read).
    All of them are packed before any is installed, so a failing one leaves `graph` and `sub` as they were."""
    state, plans = rewrite_layout(state)
    names = [t.name for t in state.dag.inputs]
    packed = []
    for plan in plans:
        k = names.index(plan.name)
        value = graph.value(sub.inputs[k])
        packed.append((k, value, plan.pack(np.asarray(graph.constants[value.name])), plan.new_shape))
    for k, value, data, shape in packed:
        name = f"{value.name}.{tag}"
        graph.constants[name] = data
        graph.values[name] = Value(name, shape, value.dtype)
        sub.inputs[k] = name
    return state


def _in_place(part: Partition) -> set[str]:
    graph = part.graph
    return set(graph.inputs) | set(graph.constants) | {part.aliases.get(n, n) for n in graph.outputs}


def _manifest(graph: Graph, part: Partition, kernels: list[KernelInfo], plan, target: Target) -> dict:
    def values(names: list[str]) -> list[dict]:
        return [{"name": n, "shape": list(graph.value(n).shape), "dtype": graph.value(n).dtype} for n in names]

    return {
        "format": FORMAT, "model": graph.name, "target": str(target),
        "inputs": values(graph.inputs), "outputs": values(graph.outputs),
        "kernels": [k.__dict__ for k in kernels],
        "arena_bytes": plan.arena_bytes, "unshared_bytes": plan.naive_bytes,
        "weights": "mapped" if model_target(target).memory.maps_weights else "copied",  # read in place, or copied
    }
