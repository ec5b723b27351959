#!/bin/bash
# Session 29's check on the GPU machine, in one call: the CUDA tests of what
# it changed and the model suites, mtrt-attention-bench at dropout 0.1 with
# the Hopper forward's mask drawn by its producer warps and by the mask
# kernel (and at dropout 0), and per-op profiles (MTRT_CUDA_PROFILE=1) of the
# d0.1 step bundles with the new paths (MTRT_CUDA_HOPPER_MASK=producer
# MTRT_CUDA_NORM_BACKWARD=shared) and the old ones.
#
# Usage: bench/run-switch-check.sh D_TGZ PROF_TGZ OUT
#   D_TGZ     bench/make-device-dir.sh's folder `d`, packed (tar czf d.tgz d)
#   PROF_TGZ  a folder `prof` of step bundles NAME.mtb (bench/make-step-dir.sh's
#             model_bundle flags), packed
#   OUT       where the logs go
#   PROFILE_UNTIL (environment) seconds after which no further profile
#             starts, default 520
set -u
dtgz=$1 proftgz=$2 out=$3
mkdir -p /tmp/d /tmp/p "$out"
tar xzf "$dtgz" -C /tmp/d
tar xzf "$proftgz" -C /tmp/p
d=/tmp/d/d
libdirs=$(find /usr/local /opt /usr/lib -name 'libcudart.so.13*' -o \
  -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' -o -name 'libnccl.so.2' 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$libdirs$d/lib:$d/fallback-lib:${LD_LIBRARY_PATH:-}"
start=$(date +%s)
timeout 230 "$d/bin/mtrt-cuda-tests" \
  --gtest_filter='CudaFused*:HopperAttention*:FlashAttention*:CudaOpsTest.*Norm*:CudaOpsTest.*Dropout*:CudaOpsTest.*Attention*:CudaModelTest*:CudaMixedPrecision*:CudaGraph*' \
  >"$out/tests.txt" 2>&1
echo "tests exit $? after $(($(date +%s) - start)) s" >>"$out/tests.txt"
grep -E "FAILED|PASSED|tests exit" "$out/tests.txt" | head -30
for source in producer kernel; do
  MTRT_CUDA_HOPPER_MASK=$source timeout 100 "$d/bin/mtrt-attention-bench" 10 \
    "" hopper,hopper-qkv 0.1 >"$out/attention-$source.txt" 2>&1
  echo "exit $?" >>"$out/attention-$source.txt"
done
timeout 60 "$d/bin/mtrt-attention-bench" 10 "" hopper,hopper-qkv 0 \
  >"$out/attention-d0.txt" 2>&1
for bundle in /tmp/p/prof/*.mtb; do
  m=$(basename "$bundle" .mtb)
  for variant in new old; do
    env=(MTRT_CUDA_HOPPER_MASK=producer MTRT_CUDA_NORM_BACKWARD=shared)
    [ $variant = old ] &&
      env=(MTRT_CUDA_HOPPER_MASK=kernel MTRT_CUDA_NORM_BACKWARD=registers)
    [ $(($(date +%s) - start)) -gt "${PROFILE_UNTIL:-520}" ] && break 2
    env "${env[@]}" MTRT_CUDA_PROFILE=1 timeout 60 "$d/bin/megatron-train" \
      "$bundle" --data-path "$d/corpus.txt" --train-iters 3 --lr 6e-4 \
      --log-interval 1 --eval-iters 0 --no-progress-bar --backend cuda \
      >"$out/profile-$m-$variant.log" 2>&1
    echo "$m $variant: exit status $?"
  done
done
echo "done after $(($(date +%s) - start)) s"
