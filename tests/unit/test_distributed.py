"""The guard against launchers whose processes did not join one group. Real 2-rank runs:
tests/e2e/test_distributed.py."""

import pytest

from finetune.distributed.launch_env import simple_launch_asks
from finetune.distributed.ranks import check_launched_all, check_world_size
from finetune.errors import ConfigError


def test_guard_against_processes_that_did_not_join_one_group():
    check_world_size(1, 1)
    check_world_size(2, 2)
    with pytest.raises(ConfigError, match="launcher started 2 processes but Accelerate sees 1"):
        check_world_size(2, 1)


ACCELERATE = ["/venv/bin/python3", "/venv/bin/accelerate", "launch"]


@pytest.fixture
def no_default_config(monkeypatch, tmp_path):
    """accelerate reads the default config of `accelerate config` when given none: this machine's user's
    must not decide the tests."""
    import accelerate.commands.launch

    monkeypatch.setattr(accelerate.commands.launch, "default_config_file", str(tmp_path / "none.yaml"))


def write_config(tmp_path, distributed_type: str, processes: int) -> str:
    path = tmp_path / f"{distributed_type}.yaml"
    path.write_text(
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: {distributed_type}\nnum_machines: 1\n"
        f"num_processes: {processes}\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n"
    )
    return str(path)


@pytest.mark.parametrize(
    ("launch", "asked"),
    [
        (["--num_processes", "2"], 2),  # accelerate's simple launcher: one process, whatever the count
        (["--num_processes=3", "--cpu"], 3),
        ([], 1),  # no count: accelerate counts the GPUs (none), and starts one process
        (["--multi_gpu", "--num_processes", "2"], None),  # torchrun's launcher: WORLD_SIZE tells
    ],
)
def test_a_simple_launch_reads_the_count_it_was_asked_for(launch, asked, no_default_config, monkeypatch):
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    # The script's own flags, after it, are not the launcher's.
    assert simple_launch_asks([*ACCELERATE, *launch, "finetune/mnli.py", "--num_processes", "9"]) == asked


def test_a_config_files_count_and_type_decide(tmp_path, no_default_config):
    single = write_config(tmp_path, "NO", 2)
    multi_cpu = write_config(tmp_path, "MULTI_CPU", 2)  # without MPI/oneCCL accelerate runs this as one
    multi_gpu = write_config(tmp_path, "MULTI_GPU", 2)  # torchrun's launcher, on CPU too (cpu_multiprocess)
    assert simple_launch_asks([*ACCELERATE, "--config_file", single, "x.py"]) == 2
    assert simple_launch_asks([*ACCELERATE, "--config_file", multi_cpu, "x.py"]) == 2
    assert simple_launch_asks([*ACCELERATE, "--config_file", multi_gpu, "x.py"]) is None
    assert simple_launch_asks([*ACCELERATE, "--config_file", single, "--num_processes", "1", "x.py"]) == 1


def test_other_parents_are_not_read_as_accelerate(no_default_config):
    assert (
        simple_launch_asks(
            ["/usr/bin/python3", "-m", "accelerate.commands.launch", "--num_processes", "2", "x.py"]
        )
        == 2
    )
    assert simple_launch_asks(["/venv/bin/accelerate-launch", "--num_processes", "2", "x.py"]) == 2
    assert (
        simple_launch_asks(["/venv/bin/python", "-m", "finetune.launch", "--num_processes", "2", "x.py"]) == 2
    )
    assert simple_launch_asks(["mpirun", "-np", "2", "python", "x.py"]) is None
    assert simple_launch_asks(["bash", "./launch", "--num_processes", "2"]) is None  # a script named launch
    assert simple_launch_asks([*ACCELERATE, "--no_such_flag"]) is None  # not one accelerate would run


def test_a_launch_that_started_fewer_processes_than_asked_is_refused():
    with pytest.raises(ConfigError) as refused:
        check_launched_all(2, 1, on_gpu=False)
    assert refused.value.flag == "--num_processes"
    assert "accelerate_configs/cpu_multiprocess.yaml" in refused.value.fix
    with pytest.raises(ConfigError) as refused:
        check_launched_all(4, 1, on_gpu=True)
    assert "accelerate_configs/multi_gpu.yaml" in refused.value.fix
    check_launched_all(2, 2, on_gpu=False)
    check_launched_all(None, 1, on_gpu=False)


def test_each_rank_checks_gloos_address_before_its_process_group(monkeypatch, tmp_path):
    """A rank of a CPU world over two machines whose host name resolves to loopback (what the preflight
    also checks, tests/e2e/test_two_hosts.py): build_accelerator refuses, naming GLOO_SOCKET_IFNAME,
    before any process group exists (one would wait 30 minutes for the others)."""
    import socket

    import torch

    from finetune.config.train_config import TrainConfig
    from finetune.distributed.accelerator import build_accelerator

    if torch.cuda.is_available():
        pytest.skip("NCCL's world: gloo's address is not checked")
    world = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
             "MASTER_ADDR": "10.36.0.1", "MASTER_PORT": "29536"}  # fmt: skip
    for name, value in world.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "localhost")

    def group(*args, **kwargs):  # without the check: a rank that would wait for the others, here a failure
        raise AssertionError("the process group was made before gloo's address was checked")

    monkeypatch.setattr(torch.distributed, "init_process_group", group)
    with pytest.raises(ConfigError) as refused:
        build_accelerator(TrainConfig(output_dir=str(tmp_path)), [])
    assert refused.value.flag == "GLOO_SOCKET_IFNAME"
    assert "gloo would tell the other machines this one is at 127.0.0.1" in str(refused.value)


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("localhost", "what its host name localhost resolves to"),
        ("nosuchhost.invalid", "its host name nosuchhost.invalid does not resolve, so gloo falls back"),
        ("192.0.2.123", "resolves to no address of this machine, so gloo falls back to loopback"),
    ],
)
def test_gloo_problem_is_where_gloo_would_give_the_others_a_loopback_address(host, why, monkeypatch):
    """torch's rule (doesHostnameResolveToUsableAddress, then gloo's lookup): the first address the host
    name resolves to that binds here, else 127.0.0.1. A name resolving to loopback, not resolving, or
    resolving only to another machine's address all leave the other machines unable to reach this one."""
    import re
    import socket

    from finetune.distributed.gloo_address import gloo_problem

    monkeypatch.setattr(socket, "gethostname", lambda: host)
    world = {"MASTER_ADDR": "10.36.0.1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
    problem = gloo_problem(world)
    assert problem is not None and problem.flag == "GLOO_SOCKET_IFNAME" and why in str(problem)
    assert re.search(r"this one is at (127\.0\.0\.1|::1) ", str(problem)), str(problem)
    assert gloo_problem({**world, "GLOO_SOCKET_IFNAME": "eth0"}) is None
    assert gloo_problem({**world, "LOCAL_WORLD_SIZE": "2"}) is None  # one machine: loopback reaches it
    assert gloo_problem({**world, "MASTER_ADDR": "127.0.0.1"}) is None


def test_gloo_problem_is_none_where_the_host_name_gives_an_address_of_this_machine(monkeypatch):
    import socket

    from finetune.distributed.gloo_address import gloo_problem

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: the route's source address
            own = probe.getsockname()[0]
    except OSError:
        pytest.skip("no route off this machine: no address of it but loopback")
    monkeypatch.setattr(socket, "gethostname", lambda: own)
    assert gloo_problem({"MASTER_ADDR": "192.0.2.1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}) is None


@pytest.mark.parametrize(
    ("exits", "expected"),
    [
        ([143, 143], 143),
        ([143, -15], 143),  # the agent's SIGTERM ended the rank still exiting
        ([-15, 143], 143),  # in either order: failures are ordered by the second
        ([130, -15], 130),  # Ctrl-C: the agent's SIGTERM is not the user's signal
        ([143, 130], 143),
        ([143, 1], None),  # a rank failed: the launch's failure, as torch reports it
        ([-15, -15], None),  # killed, never said it stopped
        ([1], None),
    ],
)
def test_a_launch_whose_ranks_were_stopped_exits_with_the_stop_code(exits, expected):
    """torch elastic's own exception types, as its agent raises them (real launches:
    tests/e2e/test_fault_tolerance.py)."""
    import signal
    import subprocess

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from finetune.distributed.signals import stopped_launch_code

    failures = {rank: ProcessFailure(rank, 1000 + rank, code, "<N/A>") for rank, code in enumerate(exits)}
    assert stopped_launch_code(ChildFailedError("mnli.py", failures)) == expected
    assert stopped_launch_code(SignalException("got signal", signal.SIGTERM)) == 143
    assert stopped_launch_code(subprocess.CalledProcessError(143, ["python"])) == 143
    assert stopped_launch_code(subprocess.CalledProcessError(1, ["python"])) is None
    assert stopped_launch_code(ValueError("other")) is None
