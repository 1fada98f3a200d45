"""Argument types, the parser and the output files shared by every `tensorgen` command: a bad value is one line,
exit code 2.

A number, target or output file is checked where argparse reads it, so no command starts work (or measures a
program) with `--threads 0`, a target the compiler rejects, or a file it could not write at the end.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

from tensorgen.codegen.backend import backend_for
from tensorgen.codegen.toolchain import preflight
from tensorgen.errors import TensorgenError
from tensorgen.hardware import hardware_for
from tensorgen.target import Target
from tensorgen.tuning.tune import check_searchable


class HelpFormatter(argparse.HelpFormatter):
    """argparse's help, but a description or epilog written in lines (the examples of a command) keeps them; one
    written as a paragraph is filled to the terminal's width."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return text if "\n" in text else super()._fill_text(text, width, indent)


class ArgumentParser(argparse.ArgumentParser):
    """argparse with errors in tensorgen's one-line form (`tensorgen: error: ...`, exit 2) instead of usage
    text; subcommand parsers made by add_subparsers inherit it.

    No prefix matching (argparse's allow_abbrev): `--thread 2` must not be taken as `--threads 2` in silence, nor
    `--batch` become ambiguous the day an option starting with it is added. Epilogs keep their line breaks (the
    examples of each command's `--help`, see HelpFormatter)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.options: list[str] = []  # every option string, for "did you mean"
        self.commands: dict[str, argparse.ArgumentParser] = {}  # its subcommands by name
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options += action.option_strings
        return action

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices  # filled as commands are added
        return action

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        """A command (a parser without subcommands) refuses what it does not know itself, so the error names it
        (`see tensorgen bench --help`, not the top-level help) and the option the user may have meant."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not self.commands:
            unknown = next((e.partition("=")[0] for e in extras if e.startswith("--")), "")
            longer = [o for o in self.options if unknown and o.startswith(unknown)]  # what prefix matching took
            close = longer or (difflib.get_close_matches(unknown, self.options, n=1) if unknown else [])
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       + (f"; did you mean {' or '.join(close)}?" if close else ""))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"tensorgen: error: {message} (see `{self.prog} --help`)\n")


def examples(*lines: str) -> str:
    """A command's `--help` epilog: `lines`, each a command line (a `# note` may follow it), under "examples:"."""
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def _integer(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _integer(text, 1, "a positive integer")


def nonneg_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _integer(text, 0, "a non-negative integer")


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_count(text: str) -> int:
    """An argparse type: threads to time with, at most one per usable CPU (more would time the contention)."""
    threads = positive_int(text)
    if threads > usable_cpus():
        raise argparse.ArgumentTypeError(f"{threads} threads, but this process may run on {usable_cpus()} CPU(s); "
                                         f"timings with more threads than CPUs measure contention, not the program")
    return threads


def _as_argument_type(check: Callable[[str], str]) -> Callable[[str], str]:
    """argparse reports only ArgumentTypeError messages; a TensorgenError's message must reach the user too."""

    def checked(text: str) -> str:
        try:
            return check(text)
        except TensorgenError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    checked.__name__ = check.__name__
    checked.__doc__ = check.__doc__
    return checked


@_as_argument_type
def target_name(text: str) -> str:
    """An argparse type: a well-formed target, as its canonical string (a target of records, maybe another
    machine's: not checked against this one)."""
    return str(Target.parse(text))


@cache
def _check_local(target: str) -> None:
    parsed = Target.parse(target)
    hw = hardware_for(parsed)  # an unknown GPU
    check_searchable(parsed)
    if parsed.kind == "cuda":
        backend_for(parsed, hw).preflight()  # nvcc (or the emulation's C++ compiler) builds a trivial kernel
        return
    usable, cores = usable_cpus(), int(parsed.get("cores", "1"))
    if cores > usable:
        raise TensorgenError(f"target {target!r}: -cores={cores}, but this process may run on {usable} CPU(s); "
                             f"timings with more threads than CPUs measure contention, not the program")
    preflight(march=parsed.march)  # the compiler builds, loads and runs a trivial kernel with the target's flags


@_as_argument_type
def local_target(text: str) -> str:
    """An argparse type: a target to compile and measure on this machine, as its canonical string: well formed,
    no more cores than this process may use, and an -mcpu the C compiler accepts (checked once per process)."""
    target = target_name(text)
    _check_local(target)
    return target


@_as_argument_type
def output_file(text: str) -> str:
    """An argparse type: a file the command writes, maybe after minutes of work: checked now (not a folder, its
    folder exists and is writable), so a mistyped path costs nothing."""
    path = Path(text)
    folder = path.parent
    if path.is_dir():
        raise TensorgenError(f"{text!r} is a folder; give a file name")
    if not folder.is_dir():
        raise TensorgenError(f"cannot write {text!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise TensorgenError(f"cannot write {text!r}: permission denied")
    return text


def output_file_or_stdout(text: str) -> str:
    """An argparse type: '-' (standard output) or an output_file."""
    return text if text == "-" else output_file(text)


def write_json(path: str, data: Any, indent: int = 2) -> None:
    """Write `data` as JSON to `path`; a failure (a full disk) is one line, not a traceback."""
    try:
        Path(path).write_text(json.dumps(data, indent=indent) + "\n", encoding="utf-8")
    except OSError as exc:
        raise TensorgenError(f"cannot write {path}: {exc.strerror or exc}") from exc
