"""A real Slurm cluster on this machine: munged, slurmctld and two slurmd nodes (n1, n2), as root.

Debian's slurm-wlm 22.05: one slurmd per node name (`slurmd -N n1`), each on a port of its own, both at
127.0.0.1; no cgroups (proctrack/linuxproc, task/none), so it also runs in containers. Everything the
daemons write (state, spool, logs, munge socket and key) lives in one temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.helpers import free_port

ENABLE = "Slurm tests need slurm-wlm and munge, and root: apt-get install -y slurm-wlm munge (as root)"
NODES = ("n1", "n2")


def missing() -> str | None:
    """Why no cluster can be started here, or None."""
    if os.geteuid() != 0:
        return "not root"
    gone = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo") if not shutil.which(tool)]
    return f"not installed: {' '.join(gone)}" if gone else None


def _slurm_conf(folder: Path, munge_socket: Path) -> str:
    ports = {name: free_port() for name in NODES}
    nodes = "\n".join(
        f"NodeName={n} NodeAddr=127.0.0.1 Port={p} CPUs=1 State=UNKNOWN" for n, p in ports.items()
    )
    return f"""\
ClusterName=finetune-test
SlurmctldHost={socket.gethostname()}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits that long (120 s by default) before it may start again.
AuthInfo=socket={munge_socket},cred_expire=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SchedulerType=sched/backfill
# A requeued job becomes eligible at a time, which no event announces: look every 2 s, not every 60.
SchedulerParameters=sched_interval=2,bf_interval=2
# Seconds between SIGTERM and SIGKILL when a job ends: the workers' checkpoint on a stop fits in it.
KillWait=30
{nodes}
PartitionName=debug Nodes={",".join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    def __init__(self, folder: Path):
        self.folder = folder
        self.processes: list[subprocess.Popen] = []
        munge_socket = folder / "munge" / "munge.socket"
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
        for sub in ("state", "munge", *(f"spool/{n}" for n in NODES)):
            (folder / sub).mkdir(parents=True)
        (folder / "slurm.conf").write_text(_slurm_conf(folder, munge_socket))
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        os.chmod(folder / "munge", 0o700)
        try:
            self._start(["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={munge_socket}",
                         f"--pid-file={folder}/munge/munged.pid", f"--seed-file={folder}/munge/seed",
                         f"--log-file={folder}/munge/munged.log"], "munged")  # fmt: skip
            self._wait(lambda: munge_socket.exists(), "munged's socket")
            self._start(["slurmctld", "-D", "-i"], "slurmctld")
            for node in NODES:
                self._start(["slurmd", "-D", "-N", node], f"slurmd-{node}")
            self._wait(self._idle, "both nodes idle in sinfo", timeout=60)
        except BaseException:
            self.stop()  # no daemon outlives a failed start
            raise

    def _start(self, command: list[str], name: str) -> None:
        log = open(self.folder / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
        self.processes.append(
            subprocess.Popen(
                command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _idle(self) -> bool:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{process.args[0]} exited {process.returncode}:\n{self.logs()}")
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False).stdout.split()
        return out == ["n1", "idle", "n2", "idle"]

    def _wait(self, ready, what: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm test cluster: no {what} after {timeout} s\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(self.folder.glob("*.log")))

    def run(self, *command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr}")
        return done

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id).stdout
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.run("scancel", "--full", "--partition", "debug", check=False, timeout=10)
        for process in reversed(self.processes):  # slurmd first, munged last
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
