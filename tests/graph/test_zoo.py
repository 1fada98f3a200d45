"""The model zoo: valid ONNX, runs in ONNX Runtime with sane outputs, deterministic, realistic op patterns."""

import math
from collections import Counter
from functools import cache

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tensorgen.graph.frontend.onnx_inputs import random_inputs
from tensorgen.graph.ir import GraphError
from tensorgen.graph.zoo import MODELS, build_model, list_models, load_model

OUTPUT_SHAPES = {
    "resnet18": (1, 1000),
    "resnet50": (1, 1000),
    "mobilenet_v2": (1, 1000),
    "resnet3d_18": (1, 400),
    "dcgan": (1, 3, 64, 64),
    "bert_base": (1, 128, 768),
    "bert_tiny": (1, 128, 128),
    "convnext_tiny": (1, 1000),
    "vit_small": (1, 1000),
}
# 100-440 MB of weights / 4-40 GFLOP: seconds each in ORT on 2 cores (ConvNeXt and ViT also run at SMALL)
SLOW = {"bert_base", "resnet3d_18", "convnext_tiny", "vit_small"}
SMALL = {"convnext_tiny": {"image_size": 64, "width": 16}, "vit_small": {"image_size": 32, "layers": 2}}


@cache
def zoo(name: str) -> onnx.ModelProto:
    return build_model(name)


def ort_run(model: onnx.ModelProto, feed: dict, optimize: bool = True) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feed)[0]


def test_output_shapes_cover_the_registry():
    assert set(OUTPUT_SHAPES) == set(MODELS)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_small_variants_are_valid_and_fused_equals_unfused(name):
    model = build_model(name, **SMALL[name])
    onnx.checker.check_model(model, full_check=True)
    feed = random_inputs(model, seed=1)
    out = ort_run(model, feed)
    assert out.shape == (1, 1000) and np.isfinite(out).all() and 0.3 < out.std() < 3
    np.testing.assert_allclose(out, ort_run(model, feed, optimize=False), rtol=1e-3, atol=1e-3 * out.std())


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in OUTPUT_SHAPES])
def test_model_is_valid_and_runs_in_onnxruntime(name):
    model = zoo(name)
    onnx.checker.check_model(model, full_check=True)
    inputs = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.input}
    assert inputs == MODELS[name].input_shapes
    assert [o.name for o in model.graph.output] == ["output"]

    out = ort_run(model, random_inputs(model, seed=0))
    assert out.shape == OUTPUT_SHAPES[name]
    assert np.isfinite(out).all()
    assert out.std() > 1e-2 and np.abs(out).max() < 1e3
    # ORT's fused graph (Conv+BN folding, GELU/attention/LayerNorm fusions) reorders float32 arithmetic:
    # the weights keep activations in range, so the two programs agree to ~1e-3
    unfused = ort_run(model, random_inputs(model, seed=0), optimize=False)
    np.testing.assert_allclose(out, unfused, rtol=1e-3, atol=1e-3 * out.std())


@pytest.mark.parametrize(
    "name, options",
    [
        ("bert_tiny", {"seq_len": 16}),
        ("dcgan", {"image_size": 16}),
        ("mobilenet_v2", {"image_size": 64}),
        *SMALL.items(),
    ],
)
def test_onnx_reference_evaluator_agrees_with_onnxruntime(name, options):
    model = build_model(name, **options)
    feed = random_inputs(model, seed=3)
    expected = ReferenceEvaluator(model).run(None, feed)[0]
    np.testing.assert_allclose(ort_run(model, feed), expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(
    "name, batch, options, shape",
    [
        ("resnet18", 2, {"image_size": 64}, (2, 1000)),
        ("resnet3d_18", 1, {"frames": 4, "image_size": 32}, (1, 400)),
        ("dcgan", 3, {"image_size": 32}, (3, 3, 32, 32)),
        ("bert_tiny", 2, {"seq_len": 24}, (2, 24, 128)),
        ("convnext_tiny", 2, SMALL["convnext_tiny"], (2, 1000)),
        ("convnext_tiny", 1, {"image_size": 48, "width": 8}, (1, 1000)),
        ("vit_small", 2, SMALL["vit_small"], (2, 1000)),
        ("vit_small", 1, {"image_size": 48, "layers": 1}, (1, 1000)),
    ],
)
def test_batch_and_options_set_the_shapes(name, batch, options, shape):
    model = build_model(name, batch=batch, **options)
    out = ort_run(model, random_inputs(model))
    assert out.shape == shape and np.isfinite(out).all() and out.std() > 1e-2


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("name", ["resnet18", "bert_tiny", "mobilenet_v2"])
def test_seed_determines_the_model(name):
    assert build_model(name, seed=0).SerializeToString() == zoo(name).SerializeToString()
    other = build_model(name, seed=1)
    assert [n.name for n in other.graph.node] == [n.name for n in zoo(name).graph.node]
    a, b = _weights(zoo(name)), _weights(other)
    assert a.keys() == b.keys() and not all(np.array_equal(a[k], b[k]) for k in a)


def test_weights_do_not_depend_on_batch_or_seq_len():
    batch4, batch1 = _weights(build_model("resnet18", batch=4)), _weights(zoo("resnet18"))
    assert batch4.keys() == batch1.keys()
    for key, value in batch4.items():
        np.testing.assert_array_equal(value, batch1[key])
    short, full = _weights(build_model("bert_tiny", seq_len=16)), _weights(zoo("bert_tiny"))
    np.testing.assert_array_equal(short["embeddings.word_embeddings.weight"], full["embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(
        short["embeddings.position_embeddings"], full["embeddings.position_embeddings"][:, :16]
    )


# op counts of the reference architectures (torchvision / HuggingFace modules, one ONNX op per layer)
OP_COUNTS = {
    "resnet18": {"Conv": 20, "BatchNormalization": 20, "Add": 8, "MaxPool": 1, "GlobalAveragePool": 1, "Gemm": 1},
    "resnet50": {"Conv": 53, "BatchNormalization": 53, "Add": 16, "Relu": 49, "Gemm": 1},
    "mobilenet_v2": {"Conv": 52, "BatchNormalization": 52, "Clip": 35, "Add": 10, "Relu": 0, "Gemm": 1},
    "resnet3d_18": {"Conv": 20, "BatchNormalization": 20, "Add": 8, "GlobalAveragePool": 1, "Gemm": 1},
    "dcgan": {"ConvTranspose": 5, "BatchNormalization": 4, "Relu": 4, "Tanh": 1},
    "bert_tiny": {"Gather": 1, "LayerNormalization": 5, "Softmax": 2, "Erf": 2, "MatMul": 16, "Reshape": 8},
    # 18 blocks: dwconv, 2 Transposes, LayerNorm, 2 MatMuls; 4 downsamples (LayerNorm2d: 2 Transposes) + head norm
    "convnext_tiny": {
        "Conv": 22,
        "LayerNormalization": 23,
        "Transpose": 44,
        "MatMul": 36,
        "Erf": 18,
        "Mul": 54,
        "ReduceMean": 1,
        "Gemm": 1,
    },
    # 12 layers: 2 LayerNorms, 6 MatMuls, 4 Reshapes, 4 Transposes; patch flatten, class token, final norm
    "vit_small": {
        "Conv": 1,
        "LayerNormalization": 25,
        "MatMul": 96,
        "Softmax": 12,
        "Erf": 12,
        "Reshape": 49,
        "Transpose": 49,
        "Expand": 1,
        "Concat": 1,
        "Gather": 1,
        "Gemm": 1,
    },
}
BIASED_CONVS = {"convnext_tiny", "vit_small"}


@pytest.mark.parametrize("name", sorted(OP_COUNTS))
def test_graphs_have_the_architecture_and_exporter_patterns(name):
    model = zoo(name)
    counts = Counter(n.op_type for n in model.graph.node)
    assert {op: counts[op] for op in OP_COUNTS[name]} == OP_COUNTS[name]
    initializers = {t.name: tuple(t.dims) for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type in ("Conv", "ConvTranspose"):  # bias=False but in ConvNeXt/ViT, weights as initializers
            assert len(node.input) == (3 if name in BIASED_CONVS else 2)
            assert all(i in initializers for i in node.input[1:])
        if node.op_type == "BatchNormalization":  # always right after its conv
            assert producers[node.input[0]].op_type in ("Conv", "ConvTranspose")
        if node.op_type == "Clip":  # ReLU6 with min/max as Constant-node inputs
            assert [producers[i].op_type for i in node.input[1:]] == ["Constant", "Constant"]
        if node.op_type == "Reshape":  # the shape is a Constant node, not an initializer
            assert producers[node.input[1]].op_type == "Constant"


def test_resnet3d_convs_have_3d_kernels():
    kernels = [
        next(a.ints for a in n.attribute if a.name == "kernel_shape")
        for n in zoo("resnet3d_18").graph.node
        if n.op_type == "Conv"
    ]
    assert list(kernels[0]) == [3, 7, 7] and all(len(k) == 3 for k in kernels)


def test_bert_embeddings_match_numpy():
    """The embedding block (Gather + constant position/token-type rows + LayerNorm) against NumPy."""
    model = build_model("bert_tiny", seq_len=8)
    w = _weights(model)
    ln = next(n for n in model.graph.node if n.op_type == "LayerNormalization")
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(ln.output[0], TensorProto.FLOAT, None))
    ids = np.array([[0, 5, 30521, 7, 7, 1, 2, 3]], np.int64)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.token_type_embeddings"]
    x = x + w["embeddings.position_embeddings"]
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    expected = x * w["embeddings.LayerNorm.weight"] + w["embeddings.LayerNorm.bias"]
    np.testing.assert_allclose(ort_run(model, {"input_ids": ids}), expected, rtol=1e-4, atol=1e-5)


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    return x * gamma + beta


def _truncated(model: onnx.ModelProto, node: onnx.NodeProto) -> onnx.ModelProto:
    """`model` with the output of `node` as its only output."""
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, None))
    return model


def test_convnext_stem_and_first_block_match_numpy():
    """Patchify conv + channels-first LayerNorm, then one block (dwconv, LN, MLP, layer scale, residual)."""
    model = build_model("convnext_tiny", image_size=32, width=8)
    w = _weights(model)
    residual = [n for n in model.graph.node if n.op_type == "Add" and n.name.startswith("/stages/0/0/")][-1]
    image = random_inputs(model, seed=2)["input"]
    got = ort_run(_truncated(model, residual), {"input": image})

    def conv(x, weight, bias, stride, pad, groups):
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        n, c, h, wd = x.shape
        cout, cin, k, _ = weight.shape
        oh, ow = (h - k) // stride + 1, (wd - k) // stride + 1
        out = np.zeros((n, cout, oh, ow), np.float64)
        per = cout // groups
        for o in range(cout):
            g = o // per
            for i in range(k):
                for j in range(k):
                    patch = x[:, g * cin : (g + 1) * cin, i : i + stride * oh : stride, j : j + stride * ow : stride]
                    out[:, o] += np.einsum("nchw,c->nhw", patch, weight[o, :, i, j])
        return out + bias[None, :, None, None]

    x = conv(image, w["downsample_layers.0.0.weight"], w["downsample_layers.0.0.bias"], 4, 0, 1)
    x = _layer_norm(x.transpose(0, 2, 3, 1), w["downsample_layers.0.1.weight"], w["downsample_layers.0.1.bias"], 1e-6)
    x = x.transpose(0, 3, 1, 2)
    p = "stages.0.0."
    y = conv(x, w[p + "dwconv.weight"], w[p + "dwconv.bias"], 1, 3, 8).transpose(0, 2, 3, 1)
    y = _layer_norm(y, w[p + "norm.weight"], w[p + "norm.bias"], 1e-6) @ w[p + "pwconv1.weight"] + w[p + "pwconv1.bias"]
    y = 0.5 * y * (1 + np.vectorize(math.erf)(y / np.sqrt(2)))
    y = (y @ w[p + "pwconv2.weight"] + w[p + "pwconv2.bias"]) * w[p + "gamma"]
    expected = x + y.transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_vit_embeddings_and_head_match_numpy():
    """Patches + class token + position embeddings; the logits read the class token after the final LayerNorm."""
    model = build_model("vit_small", image_size=32, layers=1)
    w = _weights(model)
    image = random_inputs(model, seed=2)["input"]
    concat_add = next(n for n in model.graph.node if n.name == "/vit/embeddings/Add")
    got = ort_run(_truncated(build_model("vit_small", image_size=32, layers=1), concat_add), {"input": image})
    patches = image.reshape(1, 3, 2, 16, 2, 16).transpose(0, 2, 4, 1, 3, 5).reshape(1, 4, 3 * 16 * 16)
    p = "vit.embeddings."
    tokens = patches @ w[p + "patch_embeddings.projection.weight"].reshape(384, -1).T
    tokens = tokens + w[p + "patch_embeddings.projection.bias"]
    expected = np.concatenate([w[p + "cls_token"], tokens], axis=1) + w[p + "position_embeddings"]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())

    final = next(n for n in model.graph.node if n.name == "/vit/layernorm/LayerNormalization")
    hidden = ort_run(_truncated(build_model("vit_small", image_size=32, layers=1), final), {"input": image})
    logits = hidden[:, 0] @ w["classifier.weight"].T + w["classifier.bias"]
    np.testing.assert_allclose(ort_run(model, {"input": image}), logits, rtol=1e-4, atol=1e-4 * np.abs(logits).max())


def test_list_models():
    listed = list_models()
    assert [name for name, _ in listed] == list(MODELS)
    assert all(description and "\n" not in description for _, description in listed)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: build_model("resnet101"), "known models: resnet18, resnet50"),
        (lambda: build_model("resnet18", seq_len=8), "has no option seq_len"),
        (lambda: build_model("resnet18", batch=0), "batch must be a positive integer"),
        (lambda: build_model("bert_tiny", seq_len=1000), "seq_len must be in 1..512"),
        (lambda: build_model("dcgan", image_size=48), "power of two"),
        (lambda: build_model("vit_small", image_size=40), "multiple of 16"),
        (lambda: build_model("convnext_tiny", image_size=16), "at least 32"),
        (lambda: build_model("vit_small", width=8), "has no option width"),
        (lambda: load_model("no/such/model.onnx"), "neither a zoo model"),
    ],
)
def test_errors_name_the_problem(call, message):
    with pytest.raises(GraphError, match=message):
        call()


def test_load_model_by_name_and_path(tmp_path):
    assert load_model("dcgan").SerializeToString() == zoo("dcgan").SerializeToString()
    path = tmp_path / "dcgan.onnx"
    onnx.save(zoo("dcgan"), path)
    loaded = load_model(path)
    feed = random_inputs(loaded)
    np.testing.assert_array_equal(ort_run(loaded, feed), ort_run(zoo("dcgan"), feed))
    with pytest.raises(GraphError, match="apply to zoo models only"):
        load_model(path, batch=2)
    (tmp_path / "junk.onnx").write_bytes(b"\xff\x00 not a protobuf")
    with pytest.raises(GraphError, match="cannot read ONNX model"):
        load_model(tmp_path / "junk.onnx")


def test_random_inputs():
    feed = random_inputs(zoo("bert_tiny"), seed=5)
    ids = feed["input_ids"]
    assert ids.dtype == np.int64 and ids.shape == (1, 128) and 0 <= ids.min() and ids.max() < 30522
    np.testing.assert_array_equal(ids, random_inputs(zoo("bert_tiny"), seed=5)["input_ids"])
    image = random_inputs(zoo("resnet18"))["input"]
    assert image.dtype == np.float32 and abs(image.std() - 1) < 0.01
    untyped = helper.make_model(
        helper.make_graph(
            [helper.make_node("Cast", ["n"], ["y"], to=TensorProto.FLOAT)],
            "g",
            [helper.make_tensor_value_info("n", TensorProto.INT64, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        )
    )
    with pytest.raises(GraphError, match="input 'n'"):
        random_inputs(untyped)
    untyped.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    with pytest.raises(GraphError, match="symbolic dimension"):
        random_inputs(untyped)
