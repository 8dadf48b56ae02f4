"""Configuration seen from a fresh interpreter. Parsing and checking flags: tests/unit/test_config.py."""

import subprocess
import sys

import pytest

from tests.helpers import REPO


@pytest.mark.subprocess
def test_importing_the_package_registers_nothing_with_transformers():
    """Attention and mask functions are registered by use_*, not by importing a module."""
    code = (
        "import transformers, finetune.mnli, finetune.speed.padding_free, finetune.speed.packed_dropout\n"
        "from transformers import AttentionInterface\n"
        "from transformers.masking_utils import AttentionMaskInterface\n"
        "names = [*AttentionInterface._global_mapping, *AttentionMaskInterface._global_mapping]\n"
        "print(sorted(n for n in names if n.startswith('finetune')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
