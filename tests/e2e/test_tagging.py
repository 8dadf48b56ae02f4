"""Token classification (`--task_type token_classification`) on a tiny random BERT with MiniLM's WordPiece
tokenizer, on sentences the tests generate from gazetteers: one update's loss is the mean over every
labelled sub-token however the window is cut (one batch, accumulation, two processes), and evaluation
counts each word once on any number of processes; the metrics equal seqeval's on the predicted words; a
sentence five times --max_length gets one tag per word; the exported model's `pipeline` finds the
entities predictions.jsonl holds."""

from __future__ import annotations

import json
import random

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForTokenClassification, AutoTokenizer

from finetune.families.token_classification.tags import label_order
from finetune.mnli import main
from tests.helpers import assert_sharded, read_jsonl, reset_accelerate, weights
from tests.tagging_data import sentence, sentences, tiny_tagger, write_conll, write_conllu, write_jsonl
from tests.warm_ranks import CPU_2, run_ranks, run_warm


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tagging")
    sixteen = sentences(16, seed=2)
    labels = label_order(tag for row in sixteen for tag in row["ner_tags"])
    return {
        "model16": tiny_tagger(folder / "bert16", labels),  # its head kept by a run on `sixteen`
        "model": tiny_tagger(folder / "bert"),
        "train": write_conll(folder / "train.conll", sentences(48, seed=0)),
        "validation": write_jsonl(folder / "validation.jsonl", sentences(15, seed=1)),  # odd: 2 ranks
        "sixteen": write_jsonl(folder / "sixteen.jsonl", sixteen),  # one update of 16
        "folder": folder,
    }


def tag_args(ner, out, *extra: str) -> list[str]:
    return [
        "--task_type", "token_classification",
        "--model_name_or_path", str(ner["model"]),
        "--train_file", str(ner["train"]),
        "--validation_file", str(ner["validation"]),
        "--output_dir", str(out),
        "--max_length", "32",
        "--mixed_precision", "no",
        "--report_to", "none",
        "--save_plots", "false",
        *extra,
    ]  # fmt: skip


ONE_UPDATE = ("--max_train_steps", "1", "--logging_steps", "1", "--learning_rate", "1e-3",
              "--eval_strategy", "steps", "--eval_steps", "1", "--label_all_tokens")  # fmt: skip


def first_update(out) -> dict:
    return next(r for r in read_jsonl(out / "metrics.jsonl") if "loss" in r)


def reference_loss_and_norm(model_dir, rows: list[dict]) -> tuple[float, float]:
    """Plain PyTorch: each sentence alone, every sub-token labelled (--label_all_tokens: a B-X word's later
    sub-tokens I-X), the cross-entropy summed; the mean over all of them, and its gradient's norm."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForTokenClassification.from_pretrained(model_dir)
    ids = model.config.label2id
    total, count = 0.0, 0
    for row in rows:
        encoded = tokenizer(row["tokens"], is_split_into_words=True, return_tensors="pt")
        labels, previous = [], None
        for word in encoded.word_ids():
            tag = None if word is None else row["ner_tags"][word]
            if tag and word == previous and tag.startswith("B-") and "I-" + tag[2:] in ids:
                tag = "I-" + tag[2:]
            labels.append(-100 if tag is None else ids[tag])
            previous = word
        logits = model(**encoded).logits[0]
        total = total + F.cross_entropy(logits, torch.tensor(labels), reduction="sum")
        count += sum(label != -100 for label in labels)
    loss = total / count
    loss.backward()
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    return float(loss.detach()), float(norm)


@pytest.mark.multiprocess
def test_one_update_is_the_same_however_the_window_is_cut_and_each_word_counts_once(ner, tmp_path):
    """16 sentences in one update of batch 16; 8 x 2 accumulation; 2 processes x 8: the same logged loss
    and gradient norm, plain PyTorch's mean over every labelled sub-token of the 16; and the same evaluation
    of the 15 validation sentences
    (batches of 4: one rank gets a repeated window, counted once)."""
    one, cut, two = tmp_path / "one", tmp_path / "cut", tmp_path / "two"
    ner = {**ner, "train": ner["sixteen"], "model": ner["model16"]}
    main(tag_args(ner, one, *ONE_UPDATE, "--per_device_train_batch_size", "16"))
    reset_accelerate()
    main(tag_args(ner, cut, *ONE_UPDATE, "--per_device_train_batch_size", "8",
                  "--gradient_accumulation_steps", "2", "--per_device_eval_batch_size", "4"))  # fmt: skip
    ranks = run_ranks(tag_args(ner, two, *ONE_UPDATE, "--per_device_train_batch_size", "8",
                               "--per_device_eval_batch_size", "4"))  # fmt: skip
    assert ranks.returncode == 0, ranks.stderr[-3000:]
    results = [json.loads((out / "results.json").read_text()) for out in (one, cut, two)]
    assert [r["world_size"] for r in results] == [1, 1, 2]
    loss, norm = reference_loss_and_norm(ner["model16"], sentences(16, seed=2))
    for update in [first_update(out) for out in (one, cut, two)]:
        assert update["loss"] == pytest.approx(loss, rel=1e-5)
        assert update["grad_norm"] == pytest.approx(norm, rel=1e-4)
    words = sum(len(s["tokens"]) for s in sentences(15, seed=1))
    for r in results:
        assert r["eval_samples"] == 15 and r["eval_words"] == words
        for key in ("eval_f1", "eval_precision", "eval_recall", "eval_accuracy", "eval_f1_PER"):
            assert r[key] == pytest.approx(results[0][key], abs=1e-12), key
        assert r["eval_loss"] == pytest.approx(results[0]["eval_loss"], rel=1e-5)
        assert r["eval_confusion_matrix"] == results[0]["eval_confusion_matrix"]


def test_tagging_learns_scores_as_seqeval_and_predicts_per_word(ner, tmp_path, capsys):
    """A few epochs: eval_f1 rises well above chance; the task line states the CoNLL source, IOB2 and the
    counts; predictions of the validation words (a test file of `tokens`) give, through seqeval, the very
    metrics the run reported; the card and the confusion matrix are written."""
    from seqeval.metrics import classification_report

    out = tmp_path / "out"
    test = write_jsonl(tmp_path / "test.jsonl", [{"tokens": s["tokens"]} for s in sentences(15, seed=1)])
    results = main(tag_args(ner, out, "--num_train_epochs", "4", "--per_device_train_batch_size", "8",
                            "--learning_rate", "5e-3", "--eval_strategy", "epoch",
                            "--do_predict", "--test_file", str(test), "--save_plots", "true"))  # fmt: skip
    printed = capsys.readouterr().out
    assert (
        "task: token_classification, CoNLL files + jsonl rows (tokens, ner_tags), tag scheme IOB2 (BIO), "
        "6 tags: O, B-LOC, B-ORG, B-PER, I-LOC, I-PER; train 48 sentences, 358 words, 92 entities"
    ) in printed
    assert results["metric_for_best_model"] == "eval_f1"
    assert 0.5 < results["eval_f1"] < 1, results["eval_f1"]  # learning, and not every entity found
    gold = [s["ner_tags"] for s in sentences(15, seed=1)]
    predicted = [line["tags"] for line in read_jsonl(out / "predictions.jsonl")]
    assert [len(p) for p in predicted] == [len(g) for g in gold]
    micro = classification_report(gold, predicted, output_dict=True, zero_division=0)["micro avg"]
    assert results["eval_f1"] == pytest.approx(micro["f1-score"], abs=1e-12)
    assert results["eval_precision"] == pytest.approx(micro["precision"], abs=1e-12)
    assert results["eval_recall"] == pytest.approx(micro["recall"], abs=1e-12)
    assert (out / "confusion_matrix.png").is_file()
    card = (out / "README.md").read_text()
    assert "pipeline_tag: token-classification" in card and 'aggregation_strategy="first"' in card
    assert (
        "## Confusion matrix (`eval_confusion_matrix`" in card
        and "- long sentences: windows over words" in card
    )
    assert_pipeline_agrees_on_raw_text(out, tmp_path, capsys, single=True, strategy="simple")
    assert_pipeline_agrees_on_raw_text(out, tmp_path, capsys, single=False, strategy="first")


def assert_pipeline_agrees_on_raw_text(model_dir, tmp_path, capsys, single: bool, strategy: str):
    """The exported model predicts raw text (split by its pre-tokenizer) in a run that only predicts; the
    `pipeline` of the same folder finds the same entities: type, character span and score. `single`: names
    of one sub-token each, where aggregation_strategy="simple" (each sub-token's own tag) is per word;
    otherwise names of several sub-tokens (Kowalski, Zanzibar), where "first" reads each word from its
    first sub-token as the run does."""
    from transformers import pipeline

    rows = sentences(12 if single else 40, seed=3, single=single)  # 40: Zanzibar among them
    texts = [" ".join(s["tokens"]).replace(" .", ".") for s in rows]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    words = [w for text in texts for w, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    several = [w for w in words if len(tokenizer.tokenize(w)) > 1]
    assert bool(several) is not single, several
    raw = write_jsonl(tmp_path / f"raw-{strategy}.jsonl", [{"text": text} for text in texts])
    out = tmp_path / f"predicted-{strategy}"
    capsys.readouterr()
    main(["--task_type", "token_classification", "--model_name_or_path", str(model_dir), "--do_train",
          "false", "--do_predict", "--test_file", str(raw), "--output_dir", str(out), "--max_length", "32",
          "--mixed_precision", "no", "--report_to", "none"])  # fp32, as the pipeline's  # fmt: skip
    assert (
        "task: token_classification, jsonl rows (raw text), tag scheme IOB2 (BIO), 6 tags"
        in capsys.readouterr().out
    )
    lines = read_jsonl(out / "predictions.jsonl")
    assert [line["text"] for line in lines] == texts
    tag = pipeline("token-classification", model=str(model_dir), aggregation_strategy=strategy)
    found = 0
    for line, entities in zip(lines, tag(texts), strict=True):
        ours = [(e["type"], e["start"], e["end"]) for e in line["entities"]]
        assert ours == [(e["entity_group"], e["start"], e["end"]) for e in entities], line["text"]
        assert [e["score"] for e in line["entities"]] == pytest.approx(
            [float(e["score"]) for e in entities], rel=1e-4
        )
        assert all(" ".join(e["words"]) == line["text"][e["start"] : e["end"]] for e in line["entities"])
        found += len(ours)
    assert found >= 6


def test_predictions_under_bf16_autocast_are_the_exported_weights_own(ner, tmp_path):
    """`--mixed_precision bf16` over fp32 weights (auto's choice on bf16 CPUs and GPUs): predictions are
    made without autocast, as `pipeline` makes them with the exported fp32 weights. A head whose labels'
    scores differ by less than bf16 resolves (each label's row one shared row plus 1e-4 of its own)
    would tag otherwise."""
    from transformers import AutoModelForTokenClassification

    close = AutoModelForTokenClassification.from_pretrained(ner["model16"])
    with torch.no_grad():
        rows = close.classifier.weight
        rows.copy_(rows[0] + 1e-4 * rows)
    close.save_pretrained(tmp_path / "close")
    AutoTokenizer.from_pretrained(ner["model16"]).save_pretrained(tmp_path / "close")
    runs = {}
    for precision in ("no", "bf16"):
        argv = tag_args(ner, tmp_path / precision, "--do_train", "false", "--do_predict", "--test_file",
                        str(ner["validation"]), "--mixed_precision", precision)  # fmt: skip
        argv[argv.index("--model_name_or_path") + 1] = str(tmp_path / "close")
        main(argv)
        runs[precision] = [line["tags"] for line in read_jsonl(tmp_path / precision / "predictions.jsonl")]
    assert runs["bf16"] == runs["no"]


def test_a_sentence_five_times_max_length_gets_one_tag_per_word(ner, tmp_path, capsys):
    """A 5 x --max_length sentence among short ones, evaluated and predicted by the tiny tagger: windows
    over words score every word once, so each gets one tag and no gold entity is left out of the
    references (the supports add up to every gold entity)."""
    from seqeval.metrics.sequence_labeling import get_entities

    rng, long = random.Random(4), {"tokens": [], "ner_tags": []}
    while len(long["tokens"]) < 5 * 32:  # a word is at least one sub-token
        more = sentence(rng)
        long = {key: long[key] + more[key] for key in long}
    rows = [long, *sentences(3, seed=5)]
    validation = write_jsonl(tmp_path / "long.jsonl", rows)
    test = write_jsonl(tmp_path / "long_test.jsonl", [{"tokens": row["tokens"]} for row in rows])
    out = tmp_path / "out"
    args = ["--task_type", "token_classification", "--model_name_or_path", str(ner["model16"]),
            "--do_train", "false", "--validation_file", str(validation), "--do_predict", "--test_file",
            str(test), "--output_dir", str(out), "--max_length", "32", "--doc_stride", "4",
            "--per_device_eval_batch_size", "3", "--report_to", "none"]  # fmt: skip
    results = main(args)
    assert "longer than --max_length, in " in capsys.readouterr().out
    assert results["eval_samples"] == 4 and results["eval_words"] == sum(len(r["tokens"]) for r in rows)
    gold = sum(len(get_entities(row["ner_tags"])) for row in rows)
    assert sum(v for k, v in results.items() if k.startswith("eval_support_")) == gold
    predicted = read_jsonl(out / "predictions.jsonl")
    assert [len(line["tags"]) for line in predicted] == [len(row["tokens"]) for row in rows]


def test_lora_trains_the_adapters_and_the_head_and_exports_a_merged_tagger(ner, tmp_path):
    """--use_peft (peft's TOKEN_CLS): adapters on query and value, the classifier head trained in full; the
    exported folder is a plain token classifier that `pipeline` loads, its adapter beside it."""
    from transformers import pipeline

    out = tmp_path / "lora"
    results = main(tag_args(ner, out, "--use_peft", "--lora_target_modules", "query", "value",
                            "--max_train_steps", "4", "--per_device_train_batch_size", "8"))  # fmt: skip
    assert results["trainable_parameters"] < results["total_parameters"] / 4
    assert (out / "adapter" / "adapter_config.json").is_file()
    assert json.loads((out / "adapter" / "adapter_config.json").read_text())["task_type"] == "TOKEN_CLS"
    tagged = pipeline("token-classification", model=str(out))("John lives in Paris")
    assert isinstance(tagged, list) and {t["entity"] for t in tagged} <= set(
        json.loads((out / "config.json").read_text())["label2id"]
    )


def test_pos_tags_from_conllu_are_scored_by_word_accuracy_and_macro_f1(ner, tmp_path, capsys):
    """UPOS from CoNLL-U (range lines and empty nodes skipped): no scheme, so eval_accuracy picks the best
    model, with eval_macro_f1 and the confusion matrix; predictions carry tags and no entities."""
    train, validation = (write_conllu(tmp_path / f"{n}.conllu", sentences(k, seed=s))
                         for n, k, s in (("train", 32, 6), ("dev", 9, 7)))  # fmt: skip
    out = tmp_path / "pos"
    args = tag_args({**ner, "train": train, "validation": validation}, out, "--num_train_epochs", "2",
                    "--per_device_train_batch_size", "8", "--learning_rate", "5e-3", "--do_predict",
                    "--test_file", str(validation), "--save_plots", "true")  # fmt: skip
    results = main(args)
    assert "CoNLL-U (upos), tag scheme none" in capsys.readouterr().out
    assert results["metric_for_best_model"] == "eval_accuracy"
    assert 0 < results["eval_macro_f1"] <= 1 and results["eval_f1_PROPN"] >= 0
    assert results["eval_words"] == sum(len(s["tokens"]) for s in sentences(9, seed=7))
    assert (out / "confusion_matrix.png").is_file()
    lines = read_jsonl(out / "predictions.jsonl")
    assert all(line["entities"] == [] and len(line["tags"]) == len(line["words"]) for line in lines)


def test_sigterm_stops_after_its_step_with_a_checkpoint_and_the_relaunch_ends_bitwise_equal(ner, tmp_path):
    """8 updates of 8 sentences (6 an epoch: the 7th starts the second epoch's reshuffle), a checkpoint
    every 4; SIGTERM during step 5 (a real signal, in its own process) finishes that step, checkpoints it,
    exits 143 with one line; the relaunch with --resume_from_checkpoint auto ends with the unbroken run's
    weights, bit for bit."""
    steps = ("--max_train_steps", "8", "--checkpointing_steps", "4", "--per_device_train_batch_size", "8",
             "--learning_rate", "3e-3", "--eval_strategy", "no", "--label_all_tokens")  # fmt: skip
    unbroken = tmp_path / "unbroken"
    main(tag_args(ner, unbroken, *steps))
    reset_accelerate()
    out = tmp_path / "out"
    told = {"AT_STEP": "5", "SIGNAL": "TERM", "RANKS": "0"}
    stopped = run_warm(tag_args(ner, out, *steps), script="tests/probes/signal_at_step.py", env=told)
    said = [line for line in (stopped.stdout + stopped.stderr).splitlines() if line.startswith("stopped by")]
    assert stopped.returncode == 143 and len(said) == 1, stopped.stderr[-3000:]
    assert said[0].startswith(f"stopped by SIGTERM after step 5; checkpoint saved to {out / 'checkpoint-5'}")
    results = main(tag_args(ner, out, *steps, "--resume_from_checkpoint", "auto"))
    assert results["global_step"] == 8
    a, b = weights(unbroken), weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_decoder_tags_words_full_and_with_lora(ner, tmp_path, lora):
    """A tiny Llama (byte-level BPE without a pad token) as LlamaForTokenClassification: it trains, pads
    with its EOS token, and tags every validation word."""
    from tests.backbones import build_tiny

    model = build_tiny("llama", tmp_path / "llama")
    out = tmp_path / "out"
    peft = ("--use_peft", "--lora_target_modules", "q_proj", "v_proj") if lora else ()
    results = main(tag_args({**ner, "model": model}, out, "--max_train_steps", "3",
                            "--per_device_train_batch_size", "8", *peft))  # fmt: skip
    assert results["eval_words"] == sum(len(s["tokens"]) for s in sentences(15, seed=1))
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForTokenClassification"] and len(config["id2label"]) == 6


def test_seeds_summarize_tagging_runs(ner, tmp_path, capsys):
    """--seeds: each seed a complete tagging run, summarized over eval_f1 (the family's metric)."""
    out = tmp_path / "seeds"
    summary = main(tag_args(ner, out, "--max_train_steps", "3", "--per_device_train_batch_size", "8",
                            "--seeds", "1,2"))  # fmt: skip
    assert summary["seeds"] == [1, 2] and summary["metrics"]["eval_f1"]["n"] == 2
    assert "eval_f1 over 2 seeds: " in capsys.readouterr().out


def test_a_sweep_maximizes_the_tagging_f1(ner, tmp_path):
    """A 2-trial sweep of tagging runs: each trial judged by eval_f1, maximized."""
    from finetune.studies.sweep_command import sweep_main

    config = tmp_path / "sweep.yaml"
    config.write_text("n_trials: 2\nsampler: random\nseed: 0\nsearch_space:\n"
                      "  learning_rate: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")  # fmt: skip
    out = tmp_path / "sweep"
    sweep_main(["--sweep_config", str(config), *tag_args(ner, out, "--max_train_steps", "3",
                                                          "--per_device_train_batch_size", "8")])  # fmt: skip
    report = json.loads((out / "sweep.json").read_text())
    assert report["direction"] == "maximize" and len(report["trials"]) == 2
    assert report["best_trial"]["value"] == max(t["value"] for t in report["trials"])


def test_a_folder_held_by_a_live_run_is_refused_in_one_line(ner, tmp_path, capsys):
    """The output-folder lock holds for a tagging run as for a classifier: another live run's folder is
    refused in one line (exit 2), its lock and files untouched."""
    from tests.e2e.test_checkpoints import refused_while_held

    out = tmp_path / "out"
    refused_while_held(tag_args(ner, out), out, capsys)


def test_a_model_trained_on_iob1_predicts_as_iob1_without_labelled_rows(ner, tmp_path, capsys):
    """IOB1 and IOB2 tag sets share their names (B- splits two adjacent entities in IOB1), so a run that
    only predicts cannot tell them apart from the labels: the export carries the scheme it was trained on
    (config.json's tag_scheme) and the predicting run names it."""

    def iob1(tags: list[str]) -> list[str]:
        out, previous = [], "O"
        for tag in tags:  # B-X only right after an X entity; every other entity starts with I-
            out.append(tag if tag[:2] != "B-" or previous[2:] == tag[2:] else "I-" + tag[2:])
            previous = tag
        return out

    rows = [{**s, "ner_tags": iob1(s["ner_tags"])} for s in sentences(24, seed=8)]
    rows.append(
        {"tokens": ["Paris", "London", "and", "Rome", "."], "ner_tags": ["I-LOC", "B-LOC", "O", "I-LOC", "O"]}
    )
    train = write_jsonl(tmp_path / "iob1.jsonl", rows)
    trained = tmp_path / "trained"
    main(tag_args(ner, trained, "--train_file", str(train), "--validation_file", str(train),
                  "--max_train_steps", "1", "--eval_strategy", "no"))  # fmt: skip
    reset_accelerate()
    assert "tag scheme IOB1," in capsys.readouterr().out
    assert json.loads((trained / "config.json").read_text())["tag_scheme"] == "IOB1"
    test = write_jsonl(tmp_path / "test.jsonl", [{"tokens": s["tokens"]} for s in rows[:3]])
    main(["--task_type", "token_classification", "--model_name_or_path", str(trained), "--do_train", "false",
          "--do_predict", "--test_file", str(test), "--output_dir", str(tmp_path / "predicted"),
          "--report_to", "none"])  # fmt: skip
    assert "tag scheme IOB1, " in capsys.readouterr().out


def test_tagging_trains_without_a_validation_file(ner, tmp_path):
    """As run_ner_no_trainer with no validation file: no evaluation; the last step's model is exported."""
    out = tmp_path / "out"
    args = tag_args(ner, out, "--max_train_steps", "2")
    del args[args.index("--validation_file") : args.index("--validation_file") + 2]
    results = main(args)
    reset_accelerate()
    assert (results["global_step"], results["exported_model_step"], results["best_metric"]) == (2, 2, None)
    assert "eval_f1" not in results and (out / "model.safetensors").is_file()


def test_evaluating_the_exported_tagger_reads_its_windows_as_it_was_trained(ner, tmp_path, capsys):
    """--do_train false on a tagger trained here takes its --max_length and --doc_stride from its
    train_config.json (said on the start line): its long sentences are windowed as in training, so
    evaluating the exported model gives the metrics the training run reported for it."""
    rng, long = random.Random(6), {"tokens": [], "ner_tags": []}
    while len(long["tokens"]) < 3 * 32:
        more = sentence(rng)
        long = {key: long[key] + more[key] for key in long}
    validation = write_jsonl(tmp_path / "long.jsonl", [long, *sentences(3, seed=7)])
    trained = tmp_path / "trained"
    steps = ("--max_train_steps", "2", "--eval_strategy", "steps", "--eval_steps", "2")
    results = main(tag_args(ner, trained, "--validation_file", str(validation), "--doc_stride", "4", *steps))
    reset_accelerate()
    capsys.readouterr()
    again = main(["--task_type", "token_classification", "--model_name_or_path", str(trained),
                  "--do_train", "false", "--validation_file", str(validation), "--output_dir",
                  str(tmp_path / "evaluated"), "--mixed_precision", "no", "--report_to", "none"])  # fmt: skip
    assert "--do_train false: --doc_stride 4 --max_length 32, as " in capsys.readouterr().out
    assert again["eval_loss"] == pytest.approx(results["eval_loss"], rel=1e-5)
    assert again["eval_f1"] == results["eval_f1"]


@pytest.mark.multiprocess
def test_tagging_under_fsdp_on_cpu_is_ddp_sharded(ner, tmp_path):
    """fsdp.yaml on 2 CPU ranks: each rank half of the tagger's parameters, gradients and moments; the
    losses, evaluation and exported weights are DDP's to float tolerance."""
    steps = ("--max_train_steps", "4", "--per_device_train_batch_size", "4", "--logging_steps", "1",
             "--learning_rate", "3e-3", "--eval_strategy", "steps", "--eval_steps", "4")  # fmt: skip
    fsdp = ["--config_file", "accelerate_configs/fsdp.yaml", "--num_processes", "2", "--gpu_ids", "all",
            "--mixed_precision", "no"]  # fmt: skip
    sharded, ddp = tmp_path / "fsdp", tmp_path / "ddp"
    for out, launch in ((sharded, fsdp), (ddp, CPU_2)):
        done = run_ranks(tag_args(ner, out, *steps), launch)
        assert done.returncode == 0, done.stderr[-3000:]
    a, b = (json.loads((out / "results.json").read_text()) for out in (sharded, ddp))
    assert a["world_size"] == b["world_size"] == 2 and a["global_step"] == b["global_step"] == 4
    assert a["distributed_type"] == "FSDP" and b["distributed_type"] == "MULTI_CPU"
    assert_sharded(a)
    logged = [[r["loss"] for r in read_jsonl(out / "metrics.jsonl") if "loss" in r] for out in (sharded, ddp)]
    assert len(logged[0]) == 4 and logged[0] == pytest.approx(logged[1], rel=1e-5)
    assert a["eval_loss"] == pytest.approx(b["eval_loss"], rel=1e-5) and a["eval_f1"] == b["eval_f1"]
    x, y = weights(sharded), weights(ddp)
    assert x.keys() == y.keys()
    for name in x:
        torch.testing.assert_close(x[name], y[name], rtol=1e-4, atol=1e-5, msg=name)
