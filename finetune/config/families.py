"""The flags that only some task families read, and the one rule for them: a flag set (away from its
default, or to a value that asks for its path) under a --task_type that does not read it is refused in
one line naming the flag and --task_type, before anything loads. Accepted, it would change nothing but
the run's identity and card, and the user would believe it honoured.

The families are named here, in the configuration, and nowhere in the loop: a flag not in `OWNERS` is
every family's."""

from __future__ import annotations

from dataclasses import dataclass

from finetune.errors import ConfigError

CLASSIFICATION, CAUSAL_LM, TAGGING = "sequence_classification", "causal_lm", "token_classification"
DPO = "dpo"


@dataclass(frozen=True)
class Owned:
    """A flag that only `families` read."""

    families: tuple[str, ...]
    what: str
    """What the flag does, as the refusal says it ("--calibrate rescales a classifier's softmax")."""
    asks: tuple | None = None
    """The values that ask for what only those families have (None: any value but the default); the
    others (--padding_free false) ask for what every family does."""


CLASSIFIERS, LABELLED = (CLASSIFICATION,), (CLASSIFICATION, TAGGING)

OWNERS: dict[str, Owned] = {
    "task_name": Owned(CLASSIFIERS, "names a classification task (other families read theirs from the data)"),
    "validation_mismatched_file": Owned(CLASSIFIERS, "is MNLI's second validation set"),
    "text_columns": Owned(LABELLED, "names a classifier's text columns or a tagger's column of words"),
    "label_column": Owned(LABELLED, "names the column of a classifier's labels or a tagger's tags"),
    "label_names": Owned((TAGGING,), "names a tagger's tag ids"),
    "label_all_tokens": Owned((TAGGING,), "tags every sub-token of a word"),
    "label_separator": Owned(CLASSIFIERS, "splits a multi-label classifier's labels"),
    "multi_label_threshold": Owned(CLASSIFIERS, "is a multi-label classifier's decision threshold"),
    "class_weights": Owned(LABELLED, "weighs a classifier's labels or a tagger's tags"),
    "label_smoothing_factor": Owned(LABELLED, "smooths a classifier's labels or a tagger's tags"),
    "long_documents": Owned(CLASSIFIERS, "windows a classifier's documents"),
    "window_aggregation": Owned(CLASSIFIERS, "merges a classifier's windows into the document's score"),
    "calibrate": Owned(CLASSIFIERS, "rescales a classifier's softmax"),
    "auto_find_batch_size": Owned(CLASSIFIERS, "is measured for classifiers only; set the batch size"),
    "gguf_file": Owned((CAUSAL_LM, DPO), "loads a causal LM's GGUF checkpoint"),
    "completion_only_loss": Owned((CAUSAL_LM,), "chooses a causal LM's targets"),
    "assistant_only_loss": Owned((CAUSAL_LM,), "chooses a causal LM's targets"),
    "chat_template": Owned((CAUSAL_LM, DPO), "renders a causal LM's conversations"),
    "packing": Owned((CAUSAL_LM,), "packs a causal LM's rows"),
    "predict_with_generate": Owned((CAUSAL_LM, DPO), "generates a causal LM's completions"),
    "generation_max_new_tokens": Owned((CAUSAL_LM, DPO), "caps a causal LM's generations"),
    "chunked_loss": Owned((CAUSAL_LM,), "chunks a causal LM's loss over its vocabulary", asks=("true",)),
    "chunked_loss_tokens": Owned((CAUSAL_LM,), "sizes the chunks of a causal LM's loss"),
    "beta": Owned((DPO,), "scales a preference loss's log-ratios"),
    "loss_type": Owned((DPO,), "chooses a preference loss"),
    "simpo_gamma": Owned((DPO,), "is SimPO's reward margin"),
    "rpo_alpha": Owned((DPO,), "adds the chosen completions' SFT loss to a preference loss"),
    "ref_model_name_or_path": Owned((DPO,), "names a preference loss's reference model"),
    "precompute_ref_log_probs": Owned((DPO,), "precomputes a preference loss's reference log-probs"),
    # Classification's speed paths, asked for by name: the other families run torch's dropout on padded
    # batches (model/build.py plain_speed), and say so at the start.
    "padding_free": Owned(CLASSIFIERS, "is built for classifiers only", asks=("true", "varlen")),
    "dropout_kernel": Owned(CLASSIFIERS, "is built for classifiers only", asks=("packed",)),
    "cuda_graphs": Owned(CLASSIFIERS, "is built for classifiers only", asks=("true",)),
}  # fmt: skip


def reads(config, flag: str) -> bool:
    """Whether `config`'s --task_type reads `flag` (every family reads a flag not in `OWNERS`)."""
    return flag not in OWNERS or config.task_type in OWNERS[flag].families


def refuse_other_families_flags(config, defaults: dict) -> None:
    """Each flag of `OWNERS` that `config` sets for a --task_type that does not read it, refused naming
    both (`defaults`: each flag's default, as the dataclass declares it)."""
    for flag, owned in OWNERS.items():
        if config.task_type in owned.families:
            continue
        value = getattr(config, flag)
        if value in owned.asks if owned.asks else value != defaults[flag]:
            shown = f"--{flag} {value}" if owned.asks else f"--{flag}"
            readers = " or ".join(owned.families)
            raise ConfigError(
                f"{shown} {owned.what}: it is for --task_type {readers}, not {config.task_type}; drop it",
                flag=f"--{flag}",
                fix=f"drop --{flag}",
            )
