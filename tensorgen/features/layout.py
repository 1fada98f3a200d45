"""The 164-column layout of Ansor's per-statement feature vector (paper Appendix B, TVM's feature.cc order).

Kept apart from the extraction code so a cost model can name columns without importing the analysis.
"""

from __future__ import annotations

import numpy as np

OP_CATEGORIES = ("mad", "addsub", "mul", "divmod", "cmp", "maxmin", "math_func")
ANNOT_POS = ("none", "inner_spatial", "middle_spatial", "outer_spatial",
             "inner_reduce", "middle_reduce", "outer_reduce", "mixed")
GPU_AXES = ("blockIdx_x_len", "blockIdx_y_len", "blockIdx_z_len",
            "threadIdx_x_len", "threadIdx_y_len", "threadIdx_z_len", "vthread_len")
CURVE_POINTS = 10
N_BUFFERS = 5
ACC_TYPES = ("read", "write", "readwrite")
REUSE_TYPES = ("loop_multiple_read", "serial_multiple_read", "no_reuse")
BUFFER_FIELDS = (
    *(f"acc_type.{t}" for t in ACC_TYPES),
    "bytes", "unique_bytes", "lines", "unique_lines",
    *(f"reuse_type.{t}" for t in REUSE_TYPES),
    "reuse_dis_iter", "reuse_dis_bytes", "reuse_ct",
    "bytes_d_reuse_ct", "unique_bytes_d_reuse_ct", "lines_d_reuse_ct", "unique_lines_d_reuse_ct",
    "stride",
)
ALLOC_FIELDS = ("alloc_size", "alloc_prod", "alloc_outer_prod", "alloc_inner_prod")
OTHER_FIELDS = ("outer_prod", "num_loops", "auto_unroll_max_step")


def _annotation_names(kind: str) -> list[str]:
    return [f"{kind}_num", f"{kind}_prod", f"{kind}_len", *(f"{kind}_type.{p}" for p in ANNOT_POS)]


NAMES: list[str] = [
    *(f"float_{c}" for c in OP_CATEGORIES),
    *(f"int_{c}" for c in OP_CATEGORIES),
    "bool_op", "select_op", "cast_op",
    *_annotation_names("vec"), *_annotation_names("unroll"), *_annotation_names("parallel"),
    *GPU_AXES,
    *(f"arith_intensity_curve_{i}" for i in range(CURVE_POINTS)),
    *(f"B{b}.{f}" for b in range(N_BUFFERS) for f in BUFFER_FIELDS),
    *ALLOC_FIELDS,
    *OTHER_FIELDS,
]
N_FEATURES = len(NAMES)
INDEX = {n: i for i, n in enumerate(NAMES)}
assert N_FEATURES == 164, N_FEATURES

# one-hot columns stay 0/1; every other column is a magnitude and is stored as log2(1 + x)
ONE_HOT = np.array([("_type." in n) for n in NAMES])
OFF_OPS = 0
OFF_VEC, OFF_UNROLL, OFF_PARALLEL = INDEX["vec_num"], INDEX["unroll_num"], INDEX["parallel_num"]
OFF_GPU = INDEX[GPU_AXES[0]]
OFF_CURVE = INDEX["arith_intensity_curve_0"]
OFF_BUF = INDEX["B0.acc_type.read"]
BUF_WIDTH = len(BUFFER_FIELDS)
OFF_ALLOC = INDEX["alloc_size"]
OFF_OTHER = INDEX["outer_prod"]


def log_scale(rows: np.ndarray) -> np.ndarray:
    """log2(1 + x) on the magnitude columns, in place; one-hot columns untouched."""
    mag = ~ONE_HOT
    rows[:, mag] = np.log2(1.0 + np.maximum(rows[:, mag], 0.0))
    return rows
