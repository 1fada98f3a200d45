"""A schedule fuzzer: random step sequences on random DAGs must raise ScheduleError or compute the right thing.

`random_dag(rng)` chains a few small stages (element-wise maps with broadcast operands, a matmul-like
reduction, a max or sum reduction, a transpose, a zero-padded window sum, an exp-normalize) over one or two
placeholders. `random_steps` then applies schedule primitives to random stages with random arguments, valid
and invalid alike (split lengths that do not divide or are not positive, fusing loops that are not
adjacent, reorders that drop loops, vectorizing reductions, compute_at on any stage's any loop,
compute_inline of reductions, cache_write, rfactor, pragmas, storage_align). A step that is rejected must
raise ScheduleError and leave the state as it was; whatever is accepted must lower, compile and give what
the NumPy interpreter (te_eval) gives, and round-trip through JSON. Anything else is a failure.
tests/test_fuzz_schedule.py runs fixed seeds; bench/fuzz.py --schedules runs it for minutes.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from te_eval import evaluate

from tensorgen import te
from tensorgen.build import build
from tensorgen.errors import ScheduleError
from tensorgen.schedule import State
from tensorgen.te.tensor import Tensor

# ---------------------------------------------------------------------------------------------
# random DAGs


def _dim(rng: np.random.Generator) -> int:
    return int(rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 12, 16]))


def _elementwise(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    """x combined with a fresh placeholder broadcast along a random subset of axes, then an intrinsic."""
    shape = x.shape
    keep = [bool(rng.random() < 0.6) for _ in shape]
    b = te.placeholder(tuple(d if kept else 1 for d, kept in zip(shape, keep)), name=f"B{k}")
    inputs.append(b)
    fn = rng.choice(["tanh", "sigmoid", "relu", "abs", "none"])

    def body(*i):
        y = x[i] * 0.5 + b[tuple(v if kept else 0 for v, kept in zip(i, keep))]
        if fn == "tanh":
            return te.tanh(y)
        if fn == "sigmoid":
            return te.sigmoid(y)
        if fn == "relu":
            return te.max_expr(y, 0.0)
        return te.absolute(y) if fn == "abs" else y

    return te.compute(shape, body, name=f"E{k}")


def _matmul(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    *outer, red = x.shape
    n = _dim(rng)
    w = te.placeholder((red, n), name=f"W{k}")
    inputs.append(w)
    r = te.reduce_axis(red, f"r{k}")
    return te.compute((*outer, n), lambda *i: te.sum(x[(*i[:-1], r)] * w[r, i[-1]], axis=r), name=f"M{k}")


def _reduce(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    if len(x.shape) < 2:
        return _elementwise(rng, x, inputs, k)
    *outer, red = x.shape
    r = te.reduce_axis(red, f"r{k}")
    op = te.max if rng.random() < 0.4 else te.sum
    return te.compute(tuple(outer), lambda *i: op(x[(*i, r)], axis=r), name=f"R{k}")


def _transpose(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    perm = rng.permutation(len(x.shape)).tolist()
    shape = tuple(x.shape[p] for p in perm)

    def body(*i):
        src = [0] * len(perm)
        for pos, p in enumerate(perm):
            src[p] = i[pos]
        return x[tuple(src)] + 1.0

    return te.compute(shape, body, name=f"T{k}")


def _window(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    """A zero-padded stage then a window sum over the last axis (a 1-D convolution without weights)."""
    *outer, n = x.shape
    pad, width = int(rng.integers(0, 3)), int(rng.integers(1, 4))
    padded = te.compute((*outer, n + 2 * pad), lambda *i: te.select(
        te.all_of(i[-1] >= pad, i[-1] < n + pad), x[(*i[:-1], i[-1] - pad)], 0.0), name=f"P{k}")
    out = n + 2 * pad - width + 1
    if out < 1:
        return padded
    r = te.reduce_axis(width, f"w{k}")
    return te.compute((*outer, out), lambda *i: te.sum(padded[(*i[:-1], i[-1] + r)], axis=r), name=f"C{k}")


def _normalize(rng: np.random.Generator, x: Tensor, inputs: list[Tensor], k: int) -> Tensor:
    """exp(x) / sum(exp(x)) over the last axis: a reduction read back by an element-wise stage."""
    if len(x.shape) < 2:
        return _elementwise(rng, x, inputs, k)
    *outer, n = x.shape
    e = te.compute(x.shape, lambda *i: te.exp(te.min_expr(x[i], 4.0)), name=f"X{k}")
    r = te.reduce_axis(n, f"s{k}")
    total = te.compute(tuple(outer), lambda *i: te.sum(e[(*i, r)], axis=r), name=f"S{k}")
    return te.compute(x.shape, lambda *i: e[i] / total[i[:-1]], name=f"N{k}")


STAGES: list[Callable] = [_elementwise, _matmul, _reduce, _transpose, _window, _normalize]


def random_dag(rng: np.random.Generator) -> list[Tensor]:
    """Placeholders then the output, for State(...)."""
    shape = tuple(_dim(rng) for _ in range(int(rng.integers(1, 4))))
    x = te.placeholder(shape, name="A")
    inputs: list[Tensor] = [x]
    for k in range(int(rng.integers(1, 4))):
        x = STAGES[int(rng.integers(len(STAGES)))](rng, x, inputs, k)
    return [*inputs, x]


# ---------------------------------------------------------------------------------------------
# random steps


def _lengths(rng: np.random.Generator, extent: int | None) -> list[int | None]:
    extent = extent or 1
    divisors = [d for d in range(1, extent + 1) if extent % d == 0]
    pool = divisors + [int(rng.integers(1, extent + 3)), 0, -1]  # None (a sketch's unfilled length) is valid
    weights = np.array([4.0] * len(divisors) + [2.0, 0.2, 0.2])
    count = int(rng.integers(1, 4))
    return [pool[int(rng.choice(len(pool), p=weights / weights.sum()))] for _ in range(count)]


def random_step(rng: np.random.Generator, s: State) -> str:
    """Apply one random primitive with random arguments; returns its description."""
    computed = [st.name for st in s.stages if not st.is_placeholder]
    name = computed[int(rng.integers(len(computed)))] if rng.random() < 0.85 else s.stages[0].name
    stage = s.stage(name)
    iters = [it.name for it in stage.iters]
    it = iters[int(rng.integers(len(iters)))] if iters else "missing"
    kind = str(rng.choice(["split", "split", "split", "fuse", "reorder", "parallel", "vectorize", "unroll",
                           "compute_at", "compute_at", "compute_inline", "compute_root", "cache_write", "rfactor",
                           "pragma", "storage_align", "follow_split", "follow_fused_split", "cache_read",
                           "pack_layout"]))
    others = [st.name for st in s.stages]
    other = others[int(rng.integers(len(others)))]
    step_id = int(rng.integers(-1, len(s.steps) + 1))
    if kind == "split":
        args = (name, it, _lengths(rng, stage.iters[iters.index(it)].extent if iters else 1), bool(rng.random() < 0.7))
        s.split(*args)
    elif kind == "fuse":
        start = int(rng.integers(len(iters))) if iters else 0
        count = int(rng.integers(1, 4))
        picked = iters[start:start + count] if rng.random() < 0.8 else list(rng.permutation(iters)[:count])
        args = (name, picked)
        s.fuse(*args)
    elif kind == "reorder":
        order = list(rng.permutation(iters))
        if rng.random() < 0.1 and order:
            order = order[1:]  # drops a loop: must be rejected
        args = (name, order)
        s.reorder(*args)
    elif kind in ("parallel", "vectorize", "unroll"):
        args = (name, it)
        getattr(s, kind)(*args)
    elif kind == "compute_at":
        target = computed[int(rng.integers(len(computed)))]
        target_iters = [i.name for i in s.stage(target).iters]
        args = (name, target, target_iters[int(rng.integers(len(target_iters)))] if target_iters else "missing")
        s.compute_at(*args)
    elif kind in ("compute_inline", "compute_root", "cache_write"):
        args = (name,)
        getattr(s, kind)(*args)
    elif kind == "rfactor":
        args = (name, it, int(rng.integers(0, len(iters) + 1)))
        s.rfactor(*args)
    elif kind == "follow_split":
        args = (name, it, step_id, int(rng.integers(1, 4)))
        s.follow_split(*args)
    elif kind == "follow_fused_split":
        ids = sorted({int(rng.integers(0, max(len(s.steps), 1))) for _ in range(int(rng.integers(1, 3)))})
        args = (name, it, ids, int(rng.integers(0, 3)), bool(rng.random() < 0.5))
        s.follow_fused_split(*args)
    elif kind == "cache_read":
        args = (name, "local", [c for c in s.consumers(name) if rng.random() < 0.8] or [other])
        s.cache_read(*args)
    elif kind == "pack_layout":
        readers = s.consumers(name)
        args = (name, readers[0] if readers and rng.random() < 0.8 else other)
        s.pack_layout(*args)
    elif kind == "pragma":
        args = (name, it, str(rng.choice(["auto_unroll_max_step$16", "auto_unroll_max_step$0", "bogus"])))
        s.pragma(*args)
    else:
        args = (name, it, int(rng.choice([0, 4, 16])), int(rng.integers(0, 3)))
        s.storage_align(*args)
    return f"{kind}{args}"


# ---------------------------------------------------------------------------------------------
# one fuzz case


@dataclass
class ScheduleOutcome:
    seed: int
    program: str  # the DAG and the steps applied, as text
    rejected: int  # random steps that raised ScheduleError
    applied: int = 0  # random steps that were applied
    refused: bool = False  # the steps applied one by one but make no program together (ScheduleError at build)
    stage: str = ""  # "step" | "unchanged" | "roundtrip" | "build" | "run" | "mismatch", when failed
    failure: str | None = None

    def to_dict(self) -> dict:
        return {"seed": self.seed, "stage": self.stage, "rejected": self.rejected, "applied": self.applied,
                "program": self.program,
                "failure": self.failure, "reproduce": f"tests/fuzz_schedules.py: check_schedule({self.seed})"}


def check_schedule(seed: int, steps: int | None = None) -> ScheduleOutcome:
    """Draw a DAG, tile some stages, then apply `steps` (default 2..15) random steps drawn from `seed`; check
    what they give."""
    rng = np.random.default_rng(seed)
    tensors = random_dag(rng)
    s = State(tensors)
    tried: list[str] = []
    outcome = ScheduleOutcome(seed, "", 0)

    def fail(stage: str, message: str) -> ScheduleOutcome:
        outcome.program = "\n".join([f"# dag: {s.dag}", *tried])
        outcome.stage, outcome.failure = stage, message
        return outcome

    for stage in [st.name for st in s.stages if not st.is_placeholder and rng.random() < 0.5]:
        _tile(rng, s, stage, tried)  # deeper programs: most random steps then act on tiled loops
    for _ in range(steps if steps is not None else int(rng.integers(2, 16))):
        before = (s.stages, s.steps)
        try:
            tried.append(random_step(rng, s))
            outcome.applied += 1
        except ScheduleError as err:
            outcome.rejected += 1
            tried.append(f"# rejected: {err}")
            if (s.stages, s.steps) != before:
                return fail("unchanged", f"a rejected step changed the state: {err}")
        except Exception:
            return fail("step", traceback.format_exc())
    try:
        again = State.from_json(s.dag, s.to_json())
        if again != s:
            return fail("roundtrip", f"the JSON round trip changed the state:\n{s}\n---\n{again}")
    except Exception:
        return fail("roundtrip", traceback.format_exc())
    inputs = [t for t in tensors if t.is_placeholder]
    data = [np.random.default_rng(seed).uniform(-1, 1, t.shape).astype("float32") for t in inputs]
    try:
        func = build(s)
    except ScheduleError as err:  # e.g. a copy at root of a stage computed inside its reader: refused as a whole
        outcome.refused = True
        outcome.program = "\n".join([f"# dag: {s.dag}", *tried, f"# refused: {err}"])
        return outcome
    except Exception:
        return fail("build", f"{s}\n{traceback.format_exc()}")
    try:
        (out,) = func.run(*[data[i] for i in _order(s, inputs)])[-1:]
    except Exception:
        return fail("run", f"{s}\n{traceback.format_exc()}")
    (expected,) = evaluate([tensors[-1]], dict(zip(inputs, data)))
    if not np.allclose(out, expected, rtol=1e-4, atol=1e-4):
        k = tuple(np.argwhere(~np.isclose(out, expected, rtol=1e-4, atol=1e-4))[0])
        return fail("mismatch", f"{s}\nat {k}: compiled {out[k]!r}, NumPy interpreter {expected[k]!r}\n"
                                f"{func.source}")
    outcome.program = "\n".join([f"# dag: {s.dag}", *tried])
    return outcome


def _tile(rng: np.random.Generator, s: State, name: str, tried: list[str]) -> None:
    """Valid splits of every loop of a stage (and a cache_write first, sometimes), as a sketch rule would."""
    if rng.random() < 0.3 and s.stage(name).tensor.reduce_axes:
        s.cache_write(name, "local")
        tried.append(f"cache_write('{name}')")
        name = f"{name}_local"
    for it in list(s.stage(name).iters):
        divisors = [d for d in range(2, (it.extent or 1) + 1) if (it.extent or 1) % d == 0]
        if divisors:
            lengths = [int(rng.choice(divisors))]
            s.split(name, it.name, lengths)
            tried.append(f"split('{name}', '{it.name}', {lengths})")


def _order(s: State, inputs: list[Tensor]) -> list[int]:
    """Index into `inputs` of each input the compiled function takes, in its argument order."""
    names = [t.name for t in inputs]
    return [names.index(t.name) for t in s.dag.inputs]
