"""The zoo's models as PyTorch nn.Modules with the same weights: the peer a PyTorch user would run.

Each module is written the way its family is written in PyTorch (torchvision's ResNet, r3d_18 and
MobileNetV2, pytorch/examples' DCGAN generator, HuggingFace's BertModel with SDPA attention,
facebookresearch's ConvNeXt, HuggingFace's ViTForImageClassification with SDPA attention) and
takes its weights from the initializers of the zoo's ONNX model, whose names are the modules'
state-dict keys (see zoo_builder). So the module and the ONNX file compute the same function, and
benchmarks time PyTorch running the model itself rather than an interpretation of tensorgen's graph
(graph/reference/torch_eval.py, which stays a correctness oracle).

    module, onnx_model = torch_model("resnet50", batch=1)   # eval mode, float32
    with torch.inference_mode():
        y = module(torch.from_numpy(x))
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import nn

from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo import MODELS, build_model
from tensorgen.graph.zoo.bert import BERT_BASE, BERT_TINY, BertConfig
from tensorgen.graph.zoo.modern import CONVNEXT_DEPTHS, CONVNEXT_EPS, VIT_EPS, VIT_HEADS, VIT_HIDDEN, VIT_PATCH

# ---------------------------------------------------------------------------------------------
# ResNets (torchvision.models.resnet, torchvision.models.video.r3d_18)


def _conv(dims: int, cin: int, cout: int, kernel, stride, padding, groups: int = 1) -> nn.Module:
    return (nn.Conv2d if dims == 2 else nn.Conv3d)(cin, cout, kernel, stride, padding, groups=groups, bias=False)


def _bn(dims: int, channels: int) -> nn.Module:
    return (nn.BatchNorm2d if dims == 2 else nn.BatchNorm3d)(channels)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, dims: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(dims, cin, planes, 3, stride, 1), _bn(dims, planes)
        self.conv2, self.bn2 = _conv(dims, planes, planes, 3, 1, 1), _bn(dims, planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, planes, stride, dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, dims: int):
        super().__init__()
        self.conv1, self.bn1 = _conv(dims, cin, planes, 1, 1, 0), _bn(dims, planes)
        self.conv2, self.bn2 = _conv(dims, planes, planes, 3, stride, 1), _bn(dims, planes)
        self.conv3, self.bn3 = _conv(dims, planes, planes * 4, 1, 1, 0), _bn(dims, planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(cin, planes * 4, stride, dims)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


def _downsample(cin: int, cout: int, stride: int, dims: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(_conv(dims, cin, cout, 1, stride, 0), _bn(dims, cout))


class ResNet(nn.Module):
    """torchvision's ResNet (dims=2) and r3d_18's VideoResNet (dims=3, `stem` instead of conv1/bn1/maxpool)."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: tuple[int, ...], classes: int, dims: int):
        super().__init__()
        if dims == 2:
            self.conv1, self.bn1 = _conv(2, 3, 64, 7, 2, 3), _bn(2, 64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        else:
            stem_conv = _conv(3, 3, 64, (3, 7, 7), (1, 2, 2), (1, 3, 3))
            self.stem = nn.Sequential(stem_conv, _bn(3, 64), nn.ReLU(inplace=True))
        cin = 64
        for i, (planes, blocks) in enumerate(zip((64, 128, 256, 512), layers)):
            stage = []
            for j in range(blocks):
                stage.append(block(cin, planes, 2 if i > 0 and j == 0 else 1, dims))
                cin = planes * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
        self.avgpool = (nn.AdaptiveAvgPool2d if dims == 2 else nn.AdaptiveAvgPool3d)(1)
        self.fc = nn.Linear(cin, classes)
        self.dims = dims

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x)))) if self.dims == 2 else self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


# ---------------------------------------------------------------------------------------------
# MobileNetV2 (torchvision.models.mobilenetv2)


def _conv_bn_relu6(cin: int, cout: int, kernel: int, stride: int, groups: int = 1) -> nn.Sequential:
    """torchvision's Conv2dNormActivation: 0 Conv, 1 BatchNorm, 2 ReLU6."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = [_conv_bn_relu6(cin, hidden, 1, 1)] if expand != 1 else []
        layers += [_conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # (expand ratio t, channels c, repeats n, first stride s)

    def __init__(self, classes: int = 1000):
        super().__init__()
        features: list[nn.Module] = [_conv_bn_relu6(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                features.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        features.append(_conv_bn_relu6(cin, 1280, 1, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ---------------------------------------------------------------------------------------------
# DCGAN generator (pytorch/examples dcgan)


class Generator(nn.Module):
    def __init__(self, image_size: int, nz: int = 100, ngf: int = 64):
        super().__init__()
        hidden = int(math.log2(image_size)) - 2
        widths = [nz] + [ngf * 2**i for i in reversed(range(hidden))]
        layers: list[nn.Module] = []
        for i, (cin, cout) in enumerate(zip(widths, widths[1:])):
            layers += [nn.ConvTranspose2d(cin, cout, 4, 1 if i == 0 else 2, 0 if i == 0 else 1, bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU(True)]
        layers += [nn.ConvTranspose2d(widths[-1], 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


# ---------------------------------------------------------------------------------------------
# BERT encoder (transformers.BertModel without the pooler, SDPA attention)


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.heads = cfg.heads
        self.query, self.key, self.value = (nn.Linear(cfg.hidden, cfg.hidden) for _ in range(3))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, width // self.heads).transpose(1, 2)

        context = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                                 attn_mask=mask)
        return context.transpose(1, 2).reshape(b, s, width)


class BertOutput(nn.Module):
    """dense -> + residual -> LayerNorm (BertSelfOutput and BertOutput)."""

    def __init__(self, fan_in: int, hidden: int):
        super().__init__()
        self.dense = nn.Linear(fan_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertOutput(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg.intermediate, cfg.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class BertEmbeddings(nn.Module):
    """Word embeddings plus the position and token-type embeddings of the exported sequence (the zoo's
    ONNX holds those as the constants the exporter folded them into)."""

    def __init__(self, cfg: BertConfig, seq_len: int):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.register_buffer("token_type_embeddings", torch.zeros(1, seq_len, cfg.hidden))
        self.register_buffer("position_embeddings", torch.zeros(1, seq_len, cfg.hidden))
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=1e-12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.word_embeddings(ids) + self.token_type_embeddings + self.position_embeddings)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.layers))


class BertModel(nn.Module):
    def __init__(self, cfg: BertConfig, seq_len: int):
        super().__init__()
        self.embeddings = BertEmbeddings(cfg, seq_len)
        self.encoder = BertEncoder(cfg)
        self.register_buffer("extended_attention_mask", torch.zeros(1, 1, 1, seq_len))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(ids)
        for layer in self.encoder.layer:
            x = layer(x, self.extended_attention_mask)
        return x


# ---------------------------------------------------------------------------------------------
# ConvNeXt (facebookresearch/ConvNeXt, channels-first LayerNorm as torchvision's LayerNorm2d)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of NCHW: permute to NHWC, normalize the last axis, permute back."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=CONVNEXT_EPS)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, width: int, depths: tuple[int, ...] = CONVNEXT_DEPTHS, classes: int = 1000):
        super().__init__()
        dims = [width * 2**i for i in range(4)]
        stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=CONVNEXT_EPS))
        self.downsample_layers = nn.ModuleList(
            [stem] + [nn.Sequential(LayerNorm2d(dims[i], eps=CONVNEXT_EPS), nn.Conv2d(dims[i], dims[i + 1], 2, 2))
                      for i in range(3)])
        self.stages = nn.ModuleList(nn.Sequential(*(ConvNeXtBlock(d) for _ in range(n))) for d, n in zip(dims, depths))
        self.norm = nn.LayerNorm(dims[-1], eps=CONVNEXT_EPS)
        self.head = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for downsample, stage in zip(self.downsample_layers, self.stages):
            x = stage(downsample(x))
        return self.head(self.norm(x.mean([-2, -1])))


# ---------------------------------------------------------------------------------------------
# ViT (transformers.ViTForImageClassification, SDPA attention)


class ViTSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = (nn.Linear(VIT_HIDDEN, VIT_HIDDEN) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, width = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, VIT_HEADS, width // VIT_HEADS).transpose(1, 2)

        context = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)))
        return context.transpose(1, 2).reshape(b, s, width)


class ViTSelfOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(VIT_HIDDEN, VIT_HIDDEN)


class ViTAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention, self.output = ViTSelfAttention(), ViTSelfOutput()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output.dense(self.attention(x))


class ViTIntermediate(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(VIT_HIDDEN, 4 * VIT_HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class ViTOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(4 * VIT_HIDDEN, VIT_HIDDEN)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.dense(h) + residual


class ViTLayer(nn.Module):
    """Pre-norm: x + attention(layernorm_before x), then x + output(intermediate(layernorm_after x))."""

    def __init__(self):
        super().__init__()
        self.attention = ViTAttention()
        self.intermediate = ViTIntermediate()
        self.output = ViTOutput()
        self.layernorm_before = nn.LayerNorm(VIT_HIDDEN, eps=VIT_EPS)
        self.layernorm_after = nn.LayerNorm(VIT_HIDDEN, eps=VIT_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.layernorm_before(x))
        return self.output(self.intermediate(self.layernorm_after(x)), x)


class ViTPatchEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.projection = nn.Conv2d(3, VIT_HIDDEN, VIT_PATCH, VIT_PATCH)


class ViTEmbeddings(nn.Module):
    def __init__(self, image_size: int):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, VIT_HIDDEN))
        self.patch_embeddings = ViTPatchEmbeddings()
        self.position_embeddings = nn.Parameter(torch.zeros(1, (image_size // VIT_PATCH) ** 2 + 1, VIT_HIDDEN))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        return x + self.position_embeddings


class ViTEncoder(nn.Module):
    def __init__(self, layers: int):
        super().__init__()
        self.layer = nn.ModuleList(ViTLayer() for _ in range(layers))


class ViTModel(nn.Module):
    def __init__(self, image_size: int, layers: int):
        super().__init__()
        self.embeddings = ViTEmbeddings(image_size)
        self.encoder = ViTEncoder(layers)
        self.layernorm = nn.LayerNorm(VIT_HIDDEN, eps=VIT_EPS)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixels)
        for layer in self.encoder.layer:
            x = layer(x)
        return self.layernorm(x)


class ViTForImageClassification(nn.Module):
    def __init__(self, image_size: int, layers: int, classes: int = 1000):
        super().__init__()
        self.vit = ViTModel(image_size, layers)
        self.classifier = nn.Linear(VIT_HIDDEN, classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.vit(pixels)[:, 0, :])


# ---------------------------------------------------------------------------------------------


def _bert(cfg: BertConfig) -> Callable[..., nn.Module]:
    return lambda seq_len: BertModel(cfg, seq_len)


MODULES: dict[str, Callable[..., nn.Module]] = {
    "resnet18": lambda image_size: ResNet(BasicBlock, (2, 2, 2, 2), 1000, dims=2),
    "resnet50": lambda image_size: ResNet(Bottleneck, (3, 4, 6, 3), 1000, dims=2),
    "mobilenet_v2": lambda image_size: MobileNetV2(),
    "resnet3d_18": lambda frames, image_size: ResNet(BasicBlock, (2, 2, 2, 2), 400, dims=3),
    "dcgan": lambda image_size: Generator(image_size),
    "bert_base": _bert(BERT_BASE),
    "bert_tiny": _bert(BERT_TINY),
    "convnext_tiny": lambda image_size, width: ConvNeXt(width),
    "vit_small": lambda image_size, layers: ViTForImageClassification(image_size, layers),
}  # each takes the zoo model's options (zoo.MODELS[name].options)


def state_dict_of(module: nn.Module, model: onnx.ModelProto) -> dict[str, torch.Tensor]:
    """The ONNX initializers as `module`'s state dict: nn.Linear weights that the ONNX model multiplies by with
    MatMul are stored transposed (W^T, as torch.onnx exports a Linear on a 3-D or 4-D input; a 2-D input's
    Gemm keeps W); BatchNorm's step counter is not a weight."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    expected = module.state_dict()
    keys = {k for k in expected if not k.endswith("num_batches_tracked")}
    if keys != set(weights):
        raise GraphError(f"{model.graph.name}: the torch module and the ONNX model disagree on the weights: "
                         f"module only {sorted(keys - set(weights))[:5]}, ONNX only {sorted(set(weights) - keys)[:5]}")
    linears = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.Linear)}
    transposed = linears & {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    out = {}
    for key, array in weights.items():
        shape = tuple(expected[key].shape)
        if key in transposed:
            array = array.T
        if array.shape != shape:
            raise GraphError(f"{model.graph.name}: weight {key} is {array.shape} in ONNX, {shape} in the module")
        out[key] = torch.from_numpy(np.array(array, dtype=np.float32, order="C"))  # a writable copy
    return out


def torch_model(name: str, batch: int = 1, seed: int = 0, **options: int) -> tuple[nn.Module, onnx.ModelProto]:
    """Zoo model `name` as an eval-mode nn.Module, with the weights of `zoo.build_model(name, batch, seed,
    **options)`, which is returned beside it (the same function for ONNX Runtime and tensorgen)."""
    model = build_model(name, batch, seed, **options)
    module = MODULES[name](**{**MODELS[name].options, **options})
    module.load_state_dict(state_dict_of(module, model), strict=False)  # strict but for the BN step counters
    return module.eval(), model
