#!/usr/bin/env bash
# Builds .gpu/ (git-ignored), what a lent GPU needs and cannot download (benchmarks/gpu_setup.sh installs it
# there): wheels for its Python 3.12 of the versions this checkout's .venv runs, for what its image lacks
# (datasets, evaluate and theirs) or holds in other versions (transformers, tokenizers, peft); MiniLM's
# tokenizer files; the shared MNLI rows; a ChatML tokenizer for the SFT stage. Here, after `make install`:
#   benchmarks/gpu_prepare.sh [MNLI_DIR]      (default: ../shared/data/mnli)
# then name .gpu in the device call's carry.
set -euo pipefail
MNLI=${1:-../shared/data/mnli}
rm -rf .gpu && mkdir -p .gpu/whl .gpu/mnli
pins=$(.venv/bin/python -m pip list --format=freeze 2>/dev/null |
  grep -iE '^(datasets|evaluate|dill|multiprocess|transformers|tokenizers|fsspec|peft)==')
# shellcheck disable=SC2086  # one argument per pin
.venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --dest .gpu/whl $pins
cp "$MNLI/train.jsonl" "$MNLI/validation_matched.jsonl" .gpu/mnli/
.venv/bin/python - <<'PY'
import sys

sys.path.insert(0, ".")
from transformers import AutoTokenizer

from tests.chat_models import chatml_tokenizer
from tests.helpers import minilm_dir

AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(".gpu/minilm")
chatml_tokenizer().save_pretrained(".gpu/chatml")
PY
echo "$pins" | tr '\n' ' '; echo; du -sh .gpu
