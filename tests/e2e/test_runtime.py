import pytest

from finetune.speed.malloc import is_glibc
from tests.helpers import tiny_args
from tests.warm_ranks import run_warm

GLIBC = is_glibc()


@pytest.mark.subprocess
@pytest.mark.skipif(not GLIBC, reason="malloc settings are tuned on glibc only")
@pytest.mark.parametrize("keep", [True, False])
def test_cpu_run_reuses_freed_memory_without_page_faults(keep, tiny_model_dir, nli_files, tmp_path):
    flags = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--keep_freed_memory", str(keep).lower())
    done = run_warm(flags, script="tests/probes/refill_faults.py")  # malloc's settings: per process
    assert done.returncode == 0, done.stderr[-3000:]
    # Faults to refill a freed 64 MB block, and to touch a fresh 64 MB mapping: the kernel's own cost,
    # whatever it maps per fault (4 kB pages, 16 kB folios, 2 MB huge pages).
    refill, fresh = map(int, done.stdout.split()[-2:])
    if keep:  # the block comes back from the heap, its pages still mapped
        assert refill < fresh // 10, (refill, fresh)
    else:  # glibc maps the block afresh and the kernel faults it in as it would any new mapping
        assert refill > fresh // 2, (refill, fresh)
