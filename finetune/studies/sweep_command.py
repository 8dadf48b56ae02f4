"""The sweep's command line: `finetune/sweep.py --sweep_config SWEEP.yaml [sweep flags] [training flags]`.
Parses the flags and reads the YAML before the study loop (studies/sweep.py) is imported, with torch,
transformers and Optuna: `--help`, a bad flag or a bad YAML file answer in about a second, not after the
seconds of imports a trial needs (as finetune/cli.py does for a run)."""

from __future__ import annotations

import sys

from finetune.config.parser import parse_config
from finetune.distributed.launch_env import say_once
from finetune.errors import ConfigError, OneLineParser, Stopped, TrainingFailed, TrainingInterrupted
from finetune.interrupt import exit_at_once_while_importing, stop_signals_raise
from finetune.studies.sweep_config import read_sweep_config

SWEEP_USAGE = """usage: finetune/sweep.py --sweep_config SWEEP.yaml [sweep flags] [training flags]

An Optuna study whose trials are finetune runs (docs/sweeps.md); every other flag is a training flag,
shared by every trial (listed below the sweep's own).
"""


def sweep_cli(argv: list[str] | None = None, build=None) -> int:
    """Collective: the sweep's command line; a mistake is one `error:` line on stderr (exit 2), a failed
    trial is not (it is recorded and the sweep goes on). `build`: run_config's hook, wrapped per trial."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with stop_signals_raise():
            sweep_main(argv, build)
    except (ConfigError, TrainingFailed) as error:
        if "--debug" in argv:
            raise
        say_once(f"error: {error}")
        return 2 if isinstance(error, ConfigError) else 1
    except TrainingInterrupted as stopped:
        return stopped.exit_code  # the run said where its checkpoint is; a worker resumes the trial
    except (KeyboardInterrupt, Stopped) as stopped:
        say_once("error: the sweep was stopped; start the same command again to go on (the trial resumes)")
        return stopped.exit_code if isinstance(stopped, Stopped) else 130
    return 0


def sweep_main(argv: list[str] | None = None, build=None) -> dict:
    """Collective: the sweep for Python callers; returns sweep.json's content (rank 0; {} elsewhere)."""
    parser = OneLineParser(
        prog="finetune/sweep.py", allow_abbrev=False, add_help=False, usage=SWEEP_USAGE.splitlines()[0]
    )
    parser.add_argument("--sweep_config", help="the sweep's YAML: search space, n_trials, sampler, pruner")
    parser.add_argument("--study_name", help="the study to create or join; default: one per settings")
    parser.add_argument("--storage", default=None, help="an Optuna storage URL; default: a journal file")
    parser.add_argument("--rerun_best_with_seeds", type=int, default=0, help="the best params over N seeds")
    options, training_argv = parser.parse_known_args(argv)
    if {"-h", "--help"} & set(training_argv):  # the sweep's own flags, then every training flag
        print(SWEEP_USAGE + parser.format_help().split("\n", 2)[-1])
        parse_config(["--help"])
    if not options.sweep_config:
        raise ConfigError("--sweep_config is missing; give the sweep's YAML file (see docs/sweeps.md)")
    spec = read_sweep_config(options.sweep_config)
    base = parse_config(training_argv)
    if options.rerun_best_with_seeds < 0:
        seeds = options.rerun_best_with_seeds
        raise ConfigError(f"--rerun_best_with_seeds must be a whole number of seeds >= 0, got {seeds}")
    with exit_at_once_while_importing():
        from finetune.studies.sweep import run_sweep
    return run_sweep(base, spec, options.study_name, options.storage, build, options.rerun_best_with_seeds)
