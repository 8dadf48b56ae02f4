"""Two hosts with addresses of their own (network namespaces joined by a veth pair, 10.36.0.1 and
10.36.0.2): `accelerate launch` with the multi-node CPU config, --machine_rank 0 on one, 1 on the other."""

import json
import os
import shutil
import subprocess
import uuid

import pytest

from tests.helpers import PYTHON, REPO, kill_tree, tiny_args

pytestmark = pytest.mark.multiprocess
ACCELERATE = os.path.join(os.path.dirname(PYTHON), "accelerate")


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


def test_two_hosts_train_as_one_world(two_hosts, tiny_model_dir, nli_files, tmp_path):
    out = tmp_path / "out"
    main_ip = next(iter(two_hosts.values()))[0]
    nodes = []
    for rank, (name, (_, interface)) in enumerate(two_hosts.items()):
        # Port 29536 is free: each namespace has ports of its own.
        command = ["ip", "netns", "exec", name, ACCELERATE, "launch", "--config_file",
                   "accelerate_configs/multi_node_cpu.yaml", "--num_processes", "2",
                   "--machine_rank", str(rank), "--main_process_ip", main_ip,
                   "--main_process_port", "29536", "finetune/mnli.py",
                   *tiny_args(tiny_model_dir, nli_files, out)]  # fmt: skip
        # gloo advertises the address its host name resolves to (127.0.0.1 here): name the interface.
        env = {**os.environ, "GLOO_SOCKET_IFNAME": interface}  # without it: a hang, no error (> 100 s)
        nodes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))  # fmt: skip
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            kill_tree(node.pid)
    assert [n.returncode for n in nodes] == [0, 0], outputs[0][1][-3000:] + outputs[1][1][-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["world_size"] == 2 and results["replicas_identical"] is True
