#!/usr/bin/env bash
# Installs the Debian packages moetrain builds against, skipping what is already there.
set -euo pipefail
pkgs=(cmake ninja-build g++ make libopenblas-dev nlohmann-json3-dev libgtest-dev libgmock-dev
      libbenchmark-dev clang-format libcli11-dev libtomlplusplus-dev
      libopenmpi-dev openmpi-bin libsentencepiece-dev fortunes gnuplot-nox pkg-config
      libpython3.11-stdlib libpng-dev libjpeg62-turbo-dev libpcre2-dev libutf8proc-dev ccache)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The CUDA build's CUTLASS headers (pinned wheel from PyPI), where there is a CUDA toolkit.
if command -v nvcc >/dev/null 2>&1; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  "$(dirname "$0")/fetch_cutlass.sh"
fi
