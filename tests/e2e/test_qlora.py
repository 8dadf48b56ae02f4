"""--load_in_4bit / --load_in_8bit with --use_peft (QLoRA) for every family: the quantized base stays
frozen and unchanged, the adapters and head train, the export is the base dequantised to its dtype with
the adapters merged in (a plain transformers model, no quantization_config), resume is bitwise; and the
flag combinations that cannot work, refused in one line."""

import json
import shutil
import sys
import types

import pytest
import torch

pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed (pip install -e '.[qlora]')")

from accelerate.utils import DistributedType  # noqa: E402
from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BitsAndBytesConfig,
    pipeline,
)

from finetune.config.train_config import TrainConfig  # noqa: E402
from finetune.mnli import cli, main  # noqa: E402
from finetune.model.quantization import keep_as_loaded, quantization_options  # noqa: E402
from tests.chat_models import build_tiny_lm  # noqa: E402
from tests.e2e.test_sft import conversation, write_jsonl  # noqa: E402
from tests.helpers import refused, reset_accelerate, shifted_validation, tiny_args, weights  # noqa: E402
from tests.tagging_data import sentences, tiny_tagger  # noqa: E402
from tests.tagging_data import write_jsonl as write_tags  # noqa: E402

LORA = ["--use_peft", "--lora_r", "4", "--lora_alpha", "8", "--learning_rate", "1e-2"]
SCALE = 8 / 4
STEPS = ["--max_train_steps", "4", "--checkpointing_steps", "2"]


def quantized(bits: int, keep: list[str]) -> BitsAndBytesConfig:
    """What the run loads its base with (fp32 compute: the tests' runs are fp32), for references."""
    if bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=keep)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.float32, llm_int8_skip_modules=keep)  # fmt: skip


def dequantized_base(auto_class, base_dir, bits: int, keep: list[str]) -> dict:
    """The base as bitsandbytes holds it, each quantized weight dequantised: what an unchanged frozen base
    contributes to the merged model."""
    from peft.utils.integrations import dequantize_bnb_weight

    model = auto_class.from_pretrained(
        base_dir, quantization_config=quantized(bits, keep), dtype=torch.float32
    )
    plain = {}
    for name, module in model.named_modules():
        if hasattr(module, "weight") and type(module).__module__.startswith("bitsandbytes"):
            plain[f"{name}.weight"] = dequantize_bnb_weight(
                module.weight, getattr(module, "state", None)
            ).float()
    return plain


def check_export(out, base_dir, auto_class, bits: int, keep: list[str], head: str | None, inputs: dict):
    """The exported root: an ordinary model (no quantization_config) whose adapted weights are the
    dequantised base plus B·A·alpha/r, every other weight the base's own (or the trained head); its logits
    those of the 4-bit base with the saved adapter, to dequantisation's rounding."""
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    base, merged = weights(base_dir), weights(out)
    adapter = load_file(out / "adapter" / "adapter_model.safetensors")
    assert merged.keys() == base.keys()
    held = dequantized_base(auto_class, base_dir, bits, keep)
    adapted = 0
    for name, tensor in merged.items():
        module = name.removesuffix(".weight")
        a_name = f"base_model.model.{module}.lora_A.weight"
        if a_name in adapter:
            delta = adapter[a_name.replace("lora_A", "lora_B")] @ adapter[a_name] * SCALE
            assert delta.abs().max() > 0, name  # B starts at zero: the adapter trained
            torch.testing.assert_close(tensor, held[name] + delta, rtol=0, atol=1e-6)
            adapted += 1
        elif head and name.startswith(f"{head}."):
            assert torch.equal(tensor, adapter[f"base_model.model.{name}"]) and not torch.equal(
                tensor, base[name]
            )
        else:  # embeddings, norms, biases: frozen in --torch_dtype, never quantized
            assert torch.equal(tensor, base[name]), name
    assert adapted == len(held) > 0  # every quantized layer got an adapter (all-linear)
    plain = auto_class.from_pretrained(out).eval()
    assert not any(type(m).__module__.startswith("bitsandbytes") for m in plain.modules())
    labels = {} if head is None else {"id2label": plain.config.id2label, "ignore_mismatched_sizes": True}
    reference = auto_class.from_pretrained(
        base_dir, quantization_config=quantized(bits, keep), dtype=torch.float32, **labels
    )  # the run's labels: the head is the adapter's trained copy
    keep_as_loaded(reference)  # as the run holds it: no repacking (AVX512-BF16 CPUs round its scales)
    with_adapter = PeftModel.from_pretrained(reference, out / "adapter").eval()
    with torch.no_grad():
        exported, held_logits = plain(**inputs).logits, with_adapter(**inputs).logits
    if bits == 4:  # the 4-bit forward multiplies by the dequantised weight in fp32: rounding only
        torch.testing.assert_close(exported, held_logits, rtol=1e-4, atol=1e-5)
    else:  # LLM.int8() also rounds each activation row to 127 levels (of its largest value)
        torch.testing.assert_close(exported, held_logits, rtol=0, atol=2e-2 * float(exported.abs().max()))
        assert not torch.equal(exported, held_logits)


def family_args(task_type: str, model_dir, train, validation, out, *extra: str) -> list[str]:
    return ["--task_type", task_type, "--model_name_or_path", str(model_dir), "--train_file", str(train),
            "--validation_file", str(validation), "--output_dir", str(out), "--mixed_precision", "no",
            "--report_to", "none", "--save_plots", "false", "--per_device_train_batch_size", "8", *LORA,
            *extra]  # fmt: skip


@pytest.mark.parametrize("bits", [4, 8])
def test_classifier_trains_adapters_on_a_frozen_quantized_base_and_exports_it_merged(
    bits, tiny_model_dir, nli_files, tmp_path
):
    out = tmp_path / "out"
    results = main(
        tiny_args(tiny_model_dir, nli_files, out, *LORA, f"--load_in_{bits}bit", "--max_train_steps", "4")
    )
    lora = main(tiny_args(tiny_model_dir, nli_files, tmp_path / "lora", *LORA, "--max_train_steps", "1"))
    # The same adapters and head as a 16-bit LoRA run; every weight of the base counted once, unpacked.
    assert results["trainable_parameters"] == lora["trainable_parameters"]
    assert results["total_parameters"] == lora["total_parameters"]
    assert results["base_quantization"].startswith(f"{bits}-bit")
    assert json.loads((out / "results.json").read_text())["base_quantization"] == results["base_quantization"]
    assert f"- base weights: trained in {bits}-bit" in (out / "README.md").read_text()
    tokenizer = AutoTokenizer.from_pretrained(out)
    pairs = (["A man sings.", "Two dogs run"], ["Someone sings.", "Cats sleep"])
    inputs = tokenizer(*pairs, return_tensors="pt", padding=True)
    check_export(
        out, tiny_model_dir, AutoModelForSequenceClassification, bits, ["classifier"], "classifier", inputs
    )
    classify = pipeline("text-classification", model=str(out), device="cpu")
    assert classify([{"text": "A man sings.", "text_pair": "Someone sings."}])[0]["label"] in {
        "entailment", "neutral", "contradiction"}  # fmt: skip


def test_sft_trains_adapters_on_a_4bit_base_with_the_vocabulary_head_kept(tmp_path):
    """causal_lm: the output layer stays unquantized (transformers keeps it; it is tied to the
    embeddings), the Linear layers of the blocks are 4-bit; the loss falls; the export is plain."""
    import random

    rng = random.Random(0)
    model_dir = build_tiny_lm("llama", tmp_path / "llama")
    train = write_jsonl(tmp_path / "train.jsonl", [conversation(rng) for _ in range(24)])
    validation = write_jsonl(tmp_path / "validation.jsonl", [conversation(rng) for _ in range(7)])
    out = tmp_path / "out"
    flags = ("--max_length", "64", "--load_in_4bit", "--max_train_steps", "6", "--logging_steps", "1")
    results = main(family_args("causal_lm", model_dir, train, validation, out, *flags))
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if '"loss"' in line]  # fmt: skip
    assert losses[-1] < losses[0]
    assert results["base_quantization"].startswith("4-bit nf4")
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = dict(tokenizer(["say red green", "and blue"], return_tensors="pt", padding=True))
    check_export(out, model_dir, AutoModelForCausalLM, 4, ["lm_head"], None, inputs)
    generate = pipeline("text-generation", model=str(out), device="cpu")
    assert isinstance(generate("say red", max_new_tokens=3)[0]["generated_text"], str)


def test_tagger_trains_adapters_on_an_8bit_base_and_exports_a_plain_tagger(tmp_path):
    model_dir = tiny_tagger(tmp_path / "bert")
    train = write_tags(tmp_path / "train.jsonl", sentences(32, seed=0))
    validation = write_tags(tmp_path / "validation.jsonl", sentences(8, seed=1))
    out = tmp_path / "out"
    results = main(family_args("token_classification", model_dir, train, validation, out, "--max_length",
                               "32", "--load_in_8bit", "--max_train_steps", "4"))  # fmt: skip
    assert results["base_quantization"].startswith("8-bit")
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = dict(tokenizer(["John lives in Paris .", "Google opened"], return_tensors="pt", padding=True))
    check_export(out, model_dir, AutoModelForTokenClassification, 8, ["classifier"], "classifier", inputs)
    tagged = pipeline("token-classification", model=str(out), device="cpu")("John lives in Paris")
    assert isinstance(tagged, list)


def test_a_4bit_checkpoint_resumes_bitwise_and_holds_the_base_as_quantized(
    tiny_model_dir, nli_files, tmp_path
):
    """checkpoint-2 of a 4-step 4-bit run, resumed: the same merged model and adapter, bit for bit; the
    checkpoint's quantized weights and constants are those of a fresh 4-bit load of the base."""
    args = [*LORA, "--load_in_4bit", "--use_bnb_nested_quant", *STEPS]
    unbroken = tmp_path / "unbroken"
    main(tiny_args(tiny_model_dir, nli_files, unbroken, *args))
    reset_accelerate()
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(unbroken / "checkpoint-2", resumed / "checkpoint-2")
    main(tiny_args(tiny_model_dir, nli_files, resumed, *args, "--resume_from_checkpoint", "auto"))
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a, b = load_file(unbroken / name), load_file(resumed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    saved = load_file(unbroken / "checkpoint-2" / "model.safetensors")
    config = quantized(4, ["classifier"])
    config.bnb_4bit_use_double_quant = True  # --use_bnb_nested_quant
    fresh = AutoModelForSequenceClassification.from_pretrained(
        tiny_model_dir, quantization_config=config
    ).state_dict()
    quantized_entries = [n for n in fresh if ".weight." in n or fresh[n].dtype == torch.uint8]
    assert quantized_entries
    for name in quantized_entries:
        module, _, rest = name.partition(".weight")
        assert torch.equal(saved[f"base_model.model.{module}.base_layer.weight{rest}"], fresh[name]), name


@pytest.mark.parametrize("bits", [4, 8])
def test_the_best_adapter_is_put_back_on_the_quantized_base(bits, tiny_model_dir, nli_files, tmp_path):
    """--load_best_model_at_end with a best evaluation before the last: the exported model is the best
    step's and scores the best evaluation."""
    out = tmp_path / "out"
    flags = [*LORA, f"--load_in_{bits}bit", "--eval_strategy", "steps", "--eval_steps", "8"]
    results = main(tiny_args(tiny_model_dir, shifted_validation(nli_files, tmp_path), out, *flags))
    assert results["best_step"] < results["global_step"]  # the test needs a best before the end
    assert results["exported_model_step"] == results["best_step"]
    assert results["eval_matched_accuracy"] == results["best_evaluation"]["eval_matched_accuracy"]
    best = load_file(out / "best_model" / "adapter" / "adapter_model.safetensors")
    exported = load_file(out / "adapter" / "adapter_model.safetensors")
    assert best.keys() == exported.keys() and all(torch.equal(best[k], exported[k]) for k in best)


@pytest.mark.multiprocess
def test_4bit_on_two_processes_ddp_keeps_replicas_equal(tiny_model_dir, nli_files, tmp_path):
    """DDP over 2 real processes (gloo): each holds the whole 4-bit base on its own device, the adapters'
    gradients are all-reduced, the replicas end identical, and rank 0 exports the plain merged model."""
    from tests.warm_ranks import CPU_2, run_ranks

    out = tmp_path / "out"
    args = tiny_args(tiny_model_dir, nli_files, out, *LORA, "--load_in_4bit", "--max_train_steps", "3")
    done = run_ranks(args, CPU_2)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["replicas_identical"] is True
    assert results["base_quantization"].startswith("4-bit")
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert weights(out).keys() == weights(tiny_model_dir).keys()


def test_a_checkpoint_of_a_16bit_run_is_not_resumed_in_4bit(tiny_model_dir, nli_files, tmp_path, capsys):
    out = tmp_path / "out"
    main(tiny_args(tiny_model_dir, nli_files, out, *LORA, *STEPS))
    reset_accelerate()
    shutil.rmtree(out / "checkpoint-4")
    code = cli(tiny_args(tiny_model_dir, nli_files, out, *LORA, *STEPS, "--load_in_4bit",
                         "--resume_from_checkpoint", "auto"))  # fmt: skip
    assert code != 0 and "--load_in_4bit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "flag", "fix"),
    [
        (["--load_in_4bit"], "--load_in_4bit", "--use_peft"),
        (["--load_in_8bit"], "--load_in_8bit", "--use_peft"),
        (["--use_peft", "--load_in_4bit", "--load_in_8bit"], "--load_in_8bit", "drop"),
        (["--use_peft", "--use_bnb_nested_quant"], "--use_bnb_nested_quant", "--load_in_4bit"),
        (["--use_peft", "--bnb_4bit_quant_type", "fp4"], "--bnb_4bit_quant_type", "--load_in_4bit"),
        (["--use_peft", "--load_in_4bit", "--task_type", "causal_lm", "--gguf_file", "m.gguf", "--train_file",
          "t.jsonl", "--validation_file", "v.jsonl"],
         "--load_in_4bit", "safetensors"),
    ],
)  # fmt: skip
def test_combinations_that_cannot_work_are_refused_naming_the_flag(flags, flag, fix):
    with refused(flag, fix):
        TrainConfig(**_as_fields(flags))


def _as_fields(flags: list[str]) -> dict:
    fields, i = {}, 0
    while i < len(flags):
        name = flags[i].removeprefix("--")
        if i + 1 < len(flags) and not flags[i + 1].startswith("--"):
            fields[name], i = flags[i + 1], i + 2
        else:
            fields[name], i = True, i + 1
    return fields


def test_a_run_without_bitsandbytes_is_refused_with_the_pip_command(
    tiny_model_dir, nli_files, tmp_path, monkeypatch, capsys
):
    """As where the package is not installed: Python's import system finds no bitsandbytes."""
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    code = cli(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", *LORA, "--load_in_4bit"))
    err = capsys.readouterr().err
    assert code != 0 and "--load_in_4bit needs the bitsandbytes package; pip install bitsandbytes" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out" / "model.safetensors").exists()


def test_4bit_under_fsdp_is_refused_before_any_weight_is_read():
    """The accelerator's state is given as FSDP's: the rule reads nothing else of it."""
    config = TrainConfig(use_peft=True, load_in_4bit=True)
    fsdp = types.SimpleNamespace(distributed_type=DistributedType.FSDP, mixed_precision="bf16")
    with refused("--load_in_4bit", "FSDP"):
        quantization_options(config, fsdp)


def test_compute_dtype_follows_the_runs_precision():
    ddp = types.SimpleNamespace(distributed_type=DistributedType.NO, device=torch.device("cpu"))
    config = TrainConfig(use_peft=True, load_in_4bit=True)
    for precision, dtype in (("bf16", torch.bfloat16), ("no", torch.float32), ("fp16", torch.float32)):
        options = quantization_options(config, types.SimpleNamespace(**vars(ddp), mixed_precision=precision))
        assert options["quantization_config"].bnb_4bit_compute_dtype == dtype
        assert options["device_map"] == {"": torch.device("cpu")}
    in_bf16 = TrainConfig(use_peft=True, load_in_4bit=True, torch_dtype="bfloat16")
    options = quantization_options(in_bf16, types.SimpleNamespace(**vars(ddp), mixed_precision="no"))
    assert options["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16
