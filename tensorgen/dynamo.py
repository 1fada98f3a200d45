"""`torch.compile(model, backend="tensorgen")`: PyTorch graphs compiled by tensorgen.

TorchDynamo hands the backend one FX graph per region between graph breaks. Each is imported into the graph IR
(tensorgen.graph.frontend.torch_import: exported to Core ATen, converted op by op; the module's parameters and
buffers become constants), optionally tuned, built into one shared library, and called with the caller's
tensors (CPU float tensors are shared with NumPy without copies, both ways).

    model = torch.compile(model, backend="tensorgen", options={"db": "tuning.db", "trials": 2000})

Options (CompileOptions): `db` the tuning database (default: tuning.db when it exists, else none); `trials` the
tuning budget of each graph — records already in the database count towards it, so compiling the same model
again tunes nothing more; with 0, programs come from the database (a default schedule where it has none);
`fallback` splits a graph that has ops tensorgen cannot compile: the largest parts it can compile are compiled,
the rest runs in eager PyTorch (a warning names the ops), instead of failing; `target` the tensorgen target;
`progress` the tuning's live table on stderr (None: where stderr is a terminal; True, False: always, never).
A build with no tuned kernel says once per process that it runs default programs, and how to tune.

tensorgen compiles inference only: its outputs have no autograd history. A graph compiled with grad enabled and a
parameter or input that requires grad (a model being trained) is refused with one line (its gradients would stay
silently zero), or with `fallback` runs in eager PyTorch. Each build is made in a temporary directory that is
removed once the model is loaded (its library and weights stay mapped); one left by a killed process is removed by
the next build.
Graphs are cached by structure and weights within a process: a recompile of the same graph reuses its build. A
graph whose parameters or buffers were changed in place since its build (an optimizer step, load_state_dict) is
built again at its next call, with the new values.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from tensorgen.errors import TensorgenError
from tensorgen.graph.frontend.torch_import import export_module, import_torch, op_name
from tensorgen.graph.frontend.torch_ops import CONVERTERS
from tensorgen.graph.ir import Graph
from tensorgen.graph.load import load_graph
from tensorgen.records.database import SQLiteDatabase
from tensorgen.runtime.model import CompiledModel
from tensorgen.tempdirs import owned_tempdir

LOGGER = logging.getLogger("tensorgen.dynamo")
_MODULE_STATE = re.compile(r"\._(parameters|buffers)\[")


@dataclass(frozen=True)
class CompileOptions:
    """What `torch.compile(..., backend="tensorgen", options={...})` accepts (see the module docstring)."""

    db: str | None = None
    trials: int = 0
    fallback: bool = False
    target: str = "cpu"
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.trials < 0:
            raise TensorgenError(f"options: trials must be >= 0, got {self.trials}")

    @classmethod
    def of(cls, options: Mapping[str, Any] | None) -> CompileOptions:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options or {}) - known)
        if unknown:
            raise TensorgenError(f"torch.compile backend 'tensorgen' has no option {', '.join(map(repr, unknown))}; "
                                 f"its options: {', '.join(sorted(known))}")
        return cls(**dict(options or {}))

    def database(self) -> str | None:
        if self.db is not None:
            return self.db
        return "tuning.db" if Path("tuning.db").is_file() else None


_BUILT: dict[str, CompiledModel] = {}  # graph digest -> its build, for recompiles in this process


def tensorgen_backend(gm: Any, example_inputs: Sequence[Any], options: Mapping[str, Any] | None = None) -> Callable:
    """The TorchDynamo backend: a callable computing `gm` with tensorgen (see the module docstring).

    tensorgen compiles static shapes: a graph TorchDynamo made dynamic (after a call with new sizes) is compiled
    once per set of sizes it is called with, at its first call with them."""
    config = CompileOptions.of(options)
    if _trains(gm, example_inputs):
        if not config.fallback:
            return _refusal(TensorgenError(TRAINING))
        LOGGER.warning("tensorgen runs this graph in eager PyTorch: it computes gradients (tensorgen compiles "
                       "inference only; use model.eval() and torch.no_grad() to compile it)")
        return gm
    state = sorted(i for i, (node, x) in enumerate(zip(_placeholders(gm), example_inputs))
                   if _is_module_state(node, x))
    built: dict[tuple, tuple[tuple, Callable]] = {}  # sizes -> (the module state's versions, the build)

    def sizes(args: Sequence[Any]) -> tuple:
        return tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else int(a) for i, a in enumerate(args)
                     if i not in state)

    def build(args: Sequence[Any]) -> Callable:
        key, versions = sizes(args), tuple(_version(args[i]) for i in state)
        if key not in built or built[key][0] != versions:  # new sizes, or weights changed since (an optimizer step)
            built[key] = versions, _specialize(gm, args, set(state), config)
        return built[key][1]

    def run(*args: Any) -> Any:
        return build(args)(*args)

    if all(isinstance(x, torch.Tensor) for x in example_inputs):  # static: compile now, errors surface here
        try:
            build(example_inputs)
        except TensorgenError as err:  # an op it cannot compile, a model over the memory budget, ...
            return _refusal(err)
    return run


TRAINING = ("tensorgen compiles inference only: this graph runs with grad enabled and parameters or inputs that "
            "require grad, and its outputs would have no grad_fn (backward() would leave the gradients at zero); call "
            "the compiled model under torch.no_grad() (and model.eval()), or pass options={'fallback': True} to run "
            "such graphs in eager PyTorch")


def _refusal(err: TensorgenError) -> Callable:
    """The graph's stand-in when tensorgen refuses it (a model being trained, an op it cannot compile): raises `err`
    at the call. TorchDynamo wraps what a backend raises while compiling into its BackendCompilerFailed, dozens of
    lines around the reason; raised at the call, the caller gets the TensorgenError itself."""
    def refuse(*args: Any) -> Any:
        raise err

    return refuse


def _trains(gm: Any, example_inputs: Sequence[Any]) -> bool:
    """Whether autograd would record the graph: grad enabled and a tensor it reads (an input, or a parameter lifted
    to one or kept in the module) requires grad. TorchDynamo guards grad mode: under no_grad it compiles again."""
    if not torch.is_grad_enabled():
        return False
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    return any(t.requires_grad for t in [*tensors, *gm.parameters()])


def _version(t: torch.Tensor) -> tuple[int, int]:
    """A tensor's memory and in-place write counter (-1 for an inference-mode tensor, which has none): both change
    when its values may have (`mul_`, an optimizer step; `param.data = other` swaps the memory only)."""
    try:
        return t.data_ptr(), t._version
    except RuntimeError:
        return t.data_ptr(), -1


def _specialize(gm: Any, args: Sequence[Any], state: set[int], config: CompileOptions) -> Callable:
    """`gm` compiled for the sizes of `args` (sizes given as integers are bound in); a callable taking all of
    gm's inputs."""
    fixed = {i: a if i in state else int(a) for i, a in enumerate(args)
             if i in state or not isinstance(a, torch.Tensor)}
    bound = _Bound(gm, fixed, len(args))
    tensors = [a for i, a in enumerate(args) if i not in fixed]
    try:
        graph = import_torch(bound, tensors, name="torch_graph", traces=_traces(gm))
        run = _Compiled(compile_graph(graph, config), isinstance(_example_outputs(gm), (tuple, list)))
    except TensorgenError as e:
        if not config.fallback:
            raise
        LOGGER.warning("tensorgen compiles what it can of this graph and runs the rest in eager PyTorch: %s", e)
        try:
            run = _split(bound, tensors, config, _traces(gm))
        except TensorgenError as whole:  # not even split (torch.export cannot trace it): all of it in eager
            LOGGER.warning("tensorgen runs this graph in eager PyTorch: %s", whole)
            return gm
    return _Rebound(run, sorted(fixed), len(args))


class _Compiled(torch.nn.Module):
    """A built graph called with tensors: CPU float arrays are shared with NumPy both ways, without copies."""

    def __init__(self, model: CompiledModel, several: bool) -> None:
        super().__init__()
        self.model, self.several = model, several

    def forward(self, *args: torch.Tensor) -> Any:
        outputs = [torch.from_numpy(o) for o in self.model.run([_to_numpy(a) for a in args])]
        return tuple(outputs) if self.several else outputs[0]


class _Convertible(OperatorSupportBase):
    """The ATen calls the PyTorch frontend converts (and the getitems that pick their outputs)."""

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        return node.op == "call_function" and (node.target is operator.getitem or op_name(node.target) in CONVERTERS)


def _split(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], config: CompileOptions,
           traces: Mapping[str, str]) -> Any:
    """`module`'s Core ATen graph with its convertible parts compiled by tensorgen, the rest left to PyTorch."""
    split = CapabilityBasedPartitioner(export_module(module, example_inputs).module(), _Convertible(),
                                       allows_single_node_partition=True)
    fused = split.fuse_partitions(split.propose_partitions())
    for node in fused.graph.nodes:
        if node.op != "call_module" or not str(node.target).startswith("fused_"):  # the partitioner's names
            continue
        part = fused.get_submodule(node.target)
        constants = {i: operator.attrgetter(a.target)(fused)  # parameters, buffers and constants of the module
                     for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr"}
        examples = [torch.zeros(a.meta["val"].shape, dtype=a.meta["val"].dtype)
                    for i, a in enumerate(node.args) if i not in constants]
        several = isinstance(_example_outputs(part), (tuple, list))
        try:
            graph = import_torch(_Bound(part, constants, len(node.args)), examples, str(node.target), traces)
            compiled = _Compiled(compile_graph(graph, config), several)
        except TensorgenError as e:
            LOGGER.warning("tensorgen leaves %s to eager PyTorch: %s", node.target, e)
            continue
        fused.add_submodule(str(node.target), _Rebound(compiled, sorted(constants), len(node.args)))
    fused.recompile()
    return fused


class _Rebound(torch.nn.Module):
    """Drops the arguments at `constants` (module state or sizes, bound into the compiled graph) before calling
    `inner`."""

    def __init__(self, inner: Callable, constants: Sequence[int], n: int) -> None:
        super().__init__()
        dropped = set(constants)
        self.inner, self.keep = inner, [i for i in range(n) if i not in dropped]

    def forward(self, *args: torch.Tensor) -> Any:
        return self.inner(*(args[i] for i in self.keep))


def compile_graph(graph: Graph, config: CompileOptions = CompileOptions()) -> CompiledModel:
    """Tune (config.trials, less what the database holds) and build `graph`; the build is cached in-process by
    the graph's structure, weights and database."""
    graph = load_graph(graph)
    db_path = config.database()
    key = _digest(graph, config.target, db_path)
    tuned = _tune(graph, config, db_path) if config.trials else False
    if key not in _BUILT or tuned:
        from tensorgen.graph.backend.build import build_model

        db = SQLiteDatabase(db_path) if db_path is not None else None
        # the directory goes once the model is loaded: the library and the weights stay mapped (a process holds
        # no copy of its models' weights in the temp dir)
        try:
            with owned_tempdir("tensorgen_torch_") as out:
                _BUILT[key] = CompiledModel(build_model(graph, out, target=config.target, db=db))
        finally:
            if db is not None:
                db.close()
        if config.trials == 0 and all(k["schedule"] == "default" for k in _BUILT[key].manifest["kernels"]):
            _say_untuned(db_path)
    return _BUILT[key]


@functools.cache
def _say_untuned(db_path: str | None) -> None:
    """Once per process (per database): this build runs default programs, and how to tune them."""
    where = f"{db_path} has no records for it" if db_path else "no tuning database"
    LOGGER.warning("tensorgen: torch.compile runs default (untuned) programs (%s); to tune, pass options={'db': "
                   "'tuning.db', 'trials': 1000} (tuning takes minutes; the records are reused by later runs)", where)


def _tune(graph: Graph, config: CompileOptions, db_path: str | None) -> bool:
    """Spend what is left of `config.trials` on the graph's tasks (the records of its tasks count); whether it
    measured anything."""
    from tensorgen.graph.backend.tasks import extract_tasks
    from tensorgen.tuning.scheduler import TaskScheduler

    if db_path is None:
        raise TensorgenError("options: trials > 0 needs a database to keep what tuning finds: pass options={'db': "
                             "'tuning.db', ...}")
    tasks = extract_tasks(graph, config.target)
    with SQLiteDatabase(db_path) as db:
        done = sum(len(db.records(t.task.workload_key, str(t.task.target))) for t in tasks)
    left = config.trials - done
    if left <= 0:
        LOGGER.info("%s: %d records in %s already; no more tuning", graph.name, done, db_path)
        return False
    result = TaskScheduler.from_models({graph.name: tasks}).tune(left, db=db_path, progress=config.progress)
    return result.trials > 0


class _Bound(torch.nn.Module):
    """`gm` with some inputs bound (`fixed`: position -> a tensor of module state, kept as a buffer, or an integer
    size), called with the others; `n` inputs in all."""

    def __init__(self, gm: Any, fixed: Mapping[int, Any], n: int) -> None:
        super().__init__()
        self.gm, self.n = gm, n
        self.sizes = {i: x for i, x in fixed.items() if not isinstance(x, torch.Tensor)}
        self.tensors = sorted(i for i, x in fixed.items() if isinstance(x, torch.Tensor))
        for i in self.tensors:
            self.register_buffer(f"state_{i}", fixed[i].detach())

    def forward(self, *given: torch.Tensor) -> Any:
        rest = iter(given)
        bound = {**self.sizes, **{i: self.get_buffer(f"state_{i}") for i in self.tensors}}
        return self.gm(*(bound[i] if i in bound else next(rest) for i in range(self.n)))


def _traces(gm: Any) -> dict[str, str]:
    """The stack trace of each node of TorchDynamo's graph: the user's source lines."""
    return {n.name: n.meta["stack_trace"] for n in gm.graph.nodes if n.meta.get("stack_trace")}


def _placeholders(gm: Any) -> list[Any]:
    return [n for n in gm.graph.nodes if n.op == "placeholder"]


def _is_module_state(node: Any, example: Any) -> bool:
    """Whether a graph input is a parameter or buffer of the compiled module (TorchDynamo lifts them to inputs;
    its GraphArg names where each came from)."""
    if isinstance(example, torch.nn.Parameter):
        return True
    graph_arg = node.meta.get("grapharg")
    return graph_arg is not None and bool(_MODULE_STATE.search(graph_arg.source.name))


def _example_outputs(gm: Any) -> Any:
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    return output.args[0]


def _to_numpy(x: Any) -> np.ndarray:
    """A CPU tensor's data as an array (no copy when it is contiguous and needs no grad)."""
    return x.detach().cpu().contiguous().numpy()


def _digest(graph: Graph, target: str, db: str | None) -> str:
    h = hashlib.sha256(f"{target}|{db}|{graph.inputs}|{graph.outputs}".encode())
    for node in graph.nodes:
        h.update(f"{node.op}|{node.inputs}|{node.outputs}|{sorted(node.attrs.items(), key=str)}".encode())
    for name in sorted(graph.values):
        v = graph.values[name]
        h.update(f"{name}|{v.shape}|{v.dtype}".encode())
    for name in sorted(graph.constants):
        h.update(name.encode())
        h.update(np.ascontiguousarray(graph.constants[name]).tobytes())
    return h.hexdigest()
