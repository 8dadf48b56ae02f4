"""`--task_type token_classification`: the family's model (AutoModelForTokenClassification with the tags as
id2label, full or LoRA), its loss (summed cross-entropy over labelled sub-tokens, their count as units),
its evaluation and predictions per word (evaluation.py), its refusals and its card."""

from __future__ import annotations

import functools

from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

from finetune.data.batching import build_dataloaders, resolve_pad_to_multiple_of
from finetune.errors import ConfigError
from finetune.families.family import (
    Evaluator,
    MicroBatch,
    class_weights_line,
    metric_choice,
    weights_by_label,
)
from finetune.families.token_classification.batches import POSITIONS, TagCollator, token_loss
from finetune.families.token_classification.encoding import encode_splits, stride_of
from finetune.families.token_classification.evaluation import evaluate_tags, predict_tags
from finetune.families.token_classification.tags import SCHEME_WORDS
from finetune.families.token_classification.task import TagTask, load_tag_splits, model_labels
from finetune.hub import hub_error
from finetune.model.backbones import fit_tokenizer_to_model
from finetune.model.build import plain_speed
from finetune.model.loading import _reset_head
from finetune.model.lora import wrap_with_lora
from finetune.model.options import loading_error, refuse_checkpoint_dtype
from finetune.model.quantization import keep_as_loaded, keeping_head
from finetune.output.card import CardParts, confusion_section
from finetune.speed.memory import enable_gradient_checkpointing

ADD_PREFIX_SPACE = ("roberta", "deberta", "gpt2", "bloom", "longformer")
"""Byte-level BPE tokenizers that read pre-split words only with a space before each (run_ner's list)."""


class TokenClassification:
    name = "token_classification"
    pipeline_tag = "token-classification"
    captures_cuda_graphs = False
    done_in_export = {}

    def load(self, config) -> tuple[TagTask, dict]:
        if config.text_column_names and len(config.text_column_names) != 1:
            raise ConfigError(
                f"--text_columns {config.text_columns}: token_classification reads one column of words; "
                "name one",
                flag="--text_columns",
            )
        return load_tag_splits(config)

    def choose_metric(self, config, task: TagTask, splits: dict) -> dict:
        measured = [*task.metric_keys(per_class=False), "eval_loss", *task.metric_keys()]
        return metric_choice(config, splits, measured, measured[0])

    def check(self, config, task: TagTask, splits: dict) -> None:
        """Everything is refused in `load`, before the data is read."""

    def build_model(self, args, task: TagTask, accelerator, loading: dict, bf16_native: bool, cuda_graphs):
        model, tokenizer, kept = _load(args, task, loading)
        device_type = accelerator.device.type
        refuse_checkpoint_dtype(model, args, device_type, bf16_native)
        changes = fit_tokenizer_to_model(model, tokenizer)
        if getattr(model.config, "use_cache", False):
            model.config.use_cache = False  # a tagger never generates
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        speed = plain_speed(args, model, accelerator)
        if args.use_peft:
            model = wrap_with_lora(model, args, "TOKEN_CLS")
        backbone = {
            "model_type": model.config.model_type,
            "head": "token classifier (a tag per sub-token), " + ("kept" if kept else "new"),
            "dtype": str(model.dtype).removeprefix("torch."),
            "tokenizer_changes": changes,
        }
        return model, tokenizer, backbone, speed

    def tokenize(self, task: TagTask, splits: dict, tokenizer, config, accelerator) -> dict:
        """The splits as windows (encoding.py); no collective: the rows are in memory and every rank
        encodes them alike, a pure function of the rows, the tokenizer and the flags."""
        return encode_splits(task, splits, tokenizer, config)

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
        token_types = "token_type_ids" in tokenizer.model_input_names
        collator = TagCollator(tokenizer.pad_token_id, token_types, multiple, config.max_length)
        return build_dataloaders(tokenized, tokenizer, config, world_size, on_gpu, collator=collator)

    def forward_backward(
        self, model, accelerator, task: TagTask, batch: dict, batch_divisor: int, graphs=None
    ) -> MicroBatch:
        """The summed cross-entropy of the micro-batch's labelled sub-tokens and their count: the loop
        divides the window's gradients by every rank's count, so an update is the mean per labelled
        sub-token of the whole window. Rows: the windows."""
        labels, positions = batch.pop("labels"), batch.pop(POSITIONS)
        batch.pop("row"), batch.pop("word_index")
        tokens = batch["attention_mask"].sum()
        summed, units = token_loss(model(**batch).logits, labels, positions, task)
        accelerator.backward(summed / batch_divisor)
        return MicroBatch(summed.detach(), units, labels.shape[0], tokens)

    def evaluator(self, task: TagTask, accelerator) -> Evaluator:
        return functools.partial(evaluate_tags, accelerator=accelerator, task=task)

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        return eval_loaders

    def predict(self, accelerator, model, loader, task: TagTask, num_rows: int) -> list[dict]:
        return predict_tags(accelerator, model, loader, task, num_rows)

    def card_parts(self, config, task: TagTask, results: dict) -> CardParts:
        model = config.hub_model_id or config.output_dir
        names = ", ".join(task.label_names[:12]) + (", ..." if len(task.label_names) > 12 else "")
        if task.entity_tags and task.scheme != "BIOES":
            asked = (
                'print(tag("John Smith lives in Paris."))  # entities: entity_group, score, word, start, end'
            )
            # "first": each word's tag from its first sub-token, as this model was trained and scored
            # ("simple" tags each sub-token alone, so a word of several can split).
            pipe = f'pipeline("token-classification", model="{model}", aggregation_strategy="first")'
        elif task.entity_tags:  # the pipeline's grouping reads B-/I- alone: S-PER S-PER would be one entity
            asked = 'print(tag("John Smith lives in Paris."))  # a BIOES tag per sub-token, as `entity`'
            pipe = f'pipeline("token-classification", model="{model}")'
        else:
            asked = 'print(tag("The cat sat on the mat."))  # a tag per sub-token: entity, score, word'
            pipe = f'pipeline("token-classification", model="{model}")'
        use = ("from transformers import pipeline", "", f"tag = {pipe}", asked)
        trained_on = f"**tagging** (a tag per word, scheme {SCHEME_WORDS[task.scheme]}: {names})"
        long_sentences = (
            f"- long sentences: windows over words of up to {config.max_length} tokens overlapping by "
            f"{stride_of(config)} words, each word tagged in the window where it has the most context (a "
            "`pipeline` reads one window: pass it `stride` for longer texts)"
        )
        return CardParts(
            pipeline_tag=self.pipeline_tag,
            tag="token-classification",
            trained_on=trained_on,
            use=use,
            training=(*class_weights_line(task), long_sentences),
            sections=tuple(confusion_section(results)),
        )

    def subject(self, config) -> str:
        return "tagging"

    def record_extras(self, task: TagTask) -> dict:
        return {"class_weights_by_label": weights_by_label(task)}

    def fit_batch_size(self, config, model, train, tokenizer, accelerator) -> tuple[dict, str]:
        raise NotImplementedError(
            "--auto_find_batch_size is refused for taggers (sequence_classification/flags.py OWNED)"
        )

    def step_graphs(self, args, config, accelerator, model, task: TagTask) -> None:
        """No CUDA graphs (`captures_cuda_graphs`)."""

    def finish(self, run) -> dict:
        """Nothing: the export is the trained model."""
        return {}


def _load(args, task: TagTask, loading: dict):
    """AutoModelForTokenClassification with the tags as id2label, and its fast tokenizer. A checkpoint
    that is a token classifier with these very labels keeps its head; any other gets a new one."""
    name = args.model_name_or_path
    hub = {key: loading[key] for key in ("revision", "trust_remote_code") if key in loading}
    head = {"id2label": dict(enumerate(task.label_names)),
            "label2id": {label: i for i, label in enumerate(task.label_names)}}  # fmt: skip
    kept = model_labels(name, hub) == task.label_names
    try:
        model_type = AutoConfig.from_pretrained(name, **hub).model_type
        spaced = {"add_prefix_space": True} if model_type in ADD_PREFIX_SPACE else {}
        tokenizer = AutoTokenizer.from_pretrained(name, **hub, **spaced)
        model_config = AutoConfig.from_pretrained(name, **hub, **head)
        loading = keeping_head(loading, AutoModelForTokenClassification, model_config, "TOKEN_CLS")
        model = AutoModelForTokenClassification.from_pretrained(
            name, config=model_config, ignore_mismatched_sizes=not kept, **loading
        )
        keep_as_loaded(model)  # --load_in_4bit: the base the same on every CPU class
    except ValueError as error:
        raise loading_error(name, error, loading) from None
    except OSError as error:
        raise hub_error(name, error) from None
    # config.json keeps the scheme: IOB1 and IOB2 share their tag names, so a run that only predicts
    # with this model could not tell them apart from its labels.
    model.config.tag_scheme = task.scheme
    if not kept:
        _reset_head(model)  # a sequence classifier's head of the same shape is no tagger's
    if not tokenizer.is_fast:
        raise ConfigError(
            f"--model_name_or_path {name}: its tokenizer is not a fast (Rust) one, which word alignment "
            "needs (word_ids); give a model with tokenizer.json"
        )
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and args.max_length > positions:
        raise ConfigError(
            f"--max_length {args.max_length} exceeds the model's {positions} positions; lower it"
        )
    return model, tokenizer, kept
