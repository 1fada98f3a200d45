"""Import an ONNX model as a tensorgen Graph: static shapes everywhere, constants folded, every op
normalized to the contract in tensorgen.graph.ir (see onnx_normalize for the per-op rules).

Nodes are imported one at a time, in order. A node whose inputs are all constants is evaluated by
onnx.reference and disappears (so are Shape nodes, since every shape is static); any other node gets
its output shapes from ONNX shape inference on that one node, with its constant inputs given by
value, and is then normalized. This is what folds the Shape→Gather→Concat→Reshape chains of
exported models: by the time the Reshape is reached, its shape input is a constant.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, helper, inliner, numpy_helper, version_converter

from tensorgen.graph.frontend.half import compute_in_float32
from tensorgen.graph.frontend.normalize import CONST_INPUTS, ImportState, OnnxNode, unique_name
from tensorgen.graph.frontend.normalize_more import eye_like
from tensorgen.graph.frontend.normalizers import NORMALIZERS
from tensorgen.graph.frontend.onnx_eval import evaluate, infer_outputs, np_dtype
from tensorgen.graph.frontend.onnx_export import export_onnx
from tensorgen.graph.frontend.onnx_quantized import QUANTIZED_OPS, is_quantized, quantized_in_float
from tensorgen.graph.ir import Graph, GraphError, Node, Value
from tensorgen.hardware import check_memory_budget, format_bytes

__all__ = ["FOLD_ONLY_OPS", "GRAPH_OPS", "OPSETS", "SUPPORTED_OPS", "export_onnx", "import_onnx", "read_onnx"]

OPSETS = range(13, 22)
# ops that never survive import: Constant and Shape always fold, ConstantOfShape must (else GraphError)
_ALWAYS_FOLDED = frozenset({"Constant", "Shape", "ConstantOfShape", "EyeLike"})
SUPPORTED_OPS: frozenset[str] = frozenset(NORMALIZERS) | _ALWAYS_FOLDED
# ops that may appear in an imported Graph (Dropout becomes Identity)
GRAPH_OPS: frozenset[str] = frozenset(NORMALIZERS) - {"Dropout"}
# accepted only when all their inputs are constant, so they fold away (mask and shape arithmetic)
FOLD_ONLY_OPS: frozenset[str] = frozenset({
    "Size", "Range",
})
# outputs after the first that must be unused (what they would hold)
_ITEMSIZE = {t: np.dtype(helper.tensor_dtype_to_np_dtype(t)).itemsize for t in onnx.TensorProto.DataType.values()
             if t not in (onnx.TensorProto.UNDEFINED, onnx.TensorProto.STRING)}
_FIRST_OUTPUT_ONLY = {"Dropout": "the dropout mask", "BatchNormalization": "training statistics",
                      "MaxPool": "Indices"}
# ops folded from their inputs' static shapes alone, even when the inputs' data are not constant
_STATIC_FOLDS = {
    "Shape": lambda x, attrs: np.array(x.shape[attrs.get("start", 0):attrs.get("end")], dtype=np.int64),
    "Size": lambda x, attrs: np.array(int(np.prod(x.shape, dtype=np.int64)), dtype=np.int64),
    "EyeLike": eye_like,
}


def import_onnx(model: onnx.ModelProto | str | os.PathLike,
                input_shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Import `model` (a ModelProto or a path to a .onnx file) as a statically shaped, normalized Graph.

    `input_shapes` fixes the shapes of graph inputs, e.g. {"input": (1, 3, 224, 224)} for a model
    exported with a dynamic batch dimension.
    """
    model, source = _load(model)
    if model.functions:
        model = inliner.inline_local_functions(model)
    model, opset = _at_a_known_opset(model, source)
    if is_quantized(model):
        model = quantized_in_float(model)
    g = model.graph
    if not g.node or not g.output:
        raise GraphError(f"{source} has an empty graph ({len(g.node)} nodes, {len(g.output)} outputs)")
    _check_ops(g, source)
    state = ImportState({}, {})
    inputs = _graph_inputs(g, state, dict(input_shapes or {}), source)
    state.used = {x for p in g.node for x in p.input} | {o.name for o in g.output}
    producer = _producers(g, state, source)
    nodes: list[Node] = []
    taken: set[str] = set()
    for i, proto in enumerate(g.node):
        name = unique_name(_sanitize(proto.name) or f"{proto.op_type.lower()}_{i}", taken)
        label = f"node {proto.name or name!r} ({proto.op_type})"
        for x in proto.input:
            if x and x not in state.values and x in producer:
                raise GraphError(f"{label} reads {x!r} before {producer[x]} computes it: the graph has a cycle "
                                 "or its nodes are not in topological order")
        try:
            node = _import_node(proto, name, label, opset, state)
        except GraphError:
            raise
        except Exception as e:  # a malformed node that shape inference let through
            raise GraphError(f"{label}: cannot be imported: {type(e).__name__}: {e}") from e
        nodes.extend(_named_apart(node, name, taken))
    outputs = [o.name for o in g.output]
    # keep the constants and values something reads or returns; folded intermediates go
    live = {*inputs, *outputs, *(x for n in nodes for x in (*n.inputs, *n.outputs) if x)}
    graph = Graph(g.name or "model", inputs, outputs, nodes, {k: v for k, v in state.values.items() if k in live},
                  {k: v for k, v in state.constants.items() if k in live})
    graph = compute_in_float32(graph)
    graph.validate()
    return graph


def _load(model: onnx.ModelProto | str | os.PathLike) -> tuple[onnx.ModelProto, str]:
    if isinstance(model, onnx.ModelProto):
        return model, f"model {model.graph.name or '(unnamed)'!r}"
    return read_onnx(model), f"ONNX file '{model}'"


def read_onnx(path: str | os.PathLike) -> onnx.ModelProto:
    """The model in the .onnx file at `path`, its external data loaded once each tensor's file is known to lie
    in the model's folder and to hold what the tensor declares; GraphError (one line) for anything else."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"ONNX file '{path}' does not exist")
    size = path.stat().st_size  # read whole, then parsed: twice in memory, then the model and its arrays
    check_memory_budget(2 * size, f"ONNX file '{path}' takes {format_bytes(2 * size)} to import (twice its size)")
    try:
        loaded = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf decode errors
        raise GraphError(f"ONNX file '{path}' cannot be read: {type(e).__name__}: {_one_line(e)}") from None
    if not loaded.opset_import and not loaded.graph.node:
        raise GraphError(f"ONNX file '{path}' is not an ONNX model (no graph, no opset)")
    external = [t for t in _tensors(loaded.graph) if t.data_location == onnx.TensorProto.EXTERNAL]
    for t in external:
        _check_external(t, path)
    if external:
        try:
            external_data_helper.load_external_data_for_model(loaded, str(path.parent))
        except Exception as e:
            raise GraphError(f"ONNX file '{path}': external data cannot be read: {_one_line(e)}") from None
    return loaded


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split())


def _tensors(g: onnx.GraphProto) -> list[onnx.TensorProto]:
    """The initializers and Constant values of `g` (subgraphs are refused as unsupported ops anyway)."""
    attrs = [a.t for node in g.node for a in node.attribute if a.type == onnx.AttributeProto.TENSOR]
    return [*g.initializer, *attrs]


def _check_external(t: onnx.TensorProto, path: Path) -> None:
    info = external_data_helper.ExternalDataInfo(t)
    what = f"ONNX file '{path}': tensor {t.name!r} keeps its data in {info.location!r}"
    folder = path.parent.resolve()
    file = (folder / info.location).resolve()
    if not info.location or Path(info.location).is_absolute() or not file.is_relative_to(folder):
        raise GraphError(f"{what}, outside the model's folder {folder}")
    if not file.is_file():
        raise GraphError(f"{what}, which does not exist")
    declared = math.prod(t.dims) * _ITEMSIZE.get(t.data_type, 1)
    check_memory_budget(declared, f"{what}: it declares {format_bytes(declared)}")
    offset, size = info.offset or 0, file.stat().st_size
    length = info.length or size - offset
    if length != declared or offset + length > size:
        raise GraphError(f"{what} at offset {offset}, length {length}: the file holds {size} bytes and the tensor "
                         f"needs {declared}")


def _producers(g: onnx.GraphProto, state: ImportState, source: str) -> dict[str, str]:
    """Which node computes each value; GraphError if two do, or one overwrites an input or initializer."""
    producer: dict[str, str] = {}
    for i, p in enumerate(g.node):
        label = f"node {p.name or f'{p.op_type.lower()}_{i}'!r} ({p.op_type})"
        for out in p.output:
            if out and (out in producer or out in state.values):
                other = producer.get(out, "a graph input or initializer")
                raise GraphError(f"{source}: {label} computes {out!r}, which {other} already defines "
                                 "(ONNX names every value once)")
            producer[out] = label
    return producer


def _at_a_known_opset(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, int]:
    """The model and its default-domain opset; an opset older than OPSETS is upgraded to the first of them by
    ONNX's version converter (Upsample becomes Resize, attributes become inputs), as its error message used to
    ask users to do by hand; a newer one is read at the last of them when the model is valid there (see
    _at_the_last_opset)."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise GraphError(f"{source} imports no opset of the default ONNX domain")
    known = f"tensorgen imports opsets {OPSETS[0]}–{OPSETS[-1]}"
    if versions[0] > OPSETS[-1]:
        return _at_the_last_opset(model, versions[0], source, known), OPSETS[-1]
    if versions[0] < OPSETS[0]:
        try:
            model = version_converter.convert_version(model, OPSETS[0])
        except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError, ValidationError, ...
            raise GraphError(f"{source} uses ONNX opset {versions[0]}; {known}, and ONNX's version converter "
                             f"cannot upgrade it: {type(e).__name__}: {_one_line(e)[:300]}") from None
        return model, OPSETS[0]
    return model, versions[0]


def _at_the_last_opset(model: onnx.ModelProto, version: int, source: str, known: str) -> onnx.ModelProto:
    """`model`, written at `version` (past OPSETS), as the same model at the last of OPSETS. The ops that changed
    after it mostly took new element types (bfloat16 in 22, 4-bit types in 23-25) or attributes; a model that uses
    none of them is valid there, ONNX's checker with strict shape inference says so, and means the same. Two ops
    changed meaning: from 22 a pool with ceil_mode=1 drops a last window that starts in the padding, which
    ONNX's shape inference at 21 keeps; such a pool is refused rather than read the old way."""
    if version > onnx.defs.onnx_opset_version():
        raise GraphError(f"{source} uses ONNX opset {version}; {known}, and this onnx package knows opsets up to "
                         f"{onnx.defs.onnx_opset_version()}, so what its ops mean there is unknown")
    pools = [n.name or n.op_type for n in model.graph.node if n.op_type in ("MaxPool", "AveragePool")
             and any(a.name == "ceil_mode" and a.i for a in n.attribute)]
    if pools:
        raise GraphError(f"{source} uses ONNX opset {version}; {known}, and its pool {pools[0]!r} has ceil_mode=1, "
                         f"whose output size changed in opset 22")
    lower = onnx.ModelProto()
    lower.CopyFrom(model)
    for entry in lower.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = OPSETS[-1]
    checked = onnx.ModelProto()  # without the values it declares but gives no type (exporters leave some)
    checked.CopyFrom(lower)
    for declared in (checked.graph.output, checked.graph.value_info):
        kept = [vi for vi in declared if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type]
        del declared[:]
        declared.extend(kept)
    try:
        onnx.checker.check_model(checked, full_check=True)
    except Exception as e:  # noqa: BLE001 - ValidationError, InferenceError, or a model past the 2 GB protobuf limit
        raise GraphError(f"{source} uses ONNX opset {version}; {known}, and it is not the same model at opset "
                         f"{OPSETS[-1]}: {_one_line(e)[:300]}") from None
    return lower


def _has_subgraph(p: onnx.NodeProto) -> bool:
    """Whether `p` has a graph attribute (If, Loop, Scan), which may read values of the outer graph."""
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in p.attribute)


def _check_ops(g: onnx.GraphProto, source: str) -> None:
    """Raise one GraphError listing every unsupported op (first node of each, and how many more). Any ONNX op whose
    inputs are all constants is folded at import, so only the others count (an op with a subgraph always does:
    its subgraph may read run-time values of the outer graph)."""
    bad: dict[tuple[str, str], list[str]] = {}
    constant = {t.name for t in g.initializer} | {""}
    for i, p in enumerate(g.node):
        if p.domain not in ("", "ai.onnx"):
            reason = f"op of domain {p.domain!r} is unsupported (only the default ONNX domain)"
        elif p.op_type in _STATIC_FOLDS or (all(x in constant for x in p.input) and not _has_subgraph(p)):
            constant.update(p.output)
            continue
        elif p.op_type in QUANTIZED_OPS:  # what onnx_quantized could not compute on a float grid
            reason = ("its integers are read by an op that is not a quantized one or returned (tensorgen computes "
                      "quantized values in float and has no 8-bit tensors)")
        elif p.op_type not in SUPPORTED_OPS | FOLD_ONLY_OPS:
            reason = "unsupported op"
        else:
            continue
        bad.setdefault((p.domain, p.op_type), [reason]).append(p.name or f"{p.op_type.lower()}_{i}")
    if not bad:
        return
    found = []
    for (domain, op), (reason, first, *more) in bad.items():
        extra = f" (and {len(more)} more {op} nodes)" if more else ""
        found.append(f"node {first!r} ({f'{domain}.' if domain else ''}{op}): {reason}{extra}")
    supported = f"supported: {', '.join(sorted(SUPPORTED_OPS))}; only when folded: {', '.join(sorted(FOLD_ONLY_OPS))}"
    raise GraphError(f"{source} has unsupported ops: " + "; ".join(found) + "; " + supported)


def _graph_inputs(g: onnx.GraphProto, state: ImportState, overrides: dict[str, Sequence[int]],
                  source: str) -> list[str]:
    """Initializers become constants; the other graph inputs get static Values (overrides applied)."""
    for t in g.initializer:
        if t.data_type in _ITEMSIZE:
            need = math.prod(t.dims) * _ITEMSIZE[t.data_type]
            check_memory_budget(need, f"{source}: initializer {t.name!r} declares {format_bytes(need)}")
        try:
            array = numpy_helper.to_array(t)
        except Exception as e:
            raise GraphError(f"{source}: initializer {t.name!r} cannot be read: {type(e).__name__}: {e}") from None
        state.constants[t.name] = array
        state.values[t.name] = Value(t.name, tuple(array.shape), array.dtype.name)
    inputs = [vi for vi in g.input if vi.name not in state.constants]
    unknown = set(overrides) - {vi.name for vi in inputs}
    if unknown:
        raise GraphError(f"input_shapes names {sorted(unknown)}, which are not graph inputs of {source} "
                         f"(inputs: {[vi.name for vi in inputs]})")
    for vi in inputs:
        state.values[vi.name] = _input_value(vi, overrides.get(vi.name))
    return [vi.name for vi in inputs]


def _input_value(vi: onnx.ValueInfoProto, override: Sequence[int] | None) -> Value:
    t = vi.type.tensor_type
    if not vi.type.HasField("tensor_type") or not t.elem_type:
        raise GraphError(f"graph input {vi.name!r} is not a typed tensor")
    if override is not None:
        if any(not isinstance(d, (int, np.integer)) or d < 0 for d in override):
            raise GraphError(f"input_shapes[{vi.name!r}] = {override} must be non-negative integers")
        return Value(vi.name, tuple(int(d) for d in override), np_dtype(t.elem_type))
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim)
    if not t.HasField("shape") or not all(isinstance(d, int) for d in dims):
        shown = dims if t.HasField("shape") else "unknown"
        raise GraphError(f"graph input {vi.name!r} has a dynamic shape {shown}; give it a static one with "
                         f"import_onnx(model, input_shapes={{{vi.name!r}: (...)}})")
    if any(d < 0 for d in dims):
        raise GraphError(f"graph input {vi.name!r} declares a negative dimension: shape {list(dims)}")
    return Value(vi.name, dims, np_dtype(t.elem_type))


def _attr(a: onnx.AttributeProto) -> Any:
    value = helper.get_attribute_value(a)
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, list):
        return tuple(v.decode() if isinstance(v, bytes) else v for v in value)
    return value


@functools.cache
def _schema_defaults(op: str, opset: int) -> dict[str, Any]:
    schema = onnx.defs.get_schema(op, opset, "")
    return {k: _attr(a.default_value) for k, a in schema.attributes.items() if a.default_value.type}


def _import_node(proto: onnx.NodeProto, name: str, label: str, opset: int,
                 state: ImportState) -> Node | list[Node] | None:
    """Fold `proto` into constants (returns None) or return its normalized Node."""
    for x in proto.input:
        if x and x not in state.values:
            raise GraphError(f"{label} reads {x!r}, which no earlier node, graph input or initializer defines")
    op, attrs = proto.op_type, {a.name: _attr(a) for a in proto.attribute}
    dynamic = [x for x in proto.input if x and x not in state.constants]
    if op in _STATIC_FOLDS:
        try:
            folded = {proto.output[0]: _STATIC_FOLDS[op](state.values[proto.input[0]], attrs)}
        except ValueError as e:
            raise GraphError(f"{label}: {e}") from None
    elif not dynamic:
        _check_fold_size(proto, label, opset, state)
        folded = evaluate(proto, label, opset, state.constants)
    elif op not in NORMALIZERS:
        raise GraphError(f"{label}: supported only when all its inputs are constants (it is folded at import), "
                         f"but {dynamic[0]!r} is computed at run time")
    else:
        return _normalize(proto, name, label, opset, attrs, state)
    for out, array in folded.items():
        state.constants[out] = array
        state.values[out] = Value(out, tuple(array.shape), array.dtype.name)
    return None


def _named_apart(normalized: Node | list[Node] | None, name: str, taken: set[str]) -> list[Node]:
    """The nodes a normalizer wrote for one ONNX node; the ones it named after that node's name made unique."""
    if normalized is None:
        return []
    if isinstance(normalized, Node):
        return [normalized]
    return [n if n.name == name else replace(n, name=unique_name(n.name, taken)) for n in normalized]


def _check_fold_size(proto: onnx.NodeProto, label: str, opset: int, state: ImportState) -> None:
    """Refuse to fold a node whose constant outputs would exceed the memory budget (a ConstantOfShape of
    [100000, 100000] is 40 GB), by the shapes inference gives them before anything is computed."""
    try:
        outs = infer_outputs(proto, label, opset, state.values, state.constants)
    except GraphError:  # inference cannot always see through a fold; evaluating it decides then
        return
    need = sum(math.prod(v.shape) * np.dtype(v.dtype).itemsize for v in outs.values())
    check_memory_budget(need, f"{label}: folding it makes constants of {format_bytes(need)}")


def _normalize(proto: onnx.NodeProto, name: str, label: str, opset: int, attrs: dict[str, Any],
               state: ImportState) -> Node | list[Node]:
    op, inputs = proto.op_type, list(proto.input)
    for i, role in CONST_INPUTS.get(op, {}).items():
        if i < len(inputs) and inputs[i] and inputs[i] not in state.constants:
            raise GraphError(f"{label}: input {inputs[i]!r} ({role}) must be a constant known at import time")
    outputs = list(proto.output)
    if op in _FIRST_OUTPUT_ONLY:
        for extra in outputs[1:]:
            if extra in state.used:
                raise GraphError(f"{label}: output {extra!r} ({_FIRST_OUTPUT_ONLY[op]}) is used; "
                                 "only the first output is supported")
        outputs = outputs[:1]
    try:
        attrs = {**_schema_defaults(op, opset), **attrs}
    except onnx.defs.SchemaError:
        raise GraphError(f"{label}: {op} is not defined in ONNX opset {opset}") from None
    single = onnx.NodeProto()
    single.CopyFrom(proto)
    del single.output[:]
    single.output.extend(outputs)
    state.values.update(infer_outputs(single, label, opset, state.values, state.constants))
    return NORMALIZERS[op](OnnxNode(name, label, op, inputs, outputs, attrs, state))


def _sanitize(name: str) -> str:
    """A C-identifier-friendly version of an ONNX node name ('/layer1/conv/Conv' -> 'layer1_conv_Conv')."""
    name = re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_")
    return f"n_{name}" if name[:1].isdigit() else name
