#!/bin/bash
# An interleaved A/B of megatron-train's step on the GPU machine (through
# the device tool): each bundle runs A (the default), B (with ALT_ENV set),
# A, B, ... so that the GPU's drift between runs falls on both sides
# (bench/NOTES.md, session 36: a change the step table, one run a side, read
# within its noise showed as 0.5-3.9 ms on every row this way).
#
# Usage: bench/run-step-ab.sh DIR OUT
#   DIR  the folder bench/make-step-dir.sh filled
#   OUT  gets step-ab.txt: per run the median step (ms, from iteration 4)
#        and the last loss, then per bundle the mean of each side
#   ALT_ENV (environment) NAME=VALUE words that make B
#   ALT_BIN (environment) a folder whose megatron-train makes B (a build of
#        a candidate change), with ALT_ENV or alone; one of the two is
#        required
#   BUNDLES (environment) default: every dropout-0.1 bundle of
#        DIR/models.txt (MODEL-mbMB-d0.1)
#   ROUNDS (environment) A/B pairs per bundle, default 2
#   ITERS (environment) iterations per run, default 12
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out"
if [ -z "${ALT_ENV:-}" ] && [ -z "${ALT_BIN:-}" ]; then
  echo "run-step-ab.sh: set ALT_ENV to the NAME=VALUE words of side B," \
    "or ALT_BIN to the folder of its megatron-train" >&2
  exit 2
fi
source "$(dirname "$0")/device-env.sh"
device_libraries "$dir"
report=$out/step-ab.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$report"
echo "B: ${ALT_ENV:-} ${ALT_BIN:+megatron-train of $ALT_BIN}" >>"$report"
bundles=${BUNDLES:-}
if [ -z "$bundles" ]; then
  for pair in $(cat "$dir/models.txt"); do
    bundles="$bundles ${pair%%:*}-mb${pair##*:}-d0.1"
  done
fi
logs=/tmp/step-ab-logs
rm -rf "$logs"
mkdir -p "$logs"

# NAME TAG BIN VAR=VALUE...: one run of bundle NAME by BIN's megatron-train
# with the variables set; its median step and last loss go to the report
# under TAG.
run() {
  local name=$1 tag=$2 bin=$3
  shift 3
  env "$@" timeout 150 "$bin/megatron-train" "$dir/bundles/$name.mtb" \
    --data-path "$dir/corpus.txt" --train-iters "${ITERS:-12}" --lr 1e-4 \
    --log-interval 1 --eval-iters 0 --eval-interval 0 --no-progress-bar \
    --clip-grad 1.0 --backend cuda --log-jsonl "$logs/$tag.jsonl" \
    >"$logs/$tag.log" 2>&1
  python3 - "$logs/$tag.jsonl" "$tag" >>"$report" 2>&1 <<'EOF'
import json, statistics, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
steps = [r["elapsed_ms"] for r in records if r.get("iteration", 0) >= 4]
print(sys.argv[2], round(statistics.median(steps), 2), "loss",
      records[-1].get("loss"))
EOF
}

for name in $bundles; do
  for round in $(seq "${ROUNDS:-2}"); do
    run "$name" "$name.A$round" "$dir/bin"
    # shellcheck disable=SC2086 # ALT_ENV is a list of NAME=VALUE words
    run "$name" "$name.B$round" "${ALT_BIN:-$dir/bin}" ${ALT_ENV:-}
  done
done
python3 - "$report" >/tmp/step-ab-means.txt <<'EOF'
import collections, re, sys
sides = collections.defaultdict(list)
for line in open(sys.argv[1]):
    run = re.match(r"(\S+)\.([AB])\d+ ([0-9.]+) ", line)
    if run:
        sides[(run.group(1), run.group(2))].append(float(run.group(3)))
for name in sorted({n for n, _ in sides}):
    a, b = sides.get((name, "A"), []), sides.get((name, "B"), [])
    if a and b:
        ma, mb = sum(a) / len(a), sum(b) / len(b)
        print(f"{name}: A {ma:.2f} ms, B {mb:.2f} ms, B - A {mb - ma:+.2f}")
EOF
cat /tmp/step-ab-means.txt >>"$report"
cat "$report"
