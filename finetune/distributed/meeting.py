"""How the machines' preflights meet (`finetune.distributed.preflight`): the main machine (machine_rank 0)
listens at main_process_ip:main_process_port; each other machine connects and says hello, with its
machine_rank, num_machines and its gloo verdict; the main machine answers at once ("hello", or the
mistake), and, once every machine has arrived, tells them all "ok" or the first machine's gloo problem.

    other machine -> main:  finetune-preflight/2 <machine_rank> <num_machines>\ngloo ok|<problem>\n
    main -> other machine:  hello | error <problem>\n
    then, when all have arrived:  ok | gloo <rank> <problem>\n

The protocol's version is in the hello: a machine with another version of finetune is told so, and both
stop. Every wait ends at the deadline; every mistake is a ConfigError naming the setting.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time

from finetune.errors import ConfigError

HELLO = "finetune-preflight/2"  # /2: a second line, the machine's gloo verdict (none before 2026-11-28)
ACK_WITHIN = 5.0  # seconds: the main machine's preflight answers a hello at once


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
    hello = f"{HELLO} {rank} {machines}\ngloo {gloo or 'ok'}\n".encode()
    closed = False  # whether something accepted the connection and closed it without a word
    while True:
        connection = _reach(address, port, deadline, timeout, closed)
        # The reader closed with the connection: a refusal raised from here would keep it, and the socket,
        # open, and the main machine, closing first, would leave the launcher's port in TIME_WAIT.
        with connection, connection.makefile("r") as reader:
            connection.settimeout(ACK_WITHIN)
            try:
                connection.sendall(hello)
                first = reader.readline().strip()
            except TimeoutError:
                first = "(silence)"
            except OSError:  # reset
                first = ""
            if not first:
                # The main machine's check that its port is free listens there a moment, and closes what
                # connected then; or something else closes: try again until the deadline.
                closed = True
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            _answered(first, where)
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
        return


def _reach(address: str, port: int, deadline: float, timeout: float, closed: bool) -> socket.socket:
    """A connection to the main machine's preflight, tried until the deadline."""
    where = f"{address}:{port}"
    while True:
        left = deadline - time.monotonic()
        if left <= 0 and closed:
            raise ConfigError(
                f"what answers at main_process_ip:main_process_port {where} closes every connection without "
                "a word: another program holds main_process_port there, or the main machine runs another "
                "version of finetune; set main_process_port to a free port on the main machine, the same on "
                "every machine, and install the same finetune on every machine",
                flag="main_process_port",
                fix="a port free on the machine_rank 0 machine",
            )
        if left <= 0:
            raise ConfigError(
                f"nothing answered at main_process_ip:main_process_port {where} within {timeout:g} s; set "
                "main_process_ip to the main machine's address as this machine reaches it, and start the "
                "same command there (machine_rank 0)",
                flag="main_process_ip",
                fix="the machine_rank 0 machine's address, reachable from here",
            )
        try:
            return socket.create_connection((address, port), timeout=min(left, 5.0))
        except OSError:  # refused (not started yet), unreachable, timed out: try until the deadline
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


def _answered(first: str, where: str) -> None:
    """Raise unless the main machine's first answer is its hello."""
    if first.startswith("error ") and "version of finetune" in first:
        raise ConfigError(first.removeprefix("error "), flag="finetune version",
                          fix="install the same finetune on every machine")  # fmt: skip
    if first.startswith("error "):
        raise ConfigError(first.removeprefix("error ") + "; give every machine the same settings",
                          flag="machine_rank" if "machine_rank" in first else "num_machines")  # fmt: skip
    if first != "hello":
        raise ConfigError(
            f"another program, not the main machine's preflight, answers at {where}: main_process_port is "
            "taken there (or main_process_ip is another machine); set main_process_port to a free port on "
            "the main machine, the same on every machine",
            flag="main_process_port",
            fix="a port free on the machine_rank 0 machine",
        )
