"""The built-in model zoo: standard architectures as ONNX models with seeded random weights.

Nothing is downloaded: every model is written op by op the way torch.onnx exports it (see
zoo_builder), so the frontend, fusion and task extraction see realistic graphs, and benchmarks can
compare against ONNX Runtime on the same file. `load_model` also takes a path to any .onnx file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError

from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo import bert, cnn, modern
from tensorgen.graph.zoo.builder import OnnxBuilder


@dataclass(frozen=True)
class ZooModel:
    """builder(OnnxBuilder, batch, **options) declares the inputs and returns the output value."""

    builder: Callable[..., str]
    description: str
    input_shapes: dict[str, tuple[int, ...]]  # at batch 1 with the default options
    options: dict[str, int]  # every option the builder takes, with its default


MODELS: dict[str, ZooModel] = {
    "resnet18": ZooModel(
        cnn.resnet18, "ResNet-18 (torchvision), 1000 ImageNet classes", {"input": (1, 3, 224, 224)},
        {"image_size": 224},
    ),
    "resnet50": ZooModel(
        cnn.resnet50, "ResNet-50 v1.5 (torchvision), bottleneck blocks, 1000 classes", {"input": (1, 3, 224, 224)},
        {"image_size": 224},
    ),
    "mobilenet_v2": ZooModel(
        cnn.mobilenet_v2, "MobileNet-V2 (torchvision): inverted residuals, depthwise convs, ReLU6 as Clip",
        {"input": (1, 3, 224, 224)}, {"image_size": 224},
    ),
    "resnet3d_18": ZooModel(
        cnn.resnet3d_18, "3D ResNet-18 (torchvision r3d_18) on video clips, 400 Kinetics classes",
        {"input": (1, 3, 16, 112, 112)}, {"frames": 16, "image_size": 112},
    ),
    "dcgan": ZooModel(
        cnn.dcgan, "DCGAN generator: z(100) -> 64x64x3 image via ConvTranspose+BN+ReLU, Tanh",
        {"input": (1, 100, 1, 1)}, {"image_size": 64},
    ),
    "bert_base": ZooModel(
        partial(bert.bert, bert.BERT_BASE), "BERT-base encoder: 12 layers, hidden 768, 12 heads",
        {"input_ids": (1, 128)}, {"seq_len": 128},
    ),
    "bert_tiny": ZooModel(
        partial(bert.bert, bert.BERT_TINY), "BERT-tiny encoder: 2 layers, hidden 128, 2 heads",
        {"input_ids": (1, 128)}, {"seq_len": 128},
    ),
    "convnext_tiny": ZooModel(
        modern.convnext_tiny, "ConvNeXt-T: depthwise 7x7 + channels-last LayerNorm/MLP blocks (3,3,9,3), 1000 classes",
        {"input": (1, 3, 224, 224)}, {"image_size": 224, "width": 96},
    ),
    "vit_small": ZooModel(
        modern.vit_small, "ViT-S/16 (HuggingFace ViT): 12 pre-norm layers, hidden 384, 6 heads, 1000 classes",
        {"input": (1, 3, 224, 224)}, {"image_size": 224, "layers": 12},
    ),
}  # fmt: skip


def list_models() -> list[tuple[str, str]]:
    """(name, one-line description) of every zoo model."""
    return [(name, m.description) for name, m in MODELS.items()]


def _known() -> str:
    return ", ".join(MODELS)


def build_model(name: str, batch: int = 1, seed: int = 0, **options: int) -> onnx.ModelProto:
    """Build zoo model `name` with weights drawn from `seed`; options (image_size, seq_len, ...) per model."""
    entry = MODELS.get(name)
    if entry is None:
        raise GraphError(f"unknown zoo model {name!r}; known models: {_known()}")
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        raise GraphError(
            f"zoo model {name!r} has no option {', '.join(unknown)}; its options: {', '.join(entry.options)}"
        )
    settings = {**entry.options, **options}
    for key, value in {"batch": batch, **settings}.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise GraphError(f"zoo model {name!r}: {key} must be a positive integer, got {value!r}")
    builder = OnnxBuilder(name, seed)
    output = entry.builder(builder, batch, **settings)
    return builder.model(output, entry.description)


def load_model(name_or_path: str | os.PathLike, batch: int = 1, **options: int) -> onnx.ModelProto:
    """A zoo model by name, or the .onnx file at a path (which keeps its own shapes)."""
    if isinstance(name_or_path, str) and name_or_path in MODELS:
        return build_model(name_or_path, batch, **options)
    path = Path(name_or_path)
    if not path.is_file():
        raise GraphError(f"{str(name_or_path)!r} is neither a zoo model ({_known()}) nor an existing .onnx file")
    if batch != 1 or options:
        raise GraphError(f"batch and options apply to zoo models only; {path} keeps the shapes stored in it")
    try:
        return onnx.load(path)
    except (DecodeError, OSError) as e:
        raise GraphError(f"cannot read ONNX model {path}: {e}") from None

