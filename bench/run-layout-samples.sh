#!/bin/bash
# The GPU checks of what the lit tests check on the host for layouts of
# ranks, for a GPU machine without lit (through the device tool, one call):
#   - samples: --sample-tokens after 5 iterations of tiny-gpt on in-process
#     ranks (TP2, PP2, CP2, TP2 x SP x PP2 x CP2) equal, byte for byte, the
#     one-rank GPU run's sample (cuda::Trainer::sample: predict_step or the
#     predict stages on the device, one row of logits copied per token);
#   - moe: tiny-moe's losses, gradient norms and reported MoE losses
#     (lm loss, aux_loss, load_balancing_loss, z_loss) under EP2, EP2 x DP2
#     and PP2, fp32 and bf16, against one rank on the same GPU
#     (test/integration/Inputs/compare-ranks.py --moe-losses), and the
#     reported sums (check-reported-losses.py); --moe-router-dtype fp32 in
#     bf16 against fp32; --moe-router-topk-scaling-factor and group-limited
#     routing (--moe-router-num-groups, --moe-router-group-topk) and the
#     sequence-level aux loss (seq_aux_loss) against the host; the expert
#     bias (--moe-router-enable-expert-bias) against the host and under
#     EP2 x DP2 with the distributed optimizer against one rank, losses
#     and the saved biases (check-expert-bias.py); EP2 with the
#     distributed optimizer (the experts outside its buffer) against one
#     rank.
#
# Usage, on this machine: bench/run-layout-samples.sh make COMPILER DIR
#   compiles the bundles into DIR/layouts (DIR: a bench/make-step-dir.sh
#   folder, whose bin/megatron-train runs them) and copies this script and
#   the checking scripts beside them.
# On the GPU machine: bench/run-layout-samples.sh run DIR OUT
#   OUT gets layouts.txt (every check's verdict: "same" or "DIFFERENT"
#   lines, then "layouts: N checks, M failed") and the runs' logs.
set -u
mode=$1
if [ "$mode" = make ]; then
  set -e
  root=$(cd "$(dirname "$0")/.." && pwd)
  compile=$2 dir=$3/layouts
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$0" "$root"/test/integration/Inputs/compare-ranks.py \
    "$root"/test/integration/Inputs/check-reported-losses.py \
    "$root"/test/integration/Inputs/check-expert-bias.py \
    "$root"/test/integration/Inputs/safetensors_file.py "$dir/"
  gpt=$root/models/tiny-gpt.yaml moe=$root/models/tiny-moe.yaml
  nodrop="--hidden-dropout 0 --attention-dropout 0"
  "$compile" "$gpt" $nodrop -o "$dir/gpt.mtb"
  "$compile" "$gpt" $nodrop --tensor-model-parallel-size 2 -o "$dir/gpt-tp2.mtb"
  "$compile" "$gpt" $nodrop --pipeline-model-parallel-size 2 -o "$dir/gpt-pp2.mtb"
  "$compile" "$gpt" $nodrop --context-parallel-size 2 -o "$dir/gpt-cp2.mtb"
  "$compile" "$gpt" $nodrop --tensor-model-parallel-size 2 --sequence-parallel \
    --pipeline-model-parallel-size 2 --context-parallel-size 2 \
    -o "$dir/gpt-tp2-sp-pp2-cp2.mtb"
  batch="--micro-batch-size 2 --global-batch-size 4"
  for precision in fp32 bf16; do
    flags="$batch"
    [ $precision = bf16 ] && flags="$flags --bf16"
    "$compile" "$moe" $flags -o "$dir/moe-one-$precision.mtb"
    "$compile" "$moe" $flags --data-parallel-size 2 \
      --expert-model-parallel-size 2 -o "$dir/moe-ep2-$precision.mtb"
    "$compile" "$moe" $flags --pipeline-model-parallel-size 2 \
      -o "$dir/moe-pp2-$precision.mtb"
  done
  "$compile" "$moe" $batch --bf16 --moe-router-dtype fp32 \
    -o "$dir/moe-router32-bf16.mtb"
  "$compile" "$moe" $batch --moe-router-topk-scaling-factor 2.5 \
    --moe-router-score-function sigmoid -o "$dir/moe-scaled.mtb"
  "$compile" "$moe" $batch --num-experts 8 --moe-router-num-groups 2 \
    --moe-router-group-topk 1 --moe-router-score-function sigmoid \
    -o "$dir/moe-groups.mtb"
  "$compile" "$moe" $batch --moe-router-load-balancing-type seq_aux_loss \
    -o "$dir/moe-seq.mtb"
  bias="--num-experts 8 --moe-router-score-function sigmoid
    --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.05"
  "$compile" "$moe" $batch $bias -o "$dir/moe-bias.mtb"
  "$compile" "$moe" --micro-batch-size 1 --global-batch-size 4 $bias \
    -o "$dir/moe-bias-mb1.mtb"
  "$compile" "$moe" --micro-batch-size 1 --global-batch-size 4 $bias \
    --data-parallel-size 2 --expert-model-parallel-size 2 \
    --use-distributed-optimizer -o "$dir/moe-bias-ep2-dist.mtb"
  "$compile" "$moe" --micro-batch-size 1 --global-batch-size 4 \
    -o "$dir/moe-one-mb1.mtb"
  "$compile" "$moe" --micro-batch-size 1 --global-batch-size 4 \
    --data-parallel-size 4 --expert-model-parallel-size 2 \
    -o "$dir/moe-ep2dp2.mtb"
  "$compile" "$moe" --micro-batch-size 1 --global-batch-size 4 \
    --data-parallel-size 2 --expert-model-parallel-size 2 \
    --use-distributed-optimizer -o "$dir/moe-ep2-dist.mtb"
  exit 0
fi

dir=$(cd "$2" && pwd)
out=$3
source "$dir/bench/device-env.sh"
device_libraries "$dir"
l=$dir/layouts
logs=$out/layout-logs
mkdir -p "$logs"
report=$out/layouts.txt
: >"$report"
checks=0 failed=0
verdict() { # NAME STATUS
  checks=$((checks + 1))
  if [ "$2" = 0 ]; then
    echo "$1: same" >>"$report"
  else
    failed=$((failed + 1))
    echo "$1: DIFFERENT (see layout-logs/$1.*)" >>"$report"
  fi
}
train() { # NAME BUNDLE FLAGS...: megatron-train on the GPU into logs/NAME.*
  local name=$1 bundle=$2
  shift 2
  timeout 120 "$dir/bin/megatron-train" "$l/$bundle" --backend cuda \
    --data-path "$dir/corpus.txt" --eval-interval 0 --no-progress-bar \
    "$@" >"$logs/$name.log" 2>&1
}

sample="--train-iters 5 --lr 2e-3 --sample-tokens 60 --top-k 0 --temperature 0.8"
train gpt-one gpt.mtb $sample
sed -n '/sample (/,$p' "$logs/gpt-one.log" >"$logs/gpt-one.sample"
for layout in tp2 pp2 cp2 tp2-sp-pp2-cp2; do
  train "gpt-$layout" "gpt-$layout.mtb" --in-process-ranks $sample
  sed -n '/sample (/,$p' "$logs/gpt-$layout.log" >"$logs/gpt-$layout.sample"
  [ -s "$logs/gpt-one.sample" ] &&
    cmp -s "$logs/gpt-one.sample" "$logs/gpt-$layout.sample"
  verdict "sample-$layout" $?
done

moe="--train-iters 3 --lr 1e-3 --log-interval 1"
compare() { # NAME REFERENCE FLAGS...
  local name=$1 reference=$2
  shift 2
  python3 "$l/compare-ranks.py" "$logs/$reference.jsonl" "$logs/$name.jsonl" \
    "$@" >"$logs/$name.compare" 2>&1
  verdict "$name" $?
}
for precision in fp32 bf16; do
  train "moe-one-$precision" "moe-one-$precision.mtb" $moe \
    --log-jsonl "$logs/moe-one-$precision.jsonl"
  python3 "$l/check-reported-losses.py" "$logs/moe-one-$precision.jsonl" \
    0.01 0.001 2 >"$logs/moe-sums-$precision.compare" 2>&1
  verdict "moe-sums-$precision" $?
  for layout in ep2 pp2; do
    train "moe-$layout-$precision" "moe-$layout-$precision.mtb" \
      --in-process-ranks $moe --log-jsonl "$logs/moe-$layout-$precision.jsonl"
    if [ $precision = fp32 ]; then
      compare "moe-$layout-$precision" "moe-one-$precision" --moe-losses
    else
      compare "moe-$layout-$precision" "moe-one-$precision" --moe-losses \
        --tolerance=5e-3
    fi
  done
done
# The router's GEMMs in f32 in a bf16 bundle: within bf16's tolerance of
# fp32 (the host: 1.7e-3).
train moe-router32-bf16 moe-router32-bf16.mtb $moe \
  --log-jsonl "$logs/moe-router32-bf16.jsonl"
compare moe-router32-bf16 moe-one-fp32 --grad-norm --moe-losses \
  --tolerance=5e-3
versus_host() { # NAME: NAME.mtb on the GPU against the host backend
  train "$1" "$1.mtb" $moe --log-jsonl "$logs/$1.jsonl"
  "$dir/bin/megatron-train" "$l/$1.mtb" --backend host \
    --data-path "$dir/corpus.txt" --eval-interval 0 --no-progress-bar $moe \
    --log-jsonl "$logs/$1-host.jsonl" >"$logs/$1-host.log" 2>&1
  compare "$1" "$1-host" --grad-norm --moe-losses
}
# Against the same bundle on the host backend: the top-k scaling factor
# (mt.scale in the forward and backward passes), group-limited routing (the
# device's routedExperts) and the sequence-level aux loss (counts and sums
# per sequence).
versus_host moe-scaled
versus_host moe-groups
versus_host moe-seq
# The expert bias: its routing and tokens per expert on the device, the
# cuda optimizers' update (one GPU; the distributed optimizer's shards).
same_biases() { # NAME REFERENCE: the saved biases equal
  python3 "$l/check-expert-bias.py" "$logs/$1.st" 0.05 3 "$logs/$2.st" \
    >"$logs/$1-biases.compare" 2>&1
  verdict "$1-biases" $?
}
versus_host moe-bias
train moe-bias-saved moe-bias.mtb $moe --save-weights "$logs/moe-bias.st"
"$dir/bin/megatron-train" "$l/moe-bias.mtb" --backend host \
  --data-path "$dir/corpus.txt" --eval-interval 0 --no-progress-bar $moe \
  --save-weights "$logs/moe-bias-host.st" >"$logs/moe-bias-host-saved.log" 2>&1
same_biases moe-bias moe-bias-host
train moe-bias-mb1 moe-bias-mb1.mtb $moe --log-jsonl "$logs/moe-bias-mb1.jsonl" \
  --save-weights "$logs/moe-bias-mb1.st"
train moe-bias-ep2-dist moe-bias-ep2-dist.mtb --in-process-ranks $moe \
  --log-jsonl "$logs/moe-bias-ep2-dist.jsonl" \
  --save-weights "$logs/moe-bias-ep2-dist.st"
compare moe-bias-ep2-dist moe-bias-mb1 --grad-norm --moe-losses
same_biases moe-bias-ep2-dist moe-bias-mb1
train moe-one-mb1 moe-one-mb1.mtb $moe --log-jsonl "$logs/moe-one-mb1.jsonl"
train moe-ep2dp2 moe-ep2dp2.mtb --in-process-ranks $moe \
  --log-jsonl "$logs/moe-ep2dp2.jsonl"
compare moe-ep2dp2 moe-one-mb1 --moe-losses
# The distributed optimizer steps the experts (outside its buffer) too.
train moe-ep2-dist moe-ep2-dist.mtb --in-process-ranks $moe \
  --log-jsonl "$logs/moe-ep2-dist.jsonl"
compare moe-ep2-dist moe-one-mb1 --grad-norm --moe-losses
echo "layouts: $checks checks, $failed failed" >>"$report"
