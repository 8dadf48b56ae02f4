"""The sweep's default storage: Optuna's journal file (`JournalStorage` over `JournalFileBackend`, under
Optuna's own lock object), kept readable when a worker dies while writing to it.

How Optuna's journal breaks. Every record is one JSON line, appended under the lock (a symlink beside
the file) and fsync'ed. A worker that dies while appending (SIGKILL, a lost node, a full disk) leaves a
last line without its newline. Optuna's reader skips such a last line (it could be a write in flight),
but its writer appends the next record onto it: the merged line is not JSON, and from the record after
it on, every read raises JSONDecodeError, for every worker, for good.

What this backend adds, under the same lock Optuna's writers take (so no write is in flight): before
anything is appended, a last line without its newline is cut off (its record never finished, so no
worker counted on it) and one line says so; a failed append is cut back the same way; a damaged line
anywhere else, which only an older finetune or another program could leave, stops the sweep with one
ConfigError naming the file and the line, and nothing in the file is changed.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

from finetune.errors import ConfigError, TrainingFailed


def journal_storage(path: Path) -> JournalStorage:
    """Optuna's storage over the journal file at `path` (created if missing), its torn last line (if
    any) cut off first; a damaged line is a ConfigError."""
    return JournalStorage(Journal(path))


class Journal(JournalFileBackend):
    def __init__(self, path: Path):
        # Optuna's default lock, made here so this class can take it too (the backend keeps it private).
        self.lock = JournalFileSymlinkLock(str(path))
        try:
            super().__init__(str(path), lock_obj=self.lock)
        except OSError as error:
            raise ConfigError(
                f"{path}: cannot create the study's journal there ({error.strerror}); choose a writable "
                "--output_dir"
            ) from None
        self.path = Path(path)
        with self._locked():
            self._drop_torn_line()
            self._refuse_damaged_last_line()

    def read_logs(self, log_number_from: int):
        """Optuna's reader; its error at a damaged line (raised at the line after it) is one line."""
        logs = super().read_logs(log_number_from)
        while True:
            try:
                log = next(logs)
            except StopIteration:
                return
            except ValueError:  # JSONDecodeError, UnicodeDecodeError, "Invalid log format."
                raise self._damaged(first_damaged_line(self.path)) from None
            yield log

    def append_logs(self, logs: list[dict]) -> None:
        """As Optuna's append_logs, with the torn-line check under the same hold of the lock."""
        text = "\n".join(json.dumps(log, separators=(",", ":")) for log in logs) + "\n"
        with self._locked():
            size = self._drop_torn_line()
            try:
                with open(self.path, "ab") as f:
                    f.write(text.encode("utf-8"))
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as error:
                with contextlib.suppress(OSError):  # never leave a torn line of our own
                    os.truncate(self.path, size)
                raise TrainingFailed(
                    f"writing the study's journal {self.path} failed ({error.strerror}); is the disk full? "
                    "the records before this one are intact: free space and start the same command again"
                ) from None

    @contextlib.contextmanager
    def _locked(self):
        self.lock.acquire()
        try:
            yield
        finally:
            self.lock.release()

    def _drop_torn_line(self) -> int:
        """Under the lock: cuts a last line that lacks its newline; the file's size after."""
        size = self.path.stat().st_size
        if size == 0:
            return 0
        with open(self.path, "rb") as f:
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return size
            end = _start_of_last_line(f, size)
        os.truncate(self.path, end)
        print(
            f"{self.path}: its last line was cut off ({size - end} bytes: a worker stopped while writing "
            "it); dropped it, the records before it are intact",
            flush=True,
        )
        return end

    def _refuse_damaged_last_line(self) -> None:
        """Optuna's reader passes over a last line that is not JSON; appending after it would make every
        read fail, so it is refused before anything is written."""
        size = self.path.stat().st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            start = _start_of_last_line(f, size - 1)
            f.seek(start)
            last = f.read()
        try:
            json.loads(last)
        except ValueError:
            raise self._damaged(self.path.read_bytes().count(b"\n")) from None

    def _damaged(self, line: int | None) -> ConfigError:
        where = f"line {line}" if line else "a line"
        return ConfigError(
            f"{self.path}: {where} is damaged (not one whole record), so the study cannot be read; "
            "nothing was changed: repair or delete that line (a record cut off, perhaps with a whole one "
            "after it on the same line: keep the whole one), or start the study again in another "
            "--output_dir",
            flag="--output_dir",
        )


def _start_of_last_line(f, end: int) -> int:
    """The offset just after the last newline before `end` (0 if none), reading backwards."""
    position = end
    while position > 0:
        step = min(1 << 16, position)
        f.seek(position - step)
        chunk = f.read(step)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            return position - step + newline + 1
        position -= step
    return 0


def first_damaged_line(path: Path) -> int | None:
    """The number (from 1) of the first line that is not one JSON record (a last line without its newline
    is left out: it may be a write in flight)."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    for number, line in enumerate(lines[:-1], start=1):  # after the last newline: a line in flight
        try:
            json.loads(line)
        except ValueError:
            return number
    return None
