"""Generation for `--task_type causal_lm` (--predict_with_generate, --do_predict): a tiny Llama that learns
to repeat a word has eval_exact_match over every validation row once, equal to a plain recomputation from
predictions.jsonl, which lists the test prompts' completions in input order; two processes give the same
on an odd number of rows; the exported model's `pipeline` answers greedily as predictions.jsonl does; and
prompts that cannot be compared or read are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, pipeline

from finetune.errors import ConfigError
from finetune.mnli import main
from tests.chat_models import IM_END, build_tiny_lm
from tests.e2e.test_sft import WORDS, write_jsonl
from tests.helpers import read_jsonl, with_flag
from tests.warm_ranks import run_ranks


def say(*words: str) -> list[dict]:
    return [
        {"role": "user", "content": "say " + " ".join(words)},
        {"role": "assistant", "content": " ".join(words)},
    ]


# 7 rows (odd: 2 processes get a repeated row), of varied lengths: 5 words seen in training, and 2
# conversations of several turns it never saw, whose prompts end before their last assistant turn.
VALIDATION = [
    say("river"),
    [{"role": "system", "content": "You repeat words."}, *say("north", "paper")],
    say("red"),
    [
        *say("stone"),
        {"role": "user", "content": "and quiet light"},
        {"role": "assistant", "content": "quiet light"},
    ],
    say("window"),
    say("seven"),
    say("blue"),
]
REFERENCES = [messages[-1]["content"] for messages in VALIDATION]


def sft_args(folder, out, *extra: str) -> list[str]:
    return [
        "--task_type", "causal_lm",
        "--model_name_or_path", str(folder / "llama"),
        "--validation_file", str(folder / "validation.jsonl"),
        "--test_file", str(folder / "prompts.jsonl"),
        "--output_dir", str(out),
        "--max_length", "48",
        "--mixed_precision", "no",
        "--report_to", "none",
        "--predict_with_generate",
        "--generation_max_new_tokens", "8",
        "--do_predict",
        *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def repeater(tmp_path_factory):
    """The tiny Llama trained on "say <word>" for each word (40 updates of all 14), evaluated at its last
    step with generation, exported, and predicting the validation rows' prompts (each conversation less
    its last assistant turn)."""
    folder = tmp_path_factory.mktemp("generate")
    build_tiny_lm("llama", folder / "llama")
    write_jsonl(folder / "train.jsonl", [{"messages": say(word)} for word in WORDS])
    write_jsonl(folder / "validation.jsonl", [{"messages": messages} for messages in VALIDATION])
    write_jsonl(folder / "prompts.jsonl", [{"messages": messages[:-1]} for messages in VALIDATION])
    out = folder / "out"
    schedule = ("--train_file", str(folder / "train.jsonl"), "--max_train_steps", "40",
                "--per_device_train_batch_size", "14", "--learning_rate", "1e-2", "--warmup_ratio", "0",
                "--lr_scheduler_type", "constant", "--eval_strategy", "steps", "--eval_steps", "40",
                "--metric_for_best_model", "eval_exact_match")  # fmt: skip
    return folder, out, main(sft_args(folder, out, *schedule))


def exact_match(completions: list[str], references: list[str]) -> float:
    same = [
        c.strip().casefold() == r.strip().casefold() for c, r in zip(completions, references, strict=True)
    ]
    return sum(same) / len(same)


def test_exact_match_is_the_predictions_share_of_references(repeater):
    """eval_exact_match (picked as the best model's metric, greater is better) is above 0 and equals the
    share of predictions.jsonl's completions equal to their references; the predictions are in input
    order (each learnt word where its prompt asked for it)."""
    _, out, results = repeater
    predictions = read_jsonl(out / "predictions.jsonl")
    assert [p["row"] for p in predictions] == list(range(len(VALIDATION)))
    completions = [p["completion"] for p in predictions]
    assert results["eval_exact_match"] > 0
    assert results["eval_exact_match"] == pytest.approx(exact_match(completions, REFERENCES), abs=1e-12)
    learnt = [i for i, messages in enumerate(VALIDATION) if len(messages) == 2]
    assert [completions[i] for i in learnt] == [REFERENCES[i] for i in learnt]
    assert results["metric_for_best_model"] == "eval_exact_match" and results["greater_is_better"] is True
    logged = [r for r in read_jsonl(out / "metrics.jsonl") if "eval_exact_match" in r]
    assert [r["step"] for r in logged] == [40]
    assert results["predict_samples"] == len(VALIDATION)


@pytest.mark.multiprocess
def test_two_processes_generate_each_row_once(repeater, tmp_path):
    """The exported model evaluated and predicting on 2 processes, 2 rows per batch: 7 rows, so one rank
    repeats a row that is gathered once: the same eval_exact_match and predictions as 1 process."""
    folder, out, results = repeater
    two = tmp_path / "two"
    argv = sft_args(folder, two, "--do_train", "false", "--per_device_eval_batch_size", "2")
    argv[argv.index("--model_name_or_path") + 1] = str(out)
    ranks = run_ranks(argv)
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    again = json.loads((two / "results.json").read_text())
    assert again["world_size"] == 2
    assert again["eval_exact_match"] == results["eval_exact_match"]
    assert read_jsonl(two / "predictions.jsonl") == read_jsonl(out / "predictions.jsonl")


def test_pipeline_answers_as_predictions_greedily(repeater):
    """The export's generation_config.json (and config.json): greedy, with the cache, padding with the pad
    token, stopping at <|im_end|>; `pipeline` with no generation arguments answers each prompt as
    predictions.jsonl."""
    folder, out, _ = repeater
    config = GenerationConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert config.do_sample is False and config.use_cache is True and config.max_new_tokens == 8
    assert json.loads((out / "config.json").read_text())["use_cache"] is True  # model(...) callers' too
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert "local_files_only" not in saved and "is_local" not in saved  # a pushed copy reads the Hub
    assert config.pad_token_id == tokenizer.pad_token_id
    stops = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
    assert tokenizer.convert_tokens_to_ids(IM_END) in stops
    chat = pipeline("text-generation", model=str(out))
    answers = [
        chat(row["messages"])[0]["generated_text"][-1]["content"]
        for row in read_jsonl(folder / "prompts.jsonl")
    ]
    assert answers == [p["completion"] for p in read_jsonl(out / "predictions.jsonl")]


def test_predictions_under_bf16_autocast_are_the_fp32_weights_own(repeater, tmp_path):
    """`--mixed_precision bf16` over fp32 weights (the default on bf16 CPUs and GPUs) trains under
    autocast, but the exported model generates in fp32: predictions are generated without autocast, so
    they stay the exported model's. A model whose logits differ by less than bf16 resolves (each token's
    output row one shared row plus 1e-4 of its own) would answer otherwise."""
    folder, _, _ = repeater
    close = AutoModelForCausalLM.from_pretrained(folder / "llama", tie_word_embeddings=False)
    with torch.no_grad():
        rows = close.get_output_embeddings().weight
        rows.copy_(rows[0] + 1e-4 * rows)
    close.save_pretrained(tmp_path / "close")
    AutoTokenizer.from_pretrained(folder / "llama").save_pretrained(tmp_path / "close")
    runs = {}
    for precision in ("no", "bf16"):
        out = tmp_path / precision
        argv = sft_args(folder, out, "--do_train", "false", "--mixed_precision", precision)
        argv[argv.index("--model_name_or_path") + 1] = str(tmp_path / "close")
        main(argv)
        runs[precision] = read_jsonl(out / "predictions.jsonl")
    assert runs["bf16"] == runs["no"]


def test_prompt_completion_rows_generate_as_conversations(repeater, tmp_path):
    """The same rows as string prompt-completion pairs (the prompt rendered in ChatML by hand) and as
    conversational ones, evaluated and predicted by the exported model: the same completions."""
    folder, out, results = repeater
    tokenizer = AutoTokenizer.from_pretrained(out)
    expected = read_jsonl(out / "predictions.jsonl")
    rendered = [
        tokenizer.apply_chat_template(m[:-1], tokenize=False, add_generation_prompt=True) for m in VALIDATION
    ]
    shapes = {
        "strings": [{"prompt": p, "completion": r} for p, r in zip(rendered, REFERENCES, strict=True)],
        "messages": [{"prompt": m[:-1], "completion": m[-1:]} for m in VALIDATION],
    }
    for name, rows in shapes.items():
        data = tmp_path / name
        data.mkdir()
        write_jsonl(data / "validation.jsonl", rows)
        write_jsonl(data / "prompts.jsonl", [{"prompt": row["prompt"]} for row in rows])
        argv = sft_args(data, data / "out", "--do_train", "false")
        argv[argv.index("--model_name_or_path") + 1] = str(out)
        again = main(argv)
        assert again["eval_exact_match"] == results["eval_exact_match"], name
        assert read_jsonl(data / "out" / "predictions.jsonl") == expected, name
    # The cards: eval_exact_match and eval_loss in the results; a model that learnt to complete string
    # prompts is shown completing one, not chatting.
    card = (out / "README.md").read_text()
    assert f"| eval_exact_match | {results['eval_exact_match']:.4f} |" in card and "| eval_loss |" in card
    assert "accelerate launch -m finetune --task_type causal_lm" in card
    argv = sft_args(tmp_path / "strings", tmp_path / "trained", "--max_train_steps", "1")
    argv[argv.index("--model_name_or_path") + 1] = str(out)
    main([*argv, "--train_file", str(tmp_path / "strings" / "validation.jsonl")])
    card = (tmp_path / "trained" / "README.md").read_text()
    assert "generate(prompt, max_new_tokens=64, return_full_text=False)" in card and "chat(" not in card


def test_refusals_name_the_flag_or_file_and_the_fix(repeater, tmp_path):
    """Plain-text rows with --predict_with_generate (no reference to compare with), and a test file with
    no prompt column: one line each, before the model loads."""
    folder, out, _ = repeater
    write_jsonl(tmp_path / "text.jsonl", [{"text": "say red red"}])
    argv = sft_args(folder, tmp_path / "text_out", "--train_file", str(tmp_path / "text.jsonl"))
    argv[argv.index("--validation_file") + 1] = str(tmp_path / "text.jsonl")
    with pytest.raises(ConfigError) as refused:
        main(argv)
    assert refused.value.flag == "--predict_with_generate" and "text" in str(refused.value)
    assert "drop --predict_with_generate" in refused.value.fix and "\n" not in str(refused.value)

    argv = sft_args(folder, tmp_path / "test_out", "--do_train", "false")
    argv[argv.index("--test_file") + 1] = str(tmp_path / "text.jsonl")
    with pytest.raises(ConfigError) as refused:
        main(argv)
    assert refused.value.flag == "--test_file" and str(tmp_path / "text.jsonl") in str(refused.value)
    assert "`prompt`" in refused.value.fix and "\n" not in str(refused.value)


def test_a_finished_run_predicts_at_another_generation_length(tmp_path, capsys):
    """--generation_max_new_tokens without --predict_with_generate sets only the predictions' length: a
    finished run relaunched with --do_predict and another length predicts with its model, untrained
    again (it was refused as another run, whose fix, --overwrite_output_dir, deleted the model)."""
    from finetune.mnli import cli

    build_tiny_lm("llama", tmp_path / "llama")
    write_jsonl(tmp_path / "train.jsonl", [{"messages": say(word)} for word in WORDS])
    write_jsonl(tmp_path / "validation.jsonl", [{"messages": messages} for messages in VALIDATION[:2]])
    write_jsonl(tmp_path / "prompts.jsonl", [{"messages": messages[:-1]} for messages in VALIDATION[:2]])
    out = tmp_path / "out"
    args = [a for a in sft_args(tmp_path, out) if a not in ("--predict_with_generate", "--do_predict")]
    args += ["--train_file", str(tmp_path / "train.jsonl"), "--max_train_steps", "2"]
    main(args)
    model = (out / "model.safetensors").read_bytes()
    relaunched = with_flag(args, "--generation_max_new_tokens", "3")
    assert cli([*relaunched, "--do_predict", "--resume_from_checkpoint", "auto"]) == 0
    assert "predictions.jsonl (2 rows, by the finished run's model)" in capsys.readouterr().out
    assert (out / "model.safetensors").read_bytes() == model
    assert len(read_jsonl(out / "predictions.jsonl")) == 2
