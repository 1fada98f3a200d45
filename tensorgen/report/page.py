"""The report as one self-contained HTML page: inline SVG figures, tables, inline CSS and a few lines of script that
measure the drawn figures (their size and drawn paths, as `data-` attributes a test reads from the DOM). No
request leaves the page: it opens from a file, offline."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

from tensorgen.report import figures
from tensorgen.report.data import ModelCurve, ReportData
from tensorgen.report.profile import DISAGREE, Profile
from tensorgen.target import GPU_FIELDS
from tensorgen.tuning.tally import RETIMES
from tensorgen.version import __version__

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 24px auto;
       max-width: 1100px; padding: 0 16px; }
h1 { font-size: 24px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 16px 0; }
.card { background: #f6f8fa; border: 1px solid #e1e4e8; border-radius: 6px; padding: 8px 14px; min-width: 120px; }
.card b { display: block; font-size: 20px; } .card span { color: #666; font-size: 12px; }
pre { background: #f6f8fa; border: 1px solid #e1e4e8; padding: 8px 12px; overflow-x: auto; white-space: pre-wrap; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border-bottom: 1px solid #eee; padding: 3px 10px; text-align: right; vertical-align: top; }
th { background: #f6f8fa; } td.l, th.l { text-align: left; }
figure.plot { margin: 12px 0; } figure.plot svg { max-width: 100%; height: auto; }
figcaption { color: #555; font-size: 13px; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 12px; margin: 8px 0; }
.side { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
"""

# measures every figure once it is laid out; the page reads the same without it
SCRIPT = """
for (const fig of document.querySelectorAll("figure.plot")) {
  const svg = fig.querySelector("svg");
  const box = svg ? svg.getBoundingClientRect() : { width: 0, height: 0 };
  let drawn = 0;
  for (const path of svg ? svg.querySelectorAll("path") : []) {
    try { const b = path.getBBox(); if (b.width > 0 || b.height > 0) drawn++; } catch (e) {}
  }
  fig.dataset.width = Math.round(box.width);
  fig.dataset.height = Math.round(box.height);
  fig.dataset.paths = drawn;
}
document.body.dataset.measured = "yes";
"""


@dataclass(frozen=True)
class Page:
    """What goes on the page besides the data: the command that made it and the optional profile."""

    command: str
    profile: Profile | None = None
    profile_note: str = ""  # why there is no profile


def _fmt_s(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _when(unix: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix))


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{x:g}"


def _table(head: Sequence[str], rows: Sequence[Sequence[object]], left: Sequence[int] = (1,)) -> str:
    """An HTML table; the columns in `left` are left-aligned (text), the others right-aligned (numbers)."""
    def cells(tag: str, values: Sequence[object]) -> str:
        return "".join(f"<{tag}{' class=l' if i in left else ''}>{escape(str(v))}</{tag}>"
                       for i, v in enumerate(values))

    body = "".join(f"<tr>{cells('td', r)}</tr>" for r in rows)
    return f"<table><tr>{cells('th', head)}</tr>{body}</table>"


def _figure(ident: str, caption: str, draw: Callable[[], str]) -> str:
    return f'<figure class="plot" id="fig-{ident}">{draw()}<figcaption>{escape(caption)}</figcaption></figure>'


def _notes(notes: Sequence[str]) -> str:
    return "".join(f'<p class="note">{escape(n)}</p>' for n in notes)


def _cards(data: ReportData) -> str:
    cards = [(str(len(data.tasks)), "tasks"), (str(sum(t.trials for t in data.tasks)), "trials"),
             (_fmt_s(data.tuning_s), "tuning time"), (str(len(data.runs)) if data.has_history else "-", "runs"),
             (str(sum(data.errors.values())), "failed measurements")]
    for m in data.models:
        cards.append((f"{m.final_ms:.3f} ms" if m.final_ms is not None else "-", f"{m.name}: estimated latency"))
    return '<div class="cards">' + "".join(f"<div class=card><b>{escape(v)}</b><span>{escape(k)}</span></div>"
                                           for v, k in cards) + "</div>"


def _measurements_note(data: ReportData) -> str:
    """Why the page counts more measurements than trials (a trial is a program measured for the first time)."""
    trials = sum(t.trials for t in data.tasks)
    again = data.measurements - trials
    if again <= 0:
        return ""
    return (f"<p>{data.measurements} measurements of {trials} trials: {again} measured a program again. A program "
            f"that becomes its task's best is timed {RETIMES} more times (its cost is the median, so one lucky or "
            "disturbed timing does not decide), and one whose measurement failed in a way that may be the "
            "machine's (a timeout, a busy machine) is measured again.</p>")


def _models_section(models: Sequence[ModelCurve]) -> str:
    if not models:
        return ""
    parts = ["<h2>Estimated end-to-end latency</h2>",
             "<p>The task scheduler's estimate: the sum over the model's tasks of occurrences &times; best latency, "
             "after every measurement that changed it. Until every task has a program the sum leaves the others "
             "out (dashed: a partial estimate, lower than the model will run).</p>"]
    if any(m.times for m in models):
        parts.append(_figure("model-latency", "Estimated latency against tuning time (left) and trials (right)",
                             lambda: figures.model_latency(models)))
    rows = [(m.name, len(m.weights), f"{m.final_ms:.4f}" if m.final_ms is not None else "-",
             len(m.untuned), m.source) for m in models]
    parts.append(_table(("model", "tasks", "estimated latency (ms)", "tasks without a program", "weights from"),
                        rows, left=(0, 4)))
    return "".join(parts)


def _task_rows(data: ReportData) -> list[tuple[object, ...]]:
    weights: dict[str, float] = {}
    for m in data.models:
        for key, w in m.weights.items():
            weights[key] = weights.get(key, 0) + w
    peak = data.hw.get("peak_gflops")
    rows = []
    for i, t in enumerate(data.tasks):
        best = f"{t.best_s * 1e3:.4f}" if math.isfinite(t.best_s) else "-"
        share = f"{100 * t.best_gflops / peak:.1f}" if peak and t.best_gflops else "-"
        errors = _error_text(t.errors)
        rows.append((i, t.desc, _si(t.flops), f"{weights[t.workload_key]:g}" if t.workload_key in weights else "-",
                     t.trials, t.rounds or "-", best, f"{t.best_gflops:.3g}" if t.best_gflops else "-", share, errors))
    return rows


def _tasks_section(data: ReportData) -> str:
    tasks = data.tasks
    parts = ["<h2>Tasks</h2>",
             _table(("#", "task", "FLOPs", "weight", "trials", "rounds", "best (ms)", "GFLOP/s", "% of peak",
                     "errors"), _task_rows(data), left=(1, 9))]
    if not data.hw.get("peak_gflops"):
        parts.append(_notes([f"% of peak: no peak FLOP/s is known for this machine ({_machine(data)}): the tuning "
                             "runs recorded none, and `tensorgen hw --measure` has not measured one like it. Run "
                             "`tensorgen hw --measure` once (about a second, on a quiet machine), then make this "
                             "report again."]))
    busy = [t for t in tasks if t.errors.get("busy")]
    if busy:
        parts.append(_notes([f"{sum(t.errors['busy'] for t in busy)} measurements of {len(busy)} task(s) were timed "
                             "while the machine was busy (their 'busy' errors: a calibration kernel timed with them "
                             "ran slower than quiet) and count as no program's time; `tensorgen tune` with this "
                             "database measures them again, on a quiet machine."]))
    drawable = [t for t in tasks if t.costs]
    if drawable:
        more = (f" (the first {figures.MAX_PANELS} of {len(drawable)}; all are in the table)"
                if len(drawable) > figures.MAX_PANELS else "")
        parts.append(_figure("task-trials", f"Best GFLOP/s of each task against its trials{more} (a task without "
                                            "FLOPs: its best time, in green). A curve can step down: a new best is "
                                            f"timed {RETIMES} more times and costs the median of its timings, so a "
                                            "first timing that was lucky is corrected.",
                             lambda: figures.task_curves(drawable, "trials")))
        parts.append(_figure("task-time", f"Best GFLOP/s of each task against tuning time{more}",
                             lambda: figures.task_curves(drawable, "time")))
        parts.append(_figure("trials-per-task", "Trials per task (failed measurements in red), with its rounds",
                             lambda: figures.trials_per_task(tasks)))
    return "".join(parts)


def _profile_section(page: Page) -> str:
    parts = ["<h2>Where the model's time goes</h2>"]
    p = page.profile
    if p is None:
        parts.append(_notes([page.profile_note]) if page.profile_note else "")
        return "".join(parts)
    parts.append(f"<p>{escape(p.model)} built with the best records, {p.runs} runs on {p.threads} threads: each "
                 "kernel's median time inside whole runs" + (", next to ONNX Runtime's per-node profile of the same "
                                                            "model and inputs." if p.nodes else ".") + "</p>")
    parts.append(_figure("profile", "The slowest kernels and ONNX Runtime nodes (share of each engine's time)",
                         lambda: figures.profile_bars(p)))
    kernels = sorted(p.kernels, key=lambda k: -k.ms)
    krows = [(k.name, f"{k.ms:.4f}", f"{100 * k.share:.1f}", f"{k.gflops:.3g}" if k.gflops else "-",
              f"{100 * k.peak_share:.1f}" if k.peak_share is not None else "-", k.schedule,
              f"{k.tuned_ms:.4f}" + (" (!)" if k.flagged else "") if k.tuned_ms is not None else "-") for k in kernels]
    flagged = [k for k in kernels if k.flagged]
    if flagged:
        parts.append(_notes([f"(!) {len(flagged)} kernel(s) ran more than {DISAGREE:g}x faster or slower in the model "
                             f"than their tuned time alone ({', '.join(k.name for k in flagged[:5])}"
                             f"{', ...' if len(flagged) > 5 else ''}): a time measured while the machine was busy, or "
                             "a kernel that runs in the model unlike alone. Tune again on a quiet machine (the tuned "
                             "time), and make this report there (the time in the model)."]))
    side = ["<div>" + _table(("kernel", "ms", "% of time", "GFLOP/s", "% of peak", "schedule", "alone (ms)"), krows,
                             left=(0, 5)) + "</div>"]
    if p.nodes:
        nrows = [(n.op, n.name, f"{n.ms:.4f}", f"{100 * n.share:.1f}") for n in sorted(p.nodes, key=lambda n: -n.ms)]
        side.append("<div>" + _table(("op", "ONNX Runtime node", "ms", "% of time"), nrows, left=(0, 1)) + "</div>")
    parts.append('<div class="side">' + "".join(side) + "</div>")
    return "".join(parts)


def _error_text(errors: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in errors.items()) or "-"


def _errors_section(data: ReportData) -> str:
    if not data.errors:
        return "<h2>Errors</h2><p>No measurement failed.</p>"
    rows = [(t.desc, _error_text(t.errors)) for t in data.tasks if t.errors]
    drawn = _figure("errors", "Failed measurements by kind", lambda: figures.error_kinds(data.errors))
    return "<h2>Errors</h2>" + drawn + _table(("task", "failed measurements"), rows, left=(0, 1))


def _runs_section(data: ReportData) -> str:
    if not data.runs:
        return "<h2>Tuning runs</h2><p>This database keeps no runs.</p>"
    rows = []
    for r in data.runs:
        took = _fmt_s(r.finished - r.started) if r.finished is not None else "not closed (killed, or running)"
        done = r.outcome.get("trials", "-")
        rows.append((r.id, _when(r.started), took, r.info.get("kind", "-"), r.info.get("name", "-"),
                     f"{done} of {r.info.get('trials', '-')}", r.outcome.get("stopped", "-"),
                     r.info.get("command", "-")))
    return "<h2>Tuning runs</h2>" + _table(("run", "started", "took", "kind", "name", "trials", "stopped", "command"),
                                           rows, left=(1, 3, 4, 6, 7))


def _machine(data: ReportData) -> str:
    extra = data.hw.get("extra")
    return str(extra.get("fingerprint", "unknown")) if isinstance(extra, dict) else "unknown"


def _hardware_section(data: ReportData) -> str:
    gpu = bool(data.hw.get("sm_count"))  # a CPU's GPU fields are defaults that describe nothing
    unmeasured = "not measured (tensorgen hw --measure)"
    rows = [(k, unmeasured if v is None else f"{v:.1f}" if isinstance(v, float) else v)
            for k, v in sorted(data.hw.items()) if k != "extra" and (gpu or k not in GPU_FIELDS)]
    extra = data.hw.get("extra")
    if isinstance(extra, dict):
        rows += [(f"extra.{k}", v) for k, v in sorted(extra.items())]
    others = "".join(f"<p>Not in this report: target {escape(t)} ({n} records; pass --target).</p>"
                     for t, n in data.other_targets.items())
    return (f"<h2>Target and hardware</h2><p>target <code>{escape(data.target)}</code></p>{others}"
            + _table(("parameter", "value"), rows, left=(0, 1)))


def render(data: ReportData, page: Page) -> str:
    """The whole page."""
    title = ", ".join(m.name for m in data.models) or (data.tasks[0].desc if len(data.tasks) == 1 else data.db_path)
    body = [
        f"<h1>Tuning report: {escape(title)}</h1>",
        f'<p class="sub">{escape(data.db_path)} &middot; {data.measurements} measurements &middot; made '
        f"{_when(time.time())} by tensorgen {escape(__version__)}</p>",
        _measurements_note(data),
        _cards(data),
        f"<p>Made with:</p><pre>{escape(page.command)}</pre>",
        _notes(data.notes),
        _models_section(data.models),
        _tasks_section(data),
        _profile_section(page),
        _errors_section(data),
        _runs_section(data),
        _hardware_section(data),
    ]
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>tensorgen report: {escape(title)}</title><style>{CSS}</style></head>\n"
            f"<body>{''.join(body)}<script>{SCRIPT}</script></body></html>\n")

