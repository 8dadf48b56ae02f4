"""`make demo-dpo`'s building blocks on a tiny random Llama (the demo itself runs SmolLM2): its pairs, and
its three runs as it launches them, the DPO run starting from, and referring to, the SFT run's export."""

from __future__ import annotations

import json
import re

from finetune.demo_dpo import launches, preference_pairs, write_data
from finetune.mnli import main
from tests.chat_models import build_tiny_lm
from tests.helpers import read_jsonl, reset_accelerate

SUM = re.compile(r"^(\d+) \+ (\d+) = (\d+)\.$")


def test_the_pairs_choose_the_right_sum_in_the_sft_format():
    """Every chosen answer is its question's sum in the SFT's format; every rejected one differs: a wrong
    sum in that format (every other pair) or the right sum off it."""
    pairs = preference_pairs(40, seed=0)
    assert pairs == preference_pairs(40, seed=0) and pairs != preference_pairs(40, seed=1)
    for number, pair in enumerate(pairs):
        assert [m["role"] for m in pair["prompt"]] == ["user"]
        a, b, c = map(int, SUM.match(pair["chosen"][0]["content"]).groups())
        assert a + b == c and f"{a}" in pair["prompt"][0]["content"]
        rejected = pair["rejected"][0]["content"]
        wrong = SUM.match(rejected)
        if number % 2 == 0:
            assert wrong and int(wrong[3]) != c and 1 <= abs(int(wrong[3]) - c) <= 10
        else:
            assert not wrong and str(c) in rejected


def test_the_dpo_run_trains_the_sft_runs_export(tmp_path):
    """The three launches (2 steps each): SFT with LoRA; an evaluation alone of its export, its own
    reference (every reward 0); DPO with LoRA from that export, which its train_config.json and card
    name, whose first rewards are 0 (the reference is the SFT model: LoRA starts as the identity) and
    whose evaluation moved away from them."""
    model = build_tiny_lm("llama", tmp_path / "tiny")
    files = write_data(tmp_path / "data")
    out = tmp_path / "demo"
    quick = ["--mixed_precision", "no", "--save_plots", "false", "--learning_rate", "1e-2"]
    runs = launches(["--model_name_or_path", str(model)], files, out, steps=(2, 2), extra=quick)
    assert list(runs) == ["sft", "before", "dpo"]
    results = {}
    for name, args in runs.items():
        results[name] = main(args)
        reset_accelerate()
    recorded = json.loads((out / "dpo" / "train_config.json").read_text())["args"]
    assert recorded["task_type"] == "dpo" and recorded["model_name_or_path"] == str(out / "sft")
    assert recorded["use_peft"] and (out / "sft" / "model.safetensors").is_file()  # merged SFT export
    assert results["before"]["eval_rewards/margins"] == 0.0
    assert results["before"]["eval_rewards/accuracies"] == 0.0
    assert results["before"]["eval_samples"] == results["dpo"]["eval_samples"] == 48
    first = next(r for r in read_jsonl(out / "dpo" / "metrics.jsonl") if "loss" in r)
    assert first["rewards/chosen"] == 0.0 and first["rewards/rejected"] == 0.0
    assert results["dpo"]["eval_rewards/margins"] != 0.0
    assert results["dpo"]["global_step"] == 2
