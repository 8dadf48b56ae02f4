"""`--sweep_config sweep.yaml`: the study's size, Optuna sampler and pruner, and the search space over
training flags, read into a `SweepSpec` and checked before any trial starts (one ConfigError line each)."""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("none", "median", "hyperband")
TYPES = ("float", "int", "categorical")
TOP_KEYS = ("n_trials", "sampler", "seed", "pruner", "pruner_startup_trials", "search_space")
PARAM_KEYS = {"float": {"low", "high", "log", "step"}, "int": {"low", "high", "log", "step"}}
PARAM_KEYS["categorical"] = {"choices"}
# Flags a trial cannot take from the search space: the sweep sets the folder and resuming of each
# trial, and the objective (metric and direction) is the study's, the same for every trial.
NOT_SEARCHED = ("output_dir", "resume_from_checkpoint", "overwrite_output_dir", "config",
                "metric_for_best_model", "greater_is_better")  # fmt: skip


@dataclass(frozen=True)
class Param:
    """One searched flag: Optuna's suggest_float / suggest_int / suggest_categorical arguments."""

    name: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()


@dataclass(frozen=True)
class SweepSpec:
    n_trials: int
    """Trials the study holds when the sweep is done (complete, pruned or failed), over all workers."""
    sampler: str = "tpe"
    seed: int | None = None
    pruner: str = "none"
    pruner_startup_trials: int = 5
    """median: trials that finish before any is pruned (Optuna's n_startup_trials)."""
    search_space: tuple[Param, ...] = ()
    path: str | None = dataclasses.field(default=None, compare=False)
    """The YAML file it was read from, for messages."""


def read_sweep_config(path: str) -> SweepSpec:
    """The YAML file as a checked `SweepSpec`; a problem is one ConfigError naming the key."""
    where = f"--sweep_config {path}"
    try:
        values = yaml.safe_load(Path(path).read_text())
    except OSError as error:
        raise _bad(
            f"{where}: cannot read it ({error.strerror})", "give the path of the sweep's YAML file"
        ) from None
    except yaml.YAMLError:
        raise _bad(f"{where}: not valid YAML", "fix the syntax") from None
    if not isinstance(values, dict):
        raise _bad(
            f"{where}: expected a mapping (n_trials, sampler, pruner, search_space)", "see docs/sweeps.md"
        )
    unknown = sorted(set(values) - set(TOP_KEYS))
    if unknown:
        raise _bad(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}", f"keys are {', '.join(TOP_KEYS)}"
        )
    spec = SweepSpec(
        n_trials=_whole(values.get("n_trials"), f"{where}: n_trials", minimum=1),
        sampler=_one_of(values.get("sampler", "tpe"), SAMPLERS, f"{where}: sampler"),
        seed=None if values.get("seed") is None else _whole(values["seed"], f"{where}: seed", minimum=0),
        pruner=_one_of(str(values.get("pruner", "none")).lower(), PRUNERS, f"{where}: pruner"),
        pruner_startup_trials=_whole(
            values.get("pruner_startup_trials", 5), f"{where}: pruner_startup_trials"
        ),
        search_space=_search_space(values.get("search_space"), where),
        path=path,
    )
    if spec.sampler == "grid":
        floats = [p.name for p in spec.search_space if p.type == "float"]
        if floats:
            raise _bad(
                f"{where}: sampler grid needs finite choices, but {', '.join(floats)} is a float range",
                "make it {type: categorical, choices: [...]} or use sampler tpe or random",
            )
    return spec


def grid_of(param: Param) -> list:
    """The values `sampler: grid` tries: the choices, or every step of an int range."""
    if param.type == "categorical":
        return list(param.choices)
    return list(range(int(param.low), int(param.high) + 1, int(param.step or 1)))


def _search_space(space, where: str) -> tuple[Param, ...]:
    if not isinstance(space, dict) or not space:
        raise _bad(f"{where}: search_space must map flag names to ranges", "see docs/sweeps.md")
    hints = typing.get_type_hints(TrainConfig)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    params = []
    for name, spec in space.items():
        at = f"{where}: search_space.{name}"
        if name not in fields:
            raise _bad(f"{at}: --{name} is not a training flag", "keys of search_space are the flag names")
        if name == "seeds":  # a trial is one run, with --seed: a list of seeds would be recorded, not run
            raise _bad(
                f"{at}: a trial is one run, so --seeds cannot be searched",
                "search seed instead, or rerun the best params over seeds with --rerun_best_with_seeds N",
            )
        if name in NOT_SEARCHED:
            raise _bad(f"{at}: the sweep sets --{name} itself", f"give --{name} on the command line instead")
        if not isinstance(spec, dict):
            raise _bad(f"{at}: expected {{type: float|int|categorical, ...}}", "see docs/sweeps.md")
        kind = _one_of(spec.get("type"), TYPES, f"{at}: type")
        unknown = sorted(set(spec) - PARAM_KEYS[kind] - {"type"})
        if unknown:
            allowed = ", ".join(sorted(PARAM_KEYS[kind]))
            raise _bad(
                f"{at}: unknown key(s) {', '.join(map(str, unknown))} for type {kind}", f"use {allowed}"
            )
        params.append(_categorical(name, spec, at) if kind == "categorical" else _range(name, kind, spec, at))
        _check_field_type(params[-1], hints[name], at)
    return tuple(params)


def _range(name: str, kind: str, spec: dict, at: str) -> Param:
    cast = _number if kind == "float" else (lambda v, w: _whole(v, w, minimum=None))
    low, high = cast(spec.get("low"), f"{at}: low"), cast(spec.get("high"), f"{at}: high")
    if low > high:
        raise _bad(f"{at}: low {low} is above high {high}", "swap them")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise _bad(f"{at}: log must be true or false, got {log!r}", "write log: true or log: false")
    if log and low <= 0:
        raise _bad(f"{at}: log needs low above 0, got {low}", "raise low or drop log: true")
    step = None if spec.get("step") is None else cast(spec["step"], f"{at}: step")
    if step is not None and (step <= 0 or log):
        raise _bad(f"{at}: step must be above 0 and without log, got {step}", "fix step or drop log: true")
    return Param(name, kind, low, high, log, step)


def _categorical(name: str, spec: dict, at: str) -> Param:
    choices = spec.get("choices")
    if not isinstance(choices, list) or not choices:
        raise _bad(f"{at}: choices must be a non-empty list", "write choices: [a, b]")
    scalar = (type(None), bool, int, float, str)
    if not all(isinstance(c, scalar) for c in choices):
        raise _bad(f"{at}: choices must be numbers, strings, booleans or null", "list plain values")
    return Param(name, "categorical", choices=tuple(choices))


def _check_field_type(param: Param, annotation, at: str) -> None:
    """A float range for an integer flag would hand the run 16.7 as a batch size; a choice the flag
    cannot take (a word for a batch size, a scheduler that does not exist) would crash its trial, and the
    worker adopting it after would crash again: refused before any trial."""
    if param.type == "categorical":
        _check_choices(param, annotation, at)
        return
    accepts = set(typing.get_args(annotation)) or {annotation}
    if param.type == "float" and not accepts & {float}:
        raise _bad(f"{at}: --{param.name} is not a float flag", "use type: int or categorical")
    if param.type == "int" and not accepts & {int, float}:
        raise _bad(f"{at}: --{param.name} is not a number flag", "use type: categorical")


def _check_choices(param: Param, annotation, at: str) -> None:
    words, kinds = set(), set()

    def walk(kind) -> None:  # Literal words, and the plain types of a (possibly optional) annotation
        if typing.get_origin(kind) is typing.Literal:
            words.update(typing.get_args(kind))
        elif typing.get_args(kind) and typing.get_origin(kind) not in (list, tuple, dict):
            for each in typing.get_args(kind):
                walk(each)
        else:
            kinds.add(kind)

    walk(annotation)
    optional = type(None) in kinds
    kinds.discard(type(None))
    for choice in param.choices:
        if choice is None:
            takes = optional
        elif words and not kinds:
            takes = choice in words
        elif kinds == {bool}:
            takes = isinstance(choice, bool)
        elif kinds and kinds <= {int, float}:
            takes = type(choice) in kinds or (type(choice) is int and float in kinds)
        else:  # strings, lists: the run's own checks judge the value
            takes = True
        if not takes:
            shown = f": {', '.join(map(str, sorted(words, key=str)))}" if words else ""
            raise _bad(
                f"{at}: --{param.name} cannot take {choice!r}", f"list values --{param.name} takes{shown}"
            )


def _number(value, what: str) -> float:
    try:  # PyYAML reads 1e-5 (no dot) as a string
        number = (
            float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
        )
    except ValueError:
        number = None
    if number is None or not math.isfinite(number):
        raise _bad(f"{what} must be a number, got {value!r}", "write a number such as 1.0e-5")
    return number


def _whole(value, what: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        above = f" of at least {minimum}" if minimum is not None else ""
        raise _bad(f"{what} must be a whole number{above}, got {value!r}", "write a whole number")
    return value


def _one_of(value, allowed: tuple, what: str) -> str:
    if value not in allowed:
        raise _bad(
            f"{what} must be one of {', '.join(allowed)}, got {value!r}", f"use one of {', '.join(allowed)}"
        )
    return value


def _bad(message: str, fix: str) -> ConfigError:
    """Every problem of the YAML file names --sweep_config as the flag to fix."""
    return ConfigError(f"{message}; {fix}", flag="--sweep_config", fix=fix)
