"""The PyTorch frontend: torch.export graphs imported into the graph IR (tensorgen.graph.frontend.torch_import) and
the `torch.compile(backend="tensorgen")` backend (tensorgen.dynamo), checked against eager PyTorch."""

from __future__ import annotations

import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import tensorgen  # noqa: E402
from tensorgen.dynamo import CompileOptions, compile_graph, tensorgen_backend  # noqa: E402
from tensorgen.graph.backend.tasks import extract_tasks  # noqa: E402
from tensorgen.graph.frontend.onnx_import import import_onnx  # noqa: E402
from tensorgen.graph.frontend.torch_import import import_torch, supported_ops  # noqa: E402
from tensorgen.graph.ir import GraphError  # noqa: E402
from tensorgen.graph.load import load_graph  # noqa: E402
from tensorgen.graph.reference.interpret import run_nodewise  # noqa: E402
from tensorgen.graph.reference.torch_zoo import torch_model  # noqa: E402
from tensorgen.records.database import SQLiteDatabase  # noqa: E402


class ResBlock(nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.pool, self.fc = nn.MaxPool2d(2), nn.Linear(c, 10)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)) + x)
        return self.fc(F.adaptive_avg_pool2d(self.pool(y), 1).flatten(1))


class GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 8)

    def forward(self, x):
        return self.b(F.gelu(self.a(x)))


class Depthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw, self.pw = nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.Conv2d(8, 16, 1)

    def forward(self, x):
        return F.hardswish(self.pw(F.relu6(self.dw(x))))


class Attention(nn.Module):
    """scaled_dot_product_attention as models call it: plain, causal, with a scale, with a boolean buffer mask
    and with a float mask computed from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.register_buffer("allowed", (torch.rand(1, 1, 5, 5) < 0.7) | torch.eye(5, dtype=torch.bool))

    def forward(self, x):
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, dim=-1))
        bias = torch.tanh(x[:, None, :, :5])  # (2, 1, 5, 5)
        return (F.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                F.scaled_dot_product_attention(q, k, v, scale=0.3),
                F.scaled_dot_product_attention(q, k, v, attn_mask=self.allowed),
                F.scaled_dot_product_attention(q, k, v, attn_mask=bias))


def encoder_layer() -> nn.Module:
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)


class Misc(nn.Module):
    """Shape ops and elementwise ops the models above do not use."""

    def forward(self, x):
        a, b = torch.split(x, [2, 6], dim=1)
        y = torch.cat([b, torch.sigmoid(a) * 2.0 - 1.0], dim=1).permute(0, 2, 3, 1)
        y = F.pad(y + torch.rsqrt(y.abs() + 1) - F.leaky_relu(y, 0.2), (1, 2))
        z = F.interpolate(x, scale_factor=2.0, mode="nearest")
        w = F.pad(x, (1, 1, 2, 0), mode="reflect") + F.pad(x, (1, 1, 2, 0), mode="replicate")
        picked = x[:, torch.tensor([3, 0, 3])]
        return (y[:, 1:3].sum(dim=-1), torch.clamp(z, -0.5, 0.5).mean(dim=(2, 3), keepdim=True), F.silu(x[:, 0]),
                w, picked)


class Activations(nn.Module):
    """The activations export decomposes into comparisons, where, log1p and expm1, masks computed at run time, and
    max / min reductions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.prelu = nn.Conv2d(4, 6, 3, padding=1), nn.PReLU(6)

    def forward(self, x):
        y = self.prelu(self.conv(x))
        y = F.softplus(y) + F.mish(y) - F.celu(y) + F.elu(y, 0.5) + F.selu(y) + torch.log(y.abs() + 1)
        y = torch.where(y > 1, y, -y) + F.log_softmax(y, dim=1)
        keep = (x[:, :1] != 0.5) & ~(x[:, 1:2] <= -1) | (x[:, 2:3] >= 2)
        y = y - y.amax(dim=1, keepdim=True) + y.amin(dim=(2, 3), keepdim=True)
        return y.masked_fill(keep, 0.25) * torch.logical_xor(y < 0, x[:, 3:4] == 0).float()


class Norms(nn.Module):
    """Instance norm (batch norm on the input viewed as one sample) and group norm after convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.inorm = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
        self.conv2, self.gnorm = nn.Conv2d(8, 8, 3, padding=1), nn.GroupNorm(4, 8)
        self.plain = nn.InstanceNorm2d(8)
        for norm in (self.inorm, self.gnorm):
            nn.init.uniform_(norm.weight, 0.5, 2.0)
            nn.init.uniform_(norm.bias, -1.0, 1.0)

    def forward(self, x):
        y = F.silu(self.inorm(self.conv1(x)))
        return self.plain(self.gnorm(self.conv2(y)) + y)


class Statistics(nn.Module):
    """var and std (biased and not), F.normalize and vector norms of orders 1, 2 and inf."""

    def forward(self, x):
        y = F.normalize(x, dim=1) + x.var(1, keepdim=True) - x.std(-1, keepdim=True)
        y = y * torch.var(x, dim=(2, 3), unbiased=False, keepdim=True) + x.norm(dim=-1, keepdim=True)
        return y + torch.linalg.vector_norm(x, 1, dim=1, keepdim=True) - x.abs().amax() + x.var()


CASES = {
    "activations": (Activations, (2, 4, 5, 5)),
    "statistics": (Statistics, (2, 3, 4, 5)),
    "norms": (Norms, (2, 3, 6, 6)),
    "resblock": (ResBlock, (1, 8, 8, 8)),
    "gelu_mlp": (GeluMLP, (4, 32)),
    "depthwise": (Depthwise, (1, 8, 8, 8)),
    "encoder_layer": (encoder_layer, (2, 6, 32)),
    "attention": (Attention, (2, 5, 16)),
    "misc": (Misc, (2, 8, 4, 4)),
}


def _module(name: str) -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    make, shape = CASES[name]
    module = make().eval()
    for m in module.modules():  # statistics that make batch norm do something
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            m.weight.data.uniform_(0.5, 2)
    return module, torch.randn(shape)


def _eager(module: nn.Module, x: torch.Tensor) -> list[np.ndarray]:
    return _eager_many(module, [x])


@pytest.mark.parametrize("name", sorted(CASES))
def test_compiled_module_equals_eager(name):
    """Imported, optimized, built with default schedules and run: the outputs of eager PyTorch."""
    module, x = _module(name)
    graph = tensorgen.from_torch(module, (x,))
    got = compile_graph(graph).run([x.numpy()])
    want = _eager(module, x)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["resnet18", "bert_tiny", "dcgan"])  # depthwise convs: CASES
def test_zoo_models_as_torch_modules(name):
    """The zoo's PyTorch modules imported directly compute what eager PyTorch does (NumPy interpreter)."""
    module, onnx_model = torch_model(name)
    inputs = [torch.from_numpy(_feed(v, i)) for i, v in enumerate(onnx_model.graph.input)]
    graph = import_torch(module, inputs)
    got = run_nodewise(load_graph(graph), dict(zip(graph.inputs, (x.numpy() for x in inputs))))
    for out, want in zip(graph.outputs, _eager_many(module, inputs)):
        np.testing.assert_allclose(got[out], want, rtol=2e-4, atol=2e-4)


def _feed(value, seed: int) -> np.ndarray:
    from onnx import helper

    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, 2 if "type" in value.name or "mask" in value.name else 100, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _eager_many(module: nn.Module, inputs: list[torch.Tensor]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*inputs)
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


class MaskedAttention(nn.Module):
    def forward(self, q, k, v, allowed):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def test_attention_with_a_boolean_mask_input_equals_eager():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8) for _ in range(3))
    allowed = (torch.rand(1, 1, 4, 4) < 0.6) | torch.eye(4, dtype=torch.bool)  # every query attends somewhere
    module = MaskedAttention().eval()
    got = compile_graph(tensorgen.from_torch(module, (q, k, v, allowed))).run([t.numpy() for t in (q, k, v, allowed)])
    np.testing.assert_allclose(got[0], _eager_many(module, [q, k, v, allowed])[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["resnet18", "bert_tiny"])
def test_a_zoo_model_has_the_tasks_of_its_onnx_twin(name):
    """Imported from PyTorch or from ONNX, a model has the same tuning tasks: one database serves both
    (BERT's Linears, GELU and attention are written differently by the two exporters: graph.passes.canonical)."""
    module, onnx_model = torch_model(name)
    x = torch.from_numpy(_feed(onnx_model.graph.input[0], 0))
    from_torch = {t.task.workload_key for t in extract_tasks(load_graph(import_torch(module, (x,))))}
    from_onnx = {t.task.workload_key for t in extract_tasks(load_graph(import_onnx(onnx_model)))}
    assert from_torch == from_onnx


def test_torch_compile_backend_matches_eager_and_caches_by_structure():
    module, x = _module("resblock")
    calls = []

    def counting(gm, example_inputs, **kwargs):
        calls.append(len(example_inputs))
        return tensorgen_backend(gm, example_inputs, **kwargs)

    compiled = torch.compile(module, backend=counting)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), _eager(module, x)[0], rtol=1e-4, atol=1e-4)
        y = torch.randn_like(x)
        np.testing.assert_allclose(compiled(y).numpy(), _eager(module, y)[0], rtol=1e-4, atol=1e-4)
    assert len(calls) == 1


def test_new_sizes_compile_again_for_those_sizes():
    """TorchDynamo makes a graph dynamic after a call with new sizes; tensorgen compiles each size it sees."""
    torch._dynamo.reset()
    module, _ = _module("gelu_mlp")
    compiled = torch.compile(module, backend="tensorgen")
    with torch.no_grad():
        for batch in (2, 3, 5, 3):
            x = torch.randn(batch, 32)
            np.testing.assert_allclose(compiled(x).numpy(), _eager(module, x)[0], rtol=1e-4, atol=1e-4)


def test_registered_backend_name_resolves():
    """`backend="tensorgen"` resolves through the torch_dynamo_backends entry point."""
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("tensorgen") is tensorgen_backend


class Breaks(nn.Module):
    """Python TorchDynamo cannot trace (a print) breaks the graph in two."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.a(x))
        print("between the graphs")
        return self.b(y * 2)


def test_a_graph_break_gives_graphs_each_compiled():
    torch.manual_seed(0)
    module = Breaks().eval()
    graphs = []

    def counting(gm, example_inputs, **kwargs):
        graphs.append(gm)
        return tensorgen_backend(gm, example_inputs, **kwargs)

    torch._dynamo.reset()
    compiled = torch.compile(module, backend=counting)
    x = torch.randn(3, 8)
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), _eager(module, x)[0], rtol=1e-5, atol=1e-5)
    assert len(graphs) >= 2


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 3)

    def forward(self, x):
        y = torch.lgamma(torch.relu(self.a(x)) + 1)  # no converter for aten.lgamma
        return self.b(y), y.sum() > 0


def test_an_unsupported_op_is_named_with_its_source_line():
    with pytest.raises(GraphError, match=r"aten\.lgamma is not supported.*test_torch_frontend\.py.*lgamma"):
        import_torch(Unsupported(), (torch.randn(2, 5),))


def test_torch_compile_of_an_unsupported_op_raises_its_one_line_at_the_call():
    """Without fallback the caller gets tensorgen's GraphError itself (the op it names), not TorchDynamo's
    BackendCompilerFailed wrapped around it."""
    torch._dynamo.reset()
    compiled = torch.compile(Unsupported().eval(), backend="tensorgen")
    with pytest.raises(GraphError, match=r"aten\.lgamma is not supported"), torch.no_grad():
        compiled(torch.randn(2, 5))


def test_fallback_compiles_the_parts_around_unsupported_ops(caplog, monkeypatch):
    """With fallback=True the linear layers around the lgamma are compiled by tensorgen, the rest runs eagerly."""
    import tensorgen.dynamo as dynamo

    built = []
    monkeypatch.setattr(dynamo, "compile_graph", lambda graph, config: built.append(graph) or compile_graph(graph,
                                                                                                            config))
    torch._dynamo.reset()
    torch.manual_seed(0)
    module, x = Unsupported().eval(), torch.randn(2, 5)
    compiled = torch.compile(module, backend="tensorgen", options={"fallback": True})
    with caplog.at_level(logging.WARNING, logger="tensorgen.dynamo"), torch.no_grad():
        got = compiled(x)
    want = _eager(module, x)
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-5, atol=1e-6)
    assert bool(got[1]) == bool(want[1])
    assert "aten.lgamma" in caplog.text
    assert sum(n.op == "Gemm" for g in built for n in g.nodes) == 2


def test_options_are_checked():
    with pytest.raises(tensorgen.TensorgenError, match="no option 'trails'"):
        CompileOptions.of({"trails": 4})
    with pytest.raises(tensorgen.TensorgenError, match="trials must be >= 0"):
        CompileOptions.of({"trials": -1})


def test_trials_tune_into_the_database_once(tmp_path):
    """trials > 0 tunes the graph's tasks; compiling it again finds the budget spent and tunes nothing."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    module, x = GeluMLP().eval(), torch.randn(4, 32)
    db = tmp_path / "t.db"
    compiled = torch.compile(module, backend="tensorgen", options={"db": str(db), "trials": 4})
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x).numpy(), _eager(module, x)[0], rtol=1e-4, atol=1e-4)

    def count() -> int:
        with SQLiteDatabase(db) as d:
            return sum(n for _, _, n in d.workloads())

    first = count()
    assert first >= 4
    torch._dynamo.reset()
    again = torch.compile(module, backend="tensorgen", options={"db": str(db), "trials": 4})
    with torch.no_grad():
        again(x)
    assert count() == first


def test_supported_ops_cover_the_common_layers():
    ops = set(supported_ops())
    assert {"aten.convolution", "aten.addmm", "aten.native_layer_norm", "aten._softmax", "aten.embedding"} <= ops


class RandomChain(nn.Module):
    """A seeded random chain of the ops the frontend converts, for generated tests."""

    UNARY = (torch.relu, torch.sigmoid, torch.tanh, torch.exp, F.gelu, F.silu, F.hardswish, F.relu6, torch.abs,
             lambda t: F.leaky_relu(t, 0.1), lambda t: torch.clamp(t, -1.0, 2.0), lambda t: torch.rsqrt(t.abs() + 1))

    def __init__(self, seed: int, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.rng = np.random.default_rng(seed)
        self.steps = [int(self.rng.integers(0, 8)) for _ in range(6)]
        self.picks = [int(self.rng.integers(0, 1000)) for _ in range(6)]
        self.scale = nn.Parameter(torch.randn(shape[-1]))

    def forward(self, x):
        for step, pick in zip(self.steps, self.picks):
            rank = x.dim()
            if step == 0:
                x = self.UNARY[pick % len(self.UNARY)](x)
            elif step == 1 and x.shape[-1] == self.scale.shape[0]:
                x = x * self.scale + 0.5
            elif step == 2:
                x = x.permute(*reversed(range(rank)))
            elif step == 3 and rank >= 2:
                x = x.reshape(*x.shape[:-2], -1)
            elif step == 4:
                x = torch.softmax(x, dim=pick % rank)
            elif step == 5 and x.shape[-1] > 1:
                x = torch.cat([x[..., 1:], x[..., :1]], dim=-1)
            elif step == 6 and rank >= 2:
                x = x.mean(dim=pick % rank, keepdim=bool(pick % 2))
            elif step == 7:
                x = x.unsqueeze(pick % (rank + 1)).transpose(0, -1)
        return x


@pytest.mark.parametrize("seed", range(16))
def test_generated_chains_equal_eager(seed):
    """Imported chains interpreted by NumPy, and the first few compiled to C, compute what eager PyTorch does."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(d) for d in rng.integers(1, 6, size=int(rng.integers(2, 5))))
    torch.manual_seed(seed)
    module, x = RandomChain(seed, shape).eval(), torch.randn(shape)
    graph = import_torch(module, (x,))
    want = _eager(module, x)[0]
    got = run_nodewise(load_graph(graph), {graph.inputs[0]: x.numpy()})
    np.testing.assert_allclose(got[graph.outputs[0]], want, rtol=1e-5, atol=1e-5)
    if seed < 3:
        np.testing.assert_allclose(compile_graph(graph).run([x.numpy()])[0], want, rtol=1e-4, atol=1e-5)


class _Casts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)

    def forward(self, x, mask, ids):
        return x * mask.float() + x.to(torch.float32).double().float() + self.emb(ids.long()).sum(1, keepdim=True)


def test_dtype_conversions_compile():
    """`.float()`, `.long()`, `.to(dtype)` (export checks them with aten._assert_tensor_metadata: skipped)."""
    module = _Casts().eval()
    x, mask, ids = torch.randn(3, 4), torch.rand(3, 4) > 0.5, torch.randint(0, 10, (3, 5), dtype=torch.int32)
    with torch.no_grad():
        want = module(x, mask, ids)
        torch.testing.assert_close(torch.compile(module, backend="tensorgen")(x, mask, ids), want)
        graph = tensorgen.from_torch(module, (x, mask, ids))
        got = run_nodewise(graph, dict(zip(graph.inputs, (x.numpy(), mask.numpy(), ids.numpy()))))
        torch.testing.assert_close(torch.from_numpy(got[graph.outputs[0]]), want)


class _Accumulates(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x.sum(0))
        return x - self.total


class _ScalesItsInput(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


@pytest.mark.parametrize("module", [_Accumulates(), _ScalesItsInput()], ids=["buffer", "input"])
def test_a_model_that_changes_a_tensor_in_place_is_refused(module):
    """Not a silent wrong answer (the outputs came back shifted and the change was lost)."""
    with pytest.raises(GraphError, match="in place"):
        tensorgen.from_torch(module, (torch.ones(2, 4),))


class _Nearest(nn.Module):
    def __init__(self, **how) -> None:
        super().__init__()
        self.how = how

    def forward(self, x):
        return F.interpolate(x, mode="nearest", **self.how)


@pytest.mark.parametrize("how, shape", [({"size": (6, 6)}, (1, 2, 9, 9)), ({"scale_factor": 1.7}, (1, 1, 4, 4)),
                                        ({"scale_factor": (1.5, 0.75)}, (2, 1, 6, 8)), ({"size": 9}, (1, 2, 4)),
                                        ({"scale_factor": 2}, (1, 3, 5, 4))])
def test_nearest_interpolation_reads_the_pixels_pytorch_reads(how, shape):
    """Where the ratio is not an integer ONNX's o / (m / n) and PyTorch's o * (n / m) floor differently (9 -> 6 read
    rows 0 1 2 4 5 7 instead of 0 1 3 4 6 7), and a given scale_factor is used as given."""
    module, x = _Nearest(**how), torch.randn(shape)
    graph = tensorgen.from_torch(module, (x,))
    np.testing.assert_array_equal(compile_graph(graph).run([x.numpy()])[0], _eager(module, x)[0])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_fast_path_under_torch_compile(norm_first):
    """In eval under no_grad TorchDynamo traces nn.TransformerEncoderLayer's fast path, one
    aten._transformer_encoder_layer_fwd: decomposed into the ops it stands for (with its merged key padding mask)."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_first,
                                       activation="gelu" if norm_first else "relu").eval()
    padding = torch.tensor([[False] * 5 + [True], [False] * 6])

    class Encoder(nn.Module):
        def forward(self, x):
            return layer(x, src_key_padding_mask=padding)

    x = torch.randn(2, 6, 32)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(Encoder(), backend="tensorgen")(x), Encoder()(x))


def test_python_number_arguments_that_change_between_calls():
    """TorchDynamo makes a float argument that changes a run-time scalar (a tensor and .item()) and an int one a
    size: the graph compiled at the call that first sees them computes what eager does (it raised at that call)."""

    class Scaled(nn.Module):
        def forward(self, x, alpha, n):
            return x * alpha + n

    torch._dynamo.reset()
    compiled, module = torch.compile(Scaled(), backend="tensorgen"), Scaled()
    with torch.no_grad():
        for alpha, n in ((0.5, 1), (0.7, 2), (0.9, 2)):
            x = torch.randn(2, 3)
            torch.testing.assert_close(compiled(x, alpha, n), module(x, alpha, n))


def test_weights_changed_after_compiling_are_used():
    """Parameters are constants of a build; changed in place (an optimizer step, load_state_dict) the graph is
    built again at its next call (the old weights were used silently)."""
    torch.manual_seed(0)
    module, x = nn.Linear(4, 2).eval(), torch.randn(3, 4)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="tensorgen")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x))
        module.weight.mul_(2)
        torch.testing.assert_close(compiled(x), module(x))
        module.load_state_dict({"weight": torch.randn(2, 4), "bias": torch.randn(2)})
        torch.testing.assert_close(compiled(x), module(x))
        module.weight.data = torch.randn(2, 4)  # new memory, the version counter of the new tensor
        torch.testing.assert_close(compiled(x), module(x))


class _Linear(nn.Module):
    def __init__(self, **how) -> None:
        super().__init__()
        self.how = how

    def forward(self, x):
        return F.interpolate(x, **self.how)


@pytest.mark.parametrize("how, shape", [
    ({"size": (7, 5), "mode": "bilinear", "align_corners": False}, (1, 2, 4, 3)),
    ({"size": (7, 5), "mode": "bilinear", "align_corners": True}, (2, 2, 4, 3)),
    ({"scale_factor": 1.7, "mode": "bilinear"}, (1, 1, 5, 6)),
    ({"scale_factor": (0.5, 1.5), "mode": "bilinear", "align_corners": True}, (1, 2, 8, 6)),
    ({"size": 11, "mode": "linear"}, (2, 3, 4))])
def test_linear_interpolation_equals_eager(how, shape):
    module, x = _Linear(**how), torch.randn(shape)
    graph = tensorgen.from_torch(module, (x,))
    np.testing.assert_allclose(compile_graph(graph).run([x.numpy()])[0], _eager(module, x)[0], rtol=1e-5, atol=1e-6)


def test_a_graph_torch_export_cannot_trace_runs_eagerly_with_fallback(caplog):
    """A float attribute changed between calls (batch norm's eps) becomes a run-time scalar that torch.export cannot
    retrace: with fallback=True that graph runs in eager PyTorch, with a warning, and computes what eager does."""
    module, x = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval(), torch.randn(2, 3, 7, 9)
    torch._dynamo.reset()
    compiled = torch.compile(module, backend="tensorgen", options={"fallback": True})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="tensorgen.dynamo"):
        torch.testing.assert_close(compiled(x), module(x))
        module[1].eps = 0.5
        torch.testing.assert_close(compiled(x), module(x))


class _NearOne(nn.Module):
    def forward(self, x):
        return torch.log1p(x), torch.expm1(x)


def test_log1p_and_expm1_keep_their_relative_precision_near_zero():
    """log(1 + x) and exp(x) - 1 lose it there (log1p(1e-8) was 0); infinities and -1 as PyTorch gives them."""
    x = torch.tensor([1e-8, -1e-7, 1e-6, 3e-4, 0.3, -0.7, 0.999, -0.999, 1.5, -2.0, 5.0, 30.0, -30.0, 0.0, -1.0,
                      float("inf"), -float("inf")])
    graph = tensorgen.from_torch(_NearOne(), (x,))
    for got, want in zip(compile_graph(graph).run([x.numpy()]), _eager(_NearOne(), x)):
        np.testing.assert_allclose(got, want, rtol=3e-7, atol=0)


class _ArgExtremes(nn.Module):
    def forward(self, x):
        return torch.softmax(x, 1).argmax(1), x.argmin(-1, keepdim=True), x.argmax(), torch.argmax(x, keepdim=True)


def test_argmax_and_argmin_pick_the_first_of_ties():
    x = torch.randint(0, 3, (2, 5, 3, 4)).float()  # many ties
    graph = tensorgen.from_torch(_ArgExtremes(), (x,))
    for got, want in zip(compile_graph(graph).run([x.numpy()]), _eager(_ArgExtremes(), x)):
        np.testing.assert_array_equal(got, want)


class _Attention(nn.Module):
    def forward(self, x, allowed):
        masked = x.masked_fill(~allowed, float("-inf"))
        return F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], attn_mask=allowed)[:, 0] + \
            torch.ops.aten._safe_softmax(masked, -1)


def test_a_query_with_every_key_masked_attends_to_nothing_as_in_pytorch():
    """A row of attention whose every key is masked (a run-time boolean mask) is 0 in PyTorch, as _safe_softmax
    gives it; the Softmax gave NaN."""
    x = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(0))
    allowed = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])
    module = _Attention().eval()
    got = compile_graph(tensorgen.from_torch(module, (x, allowed))).run([x.numpy(), allowed.numpy()])[0]
    want = _eager_many(module, [x, allowed])[0]
    assert not np.isnan(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_torch_frontend_alone_has_every_normalizer():
    """In a process that never imported the ONNX frontend, torch.gather (GatherElements) still imports."""
    import subprocess
    import sys

    code = ("import torch, tensorgen\n"
            "class M(torch.nn.Module):\n"
            "    def forward(self, x, i): return torch.gather(x, 1, i)\n"
            "tensorgen.from_torch(M(), (torch.randn(2, 5), torch.tensor([[4, 0], [1, 1]])))\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


class _NotATensor(nn.Module):
    def forward(self, x):
        return x * 2, None


class _DataShaped(nn.Module):
    def forward(self, x):
        return x[x > 0]


@pytest.mark.parametrize(("module", "message"), [
    (_NotATensor(), r"output 1 of the module is None, not a tensor"),
    (_DataShaped(), r"aten\.index .*: its output's shape depends on the data")])
def test_outputs_that_are_no_static_tensor_are_one_line(module, message):
    with pytest.raises(GraphError, match=message):
        tensorgen.from_torch(module, (torch.randn(3, 4),))
