#!/bin/bash
# The Hopper attention kernels and the step's GEMM paths on the GPU, in about
# 60 s of one device call (bench/NOTES.md, session 34):
#   1. the GPU tests of attention and of the ops (HopperAttention*,
#      FlashAttention*, CudnnAttention*, CudaOpsTest.*);
#   2. mtrt-attention-bench on the Hopper kernels from a packed qkv at the
#      step table's shapes (llama-1.5b's grouped-query heads from q, k and v
#      apart), dropout 0.1 and 0, with MTRT_CUDA_HOPPER_TIMING=1
#      at gpt-1.3b's and gpt2-350m's (the backward's three kernels apart);
#      and against cuDNN at gqa-4096 (grouped-query heads at head dimension
#      128) without dropout;
#   3. with ALT_ENV="NAME=VALUE ..." or ALT_BIN (a folder with another
#      build's mtrt-attention-bench and mtrt-cuda-tests, a candidate change)
#      set, ALT_BIN's tests, then 2 again under both, then without.
#
# Usage: bench/run-hopper-check.sh DIR OUT
#   DIR  a folder of bench/make-step-dir.sh, from a build with
#        mtrt-cuda-tests (bin/ and lib/)
#   OUT  gets hopper-check.txt
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
report=$out/hopper-check.txt
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >"$report"

# 1.
timeout 150 "$dir/bin/mtrt-cuda-tests" \
  --gtest_filter='HopperAttention*:FlashAttention*:CudnnAttention*:CudaOpsTest.*' \
  >/tmp/tests.log 2>&1
echo "tests: exit status $? at $(elapsed) s" >>"$report"
grep -E "^\[  FAILED|^\[  PASSED|^\[==========\]" /tmp/tests.log >>"$report"
grep -B3 -A12 "^\[  FAILED" /tmp/tests.log | head -60 >>"$report"

# 2. (and 3.) BIN VAR=VALUE...: the timings of BIN's mtrt-attention-bench
# with the variables set.
timings() {
  local bin=$1
  shift
  for shape in gpt-1.3b gpt2-350m; do
    echo "$shape, dropout 0.1: $(env "$@" MTRT_CUDA_HOPPER_TIMING=1 \
      timeout 40 "$bin/mtrt-attention-bench" 50 $shape hopper-qkv 0.1 \
      2>&1 | grep "hopper backward, mean" | head -1)" >>"$report"
  done
  env "$@" timeout 60 "$bin/mtrt-attention-bench" 10 \
    gpt-1.3b,gpt2-350m,gpt2-124m hopper-qkv 0.1,0 2>&1 |
    grep -E "^(shape|gpt)|mismatch|outside|rror" >>"$report"
  # (grouped-query heads: q, k and v apart)
  env "$@" timeout 60 "$bin/mtrt-attention-bench" 10 llama-1.5b hopper \
    0.1,0 2>&1 | grep -E "^llama|mismatch|outside|rror" >>"$report"
  # (grouped-query heads at head dimension 128, the Llama 3 shapes, without
  # dropout: the own kernels against cuDNN, which the runtime takes there)
  env "$@" timeout 60 "$bin/mtrt-attention-bench" 10 gqa-4096 \
    hopper,cudnn 0 2>&1 | grep -E "^gqa|mismatch|outside|rror" >>"$report"
}
timings "$dir/bin"
if [ -n "${ALT_ENV:-}${ALT_BIN:-}" ]; then
  if [ -n "${ALT_BIN:-}" ]; then
    timeout 150 "$ALT_BIN/mtrt-cuda-tests" \
      --gtest_filter='HopperAttention*:FlashAttention*:CudnnAttention*:CudaOpsTest.*' \
      >/tmp/alt-tests.log 2>&1
    echo "tests of $ALT_BIN: exit status $? at $(elapsed) s" >>"$report"
    grep -E "^\[  FAILED|^\[  PASSED|^\[==========\]" /tmp/alt-tests.log >>"$report"
    grep -B3 -A12 "^\[  FAILED" /tmp/alt-tests.log | head -60 >>"$report"
  fi
  echo "with ${ALT_ENV:-} ${ALT_BIN:+the bench of $ALT_BIN}:" >>"$report"
  # shellcheck disable=SC2086 # ALT_ENV is a list of NAME=VALUE words
  timings "${ALT_BIN:-$dir/bin}" ${ALT_ENV:-}
  echo "without, again:" >>"$report"
  timings "$dir/bin"
fi
echo "done at $(elapsed) s" >>"$report"
cat "$report"
