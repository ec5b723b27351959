#!/bin/bash
# Assembles what bench/run-step-table.sh needs on the GPU machine into one
# folder (to carry through the device tool): megatron-train, the libraries
# the device image lacks, the bench scripts and model files, the corpus, and
# the bundles with their --report memory tables:
#   - tiny-gpt (fp32), the CUDA context's yardstick;
#   - every model:micro-batch of MODELS with dropout 0 and 0.1 (hidden and
#     attention dropout alike), bf16, --fuse-kernels,
#     --fuse-linear-cross-entropy, no recomputation:
#     NAME = MODEL-mbMB-dD;
#   - for each model of SEARCH, the micro-batches whose reported total lies
#     between 95 and 145 GiB (the H200 holds about 140), and every fourth
#     from 60 GiB, dropout 0: the largest-micro-batch search's candidates,
#     NAME = MODEL-mbMB-d0.
#
# Usage: bench/make-step-dir.sh BIN COMPILER DEST
#   BIN       a folder holding megatron-train built with -DMTRT_ENABLE_CUDA=ON
#             (the top-level build's build/bin, or a runtime build's bin)
#   COMPILER  megatron-compile of the same tree (same bundle format)
#   DEST      the folder to fill (emptied first)
#   MODELS    (environment) default
#             "gpt2-124m:32 gpt2-350m:32 gpt-1.3b:8 llama-1.5b:4"
#   SEARCH    (environment) default "gpt-1.3b llama-1.5b"; empty: none
# The folder's models.txt records MODELS for bench/run-step-table.sh.
#   FLAGS     (environment) more megatron-compile flags for every model
#             bundle and search candidate
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$1 compile=$2 dest=$3
source "$root/bench/bundle-dir.sh"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/bundles" "$dest/bench" "$dest/models"
cp "$bin/megatron-train" "$dest/bin/"
# bench/run-backward-gap.sh's and bench/run-hopper-check.sh's too, where
# BIN has them (the GPU tests with libmtrt beside them in lib/).
for tool in mtrt-attention-bench mtrt-cuda-tests; do
  if [ -x "$bin/$tool" ]; then
    cp "$bin/$tool" "$dest/bin/"
  fi
done
if [ -x "$bin/mtrt-cuda-tests" ]; then
  mkdir -p "$dest/lib"
  cp -L "$bin"/../lib/libmtrt.so* "$dest/lib/"
fi
# Without their symbols: the folder travels within the device tool's 64 MiB.
if command -v strip >/dev/null; then
  strip "$dest"/bin/* "$dest"/lib/* 2>/dev/null || true
fi
# Packed (ICU's data is 30 MB); run-step-table.sh unpacks them.
tar -C /lib/x86_64-linux-gnu -czhf "$dest/fallback-lib.tgz" "${fallback_libs[@]}"
cp "$root/bench/run-step-table.sh" "$root/bench/step_table.py" \
  "$root/bench/torch_step.py" "$root/bench/modelfile.py" \
  "$root/bench/run-backward-gap.sh" "$root/bench/torch_sdpa.py" \
  "$root/bench/run-hopper-check.sh" "$root/bench/run-kernel-profile.sh" \
  "$root/bench/kernel_summary.py" "$root/bench/run-sustained-attention.sh" \
  "$root/bench/device-env.sh" "$root/bench/run-step-ab.sh" \
  "$dest/bench/"
cp "$root"/models/*.yaml "$dest/models/"
cp "$root/data/corpus.txt" "$dest/corpus.txt"

b=$dest/bundles
bundle tiny-gpt "$root/models/tiny-gpt.yaml" --precision=fp32
# MODEL MB DROPOUT: the bf16 bundle of bench/run-step-table.sh.
model_bundle() {
  bundle "$1-mb$2-d$3" "$root/models/$1.yaml" --bf16 --fuse-kernels \
    --fuse-linear-cross-entropy ${FLAGS:-} \
    --recompute-granularity none --micro-batch-size="$2" \
    --global-batch-size="$2" --hidden-dropout="$3" --attention-dropout="$3"
}
models=${MODELS:-gpt2-124m:32 gpt2-350m:32 gpt-1.3b:8 llama-1.5b:4}
echo "$models" >"$dest/models.txt"
for pair in $models; do
  for dropout in 0 0.1; do
    model_bundle "${pair%%:*}" "${pair##*:}" "$dropout"
  done
done
gib=$((1 << 30))
for model in ${SEARCH-gpt-1.3b llama-1.5b}; do
  for mb in $(seq 2 64); do
    total=$("$compile" "$root/models/$model.yaml" --bf16 --fuse-kernels \
      --fuse-linear-cross-entropy ${FLAGS:-} \
      --recompute-granularity none --micro-batch-size="$mb" \
      --global-batch-size="$mb" --hidden-dropout=0 --attention-dropout=0 \
      --report memory | awk '$1 == "total" {print $2}')
    if ((total > 95 * gib && total < 145 * gib)) ||
      ((total > 60 * gib && total <= 95 * gib && mb % 4 == 0)); then
      [ -f "$b/$model-mb$mb-d0.mtb" ] || model_bundle "$model" "$mb" 0
    fi
  done
done
du -sh "$dest"
