#!/usr/bin/env bash
# Issue #35's exact-resume check on CUDA: one run of 40 updates with a checkpoint at 20, then a second
# run resumed from a copy of that checkpoint in another folder; prints both final weights' sha256 (they
# must be equal) and "resume bitwise: equal|DIFFERENT". Extra flags go to both runs (e.g.
# --torch_compile_mode reduce-overhead --pad_to_multiple_of 32).
# usage: benchmarks/gpu_resume.sh MODEL_DIR MNLI_DIR WORK_DIR [flags...]
set -uo pipefail
MODEL=$1 DATA=$2 WORK=$3
shift 3
rm -rf "$WORK" && mkdir -p "$WORK/b"
COMMON=(--model_name_or_path "$MODEL" --train_file "$DATA/train.jsonl"
  --validation_file "$DATA/validation_matched.jsonl" --max_train_samples 1280 --max_eval_samples 256
  --per_device_train_batch_size 32 --num_train_epochs 1 --checkpointing_steps 20 --logging_steps 10
  --report_to none --seed 7 "$@")
"${PYTHON:-python3}" -m finetune "${COMMON[@]}" --output_dir "$WORK/a" > "$WORK/a.log" 2>&1 || { tail -5 "$WORK/a.log"; exit 1; }
cp -r "$WORK/a/checkpoint-20" "$WORK/b/"
"${PYTHON:-python3}" -m finetune "${COMMON[@]}" --output_dir "$WORK/b" --resume_from_checkpoint "$WORK/b/checkpoint-20" \
  > "$WORK/b.log" 2>&1 || { tail -5 "$WORK/b.log"; exit 1; }
grep -h "resuming" "$WORK/b.log"
a=$(sha256sum < "$WORK/a/model.safetensors") b=$(sha256sum < "$WORK/b/model.safetensors")
echo "a ${a%% *}"; echo "b ${b%% *}"
[ "$a" = "$b" ] && echo "resume bitwise: equal" || echo "resume bitwise: DIFFERENT"
