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
import math
import os
import socket
import sys

import yaml

from finetune.distributed.gloo_address import gloo_problem
from finetune.distributed.meeting import main_machine, other_machine
from finetune.errors import ConfigError, OneLineParser

MAX_TIMEOUT_S = 7 * 24 * 3600  # a week; far above it a socket's timeout overflows


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
