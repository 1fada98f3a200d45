"""ONNX's own node conformance tests, imported with import_onnx and run node by node.

The cases are onnx.backend.test's node tests: the data directories (onnx/backend/test/data/node/test_*)
where the onnx install ships them, else generated in-process by onnx.backend.test.case.node, the code
those directories are written from. There is one pytest case per test whose model is a single node of
a supported op. Inputs in the slots the frontend needs as compile-time constants (a Reshape's shape,
Slice's starts, ...) become initializers holding the test's data, as they would be in a real model.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tensorgen.graph.frontend import normalize
from tensorgen.graph.frontend import onnx_import as frontend
from tensorgen.graph.ir import GraphError
from tensorgen.graph.ops import SUPPORTED_OPS
from tensorgen.graph.reference.interpret import run_nodewise

# Tests of what tensorgen deliberately does not support, by test-name pattern: each must raise GraphError
# (from the frontend or the lowering) and is a strict expected failure with the reason given.
KNOWN_UNSUPPORTED: dict[str, str] = {
    # element types beyond float32/float64/int32/int64, bool conditions and float16 (computed in float32) at the
    # boundary: te and the kernel ABI lack them
    r"(?i)(^|_)(bfloat16|float8\w*|float4e2m1|e8m0|u?int(2|4|8|16)|uint(32|64))(_|$)":
        "element type not supported (float32, float64, int32, int64 only; float16 at the boundary)",
    # Resize is nearest-neighbour or linear
    r"^test_resize_.*cubic": "Resize supports mode='nearest' and 'linear' only",
    r"^test_resize_.*linear_antialias": "antialiased linear downsampling is not supported",
    r"^test_resize_tf_crop_and_resize": "Resize coordinate mode tf_crop_and_resize is not supported",
    # te has no zero-size tensors
    r"^test_(slice_start_out_of_bounds|split_zero_size_splits_opset1[38]"
    r"|reduce_(sum|max|min|prod|l1|l2|sum_square|log_sum_exp)_empty_set\w*"
    r"|reshape_allowzero_reordered|tril_zero|triu_zero)$": "empty tensors are not supported",
    r"^test_batchnorm_\w+_training_mode$": "BatchNormalization is inference-only",
    r"^test_maxpool_with_argmax_": "the MaxPool Indices output is not supported",
    r"^test_identity_(opt|sequence)$": "optional and sequence types are not supported",
    r"^test_wrap_pad$": "Pad mode 'wrap' is not supported",
    r"_string(_|$)": "string tensors are not supported",
    r"^test_reduce_(max|min)_bool_inputs$": "ReduceMax and ReduceMin of bool are not supported",
    # opset-22 semantics (the ceil_mode output size); the frontend imports opsets 13-21
    r"^test_(averagepool_2d_ceil_last_window_starts_on_pad|maxpool_2d_ceil_output_size_reduce_by_one)$":
        "needs opset 22; the frontend imports opsets 13-21",
    r"^test_celu_float16$": "Celu takes float16 from opset 28 on; the frontend imports opsets 13-21",
    r"^test_spacetodepth_(dcr|crd)_mode_example$": "SpaceToDepth's mode attribute is opset 28; the frontend imports "
                                                   "opsets 13-21",
}

# Tests whose expected outputs (ONNX's reference implementation) disagree with ONNX Runtime, where tensorgen follows
# ONNX Runtime (and PyTorch, which exports these models): each is checked against ONNX Runtime instead.
FOLLOWS_ONNX_RUNTIME: dict[str, str] = {
    "test_resize_downsample_scales_linear_align_corners":
        "align_corners divides by the output length less one (ONNX Runtime, PyTorch), not scale * input length",
}


@dataclass
class Case:
    model: onnx.ModelProto
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def _array(x) -> np.ndarray:
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else np.asarray(x)


def _from_files(root: Path) -> dict[str, Case]:
    cases = {}
    for d in sorted(root.glob("test_*")):
        data = d / "test_data_set_0"
        if not (d / "model.onnx").exists() or not data.exists():
            continue
        tensors = {kind: [numpy_helper.to_array(onnx.load_tensor(str(p)))
                          for p in sorted(data.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))]
                   for kind in ("input", "output")}
        cases[d.name] = Case(onnx.load(str(d / "model.onnx")), tensors["input"], tensors["output"])
    return cases


def _generated() -> dict[str, Case]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tests = collect_testcases()
    return {t.name: Case(t.model, [_array(x) for x in t.data_sets[0][0]], [_array(x) for x in t.data_sets[0][1]])
            for t in tests if _single_supported_node(t.model)}


# the ops with a lowering, and those the frontend writes as several nodes of such ops (LpNormalization, ...)
TESTED_OPS = SUPPORTED_OPS | frontend.GRAPH_OPS | {"EyeLike"}  # EyeLike: folded from its input's shape


def _single_supported_node(model: onnx.ModelProto) -> bool:
    nodes = model.graph.node
    return len(nodes) == 1 and nodes[0].domain in ("", "ai.onnx") and nodes[0].op_type in TESTED_OPS


def _cases() -> dict[str, Case]:
    root = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
    cases = _from_files(root) if root.is_dir() else _generated()
    return {name: case for name, case in sorted(cases.items()) if _single_supported_node(case.model)}


CASES = _cases()


def _params():
    for name in CASES:
        reason = next((why for pattern, why in KNOWN_UNSUPPORTED.items() if re.search(pattern, name)), None)
        marks = [pytest.mark.xfail(raises=GraphError, strict=True, reason=reason)] if reason else []
        yield pytest.param(name, marks=marks, id=name)


def _at_supported_opset(model: onnx.ModelProto) -> None:
    """Move a model written at an older opset than the frontend imports up to its oldest (onnx's converter), and
    one written at a newer opset down to its newest one, where the
    model is valid there: onnx writes each test at its op's latest version, and for the ops tested here
    the versions after 21 only admit new element types."""
    newest = max(frontend.OPSETS)
    default = next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if default.version < min(frontend.OPSETS):  # an op unchanged since (And, Not: opset 7), as a converter writes it
        model.CopyFrom(onnx.version_converter.convert_version(model, min(frontend.OPSETS)))
        return
    if default.version <= newest:
        return
    old = default.version
    default.version = newest
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError):
        default.version = old


def _frozen_parameters(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with compile-time-parameter inputs turned into initializers, and the feeds of the rest."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    _at_supported_opset(model)
    node = model.graph.node[0]
    params = {node.input[i] for i in normalize.CONST_INPUTS.get(node.op_type, {}) if i < len(node.input)}
    given = [vi.name for vi in case.model.graph.input]
    data = dict(zip(given, case.inputs))
    kept = [vi for vi in case.model.graph.input if vi.name not in params]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(data[name], name) for name in given if name in params)
    return model, {vi.name: data[vi.name] for vi in kept}


@pytest.mark.parametrize("name", list(_params()))
def test_onnx_node(name):
    case = CASES[name]
    model, feeds = _frozen_parameters(case)
    graph = frontend.import_onnx(model)
    got = run_nodewise(graph, feeds)
    outputs = case.outputs
    if name in FOLLOWS_ONNX_RUNTIME:
        import onnxruntime

        outputs = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for out, expected in zip(graph.outputs, outputs):
        actual = got[out]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (
            f"{out}: got {actual.dtype}{list(actual.shape)}, expected {expected.dtype}{list(expected.shape)}")
        if expected.dtype.kind in "iub":
            np.testing.assert_array_equal(actual, expected, err_msg=out)
        else:
            np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5, err_msg=out)
