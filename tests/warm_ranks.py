"""Runs of a script in processes forked from a warm one: `python script ...`, or the 2 ranks of
`accelerate launch --config_file CONFIG script ...`.

Each is a real process (2 ranks: a real gloo process group), with the environment it would get: the
caller's, and for ranks what `accelerate launch` gives its workers (accelerate's own parser and
`prepare_multi_gpu_env`) plus the variables torchrun sets per rank. What is left out is the imports and
the launcher: a process forks from a server that imported finetune once per session, instead of a fresh
interpreter spending ~4.5 s of CPU importing torch and transformers, behind a launcher of ~2 s
(docs/log.md). For tests whose subject is the run (its training, checkpoints, resume, output) on one
or two processes. What an interpreter's start or a launcher itself does (a fresh process's first lines,
signals to the launcher, restarts, config files, several machines) goes through the real commands.

The server is multiprocessing's forkserver: a process of its own that imported finetune before any
thread started, so no run inherits the pytest process's threads (tqdm's monitor, W&B, inductor's pool).
What a library reads from the environment when it is imported (OMP_NUM_THREADS for libgomp, the
Hugging Face cache paths) is the server's, the pytest process's at its start: `env` cannot change it.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import resource
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import REPO, free_port, kill_tree

GRACE_S = 10  # between the SIGTERM and the SIGKILL to the others once one failed
CPU_2 = ["--config_file", "accelerate_configs/cpu_multiprocess.yaml"]  # 2 processes, gloo, fp32
_server = None


def run_warm(
    argv: list[str],
    script="finetune/mnli.py",
    env: dict | None = None,
    timeout: float = 300,
    file_size_limit_kib: int | None = None,
) -> subprocess.CompletedProcess:
    """`python script *argv` with `env` added to this process's environment, as run_cli returns it
    (the return code -N when the process was killed by signal N). `file_size_limit_kib`: as `ulimit -f`
    (RLIMIT_FSIZE), a write beyond it fails with EFBIG as on a full disk."""
    done = _run(script, argv, [{**os.environ, **(env or {})}], timeout, file_size_limit_kib)
    done.returncode = done.rank_returncodes[0]
    return done


def run_warm_apart(
    commands: list[tuple[str, list[str], dict]], timeout: float = 300
) -> list[subprocess.CompletedProcess]:
    """Several `python script *argv` started together, each (script, argv, env) with `env` added to this
    process's environment and with output of its own, as separate commands in separate shells: none
    stops another. Each one's result as run_warm returns it."""
    runs = [
        (_context().Process(target=_process, args=({**os.environ, **env}, script, argv, logs, None)), logs)
        for script, argv, env in commands
        for logs in [_logs()]
    ]
    outputs, late = [], None
    try:
        for process, _ in runs:
            process.start()
        deadline = time.monotonic() + timeout
        for process, _ in runs:
            process.join(max(0.0, deadline - time.monotonic()))
        late = next((i for i, (process, _) in enumerate(runs) if process.exitcode is None), None)
    finally:  # a timeout, a failure or Ctrl-C here: no process outlives the call, no log is left
        for process, logs in runs:
            if process.pid is not None and process.exitcode is None:
                kill_tree(process.pid)
            if process.pid is not None:
                process.join()
            outputs.append(_read_and_remove(logs))
    if late is not None:
        raise AssertionError(f"timed out after {timeout} s: {commands[late]}\n{outputs[late][1][-3000:]}")
    return [
        subprocess.CompletedProcess([script, *argv], process.exitcode, *output)
        for (script, argv, _), (process, _), output in zip(commands, runs, outputs, strict=True)
    ]


def run_ranks(
    argv: list[str],
    launch_args: list[str] = CPU_2,
    script="finetune/mnli.py",
    env: dict | None = None,
    timeout: float = 300,
    file_size_limit_kib: int | None = None,
) -> subprocess.CompletedProcess:
    """`accelerate launch *launch_args script *argv`'s processes, as run_cli returns the command: exit code
    0, or 1 once a process failed (what `accelerate launch` exits with: the others are stopped then, as
    torchrun stops them; each process's own code is in `rank_returncodes`),
    and stdout and stderr, each holding every process's lines as the launcher's streams do (not the
    launcher's own report of a failure)."""
    launched, nproc = launch_env(launch_args, script)
    if nproc == 1:
        return _run(script, argv, [{**launched, **(env or {})}], timeout, file_size_limit_kib)
    per_rank = {"GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
                "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
                "TORCHELASTIC_USE_AGENT_STORE": "False"}  # fmt: skip
    environments = [
        {**launched, **per_rank, **(env or {}), "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)}
        for r in range(nproc)
    ]
    return _run(script, argv, environments, timeout, file_size_limit_kib)


def launch_env(launch_args: list[str], script: str) -> tuple[dict[str, str], int]:
    """What `accelerate launch *launch_args --main_process_port P script` puts in its workers'
    environment (before torchrun's per-rank variables, with several), computed by accelerate itself,
    and its number of processes."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    args = launch_command_parser().parse_args([*launch_args, "--main_process_port", str(free_port()), script])
    args, *_ = _validate_launch_command(args)
    if args.num_processes == 1:  # accelerate's simple launcher: `python script` with its environment
        return prepare_simple_launcher_cmd_env(args)[1], 1
    env = prepare_multi_gpu_env(args)
    return {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(args.main_process_port)}, args.num_processes


def _context():
    global _server
    if _server is None:
        _server = multiprocessing.get_context("forkserver")
        _server.set_forkserver_preload(["tests.frozen_imports"])  # the scripts' imports
    return _server


def _run(
    script: str, argv: list[str], environments: list[dict], timeout: float, file_size_limit_kib: int | None
) -> subprocess.CompletedProcess:
    """The processes, one per environment; returncode as a launcher's (0, or 1 once one failed)."""
    logs = _logs()
    processes = [
        _context().Process(target=_process, args=(env, script, argv, logs, file_size_limit_kib))
        for env in environments
    ]
    try:
        for process in processes:
            process.start()
        codes = _wait(processes, time.monotonic() + timeout)
    finally:  # a timeout, a failure or Ctrl-C here: no process outlives the call
        for process in processes:
            if process.pid is not None and process.exitcode is None:
                kill_tree(process.pid)
            if process.pid is not None:
                process.join()
        stdout, stderr = _read_and_remove(logs)
    if codes is None:
        raise AssertionError(f"timed out after {timeout} s: {script} {' '.join(argv)}\n{stderr[-3000:]}")
    done = subprocess.CompletedProcess([script, *argv], int(any(codes)), stdout, stderr)
    done.rank_returncodes = codes
    return done


def _logs() -> list[str]:
    """Two new files, for a process's stdout and stderr."""
    logs = []
    for stream in ("stdout", "stderr"):
        handle, name = tempfile.mkstemp(prefix=f"warm-{stream}-", suffix=".log")
        os.close(handle)
        logs.append(name)
    return logs


def _read_and_remove(logs: list[str]) -> tuple[str, str]:
    texts = tuple(Path(log).read_text() for log in logs)
    for log in logs:
        os.unlink(log)
    return texts


def _process(env: dict, script: str, argv: list[str], logs: list[str], file_size_limit_kib: int | None):
    """In the forked process: its environment, stdout and stderr into `logs`, the script run as
    `python script` runs it (its imports are the server's, already done)."""
    if file_size_limit_kib is not None:  # Python ignores SIGXFSZ: the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit_kib * 1024,) * 2)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(REPO)
    for fd, log in ((1, logs[0]), (2, logs[1])):
        os.dup2(os.open(log, os.O_WRONLY | os.O_APPEND), fd)
    # Line by line, as a process started with PYTHONUNBUFFERED would: a killed one loses no line.
    sys.stdout, sys.stderr = (open(fd, "w", buffering=1, closefd=False) for fd in (1, 2))  # noqa: SIM115
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def _wait(processes, deadline: float) -> list[int | None] | None:
    """Each process's exit code (-N: killed by signal N), once all ended; after the first failure the
    others get SIGTERM, then SIGKILL after GRACE_S. None at the deadline."""
    pending = {process.sentinel: process for process in processes}
    codes: dict = {}
    while pending:
        ready = multiprocessing.connection.wait(list(pending), max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        for sentinel in ready:
            process = pending.pop(sentinel)
            process.join()
            codes[process] = process.exitcode
            if process.exitcode != 0:  # as torchrun's agent: SIGTERM to the others, SIGKILL after a grace
                multiprocessing.connection.wait(list(pending), 2)  # ranks failing together end on their own
                for other in pending.values():
                    if other.exitcode is None:
                        os.kill(other.pid, signal.SIGTERM)
                for other in pending.values():
                    other.join(GRACE_S)
                    if other.exitcode is None:
                        kill_tree(other.pid)
                        other.join()
                    codes[other] = other.exitcode
                pending.clear()
                break
    return [codes[process] for process in processes]
