"""Import a PyTorch module as a tensorgen Graph, directly from its exported FX graph (no ONNX file).

`torch.export` traces the module with example inputs; its decompositions lower it to Core ATen. Each ATen
call becomes graph-IR nodes through the converter table of `torch_ops` (one small function per op, written in
the ONNX vocabulary of the IR) and then goes through the same per-op normalizers as an imported ONNX node, so
both frontends meet the one contract of `tensorgen.graph.ir`. Parameters and buffers become constants
(inference); a call whose inputs are all constants is evaluated by PyTorch itself and becomes a constant (a
weight's transpose, an `arange`), as the ONNX importer folds constant subgraphs.

An op without a converter is one GraphError naming the op and the line of the module that called it.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tensorgen.graph.frontend.half import compute_in_float32
from tensorgen.graph.frontend.normalize import ImportState, OnnxNode, add_constant
from tensorgen.graph.frontend.normalizers import NORMALIZERS
from tensorgen.graph.frontend.torch_ops import CONVERTERS
from tensorgen.graph.ir import Graph, GraphError, Node, Value

__all__ = ["TorchImport", "export_module", "import_exported", "import_torch", "op_name", "supported_ops"]


def supported_ops() -> tuple[str, ...]:
    """The ATen ops (overload packets, e.g. "aten.convolution") the frontend converts."""
    return tuple(sorted(CONVERTERS))


def export_module(module: Any, example_inputs: Sequence[Any]) -> Any:
    """The Core ATen ExportedProgram of `module` in eval mode, traced with `example_inputs` (torch tensors).

    `aten._safe_softmax` (attention's softmax) is kept whole rather than decomposed into a mask computation on
    the softmax's input; it becomes a plain Softmax (see torch_ops). So is `scaled_dot_product_attention`,
    whose decomposition scales q and k by sqrt(scale) each: converted whole, it is the ONNX exporters' graph."""
    if not isinstance(module, torch.nn.Module):
        raise GraphError(f"from_torch needs a torch.nn.Module, not {type(module).__name__}")
    inputs = tuple(example_inputs)
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise GraphError(f"example input {i} is a {type(x).__name__}; pass torch tensors")
    module = module.eval()
    table = torch.export.default_decompositions()
    for op in (torch.ops.aten._safe_softmax.default, torch.ops.aten.scaled_dot_product_attention.default):
        table.pop(op, None)
    table[torch.ops.aten._transformer_encoder_layer_fwd.default] = _encoder_layer
    try:
        with torch.no_grad():
            return torch.export.export(module, inputs).run_decompositions(table)
    except Exception as e:  # noqa: BLE001 - torch.export raises many kinds; the user needs one line
        raise GraphError(f"torch.export cannot trace {type(module).__name__}: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:400]}") from None


def _encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                   eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                   ffn_bias_2, mask=None, mask_type=None):
    """aten._transformer_encoder_layer_fwd, the fast path TorchDynamo traces for nn.TransformerEncoderLayer (batch
    first, eval, no grad), as the ops it stands for. `mask` is nn.MultiheadAttention's (True or -inf: masked out):
    mask_type 0 an attention mask (L, S), 1 a key padding mask (B, S), 2 both merged (B, H, L, S)."""
    functional = torch.nn.functional
    batch, length, _ = src.shape
    head = embed_dim // num_heads

    def attention(x):
        q, k, v = functional.linear(x, qkv_weight, qkv_bias).view(batch, length, 3, num_heads, head) \
            .permute(2, 0, 3, 1, 4)
        allowed = None
        if mask is not None:
            m = mask.view(batch, 1, 1, length) if mask_type == 1 else mask
            allowed = ~m if m.dtype == torch.bool else m
        out = functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return functional.linear(out.transpose(1, 2).reshape(batch, length, embed_dim), proj_weight, proj_bias)

    def feed_forward(x):
        hidden = functional.linear(x, ffn_weight_1, ffn_bias_1)
        hidden = functional.gelu(hidden) if use_gelu else functional.relu(hidden)
        return functional.linear(hidden, ffn_weight_2, ffn_bias_2)

    def norm(x, weight, bias):
        return functional.layer_norm(x, (embed_dim,), weight, bias, eps)

    if norm_first:
        x = src + attention(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attention(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


def import_torch(module: Any, example_inputs: Sequence[Any], name: str | None = None,
                 traces: Mapping[str, str] | None = None) -> Graph:
    """The graph IR of `module` called on `example_inputs` (shapes and dtypes are taken from them). `traces`: the
    stack traces of the nodes of the FX graph `module` runs, by name, when it runs one (TorchDynamo's): errors
    then name the user's source line rather than the graph's generated code."""
    return import_exported(export_module(module, example_inputs), name or type(module).__name__, traces)


def import_exported(exported: Any, name: str = "model", traces: Mapping[str, str] | None = None) -> Graph:
    """The graph IR of a Core ATen ExportedProgram (see export_module and import_torch)."""
    return TorchImport(exported, name, dict(traces or {})).run()


def _owns_storage(meta: Any) -> bool:
    """Whether a fake tensor is row-major from the start of a storage of its own (not a view into a bigger one)."""
    try:
        return bool(meta.is_contiguous() and meta.storage_offset() == 0
                    and meta.untyped_storage().nbytes() == meta.numel() * meta.element_size())
    except Exception:  # noqa: BLE001 - not a tensor, or a storage fake tensors cannot tell
        return False


@dataclass
class _Runtime:
    """A value computed at run time: the name of its graph Value."""

    name: str


@dataclass
class TorchImport:
    """One import: walks the exported graph, folding constant calls and converting the others."""

    exported: Any
    name: str
    traces: dict[str, str] = field(default_factory=dict)  # source FX node name -> its stack trace
    state: ImportState = field(default_factory=lambda: ImportState({}, {}))
    nodes: list[Node] = field(default_factory=list)
    env: dict[Any, Any] = field(default_factory=dict)  # fx node -> _Runtime | torch.Tensor | python value | tuple
    taken: set[str] = field(default_factory=set)
    returned: set[str] = field(default_factory=set)  # values already made graph outputs
    own_storage: set[str] = field(default_factory=set)  # see owns_storage

    def run(self) -> Graph:
        signature = self.exported.graph_signature
        mutated = [*signature.buffers_to_mutate.values(), *signature.user_inputs_to_mutate.values()]
        if mutated:
            raise GraphError(f"the model changes {', '.join(map(repr, sorted(set(mutated))))} in place (e.g. "
                             "`self.total.add_(x)`, `x.mul_(2)`); tensorgen compiles functions of their inputs, "
                             "with buffers fixed: return the new value instead")
        lifted = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
                  **signature.inputs_to_lifted_tensor_constants}
        data = {**self.exported.state_dict, **self.exported.constants}
        inputs: list[str] = []
        for node in self.exported.graph.nodes:
            if node.op == "placeholder":
                if node.name in lifted:
                    self.env[node] = data[lifted[node.name]].detach()
                elif isinstance(node.meta.get("val"), torch.Tensor):
                    value = self._declare(node.name, node.meta["val"])
                    inputs.append(value)
                    self.own_storage.add(value)  # the compiled model reads its inputs row-major
                    self.env[node] = _Runtime(value)
                else:
                    raise GraphError(f"input {node.name!r} is not a tensor ({type(node.meta.get('val')).__name__}); "
                                     "tensorgen compiles tensor inputs only")
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                outputs = [self._output(x, i) for i, x in enumerate(node.args[0])]
        live = {*inputs, *outputs, *(x for n in self.nodes for x in (*n.inputs, *n.outputs) if x)}
        graph = Graph(self.name, inputs, outputs, self.nodes,
                      {k: v for k, v in self.state.values.items() if k in live},
                      {k: v for k, v in self.state.constants.items() if k in live})
        graph = compute_in_float32(graph)
        graph.validate()
        return graph

    # ---- values ---------------------------------------------------------------------------------

    def unique(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken or name in self.state.values:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def _declare(self, base: str, meta: Any) -> str:
        name = self.unique(base)
        self.state.values[name] = Value(name, tuple(int(d) for d in meta.shape), _dtype(meta.dtype))
        return name

    def constant(self, array: Any, base: str = "const") -> str:
        """The name of a new constant holding `array` (a torch tensor, NumPy array or Python scalar)."""
        return add_constant(self.state.values, self.state.constants, self.unique(base), _numpy(array))

    def tensor(self, x: Any, dtype: str | None = None) -> str:
        """The value name of a converter argument: a run-time value, or a constant made from a tensor/scalar."""
        if isinstance(x, _Runtime):
            return x.name
        array = _numpy(x)
        return self.constant(array.astype(dtype) if dtype is not None else array)

    def value(self, name: str) -> Value:
        return self.state.values[name]

    def is_runtime(self, x: Any) -> bool:
        return isinstance(x, _Runtime)

    def owns_storage(self, name: str) -> bool:
        """Whether eager PyTorch lays run-time value `name` out row-major from the start of a storage of its own
        (so a view that restrides it, as_strided, reads its elements in row-major order)."""
        return name in self.own_storage

    # ---- emitting nodes -------------------------------------------------------------------------

    def emit(self, op: str, inputs: Sequence[str], attrs: dict[str, Any] | None = None, *,
             shapes: Sequence[tuple[tuple[int, ...], str]], label: str = "") -> list[str]:
        """Add one IR node, normalized like an imported ONNX node; returns its output names. `shapes` are the
        (shape, dtype) of its outputs. Float attributes are rounded to float32, as ONNX stores them."""
        name = self.unique(f"{op.lower()}")
        attrs = {k: _as_onnx_attribute(v) for k, v in (attrs or {}).items()}
        outputs = []
        for shape, dtype in shapes:
            out = self.unique(f"{name}_out")
            self.state.values[out] = Value(out, tuple(int(d) for d in shape), dtype)
            outputs.append(out)
        onnx_node = OnnxNode(name, label or f"node {name!r} ({op})", op, list(inputs), outputs, attrs,
                             self.state)
        self.nodes.append(NORMALIZERS[op](onnx_node))
        return outputs

    # ---- the walk -------------------------------------------------------------------------------

    def _call(self, node: Any) -> Any:
        args = torch.fx.node.map_arg(node.args, lambda a: self.env[a])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: self.env[a])
        if node.target is operator.getitem:
            return args[0][args[1]]
        key = op_name(node.target)
        if key in _ASSERTIONS:  # checks of what the trace already fixed (dtypes, shapes)
            return None
        if any(self.env[a] is None for a in node.all_input_nodes):
            raise GraphError(f"{key}{self.where(node)}: reads an output tensorgen does not compute (pooling "
                             "indices, training statistics)")
        if not _has_runtime((args, kwargs)):
            return self._fold(node, args, kwargs)
        if key == "aten._local_scalar_dense" and len(self.value(args[0].name).shape) <= 1:
            return args[0]  # .item() of a run-time scalar (a Python float argument): the one-element tensor itself
        convert = CONVERTERS.get(key)
        if convert is None:
            raise GraphError(f"{key} is not supported by tensorgen's PyTorch frontend{self.where(node)} (the "
                             f"{len(CONVERTERS)} it converts: tensorgen.graph.frontend.torch_import.supported_ops(); "
                             "torch.compile option fallback=True runs such ops in eager PyTorch)")
        meta = node.meta.get("val")
        metas = list(meta) if isinstance(meta, (tuple, list)) else [meta]
        try:
            shapes = [(tuple(int(d) for d in m.shape), _dtype(m.dtype)) if m is not None else None for m in metas]
        except Exception as e:  # noqa: BLE001 - torch raises its own kinds for a size only the data decides
            raise GraphError(f"{key}{self.where(node)}: its output's shape depends on the data ({type(e).__name__}); "
                             "tensorgen compiles static shapes") from None
        try:
            result = convert(self, args, kwargs, shapes)
        except GraphError as e:  # ConvertError included
            raise GraphError(f"{key}{self.where(node)}: {e}") from None
        except Exception as e:  # noqa: BLE001 - a call the converter did not expect: one line, not a traceback
            raise GraphError(f"{key}{self.where(node)}: cannot be converted: {type(e).__name__}: {e}") from None
        results = result if isinstance(result, (list, tuple)) else [result]
        self.own_storage.update(r for r, m in zip(results, metas) if isinstance(r, str) and _owns_storage(m))
        if isinstance(result, (list, tuple)):
            return tuple(_Runtime(r) if isinstance(r, str) else r for r in result)
        return _Runtime(result) if isinstance(result, str) else result

    def _fold(self, node: Any, args: Any, kwargs: Any) -> Any:
        """A call on constants only, evaluated by PyTorch."""
        try:
            with torch.no_grad():
                return node.target(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure of a folded op is the model's
            raise GraphError(f"{op_name(node.target)}{self.where(node)}: folding it on constants failed: "
                             f"{type(e).__name__}: {e}") from None

    def where(self, node: Any) -> str:
        """Where the user's code made `node`: the trace of the node it came from in `traces`, else its own."""
        for origin in _origins(node.meta.get("from_node")):
            if self.traces.get(origin):
                return _where(self.traces[origin])
        return _where(node.meta.get("stack_trace") or "")

    def _output(self, x: Any, i: int) -> str:
        """A graph output name. Outputs are computed by nodes, each once: a constant, an input or a value
        returned twice gets an Identity node."""
        if not isinstance(x, torch.fx.Node):
            raise GraphError(f"output {i} of the module is {x!r}, not a tensor; tensorgen compiles tensor outputs "
                             "(return them alone, or in a tuple, list or dict)")
        value = self.env[x]
        if isinstance(value, _Runtime) and value.name not in self.returned \
                and any(value.name in n.outputs for n in self.nodes):
            self.returned.add(value.name)
            return value.name
        source = value.name if isinstance(value, _Runtime) else self.tensor(value)
        v = self.value(source)
        (out,) = self.emit("Identity", [source], shapes=[(v.shape, v.dtype)], label=f"output {i}")
        self.returned.add(out)
        return out


def _has_runtime(tree: Any) -> bool:
    if isinstance(tree, _Runtime):
        return True
    if isinstance(tree, (list, tuple)):
        return any(_has_runtime(t) for t in tree)
    if isinstance(tree, dict):
        return any(_has_runtime(t) for t in tree.values())
    return False


#: ops export adds to check what the trace fixed (a tensor's dtype and shape, a size's range): nothing to compute
_ASSERTIONS = frozenset({"aten._assert_tensor_metadata", "aten._assert_async", "aten._assert_scalar",
                         "aten._functional_assert_async", "aten.sym_constrain_range",
                         "aten.sym_constrain_range_for_size"})


def op_name(target: Any) -> str:
    """"aten.convolution" for torch.ops.aten.convolution.default; a plain function's name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket)
    return f"{target.__module__}.{target.__qualname__}" if callable(target) else str(target)


def _origins(sources: Any) -> Iterator[str]:
    """The names of the nodes an exported node was made from (its `from_node` provenance), nearest first."""
    for source in sources or ():
        yield source.name
        yield from _origins(source.from_node)


def _where(trace: str) -> str:
    """ ' (at "model.py", line 12, in forward: return self.fc(x))' from a stack trace, or ''."""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    frames = [i for i, line in enumerate(lines) if line.startswith("File ")]
    if not frames:
        return ""
    yours = [i for i in frames if _TORCH_DIR not in lines[i]]  # the user's line, not nn.Module internals
    last = (yours or frames)[-1]
    code = lines[last + 1] if last + 1 < len(lines) and not lines[last + 1].startswith("File ") else ""
    head = lines[last].replace("File ", "", 1)
    return f" (at {head}{f': {code}' if code else ''})"


_TORCH_DIR = str(Path(torch.__file__).parent)


def _dtype(dtype: Any) -> str:
    return str(torch.empty((), dtype=dtype).numpy().dtype) if dtype != torch.bfloat16 else "bfloat16"


def _numpy(x: Any) -> np.ndarray:
    """`x` as a NumPy array; a bfloat16 tensor (NumPy has no bfloat16) as its float32 values, which is what the
    graph computes it in (tensorgen.graph.frontend.half)."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous()
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy().copy()
    return np.asarray(x)


def _as_onnx_attribute(value: Any) -> Any:
    """A Python float as ONNX holds an attribute (float32), so both frontends compile the same constants."""
    if isinstance(value, float):
        return float(np.float32(value))
    if isinstance(value, (list, tuple)) and any(isinstance(v, float) for v in value):
        return type(value)(_as_onnx_attribute(v) for v in value)
    return value
