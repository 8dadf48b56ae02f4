"""The command line: `finetune [--flags]`, `python -m finetune`, `accelerate launch -m finetune`
(and the scripts finetune/mnli.py, finetune/glue.py). Parses the flags, runs `finetune.run.run_config`,
and turns what the user can act on into one line on stderr and an exit code."""

from __future__ import annotations

import signal
import sys
import threading

from finetune.config.parser import parse_config
from finetune.errors import ConfigError, TrainingFailed, TrainingInterrupted
from finetune.run import run_config


def cli(argv: list[str] | None = None, build=None) -> int:
    """Collective: the command line; a mistake or failure the user can act on is one line on stderr
    (with `--debug`, its traceback). Returns the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again, handled below
    config = None
    try:
        config = parse_config(argv)
        run_config(config, build)
    except (ConfigError, TrainingFailed) as error:
        if config.debug if config is not None else getattr(error, "debug", False):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except TrainingInterrupted as stopped:
        return stopped.exit_code  # the main process already said where the checkpoint is
    except KeyboardInterrupt:  # Ctrl-C outside training's own handler (loading, evaluating, exporting)
        if config is not None and config.debug:
            raise
        print(
            "error: interrupted by Ctrl-C; the run did not finish (no results.json); its checkpoints, if "
            "any, continue with --resume_from_checkpoint auto",
            file=sys.stderr,
        )
        return 130
    return 0


def main(argv: list[str] | None = None, build=None) -> dict:
    """Collective: `cli` for Python callers; returns the results and raises what `cli` reports."""
    return run_config(parse_config(argv), build)
