"""The entry point's imports, then gc.freeze(): imported in the pytest process (tests/e2e/conftest.py)
and in the server the warm processes fork from (tests/warm_ranks.py).

The e2e tier runs hundreds of runs in one process. Each run's end (Accelerate's free_memory) and each
of Python's full collections walk every tracked object, ~0.2 s with torch and transformers imported;
frozen, the imported modules' objects (never garbage) are skipped and such a collection takes
microseconds (docs/log.md).
"""

import gc

import finetune.cli  # noqa: F401
import finetune.run  # noqa: F401  (the cli imports it once the flags parsed)
import finetune.studies.seeds  # noqa: F401
import finetune.studies.sweep  # noqa: F401

gc.freeze()
