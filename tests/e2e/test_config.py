"""Configuration seen from a fresh interpreter. Parsing and checking flags: tests/unit/test_config.py."""

import pytest

from tests.warm_ranks import run_warm


@pytest.mark.subprocess
def test_importing_the_package_registers_nothing_with_transformers(tmp_path):
    """Attention and mask functions are registered by use_*, not by importing a module. And the run's
    modules leave `evaluate` unimported (about 0.45 s of CPU per process, every rank: docs/log.md).

    In a process forked from the warm server (tests/warm_ranks.py), an interpreter that imported the
    entry point's modules and ran nothing: what a fresh one holds after the same imports, without
    their 6-7 s of CPU again."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import sys, transformers, finetune.mnli, finetune.run, finetune.speed.padding_free\n"
        "import finetune.speed.packed_dropout\n"
        "assert 'evaluate' not in sys.modules, 'a run module imports evaluate'\n"
        "from transformers import AttentionInterface\n"
        "from transformers.masking_utils import AttentionMaskInterface\n"
        "names = [*AttentionInterface._global_mapping, *AttentionMaskInterface._global_mapping]\n"
        "print(sorted(n for n in names if n.startswith('finetune')))\n"
    )
    done = run_warm([], script=str(probe))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
