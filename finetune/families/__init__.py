"""Task families: what a run learns (sequence classification, causal-LM SFT, token classification,
DPO), plugged into the one loop; and families from outside the package, `register`ed by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from finetune.families.causal_lm.flags import OWNED as _CAUSAL_LM_FLAGS
from finetune.families.causal_lm.flags import CausalLMArgs
from finetune.families.dpo.flags import OWNED as _DPO_FLAGS
from finetune.families.dpo.flags import PreferenceArgs
from finetune.families.sequence_classification.flags import OWNED as _CLASSIFICATION_FLAGS
from finetune.families.sequence_classification.flags import ClassificationArgs
from finetune.families.token_classification.flags import OWNED as _TAGGING_FLAGS
from finetune.families.token_classification.flags import TaggingArgs

BUILT_IN = ("sequence_classification", "causal_lm", "token_classification", "dpo")
TaskType = Literal[BUILT_IN]
"""--task_type's built-in values (and `register`ed ones beside them)."""
DEFAULT_TASK_TYPE = BUILT_IN[0]

FLAG_GROUPS = (ClassificationArgs, CausalLMArgs, TaggingArgs, PreferenceArgs)
"""The families' own groups of flags (each family's flags.py: its fields, their checks and which families
read each), composed into `TrainConfig` after the shared groups; their modules import only config's
types, so config reads them here with no circle."""
FLAG_OWNERS = {**_CLASSIFICATION_FLAGS, **_CAUSAL_LM_FLAGS, **_TAGGING_FLAGS, **_DPO_FLAGS}
"""Each family flag and the families that read it (`finetune.config.families.Owned`); a flag not here is
every family's."""


@dataclass(frozen=True)
class ConfigDefaults:
    """What a family decides of the configuration before anything loads: read by config/ (lazily, at
    parse time, so here and not on the family, whose module imports torch and transformers)."""

    max_length_tokens: int = 128
    """--max_length's default."""
    tokenizer_in_identity: bool = False
    """Whether the run's identity holds a digest of the model folder's tokenizer files and
    --chat_template's content (config/identity.py tokenizer_identity): they decide a decoder's target
    tokens. False: classifiers' identities, recorded without one, stay as they were."""
    reads_glue: bool = False
    """Whether --dataset_name's default (GLUE) and its tasks are this family's rows; the others need local
    files or a --dataset_name of their own."""
    file_extensions: tuple[str, ...] = ()
    """Data files this family reads beside .jsonl, .json, .csv, .tsv and .parquet."""
    files_hint: str = ""
    """What a file of those extensions is, as a refusal under another --task_type says it."""


DECODER = ConfigDefaults(max_length_tokens=1024, tokenizer_in_identity=True)
CONFIG_DEFAULTS = {
    "sequence_classification": ConfigDefaults(reads_glue=True),
    "causal_lm": DECODER,
    "dpo": DECODER,
    "token_classification": ConfigDefaults(
        file_extensions=(".conll", ".iob", ".conllu"),
        files_hint="a CoNLL file (words and their tags) trains a tagger",
    ),
}
"""Each built-in family's."""

REGISTERED: dict[str, Callable[[], object]] = {}
"""--task_type values beyond the package's, each with the factory of its family (`register`)."""


def config_defaults(task_type: str) -> ConfigDefaults:
    """--task_type's `ConfigDefaults`."""
    return CONFIG_DEFAULTS.get(task_type, ConfigDefaults())


def reading_extension(suffix: str) -> str | None:
    """The --task_type whose own data files end in `suffix` (.conll: token_classification), if any."""
    return next((name for name, d in CONFIG_DEFAULTS.items() if suffix in d.file_extensions), None)


def register(name: str, factory: Callable[[], object], defaults: ConfigDefaults | None = None) -> None:
    """Makes `name` a --task_type whose runs `factory()`'s family learns, in this process (a launched run's
    every rank registers it before parsing its flags). The family provides what
    `finetune.families.family.TaskFamily` lists (its attributes and every hook run.py calls; tests/
    toy_family.py is one outside the package); the flags it reads are the ones no family owns
    (FLAG_OWNERS); `defaults`, its `ConfigDefaults`."""
    REGISTERED[name] = factory
    CONFIG_DEFAULTS[name] = defaults or ConfigDefaults()


def registered() -> tuple[str, ...]:
    """The registered --task_type values: the config accepts them beside its own (config reads this
    lazily, and this module imports nothing of config at import time: no circle)."""
    return tuple(REGISTERED)


def family_for(task_type: str):
    """The family of --task_type (imported here, when asked for: each brings its own modules)."""
    if task_type in REGISTERED:
        return REGISTERED[task_type]()
    if task_type == "causal_lm":
        from finetune.families.causal_lm.family import CausalLM

        return CausalLM()
    if task_type == "token_classification":
        from finetune.families.token_classification.family import TokenClassification

        return TokenClassification()
    if task_type == "dpo":
        from finetune.families.dpo.family import DPO

        return DPO()
    from finetune.families.sequence_classification.family import SequenceClassification

    return SequenceClassification()
