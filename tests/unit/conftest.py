"""The unit tier (`make test-quick`): in process, seconds each. No run of the program (`main`, `cli`,
or the `trained` fixture's finished run), no subprocess, no second rank: those tests live in
tests/e2e. The fixture below fails a test here that breaks the promise, naming where it belongs."""

from __future__ import annotations

import subprocess

import pytest

import finetune.cli

WRONG_TIER = "tests/unit runs no program end to end and starts no process: move this test to tests/e2e"


@pytest.fixture(autouse=True)
def in_process_only(request, monkeypatch):
    assert "trained" not in request.fixturenames, WRONG_TIER
    assert not {m.name for m in request.node.iter_markers()} & {"slow", "multiprocess", "subprocess"}, (
        WRONG_TIER
    )

    def refuse(*args, **kwargs):
        raise AssertionError(WRONG_TIER)

    def only_fontconfig(process, args, *more, **options):
        # matplotlib's first chart on a machine lists its fonts with fontconfig, once (its font cache,
        # ~/.cache/matplotlib): a library's own probe, not a program of this project.
        if not (isinstance(args, list | tuple) and args[:1] in (["fc-list"], ("fc-list",))):
            refuse()
        starts(process, args, *more, **options)

    starts = subprocess.Popen.__init__
    monkeypatch.setattr(finetune.cli, "_runner", refuse)  # what main() and cli() run
    monkeypatch.setattr(subprocess.Popen, "__init__", only_fontconfig)  # subprocess.run, launchers
