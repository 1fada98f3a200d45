"""BERT encoders as HuggingFace `BertModel` exports through torch.onnx (opset 17), without the pooler.

Input "input_ids" int64 [batch, seq]; output "output" = the last hidden state [batch, seq, hidden].
Position and token-type embeddings are constants the exporter folded (`position_ids` and all-zero
`token_type_ids` are buffers), added to the Gather of the word embeddings. The attention mask is a
constant too: additive [1, 1, 1, seq], 0 where a token is attended and -10000 on the last seq // 8
positions, as for a padded batch — so the Add-mask pattern is there without a second model input.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo.builder import OnnxBuilder


@dataclass(frozen=True)
class BertConfig:
    layers: int
    hidden: int
    heads: int
    vocab: int = 30522
    max_positions: int = 512

    @property
    def intermediate(self) -> int:
        return 4 * self.hidden


BERT_BASE = BertConfig(layers=12, hidden=768, heads=12)
BERT_TINY = BertConfig(layers=2, hidden=128, heads=2)


def linear(b: OnnxBuilder, name: str, x: str, fan_in: int, fan_out: int) -> str:
    """nn.Linear on a 3-D input exports as MatMul by the transposed weight, then Add(bias, ·)."""
    with b.scope(name):
        w = b.weight("weight", b.normal((fan_in, fan_out), np.sqrt(1.0 / fan_in)))
        y = b.op("MatMul", [x, w])
        return b.op("Add", [b.weight("bias", b.normal((fan_out,), 0.02)), y])


def layer_norm(b: OnnxBuilder, x: str, hidden: int, name: str = "LayerNorm", eps: float = 1e-12) -> str:
    """nn.LayerNorm over the last axis as one LayerNormalization (opset 17); weights `name.weight`, `name.bias`."""
    with b.scope(name):
        gamma = b.weight("weight", b.uniform((hidden,), 0.9, 1.1))
        beta = b.weight("bias", b.normal((hidden,), 0.02))
        return b.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)


def gelu(b: OnnxBuilder, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)), op by op as torch.onnx writes F.gelu before opset 20."""
    y = b.op("Erf", [b.op("Div", [x, b.const(np.sqrt(2.0))])])
    y = b.op("Mul", [x, b.op("Add", [y, b.const(1.0)])])
    return b.op("Mul", [y, b.const(0.5)])


def _self_attention(b: OnnxBuilder, cfg: BertConfig, x: str, mask: str, batch: int, seq: int) -> str:
    head = cfg.hidden // cfg.heads
    split = [batch, seq, cfg.heads, head]

    def heads(name: str, perm: list[int]) -> str:
        y = b.op("Reshape", [linear(b, name, x, cfg.hidden, cfg.hidden), b.const(split, np.int64)])
        return b.op("Transpose", [y], perm=perm)

    q = heads("query", [0, 2, 1, 3])
    k = heads("key", [0, 2, 3, 1])  # permute then transpose(-1, -2), folded into one Transpose
    v = heads("value", [0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k]), b.const(np.sqrt(head))])
    probs = b.op("Softmax", [b.op("Add", [scores, mask])], axis=-1)
    context = b.op("Transpose", [b.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    return b.op("Reshape", [context, b.const([batch, seq, cfg.hidden], np.int64)])


def _encoder_layer(b: OnnxBuilder, cfg: BertConfig, x: str, mask: str, batch: int, seq: int) -> str:
    with b.scope("attention"):
        with b.scope("self"):
            context = _self_attention(b, cfg, x, mask, batch, seq)
        with b.scope("output"):
            x = layer_norm(b, b.op("Add", [linear(b, "dense", context, cfg.hidden, cfg.hidden), x]), cfg.hidden)
    with b.scope("intermediate"):
        h = gelu(b, linear(b, "dense", x, cfg.hidden, cfg.intermediate))
    with b.scope("output"):
        return layer_norm(b, b.op("Add", [linear(b, "dense", h, cfg.intermediate, cfg.hidden), x]), cfg.hidden)


def bert(cfg: BertConfig, b: OnnxBuilder, batch: int, seq_len: int) -> str:
    if not 1 <= seq_len <= cfg.max_positions:
        raise GraphError(f"bert: seq_len must be in 1..{cfg.max_positions}, got {seq_len}")
    ids = b.input("input_ids", (batch, seq_len), TensorProto.INT64)
    with b.scope("embeddings"):
        # tables are drawn whole so that the weights of a seed do not depend on seq_len
        words = b.weight("word_embeddings.weight", b.normal((cfg.vocab, cfg.hidden), 0.02))
        positions = b.normal((cfg.max_positions, cfg.hidden), 0.02)[None, :seq_len]
        token_type = np.broadcast_to(b.normal((2, cfg.hidden), 0.02)[0], (1, seq_len, cfg.hidden))
        x = b.op("Gather", [words, ids], axis=0)
        x = b.op("Add", [x, b.weight("token_type_embeddings", token_type)])
        x = b.op("Add", [x, b.weight("position_embeddings", positions)])
        x = layer_norm(b, x, cfg.hidden)
    mask = np.zeros((1, 1, 1, seq_len), np.float32)
    mask[..., seq_len - seq_len // 8 :] = -10000.0
    mask_name = b.weight("extended_attention_mask", mask)
    for i in range(cfg.layers):
        with b.scope("encoder"), b.scope(f"layer.{i}"):
            x = _encoder_layer(b, cfg, x, mask_name, batch, seq_len)
    return x
