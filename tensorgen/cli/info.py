"""`tensorgen info MODEL`: what a model takes and returns (names, shapes, element types), so that a user can write
the .npz file `--inputs` reads, with an `np.savez` line to start from."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tensorgen.cli.args import examples, positive_int
from tensorgen.cli.inputs import add_shape_arg, parse_input_shapes
from tensorgen.errors import TensorgenError

NPZ = "inputs.npz"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `info` command to a `tensorgen` argument parser's subparsers."""
    p = subparsers.add_parser(
        "info", help="a model's inputs and outputs (names, shapes, types) and how to write its --inputs file",
        description="The inputs a model takes and the outputs it returns, by name, with their shapes and element "
                    "types: what `--inputs FILE.npz` must hold (one array per input name) and what `tensorgen run` "
                    "writes. A symbolic dimension is shown by its name; fix it with --shape to see every shape.",
        epilog=examples("tensorgen info bert_tiny",
                        "tensorgen info model.onnx --shape input_ids=1x64   # fix a symbolic dimension",
                        "tensorgen info resnet50 --batch 8"))
    p.add_argument("model", metavar="MODEL", help="a zoo name (see `tensorgen models`) or an .onnx file")
    p.add_argument("--batch", type=positive_int, default=1, metavar="N",
                   help="the batch size of a zoo model, its inputs' first dimension (default 1)")
    add_shape_arg(p)
    p.set_defaults(fn=_info)


@dataclass(frozen=True)
class Port:
    """An input or output as `info` prints it: `dims` hold a symbolic dimension's name where it is not fixed."""

    name: str
    dtype: str
    dims: tuple[int | str, ...]
    note: str = ""

    @property
    def declared(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.dims))}]"


def _rows(ports: Sequence[Port], width: Sequence[Port]) -> str:
    """`ports` as aligned `name  type[shape]  note` rows, as wide as the longest of `width`."""
    name_w = max(len(p.name) for p in width)
    type_w = max(len(p.declared) for p in width)
    return "\n".join(f"  {p.name:<{name_w}}  {p.declared:<{type_w}}  {p.note}".rstrip() for p in ports)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def _example_array(dtype: str, shape: tuple[int, ...], bound: int | None) -> str:
    """Python that makes an array of this type and shape, of values the model takes."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        return f"np.random.standard_normal({shape!r}).astype({dtype!r})"
    if kind == "b":
        return f"np.ones({shape!r}, dtype=bool)"
    if bound is not None:
        return f"np.random.randint(0, {bound}, {shape!r}).astype({dtype!r})"
    return f"np.zeros({shape!r}, dtype={dtype!r})"


def _elem_type(elem: int) -> str:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).name if elem else "?"


def savez_line(ports: Sequence[Port], shapes: Mapping[str, tuple[int, ...]], bounds: Mapping[str, int]) -> str:
    """An `np.savez` call that writes an inputs file for these inputs, at these shapes, with ids below `bounds`."""
    arrays = []
    for p in ports:
        shape = shapes[p.name]
        arrays.append(f"{p.name}={_example_array(p.dtype, shape, bounds.get(p.name))}" if p.name.isidentifier()
                      else f"**{{{p.name!r}: {_example_array(p.dtype, shape, bounds.get(p.name))}}}")
    return f"np.savez({NPZ!r}, {', '.join(arrays)})"


def _info(args: argparse.Namespace) -> int:
    from tensorgen.graph.frontend.onnx_inputs import (
        declared_dims,
        index_bounds,
        model_inputs,
        shape_text,
        static_shapes,
    )
    from tensorgen.graph.load import load_graph, onnx_model_of

    proto = onnx_model_of(args.model, batch=args.batch)
    given = parse_input_shapes(args.shape)
    declared = model_inputs(proto)
    symbolic = [s.name for s in declared if s.name not in given and not all(isinstance(d, int) for d in s.dims)]
    # a symbolic dimension left open takes, in the example, the value --shape gives the same name in another input,
    # else 1; static_shapes checks what --shape gives against the file
    known = {d: v for s in declared if s.name in given for d, v in zip(s.dims, given[s.name]) if isinstance(d, str)}
    static = static_shapes(proto, {**{s.name: tuple(d if isinstance(d, int) else known.get(d, 1) for d in s.dims)
                                      for s in declared if s.name in symbolic}, **given})
    bounds = index_bounds(proto, static)
    inputs = [Port(s.name, s.dtype.name, s.dims if s.name in symbolic else static[s.name],
                   f"ids in [0, {bounds[s.name]})" if s.name in bounds else "") for s in declared]
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) for t in proto.graph.initializer)
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    size = f"{weights / 1e6:.2f} M" if weights >= 1e6 else str(weights)
    print(f"{args.model}: ONNX opset {opset}, {_count(len(declared), 'input')}, "
          f"{_count(len(proto.graph.output), 'output')}, {size} weights")
    print(f"inputs (what --inputs {NPZ} holds: one array per name, of this type and shape):")
    failure = None
    if not symbolic:
        try:
            graph = load_graph(proto, input_shapes=static)  # its outputs are what `run` returns
        except TensorgenError as err:  # still worth listing what the model takes; the reason comes last
            failure = err
    if symbolic or failure:
        heading = "outputs, as the file declares them:"
        outputs = [Port(o.name, _elem_type(o.type.tensor_type.elem_type), declared_dims(o)) for o in proto.graph.output]
    else:
        heading = "outputs (what `tensorgen run` writes, by name):"
        outputs = [Port(name, graph.value(name).dtype, graph.value(name).shape) for name in graph.outputs]
    print(_rows(inputs, [*inputs, *outputs]))
    print(heading)
    print(_rows(outputs, [*inputs, *outputs]))
    if symbolic:
        fixes = " ".join(f"--shape {name}={shape_text(static[name])}" for name in symbolic)
        print(f"symbolic dimensions: fix them for tune, build, bench and run with {fixes} (or by the arrays of "
              "--inputs); `tensorgen info` with them shows every shape")
    print("an inputs file, in Python (your own values in place of these):")
    print(f"  import numpy as np; {savez_line(inputs, static, bounds)}")
    if failure is not None:  # no `run` line: tensorgen cannot run it
        raise failure
    batch = f" --batch {args.batch}" if args.batch != 1 else ""
    print(f"then: tensorgen run {args.model}{batch} --inputs {NPZ} -o outputs.npz   (the arrays fix the shapes)")
    return 0
