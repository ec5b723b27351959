#!/usr/bin/env bash
# Makes a GPT-2 BPE corpus of English prose that gpt2-124m does not
# memorize in 500 iterations of 8 x 1024 tokens (issue 26's convergence
# check): the reStructuredText sources of Debian's Python 3.11 and Linux 6.1
# documentation packages (python3.11-doc, linux-doc-6.1: about 35 MB of
# text, 9-10 M tokens), one JSON document per paragraph, tokenized by
# megatron-preprocess with --append-eod.
#
# Usage: bench/make-bpe-corpus.sh BUILD_DIR OUT_DIR
# Writes OUT_DIR/docs_text_document.{bin,idx} and OUT_DIR/SOURCES (the
# packages' versions and the tarballs' SHA-256 sums: the corpus is as
# reproducible as the Debian mirror keeps those versions). Needs apt-get
# (run apt-get update first) and GPT-2's tokenizer files
# (tools/fetch-gpt2-tokenizer.sh).
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR OUT_DIR}
out=${2:?usage: $0 BUILD_DIR OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
gpt2=${MEGATRON_GPT2_DIR:-$root/.cache/gpt2}
[[ -f $gpt2/encoder.json && -f $gpt2/vocab.bpe ]] ||
  bash "$root/tools/fetch-gpt2-tokenizer.sh"

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download python3.11-doc linux-doc-6.1)
: >"$out/SOURCES"
for deb in "$work"/*.deb; do
  echo "$(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" \
    "sha256 $(sha256sum <"$deb" | cut -d' ' -f1)" >>"$out/SOURCES"
  dpkg-deb -x "$deb" "$work/x"
done
# Sphinx keeps each page's source as _sources/PAGE.rst.txt; sorted by path
# so the corpus's order does not depend on the file system.
find "$work/x/usr/share/doc" -path '*/_sources/*' -name '*.txt' -print0 |
  LC_ALL=C sort -z | xargs -0 cat >"$work/docs.txt"
python3 "$root/tools/paragraphs-to-jsonl.py" "$work/docs.txt" \
  "$work/docs.jsonl"
"$build/bin/megatron-preprocess" --input "$work/docs.jsonl" \
  --output-prefix "$out/docs" --tokenizer-type GPT2BPETokenizer \
  --vocab-file "$gpt2/encoder.json" --merge-file "$gpt2/vocab.bpe" \
  --append-eod --workers 2 --force --no-progress-bar
echo "$(wc -c <"$work/docs.txt") bytes, $(wc -l <"$work/docs.jsonl")" \
  "paragraphs" >>"$out/SOURCES"
cat "$out/SOURCES"
ls -l "$out"/docs_text_document.*
