"""Scoring one long document with a model (trained here or not), as --long_documents sliding_window does:
the same windows (finetune.data.windows), the same aggregation of their logits, a prediction shaped
like a line of predictions.jsonl. A `pipeline` scores only one window of a long text.

    from finetune.long_documents import score_document
    score_document("outputs/custom", text)  # {"label": ..., "probabilities": {...}, "windows": 3}
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from finetune.data.tasks import Task
from finetune.data.windows import by_document, encode_windows


def score_document(
    model_or_folder,
    text: str,
    text_pair: str | None = None,
    max_length: int | None = None,
    doc_stride: int | None = None,
    aggregation: str | None = None,
    tokenizer=None,
) -> dict:
    """One document's prediction: {label, probabilities} (multi-label: labels, probabilities;
    regression: score) and its number of windows. `model_or_folder`: a folder (its tokenizer too) or a
    loaded sequence-classification model with `tokenizer`. Settings left unset: as the folder's
    train_config.json records its training, else --max_length 128, a quarter of it as stride, mean."""
    model, tokenizer, recorded = _load(model_or_folder, tokenizer)
    max_length = max_length or recorded.get("max_length") or 128
    default_stride = not (doc_stride or recorded.get("doc_stride"))
    doc_stride = doc_stride or recorded.get("doc_stride") or max_length // 4
    aggregation = aggregation or recorded.get("window_aggregation") or "mean"
    texts = [[text]] if text_pair is None else [[text], [text_pair]]
    encoded = encode_windows(tokenizer, texts, max_length, doc_stride, default_stride)
    keep = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded]
    device = next(model.parameters()).device
    logits = []
    model.eval()
    with torch.no_grad():  # window by window: no padding, each scored as it is alone
        for i in range(len(encoded["input_ids"])):
            window = {k: torch.tensor([encoded[k][i]], device=device) for k in keep}
            logits.append(model(**window).logits.float().cpu())
    logits = torch.cat(logits)
    docs = torch.zeros(len(logits), dtype=torch.long)
    _, _, document, windows = by_document(docs, docs, logits, aggregation)
    # torch-heavy metrics: on use only
    from finetune.families.sequence_classification.evaluation import prediction_lines

    line = prediction_lines(document, _task(model.config, recorded))[0]
    line.pop("row")
    return {**line, "windows": int(windows[0])}


def _load(model_or_folder, tokenizer):
    """(model, tokenizer, the folder's recorded flags or {})."""
    recorded = {}
    if isinstance(model_or_folder, (str, Path)):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(model_or_folder)
        for record in (folder / "train_config.json", folder.parent / "train_config.json"):
            if record.is_file():
                recorded = json.loads(record.read_text())
                recorded = {**recorded, **(recorded.get("resolved") or {})}
                break
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(folder)
        return AutoModelForSequenceClassification.from_pretrained(folder), tokenizer, recorded
    if tokenizer is None:
        raise ValueError("score_document: give the model's tokenizer with a loaded model")
    return model_or_folder, tokenizer, recorded


def _task(config, recorded: dict) -> Task:
    """The task as far as predictions need it: labels, multi-label, regression, the threshold."""
    regression = config.problem_type == "regression" or config.num_labels == 1
    names = None if regression else tuple(config.id2label[i] for i in range(config.num_labels))
    return Task(
        name="custom",
        text_columns=("text",),
        label_names=names,
        metrics=(),
        multi_label=config.problem_type == "multi_label_classification",
        threshold=recorded.get("multi_label_threshold") or 0.5,
    )
