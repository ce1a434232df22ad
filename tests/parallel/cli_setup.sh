# Shared set-up of the command-line checks (sourced after `bin` is set): the repository root
# `src`, a temporary directory `T` removed on exit, and a fresh job seed (MOETRAIN_TEST_SEED when
# set; printed when the check fails) as `run_seed`, a TOML integer. Unless the caller set
# `own_data=1` before sourcing, also the tiny-code dataset prepared from this tree's headers in
# $T/data (150 KB: enough documents for a non-empty held-out split on any checkout path) and `S`,
# the tiny-code job's arguments on that data with that seed. Callers append their own keys.
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
T=$(mktemp -d)
seed=${MOETRAIN_TEST_SEED:-$(( (RANDOM << 30) | (RANDOM << 15) | RANDOM ))}
run_seed=$(( seed & 0x3fffffffffffffff ))
trap 'rc=$?; rm -rf "$T"; [ $rc -eq 0 ] || echo "this run drew its job seed from MOETRAIN_TEST_SEED=$seed; rerun it: MOETRAIN_TEST_SEED=$seed ctest -R <test>"' EXIT
if [ "${own_data:-0}" != 1 ]; then
  "$bin" data prepare "$src/src" --ext .h --max-bytes 150000 --vocab 384 --seq 64 --out "$T/data" >/dev/null 2>&1
  S=(--job "$src/configs/tiny-code.toml" --set "model.config=\"$src/configs/models/tiny-code.json\""
     --set "data.train=\"$T/data/train\"" --set "data.eval.code=\"$T/data/heldout\""
     --set "run.seed=$run_seed")
fi
