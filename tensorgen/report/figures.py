"""The report's figures, drawn with matplotlib (imported here only, lazily, without pyplot: no display, no global
figure state) and returned as inline SVG text."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import count
from typing import Any

from tensorgen.report.data import ModelCurve, ReportError, TaskCurve
from tensorgen.report.profile import Profile

MAX_PANELS = 24  # tasks drawn one panel each; the others are listed in the table
MAX_BARS = 40
TOP_KERNELS = 15
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
_SALT = count()


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


@contextmanager
def _style() -> Iterator[None]:
    """Every figure is drawn inside: it checks that matplotlib is there, and sets the page's style."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the report draws its figures with matplotlib, which is not installed: "
                          "pip install 'tensorgen[report]' (or pip install matplotlib)") from None
    # text stays text (small, searchable); ids differ between the page's figures
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"tensorgen-{next(_SALT)}",
                                "font.size": 9, "axes.titlesize": 9, "axes.grid": True, "grid.alpha": 0.3,
                                "axes.spines.top": False, "axes.spines.right": False}):
        yield


def to_svg(fig: Any) -> str:
    """The figure as an <svg> element (the XML prolog cut off, to be inlined in HTML)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue().decode()
    return text[text.index("<svg"):]


def time_unit(seconds: float) -> tuple[str, float]:
    """("s" | "min" | "h", divisor) for an axis that runs to `seconds`."""
    if seconds < 180:
        return "s", 1.0
    if seconds < 3 * 3600:
        return "min", 60.0
    return "h", 3600.0


def _clip(text: str, width: int = 34) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def task_curves(tasks: Sequence[TaskCurve], by: str) -> str:
    """Best GFLOP/s of each task against its trials (`by="trials"`) or tuning time (`by="time"`): one panel per
    task (the first MAX_PANELS)."""
    shown = [t for t in tasks if t.costs][:MAX_PANELS]
    if not shown:
        raise ReportError("no task has a measurement to draw")
    cols = 1 if len(shown) == 1 else min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    unit, scale = time_unit(max(t.times[-1] for t in shown))
    with _style():
        fig = _figure(7.0 if cols == 1 else 2.9 * cols, 3.0 if cols == 1 else 2.1 * rows + 0.3)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax, task in zip(axes.flat, shown):
            xs = list(range(1, task.trials + 1)) if by == "trials" else [t / scale for t in task.times]
            if task.flops:
                ax.step(xs, task.gflops, where="post", color=COLORS[0], linewidth=1.4)
                ax.set_title(f"{_clip(task.desc)}\nbest {task.best_gflops:.3g} GFLOP/s", loc="left")
            else:  # no arithmetic (a transpose): its time is the measure
                ax.step(xs, [c * 1e3 if math.isfinite(c) else math.nan for c in task.costs], where="post",
                        color=COLORS[2], linewidth=1.4)
                best = f"{task.best_s * 1e3:.3g} ms" if math.isfinite(task.best_s) else "none"
                ax.set_title(f"{_clip(task.desc)}\nbest {best} (no FLOPs: time in ms)", loc="left")
            ax.set_ylim(bottom=0)
            ax.set_xlim(left=0)
        for ax in axes.flat[len(shown):]:
            ax.set_visible(False)
        for i, (ax, task) in enumerate(zip(axes.flat, shown)):
            if not task.flops:
                ax.set_ylabel("best ms")
            elif i % cols == 0:
                ax.set_ylabel("best GFLOP/s")
        for ax in axes[-1, :]:
            ax.set_xlabel("trials" if by == "trials" else f"tuning time ({unit})")
        return to_svg(fig)


def model_latency(models: Sequence[ModelCurve]) -> str:
    """Each model's estimated end-to-end latency against tuning time and against trials; a partial estimate
    (some task without a program yet, left out of the sum) is drawn dashed."""
    drawn = [m for m in models if m.times]
    if not drawn:
        raise ReportError("no model has an estimate to draw")
    unit, scale = time_unit(max(m.times[-1] for m in drawn))
    with _style():
        fig = _figure(9.0, 3.4)
        axes = fig.subplots(1, 2, squeeze=False)[0]
        for ax, xs_of, label in ((axes[0], lambda m: [t / scale for t in m.times], f"tuning time ({unit})"),
                                 (axes[1], lambda m: list(m.trials), "trials (all its tasks)")):
            for color, m in zip(COLORS * 4, drawn):
                xs, ys = xs_of(m), list(m.latency_ms)
                split = next((i for i, c in enumerate(m.complete) if c), len(ys))
                if split:
                    partial = xs[: split + 1], ys[: split + 1]
                    ax.step(*partial, where="post", color=color, linestyle="--", alpha=0.6, linewidth=1.2,
                            label=f"{m.name}: partial (tasks without a program left out)")
                if split < len(ys):
                    ax.step(xs[split:], ys[split:], where="post", color=color, linewidth=1.6,
                            label=f"{m.name}: all {len(m.weights)} tasks")
            ax.set_xlabel(label)
            ax.set_ylabel("estimated latency (ms)")
            ax.set_ylim(bottom=0)
            ax.set_xlim(left=0)
        axes[0].legend(loc="upper right", fontsize=8)
        return to_svg(fig)


def trials_per_task(tasks: Sequence[TaskCurve]) -> str:
    """Trials per task, the failed measurements marked, with the rounds it was given."""
    shown = list(tasks)[:MAX_BARS]
    with _style():
        fig = _figure(8.0, 0.28 * len(shown) + 1.0)
        ax = fig.subplots()
        ys = list(range(len(shown)))[::-1]
        failed = [min(sum(t.errors.values()), t.trials) for t in shown]
        ax.barh(ys, [t.trials - f for t, f in zip(shown, failed)], color=COLORS[0], label="succeeded")
        ax.barh(ys, failed, left=[t.trials - f for t, f in zip(shown, failed)], color=COLORS[1], label="failed")
        for y, t in zip(ys, shown):
            ax.text(t.trials, y, f" {t.trials}" + (f" ({t.rounds} rounds)" if t.rounds else ""), va="center",
                    fontsize=8)
        ax.set_yticks(ys, [_clip(t.desc, 40) for t in shown])
        ax.set_xlabel("trials (programs measured)")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower right", fontsize=8)
        ax.set_xlim(right=max(t.trials for t in shown) * 1.25 + 1)
        return to_svg(fig)


def error_kinds(errors: dict[str, int]) -> str:
    """Failed measurements by kind."""
    kinds = sorted(errors, key=errors.__getitem__)
    with _style():
        fig = _figure(6.0, 0.35 * len(kinds) + 1.0)
        ax = fig.subplots()
        ax.barh(kinds, [errors[k] for k in kinds], color=COLORS[1])
        for y, k in enumerate(kinds):
            ax.text(errors[k], y, f" {errors[k]}", va="center", fontsize=8)
        ax.set_xlabel("failed measurements")
        ax.grid(axis="y", visible=False)
        ax.set_xlim(right=max(errors.values()) * 1.2 + 1)
        return to_svg(fig)


def profile_bars(profile: Profile) -> str:
    """The slowest kernels inside the model (share of its time, GFLOP/s) next to ONNX Runtime's slowest nodes."""
    kernels = sorted(profile.kernels, key=lambda k: -k.ms)[:TOP_KERNELS][::-1]
    nodes = sorted(profile.nodes or (), key=lambda n: -n.ms)[:TOP_KERNELS][::-1]
    rows = max(len(kernels), len(nodes), 1)
    with _style():
        from matplotlib.ticker import MaxNLocator

        fig = _figure(10.0, 0.3 * rows + 1.2)
        axes = fig.subplots(1, 2 if nodes else 1, squeeze=False)[0]
        ax = axes[0]
        ax.barh(range(len(kernels)), [k.ms for k in kernels], color=COLORS[0])
        ax.set_yticks(range(len(kernels)), [_clip(k.name, 30) for k in kernels])
        for y, k in enumerate(kernels):
            speed = f", {k.gflops:.3g} GFLOP/s" if k.gflops else ""
            ax.text(k.ms, y, f" {100 * k.share:.1f}%{speed}", va="center", fontsize=7)
        ax.set_title(f"tensorgen kernels ({profile.total_ms:.3f} ms in all)", loc="left")
        ax.set_xlabel("ms per run")
        ax.set_xlim(right=max((k.ms for k in kernels), default=1.0) * 1.6)
        if nodes:
            ax = axes[1]
            ax.barh(range(len(nodes)), [n.ms for n in nodes], color=COLORS[4])
            ax.set_yticks(range(len(nodes)), [_clip(f"{n.op} {n.name}", 30) for n in nodes])
            for y, n in enumerate(nodes):
                ax.text(n.ms, y, f" {100 * n.share:.1f}%", va="center", fontsize=7)
            ax.set_title(f"ONNX Runtime nodes ({profile.onnxruntime_ms:.3f} ms in all)", loc="left")
            ax.set_xlabel("ms per run")
            ax.set_xlim(right=max(n.ms for n in nodes) * 1.4)
        for ax in axes:
            ax.grid(axis="y", visible=False)
            ax.xaxis.set_major_locator(MaxNLocator(4))
        return to_svg(fig)
