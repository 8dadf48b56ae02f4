import contextlib
import dataclasses
import json
import re
import typing

import pytest

from finetune.config.parser import OTHER_NAMES, parse_config
from finetune.config.train_config import TrainConfig, to_dict
from finetune.errors import ConfigError
from finetune.families import FLAG_OWNERS as OWNERS
from tests.helpers import REPO, refused

RECIPES = REPO / "recipes"

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


@pytest.mark.parametrize(
    ("given", "fix"),
    [
        (["--learning_rte", "1e-4"], "did you mean --learning_rate? (see --help for the flags)"),
        (["--validation_fle=d.jsonl"], "did you mean --validation_file? (see --help for the flags)"),
        (["--lr", "1"], "see --help for the flags"),  # nothing near enough: no guess
    ],
)
def test_an_unknown_flag_names_the_nearest_flag(given, fix):
    with pytest.raises(ConfigError) as refused:
        parse_config(given)
    assert str(refused.value) == f"unknown argument(s) {' '.join(given)}; {fix}"
    assert refused.value.fix == fix and refused.value.flag == given[0].split("=")[0]


def test_an_unknown_yaml_key_names_the_nearest_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("logging_step: 5\n")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) logging_step; did you mean logging_steps\?$"):
        parse_config(["--config", str(path)])


def test_other_toolkits_names_are_not_flags_here():
    """A name listed for HF Trainer's users must not shadow (or hide) a real flag."""
    assert not set(OTHER_NAMES) & {f.name for f in dataclasses.fields(TrainConfig)}


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
        ("train_file", "data.xlsx", "--train_file"),
    ],
)
def test_bad_values_name_the_flag(field, value, flag):
    kwargs = {"train_file": "t.jsonl", "validation_file": "v.jsonl", field: value}
    with pytest.raises(ConfigError) as refused:
        TrainConfig(**kwargs)
    assert refused.value.flag == flag and refused.value.fix


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

    from finetune.distributed.accelerator import resolve_mixed_precision

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


def test_choice_flags_list_their_choices_and_refuse_others():
    from finetune.config.parser import _Parser

    help_text = _Parser(TrainConfig).format_help()
    assert "--mixed_precision {auto,no,bf16,fp16}" in help_text
    assert "--keep_freed_memory {auto,true,false}" in help_text
    with refused("--report_to", "choose one of auto, wandb, tensorboard, all, none"):
        parse_config(["--report_to", "comet"])


@pytest.mark.parametrize("flag", ["--learning_rate", "--weight_decay", "--max_grad_norm", "--peak_tflops"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_at_parse_time(flag, value):
    with refused(flag, "finite number"):
        parse_config([f"{flag}={value}"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("learning_rate: abc\n", "learning_rate: 'abc' is not a valid value"),
        ("learning_rate: .nan\n", "--learning_rate must be a finite number"),
        ("mixed_precision: fp8\n", "mixed_precision must be one of auto, no, bf16, fp16, got 'fp8'"),
        ("greater_is_better: maybe\n", "greater_is_better: 'maybe' is not a valid value"),
        ("class_weights: [1, 2, 3]\n", "class_weights takes one value, not a list"),
        ("lora_target_modules: [query, 7]\n", None),  # list flags take lists (as strings, like flags)
    ],
)
def test_yaml_values_are_checked_like_flags(tmp_path, text, expected):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    if expected is None:
        assert parse_config(["--config", str(path)]).lora_target_modules == ["query", "7"]
        return
    with pytest.raises(ConfigError, match=re.escape(expected)):
        parse_config(["--config", str(path)])


def test_a_list_flag_given_one_value_in_yaml_is_a_list_of_one(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lora_target_modules: query\n")
    # Not the string "query": `"all-linear" in "query"` would then test for a substring.
    assert parse_config(["--config", str(path)]).lora_target_modules == ["query"]
    assert parse_config(["--lora_target_modules", "query", "value"]).lora_target_modules == ["query", "value"]
    # PEFT's own scripts take commas: the same list, the same run.
    commas = parse_config(["--lora_target_modules", "query,value", "--lora_modules_to_save", "a, b"])
    assert commas.lora_target_modules == ["query", "value"] and commas.lora_modules_to_save == ["a", "b"]


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_recipe_parses(recipe):
    config = parse_config(["--config", str(recipe)])
    assert config.task_name in recipe.read_text()


def test_flags_doc_is_up_to_date():
    from finetune.config.flags import flags_markdown

    committed = (REPO / "docs" / "flags.md").read_text()
    assert committed == flags_markdown(), "docs/flags.md is out of date: run `make flags`"


def _optional_bool_flags() -> list[str]:
    hints = typing.get_type_hints(TrainConfig)
    return [f.name for f in dataclasses.fields(TrainConfig) if hints[f.name] == bool | None]


def test_there_are_optional_bool_flags_to_test():
    assert {"greater_is_better", "load_best_model_at_end"} <= set(_optional_bool_flags())


@pytest.mark.parametrize("name", _optional_bool_flags())
@pytest.mark.parametrize(
    ("spelling", "expected"),
    [
        ([], True),
        (["true"], True),
        (["false"], False),
        (["False"], False),
        (["--learning_rate", "1e-4"], True),  # bare, then the next flag
    ],
)
def test_optional_bool_flags_take_a_bare_form_as_hf_does(name, spelling, expected):
    """`--load_best_model_at_end` alone means true (HF Trainer's spelling); a value still works."""
    config = parse_config([f"--{name}", *spelling])
    assert getattr(config, name) is expected
    assert getattr(parse_config([f"--{name}=false"]), name) is False


def test_optional_bool_flags_left_out_are_decided_later_and_yaml_is_unchanged(tmp_path):
    config = parse_config([])
    assert config.greater_is_better is None  # decided once the metric is known
    assert config.load_best_model_at_end is True  # the run evaluates (--eval_strategy epoch)
    path = tmp_path / "run.yaml"
    path.write_text("greater_is_better: false\nload_best_model_at_end: false\n")
    config = parse_config(["--config", str(path)])
    assert (config.greater_is_better, config.load_best_model_at_end) == (False, False)
    with pytest.raises(ConfigError, match="greater_is_better: 'maybe' is not a valid value"):
        path.write_text("greater_is_better: maybe\n")
        parse_config(["--config", str(path)])


def test_no_flags_say_what_they_turn_off(capsys):
    with pytest.raises(SystemExit) as exited:
        parse_config(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    negated = [f.name for f in dataclasses.fields(TrainConfig) if f.default is True]
    assert {"group_by_length", "do_train", "ddp_gradient_as_bucket_view"} <= set(negated)
    for name in negated:
        # The --no_ flag's own line, up to the next flag: its text, not the positive flag's again.
        entry = re.search(rf"\n  --no_{name}, --no-[\w-]+\s+(.*?)\n  --", help_text, re.S)
        assert entry is not None, name
        assert " ".join(entry.group(1).split()) == f"Turn off --{name}."
        owners = OWNERS.get(name)  # a family's flag, parsed under its family
        family = ["--task_type", owners.families[0], "--dataset_name", "d"] if owners else []
        assert getattr(parse_config([*family, f"--no_{name}"]), name) is False
        assert getattr(parse_config([]), name) is True


@pytest.mark.parametrize(("value", "expected"), [("0.5", 0.5), ("1.5", 1.5), ("2", 2), ("2.0", 2)])
def test_num_train_epochs_takes_fractions_and_whole_numbers_stay_whole(value, expected, tmp_path):
    for config in (
        parse_config(["--num_train_epochs", value]),
        parse_config(["--config", write_yaml(tmp_path, f"num_train_epochs: {value}\n")]),
    ):
        assert config.num_train_epochs == expected
        # train_config.json and the model card show 2, not 2.0
        assert type(config.num_train_epochs) is type(expected)
    default = to_dict(parse_config([]))["num_train_epochs"]
    assert default == 3 and type(default) is int


@pytest.mark.parametrize(
    ("value", "fix"),
    [
        ("0", "positive integer or fraction"),
        ("-0.5", "positive integer or fraction"),
        ("half", "number of epochs"),
        ("nan", "finite number"),
    ],
)
def test_bad_num_train_epochs_is_one_line(value, fix):
    with refused("--num_train_epochs", fix):
        parse_config(["--num_train_epochs", value])


def write_yaml(folder, text: str) -> str:
    path = folder / "run.yaml"
    path.write_text(text)
    return str(path)


def test_user_flags_are_what_the_user_set_not_what_was_resolved(tmp_path):
    path = write_yaml(tmp_path, "learning_rate: 3e-3\nlora_target_modules: [query, value]\nseed: 42\n")
    flags = ["--task_name", "sst2", "--num_train_epochs", "2", "--greater_is_better"]
    config = parse_config(["--config", path, *flags])
    # Resolved by __post_init__, but not given: not a command-line choice to repeat elsewhere.
    assert (config.output_dir, config.project_name, config.dataset_config_name) == (
        "outputs/sst2",
        "finetune-sst2",
        "sst2",
    )
    assert config.load_best_model_at_end is True
    assert config.user_flags == {  # seed 42 is the default; --config's keys stand in for the file
        "task_name": "sst2",
        "learning_rate": 3e-3,
        "num_train_epochs": 2,
        "lora_target_modules": ["query", "value"],
        "greater_is_better": True,
    }
    # Not a field: no --user_flags flag, no key in train_config.json or docs/flags.md.
    assert "user_flags" not in {f.name for f in dataclasses.fields(TrainConfig)}
    assert "user_flags" not in to_dict(config)


def test_yaml_no_is_the_word_no_and_keys_are_given_once(tmp_path):
    """YAML 1.1 reads `no` as false: a choice flag that takes `no` gets it; a key given twice, or a
    config key inside the file, is refused in one line."""
    files = ["train_file: t.jsonl", "validation_file: v.jsonl"]
    written = tmp_path / "run.yaml"
    written.write_text(
        "\n".join([*files, "eval_strategy: no", "mixed_precision: no", "keep_freed_memory: off"])
    )
    config = parse_config(["--config", str(written)])
    assert (config.eval_strategy, config.mixed_precision, config.keep_freed_memory) == ("no", "no", "false")
    written.write_text("\n".join([*files, "seed: 1", "seed: 2"]))
    with pytest.raises(ConfigError, match=r"seed is given twice \(line 4\)"):
        parse_config(["--config", str(written)])
    written.write_text("\n".join([*files, "config: other.yaml"]))
    with pytest.raises(ConfigError) as refused:
        parse_config(["--config", str(written)])
    assert refused.value.flag == "--config" and "give that file with --config" in refused.value.fix


def test_evaluating_a_trained_model_takes_its_task_flags_from_its_record(tmp_path, capsys):
    """--do_train false on a custom task's model: --task_name, --text_columns and --label_column come
    from its train_config.json (also for its best_model/); a flag given wins."""
    model = tmp_path / "run"
    (model / "best_model").mkdir(parents=True)
    task = {"task_name": "custom", "text_columns": "review", "label_column": "verdict"}
    (model / "train_config.json").write_text(json.dumps({"args": {**task, "learning_rate": 1.0}}))
    for folder in (model, model / "best_model"):
        argv = ["--do_train", "false", "--model_name_or_path", str(folder), "--validation_file", "dev.csv"]
        config = parse_config(argv)
        assert (config.task_name, config.text_columns, config.label_column) == ("custom", "review", "verdict")
        assert config.learning_rate == 2e-5  # only the task flags
        assert "--do_train false: --task_name custom --text_columns review --label_column verdict" in (
            capsys.readouterr().out
        )
    given = parse_config([*argv, "--label_column", "stars"])
    assert (given.task_name, given.label_column) == ("custom", "stars")
    assert parse_config(["--model_name_or_path", str(model), "--train_file", "t.csv", "--validation_file",
                         "v.csv"]).task_name == "mnli"  # training: the flags as given  # fmt: skip


def test_evaluating_a_tagger_takes_its_family_and_says_only_what_differs_from_the_defaults(tmp_path, capsys):
    """A tagging run's record holds every flag, defaults included (--task_name mnli, --label_column
    label): --do_train false takes its --task_type, its own columns and its windows' stride, and names
    only those."""
    model = tmp_path / "tagger"
    model.mkdir()
    record = {"task_type": "token_classification", "task_name": "mnli", "text_columns": "words",
              "label_column": "label", "long_documents": "truncate", "doc_stride": 128}  # fmt: skip
    (model / "train_config.json").write_text(json.dumps({"args": record}))
    config = parse_config(["--do_train", "false", "--model_name_or_path", str(model), "--validation_file",
                           "dev.jsonl"])  # fmt: skip
    assert (config.task_type, config.text_columns) == ("token_classification", "words")
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--do_train false")]
    assert said == [f"--do_train false: --task_type token_classification --text_columns words --doc_stride "
                    f"128, as {model / 'train_config.json'} records the model's training"]  # fmt: skip


@pytest.mark.parametrize(
    ("record", "taken"),
    [
        ({"task_type": "token_classification", "max_length": 64, "doc_stride": 4},
         {"max_length": 64, "doc_stride": 4}),  # a tagger's windows, under --long_documents truncate
        ({"task_type": "causal_lm", "max_length": 128}, {"max_length": 128}),
        ({"max_length": 64}, {"max_length": 64}),  # a classifier's truncation
        ({"long_documents": "sliding_window", "max_length": 64, "doc_stride": 8, "window_aggregation": "max"},
         {"max_length": 64, "doc_stride": 8, "window_aggregation": "max"}),
    ],
)  # fmt: skip
def test_evaluating_a_trained_model_reads_its_rows_as_it_was_trained(tmp_path, capsys, record, taken):
    """--do_train false (an evaluation or prediction run) takes --max_length and the windows' --doc_stride
    as the model was trained with them (a tagger evaluated at 128 tokens where it trained on 64 scores
    another model); given flags win, and the window flags stay out under another --long_documents."""
    model = tmp_path / "run"
    model.mkdir()
    (model / "train_config.json").write_text(json.dumps({"args": record}))
    argv = [
        "--do_train",
        "false",
        "--do_predict",
        "--model_name_or_path",
        str(model),
        "--test_file",
        "t.jsonl",
    ]
    config = parse_config(argv)
    assert {k: getattr(config, k) for k in taken} == taken
    said = capsys.readouterr().out
    assert all(f"--{k} {v}" in said for k, v in taken.items()) and "records the model's training" in said
    assert parse_config([*argv, "--max_length", "256"]).max_length == 256
    if "window_aggregation" in taken:
        other = parse_config([*argv, "--long_documents", "truncate"])
        assert other.doc_stride is None and other.window_aggregation != "max" and other.max_length == 64


ASKING = {
    "task_name": ["sst2"], "validation_mismatched_file": ["m.jsonl"], "text_columns": ["text"],
    "label_column": ["y"], "label_names": ["O,B-X"], "label_all_tokens": [], "label_separator": [","],
    "multi_label_threshold": ["0.3"], "class_weights": ["balanced"], "label_smoothing_factor": ["0.1"],
    "long_documents": ["sliding_window"], "window_aggregation": ["max"], "calibrate": ["temperature"],
    "auto_find_batch_size": [], "completion_only_loss": ["false"], "assistant_only_loss": ["false"],
    "chat_template": ["t.jinja"], "gguf_file": ["m.gguf"], "packing": [], "predict_with_generate": [],
    "generation_max_new_tokens": ["8"], "padding_free": ["varlen"], "dropout_kernel": ["packed"],
    "cuda_graphs": ["true"], "chunked_loss": ["true"], "chunked_loss_tokens": ["64"],
    "beta": ["0.2"], "loss_type": ["ipo"], "simpo_gamma": ["1.0"], "rpo_alpha": ["0.5"],
    "ref_model_name_or_path": ["ref"], "precompute_ref_log_probs": [], "prefix_sharing": ["true"],
    "disable_dropout": ["false"],
    "doc_stride": ["16"],
    "window_loss_weighting": ["document"],
}  # fmt: skip
"""A value of each family's flag that asks for what only its families do."""
FAMILIES = ("sequence_classification", "causal_lm", "token_classification", "dpo")


@pytest.mark.parametrize("flag", sorted(ASKING))
def test_a_flag_of_another_family_is_refused_naming_it_and_the_task_type(flag):
    """One rule for every family's flags (config/families.py): set for a --task_type that does not read
    it, it is refused in one line naming the flag and --task_type (accepted, it would change nothing but
    the identity); under its own family it is read. E.g. --chat_template or --assistant_only_loss for a
    tagger, --window_aggregation or --multi_label_threshold for causal_lm, --chat_template or
    --predict_with_generate for a classifier."""
    assert set(ASKING) == set(OWNERS)  # a new family flag needs its case here
    files = ["--train_file", "t.jsonl", "--validation_file", "v.jsonl"]
    for task_type in FAMILIES:
        argv = ["--task_type", task_type, *files, f"--{flag}", *ASKING[flag]]
        if task_type in OWNERS[flag].families:
            with contextlib.suppress(ConfigError):  # another check may want more flags; not this rule
                parse_config(argv)
            continue
        with pytest.raises(ConfigError) as refused:
            parse_config(argv)
        said = str(refused.value)
        assert said.startswith(f"--{flag}") and "it is for --task_type " in said and "\n" not in said
        assert f"not {task_type}; drop it" in said and refused.value.flag == f"--{flag}"
        assert refused.value.fix == f"drop --{flag}"


def test_the_flags_of_another_family_the_adversary_found_are_refused():
    files = ["--train_file", "t.jsonl", "--validation_file", "v.jsonl"]
    for task_type, flags in [("token_classification", ["--chat_template", "t.jinja"]),
                             ("token_classification", ["--no_assistant_only_loss"]),
                             ("causal_lm", ["--window_aggregation", "max"]),
                             ("causal_lm", ["--multi_label_threshold", "0.3"]),
                             ("sequence_classification", ["--chat_template", "t.jinja"]),
                             ("sequence_classification", ["--predict_with_generate"])]:  # fmt: skip
        with pytest.raises(ConfigError, match=f"not {task_type}; drop it"):
            parse_config(["--task_type", task_type, *files, *flags])


def test_seeds_are_distinct_whole_numbers_and_the_interval_uses_students_t():
    """--seeds normalizes spaces; a repeat or a word is refused naming the flag. Student's t at 97.5%:
    the table, then the series (exact values 2.0395 at 31, 1.9840 at 100 degrees of freedom)."""
    from finetune.studies.seeds import describe, t_975

    assert TrainConfig(seeds="42, 43,44").seed_list == [42, 43, 44]
    # 1,01: one seed twice; numpy takes 0..2**32-1 (beyond it: a traceback once the first seed started)
    for bad in ("42,42", "42,x", "", "1,01", "4294967296,1", "-1,2", "99999999999999999999"):
        with refused("--seeds"):
            TrainConfig(seeds=bad)
    for bad in (-1, 2**32):
        with refused("--seed"):
            TrainConfig(seed=bad)
    assert t_975(2) == 4.303 and abs(t_975(31) - 2.0395) < 1e-3 and abs(t_975(100) - 1.9840) < 1e-3
    one = describe({7: 0.5})
    assert (one["n"], one["std"], one["ci95"]) == (1, None, None)


def test_a_seeds_interval_is_cut_to_its_metrics_range():
    """Three F1s near 1: Student's interval passes 1, where no F1 is; cut there, its lower end kept. A
    loss has no upper bound; a label named like a metric does not change which metric a key is."""
    from finetune.metrics.ranges import metric_range
    from finetune.studies.seeds import describe, t_975

    f1 = describe({1: 1.0, 2: 0.96, 3: 1.0}, metric_range("eval_f1_PER"))
    half = t_975(2) * f1["std"] / 3**0.5
    assert f1["mean"] + half > 1 and f1["ci95"] == [f1["mean"] - half, 1.0]
    low = describe({1: 0.0, 2: 0.05, 3: 0.0}, metric_range("eval_matched_accuracy"))
    assert low["ci95"][0] == 0.0 and low["ci95"][1] > 0.05
    loss = describe({1: 0.1, 2: 0.5, 3: 0.9}, metric_range("eval_test_loss"))
    assert loss["ci95"] == [0.0, 0.5 + t_975(2) * 0.4 / 3**0.5]
    assert metric_range("eval_f1_loss") == (0.0, 1.0) and metric_range("eval_matthews_correlation") == (-1, 1)
    assert metric_range("eval_words") == (None, None)
