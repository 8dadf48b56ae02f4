import json
import os
import subprocess

import pytest

from finetune.speed.malloc import is_glibc
from tests.helpers import PYTHON, REPO, run_cli, tiny_args
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


STARTUP_PROBE = """
import sys
import finetune.cli  # what `python -m finetune` and each rank import before the flags are read
import finetune.run
print("imported:", "peft" in sys.modules, "bitsandbytes" in sys.modules)
from transformers.utils import is_peft_available
print("peft available:", is_peft_available())  # to transformers' own peft integration
from transformers import AutoModelForSequenceClassification, BertConfig
from transformers.trainer_utils import _is_peft_model
from finetune.speed.startup import get_scheduler
plain = AutoModelForSequenceClassification.from_config(
    BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8)
)
from peft import LoraConfig, get_peft_model
adapted = get_peft_model(plain, LoraConfig(r=2, target_modules=["query"], task_type="SEQ_CLS"))
print("peft model:", _is_peft_model(plain.base_model), _is_peft_model(adapted))
"""


@pytest.mark.subprocess
def test_a_process_imports_neither_peft_nor_bitsandbytes_until_a_run_asks(tmp_path):
    """transformers' schedulers import peft (and peft bitsandbytes, whose ops import torch's inductor)
    for every process, LoRA or not: about half of the CPU of importing the run. finetune imports them with
    peft hidden (finetune/speed/startup.py), and Trainer's check for a peft model still answers."""
    done = subprocess.run(
        [PYTHON, "-c", STARTUP_PROBE], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "imported: False False" in lines
    assert "peft model: False True" in lines
    assert "peft available: True" in lines


def _idle_priority() -> None:
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


@pytest.mark.subprocess
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: one thread whatever is busy")
def test_a_run_beside_busy_cores_gives_torch_a_thread_per_free_core(tiny_model_dir, nli_files, tmp_path):
    """A fresh process started while other jobs keep every core busy runs torch with one thread (a thread
    per free core, at least one: make bench-threads measured that fastest), and says why on its own line.
    The jobs spin at SCHED_IDLE, on CPU nothing else wants: the run and the other tests go first."""
    cores = len(os.sched_getaffinity(0))
    loop = [PYTHON, "-c", "while True: pass"]
    jobs = [subprocess.Popen(loop, preexec_fn=_idle_priority) for _ in range(cores)]
    try:
        out = tmp_path / "out"
        flags = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "1", "--eval_strategy", "no")
        # OMP_NUM_THREADS empty: unset for libgomp and for the rule (the tests' own 1 would be kept)
        done = run_cli([PYTHON, "-m", "finetune", *flags], env={"OMP_NUM_THREADS": ""})
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["torch_threads"] == 1
    start = next(line for line in done.stdout.splitlines() if line.startswith("world_size=1"))
    assert " torch_threads=1 " in start
    assert "busy as it started, so torch runs 1 thread " in done.stdout
