"""The files of a built model directory and what ties them together.

Since format 4, model.json lists the size and SHA-256 of weights.bin and model.so (`files`), computed while the
build streams them to disk. The loader checks both before it maps the weights or loads the library: a truncated or
corrupted file, or a model.so and a weights.bin of two different builds, is refused in one line instead of running
into garbage, NaN, a segfault or a bus error. SHA-256 because the CPU computes it in hardware (SHA-NI): about
1 GB/s on this 2-core machine under load, the fastest of hashlib's digests here (blake2b 0.34 GB/s).

A build writes every file under a temporary name in the directory (`.NAME.PID.partial`), then removes the old
manifest, renames the files into place and the new manifest last (`commit`): a build killed at any point leaves the
old build, the new one, or a directory refused in one line, never a mix that runs. Partial files of builds whose
process is gone are removed by the next build into the directory (tempdirs.sweep_dead).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import RuntimeCallError

MANIFEST = "model.json"
WEIGHTS = "weights.bin"
LIBRARY = "model.so"
#: model.json format: 4 adds `files` (sizes and digests) and weights the host executor reads in place (mapped)
FORMAT = 4
CHUNK = 1 << 20  # bytes hashed or copied at a time: memory stays flat whatever the file's size
PARTIAL = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d{1,7})\.partial")  # pids are below 2**22
REBUILD = "rebuild it with tensorgen build"


@dataclass(frozen=True)
class FileDigest:
    """What model.json records of one file.

    Fields:
        size: bytes.
        sha256: hex digest of the whole file."""

    size: int
    sha256: str


def file_digest(f: BinaryIO) -> FileDigest:
    """Size and digest of the open file `f`, read from its start CHUNK bytes at a time."""
    f.seek(0)
    digest, size = hashlib.sha256(), 0
    while chunk := f.read(CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return FileDigest(size, digest.hexdigest())


class StagedFile:
    """A file of a build written under its temporary name (`.NAME.PID.partial`) in `directory`, hashed as it is
    written; `commit` renames it into place.

    Args:
        directory: the build directory (it exists).
        name: the file's final name in it."""

    def __init__(self, directory: Path, name: str):
        self.name = name
        self.path = directory / f".{name}.{os.getpid()}.partial"
        self._file = self.path.open("wb")
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data) -> None:
        """Append `data` (bytes or any C-contiguous buffer, e.g. a uint8 array)."""
        self._digest.update(data)
        self._file.write(data)
        self.size += memoryview(data).nbytes

    def copy_from(self, path: Path) -> None:
        """Append the whole file at `path`."""
        with path.open("rb") as source:
            while chunk := source.read(CHUNK):
                self.write(chunk)

    def close(self) -> FileDigest:
        """Flush and close the file; its size and digest."""
        self._file.close()
        return FileDigest(self.size, self._digest.hexdigest())

    def discard(self) -> None:
        """Close and remove the file (a build that failed)."""
        self._file.close()
        self.path.unlink(missing_ok=True)


def commit(directory: Path, staged: Iterable[StagedFile], manifest: dict) -> None:
    """Put a build in place: the old manifest removed, the closed `staged` files renamed to their names, then the new
    `manifest` written the same way. A reader that finds a manifest finds the files it lists or files whose
    digests differ from it (refused); the old manifest is removed first because one of format 3 or older lists no
    digests, and a mix of its files with the new ones would run."""
    (directory / MANIFEST).unlink(missing_ok=True)
    for file in staged:
        os.replace(file.path, directory / file.name)
    last = StagedFile(directory, MANIFEST)
    last.write(json.dumps(manifest, indent=1).encode())
    last.close()
    os.replace(last.path, directory / MANIFEST)


def digests(files: dict[str, FileDigest]) -> dict[str, dict]:
    """The manifest's `files` entry."""
    return {name: asdict(d) for name, d in files.items()}


def open_checked(directory: Path, name: str, manifest: dict) -> BinaryIO:
    """`directory/name` opened for reading once its size and digest equal what `manifest` lists (format 4 on; an
    older manifest lists none, and its files are opened unchecked). RuntimeCallError naming the file otherwise."""
    path = directory / name
    f = path.open("rb")
    expected = manifest.get("files", {}).get(name)
    if expected is None:
        return f
    try:
        size = os.fstat(f.fileno()).st_size
        if size != expected["size"]:
            raise RuntimeCallError(f"{path} holds {size} bytes where its build wrote {expected['size']} "
                                   f"(truncated, or from another build): {REBUILD}")
        if file_digest(f).sha256 != expected["sha256"]:
            raise RuntimeCallError(f"{path} differs from what its build wrote (its SHA-256 does not match "
                                   f"{MANIFEST}; corrupted, or from another build): {REBUILD}")
    except BaseException:
        f.close()
        raise
    return f
