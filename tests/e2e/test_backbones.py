"""Any sequence-classification backbone: each family fine-tunes, evaluates, predicts and loads in
`pipeline`; decoders get a pad token and predict the same batched (either padding side) as alone;
the loading flags and their one-line refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    ViTConfig,
    pipeline,
)
from transformers.utils import is_flash_attn_2_available

from finetune.mnli import cli, main
from finetune.model.flops import non_embedding_parameters
from finetune.speed.hardware import bf16_is_fast
from finetune.speed.packed_dropout import MODEL_TYPES as PACKED_DROPOUT_TYPES
from finetune.speed.padding_free import MODEL_TYPES as PADDING_FREE_TYPES
from finetune.speed.padding_free import padding_free_pays
from tests.backbones import DECODERS, FAMILIES, NO_EOS, build_tiny
from tests.helpers import SHARED_MNLI, minilm_dir, read_jsonl, reset_accelerate, tiny_args

N_ROWS = 21  # validation = test rows: each row evaluated and predicted once
pytestmark = pytest.mark.skipif(not SHARED_MNLI.is_dir(), reason="the decoders' BPE trains on shared MNLI")


@pytest.fixture(scope="module")
def small_nli(tmp_path_factory):
    from finetune.demo_data import write_demo_dataset

    return write_demo_dataset(tmp_path_factory.mktemp("nli-small"), 64, N_ROWS, seed=0)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, small_nli):
    """family -> (output_dir, results) of one short run with predictions, trained on first use."""
    done = {}

    def run(family: str):
        if family not in done:
            root = tmp_path_factory.mktemp(family)
            model_dir = build_tiny(family, root / "model")
            out = root / "out"
            # 128: no row is truncated, so pipeline (which does not truncate) sees the same tokens.
            flags = ["--test_file", str(small_nli["validation"]), "--do_predict", "true"]
            flags += ["--max_length", "128"]
            results = main(tiny_args(model_dir, small_nli, out, *flags))
            reset_accelerate()
            done[family] = out, results
        return done[family]

    return run


def pair(row: dict) -> dict:
    return {"text": row["premise"], "text_pair": row["hypothesis"]}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_finetunes_evaluates_predicts_and_loads_in_pipeline(family, finetuned, small_nli):
    out, results = finetuned(family)
    assert results["global_step"] == 4  # 64 rows, batch 16
    assert results["eval_matched_samples"] == N_ROWS and results["predict_samples"] == N_ROWS
    trained = json.loads((out / "train_config.json").read_text())
    # The CPU speed paths switched themselves off where the architecture can't take them, and say so;
    # padding-free also where it does not pay on this machine's CPU (the product's rule, not a CPU class).
    takes_padding_free = trained["backbone"]["model_type"] in PADDING_FREE_TYPES
    assert trained["padding_free"] == (
        "true" if takes_padding_free and padding_free_pays("cpu", torch_compile=False) else "false"
    )
    assert trained["dropout_kernel"] == (
        "packed" if trained["backbone"]["model_type"] in PACKED_DROPOUT_TYPES else "torch"
    )
    # The exported folder works in transformers' pipeline, and agrees with the toolkit's predictions.
    classify = pipeline("text-classification", model=str(out), device="cpu")
    rows = read_jsonl(small_nli["validation"])[:3]
    predictions = read_jsonl(out / "predictions.jsonl")[:3]
    for row, predicted in zip(rows, predictions, strict=True):
        scores = {s["label"]: s["score"] for s in classify(pair(row), top_k=None)}
        assert (
            scores.keys() == predicted["probabilities"].keys() == {"entailment", "neutral", "contradiction"}
        )
        for label, probability in predicted["probabilities"].items():
            assert scores[label] == pytest.approx(probability, abs=1e-5), (family, label)
    # MFU's N: every parameter but the embeddings (GPT-2's learned positions included).
    model = classify.model
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]
    assert 0 < non_embedding_parameters(model) <= model.num_parameters() - sum(t.numel() for t in tables)
    exported = json.loads((out / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(out)
    if family in DECODERS:  # they read the last non-pad token: pad_token_id saved with the model
        assert tokenizer.pad_token is not None
        assert exported["pad_token_id"] == tokenizer.pad_token_id
        assert trained["backbone"]["classifier_reads"] == "last non-pad token"
        assert trained["backbone"]["position_ids"] == "from attention_mask"
    if family in NO_EOS:  # no pad, no EOS: a new token, and an embedding row for it
        assert tokenizer.pad_token == "<pad>" and exported["vocab_size"] == len(tokenizer)
    if family in ("distilbert", "modernbert"):  # their forward takes no token types: none made or saved
        assert "token_type_ids" not in tokenizer("a", "b")


@pytest.mark.parametrize("family", ["gpt2", "phi"])
def test_decoder_batched_predictions_equal_row_alone_for_both_padding_sides(
    family, finetuned, small_nli, tmp_path
):
    # GPT-2 has learned absolute positions (left padding would shift them), Phi rotary ones and an
    # added pad token; batches of length-sorted rows of different lengths are padded.
    out, _ = finetuned(family)
    model = AutoModelForSequenceClassification.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    rows = read_jsonl(small_nli["validation"])
    with torch.no_grad():
        alone = [model(**tokenizer(r["premise"], r["hypothesis"], return_tensors="pt")).logits for r in rows]
    expected = torch.cat(alone).softmax(-1)
    for side in ("right", "left"):
        folder = shutil.copytree(out, tmp_path / side)
        settings = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "padding_side": side}))
        flags = ["--do_train", "false", "--do_predict", "true", "--test_file", str(small_nli["validation"])]
        flags += ["--per_device_eval_batch_size", "8", "--max_length", "128"]
        main(tiny_args(folder, small_nli, tmp_path / f"predict-{side}", *flags))
        reset_accelerate()
        predicted = read_jsonl(tmp_path / f"predict-{side}" / "predictions.jsonl")
        names = list(predicted[0]["probabilities"])
        batched = torch.tensor([[p["probabilities"][n] for n in names] for p in predicted])
        assert names == [model.config.id2label[i] for i in range(3)]
        torch.testing.assert_close(batched, expected, atol=1e-5, rtol=1e-4, msg=f"{family}, {side} padding")


@pytest.mark.skipif(not bf16_is_fast(), reason="bf16 weights need native bf16")
def test_bfloat16_weights_train_and_export_in_bfloat16(tmp_path, small_nli, capsys):
    model_dir = build_tiny("llama", tmp_path / "model")
    out = tmp_path / "out"
    flags = ["--torch_dtype", "bfloat16", "--attn_implementation", "eager", "--max_train_steps", "2"]
    results = main(tiny_args(model_dir, small_nli, out, *flags))
    assert results["global_step"] == 2
    trained = json.loads((out / "train_config.json").read_text())
    assert trained["backbone"]["dtype"] == "bfloat16" and trained["attn_implementation"] == "eager"
    assert "torch_dtype=bfloat16 attn_implementation=eager" in capsys.readouterr().out
    exported = AutoModelForSequenceClassification.from_pretrained(out, dtype="auto")
    assert exported.dtype == torch.bfloat16


def test_auto_dtype_refuses_to_train_float16_weights(half_precision_bert, small_nli, tmp_path, capsys):
    folder = half_precision_bert[torch.float16]
    argv = tiny_args(folder, small_nli, tmp_path / "out", "--torch_dtype", "auto")
    assert error_line(argv, capsys) == (
        f"error: --torch_dtype auto: {folder} holds float16 weights, which train unstably; use --torch_dtype "
        "float32 (with --mixed_precision fp16) or bfloat16"
    )
    reset_accelerate()
    # Evaluation only: fp16 weights are fine.
    evaluated = main(
        tiny_args(folder, small_nli, tmp_path / "eval", "--torch_dtype", "auto", "--do_train", "false")
    )
    assert 0 <= evaluated["eval_loss"] < 5


def error_line(argv, capsys) -> str:
    capsys.readouterr()
    assert cli(argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.skipif(
    torch.cuda.is_available() and is_flash_attn_2_available(), reason="flash-attn runs on this machine"
)
def test_flash_attention_is_refused_without_cuda_and_flash_attn(tmp_path, tiny_model_dir, small_nli, capsys):
    argv = tiny_args(
        tiny_model_dir, small_nli, tmp_path / "out", "--attn_implementation", "flash_attention_2"
    )
    assert error_line(argv, capsys).startswith(
        "error: --attn_implementation flash_attention_2: needs a CUDA GPU"
    )


def test_an_attention_kernel_the_model_lacks_is_one_line(tmp_path, small_nli, capsys):
    model_dir = build_tiny("deberta-v2", tmp_path / "model")
    argv = tiny_args(model_dir, small_nli, tmp_path / "out", "--attn_implementation", "sdpa")
    err = error_line(argv, capsys)
    assert err.startswith("error: --attn_implementation sdpa: DebertaV2ForSequenceClassification does not")
    assert err.endswith("drop the flag (transformers then picks one the model has) or use eager")


def test_packed_dropout_is_refused_for_a_decoder(tmp_path, small_nli, capsys):
    model_dir = build_tiny("qwen3", tmp_path / "model")
    argv = tiny_args(model_dir, small_nli, tmp_path / "out", "--dropout_kernel", "packed")
    assert "use --dropout_kernel torch" in error_line(argv, capsys)


def test_a_backbone_without_a_classification_class_is_one_line(tmp_path, small_nli, capsys):
    folder = tmp_path / "vit"
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(folder)
    err = error_line(tiny_args(folder, small_nli, tmp_path / "out"), capsys)
    assert f"--model_name_or_path {folder}: ViTConfig has no sequence-classification class" in err
    assert not (tmp_path / "out" / "model.safetensors").exists()


REMOTE_CONFIG = """from transformers import BertConfig


class TinyRemoteConfig(BertConfig):
    model_type = "tiny-remote"
"""
REMOTE_MODEL = """from transformers import BertForSequenceClassification

from .configuration_tiny_remote import TinyRemoteConfig


class TinyRemoteForSequenceClassification(BertForSequenceClassification):
    config_class = TinyRemoteConfig
"""


def test_code_shipped_with_the_model_needs_trust_remote_code(tmp_path, small_nli, capsys):
    folder = tmp_path / "remote"
    config = BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3
    )
    BertForSequenceClassification(config).save_pretrained(folder)
    settings = json.loads((folder / "config.json").read_text())
    settings.update(
        model_type="tiny-remote",
        auto_map={
            "AutoConfig": "configuration_tiny_remote.TinyRemoteConfig",
            "AutoModelForSequenceClassification": "modeling_tiny_remote.TinyRemoteForSequenceClassification",
        },
    )
    (folder / "config.json").write_text(json.dumps(settings))
    (folder / "configuration_tiny_remote.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny_remote.py").write_text(REMOTE_MODEL)
    AutoTokenizer.from_pretrained(minilm_dir()).save_pretrained(folder)
    argv = tiny_args(folder, small_nli, tmp_path / "out", "--max_train_steps", "1")
    err = error_line(argv, capsys)
    assert err.startswith(f"error: --model_name_or_path {folder}: its config.json maps to code shipped")
    assert err.endswith("pass --trust_remote_code true to run it")
    reset_accelerate()
    # Given the flag, the model's own class trains.
    results = main([*argv, "--trust_remote_code", "true"])
    assert results["global_step"] == 1
    exported = json.loads((tmp_path / "out" / "config.json").read_text())
    assert exported["architectures"] == ["TinyRemoteForSequenceClassification"]
