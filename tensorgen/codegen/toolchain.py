"""Compile generated C into shared libraries, cached by content so re-tuning never recompiles a kernel.

`build_cached` is the cache itself, for any compiler (`BuildCommand`); the CUDA toolchain builds through it too.

A cached object is trusted only if it matches the size and SHA-256 recorded beside it when it was built
(`<object>.sum`): a file that merely exists may be truncated by a full disk or a killed copy, and loading
one crashes the process or, worse, is taken for a failure of the program it holds.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from ..errors import CompileError, ToolchainError

#: Flags every kernel is built with; no -ffast-math so results stay comparable with numpy.
BASE_FLAGS: tuple[str, ...] = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-ffp-contract=fast")
#: Added for gcc only. gcc 12 -O3 turns some unrolled loops over a stack tile into wrong memset/memcpy calls
#: (bench/results/fuzz_s16.md); our loops never gain from that pattern replacement.
GCC_FLAGS: tuple[str, ...] = ("-fno-tree-loop-distribute-patterns",)
_LOG_LINES = 20
LOGGER = logging.getLogger("tensorgen.toolchain")


def find_command(spec: str | None, env: str, candidates: Sequence[str], what: str) -> list[str]:
    """Resolve a compiler command: `spec`, else $`env`, else the first of `candidates` on PATH; fail clearly
    (naming `what` it is, e.g. "C compiler") if none exists."""
    given = spec or os.environ.get(env)
    for cand in [given] if given else candidates:
        words = shlex.split(cand)
        path = shutil.which(words[0]) if words else None
        if path:
            return [path, *words[1:]]
    if given:
        raise ToolchainError(f"{what} {given!r} (from {'the argument' if spec else '$' + env}) not found on PATH")
    raise ToolchainError(f"no {what} found: none of {', '.join(candidates)} is on PATH; set ${env}")


def find_compiler(cc: str | None = None) -> list[str]:
    """Resolve the compiler command: `cc`, else $CC, else gcc, else clang; fail clearly if none exists."""
    return find_command(cc, "CC", ("gcc", "clang"), "C compiler")


@cache
def tool_version(path: str) -> str:
    """The output of `<path> --version` (part of cache keys, so a compiler upgrade invalidates kernels)."""
    try:
        out = subprocess.run([path, "--version"], check=False, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run compiler {path!r}: {exc}") from exc
    return (out.stdout or out.stderr).strip()


def _identify(path: str) -> tuple[str, bool]:
    """The first line of `<cc> --version` and whether the compiler is gcc (under any name, e.g. `cc`: its notice
    names the Free Software Foundation)."""
    text = tool_version(path)
    lines = text.splitlines()
    return (lines[0].strip() if lines else "unknown"), "Free Software Foundation" in text and "clang" not in text


def _flags(cmd: Sequence[str], march: str | None, extra_flags: Sequence[str]) -> list[str]:
    arch = [f"-march={march}"] if march else []
    family = GCC_FLAGS if _identify(cmd[0])[1] else ()
    return [BASE_FLAGS[0], *arch, *BASE_FLAGS[1:], *family, *extra_flags]


def compiler_info(cc: str | None = None, march: str | None = "native") -> dict[str, str]:
    """Compiler command, version and flags, for recording alongside tuning results."""
    cmd = find_compiler(cc)
    return {"command": shlex.join(cmd), "version": _identify(cmd[0])[0], "flags": shlex.join(_flags(cmd, march, ()))}


def cache_dir() -> Path:
    """Kernel cache: $TENSORGEN_CACHE_DIR, else ~/.cache/tensorgen/kernels."""
    env = os.environ.get("TENSORGEN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "tensorgen" / "kernels"


def usable_cache_dir() -> Path:
    """cache_dir(), created if missing; ToolchainError (one line, naming the directory) if it cannot be."""
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=root, prefix=".probe.")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise _cache_error(root, exc) from None
    return root


def _cache_error(root: Path, exc: OSError) -> ToolchainError:
    return ToolchainError(f"kernel cache directory {root} is not writable ({exc.strerror or exc}); "
                          "set TENSORGEN_CACHE_DIR to a writable directory")


def _digest(path: Path) -> str:
    with open(path, "rb") as f:
        return f"{os.fstat(f.fileno()).st_size} {hashlib.file_digest(f, 'sha256').hexdigest()}"


def seal(path: Path, built: Path) -> None:
    """Record the size and hash of `built` as those of `path`, before `built` is moved there: a reader that
    finds the new checksum beside an older object rebuilds it, never trusts a partial one."""
    atomic_write(path.with_name(path.name + ".sum"), _digest(built))


def intact(path: Path) -> bool:
    """Whether cached `path` exists and matches the size and hash sealed for it; a mismatch is logged."""
    if not path.exists():
        return False
    try:
        expected = path.with_name(path.name + ".sum").read_text()
    except OSError:
        LOGGER.warning("kernel cache: %s has no checksum; rebuilding it", path)
        return False
    if _digest(path) != expected:
        LOGGER.warning("kernel cache: %s does not match its checksum (truncated or overwritten); rebuilding it",
                       path)
        return False
    return True


def numbered_source(source: str) -> str:
    """The source with 1-based line numbers, to match compiler diagnostics against."""
    lines = source.splitlines()
    width = len(str(len(lines)))
    return "\n".join(f"{i:>{width}} | {line}" for i, line in enumerate(lines, 1))


def atomic_write(path: Path, data: str) -> None:
    """Write via a temp file + rename so a concurrent reader never sees a partial file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(data)
    os.replace(tmp, path)


VECTOR_MATH_PREFIX = "_ZGV"  # x86-64 vector-function ABI names: glibc's libmvec (e.g. _ZGVdN8v_expf)


def libraries(source: str) -> list[str]:
    """Link flags `source` needs: libm, and libmvec when it calls vector math functions."""
    return ["-lmvec", "-lm"] if VECTOR_MATH_PREFIX in source else ["-lm"]


@cache
def has_vector_math(simd_bytes: int, name: str = "exp") -> bool:
    """Whether generated code may call libmvec's `simd_bytes`-wide `name`f (x86-64 glibc: exp and log
    from 2.22, erf and tanh from 2.35, each with the matching ISA): one probe link per function and
    width (cached on disk). The probe links with --no-undefined: a shared library is otherwise built
    against a libmvec without the function and fails only when loaded."""
    isa = {16: "b", 32: "d", 64: "e"}.get(simd_bytes)
    if isa is None or platform.machine() not in ("x86_64", "AMD64"):
        return False
    fn = f"_ZGV{isa}N{simd_bytes // 4}v_{name}f"
    probe = (f"typedef float v __attribute__((vector_size({simd_bytes})));\n"
             f"v {fn}(v);\nv probe(v x) {{ return {fn}(x); }}\n")
    try:
        compile_source(probe, timeout=60, extra_flags=("-Wl,--no-undefined",))
    except CompileError:
        return False
    return True


def run_group(argv: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """Run a compiler in its own process group and kill the whole group on timeout: killing only the
    driver leaves cc1 running for minutes, stealing a core from every measurement after it."""
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@dataclass(frozen=True)
class BuildCommand:
    """How a source becomes a shared library: `compiler` `flags` -o <library> <source> `libraries`. The source,
    compiler, version and flags make the cache key; `suffix` names the cached source file (and so its language
    for compilers that go by it) and `what` the compiler in errors."""

    compiler: tuple[str, ...]
    flags: tuple[str, ...]
    version: str
    libraries: tuple[str, ...] = ()
    suffix: str = ".c"
    what: str = "C compiler"

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, "\0".join(self.compiler), self.version, "\0".join(self.flags)):
            h.update(part.encode())
            h.update(b"\x01")
        return h.hexdigest()


def build_cached(source: str, command: BuildCommand, timeout: float | None = None) -> Path:
    """Build `source` with `command` into the kernel cache and return the library's path; identical inputs reuse
    the cached library. CompileError (with the compiler's log) if the compiler rejects the source or times out."""
    key = command.key(source)
    root = cache_dir()
    so_path, src_path = root / f"{key}.so", root / f"{key}{command.suffix}"
    if intact(so_path):
        return so_path
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(src_path, source)
        fd, tmp = tempfile.mkstemp(dir=root, prefix=f"{key}.", suffix=".so.tmp")
        os.close(fd)
    except OSError as exc:
        raise _cache_error(root, exc) from None
    try:
        try:
            argv = [*command.compiler, *command.flags, "-o", tmp, str(src_path), *command.libraries]
            proc = run_group(argv, timeout)
        except subprocess.TimeoutExpired as exc:
            raise CompileError(
                f"{command.what} timed out after {timeout}s compiling {src_path}", source=source
            ) from exc
        except OSError as exc:
            raise ToolchainError(f"cannot run {command.what} {command.compiler[0]!r}: {exc}", source=source) from exc
        if proc.returncode != 0:
            log = proc.stderr or proc.stdout
            lines = log.splitlines()
            shown = "\n".join(lines[:_LOG_LINES])
            more = f"\n... ({len(lines) - _LOG_LINES} more lines)" if len(lines) > _LOG_LINES else ""
            raise CompileError(
                f"{shlex.join(command.compiler)} failed (exit {proc.returncode}) compiling {src_path}:\n{shown}{more}",
                source=source,
                log=log,
            )
        seal(so_path, Path(tmp))
        os.replace(tmp, so_path)
    except OSError as exc:
        raise _cache_error(root, exc) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so_path


def compile_source(
    source: str,
    *,
    cc: str | None = None,
    march: str | None = "native",
    extra_flags: Sequence[str] = (),
    timeout: float | None = None,
) -> Path:
    """Compile C `source` to a shared library and return its path; identical inputs reuse the cached .so."""
    cmd = find_compiler(cc)
    command = BuildCommand(tuple(cmd), tuple(_flags(cmd, march, extra_flags)), _identify(cmd[0])[0],
                           tuple(libraries(source)))
    return build_cached(source, command, timeout)


_PREFLIGHT_C = r"""
int tensorgen_preflight(int n) {
  int s = 0;
  #pragma omp parallel for reduction(+:s)
  for (int i = 0; i < n; i++) s += i;
  return s;
}
"""
_preflight_passed: set[tuple[str, ...]] = set()


def build_probe(command: BuildCommand, source: str, directory: Path, hint: str) -> Any:
    """Build `source` with `command` in `directory` (not the cache: a preflight checks that the compiler works
    now), load it and return its function `tensorgen_preflight`. ToolchainError naming the command (and `hint`,
    what to check) if it cannot be run, fails or builds a library that does not load."""
    src, so = directory / f"preflight{command.suffix}", directory / "preflight.so"
    src.write_text(source)
    what = f"the {command.what} ({shlex.join([*command.compiler, *command.flags])})"
    try:
        proc = run_group([*command.compiler, *command.flags, "-o", str(so), str(src), *command.libraries], 300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{what} cannot be run: {exc}") from None
    if proc.returncode != 0 or not so.is_file():
        first = next((line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()), "no output")
        raise ToolchainError(f"{what} cannot build a trivial kernel (exit {proc.returncode}: {first.strip()}); {hint}")
    try:
        return ctypes.CDLL(str(so)).tensorgen_preflight
    except (OSError, AttributeError) as exc:
        raise ToolchainError(f"a trivial kernel built by {what} cannot be loaded: {exc}") from None


def preflight(cc: str | None = None, march: str | None = "native", *, again: bool = False) -> None:
    """Check once per process, compiler, flags and cache directory (`again`: check anew) that a trivial
    OpenMP kernel compiles with the flags every kernel gets, loads and runs, in a fresh directory of the
    kernel cache. Raises ToolchainError naming what is broken: without it, a missing compiler, an
    unwritable cache or a rejected -march would be stored as a failure of every program measured."""
    cmd = find_compiler(cc)
    command = BuildCommand(tuple(cmd), tuple(_flags(cmd, march, ())), _identify(cmd[0])[0])
    key = (*cmd, *command.flags, str(cache_dir()))
    if key in _preflight_passed and not again:
        return
    root = usable_cache_dir()
    with tempfile.TemporaryDirectory(dir=root, prefix="preflight.") as tmp:
        got = build_probe(command, _PREFLIGHT_C, Path(tmp), "check $CC and the target's -mcpu/-march")(100)
        if got != 4950:
            raise ToolchainError(f"a trivial kernel built by the C compiler ({shlex.join([*cmd, *command.flags])}) "
                                 f"returns {got} instead of 4950")
    _preflight_passed.add(key)
