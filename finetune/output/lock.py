"""One run per output folder: rank 0 holds `<output_dir>/.finetune.lock` from setup until close."""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
from datetime import datetime
from pathlib import Path

from finetune.distributed.launch_env import launcher_rank
from finetune.errors import ConfigError

LOCK_FILE = ".finetune.lock"


_held: set[Path] = set()


def take_lock(output_dir: Path) -> None:
    """Rank 0 only (RANK, before the Accelerator exists): refuses a folder a live run holds, takes over
    the lock of a run that is gone. Other ranks go on; rank 0's exit makes the launcher end them."""
    if launcher_rank() != 0:
        return
    path, host = Path(output_dir) / LOCK_FILE, socket.gethostname()
    folder = os.open(output_dir, os.O_RDONLY)
    try:
        with contextlib.suppress(OSError):  # lock takers on this host one at a time, so a takeover can't race
            fcntl.flock(folder, fcntl.LOCK_EX)
        holder = _read(path)
        if holder is not None:
            pid, where, since = holder.get("pid"), holder.get("host"), holder.get("started")
            if _alive(holder):
                gone = "" if where == host else f"; if that run has ended, delete {path}"
                raise ConfigError(
                    f"--output_dir {output_dir} is in use by another run (pid {pid} on {where}, since "
                    f"{since}); wait for it to finish or choose another folder{gone}"
                )
            if pid != os.getpid():  # our own: left by an earlier run in this process that failed
                print(f"{path}: taking over the lock of pid {pid} on {where}, which is no longer running")
            path.unlink()
        me = {"pid": os.getpid(), "host": host, "started": datetime.now().astimezone().isoformat()}
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)  # exclusive: one creator wins
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        _held.add(path)
    finally:
        os.close(folder)


def holds_lock(output_dir: Path | str) -> bool:
    """Whether this process holds the folder's lock (rank 0 of a run that took it)."""
    return Path(output_dir) / LOCK_FILE in _held


def release_lock(output_dir: Path | str) -> None:
    """At close() and on failure: removes the lock if this process holds it."""
    path = Path(output_dir) / LOCK_FILE
    if path in _held:
        _held.discard(path)
        if (_read(path) or {}).get("pid") == os.getpid():
            path.unlink(missing_ok=True)


# A run that failed after setup: the process exits (in process, a later run takes over its own lock).
atexit.register(lambda: [release_lock(path.parent) for path in list(_held)])


def _read(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # half-written by a process that died: nobody's
    return record if isinstance(record, dict) else {}


def _alive(holder: dict) -> bool:
    """Whether the holder runs: on another host we cannot tell, so yes. A zombie, or a process that
    started after the lock was written (its pid reused), is not the holder."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False
    if holder.get("host") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True  # no /proc: the pid is enough
    if stat[0] == "Z":
        return False
    try:
        btime = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        started = int(btime.split()[1]) + int(stat[19]) / os.sysconf("SC_CLK_TCK")
        written = datetime.fromisoformat(holder["started"]).timestamp()
    except (OSError, KeyError, ValueError, TypeError, StopIteration):
        return True
    return started <= written + 60  # a minute's slack for clock drift; a reused pid started after that
