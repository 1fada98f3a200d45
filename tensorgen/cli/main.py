"""The `tensorgen` command."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from tensorgen.cli import costmodel, graph, hw, info, records, report, tune, worker
from tensorgen.cli.args import ArgumentParser, examples
from tensorgen.errors import TensorgenError
from tensorgen.version import __version__


def _demo(args: argparse.Namespace) -> int:
    from tensorgen.cli.demo import main as demo_main

    return demo_main([])


def _ops(args: argparse.Namespace) -> int:
    from tensorgen.te.ops import SUITE

    for name, (make, configs) in SUITE.items():
        print(f"{name:10s} {make.__name__:18s} {len(configs)} shape configs, e.g. {configs[0]}")
    return 0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that it ends a command as Ctrl-C does: what a tuning run measured is
    committed, its workers are stopped, and one line says so."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def build_parser() -> ArgumentParser:
    """The `tensorgen` argument parser, with every command."""
    parser = ArgumentParser(
        prog="tensorgen", description="Generate fast tensor programs by search: tune a model (or an operator) on "
        "this machine, then build, run and time it. `tensorgen COMMAND --help` shows a command's options and examples.",
        epilog=examples("tensorgen tune bert_tiny --trials 256 && tensorgen bench bert_tiny   # the main job",
                        "tensorgen info model.onnx                      # what a model takes and returns",
                        "tensorgen build model.onnx -o out && tensorgen run out --inputs in.npz -o out.npz",
                        "tensorgen report -o report.html                # the tuning database as one page"))
    parser.add_argument("--version", action="version", version=f"tensorgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for commands in (tune, graph, info, report, records, hw, costmodel, worker):  # the main job's first
        commands.register(sub)
    sub.add_parser("demo", help="hand-scheduled matmul and conv2d: compile, check, time next to NumPy",
                   epilog=examples("tensorgen demo")).set_defaults(fn=_demo)
    sub.add_parser("ops", help="list the operator benchmark suite (Ansor Appendix C)",
                   epilog=examples("tensorgen ops", "tensorgen tune gmm --shape 1024,1024,1024 --trials 64")
                   ).set_defaults(fn=_ops)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = ["tensorgen", *(sys.argv[1:] if argv is None else argv)]  # the command, as typed
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return args.fn(args)
    except TensorgenError as err:
        print(f"tensorgen: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `tensorgen models | head`: the reader has gone, so has the rest of the listing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit must not raise again
        return 141  # what a shell reports for a writer killed by SIGPIPE
    except KeyboardInterrupt as exc:
        print(f"tensorgen: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
