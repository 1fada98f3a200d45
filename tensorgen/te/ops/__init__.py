"""The operator library: functions that take input Tensors and return the output Tensor.

Everything has static integer shapes, float32 unless the inputs say otherwise, and raises
`TensorExprError` on bad arguments. Stage names are identifiers (they become C names); tags
(`elemwise`, `broadcast`, `injective`, `reduce`, `pool`, `conv1d`, `conv2d`, `conv3d`,
`conv2d_transpose`, `conv2d_capsule`, `matmul`, `batch_matmul`, `dense`) say what kind a stage is.
Layout-taking ops default to channels-last (NWC / NHWC / NDHWC), like Ansor's CPU benchmarks.
"""

from tensorgen.te.ops.common import (
    BATCH_MATMUL,
    BROADCAST,
    CONV1D,
    CONV2D,
    CONV2D_CAPSULE,
    CONV2D_TRANSPOSE,
    CONV3D,
    DENSE,
    ELEMWISE,
    INJECTIVE,
    MATMUL,
    POOL,
    REDUCE,
)
from tensorgen.te.ops.conv import (
    KERNEL_LAYOUTS,
    conv1d,
    conv2d,
    conv2d_capsule,
    conv2d_transpose,
    conv2d_transpose_col2im,
    conv3d,
    depthwise_conv2d,
)
from tensorgen.te.ops.linalg import batch_matmul, dense, matmul, matrix_norm
from tensorgen.te.ops.math import (
    add,
    broadcast_shape,
    clip,
    div,
    elementwise,
    gelu,
    maximum,
    minimum,
    mul,
    reduce_max,
    reduce_mean,
    reduce_min,
    reduce_prod,
    reduce_sum,
    relu,
    relu6,
    sigmoid,
    sub,
    tanh,
)
from tensorgen.te.ops.nn import avg_pool2d, batch_norm, global_avg_pool2d, layer_norm, max_pool2d, softmax
from tensorgen.te.ops.suite import (
    SUITE,
    conv_layer,
    make_c1d,
    make_c2d,
    make_c3d,
    make_cap,
    make_conv_layer,
    make_dep,
    make_dil,
    make_gmm,
    make_grp,
    make_nrm,
    make_t2d,
    make_tbs,
    tbs,
)
from tensorgen.te.ops.transform import concatenate, pad, reshape, transpose

__all__ = [
    "BATCH_MATMUL", "BROADCAST", "CONV1D", "CONV2D", "CONV2D_CAPSULE", "CONV2D_TRANSPOSE", "CONV3D",
    "DENSE", "ELEMWISE", "INJECTIVE", "KERNEL_LAYOUTS", "MATMUL", "POOL", "REDUCE", "SUITE", "add",
    "avg_pool2d", "batch_matmul", "batch_norm", "broadcast_shape", "clip", "concatenate", "conv1d",
    "conv2d", "conv2d_capsule", "conv2d_transpose", "conv2d_transpose_col2im", "conv3d", "conv_layer", "dense",
    "depthwise_conv2d",
    "div", "elementwise", "gelu", "global_avg_pool2d", "layer_norm", "make_c1d", "make_c2d", "make_c3d",
    "make_cap", "make_conv_layer", "make_dep", "make_dil", "make_gmm", "make_grp", "make_nrm", "make_t2d",
    "make_tbs", "matmul", "matrix_norm", "max_pool2d", "maximum", "minimum", "mul", "pad", "reduce_max",
    "reduce_mean", "reduce_min", "reduce_prod", "reduce_sum", "relu", "relu6", "reshape", "sigmoid", "softmax", "sub",
    "tanh", "tbs", "transpose"
]
