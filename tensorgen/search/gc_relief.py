"""Fewer garbage collections while the search runs.

The search allocates millions of small acyclic objects (stages, steps, feature rows) and keeps large
caches alive; CPython's default gen-0 threshold (700 allocations) then triggers collections that
traverse those caches again and again: a third of the evolutionary search's time went to the
collector. Raising the thresholds for the duration (and, in the search's own worker processes, for
their lifetime) keeps cycles collected, just less often.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

SEARCH_THRESHOLDS = (100_000, 50, 100)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's thresholds inside the block; restore the caller's afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(*SEARCH_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def relax_worker_collections() -> None:
    """For a forked search worker: what it inherited is never collected (frozen), new objects rarely."""
    gc.freeze()
    gc.set_threshold(*SEARCH_THRESHOLDS)
