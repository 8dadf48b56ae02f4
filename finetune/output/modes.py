"""Weight files with the permissions the umask gives every other file of the run.

safetensors (0.8) writes each file through a private temporary one and renames it, so model.safetensors,
adapter/ and a checkpoint's weights came out `-rw-------` whatever the umask: unreadable by the group
that reads config.json beside them."""

from __future__ import annotations

import os
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it (os.umask sets one to read
    it: a file another thread creates meanwhile would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    current = os.umask(0o022)
    os.umask(current)
    return current


def follow_umask(folder: str | Path, nested: bool = False) -> None:
    """Each .safetensors file in `folder` (`nested`: in its subfolders too) given the mode a file the
    run creates with open() gets: 0o666 less the umask."""
    mode = 0o666 & ~umask()
    for file in (Path(folder).rglob if nested else Path(folder).glob)("*.safetensors"):
        if file.is_file() and (file.stat().st_mode & 0o777) != mode:
            os.chmod(file, mode)
