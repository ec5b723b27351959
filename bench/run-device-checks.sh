#!/bin/bash
# Runs on the GPU machine (through the device tool) what the cuda backend is
# checked and measured by, in one call: the CUDA tests (parity with the host
# backend, fp32 and bf16), megatron-train --backend cuda on tiny-gpt, and the
# compiled step's throughput for gpt2-124m, gpt2-350m and gpt-1.3b beside
# PyTorch (bench/torch_step.py: eager and torch.compile, bf16 autocast) at
# the same shapes.
#
# Usage: bench/run-device-checks.sh DIR OUT
#   DIR    a folder holding bin/ (megatron-train, mtrt-cuda-tests from a
#          runtime build with -DMTRT_ENABLE_CUDA=ON), lib/, bundles/ (see
#          bench/NOTES.md), optionally fallback-lib/ (shared libraries the
#          machine may lack), bench/ (torch_step.py, modelfile.py,
#          summarize.py), models/ and corpus.txt; bench/make-device-dir.sh
#          makes it
#   OUT    where the logs go: summary.txt (the short version), tests.log,
#          bench.log, profile.log, and the timed runs' JSON lines
#          (mtrt-MODEL.jsonl, torch.jsonl)
#   CHECKS (environment) the parts to run, default
#          "env tests tiny mtrt profile torch"
#   MODELS (environment) default "gpt2-124m gpt2-350m gpt-1.3b"; the bundle
#          of each is bundles/MODEL-bf16-mbMB.mtb with MB from MICRO_BATCH
#          ("gpt2-124m:32 gpt2-350m:32 gpt-1.3b:8", DESIGN.md's batches)
#   VARIANTS (environment) bundle variants to time beside the default one:
#          each V runs bundles/MODEL-bf16-mbMB-V.mtb too (make-device-dir.sh
#          UNFUSED=1 makes "unfused": without GEMM epilogues; it always
#          makes "fused": with the generated elementwise kernels,
#          --fuse-kernels); default "fused" (when its bundle exists); the
#          profile part profiles gpt2-124m's variants too
#   TESTS_LIMIT (environment) seconds for mtrt-cuda-tests, default 240
#   ITERS  (environment) megatron-train iterations per timed run, default 15
#          (10 for gpt-1.3b); the median skips the first 5
#   TORCH  (environment) the PyTorch variants (torch_step.py --compile),
#          default "eager blocks"
#   TORCH_MODELS (environment) the models PyTorch runs, default MODELS
set -u
checks=" ${CHECKS:-env tests tiny mtrt profile torch} "
want() { [[ "$checks" == *" $1 "* ]]; }
dir=$(cd "$1" && pwd)
out=$2
models=${MODELS:-gpt2-124m gpt2-350m gpt-1.3b}
declare -A batch
for pair in ${MICRO_BATCH:-gpt2-124m:32 gpt2-350m:32 gpt-1.3b:8}; do
  batch[${pair%%:*}]=${pair##*:}
done
summary=$out/summary.txt
corpus=$dir/corpus.txt

# cuBLASLt, the CUDA runtime, cuDNN and NVRTC (which cuDNN's attention
# engines compile with): the machine's toolkit or PyTorch's wheels (cuDNN
# 9.19, found before the system's 9.14).
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
# NCCL (loaded at run time by the NCCL communicator's tests): PyTorch's wheel.
libdirs+=$(find /usr/local /opt -name 'libnccl.so.2*' 2>/dev/null |
  xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$dir/lib:$libdirs${LD_LIBRARY_PATH:-}:$dir/fallback-lib"
section() { echo; echo "== $* (at $(date -u +%T))"; } >>"$summary"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv
  echo "cuBLASLt from: $libdirs"
  ldd "$dir/bin/megatron-train" | grep -E "not found|cublas|cudart|crypto"
} >"$summary" 2>&1
if want env; then
  section "cuDNN on this machine"
  find / -xdev -name 'libcudnn*.so*' 2>/dev/null | head -20 >>"$summary"
fi

tests=0
export MTRT_CUDA_TEST_BUNDLES=$dir/bundles
if want tests; then
  section "mtrt-cuda-tests"
  timeout "${TESTS_LIMIT:-240}" "$dir/bin/mtrt-cuda-tests" >"$out/tests.log" 2>&1
  tests=$?
  echo "exit status $tests" >>"$summary"
  grep -E "^\[ epilogue|^\[ parity|^\[  (PASSED|FAILED|SKIPPED) |^\[==|Failure|relative diff|cosine|iteration" \
    "$out/tests.log" | head -80 >>"$summary"
fi

if want tiny; then
  section "megatron-train --backend cuda, tiny-gpt bf16, 300 iterations"
  timeout 60 "$dir/bin/megatron-train" "$dir/bundles/tiny-gpt-bf16.mtb" \
    --data-path "$corpus" --train-iters 300 --lr 1e-3 \
    --lr-decay-style cosine --lr-warmup-iters 20 --log-interval 100 \
    --eval-interval 300 --eval-iters 5 --sample-tokens 60 --no-progress-bar \
    --backend cuda >"$out/tiny.log" 2>&1
  echo "exit status $?" >>"$summary"
  grep -E "iteration +(100|200|300)/|validation loss|rror" "$out/tiny.log" \
    | cut -c1-160 >>"$summary"
fi

# Runs megatron-train on MODEL's bundle for ITERS iterations, sampling the
# device's memory in use; its log under /tmp/mtrt-MODEL.log, its
# per-iteration JSON lines in OUT (kept when a timeout cuts the script
# short, as PyTorch's torch.jsonl is).
run_mtrt() {
  local model=$1 iters=$2 mb=${batch[$1]} variant=${3:-}
  local bundle=$dir/bundles/$model-bf16-mb$mb${variant:+-$variant}.mtb
  local tag=$model${variant:+-$variant}
  (while sleep 0.5; do
     nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits
   done) >"/tmp/mem-$tag.txt" 2>/dev/null &
  local sampler=$!
  timeout 150 "$dir/bin/megatron-train" "$bundle" --data-path "$corpus" \
    --train-iters "$iters" --lr 6e-4 --lr-warmup-iters 5 --log-interval 1 \
    --eval-iters 0 --no-progress-bar --backend cuda \
    --log-jsonl "$out/mtrt-$tag.jsonl" >"/tmp/mtrt-$tag.log" 2>&1
  local status=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  sort -n "/tmp/mem-$tag.txt" | tail -1 >"/tmp/peak-$tag.txt"
  echo "megatron-train $tag mb $mb: exit status $status, peak $(cat "/tmp/peak-$tag.txt") MiB" >>"$summary"
  { echo "== megatron-train $tag mb $mb"; tail -5 "/tmp/mtrt-$tag.log"; } >>"$out/bench.log"
}

: >"$out/bench.log"
: >"$out/torch.jsonl"
specs=()
if want mtrt; then
  section "megatron-train --backend cuda, bf16 bundles"
  for model in $models; do
    iters=${ITERS:-15}
    [ "$model" = gpt-1.3b ] && iters=$(( ${ITERS:-15} * 2 / 3 ))
    for variant in "" ${VARIANTS-fused}; do
      tag=$model${variant:+-$variant}
      [ -f "$dir/bundles/$model-bf16-mb${batch[$model]}${variant:+-$variant}.mtb" ] || continue
      run_mtrt "$model" "$iters" "$variant"
      specs+=(--mtrt "$model,${batch[$model]},mtrt cuda bf16${variant:+ $variant}=$out/mtrt-$tag.jsonl:/tmp/mtrt-$tag.log:/tmp/peak-$tag.txt")
    done
  done
fi

if want profile; then
  # The same step without attention dropout (bundle made by
  # bench/make-device-dir.sh) shows what the dropout masks cost.
  for variant in "" -nodrop $(for v in ${VARIANTS-fused}; do echo "-$v"; done); do
    model=gpt2-124m
    bundle=$dir/bundles/$model-bf16-mb${batch[$model]}$variant.mtb
    [ -f "$bundle" ] || continue
    section "where the time goes: $model$variant train_step per op (CUDA events)"
    MTRT_CUDA_PROFILE=1 timeout 90 "$dir/bin/megatron-train" "$bundle" \
      --data-path "$corpus" --train-iters 4 --lr 6e-4 --log-interval 1 \
      --eval-iters 0 --no-progress-bar --backend cuda \
      >"$out/profile$variant.log" 2>&1
    echo "exit status $?" >>"$summary"
    sed -n '/^train_step:/,$p' "$out/profile$variant.log" | head -30 >>"$summary"
  done
fi

if want torch; then
  section "PyTorch at the same shapes (bench/torch_step.py, the model file's dropout)"
  for model in ${TORCH_MODELS:-$models}; do
    for variant in ${TORCH:-eager blocks}; do
      dropout=$(python3 -c "import sys; sys.path.insert(0, '$dir/bench')
import modelfile; print(modelfile.load('$dir/models/$model.yaml')['hidden_dropout'])")
      PYTHONUNBUFFERED=1 timeout 240 python3 "$dir/bench/torch_step.py" \
        "$dir/models/$model.yaml" --micro-batch-size "${batch[$model]}" \
        --dropout "$dropout" --compile "$variant" \
        >>"$out/torch.jsonl" 2>>"$out/bench.log"
      echo "torch $model $variant: exit status $?" >>"$summary"
    done
  done
  { echo "== torch"; cat "$out/torch.jsonl"; } >>"$out/bench.log"
fi

section "throughput (tokens/s: median after 5 warm-up steps)"
python3 "$dir/bench/summarize.py" "${specs[@]}" --torch "$out/torch.jsonl" \
  >>"$summary" 2>&1

if [ "$tests" -ne 0 ]; then
  section "failed tests again, synchronizing after each instruction, under memcheck"
  MTRT_CUDA_SYNC=1 timeout 90 compute-sanitizer --tool memcheck \
    "$dir/bin/mtrt-cuda-tests" --gtest_filter='CudaOps*Bf16*' \
    >"$out/sanitizer.log" 2>&1
  echo "exit status $?" >>"$summary"
  grep -E "FAILED|ERROR SUMMARY|Invalid" "$out/sanitizer.log" | head -20 >>"$summary"
fi
cat "$summary"
