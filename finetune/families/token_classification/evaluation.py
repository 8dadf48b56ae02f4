"""Evaluation and predictions per word, whatever the alignment: each word's tag read from its first
sub-token in the window that scores it, gathered from every rank with its sentence and word number
(Accelerate's repeated windows dropped), and checked to hold every word of every sentence exactly once."""

from __future__ import annotations

import numpy as np
import torch

from finetune.families.token_classification.batches import POSITIONS, row_losses
from finetune.families.token_classification.tags import confusion, entities, entity_scores, word_scores
from finetune.training.evaluation import EvaluationAbandoned, progress, without_autocast


def scored_words(accelerator, model, loader, task, should_stop=None, desc: str = "eval") -> dict:
    """Collective: every scored word's sentence (`row`), position (`word`), predicted label id (`tag`) and
    probability (`score`), as numpy arrays in no particular order, and the loss summed over the labelled
    sub-tokens with their count (0 for unlabelled rows). Widths differ across ranks: padded to the widest
    before each gather."""
    model = getattr(model, "_orig_mod", model)
    model.eval()
    parts = {"row": [], "word": [], "tag": [], "score": []}
    loss, tokens = [], []
    with torch.no_grad(), progress(accelerator, loader, desc) as batches:
        for batch in batches:
            if should_stop is not None and should_stop():  # every rank, at the same batch
                model.train()
                raise EvaluationAbandoned
            labels = batch.pop("labels", None)
            batch.pop(POSITIONS, None)
            rows, index = batch.pop("row"), batch.pop("word_index")
            logits = model(**batch).logits.float()
            score, tag = logits.softmax(dim=-1).max(dim=-1)
            index, tag, score = accelerator.pad_across_processes((index, tag, score), dim=1, pad_index=-1)
            if labels is not None:
                summed, count = row_losses(logits, labels, task)
                rows, index, tag, score, summed, count = accelerator.gather_for_metrics(
                    (rows, index, tag, score, summed, count)
                )
                loss.append(summed)
                tokens.append(count)
            else:
                rows, index, tag, score = accelerator.gather_for_metrics((rows, index, tag, score))
            scored = index >= 0
            parts["row"].append(rows[:, None].expand_as(index)[scored])
            parts["word"].append(index[scored])
            parts["tag"].append(tag[scored])
            parts["score"].append(score[scored])
    model.train()
    words = {key: torch.cat(values).cpu().numpy() for key, values in parts.items()}
    words["loss"] = float(torch.cat(loss).sum()) if loss else 0.0
    words["tokens"] = int(torch.cat(tokens).sum()) if tokens else 0
    return words


def per_sentence(words: dict, key: str, lengths: list[int]) -> list[list]:
    """`words[key]` as one list per sentence in word order; every word of every sentence must be there
    exactly once (a RuntimeError otherwise: a word dropped or counted twice is a bug, not a result)."""
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = starts[words["row"]] + words["word"]
    counts = np.bincount(flat, minlength=starts[-1])
    if len(flat) != starts[-1] or (counts != 1).any():
        raise RuntimeError(
            f"the windows scored {len(flat)} words ({int((counts > 0).sum())} distinct) of {starts[-1]}"
        )
    ordered = np.empty(starts[-1], dtype=words[key].dtype)
    ordered[flat] = words[key]
    return [ordered[starts[i] : starts[i + 1]].tolist() for i in range(len(lengths))]


def evaluate_tags(model, eval_loaders: dict, should_stop=None, *, accelerator, task) -> dict:
    """Collective: per split, the scores of the predicted tags against the gold ones, word by word
    (tags.py: entity precision, recall, F1 and word accuracy; or accuracy and macro F1), eval_loss over
    the labelled sub-tokens, the sentences and words counted, and the confusion matrix (up to 50 tags)."""
    results = {}
    for split, loader in eval_loaders.items():
        gold = task.references[split]
        words = scored_words(accelerator, model, loader, task, should_stop)
        ids = per_sentence(words, "tag", [len(tags) for tags in gold])
        predicted = [[task.label_names[i] for i in sentence] for sentence in ids]
        scores = entity_scores(gold, predicted) if task.entity_tags else word_scores(gold, predicted)
        scores = {**dict.fromkeys(task.per_class_metrics, 0), **scores}
        prefix = "eval" if split == "validation" else f"eval_{split}"
        results.update({f"{prefix}_{name}": value for name, value in scores.items()})
        results[f"{prefix}_loss"] = words["loss"] / max(words["tokens"], 1)
        results[f"{prefix}_samples"] = len(gold)
        results[f"{prefix}_words"] = sum(len(tags) for tags in gold)
        matrix = confusion(gold, predicted, task.label_names)
        if matrix is not None:  # rows: gold tag, columns: predicted; not sent to trackers
            results[f"{prefix}_confusion_matrix"] = matrix
    return results


def predict_tags(accelerator, model, loader, task, num_rows: int) -> list[dict]:
    """Collective: predictions.jsonl's lines in input order: the row's `words`, their `tags` and `scores`
    (the tag's probability), the `text` the spans index, and the `entities` (tag sets with a scheme):
    `type`, `start`/`end` (character offsets into the text), `words`, `score` (the mean of its words')."""
    inputs = task.references["test"]
    if len(inputs) != num_rows:
        raise RuntimeError(f"predictions cover {len(inputs)} rows of {num_rows}")
    # pipeline's: the exported weights, not autocast's rounding (which can flip a near-tie's tag)
    with without_autocast(accelerator.unwrap_model(model, keep_torch_compile=False)):
        words = scored_words(accelerator, model, loader, task, desc="predict")
    lengths = [len(row["words"]) for row in inputs]
    ids, scores = per_sentence(words, "tag", lengths), per_sentence(words, "score", lengths)
    lines = []
    for number, (row, tag_ids, probabilities) in enumerate(zip(inputs, ids, scores, strict=True)):
        tags = [task.label_names[i] for i in tag_ids]
        found = []
        for kind, first, last in entities(tags) if task.entity_tags else ():
            found.append({
                "type": kind, "start": row["spans"][first][0], "end": row["spans"][last][1],
                "words": row["words"][first : last + 1],
                "score": float(np.mean(probabilities[first : last + 1])),
            })  # fmt: skip
        lines.append({"row": number, "text": row["text"], "words": row["words"], "tags": tags,
                      "scores": probabilities, "entities": found})  # fmt: skip
    return lines
