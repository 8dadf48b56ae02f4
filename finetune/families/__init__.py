"""Task families: what a run learns (sequence classification, causal-LM SFT, token classification),
plugged into the one loop."""

from __future__ import annotations


def family_for(task_type: str):
    """The family of --task_type (imported here, when asked for: each brings its own modules)."""
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
