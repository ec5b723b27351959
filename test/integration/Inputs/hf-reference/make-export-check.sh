#!/usr/bin/env bash
# Prepares check-export.py's input: export-hf directories of the four
# hf-reference models (imported) and of a trained tiny GPT-2 and tiny Llama,
# each with a token batch and mtrt-run's predict_step logits on it.
# Usage: make-export-check.sh BIN_DIR OUT_ROOT   (then, where transformers
# is: check-export.py OUT_ROOT)
set -euo pipefail
bin=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../../.." && pwd)
mkdir -p "$out"
work=$(mktemp -d)
for m in llama31 qwen2 qwen3 llama-yarn; do
  d=$out/$m
  mkdir -p "$d"
  "$bin/megatron-compile" "$here/$m/config.json" --seq-length 16 --micro-batch-size 2 -o "$work/$m.mtb"
  "$bin/megatron-checkpoint" import-hf "$here/$m/model.safetensors" --bundle "$work/$m.mtb" -o "$work/$m-ckpt" > /dev/null
  "$bin/megatron-checkpoint" export-hf "$work/$m-ckpt" -o "$d/hf"
  head -1 "$here/$m/batch.txt" > "$d/tokens.txt"
  echo 2 > "$d/batch.txt"
  "$bin/mtrt-run" "$work/$m.mtb" --function predict_step --init-from "$d/hf/model.safetensors" --inputs "$d/tokens.txt" > "$d/predict.txt"
done
for m in tiny-gpt tiny-llama; do
  d=$out/$m
  mkdir -p "$d"
  "$bin/megatron-compile" "$src/models/$m.yaml" --micro-batch-size 1 --global-batch-size 1 -o "$work/$m.mtb"
  "$bin/megatron-train" "$work/$m.mtb" --data-path "$src/data/corpus.txt" --train-iters 5 --lr 3e-3 --eval-interval 0 --no-progress-bar --save "$work/$m-ckpt" > /dev/null
  "$bin/megatron-checkpoint" export-hf "$work/$m-ckpt" -o "$d/hf"
  python3 -c "import random; r = random.Random(7); print(' '.join(str(r.randrange(256)) for _ in range(128)))" > "$d/tokens.txt"
  echo 1 > "$d/batch.txt"
  "$bin/mtrt-run" "$work/$m.mtb" --function predict_step --init-from "$d/hf/model.safetensors" --inputs "$d/tokens.txt" > "$d/predict.txt"
done
rm -rf "$work"
