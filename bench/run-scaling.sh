#!/bin/bash
# Issue 29's multi-GPU runs, one process per GPU over NCCL: every layout of
# bench/scaling-layouts.txt that fits the machine's GPUs against the same
# model on one GPU (the same global batch, the same iterations), the
# compiler's predicted step beside the measured one, and the fault runs (a
# rank killed mid-step, a rank that hangs, a checkpoint resumed on another
# GPU count).
#
# Made here (no GPU needed):
#   bench/make-device-dir.sh build build/bin/megatron-compile DEST  (SCALING=1
#   adds DEST/scaling: bench/compile-scaling-bundles.sh's bundles and
#   predictions; OPENMPI=1 adds an Open MPI mpirun)
# then on the machine with the GPUs, from the repository's root:
#   bench/run-scaling.sh DEST OUT
# OUT gets scaling.txt (the table, the acceptance lines, the fault runs) and
# scaling/ (every run's log).
# Environment:
#   LAYOUTS    an extended regular expression: only the layouts whose label
#              matches it run (default: all that fit)
#   ITERS      iterations of every run (20); LR, WARMUP: peak learning rate
#              (1e-4) after linear warm-up iterations (10)
#   RUN_LIMIT  seconds a run may take (240)
#   FAULTS=0   skips the fault runs
# A device call lasts at most 10 minutes: split the table between calls
# with LAYOUTS (for instance "^gpt-1.3b (DP|TP)", then the rest with
# FAULTS=0 on all but one call).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "$1" && pwd)
out=$2
logs=$out/scaling
mkdir -p "$logs"
report=$out/scaling.txt
bundles=$dir/scaling
iters=${ITERS:-20} lr=${LR:-1e-4} warmup=${WARMUP:-10}
limit=${RUN_LIMIT:-240}
# NVLink multicast stays off on these machines (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  -o -name 'libnccl.so.2*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
export LD_LIBRARY_PATH="$dir/lib:$libdirs${LD_LIBRARY_PATH:-}:$dir/fallback-lib"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
launch=(python3 "$root/tools/launch-ranks.py")
train=("$dir/bin/megatron-train")
common=(--data-path "$dir/corpus.txt" --train-iters "$iters" --lr "$lr"
  --lr-warmup-iters "$warmup" --log-interval 1 --eval-iters 0
  --no-progress-bar --backend cuda)
{
  date -u
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -12
  echo "GPUs: $gpus; every run: $iters iterations, lr $lr after $warmup" \
    "warm-up iterations, bf16, dropout 0.1"
} >"$report" 2>&1
if [ ! -f "$bundles/layouts.tsv" ]; then
  echo "no $bundles/layouts.tsv: make DIR with SCALING=1" \
    "bench/make-device-dir.sh" >>"$report"
  exit 1
fi

# mpirun: DIR's Open MPI (make-device-dir.sh OPENMPI=1; relocated with
# OPAL_PREFIX, PMIx's zlib plugin left out as bench/run-multi-gpu.sh
# explains), else Open MPI's variables set by tools/launch-ranks.py.
mpirun=()
if [ -x "$dir/openmpi/usr/bin/orterun" ]; then
  ompi=$dir/openmpi
  mpirun=(env OPAL_PREFIX=$ompi/usr
    PMIX_MCA_mca_base_component_path=$ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    PMIX_MCA_pcompress=^zlib PMIX_MCA_pcompress_base_silence_warning=1
    LD_LIBRARY_PATH=$ompi/usr/lib/x86_64-linux-gnu:$ompi/lib/x86_64-linux-gnu
    "$ompi/usr/bin/orterun" --allow-run-as-root --bind-to none)
fi

# run_layout LOG LAUNCHER N BUNDLE: N ranks, one per GPU; prints what
# launched them.
run_layout() {
  local log=$1 launcher=$2 n=$3 bundle=$4
  if [ "$launcher" = mpirun ] && [ ${#mpirun[@]} -gt 0 ]; then
    timeout "$limit" "${mpirun[@]}" -np "$n" -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT=$((29500 + RANDOM % 1000)) -x LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
      -x NCCL_NVLS_ENABLE "${train[@]}" "$bundles/$bundle.mtb" \
      "${common[@]}" </dev/null >"$log" 2>&1
    echo "mpirun (exit $?)"
    return
  fi
  local as=torchrun
  [ "$launcher" = mpirun ] && as=openmpi
  "${launch[@]}" --launcher $as --timeout "$limit" "$n" -- "${train[@]}" \
    "$bundles/$bundle.mtb" "${common[@]}" </dev/null >"$log" 2>&1
  echo "$as variables (exit $?)"
}

# The references, once each: one GPU, the layout's global batch.
declare -A trained=()
: >"$logs/launched.tsv"
while IFS=$'\t' read -r label need launcher model scaling batch name ref \
  flags; do
  if [[ ! $label =~ ${LAYOUTS:-.} ]] || [ "$gpus" -lt "$need" ]; then
    continue
  fi
  if [ -z "${trained[$ref]:-}" ]; then
    CUDA_VISIBLE_DEVICES=0 timeout "$limit" "${train[@]}" \
      "$bundles/$ref.mtb" "${common[@]}" </dev/null >"$logs/$ref.log" 2>&1
    trained[$ref]=1
  fi
  how=$(run_layout "$logs/$name.log" "$launcher" "$need" "$name")
  printf '%s\t%s\n' "$name" "$how" >>"$logs/launched.tsv"
done <"$bundles/layouts.tsv"
python3 "$root/bench/scaling_table.py" "$root" "$bundles" "$logs" "$gpus" \
  >>"$report"

[ "${FAULTS:-1}" = 1 ] && [ "$gpus" -ge 2 ] || exit 0
# The faults: tiny-gpt over 4 ranks (TP2 x DP2; TP2 on 2 GPUs) with a
# 10-s collective timeout; rank 1 killed, then (another run) stopped, 20 s
# after the start. Every other rank must exit within 10 + 10 s of it,
# naming itself, the collective, the step and the group.
fault=fault-tp2-dp2 n=4
[ "$gpus" -lt 4 ] && fault=fault-tp2 n=2
for kind in kill stop; do
  "${launch[@]}" --$kind 1@20 --timeout 90 $n -- "${train[@]}" \
    "$bundles/$fault.mtb" --data-path "$dir/corpus.txt" \
    --train-iters 1000000 --lr 6e-4 --log-interval 100 --eval-iters 0 \
    --no-progress-bar --backend cuda --collective-timeout 10 </dev/null \
    >"$logs/fault-$kind.log" 2>&1
done
# The reshard: 40 iterations on the 4 (or 2) ranks, saved at 20; one GPU
# resumes iteration 20's checkpoint and must match iterations 21-40 within
# the bf16 tolerance.
rm -rf "$logs/reshard-saved" "$logs/reshard-one-gpu"
resume=(--data-path "$dir/corpus.txt" --train-iters 40 --lr 6e-4
  --lr-warmup-iters 5 --log-interval 1 --eval-iters 0 --no-progress-bar
  --backend cuda)
"${launch[@]}" --timeout 120 $n -- "${train[@]}" "$bundles/$fault.mtb" \
  "${resume[@]}" --save "$logs/reshard-saved" --save-interval 20 \
  --log-jsonl "$logs/reshard-full.jsonl" </dev/null \
  >"$logs/reshard-save.log" 2>&1
mkdir -p "$logs/reshard-one-gpu"
cp -r "$logs/reshard-saved/iter_0000020" "$logs/reshard-one-gpu/" &&
  echo 20 >"$logs/reshard-one-gpu/latest_checkpointed_iteration.txt"
CUDA_VISIBLE_DEVICES=0 timeout 120 "${train[@]}" \
  "$bundles/fault-one-gpu.mtb" "${resume[@]}" --load "$logs/reshard-one-gpu" \
  --log-jsonl "$logs/reshard-resumed.jsonl" </dev/null \
  >"$logs/reshard-load.log" 2>&1
echo "reshard: one GPU resumed iteration 20 of the $n-rank run: exit $?" \
  >>"$logs/reshard.txt"
python3 "$root/test/integration/Inputs/compare-resume.py" \
  "$logs/reshard-full.jsonl" "$logs/reshard-resumed.jsonl" --from 21 \
  --tolerance 2e-2 >>"$logs/reshard.txt" 2>&1
echo "reshard: compare-resume exit $? (2e-2 relative, bf16)" \
  >>"$logs/reshard.txt"
rm -rf "$logs/reshard-saved" "$logs/reshard-one-gpu"
python3 "$root/bench/scaling_table.py" --faults "$logs" "$n" >>"$report"
