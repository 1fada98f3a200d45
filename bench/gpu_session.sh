#!/usr/bin/env bash
# What a session lent an NVIDIA GPU runs first, in one call of the device tool (about 8 minutes on an H200):
#   bash bench/gpu_session.sh            (results under $OUT, else bench/results/gpu)
# 1. the CUDA tests on the device (their `gpu` cases run only where a GPU is usable);
# 2. Pruner's Best-k of the GPU static analyzer against random spaces (bench/psa_gpu_bestk.py);
# 3. GMM 1024^3 tuned for the GPU by Ansor and by Pruner, 128 trials each: best time and wall-clock side by side.
set -u
out=${OUT:-bench/results/gpu}
mkdir -p "$out"
python -m pip install -q -e ".[dev]" 2>&1 | tail -1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv | tee "$out/gpu.txt"
timeout 180 python -m pytest -q -p no:cacheprovider tests/test_cuda_emu.py tests/test_cuda_codegen.py \
  tests/test_gpu_tune.py 2>&1 | tail -15 | tee "$out/tests.txt"
timeout 200 python bench/psa_gpu_bestk.py --target "cuda -device=h200" --space 512 --sizes 64,128,256 \
  --json "$out/bestk.json" 2>&1 | tail -15 | tee "$out/bestk.txt"
for policy in ansor pruner; do
  timeout 120 tensorgen tune gmm --shape 1024,1024,1024 --target "cuda -device=h200" --policy "$policy" \
    --trials 128 --db "$out/gmm_$policy.db" --json "$out/gmm_$policy.json" 2>&1 | tail -14 | tee "$out/gmm_$policy.txt"
done
