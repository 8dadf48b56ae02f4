"""The sweep's YAML file (finetune/studies/sweep_config.py): read into a SweepSpec, every bad input one
ConfigError naming --sweep_config, before any trial."""

import pytest

from finetune.errors import ConfigError
from finetune.studies.sweep_config import Param, grid_of, read_sweep_config

GOOD = """
n_trials: 6
sampler: tpe          # tpe | random | grid
seed: 0
pruner: median        # none | median | hyperband
search_space:
  learning_rate: {type: float, low: 1.0e-5, high: 1.0e-3, log: true}
  per_device_train_batch_size: {type: categorical, choices: [16, 32]}
  warmup_ratio: {type: float, low: 0.0, high: 0.2}
  gradient_accumulation_steps: {type: int, low: 1, high: 4, step: 1}
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return str(path)


def test_the_documented_file_reads_as_written(tmp_path):
    spec = read_sweep_config(write(tmp_path, GOOD))
    assert (spec.n_trials, spec.sampler, spec.seed, spec.pruner) == (6, "tpe", 0, "median")
    assert spec.search_space[0] == Param("learning_rate", "float", 1e-5, 1e-3, log=True)
    assert spec.search_space[1].choices == (16, 32)
    assert grid_of(spec.search_space[3]) == [1, 2, 3, 4]
    # 1e-5 without a dot is a string to PyYAML: still a number here.
    spec = read_sweep_config(write(tmp_path, GOOD.replace("1.0e-5", "1e-5")))
    assert spec.search_space[0].low == 1e-5


BAD = {
    "unknown flag": ("learning_rate:", "learning_rte:", "--learning_rte is not a training flag"),
    "low above high": ("low: 0.0, high: 0.2", "low: 0.3, high: 0.2", "low 0.3 is above high 0.2"),
    "unknown type": ("type: int", "type: integer", "type must be one of float, int, categorical"),
    "unknown sampler": ("sampler: tpe", "sampler: cmaes", "sampler must be one of tpe, random, grid"),
    "unknown pruner": ("pruner: median", "pruner: asha", "pruner must be one of none, median, hyperband"),
    "unknown top key": ("seed: 0", "seeds: 0", "unknown key(s) seeds"),
    "unknown param key": ("step: 1}", "stride: 1}", "unknown key(s) stride for type int"),
    "no trials": ("n_trials: 6", "n_trials: 0", "n_trials must be a whole number of at least 1"),
    "log from zero": ("low: 1.0e-5", "low: 0", "log needs low above 0"),
    "float for an int flag": ("type: int, low: 1", "type: float, low: 1", "is not a float flag"),
    "empty choices": ("choices: [16, 32]", "choices: []", "choices must be a non-empty list"),
    "flag the sweep sets": ("warmup_ratio:", "output_dir:", "the sweep sets --output_dir itself"),
    # recorded in each trial's train_config.json and ignored: a trial is one run, with --seed
    "seeds searched": (
        "warmup_ratio: {type: float, low: 0.0, high: 0.2}",
        'seeds: {type: categorical, choices: ["1,2", "3,4"]}',
        "--seeds cannot be searched",
    ),
    "grid over a float range": ("sampler: tpe", "sampler: grid", "sampler grid needs finite choices"),
    "not a number": ("high: 0.2", "high: lots", "high must be a number"),
    # choices the flag cannot take: each trial that drew one crashed, and so did every worker adopting it
    "a word for a batch size": ("choices: [16, 32]", "choices: [16, abc]", "cannot take 'abc'"),
    "a scheduler that does not exist": (
        "choices: [16, 32]}",
        "choices: [16, 32]}\n  lr_scheduler_type: {type: categorical, choices: [linear, bogus]}",
        "--lr_scheduler_type cannot take 'bogus'",
    ),
}


@pytest.mark.parametrize("case", BAD.values(), ids=BAD.keys())
def test_each_bad_input_is_one_config_error_naming_the_flag(case, tmp_path):
    old, new, message = case
    assert old in GOOD
    with pytest.raises(ConfigError) as error:
        read_sweep_config(write(tmp_path, GOOD.replace(old, new, 1)))
    assert message in str(error.value) and "\n" not in str(error.value)
    assert error.value.flag == "--sweep_config" and error.value.fix


def test_a_missing_or_broken_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read it") as error:
        read_sweep_config(str(tmp_path / "absent.yaml"))
    assert error.value.flag == "--sweep_config"
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_sweep_config(write(tmp_path, "n_trials: [1"))


def test_help_lists_the_sweeps_flags_then_the_training_flags(capsys):
    from finetune.studies.sweep_command import sweep_main

    with pytest.raises(SystemExit) as done:
        sweep_main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0
    assert out.index("--rerun_best_with_seeds") < out.index("--learning_rate") and "--sweep_config" in out


@pytest.mark.parametrize(
    ("flags", "flag", "says"),
    [
        (["--rerun_best_with_seeds", "abc"], "--rerun_best_with_seeds", "invalid int value: 'abc'"),
        (["--rerun_best_with_seeds", "-1"], "--rerun_best_with_seeds", "number of seeds >= 0, got -1"),
        (["--sweep_config"], "--sweep_config", "expected one argument"),
        ([], "--sweep_config", "--sweep_config is missing"),
    ],
)
def test_a_bad_sweep_flag_is_one_config_error_naming_it(flags, flag, says, tmp_path):
    """Not argparse's usage block and exit: the one `error:` line the sweep's command line prints."""
    from finetune.studies.sweep_command import sweep_main

    config = ["--sweep_config", write(tmp_path, GOOD)] if "-1" in flags else []
    with pytest.raises(ConfigError) as error:
        sweep_main([*config, *flags])
    assert says in str(error.value) and "\n" not in str(error.value) and error.value.flag == flag


@pytest.mark.parametrize(
    ("sampler", "pruner", "classes"),
    [
        ("tpe", "median", ("TPESampler", "MedianPruner")),
        ("random", "hyperband", ("RandomSampler", "HyperbandPruner")),
        ("grid", "none", ("GridSampler", "NopPruner")),
    ],
)
def test_each_sampler_and_pruner_is_optunas_own(sampler, pruner, classes, tmp_path):
    from finetune.studies.storage import pruner_for, sampler_for

    text = GOOD.replace("sampler: tpe", f"sampler: {sampler}").replace("pruner: median", f"pruner: {pruner}")
    if sampler == "grid":  # a grid takes categorical and int parameters only
        text = text.replace(
            "{type: float, low: 1.0e-5, high: 1.0e-3, log: true}", "{type: categorical, choices: [1.0e-5]}"
        )
        text = text.replace("{type: float, low: 0.0, high: 0.2}", "{type: categorical, choices: [0.0, 0.1]}")
    spec = read_sweep_config(write(tmp_path, text))
    assert (type(sampler_for(spec, 3)).__name__, type(pruner_for(spec)).__name__) == classes


def test_sweep_json_ranks_parameters_with_ped_anova_and_says_so(tmp_path):
    """The same importances on every Optuna this toolkit takes: Optuna 4 defaulted to fANOVA, 5 to
    PED-ANOVA; the report names the method it ran."""
    import optuna

    from finetune.studies.report import write_report

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    # The value follows the learning rate alone: it must rank first.
    study.optimize(
        lambda t: -abs(t.suggest_float("lr", 1e-5, 1e-3, log=True) - 1e-4) + 0 * t.suggest_int("b", 1, 4), 30
    )
    report = write_report(study, tmp_path, {})
    expected = optuna.importance.get_param_importances(
        study, evaluator=optuna.importance.PedAnovaImportanceEvaluator()
    )
    assert report["param_importances_method"] == "PED-ANOVA"
    assert report["param_importances"] == pytest.approx(dict(expected))
    assert next(iter(report["param_importances"])) == "lr"


def test_a_sweep_on_local_files_without_validation_rows_asks_for_them(tmp_path):
    """Training on local files without validation rows resolves --eval_strategy to no, a flag the user
    never gave: the sweep's refusal names what is missing (validation rows), not that flag."""
    from finetune.config.train_config import TrainConfig
    from finetune.studies.sweep import objective

    train = tmp_path / "train.jsonl"
    train.write_text('{"sentence": "a", "label": 0}\n')
    config = TrainConfig(train_file=str(train), output_dir=str(tmp_path / "out"))
    with pytest.raises(ConfigError) as refused:
        objective(config)
    assert refused.value.flag == "--validation_file"
    assert "--validation_split_percentage" in str(refused.value)
    given = TrainConfig(train_file=str(train), output_dir=str(tmp_path / "o2"), eval_strategy="no",
                        validation_split_percentage=10)  # fmt: skip
    with pytest.raises(ConfigError) as told:  # asked for by name: the flag is the one to change
        objective(given)
    assert told.value.flag == "--eval_strategy"
