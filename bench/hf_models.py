"""Models written outside this project: small HuggingFace `transformers` models with random weights (built from a
config, nothing downloaded), exported to ONNX by torch.onnx (TorchScript or dynamo exporter) or read by
tensorgen.from_torch, then tuned, built, run and compared with ONNX Runtime (ONNX) or eager PyTorch (torch).

    pip install transformers onnxscript         # not in .[dev]: this is a hunt for faults, not a test
    python bench/hf_models.py [--mode legacy|dynamo|torch] [--trials 0] [--models BertModel,GPT2Model]

Each model runs in its own process (a crash or a hang is that model's failure). Per model one line: OK, SKIP (the
model or its exporter failed before tensorgen saw it) or FAIL[stage] with the error; the traceback lands in
OUT/<model>-<mode>/error.txt. Exits 1 if anything failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the checks live with the tests

MODEL_TIMEOUT_S = 900
TEXT = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, n_embd=32, n_layer=2, n_head=4, d_model=32, num_layers=2, num_heads=4,
            d_ff=64, d_kv=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
            encoder_ffn_dim=64, decoder_ffn_dim=64, num_key_value_heads=2, ffn_dim=64, n_positions=64, head_dim=8,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0, type_vocab_size=2,
            embedding_size=32, word_embed_proj_dim=32, rotary_dim=8, partial_rotary_factor=0.5)
IMAGE = dict(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64, hidden_sizes=[16, 32], depths=[1, 1], embed_dim=16, num_heads=[2, 4],
             window_size=2, embedding_size=16, num_labels=10)
AUDIO = dict(TEXT, conv_dim=[16, 16], conv_stride=[5, 2], conv_kernel=[10, 3], num_conv_pos_embeddings=16,
             num_conv_pos_embedding_groups=4, num_mel_bins=16, max_source_positions=64, max_target_positions=64,
             input_feat_per_channel=16, max_length=64, num_feat_extract_layers=2)
SEGFORMER = dict(hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2, sr_ratios=[2, 1],
                 num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])
# model class -> (config overrides, inputs: name -> shape, or "ids" for token ids of shape (1, 8))
MODELS: dict[str, tuple[dict, dict]] = {
    **{name: (TEXT, {"input_ids": "ids"}) for name in [
        "BertModel", "GPT2Model", "LlamaModel", "MistralModel", "Qwen2Model", "Qwen3Model", "DistilBertModel",
        "RobertaModel", "AlbertModel", "ElectraModel", "OPTModel", "PhiModel", "GemmaModel", "Gemma2Model",
        "GPTNeoXModel", "BloomModel", "MPNetModel", "DebertaModel", "DebertaV2Model", "FNetModel", "T5EncoderModel",
        "XLMRobertaModel", "GPTJModel", "CodeGenModel", "StableLmModel", "MobileBertModel", "SqueezeBertModel",
        "ConvBertModel", "RoFormerModel", "XGLMModel", "BioGptModel", "Starcoder2Model", "OlmoModel", "CTRLModel",
        "IBertModel", "NystromformerModel", "YosoModel", "MegatronBertModel", "ErnieModel", "SplinterModel",
        "LayoutLMModel"]},
    **{name: (TEXT, {"input_ids": "ids", "decoder_input_ids": (1, 5)}) for name in ["BartModel", "MarianMTModel"]},
    **{name: (IMAGE, {"pixel_values": (1, 3, 32, 32)}) for name in [
        "ViTModel", "ConvNextModel", "ConvNextV2Model", "ResNetModel", "DeiTModel", "MobileNetV1Model",
        "MobileNetV2Model", "Dinov2Model", "BeitModel", "EfficientNetModel", "DPTModel", "FocalNetModel", "ViTMSNModel",
        "CLIPVisionModel", "SiglipVisionModel", "Data2VecVisionModel", "UperNetForSemanticSegmentation"]},
    **{name: (dict(IMAGE, **SEGFORMER), {"pixel_values": (1, 3, 32, 32)}) for name in ["SegformerModel", "GLPNModel"]},
    **{name: ({}, {"pixel_values": (1, 3, 64, 64)}) for name in [
        "Swinv2Model", "MaskFormerSwinModel", "PoolFormerModel", "RegNetModel", "BitModel", "CvtModel"]},
    **{name: ({"image_size": 64}, {"pixel_values": (1, 3, 64, 64)}) for name in [
        "MobileViTModel", "LevitModel", "PvtModel"]},
    "YolosModel": ({"image_size": [64, 64]}, {"pixel_values": (1, 3, 64, 64)}),
    "TimesformerModel": (IMAGE, {"pixel_values": (1, 8, 3, 32, 32)}),
    **{name: (AUDIO, {"input_values": (1, 800)}) for name in [
        "Wav2Vec2Model", "HubertModel", "WavLMModel", "UniSpeechModel", "SEWModel", "Data2VecAudioModel"]},
    "WhisperModel": (AUDIO, {"input_features": (1, 16, 128), "decoder_input_ids": (1, 3)}),
    "Speech2TextModel": (AUDIO, {"input_features": (1, 40, 16), "decoder_input_ids": (1, 3)}),
    "ASTModel": (AUDIO, {"input_values": (1, 64, 16)}),
}


def make(name: str):
    """The model with random weights (eager attention) wrapped to take its inputs by position and return its
    tensor outputs, and example inputs."""
    import torch
    import transformers

    overrides, shapes = MODELS[name]
    cls = getattr(transformers, name)
    config = cls.config_class(**overrides)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = cls(config).eval()

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *args):
            out = self.model(**dict(zip(shapes, args)), return_dict=True)
            return tuple(v for v in out.values() if isinstance(v, torch.Tensor))

    inputs = tuple(torch.tensor([[3, 17, 42, 8, 11, 5, 60, 9]]) if s == "ids" else
                   torch.tensor([list(range(s[1]))]) if k.endswith("_ids") else torch.randn(*s)
                   for k, s in shapes.items())
    return Positional().eval(), inputs


def check(name: str, mode: str, trials: int, out: Path) -> str:
    """One model: 'OK', 'SKIP ...' or 'FAIL[stage] ...'."""
    import onnx
    import torch
    from fuzz_graph_check import check_model, validate

    out.mkdir(parents=True, exist_ok=True)
    try:
        model, inputs = make(name)
        if mode == "torch":
            with torch.no_grad():
                reference = [t.numpy() for t in model(*inputs)]
        else:
            with torch.no_grad():
                torch.onnx.export(model, inputs, str(out / "model.onnx"), dynamo=mode == "dynamo",
                                  opset_version=18 if mode == "dynamo" else 17)
            proto = onnx.load(out / "model.onnx")
            reference = validate(proto)
    except Exception as err:  # noqa: BLE001 - the model or its exporter, before tensorgen
        return f"SKIP {type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    if mode != "torch":
        failure = check_model(proto, 0, "ansor", trials, out / "work", reference)
        if failure is None:
            return "OK"
        (out / "error.txt").write_text(failure.error)
        return f"FAIL[{failure.stage}] {failure.headline()[:300]}"
    return _check_torch(model, inputs, reference, trials, out)


def _check_torch(model, inputs, reference, trials: int, out: Path) -> str:
    from fuzz_graph_check import compare

    import tensorgen
    from tensorgen.graph.backend.build import build_model
    from tensorgen.graph.backend.tasks import extract_tasks
    from tensorgen.records.database import SQLiteDatabase
    from tensorgen.runtime.model import CompiledModel
    from tensorgen.tuning.scheduler import TaskScheduler

    stage = "import"
    try:
        graph = tensorgen.from_torch(model, inputs)
        db = SQLiteDatabase(out / "tuning.db")
        if trials:
            stage = "tune"
            tasks = extract_tasks(graph)
            TaskScheduler.from_models({"model": tasks}, seed=0).tune(trials * len(tasks), db=db)
        stage = "build"
        built = build_model(graph, out / "model", db=db)
        db.close()
        stage = "run"
        ours = CompiledModel(built, threads=2).run([t.numpy() for t in inputs])
    except Exception:  # noqa: BLE001 - any failure is the finding
        (out / "error.txt").write_text(traceback.format_exc())
        return f"FAIL[{stage}] {traceback.format_exc().strip().splitlines()[-1][:300]}"
    why = compare(ours, reference)
    return "OK" if why is None else f"FAIL[mismatch] {why[:300]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["legacy", "dynamo", "torch"], default="legacy",
                        help="torch.onnx's TorchScript exporter, its dynamo exporter, or tensorgen.from_torch")
    parser.add_argument("--trials", type=int, default=0, help="tuning trials per task (0: default schedules)")
    parser.add_argument("--models", help=f"comma-separated (default: all {len(MODELS)})")
    parser.add_argument("--out", type=Path, default=Path("hf_out"))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one model in this process
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.one:
        print(check(args.one, args.mode, args.trials, args.out / f"{args.one}-{args.mode}"), flush=True)
        return 0
    names = args.models.split(",") if args.models else list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)}; known: {', '.join(MODELS)}")
    failed = 0
    for name in names:
        t0 = time.monotonic()
        cmd = [sys.executable, __file__, "--one", name, "--mode", args.mode, "--trials", str(args.trials),
               "--out", str(args.out)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=MODEL_TIMEOUT_S)
            lines = proc.stdout.strip().splitlines()
            line = lines[-1] if proc.returncode == 0 and lines else \
                f"FAIL[crash] exit code {proc.returncode}: {proc.stderr.strip()[-300:]}"
        except subprocess.TimeoutExpired:
            line = f"FAIL[hang] over {MODEL_TIMEOUT_S} s"
        failed += line.startswith("FAIL")
        print(f"{name:32s} {args.mode:6s} {line} ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"\n{len(names)} models, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
