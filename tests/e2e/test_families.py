"""Every task family through one contract, on tiny models built in process (train, evaluate, predict,
resume, export, 2 processes), the toy family of tests/toy_family.py among them; and DPO's generation
(--do_predict, --predict_with_generate) by the SFT family's code."""

from __future__ import annotations

import json
import random
import shutil
import typing

import pytest
import torch
from safetensors.torch import load_file
from transformers import pipeline

from finetune.config.data_args import TaskType
from finetune.config.identity import run_identity
from finetune.config.parser import parse_config
from finetune.errors import ConfigError
from finetune.families import CONFIG_DEFAULTS, REGISTERED, ConfigDefaults, family_for, register
from finetune.mnli import main
from tests import toy_family
from tests.chat_models import build_tiny_lm
from tests.e2e.test_dpo import pair, write_jsonl
from tests.helpers import read_jsonl, reset_accelerate
from tests.warm_ranks import run_ranks


def exact_match(completions: list[str], references: list[str]) -> float:
    pairs = zip(completions, references, strict=True)
    same = [c.strip().casefold() == r.strip().casefold() for c, r in pairs]
    return sum(same) / len(same)


def conversational(row: dict) -> dict:
    """A pair of tests/e2e/test_dpo.py as messages: the prompt a user turn, each completion a reply."""
    reply = [{"role": "assistant", "content": row["chosen"].strip()}]
    other = [{"role": "assistant", "content": row["rejected"].strip()}]
    return {"prompt": [{"role": "user", "content": row["prompt"]}], "chosen": reply, "rejected": other}


@pytest.mark.parametrize("messages", [False, True], ids=["strings", "conversational"])
def test_dpo_predicts_and_generates_as_sft_does(tmp_path, messages):
    """--do_predict on a file of pairs (their prompts) and --predict_with_generate: predictions.jsonl
    lists each prompt's greedy completion in input order, as `pipeline("text-generation")` of the export
    answers it (a conversation's: with the chat template's generation prompt); eval_exact_match is the
    share of them equal to each pair's chosen completion (a conversation's: its reply)."""
    rng = random.Random(0)
    validation = [pair(rng) for _ in range(5)]
    train = [pair(rng) for _ in range(8)]
    if messages:
        validation, train = [conversational(r) for r in validation], [conversational(r) for r in train]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "validation.jsonl", validation)
    out = tmp_path / "out"
    results = main([
        "--task_type", "dpo", "--model_name_or_path", str(build_tiny_lm("llama", tmp_path / "llama")),
        *local_files(tmp_path), "--test_file", str(tmp_path / "validation.jsonl"), "--do_predict",
        "--predict_with_generate", "--generation_max_new_tokens", "4", "--output_dir", str(out),
        "--max_length", "48", "--per_device_train_batch_size", "4", "--max_train_steps", "2",
        "--learning_rate", "1e-3", "--eval_strategy", "steps", "--eval_steps", "2",
        "--mixed_precision", "no", "--report_to", "none", "--save_plots", "false",
    ])  # fmt: skip
    reset_accelerate()
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(len(validation)))
    completions = [p["completion"] for p in predictions]
    generate = pipeline("text-generation", model=str(out))
    if messages:
        answers = [generate(row["prompt"])[0]["generated_text"][-1]["content"] for row in validation]
        chosen = [row["chosen"][0]["content"] for row in validation]
    else:
        answers = [generate(row["prompt"], return_full_text=False)[0]["generated_text"] for row in validation]
        chosen = [row["chosen"] for row in validation]
    assert answers == completions
    assert results["predict_samples"] == len(validation)
    assert results["eval_exact_match"] == pytest.approx(exact_match(completions, chosen), abs=1e-12)
    logged = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_exact_match" in r]
    assert [r["step"] for r in logged] == [2]
    # The export evaluated alone on pairs two of whose chosen completions are its own answers: 2 of 5
    # match (the reference is the chosen side, not the rejected one; a random model matches none).
    said = [i for i, completion in enumerate(completions) if completion.strip()][:2]
    assert len(said) == 2
    for i in said:
        answer = completions[i].strip()
        if messages:
            validation[i]["chosen"] = [{"role": "assistant", "content": answer}]
        else:
            validation[i]["chosen"] = " " + answer
    write_jsonl(tmp_path / "answered.jsonl", validation)
    alone = main([
        "--task_type", "dpo", "--model_name_or_path", str(out), "--validation_file",
        str(tmp_path / "answered.jsonl"), "--do_train", "false", "--predict_with_generate",
        "--generation_max_new_tokens", "4",
        "--max_length", "48", "--output_dir", str(tmp_path / "alone"), "--mixed_precision", "no",
        "--report_to", "none", "--save_plots", "false",
    ])  # fmt: skip
    assert alone["eval_exact_match"] == pytest.approx(2 / 5, abs=1e-12)


# The contract: each family trained on 2 real processes (a checkpoint at step 2 of 4, evaluation, the
# test rows predicted), then relaunched from that checkpoint alone with --resume_from_checkpoint auto,
# and its export evaluated again by an evaluate-only run on 1 process.
SCHEDULE = ("--max_train_steps", "4", "--checkpointing_steps", "2", "--eval_strategy", "steps",
            "--eval_steps", "4", "--logging_steps", "1", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--learning_rate", "1e-3", "--warmup_ratio", "0",
            "--mixed_precision", "no", "--report_to", "none", "--save_plots", "false",
            "--do_predict")  # fmt: skip
TOY_SCRIPT = "tests/toy_family.py"


def local_files(folder) -> list[str]:
    train, validation = folder / "train.jsonl", folder / "validation.jsonl"
    return ["--train_file", str(train), "--validation_file", str(validation)]


def classification_case(folder, tiny_model_dir, nli_files) -> dict:
    rows = read_jsonl(nli_files["validation"])[:7]
    write_jsonl(folder / "test.jsonl", [{k: r[k] for k in ("premise", "hypothesis")} for r in rows])
    flags = ["--model_name_or_path", str(tiny_model_dir),
             "--train_file", str(nli_files["train"]), "--validation_file", str(nli_files["validation"]),
             "--max_train_samples", "16", "--max_eval_samples", "7", "--max_length", "64"]  # fmt: skip
    return {"flags": flags, "test": folder / "test.jsonl", "tests": 7}


def causal_lm_case(folder, tiny_model_dir, nli_files) -> dict:
    from tests.e2e.test_sft_generate import say

    words = ["red", "green", "blue", "apple", "river", "stone", "cloud", "seven", "quiet"]
    write_jsonl(folder / "train.jsonl", [{"messages": say(w)} for w in words])
    write_jsonl(folder / "validation.jsonl", [{"messages": say(w)} for w in words[:5]])
    write_jsonl(folder / "test.jsonl", [{"messages": say(w)[:1]} for w in words[:5]])
    model = build_tiny_lm("llama", folder / "lm")
    flags = ["--task_type", "causal_lm", "--model_name_or_path", str(model),
             *local_files(folder),
             "--max_length", "32", "--generation_max_new_tokens", "4"]  # fmt: skip
    return {"flags": flags, "test": folder / "test.jsonl", "tests": 5}


def tagging_case(folder, tiny_model_dir, nli_files) -> dict:
    from tests.tagging_data import sentences, tiny_tagger
    from tests.tagging_data import write_jsonl as write_rows

    write_rows(folder / "train.jsonl", sentences(9, seed=0))
    write_rows(folder / "validation.jsonl", sentences(5, seed=1))
    write_rows(folder / "test.jsonl", [{"tokens": r["tokens"]} for r in sentences(5, seed=2)])
    model = tiny_tagger(folder / "tagger")
    flags = ["--task_type", "token_classification", "--model_name_or_path", str(model),
             *local_files(folder),
             "--max_length", "64"]  # fmt: skip
    return {"flags": flags, "test": folder / "test.jsonl", "tests": 5}


def dpo_case(folder, tiny_model_dir, nli_files) -> dict:
    rng = random.Random(0)
    write_jsonl(folder / "train.jsonl", [pair(rng) for _ in range(9)])
    write_jsonl(folder / "validation.jsonl", [pair(rng) for _ in range(5)])
    model = build_tiny_lm("llama", folder / "lm")
    flags = ["--task_type", "dpo", "--model_name_or_path", str(model),
             *local_files(folder),
             "--max_length", "48", "--generation_max_new_tokens", "4"]  # fmt: skip
    # The export evaluated alone: its reference is the starting model, as the run's frozen copy was.
    return {"flags": flags, "test": folder / "validation.jsonl", "tests": 5,
            "evaluated": ["--ref_model_name_or_path", str(model)]}  # fmt: skip


def toy_case(folder, tiny_model_dir, nli_files) -> dict:
    rng = random.Random(0)
    words = ["red", "green", "blue", "apple", "river", "stone", "cloud"]

    def texts(count):
        return [{"text": " ".join(rng.choices(words, k=rng.randint(1, 6)))} for _ in range(count)]

    for name, count in (("train", 9), ("validation", 5), ("test", 5)):
        write_jsonl(folder / f"{name}.jsonl", texts(count))
    flags = ["--task_type", toy_family.NAME, "--model_name_or_path", str(tiny_model_dir),
             *local_files(folder),
             "--max_length", "32"]  # fmt: skip
    return {"flags": flags, "test": folder / "test.jsonl", "tests": 5, "script": TOY_SCRIPT}


CASES = {
    "sequence_classification": classification_case,
    "causal_lm": causal_lm_case,
    "token_classification": tagging_case,
    "dpo": dpo_case,
    toy_family.NAME: toy_case,
}


def test_every_family_is_a_case_of_the_contract():
    """A family added to --task_type's choices without a case here fails, rather than go untested."""
    assert set(CASES) == {*typing.get_args(TaskType), toy_family.NAME}


@pytest.fixture
def toy_registered():
    """The toy family a --task_type of this process (the launched ranks register it themselves)."""
    register(toy_family.NAME, toy_family.WordCount)
    yield
    REGISTERED.pop(toy_family.NAME)


@pytest.mark.multiprocess
@pytest.mark.parametrize("task_type", CASES)
def test_the_contract_of_every_family(task_type, tiny_model_dir, nli_files, tmp_path, toy_registered):
    """Train, evaluate and predict on 2 processes (the world size they got is results.json's); resume
    from a checkpoint with --resume_from_checkpoint auto to the same final weights, bitwise, and the
    same predictions; the export loads as its pipeline and evaluated alone gives results.json's figures."""
    case = CASES[task_type](tmp_path, tiny_model_dir, nli_files)
    script = case.get("script", "finetune/mnli.py")

    def launched(out, *extra):
        argv = [*case["flags"], *SCHEDULE, "--test_file", str(case["test"]), "--output_dir", str(out), *extra]
        ranks = run_ranks(argv, script=script)
        assert ranks.returncode == 0, ranks.stderr[-3000:]
        return json.loads((out / "results.json").read_text())

    out = tmp_path / "two"
    results = launched(out)
    assert results["world_size"] == 2
    assert results["train_samples"] > 0 and results["global_step"] == 4
    predictions = read_jsonl(out / "predictions.jsonl")
    assert len(predictions) == case["tests"] == results["predict_samples"]
    if "row" in predictions[0]:
        assert [p["row"] for p in predictions] == list(range(case["tests"]))

    resumed = tmp_path / "resumed"  # a run that died after its step-2 checkpoint
    resumed.mkdir()
    shutil.copytree(out / "checkpoint-2", resumed / "checkpoint-2")
    again = launched(resumed, "--resume_from_checkpoint", "auto")
    assert again["world_size"] == 2
    final, relaunched = (load_file(folder / "model.safetensors") for folder in (out, resumed))
    assert final.keys() == relaunched.keys()
    assert all(torch.equal(final[name], relaunched[name]) for name in final), "resumed weights differ"
    assert read_jsonl(resumed / "predictions.jsonl") == predictions

    family = family_for(task_type)
    exported = pipeline(family.pipeline_tag, model=str(out))
    assert exported.model.config.model_type == json.loads((out / "config.json").read_text())["model_type"]
    metric = results["metric_for_best_model"]
    flags = [f for f in case["flags"] if f not in ("--max_train_samples", "16")]
    flags[flags.index("--model_name_or_path") + 1] = str(out)
    alone = main([*flags, *case.get("evaluated", ()), "--do_train", "false", "--output_dir",
                  str(tmp_path / "alone"), "--mixed_precision", "no", "--report_to", "none",
                  "--save_plots", "false"])  # fmt: skip
    for key in dict.fromkeys(("eval_loss", metric)):
        assert alone[key] == pytest.approx(results[key], rel=1e-5, abs=1e-7), key


def test_a_family_supplies_its_max_length_default_and_identity_extras(tmp_path, tiny_model_dir):
    """--max_length's default and the tokenizer's place in the identity are the family's: the built-in
    ones as they were recorded (128 and none for the classifiers, 1024 and a digest for the decoders),
    a registered family's its own."""
    write_jsonl(tmp_path / "train.jsonl", [{"text": "a b"}])
    write_jsonl(tmp_path / "validation.jsonl", [{"text": "a"}])

    def parsed(task_type):
        config = parse_config(["--task_type", task_type, "--model_name_or_path", str(tiny_model_dir),
                               *local_files(tmp_path), "--output_dir", str(tmp_path / "out")])  # fmt: skip
        return config.max_length, run_identity(config, 1)["tokenizer"]

    found = {task_type: parsed(task_type) for task_type in typing.get_args(TaskType)}
    assert {t: length for t, (length, _) in found.items()} == {
        "sequence_classification": 128, "causal_lm": 1024, "token_classification": 128, "dpo": 1024
    }  # fmt: skip
    assert [t for t, (_, tokenizer) in found.items() if tokenizer] == ["causal_lm", "dpo"]
    decoder = ConfigDefaults(max_length_tokens=77, tokenizer_in_identity=True)
    register("toy_decoder", toy_family.WordCount, decoder)
    try:
        length, tokenizer = parsed("toy_decoder")
    finally:
        REGISTERED.pop("toy_decoder")
        CONFIG_DEFAULTS.pop("toy_decoder")
    assert length == 77 and tokenizer == found["causal_lm"][1]  # the same folder's tokenizer files
    with pytest.raises(ConfigError, match="--task_type must be one of|--task_type: invalid choice"):
        parsed("toy_decoder")  # registered in this process only
