"""Model, tokenizer and optimizer for sentence and sentence-pair classification or regression."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from finetune.config import ConfigError
from finetune.loading import loading_error
from finetune.tasks import Task


def load_model_and_tokenizer(
    model_name_or_path: str, task: Task, max_length: int, loading: dict | None = None
):
    """The model with a head for the task's labels (saved as id2label), or one output for regression.

    `loading`: `loading_options(config)`, the flags that say how to read the checkpoint."""
    loading = loading or {}
    hub = {key: loading[key] for key in ("revision", "trust_remote_code") if key in loading}
    if task.is_regression:
        # Given in full: a base model's config.json may carry another head's id2label.
        head = {"id2label": {0: "LABEL_0"}, "label2id": {"LABEL_0": 0}, "problem_type": "regression"}
    else:
        names = task.label_names  # in the order of the model's own head when it has one (settle_label_order)
        head = {  # id2label sets num_labels
            "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)},
            "problem_type": f"{'multi' if task.multi_label else 'single'}_label_classification",
        }
    folder = Path(model_name_or_path)
    if folder.is_dir() and (folder / "config.json").is_file() and not _has_tokenizer_files(folder):
        # transformers would build a tokenizer of a handful of special tokens: every word [UNK].
        raise ConfigError(
            f"--model_name_or_path {model_name_or_path}: no tokenizer files there (tokenizer.json, "
            "vocab.txt, ...); save the model's tokenizer beside it with tokenizer.save_pretrained"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **hub)
        replaced = _head_replaced(model_name_or_path, task, hub)
        model_config = AutoConfig.from_pretrained(model_name_or_path, **hub, **head)
        # A head of another size is new anyway: transformers initializes it instead of refusing.
        model = AutoModelForSequenceClassification.from_pretrained(
            model_name_or_path, config=model_config, ignore_mismatched_sizes=replaced, **loading
        )
        if replaced:
            _reset_head(model)
    except ValueError as error:  # transformers' "can't" for a checkpoint: no class, remote code, attention
        raise loading_error(model_name_or_path, error, loading) from None
    except SafetensorError as error:
        raise ConfigError(
            f"--model_name_or_path {model_name_or_path}: a weights file there is damaged ({error}); "
            "copy or save the model again"
        ) from None
    except RuntimeError as error:  # weights whose shapes do not match config.json
        raise ConfigError(
            f"--model_name_or_path {model_name_or_path}: its weights do not fit its config.json "
            f"({str(error).splitlines()[0][:120]})"
        ) from None
    except OSError:
        raise ConfigError(
            f"--model_name_or_path {model_name_or_path}: no model there; pass a local folder "
            "(config.json, weights, tokenizer) or a Hub id with Hub access (unset HF_HUB_OFFLINE)"
        ) from None
    positions = getattr(model_config, "max_position_embeddings", None)
    if positions is not None and max_length > positions:
        raise ConfigError(f"--max_length {max_length} exceeds the model's {positions} positions; lower it")
    # Truncation can't cut a sequence below its special tokens: it would pass whole, of any length.
    pair = len(task.text_columns) == 2
    needed = tokenizer.num_special_tokens_to_add(pair=pair) + len(task.text_columns)
    if max_length < needed:
        shape = "a pair" if pair else "a sentence"
        raise ConfigError(
            f"--max_length {max_length} is below the {needed} tokens this tokenizer needs for {shape} "
            "(its special tokens plus one per text); raise it"
        )
    return model, tokenizer


def is_generic_head(names: tuple[str, ...]) -> bool:
    """transformers' default names LABEL_0..LABEL_{n-1}: a head nobody named, treated as untrained."""
    return tuple(names) == tuple(f"LABEL_{i}" for i in range(len(names)))


REGRESSION_HEAD = "regression"  # model_head's answer for a head trained to predict one score


def settle_label_order(
    task: Task, head: tuple[str, ...] | str | None, ignore_mismatched_sizes: bool, training: bool, model: str
) -> tuple[Task, bool]:
    """The task in the label order of the model's trained head `head` (model_head's answer) when its
    names are the task's (as sets, any case); and whether the head must be replaced.

    A trained head that predicts something else (other labels; a score where the task has labels, or
    the reverse) is replaced only with --ignore_mismatched_sizes and only when training; a generic one
    (LABEL_i, nobody trained it) whenever its size differs; no head: the task's own order."""
    if head is None:
        return task, False
    if head != REGRESSION_HEAD and is_generic_head(head):
        return task, len(head) != (1 if task.is_regression else task.num_labels)
    if task.is_regression and head == REGRESSION_HEAD:
        return task, False
    if not task.is_regression and head != REGRESSION_HEAD:
        ours = {name.lower(): name for name in task.label_names}
        if len(ours) == len(head) and set(ours) == {name.lower() for name in head}:
            return replace(task, label_names=tuple(ours[name.lower()] for name in head)), False
    theirs = "one regression score" if head == REGRESSION_HEAD else "/".join(head)
    wanted = "one regression score" if task.is_regression else "/".join(task.label_names)
    task_has = "the task predicts" if task.is_regression else "the task's labels are"
    mismatch = f"--model_name_or_path {model}: its head predicts {theirs}, {task_has} {wanted}"
    if not training:
        raise ConfigError(f"{mismatch}; evaluate a model trained for this task")
    if not ignore_mismatched_sizes:
        raise ConfigError(f"{mismatch}; pass --ignore_mismatched_sizes to replace the head with a new one")
    return task, True


def model_head(model_name_or_path: str, hub: dict | None = None) -> tuple[str, ...] | str | None:
    """What the model's head predicts, from its config.json: the label names in id order,
    REGRESSION_HEAD, or None when there is no readable config. Cheap: reads config.json only."""
    try:
        model_config = AutoConfig.from_pretrained(model_name_or_path, **(hub or {}))
    except (OSError, ValueError):  # load_model_and_tokenizer names the problem
        return None
    if model_config.problem_type == "regression":
        return REGRESSION_HEAD
    if not model_config.id2label:
        return None
    return tuple(model_config.id2label[i] for i in range(model_config.num_labels))


def _head_replaced(model_name_or_path: str, task: Task, hub: dict) -> bool:
    """Whether the model gets a new head; the task is settled (load_splits refused what it must), so
    this only repeats that decision."""
    head = model_head(model_name_or_path, hub)
    return settle_label_order(task, head, True, True, model_name_or_path)[1]


def _reset_head(model) -> None:
    """Every module outside the encoder (the classification head) freshly initialized, as a new head
    is: with as many labels as before, transformers would keep the old, meaningless weights."""
    for name, module in model.named_modules():
        if name and not name.startswith(model.base_model_prefix):
            for param in module.parameters(recurse=False):
                param._is_hf_initialized = False  # transformers' init skips weights it loaded
            model._init_weights(module)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "vocab.json", "spiece.model",
                   "sentencepiece.bpe.model", "tokenizer.model")  # fmt: skip


def _has_tokenizer_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def build_optimizer(
    model: torch.nn.Module,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
) -> torch.optim.AdamW:
    # Biases and LayerNorm weights (every tensor below 2-D) are not decayed: decay would only
    # pull them towards zero, where they mean "no shift" and "no scale".
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # One fused kernel per step instead of one per tensor; torch has it on CPU and CUDA.
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=epsilon, fused=True)


def non_embedding_parameters(model: torch.nn.Module) -> int:
    """N in the 6·N FLOPs per trained token of MFU: every parameter outside the embedding layer(s):
    the encoder's `embeddings` block (with its LayerNorm) where there is one, and every nn.Embedding
    (a decoder's token embeddings, GPT-2's learned positions)."""
    embeddings = getattr(model.base_model, "embeddings", None) or model.get_input_embeddings()
    excluded = {id(p) for p in embeddings.parameters()}
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            excluded.update(id(p) for p in module.parameters())
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)
