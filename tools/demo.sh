#!/usr/bin/env bash
# The main job: installs what is missing, builds, compiles the bundled tiny GPT
# (models/tiny-gpt.yaml, with the 2,022 tokens of the bundled BPE tokenizer
# data/tokenizer, micro-batch 4, without dropout) into a training bundle and
# trains it on the bundled corpus (data/corpus.txt, public-domain text). The
# corpus's paragraphs become the documents of an indexed dataset
# (megatron-preprocess), so that every epoch cuts its samples at other places,
# as Megatron-LM's GPTDataset does. Then it prints a sample drawn with
# temperature and top-k, and where the loss plot is. On a machine with an
# NVIDIA GPU (nvidia-smi finds one) and the CUDA toolkit it builds the CUDA
# backend and trains on the GPU; otherwise on the CPU. ITERS=N changes the
# length of the run.
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
  iters=${ITERS:-1400}
fi

bundle="$build/tiny-gpt.mtb"
plots="$build/demo-plots"
data="$build/demo-data"
tokenizer=(--tokenizer-type HuggingFaceTokenizer
  --tokenizer-model "$root/data/tokenizer")
# The model's vocabulary is the tokenizer's; dropout only slows a model this
# small on a corpus this small; 4 samples a step learn more in the same time
# than 8.
model=("$root/models/tiny-gpt.yaml" --vocab-size 2022 --hidden-dropout 0
  --attention-dropout 0 --micro-batch-size 4 --global-batch-size 4)
echo
echo "== megatron-preprocess: the paragraphs of data/corpus.txt as documents"
mkdir -p "$data"
python3 "$root/tools/paragraphs-to-jsonl.py" "$root/data/corpus.txt" \
  "$data/corpus.jsonl"
# The demo's own files, remade from the repository's corpus each run.
"$build/bin/megatron-preprocess" --input "$data/corpus.jsonl" \
  --output-prefix "$data/corpus" "${tokenizer[@]}" --append-eod --force
echo
echo "== megatron-compile models/tiny-gpt.yaml -o $bundle"
"$build/bin/megatron-compile" "${model[@]}" --report params
"$build/bin/megatron-compile" "${model[@]}" -o "$bundle"
echo
echo "== megatron-train: $iters iterations (--backend $backend)"
mkdir -p "$plots"
"$build/bin/megatron-train" "$bundle" --backend "$backend" \
  --data-path "$data/corpus_text_document" "${tokenizer[@]}" \
  --train-iters "$iters" --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine \
  --lr-warmup-iters 30 --log-interval 100 --eval-interval "$iters" \
  --eval-iters 4 --seed 1234 --plot-dir "$plots" \
  --sample-tokens 100 --sample-prompt "The" --temperature 0.5 --top-k 4
echo
echo "loss plot: $plots/loss.png"
