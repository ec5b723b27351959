#!/bin/bash
# Compiles bench/run-scaling.sh's bundles here (no GPU needed): every layout
# of bench/scaling-layouts.txt, the one-GPU reference each is compared with
# (the same model and global batch), the fault runs' tiny-gpt bundles, and
# the compiler's predictions for each layout (--report step: the step, its
# bubble and exposed communication; --report overlap: each collective).
#
# Usage: bench/compile-scaling-bundles.sh COMPILER DEST
#   COMPILER  megatron-compile
#   DEST      the folder to fill (emptied first): NAME.mtb, NAME.step.txt,
#             NAME.overlap.txt, and layouts.tsv, one line a layout: label,
#             GPUs, launcher, model, scaling, global batch, bundle,
#             reference bundle, flags (tab-separated)
# Environment:
#   LAYOUTS       an extended regular expression: only the layouts whose
#                 label matches it (default: all)
#   REPORTS_ONLY=1  the predictions alone, no bundles (checks that the
#                 compiler accepts every layout)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
compile=$1 dest=$2
rm -rf "$dest"
mkdir -p "$dest"
# The models: the file, bf16, the micro-batch of bench/run-step-table.sh's
# rows, dropout 0.1 (the Llama files have none).
declare -A models=(
  [gpt-1.3b]="$root/models/gpt-1.3b.yaml --bf16 --micro-batch-size=8"
  [llama-1.5b]="$root/models/llama-1.5b.yaml --bf16 --micro-batch-size=4 --hidden-dropout=0.1 --attention-dropout=0.1"
  [mixtral]="$root/models/mixtral-h2048-8l.yaml --bf16 --micro-batch-size=1 --hidden-dropout=0.1 --attention-dropout=0.1"
)
slug() { echo "$1" | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9.]+/-/g; s/-+$//'; }
# compile NAME MODEL BATCH [FLAGS...]: the bundle and its predictions.
compile() {
  local name=$1 model=$2 batch=$3
  shift 3
  local args=(${models[$model]} --global-batch-size="$batch" "$@")
  if [ "${REPORTS_ONLY:-0}" != 1 ] && [ ! -f "$dest/$name.mtb" ]; then
    "$compile" "${args[@]}" -o "$dest/$name.mtb"
  fi
  if [ ! -f "$dest/$name.step.txt" ]; then
    "$compile" "${args[@]}" --report step -o "$dest/$name.step.txt"
    # A pipeline's sends are not IR yet: --report overlap has no
    # collectives to show for pipeline-only layouts, and says so.
    "$compile" "${args[@]}" --report overlap -o "$dest/$name.overlap.txt"
  fi
}
: >"$dest/layouts.tsv"
while IFS='|' read -r label gpus launcher model scaling batch flags; do
  [[ -z $label || $label == \#* ]] && continue
  [[ $label =~ ${LAYOUTS:-.} ]] || continue
  if [ -z "${models[$model]:-}" ]; then
    echo "scaling-layouts.txt: '$label' names the model '$model'; the" \
      "models are ${!models[*]}" >&2
    exit 1
  fi
  name=$(slug "$label")
  ref=$model-gb$batch
  compile "$name" "$model" "$batch" $flags
  compile "$ref" "$model" "$batch"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$gpus" \
    "$launcher" "$model" "$scaling" "$batch" "$name" "$ref" "$flags" \
    >>"$dest/layouts.tsv"
done <"$root/bench/scaling-layouts.txt"
[ "${REPORTS_ONLY:-0}" = 1 ] && exit 0
# The fault runs: tiny-gpt in bf16 without dropout, TP2 x DP2 (4 ranks; on
# 2 GPUs TP2), and one rank at the same global batch, which resumes the
# 4-rank run's checkpoint (a reshard to another GPU count).
tiny=("$compile" "$root/models/tiny-gpt.yaml" --bf16 --hidden-dropout=0
  --attention-dropout=0 --micro-batch-size=4 --global-batch-size=8)
"${tiny[@]}" -o "$dest/fault-one-gpu.mtb"
"${tiny[@]}" --tensor-model-parallel-size=2 -o "$dest/fault-tp2.mtb"
"${tiny[@]}" --tensor-model-parallel-size=2 --data-parallel-size=2 \
  -o "$dest/fault-tp2-dp2.mtb"
