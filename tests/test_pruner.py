"""Pruner's draft-then-verify search (search/pruner_policy.py) and the vectorized static analyzer it drafts with.

The analyzer's stacked formula is checked against a statement-at-a-time reference written here from Pruner §2.3's
CPU terms (the analyzer's docstring), on random programs of several tasks; the policy is checked for what it
proposes (the analyzer's best before the model learns, never a program twice, seeded), and end to end: the best
program it tunes computes what NumPy does.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from search_tasks import c2d_relu, gmm, make_task, nrm

from tensorgen.build import build
from tensorgen.costmodel.base import RandomModel
from tensorgen.costmodel.psa import StaticAnalyzer
from tensorgen.costmodel.xgb import XGBModel
from tensorgen.errors import TuneError
from tensorgen.features.nest import program_statements
from tensorgen.features.statement import Statement
from tensorgen.search.policy import state_key
from tensorgen.search.pruner_policy import PrunerPolicy
from tensorgen.search.sketch_policy import SketchPolicy
from tensorgen.te import ops
from tensorgen.tuning.registry import POLICIES
from tensorgen.tuning.tune import tune

FLOAT_OPS = 7


def reference_latency(psa: StaticAnalyzer, st: Statement, start: int) -> float:
    """One statement's PSA latency, term by term (costmodel.psa's docstring), without stacking; `start`: the loops
    around the statement that initialized its accumulator."""
    hw, ext, n, lanes, kinds = psa.hw, np.asarray(st.extents, float), len(st.extents), psa.lanes, st.kinds
    work = max(float(st.ops[:FLOAT_OPS].sum()), 1.0) * float(ext.prod())
    vec = max((k for k in range(n) if kinds[k] == "vectorize"), default=None)
    if vec is None and n and ext[-1] > 1 and st.accesses[0].coef[-1] == 1:
        vec = n - 1
    inner_reads = [a.coef[-1] for a in st.accesses[1:] if n and a.buffer.name != st.accesses[0].buffer.name]
    if vec is None and n and ext[-1] >= 4 and st.accesses[0].coef[-1] == 0 and len(inner_reads) < len(st.accesses) - 1 \
            and set(inner_reads) <= {0, 1} and 1 in inner_reads:  # a reduction over vectors (codegen.vector)
        vec = n - 1
    fill = ext[vec] / math.ceil(ext[vec] / lanes) if vec is not None else 1.0
    p = float(np.prod([ext[k] for k in range(n) if kinds[k] == "parallel"] or [1.0]))
    busy = p / math.ceil(p / hw.cores)
    store = st.accesses[0]
    reads = [a for a in st.accesses[1:] if a.buffer.name != store.buffer.name]
    updates = any(a.buffer.name == store.buffer.name for a in st.accesses[1:])
    reduce = [k for k in range(start, n) if updates and store.coef[k] == 0 and ext[k] > 1]
    if reduce:
        inner = range(reduce[-1] + 1, n)
        in_vec = vec is not None and vec > reduce[-1]
        acc = float(np.prod([ext[k] for k in inner])) / (fill if in_vec else 1.0)
        loads = held = 0.0
        for a in reads:
            whole_vectors = in_vec and a.coef[vec] == 1
            pts = float(np.prod([ext[k] for k in inner if a.coef[k] != 0]))
            loads += pts / fill if whole_vectors else pts
            # held across the outermost tile loop the read does not move with; streamed (1) if none
            kept = next((k for k in inner if a.coef[k] == 0 and ext[k] > 1), n)
            pts = float(np.prod([ext[k] for k in range(kept + 1, n) if a.coef[k] != 0]))
            held += pts / fill if whole_vectors and vec > kept else pts
        alpha, last = 1 + loads / acc, reduce[-1]
        # unrolled inside the spatial loops around it: what they do not move is held, the rest loaded each pass
        around = [k for k in range(max([k for k in reduce if k < last], default=-1) + 1, last) if ext[k] > 1]
        if around and ext[last] * acc <= psa.unroll:
            moved = stationary = 0.0
            for a in reads:
                pts = float(np.prod([ext[k] for k in range(last, n) if a.coef[k] != 0]))
                pts = pts / fill if in_vec and a.coef[vec] == 1 else pts
                if any(a.coef[k] != 0 for k in around):
                    moved += pts
                else:
                    stationary += pts
            spill = max(stationary + acc - hw.vector_registers, 0.0)
            alpha = min(alpha, 1 + (moved + acc + spill) / (ext[last] * acc))
        thread = alpha * max((acc + held) / hw.vector_registers, 1.0)
        steps = 1.0  # the chain: reduction loops from the innermost one out to a loop that moves the accumulator
        for k in range(reduce[-1], start - 1, -1):
            if k in reduce:
                steps *= ext[k]
            elif ext[k] > 1:
                break
        chains = max(psa.fma_chain / (acc * max(psa.window / (steps * (acc + loads)), 1.0)), 1.0)
    else:
        thread, chains = 1.0 + len(reads), 1.0
    compute = work / (psa.peak() * 1e9) * (lanes / fill) * (hw.cores / busy) * thread * chains
    line = float(hw.cache_line_bytes)
    accesses = list({(a.buffer.name, tuple(a.coef)): a for a in st.accesses}.values())
    def footprint(a, ext: np.ndarray, k: int) -> float:
        """Bytes `a` touches under loop level k (no more than under any level around it)."""
        points = min(min(float(np.sum(a.coef[j:] * (ext[j:] - 1)) + 1), merged_points(a.coef[j:], ext[j:]))
                     for j in range(k + 1))
        return min(points, a.buffer.size) * a.buffer.nbytes / max(a.buffer.size, 1)

    fits = [k for k in range(n + 1) if sum(footprint(a, ext, k) for a in accesses) <= hw.l2_bytes]
    level = fits[0] if fits else n
    traffic = 0.0
    for a in accesses:
        use = 1.0
        if np.any(a.coef[level:] != 0):
            unit = [ext[k] for k in range(level, n) if a.coef[k] == 1]
            use = min(line, a.buffer.nbytes / max(a.buffer.size, 1) * max(unit, default=1.0)) / line
        fetched, around = footprint(a, ext, level), 1.0
        if level > 0:  # the loop outside the cached level: the first footprint, then what each iteration adds
            outer, two = level - 1, ext.copy()
            two[outer] = min(ext[outer], 2.0)
            fetched += (ext[outer] - 1) * max(footprint(a, two, outer) - fetched, 0.0)
            around = float(np.prod(ext[:outer]))  # the bodies of the loops around it do not fit
        traffic += fetched * around / use
    return max(compute, traffic / (20.0 * hw.cores * 1e9))


def merged_points(coef: np.ndarray, ext: np.ndarray) -> float:
    """Distinct points of an index moved by these loops, loops along one dimension merged (features.access)."""
    dims: list[list[float]] = []  # [stride, points]
    for c, e in sorted((c, e) for c, e in zip(coef, ext) if c > 0 and e > 1):
        if dims and (c / dims[-1][0]).is_integer() and c / dims[-1][0] <= dims[-1][1]:
            dims[-1][1] += c / dims[-1][0] * (e - 1)
        else:
            dims.append([c, e])
    return float(np.prod([pts for _, pts in dims]))


def chain_start(stmts: list[Statement], i: int) -> int:
    """The loops statement i shares with the last statement before it that wrote its buffer without reading it."""
    name = stmts[i].accesses[0].buffer.name
    if all(a.buffer.name != name for a in stmts[i].accesses[1:]):
        return 0
    init = next((st for st in reversed(stmts[:i]) if st.accesses[0].buffer.name == name
                 and all(a.buffer.name != name for a in st.accesses[1:])), None)
    shared = 0
    while init is not None and shared < min(len(init.ids), len(stmts[i].ids)) and \
            init.ids[shared] == stmts[i].ids[shared]:
        shared += 1
    return shared


def gmm_relu_two_cores():
    ins, (out,) = ops.make_gmm(24, 40, 56)
    return make_task(ins, [ops.relu(out)], cores=2)


@pytest.mark.parametrize("make", [gmm, c2d_relu, nrm, gmm_relu_two_cores])
def test_the_stacked_analyzer_equals_the_statement_at_a_time_formula(make):
    task = make()
    programs = [program_statements(s) for s in SketchPolicy.from_options(task, workers=1).evolution.sample(120)]
    psa = StaticAnalyzer(task.hw)
    got = psa.program_latencies([*programs, None])
    want = [sum(reference_latency(psa, st, chain_start(stmts, i)) for i, st in enumerate(stmts)) for stmts in programs]
    np.testing.assert_allclose(got[:-1], want, rtol=1e-12)
    assert got[-1] == math.inf and np.all(got[:-1] > 0)


def test_before_the_model_learns_a_batch_is_the_analyzers_best_and_a_random_share():
    task = c2d_relu()
    policy = PrunerPolicy.from_options(task, RandomModel(0), potential=32, draft_generations=1, population=64,
                                       workers=1)
    batch = policy.next_batch(10)
    assert len(policy.potential) == 32 and policy.draft.potential == 32 and policy.config.eps_greedy == 0.1
    assert [s.steps for s in batch[:9]] == [s.steps for s in policy.potential[:9]]  # the analyzer's order
    assert batch[9].steps not in {s.steps for s in policy.potential[:9]}  # one random program in ten
    latencies = StaticAnalyzer(task.hw).latencies(policy.potential)
    assert np.all(np.diff(latencies) >= -1e-12 * latencies[1:])  # the potential space is kept best first


def test_the_draft_lowers_each_child_once_in_the_workers_and_computes_no_features():
    """Children of the draft are made in two worker processes, which send back the analyzer's estimate alone: the
    search process lowers nothing for the draft, and the estimates are the analyzer's."""
    task = c2d_relu()
    policy = PrunerPolicy.from_options(task, RandomModel(0), potential=32, draft_generations=2, population=128,
                                       init_population=64, first_generations=None, workers=2)
    policy.next_batch(8)
    ex = policy.extractor
    assert ex.stats["estimates"] == 0 and len(ex._estimates) > 2 * len(ex)  # estimates only, from the workers
    expect = StaticAnalyzer(task.hw).latencies(policy.potential)
    assert np.allclose(ex.estimates(policy.potential), expect, rtol=1e-12) and np.isfinite(expect).all()
    policy.close()


class InformedRandomModel(RandomModel):
    """Random scores the policy takes as learned: the verification runs."""

    trained = True


def test_the_verification_is_one_generation_of_its_own_size_scored_with_the_workers_features():
    """The learned model verifies in one generation as large as the potential space, its random share and the best
    measured programs (the paper's), not the evolution's population; the draft's programs have no features yet and
    the workers compute them: the search process computes only the few random programs' it sampled itself. The
    potential space is the one a single process drafts (its order may differ where estimates tie to rounding)."""
    task = c2d_relu()
    spaces = []
    for workers in (1, 2):
        policy = PrunerPolicy.from_options(task, InformedRandomModel(0), seed=4, potential=96, draft_generations=1,
                                           population=256, init_population=64, first_generations=None,
                                           workers=workers)
        batch = policy.next_batch(8)
        assert len({state_key(s) for s in batch}) == 8
        spaces.append({s.steps for s in policy.potential})
        verify = policy.evolution.history
        assert len(verify) == 2 and verify[1].size == verify[0].size <= 96 + 24
        if workers == 2:  # 24 random programs (verify_random 0.25 of 96), fewer than the workers take
            assert policy.extractor.stats["misses"] <= 24 < policy.extractor.stats["added"]
        policy.close()
    assert spaces[0] == spaces[1] and len(spaces[0]) == 96


def test_batches_never_repeat_and_the_draft_is_redone_every_few_batches():
    policy = PrunerPolicy.from_options(gmm(), RandomModel(0), potential=16, draft_every=2, draft_generations=1,
                                       population=32, workers=1)
    drafts = []
    seen: set[str] = set()
    for _ in range(5):
        batch = policy.next_batch(6)
        keys = {state_key(s) for s in batch}
        assert len(keys) == len(batch) == 6 and not keys & seen
        seen |= keys
        drafts.append(tuple(s.steps for s in policy.potential))
    assert len(set(drafts)) >= 3  # batches 1, 3, 5 drafted (and whenever the potential space ran short)


def test_a_cheaper_first_draft_is_followed_by_a_full_one():
    """`first_generations=0`: a task's first batch is the analyzer's best of the random sample (no generation), the
    next batch drafts in full, and then drafts come every `draft_every` batches again."""
    policy = PrunerPolicy.from_options(gmm(), RandomModel(0), potential=16, draft_every=3, draft_generations=2,
                                       first_generations=0, population=32, init_population=24, workers=1)
    generations = []
    for _ in range(5):
        drafts = policy.drafts
        policy.next_batch(4)
        generations.append(len(policy.evolution.history) - 1 if policy.drafts > drafts else None)
    assert generations == [0, 2, None, 2, None]
    with pytest.raises(TuneError, match="first_generations None or >= 0"):
        PrunerPolicy.from_options(gmm(), RandomModel(0), first_generations=-1)


def test_same_seed_same_batches():
    def batches(seed):
        policy = PrunerPolicy.from_options(gmm(), RandomModel(0), seed=seed, potential=16, draft_generations=1,
                                           population=32, workers=1)
        return [[s.steps for s in policy.next_batch(5)] for _ in range(2)]

    assert batches(3) == batches(3)


def test_bad_options_say_which():
    with pytest.raises(TuneError, match="potential >= 1"):
        PrunerPolicy.from_options(gmm(), RandomModel(0), potential=0)
    with pytest.raises(TuneError, match="no knob 'drafts'"):
        PrunerPolicy.from_options(gmm(), RandomModel(0), drafts=3)
    assert "pruner" in POLICIES


def test_pruner_tunes_a_program_that_matches_numpy(tmp_path):
    """Real measurements, the XGBoost model trained after the first 16 programs: the second batch is verified by
    the model over the analyzer's potential space."""
    model = XGBModel(min_samples=16)
    result = tune(gmm(32), trials=32, policy="pruner", cost_model=model, batch_size=16, db=tmp_path / "p.db",
                  policy_options={"potential": 32, "draft_generations": 1, "population": 64, "workers": 1})
    assert result.trials == 32 and result.best_state is not None and model.trained
    rng = np.random.default_rng(0)
    a, b = (rng.random((1, 32, 32), dtype=np.float32) for _ in range(2))
    (c,) = build(result.best_state).run(a, b)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
