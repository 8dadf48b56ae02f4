"""The side-by-side benchmarks' process plumbing and TRL settings, in one place (bench_sft, bench_dpo and
bench_memory use them): each run is a process of its own, so its peak RSS and wall time are its own, and
TRL's runs are that process under TRL's own virtualenv's python. A run prints its figures as `BENCH {json}`
lines (one per rank when launched); the driver reads them back.

Only the standard library at import: this module is imported from TRL's virtualenv too.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: benchmarks/ importable from any python
# The toolkit's LoRA defaults (finetune/config/model_args.py), given to TRL so both train the same adapters.
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"}


@dataclass
class Finished:
    returncode: int
    figures: list[dict]  # every BENCH line, in the order printed
    stderr: str
    seconds: float  # the whole process, start-up included


def environment() -> dict[str, str]:
    """Offline, with this repository first on PYTHONPATH (a TRL virtualenv has no editable install of it)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


def run_process(command: list[str]) -> Finished:
    """`command` from the repository's root; its BENCH lines parsed, whatever its exit status."""
    tic = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment(), cwd=ROOT)
    seconds = time.perf_counter() - tic
    return Finished(done.returncode, bench_lines(done.stdout), done.stderr, seconds)


def bench_lines(stdout: str) -> list[dict]:
    """Every `BENCH {json}` in `stdout`, wherever it starts: a launched run's ranks share one pipe, and a
    rank's line may land after another's output that had not ended its line yet."""
    decoder, figures, at = json.JSONDecoder(), [], stdout.find("BENCH {")
    while at >= 0:
        found, end = decoder.raw_decode(stdout, at + len("BENCH "))
        figures.append(found)
        at = stdout.find("BENCH {", end)
    return figures


def run_one(label: str, command: list[str]) -> dict:
    """One single-process run that must succeed: its figures and whole-process seconds; exits with its
    stderr's tail, naming `label`, if it fails."""
    done = run_process(command)
    if done.returncode != 0 or not done.figures:
        sys.exit(f"{label} failed:\n{done.stderr[-3000:]}")
    return {**done.figures[0], "process_seconds": done.seconds}


LOCAL_PATHS = ("worker", "model", "data", "output", "trl_python")
"""Settings that are this machine's paths: left out of a benchmark's recorded environment."""


def trl_python(path: str, make_target: str) -> str:
    """--trl_python as a runnable path, or exit saying which make target builds TRL's virtualenv. Absolute,
    not resolved: a virtualenv's python is a link that must stay in its folder."""
    if not Path(path).is_file():
        sys.exit(f"--trl_python {path}: no such file; `make {make_target}` makes TRL's virtualenv")
    return str(Path(path).absolute())


def peak_rss_mib() -> float:
    """This process's peak resident set (getrusage's ru_maxrss, KiB on Linux), its children not counted."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def emit(figures: dict) -> None:
    """One write of the whole line (a pipe's write of under 4 KiB is not split by another rank's)."""
    sys.stdout.write(f"\nBENCH {json.dumps(figures)}\n")
    sys.stdout.flush()


def lora_config():
    """peft's LoraConfig of the toolkit's LoRA defaults, for TRL's trainers."""
    from peft import LoraConfig

    return LoraConfig(**LORA, task_type="CAUSAL_LM")
