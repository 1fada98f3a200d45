"""ALT (tensorgen.search.layouts, tensorgen.tuning.alt): layout templates and joint layout + loop tuning."""

from __future__ import annotations

import numpy as np
import pytest
from search_tasks import make_task

from tensorgen.build import build
from tensorgen.records.database import SQLiteDatabase
from tensorgen.schedule.layout import Layout, lay_out
from tensorgen.schedule.state import State
from tensorgen.search.layouts import LAYOUT_TEMPLATES, TilingTemplate, tiled
from tensorgen.te import ops
from tensorgen.te.tensor import placeholder
from tensorgen.tuning.alt import AltConfig, layout_candidates, tune_alt


def gmm_relu(m=32, n=48, k=40):
    (a, b), (c,) = ops.make_gmm(m, n, k)
    return make_task([a, b], [ops.relu(c)], cores=2)


def test_the_gmm_template_tiles_every_operand_with_shared_tiles():
    """ALT §5.1's GMM template: C (M/mt, N/nt, mt, nt), A (M/mt, K/kt, mt, kt), B (K/kt, N/nt, kt, nt); the
    output layout propagates to the element-wise ReLU after it."""
    task = gmm_relu()
    template = LAYOUT_TEMPLATES["tiling"]
    space = template.space(task.dag)
    _, i, j = (a.name for a in task.dag.by_name[space.anchor].axes)  # make_gmm: (batch of 1, M, N)
    kk = task.dag.by_name[space.anchor].reduce_axes[0].name
    layouts = template.layouts(task.dag, {i: 8, j: 16, kk: 4})
    shapes = {name: Layout.of(task.dag.by_name[name].shape, prims).new_shape for name, prims in layouts.items()}
    assert shapes == {"A": (1, 4, 10, 8, 4), "B": (1, 10, 3, 4, 16),
                      "batch_matmul": (1, 4, 3, 8, 16), "relu": (1, 4, 3, 8, 16)}


def test_an_operator_without_data_reuse_has_no_template():
    x = placeholder((4, 16), "float32", "x")
    assert LAYOUT_TEMPLATES["tiling"].space(make_task([x], [ops.relu(x)]).dag) is None


def test_tiled_leaves_untileable_dimensions_whole():
    assert tiled((6, 10), [1, 1]) == []
    assert Layout.of((6, 10), tiled((6, 10), [3, 4])).new_shape == (2, 10, 3)  # 4 does not divide 10: whole
    assert Layout.of((6, 10), tiled((6, 10), [3, 5])).new_shape == (2, 2, 3, 5)


def test_sampled_layouts_compute_the_same():
    task = gmm_relu()
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, t.shape).astype("float32") for t in task.dag.inputs)
    for layouts in layout_candidates(task, 6, "tiling", np.random.default_rng(3)):
        (out,) = build(State(lay_out(task.dag, layouts))).run(
            *(Layout.of(x.shape, layouts[t.name]).pack(x) if t.name in layouts else x
              for t, x in zip(task.dag.inputs, (a, b))))
        if "relu" in layouts:
            out = Layout.of((1, 32, 48), layouts["relu"]).unpack(out)
        np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_joint_then_loop_only_tuning_gives_a_replayable_state_of_the_task(tmp_path):
    task = gmm_relu()
    db = SQLiteDatabase(tmp_path / "alt.db")
    result = tune_alt(task, 24, db=db, config=AltConfig(layouts=3, joint_fraction=0.5), seed=0)
    assert len(result.explored) == 3 and result.explored[0].layouts == {}  # the task's own layout competes
    assert result.best_state is not None and np.isfinite(result.best_cost) and result.trials == 24
    assert result.best_cost <= min(t.best_cost for t in result.explored)  # the loop-only stage resumes the best
    replayed = State.from_json(task.dag, result.best_state.to_json())
    assert replayed.dag.workload_key == result.best_state.dag.workload_key
    assert {name for name in result.layouts} <= set(task.dag.by_name)


def test_bad_alt_configs_are_refused():
    from tensorgen.errors import TuneError

    for bad in ({"layouts": 0}, {"joint_fraction": 0}, {"template": "nope"}):
        with pytest.raises(TuneError):
            AltConfig(**bad)
    assert isinstance(LAYOUT_TEMPLATES["tiling"], TilingTemplate)
