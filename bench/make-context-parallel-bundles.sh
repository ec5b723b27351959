#!/bin/bash
# Compiles the bundles of runtime/test/cuda/CudaContextParallelTest.cpp
# (tiny Llama and tiny GPT at sequence 256, one rank, CP2 and CP2 x TP2 + SP,
# fp32 and bf16) and CudaAttentionBlockLimitsTest into DEST (for
# bench/make-device-dir.sh and bench/run-context-parallel.sh).
#
# Usage: bench/make-context-parallel-bundles.sh COMPILER DEST
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
compile=$1 b=$2
# The vocabulary is padded to a multiple of the flag times the tensor
# ranks: 512 for one rank and CP2, 256 x 2 under TP2, one model.
common=(--seq-length 256 --hidden-dropout 0.1 --attention-dropout 0.1
  --micro-batch-size 2 --global-batch-size 2)
whole=(--make-vocab-size-divisible-by 512)
tp2=(--make-vocab-size-divisible-by 256 --tensor-model-parallel-size 2
  --sequence-parallel)
for model in llama gpt; do
  flags=("${common[@]}")
  [[ $model == gpt ]] && flags+=(--max-position-embeddings 256)
  for precision in fp32 bf16; do
    name=tiny-$model-s256 p=(--precision=fp32)
    [[ $precision == bf16 ]] && name=$name-bf16 p=(--bf16)
    m=$root/models/tiny-$model.yaml
    "$compile" "$m" "${flags[@]}" "${p[@]}" "${whole[@]}" -o "$b/$name.mtb"
    "$compile" "$m" "${flags[@]}" "${p[@]}" "${whole[@]}" \
      --context-parallel-size 2 -o "$b/$name-cp2.mtb"
    "$compile" "$m" "${flags[@]}" "${p[@]}" "${tp2[@]}" \
      --context-parallel-size 2 -o "$b/$name-cp2-tp2-sp.mtb"
  done
done
# CudaAttentionBlockLimitsTest: a head dimension over the block kernels'.
"$compile" "$root/models/tiny-llama.yaml" --seq-length 64 \
  --micro-batch-size 1 --global-batch-size 1 --kv-channels 512 \
  --context-parallel-size 2 -o "$b/tiny-llama-hd512-cp2.mtb"
