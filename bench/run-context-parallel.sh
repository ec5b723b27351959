#!/bin/bash
# Context parallelism on the GPU (issue 24; bench/NOTES.md, "Session 18"):
# makes the folder the device run needs, or runs it there.
#
#   bench/run-context-parallel.sh make BUILD DEST   (here: binaries, libmtrt,
#       the Debian fallback libraries, the corpus, the bundles of
#       runtime/test/cuda/CudaContextParallelTest.cpp)
#   DEST/run-context-parallel.sh run                 (on the device: the
#       tests, then megatron-train --backend cuda --in-process-ranks on the
#       CP2 bundles beside the host's losses; results under $OUT)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ ${1:-} == make ]]; then
  set -e
  root=$(cd "$here/.." && pwd)
  build=$2 dest=$3
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib" "$dest/bundles" "$dest/fallback-lib"
  cp "$build/bin/megatron-train" "$build/bin/mtrt-cuda-tests" "$dest/bin/"
  strip "$dest/bin/"*
  cp -L "$build"/lib/libmtrt.so* "$dest/lib/" 2>/dev/null || true
  cp -L /lib/x86_64-linux-gnu/libcrypto.so.3 \
    /lib/x86_64-linux-gnu/libicuuc.so.72 \
    /lib/x86_64-linux-gnu/libicudata.so.72 "$dest/fallback-lib/"
  cp "$root/data/corpus.txt" "$dest/corpus.txt"
  cp "$root/test/integration/Inputs/compare-ranks.py" "$dest/"
  cp "$0" "$dest/run-context-parallel.sh"
  compile=$build/bin/megatron-compile b=$dest/bundles
  "$here/make-context-parallel-bundles.sh" "$compile" "$b"
  # CudaModelTest and CudaOpsTest (the rope, position and dropout kernels
  # this change touched) on the bundles they read.
  "$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 -o "$b/tiny-gpt.mtb"
  "$compile" "$root/models/tiny-llama.yaml" --precision=fp32 \
    -o "$b/tiny-llama.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" --bf16 -o "$b/tiny-gpt-bf16.mtb"
  "$compile" "$root/models/tiny-llama.yaml" --bf16 -o "$b/tiny-llama-bf16.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 \
    --tensor-model-parallel-size=2 --sequence-parallel -o "$b/tiny-gpt-tp2-sp.mtb"
  exit 0
fi
[[ ${1:-} == run ]] || { echo "usage: $0 make BUILD DEST | run" >&2; exit 2; }
out=${OUT:-/tmp/cp-out}
mkdir -p "$out"
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' -o \
  -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' -o -name 'libnccl.so.2' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH=$here/lib:$libdirs:$here/fallback-lib
export MTRT_CUDA_TEST_BUNDLES=$here/bundles
nvidia-smi --query-gpu=name,driver_version --format=csv > "$out/gpu.txt" 2>&1
# About 140 s in all (the device budget of the session that wrote this).
timeout 95 "$here/bin/mtrt-cuda-tests" \
  --gtest_filter='*CudaAttentionBlock*:*CudaContextParallelTest.*' \
  > "$out/cp-tests.log" 2>&1
echo "cp tests rc $?" >> "$out/summary.txt"
for b in tiny-llama-s256-bf16-cp2 tiny-gpt-s256-cp2-tp2-sp; do
  for backend in cuda host; do
    timeout 12 "$here/bin/megatron-train" "$here/bundles/$b.mtb" \
      --backend $backend --in-process-ranks --data-path "$here/corpus.txt" \
      --train-iters 5 --lr 1e-3 --log-interval 1 --eval-interval 0 \
      --no-progress-bar --log-jsonl "$out/$b-$backend.jsonl" \
      $([[ $b == *bf16* ]] && echo --bf16) > "$out/$b-$backend.log" 2>&1
    echo "train $b $backend rc $?" >> "$out/summary.txt"
  done
done
timeout 25 "$here/bin/mtrt-cuda-tests" \
  --gtest_filter='CudaOpsTest.*:Models/CudaModelTest.TrainStep*/tiny_gpt:Models/CudaModelTest.TrainStep*/tiny_llama:Models/CudaMixedPrecisionTest.TrainStep*/tiny_llama_bf16:DeviceCollectiveTest.*:TinyGpt/CudaTensorParallelTest.TwoInProcess*/DropoutSequenceParallelFp32' \
  > "$out/regression-tests.log" 2>&1
echo "regression tests rc $?" >> "$out/summary.txt"
