#!/usr/bin/env bash
# The end-to-end check of docs/formats.md "Fine-tuning HF checkpoints": for each family a small
# random sharded HF model (tools/make_hf_model.py, bf16 weights) with a tokenizer trained by
# tools/make_tokenizers.py (tests/tokenizer: DeepSeek-V3's byte-level BPE for the deepseek types,
# Kimi's tiktoken for kimi_linear); the repo's docs prepared with that tokenizer
# (`data prepare --tokenizer MODEL_DIR`); then
#   LoRA: `moetrain train --model DIR` for 50 steps (attention, KDA, shared and routed experts,
#         dense MLPs), the loss must fall, and the `export --format peft` adapter must load with
#         PeftModel.from_pretrained and reproduce moetrain's logits (tools/check_peft.py);
#   full: 50 steps of full fine-tuning, the loss must fall, and the `export --format hf`
#         directory must load in transformers with moetrain's logits (tools/check_hf_export.py).
# Needs torch, transformers, peft and safetensors (PYTHON).
# Usage: tools/hf_finetune_check.sh [WORK=build/hfcheck]
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${1:-build/hfcheck}
PY=${PYTHON:-python3}
MT=build/moetrain
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
rm -rf "$WORK"
mkdir -p "$WORK"
loss_falls() {  # run dir, label
  local first last
  first=$(head -1 "$1/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  last=$(tail -1 "$1/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["loss"])')
  echo "$2: loss $first -> $last"
  $PY -c "import sys; sys.exit(0 if $last < $first - 0.25 else 1)" || { echo "$2: loss did not fall"; exit 1; }
}
for fam in kimi_linear deepseek_v3 deepseek_v32; do
  tok=deepseek_v3 vocab=512
  [ "$fam" = kimi_linear ] && tok=kimi vocab=1024  # 768 ranks + Kimi's 256 reserved ids
  model="$WORK/models/$fam/model"
  $PY tools/make_hf_model.py --family "$fam" --vocab $vocab --dtype bfloat16 \
    --tokenizer "tests/tokenizer/$tok" --out "$model" 2>/dev/null | tail -1
  $MT data prepare README.md docs --ext .md --heldout 0.3 --out "$WORK/data/$fam" \
    --tokenizer "$model" --seq 64 >/dev/null
  targets='["attention", "shared_experts", "routed_experts", "dense_ffn"]'
  [ "$fam" = kimi_linear ] && targets='["attention", "kda", "shared_experts", "routed_experts", "dense_ffn"]'
  $MT train --job configs/lora-hf.toml --model "$model" \
    --set run.dir="$WORK/runs/$fam" --set data.train="$WORK/data/$fam/train" \
    --set "lora.targets=$targets" --set lora.rank=4 --set log.every=1 >"$WORK/$fam.train.log"
  loss_falls "$WORK/runs/$fam" "$fam lora"
  case="$WORK/peft/$fam"
  mkdir -p "$case"
  $MT export --checkpoint "$WORK/runs/$fam/checkpoints" --format peft --out "$case/adapter" >/dev/null
  $MT forward --checkpoint "$WORK/runs/$fam/checkpoints" --tokens "$WORK/models/$fam/inputs.safetensors" \
    --out "$case/moetrain_lora.safetensors" >/dev/null
  $MT forward --model "$model" --tokens "$WORK/models/$fam/inputs.safetensors" \
    --out "$case/moetrain_base.safetensors" >/dev/null

  $MT train --job configs/full-hf.toml --model "$model" --set run.dir="$WORK/runs/$fam-full" \
    --set data.train="$WORK/data/$fam/train" --set log.every=1 >"$WORK/$fam.full.log"
  loss_falls "$WORK/runs/$fam-full" "$fam full"
  $MT export --checkpoint "$WORK/runs/$fam-full/checkpoints" --format hf --out "$WORK/export/$fam" >/dev/null
  $MT forward --checkpoint "$WORK/runs/$fam-full/checkpoints" \
    --tokens "$WORK/models/$fam/inputs.safetensors" --out "$WORK/export/$fam.moetrain.safetensors" >/dev/null
  $PY tools/check_hf_export.py --model "$WORK/export/$fam" --tokens "$WORK/models/$fam/inputs.safetensors" \
    --logits "$WORK/export/$fam.moetrain.safetensors" 2>/dev/null | tail -1
done
$PY tools/check_peft.py --dir "$WORK/peft" --golden "$WORK/models" --out "$WORK/peft.json" \
  | cut -c1-400
