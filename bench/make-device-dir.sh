#!/bin/bash
# Assembles what bench/run-device-checks.sh needs on the GPU machine into one
# folder (to carry through the device tool): the CUDA runtime build's
# binaries and libmtrt, the bundles compiled here, the libraries the machine
# may lack, the bench scripts and the corpus.
#
# Usage: bench/make-device-dir.sh CUDA_BUILD COMPILER DEST
#   CUDA_BUILD  a runtime build with -DMTRT_ENABLE_CUDA=ON (bench/NOTES.md)
#   COMPILER    megatron-compile
#   DEST        the folder to fill (emptied first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 compile=$2 dest=$3
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/bundles" "$dest/fallback-lib" \
  "$dest/bench"
cp "$build/bin/megatron-train" "$build/bin/mtrt-cuda-tests" \
  "$build/bin/mtrt-attention-bench" "$build/bin/mtrt-moe-bench" "$dest/bin/"
cp -L "$build"/lib/libmtrt.so* "$dest/lib/" 2>/dev/null || true
# Debian 12 libraries the device image (Ubuntu) lacks: OpenSSL 3 and ICU 72.
cp -L /lib/x86_64-linux-gnu/libcrypto.so.3 /lib/x86_64-linux-gnu/libicuuc.so.72 \
  /lib/x86_64-linux-gnu/libicudata.so.72 "$dest/fallback-lib/"
cp "$root"/bench/*.py "$root/bench/run-device-checks.sh" \
  "$root/bench/run-multi-gpu.sh" "$root/bench/run-attention-table.sh" \
  "$dest/bench/"
mkdir -p "$dest/models"
cp "$root"/models/*.yaml "$dest/models/"
cp "$root/data/corpus.txt" "$dest/corpus.txt"
b=$dest/bundles
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 -o "$b/tiny-gpt.mtb"
"$compile" "$root/models/tiny-llama.yaml" --precision=fp32 -o "$b/tiny-llama.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --bf16 -o "$b/tiny-gpt-bf16.mtb"
"$compile" "$root/models/tiny-llama.yaml" --bf16 -o "$b/tiny-llama-bf16.mtb"
# CudaPlanCoverageTest: grouped-query heads at a head dimension the Hopper
# kernels take.
"$compile" "$root/models/tiny-llama.yaml" --bf16 --kv-channels 64 \
  -o "$b/tiny-llama-bf16-hd64.mtb"
# CudaTensorParallelTest: tiny-gpt without dropout, for one rank and TP=2;
# CudaDataParallelTest: for DP=2, with and without the distributed
# optimizer, and DP=2 x TP=2.
for precision in fp32 bf16; do
  name=tiny-gpt-nodrop flags=--precision=fp32
  [[ $precision == bf16 ]] && name=tiny-gpt-bf16-nodrop flags=--bf16
  "$compile" "$root/models/tiny-gpt.yaml" $flags --hidden-dropout=0 \
    --attention-dropout=0 -o "$b/$name.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" $flags --hidden-dropout=0 \
    --attention-dropout=0 --tensor-model-parallel-size=2 -o "$b/$name-tp2.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" $flags --hidden-dropout=0 \
    --attention-dropout=0 --tensor-model-parallel-size=2 --sequence-parallel \
    -o "$b/$name-tp2-sp.mtb"
  # The same with the fused loss (the vocabulary-parallel chunked ops).
  lce=(--fuse-linear-cross-entropy --linear-cross-entropy-chunk-rows=300)
  "$compile" "$root/models/tiny-gpt.yaml" $flags --hidden-dropout=0 \
    --attention-dropout=0 --tensor-model-parallel-size=2 "${lce[@]}" \
    -o "$b/$name-tp2-lce.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" $flags --hidden-dropout=0 \
    --attention-dropout=0 --tensor-model-parallel-size=2 --sequence-parallel \
    "${lce[@]}" -o "$b/$name-tp2-sp-lce.mtb"
  dp=(--hidden-dropout=0 --attention-dropout=0 --data-parallel-size=2
    --micro-batch-size=4 --global-batch-size=8)
  "$compile" "$root/models/tiny-gpt.yaml" $flags "${dp[@]}" -o "$b/$name-dp2.mtb"
  "$compile" "$root/models/tiny-gpt.yaml" $flags "${dp[@]}" \
    --use-distributed-optimizer -o "$b/$name-dp2-distopt.mtb"
  if [[ $precision == fp32 ]]; then
    "$compile" "$root/models/tiny-gpt.yaml" $flags "${dp[@]}" \
      --tensor-model-parallel-size=2 --use-distributed-optimizer \
      -o "$b/$name-dp2-tp2-distopt.mtb"
    # CudaDataParallelBucketTest: the same with gradient buckets.
    buckets=(--overlap-grad-reduce --ddp-bucket-size=40000)
    "$compile" "$root/models/tiny-gpt.yaml" $flags "${dp[@]}" "${buckets[@]}" \
      -o "$b/$name-dp2-overlap.mtb"
    "$compile" "$root/models/tiny-gpt.yaml" $flags "${dp[@]}" "${buckets[@]}" \
      --use-distributed-optimizer -o "$b/$name-dp2-distopt-overlap.mtb"
  fi
done
# Dropout 0.1 over split tensors (masks keyed on the global samples):
# CudaTensorParallelTest's TP=2 with and without sequence parallelism,
# CudaDataParallelTest's DP=2 and DP=2 x TP=2 with sequence parallelism.
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 \
  --tensor-model-parallel-size=2 -o "$b/tiny-gpt-tp2.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 \
  --tensor-model-parallel-size=2 --sequence-parallel -o "$b/tiny-gpt-tp2-sp.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 \
  --data-parallel-size=2 --micro-batch-size=4 --global-batch-size=8 \
  -o "$b/tiny-gpt-dp2.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 \
  --data-parallel-size=2 --micro-batch-size=4 --global-batch-size=8 \
  --tensor-model-parallel-size=2 --sequence-parallel \
  --use-distributed-optimizer -o "$b/tiny-gpt-dp2-tp2-sp-distopt.mtb"
# CudaOverlapTest (issue 23): tiny-gpt (dropout 0.1, 4 micro-batches of 8
# per iteration) in three layouts, each without and with the overlap flags
# that apply, fp32 and bf16: TP2 + SP (--tp-comm-overlap
# --overlap-collectives), DP2 with the distributed optimizer
# (--overlap-grad-reduce --overlap-param-gather --overlap-collectives),
# TP2 x PP2 x DP2 + SP with the distributed optimizer (all four); and a wider GPT (hidden 1024,
# sequence 512) at TP2 + SP with --tp-comm-overlap --overlap-collectives
# for the timeline.
for precision in fp32 bf16; do
  name=tiny-gpt flags=--precision=fp32
  [[ $precision == bf16 ]] && name=tiny-gpt-bf16 flags=--bf16
  o=("$compile" "$root/models/tiny-gpt.yaml" $flags --global-batch-size=32)
  tpo=(--tp-comm-overlap --overlap-collectives)
  dpo=(--overlap-grad-reduce --ddp-bucket-size=40000 --overlap-param-gather
    --overlap-collectives)
  tp=(--tensor-model-parallel-size=2 --sequence-parallel)
  dp=(--data-parallel-size=2 --use-distributed-optimizer)
  "${o[@]}" "${tp[@]}" -o "$b/$name-gb32-tp2-sp.mtb"
  "${o[@]}" "${tp[@]}" "${tpo[@]}" -o "$b/$name-gb32-tp2-sp-overlap.mtb"
  "${o[@]}" "${dp[@]}" -o "$b/$name-gb32-dp2-distopt.mtb"
  "${o[@]}" "${dp[@]}" "${dpo[@]}" -o "$b/$name-gb32-dp2-distopt-overlap.mtb"
  "${o[@]}" "${tp[@]}" "${dp[@]}" --pipeline-model-parallel-size=2 \
    -o "$b/$name-gb32-tp2-pp2-dp2.mtb"
  "${o[@]}" "${tp[@]}" "${dp[@]}" --pipeline-model-parallel-size=2 \
    --tp-comm-overlap --overlap-grad-reduce --ddp-bucket-size=20000 \
    --overlap-param-gather --overlap-collectives \
    -o "$b/$name-gb32-tp2-pp2-dp2-overlap.mtb"
done
"$compile" "$root/models/tiny-gpt.yaml" --bf16 --hidden-size=1024 \
  --num-attention-heads=16 --ffn-hidden-size=4096 --seq-length=512 \
  --max-position-embeddings=512 --micro-batch-size=8 --global-batch-size=8 \
  --hidden-dropout=0 --attention-dropout=0 --tensor-model-parallel-size=2 \
  --sequence-parallel --tp-comm-overlap --overlap-collectives \
  -o "$b/gpt-h1024-bf16-tp2-sp-overlap.mtb"
# CudaMoeTest (issue 25): tiny-moe dropless, with capacity dropping by
# weight, and by position under sigmoid scores; and in bf16.
moe=("$compile" "$root/models/tiny-moe.yaml" --precision=fp32)
"${moe[@]}" -o "$b/tiny-moe.mtb"
"${moe[@]}" --moe-expert-capacity-factor=1.0 -o "$b/tiny-moe-drop.mtb"
"${moe[@]}" --moe-expert-capacity-factor=1.0 --moe-token-drop-policy=position \
  --moe-router-score-function=sigmoid -o "$b/tiny-moe-drop-position-sigmoid.mtb"
"$compile" "$root/models/tiny-moe.yaml" --bf16 -o "$b/tiny-moe-bf16.mtb"
# CudaSessionTest: fp16 loss scaling in a session (no dropout: skipped steps
# still consume the samples that key it).
"$compile" "$root/models/tiny-gpt.yaml" --fp16 --hidden-dropout=0 \
  --attention-dropout=0 -o "$b/tiny-gpt-fp16-nodrop.mtb"
# CudaPipelineTest: tiny-gpt with 4 layers (PP=2: two stages of two layers,
# or four virtual stages of one; PP=4: one layer a stage; TP=2 x PP=2), and
# with 8 layers for PP=4 interleaved (eight virtual stages of one), untied
# embeddings, no dropout, 4 micro-batches of 2; each for one rank too.
for precision in fp32 bf16; do
  name=tiny-gpt-l4-nodrop flags=--precision=fp32
  [[ $precision == bf16 ]] && name=tiny-gpt-l4-bf16-nodrop flags=--bf16
  pp=("$compile" "$root/models/tiny-gpt.yaml" $flags --num-layers=4
    --untie-embeddings-and-output-weights --hidden-dropout=0
    --attention-dropout=0 --micro-batch-size=2 --global-batch-size=8)
  "${pp[@]}" -o "$b/$name.mtb"
  "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
    -o "$b/$name-pp2-1f1b.mtb"
  "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=interleaved \
    --virtual-pipeline-model-parallel-size=2 -o "$b/$name-pp2-interleaved.mtb"
  # The fused output layer and loss on the last stage (100 tokens a chunk).
  "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
    --fuse-linear-cross-entropy --linear-cross-entropy-chunk-rows=100 \
    -o "$b/$name-pp2-1f1b-lce.mtb"
  "${pp[@]}" --pipeline-model-parallel-size=4 --pipeline-schedule=1f1b \
    -o "$b/$name-pp4-1f1b.mtb"
  "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
    --tensor-model-parallel-size=2 -o "$b/$name-tp2-pp2.mtb"
  # CudaDataParallelTest: PP=2 x DP=2 (1F1B, 2 micro-batches of 2 per data
  # rank; each pipeline rank reduces its own gradient buffer once per
  # iteration), with and without the distributed optimizer.
  if [[ $precision == fp32 ]]; then
    "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
      --data-parallel-size=2 -o "$b/$name-pp2-dp2.mtb"
    "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
      --data-parallel-size=2 --use-distributed-optimizer \
      -o "$b/$name-pp2-dp2-distopt.mtb"
    # CudaDataParallelBucketTest: PP=2 x DP=2 with gradient buckets.
    "${pp[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
      --data-parallel-size=2 --overlap-grad-reduce --ddp-bucket-size=40000 \
      -o "$b/$name-pp2-dp2-overlap.mtb"
  fi
done
# CudaContextParallelTest and CudaAttentionBlockLimitsTest.
"$root/bench/make-context-parallel-bundles.sh" "$compile" "$b"
# CudaPipelineTest's FP8 cases: the same 4 layers in bf16 with FP8 GEMMs
# (hybrid, delayed scaling over 4 amaxes), PP=2 under 1F1B and interleaved,
# TP=2 x PP=2, and one rank.
fp8=("$compile" "$root/models/tiny-gpt.yaml" --bf16 --fp8-format=hybrid
  --fp8-amax-history-len=4 --fp8-amax-compute-algo=max --num-layers=4
  --untie-embeddings-and-output-weights --hidden-dropout=0
  --attention-dropout=0 --micro-batch-size=2 --global-batch-size=8)
"${fp8[@]}" -o "$b/tiny-gpt-l4-fp8-nodrop.mtb"
"${fp8[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
  -o "$b/tiny-gpt-l4-fp8-nodrop-pp2-1f1b.mtb"
"${fp8[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=interleaved \
  --virtual-pipeline-model-parallel-size=2 \
  -o "$b/tiny-gpt-l4-fp8-nodrop-pp2-interleaved.mtb"
"${fp8[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
  --tensor-model-parallel-size=2 -o "$b/tiny-gpt-l4-fp8-nodrop-tp2-pp2.mtb"
# CudaPipelineTest's tied cases: the same 4 layers with tiny-gpt's tied
# embeddings (the table on the first and the last pipeline rank, its gradient
# summed over the two), fp32.
tied=("$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 --num-layers=4
  --hidden-dropout=0 --attention-dropout=0 --micro-batch-size=2
  --global-batch-size=8)
"${tied[@]}" -o "$b/tiny-gpt-l4-tied-nodrop.mtb"
"${tied[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
  -o "$b/tiny-gpt-l4-tied-nodrop-pp2-1f1b.mtb"
"${tied[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
  --fuse-linear-cross-entropy --linear-cross-entropy-chunk-rows=100 \
  -o "$b/tiny-gpt-l4-tied-nodrop-pp2-1f1b-lce.mtb"
"${tied[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=interleaved \
  --virtual-pipeline-model-parallel-size=2 \
  -o "$b/tiny-gpt-l4-tied-nodrop-pp2-interleaved.mtb"
"${tied[@]}" --pipeline-model-parallel-size=2 --pipeline-schedule=1f1b \
  --tensor-model-parallel-size=2 -o "$b/tiny-gpt-l4-tied-nodrop-tp2-pp2.mtb"
l8=("$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 --num-layers=8
  --untie-embeddings-and-output-weights --hidden-dropout=0
  --attention-dropout=0 --micro-batch-size=2 --global-batch-size=8)
"${l8[@]}" -o "$b/tiny-gpt-l8-nodrop.mtb"
"${l8[@]}" --pipeline-model-parallel-size=4 --pipeline-schedule=interleaved \
  --virtual-pipeline-model-parallel-size=2 \
  -o "$b/tiny-gpt-l8-nodrop-pp4-interleaved.mtb"
# The generated kernels (--fuse-kernels: mt.fused groups compiled with
# nvrtc into the bundle): their own test bundle and tiny-gpt with them.
"$(dirname "$compile")/megatron-translate" --mlir-to-bundle \
  "$root/runtime/test/cuda/data/fused-ops.mlir" -o "$b/fused-ops.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 --fuse-kernels \
  -o "$b/tiny-gpt-fused.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --bf16 --fuse-kernels \
  -o "$b/tiny-gpt-bf16-fused.mtb"
# CudaMixedPrecisionTest under full recomputation: 8 layers of sequence 64,
# where a bf16 GEMM result's bias vector once landed on a live value.
"$compile" "$root/models/tiny-gpt.yaml" --bf16 --num-layers=8 \
  --seq-length=64 --max-position-embeddings=64 --recompute-granularity=full \
  --recompute-method=uniform --recompute-num-layers=1 \
  -o "$b/tiny-gpt-bf16-l8-s64-full.mtb"
# The fused output layer and loss (--fuse-linear-cross-entropy, 300 tokens
# a chunk: four chunks of tiny-gpt's 1024 tokens): CudaModelTest and
# CudaMixedPrecisionTest against the host (tied and untied output layers),
# CudaLinearCrossEntropyTest against the unfused tiny-gpt-[bf16-]nodrop.
lce=(--fuse-linear-cross-entropy --linear-cross-entropy-chunk-rows=300)
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 "${lce[@]}" \
  -o "$b/tiny-gpt-lce.mtb"
"$compile" "$root/models/tiny-llama.yaml" --precision=fp32 "${lce[@]}" \
  -o "$b/tiny-llama-lce.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --bf16 "${lce[@]}" \
  -o "$b/tiny-gpt-bf16-lce.mtb"
"$compile" "$root/models/tiny-llama.yaml" --bf16 "${lce[@]}" \
  -o "$b/tiny-llama-bf16-lce.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --precision=fp32 "${lce[@]}" \
  --hidden-dropout=0 --attention-dropout=0 -o "$b/tiny-gpt-lce-nodrop.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --bf16 "${lce[@]}" \
  --hidden-dropout=0 --attention-dropout=0 -o "$b/tiny-gpt-bf16-lce-nodrop.mtb"
# CudaFp8ModelTest: FP8 training against the host's emulation, hybrid with
# delayed scaling and e4m3 with tensorwise scaling (issue 26).
nodrop=(--hidden-dropout=0 --attention-dropout=0)
"$compile" "$root/models/tiny-gpt.yaml" --bf16 "${nodrop[@]}" \
  --fp8-format hybrid -o "$b/tiny-gpt-fp8-hybrid.mtb"
"$compile" "$root/models/tiny-gpt.yaml" --bf16 "${nodrop[@]}" \
  --fp8-format e4m3 --fp8-recipe tensorwise \
  -o "$b/tiny-gpt-fp8-e4m3-tensorwise.mtb"
"$compile" "$root/models/tiny-llama.yaml" --bf16 "${nodrop[@]}" \
  --fp8-format hybrid -o "$b/tiny-llama-fp8-hybrid.mtb"
for pair in ${MICRO_BATCH:-gpt2-124m:32 gpt2-350m:32 gpt-1.3b:8}; do
  model=${pair%%:*} mb=${pair##*:}
  "$compile" "$root/models/$model.yaml" --bf16 --micro-batch-size="$mb" \
    --global-batch-size="$mb" -o "$b/$model-bf16-mb$mb.mtb"
  "$compile" "$root/models/$model.yaml" --bf16 --micro-batch-size="$mb" \
    --global-batch-size="$mb" --fuse-kernels -o "$b/$model-bf16-mb$mb-fused.mtb"
  # UNFUSED=1: also the bundle without GEMM epilogues (the VARIANTS
  # "unfused" of bench/run-device-checks.sh), to measure what they do.
  if [ "${UNFUSED:-0}" = 1 ]; then
    "$compile" "$root/models/$model.yaml" --bf16 --micro-batch-size="$mb" \
      --global-batch-size="$mb" --fuse-gemm-epilogues=false \
      -o "$b/$model-bf16-mb$mb-unfused.mtb"
  fi
done
# What attention dropout costs: gpt2-124m without it.
"$compile" "$root/models/gpt2-124m.yaml" --bf16 --micro-batch-size=32 \
  --global-batch-size=32 --attention-dropout=0 \
  -o "$b/gpt2-124m-bf16-mb32-nodrop.mtb"
# MULTI=1: bench/run-multi-gpu.sh's bundles (issue #11): gpt2-124m without
# any dropout (the layouts bench/NOTES.md measured), for one
# rank and for TP=2; and for DP=2 (micro-batches of 32 per rank, global
# batch 64), with and without the distributed optimizer.
if [ "${MULTI:-0}" = 1 ]; then
  for tp in 1 2; do
    suffix=; [ $tp = 2 ] && suffix=-tp2
    "$compile" "$root/models/gpt2-124m.yaml" --bf16 --micro-batch-size=32 \
      --global-batch-size=32 --attention-dropout=0 --hidden-dropout=0 \
      --tensor-model-parallel-size=$tp \
      -o "$b/gpt2-124m-bf16-mb32-nodropout$suffix.mtb"
  done
  "$compile" "$root/models/gpt2-124m.yaml" --bf16 --micro-batch-size=32 \
    --global-batch-size=32 --attention-dropout=0 --hidden-dropout=0 \
    --tensor-model-parallel-size=2 --sequence-parallel \
    -o "$b/gpt2-124m-bf16-mb32-nodropout-tp2-sp.mtb"
  for distopt in "" --use-distributed-optimizer; do
    suffix=-dp2; [ -n "$distopt" ] && suffix=-dp2-distopt
    "$compile" "$root/models/gpt2-124m.yaml" --bf16 --micro-batch-size=32 \
      --global-batch-size=64 --attention-dropout=0 --hidden-dropout=0 \
      --data-parallel-size=2 $distopt \
      -o "$b/gpt2-124m-bf16-mb32-nodropout$suffix.mtb"
  done
  # PP=2 (1F1B, 4 micro-batches of 8) and its one-rank twin: untied
  # embeddings, no dropout.
  for pp in 1 2; do
    suffix=; [ $pp = 2 ] && suffix=-pp2
    "$compile" "$root/models/gpt2-124m.yaml" --bf16 --micro-batch-size=8 \
      --global-batch-size=32 --attention-dropout=0 --hidden-dropout=0 \
      --untie-embeddings-and-output-weights \
      --pipeline-model-parallel-size=$pp \
      -o "$b/gpt2-124m-bf16-mb8-untied-nodropout$suffix.mtb"
  done
fi
# MULTI=1, continued: the rest of bench/run-multi-gpu.sh's layouts (those
# needing more GPUs than the machine has are listed, not run): gpt2-124m
# TP4 (+ SP), PP2 interleaved, PP4 1F1B and interleaved, DP8 with the
# distributed optimizer, TP2 x PP2 x DP2; gpt2-350m (16 heads; gpt2-124m's
# 12 do not split 8 ways) for one rank and TP8. And the one-GPU checks'
# tiny-gpt layouts (in-process ranks against one rank, fp32): TP4 with its
# one-rank twin (the vocabulary padded to 512 in both), DP8 (micro-batches
# of 1) with the distributed optimizer, PP4 1F1B and TP2 x PP2 x DP2 of the
# 4-layer model.
if [ "${MULTI:-0}" = 1 ]; then
  g=("$compile" "$root/models/gpt2-124m.yaml" --bf16 --attention-dropout=0
    --hidden-dropout=0)
  m=$b/gpt2-124m-bf16-mb32-nodropout
  "${g[@]}" --micro-batch-size=32 --global-batch-size=32 \
    --tensor-model-parallel-size=4 -o "$m-tp4.mtb"
  "${g[@]}" --micro-batch-size=32 --global-batch-size=32 \
    --tensor-model-parallel-size=4 --sequence-parallel -o "$m-tp4-sp.mtb"
  "${g[@]}" --micro-batch-size=32 --global-batch-size=256 \
    --data-parallel-size=8 --use-distributed-optimizer -o "$m-dp8-distopt.mtb"
  u=("${g[@]}" --micro-batch-size=8 --untie-embeddings-and-output-weights)
  p=$b/gpt2-124m-bf16-mb8-untied-nodropout
  "${u[@]}" --global-batch-size=32 --pipeline-model-parallel-size=2 \
    --pipeline-schedule=interleaved --virtual-pipeline-model-parallel-size=2 \
    -o "$p-pp2-interleaved.mtb"
  "${u[@]}" --global-batch-size=32 --pipeline-model-parallel-size=4 \
    --pipeline-schedule=1f1b -o "$p-pp4-1f1b.mtb"
  "${u[@]}" --global-batch-size=32 --pipeline-model-parallel-size=4 \
    --pipeline-schedule=interleaved --virtual-pipeline-model-parallel-size=3 \
    -o "$p-pp4-interleaved.mtb"
  "${u[@]}" --global-batch-size=64 --tensor-model-parallel-size=2 \
    --pipeline-model-parallel-size=2 --data-parallel-size=2 \
    -o "$p-tp2-pp2-dp2.mtb"
  for tp in 1 8; do
    suffix=; [ $tp = 8 ] && suffix=-tp8
    "$compile" "$root/models/gpt2-350m.yaml" --bf16 --attention-dropout=0 \
      --hidden-dropout=0 --micro-batch-size=32 --global-batch-size=32 \
      --tensor-model-parallel-size=$tp \
      -o "$b/gpt2-350m-bf16-mb32-nodropout$suffix.mtb"
  done
  t=("$compile" "$root/models/tiny-gpt.yaml" --precision=fp32
    --hidden-dropout=0 --attention-dropout=0)
  "${t[@]}" --make-vocab-size-divisible-by=512 -o "$b/tiny-gpt-nodrop-v512.mtb"
  "${t[@]}" --tensor-model-parallel-size=4 -o "$b/tiny-gpt-nodrop-tp4.mtb"
  "${t[@]}" --data-parallel-size=8 --micro-batch-size=1 \
    --global-batch-size=8 --use-distributed-optimizer \
    -o "$b/tiny-gpt-nodrop-dp8-distopt.mtb"
  l=("${t[@]}" --num-layers=4 --untie-embeddings-and-output-weights
    --micro-batch-size=2 --global-batch-size=8)
  "${l[@]}" --pipeline-model-parallel-size=4 --pipeline-schedule=1f1b \
    -o "$b/tiny-gpt-l4-nodrop-pp4-1f1b.mtb"
  "${l[@]}" --tensor-model-parallel-size=2 --pipeline-model-parallel-size=2 \
    --data-parallel-size=2 -o "$b/tiny-gpt-l4-nodrop-tp2-pp2-dp2.mtb"
fi
# OPENMPI=1: Debian's Open MPI launcher (openmpi-bin and the libraries
# mpirun loads, about 23 MB) unpacked into DEST/openmpi, for
# bench/run-multi-gpu.sh's mpirun rows on a machine without mpirun; it runs
# from there with OPAL_PREFIX (the ranks themselves use no MPI library).
if [ "${OPENMPI:-0}" = 1 ]; then
  debs=$(mktemp -d)
  (cd "$debs" && apt-get download openmpi-bin openmpi-common libopenmpi3 \
    libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 \
    libevent-2.1-7 libpmix2 libnuma1 libxnvctrl0 libmunge2 libpciaccess0 \
    libxml2 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2 \
    libpsm-infinipath1 libnl-3-200 libnl-route-3-200 >/dev/null)
  mkdir -p "$dest/openmpi"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$dest/openmpi"; done
  rm -rf "$debs"
fi
du -sh "$dest"
# SCALING=1: bench/run-scaling.sh's bundles and the compiler's predictions
# for them (issue 29: bench/scaling-layouts.txt).
if [ "${SCALING:-0}" = 1 ]; then
  "$root/bench/compile-scaling-bundles.sh" "$compile" "$dest/scaling"
fi
