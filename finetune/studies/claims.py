"""Which worker runs a trial: `<trial folder>/.sweep-claim.json` (pid, host, start), held by the worker's
rank 0 from the moment it asks or adopts the trial until it has told the study the outcome.

Optuna marks a trial RUNNING when it is asked and leaves it so when its worker is killed. A RUNNING
trial whose claim is missing or dead is adopted by the next worker that looks: it runs the trial again
with the same params in the same folder with `--resume_from_checkpoint auto` (the run's own exact
resume) and tells the study, so the trial counts once. Dead means: on this host, the process is gone
(finetune/output/lock.py's check, which also sees through a zombie and a reused pid); on another host,
where no pid can be checked, the claim's heartbeat (its mtime, touched every HEARTBEAT_S) is older than
STALE_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

from finetune.output.lock import LOCK_FILE, _alive, _read  # the same record: pid, host, start

CLAIM_FILE = ".sweep-claim.json"
HEARTBEAT_S = 30.0
STALE_S = 300.0
"""A claim from another host untouched this long is a dead worker's (ten missed heartbeats)."""


@contextlib.contextmanager
def one_worker_at_a_time(root: Path):
    """Workers look for trials (count, adopt, ask, claim) one at a time: on one host by flock; across
    hosts as far as the shared filesystem honours flock. Without it two workers could both ask the
    study's last trial."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".sweep-ask.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        with contextlib.suppress(OSError):  # a filesystem without flock: the claims alone decide
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def claim(folder: Path) -> bool:
    """Takes the trial folder's claim for this process if nobody live holds it; whether it did. A dead
    worker's claim is moved aside by one rename (only one taker's rename succeeds) before the new one is
    created exclusively (only one creator succeeds)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / CLAIM_FILE
    holder = _read(path)
    if holder is not None:
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            return True  # this process's own, left by a trial it stopped (in-process callers)
        if is_live(path, holder):
            return False
        aside = folder / f".sweep-claim.{uuid.uuid4().hex}.dead"
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return False  # another worker took it over first
        moved = _read(aside)
        if moved != holder:  # a fresh claim arrived between reading and moving: give it back
            with contextlib.suppress(OSError):
                os.rename(aside, path)
            return False
        aside.unlink(missing_ok=True)
        _drop_dead_run_lock(folder, holder)
    me = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.now().astimezone().isoformat(),
    }
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    return True


def release(folder: Path) -> None:
    """After the study was told: the claim goes (a RUNNING trial is what adoption looks for, so a claim
    left by a worker killed after telling is harmless)."""
    path = folder / CLAIM_FILE
    holder = _read(path) or {}
    if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)


def is_live(path: Path, holder: dict) -> bool:
    if holder.get("host") == socket.gethostname():
        return _alive(holder)
    try:
        return time.time() - path.stat().st_mtime < STALE_S
    except OSError:
        return False


class Heartbeat:
    """Touches the claim every HEARTBEAT_S while the trial trains, so workers on other hosts can tell a
    live claim from a dead one. A daemon thread: it dies with the worker."""

    def __init__(self, folder: Path):
        self.path, self.stop = folder / CLAIM_FILE, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def _beat(self):
        while not self.stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)


def _drop_dead_run_lock(folder: Path, dead: dict) -> None:
    """The dead worker's rank 0 also held the trial's run lock; on another host the run could not tell
    it is dead (lock.py assumes alive), so it goes with the claim."""
    lock = folder / LOCK_FILE
    held = _read(lock) or {}
    if (held.get("pid"), held.get("host")) == (dead.get("pid"), dead.get("host")):
        lock.unlink(missing_ok=True)
