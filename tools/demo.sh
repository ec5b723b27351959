#!/usr/bin/env bash
# The main job: installs what is missing, builds, compiles the bundled tiny GPT
# (models/tiny-gpt.yaml) into a training bundle and trains it on the bundled
# corpus (data/corpus.txt, public-domain text, one token per byte), then prints
# a greedy sample. On a machine with an NVIDIA GPU (nvidia-smi finds one) and
# the CUDA toolkit it builds the CUDA backend and trains on the GPU; otherwise
# on the CPU. ITERS=N changes the length of the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

backend=host
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 &&
   [[ -x /usr/local/cuda/bin/nvcc ]]; then
  backend=cuda
fi

"$root/tools/setup.sh"
if [[ $backend == cuda ]]; then
  build=${BUILD_DIR:-$root/build-gpu}
  BUILD_DIR=$build "$root/tools/build.sh" -DMTRT_ENABLE_CUDA=ON \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    -DCMAKE_CUDA_ARCHITECTURES=native
  iters=${ITERS:-3000}
else
  build=${BUILD_DIR:-$root/build}
  BUILD_DIR=$build "$root/tools/build.sh"
  iters=${ITERS:-600}
fi

bundle="$build/tiny-gpt.mtb"
echo
echo "== megatron-compile models/tiny-gpt.yaml -o $bundle"
"$build/bin/megatron-compile" "$root/models/tiny-gpt.yaml" --report params
"$build/bin/megatron-compile" "$root/models/tiny-gpt.yaml" -o "$bundle"
echo
echo "== megatron-train: $iters iterations on data/corpus.txt (--backend $backend)"
"$build/bin/megatron-train" "$bundle" --backend "$backend" \
  --data-path "$root/data/corpus.txt" \
  --train-iters "$iters" --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine \
  --lr-warmup-iters 30 --log-interval 50 --eval-interval 200 --eval-iters 4 \
  --seed 1234 --sample-tokens 200
