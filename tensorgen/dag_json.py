"""ComputeDAG <-> JSON, so a tuning record replays without the Python code that built the DAG.

Format 1: `{"format": 1, "tensors": [...], "inputs": [ids], "outputs": [ids]}` with tensors in the
DAG's topological order. A compute tensor carries a table of the variables its body uses (`vars`,
`[name, extent, reduce]` plus a dtype when not int32) and refers to them by index, since Vars are
identity-hashed and names alone are ambiguous. Expressions are nested lists headed by a tag; a
node's dtype is written only where it differs from what its operands imply, which keeps records
small. Floats are JSON numbers (Python writes them with round-trip precision); inf and nan, which
JSON lacks, are the strings "inf", "-inf", "nan".
"""

from __future__ import annotations

import math
from typing import Any

from tensorgen.dag import ComputeDAG
from tensorgen.errors import TensorgenError
from tensorgen.te.expr import (
    BinOp,
    Call,
    Cast,
    Cmp,
    Const,
    Expr,
    Load,
    Logic,
    Reduce,
    Select,
    Var,
    promote,
    walk,
)
from tensorgen.te.tensor import Tensor

DAG_FORMAT = 1
_NONFINITE = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


class DagFormatError(TensorgenError, ValueError):
    """Serialized DAG data is malformed."""


class DagVersionError(DagFormatError):
    """Serialized DAG data is from a newer format version than this tensorgen reads."""


# ---------------------------------------------------------------------------------------------
# scalars and attrs


def encode_float(x: float) -> float | str:
    """A float as JSON: itself when finite, else "inf" / "-inf" / "nan"."""
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def decode_float(x: float | int | str) -> float:
    if isinstance(x, str):
        if x not in _NONFINITE:
            raise DagFormatError(f"not a float: {x!r}")
        return _NONFINITE[x]
    return float(x)


def _encode_value(v: Any) -> Any:
    """Attr values: tuples and non-finite floats are tagged so they come back as they were.

    Anything JSON cannot hold becomes `str(v)`, which is exactly what `canonical_text` prints for it,
    so the workload key survives.
    """
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"__float__": encode_float(v)}
    if isinstance(v, tuple):
        return {"__tuple__": [_encode_value(x) for x in v]}
    if isinstance(v, list):
        return [_encode_value(x) for x in v]
    if isinstance(v, dict) and all(isinstance(k, str) for k in v):
        return {k: _encode_value(x) for k, x in v.items()}
    return str(v)


def _decode_value(v: Any) -> Any:
    if isinstance(v, list):
        return [_decode_value(x) for x in v]
    if isinstance(v, dict):
        if "__tuple__" in v:
            return tuple(_decode_value(x) for x in v["__tuple__"])
        if "__float__" in v:
            return decode_float(v["__float__"])
        return {k: _decode_value(x) for k, x in v.items()}
    return v


# ---------------------------------------------------------------------------------------------
# expressions


def _default_dtype(e: Expr) -> str:
    """The dtype a decoder infers for `e` from its (already decoded) children."""
    if isinstance(e, BinOp):
        return promote(e.a.dtype, e.b.dtype)
    if isinstance(e, (Cmp, Logic)):
        return "bool"
    if isinstance(e, Select):
        return e.true_value.dtype
    if isinstance(e, Call):
        return e.args[0].dtype if e.args else "float32"
    if isinstance(e, Load):
        return e.tensor.dtype
    if isinstance(e, Reduce):
        return e.source.dtype
    raise TypeError(type(e).__name__)


class _Encoder:
    def __init__(self, tensor_ids: dict[int, int], var_ids: dict[Var, int]):
        self.tensor_ids = tensor_ids
        self.var_ids = var_ids

    def __call__(self, e: Expr | None) -> list | None:
        if e is None:
            return None
        if isinstance(e, Const):
            value = encode_float(e.value) if isinstance(e.value, float) else e.value
            return ["const", value, e.dtype]
        if isinstance(e, Var):
            return ["var", self.var_ids[e]]
        if isinstance(e, Cast):
            return ["cast", e.dtype, self(e.value)]
        if isinstance(e, BinOp):
            out = ["bin", e.op, self(e.a), self(e.b)]
        elif isinstance(e, Cmp):
            out = ["cmp", e.op, self(e.a), self(e.b)]
        elif isinstance(e, Logic):
            out = ["logic", e.op, [self(a) for a in e.args]]
        elif isinstance(e, Select):
            out = ["select", self(e.cond), self(e.true_value), self(e.false_value)]
        elif isinstance(e, Call):
            out = ["call", e.name, [self(a) for a in e.args]]
        elif isinstance(e, Load):
            if id(e.tensor) not in self.tensor_ids:
                raise DagFormatError(f"expression reads tensor {e.tensor.name}, which is not in the DAG")
            out = ["load", self.tensor_ids[id(e.tensor)], [self(i) for i in e.indices]]
        elif isinstance(e, Reduce):
            out = ["reduce", e.combiner, self(e.source), [self.var_ids[a] for a in e.axes],
                   self(e.condition), self(e.init)]
        else:
            raise DagFormatError(f"cannot serialize expression node {type(e).__name__}")
        if e.dtype != _default_dtype(e):
            out.append(e.dtype)
        return out


class _Decoder:
    def __init__(self, tensors: list[Tensor], variables: list[Var], where: str):
        self.tensors = tensors
        self.vars = variables
        self.where = where

    def __call__(self, data: Any) -> Expr | None:
        if data is None:
            return None
        try:
            return self._node(data)
        except DagFormatError:
            raise
        except (TypeError, ValueError, IndexError, KeyError) as err:
            raise DagFormatError(f"{self.where}: malformed expression {str(data)[:120]}: {err}") from None

    def _node(self, d: list) -> Expr:
        tag = d[0]
        if tag == "const":
            value = decode_float(d[1]) if isinstance(d[1], str) else d[1]
            return Const(value, d[2])
        if tag == "var":
            return self.vars[d[1]]
        if tag == "cast":
            return Cast(d[1], self._node(d[2]))
        if tag == "bin":
            e: Expr = BinOp(d[1], self._node(d[2]), self._node(d[3]), "")
            extra = d[4:]
        elif tag == "cmp":
            e, extra = Cmp(d[1], self._node(d[2]), self._node(d[3])), d[4:]
        elif tag == "logic":
            e, extra = Logic(d[1], tuple(self._node(a) for a in d[2])), d[3:]
        elif tag == "select":
            e, extra = Select(self._node(d[1]), self._node(d[2]), self._node(d[3]), ""), d[4:]
        elif tag == "call":
            e, extra = Call(d[1], tuple(self._node(a) for a in d[2]), ""), d[3:]
        elif tag == "load":
            if not 0 <= d[1] < len(self.tensors):
                raise DagFormatError(f"{self.where}: reads tensor #{d[1]}, which is not defined before it")
            e, extra = Load(self.tensors[d[1]], tuple(self._node(i) for i in d[2]), ""), d[3:]
        elif tag == "reduce":
            axes = tuple(self.vars[i] for i in d[3])
            e = Reduce(d[1], self._node(d[2]), axes, self(d[4]), self(d[5]), "")
            extra = d[6:]
        else:
            raise DagFormatError(f"{self.where}: unknown expression tag {tag!r}")
        dtype = extra[0] if extra else _default_dtype(e)
        return _with_dtype(e, dtype)


def _with_dtype(e: Expr, dtype: str) -> Expr:
    if e.dtype == dtype:
        return e
    kw = {k: getattr(e, k) for k in e.__dataclass_fields__}  # type: ignore[attr-defined]
    kw["dtype"] = dtype
    return type(e)(**kw)


# ---------------------------------------------------------------------------------------------
# tensors and DAGs


def _encode_var(v: Var) -> list:
    out: list = [v.name, v.extent, v.reduce]
    if v.dtype != "int32":
        out.append(v.dtype)
    return out


def _encode_tensor(t: Tensor, tensor_ids: dict[int, int]) -> dict:
    out: dict[str, Any] = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
    if t.is_placeholder:
        if t.attrs:
            out["attrs"] = _encode_value(t.attrs)
        return out
    var_ids: dict[Var, int] = {}
    for v in [*t.axes, *t.reduce_axes, *(n for n in walk(t.body) if isinstance(n, Var))]:
        var_ids.setdefault(v, len(var_ids))
    table = list(var_ids)
    out["vars"] = [_encode_var(v) for v in table]
    out["axes"] = [var_ids[a] for a in t.axes]
    out["body"] = _Encoder(tensor_ids, var_ids)(t.body)
    if t.tag:
        out["tag"] = t.tag
    if t.attrs:
        out["attrs"] = _encode_value(t.attrs)
    return out


def dag_to_json(dag: ComputeDAG) -> dict:
    """The DAG as JSON-ready data; `dag_from_json` rebuilds it with the same `workload_key`."""
    tensor_ids = {id(t): n for n, t in enumerate(dag.tensors)}
    return {
        "format": DAG_FORMAT,
        "tensors": [_encode_tensor(t, tensor_ids) for t in dag.tensors],
        "inputs": [tensor_ids[id(t)] for t in dag.inputs],
        "outputs": [tensor_ids[id(t)] for t in dag.outputs],
    }


def _decode_tensor(d: dict, tensors: list[Tensor]) -> Tensor:
    shape, dtype, name = tuple(d["shape"]), d["dtype"], d["name"]
    if "body" not in d:
        return Tensor(shape, dtype, name, attrs=_decode_value(d.get("attrs", {})))
    variables = [Var(v[0], v[3] if len(v) > 3 else "int32", v[1], bool(v[2])) for v in d["vars"]]
    axes = tuple(variables[i] for i in d["axes"])
    body = _Decoder(tensors, variables, f"tensor {name}")(d["body"])
    attrs = _decode_value(d.get("attrs", {}))
    return Tensor(shape, dtype, name, axes, body, d.get("tag", ""), attrs)


def dag_from_json(data: dict) -> ComputeDAG:
    """Rebuild a ComputeDAG from `dag_to_json` data (raises DagFormatError on bad or newer data)."""
    if not isinstance(data, dict) or "format" not in data:
        raise DagFormatError("not a serialized ComputeDAG (no 'format' field)")
    if not isinstance(data["format"], int):
        raise DagFormatError(f"serialized DAG has a non-integer format {data['format']!r}")
    if data["format"] > DAG_FORMAT:
        raise DagVersionError(
            f"serialized DAG has format version {data['format']!r}; this tensorgen reads up to {DAG_FORMAT}"
        )
    tensors: list[Tensor] = []
    try:
        for n, d in enumerate(data["tensors"]):
            try:
                tensors.append(_decode_tensor(d, tensors))
            except DagFormatError:
                raise
            except (TypeError, ValueError, IndexError, KeyError) as err:
                raise DagFormatError(f"tensor #{n}: malformed ({type(err).__name__}: {err})") from None
        inputs = [tensors[i] for i in data["inputs"]]
        outputs = [tensors[i] for i in data["outputs"]]
    except (TypeError, IndexError, KeyError) as err:
        raise DagFormatError(f"malformed serialized DAG ({type(err).__name__}: {err})") from None
    return _assemble(tensors, inputs, outputs)


def _assemble(tensors: list[Tensor], inputs: list[Tensor], outputs: list[Tensor]) -> ComputeDAG:
    """A ComputeDAG with exactly this order of tensors, inputs and outputs, after checking it."""
    if not outputs or any(t.is_placeholder for t in outputs) or any(not t.is_placeholder for t in inputs):
        raise DagFormatError("serialized DAG: inputs must be placeholders and outputs computed tensors")
    if len({t.name for t in tensors}) != len(tensors):
        raise DagFormatError("serialized DAG: tensor names are not unique")
    if {id(t) for t in ComputeDAG(inputs + outputs).tensors} != {id(t) for t in tensors}:
        raise DagFormatError("serialized DAG lists tensors that are not reachable from its outputs")
    return ComputeDAG.from_parts(tensors, inputs, outputs)
