import dataclasses

import pytest

from finetune.config import ConfigError, TrainConfig, parse_config

FLAGS = [
    "--model_name_or_path", "some/model",
    "--train_file", "train.jsonl",
    "--validation_file", "dev.csv",
    "--per_device_train_batch_size", "16",
    "--gradient_accumulation_steps", "2",
    "--learning_rate", "3e-5",
    "--num_train_epochs", "2",
    "--checkpointing_steps", "100",
    "--overwrite_output_dir", "true",
    "--report_to", "none",
]  # fmt: skip

YAML = """
model_name_or_path: some/model
train_file: train.jsonl
validation_file: dev.csv
per_device_train_batch_size: 16
gradient_accumulation_steps: 2
learning_rate: 3e-5
num_train_epochs: 2
checkpointing_steps: 100
overwrite_output_dir: true
report_to: none
"""


def test_yaml_and_flags_give_the_same_config(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(YAML)
    from_flags = dataclasses.asdict(parse_config(FLAGS))
    from_yaml = dataclasses.asdict(parse_config(["--config", str(path)]))
    from_yaml.pop("config")
    from_flags.pop("config")
    assert from_yaml == from_flags
    assert from_yaml["learning_rate"] == 3e-5 and isinstance(from_yaml["per_device_train_batch_size"], int)


def test_flags_override_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(YAML)
    config = parse_config(["--config", str(path), "--learning_rate", "1e-4"])
    assert config.learning_rate == 1e-4
    assert config.per_device_train_batch_size == 16


def test_defaults_are_the_real_mnli_recipe():
    config = parse_config([])
    assert (config.model_name_or_path, config.dataset_name, config.dataset_config_name) == (
        "bert-base-cased",
        "nyu-mll/glue",
        "mnli",
    )
    assert (config.num_train_epochs, config.learning_rate, config.per_device_train_batch_size) == (
        3,
        2e-5,
        32,
    )
    assert config.max_length == 128


@pytest.mark.parametrize("flag", ["--learning_rte", "--learning_r"])  # typos, and no abbreviations
def test_unknown_flag_is_an_error(flag):
    with pytest.raises(ConfigError, match=f"unknown argument.*{flag}"):
        parse_config([flag, "1e-4"])


def test_unknown_yaml_key_names_the_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("learning_rte: 1e-4\n")
    with pytest.raises(ConfigError, match="learning_rte"):
        parse_config(["--config", str(path)])


def test_unparsable_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("learning_rate: [1e-4\n")
    with pytest.raises(ConfigError, match="broken.yaml.*not valid YAML"):
        parse_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("field", "value", "flag"),
    [
        ("per_device_train_batch_size", 0, "--per_device_train_batch_size"),
        ("gradient_accumulation_steps", -1, "--gradient_accumulation_steps"),
        ("num_train_epochs", 0, "--num_train_epochs"),
        ("learning_rate", 0.0, "--learning_rate"),
        ("max_train_samples", 0, "--max_train_samples"),
        ("checkpointing_steps", "often", "--checkpointing_steps"),
        ("report_to", "comet", "--report_to"),
        ("mixed_precision", "fp8", "--mixed_precision"),
        ("dropout_kernel", "fast", "--dropout_kernel"),
        ("padding_free", "yes", "--padding_free"),
        ("peak_tflops", 0.0, "--peak_tflops"),
        ("train_file", "data.parquet", "--train_file"),
    ],
)
def test_bad_values_name_the_flag(field, value, flag):
    kwargs = {"train_file": "t.jsonl", "validation_file": "v.jsonl", field: value}
    with pytest.raises(ConfigError, match=flag):
        TrainConfig(**kwargs)


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "launcher", "expected"),
    [
        (False, False, None, "no"),  # Skylake to Ice Lake Xeons: oneDNN emulates bf16, 2-4x slower
        (True, False, None, "bf16"),  # AVX512-BF16 (Cooper Lake, Zen 4)
        (False, True, None, "bf16"),  # AMX (Sapphire Rapids and later)
        (False, False, "bf16", "bf16"),  # an accelerate config that asks for bf16 wins
        (True, False, "no", "bf16"),  # a config without mixed precision leaves the choice to auto
    ],
)
def test_auto_precision_is_bf16_only_where_the_cpu_multiplies_bf16_natively(
    monkeypatch, avx512_bf16, amx, launcher, expected
):
    import torch

    from finetune.runtime import resolve_mixed_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # What every AVX-512 CPU answers, native bf16 or not: not the signal to go by.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    if launcher is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    assert resolve_mixed_precision("auto") == expected
    assert resolve_mixed_precision("no") == "no"
