"""Faults of the `torch.compile(backend="tensorgen")` backend (tensorgen.dynamo) on real modules and processes: a model
being trained, the build directories a process leaves in the temp dir, the notice of an untuned build."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tensorgen.dynamo import tensorgen_backend  # noqa: E402
from tensorgen.errors import TensorgenError  # noqa: E402
from tensorgen.tempdirs import owned_tempdir, sweep_stale  # noqa: E402


def _linear() -> tuple[nn.Linear, torch.Tensor]:
    torch.manual_seed(0)
    return nn.Linear(4, 2), torch.randn(3, 4)


def test_a_module_in_training_is_refused_in_one_line():
    """Its outputs had no grad_fn: backward() left the parameters' gradients at zero, silently."""
    module, x = _linear()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="tensorgen")
    with pytest.raises(TensorgenError, match=r"inference only.*torch\.no_grad\(\).*'fallback': True"):
        compiled(x)


def test_eval_and_no_grad_still_compile():
    module, x = _linear()
    backends = []

    def recording(gm, example_inputs, **kwargs):
        backends.append((gm, fn := tensorgen_backend(gm, example_inputs, **kwargs)))
        return fn

    torch._dynamo.reset()
    compiled = torch.compile(module.eval(), backend=recording)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x))
    assert len(backends) == 1 and backends[0][1] is not backends[0][0]  # compiled, not left to eager PyTorch


def test_fallback_trains_the_graph_in_eager_pytorch(caplog):
    """With fallback the graph runs eagerly: the gradients are eager PyTorch's."""
    module, x = _linear()
    eager, _ = _linear()
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="tensorgen", options={"fallback": True})
    with caplog.at_level(logging.WARNING, logger="tensorgen.dynamo"):
        compiled(x).square().sum().backward()
    eager(x).square().sum().backward()
    assert "inference only" in caplog.text
    torch.testing.assert_close(module.weight.grad, eager.weight.grad)
    torch.testing.assert_close(module.bias.grad, eager.bias.grad)
    assert module.weight.grad.abs().sum() > 0


_SCRIPT = textwrap.dedent("""
    import pathlib, tempfile
    import torch
    from torch import nn

    class TwoGraphs(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

        def forward(self, x):
            y = torch.relu(self.a(x))
            torch._dynamo.graph_break()
            return self.b(y)

    torch.manual_seed(0)
    module, x = TwoGraphs().eval(), torch.randn(3, 8)
    compiled = torch.compile(module, backend="tensorgen")
    with torch.no_grad():
        compiled(x)
        left = sorted(p.name for p in pathlib.Path(tempfile.gettempdir()).glob("tensorgen_torch_*"))
        assert not left, left
        torch.testing.assert_close(compiled(x), module(x))  # the builds run with their directories gone
    """)


def _dead_pid() -> str:
    """The id of a process that has exited."""
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_process_leaves_no_build_directory_and_says_once_it_is_untuned(tmp_path):
    """Each compiled graph left a tensorgen_torch_* directory with a copy of its weights; one a killed process left
    (named with a pid that is gone) is swept by the next build. Two untuned graphs: one notice."""
    dead = _dead_pid()
    stale = tmp_path / f"tensorgen_torch_{dead}-x1y2"
    stale.mkdir()
    (stale / "weights.bin").write_bytes(b"\0" * 64)
    script = tmp_path / "compile.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, "TMPDIR": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("tensorgen_torch_")) == []
    notices = [line for line in done.stderr.splitlines() if "untuned" in line]
    assert len(notices) == 1, done.stderr
    assert "'trials'" in notices[0] and "'db'" in notices[0]


def test_sweep_removes_only_the_directories_of_processes_that_are_gone(tmp_path):
    dead = _dead_pid()
    mine, gone, other = (tmp_path / f"tg_{os.getpid()}-a", tmp_path / f"tg_{dead}-b", tmp_path / "tg_build")
    for d in (mine, gone, other):
        d.mkdir()
    assert sweep_stale("tg_", tmp_path) == [gone]
    assert mine.is_dir() and other.is_dir() and not gone.exists()


def test_an_owned_directory_goes_when_its_block_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    with pytest.raises(ValueError), owned_tempdir("tg_") as path:
        (path / "partial").write_text("x")
        raise ValueError("the build failed")
    assert not list(Path(tmp_path).iterdir())
