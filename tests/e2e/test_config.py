"""Configuration seen from a fresh interpreter. Parsing and checking flags: tests/unit/test_config.py."""

import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.subprocess
def test_importing_the_package_registers_nothing_with_transformers():
    """Attention and mask functions are registered by use_*, not by importing a module. And the run's
    modules leave `evaluate` unimported (about 0.45 s of CPU per process, every rank: docs/log.md)."""
    code = (
        "import sys, transformers, finetune.mnli, finetune.run, finetune.speed.padding_free\n"
        "import finetune.speed.packed_dropout\n"
        "assert 'evaluate' not in sys.modules, 'a run module imports evaluate'\n"
        "from transformers import AttentionInterface\n"
        "from transformers.masking_utils import AttentionMaskInterface\n"
        "names = [*AttentionInterface._global_mapping, *AttentionMaskInterface._global_mapping]\n"
        "print(sorted(n for n in names if n.startswith('finetune')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
