"""The cost models that ship in the package: PaCM pretrained on measured x86 programs, one per kind of machine, named
`pacm_<ISA family>-<vendor>.pt`: `pacm_x86-intel.pt` on AVX2 programs of the zoo's tasks measured on an Intel CPU
(bench/dataset.py, random and searched programs), `pacm_x86-amd.pt` on programs measured on an AMD CPU: a data set of
ConvNeXt-T, DCGAN, BERT-tiny and ResNet-18 (bench/dataset.py) and the tuning databases of MobileNet-V2, ResNet-50 and
ViT-S/16 (bench/pruner_networks.py; `tensorgen costmodel train`, bench/results/pruner_s32.md). Pruner's search starts
from the one of its machine's kind when PyTorch is installed (`--policy pruner`, cost model "auto", the default): the
first run of a new user starts from what was learned on other models, by momentum transfer (costmodel.pacm). The ISA
family alone is not enough: on the AMD CPU the Intel-measured model made Pruner slower than no pretraining, a model
pretrained on that machine's records of another network faster (bench/results/pruner_s25.md). Ansor's search keeps
XGBoost: on held-out tasks the shipped PaCM, fine-tuned, ranks pairs better than XGBoost learned online but finds the
best program less often (bench/results/pruner_s24.md).
"""

from __future__ import annotations

import platform
from pathlib import Path

from tensorgen.target import Target

__all__ = ["SHIPPED_DIR", "cpu_vendor", "isa_family", "machine_kind", "shipped_pacm"]

SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
_FAMILIES = {"x86_64": "x86", "amd64": "x86", "i386": "x86", "i686": "x86"}
_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def isa_family(target: str | Target) -> str | None:
    """The ISA family a target's programs are built for ("x86"; None: a GPU, or a CPU of another family). A CPU
    target compiles for this machine (its -mcpu picks a generation within the family)."""
    if Target.parse(target).kind != "cpu":
        return None
    return _FAMILIES.get(platform.machine().lower())


def cpu_vendor(cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """This machine's CPU vendor ("intel", "amd"; None: unknown, or no /proc/cpuinfo)."""
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return _VENDORS.get(value.strip())
    return None


def machine_kind(target: str | Target) -> str | None:
    """"<ISA family>-<vendor>" of the machine a CPU target runs on (e.g. "x86-intel"); None: not known."""
    family, vendor = isa_family(target), cpu_vendor()
    return f"{family}-{vendor}" if family is not None and vendor is not None else None


def shipped_pacm(target: str | Target) -> Path | None:
    """The pretrained PaCM file for the kind of machine `target` runs on; None where none ships (loading it needs
    PyTorch)."""
    kind = machine_kind(target)
    path = SHIPPED_DIR / f"pacm_{kind}.pt"
    return path if kind is not None and path.is_file() else None
