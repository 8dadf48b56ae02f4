"""--keep_freed_memory auto. Its effect on a process: tests/e2e/test_runtime.py."""

import dataclasses

import torch

from finetune.speed import threads
from finetune.speed.malloc import resolve_keep_freed_memory
from finetune.speed.threads import (
    ThreadChoice,
    apply_threads,
    choose_threads,
    threads_for,
    threads_notice,
)


def test_keep_freed_memory_auto_follows_the_training_precision():
    # Measured faster per step where the CPU trains in bf16, slower in fp32; GPUs have no use for it.
    assert resolve_keep_freed_memory("auto", "cpu", "bf16") == "true"
    assert resolve_keep_freed_memory("auto", "cpu", "no") == "false"
    assert resolve_keep_freed_memory("auto", "cuda", "bf16") == "false"
    assert resolve_keep_freed_memory("true", "cpu", "no") == "true"
    assert resolve_keep_freed_memory("false", "cpu", "bf16") == "false"


def test_torch_gets_a_thread_per_core_other_jobs_leave_free():
    # make bench-threads measured this count fastest beside 0, 1 and 2 CPU-bound neighbours (docs/log.md)
    assert threads_for(cores=2, busy_cores=0.1, local_processes=1, default=2) == 2
    assert threads_for(cores=2, busy_cores=1.0, local_processes=1, default=2) == 1
    assert threads_for(cores=2, busy_cores=3.0, local_processes=1, default=2) == 1  # at least one
    assert threads_for(cores=16, busy_cores=5.8, local_processes=1, default=16) == 10
    # each local rank its share: 2 ranks on 16 free cores run 8 each, not 16 each
    assert threads_for(cores=16, busy_cores=0.0, local_processes=2, default=16) == 8
    assert threads_for(cores=8, busy_cores=0.0, local_processes=1, default=4) == 4  # never above torch's


def test_a_thread_count_the_environment_sets_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's, or torchrun's 1 for several local ranks
    choice = choose_threads(local_processes=1, default=3)
    assert (choice.threads, choice.set_by, choice.busy_cores) == (3, "OMP_NUM_THREADS", None)
    assert threads_notice(choice) is None


def test_fewer_threads_are_said_on_a_line_that_names_the_override():
    lowered = ThreadChoice(threads=1, default=2, cores=2, busy_cores=1.2, set_by=None)
    notice = threads_notice(lowered)
    assert notice.startswith("note: other jobs kept 1.2 of this process's 2 cores busy")
    assert "torch runs 1 thread " in notice and "OMP_NUM_THREADS" in notice
    assert threads_notice(dataclasses.replace(lowered, threads=2, busy_cores=0.2)) is None  # free cores


def test_a_study_s_later_run_is_not_capped_by_an_earlier_run_s_lowered_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    threads._torch_default.cache_clear()
    try:
        torch.set_num_threads(3)  # torch's default, as the first run of a --seeds study finds it
        assert apply_threads().default == 3
        torch.set_num_threads(1)  # as that run left it beside busy neighbours
        later = apply_threads()
        assert later.default == 3 and torch.get_num_threads() == later.threads
    finally:
        threads._torch_default.cache_clear()
        torch.set_num_threads(before)
