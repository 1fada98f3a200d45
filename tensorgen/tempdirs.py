"""Temporary directories a process owns: named with its pid, removed when the work in them is done, and swept by a
later process when their owner died without removing them (SIGKILL runs no handler, no `finally`)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def owned_tempdir(prefix: str) -> Iterator[Path]:
    """A new directory `{prefix}{pid}-...` in the temp dir, removed with what it holds when the block ends (normally
    or by an exception); the directories of `prefix` left by processes that are gone are removed first.

    Args:
        prefix: the directory names' start, e.g. "tensorgen_torch_" (one prefix per kind of directory).
    """
    sweep_stale(prefix)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_stale(prefix: str, directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Remove the `{prefix}{pid}-...` directories whose process is no longer alive; the ones removed.

    Args:
        prefix: as given to owned_tempdir.
        directory: where to look (default: the temp dir, tempfile.gettempdir()).
    """
    root = Path(directory if directory is not None else tempfile.gettempdir())
    return sweep_dead(root, re.compile(re.escape(prefix) + r"(?P<pid>\d+)-.*"))


def sweep_dead(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Remove the entries of `folder` whose whole name matches `pattern` (its `pid` group: the process that made
    it) and whose process is gone: what a SIGKILL, which runs no clean-up, left behind; the ones removed. Entries
    that cannot be removed (another user's) are left."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    removed = []
    for entry in entries:
        found = pattern.fullmatch(entry.name)
        if found is None or pid_alive(int(found["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return sorted(removed)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (one of another user counts: it cannot be signalled, but it is there)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
