"""The PaCM that ships in the package (costmodel/shipped.py) and the cost model "auto" that picks it.

The shipped file must load as a pretrained PaCM and rank programs it never saw better than chance: random programs
of a GEMM and a conv, ordered by the static analyzer (an independent formula; the model learned from measurements of
the zoo's tasks, none of them these shapes)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm

from tensorgen.costmodel.shipped import SHIPPED_DIR, cpu_vendor, isa_family, machine_kind, shipped_pacm
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.tuning.tune import make_cost_model

X86 = platform.machine().lower() in ("x86_64", "amd64")
SHIPPED = sorted(SHIPPED_DIR.glob("pacm_*.pt"))


def test_isa_family_vendor_and_machine_kind(tmp_path):
    assert isa_family("cuda -arch=sm_90") is None and machine_kind("cuda -arch=sm_90") is None
    assert isa_family("cpu -mcpu=haswell") == ("x86" if X86 else isa_family("cpu"))
    for vendor_id, vendor in (("GenuineIntel", "intel"), ("AuthenticAMD", "amd"), ("HygonGenuine", None)):
        (tmp_path / vendor_id).write_text(f"processor\t: 0\nvendor_id\t: {vendor_id}\nflags\t\t: fpu\n")
        assert cpu_vendor(tmp_path / vendor_id) == vendor
    assert cpu_vendor(tmp_path / "missing") is None
    kind = machine_kind("cpu")
    assert kind is None or kind == f"{isa_family('cpu')}-{cpu_vendor()}"
    assert shipped_pacm("cpu") in (None, SHIPPED_DIR / f"pacm_{kind}.pt")


def test_auto_is_xgboost_but_for_pruner_on_a_cpu():
    assert isinstance(make_cost_model("auto"), XGBModel)
    assert isinstance(make_cost_model("auto", target="cpu", policy="ansor"), XGBModel)
    assert isinstance(make_cost_model("auto", target="cuda -arch=sm_90", policy="pruner"), XGBModel)


def test_auto_for_pruner_is_the_shipped_model_of_this_kind_of_machine_else_pacm_learned_online():
    pytest.importorskip("torch")
    from tensorgen.costmodel.pacm import PaCM

    model = make_cost_model("auto", seed=0, target="cpu", policy="pruner")
    assert isinstance(model, PaCM)
    assert (model.siamese is not None) == (shipped_pacm("cpu") is not None)
    assert model.trained == (shipped_pacm("cpu") is not None)  # a pretrained model ranks from the start


def test_a_pacm_ships_for_intel_and_amd_x86():
    assert [p.name for p in SHIPPED] == ["pacm_x86-amd.pt", "pacm_x86-intel.pt"]


@pytest.mark.skipif(not X86, reason="the shipped PaCM is for x86 CPUs")
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_the_shipped_pretrained_pacm_is_small_and_ranks_unseen_programs(path):
    pytest.importorskip("torch")
    from tensorgen.costmodel.metrics import pairwise_accuracy
    from tensorgen.costmodel.pacm import PaCM
    from tensorgen.costmodel.psa import StaticAnalyzer
    from tensorgen.features.extractor import FeatureExtractor
    from tensorgen.search.sketch_policy import SketchPolicy

    assert path.stat().st_size < 4 * 2**20  # a few MB at most
    model = make_cost_model(f"pacm:{path}", seed=0)
    assert isinstance(model, PaCM) and model.trained and model.dataflow
    scores = []
    for task in (gmm(), c2d_relu()):
        states = SketchPolicy.from_options(task, model, seed=1, workers=1).evolution.sample(96)
        feats = FeatureExtractor(task.hw, dataflow=True).extract(states)
        truth = 1.0 / StaticAnalyzer(task.hw).latencies(states)
        scores.append(pairwise_accuracy(truth, np.asarray(model.predict(feats))))
    assert np.mean(scores) > 0.6, scores
