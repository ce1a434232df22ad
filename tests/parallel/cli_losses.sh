# Loss comparisons of the command-line checks (sourced): `losses RUN_DIR` prints "step loss" per
# optimizer step, then "eval loss", from the run's metrics.jsonl; `same A B WHAT` fails unless
# every line of B matches the same step of A to relative $tol.
losses() {
  sed -n 's/.*"grad_norm".*"loss":\([^,]*\),.*"step":\([0-9]*\).*/\2 \1/p' "$1/metrics.jsonl"
  sed -n 's/.*"eval".*"loss":\([^,]*\),.*/eval \1/p' "$1/metrics.jsonl" | tail -1
}
same() {
  awk -v tol="$tol" -v what="$3" 'NR == FNR { want[$1] = $2; next }
    { d = $2 - want[$1]; if (d < 0) d = -d; r = d / (want[$1] < 0 ? -want[$1] : want[$1]);
      if (r > worst) worst = r; if (!($1 in want) || r > tol) bad = bad " " $1; n++ }
    END { printf "%s: %d values, worst rel err %.3g\n", what, n, worst;
          if (bad != "" || n == 0) { print "MISMATCH at" bad; exit 1 } }' \
    <(losses "$1") <(losses "$2")
}
