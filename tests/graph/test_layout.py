"""The channels-last rewrite (tensorgen.graph.passes.layout): same results, convolutions NHWC, few transposes."""

from __future__ import annotations

import numpy as np
import pytest
from test_onnx_frontend import make_model, node

from tensorgen.graph.load import load_graph
from tensorgen.graph.passes.layout import to_channels_last
from tensorgen.graph.reference.interpret import run_nodewise
from tensorgen.graph.zoo import build_model as zoo_model


def _ops(graph) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in graph.nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    return counts


def _same_results(graph, rewritten, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(graph.value(name).shape).astype(np.float32) for name in graph.inputs}
    want, got = run_nodewise(graph, feeds), run_nodewise(rewritten, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4 * float(np.abs(want[name]).max()))


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_zoo_convnets_run_channels_last_from_input_to_head(name):
    """Only the input keeps a Transpose (the pooled head is (1, 1, 1, C): a Reshape); every conv is NHWC."""
    graph = load_graph(zoo_model(name, image_size=32))
    cl = to_channels_last(graph)
    assert _ops(cl)["Transpose"] == 1 and all(n.attrs["layout"] == "NHWC" for n in cl.nodes if "Pool" in n.op)
    convs = [n for n in cl.nodes if n.op == "Conv"]
    assert convs and all(n.attrs["layout"] == "NHWC" for n in convs)
    assert all(cl.value(n.inputs[1]).shape[-1] == cl.value(n.outputs[0]).shape[-1] for n in convs)  # (kh, kw, ci, co)
    assert cl.inputs == graph.inputs and cl.outputs == graph.outputs
    _same_results(graph, cl)


def test_the_models_own_permutes_are_absorbed():
    """ConvNeXt permutes each block to channels-last for its LayerNorm and Linears and back for the residual: the
    residual stream stays channels-last, so of its 44 Transposes only the input's is left, and it computes the
    same."""
    graph = load_graph(zoo_model("convnext_tiny", image_size=32, width=8))
    assert _ops(graph)["Transpose"] == 2 * 18 + 2 * 4
    cl = to_channels_last(graph)
    assert _ops(cl)["Transpose"] == 1
    _same_results(graph, cl)


def test_constants_of_elementwise_ops_are_permuted_and_concat_moves_its_axis():
    """A per-channel constant (C, 1, 1) broadcast against NCHW becomes (1, 1, 1, C); Concat over channels
    concatenates over the last axis; an AveragePool with partial windows pools channels-last; a 1-D conv
    and a grouped conv are rewritten too."""
    rng = np.random.default_rng(1)

    def const(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    nodes = [node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             node("Mul", ["c1", "scale"], ["m"]),
             node("Conv", ["x", "w2"], ["c2"], group=2),
             node("Concat", ["m", "c2"], ["cat"], axis=1),
             node("Sigmoid", ["cat"], ["s"]),
             node("AveragePool", ["s"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=0)]
    inits = {"w1": const(4, 2, 3, 3), "scale": const(4, 1, 1), "w2": const(6, 1, 1, 1)}
    proto = make_model(nodes, {"x": ((1, 2, 5, 6), "float32")}, ["y"], inits)
    graph = load_graph(proto)
    cl = to_channels_last(graph)
    assert _ops(cl)["Transpose"] == 2
    assert next(n for n in cl.nodes if n.op == "Concat").attrs["axis"] == 3
    assert next(n for n in cl.nodes if n.op == "AveragePool").attrs["layout"] == "NHWC"
    _same_results(graph, cl)

    conv1d = make_model([node("Conv", ["x", "w"], ["y"], pads=[1, 1])], {"x": ((1, 3, 8), "float32")}, ["y"],
                        {"w": const(4, 3, 3)})
    graph = load_graph(conv1d)
    cl = to_channels_last(graph)
    assert next(n for n in cl.nodes if n.op == "Conv").attrs["layout"] == "NWC"
    _same_results(graph, cl)


def test_conv_with_a_computed_weight_stays_channels_first():
    nodes = [node("Relu", ["w"], ["wr"]), node("Conv", ["x", "wr"], ["y"])]
    proto = make_model(nodes, {"x": ((1, 2, 4, 4), "float32"), "w": ((3, 2, 1, 1), "float32")}, ["y"])
    graph = load_graph(proto)
    cl = to_channels_last(graph)
    assert _ops(cl) == _ops(graph) and "layout" not in next(n for n in cl.nodes if n.op == "Conv").attrs


def test_dcgan_conv_transposes_run_channels_last():
    """Every ConvTranspose NHWC: the first (stride 1 on the 1x1 latent) with a (kh, kw, C, M) weight, the
    stride-2 ones as col2im with a (C, kh*kw*M) weight; only the latent's and the image's Transposes remain."""
    graph = load_graph(zoo_model("dcgan", image_size=16))
    cl = to_channels_last(graph)
    convs = [n for n in cl.nodes if n.op == "ConvTranspose"]
    assert len(convs) == 3 and all(n.attrs["layout"] == "NHWC" for n in convs)
    assert [n.attrs.get("method") for n in convs] == [None, "col2im", "col2im"]
    assert cl.value(convs[0].inputs[1]).shape == (4, 4, 100, 128)  # (kh, kw, C, M)
    assert cl.value(convs[2].inputs[1]).shape == (64, 4 * 4 * 3)  # (C, kh * kw * M)
    assert _ops(cl).get("Transpose", 0) <= 2
    _same_results(graph, cl)


def test_conv_transposes_outside_the_gather_go_channels_last_or_stay():
    """Stride 2 with a 3x3 kernel and output_padding (the dilate-and-convolve path) goes channels-last;
    a grouped one stays channels-first."""
    rng = np.random.default_rng(2)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    nodes = [node("ConvTranspose", ["x", "w", "b"], ["t"], strides=[2, 2], pads=[1, 0, 1, 1], output_padding=[1, 0]),
             node("Relu", ["t"], ["r"]),
             node("ConvTranspose", ["r", "wg"], ["y"], group=3)]
    inits = {"w": w, "b": rng.uniform(-1, 1, 3).astype(np.float32),
             "wg": rng.uniform(-1, 1, (3, 2, 2, 2)).astype(np.float32)}
    graph = load_graph(make_model(nodes, {"x": ((1, 4, 5, 6), "float32")}, ["y"], inits))
    cl = to_channels_last(graph)
    first, grouped = [n for n in cl.nodes if n.op == "ConvTranspose"]
    assert first.attrs["layout"] == "NHWC" and "layout" not in grouped.attrs
    _same_results(graph, cl)
