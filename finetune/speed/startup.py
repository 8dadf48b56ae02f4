"""Process start-up: transformers' schedulers without peft and bitsandbytes.

`transformers.trainer_utils` (which `get_scheduler` and `enable_full_determinism` live beside) imports
peft at import time wherever peft is installed, for its Trainer's `_is_peft_model` alone; peft then
imports bitsandbytes where that is installed (the `qlora` extra), whose ops import torch's inductor.
Every process paid that, LoRA or not: about half the CPU of importing `finetune.run` on a Zen 3
(docs/log.md, 2026-12-02), in each rank of each launch. Imported here with peft hidden, the schedulers
leave peft to the runs that ask for it (model/lora.py imports it with --use_peft), and bitsandbytes
to the runs that quantize.
"""

from __future__ import annotations

import sys

from transformers.utils import import_utils  # before the window below: only trainer_utils is imported in it


class _PeftClass(type):
    """Stands for one of peft's model classes in `transformers.trainer_utils` (read by Trainer's
    `_is_peft_model`): an isinstance check imports peft then, and asks the real class."""

    def __instancecheck__(cls, instance) -> bool:
        import peft

        return isinstance(instance, getattr(peft, cls.__name__))


def _trainer_utils_without_peft():
    """`transformers.trainer_utils`, imported without importing peft (unless something imported either
    already): `importlib.util.find_spec` answers None for a module whose sys.modules entry is None, so
    transformers' `is_peft_available()` is False for that one import, and True again after it (its
    cached answer cleared)."""
    if "transformers.trainer_utils" not in sys.modules and "peft" not in sys.modules:
        sys.modules["peft"] = None
        try:
            import transformers.trainer_utils
        finally:
            del sys.modules["peft"]
            # transformers caches the answer: asked again, it is True (peft is installed)
            import_utils.is_peft_available.cache_clear()
        for name in ("PeftModel", "PeftMixedModel"):
            setattr(transformers.trainer_utils, name, _PeftClass(name, (), {}))
    import transformers.trainer_utils

    return transformers.trainer_utils


_trainer_utils_without_peft()

from transformers import enable_full_determinism, get_scheduler  # noqa: E402

__all__ = ["enable_full_determinism", "get_scheduler"]
