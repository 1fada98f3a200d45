"""Numeric ops at run time (session 38): trigonometry, rounding, Sign, IsNaN, IsInf, Mod and Tile from ONNX, checked
against ONNX Runtime; PyTorch's numeric functions, rounding modes of division, extremes with their indices, any/all,
var_mean, repeat and flip, checked against eager PyTorch."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tensorgen.graph.backend.build import build_model
from tensorgen.runtime.model import CompiledModel

torch = pytest.importorskip("torch")
from torch_fn import Fn  # noqa: E402

import tensorgen  # noqa: E402
from tensorgen.dynamo import compile_graph  # noqa: E402

F = torch.nn.functional
TYPES = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.int64: TensorProto.INT64,
         np.int32: TensorProto.INT32, np.bool_: TensorProto.BOOL}


def _onnx_matches_ort(op: str, feeds: dict[str, np.ndarray], out_dtype, tmp_path, ref: np.ndarray | None = None,
                      **attrs) -> np.ndarray:
    """The one-node model built and run, against ONNX Runtime (or `ref` where ONNX Runtime lacks the kernel)."""
    inputs = [helper.make_tensor_value_info(k, TYPES[v.dtype.type], list(v.shape)) for k, v in feeds.items()]
    out = helper.make_tensor_value_info("y", TYPES[out_dtype], None)
    graph = helper.make_graph([helper.make_node(op, list(feeds), ["y"], **attrs)], "math", inputs, [out])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if ref is None:
        ref = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run(list(feeds.values()))[0]
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=2e-6)
    return ours


def _values(seed: int, shape=(3, 37), scale: float = 3.0, dtype=np.float32) -> np.ndarray:
    """Random values with exact halves among them (rounding's ties) and zeros of both signs."""
    x = np.random.default_rng(seed).standard_normal(shape) * scale
    x.flat[:8] = [0.5, 1.5, 2.5, -0.5, -2.5, 0.0, -0.0, 3.0]
    return x.astype(dtype)


NUMPY = {"Floor": np.floor, "Ceil": np.ceil, "Round": np.round, "Sign": np.sign, "Sin": np.sin, "Cos": np.cos,
         "Tan": np.tan, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh, "Asin": np.arcsin,
         "Acos": np.arccos, "Atanh": np.arctanh, "Acosh": np.arccosh}


DOMAIN = {"Asin": "u", "Acos": "u", "Atanh": "u", "Acosh": "p"}  # ops defined on (-1, 1) and [1, inf)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unary_math_matches_onnxruntime(dtype, tmp_path):
    """Every op in one model (one build): float32 against ONNX Runtime; float64 (which ONNX Runtime lacks for most
    of these) against NumPy."""
    x = _values(1, dtype=dtype)
    feeds = {"x": x, "u": np.clip(x / 4, -0.99, 0.99).astype(dtype), "p": (np.abs(x) + 1).astype(dtype)}
    ops = sorted(NUMPY)
    graph = helper.make_graph(
        [helper.make_node(op, [DOMAIN.get(op, "x")], [op]) for op in ops], "unary",
        [helper.make_tensor_value_info(k, TYPES[dtype], list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(op, TYPES[dtype], None) for op in ops])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if dtype == np.float32:
        refs = ort.InferenceSession(proto.SerializeToString()).run(None, feeds)
    else:
        refs = [NUMPY[op](feeds[DOMAIN.get(op, "x")]) for op in ops]
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run(list(feeds.values()))
    for op, got, want in zip(ops, ours, refs):
        assert got.dtype == want.dtype, op
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6, err_msg=op)


def test_sign_of_integers_matches_onnxruntime(tmp_path):
    _onnx_matches_ort("Sign", {"x": np.arange(-5, 7, dtype=np.int64).reshape(3, 4)}, np.int64, tmp_path)


@pytest.mark.parametrize(("op", "attrs"), [("IsNaN", {}), ("IsInf", {}), ("IsInf", {"detect_negative": 0}),
                                           ("IsInf", {"detect_positive": 0})])
def test_float_tests_match_onnxruntime(op, attrs, tmp_path):
    x = _values(2)
    x.flat[8:14] = [np.nan, np.inf, -np.inf, np.nan, -np.inf, np.inf]
    _onnx_matches_ort(op, {"x": x}, np.bool_, tmp_path, **attrs)


@pytest.mark.parametrize(("dtype", "fmod"), [(np.float32, 1), (np.int64, 0), (np.int64, 1), (np.int32, 0)])
def test_mod_of_mixed_signs_matches_onnxruntime(dtype, fmod, tmp_path):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((4, 9)) * 20).astype(dtype)
    b = (rng.choice([-1, 1], (1, 9)) * rng.uniform(1, 7, (1, 9))).astype(dtype)
    _onnx_matches_ort("Mod", {"a": a, "b": b}, dtype, tmp_path, fmod=fmod)


@pytest.mark.parametrize(("shape", "repeats"), [((2, 3), (3, 2)), ((2, 1, 4), (1, 5, 2)), ((5,), (1,))])
def test_tile_at_run_time_matches_onnxruntime(shape, repeats, tmp_path):
    x = _values(4, shape)
    r = helper.make_tensor("r", TensorProto.INT64, [len(repeats)], list(repeats))
    graph = helper.make_graph([helper.make_node("Tile", ["x", "r"], ["y"])], "tile",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [r])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    ref = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    ours = CompiledModel(build_model(proto, tmp_path / "model"), threads=1).run([x])[0]
    np.testing.assert_array_equal(ours, ref)



def _rope(x):
    """Rotary position embedding as LLaMA-style models write it: sin and cos of position times frequency."""
    position = torch.arange(x.shape[1]).float()
    frequency = 1.0 / (10000 ** (torch.arange(0, x.shape[-1], 2).float() / x.shape[-1]))
    angles = torch.cat([position[:, None] * frequency] * 2, -1) + x[..., :1]  # at run time: sin/cos of data
    half = x.shape[-1] // 2
    return x * angles.cos() + torch.cat([-x[..., half:], x[..., :half]], -1) * angles.sin()


TORCH_CASES = {
    "trigonometry": lambda x: torch.sin(x) + torch.cos(x) + torch.tan(x) + torch.atan(x) + torch.sinh(x) +
    torch.cosh(x) + torch.asinh(x) + torch.asin(x / 8) + torch.acos(x / 8) + torch.atanh(x / 8) +
    torch.acosh(x.abs() + 1),
    "rotary_embedding": _rope,
    "rounding": lambda x: torch.floor(x) + torch.ceil(x) * 2 + torch.round(x) * 3 + torch.trunc(x) * 5 +
    torch.frac(x) * 7 + torch.round(x, decimals=2) * 11 + torch.round(x * 100, decimals=-1),
    "shrinks_and_sign": lambda x: torch.sign(x) + F.hardshrink(x) + F.softshrink(x) + F.tanhshrink(x),
    "remainders": lambda x: torch.remainder(x, 0.7) + torch.fmod(x, -0.7) * 2 + torch.remainder(x, x.flip(-1)),
    "float_floor_division": lambda x: torch.div(x, 0.3, rounding_mode="floor") + x // x.flip(0) +
    torch.div(x, -0.3, rounding_mode="trunc") + torch.div(x, 0.0, rounding_mode="floor").clamp(-9, 9),
    "integer_division": lambda x: ((x * 10).long() // 3 + torch.div((x * 10).long(), -3, rounding_mode="trunc") +
                                   torch.remainder((x * 10).long(), -3) + torch.fmod((x * 10).long(), 3)).float(),
    "atan2": lambda x: torch.atan2(x, x.flip(-1)) + torch.atan2(x, torch.zeros_like(x)),
    "other_bases": lambda x: torch.log2(x.abs() + 1) + torch.log10(x.abs() + 1) + torch.exp2(x),
    "nan_to_num": lambda x: torch.nan_to_num(torch.where(x > 1, x / 0, torch.where(x < -1, torch.sqrt(x), x))),
    "float_tests": lambda x: torch.isinf(x / 0).float() + torch.isposinf(x / 0).float() * 2 +
    torch.isneginf(x / 0).float() * 3 + torch.isnan(torch.log(x)).float() * 4,
    "max_min_dim": lambda x: torch.max(x, -1)[0].unsqueeze(-1) + torch.max(x, 1, keepdim=True)[1] +
    torch.min(x, 0, keepdim=True)[0] + torch.min(x, -1)[1].unsqueeze(-1),
    "max_min_all_and_pairwise": lambda x: torch.max(x) + torch.min(x) + torch.max(x, x.flip(0)) * 2 +
    torch.min(x, x.flip(1)),
    "any_all": lambda x: torch.where((x > 0).any(-1, keepdim=True), x, -x) + (x > -2).all().float() +
    (x > 1).any() + x.bool().all(1, keepdim=True),
    "var_mean": lambda x: torch.var_mean(x, -1)[0].unsqueeze(-1) + torch.var_mean(x, (0, 2), keepdim=True)[1],
    "repeat": lambda x: x.repeat(2, 1, 3) + 1,
    "repeat_with_new_axes": lambda x: x.repeat(2, 1, 1, 2).sum(0),
    "flip": lambda x: torch.flip(x, [-1]) + torch.flip(x, [0, 1]) * 2,
    "one_hot_of_argmax": lambda x: F.one_hot(torch.argmax(x, -1), 4).float(),
}


@pytest.mark.parametrize("name", sorted(TORCH_CASES))
def test_torch_numeric_functions_equal_eager(name):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4) * 2
    x[0, 0, :3] = torch.tensor([0.5, 2.5, -1.5])  # ties of rounding
    module = Fn(TORCH_CASES[name]).eval()
    want = module(x)
    got = compile_graph(tensorgen.from_torch(module, (x,))).run([x.numpy()])[0]
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-5, atol=2e-5)


def test_neg_flips_the_sign_of_zero(tmp_path):
    """ONNX Neg of 0.0 is -0.0 and of -0.0 is 0.0 (the kernel computed 0 - x, which gives +0.0 for both)."""
    x = np.array([[0.0, -0.0, 1.5, -2.0, np.inf, -np.inf]], np.float32)
    np.testing.assert_array_equal(np.signbit(_onnx_matches_ort("Neg", {"x": x}, np.float32, tmp_path)), np.signbit(-x))
