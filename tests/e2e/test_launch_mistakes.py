"""The classic mistakes of a multi-machine launch, each one line naming the setting, within a bound.

Two "machines" are two commands on 127.0.0.1 with --machine_rank 0 and 1, with the knobs users get:
`python -m finetune.distributed.preflight --timeout N` and `accelerate launch --rdzv_conf timeout=N`.
(The gloo-interface mistake needs addresses of their own: tests/e2e/test_two_hosts.py.)
"""

import os
import socket
import subprocess
import threading
import time

import pytest

from finetune.distributed.meeting import main_machine, other_machine
from finetune.distributed.preflight import check
from finetune.errors import ConfigError
from tests.helpers import PYTHON, REPO, free_port

pytestmark = pytest.mark.subprocess
CONFIG = "accelerate_configs/multi_node_cpu.yaml"
TIMEOUT = 2  # seconds, the --timeout given; the bound below adds the start of a Python process
ACCELERATE = os.path.join(os.path.dirname(PYTHON), "accelerate")


def preflight(rank: int, ip: str, port: int, machines: int = 2) -> subprocess.Popen:
    command = [PYTHON, "-m", "finetune.distributed.preflight", "--config_file", CONFIG, "--machine_rank",
               str(rank), "--main_process_ip", ip, "--main_process_port", str(port), "--num_machines",
               str(machines), "--timeout", str(TIMEOUT)]  # fmt: skip
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ends(process: subprocess.Popen, within: float) -> tuple[int, str, float]:
    """(exit code, last line of stderr, seconds since the call) of a process that must end in time."""
    start = time.monotonic()
    _, err = process.communicate(timeout=within + 30)  # a hang fails here, not in the CI's limit
    took = time.monotonic() - start
    assert took < within, f"took {took:.1f} s: {err[-2000:]}"
    return process.returncode, (err.strip().splitlines() or [""])[-1], took


def flag_of(rank: int, ip: str, port: int, *extra: str) -> str:
    """The ConfigError's flag, in this process (the same check the command runs)."""
    with pytest.raises(ConfigError) as error:
        check(["--config_file", CONFIG, "--machine_rank", str(rank), "--main_process_ip", ip,
               "--main_process_port", str(port), *extra])  # fmt: skip
    return error.value.flag


@pytest.fixture
def taken_port():
    """A port another program listens on (and never answers), on this machine."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def test_machines_that_meet_pass_and_free_the_port():
    port = free_port()
    main = preflight(0, "127.0.0.1", port)
    other = preflight(1, "127.0.0.1", port)
    assert ends(other, TIMEOUT + 10)[0] == 0 and ends(main, TIMEOUT + 10)[0] == 0
    with socket.socket() as launcher:  # the launcher binds it next
        launcher.bind(("127.0.0.1", port))


def test_wrong_main_process_ip():
    # On the main machine: not one of its addresses, at once.
    code, line, _ = ends(preflight(0, "192.0.2.123", free_port()), 10)
    assert code == 2 and line.startswith("error: main_process_ip 192.0.2.123 ")
    assert flag_of(0, "192.0.2.123", free_port()) == "main_process_ip"
    # On another machine: an address where no main machine listens, after --timeout.
    code, line, took = ends(preflight(1, "127.0.0.2", free_port()), TIMEOUT + 10)
    assert code == 2 and "main_process_ip" in line and took >= TIMEOUT


def test_main_process_port_taken(taken_port):
    code, line, _ = ends(preflight(0, "127.0.0.1", taken_port), 10)
    assert code == 2 and line.startswith(f"error: main_process_port {taken_port} ")
    assert flag_of(0, "127.0.0.1", taken_port) == "main_process_port"
    # The other machines reach the other program: it never says the preflight's hello.
    code, line, _ = ends(preflight(1, "127.0.0.1", taken_port), 5 + 10)
    assert code == 2 and "main_process_port" in line


def test_main_process_port_taken_on_another_address_of_the_machine():
    """A program listening at 127.0.0.2:PORT leaves 127.0.0.1:PORT free to bind, yet torch's TCPStore
    binds every address of the machine and fails with EADDRINUSE: the preflight binds as it does."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    with socket.socket() as holder:
        holder.bind(("127.0.0.2", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match="EADDRINUSE"):  # what the launcher meets, for real
            TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
        code, line, _ = ends(preflight(0, "127.0.0.1", port), 10)
        assert code == 2 and line.startswith(f"error: main_process_port {port} is in use"), line
        assert flag_of(0, "127.0.0.1", port) == "main_process_port"


def test_machine_that_never_arrives():
    port = free_port()
    code, line, took = ends(preflight(0, "127.0.0.1", port), TIMEOUT + 10)
    assert code == 2 and "num_machines=2" in line and "machine_rank 1" in line and took >= TIMEOUT
    assert flag_of(0, "127.0.0.1", free_port(), "--timeout", "0.5") == "num_machines"
    # Of 3, machine_rank 2 missing: the one that arrived hears that the main one stopped waiting.
    main, other = preflight(0, "127.0.0.1", port, 3), preflight(1, "127.0.0.1", port, 3)
    code, line, _ = ends(main, TIMEOUT + 10)
    assert code == 2 and "only 2 of num_machines=3" in line and "machine_rank 2" in line
    code, line, _ = ends(other, 10)
    assert code == 2 and "num_machines=3" in line


@pytest.mark.parametrize("at_fault", [0, 1])
def test_a_gloo_problem_on_one_machine_stops_every_machine(at_fault):
    """Each machine's preflight finds its own gloo problem; the machines tell each other as they meet, so
    the machine without one stops too, at once, rather than its launcher waiting for the other until the
    rendezvous timeout. (Where the problem comes from: tests/e2e/test_two_hosts.py.)"""
    port, outcome = free_port(), {}
    problem = ConfigError(
        "gloo would tell the other machines this one is at 127.0.0.1 (what its host name h resolves to); "
        "set GLOO_SOCKET_IFNAME=eth9",
        flag="GLOO_SOCKET_IFNAME",
    )

    def machine(rank: int) -> None:
        gloo = problem if rank == at_fault else None
        try:
            if rank == 0:
                main_machine("127.0.0.1", port, 2, TIMEOUT + 10, gloo)
            else:
                other_machine("127.0.0.1", port, 1, 2, TIMEOUT + 10, gloo)
        except ConfigError as error:
            outcome[rank] = error

    threads = [threading.Thread(target=machine, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT + 20)
    assert outcome[at_fault] is problem
    stopped = outcome[1 - at_fault]
    assert stopped.flag == "GLOO_SOCKET_IFNAME" and f"machine_rank {at_fault} cannot join" in str(stopped)
    assert str(problem) in str(stopped) and "\n" not in str(stopped)
    with socket.socket() as launcher:  # and the port is free for a launcher
        launcher.bind(("127.0.0.1", port))


def test_machines_with_different_finetune_versions_both_say_so():
    """Another version's preflight speaks another protocol: each machine stops at once and names the
    version, rather than waiting for the other until --timeout and blaming num_machines or the port."""
    port, outcome = free_port(), {}
    newer = (f"import finetune.distributed.meeting as p; p.HELLO = 'finetune-preflight/99'; "
             f"p.other_machine('127.0.0.1', {port}, 1, 2, {TIMEOUT + 10})")  # fmt: skip
    other = subprocess.Popen([PYTHON, "-c", newer], cwd=REPO, stderr=subprocess.PIPE, text=True)

    def main(port: int) -> None:
        try:
            main_machine("127.0.0.1", port, 2, TIMEOUT + 10)
        except ConfigError as error:
            outcome[port] = error

    thread = threading.Thread(target=main, args=(port,))
    thread.start()
    thread.join(TIMEOUT + 20)
    newest = str(outcome[port])
    assert outcome[port].flag == "finetune version" and "(preflight finetune-preflight/99" in newest, newest
    code, line, _ = ends(other, 10)
    assert code != 0 and "ConfigError: machine_rank 1 runs another version of finetune" in line, line
    # A finetune from before the versions (its hello has none) hears the same line.
    port = free_port()
    thread = threading.Thread(target=main, args=(port,))
    thread.start()
    assert answer("127.0.0.1", port, b"finetune-preflight 1 2\n", 10).startswith(
        "error machine_rank 1 runs another version of finetune"
    )
    thread.join(20)
    assert outcome[port].flag == "finetune version"


def answer(ip: str, port: int, hello: bytes, seconds: float) -> str:
    """The first line a main machine's preflight answers to `hello`, tried until it listens (its check
    that the port is free listens there a moment too, and resets what connects then)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with socket.create_connection((ip, port), timeout=seconds) as peer, peer.makefile() as reply:
                peer.sendall(hello)
                line = reply.readline()
            if line:
                return line
        except (ConnectionRefusedError, ConnectionResetError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no answer at {ip}:{port}")
        time.sleep(0.05)


def test_launcher_rendezvous_is_bounded_by_rdzv_conf_timeout():
    """Without the preflight, the launcher's own bound: `--rdzv_conf timeout=N` (900 s by default)."""
    command = [ACCELERATE, "launch", "--config_file", CONFIG, "--num_processes", "2", "--machine_rank", "0",
               "--main_process_ip", "127.0.0.1", "--main_process_port", str(free_port()),
               "--rdzv_conf", f"timeout={TIMEOUT}", "-m", "finetune", "--help"]  # fmt: skip
    launcher = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code, line, _ = ends(launcher, TIMEOUT + 30)
    assert code != 0 and "1/2 clients joined" in line
