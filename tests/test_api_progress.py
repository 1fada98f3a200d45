"""The Python API's progress: tune() and TaskScheduler.tune show what `tensorgen tune` shows (the status line, the
live table) on stderr where it is a terminal, nothing where it is not, and as told by `progress=`."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap

from tensorgen.te.ops.suite import make_gmm
from tensorgen.tuning.scheduler import TaskScheduler
from tensorgen.tuning.tune import make_task, tune


def _task():
    inputs, outputs = make_gmm(8, 8, 8)
    return make_task([*inputs, *outputs])


def _tune_both(progress: bool | None) -> None:
    """tune() and TaskScheduler.tune of one small task, with no trials: the resume reports progress, nothing is
    measured."""
    tune(_task(), trials=0, policy="random", progress=progress)
    TaskScheduler([_task()]).tune(0, policy="random", progress=progress)


def test_quiet_where_stderr_is_not_a_terminal(capfd):
    _tune_both(None)
    assert capfd.readouterr().err == ""


def test_progress_true_shows_it_anywhere_and_false_never(capfd):
    _tune_both(True)
    err = capfd.readouterr().err
    assert "[tune " in err and "0/0 trials" in err
    assert "Estimated total latency" in err and "| ID" in err
    _tune_both(False)
    assert capfd.readouterr().err == ""


def test_shown_on_a_terminal():
    """A process whose stderr is a terminal (a pseudo-terminal here) shows both by default."""
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_api_progress import _tune_both
        _tune_both(None)
        """)
    leader, follower = pty.openpty()
    done = subprocess.run([sys.executable, "-c", code], stderr=follower, stdout=subprocess.PIPE)
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other end is closed and all was read
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    assert done.returncode == 0, err.decode(errors="replace")
    text = err.decode(errors="replace")
    assert "[tune " in text and "Estimated total latency" in text
