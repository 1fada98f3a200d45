"""`tensorgen costmodel`: train a cost model offline from tuning databases, and say how well a model ranks programs.

    tensorgen costmodel train --db a.db --db b.db -o model.pt     # PaCM, pretrained on every task of the databases
    tensorgen costmodel train --db a.db -o m.pt --held-out-model resnet50   # ... but none of ResNet-50's tasks
    tensorgen costmodel eval pacm:model.pt --db held_out.db       # its ranking of tasks it never saw
    tensorgen costmodel eval auto --db held_out.db                # the PaCM that ships with tensorgen
    tensorgen tune resnet50 --cost-model pacm:model.pt ...        # tuning that starts from it (momentum transfer)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tensorgen.cli.args import examples, output_file, positive_int, write_json
from tensorgen.cli.tune import cost_model_arg
from tensorgen.costmodel.pacm import PaCM, PaCMConfig
from tensorgen.errors import TensorgenError
from tensorgen.graph.backend.tasks import extract_tasks
from tensorgen.graph.load import load_graph
from tensorgen.target import Target
from tensorgen.tuning.training import TrainingSet, load_training_set, ranking_quality
from tensorgen.tuning.tune import make_cost_model


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("costmodel", help="train a cost model from tuning databases; evaluate one",
                              epilog=examples("tensorgen costmodel train --db a.db --db b.db -o model.pt",
                                              "tensorgen costmodel eval pacm:model.pt --db held_out.db"))
    sub = p.add_subparsers(dest="costmodel_command", required=True)
    train = sub.add_parser("train", help="pretrain a PaCM cost model on the measured programs of databases",
                           epilog=examples("tensorgen costmodel train --db a.db --db b.db -o model.pt",
                                           "tensorgen costmodel train --db a.db -o m.pt --held-out-model resnet50",
                                           "tensorgen tune resnet50 --policy pruner --cost-model pacm:model.pt"))
    train.add_argument("--db", action="append", required=True, metavar="FILE",
                       help="a tuning database (repeat for several): every task's measured programs")
    train.add_argument("-o", "--out", required=True, type=output_file, metavar="FILE.pt",
                       help="where to write the model")
    train.add_argument("--steps", type=positive_int, default=3000, help="training steps (default 3000)")
    train.add_argument("--held-out", type=float, default=0.0, metavar="SHARE",
                       help="leave this share of the tasks out of training and report the model's ranking of them")
    train.add_argument("--held-out-model", action="append", default=[], metavar="MODEL",
                       help="leave every task of this model (zoo name or ONNX file; repeatable) out of training, and "
                            "report the ranking of those the databases hold: pretraining for a model it never saw")
    train.add_argument("--no-dataflow", action="store_true", help="leave out the data-flow branch (the ablation)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--json", type=output_file, metavar="FILE", help="also write the figures as JSON")
    train.set_defaults(fn=_train)
    ev = sub.add_parser("eval", help="how a cost model ranks the measured programs of databases",
                        epilog=examples("tensorgen costmodel eval pacm:model.pt --db held_out.db",
                                        "tensorgen costmodel eval auto --db held_out.db   # the PaCM that ships"))
    ev.add_argument("model", type=cost_model_arg, metavar="NAME:FILE",
                    help="a saved model, e.g. pacm:model.pt; auto: the one that ships for this machine")
    ev.add_argument("--db", action="append", required=True, metavar="FILE", help="a tuning database (repeatable)")
    ev.add_argument("--json", type=output_file, metavar="FILE", help="also write the figures as JSON")
    ev.set_defaults(fn=_eval)


def _line(quality: dict[str, float]) -> str:
    return (f"{int(quality['tasks'])} tasks: pairwise accuracy {quality['pairwise']:.3f}, recall@10 "
            f"{quality['recall@10']:.3f}, top-1 {quality['top-1']:.3f}, top-5 {quality['top-5']:.3f}")


def _load(paths: list[str], dataflow: bool) -> TrainingSet:
    data = load_training_set(paths, dataflow=dataflow, progress=lambda line: print(line, file=sys.stderr, flush=True))
    if not data.tasks:
        raise TensorgenError(f"no task with two or more measured programs in {', '.join(paths)}")
    print(f"{len(data.tasks)} tasks, {data.programs} programs from {len(paths)} database(s) "
          f"({data.seconds:.1f} s to replay and extract features)" + (f"; {data.unreplayable} records could not "
                                                                        f"be replayed" if data.unreplayable else ""))
    return data


def _train(args: argparse.Namespace) -> int:
    if not 0 <= args.held_out < 1:
        raise TensorgenError(f"--held-out must be in [0, 1), got {args.held_out}")
    held_keys = {mt.task.workload_key for model in args.held_out_model
                 for mt in extract_tasks(load_graph(model), Target.parse("cpu"))}
    data = _load(args.db, dataflow=True)
    train, held = data.split(args.held_out, args.seed, workloads=held_keys)
    if not train.tasks:
        raise TensorgenError("no task left to train on: lower --held-out or hold out fewer models")
    model = PaCM(seed=args.seed, config=PaCMConfig(dataflow=not args.no_dataflow))
    t0 = time.perf_counter()
    model.fit(*train.arrays(), steps=args.steps)
    seconds = time.perf_counter() - t0
    try:
        model.save(args.out)
    except (OSError, RuntimeError) as exc:  # torch.save reports a failed write as a RuntimeError
        raise TensorgenError(f"cannot write the model to {args.out}: {exc}") from exc
    print(f"trained PaCM on {len(train.tasks)} tasks ({train.programs} programs), {args.steps} steps in "
          f"{seconds:.1f} s -> {args.out}")
    out: dict[str, Any] = {"tasks": len(train.tasks), "programs": train.programs, "steps": args.steps,
                           "train_s": seconds, "model": args.out}
    if held.tasks:
        out["held_out"] = ranking_quality(model, held)
        print(f"held out, {_line(out['held_out'])}")
    if args.json:
        write_json(args.json, out, indent=1)
    return 0


def _eval(args: argparse.Namespace) -> int:
    model = make_cost_model(args.model, target="cpu", policy="pruner")  # auto: the PaCM that ships for this CPU
    quality = ranking_quality(model, _load(args.db, dataflow=model.dataflow))
    print(_line(quality))
    if args.json:
        write_json(args.json, quality, indent=1)
    return 0
