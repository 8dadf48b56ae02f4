"""`make bench-sft-quality`: does the model this toolkit's SFT exports learn as well as TRL's SFTTrainer's?

The speed benchmark (`bench_sft`) cannot say: each tool reports its own eval_loss (TRL's the mean of
per-batch means, this toolkit's the mean per target token). Here both tools train SmolLM2-135M-Instruct
on the same sums (`make demo-sft`'s task, as TRL's conversational prompt-completion rows: a user asks
"What is 12 plus 30?", the assistant answers "12 + 30 = 42."), through `bench_sft`'s own runs (the same
model, batch, accumulation, learning rate, schedule, steps, fp32; each tool's defaults otherwise), for
several seeds. Then one judge, the same code for every exported model, measures on held-out questions:
- `answer_loss`: the cross-entropy per answer token, over the tokens after the rendered prompt through the
  end-of-turn token, summed over all rows and divided by their count (plain PyTorch, one row at a time);
- `exact_match`: greedy answers (`generate`, 16 new tokens at most), stripped, equal to the reference.
Printed: each seed's figures, the mean and standard deviation per tool over seeds, and the difference of
the means in units of the seeds' standard deviation.

    python -m benchmarks.sft_quality [--seeds 1,2,3] [--max_steps 30] [--learning_rate 5e-5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_sft import _cpu, plain_model, run_once
from finetune.demo_sft import conversations


def sums(count: int, seed: int) -> list[dict]:
    """`make demo-sft`'s conversations (a sum asked, `a + b = c.` answered) as TRL's conversational
    prompt-completion rows."""
    return [
        {"prompt": row["messages"][:1], "completion": row["messages"][1:]}
        for row in conversations(count, seed)
    ]


def judge(model_dir: Path, tokenizer_dir: Path, rows: list[dict], batch_size: int = 16) -> dict:
    """The same measurement for every exported model: answer_loss and exact_match (module docstring)."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # one tokenizer for both tools' models
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True)["input_ids"] for r in rows
    ]
    summed, count = 0.0, 0
    with torch.no_grad():
        for row, prompt in zip(rows, prompts, strict=True):
            full = tokenizer.apply_chat_template(row["prompt"] + row["completion"])["input_ids"]
            assert full[: len(prompt)] == prompt, "the template broke the prompt's prefix"
            answer = full[len(prompt) :]
            answer = answer[: answer.index(end_of_turn) + 1]  # through the end-of-turn token
            ids = torch.tensor([prompt + answer])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            summed += float(F.cross_entropy(logits, torch.tensor(answer), reduction="sum"))
            count += len(answer)
        tokenizer.padding_side = "left"
        correct = 0
        for start in range(0, len(rows), batch_size):
            batch = prompts[start : start + batch_size]
            width = max(map(len, batch))
            pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_turn
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16, do_sample=False,
                                 pad_token_id=pad, eos_token_id=end_of_turn)  # fmt: skip
            for row, new in zip(rows[start : start + batch_size], out[:, width:], strict=True):
                said = tokenizer.decode(new, skip_special_tokens=True).strip()
                correct += said.casefold() == row["completion"][0]["content"].strip().casefold()
    return {"answer_loss": summed / count, "exact_match": correct / len(rows), "answer_tokens": count}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--train_rows", type=int, default=400)
    parser.add_argument("--validation_rows", type=int, default=96)
    parser.add_argument("--output", default="sft_quality.json")
    args = parser.parse_args()
    cache = Path.home() / ".cache" / "finetune-bench" / "smollm2-135m"
    model = plain_model(cache)
    data = Path(tempfile.mkdtemp(prefix="sft-quality-data-"))
    held_out = sums(args.validation_rows, seed=1000)
    for name, rows in (("train", sums(args.train_rows, seed=0)), ("validation", held_out[:32])):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = judge(model, model, held_out)
    print(f"before training: {before}", flush=True)
    tools = ["toolkit", "trl"]
    judged = {tool: [] for tool in tools}
    for number, seed in enumerate(int(s) for s in args.seeds.split(",")):
        for tool in tools if number % 2 == 0 else reversed(tools):
            flags = ["--max_steps", str(args.max_steps), "--batch_size", str(args.batch_size),
                     "--accumulation", str(args.accumulation), "--learning_rate", str(args.learning_rate),
                     "--max_length", "256", "--seed", str(seed)]  # fmt: skip
            figures = run_once(tool, model, data, flags)
            scores = judge(Path(figures["model_dir"]), model, held_out)
            shutil.rmtree(figures["run_dir"], ignore_errors=True)
            judged[tool].append({"seed": seed, **scores, "own_eval_loss": figures["eval_loss"]})
            print(f"seed {seed} {tool}: {judged[tool][-1]}", flush=True)
    summary = {}
    for tool, runs in judged.items():
        summary[tool] = {
            key: {"mean": statistics.mean(values), "std": statistics.stdev(values)}
            for key in ("answer_loss", "exact_match")
            for values in [[r[key] for r in runs]]
        }
    print(f"\n{'tool':10}{'answer_loss':>22}{'exact_match':>22}")
    for tool, s in summary.items():
        loss, match = s["answer_loss"], s["exact_match"]
        print(f"{tool:10}{loss['mean']:13.4f} ± {loss['std']:.4f}{match['mean']:13.3f} ± {match['std']:.3f}")
    for key in ("answer_loss", "exact_match"):
        a, b = summary["toolkit"][key], summary["trl"][key]
        difference, noise = a["mean"] - b["mean"], statistics.mean([a["std"], b["std"]])
        spread = abs(difference) / noise if noise else float("inf")
        print(f"{key}: toolkit - trl = {difference:+.4f}, {spread:.2f} seed standard deviations")
    settings = {k: v for k, v in vars(args).items() if k != "output"}  # a path of this machine's
    environment = {"date": time.strftime("%Y-%m-%d"), "cpu": _cpu(), "settings": settings}
    report = {"environment": environment, "before": before, "runs": judged, "summary": summary}
    Path(args.output).write_text(json.dumps(report, indent=2))
    shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
