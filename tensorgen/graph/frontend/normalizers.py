"""Every ONNX op's normalizer, registered: the one table both importers (ONNX files and PyTorch modules) normalize
their nodes with. An op whose normalizer lives in a module nobody imported would be missing from one of them (torch
gather reached GatherElements before its normalizer was registered)."""

import tensorgen.graph.frontend.normalize_index  # noqa: F401  (Einsum, GatherElements, DepthToSpace, ...)
import tensorgen.graph.frontend.normalize_more  # noqa: F401  (OneHot, Trilu, Hardmax, LpPool, ...)
import tensorgen.graph.frontend.normalize_nn  # noqa: F401  (Conv, pooling, Resize)
import tensorgen.graph.frontend.normalize_norm  # noqa: F401  (LpNormalization, GroupNormalization, ...)
import tensorgen.graph.frontend.normalize_rnn  # noqa: F401  (RNN, GRU, LSTM)
import tensorgen.graph.frontend.normalize_scatter  # noqa: F401  (ScatterElements, ScatterND)
from tensorgen.graph.frontend.normalize import NORMALIZERS

__all__ = ["NORMALIZERS"]
