"""The PaCM that ships in the package (costmodel/shipped.py) and the cost model "auto" that picks it.

The shipped file must load as a pretrained PaCM and rank programs it never saw better than chance: random programs
of a GEMM and a conv, ordered by the static analyzer (an independent formula; the model learned from measurements of
the zoo's tasks, none of them these shapes)."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm

from tensorgen.costmodel.shipped import isa_family, shipped_pacm
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.tuning.tune import make_cost_model

X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_isa_family_of_targets():
    assert isa_family("cuda -arch=sm_90") is None
    assert isa_family("cpu -mcpu=haswell") == ("x86" if X86 else isa_family("cpu"))


def test_auto_is_xgboost_but_for_pruner_with_a_shipped_model():
    assert isinstance(make_cost_model("auto"), XGBModel)
    assert isinstance(make_cost_model("auto", target="cpu", policy="ansor"), XGBModel)
    assert isinstance(make_cost_model("auto", target="cuda -arch=sm_90", policy="pruner"), XGBModel)


@pytest.mark.skipif(not X86, reason="the shipped PaCM is for x86 CPUs")
def test_auto_on_x86_is_the_shipped_pretrained_pacm_and_it_ranks_unseen_programs():
    pytest.importorskip("torch")
    from tensorgen.costmodel.metrics import pairwise_accuracy
    from tensorgen.costmodel.pacm import PaCM
    from tensorgen.costmodel.psa import StaticAnalyzer
    from tensorgen.features.extractor import FeatureExtractor
    from tensorgen.search.sketch_policy import SketchPolicy

    path = shipped_pacm("cpu")
    assert path is not None and path.stat().st_size < 4 * 2**20  # a few MB at most
    model = make_cost_model("auto", seed=0, target="cpu", policy="pruner")
    assert isinstance(model, PaCM) and model.trained and model.dataflow
    scores = []
    for task in (gmm(), c2d_relu()):
        states = SketchPolicy.from_options(task, model, seed=1, workers=1).evolution.sample(96)
        feats = FeatureExtractor(task.hw, dataflow=True).extract(states)
        truth = 1.0 / StaticAnalyzer(task.hw).latencies(states)
        scores.append(pairwise_accuracy(truth, np.asarray(model.predict(feats))))
    assert np.mean(scores) > 0.6, scores
