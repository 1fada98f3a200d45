"""The tuning report: one self-contained HTML page of what a tuning database holds (`tensorgen report`).

`data` reads the curves from the database (no drawing), `profile` builds and runs a model for its per-kernel
breakdown (optional), `figures` draws with matplotlib (imported lazily), `page` assembles the HTML and `make`
ties them together.
"""

from tensorgen.report.data import ReportData, ReportError, gather
from tensorgen.report.make import ModelRequest, write_report

__all__ = ["ModelRequest", "ReportData", "ReportError", "gather", "write_report"]
