#!/bin/bash
# A bf16 bundle of an MoE model, which megatron-compile refuses for now
# (ValidateCompileConfig: MoE runs in fp32 until the front end lets bf16
# through, docs/MoE.md): the model's fp32 IR at the fusion boundary, its
# precision set to bf16 in #mt.model, the precision pipeline
# (mt-mixed-precision types the MoE ops: docs/MixedPrecision.md), and the
# bundle writer.
#
# Usage: bench/make-moe-bf16-bundle.sh BIN MODEL OUT [megatron-compile flags]
#   BIN    the folder of megatron-compile, megatron-opt, megatron-translate
set -euo pipefail
bin=$1 model=$2 out=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin/megatron-compile" "$model" --precision=fp32 "$@" --emit mlir \
  --stop-after fusion -o "$tmp/fp32.mlir"
sed 's/precision = "fp32"/precision = "bf16"/' "$tmp/fp32.mlir" > "$tmp/bf16.mlir"
grep -q 'precision = "bf16"' "$tmp/bf16.mlir"
"$bin/megatron-opt" "$tmp/bf16.mlir" --megatron-precision-pipeline \
  -o "$tmp/typed.mlir"
"$bin/megatron-translate" --mlir-to-bundle "$tmp/typed.mlir" -o "$out"
