"""The model and tokenizer from a checkpoint, with a head for the task's labels (a replaced head
freshly initialized)."""

from __future__ import annotations

from pathlib import Path

from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from finetune.data.labels import model_head, settle_label_order
from finetune.data.tasks import Task
from finetune.errors import ConfigError
from finetune.hub import hub_error
from finetune.model.options import loading_error
from finetune.model.quantization import keep_as_loaded, keeping_head


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
        loading = keeping_head(loading, AutoModelForSequenceClassification, model_config, "SEQ_CLS")
        # A head of another size is new anyway: transformers initializes it instead of refusing.
        model = AutoModelForSequenceClassification.from_pretrained(
            model_name_or_path, config=model_config, ignore_mismatched_sizes=replaced, **loading
        )
        keep_as_loaded(model)  # --load_in_4bit: the base the same on every CPU class
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
    except OSError as error:  # no such model, a gated one, no model files in the folder
        raise hub_error(model_name_or_path, error) from None
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
