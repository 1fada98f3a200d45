"""`--shape NAME=1x16` and `--inputs FILE.npz`: the inputs a model command builds, times or runs a model for."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorgen.errors import TensorgenError

if TYPE_CHECKING:
    import onnx

    from tensorgen.graph.ir import Graph

SHAPE_HELP = ("fix the symbolic dimensions of a model input, e.g. input_ids=1x64 (repeat it, or separate "
              "several with commas)")


def add_shape_arg(p: argparse.ArgumentParser) -> None:
    """The `--shape NAME=DIMS` option of a model command (repeatable)."""
    p.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS", help=SHAPE_HELP)


def add_input_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    """The `--shape` and `--inputs` options of a model command."""
    add_shape_arg(p)
    p.add_argument("--inputs", metavar="FILE.npz", required=required,
                   help="the model's inputs, one array per input name (np.savez(FILE, input_ids=ids, ...); "
                        "`tensorgen info MODEL` lists the names, shapes and types); they also fix symbolic "
                        "dimensions" + ("" if required else " (default: seeded random inputs)"))


def parse_input_shapes(texts: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """{name: shape} of `--shape` values such as 'input_ids=1x16' or 'a=1x16,b=1x16'."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        for item in (t.strip() for t in text.split(",")):
            name, sep, dims = item.rpartition("=")
            if not sep or not name.strip():
                raise TensorgenError(f"--shape {item!r} is not NAME=DIMS, e.g. --shape input_ids=1x16")
            try:
                shape = tuple(int(d) for d in dims.split("x")) if dims.strip() else ()
            except ValueError:
                raise TensorgenError(f"--shape {item!r}: {dims!r} is not dimensions such as 1x16") from None
            if name.strip() in shapes:
                raise TensorgenError(f"--shape gives input {name.strip()!r} twice")
            shapes[name.strip()] = shape
    return shapes


@dataclass(frozen=True)
class ModelInputs:
    """An ONNX model named on the command line with the inputs `--shape`/`--inputs` give it."""

    model: onnx.ModelProto
    shapes: dict[str, tuple[int, ...]]  # every input's static shape
    feed: dict[str, np.ndarray] | None  # the arrays of --inputs, checked against the model; None without it

    def graph(self) -> Graph:
        """The model's optimized graph at these input shapes."""
        from tensorgen.graph.load import load_graph

        return load_graph(self.model, input_shapes=self.shapes)


def model_inputs(model: str, batch: int, shape_texts: Sequence[str], inputs: str | None) -> ModelInputs:
    """The ONNX model `model` names (a zoo model built at `batch`), with the input shapes `--shape` values fix and
    the arrays of the `--inputs` file, checked."""
    from tensorgen.graph.frontend.onnx_inputs import fixed_inputs, load_npz
    from tensorgen.graph.load import onnx_model_of

    proto = onnx_model_of(model, batch=batch)
    shapes = parse_input_shapes(shape_texts)
    arrays = None if inputs is None else load_npz(inputs)
    return ModelInputs(proto, *fixed_inputs(proto, arrays, shapes, source=inputs or "--inputs"))
