"""The address a CPU (gloo) world tells the other machines this one is at, and a one-line refusal when
they could not reach it. Read without torch: the preflight checks it before a launcher starts, and each
rank again before its process group (a process group would wait 30 minutes for the others)."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct

from finetune.errors import ConfigError

LOOPBACK = "127.0.0.1"  # torch's fallback when the host name gives no address that binds here


def gloo_problem(env=os.environ) -> ConfigError | None:
    """The refusal for a gloo world over several machines in which the others would be told to reach
    this one at a loopback address; None where GLOO_SOCKET_IFNAME is set, the world is one machine, or
    main_process_ip (MASTER_ADDR) is itself loopback or unresolvable (the launch says so itself)."""
    master, world = env.get("MASTER_ADDR", ""), env.get("WORLD_SIZE", "1")
    if env.get("GLOO_SOCKET_IFNAME") or world == env.get("LOCAL_WORLD_SIZE", world):
        return None
    try:
        if ipaddress.ip_address(socket.gethostbyname(master)).is_loopback:
            return None
    except (OSError, UnicodeError, ValueError):
        return None
    host = socket.gethostname()
    own, why = gloo_own_address(host)
    if not ipaddress.ip_address(own.split("%")[0]).is_loopback:
        return None
    interface = _interface_towards(master) or "<the interface that reaches it>"
    return ConfigError(
        f"gloo would tell the other machines this one is at {own} ({why}), where they cannot reach it; set "
        f"GLOO_SOCKET_IFNAME={interface}, the interface that reaches main_process_ip {master} here (on each "
        "machine, its own)",
        flag="GLOO_SOCKET_IFNAME",
        fix=f"GLOO_SOCKET_IFNAME={interface}",
    )


def check_gloo_address(env=os.environ) -> None:
    """`gloo_problem`, raised."""
    problem = gloo_problem(env)
    if problem is not None:
        raise problem


def gloo_own_address(host: str) -> tuple[str, str]:
    """What gloo gives the others without GLOO_SOCKET_IFNAME, and why: the first address the host name
    resolves to that binds here (torch's doesHostnameResolveToUsableAddress, then gloo's own lookup),
    else 127.0.0.1: a name that does not resolve, or resolves only to another machine's address."""
    try:
        candidates = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return LOOPBACK, f"its host name {host} does not resolve, so gloo falls back to loopback"
    for family, kind, protocol, _, address in candidates:
        with contextlib.suppress(OSError), socket.socket(family, kind, protocol) as probe:
            probe.bind(address)
            return address[0], f"what its host name {host} resolves to"
    return (
        LOOPBACK,
        f"its host name {host} resolves to no address of this machine, so gloo falls back to loopback",
    )


def _interface_towards(address: str) -> str | None:
    """The network interface this machine sends to `address` through (its name, as `ip addr` shows)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # no packet is sent: this only picks the route
            local = probe.getsockname()[0]
            for _, name in socket.if_nameindex():
                with contextlib.suppress(OSError):  # SIOCGIFADDR: the interface's IPv4 address
                    packed = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                    if socket.inet_ntoa(packed[20:24]) == local:
                        return name
    except OSError:
        pass
    return None
