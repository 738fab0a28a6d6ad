#!/usr/bin/env bash
# Runs on the GPU machine (device tool) from the repository root, with build/ carried: the
# checks of the training-stack integration (issue 20). Logs and results go to $OUT (or
# ./device-out); each step's rc and time to $OUT/summary.txt.
#   1. the GPU doctest table (fused gate_up and GPT-OSS cases included)
#   2. grad-checks of the suite's gpt-oss-20b and deepseek-v3 shapes in the Hugging Face
#      layouts (fused gate_up; gpt-oss with its clamped SwiGLU and expert biases)
#   3. the Python GPU tests: the package's (python/tests/test_torch_gpu.py) and the
#      transformers backend's (python/tests/test_hf_gpu.py: per-family parity, FSDP2,
#      torch.compile, CUDA graph step, gradient accumulation)
#   3b. the torchtitan and Megatron adapters' GPU tests (python/tests/test_torchtitan_gpu.py,
#      test_megatron_gpu.py), with torchtitan and megatron-core installed from build-wheels/
#      when it was carried (scripts/stack_wheels.sh fills it; the GPU machine reaches no registry)
#   4. examples/train_moe.py (grouped_mm, eager and moeblaze: tokens/s, peak, loss curves) into $OUT/train_moe
#   5. bench/accumulate.py (deepseek-v3 layer, 22.5 GB of weight gradients) into $OUT/accumulate.json
# SKIP=gpu,grad,pytest,stacks,train,accumulate (comma-separated) leaves those steps out.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEBLAZE_LIBRARY=${MOEBLAZE_LIBRARY:-$PWD/build/lib/libmoeblaze_c.so}
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
BIN=build/bin
SKIP=,${SKIP:-},
nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  case $SKIP in *",${name%%_*},"*) return ;; esac
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-40s rc=%-3s %5ss\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -n 40 "$OUT/$name.log"; }
}
step gpu_tests 300 $BIN/moeblaze_gpu_tests
step grad_gpt-oss-20b_hf 240 $BIN/moeblaze grad-check --preset gpt-oss-20b --router none --activation clamped_swiglu \
  --weight-layout fused --expert-bias
step grad_deepseek-v3_fused 300 $BIN/moeblaze grad-check --preset deepseek-v3 --weight-layout fused
step pytest_torch 300 python3 -m pytest -q -p no:cacheprovider python/tests/test_torch_gpu.py
step pytest_hf 600 python3 -m pytest -q -p no:cacheprovider -rs python/tests/test_hf_gpu.py
if [ -d build-wheels ] && ! python3 -c "import torchtitan, megatron.core" >/dev/null 2>&1; then
  python3 -m pip install -q --no-deps --no-index build-wheels/*.whl
fi
step stacks_pytest 300 python3 -m pytest -q -p no:cacheprovider -rs python/tests/test_torchtitan_gpu.py \
  python/tests/test_megatron_gpu.py
step train_moe 300 python3 examples/train_moe.py --out "$OUT/train_moe"
step accumulate 400 python3 bench/accumulate.py --json "$OUT/accumulate.json"
exit $status
