"""Reduced-precision models written by other tools: the graph fuzzer's models and the zoo, converted to float16 by
onnxconverter-common or quantized by ONNX Runtime (quantize_static, QDQ; quantize_dynamic, integer ops), then built
with default schedules, run, and compared.

    python bench/precision_models.py --mode float16|static|dynamic [--seeds 100-140] [--zoo bert_tiny,resnet18]

Per model one line. float16: tensorgen against the float32 original run by ONNX Runtime with its weights and inputs
rounded to float16 (the same work on the same numbers), relative to the largest |output|. static / dynamic: tensorgen
against ONNX Runtime on the quantized model op by op, next to ONNX Runtime against itself with its float inputs (or,
for a model whose inputs are integers, its float weights) changed by 1e-6: a quantized model's own noise, since a
value at the edge of a grid step rounds either way. Exits 1 if a model failed in tensorgen.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checks live with the tests
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "graph"))


def _relative(ours: list[np.ndarray], ref: list[np.ndarray]) -> float:
    worst = 0.0
    for a, b in zip(ours, ref, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        finite = np.isfinite(b)
        if not finite.any():
            continue
        worst = max(worst, float(np.abs(a - b)[finite].max() / max(np.abs(b[finite]).max(), 1e-12)))
    return worst


def _nudged(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The float inputs changed by 1e-6 relative, or, where no input is float, the float weights (not the scales)."""
    rng = np.random.default_rng(1)
    floats = {k for k, v in feeds.items() if v.dtype.kind == "f"}
    if floats:
        return model, {k: (v * (1 + 1e-6 * rng.standard_normal(v.shape))).astype(v.dtype) if k in floats else v
                       for k, v in feeds.items()}
    scales = {n.input[1] for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in out.graph.initializer:
        if t.data_type == onnx.TensorProto.FLOAT and t.dims and t.name not in scales:
            a = numpy_helper.to_array(t)
            t.CopyFrom(numpy_helper.from_array((a * (1 + 1e-6 * rng.standard_normal(a.shape))).astype(a.dtype),
                                               t.name))
    return out, feeds


def one(source: str, mode: str) -> tuple[str, bool]:
    """The line for one model (a fuzz seed or a zoo name) and whether tensorgen failed on it."""
    from fuzz_graph_check import feeds as random_feeds
    from fuzz_graph_check import onnxruntime_outputs, tensorgen_outputs
    from fuzz_graphs import random_model
    from onnxconverter_common import float16
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from test_half import float32_reference
    from test_qdq import Calibration

    from tensorgen.graph.zoo import build_model as zoo_model

    model = random_model(np.random.default_rng(int(source))) if source.isdigit() else zoo_model(source)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        try:  # the converter's or quantizer's own failures are no fault of tensorgen's
            if mode == "float16":
                converted = float16.convert_float_to_float16(model)
                feeds = random_feeds(converted, 0)
                reference = float32_reference(model, converted, feeds)
            else:
                onnx.save(model, d / "f.onnx")

                class ModelCalibration(Calibration):
                    def get_next(self):
                        self.left -= 1
                        return random_feeds(model, 10 + self.left) if self.left >= 0 else None

                if mode == "static":
                    quantize_static(str(d / "f.onnx"), str(d / "q.onnx"), ModelCalibration("", ()),
                                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
                                    weight_type=QuantType.QInt8, per_channel=True)
                else:
                    quantize_dynamic(str(d / "f.onnx"), str(d / "q.onnx"), weight_type=QuantType.QInt8)
                converted = onnx.load(d / "q.onnx")
                feeds = random_feeds(model, 0)
                reference = onnxruntime_outputs(converted, feeds)
        except Exception as e:  # noqa: BLE001
            return f"{source:14s} SKIP  {type(e).__name__}: {str(e).splitlines()[0][:100]}", False
        try:
            ours = tensorgen_outputs(converted, feeds, d)
        except Exception as e:  # noqa: BLE001
            (d / "error.txt").write_text(traceback.format_exc())
            return f"{source:14s} FAIL  {type(e).__name__}: {str(e).splitlines()[0][:200]}", True
        line = f"{source:14s} OK    tensorgen {_relative(ours, reference):.3g}"
        if mode != "float16":
            nudged, nudged_feeds = _nudged(converted, feeds)
            noise = _relative(onnxruntime_outputs(nudged, nudged_feeds), reference)
            line += f"   ONNX Runtime against itself nudged by 1e-6 {noise:.3g}"
        return line, False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["float16", "static", "dynamic"], default="float16")
    parser.add_argument("--seeds", default="100-140", help="graph fuzzer seeds, FIRST-LAST ('' for none)")
    parser.add_argument("--zoo", default="bert_tiny,resnet18,mobilenet_v2,dcgan", help="zoo models, comma separated")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    ort.set_default_logger_severity(3)
    first, _, last = args.seeds.partition("-")
    seeds = [str(s) for s in range(int(first), int(last or first) + 1)] if args.seeds else []
    failed = False
    for source in [*seeds, *filter(None, args.zoo.split(","))]:
        line, bad = one(source, args.mode)
        print(line, flush=True)
        failed |= bad
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
