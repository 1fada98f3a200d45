"""Import first in a benchmark script: fixes the BLAS/OpenMP thread counts of NumPy (OpenBLAS) and torch, which
are read when they are imported, to --threads (default 2) of the command line."""

import os
import sys

THREADS = "2"
for _i, _arg in enumerate(sys.argv[:-1]):
    if _arg == "--threads":
        THREADS = sys.argv[_i + 1]
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, THREADS)
