"""--keep_freed_memory auto. Its effect on a process: tests/e2e/test_runtime.py."""

import os

from finetune.speed.hardware import busy_cores_notice, cores_load
from finetune.speed.malloc import resolve_keep_freed_memory


def test_keep_freed_memory_auto_follows_the_training_precision():
    # Measured faster per step where the CPU trains in bf16, slower in fp32; GPUs have no use for it.
    assert resolve_keep_freed_memory("auto", "cpu", "bf16") == "true"
    assert resolve_keep_freed_memory("auto", "cpu", "no") == "false"
    assert resolve_keep_freed_memory("auto", "cuda", "bf16") == "false"
    assert resolve_keep_freed_memory("true", "cpu", "no") == "true"
    assert resolve_keep_freed_memory("false", "cpu", "bf16") == "false"


def test_busy_cores_are_said_only_where_torch_runs_several_threads_on_them():
    notice = busy_cores_notice(5.6, 2, 2)
    assert notice.startswith("note: the cores are busy (1-minute load average 5.6 on the 2 this process")
    assert "torch runs 2 threads per process" in notice and "OMP_NUM_THREADS=1" in notice
    assert busy_cores_notice(1.9, 2, 2) is None  # this run alone, or with a light job beside it
    assert busy_cores_notice(5.6, 2, 1) is None  # one thread: nothing to wait for
    assert busy_cores_notice(12.0, 16, 16) is None  # the load is the cores', not the machine's


def test_the_load_is_read_against_the_cores_this_process_may_use():
    load, cores = cores_load()
    assert load >= 0 and cores == len(os.sched_getaffinity(0)) <= os.cpu_count()
