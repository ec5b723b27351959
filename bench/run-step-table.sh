#!/bin/bash
# Runs on the GPU machine (through the device tool), in one call, the step
# and memory comparison of issues 21 and 22, then writes the table
# (bench/step_table.py):
#   1. tiny-gpt, whose peak minus its reported total is the CUDA context;
#   2. megatron-train --backend cuda on every bundle NAME = MODEL-mbMB-dD
#      that bench/make-step-dir.sh compiled for MODELS, sampling nvidia-smi's
#      memory in use every 100 ms;
#   3. the largest micro-batch without recomputation, for each model with
#      search candidates (MODEL-mbMB-d0 beyond MODELS' micro-batch): from
#      the largest candidate whose --report memory total fits the device,
#      upwards while a run succeeds, else downwards until one does;
#   4. bench/torch_step.py (torch.compile, fused AdamW, the fastest SDPA
#      backend) at each MODELS shape, dropout 0 and 0.1, one process a model;
#   5. torch_step.py --llama hf (Hugging Face's LlamaForCausalLM) at each
#      Llama shape, dropout 0;
#   6. when time is left, torch_step.py --compile model (the whole model one
#      graph) at the first MODELS shape, a check of its default regional
#      compile.
# Everything is written as it comes, so a run cut short by the call's limit
# still leaves a table of what finished.
#
# Usage: bench/run-step-table.sh DIR OUT
#   DIR  the folder bench/make-step-dir.sh filled
#   OUT  gets step-table.md, step-table.json, summary.txt and logs.tgz (the
#        runs' logs, JSON lines and memory samples)
#   ITERS (environment) megatron-train iterations per timed run, default 10;
#        the step time is the median from iteration 4 on
#   MODELS (environment) default: the ones bench/make-step-dir.sh compiled
#        (DIR/models.txt)
#   LIMIT (environment) seconds after which no further run starts, default
#        480; a PyTorch run is stopped 60 s after it
#   CLIP (environment) the global gradient-norm clipping of both sides
#        (megatron-train --clip-grad, torch_step.py --clip-grad), default
#        1.0, megatron-train's and Megatron-LM's; 0 turns it off on both
#   TORCH_FLAGS (environment) more torch_step.py flags for the PyTorch runs
#        of step 4, e.g. "--steps 6 --warmup 2" (with the SDPA backend given,
#        cudnn, cudnn+gqa at the Llama, a model's two runs took 40 s at
#        gpt2-350m and 69 s at llama-1.5b, compile included: bench/NOTES.md,
#        session 21)
#   ALT_ENV (environment) variables, e.g. "MTRT_CUDA_HOPPER_PINGPONG=0":
#        megatron-train runs each dropout-0.1 bundle a second time with them
#        set (logs NAME.alt.*, after all of ours' runs, before PyTorch's),
#        and the table gives that step time beside ours
#   ALT_BIN (environment) another megatron-train (another build) for those
#        second runs, with or without ALT_ENV
#   SEARCH_RUNS (environment) 0 skips step 3 (the search of bundles that
#        make-step-dir.sh's SEARCH compiled)
#   TORCH_CACHE (environment) torch.compile's caches (Inductor's and
#        Triton's), default /tmp/torch-compile-cache: outside DIR, which the
#        device tool replaces each call, so a second call on a machine still
#        warm compiles from them
set -u
dir=$(cd "$1" && pwd)
out=$2
logs=/tmp/step-table-logs
rm -rf "$logs"
mkdir -p "$out" "$logs"
start=$(date +%s)
limit=${LIMIT:-480}
time_left() { (($(date +%s) - start < limit)); }
summary=$out/summary.txt
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
cache=${TORCH_CACHE:-/tmp/torch-compile-cache}
export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
mkdir -p "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__)'
} >"$summary" 2>&1

used() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1
}
# The memory in use (MiB), the SM clock (MHz) and the power drawn (W).
state() {
  nvidia-smi --query-gpu=memory.used,clocks.sm,power.draw \
    --format=csv,noheader,nounits | head -1
}
# TAG COMMAND...: runs COMMAND, sampling state every 100 ms into LOGS/TAG.mem;
# TAG.before holds the memory in use before, TAG.status the exit status.
sampled() {
  local tag=$1
  shift
  used >"$logs/$tag.before"
  (while sleep 0.1; do state; done) >"$logs/$tag.mem" 2>/dev/null &
  local sampler=$!
  "$@"
  local status=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  echo "$status" >"$logs/$tag.status"
  echo "$tag: exit status $status at $(($(date +%s) - start)) s" >>"$summary"
  return $status
}
# NAME ITERS [TAG [VAR=VALUE...]]: megatron-train on bundles/NAME.mtb with
# the variables set, its logs under TAG (default NAME).
train() {
  local name=$1 iters=$2 tag=${3:-$1}
  shift $(($# < 3 ? $# : 3))
  sampled "$tag" env "$@" timeout 120 "${train_bin:-$dir/bin/megatron-train}" \
    "$dir/bundles/$name.mtb" --data-path "$dir/corpus.txt" \
    --train-iters "$iters" --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --eval-interval 0 --no-progress-bar --clip-grad "$clip" --backend cuda \
    --log-jsonl "$logs/$tag.jsonl" >"$logs/$tag.log" 2>&1
}
table() {
  python3 "$dir/bench/step_table.py" "$dir" "$logs" "$out" >>"$summary" 2>&1
  tar -C "$logs" -czf "$out/logs.tgz" .
}

iters=${ITERS:-10}
clip=${CLIP:-1.0}
train tiny-gpt 5
declare -A base
models=()
for pair in ${MODELS:-$(cat "$dir/models.txt")}; do
  models+=("${pair%%:*}")
  base[${pair%%:*}]=${pair##*:}
done
for model in "${models[@]}"; do
  for dropout in 0 0.1; do
    time_left && train "$model-mb${base[$model]}-d$dropout" "$iters"
  done
done
if [ -n "${ALT_ENV:-}${ALT_BIN:-}" ]; then
  echo "ALT_ENV: ${ALT_ENV:-}; ALT_BIN: ${ALT_BIN:-}" >>"$summary"
  for model in "${models[@]}"; do
    name=$model-mb${base[$model]}-d0.1
    time_left && train_bin=${ALT_BIN:-} train "$name" "$iters" "$name.alt" \
      ${ALT_ENV:-}
  done
fi
table

# The search: step_table.py orders the candidates and picks the first, the
# largest that its reported total, scaled by the measured/reported ratio of
# the model's dropout-0 run above, says fits.
for model in "${models[@]}"; do
  [ "${SEARCH_RUNS:-1}" = 0 ] && break
  plan=$(python3 "$dir/bench/step_table.py" "$dir" "$logs" --search-start \
    "$model-mb${base[$model]}-d0")
  mbs=($(echo "$plan" | head -1))
  i=$(echo "$plan" | tail -1)
  ((${#mbs[@]})) || continue
  echo "$model search: candidates ${mbs[*]}, first ${mbs[$i]}" >>"$summary"
  if time_left && train "$model-mb${mbs[$i]}-d0" 6; then
    while ((i + 1 < ${#mbs[@]})) && time_left &&
      train "$model-mb${mbs[$((i + 1))]}-d0" 6; do
      i=$((i + 1))
    done
  else
    while ((i > 0)) && time_left; do
      i=$((i - 1))
      train "$model-mb${mbs[$i]}-d0" 6 && break
    done
  fi
done
table

for model in "${models[@]}"; do
  time_left || break
  sampled "torch-$model" timeout $((limit + 60 - $(date +%s) + start)) python3 "$dir/bench/torch_step.py" \
    "$dir/models/$model.yaml" --micro-batch-size "${base[$model]}" \
    --dropout 0 0.1 --clip-grad "$clip" ${TORCH_FLAGS:-} \
    >"$logs/torch-$model.jsonl" \
    2>"$logs/torch-$model.log"
  table
done
# Hugging Face's Llama (the second baseline of issue 22) at each Llama
# shape, dropout 0.
for model in "${models[@]}"; do
  grep -q "position_embedding_type: rope" "$dir/models/$model.yaml" || continue
  time_left || break
  sampled "torch-hf-$model" timeout $((limit + 60 - $(date +%s) + start)) \
    python3 "$dir/bench/torch_step.py" "$dir/models/$model.yaml" --llama hf \
    --micro-batch-size "${base[$model]}" --dropout 0 --clip-grad "$clip" \
    >"$logs/torch-hf-$model.jsonl" 2>"$logs/torch-hf-$model.log"
  table
done
# A check of the regional compile (torch_step.py's default) against the
# whole model as one graph, at the smallest shape, when time is left.
model=${models[0]}
if time_left; then
  sampled "torch-check-$model" \
    timeout $((limit + 60 - $(date +%s) + start)) python3 \
    "$dir/bench/torch_step.py" "$dir/models/$model.yaml" --compile model \
    --micro-batch-size "${base[$model]}" --dropout 0 0.1 --clip-grad "$clip" \
    >"$logs/torch-check-$model.jsonl" 2>"$logs/torch-check-$model.log"
  table
fi
cat "$summary"
