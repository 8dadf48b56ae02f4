"""Preference tuning (`--task_type dpo`) on a tiny random Llama: one update's loss is the mean over every
pair of the window however the window is cut (one micro-batch, accumulation, two processes, a partial
window), and equals plain PyTorch's on the same pairs, as do its gradient norm and rewards/*; evaluation
counts each pair once on any number of processes; the frozen reference is never updated; LoRA's reference
is the model with its adapters disabled; a resumed run logs what an unbroken one does."""

from __future__ import annotations

import functools
import json
import random
import shutil

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from finetune.config.parser import parse_config
from finetune.distributed.signals import StopSignals
from finetune.families.dpo.collate import Targets
from finetune.families.dpo.data import encode_pairs, load_preference_splits
from finetune.families.dpo.loss import sequence_logps
from finetune.mnli import main
from finetune.run import close, setup
from finetune.training.loop import train
from tests.chat_models import build_tiny_lm
from tests.helpers import read_jsonl, reset_accelerate
from tests.warm_ranks import run_ranks

WORDS = ["red", "green", "blue", "apple", "river", "stone", "cloud", "seven", "quiet", "north", "bright"]
TRAIN_PAIRS = 13  # divides neither the batch (16, 8) nor the 2 processes
BETA = 0.1


def pair(rng: random.Random) -> dict:
    asked = rng.sample(WORDS, rng.randint(1, 4))
    other = rng.sample(WORDS, rng.randint(1, 5))
    return {
        "prompt": f"say {' '.join(asked)}:",
        "chosen": " " + " ".join(asked),
        "rejected": " " + " ".join(other),
    }


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dpo")
    rng = random.Random(0)
    return {
        "model": build_tiny_lm("llama", folder / "llama"),
        # Another starting point as the reference: the first update's loss is not log 2 then.
        "reference": build_tiny_lm("llama", folder / "reference", seed=1),
        "train": write_jsonl(folder / "train.jsonl", [pair(rng) for _ in range(TRAIN_PAIRS)]),
        "validation": write_jsonl(folder / "validation.jsonl", [pair(rng) for _ in range(5)]),
    }


def dpo_args(prefs, out, *extra: str) -> list[str]:
    return [
        "--task_type", "dpo",
        "--model_name_or_path", str(prefs["model"]),
        "--train_file", str(prefs["train"]),
        "--validation_file", str(prefs["validation"]),
        "--output_dir", str(out),
        "--max_length", "64",
        "--mixed_precision", "no",
        "--report_to", "none",
        "--save_plots", "false",
        *extra,
    ]  # fmt: skip


ONE_UPDATE = ("--max_train_steps", "1", "--logging_steps", "1", "--learning_rate", "1e-6",
              "--eval_strategy", "steps", "--eval_steps", "1")  # fmt: skip
REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
           "logps/rejected")  # fmt: skip


def first_update(out) -> dict:
    return next(r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r)


def sequence_logp(model, ids: list[int], labels: list[int]) -> tuple[torch.Tensor, int]:
    """Plain PyTorch: one sequence alone, the log-probs of its completion's target tokens summed, and
    their count."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    targets = torch.tensor(labels[1:])
    kept = targets != -100
    return torch.log_softmax(logits[kept], dim=-1).gather(1, targets[kept, None]).sum(), int(kept.sum())


def plain_dpo(prefs, tmp_path, rpo_alpha: float | None = None) -> dict:
    """Every training pair alone (no padding, no batching, the reference a separate model): the mean
    sigmoid loss over all of them (with `rpo_alpha`, plus alpha x the chosen completions' cross-entropy
    summed over every chosen target token over their count), its gradient's norm, the pairs' mean
    rewards."""
    config = parse_config(dpo_args(prefs, tmp_path / "plain"))
    tokenizer = AutoTokenizer.from_pretrained(prefs["model"])
    task, splits = load_preference_splits(config)
    encoded = encode_pairs(task, {"train": splits["train"]}, tokenizer, config, Accelerator(cpu=True))[
        "train"
    ]
    reset_accelerate()
    policy = AutoModelForCausalLM.from_pretrained(prefs["model"])
    reference = AutoModelForCausalLM.from_pretrained(prefs["reference"])
    losses, chosen_rewards, rejected_rewards, nll, chosen_tokens = [], [], [], 0.0, 0
    for row in encoded:
        chosen, targets = sequence_logp(policy, row["chosen_input_ids"], row["chosen_labels"])
        rejected, _ = sequence_logp(policy, row["rejected_input_ids"], row["rejected_labels"])
        nll, chosen_tokens = nll - chosen, chosen_tokens + targets
        with torch.no_grad():
            ref_chosen, _ = sequence_logp(reference, row["chosen_input_ids"], row["chosen_labels"])
            ref_rejected, _ = sequence_logp(reference, row["rejected_input_ids"], row["rejected_labels"])
        losses.append(-F.logsigmoid(BETA * ((chosen - rejected) - (ref_chosen - ref_rejected))))
        chosen_rewards.append(float(BETA * (chosen.detach() - ref_chosen)))
        rejected_rewards.append(float(BETA * (rejected.detach() - ref_rejected)))
    loss = torch.stack(losses).mean()
    if rpo_alpha is not None:
        loss = loss + rpo_alpha * nll / chosen_tokens
    loss.backward()
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in policy.parameters() if p.grad is not None])
    )
    margins = [c - r for c, r in zip(chosen_rewards, rejected_rewards, strict=True)]
    return {
        "loss": float(loss),
        "grad_norm": float(norm),
        "rewards/chosen": sum(chosen_rewards) / len(losses),
        "rewards/margins": sum(margins) / len(losses),
        "rewards/accuracies": sum(m > 0 for m in margins) / len(losses),
    }


@pytest.mark.parametrize("rpo_alpha", [None, 0.5], ids=["dpo", "rpo"])
def test_one_update_is_the_mean_over_every_pair_however_the_window_is_cut(prefs, tmp_path, rpo_alpha):
    """13 pairs in a window of 16: one micro-batch, 4 x 4 accumulation, and 2 processes x 2 x 4 (real
    ranks, a placeholder in the last micro-batch): the same logged loss, gradient norm and rewards/*,
    equal to plain PyTorch's; and the same eval_loss and eval_rewards/* for evaluation batches of 64
    and 2 (on 2 processes, 5 validation pairs: one rank gets a repeated pair, counted once). --rpo_alpha:
    its SFT term is the mean over every chosen target token of the window, on each cut."""
    reference = ("--ref_model_name_or_path", str(prefs["reference"]))
    if rpo_alpha is not None:
        reference += ("--rpo_alpha", str(rpo_alpha))
    one = tmp_path / "one"
    main(dpo_args(prefs, one, *ONE_UPDATE, *reference, "--per_device_train_batch_size", "16"))
    reset_accelerate()
    cut = tmp_path / "accumulated"
    main(dpo_args(prefs, cut, *ONE_UPDATE, *reference, "--per_device_train_batch_size", "4",
                  "--gradient_accumulation_steps", "4"))  # fmt: skip
    reset_accelerate()
    two = tmp_path / "two"
    # 2 ranks x 2 pairs x 4: global micro-batches of 4, 4, 4 and 1 pair, whose second rank's is a placeholder
    split = ("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "4",
             "--per_device_eval_batch_size", "2")  # fmt: skip
    ranks = run_ranks(dpo_args(prefs, two, *ONE_UPDATE, *reference, *split))
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    results = [json.loads((out / "results.json").read_text()) for out in (one, cut, two)]
    assert [r["world_size"] for r in results] == [1, 1, 2]
    assert [r["train_samples"] for r in results] == [TRAIN_PAIRS] * 3
    updates = [first_update(out) for out in (one, cut, two)]
    plain = plain_dpo(prefs, tmp_path, rpo_alpha)
    assert abs(plain["loss"] - 0.6931) > 1e-3  # the reference is another model: not log 2
    for update in updates:
        assert update["loss"] == pytest.approx(plain["loss"], rel=1e-5)
        assert update["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-4)
        assert set(REWARDS) <= set(update)
        for name in ("rewards/chosen", "rewards/margins", "rewards/accuracies"):
            assert update[name] == pytest.approx(plain[name], rel=1e-4, abs=1e-6), name
    # Batches of other widths round the fp32 log-prob sums (~30) differently: 1e-6 abs on margins near 0.
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"):
        assert results[1][key] == pytest.approx(results[0][key], rel=1e-6, abs=1e-6), key
        assert results[2][key] == pytest.approx(results[0][key], rel=1e-6, abs=1e-6), key
    assert [r["eval_samples"] for r in results] == [5, 5, 5]


def capture_run(runs: list):
    def build(*launch):
        run = setup(*launch)
        runs.append(run)
        return run

    return build


def test_the_frozen_reference_is_never_updated(prefs, tmp_path):
    """A full fine-tuning run: the policy moves, its reference (a copy of the starting model) keeps
    every starting weight, in eval mode, without gradients. eval_rewards/accuracies picks the best model
    (greater is better), and the export generates through pipeline("text-generation")."""
    runs = []
    results = main(dpo_args(prefs, tmp_path / "run", "--per_device_train_batch_size", "4", "--learning_rate",
                            "1e-3", "--num_train_epochs", "1", "--metric_for_best_model",
                            "eval_rewards/accuracies"), build=capture_run(runs))  # fmt: skip
    reset_accelerate()
    assert results["metric_for_best_model"] == "eval_rewards/accuracies" and results["greater_is_better"]
    assert results["best_metric"] == results["eval_rewards/accuracies"]
    generate = pipeline("text-generation", model=str(tmp_path / "run"))
    said = generate("say red:", max_new_tokens=4, do_sample=False, return_full_text=False)
    assert isinstance(said[0]["generated_text"], str)
    reference = runs[0].family.reference.model
    assert not reference.training and not any(p.requires_grad for p in reference.parameters())
    start = load_file(prefs["model"] / "model.safetensors")
    exported = load_file(tmp_path / "run" / "model.safetensors")
    kept = {name: tensor for name, tensor in reference.state_dict().items() if name in start}
    assert kept.keys() == start.keys()
    assert all(torch.equal(kept[name], start[name]) for name in start)
    assert any(not torch.equal(exported[name], start[name]) for name in start)  # the policy trained


def test_a_lora_runs_reference_is_the_model_with_its_adapters_disabled(prefs, tmp_path):
    """--use_peft: no second copy; the first step's rewards are 0 (LoRA starts as the identity); after
    training, the reference's log-probs are the starting model's while the policy's have moved."""
    config = parse_config(dpo_args(prefs, tmp_path / "lora", "--use_peft", "--lora_r", "4",
                                   "--per_device_train_batch_size", "4", "--learning_rate", "1e-2",
                                   "--num_train_epochs", "2", "--logging_steps", "1"))  # fmt: skip
    run = setup(config)
    try:
        train(run, StopSignals())
        family = run.family
        assert family.reference.kind == "adapters" and family.reference.model is None
        # --disable_dropout (TRL's default): LoRA's own dropout (--lora_dropout 0.05) is off too
        dropouts = [m for m in run.model.modules() if isinstance(m, torch.nn.Dropout)]
        assert dropouts and all(m.p == 0 for m in dropouts)
        batch = next(iter(run.eval_loaders["validation"]))
        targets = Targets.pop(batch)
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
        found = family.reference.logps(run.accelerator, run.model, inputs, targets, True)
        base = AutoModelForCausalLM.from_pretrained(prefs["model"]).eval()
        with torch.no_grad():
            start = sequence_logps(base(**inputs).logits, targets)[0]
            policy = sequence_logps(run.model(**inputs).logits, targets)[0]
        torch.testing.assert_close(found[0], start, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(policy, start, atol=1e-3)  # the adapters moved the policy
        assert run.model.training  # the reference's pass left the policy in training mode
    finally:
        close(run)
        reset_accelerate()
    lines = [r for r in read_jsonl(tmp_path / "lora" / "metrics.jsonl") if "loss" in r]
    assert lines[0]["rewards/chosen"] == 0.0 and lines[0]["rewards/rejected"] == 0.0
    assert lines[-1]["rewards/margins"] != 0.0


@pytest.mark.parametrize(
    ("extra", "steps"),
    [((), [6, 7]), (("--rpo_alpha", "0.5", "--gradient_accumulation_steps", "2"), [3, 4])],
    ids=["dpo", "rpo"],
)
def test_a_resumed_run_logs_the_unbroken_runs_lines(prefs, tmp_path, extra, steps):
    """13 pairs in batches of 2, lines every 3 steps, resumed from the checkpoint before the last two
    lines (step 4 of 7; with --rpo_alpha and 2 x 2 accumulation, step 2 of 4, the windows' totals counted
    again after the resume): the resumed run's lines, loss, gradient norm and rewards/*, are the
    unbroken run's, bitwise."""
    checkpoint = steps[0] - 1 if extra else 4
    args = ("--per_device_train_batch_size", "2", "--num_train_epochs", "1", "--logging_steps", "3",
            "--checkpointing_steps", str(checkpoint), "--learning_rate", "1e-3", "--eval_strategy", "no",
            *extra)  # fmt: skip
    full = tmp_path / "full"
    main(dpo_args(prefs, full, *args))
    reset_accelerate()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / f"checkpoint-{checkpoint}", resumed / f"checkpoint-{checkpoint}")
    main(dpo_args(prefs, resumed, *args, "--resume_from_checkpoint", "auto"))
    reset_accelerate()
    keys = ("step", "loss", "grad_norm", *REWARDS)
    after = [{k: r[k] for k in keys} for r in read_jsonl(resumed / "metrics.jsonl") if "loss" in r]
    lines = [{k: r[k] for k in keys} for r in read_jsonl(full / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in after] == steps
    assert after == lines[-2:]


def test_precomputed_reference_log_probs_train_and_evaluate_as_the_online_reference(prefs, tmp_path):
    """--precompute_ref_log_probs: the same training lines and the same eval_loss and eval_rewards/* as
    a run whose reference runs per micro-batch (evaluation reads the precomputed reference, never the
    policy); they are kept beside the run, and a resumed run reads them back instead of computing them."""
    args = ("--ref_model_name_or_path", str(prefs["reference"]), "--per_device_train_batch_size", "4",
            "--num_train_epochs", "2", "--logging_steps", "2", "--learning_rate", "1e-3",
            "--checkpointing_steps", "4")  # fmt: skip
    online, kept = tmp_path / "online", tmp_path / "precomputed"
    online_results = main(dpo_args(prefs, online, *args))
    reset_accelerate()
    results = main(dpo_args(prefs, kept, *args, "--precompute_ref_log_probs"))
    reset_accelerate()
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen"):
        assert results[key] == pytest.approx(online_results[key], rel=1e-5, abs=1e-7), key
    assert results["eval_rewards/margins"] != 0.0  # the policy has moved away from the reference
    lines = [[r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] for out in (online, kept)]
    for mine, theirs in zip(*lines, strict=True):
        for key in ("loss", "grad_norm", *REWARDS):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["step"], key)
    saved = kept / "reference_logps.pt"
    written = saved.stat().st_mtime_ns
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(kept / "checkpoint-4", resumed / "checkpoint-4")
    shutil.copy2(saved, resumed / "reference_logps.pt")
    again = main(
        dpo_args(prefs, resumed, *args, "--precompute_ref_log_probs", "--resume_from_checkpoint", "auto")
    )
    reset_accelerate()
    assert (resumed / "reference_logps.pt").stat().st_mtime_ns == saved.stat().st_mtime_ns == written
    assert again["eval_rewards/margins"] == results["eval_rewards/margins"]
    # 2 processes x 2 pairs: each rank precomputes a share, gathered; the same evaluation to rounding
    two = tmp_path / "two"
    per_rank = list(args)
    per_rank[per_rank.index("--per_device_train_batch_size") + 1] = "2"
    ranks = run_ranks(dpo_args(prefs, two, *per_rank, "--precompute_ref_log_probs"))
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    shared = json.loads((two / "results.json").read_text())
    assert shared["world_size"] == 2
    for key in ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins"):
        assert shared[key] == pytest.approx(online_results[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize(
    "extra", [("--rpo_alpha", "0.5"), ("--precompute_ref_log_probs",)], ids=["rpo", "precomputed"]
)
def test_no_host_reads_between_log_lines(prefs, tmp_path, extra):
    """DPO's micro-batches (the reference's forward or its precomputed log-probs, rewards/* sums, RPO's
    window totals counted on the host) never wait for the device between log lines. Left out: transformers'
    causal mask asking whether a padded batch's mask is all ones (to use sdpa's is_causal), as it does for
    causal_lm's batches."""
    from tests.e2e.test_host_syncs import host_reads

    args = dpo_args(prefs, tmp_path / "out", "--per_device_train_batch_size", "2",
                    "--gradient_accumulation_steps", "2", "--num_train_epochs", "2",
                    "--logging_steps", "1000", "--eval_strategy", "no", *extra)  # fmt: skip
    with host_reads() as reads:
        main(args)
    reset_accelerate()
    assert [read for read in reads if "create_causal_mask" not in read] == []


@pytest.mark.parametrize("extra", [(), ("--precompute_ref_log_probs",)], ids=["online", "precomputed"])
def test_a_policy_equal_to_its_reference_scores_zero_rewards_under_autocast(prefs, tmp_path, extra):
    """results.json's evaluation is the exported policy's, without autocast (training/best.py); the
    reference (a frozen copy, online or precomputed) is scored the same way, so a policy that is its own
    reference gets rewards of exactly 0, not autocast's rounding of the copy's log-probs (4.9e-5 on an
    AVX512-BF16 CPU, where --mixed_precision auto is bf16)."""
    args = ("--do_train", "false", "--mixed_precision", "bf16", *extra)
    results = main(dpo_args(prefs, tmp_path / "out", *args))
    reset_accelerate()
    assert results["eval_rewards/margins"] == 0.0 and results["eval_rewards/chosen"] == 0.0
    assert results["eval_loss"] == pytest.approx(0.6931471805599453, abs=1e-6)  # log 2, in fp32


def test_evaluations_after_the_first_run_the_policy_alone_and_score_as_a_fresh_reference_pass(
    prefs, tmp_path
):
    """Three evaluations (eval every step, batches of 2 over 5 validation pairs: 3 batches): the frozen
    copy runs once per training micro-batch and once per evaluation batch of the first evaluation only;
    an evaluation read from the kept log-probs equals one that computes the reference again."""
    config = parse_config(dpo_args(prefs, tmp_path / "run", "--per_device_train_batch_size", "4",
                                   "--per_device_eval_batch_size", "2", "--max_train_steps", "3",
                                   "--eval_strategy", "steps", "--eval_steps", "1", "--learning_rate", "1e-3",
                                   "--ref_model_name_or_path", str(prefs["reference"])))  # fmt: skip
    run = setup(config)
    try:
        calls = []
        run.family.reference.model.register_forward_pre_hook(lambda *_: calls.append(1))
        train(run, StopSignals())
        assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) >= 3
        assert len(calls) == 3 + 3  # 3 micro-batches, then the first evaluation's 3 batches
        evaluate = functools.partial(run.family._evaluate, accelerator=run.accelerator)
        kept = evaluate(run.model, run.eval_loaders)
        assert len(calls) == 6
        run.family.reference.evaluated.clear()
        assert evaluate(run.model, run.eval_loaders) == kept and len(calls) == 9
    finally:
        close(run)
        reset_accelerate()
