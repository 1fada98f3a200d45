"""ConvNeXt and the Vision Transformer, laid out as their PyTorch modules export through torch.onnx (opset 17).

ConvNeXt follows facebookresearch/ConvNeXt (`downsample_layers`, `stages`, `dwconv`, `pwconv1`, `gamma`, ...)
with its channels-first LayerNorm written as torchvision's LayerNorm2d: Transpose to NHWC, LayerNormalization
over C, Transpose back. ViT follows HuggingFace's ViTForImageClassification with eager attention (separate
query/key/value linears, Div by sqrt(head size)). Each builder declares the image input "input" and
returns the logits [batch, 1000].
"""

from __future__ import annotations

import numpy as np

from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo.bert import gelu, layer_norm, linear
from tensorgen.graph.zoo.builder import OnnxBuilder, conv

CONVNEXT_DEPTHS = (3, 3, 9, 3)
LAYER_SCALE = (0.1, 0.5)  # per-channel gamma; the trained-from-scratch 1e-6 would hide the blocks from a test
CONVNEXT_EPS = 1e-6


def _head(b: OnnxBuilder, x: str, features: int, classes: int, name: str) -> str:
    """nn.Linear on a 2-D input: Gemm with the [out, in] weight and transB=1."""
    with b.scope(name):
        w = b.weight("weight", b.normal((classes, features), np.sqrt(1.0 / features)))
        bias = b.weight("bias", b.normal((classes,), 0.01))
        return b.op("Gemm", [x, w, bias], alpha=1.0, beta=1.0, transB=1)


def _layer_norm_2d(b: OnnxBuilder, x: str, channels: int) -> str:
    """LayerNorm over the channels of NCHW, as torchvision's LayerNorm2d exports: permute, LayerNorm, permute."""
    x = b.op("Transpose", [x], perm=[0, 2, 3, 1])
    x = layer_norm(b, x, channels, name="", eps=CONVNEXT_EPS)
    return b.op("Transpose", [x], perm=[0, 3, 1, 2])


def _convnext_block(b: OnnxBuilder, x: str, dim: int) -> str:
    """dwconv 7×7 → NHWC → LayerNorm → Linear 4C → GELU → Linear C → ×gamma → NCHW, plus the input."""
    with b.scope("dwconv"):
        y = conv(b, x, dim, dim, (7, 7), (1, 1), (3, 3), groups=dim, gain=1.0, bias=True)
    y = b.op("Transpose", [y], perm=[0, 2, 3, 1])
    y = layer_norm(b, y, dim, name="norm", eps=CONVNEXT_EPS)
    y = gelu(b, linear(b, "pwconv1", y, dim, 4 * dim))
    y = linear(b, "pwconv2", y, 4 * dim, dim)
    y = b.op("Mul", [b.weight("gamma", b.uniform((dim,), *LAYER_SCALE)), y])
    y = b.op("Transpose", [y], perm=[0, 3, 1, 2])
    return b.op("Add", [x, y])


def convnext_tiny(b: OnnxBuilder, batch: int, image_size: int, width: int) -> str:
    """ConvNeXt-T: stages of (3, 3, 9, 3) blocks at width × (1, 2, 4, 8) channels, 1/32 of the image at the end."""
    if image_size < 32:
        raise GraphError(f"convnext_tiny: image_size must be at least 32, got {image_size}")
    dims = [width * 2**i for i in range(4)]
    x = b.input("input", (batch, 3, image_size, image_size))
    for i, (dim, depth) in enumerate(zip(dims, CONVNEXT_DEPTHS)):
        with b.scope("downsample_layers"), b.scope(str(i)):
            if i == 0:  # stem: 4×4 patchify conv, then LayerNorm
                with b.scope("0"):
                    x = conv(b, x, 3, dim, (4, 4), (4, 4), (0, 0), gain=1.0, bias=True)
                with b.scope("1"):
                    x = _layer_norm_2d(b, x, dim)
            else:
                with b.scope("0"):
                    x = _layer_norm_2d(b, x, dims[i - 1])
                with b.scope("1"):
                    x = conv(b, x, dims[i - 1], dim, (2, 2), (2, 2), (0, 0), gain=1.0, bias=True)
        for j in range(depth):
            with b.scope("stages"), b.scope(str(i)), b.scope(str(j)):
                x = _convnext_block(b, x, dim)
    x = b.op("ReduceMean", [x], axes=[-2, -1], keepdims=0)  # x.mean([-2, -1])
    x = layer_norm(b, x, dims[-1], name="norm", eps=CONVNEXT_EPS)
    return _head(b, x, dims[-1], 1000, "head")


# ViT-S/16
VIT_HIDDEN, VIT_HEADS, VIT_PATCH = 384, 6, 16
VIT_EPS = 1e-12  # HuggingFace ViTConfig.layer_norm_eps


def _vit_attention(b: OnnxBuilder, x: str, batch: int, seq: int) -> str:
    """Eager ViTSelfAttention: q/k/v linears split into heads, softmax(q kᵀ / sqrt d) v, heads merged back."""
    head = VIT_HIDDEN // VIT_HEADS
    split = [batch, seq, VIT_HEADS, head]

    def heads(name: str, perm: list[int]) -> str:
        y = b.op("Reshape", [linear(b, name, x, VIT_HIDDEN, VIT_HIDDEN), b.const(split, np.int64)])
        return b.op("Transpose", [y], perm=perm)

    q = heads("query", [0, 2, 1, 3])
    k = heads("key", [0, 2, 3, 1])  # permute then transpose(-1, -2), folded into one Transpose
    v = heads("value", [0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.const(np.sqrt(head))])
    probs = b.op("Softmax", [scores], axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return b.op("Reshape", [context, b.const([batch, seq, VIT_HIDDEN], np.int64)])


def _vit_layer(b: OnnxBuilder, x: str, batch: int, seq: int) -> str:
    """Pre-norm encoder layer: x + attention(LN x), then x + MLP(LN x)."""
    h = layer_norm(b, x, VIT_HIDDEN, name="layernorm_before", eps=VIT_EPS)
    with b.scope("attention"):
        with b.scope("attention"):
            h = _vit_attention(b, h, batch, seq)
        with b.scope("output"):
            h = linear(b, "dense", h, VIT_HIDDEN, VIT_HIDDEN)
    x = b.op("Add", [h, x])
    h = layer_norm(b, x, VIT_HIDDEN, name="layernorm_after", eps=VIT_EPS)
    with b.scope("intermediate"):
        h = gelu(b, linear(b, "dense", h, VIT_HIDDEN, 4 * VIT_HIDDEN))
    with b.scope("output"):
        return b.op("Add", [linear(b, "dense", h, 4 * VIT_HIDDEN, VIT_HIDDEN), x])


def vit_small(b: OnnxBuilder, batch: int, image_size: int, layers: int) -> str:
    """ViT-S/16: 16×16 patches, a class token, learned position embeddings (drawn for this image_size),
    `layers` encoder layers of hidden 384 and 6 heads, the class token's final LayerNorm into a 1000-way Linear."""
    if image_size % VIT_PATCH:
        raise GraphError(f"vit_small: image_size must be a multiple of {VIT_PATCH}, got {image_size}")
    grid = image_size // VIT_PATCH
    seq = grid * grid + 1
    x = b.input("input", (batch, 3, image_size, image_size))
    with b.scope("vit"), b.scope("embeddings"):
        cls_token = b.weight("cls_token", b.normal((1, 1, VIT_HIDDEN), 0.5))
        with b.scope("patch_embeddings"), b.scope("projection"):
            patch, p = (VIT_PATCH, VIT_PATCH), VIT_PATCH
            x = conv(b, x, 3, VIT_HIDDEN, patch, (p, p), (0, 0), gain=1.0, bias=True)
        x = b.op("Reshape", [x, b.const([batch, VIT_HIDDEN, seq - 1], np.int64)])  # flatten(2)
        x = b.op("Transpose", [x], perm=[0, 2, 1])
        cls_tokens = b.op("Expand", [cls_token, b.const([batch, 1, 1], np.int64)])
        x = b.op("Concat", [cls_tokens, x], axis=1)
        x = b.op("Add", [x, b.weight("position_embeddings", b.normal((1, seq, VIT_HIDDEN), 0.5))])
    for i in range(layers):
        with b.scope("vit"), b.scope("encoder"), b.scope(f"layer.{i}"):
            x = _vit_layer(b, x, batch, seq)
    with b.scope("vit"):
        x = layer_norm(b, x, VIT_HIDDEN, name="layernorm", eps=VIT_EPS)
    x = b.op("Gather", [x, b.const(0, np.int64)], axis=1)  # sequence_output[:, 0, :]
    return _head(b, x, VIT_HIDDEN, 1000, "classifier")
