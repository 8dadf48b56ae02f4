#!/usr/bin/env bash
# Issue #35 in one call of the lent GPU (docs/benchmarks.md, "GPU"): each stage under its own time cap, every
# result written to $OUT as it lands, so a cut-short call still returns what finished. From the repository
# root, with .gpu/ carried (see gpu_setup.sh):  OUT=<folder> benchmarks/gpu_session.sh
set -uo pipefail
: "${OUT:?set OUT to an output folder}"
exec > >(tee -a "$OUT/log.txt") 2>&1
started=$SECONDS
stage() { echo "=== $(date -u +%H:%M:%S) +$((SECONDS - started))s $*"; }
stage setup
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
source benchmarks/gpu_setup.sh || exit 1
python3 -c "import torch, transformers, accelerate, datasets, peft; print('torch', torch.__version__,
'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'datasets', datasets.__version__,
'peft', peft.__version__)"
MODEL=/tmp/bert-base DATA=.gpu/mnli

stage "steps (variants; none starts after 100 s)"
timeout -k 5 200 python3 benchmarks/gpu_steps.py $MODEL $DATA "$OUT/steps.json" --budget_s 100

stage "numerics (varlen against padded, bf16 against fp64)"
timeout -k 5 45 python3 benchmarks/gpu_checks.py $MODEL $DATA "$OUT/checks.json" | cut -c1-400

stage "whole runs: 9,888 rows x 3 epochs, batch 32"
timeout -k 5 270 python3 -m benchmarks.bench --model_name_or_path $MODEL --data_dir $DATA --train_samples 9888 \
  --eval_samples 9815 --num_train_epochs 3 --runs toolkit,trainer_tuned,bare --extra_runs graphs \
  --skip_prep --output_dir /tmp/bench32
pkill -f benchmarks.bench; cp /tmp/bench32/bench.json "$OUT/bench32.json" 2>/dev/null \
  || cp /tmp/bench32/bench.partial.json "$OUT/bench32.partial.json"

stage "exact resume on CUDA (eager; then with --full_determinism)"
timeout -k 5 60 benchmarks/gpu_resume.sh $MODEL $DATA /tmp/resume
timeout -k 5 90 benchmarks/gpu_resume.sh $MODEL $DATA /tmp/resume_det --full_determinism
stage done
