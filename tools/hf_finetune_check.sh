#!/usr/bin/env bash
# The end-to-end check of docs/formats.md "Fine-tuning HF checkpoints": for each family a small
# random sharded HF model (tools/make_hf_model.py, bf16 weights), `moetrain train --model DIR`
# with LoRA for 50 steps on text prepared with the repo's own tokenizer, the loss must fall, and
# the `export --format peft` adapter must load in transformers + PEFT and reproduce moetrain's
# logits (tools/check_peft.py). Needs torch, transformers, peft and safetensors (PYTHON).
# Usage: tools/hf_finetune_check.sh [WORK=build/hfcheck]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-build/hfcheck}
PY=${PYTHON:-python3}
MT=build/moetrain
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
rm -rf "$WORK"
mkdir -p "$WORK"
$MT data prepare README.md docs --ext .md --heldout 0.3 --out "$WORK/data" --vocab 512 --seq 64 >/dev/null
for fam in kimi_linear deepseek_v3 deepseek_v32; do
  $PY tools/make_hf_model.py --family "$fam" --vocab 512 --dtype bfloat16 \
    --out "$WORK/models/$fam/model" 2>/dev/null | tail -1
  targets='["attention", "shared_experts", "dense_ffn"]'
  [ "$fam" = kimi_linear ] && targets='["attention", "kda", "shared_experts", "dense_ffn"]'
  $MT train --job configs/lora-hf.toml --model "$WORK/models/$fam/model" \
    --set run.dir="$WORK/runs/$fam" --set data.train="$WORK/data/train" \
    --set "lora.targets=$targets" --set lora.rank=4 --set log.every=1 >"$WORK/$fam.train.log"
  first=$(head -1 "$WORK/runs/$fam/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  last=$(tail -1 "$WORK/runs/$fam/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  echo "$fam: loss $first -> $last"
  $PY -c "import sys; sys.exit(0 if $last < $first - 0.25 else 1)" || { echo "$fam: loss did not fall"; exit 1; }
  case="$WORK/peft/$fam"
  mkdir -p "$case"
  $MT export --checkpoint "$WORK/runs/$fam/checkpoints" --format peft --out "$case/adapter" >/dev/null
  $MT forward --checkpoint "$WORK/runs/$fam/checkpoints" --tokens "$WORK/models/$fam/inputs.safetensors" \
    --out "$case/moetrain_lora.safetensors" >/dev/null
  $MT forward --model "$WORK/models/$fam/model" --tokens "$WORK/models/$fam/inputs.safetensors" \
    --out "$case/moetrain_base.safetensors" >/dev/null
done
$PY tools/check_peft.py --dir "$WORK/peft" --golden "$WORK/models" --out "$WORK/peft.json" \
  | cut -c1-400
