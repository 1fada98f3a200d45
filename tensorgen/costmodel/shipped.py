"""The cost models that ship in the package: PaCM pretrained on measured x86 programs (bench/dataset.py: the zoo's
tasks with random and searched programs, measured as AVX2 programs; `tensorgen costmodel train`). Pruner's search
on an x86 CPU starts from it when PyTorch is installed (`--policy pruner`, cost model "auto", the default): the
first run of a new user starts from what was learned on other machines and models, by momentum transfer
(costmodel.pacm). Ansor's search keeps XGBoost: on held-out tasks the shipped PaCM, fine-tuned, ranks pairs
better than XGBoost learned online but finds the best program less often (bench/results/pruner_s24.md).
"""

from __future__ import annotations

import importlib.util
import platform
from pathlib import Path

from tensorgen.target import Target

__all__ = ["SHIPPED_DIR", "isa_family", "shipped_pacm"]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
_FAMILIES = {"x86_64": "x86", "amd64": "x86", "i386": "x86", "i686": "x86"}


def isa_family(target: str | Target) -> str | None:
    """The ISA family a target's programs are built for ("x86"; None: a GPU, or a CPU of another family). A CPU
    target compiles for this machine (its -mcpu picks a generation within the family)."""
    if Target.parse(target).kind != "cpu":
        return None
    return _FAMILIES.get(platform.machine().lower())


def shipped_pacm(target: str | Target) -> Path | None:
    """The pretrained PaCM for `target`'s ISA family; None where none ships or PyTorch is not installed."""
    family = isa_family(target)
    path = SHIPPED_DIR / f"pacm_{family}.pt"
    if family is None or not path.is_file() or importlib.util.find_spec("torch") is None:
        return None
    return path
