import pytest

from finetune.speed.malloc import is_glibc
from tests.helpers import tiny_args
from tests.warm_ranks import run_warm

GLIBC = is_glibc()
PAGES_IN_64_MB = 64 * 2**20 // 4096


@pytest.mark.subprocess
@pytest.mark.skipif(not GLIBC, reason="malloc settings are tuned on glibc only")
@pytest.mark.parametrize("keep", [True, False])
def test_cpu_run_reuses_freed_memory_without_page_faults(keep, tiny_model_dir, nli_files, tmp_path):
    flags = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--keep_freed_memory", str(keep).lower())
    done = run_warm(flags, script="tests/probes/refill_faults.py")  # malloc's settings: per process
    assert done.returncode == 0, done.stderr[-3000:]
    faults = int(done.stdout.split()[-1])
    if keep:  # the block comes back from the heap, its pages still mapped
        assert faults < PAGES_IN_64_MB // 10
    else:  # glibc maps the block afresh and the kernel faults in every page
        assert faults > PAGES_IN_64_MB // 2
