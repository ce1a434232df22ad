#!/usr/bin/env bash
# Coverage-guided fuzzing of one parser with libFuzzer (docs/reliability.md, "Fuzzing"): builds
# build-fuzz/ with clang (ASan + UBSan, the library instrumented for coverage), then fuzzes TARGET
# for SECONDS starting from fuzz/corpus/TARGET and every past finding in fuzz/crashes/TARGET.
# Inputs that add coverage collect in build-fuzz/corpus/TARGET (kept between runs; the committed
# seed corpus is not touched); a finding is written to build-fuzz/findings/TARGET/ and ends the run
# with a non-zero status: copy it to fuzz/crashes/TARGET/, fix the parser, and the replay test
# (ctest -R Fuzz.TARGET) keeps it fixed.
# Usage: tools/fuzz.sh TARGET SECONDS [libFuzzer flags...]
# TARGET: safetensors, hf_config, job_toml, token_shards, tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: tools/fuzz.sh TARGET SECONDS [libFuzzer flags...]" >&2
  exit 2
fi
target=$1
seconds=$2
shift 2
[ -d "fuzz/corpus/$target" ] || { echo "fuzz.sh: no target '$target' (fuzz/corpus/$target)" >&2; exit 2; }
cxx=${MOETRAIN_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++ || true)}
[ -n "$cxx" ] || { echo "fuzz.sh: libFuzzer needs clang++ (apt-get install clang)" >&2; exit 2; }
launcher=""
command -v ccache >/dev/null 2>&1 && launcher="-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
MOETRAIN_CMAKE_ARGS="-DCMAKE_CXX_COMPILER=$cxx -DMOETRAIN_FUZZ=ON -DMOETRAIN_BENCH=OFF \
-DMOETRAIN_WERROR=ON -DCMAKE_CXX_FLAGS_RELEASE=-O1 -DCMAKE_CXX_FLAGS=-g1 $launcher" \
  tools/build.sh build-fuzz --target "fuzz_$target"
mkdir -p "build-fuzz/corpus/$target" "build-fuzz/findings/$target"
exec env UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "build-fuzz/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="build-fuzz/findings/$target/" "$@" \
  "build-fuzz/corpus/$target" "fuzz/corpus/$target" "fuzz/crashes/$target"
