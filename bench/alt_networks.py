"""ALT on whole networks (ALT §7.2, Fig. 10): each model tuned with the same trial budget by Ansor (the "ansor"
policy: loops only, the layouts the graph passes fix) and by ALT (`tensorgen tune MODEL --policy alt`: layouts and
loops, then the kernels its layouts add), then built four ways and timed in one run next to ONNX Runtime:

    ansor        Ansor's records (every build here takes each kernel's fastest record: --candidates 1)
    alt-nolayout ALT's database, records that lay out arguments passed over (what ALT's loops alone give)
    alt-noprop   ALT's records with conversion kernels, no propagation (the ablation's "without propagation")
    alt          ALT's records, layouts propagated along element-wise kernels, Transposes absorbed (full ALT)

    python bench/alt_networks.py [--models mobilenet_v2,resnet18] [--trials 800] [--dbs alt_networks]
                                 [--threads 2] [--json FILE] [timing options]

Tuning resumes from the databases (`<dbs>_<model>_ansor.db`, `<dbs>_<model>_alt.db`); `--trials 0` times what they
hold. Every build's output is checked against ONNX Runtime before it is timed; the time each kernel kind takes
inside the full ALT model (layout_transform: the conversions) comes from its per-kernel profile.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import thread_env  # noqa: E402, F401  (first: the thread counts of NumPy and torch)

from tensorgen.cli.main import main as tensorgen_main  # noqa: E402
from tensorgen.graph.reference.compare import OUTPUT_RTOL, onnxruntime_engine, output_error  # noqa: E402
from tensorgen.graph.zoo import MODELS  # noqa: E402
from tensorgen.timing import add_arguments, compare, protocol_from  # noqa: E402

BUILDS = {"ansor": ("ansor", "off"), "alt-nolayout": ("alt", "off"), "alt-noprop": ("alt", "follow"),
          "alt": ("alt", "propagate")}  # name: (database, build_model's layouts)


def tune(model: str, policy: str, trials: int, db: str) -> dict:
    start = time.perf_counter()
    if trials:
        code = tensorgen_main(["tune", model, "--trials", str(trials), "--policy", policy, "--db", db])
        if code != 0:
            raise SystemExit(f"tensorgen tune {model} --policy {policy} failed ({code})")
    return {"policy": policy, "trials": trials, "tuning_wall_s": time.perf_counter() - start}


def measure(model: str, dbs: dict[str, str], threads: int, protocol) -> dict:
    """Build `model` every way of BUILDS, check each against ONNX Runtime and time them together."""
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.frontend.onnx_inputs import random_inputs
    from tensorgen.graph.load import load_graph, onnx_model_of
    from tensorgen.records.database import SQLiteDatabase
    from tensorgen.runtime.model import CompiledModel

    proto = onnx_model_of(model)
    graph = load_graph(proto)
    feeds = random_inputs(proto)
    inputs = [feeds[n] for n in graph.inputs]
    ort_run, reference = onnxruntime_engine(proto, feeds, threads)
    row: dict[str, Any] = {"model": model, "threads": threads, "errors": {}, "kernels": {}}
    runs = {"onnxruntime": ort_run}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (db, layouts) in BUILDS.items():
            with SQLiteDatabase(dbs[db]) as records:
                out = build_model(graph, Path(tmp) / name, db=records, layouts=layouts)
            compiled = CompiledModel(out, threads=threads)
            _, rel = output_error(compiled.run(inputs), reference)
            kernels = compiled.manifest["kernels"]
            row["kernels"][name] = {"count": len(kernels),
                                    "conversions": sum("layout_transform" in k["name"] for k in kernels)}
            if rel > OUTPUT_RTOL:
                row["errors"][name] = f"wrong output ({rel:.3g} of max |onnxruntime|)"
                continue
            runs[name] = (lambda c: lambda: c.run(inputs))(compiled)
            if name == "alt":
                profile = compiled.profile(inputs, repeat=30)
                total = sum(k["ms"] for k in profile)
                conv = sum(k["ms"] for k in profile if "layout_transform" in k["kernel"])
                row["conversion_ms"], row["kernels_ms"] = conv, total
        timed = compare(runs, protocol, reference="ansor" if "ansor" in runs else "onnxruntime")
    row["ms"] = {engine: s * 1e3 for engine, s in timed.seconds.items()}
    row["speedup_vs_ansor"] = {k: row["ms"]["ansor"] / v for k, v in row["ms"].items()} if "ansor" in row["ms"] else {}
    row.update(reliable=timed.reliable, disagreement=timed.disagreement(), timing=timed.to_json())
    return row


def measure_fresh(*args: Any) -> dict:
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(measure, *args).result()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mobilenet_v2,resnet18")
    parser.add_argument("--trials", type=int, default=800, help="per model and policy (default 800)")
    parser.add_argument("--dbs", default="alt_networks", help="database name prefix (default alt_networks)")
    parser.add_argument("--threads", type=int, default=2)
    add_arguments(parser)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(MODELS)}")
    protocol = protocol_from(args)
    rows = []
    for model in args.models.split(","):
        dbs = {policy: f"{args.dbs}_{model}_{policy}.db" for policy in ("ansor", "alt")}
        tuning = [tune(model, policy, args.trials, db) for policy, db in dbs.items()]
        row = {**measure_fresh(model, dbs, args.threads, protocol), "tuning": tuning}
        rows.append(row)
        verdict = "" if row["reliable"] else f"  UNRELIABLE: {row['disagreement']}"
        times = ", ".join(f"{k} {v:.3f} ms ({row['speedup_vs_ansor'].get(k, 0):.2f}x)" for k, v in row["ms"].items())
        print(f"{model}: {times}; conversions {row.get('conversion_ms', 0):.3f} of {row.get('kernels_ms', 0):.3f} "
              f"kernel ms; errors {row['errors'] or 'none'}{verdict}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"protocol": protocol.to_json(), "rows": rows}, indent=1,
                                              default=str))
    return 0 if all(not r["errors"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
