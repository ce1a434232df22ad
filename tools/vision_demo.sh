#!/usr/bin/env bash
# The vision demo (bench/RESULTS.md, "Vision demo"): the shapes/colours task of
# tools/make_vision_demo.py on a random tiny kimi_k25, held-out exact-match accuracy before and
# after LoRA fine-tuning (configs/vision-demo.toml), next to chance (1/4) and a control run on
# blank images. Exits 1 unless after >= 2 x chance and >= chance + 0.30, and the control is
# within 0.05 of chance.
# Usage: tools/vision_demo.sh MOETRAIN WORK_DIR [PYTHON with torch + transformers]
set -euo pipefail
bin=$(realpath "$1"); work=$2; py=${3:-python3}
src=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"; cd "$work"
"$py" "$src/tools/make_vision_demo.py" --out task --model-vocab 304 --image-token-id 300 >/dev/null 2>&1
"$bin" data prepare task/text.txt --separator % --vocab 300 --seq 32 --out tok >/dev/null 2>&1
prep() {  # JSONL OUT
  "$bin" data prepare "$1" --tokenizer tok/tokenizer.model --image-token-id 300 --patch-size 4 \
    --seq 32 --heldout 0 --out "$2" >/dev/null
}
prep task/train.jsonl img_train; prep task/heldout.jsonl img_held
prep task/blank/train.jsonl blank_train; prep task/blank/heldout.jsonl blank_held
exact() { awk '$1 == "held" { print $6 }'; }
ev() { "$bin" eval "$@" --exact-match --batch 16 --threads 2 | exact; }
before=$(ev --model task/model --data held=img_held/train)
for run in img blank; do
  "$bin" train --job "$src/configs/vision-demo.toml" --set "model.dir=\"$work/task/model\"" \
    --set "data.train=\"$work/${run}_train/train\"" --set "run.dir=\"$work/run_$run\"" >"$run.log" 2>&1
done
after=$(ev --checkpoint run_img/checkpoints --data held=img_held/train)
blank=$(ev --checkpoint run_blank/checkpoints --data held=blank_held/train)
printf "held-out exact match (256 answers): chance 0.25, before %s, after %s, blank control %s\n" \
  "$before" "$after" "$blank"
awk -v a="$after" -v b="$blank" 'BEGIN { c = 0.25; ok = a >= 2 * c && a >= c + 0.30 && b - c <= 0.05 && c - b <= 0.05;
  print ok ? "targets met" : "targets MISSED"; exit ok ? 0 : 1 }'
