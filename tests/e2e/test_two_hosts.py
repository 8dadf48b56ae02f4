"""Two hosts with addresses of their own (network namespaces joined by a veth pair, 10.36.0.1 and
10.36.0.2): `accelerate launch` as a user types it on each, --machine_rank 0 on one, 1 on the other. The
multi-node CPU config file's launch is the Slurm tests' (multinode.sbatch runs it on two such hosts)."""

import os
import shlex
import shutil
import subprocess
import time
import uuid

import pytest

from finetune.mnli import main
from tests.e2e.test_distributed import losses, results_of
from tests.helpers import PYTHON, REPO, kill_tree, tiny_args, without_dropout

pytestmark = pytest.mark.multiprocess
ACCELERATE = os.path.join(os.path.dirname(PYTHON), "accelerate")
CONFIG = "accelerate_configs/multi_node_cpu.yaml"
PREFLIGHT = [PYTHON, "-m", "finetune.distributed.preflight"]


@pytest.fixture
def two_hosts():
    """Namespace names and their (address, interface), removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("two-host tests need root and iproute2 (ip netns)")
    tag = uuid.uuid4().hex[:6]
    hosts = {f"ft{tag}a": ("10.36.0.1", f"v{tag}a"), f"ft{tag}b": ("10.36.0.2", f"v{tag}b")}
    (a, (_, ifa)), (b, (_, ifb)) = hosts.items()
    commands = [f"netns add {a}", f"netns add {b}", f"link add {ifa} type veth peer name {ifb}",
                f"link set {ifa} netns {a}", f"link set {ifb} netns {b}"]  # fmt: skip
    for name, (address, interface) in hosts.items():
        commands += [f"-n {name} addr add {address}/24 dev {interface}", f"-n {name} link set {interface} up",
                     f"-n {name} link set lo up"]  # fmt: skip
    try:
        for command in commands:
            subprocess.run(["ip", *command.split()], check=True, capture_output=True)
        yield hosts
    finally:
        for name in hosts:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def launch(
    two_hosts, args: list[str], gloo_interface: tuple[bool, bool] = (True, True), config: bool = True
) -> list[tuple[int, str, str]]:
    """On each host: the preflight, then `accelerate launch` (as multinode.sbatch does), with the
    multi-node CPU config, or from the flags alone (`config=False`: --multi_gpu --num_machines 2, no
    file); GLOO_SOCKET_IFNAME set on the hosts `gloo_interface` says. Each node's (exit code, stdout,
    stderr)."""
    main_ip = next(iter(two_hosts.values()))[0]
    setup = ["--config_file", CONFIG] if config else ["--num_machines", "2"]
    launcher = ["--config_file", CONFIG] if config else ["--multi_gpu", "--num_machines", "2"]
    nodes = []
    for rank, (name, (_, interface)) in enumerate(two_hosts.items()):
        # Port 29536 is free: each namespace has ports of its own.
        where = ["--machine_rank", str(rank), "--main_process_ip", main_ip, "--main_process_port", "29536"]
        check = [*PREFLIGHT, *setup, *where, "--timeout", "60"]
        command = [ACCELERATE, "launch", *launcher, "--num_processes", "2", *where,
                   "--rdzv_conf", "timeout=60", "finetune/mnli.py", *args]  # fmt: skip
        both = ["sh", "-c", f"{shlex.join(check)} && exec {shlex.join(command)}"]
        # gloo advertises the address its host name resolves to (127.0.0.1 here): name the interface.
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        if gloo_interface[rank]:
            env["GLOO_SOCKET_IFNAME"] = interface
        nodes.append(subprocess.Popen(["ip", "netns", "exec", name, *both], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))  # fmt: skip
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            kill_tree(node.pid)
    return [(node.returncode, *output) for node, output in zip(nodes, outputs, strict=True)]


def test_two_hosts_from_the_flags_alone_with_batch_16_match_one_process_with_batch_32(
    two_hosts, tiny_model_dir, nli_files, tmp_path
):
    """`accelerate launch --multi_gpu --num_machines 2 --num_processes 2 --machine_rank R` with no config
    file, one process per host: one world of two, whose updates are one process's with the same global
    batch (the same rows per step, the same loss curve).

    320 rows divide by 32 (10 steps, a loss line every 2; 18 steps asserted nothing more); a remainder
    is cut over the ranks too, each row trained once (tests/e2e/test_uneven_ranks.py)."""
    model_dir = without_dropout(tiny_model_dir, tmp_path / "model")
    one, two = tmp_path / "one", tmp_path / "two"
    rows = ["--max_train_samples", "320", "--logging_steps", "2"]
    main(tiny_args(model_dir, nli_files, one, *rows, "--per_device_train_batch_size", "32"))
    args = tiny_args(model_dir, nli_files, two, *rows, "--per_device_train_batch_size", "16")
    nodes = launch(two_hosts, args, config=False)
    assert [n[0] for n in nodes] == [0, 0], nodes[0][2][-3000:] + nodes[1][2][-3000:]
    assert "".join(n[1] for n in nodes).count("world_size=2") == 1  # the start-up summary: rank 0's
    assert results_of(two)["replicas_identical"] is True
    assert (results_of(one)["world_size"], results_of(two)["world_size"]) == (1, 2)
    assert results_of(one)["global_step"] == results_of(two)["global_step"] == 10
    assert len(losses(one)) == 5 and losses(one) == pytest.approx(losses(two), rel=1e-5)


def test_without_gloo_socket_ifname_each_host_stops_before_the_launcher(
    two_hosts, tiny_model_dir, nli_files, tmp_path
):
    """Without GLOO_SOCKET_IFNAME the ranks waited for each other (> 100 s; the process group's 30 min).
    Each host's preflight, once the hosts met, says so in one line, and no launcher starts. A launch
    without the preflight meets the same check in each rank, before its process group: the same line
    from the same function, called in a host's namespace with the environment a launcher gives a rank."""
    start = time.monotonic()
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out")
    nodes = launch(two_hosts, args, gloo_interface=(False, False))
    assert time.monotonic() - start < 30
    lines = []
    for (code, _, err), (_, interface) in zip(nodes, two_hosts.values(), strict=True):
        assert code == 2 and len(err.splitlines()) == 1, err[-3000:]  # the preflight's line, alone
        assert err.startswith("error: gloo would tell the other machines") and (
            f"set GLOO_SOCKET_IFNAME={interface}," in err
        ), err
        lines.append(err.strip())
    name, (main_ip, _) = next(iter(two_hosts.items()))
    rank = {"MASTER_ADDR": main_ip, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    probe = f"from finetune.distributed.gloo_address import check_gloo_address as c; c({rank!r})"
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    done = subprocess.run(["ip", "netns", "exec", name, PYTHON, "-c", probe], cwd=REPO, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and lines[0].removeprefix("error: ") in done.stderr, done.stderr[-3000:]


def test_a_host_without_gloo_socket_ifname_stops_the_other_too(
    two_hosts, tiny_model_dir, nli_files, tmp_path
):
    """GLOO_SOCKET_IFNAME set on the main host only: the other host's preflight says its own line, and
    the main host's, told as the machines meet, says which machine stopped and why, so that its
    launcher does not wait for the other until the rendezvous timeout."""
    start = time.monotonic()
    args = tiny_args(tiny_model_dir, nli_files, tmp_path / "out")
    (main_code, _, main_err), (code, _, err) = launch(two_hosts, args, gloo_interface=(True, False))
    assert time.monotonic() - start < 30
    assert (
        code == 2
        and err.startswith("error: gloo would tell the other machines")
        and len(err.splitlines()) == 1
    )
    assert main_code == 2 and len(main_err.splitlines()) == 1, main_err[-3000:]
    assert main_err.startswith("error: machine_rank 1 cannot join the ranks' process group")
    assert err.removeprefix("error: ").strip() in main_err
