#!/bin/bash
# Runs on the GPU machine (through the device tool) what the cuda backend is
# checked and measured by, in one call: the CUDA tests (parity with the host
# backend), megatron-train --backend cuda on tiny-gpt (and the same run on the
# host), and GPT-2 124M throughput against PyTorch eager at the same shapes.
#
# Usage, from the repository root: bench/run-device-checks.sh BUILD OUT
#   BUILD  a runtime build made with -DMTRT_ENABLE_CUDA=ON (bench/NOTES.md
#          says how), holding bundles/ (tiny-gpt.mtb, tiny-llama.mtb,
#          gpt2-124m-fp32-mb8.mtb) and, optionally, fallback-lib/ (shared
#          libraries the machine may lack)
#   OUT    where the logs go: summary.txt (the short version), tests.log,
#          tiny-gpt.log, tiny-gpt-host.log, bench.log, sanitizer.log (only
#          when a test failed)
#   CHECKS (environment) the parts to run, default "tests tiny gpt2 torch
#          host"
set -u
checks=" ${CHECKS:-tests tiny gpt2 torch host} "
want() { [[ "$checks" == *" $1 "* ]]; }
build=$(cd "$1" && pwd)
out=$2
summary=$out/summary.txt

# cuBLASLt and the CUDA runtime: the machine's toolkit or PyTorch's wheels.
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$build/lib:$libdirs${LD_LIBRARY_PATH:-}:$build/fallback-lib"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv
  echo "cuBLASLt from: $libdirs"
  ldd "$build/bin/megatron-train" | grep -E "not found|cublas|cudart|crypto"
} >"$summary" 2>&1

section() { echo; echo "== $* (at $(date -u +%T))"; } >>"$summary"

tests=0
export MTRT_CUDA_TEST_BUNDLES=$build/bundles
if want tests; then
section "mtrt-cuda-tests"
timeout 150 "$build/bin/mtrt-cuda-tests" >"$out/tests.log" 2>&1
tests=$?
echo "exit status $tests" >>"$summary"
grep -E "^\[ parity|^\[  (PASSED|FAILED|SKIPPED) |^\[==" "$out/tests.log" \
  | head -60 >>"$summary"
fi

tiny=("$build/bin/megatron-train" "$build/bundles/tiny-gpt.mtb"
  --data-path data/corpus.txt --train-iters 300 --lr 1e-3
  --lr-decay-style cosine --lr-warmup-iters 20 --log-interval 50
  --eval-interval 100 --eval-iters 5 --sample-tokens 120 --no-progress-bar)
if want tiny; then
section "megatron-train --backend cuda, tiny-gpt, 300 iterations"
timeout 60 "${tiny[@]}" --backend cuda >"$out/tiny-gpt.log" 2>&1
echo "exit status $?" >>"$summary"
grep -E "iteration +(50|100|200|300)/|validation loss|error" "$out/tiny-gpt.log" \
  | cut -c1-200 >>"$summary"
fi

gpt2=$build/bundles/gpt2-124m-fp32-mb8.mtb
: >"$out/bench.log"
: >/tmp/torch.jsonl
if want gpt2; then
section "GPT-2 124M, fp32, micro-batch 8, seq 1024: megatron-train --backend cuda"
for tf32 in 0 1; do
  MTRT_CUDA_TF32=$tf32 timeout 75 "$build/bin/megatron-train" "$gpt2" \
    --data-path data/corpus.txt --train-iters 20 --lr 6e-4 \
    --lr-warmup-iters 5 --log-interval 5 --eval-iters 0 --no-progress-bar \
    --backend cuda \
    --log-jsonl "/tmp/mtrt-tf32-$tf32.jsonl" >"/tmp/mtrt-tf32-$tf32.log" 2>&1
  echo "megatron-train TF32=$tf32: exit status $?" >>"$summary"
  { echo "== megatron-train, MTRT_CUDA_TF32=$tf32"; cat "/tmp/mtrt-tf32-$tf32.log"
    cat "/tmp/mtrt-tf32-$tf32.jsonl"; } >>"$out/bench.log"
done
# Where the time goes: train_step timed per op with CUDA events.
MTRT_CUDA_PROFILE=1 timeout 60 "$build/bin/megatron-train" "$gpt2" \
  --data-path data/corpus.txt --train-iters 4 --lr 6e-4 --log-interval 1 \
  --eval-iters 0 --no-progress-bar --backend cuda >/tmp/mtrt-profile.log 2>&1
echo "profiled run (TF32 off): exit status $?" >>"$summary"
sed -n '/^train_step:/,$p' /tmp/mtrt-profile.log >>"$summary"
{ echo "== megatron-train, MTRT_CUDA_PROFILE=1"; cat /tmp/mtrt-profile.log; } \
  >>"$out/bench.log"
fi

if want torch; then
section "GPT-2 124M in PyTorch eager at the same shapes"
for variant in "--tf32 0 --attention sdpa" "--tf32 1 --attention sdpa" \
  "--tf32 0 --attention math"; do
  # shellcheck disable=SC2086
  timeout 60 python3 bench/torch_gpt2.py --micro-batch-size 8 $variant \
    >>/tmp/torch.jsonl 2>>"$out/bench.log"
  echo "torch $variant: exit status $?" >>"$summary"
done
{ echo "== torch"; cat /tmp/torch.jsonl; } >>"$out/bench.log"
fi
python3 bench/summarize.py \
  --mtrt "mtrt cuda, fp32 (TF32 off)=/tmp/mtrt-tf32-0.jsonl:/tmp/mtrt-tf32-0.log" \
  --mtrt "mtrt cuda, TF32 on=/tmp/mtrt-tf32-1.jsonl:/tmp/mtrt-tf32-1.log" \
  --torch /tmp/torch.jsonl >>"$summary" 2>&1

if want host; then
section "megatron-train --backend host, tiny-gpt, 300 iterations (the reference)"
timeout 60 "${tiny[@]}" --backend host >"$out/tiny-gpt-host.log" 2>&1
echo "exit status $?" >>"$summary"
grep -E "iteration +(50|100|200|300)/|validation loss|error" "$out/tiny-gpt-host.log" \
  | cut -c1-200 >>"$summary"
fi

if [ "$tests" -ne 0 ]; then
  section "failed tests again, synchronizing after each instruction, under memcheck"
  MTRT_CUDA_SYNC=1 timeout 60 compute-sanitizer --tool memcheck \
    "$build/bin/mtrt-cuda-tests" --gtest_filter='CudaOps*:CudaExecutor*' \
    >"$out/sanitizer.log" 2>&1
  echo "exit status $?" >>"$summary"
  grep -E "FAILED|ERROR SUMMARY|Invalid" "$out/sanitizer.log" | head -20 >>"$summary"
fi
cat "$summary"
