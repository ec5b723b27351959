#!/bin/bash
# The Hopper attention backward's switches of session 33 (bench/NOTES.md),
# measured in one call of the device tool (about 350 s on the GPU machine):
#   base     the defaults (the old paths)
#   side     MTRT_CUDA_HOPPER_SIDE_KERNELS=1: delta with the zeroing of dq's
#            sums in one kernel, dq's conversion by tiles
#   late     side and MTRT_CUDA_HOPPER_LATE_DQ=1: dQ's product a step late
#   stagger  late and MTRT_CUDA_HOPPER_STAGGER=1
# In order, each step cut short once the call's time runs low:
#   1. the GPU tests (HopperAttention*, FlashAttention*) under base, and
#      HopperAttentionBackward* under each switch;
#   2. CudaKernelBench.DISABLED_QkvBiasGradient (the qkv weight gradient's
#      bias gradient: BGRADA against the plain GEMM and the column sums);
#   3. mtrt-attention-bench with MTRT_CUDA_HOPPER_TIMING=1 at gpt-1.3b's
#      shape, dropout 0.1, under each switch (the backward's three kernels),
#      and at the step table's four shapes under base and late;
#   4. gpt-1.3b mb 8 steps (7 iterations, the time of 4-7): dropout 0.1
#      under base, late, stagger and side; dropout 0 as it is, with
#      MTRT_CUDA_BIAS_GRAD_KERNEL=1, and on the Hopper kernels
#      (MTRT_CUDA_CUDNN_ATTENTION=0) under late;
#   5. ncu of the main kernel under late, per SASS instruction (stall
#      samples), where ncu is there.
#
# Usage: bench/run-hopper-switches.sh DIR OUT
#   DIR  a folder of bench/make-step-dir.sh, from a build with
#        mtrt-cuda-tests (bin/ and lib/)
#   OUT  gets tests.txt, bench.txt and ncu.tgz
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
libdirs=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' -o \
  -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' -o -name 'libnccl.so.2' \
  -o -name 'libcublasLt.so.13*' 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
mkdir -p /tmp/fallback-lib
tar -C /tmp/fallback-lib -xzf "$dir/fallback-lib.tgz"
export LD_LIBRARY_PATH="$libdirs$dir/lib:/tmp/fallback-lib:${LD_LIBRARY_PATH:-}"
tests=$out/tests.txt bench=$out/bench.txt
declare -A switches=([base]=""
  [side]="MTRT_CUDA_HOPPER_SIDE_KERNELS=1"
  [late]="MTRT_CUDA_HOPPER_SIDE_KERNELS=1 MTRT_CUDA_HOPPER_LATE_DQ=1"
  [stagger]="MTRT_CUDA_HOPPER_SIDE_KERNELS=1 MTRT_CUDA_HOPPER_LATE_DQ=1 MTRT_CUDA_HOPPER_STAGGER=1")
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv >"$tests"

# 1.
for v in base side late stagger; do
  filter='HopperAttentionBackward*'
  [ $v = base ] && filter='HopperAttention*:FlashAttention*'
  env ${switches[$v]} timeout 100 "$dir/bin/mtrt-cuda-tests" \
    --gtest_filter="$filter" >/tmp/tests-$v.log 2>&1
  echo "$v: exit status $? at $(elapsed) s" >>"$tests"
  grep -E "^\[  FAILED|^\[  PASSED|hopper backward \]" /tmp/tests-$v.log \
    >>"$tests"
  grep -B3 -A12 "^\[  FAILED" /tmp/tests-$v.log | head -40 >>"$tests"
done

# 2.
timeout 60 "$dir/bin/mtrt-cuda-tests" --gtest_also_run_disabled_tests \
  --gtest_filter='CudaKernelBench.DISABLED_QkvBiasGradient' 2>&1 |
  grep -E "bench:|gemm-bench|FAILED" >>"$bench"

# 3.
for v in base side late stagger; do
  echo "$v, gpt-1.3b, dropout 0.1: $(env ${switches[$v]} \
    MTRT_CUDA_HOPPER_TIMING=1 timeout 40 "$dir/bin/mtrt-attention-bench" 50 \
    gpt-1.3b hopper-qkv 0.1 2>&1 | grep "hopper backward, mean" | head -1)" \
    >>"$bench"
done
for v in base late; do
  echo "$v, hopper-qkv, dropout 0.1 and 0:" >>"$bench"
  env ${switches[$v]} timeout 60 "$dir/bin/mtrt-attention-bench" 10 \
    gpt-1.3b,gpt2-350m,gpt2-124m,llama-1.5b hopper-qkv 0.1,0 2>&1 |
    grep -E "^(gpt|llama)|mismatch|outside|rror" >>"$bench"
done
echo "bench done at $(elapsed) s" >>"$bench"

# 4. NAME VAR=VALUE...: 7 iterations of bundles/NAME.mtb.
step() {
  local name=$1
  shift
  env "$@" timeout 100 "$dir/bin/megatron-train" "$dir/bundles/$name.mtb" \
    --data-path "$dir/corpus.txt" --train-iters 7 --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --eval-interval 0 --no-progress-bar \
    --clip-grad 1.0 --backend cuda >/tmp/step.log 2>&1
  local times loss
  times=$(grep -E 'iteration +[4-7]/' /tmp/step.log |
    grep -oE 'per iteration \(ms\): [0-9.]+' | awk '{print $NF}' | tr '\n' ' ')
  loss=$(grep -E 'iteration +7/' /tmp/step.log | grep -oE 'lm loss: [0-9.E+-]+')
  echo "$name $*: ms $times| $loss | at $(elapsed) s" >>"$bench"
}
step gpt-1.3b-mb8-d0.1
step gpt-1.3b-mb8-d0.1 ${switches[late]}
(($(elapsed) < 250)) && step gpt-1.3b-mb8-d0.1 ${switches[stagger]}
(($(elapsed) < 270)) && step gpt-1.3b-mb8-d0.1 ${switches[side]}
(($(elapsed) < 290)) && step gpt-1.3b-mb8-d0
(($(elapsed) < 310)) && step gpt-1.3b-mb8-d0 MTRT_CUDA_BIAS_GRAD_KERNEL=1
(($(elapsed) < 330)) &&
  step gpt-1.3b-mb8-d0 MTRT_CUDA_CUDNN_ATTENTION=0 ${switches[late]}

# 5.
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu \
  /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ] && (($(elapsed) < 330)); then
  mkdir -p /tmp/ncu
  env ${switches[late]} timeout 60 "$ncu" \
    --kernel-name regex:hopperBackwardKernel --launch-skip 2 --launch-count 1 \
    --section SourceCounters --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    --section SpeedOfLight -f -o /tmp/ncu/late \
    "$dir/bin/mtrt-attention-bench" 3 gpt-1.3b hopper-qkv 0.1 \
    >/tmp/ncu/run.log 2>&1
  "$ncu" -i /tmp/ncu/late.ncu-rep --page source --csv --print-source sass \
    >/tmp/ncu/sass.csv 2>&1
  "$ncu" -i /tmp/ncu/late.ncu-rep --page details --csv \
    >/tmp/ncu/details.csv 2>&1
  rm -f /tmp/ncu/*.ncu-rep
  tar czf "$out/ncu.tgz" -C /tmp ncu
  echo "ncu done at $(elapsed) s" >>"$bench"
fi
cat "$tests" "$bench"
