"""--keep_freed_memory auto. Its effect on a process: tests/e2e/test_runtime.py."""

from finetune.speed.malloc import resolve_keep_freed_memory


def test_keep_freed_memory_auto_follows_the_training_precision():
    # Measured faster per step where the CPU trains in bf16, slower in fp32; GPUs have no use for it.
    assert resolve_keep_freed_memory("auto", "cpu", "bf16") == "true"
    assert resolve_keep_freed_memory("auto", "cpu", "no") == "false"
    assert resolve_keep_freed_memory("auto", "cuda", "bf16") == "false"
    assert resolve_keep_freed_memory("true", "cpu", "no") == "true"
    assert resolve_keep_freed_memory("false", "cpu", "bf16") == "false"
