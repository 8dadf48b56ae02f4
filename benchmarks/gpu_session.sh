#!/usr/bin/env bash
# One call of a lent GPU (docs/benchmarks.md, "GPU"): SFT's packing through torch's varlen kernel checked
# and run; --cuda_graphs checked and measured against eager and HF Trainer tuned. Each stage under its own
# time cap, every result written to $OUT as it lands, so a cut-short call still returns what finished.
# From the repository root, with .gpu/ carried (benchmarks/gpu_prepare.sh builds it; gpu_setup.sh):
#   OUT=<folder> [STAGES=sft,same,steps,runs32,fsdp,runs256,steps256] benchmarks/gpu_session.sh
set -uo pipefail
: "${OUT:?set OUT to an output folder}"
STAGES=",${STAGES:-sft,same,steps,runs32,fsdp,runs256,steps256},"
exec > >(tee -a "$OUT/log.txt") 2>&1
started=$SECONDS
stage() { echo "=== $(date -u +%H:%M:%S) +$((SECONDS - started))s $*"; }
wanted() { [[ $STAGES == *",$1,"* ]]; }
stage setup
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
source benchmarks/gpu_setup.sh || exit 1
python3 -c "import torch, transformers, accelerate, datasets, peft; print('torch', torch.__version__,
'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'datasets', datasets.__version__,
'peft', peft.__version__)"
MODEL=/tmp/bert-base DATA=.gpu/mnli

if wanted sft; then
  stage "SFT --packing: torch's varlen kernel against its reference and against documents alone; step times"
  timeout -k 5 150 python3 benchmarks/gpu_sft.py "$OUT/sft.json"
  stage "SFT: whole runs on generated chats, packed (the kernel) and unpacked, bf16"
  timeout -k 5 240 python3 benchmarks/gpu_sft.py "$OUT/sft_runs.json" --runs .gpu/chatml
fi

if wanted same; then
  stage "same function: 40 updates eager and with --cuda_graphs, each resumed at 20 (--full_determinism)"
  for mode in false true; do
    timeout -k 5 60 benchmarks/gpu_resume.sh $MODEL $DATA /tmp/resume_$mode --cuda_graphs $mode --full_determinism
    grep -h "cuda_graphs=" /tmp/resume_$mode/a.log | grep -o "cuda_graphs=[a-z]*"
    python3 -c "import json,sys; print('losses', [round(json.loads(l)['loss'], 6) for l in open(sys.argv[1])
      if '\"loss\"' in l and 'eval' not in l])" /tmp/resume_$mode/a/metrics.jsonl
  done
  a=$(sha256sum < /tmp/resume_false/a/model.safetensors) b=$(sha256sum < /tmp/resume_true/a/model.safetensors)
  [ "$a" = "$b" ] && echo "eager and graphs: equal weights" || echo "eager and graphs: DIFFERENT weights"
fi

steps() {  # $1: output name, $2: variants
  timeout -k 5 110 python3 benchmarks/gpu_steps.py $MODEL $DATA "$OUT/$1.json" --budget_s 45 --variants "$2"
}
if wanted steps; then
  stage "steps at batch 32 (eager against graphs; none starts after 45 s)"
  steps steps b32_padded_8_eager,b32_padded_8_graphs,b32_buckets_32_graphs
fi

runs() {  # $1: batch, $2: runs, $3: extra runs
  timeout -k 5 200 python3 -m benchmarks.bench --model_name_or_path $MODEL --data_dir $DATA --train_samples 9888 \
    --eval_samples 9815 --num_train_epochs 3 --batch_size "$1" --runs "$2" --extra_runs "$3" --skip_prep \
    --output_dir /tmp/bench$1
  pkill -f benchmarks.bench; cp /tmp/bench$1/bench.json "$OUT/bench$1.json" 2>/dev/null \
    || cp /tmp/bench$1/bench.partial.json "$OUT/bench$1.partial.json"
}
if wanted runs32; then
  stage "whole runs: 9,888 rows x 3 epochs, batch 32 (toolkit = its defaults)"
  runs 32 toolkit,trainer_tuned "${EXTRA32-eager}"
fi

if wanted fsdp; then
  stage "FSDP2 on one GPU: 1,280 rows, export"
  timeout -k 5 60 accelerate launch --config_file accelerate_configs/fsdp.yaml --num_processes 1 --gpu_ids 0 \
    -m finetune --model_name_or_path $MODEL --train_file $DATA/train.jsonl --validation_file \
    $DATA/validation_matched.jsonl --max_train_samples 1280 --max_eval_samples 256 --report_to none \
    --output_dir /tmp/fsdp > "$OUT/fsdp.log" 2>&1
  echo "exit $?"; grep -v "Warning\|warn(" "$OUT/fsdp.log" | grep -B2 -A3 "Error\|error:" | head -30
  python3 -c "import json; r=json.load(open('/tmp/fsdp/results.json')); print({k: r.get(k) for k in
    ('distributed_type', 'eval_matched_accuracy', 'global_step', 'train_samples_per_second')})"
fi

if wanted runs256; then
  stage "whole runs: 9,888 rows x 3 epochs, batch 256"
  runs 256 toolkit,trainer_tuned "${EXTRA256-}"
fi
if wanted steps256; then
  stage "steps at batch 256 (none starts after 45 s)"
  steps steps256 b256_padded_8_eager,b256_padded_8_graphs,b256_varlen_eager
fi

stage done
