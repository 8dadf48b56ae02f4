# sourced by every device call: carried wheels, offline, BERT-base shape with random weights
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
