#!/bin/bash
# Issue #11's runs on a machine with two or more GPUs (through the device
# tool, kind nvidia-h200-x2 or larger): one process per GPU launched with
# torchrun's and with Open MPI's variables, each layout's losses against
# the one-GPU run of the same model, tokens/s per GPU, and a fault run.
#
# Usage: bench/run-multi-gpu.sh DIR OUT
#   DIR  bench/make-device-dir.sh's folder (MULTI=1 adds the bundles used
#        here besides tiny-gpt-bf16-nodrop{,-tp2}:
#        gpt2-124m-bf16-mb32-nodropout{,-tp2,-tp2-sp}, with no dropout at
#        all; a MODEL-tp2-sp bundle, where there is one, runs too)
#   OUT  where multi-gpu.txt and the logs (multi/) go
#   LAYOUT_MODELS (environment) MODEL:ITERATIONS pairs to compare, default
#        tiny-gpt-bf16-nodrop:20 gpt2-124m-bf16-mb32-nodropout:20
#   DP_MODELS (environment) MODEL:ITERATIONS:GLOBAL_BATCH triples for the
#        data-parallel runs (MODEL-dp2.mtb and MODEL-dp2-distopt.mtb against
#        MODEL.mtb on one GPU at that global batch), default
#        tiny-gpt-bf16-nodrop:20:8 gpt2-124m-bf16-mb32-nodropout:12:64
#   FAULT (environment) 0 skips the fault run
#   RUN_LIMIT (environment) seconds each multi-process run may take (100)
#   PP_MODELS (environment) MODEL:ITERATIONS:SCHEDULES for PP=2, default
#        tiny-gpt-l4-nodrop:20:1f1b,interleaved
#        gpt2-124m-bf16-mb8-untied-nodropout:10:- (bundles MODEL.mtb and
#        MODEL-pp2-SCHEDULE.mtb, or MODEL-pp2.mtb for "-")
# The cuda backend runs tensor (and sequence) and data parallelism across
# processes (its multi-rank instructions on the device, the collectives
# through NCCL on the arena's buffers: runtime/src/cuda/RankOps.cpp; the
# data-parallel gradient buffer and the distributed optimizer on the device,
# runtime/src/cuda/DataParallel.h) and pipeline parallelism (its messages
# through NCCL on device buffers).
# Each comparison prints the largest relative loss difference against one
# GPU, ms per iteration, tokens/s per GPU and the speedup over one GPU (and
# its efficiency: speedup / GPUs).
set -u
dir=$(cd "$1" && pwd)
out=$2
mkdir -p "$out/multi"
report=$out/multi-gpu.txt
corpus=$dir/corpus.txt
# NVLink multicast stays off on these machines (the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libnccl.so.2*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
export LD_LIBRARY_PATH="$dir/lib:$libdirs${LD_LIBRARY_PATH:-}:$dir/fallback-lib"
gpus=$(nvidia-smi -L | wc -l)
{
  date -u
  nvidia-smi -L
  nvidia-smi topo -m 2>/dev/null | head -5
} >"$report" 2>&1
train() { # train LOG BUNDLE ITERS [flags...]: one process
  local log=$1 bundle=$2 iters=$3
  shift 3
  timeout "${RUN_LIMIT:-100}" "$dir/bin/megatron-train" \
    "$dir/bundles/$bundle" --data-path "$corpus" --train-iters "$iters" \
    --lr 6e-4 --lr-warmup-iters 5 --log-interval 1 --eval-iters 0 \
    --no-progress-bar --backend cuda "$@" >"$log" 2>&1
}
port=29500
launch() { # launch NAME LAUNCHER N BUNDLE ITERS [flags...]: N processes
  local name=$1 launcher=$2 n=$3 bundle=$4 iters=$5
  shift 5
  port=$((port + 1))
  local pids=()
  for ((r = 0; r < n; ++r)); do
    if [ "$launcher" = torchrun ]; then
      vars=(RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n)
    else
      vars=(OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_LOCAL_RANK=$r
        OMPI_COMM_WORLD_SIZE=$n)
    fi
    env "${vars[@]}" MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout "${RUN_LIMIT:-100}" "$dir/bin/megatron-train" \
      "$dir/bundles/$bundle" \
      --data-path "$corpus" --train-iters "$iters" --lr 6e-4 \
      --lr-warmup-iters 5 --log-interval 1 --eval-iters 0 \
      --no-progress-bar --backend cuda "$@" \
      >"$out/multi/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  local status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
  echo "$name: exit $status" >>"$report"
}
# Largest relative loss difference between two logs, ms per iteration and
# tokens/s (medians after 5 iterations), per GPU against the reference's.
compare() { # compare NAME LOG REFERENCE GPUS
  python3 - "$@" >>"$report" <<'EOF'
import re, statistics, sys
name, log, ref, gpus = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def read(path):
    losses, times, rates = [], [], []
    for line in open(path, errors="replace"):
        loss = re.search(r"lm loss: ([0-9.E+-]+)", line)
        ms = re.search(r"elapsed time per iteration \(ms\): ([0-9.]+)", line)
        rate = re.search(r"tokens per second: ([0-9.]+)", line)
        if loss:
            losses.append(float(loss.group(1)))
            times.append(float(ms.group(1)) if ms else float("nan"))
            rates.append(float(rate.group(1)) if rate else float("nan"))
    return losses, times, rates
def median(values):
    return statistics.median(values[5:]) if len(values) > 5 else float("nan")
a, ta, ra = read(log)
b, tb, rb = read(ref)
n = min(len(a), len(b))
worst = max((abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n])), default=-1)
rate, one = median(ra), median(rb)
print(f"{name}: {n} iterations compared, largest relative loss difference "
      f"{worst:.3g}, median {median(ta):.1f} ms/iteration (one GPU "
      f"{median(tb):.1f}), {rate:.0f} tokens/s = {rate / gpus:.0f} per GPU "
      f"(one GPU {one:.0f}): speedup {rate / one:.2f}, efficiency "
      f"{rate / one / gpus:.2f}; last loss {a[-1] if a else 'none'} "
      f"(reference {b[-1] if b else 'none'})")
EOF
}
echo "GPUs: $gpus" >>"$report"
if [ "$gpus" -lt 2 ]; then
  echo "fewer than 2 GPUs: nothing to run" >>"$report"
  exit 0
fi

# Layouts against one GPU: tiny-gpt and gpt2-124m (micro-batch 32), 20
# steps each, dropout off (dropout over split tensors is refused on the
# GPU). tiny-gpt also runs with Open MPI's variables, in process on one GPU,
# and with sequence parallelism; gpt2-124m with torchrun's variables.
for pair in ${LAYOUT_MODELS-tiny-gpt-bf16-nodrop:20 gpt2-124m-bf16-mb32-nodropout:20}; do
  model=${pair%%:*} iters=${pair##*:}
  one=$out/multi/$model.one-gpu.log
  CUDA_VISIBLE_DEVICES=0 train "$one" "$model.mtb" "$iters"
  launchers="torchrun"
  if [ "$model" = tiny-gpt-bf16-nodrop ]; then
    launchers="torchrun mpi"
    CUDA_VISIBLE_DEVICES=0 train "$out/multi/$model.tp2-one-gpu.log" \
      "$model-tp2.mtb" "$iters" --in-process-ranks
    compare "$model TP2 in-process on one GPU" \
      "$out/multi/$model.tp2-one-gpu.log" "$one" 1
  fi
  if [ -f "$dir/bundles/$model-tp2-sp.mtb" ]; then
    launch "$model.tp2-sp" torchrun 2 "$model-tp2-sp.mtb" "$iters"
    compare "$model TP2 + sequence parallelism, 2 processes on 2 GPUs" \
      "$out/multi/$model.tp2-sp.rank0.log" "$one" 2
  fi
  for launcher in $launchers; do
    launch "$model.tp2-$launcher" $launcher 2 "$model-tp2.mtb" "$iters"
    compare "$model TP2, 2 processes on 2 GPUs ($launcher variables)" \
      "$out/multi/$model.tp2-$launcher.rank0.log" "$one" 2
  done
done

# Data parallelism: DP=2, one process per GPU (torchrun's variables), with
# and without the distributed optimizer, against one GPU at the same global
# batch (there two micro-batches, here one per rank).
for triple in ${DP_MODELS-tiny-gpt-bf16-nodrop:20:8 gpt2-124m-bf16-mb32-nodropout:12:64}; do
  IFS=: read -r model iters batch <<<"$triple"
  one=$out/multi/$model.one-gpu-gb$batch.log
  CUDA_VISIBLE_DEVICES=0 train "$one" "$model.mtb" "$iters" \
    --global-batch-size "$batch"
  for variant in dp2 dp2-distopt; do
    launch "$model.$variant" torchrun 2 "$model-$variant.mtb" "$iters"
    compare "$model ${variant/dp2/DP2}, 2 processes on 2 GPUs" \
      "$out/multi/$model.$variant.rank0.log" "$one" 2
  done
done

# Pipeline parallelism (PP=2, one process per GPU) against one GPU; a
# bundle make-device-dir.sh did not write is skipped.
for triple in ${PP_MODELS-tiny-gpt-l4-nodrop:20:1f1b,interleaved gpt2-124m-bf16-mb8-untied-nodropout:10:-}; do
  model=${triple%%:*} rest=${triple#*:}
  iters=${rest%%:*} schedules=${rest#*:}
  [ -f "$dir/bundles/$model.mtb" ] || continue
  one=$out/multi/$model.one-gpu.log
  CUDA_VISIBLE_DEVICES=0 train "$one" "$model.mtb" "$iters"
  for schedule in ${schedules//,/ }; do
    bundle=$model-pp2-$schedule.mtb
    [ "$schedule" = - ] && bundle=$model-pp2.mtb
    [ -f "$dir/bundles/$bundle" ] || continue
    launch "${bundle%.mtb}" torchrun 2 "$bundle" "$iters"
    compare "$bundle, 2 processes on 2 GPUs" \
      "$out/multi/${bundle%.mtb}.rank0.log" "$one" 2
    grep -h "idle fraction" "$out/multi/${bundle%.mtb}.rank0.log" >>"$report"
  done
done

# The fault run: rank 1 killed mid-run; rank 0 must exit within the
# collective timeout (10 s) plus 10 s, naming the rank, call and step. The
# ranks are started without a wrapper (`env` execs megatron-train), so that
# the SIGKILL reaches the rank itself: session 4's run killed a `timeout`
# wrapper instead and its megatron-train trained on. A background kill
# ends rank 0 after 40 s if it hangs. The ranks save every 500 iterations;
# afterwards the newest checkpoint must load and train on (both ranks in
# one process on GPU 0): the kill corrupted none.
[ "${FAULT:-1}" = 1 ] || exit 0
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
