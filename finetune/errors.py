"""The errors a run reports as one line: a setting to fix (`ConfigError`), a run that cannot go on
(`TrainingFailed`), a run stopped by a signal with its checkpoint written (`TrainingInterrupted`);
argparse's mistakes as a ConfigError (`OneLineParser`); and the OS's words for a failed write or read."""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path


class ConfigError(ValueError):
    """A setting the user can fix: one line naming the flag (or file) and the fix.

    `flag` and `fix` are fields, so code and tests read them instead of the wording. Given explicitly, or
    read from the message's shapes: "<what is wrong>; <what to do>" (the fix: after the last "; "),
    "--flag must be <rule>, got <value>" (the rule; also "takes", "needs"), "--flag: <what to do>"; the
    flag: the first --flag named."""

    debug = False
    """Whether the run asked for --debug (set where the config could not be built)."""

    def __init__(self, message: str, *, flag: str | None = None, fix: str | None = None):
        super().__init__(message)
        named = re.search(r"--[a-z][a-z0-9_]*", message)
        self.flag = flag or (named.group(0) if named else None)
        rule = re.search(r" (must be|must|takes|needs) (.+?)(?:, got |$)", message)
        if fix is None and "; " in message:
            fix = message.rsplit("; ", 1)[1]
        elif fix is None and rule:
            fix = f"{self.flag or 'it'} {rule.group(1)} {rule.group(2)}"
        elif fix is None and ": " in message:
            fix = message.split(": ", 1)[1]
        self.fix = fix


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag or value is a ConfigError naming the flag, not the usage block and exit 2
    argparse prints: "--port: invalid int value: 'x'; see --help"."""

    def error(self, message: str):
        named = re.match(r"argument (--\w+)(/--[\w-]+)*: ", message)
        if named:
            message = f"{named.group(1)}: {message[named.end() :]}"
        raise ConfigError(f"{message.rstrip('.')}; see --help", flag=named.group(1) if named else None)


class TrainingFailed(Exception):
    """The run cannot go on (out of memory, NaN loss, a failed write); the message says what to do."""


class TrainingInterrupted(Exception):
    """Raised on every rank after a stop signal, once the checkpoint is safely written."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        self.exit_code = 128 + signal.Signals[signal_name].value
        super().__init__(
            f"stopped by {signal_name} after step {step}; checkpoint saved to {checkpoint}; "
            "continue with the same command plus --resume_from_checkpoint auto"
        )


class Stopped(BaseException):
    """A stop signal outside training's own handling of it (loading, evaluating, exporting): the run
    stops where it is, unfinished (no results.json). Not an Exception, so no handler swallows it."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.exit_code = 128 + signal.Signals[signal_name].value


class StoppedAfterFinish(Stopped):
    """A stop signal that arrived while a finished run was closing: the run is complete (results.json
    written); a study of several runs stops before its next one."""


def _reason(error: Exception) -> str:
    """The OS's words: strerror, or what safetensors' Rust error quotes ("I/O error: File too large (os
    error 27)")."""
    if getattr(error, "strerror", None):
        return error.strerror
    text = str(error).strip()
    quoted = re.search(r'message: "([^"]+)"|I/O error: ([^(]+?) \(os error', text)
    return next(g for g in quoted.groups() if g) if quoted else shorten(text.splitlines()[0], 120)


def shorten(text: str, limit: int) -> str:
    """`text` up to `limit` characters, cut between words (with "...") rather than inside one."""
    if len(text) <= limit:
        return text
    cut = text[: limit + 1].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
    return cut.rstrip(" ,;:(") + " ..."
