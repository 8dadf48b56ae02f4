"""Before `accelerate launch` on several machines: a check, bounded in time, that they can meet, with one
line naming the setting to fix (the launcher's own rendezvous waits 900 s by default, then prints a
traceback that names none; a port held by another program makes it wait forever).

    python -m finetune.distributed.preflight --config_file accelerate_configs/multi_node.yaml \
        --machine_rank 1 [--main_process_ip IP] [--main_process_port PORT] [--num_machines N] [--timeout 120]

The flags are `accelerate launch`'s; those not given come from the config file. The main machine
(machine_rank 0) listens at main_process_ip:main_process_port, so the address must be its own and the
port free; each other machine connects there and says hello. When all num_machines machines have, each
hears "ok"; on a machine without a GPU, gloo's address for it must reach the others (GLOO_SOCKET_IFNAME);
then the check exits 0 and the port is free again for the launcher. Every wait ends after
--timeout seconds; a mistake is one line, `error: ...` (ConfigError's flag and fix), and exit code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import socket
import sys
import time

import yaml

from finetune.distributed.gloo_address import gloo_problem
from finetune.errors import ConfigError, OneLineParser

HELLO = "finetune-preflight/2"  # /2: a second line, the machine's gloo verdict (none before 2026-11-28)
ACK_WITHIN = 5.0  # seconds: the main machine's preflight answers a hello at once
MAX_TIMEOUT_S = 7 * 24 * 3600  # a week; far above it a socket's timeout overflows


def _port_in_use(port: int) -> ConfigError:
    return ConfigError(
        f"main_process_port {port} is in use on the main machine (machine_rank 0) by another "
        "program; set main_process_port to a free port (the same on every machine), or, on a machine "
        "that is not the main one, give it its own --machine_rank",
        flag="main_process_port",
        fix="a port free on the machine_rank 0 machine",
    )


def check_port_free(port: int) -> None:
    """The port bound as torch's TCPStore server binds it (libuv's: every address, IPv6 "::" dual-stack,
    else IPv4 "0.0.0.0"; SO_REUSEADDR), then let go. A program listening at that port on any address of
    this machine (127.0.0.2 while main_process_ip is 127.0.0.1) leaves main_process_ip's own bind free
    but fails the store with EADDRINUSE."""
    for family, anywhere in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:  # libuv clears it: IPv4 connections too
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                probe.bind((anywhere, port))
                probe.listen()
                return
        except OSError as error:  # as the store: any IPv6 failure (none here, in use), then IPv4
            if family == socket.AF_INET and error.errno == errno.EADDRINUSE:
                raise _port_in_use(port) from None
            if family == socket.AF_INET:
                raise


def main_machine(
    address: str, port: int, machines: int, timeout: float, gloo: ConfigError | None = None
) -> None:
    """machine_rank 0: listen where the others will connect, until every machine_rank said hello; then
    tell them "ok", or the first machine's gloo problem (`gloo`: this one's), which every machine raises."""
    check_port_free(port)
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((address, port))
    except OSError as error:
        if error.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(
                f"main_process_ip {address} is not an address of this machine, which is the main one "
                "(machine_rank 0); set main_process_ip to its address that the others reach (on another "
                "machine: give it its own --machine_rank)",
                flag="main_process_ip",
                fix="an address of the machine_rank 0 machine",
            ) from None
        if error.errno == errno.EADDRINUSE:
            raise _port_in_use(port) from None
        raise
    listener.listen(machines)
    deadline = time.monotonic() + timeout
    arrived: dict[int, tuple[socket.socket, str]] = {}  # machine_rank: its connection, its gloo problem
    try:
        while len(arrived) < machines - 1:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, machines)) - set(arrived))
                raise ConfigError(
                    f"only {len(arrived) + 1} of num_machines={machines} machines arrived within "
                    f"{timeout:g} s (no machine_rank {', '.join(map(str, missing))}); start the same "
                    "command on every machine, or set num_machines to the machines there are",
                    flag="num_machines",
                    fix="start every machine, or lower num_machines",
                )
            listener.settimeout(left)
            try:
                peer, _ = listener.accept()
            except TimeoutError:
                continue
            greeted = _greet(peer, machines, set(arrived))
            if greeted is not None:
                arrived[greeted[0]] = (peer, greeted[1])
        problems = {rank: problem for rank, (_, problem) in arrived.items() if problem}
        if gloo is not None:
            problems[0] = str(gloo)
        first = min(problems, default=None)
        verdict = "ok" if first is None else f"gloo {first} {problems[first]}"
        for peer, _ in arrived.values():
            peer.sendall(f"{verdict}\n".encode())
        for peer, _ in arrived.values():  # they close first: no TIME_WAIT left on the launcher's port here
            peer.settimeout(ACK_WITHIN)
            with contextlib.suppress(OSError):
                peer.recv(1)
    finally:
        for peer, _ in arrived.values():
            peer.close()
        listener.close()
    if gloo is not None:
        raise gloo
    if first is not None:
        raise _gloo_elsewhere(first, problems[first])


def _greet(peer: socket.socket, machines: int, seen: set[int]) -> tuple[int, str] | None:
    """A connection's machine_rank, acknowledged, and its gloo problem ("" for none); None (and the
    connection closed) for anything else."""
    peer.settimeout(ACK_WITHIN)
    try:
        with peer.makefile("r", errors="replace") as reader:
            words = reader.readline(256).split()
            if words and words[0].split("/")[0] == HELLO.split("/")[0] and words[0] != HELLO:
                _refuse_version(peer, words)
            gloo = reader.readline(4096).rstrip("\n")
        if len(words) != 3 or words[0] != HELLO or not gloo.startswith("gloo "):
            raise ValueError
        rank, theirs = int(words[1]), int(words[2])
    except ConfigError:
        raise
    except (OSError, ValueError):
        peer.close()  # not a preflight (a port scanner, a stray client)
        return None
    problem = (
        f"num_machines is {theirs} there and {machines} on the main machine" if theirs != machines
        else f"machine_rank {rank} is given to two machines" if rank in seen
        else f"machine_rank {rank} is out of range for num_machines={machines}" if not 0 < rank < machines
        else None
    )  # fmt: skip
    peer.sendall(f"{'error ' + problem if problem else 'hello'}\n".encode())
    if problem:
        peer.close()
        return None
    gloo = gloo.removeprefix("gloo ")
    return rank, "" if gloo == "ok" else gloo


def _refuse_version(peer: socket.socket, words: list[str]):
    """Another finetune's preflight, which would not understand this one's answers: both machines stop,
    each saying so (the other machine's finetune, if older, reads this as an error to print)."""
    where = f"machine_rank {words[1]}" if len(words) > 1 else "another machine"
    problem = ConfigError(
        f"{where} runs another version of finetune (preflight {words[0]}, here {HELLO}); install the same "
        "finetune on every machine",
        flag="finetune version",
        fix="install the same finetune on every machine",
    )
    with contextlib.suppress(OSError):
        peer.sendall(f"error {problem}\n".encode())
    peer.close()
    raise problem


def _gloo_elsewhere(rank: int, problem: str) -> ConfigError:
    """Another machine's gloo problem: the launch cannot go on here either (this machine's launcher would
    wait for that machine until its rendezvous timeout)."""
    return ConfigError(
        f"machine_rank {rank} cannot join the ranks' process group, so this machine stops too. There, "
        f"{problem}",
        flag="GLOO_SOCKET_IFNAME",
        fix=f"set GLOO_SOCKET_IFNAME on machine_rank {rank}, as its own error says",
    )


def other_machine(
    address: str, port: int, rank: int, machines: int, timeout: float, gloo: ConfigError | None = None
) -> None:
    """machine_rank > 0: reach the main machine's preflight, with this one's gloo problem (`gloo`), and
    wait for everyone's arrival; then raise the first machine's gloo problem, if any."""
    where = f"{address}:{port}"
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ConfigError(
                f"nothing answered at main_process_ip:main_process_port {where} within {timeout:g} s; set "
                "main_process_ip to the main machine's address as this machine reaches it, and start the "
                "same command there (machine_rank 0)",
                flag="main_process_ip",
                fix="the machine_rank 0 machine's address, reachable from here",
            )
        try:
            connection = socket.create_connection((address, port), timeout=min(left, 5.0))
            break
        except OSError:  # refused (not started yet), unreachable, timed out: try until the deadline
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
    # The reader closed with the connection: a refusal raised from here would keep it, and the socket,
    # open, and the main machine, closing first, would leave the launcher's port in TIME_WAIT.
    with connection, connection.makefile("r") as reader:
        connection.sendall(f"{HELLO} {rank} {machines}\ngloo {gloo or 'ok'}\n".encode())
        connection.settimeout(ACK_WITHIN)
        try:
            first = reader.readline().strip()
        except OSError:
            first = ""
        if first.startswith("error ") and "version of finetune" in first:
            raise ConfigError(first.removeprefix("error "), flag="finetune version",
                              fix="install the same finetune on every machine")  # fmt: skip
        if first.startswith("error "):
            raise ConfigError(first.removeprefix("error ") + "; give every machine the same settings",
                              flag="machine_rank" if "machine_rank" in first else "num_machines")  # fmt: skip
        if first != "hello":
            raise ConfigError(
                f"another program, not the main machine's preflight, answers at {where}: "
                "main_process_port is taken there (or main_process_ip is another machine, or it runs "
                "another version of finetune); set "
                "main_process_port to a free port on the main machine, the same on every machine",
                flag="main_process_port",
                fix="a port free on the machine_rank 0 machine",
            )
        connection.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            last = reader.readline().strip()
        except OSError:
            last = ""
        if last.startswith("gloo "):
            at, problem = last.removeprefix("gloo ").split(" ", 1)
            raise gloo if gloo is not None else _gloo_elsewhere(int(at), problem)
        if last != "ok":
            raise ConfigError(
                f"the main machine ({where}) stopped waiting for the num_machines={machines} machines within "
                f"{timeout:g} s (its error names the machine_rank missing); start the same command on every "
                "machine, or set num_machines to the machines there are",
                flag="num_machines",
                fix="start every machine, or lower num_machines",
            )


def parse(argv: list[str]) -> argparse.Namespace:
    """The flags, and the config file's values for those not given; each a one-line ConfigError when
    unreadable (a missing file, bad YAML, a port that is not a port)."""
    parser = OneLineParser(
        prog="python -m finetune.distributed.preflight", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config_file", help="the accelerate config the launch uses")
    for name in ("machine_rank", "main_process_ip", "main_process_port", "num_machines"):
        parser.add_argument(f"--{name}", help="as `accelerate launch` takes it (default: the config file's)")
    parser.add_argument("--timeout", default="120",
                        help="seconds every wait may take (default 120); give the launcher the same, "
                        "`accelerate launch --rdzv_conf timeout=N`")  # fmt: skip
    args = parser.parse_args(argv)
    args.timeout = _seconds(args.timeout)
    config = _read_config(args.config_file) if args.config_file else {}
    defaults = {"machine_rank": 0, "main_process_ip": None, "main_process_port": 29500, "num_machines": 1}
    for key, default in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, config.get(key, default))
    for key, low, high in (
        ("machine_rank", 0, None),
        ("num_machines", 1, None),
        ("main_process_port", 1, 65535),
    ):
        value = getattr(args, key)
        try:
            number = int(str(value))
        except ValueError:
            number = None
        if number is None or number < low or (high is not None and number > high):
            bounds = f"{low}..{high}" if high else f">= {low}"
            raise ConfigError(f"{key} must be a whole number {bounds}, got {value!r}", flag=key,
                              fix=f"set {key} to a whole number {bounds}")  # fmt: skip
        setattr(args, key, number)
    if args.main_process_ip is not None:
        args.main_process_ip = str(args.main_process_ip)
        try:
            socket.getaddrinfo(args.main_process_ip, args.main_process_port, socket.AF_INET)
        except (OSError, UnicodeError):
            raise ConfigError(
                f"main_process_ip {args.main_process_ip} is not an IPv4 address or a host name this machine "
                "resolves; set it to the main machine's address",
                flag="main_process_ip",
                fix="the machine_rank 0 machine's IPv4 address",
            ) from None
    return args


def _seconds(text: str) -> float:
    """--timeout: a number of seconds above 0 and at most MAX_TIMEOUT_S (nan, inf and 1e400 are
    floats that no wait can take)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ConfigError(
            f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (a week), got "
            f"{text!r}; give the seconds every wait may take, e.g. 120",
            flag="--timeout",
        )
    return seconds


def _read_config(path: str) -> dict:
    try:
        with open(path) as f:
            config = yaml.safe_load(f) or {}
    except OSError as error:
        raise ConfigError(f"--config_file {path}: cannot read it ({error.strerror}); give the accelerate "
                          "config the launch uses", flag="--config_file") from None  # fmt: skip
    except yaml.YAMLError:
        raise ConfigError(f"--config_file {path}: not valid YAML; give the accelerate config the launch uses",
                          flag="--config_file") from None  # fmt: skip
    if not isinstance(config, dict):
        raise ConfigError(f"--config_file {path}: not an accelerate config (a mapping of keys to values)",
                          flag="--config_file", fix="give the accelerate config the launch uses")  # fmt: skip
    return config


def check(argv: list[str]) -> None:
    args = parse(argv)
    if args.num_machines <= 1:
        return
    if not args.main_process_ip:
        raise ConfigError("main_process_ip is not set; give the main machine's address (--main_process_ip "
                          "or the config file)", flag="main_process_ip")  # fmt: skip
    if not 0 <= args.machine_rank < args.num_machines:
        raise ConfigError(f"machine_rank {args.machine_rank} must be in 0..{args.num_machines - 1} "
                          f"(num_machines={args.num_machines})", flag="machine_rank")  # fmt: skip
    # On a machine without a GPU the ranks' process group is gloo's. The address it would give the others
    # is checked here, before the launcher and its ranks spend seconds importing torch, and told to the
    # other machines as they meet: every machine stops, not only the one at fault, whose peers' launchers
    # would wait for it until their rendezvous timeout. (The ranks check it again, for launches without
    # this preflight.)
    world = {
        "MASTER_ADDR": args.main_process_ip,
        "WORLD_SIZE": str(args.num_machines),
        "LOCAL_WORLD_SIZE": "1",
    }
    gloo = None if _has_gpu_device() else gloo_problem({**os.environ, **world})
    if args.machine_rank == 0:
        main_machine(args.main_process_ip, args.main_process_port, args.num_machines, args.timeout, gloo)
    else:
        other_machine(args.main_process_ip, args.main_process_port, args.machine_rank, args.num_machines,
                      args.timeout, gloo)  # fmt: skip


def _has_gpu_device() -> bool:
    """Whether this machine has an NVIDIA or AMD GPU driver's device (torch's CUDA, NCCL's group),
    read without importing torch. Where unsure, a GPU: the ranks, which know, check gloo's address."""
    return any(os.path.exists(device) for device in ("/dev/nvidiactl", "/dev/kfd"))


def cli(argv: list[str] | None = None) -> int:
    try:
        check(sys.argv[1:] if argv is None else argv)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(cli())
