#!/bin/bash
# Issue #11's runs: every layout of gpt2-124m (bf16, no dropout) as one
# process per GPU against the same model on one GPU, over the same 20
# iterations; then checks that need one GPU only, and a fault run.
#
# Usage: bench/run-multi-gpu.sh DIR OUT
#   DIR  bench/make-device-dir.sh's folder, made with MULTI=1 (the bundles
#        named in the layout table below; OPENMPI=1 adds an Open MPI
#        mpirun, else a system one on PATH is used)
#   OUT  where multi-gpu.txt (the table and the checks) and the logs
#        (multi/) go
# Environment:
#   LR, WARMUP, ITERS  the schedule of every run: peak learning rate (1e-4),
#        linear warm-up iterations (10), iterations (20). Session 5's 6e-4
#        after 5 warm-up steps spiked at iteration 11 (bench/NOTES.md)
#   SPIKE_CHECK=1  trains the one-GPU gpt2-124m reference (micro-batch 32)
#        at this schedule and at 6e-4 after 5 warm-up steps, to show the
#        spike the default avoids (on any number of GPUs)
#   LAYOUTS  an extended regular expression: only the layouts whose label
#        (the table's first column) matches it run (default: all)
#   ONE_GPU_CHECKS=0  skips the one-GPU checks (in-process layouts of
#        tiny-gpt against one rank; two processes sharing GPU 0)
#   FAULT=0  skips the fault run
#   RUN_LIMIT  seconds each run may take (100)
#
# The table: per layout, ms per iteration (median of the iterations after
# the warm-up) against one GPU's, tokens/s per GPU, the speedup in tokens/s
# over one GPU running the same global batch and its efficiency (speedup /
# GPUs), and the largest relative loss difference over the iterations
# (bf16 tolerance 2e-2, as the CUDA tests'). A layout needing more GPUs than
# the machine has (nvidia-smi -L) is listed as "needs N GPUs"; it runs
# wherever enough are. Each one-GPU reference also reports its largest loss
# rise between consecutive iterations after the warm-up (a spike shows
# there).
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out/multi"
report=$out/multi-gpu.txt
corpus=$dir/corpus.txt
lr=${LR:-1e-4} warmup=${WARMUP:-10} iters=${ITERS:-20}
limit=${RUN_LIMIT:-100}
# NVLink multicast stays off on these machines (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  -o -name 'libnccl.so.2*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
export LD_LIBRARY_PATH="$dir/lib:$libdirs${LD_LIBRARY_PATH:-}:$dir/fallback-lib"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
rows=$out/multi/rows.tsv
refs=$out/multi/references.tsv
# The one-GPU references are trained once per run of this script (an
# earlier run's, maybe at another schedule, must not stand in).
rm -f "$out"/multi/one-gpu.*.log
: >"$rows"
: >"$refs"
{
  date -u
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -5
  echo "GPUs: $gpus; schedule: lr $lr after $warmup warm-up iterations," \
    "$iters iterations"
} >"$report" 2>&1

# mpirun: DIR's Open MPI (make-device-dir.sh OPENMPI=1, Debian's
# openmpi-bin, relocated with OPAL_PREFIX), else one on PATH. PMIx looks
# for its plugins under its compiled-in path too, where the device image
# has its own PMIx's: their zlib compression plugin fails to load there
# (a mismatched symbol; PMIx ignores it and warns). A job of a few local
# ranks compresses nothing, so that plugin is left out and the warning
# silenced.
mpirun=() mpienv=()
if [ -x "$dir/openmpi/usr/bin/orterun" ]; then
  ompi=$dir/openmpi
  mpienv=(OPAL_PREFIX=$ompi/usr
    PMIX_MCA_mca_base_component_path=$ompi/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
    PMIX_MCA_pcompress=^zlib PMIX_MCA_pcompress_base_silence_warning=1
    LD_LIBRARY_PATH=$ompi/usr/lib/x86_64-linux-gnu:$ompi/lib/x86_64-linux-gnu)
  mpirun=("$ompi/usr/bin/orterun")
elif command -v mpirun >/dev/null; then
  mpirun=(mpirun)
fi
if [ ${#mpirun[@]} -gt 0 ]; then
  echo "mpirun: $(env "${mpienv[@]}" "${mpirun[@]}" --version 2>&1 | head -1)" \
    >>"$report"
else
  echo "mpirun: none (the mpirun rows set Open MPI's variables by hand)" \
    >>"$report"
fi

common=(--data-path "$corpus" --train-iters "$iters" --lr "$lr"
  --lr-warmup-iters "$warmup" --log-interval 1 --eval-iters 0
  --no-progress-bar --backend cuda)

# One process on GPU 0: one_gpu LOG BUNDLE [flags...]
one_gpu() {
  local log=$1 bundle=$2
  shift 2
  CUDA_VISIBLE_DEVICES=0 timeout "$limit" "$dir/bin/megatron-train" \
    "$dir/bundles/$bundle.mtb" "${common[@]}" "$@" </dev/null >"$log" 2>&1
}

# N processes, one per GPU: launch LOG LAUNCHER N BUNDLE [flags...].
# LAUNCHER torchrun: torchrun's variables set by hand; mpirun: `mpirun -np
# N` (Open MPI sets OMPI_COMM_WORLD_*), or Open MPI's variables by hand
# where there is no mpirun. Rank 0's output goes to LOG (with mpirun,
# every rank's).
port=29500
launch() {
  local log=$1 launcher=$2 n=$3 bundle=$4
  shift 4
  port=$((port + 1))
  if [ "$launcher" = mpirun ] && [ ${#mpirun[@]} -gt 0 ]; then
    # Not bound to cores: each rank runs host threads (NCCL's, the
    # watchdog) beside its own.
    timeout "$limit" env "${mpienv[@]}" "${mpirun[@]}" --allow-run-as-root \
      --bind-to none -np "$n" -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT=$port -x LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
      -x NCCL_NVLS_ENABLE "$dir/bin/megatron-train" \
      "$dir/bundles/$bundle.mtb" "${common[@]}" "$@" </dev/null >"$log" 2>&1
    return
  fi
  local pids=() r vars status=0
  for ((r = 0; r < n; ++r)); do
    if [ "$launcher" = torchrun ]; then
      vars=(RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n)
    else
      vars=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$r
        OMPI_COMM_WORLD_SIZE=$n)
    fi
    local rankLog=$log
    [ "$r" -gt 0 ] && rankLog=${log%.log}.rank$r.log
    env "${vars[@]}" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "$limit" "$dir/bin/megatron-train" "$dir/bundles/$bundle.mtb" \
      "${common[@]}" "$@" </dev/null >"$rankLog" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || status=$?; done
  return $status
}

# The one-GPU reference NAME (its bundle) at global batch BATCH, trained
# once: reference NAME BATCH; prints its log's path.
reference() {
  local log=$out/multi/one-gpu.$1.gb$2.log
  if [ ! -f "$log" ]; then
    one_gpu "$log" "$1" --global-batch-size "$2"
    echo "$1 (one GPU, global batch $2)	$log	$lr/$warmup	exit $?" >>"$refs"
  fi
  echo "$log"
}

# One row of the table: layout LABEL GPUS LAUNCHER BUNDLE REFERENCE BATCH.
layout() {
  local label=$1 need=$2 launcher=$3 bundle=$4 ref=$5 batch=$6
  if [ "$gpus" -lt "$need" ]; then
    printf '%s\t%s\t%s\tneeds %s GPUs\n' "$label" "$need" "$bundle" \
      "$need" >>"$rows"
    return
  fi
  for b in "$bundle" "$ref"; do
    if [ ! -f "$dir/bundles/$b.mtb" ]; then
      printf '%s\t%s\t%s\tno bundle %s.mtb (make-device-dir.sh MULTI=1)\n' \
        "$label" "$need" "$bundle" "$b" >>"$rows"
      return
    fi
  done
  local one log=$out/multi/$bundle.log status
  one=$(reference "$ref" "$batch")
  launch "$log" "$launcher" "$need" "$bundle"
  status=$?
  local used=$launcher
  if [ "$launcher" = mpirun ]; then
    if [ ${#mpirun[@]} -eq 0 ]; then
      used="Open MPI variables"
    elif [ $status -ne 0 ]; then
      # mpirun failed: the same layout with torchrun's variables, so that
      # the row still has figures; the mpirun log stays for the notes.
      mv "$log" "${log%.log}.mpirun-failed.log"
      used="torchrun (mpirun exit $status: ${log%.log}.mpirun-failed.log)"
      launch "$log" torchrun "$need" "$bundle"
      status=$?
    fi
  fi
  printf '%s\t%s\t%s\tran\t%s\t%s\t%s\t%s\n' "$label" "$need" "$bundle" \
    "$used" "$status" "$log" "$one" >>"$rows"
}

# The layouts. gpt2-124m has 12 heads, so TP8 runs gpt2-350m (16 heads)
# against gpt2-350m on one GPU. Pipelines need untied embeddings: their
# reference is the untied model (micro-batches of 8). The data-parallel
# rows compare with one GPU at the same global batch (there several
# micro-batches, here one per rank).
m=gpt2-124m-bf16-mb32-nodropout
p=gpt2-124m-bf16-mb8-untied-nodropout
while IFS='|' read -r label need launcher bundle ref batch; do
  [[ $label =~ ${LAYOUTS:-.} ]] || continue
  layout "$label" "$need" "$launcher" "$bundle" "$ref" "$batch"
done <<EOF
TP2|2|mpirun|$m-tp2|$m|32
TP2 + SP|2|torchrun|$m-tp2-sp|$m|32
DP2|2|torchrun|$m-dp2|$m|64
DP2, distributed optimizer|2|torchrun|$m-dp2-distopt|$m|64
PP2 1F1B|2|torchrun|$p-pp2|$p|32
PP2 interleaved (2 virtual stages)|2|torchrun|$p-pp2-interleaved|$p|32
TP4|4|torchrun|$m-tp4|$m|32
TP4 + SP|4|torchrun|$m-tp4-sp|$m|32
PP4 1F1B|4|torchrun|$p-pp4-1f1b|$p|32
PP4 interleaved (3 virtual stages)|4|torchrun|$p-pp4-interleaved|$p|32
TP8 (gpt2-350m)|8|torchrun|gpt2-350m-bf16-mb32-nodropout-tp8|gpt2-350m-bf16-mb32-nodropout|32
DP8, distributed optimizer|8|mpirun|$m-dp8-distopt|$m|256
TP2 x PP2 x DP2|8|torchrun|$p-tp2-pp2-dp2|$p|64
EOF

if [ "${SPIKE_CHECK:-0}" = 1 ]; then
  reference "$m" 32 >/dev/null
  spike=$out/multi/one-gpu.$m.gb32.lr6e-4.log
  CUDA_VISIBLE_DEVICES=0 timeout "$limit" "$dir/bin/megatron-train" \
    "$dir/bundles/$m.mtb" "${common[@]}" --lr 6e-4 --lr-warmup-iters 5 \
    >"$spike" 2>&1
  echo "$m (one GPU, global batch 32)	$spike	6e-4/5	exit $?" >>"$refs"
fi

# The table.
python3 - "$rows" "$refs" "$gpus" >>"$report" <<'EOF'
import json, re, statistics, sys
rows_path, refs_path, gpus = sys.argv[1], sys.argv[2], int(sys.argv[3])
def read(path):
    rows = []
    try:
        lines = open(path, errors="replace").readlines()
    except OSError:
        return rows
    for line in lines:
        loss = re.search(r"lm loss: ([0-9.E+-]+)", line)
        if not loss:
            continue
        def field(pattern):
            m = re.search(pattern, line)
            return float(m.group(1)) if m else float("nan")
        lr = field(r"learning rate: ([0-9.E+-]+)")
        rows.append(dict(loss=float(loss.group(1)), lr=lr,
                         ms=field(r"per iteration \(ms\): ([0-9.]+)"),
                         rate=field(r"tokens per second: ([0-9.]+)"),
                         norm=field(r"grad norm: ([0-9.]+)")))
    return rows
def after_warmup(rows, key, warmup=5):
    values = [r[key] for r in rows[warmup:]]
    return statistics.median(values) if values else float("nan")
print()
print("| layout | GPUs | launcher | ms/iter (one GPU) | tokens/s per GPU "
      "| speedup | efficiency | largest relative loss difference "
      "(iteration) | within 2e-2 |")
print("|---|---:|---|---:|---:|---:|---:|---|---|")
for line in open(rows_path):
    f = line.rstrip("\n").split("\t")
    label, need, bundle, state = f[0], int(f[1]), f[2], f[3]
    if state != "ran":
        print(f"| {label} | {need} | | {state} | | | | | |")
        continue
    launcher, status, log, ref = f[4], f[5], f[6], f[7]
    a, b = read(log), read(ref)
    n = min(len(a), len(b))
    if n == 0:
        print(f"| {label} | {need} | {launcher} | exit {status}, no "
              f"iterations logged ({log}) | | | | | |")
        continue
    diffs = [abs(x["loss"] - y["loss"]) / abs(y["loss"])
             for x, y in zip(a[:n], b[:n])]
    worst = max(range(n), key=lambda i: diffs[i])
    ms, ms1 = after_warmup(a, "ms"), after_warmup(b, "ms")
    rate, rate1 = after_warmup(a, "rate"), after_warmup(b, "rate")
    speedup = rate / rate1
    note = "" if n == len(b) and status == "0" else \
        f" ({n} of {len(b)} iterations, exit {status})"
    print(f"| {label} | {need} | {launcher} | {ms:.1f} ({ms1:.1f}) | "
          f"{rate / need:,.0f} | {speedup:.2f} | {speedup / need:.2f} | "
          f"{diffs[worst]:.2g} ({worst + 1}){note} | "
          f"{'yes' if diffs[worst] <= 2e-2 and n == len(b) else 'NO'} |")
print()
print("One-GPU references (largest loss rise between consecutive "
      "iterations after the warm-up; a spike shows there):")
for line in open(refs_path):
    name, log, schedule, status = line.rstrip("\n").split("\t")
    rows = read(log)
    if not rows:
        print(f"- {name}, lr/warm-up {schedule}: {status}, no iterations")
        continue
    warmup = int(schedule.split("/")[1])
    rises = [(rows[i]["loss"] - rows[i - 1]["loss"], i + 1)
             for i in range(max(warmup, 1), len(rows))]
    rise, at = max(rises) if rises else (float("nan"), 0)
    norm, norm_at = max((r["norm"], i + 1) for i, r in enumerate(rows))
    print(f"- {name}, lr/warm-up {schedule}: {status}; loss "
          f"{rows[0]['loss']:.4f} -> {rows[-1]['loss']:.4f}; largest rise "
          f"{rise:+.4f} (iteration {at}); largest grad norm {norm:.1f} "
          f"(iteration {norm_at}); "
          f"{after_warmup(rows, 'rate'):,.0f} tokens/s")
EOF

# One GPU only: in-process layouts of tiny-gpt (fp32, every rank a thread
# with its own CUDA context on GPU 0, the in-process communicator) against
# one rank, and what two processes sharing GPU 0 do.
if [ "${ONE_GPU_CHECKS:-1}" = 1 ]; then
  echo >>"$report"
  echo "One GPU: in-process ranks of tiny-gpt (fp32) against one rank:" \
    >>"$report"
  t=tiny-gpt-nodrop l=tiny-gpt-l4-nodrop
  while IFS='|' read -r label bundle ref batch; do
    [ -f "$dir/bundles/$bundle.mtb" ] && [ -f "$dir/bundles/$ref.mtb" ] ||
      { echo "- $label: no bundle" >>"$report"; continue; }
    one_gpu "$out/multi/inproc.$bundle.log" "$bundle" --in-process-ranks \
      --global-batch-size "$batch"
    status=$?
    reflog=$(reference "$ref" "$batch")
    python3 - "$label" "$status" "$out/multi/inproc.$bundle.log" "$reflog" \
      >>"$report" <<'EOF'
import re, sys
label, status, log, ref = sys.argv[1:]
def losses(path):
    return [float(m.group(1)) for m in
            (re.search(r"lm loss: ([0-9.E+-]+)", l) for l in open(path))
            if m]
a, b = losses(log), losses(ref)
n = min(len(a), len(b))
worst = max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("nan"))
print(f"- {label}: exit {status}, {n} of {len(b)} iterations, largest "
      f"relative loss difference {worst:.2g} (fp32 tolerance 1e-5: "
      f"{'yes' if worst <= 1e-5 and n == len(b) > 0 else 'NO'})")
EOF
  done <<EOF
TP2|$t-tp2|$t|8
TP4 (vocabulary padded to 512 in both)|$t-tp4|$t-v512|8
DP8, distributed optimizer (micro-batches of 1)|$t-dp8-distopt|$t|8
PP2 interleaved|$l-pp2-interleaved|$l|8
PP4 1F1B|$l-pp4-1f1b|$l|8
TP2 x PP2 x DP2 (8 ranks)|$l-tp2-pp2-dp2|$l|8
EOF
  # Two processes on one GPU. Rank 1 of torchrun's numbering selects CUDA
  # device 1 (LOCAL_RANK), which a one-GPU process does not see; both on
  # device 0 (LOCAL_RANK=0 twice) reach NCCL, which refuses two ranks of a
  # communicator on one GPU.
  one=(CUDA_VISIBLE_DEVICES=0 MASTER_ADDR=127.0.0.1 WORLD_SIZE=2)
  env "${one[@]}" MASTER_PORT=29600 RANK=1 LOCAL_RANK=1 timeout 30 \
    "$dir/bin/megatron-train" "$dir/bundles/$t-tp2.mtb" "${common[@]}" \
    >"$out/multi/shared-gpu.local-rank-1.log" 2>&1
  echo "- two processes on GPU 0, rank 1 with LOCAL_RANK=1: exit $?:" \
    "$(tail -1 "$out/multi/shared-gpu.local-rank-1.log" | cut -c1-400)" \
    >>"$report"
  # The same by mpirun -np 2 (Open MPI numbers the local ranks 0 and 1):
  # rank 1's refusal ends the job.
  if [ ${#mpirun[@]} -gt 0 ]; then
    CUDA_VISIBLE_DEVICES=0 timeout 30 env "${mpienv[@]}" "${mpirun[@]}" \
      --allow-run-as-root --bind-to none -np 2 -x MASTER_ADDR=127.0.0.1 \
      -x MASTER_PORT=29602 -x LD_LIBRARY_PATH="$LD_LIBRARY_PATH" \
      -x CUDA_VISIBLE_DEVICES "$dir/bin/megatron-train" \
      "$dir/bundles/$t-tp2.mtb" "${common[@]}" </dev/null \
      >"$out/multi/shared-gpu.mpirun.log" 2>&1
    echo "- mpirun -np 2 on GPU 0: exit $?:" \
      "$(grep -v '^ *$' "$out/multi/shared-gpu.mpirun.log" | grep -v '^---' |
        head -3 | cut -c1-400 | tr '\n' ' ')" >>"$report"
  fi
  pids=()
  for r in 0 1; do
    env "${one[@]}" MASTER_PORT=29601 RANK=$r LOCAL_RANK=0 timeout 40 \
      "$dir/bin/megatron-train" "$dir/bundles/$t-tp2.mtb" "${common[@]}" \
      >"$out/multi/shared-gpu.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}"
    echo "- two processes on GPU 0, both LOCAL_RANK=0: rank $r exit $?:" \
      "$(grep -v '^ *$' "$out/multi/shared-gpu.rank$r.log" | tail -2 |
        cut -c1-400 | tr '\n' ' ')" >>"$report"
  done
fi

# The fault run: rank 1 killed mid-run; rank 0 must exit within the
# collective timeout (10 s) plus 10 s, naming the rank, call and step. The
# ranks are started without a wrapper (`env` execs megatron-train), so that
# the SIGKILL reaches the rank itself: session 4's run killed a `timeout`
# wrapper instead and its megatron-train trained on. A background kill
# ends rank 0 after 40 s if it hangs. The ranks save every 500 iterations;
# afterwards the newest checkpoint must load and train on (both ranks in
# one process on GPU 0): the kill corrupted none.
[ "${FAULT:-1}" = 1 ] && [ "$gpus" -ge 2 ] || exit 0
port=$((port + 1))
pids=()
for r in 0 1; do
  env RANK=$r LOCAL_RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$dir/bin/megatron-train" \
    "$dir/bundles/tiny-gpt-bf16-nodrop-tp2.mtb" --data-path "$corpus" \
    --train-iters 1000000 --lr 6e-4 --log-interval 100 --eval-iters 0 \
    --no-progress-bar --backend cuda --collective-timeout 10 \
    --save "$out/multi/fault-ckpt" --save-interval 500 \
    >"$out/multi/fault.rank$r.log" 2>&1 &
  pids+=($!)
done
(sleep 55 && kill -9 "${pids[0]}" 2>/dev/null) &
guard=$!
sleep 15
alive=$(kill -0 "${pids[0]}" 2>/dev/null && kill -0 "${pids[1]}" 2>/dev/null &&
  echo both || echo "not both")
kill -9 "${pids[1]}"
killed=$(date +%s.%N)
wait "${pids[0]}"
status=$?
ended=$(date +%s.%N)
wait "${pids[1]}" 2>/dev/null
kill "$guard" 2>/dev/null
{
  echo "fault: ranks alive at the kill: $alive; rank 1 (pid ${pids[1]}," \
    "megatron-train itself) killed after 15 s; rank 0 exit $status after" \
    "$(python3 -c "print(f'{$ended - $killed:.1f}')") s (limit 20 s;" \
    "137: killed by the 40 s guard)"
  echo "fault: rank 0's last lines:"
  tail -3 "$out/multi/fault.rank0.log" | cut -c1-600
} >>"$report"
latest=$(cat "$out/multi/fault-ckpt/latest_checkpointed_iteration.txt" 2>/dev/null)
if [ -n "$latest" ]; then
  CUDA_VISIBLE_DEVICES=0 timeout 60 "$dir/bin/megatron-train" \
    "$dir/bundles/tiny-gpt-bf16-nodrop-tp2.mtb" --data-path "$corpus" \
    --train-iters $((latest + 20)) --lr-decay-iters 1000000 --lr 6e-4 \
    --log-interval 10 \
    --eval-iters 0 --no-progress-bar --backend cuda --in-process-ranks \
    --load "$out/multi/fault-ckpt" >"$out/multi/fault.resume.log" 2>&1
  echo "fault: resumed from the newest checkpoint (iteration $latest) on" \
    "one GPU: exit $?; $(grep -c 'iteration ' "$out/multi/fault.resume.log")" \
    "iterations logged" >>"$report"
else
  echo "fault: no checkpoint was written before the kill" >>"$report"
fi
rm -rf "$out/multi/fault-ckpt"
