#!/bin/bash
# Runs on the GPU machine (issue 28): for each configuration of
# planner-configs.txt, megatron-train's step (the median of elapsed_ms from
# iteration 4 on, CUDA graphs on), then, per model and micro-batch, one run
# with MTRT_CUDA_PROFILE_INSTRUCTIONS=1 whose `calibration:` lines are the
# kernel times bench/make-calibration.py turns into
# data/calibration-h200.json.
#
# Usage: bench/run-planner-check.sh DIR OUT
#   OUT gets steps.txt (NAME MS), calibration.txt and logs.tgz
#   ITERS (environment) timed iterations, default 8; LIMIT seconds after
#   which no run starts, default 240
set -u
dir=$(cd "$1" && pwd)
out=$2
logs=/tmp/planner-logs
rm -rf "$logs"
mkdir -p "$out" "$logs"
start=$(date +%s)
limit=${LIMIT:-240}
time_left() { (($(date +%s) - start < limit)); }
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
mkdir -p /tmp/fallback-lib
tar -C /tmp/fallback-lib -xzf "$dir/fallback-lib.tgz"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:-}:/tmp/fallback-lib"
nvidia-smi --query-gpu=name,driver_version --format=csv >"$out/env.txt" 2>&1
train() { # NAME ITERS [ENV...]
  local name=$1 iters=$2
  shift 2
  env "$@" timeout 120 "$dir/bin/megatron-train" "$dir/bundles/$name.mtb" \
    --data-path "$dir/corpus.txt" --train-iters "$iters" --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --eval-interval 0 --no-progress-bar \
    --backend cuda --log-jsonl "$logs/$name.$iters.jsonl" \
    >"$logs/$name.$iters.log" 2>&1
}
configs=$(grep -v '^#' "$dir/bench/planner-configs.txt" | awk 'NF == 5')
iters=${ITERS:-8}
: >"$out/steps.txt"
while read -r name model global mb recompute; do
  time_left || break
  train "$name" "$iters"
  python3 - "$logs/$name.$iters.jsonl" "$name" >>"$out/steps.txt" <<'PY'
import json, statistics, sys
records = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
steps = [r["elapsed_ms"] for r in records
         if r.get("iteration", 0) >= 4 and "elapsed_ms" in r]
print(sys.argv[2], f"{statistics.median(steps):.2f}" if steps else "failed")
PY
done <<<"$configs"
# The kernel times: one profiled run per model and micro-batch (recomputation
# only repeats forward kernels of the same shapes).
: >"$out/calibration.txt"
seen=""
while read -r name model global mb recompute; do
  key="$model-$mb"
  case " $seen " in *" $key "*) continue ;; esac
  seen="$seen $key"
  time_left || break
  train "$name" 3 MTRT_CUDA_PROFILE_INSTRUCTIONS=1
  grep '^calibration: ' "$logs/$name.3.log" >>"$out/calibration.txt"
done <<<"$configs"
tar -C "$logs" -czf "$out/logs.tgz" .
echo "done at $(($(date +%s) - start)) s" >>"$out/steps.txt"
