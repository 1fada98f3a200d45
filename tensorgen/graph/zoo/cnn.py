"""Convolutional networks of the zoo, laid out as torchvision / pytorch-examples modules export.

Each builder takes an OnnxBuilder, the batch size and its options, declares the input "input", and
returns the value that becomes the output "output". Residual branches end in a BatchNorm with a damped
gamma so that activations do not double with every block of random weights.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo.builder import OnnxBuilder, batch_norm, classifier, conv_bn, relu

RESIDUAL_GAMMA = (0.3, 0.5)

Block = Callable[[OnnxBuilder, str, int, int, int, int], tuple[str, int]]


def _basic_block(b: OnnxBuilder, x: str, cin: int, planes: int, stride: int, dims: int) -> tuple[str, int]:
    """ResNet BasicBlock: 3×3 → 3×3, projection shortcut when the shape changes."""
    k3, one, s = (3,) * dims, (1,) * dims, (stride,) * dims
    y = relu(b, conv_bn(b, "conv1", "bn1", x, cin, planes, k3, s, one))
    y = conv_bn(b, "conv2", "bn2", y, planes, planes, k3, one, one, gamma=RESIDUAL_GAMMA)
    return _residual(b, x, y, cin, planes, stride, dims), planes


def _bottleneck(b: OnnxBuilder, x: str, cin: int, planes: int, stride: int, dims: int) -> tuple[str, int]:
    """ResNet-v1.5 Bottleneck: 1×1 → 3×3 (strided) → 1×1 ×4."""
    k3, one, s, zero = (3,) * dims, (1,) * dims, (stride,) * dims, (0,) * dims
    y = relu(b, conv_bn(b, "conv1", "bn1", x, cin, planes, one, one, zero))
    y = relu(b, conv_bn(b, "conv2", "bn2", y, planes, planes, k3, s, one))
    y = conv_bn(b, "conv3", "bn3", y, planes, planes * 4, one, one, zero, gamma=RESIDUAL_GAMMA)
    return _residual(b, x, y, cin, planes * 4, stride, dims), planes * 4


def _residual(b: OnnxBuilder, x: str, y: str, cin: int, cout: int, stride: int, dims: int) -> str:
    if stride != 1 or cin != cout:
        x = conv_bn(b, "downsample.0", "downsample.1", x, cin, cout, (1,) * dims, (stride,) * dims, (0,) * dims)
    return relu(b, b.op("Add", [y, x]))


def _stages(b: OnnxBuilder, x: str, cin: int, block: Block, layers: tuple[int, ...], dims: int) -> tuple[str, int]:
    """The four residual stages layer1..layer4 (64, 128, 256, 512 planes; stride 2 from layer2 on)."""
    for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
        for j in range(blocks):
            with b.scope(f"layer{i + 1}"), b.scope(str(j)):
                x, cin = block(b, x, cin, planes, 2 if i > 0 and j == 0 else 1, dims)
    return x, cin


def _resnet(block: Block, layers: tuple[int, ...]) -> Callable[[OnnxBuilder, int, int], str]:
    def build(b: OnnxBuilder, batch: int, image_size: int) -> str:
        x = b.input("input", (batch, 3, image_size, image_size))
        x = relu(b, conv_bn(b, "conv1", "bn1", x, 3, 64, (7, 7), (2, 2), (3, 3)))
        with b.scope("maxpool"):
            x = b.op("MaxPool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2])
        x, channels = _stages(b, x, 64, block, layers, dims=2)
        return classifier(b, x, channels, 1000)

    return build


resnet18 = _resnet(_basic_block, (2, 2, 2, 2))
resnet50 = _resnet(_bottleneck, (3, 4, 6, 3))


def resnet3d_18(b: OnnxBuilder, batch: int, frames: int, image_size: int) -> str:
    """torchvision r3d_18: a (3,7,7) stem without pooling, 3×3×3 BasicBlocks, Kinetics-400 head."""
    x = b.input("input", (batch, 3, frames, image_size, image_size))
    x = relu(b, conv_bn(b, "stem.0", "stem.1", x, 3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3)), "stem.2")
    x, channels = _stages(b, x, 64, _basic_block, (2, 2, 2, 2), dims=3)
    return classifier(b, x, channels, 400)


# MobileNet-V2: (expand ratio t, channels c, repeats n, first stride s), torchvision's table
_MOBILENET_V2 = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


def _relu6(b: OnnxBuilder, x: str) -> str:
    return b.op("Clip", [x, b.const(0.0), b.const(6.0)])


def _conv_bn_relu6(b: OnnxBuilder, x: str, cin: int, cout: int, k: int, stride: int, groups: int = 1) -> str:
    """torchvision's Conv2dNormActivation: children 0 (Conv), 1 (BN), 2 (ReLU6 → Clip)."""
    y = conv_bn(b, "0", "1", x, cin, cout, (k, k), (stride, stride), (k // 2, k // 2), groups=groups)
    with b.scope("2"):
        return _relu6(b, y)


def _inverted_residual(b: OnnxBuilder, x: str, cin: int, cout: int, stride: int, t: int) -> str:
    hidden, layer, y = cin * t, 0, x
    residual = stride == 1 and cin == cout
    if t != 1:
        with b.scope("conv.0"):
            y = _conv_bn_relu6(b, y, cin, hidden, 1, 1)
        layer = 1
    with b.scope(f"conv.{layer}"):
        y = _conv_bn_relu6(b, y, hidden, hidden, 3, stride, groups=hidden)
    gamma = RESIDUAL_GAMMA if residual else (0.8, 1.2)
    y = conv_bn(b, f"conv.{layer + 1}", f"conv.{layer + 2}", y, hidden, cout, (1, 1), (1, 1), (0, 0), gamma=gamma)
    return b.op("Add", [x, y]) if residual else y


def mobilenet_v2(b: OnnxBuilder, batch: int, image_size: int) -> str:
    x = b.input("input", (batch, 3, image_size, image_size))
    with b.scope("features.0"):
        x = _conv_bn_relu6(b, x, 3, 32, 3, 2)
    cin, index = 32, 1
    for t, c, n, s in _MOBILENET_V2:
        for i in range(n):
            with b.scope(f"features.{index}"):
                x = _inverted_residual(b, x, cin, c, s if i == 0 else 1, t)
            cin, index = c, index + 1
    with b.scope(f"features.{index}"):
        x = _conv_bn_relu6(b, x, cin, 1280, 1, 1)
    return classifier(b, x, 1280, 1000, name="classifier.1")


def _conv_transpose(b: OnnxBuilder, x: str, cin: int, cout: int, first: bool, gain: float) -> str:
    """A 4×4 ConvTranspose(bias=False): stride 1 on the 1×1 latent, else stride 2 (doubles the side)."""
    taps = cin if first else cin * 4  # inputs one output pixel sees: all of z, or a 2×2 window
    w = b.weight("weight", b.normal((cin, cout, 4, 4), np.sqrt(gain / taps)))
    stride, pad = (1, 0) if first else (2, 1)
    return b.op(
        "ConvTranspose", [x, w], dilations=[1, 1], group=1, kernel_shape=[4, 4], pads=[pad] * 4, strides=[stride] * 2
    )


def dcgan(b: OnnxBuilder, batch: int, image_size: int, nz: int = 100, ngf: int = 64) -> str:
    """The pytorch/examples DCGAN generator: z [batch, nz, 1, 1] → (ConvTranspose, BN, ReLU)×k → ConvTranspose, Tanh.

    The first ConvTranspose makes 4×4 and every later one doubles the side, so image_size is a power of two.
    """
    if image_size < 8 or image_size & (image_size - 1):
        raise GraphError(f"dcgan: image_size must be a power of two >= 8, got {image_size}")
    x = b.input("input", (batch, nz, 1, 1))
    hidden = int(np.log2(image_size)) - 2
    widths = [nz] + [ngf * 2**i for i in reversed(range(hidden))]
    for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
        with b.scope(f"main.{3 * i}"):
            x = _conv_transpose(b, x, cin, cout, first=i == 0, gain=2.0)
        with b.scope(f"main.{3 * i + 1}"):
            x = batch_norm(b, x, cout)
        x = relu(b, x, f"main.{3 * i + 2}")
    with b.scope(f"main.{3 * hidden}"):
        x = _conv_transpose(b, x, widths[-1], 3, first=False, gain=1.0)
    with b.scope(f"main.{3 * hidden + 1}"):
        return b.op("Tanh", [x])
