#!/usr/bin/env bash
# `moetrain train` and `moetrain eval` end to end on a tiny kimi_k25 model with image data (CPU):
# the demo's task in small (tools/make_vision_demo.py, images only), a tokenizer, interleaved
# image-text data prepared with --image-token-id, a LoRA run on the language model and the
# projector with the tower trained in full (model.vision_tower = "train"), then eval with the
# exact-match columns. The model is the k25_a golden's config with a vocabulary that holds the
# tokenizer's 300 ids and the image token (moetrain initialises it). The images and the job draw
# from a fresh seed (cli_setup.sh: MOETRAIN_TEST_SEED when set, printed on failure).
# Usage: vision_cli_check.sh MOETRAIN
set -euo pipefail
bin=$1
own_data=1  # its own data; the job seed from cli_setup.sh
source "$(dirname "$0")/../parallel/cli_setup.sh"

python3 "$src/tools/make_vision_demo.py" --out "$T/task" --train 48 --heldout 16 --seed "$run_seed" \
  >/dev/null
python3 - "$src/tests/golden/k25_a/model/config.json" "$T/model.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["vocab_size"] = 304
c.update(image_token_id=300, video_token_id=301, vision_start_token_id=302, vision_end_token_id=303)
json.dump(c, open(sys.argv[2], "w"))
PY
"$bin" data prepare "$T/task/text.txt" --separator % --vocab 300 --seq 32 --out "$T/tok" >/dev/null 2>&1
for s in train heldout; do
  "$bin" data prepare "$T/task/$s.jsonl" --tokenizer "$T/tok/tokenizer.model" --image-token-id 300 \
    --patch-size 4 --seq 32 --heldout 0 --out "$T/$s" >/dev/null
done
cat >"$T/job.toml" <<TOML
[run]
dir = "$T/run"
seed = $run_seed
threads = 1
device = "cpu"
[model]
config = "$T/model.json"
vision_tower = "train"
[data]
train = "$T/train/train"
eval = { held = "$T/heldout/train" }
[lora]
targets = ["attention", "dense_ffn", "vision_projector"]
rank = 4
[schedule]
steps = 4
warmup = 1
[train]
batch = 4
[log]
progress = "off"
TOML
"$bin" train --job "$T/job.toml" >"$T/train.log" 2>&1 || { cat "$T/train.log"; exit 1; }
grep -q '"eval"' "$T/run/metrics.jsonl" || { echo "no held-out eval in metrics"; exit 1; }
"$bin" eval --checkpoint "$T/run/checkpoints" --data "held=$T/heldout/train" --exact-match \
  --threads 1 | tee "$T/eval.log"
awk '$1 == "held" { ok = ($5 == 16 && $6 >= 0 && $6 <= 1) } END { exit ok ? 0 : 1 }' "$T/eval.log" ||
  { echo "eval --exact-match did not report 16 answers"; exit 1; }
echo "vision train + eval: ok"
