"""The command line: `finetune [--flags]`, `python -m finetune`, `accelerate launch -m finetune`
(and the scripts finetune/mnli.py, finetune/glue.py). Parses the flags, runs `finetune.run.run_config`,
and turns what the user can act on into one line on stderr and an exit code."""

from __future__ import annotations

import gc
import sys
import traceback

from finetune.config.parser import parse_config
from finetune.distributed.launch_env import say_once
from finetune.errors import ConfigError, Stopped, StoppedAfterFinish, TrainingFailed, TrainingInterrupted
from finetune.interrupt import exit_at_once_while_importing, ignore_while_exiting, stop_signals_raise


def cli(argv: list[str] | None = None, build=None) -> int:
    """Collective: the command line; a mistake or failure the user can act on is one line on stderr,
    said once however many ranks meet it (with `--debug`, its traceback first; the exit code stays).
    Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    with stop_signals_raise():  # what they raise is handled in _run
        return _run(argv, build)


def _run(argv: list[str], build) -> int:
    config = None
    try:
        config = parse_config(argv)
        _runner(config)(config, build)
    except (ConfigError, TrainingFailed) as error:
        if config.debug if config is not None else getattr(error, "debug", False):
            traceback.print_exc()  # then the line and the exit code a run without --debug gives
        say_once(f"error: {error}")
        return 2 if isinstance(error, ConfigError) else 1
    except TrainingInterrupted as stopped:
        return stopped.exit_code  # the main process already said where the checkpoint is
    except StoppedAfterFinish as late:  # the run is complete; a study stops before its next run
        left = "; relaunch with --resume_from_checkpoint auto to finish the study" if config.seeds else ""
        say_once(
            f"note: {late.signal_name} arrived as the finished run closed: its results.json is written{left}"
        )
        return late.exit_code if config.seeds else 0
    except (KeyboardInterrupt, Stopped) as stopped:  # outside training's own handler: loading, exporting
        if config is not None and config.debug:
            traceback.print_exc()
        name = stopped.signal_name if isinstance(stopped, Stopped) else "Ctrl-C"
        say_once(
            f"error: {'interrupted by' if name == 'Ctrl-C' else 'stopped by'} {name}; the run did not finish "
            "(no results.json); its checkpoints, if any, continue with --resume_from_checkpoint auto"
        )
        return stopped.exit_code if isinstance(stopped, Stopped) else 130
    return 0


def script() -> int:
    """The scripts' entry (`finetune`, `-m finetune`, finetune/mnli.py, finetune/glue.py): `cli`, then
    stop signals are ignored while the interpreter exits, which would otherwise end a complete run 143
    with no line.

    First, gc.freeze(): the imports' objects (torch's, transformers', about a million) are never garbage,
    and every full collection walked them, ~0.2 s each: Accelerate's free_memory at the run's end
    collects, and Python collects fully as a run's objects pile up (docs/log.md, 2026-11-28)."""
    gc.freeze()
    code = cli()
    ignore_while_exiting()
    return code


def main(argv: list[str] | None = None, build=None) -> dict:
    """Collective: `cli` for Python callers; returns the results (with --seeds, the summary) and raises
    what `cli` reports."""
    config = parse_config(argv)
    return _runner(config)(config, build)


def _runner(config):
    """`run_seeds` or `run_config`, imported once the flags parsed: torch, transformers and the rest take
    seconds to import, and `--help` or a bad flag needs none of them."""
    with exit_at_once_while_importing():
        if config.seeds:
            from finetune.studies.seeds import run_seeds

            return run_seeds
        from finetune.run import run_config

        return run_config
