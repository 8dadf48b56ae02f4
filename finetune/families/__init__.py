"""Task families: what a run learns (sequence classification, causal-LM SFT, token classification,
DPO), plugged into the one loop; and families from outside the package, `register`ed by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


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


DECODER = ConfigDefaults(max_length_tokens=1024, tokenizer_in_identity=True)
CONFIG_DEFAULTS = {"causal_lm": DECODER, "dpo": DECODER}
"""Each built-in family's, where not the defaults (sequence and token classification)."""

REGISTERED: dict[str, Callable[[], object]] = {}
"""--task_type values beyond the package's, each with the factory of its family (`register`)."""


def config_defaults(task_type: str) -> ConfigDefaults:
    """--task_type's `ConfigDefaults`."""
    return CONFIG_DEFAULTS.get(task_type, ConfigDefaults())


def register(name: str, factory: Callable[[], object], defaults: ConfigDefaults | None = None) -> None:
    """Makes `name` a --task_type whose runs `factory()`'s family learns, in this process (a launched run's
    every rank registers it before parsing its flags). The family provides what
    `finetune.families.family.TaskFamily` lists (its attributes and every hook run.py calls; tests/
    toy_family.py is one outside the package); the flags it reads are the ones no family owns
    (config/families.py); `defaults`, its `ConfigDefaults`."""
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
