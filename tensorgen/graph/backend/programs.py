"""The program each kernel of a model runs: its task's best record (or a chosen rank of its candidates), else one
adapted from a tuned kernel of the same structure, else the default schedule."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from tensorgen.errors import TensorgenError
from tensorgen.graph.backend.model_target import model_target
from tensorgen.graph.backend.select import CANDIDATE_POOL, candidate_records
from tensorgen.graph.passes.fusion import Subgraph
from tensorgen.records.database import Database
from tensorgen.schedule.state import State, state_layouts
from tensorgen.search.transfer import transfer_candidates
from tensorgen.target import Target

LOGGER = logging.getLogger("tensorgen.graph")
Schedule = tuple[State, float | None, str]  # a kernel's program, its recorded cost (None: not timed), how chosen


def schedule_subgraphs(subs: Sequence[Subgraph], target: Target, db: Database | None, cores: int,
                       ranks: Sequence[int] | None = None, pools: dict[str, tuple[int, list]] | None = None,
                       layouts: bool = True) -> list[Schedule]:
    """(state, its recorded cost or None, how it was chosen) per subgraph: its best record on `target` (or
    its `ranks[i]`-th candidate, see select.candidate_records; `pools` caches each task's candidates with
    how many were asked for), else one adapted from the tuned subgraph of the same structure and closest
    size, else the default schedule of the target's kind. Without `layouts`, records that lay out the kernel's
    arguments (ALT's) are passed over."""
    pools = {} if pools is None else pools

    def record(sub: Subgraph, rank: int):
        if db is None:
            return None
        if rank == 0:
            best = db.best(sub.workload_key, str(target))
            if best is None or layouts or not best.sets_layouts:
                return best
            return next((r for r in db.top_k(sub.workload_key, str(target), CANDIDATE_POOL) if not r.sets_layouts),
                        None)
        asked, pool = pools.get(sub.workload_key, (0, []))
        if asked <= rank:  # one query and replay per task for all the ranks of a selection
            asked = max(rank + 1, CANDIDATE_POOL)
            pool = candidate_records(db, sub.workload_key, str(target), asked)
            pools[sub.workload_key] = asked, pool
        return pool[min(rank, len(pool) - 1)] if pool else None

    records = [record(sub, ranks[i] if ranks else 0) for i, sub in enumerate(subs)]
    tuned = {}
    for i, (sub, r) in enumerate(zip(subs, records)):
        if r is not None:
            try:
                tuned[i] = r.state(sub.dag), r.result.median_cost
            except TensorgenError as err:  # a record an older or broken version wrote
                LOGGER.warning("kernel %d (%s): its record does not replay (%s); it is built without it", i,
                               sub.name, err)
    # a program whose arguments are laid out does not adapt: its layouts' tile sizes are those of its own shapes
    donors = [(state, subs[i].dag.flop_count / cost) for i, (state, cost) in tuned.items()
              if cost > 0 and not state_layouts(state)]
    out = []
    for i, sub in enumerate(subs):
        if i in tuned:
            out.append((*tuned[i], "tuned"))
        elif adapted := transfer_candidates(sub.dag, donors, limit=1):
            out.append((adapted[0], None, "transferred"))
        else:
            out.append((model_target(target).schedule(sub.dag, cores), None, "default"))
    return out
