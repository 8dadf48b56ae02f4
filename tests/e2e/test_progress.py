"""Evaluation, generation and prediction each show a progress bar, as training does: on the main process
only (made as training's bar is), its final line kept where it is the only bar (an evaluate-only or
predicting run: a user saw 183 s of silence) and cleared under the training bar."""

from __future__ import annotations

import json
import re

import pytest

from finetune.mnli import main
from tests.e2e.test_sft_generate import VALIDATION, say
from tests.helpers import read_jsonl
from tests.tagging_data import sentences, tiny_tagger, write_jsonl
from tests.warm_ranks import run_ranks

BAR = r"\| (\d+)/(\d+) \[[^\x1b]*\]"  # `| n/total [elapsed<left, rate]`, not a nested bar's (cursor moves)


def renders(stderr: str, desc: str, percent: str) -> list[str]:
    """The renders of `desc`'s bars at `percent` ("0": each bar's first, drawn as it starts; "100": done),
    whether redrawn in place (\\r, a terminal's) or on lines of their own (a log file read back)."""
    return [
        part for part in re.split(r"[\r\n]", stderr) if re.fullmatch(rf"{desc}: +{percent}%\|.*?{BAR}", part)
    ]


def kept_lines(stderr: str, desc: str) -> list[str]:
    """The final lines `desc`'s bars leave on screen: a bar kept ends its line with a newline, after its
    last redraw (a cleared one, nested under the training bar, leaves none)."""
    return [line.split("\r")[-1] for line in stderr.split("\n") if renders(line.split("\r")[-1], desc, "100")]


def assert_one_bar_done(stderr: str, desc: str, batches: int | None = None) -> None:
    """One bar started (every process's would draw its 0%) and it ran to its end."""
    assert len(renders(stderr, desc, "0")) == 1, (desc, stderr[-3000:])
    done = [re.search(BAR, line).group(1, 2) for line in renders(stderr, desc, "100")]
    assert done and all(n == total for n, total in done), (desc, stderr[-3000:])
    assert batches is None or done[-1] == (str(batches),) * 2, done


@pytest.mark.multiprocess
def test_an_evaluate_only_run_that_predicts_shows_each_bar_once_on_two_processes(
    tiny_model_dir, nli_files, tmp_path
):
    """2 processes evaluate and predict the 151 validation rows: one finished `eval` bar and one `predict`
    bar on stderr (the main process's), none from the other rank."""
    out = tmp_path / "out"
    done = run_ranks(["--model_name_or_path", str(tiny_model_dir), "--validation_file",
                      str(nli_files["validation"]), "--do_train", "false", "--do_predict", "--test_file",
                      str(nli_files["validation"]), "--output_dir", str(out), "--report_to", "none",
                      "--mixed_precision", "no", "--max_length", "64", "--per_device_eval_batch_size",
                      "16"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["world_size"] == 2
    # 76 rows per rank (one repeated) in batches of 16: 5 each
    assert_one_bar_done(done.stderr, "eval", batches=5)
    assert_one_bar_done(done.stderr, "predict", batches=5)


@pytest.mark.multiprocess
def test_sft_generation_and_predictions_show_their_bars_once_on_two_processes(tmp_path):
    """A causal LM evaluated with --predict_with_generate and predicting, on 2 processes: the loss's `eval`
    bar, the completions' `generate` bar and the test prompts' `predict` bar, each once."""
    from tests.chat_models import build_tiny_lm

    build_tiny_lm("llama", tmp_path / "llama")
    write_jsonl(tmp_path / "validation.jsonl", [{"messages": messages} for messages in VALIDATION])
    write_jsonl(tmp_path / "prompts.jsonl", [{"messages": say("red")[:-1]}] * 3)
    out = tmp_path / "out"
    done = run_ranks(["--task_type", "causal_lm", "--model_name_or_path", str(tmp_path / "llama"),
                      "--validation_file", str(tmp_path / "validation.jsonl"), "--test_file",
                      str(tmp_path / "prompts.jsonl"), "--do_train", "false", "--do_predict",
                      "--predict_with_generate", "--generation_max_new_tokens", "4", "--output_dir", str(out),
                      "--max_length", "48", "--mixed_precision", "no", "--report_to", "none"])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["world_size"] == 2
    for desc in ("eval", "generate", "predict"):
        assert_one_bar_done(done.stderr, desc)


def test_a_tagging_run_keeps_its_predict_bar_and_clears_its_evaluations_under_the_training_bar(
    tmp_path, capsys
):
    """In process: a tagger trained 2 epochs (an evaluation each) and predicting: its `predict` bar's final
    line stays; the evaluations' bars, nested under the training bar, leave no final line of their own."""
    rows = sentences(15, seed=1)
    validation = write_jsonl(tmp_path / "validation.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"tokens": row["tokens"]} for row in rows])
    model = tiny_tagger(tmp_path / "bert")
    main(["--task_type", "token_classification", "--model_name_or_path", str(model), "--train_file",
          str(validation), "--validation_file", str(validation), "--do_predict", "--test_file", str(test),
          "--output_dir", str(tmp_path / "out"), "--max_length", "32", "--mixed_precision", "no",
          "--report_to", "none", "--save_plots", "false", "--num_train_epochs", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert len(read_jsonl(tmp_path / "out" / "predictions.jsonl")) == 15
    assert_one_bar_done(err, "predict")
    assert len(kept_lines(err, "predict")) == 1, err[-3000:]
    assert "eval: " in err and not kept_lines(err, "eval"), err[-3000:]
