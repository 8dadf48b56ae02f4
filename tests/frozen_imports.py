"""The entry point's imports, then gc.freeze(): imported in the pytest process (tests/e2e/conftest.py)
and in the server the warm processes fork from (tests/warm_ranks.py).

The e2e tier runs hundreds of runs in one process. Each run's end (Accelerate's free_memory) and each
of Python's full collections walk every tracked object, ~0.2 s with torch and transformers imported;
frozen, the imported modules' objects (never garbage) are skipped and such a collection takes
microseconds (docs/log.md).

The families too: run.py imports a run's family once its flags are parsed, and the sequence classifier's
brings transformers' modeling_utils, torch._dynamo and scipy (~2.5 s of CPU). Imported here, a warm
process (each rank) forks with them instead of importing them for every run. So does transformers'
table of checkpoint conversions, built at a process's first model load (~1,000 regular expressions,
0.4 s) and kept for the process: built here, once. And peft (--use_peft, with bitsandbytes and torch's
inductor where installed, ~1.2 s), after finetune's own imports, as a run imports it
(finetune/speed/startup.py imports transformers' schedulers with peft hidden). What a fresh process
imports, and when, is tested on fresh interpreters (tests/e2e/test_runtime.py, test_cli.py).
"""

import gc
import importlib

import finetune.cli  # noqa: F401
import finetune.families.causal_lm.family  # noqa: F401  (family_for imports each when asked for)
import finetune.families.dpo.family  # noqa: F401
import finetune.families.sequence_classification.family  # noqa: F401
import finetune.families.token_classification.family  # noqa: F401
import finetune.mnli  # noqa: F401  (the entry point the warm runs mostly start)
import finetune.run  # noqa: F401  (the cli imports it once the flags parsed)
import finetune.studies.seeds  # noqa: F401
import finetune.studies.sweep  # noqa: F401

# The tests' tiny BERT, which transformers' auto classes import at its first load, and scipy.io, which
# datasets' streaming patch imports at the first load_dataset: ~0.3 s a process.
for name in (
    "transformers.models.bert.modeling_bert",
    "transformers.models.bert.tokenization_bert",
    "scipy.io",
):
    importlib.import_module(name)
importlib.import_module("peft")
# Builds the whole table, then returns bert's entry.
importlib.import_module("transformers.conversion_mapping").get_checkpoint_conversion_mapping("bert")
gc.freeze()
