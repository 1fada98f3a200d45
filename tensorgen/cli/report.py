"""`tensorgen report`: a tuning database as one self-contained HTML page (curves, tasks, errors, hardware)."""

from __future__ import annotations

import argparse
import shlex

from tensorgen.cli.args import examples, output_file, positive_int, target_name, thread_count, usable_cpus
from tensorgen.cli.inputs import add_input_args, model_inputs
from tensorgen.cli.records import DEFAULT_DB, open_existing, report_unreadable
from tensorgen.errors import TensorgenError

DEFAULT_OUT = "report.html"


def report_hint(db: str, model: str | None = None, batch: int = 1, shape: str | None = None) -> str:
    """The line `tensorgen tune` ends with: the command that makes the report of what it tuned (for a model, with
    the batch and input shapes it was tuned at)."""
    named = ["--model", model] if model else []
    named += ["--batch", str(batch)] if model and batch != 1 else []
    named += ["--shape", shape] if model and shape else []
    return "report: " + shlex.join(["tensorgen", "report", "--db", db, *named, "-o", DEFAULT_OUT])


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="a tuning database as one self-contained HTML page: best speed per task "
                                             "against trials and time, a model's estimated latency, errors, hardware",
                              epilog=examples("tensorgen report -o report.html                 # tuning.db",
                                              "tensorgen report --db my.db --model bert_tiny --profile -o report.html",
                                              "tensorgen hw --measure    # once: the report's % of peak needs it"))
    p.add_argument("--db", default=DEFAULT_DB, help=f"the tuning database (default {DEFAULT_DB})")
    p.add_argument("-o", "--out", type=output_file, default=DEFAULT_OUT,
                   help=f"the HTML file to write (default {DEFAULT_OUT})")
    p.add_argument("--model", metavar="MODEL",
                   help="a zoo name or .onnx file: its estimated latency from its own tasks and weights (default: "
                        "the models the tuning runs recorded)")
    p.add_argument("--batch", type=positive_int, default=1, metavar="N",
                   help="the batch size of a zoo model: its inputs' first dimension (default 1)")
    add_input_args(p)
    p.add_argument("--target", type=target_name,
                   help="the target whose records to show (default: the one with the most records)")
    p.add_argument("--profile", action="store_true",
                   help="with --model: build and run the model and show each kernel's share of its time, GFLOP/s "
                        "and share of peak, next to ONNX Runtime's per-node profile (seconds to minutes)")
    p.add_argument("--threads", type=thread_count, default=usable_cpus(),
                   help="threads to profile with (default: every usable CPU)")
    p.set_defaults(fn=_report)


def _report(args: argparse.Namespace) -> int:
    from tensorgen.report import ModelRequest, write_report

    if args.model is None and (args.profile or args.shape or args.inputs or args.batch != 1):
        raise TensorgenError("--profile, --shape, --inputs and --batch describe a model: pass --model MODEL too")
    command = shlex.join(args.argv)
    with open_existing(args.db) as db:
        request = None
        if args.model is not None:
            given = model_inputs(args.model, args.batch, args.shape, args.inputs)
            feed = None
            if args.profile:
                from tensorgen.graph.frontend.onnx_inputs import random_inputs

                feed = given.feed if given.feed is not None else random_inputs(given.model, 0, given.shapes)
            request = ModelRequest(given.model, given.graph(), feed, args.threads)
        data = write_report(db, args.out, command, args.target, request)
        report_unreadable(db)
    print(f"wrote {args.out}: {len(data.tasks)} tasks, {data.measurements} measurements, target '{data.target}'")
    return 0
