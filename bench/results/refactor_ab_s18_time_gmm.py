"""Re-time the best GMM 1024 program of two databases (before/after the refactor), alternating, current code."""
import json

import numpy as np

from tensorgen.build import build
from tensorgen.records.database import SQLiteDatabase
from tensorgen.timing import compare

engines, info = {}, {}
for name in ("before", "after"):
    with SQLiteDatabase(f"/tmp/ab/gmm_{name}.db") as db:
        ((key, target, _),) = db.workloads()
        rec = db.best(key, target)
        task = rec.task()
        info[name] = {"tuned_cost_s": rec.cost, "records": len(db.records(key, target))}
        mod = build(rec.state(), simd_bytes=task.hw.simd_bytes, march=task.target.march)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(t.shape).astype(t.dtype) for t in task.dag.args[:2]]
    engines[name] = lambda m=mod, a=args: m.run(*a)
c = compare(engines)
print(json.dumps({"info": info, "result": c.to_json(), "ratios": c.ratios, "reliable": c.reliable}, indent=1,
                 default=str))
