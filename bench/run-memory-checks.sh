#!/bin/bash
# Runs on the GPU machine (through the device tool) the memory acceptance of
# issue 8: for every bundle that bench/make-memory-dir.sh compiled, trains a
# few iterations with the CUDA backend, sampling the device's memory in use,
# and compares with the compiler's --report memory:
#   - the arena megatron-train allocates (its "arena N MiB" line: the
#     values and the side buffers at the plan's offsets) against the
#     report's activations (the plan's arena);
#   - the peak memory in use (nvidia-smi, what cudaMemGetInfo reports as
#     total - free) minus what was in use before and minus the CUDA context
#     (tiny-gpt's peak minus its own reported total) against the report's
#     total;
#   - the step time (the mean of iterations 3 and later), so that the
#     automatic policy can be held against full recomputation.
# memory_table.py prints the table and the verdicts (within 3%; automatic
# fits and is no slower than full uniform 1). When DIR has mtrt-cuda-tests
# (make-memory-dir.sh copies it with its bundles), the CUDA tests run first:
# parity with the host backend with every arena laid out by the compiler.
#
# Usage, from the carried folder's parent or anywhere:
#   bench/run-memory-checks.sh DIR OUT
#   DIR  the folder bench/make-memory-dir.sh filled
#   OUT  where the logs go: memory-summary.txt, and per bundle NAME.log,
#        NAME.jsonl, NAME.mem (samples in MiB)
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
summary=$out/memory-summary.txt
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="$dir/lib:$libdirs${LD_LIBRARY_PATH:-}:$dir/fallback-lib"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
} >"$summary" 2>&1

if [ -x "$dir/bin/mtrt-cuda-tests" ]; then
  MTRT_CUDA_TEST_BUNDLES=$dir/test-bundles timeout 120 \
    "$dir/bin/mtrt-cuda-tests" >"$out/tests.log" 2>&1
  echo "mtrt-cuda-tests: exit status $?" >>"$summary"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|Failure|FAILED_PRECONDITION" \
    "$out/tests.log" | head -40 >>"$summary"
fi

used() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1
}

# NAME ITERS: trains bundles/NAME.mtb, sampling memory every 100 ms.
run() {
  local name=$1 iters=$2
  local before
  before=$(used)
  (while sleep 0.1; do used; done) >"$out/$name.mem" 2>/dev/null &
  local sampler=$!
  timeout 60 "$dir/bin/megatron-train" "$dir/bundles/$name.mtb" \
    --data-path "$dir/corpus.txt" --train-iters "$iters" --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --eval-interval 0 --no-progress-bar \
    --backend cuda --log-jsonl "$out/$name.jsonl" >"$out/$name.log" 2>&1
  local status=$?
  kill "$sampler" 2>/dev/null
  wait "$sampler" 2>/dev/null
  echo "$name: exit status $status, in use before $before MiB" >>"$summary"
  echo "$before" >"$out/$name.before"
}

run tiny-gpt 5
for report in "$dir"/bundles/*.memory.txt; do
  name=$(basename "$report" .memory.txt)
  [ "$name" = tiny-gpt ] && continue
  run "$name" 8
done
python3 "$dir/bench/memory_table.py" "$dir/bundles" "$out" >>"$summary" 2>&1
cat "$summary"
