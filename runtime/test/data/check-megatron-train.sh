#!/bin/sh
# megatron-train end to end on bigram.mtb: it trains, logs Megatron-style and
# to JSONL, evaluates and samples; bad input exits non-zero with a message.
# Usage: check-megatron-train.sh MEGATRON_TRAIN DATA_DIR
set -eu
train=$1
bundle=$2/bigram.mtb
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "check-megatron-train: $*" >&2
  exit 1
}

i=0
while [ $i -lt 200 ]; do
  printf 'the cat sat on the mat. '
  i=$((i + 1))
done >"$tmp/corpus.txt"

"$train" "$bundle" --data-path "$tmp/corpus.txt" --train-iters 40 --lr 3e-2 \
  --lr-warmup-iters 4 --lr-decay-style cosine --log-interval 20 \
  --eval-interval 20 --eval-iters 2 --log-jsonl "$tmp/metrics.jsonl" \
  --sample-tokens 6 --sample-prompt "the c" --threads 2 >"$tmp/out.txt" ||
  fail "training failed: $(cat "$tmp/out.txt")"
grep -q '^ iteration       40/      40 | consumed samples: 320 | ' "$tmp/out.txt" ||
  fail "no log line for iteration 40 in: $(cat "$tmp/out.txt")"
grep -q '^ validation loss at iteration 40 | lm loss value: ' "$tmp/out.txt" ||
  fail "no validation line"
[ "$(wc -l <"$tmp/metrics.jsonl")" -eq 42 ] || fail "metrics.jsonl: expected 42 lines"
grep -q '^the cat ' "$tmp/out.txt" || fail "the greedy sample does not continue 'the c' with 'at '"

# Same seed, same losses: the JSONL loss fields of two runs are identical.
"$train" "$bundle" --data-path "$tmp/corpus.txt" --train-iters 40 --lr 3e-2 \
  --lr-warmup-iters 4 --lr-decay-style cosine --log-interval 20 \
  --eval-interval 20 --eval-iters 2 --log-jsonl "$tmp/again.jsonl" \
  --threads 1 >/dev/null || fail "second run failed"
sed 's/.*"loss":\([^,]*\),.*/\1/' "$tmp/metrics.jsonl" >"$tmp/a"
sed 's/.*"loss":\([^,]*\),.*/\1/' "$tmp/again.jsonl" >"$tmp/b"
cmp -s "$tmp/a" "$tmp/b" || fail "losses differ between two runs with one seed"

expect_error() {
  pattern=$1
  shift
  if "$train" "$@" >/dev/null 2>"$tmp/err.txt"; then
    fail "expected failure for: $*"
  fi
  grep -q -- "$pattern" "$tmp/err.txt" ||
    fail "expected '$pattern' in: $(cat "$tmp/err.txt")"
}
expect_error "did you mean --lr-warmup-iters?" "$bundle" --data-path "$tmp/corpus.txt" \
  --train-iters 2 --lr 1e-3 --lr-warmup-iter 1
expect_error "bundle 'nowhere.mtb': cannot open it" nowhere.mtb \
  --data-path "$tmp/corpus.txt" --train-iters 2 --lr 1e-3
head -c 100 "$bundle" >"$tmp/truncated.mtb"
expect_error "the file is truncated" "$tmp/truncated.mtb" \
  --data-path "$tmp/corpus.txt" --train-iters 2 --lr 1e-3
expect_error "--lr: found 'fast', expected a number" "$bundle" \
  --data-path "$tmp/corpus.txt" --train-iters 2 --lr fast
"$train" --help | grep -q -- '--data-path PATH' || fail "--help lists no flags"
echo "check-megatron-train: ok"
