"""The entry point's imports, then gc.freeze(): imported in the pytest process (tests/e2e/conftest.py)
and in the server the warm processes fork from (tests/warm_ranks.py).

The e2e tier runs hundreds of runs in one process. Each run's end (Accelerate's free_memory) and each
of Python's full collections walk every tracked object, ~0.2 s with torch and transformers imported;
frozen, the imported modules' objects (never garbage) are skipped and such a collection takes
microseconds (docs/log.md).

Besides the imports before the flags are read, the ones a run makes once it knows them: each family's
module (transformers' modeling_utils, ~1.2 s of CPU on a Zen 4) and peft (--use_peft, with bitsandbytes
and torch's inductor where installed, ~1.2 s); and transformers' table of checkpoint conversions, built
at a process's first from_pretrained. In the server, once per session, instead of in each rank of each
warm launch. What a fresh process imports, and when, is tested on fresh interpreters
(tests/e2e/test_runtime.py, test_cli.py).
"""

import gc
import importlib

import finetune.cli  # noqa: F401
import finetune.families.causal_lm.family  # noqa: F401
import finetune.families.dpo.family  # noqa: F401
import finetune.families.sequence_classification.family  # noqa: F401
import finetune.families.token_classification.family  # noqa: F401
import finetune.run  # noqa: F401  (the cli imports it once the flags parsed)
import finetune.studies.seeds  # noqa: F401
import finetune.studies.sweep  # noqa: F401

# after finetune's own imports, as a run imports it (finetune/speed/startup.py imports transformers'
# schedulers with peft hidden)
importlib.import_module("peft")
# transformers builds its table of checkpoint conversions (~1,100 compiled regular expressions, ~0.4 s)
# at a process's first from_pretrained: once here, for every warm process
importlib.import_module("transformers.conversion_mapping").get_checkpoint_conversion_mapping("bert")

gc.freeze()
