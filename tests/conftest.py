"""Shared fixtures. `evaluate(outputs, feed) -> list[np.ndarray]` runs a tensor-expression graph;
add more implementations (e.g. compile + run the naive schedule) to EVALUATORS."""

import pytest
from te_eval import evaluate as te_evaluate

EVALUATORS = {"te_eval": te_evaluate}  # register new implementations here, before the fixture


@pytest.fixture(params=sorted(EVALUATORS))
def evaluate(request):
    return EVALUATORS[request.param]
