#!/usr/bin/env bash
# The main job: installs what is missing, builds, compiles the bundled tiny GPT
# (models/tiny-gpt.yaml) into a training bundle and trains it on the bundled
# corpus (data/corpus.txt, public-domain text, one token per byte), then prints
# a greedy sample. It trains on the CPU (the host backend); the CUDA backend
# does not exist yet. ITERS=N changes the length of the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
iters=${ITERS:-600}

"$root/tools/setup.sh"
"$root/tools/build.sh"

bundle="$build/tiny-gpt.mtb"
echo
echo "== megatron-compile models/tiny-gpt.yaml -o $bundle"
"$build/bin/megatron-compile" "$root/models/tiny-gpt.yaml" --report params
"$build/bin/megatron-compile" "$root/models/tiny-gpt.yaml" -o "$bundle"
echo
echo "== megatron-train: $iters iterations on data/corpus.txt (CPU)"
"$build/bin/megatron-train" "$bundle" --data-path "$root/data/corpus.txt" \
  --train-iters "$iters" --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine \
  --lr-warmup-iters 30 --log-interval 50 --eval-interval 200 --eval-iters 4 \
  --seed 1234 --sample-tokens 200
