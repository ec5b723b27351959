#!/usr/bin/env bash
# Installs what the build and the tests need from Debian 12's packages; safe to
# run again (it installs only what is missing). The CUDA 13.0 toolkit is
# expected at /usr/local/cuda and is used only when it is there.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache python3
  llvm-22-dev llvm-22-tools libmlir-22-dev mlir-22-tools
  libgtest-dev libgmock-dev nlohmann-json3-dev libssl-dev
  clang-22 libclang-rt-22-dev
  libicu-dev libpcre2-dev libpng-dev zlib1g-dev curl ca-certificates
  pybind11-dev python3-dev libdlpack-dev python3-numpy
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done

# GPT-2's tokenizer files for the tests; without network the tests that
# need them are skipped, so a failure here does not stop the set-up.
fetch_gpt2() {
  "$(dirname "$0")/fetch-gpt2-tokenizer.sh" ||
    echo "setup: continuing without GPT-2's tokenizer files" >&2
}

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages are installed"
  fetch_gpt2
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || {
    echo "setup: missing packages (${missing[*]}) and not root; run as root" >&2
    exit 1
  }
  sudo=(sudo)
fi
echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
  --no-install-recommends "${missing[@]}"
fetch_gpt2
