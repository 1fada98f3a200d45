"""The PyTorch peer of the model benchmarks (tensorgen/graph/reference/torch_zoo.py) and bench/networks.py: every zoo
model as an nn.Module computes what ONNX Runtime computes on the zoo's ONNX file; the benchmark checks
every engine's output before timing it and publishes no speedup for a wrong one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.ir import GraphError
from tensorgen.graph.reference.compare import OUTPUT_RTOL, output_error
from tensorgen.graph.reference.torch_zoo import MODULES, state_dict_of, torch_model
from tensorgen.graph.zoo import MODELS, build_model

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import networks  # noqa: E402

from tensorgen import timing  # noqa: E402

# small inputs, batch 2: the same weights whatever the image size
SMALL = {"resnet18": {"image_size": 64}, "resnet50": {"image_size": 64}, "mobilenet_v2": {"image_size": 64},
         "resnet3d_18": {"frames": 4, "image_size": 32}, "dcgan": {"image_size": 16},
         "bert_base": {"seq_len": 16}, "bert_tiny": {"seq_len": 16},
         "convnext_tiny": {"image_size": 64, "width": 16}, "vit_small": {"image_size": 32, "layers": 2}}
SLOW = {"bert_base", "resnet3d_18"}  # 440 MB of weights / a 3-D network: tens of seconds on 2 cores


def test_every_zoo_model_has_a_torch_module():
    assert set(MODULES) == set(MODELS) == set(SMALL)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in SMALL])
def test_torch_module_equals_onnxruntime(name):
    torch.set_num_threads(2)
    module, model = torch_model(name, batch=2, **SMALL[name])
    feed = random_inputs(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    (ref,) = session.run(None, feed)
    with torch.inference_mode():
        got = module(*(torch.from_numpy(v) for v in feed.values())).numpy()
    abs_err, rel_err = output_error([got], [ref])
    assert rel_err <= OUTPUT_RTOL, (abs_err, rel_err)
    assert float(np.abs(ref).std()) > 1e-2  # not a trivially equal (constant) output


def test_a_module_with_other_weights_is_refused():
    """The weights come by name: an ONNX model of another architecture does not load silently."""
    module = MODULES["resnet18"](image_size=32)
    with pytest.raises(GraphError, match="disagree on the weights"):
        state_dict_of(module, build_model("mobilenet_v2", image_size=32))


def test_output_error():
    assert output_error([np.ones(3)], [np.ones(3)]) == (0.0, 0.0)
    assert output_error([np.array([1.0, 2.5])], [np.array([1.0, 2.0])]) == (0.5, 0.25)
    assert output_error([np.array([np.nan, 2.0])], [np.array([1.0, 2.0])])[1] == float("inf")
    assert output_error([np.ones(2)], [np.ones(3)])[1] == float("inf")


FAST = timing.Protocol(rounds=2, max_rounds=2, bound=1000.0, samples=2, pause_s=0.0, warm_s=0.0)
TINY = {"image_size": 8}  # the DCGAN generator's smallest image: 4 kernels


def test_measure_checks_every_engine_then_times_it(tmp_path):
    row = networks.measure("dcgan", 1, TINY, str(tmp_path / "none.db"), 2, 1, FAST, False, False)
    assert row["status"] == "ok" and row["errors"] == {} and row["reliable"] is True
    assert set(row["ms"]) == {"tensorgen", "onnxruntime", "torch"}
    assert all(e["max_rel"] <= OUTPUT_RTOL for e in row["output_error"].values())
    # one statistic: the speedups are the ratios of the reported times
    for peer, speedup in row["speedup"].items():
        assert speedup == pytest.approx(row["ms"][peer] / row["ms"]["tensorgen"])
    assert row["timing"]["rounds"] == 2 and row["load"]["competing_process"] is False
    assert "UNRELIABLE" not in networks.row_line(row) and "(" in networks.row_line(row)


def test_the_build_of_another_database_is_one_more_engine(tmp_path):
    row = networks.measure("dcgan", 1, TINY, str(tmp_path / "a.db"), 2, 1, FAST, False, False, "onnx",
                           (str(tmp_path / "b.db"),))
    assert row["status"] == "ok" and set(row["ms"]) == {"tensorgen", "tensorgen:b", "onnxruntime", "torch"}
    assert row["output_error"]["tensorgen:b"]["max_rel"] <= OUTPUT_RTOL
    assert "tensorgen:b " in networks.row_line(row)


def test_a_wrong_output_gets_no_speedup(tmp_path, monkeypatch):
    """tensorgen built from a model with other weights computes another function: the row says
    "wrong output" with the errors, and no time or speedup is published."""
    from tensorgen.graph.load import load_graph

    monkeypatch.setattr(networks, "load_graph", lambda model: load_graph(build_model("dcgan", seed=1, **TINY)))
    row = networks.measure("dcgan", 1, TINY, str(tmp_path / "none.db"), 2, 1, FAST, False, False)
    assert row["status"] == "wrong output" and "ms" not in row and "speedup" not in row
    assert row["output_error"]["tensorgen"]["max_rel"] > OUTPUT_RTOL
    assert "wrong output" in row["errors"]["tensorgen"]
    line = networks.row_line(row)
    assert line.startswith("dcgan b1: WRONG OUTPUT") and "x)" not in line


def test_a_wrong_peer_is_not_timed(tmp_path, monkeypatch):
    def other_weights(name, batch, **options):
        module, _ = torch_model(name, batch, **options)
        with torch.no_grad():
            module.main[0].weight.mul_(1.5)
        return module, build_model(name, batch, **options)

    monkeypatch.setattr("tensorgen.graph.reference.torch_zoo.torch_model", other_weights)
    row = networks.measure("dcgan", 1, TINY, str(tmp_path / "none.db"), 2, 1, FAST, False, False)
    assert row["status"] == "ok" and set(row["ms"]) == {"tensorgen", "onnxruntime"}
    assert "wrong output" in row["errors"]["torch"] and "torch" not in row["speedup"]
    assert "wrong output: max |torch - onnxruntime|" in networks.row_line(row)


@pytest.mark.slow
def test_networks_cli_with_torch_compile_and_a_failing_compiler(tmp_path):
    """The script end to end in its own process, with --load; Inductor given a C++ compiler that fails
    reports "torch.compile failed" in its column while the other engines are timed."""
    out = tmp_path / "n.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CXX": "/bin/false",
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "networks.py"), "--models", "dcgan", "--option",
                           "image_size=8", "--trials", "0", "--db", str(tmp_path / "n.db"), "--rounds", "2",
                           "--max-rounds", "2", "--repeat", "2", "--pause", "0", "--bound", "1000", "--load",
                           "--json", str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert data["load"] is True and row["load"]["competing_process"] is True
    assert row["errors"]["torch_compile"].startswith("torch.compile failed: ")
    assert "\n" not in row["errors"]["torch_compile"] and set(row["ms"]) == {"tensorgen", "onnxruntime", "torch"}
    assert "torch.compile failed" in proc.stdout
