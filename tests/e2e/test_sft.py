"""Generative fine-tuning (`--task_type causal_lm`) on a tiny random Llama with ChatML: one update's loss
is the mean over every target token of the window, however the window is cut (one batch, accumulation,
two processes, --packing) and whether the loss runs whole or in chunks (--chunked_loss_tokens), and equals
plain PyTorch's on the same rows; evaluation weighs tokens alike on any number of processes and batch
sizes; a packed run resumes bitwise; the exported model chats through `pipeline`."""

from __future__ import annotations

import json
import math
import random
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import encode_row
from finetune.mnli import main
from finetune.run import setup
from tests.chat_models import build_tiny_lm
from tests.helpers import read_jsonl, reset_accelerate, weights, with_flag
from tests.warm_ranks import run_ranks

WORDS = ["red", "green", "blue", "apple", "river", "stone", "cloud", "seven", "quiet", "north", "bright",
         "window", "paper", "light"]  # fmt: skip


def conversation(rng: random.Random) -> dict:
    """A user asking for some words back, the assistant answering; turns of varied lengths."""
    asked = rng.sample(WORDS, rng.randint(1, 6))
    turns = [{"role": "user", "content": "say " + " ".join(asked)},
             {"role": "assistant", "content": " ".join(asked)}]  # fmt: skip
    if rng.random() < 0.4:
        more = rng.sample(WORDS, rng.randint(1, 3))
        turns += [{"role": "user", "content": "and " + " ".join(more)},
                  {"role": "assistant", "content": " ".join(more)}]  # fmt: skip
    if rng.random() < 0.3:
        turns.insert(0, {"role": "system", "content": "You repeat words."})
    return {"messages": turns}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sft")
    rng = random.Random(0)
    return {
        "model": build_tiny_lm("llama", folder / "llama"),
        "train": write_jsonl(folder / "train.jsonl", [conversation(rng) for _ in range(24)]),
        "validation": write_jsonl(folder / "validation.jsonl", [conversation(rng) for _ in range(7)]),
    }


def sft_args(chat, out, *extra: str) -> list[str]:
    return [
        "--task_type", "causal_lm",
        "--model_name_or_path", str(chat["model"]),
        "--train_file", str(chat["train"]),
        "--validation_file", str(chat["validation"]),
        "--output_dir", str(out),
        "--max_length", "64",
        "--mixed_precision", "no",
        "--report_to", "none",
        "--save_plots", "false",
        *extra,
    ]  # fmt: skip


ONE_UPDATE = ("--max_train_steps", "1", "--logging_steps", "1", "--learning_rate", "1e-6",
              "--eval_strategy", "steps", "--eval_steps", "1")  # fmt: skip


def first_update(out) -> dict:
    return next(r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r)


def reference_loss_and_norm(chat, max_length: int = 64) -> tuple[float, float]:
    """Plain PyTorch: every training row alone (no padding, no batching), the summed cross-entropy of its
    target tokens; the mean over all of them, its gradient's norm. Rows truncated at `max_length`."""
    tokenizer = AutoTokenizer.from_pretrained(chat["model"])
    model = AutoModelForCausalLM.from_pretrained(chat["model"])
    total, count = 0.0, 0
    for number, line in enumerate(chat["train"].read_text().splitlines()):
        messages = json.loads(line)
        row = encode_row(
            messages, "messages", tokenizer, max_length=max_length, row_number=number, source="t"
        )
        ids, labels = torch.tensor([row.input_ids]), torch.tensor([row.labels])
        logits = model(input_ids=ids).logits[0, :-1]
        total = total + torch.nn.functional.cross_entropy(logits, labels[0, 1:], reduction="sum")
        count += int((labels[0, 1:] != -100).sum())
    loss = total / count
    loss.backward()
    norms = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(norms))
    return float(loss), float(norm)


def test_one_update_is_the_mean_over_every_target_token_however_the_window_is_cut(chat, tmp_path, capsys):
    """Batch 24, the loss whole; 6 x 4 accumulation and 2 processes x 4 x 3, the loss in chunks of 8
    target tokens (--chunked_loss true, training and evaluation): the same logged loss and gradient norm,
    equal to plain PyTorch's on the same rows; and the same eval_loss for evaluation batches of 64, 3 and
    2 (on 2 processes, 7 validation rows: one rank gets a repeated row, counted once)."""
    one = tmp_path / "one"
    main(sft_args(chat, one, *ONE_UPDATE, "--per_device_train_batch_size", "24", "--chunked_loss", "false"))
    assert "chunked_loss=false" in capsys.readouterr().out  # the start line
    chunks = ("--chunked_loss", "true", "--chunked_loss_tokens", "8")
    cut = tmp_path / "accumulated"
    main(sft_args(chat, cut, *ONE_UPDATE, *chunks, "--per_device_train_batch_size", "6",
                  "--gradient_accumulation_steps", "4", "--per_device_eval_batch_size", "3"))  # fmt: skip
    assert "chunked_loss=true" in capsys.readouterr().out
    two = tmp_path / "two"
    split = ("--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "3",
             "--per_device_eval_batch_size", "2")  # fmt: skip
    ranks = run_ranks(sft_args(chat, two, *ONE_UPDATE, *chunks, *split))
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    results = [json.loads((out / "results.json").read_text()) for out in (one, cut, two)]
    assert [r["world_size"] for r in results] == [1, 1, 2]
    resolved = [json.loads((out / "train_config.json").read_text())["resolved"] for out in (one, cut, two)]
    chosen = [(r["chunked_loss"], r["chunked_loss_tokens"]) for r in resolved]
    assert chosen == [("false", None), ("true", 8), ("true", 8)]
    updates = [first_update(out) for out in (one, cut, two)]
    loss, norm = reference_loss_and_norm(chat)
    for update in updates:
        assert update["loss"] == pytest.approx(loss, rel=1e-5)
        assert update["grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert all(r["train_samples"] == 24 for r in results)
    evaluated = [r["eval_loss"] for r in results]
    assert evaluated == pytest.approx([evaluated[0]] * 3, rel=1e-5)
    assert all(r["eval_samples"] == 7 for r in results)
    assert results[0]["eval_perplexity"] == pytest.approx(math.exp(evaluated[0]), rel=1e-9)


def keeping_packs(packs: list):
    """`setup`, recording the training split's packs (each one's document lengths) in `packs`."""

    def build(*launch):
        run = setup(*launch)
        packs.extend(run.train_loader.dataset["document_lengths"])
        return run

    return build


def test_a_packed_update_is_the_same_mean_over_every_target_token(chat, tmp_path, capsys):
    """--packing: the 24 rows best-fit into a few sequences of up to 256 tokens, all in one update (as
    the first test's batch of 24), the loss in chunks of 16 target tokens (--chunked_loss auto): the same
    logged loss and gradient norm as plain PyTorch on the rows alone; train_samples counts documents, not
    packs."""
    out, packs = tmp_path / "packed", []
    chunks = ("--chunked_loss_tokens", "16")
    args = with_flag(sft_args(chat, out, *ONE_UPDATE, "--packing", *chunks), "--max_length", "256")
    results = main([*args, "--per_device_train_batch_size", "24"], keeping_packs(packs))
    assert sum(len(pack) for pack in packs) == 24
    assert all(len(pack) >= 2 for pack in packs) and len(packs) <= 8  # several documents in every pack
    tokens = sum(sum(pack) for pack in packs)
    assert tokens > 256 * (len(packs) - 1)  # as few packs as the tokens need
    fill = f"{tokens / (256 * len(packs)):.0%}"
    said = f"train 24 rows, packed into {len(packs)} sequences of up to 256 tokens, {fill} filled"
    assert said in capsys.readouterr().out
    assert said in results["task"] and said in (out / "README.md").read_text()  # the task line, kept
    update = first_update(out)
    loss, norm = reference_loss_and_norm(chat, max_length=256)
    assert update["loss"] == pytest.approx(loss, rel=1e-5)
    assert update["grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert results["train_samples"] == 24 and results["global_step"] == 1
    assert json.loads((out / "train_config.json").read_text())["resolved"]["chunked_loss_tokens"] == 16


def test_a_packed_run_resumed_from_its_checkpoint_ends_bitwise_equal(chat, tmp_path, capsys):
    """8 updates of 2 packs (11 packs of up to 128 tokens: the 6th update starts the second epoch's
    reshuffle of the same packs), a checkpoint every 4; the run that died after step 4 resumes from
    checkpoint-4 and ends with the uninterrupted run's weights, bit for bit."""
    steps = ("--packing", "--max_train_steps", "8", "--checkpointing_steps", "4", "--learning_rate", "3e-3",
             "--per_device_train_batch_size", "2", "--eval_strategy", "no")  # fmt: skip
    unbroken, packs = tmp_path / "unbroken", []
    main(with_flag(sft_args(chat, unbroken, *steps), "--max_length", "128"), keeping_packs(packs))
    reset_accelerate()
    assert len(packs) == 11  # 6 micro-batches an epoch: step 8 is in the second
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(unbroken / "checkpoint-4", out / "checkpoint-4")
    args = with_flag(sft_args(chat, out, *steps, "--resume_from_checkpoint", "auto"), "--max_length", "128")
    capsys.readouterr()
    results = main(args)
    assert f"resuming from {out / 'checkpoint-4'} at step 4" in capsys.readouterr().out
    assert results["global_step"] == 8
    a, b = weights(unbroken), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], weights_at_start(chat))


def weights_at_start(chat) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(chat["model"])
    return model.model.layers[0].mlp.up_proj.weight.detach()


def test_sft_learns_and_the_exported_model_chats_through_pipeline(chat, tmp_path):
    """A few epochs of the tiny Llama: eval_loss falls well below its start; the output folder loads in
    `pipeline("text-generation")`, which answers a messages list; the card has the chat snippet."""
    from transformers import pipeline

    out = tmp_path / "out"
    schedule = ("--num_train_epochs", "6", "--per_device_train_batch_size", "4", "--learning_rate", "3e-3",
                "--eval_strategy", "epoch", "--logging_steps", "6")  # fmt: skip
    results = main(sft_args(chat, out, *schedule))
    evaluations = [r["eval_loss"] for r in read_jsonl(out / "metrics.jsonl") if "eval_loss" in r]
    assert evaluations[-1] < 0.6 * evaluations[0]
    assert results["metric_for_best_model"] == "eval_loss" and results["greater_is_better"] is False
    generate = pipeline("text-generation", model=str(out))
    answer = generate([{"role": "user", "content": "say red"}], max_new_tokens=5, do_sample=False)
    assert answer[0]["generated_text"][-1]["role"] == "assistant"
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and 'chat = pipeline("text-generation"' in card


def test_sft_trains_without_a_validation_file(chat, tmp_path):
    """As TRL's SFTTrainer: no validation rows, no evaluation; the last step's model is exported."""
    out = tmp_path / "out"
    args = sft_args(chat, out, "--max_train_steps", "2")
    del args[args.index("--validation_file") : args.index("--validation_file") + 2]
    results = main(args)
    reset_accelerate()
    assert (results["global_step"], results["exported_model_step"], results["best_metric"]) == (2, 2, None)
    assert "eval_loss" not in results and (out / "model.safetensors").is_file()


def test_a_chat_file_without_an_assistant_turn_is_refused_before_the_model_loads(chat, tmp_path):
    """Its row named while the rows are read: here the model folder has no weights, which loading would
    refuse first; a user waits seconds, not the model's loading (18 s for SmolLM2 on 2 cores)."""
    no_weights = tmp_path / "no-weights"
    shutil.copytree(chat["model"], no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    rows = [conversation(random.Random(1)), {"messages": [{"role": "user", "content": "say red"}]}]
    questions = write_jsonl(tmp_path / "questions.jsonl", rows)
    args = with_flag(sft_args(chat, tmp_path / "out"), "--model_name_or_path", str(no_weights))
    with pytest.raises(ConfigError) as refused:
        main(with_flag(args, "--train_file", str(questions)))
    assert str(refused.value) == (
        f"{questions}: row 1 has no assistant turn to train on; add one, or --assistant_only_loss false"
    )
    prompts = write_jsonl(
        tmp_path / "pc.jsonl", [{"prompt": rows[0]["messages"][:1], "completion": rows[1]["messages"]}]
    )
    with pytest.raises(ConfigError) as refused:  # a conversational prompt-completion: its completion's turns
        main(with_flag(args, "--train_file", str(prompts)))
    assert str(refused.value) == (
        f"{prompts}: row 0 has no assistant turn in its completion to train on; add one, or "
        "--assistant_only_loss false"
    )
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_without_an_eos_token_trains_where_its_template_ends_turns(chat, tmp_path, capsys):
    """Qwen-style: no eos_token in tokenizer_config.json, <|im_end|> ending every turn (and in
    generation_config.json's eos_token_id): the turn-end token is the EOS, rows end with it, generation
    stops at it. Only a tokenizer with nothing that ends a turn is refused."""
    from transformers import GenerationConfig

    from finetune.mnli import cli
    from tests.chat_models import IM_END

    folder = shutil.copytree(chat["model"], tmp_path / "no-eos")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("eos_token", None)
    config.pop("pad_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").unlink(missing_ok=True)
    assert AutoTokenizer.from_pretrained(folder).eos_token is None
    out = tmp_path / "out"
    args = with_flag(sft_args(chat, out, "--max_train_steps", "2"), "--model_name_or_path", str(folder))
    assert cli(args) == 0, capsys.readouterr().err[-2000:]
    im_end = AutoTokenizer.from_pretrained(out).convert_tokens_to_ids(IM_END)
    assert AutoTokenizer.from_pretrained(out).eos_token == IM_END
    assert im_end in torch.tensor(GenerationConfig.from_pretrained(out).eos_token_id).flatten().tolist()
    reset_accelerate()
    # Nothing ends a turn: refused in one line.
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    text = write_jsonl(tmp_path / "text.jsonl", [{"text": "say red"}] * 4)
    plain = with_flag(with_flag(args, "--train_file", str(text)), "--output_dir", str(tmp_path / "plain"))
    plain = with_flag(plain, "--validation_file", str(text))
    assert cli(plain) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "its tokenizer has no EOS token and no chat template ending a turn with a special token" in err
