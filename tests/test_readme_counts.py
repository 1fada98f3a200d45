"""README's counts of the ops each frontend takes are the frontends' own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tensorgen.graph.frontend.onnx_import import SUPPORTED_OPS

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_onnx_op_count():
    assert re.search(r"with (\d+) ONNX ops", README).group(1) == str(len(SUPPORTED_OPS))


def test_aten_op_count():
    pytest.importorskip("torch")
    from tensorgen.graph.frontend.torch_import import supported_ops

    assert re.search(r"uses the (\d+)\s+ATen ops", README).group(1) == str(len(supported_ops()))
