#!/usr/bin/env bash
# What a session lent an NVIDIA GPU runs first, in one call of the device tool (sized for about 8 minutes on an
# H200). The device machine has python3 with numpy, onnx, onnxruntime and CUDA PyTorch but no xgboost and no network:
# carry the xgboost-cpu wheel. Here, before the call:
#   pip download xgboost-cpu --no-deps -d .gpu_wheels && echo /.gpu_wheels/ >> .git/info/exclude
# then run (device tool): command "bash bench/gpu_session.sh", carry [".gpu_wheels"], timeout_s 590.
# 1. the CUDA tests on the device (their `gpu` cases run only where a GPU is usable);
# 2. Pruner's Best-k of the GPU static analyzer against random spaces (bench/psa_gpu_bestk.py);
# 3. GMM 1024^3 tuned for the GPU by Ansor and by Pruner, 128 trials each (best time and wall-clock side by side),
#    each best next to PyTorch's cuBLAS matmul in FP32 (bench/gpu_peer.py).
# Results under $OUT (the device tool brings back up to 8 files), else bench/results/gpu.
set -u
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps .gpu_wheels/*.whl 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$out/gpu.txt"
{
  cat "$out/gpu.txt"
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_emu.py tests/test_cuda_codegen.py \
    tests/test_gpu_tune.py tests/graph/test_model_build_cuda.py 2>&1 | tail -15
  timeout 150 python3 bench/psa_gpu_bestk.py --target "cuda -device=h200" --space 512 --sizes 64,128,256 \
    --json "$out/bestk.json" 2>&1 | tail -15
  for policy in ansor pruner; do
    timeout 100 python3 -m tensorgen.cli tune gmm --shape 1024,1024,1024 --target "cuda -device=h200" \
      --policy "$policy" --trials 128 --db "$out/gmm_$policy.db" 2>&1 | tail -12
    timeout 40 python3 bench/gpu_peer.py --db "$out/gmm_$policy.db" --target "cuda -device=h200" 2>&1 | tail -3
  done
} 2>&1 | tee "$out/session.txt"
