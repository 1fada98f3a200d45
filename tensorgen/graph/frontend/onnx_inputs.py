"""The inputs of an ONNX model: their static shapes, a user's own arrays checked against them, and a seeded random
feed whose integer inputs stay in the range the model reads them in.

A symbolic dimension (`dim_param`) is fixed by the caller (`--shape input_ids=1x16`, `input_shapes=`) or by the
arrays the caller hands in. An integer input gets its range from the ops that index with it: a Gather or
GatherElements from a tensor of known shape, a OneHot of constant depth, reached through any chain of ops that pass
values on unchanged (Reshape, Squeeze, Unsqueeze, Flatten, Cast, Identity, Expand, Transpose, Slice, Concat, a
Gather's data, ...), as token ids reach an embedding table in exported transformers.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tensorgen.graph.ir import GraphError

# op -> the positions of its inputs whose values reach its outputs unchanged (None: all of them)
_CARRIES: dict[str, tuple[int, ...] | None] = {
    "Reshape": (0,), "Squeeze": (0,), "Unsqueeze": (0,), "Flatten": (0,), "Cast": (0,), "CastLike": (0,),
    "Identity": (0,), "Dropout": (0,), "Expand": (0,), "Transpose": (0,), "Slice": (0,), "Split": (0,),
    "Tile": (0,), "Gather": (0,), "GatherElements": (0,), "GatherND": (0,), "Compress": (0,), "Concat": None,
    "Where": (1, 2), "ReduceMax": (0,), "ReduceMin": (0,),
}  # fmt: skip
_BOUNDING = "a Gather, GatherElements or OneHot, through Reshape, Squeeze, Unsqueeze, Cast, Slice, Concat, ..."


@dataclass(frozen=True)
class ModelInput:
    """A graph input of an ONNX model as the file declares it: a str dimension is symbolic ('?' if unnamed)."""

    name: str
    dims: tuple[int | str, ...]
    dtype: np.dtype

    @property
    def declared(self) -> str:
        return f"{self.dtype.name}[{', '.join(map(str, self.dims))}]"


def shape_text(shape: Sequence[int | str]) -> str:
    """A shape the way `--shape` takes it: 1x16 (a scalar is the empty string)."""
    return "x".join(map(str, shape))


def declared_dims(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    """The dimensions a graph input or output declares: a str is a symbolic one ('?' if unnamed)."""
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in value.type.tensor_type.shape.dim)


def model_inputs(model: onnx.ModelProto) -> list[ModelInput]:
    """The graph inputs of `model` that are not initializers, in order."""
    weights = {t.name for t in model.graph.initializer}  # IR < 4 files list initializers among the inputs
    found = []
    for vi in model.graph.input:
        if vi.name in weights:
            continue
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.elem_type:
            raise GraphError(f"graph input {vi.name!r} is not a typed tensor")
        if not t.HasField("shape"):
            raise GraphError(f"graph input {vi.name!r} declares no shape; tensorgen needs at least its rank")
        dims = declared_dims(vi)
        if any(isinstance(d, int) and d < 0 for d in dims):
            raise GraphError(f"graph input {vi.name!r} declares a negative dimension: shape {list(dims)}")
        found.append(ModelInput(vi.name, dims, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))))
    return found


def _names(inputs: Sequence[ModelInput]) -> str:
    return ", ".join(f"{i.name} {i.declared}" for i in inputs)


def _check_shape(spec: ModelInput, shape: Sequence[int], what: str) -> tuple[int, ...]:
    """`shape` for `spec` when it has its rank and static dimensions, else GraphError naming the input."""
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in shape):
        raise GraphError(f"{what} gives input {spec.name!r} the shape {tuple(shape)}; dimensions are integers >= 0")
    if len(shape) != len(spec.dims) or any(isinstance(d, int) and d != s for d, s in zip(spec.dims, shape)):
        raise GraphError(f"{what} gives input {spec.name!r} the shape {shape_text(shape) or 'scalar'}, but the model "
                         f"declares {spec.declared}: only its symbolic dimensions can be chosen")
    return tuple(int(d) for d in shape)


def static_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None,
                  what: str = "--shape") -> dict[str, tuple[int, ...]]:
    """Every input's static shape: declared, or from `input_shapes` (which may only fix symbolic dimensions).
    A symbolic dimension left open is a GraphError that says how to fix it."""
    inputs = model_inputs(model)
    given = dict(input_shapes or {})
    unknown = sorted(set(given) - {i.name for i in inputs})
    if unknown:
        raise GraphError(f"{what} names {', '.join(map(repr, unknown))}, which the model does not take "
                         f"(its inputs: {_names(inputs)})")
    shapes = {}
    for spec in inputs:
        if spec.name in given:
            shapes[spec.name] = _check_shape(spec, given[spec.name], f"{what} {spec.name}")
        elif all(isinstance(d, int) for d in spec.dims):
            shapes[spec.name] = tuple(int(d) for d in spec.dims)
        else:
            example = shape_text([d if isinstance(d, int) else 1 for d in spec.dims])
            raise GraphError(f"input {spec.name!r} has a symbolic dimension {spec.declared}; fix it with "
                             f"--shape {spec.name}={example} (Python: input_shapes={{{spec.name!r}: (...)}}) or "
                             "hand in real inputs with --inputs FILE.npz")
    return shapes


def check_feed(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray],
               input_shapes: Mapping[str, Sequence[int]] | None = None,
               source: str = "the inputs") -> dict[str, np.ndarray]:
    """`arrays` (one per model input, by name) in the model's input order, once each has the declared dtype and a
    shape that agrees with the declared one and with `input_shapes`; else one GraphError naming the input."""
    inputs = model_inputs(model)
    extra = sorted(set(arrays) - {i.name for i in inputs})
    missing = [i.name for i in inputs if i.name not in arrays]
    if extra or missing:
        problem = (f"has no array {', '.join(map(repr, missing))}" if missing else
                   f"has {', '.join(map(repr, extra))}, which the model does not take")
        raise GraphError(f"{source} {problem} (the model's inputs: {_names(inputs)})")
    given = dict(input_shapes or {})
    feed = {}
    for spec in inputs:
        array = np.asarray(arrays[spec.name])
        if array.dtype != spec.dtype:
            raise GraphError(f"{source}: input {spec.name!r} is {array.dtype.name}, but the model takes "
                             f"{spec.declared}")
        shape = _check_shape(spec, array.shape, f"{source}")
        if spec.name in given and tuple(given[spec.name]) != shape:
            raise GraphError(f"{source}: input {spec.name!r} has the shape {shape_text(shape)}, but --shape says "
                             f"{shape_text(given[spec.name])}")
        feed[spec.name] = np.require(array, requirements="C")  # ascontiguousarray would make a 0-d array 1-d
    return feed


def load_npz(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an .npz file (np.savez) by name; GraphError (one line) if it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise GraphError(f"inputs file '{path}' does not exist")
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise GraphError(f"inputs file '{path}' holds one array, not named arrays; write it with "
                             "np.savez(path, input_name=array, ...)")
        with data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise GraphError(f"inputs file '{path}' is not an .npz of arrays: {' '.join(str(e).split())}") from None


def _constants(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The initializers and the values of Constant nodes, by name."""
    found = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            found.update((node.output[0], a.t) for a in node.attribute if a.name == "value")
    return found


def _known_dims(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """The static shapes the model states: its constants', its inputs' (`shapes`) and its fully static value_info."""
    dims = {}
    for vi in model.graph.value_info:
        declared = vi.type.tensor_type.shape.dim
        if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in declared):
            dims[vi.name] = tuple(d.dim_value for d in declared)
    dims.update({name: tuple(t.dims) for name, t in _constants(model).items()})
    return {**dims, **shapes}


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _bound(node: onnx.NodeProto, position: int, dims: Mapping[str, tuple[int, ...]],
           constants: Mapping[str, onnx.TensorProto]) -> int | None:
    """How many values an index read by input `position` of `node` may take, if the node says."""
    if node.op_type in ("Gather", "GatherElements") and position == 1 and node.input[0] in dims:
        table = dims[node.input[0]]
        return table[_attr(node, "axis", 0) % len(table)] if table else None
    if node.op_type == "OneHot" and position == 0 and len(node.input) > 1 and node.input[1] in constants:
        depth = numpy_helper.to_array(constants[node.input[1]])
        return int(depth.reshape(-1)[0]) if depth.size == 1 else None
    return None


def index_bounds(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """For each input of the model that indexes something, the number of values it may take ([0, bound)): the
    smallest bound of the ops it reaches through ops that pass values on unchanged."""
    constants = _constants(model)
    dims = _known_dims(model, shapes)
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, position))
    bounds = {}
    for start in shapes:
        seen, todo, found = {start}, [start], []
        while todo:
            for node, position in readers.get(todo.pop(), []):
                bound = _bound(node, position, dims, constants)
                if bound is not None:
                    found.append(bound)
                carried = _CARRIES.get(node.op_type, ())
                if carried is None or position in carried:
                    fresh = [out for out in node.output if out and out not in seen]
                    seen.update(fresh)
                    todo.extend(fresh)
        if found:
            bounds[start] = min(found)
    return bounds


def random_inputs(model: onnx.ModelProto, seed: int = 0,
                  input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """A seeded feed for every input (`input_shapes` fixes symbolic dimensions): N(0, 1) floats, integers in
    [0, bound) of what they index (index_bounds), bools (masks) true or false alike; GraphError saying how to
    pass real inputs for any other."""
    shapes = static_shapes(model, input_shapes)
    bounds = index_bounds(model, shapes)
    rng = np.random.default_rng(seed)
    feed = {}
    for spec in model_inputs(model):
        shape = shapes[spec.name]
        if np.issubdtype(spec.dtype, np.floating):
            feed[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype == np.bool_:
            feed[spec.name] = rng.random(shape) < 0.5
        elif np.issubdtype(spec.dtype, np.integer) and spec.name in bounds:
            feed[spec.name] = rng.integers(0, bounds[spec.name], shape).astype(spec.dtype)
        else:
            raise GraphError(f"input {spec.name!r} ({spec.declared}) is not float and no op says which values it "
                             f"takes ({_BOUNDING}); hand in real inputs with --inputs FILE.npz (one array per "
                             f"input, by name: np.savez(FILE, {spec.name}=...))")
    return feed


def fixed_inputs(model: onnx.ModelProto, arrays: Mapping[str, np.ndarray] | None = None,
                 input_shapes: Mapping[str, Sequence[int]] | None = None,
                 source: str = "the inputs") -> tuple[dict[str, tuple[int, ...]], dict[str, np.ndarray] | None]:
    """(every input's static shape, `arrays` checked by check_feed) when the caller hands in arrays, else (the
    shapes `input_shapes` fixes, None): the shapes to import the model at, before any input is drawn for it."""
    if arrays is None:
        return static_shapes(model, input_shapes), None
    feed = check_feed(model, arrays, input_shapes, source)
    return {name: array.shape for name, array in feed.items()}, feed
