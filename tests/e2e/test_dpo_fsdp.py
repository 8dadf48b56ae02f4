"""DPO under FSDP2 on 2 CPU ranks (gloo), each against the same run under DDP: the policy and its frozen
reference both sharded, each rank about half of each (the reference too: Accelerate's evaluation-mode
prepare alone would leave a whole copy on every rank); the logged losses, rewards/* and the evaluation
equal DDP's to float tolerance; the reference never trains. LoRA (fsdp_lora.yaml): the reference is the
sharded policy with its adapters disabled, DDP's losses and rewards again. --precompute_ref_log_probs
with shares of unequal batch counts: every rank's sharded forwards pair up, DDP's figures."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_dpo import REWARDS, dpo_args, prefs  # noqa: F401  (prefs: the module's fixture)
from tests.e2e.test_sft_composes import fsdp_on_cpu
from tests.helpers import assert_sharded, read_jsonl
from tests.warm_ranks import run_ranks

STEPS = ("--max_train_steps", "4", "--logging_steps", "1", "--per_device_train_batch_size", "2",
         "--learning_rate", "1e-3", "--warmup_steps", "0",
         "--eval_strategy", "steps", "--eval_steps", "4")  # fmt: skip
EVALUATED = ("eval_loss", "eval_rewards/accuracies", "eval_rewards/margins", "eval_rewards/chosen")


def like_ddp(prefs, tmp_path, name: str, config: str, *extra: str, ddp=None) -> tuple[dict, dict]:  # noqa: F811
    """The run under DDP and under `config` (FSDP2), both on 2 ranks: each one's train_config.json and
    results.json of the FSDP2 run, once its logged lines and evaluation are DDP's. `ddp`: the output
    folder of a DDP run already made, whose figures the FSDP2 run's must be (no DDP run then)."""
    outs = {"ddp": ddp} if ddp else {}
    for kind, launch in (("ddp", None), ("fsdp", fsdp_on_cpu(config))):
        if kind in outs:
            continue
        out = outs[kind] = tmp_path / f"{name}_{kind}"
        done = run_ranks(dpo_args(prefs, out, *STEPS, *extra), *([launch] if launch else []))
        assert done.returncode == 0, done.stderr[-3000:]
    fsdp, ddp = (json.loads((out / "results.json").read_text()) for out in (outs["fsdp"], outs["ddp"]))
    assert fsdp["world_size"] == ddp["world_size"] == 2 and fsdp["global_step"] == ddp["global_step"] == 4
    assert fsdp["distributed_type"] == "FSDP" and ddp["distributed_type"] == "MULTI_CPU"
    assert_sharded(fsdp)
    logged = [[r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] for out in outs.values()]
    assert len(logged[0]) == len(logged[1]) == 4
    for mine, theirs in zip(*logged, strict=True):
        for key in ("loss", "grad_norm", *REWARDS):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), (mine["step"], key)
    assert logged[0][-1]["rewards/margins"] != 0  # the policy moved away from the reference
    for key in EVALUATED:
        assert fsdp[key] == pytest.approx(ddp[key], rel=1e-5, abs=1e-6), key
    return json.loads((outs["fsdp"] / "train_config.json").read_text()), fsdp


@pytest.mark.multiprocess
def test_dpo_under_fsdp_shards_the_policy_and_its_reference_and_trains_as_ddp(prefs, tmp_path):  # noqa: F811
    config, results = like_ddp(
        prefs, tmp_path, "copy", "fsdp.yaml", "--ref_model_name_or_path", str(prefs["reference"])
    )
    shares = config["fsdp_reference_shards"]
    assert [s["rank"] for s in shares] == [0, 1]
    whole = shares[0]["whole_parameters"]
    assert whole == results["fsdp_shards"][0]["whole_parameters"]  # the copy is the policy's size
    assert sum(s["parameters"] for s in shares) == whole
    assert all(abs(s["parameters"] - whole / 2) < 0.01 * whole for s in shares)
    assert all(s["sharded_tensors"] == s["tensors"] > 0 and s["trainable_tensors"] == 0 for s in shares)

    # Precomputed by the sharded copy: 13 pairs in shares of 7 and 6, 2 a batch, so one rank has a batch
    # fewer and runs one more forward (the all-gathers pair up), and it trains and evaluates as the
    # online reference under DDP above (the precomputed reference is the online one's: test_dpo.py).
    precompute = ("--precompute_ref_log_probs", "true", "--per_device_eval_batch_size", "2")
    copy = ("--ref_model_name_or_path", str(prefs["reference"]))
    like_ddp(prefs, tmp_path, "precomputed", "fsdp.yaml", *copy, *precompute, ddp=tmp_path / "copy_ddp")

    config, _ = like_ddp(prefs, tmp_path, "lora", "fsdp_lora.yaml", "--use_peft", "true")
    assert config["backbone"]["reference"] == "the policy with its LoRA adapters disabled"
    assert "fsdp_reference_shards" not in config  # no second copy: the sharded policy is the reference
