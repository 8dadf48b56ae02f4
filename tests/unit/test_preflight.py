"""The multi-machine preflight's inputs, read before any socket: each mistake one ConfigError naming the
setting (the mistakes that need machines to meet: tests/e2e/test_launch_mistakes.py)."""

import pytest

from finetune.distributed.preflight import check
from tests.helpers import refused

TWO = ["--num_machines", "2", "--main_process_ip", "127.0.0.1"]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        ([*TWO, "--main_process_port", "abc"], "main_process_port"),
        ([*TWO, "--main_process_port", "70000", "--machine_rank", "1"], "main_process_port"),
        ([*TWO, "--main_process_port", "0"], "main_process_port"),
        (["--num_machines", "two"], "num_machines"),
        ([*TWO, "--machine_rank", "-1"], "machine_rank"),
        ([*TWO, "--machine_rank", "2"], "machine_rank"),
        (["--num_machines", "2"], "main_process_ip"),
        (["--num_machines", "2", "--main_process_ip", "nosuchhost.invalid"], "main_process_ip"),
        ([*TWO, "--timeout", "soon"], "--timeout"),
        # Floats no wait can take: each was a traceback (nan, inf: from the socket; 1e400 reads as inf).
        ([*TWO, "--timeout", "nan"], "--timeout"),
        ([*TWO, "--timeout", "inf"], "--timeout"),
        ([*TWO, "--timeout", "1e400"], "--timeout"),
        ([*TWO, "--timeout", "0"], "--timeout"),
    ],
)
def test_a_bad_setting_is_one_error_naming_it(argv, flag):
    with refused(flag):
        check(argv)


@pytest.mark.parametrize(
    "content",
    [
        None,
        "main_process_ip: [unclosed\n",
        "- a list\n",
        'num_machines: 2\nmain_process_ip: 127.0.0.1\nmain_process_port: "x"\n',
    ],
    ids=["missing", "bad YAML", "not a mapping", "quoted non-port"],
)
def test_a_bad_config_file_is_one_error(content, tmp_path):
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_text(content)
    with refused("main_process_port" if content and "main_process_port" in content else "--config_file"):
        check(["--config_file", str(path), "--machine_rank", "1"])


def test_a_quoted_port_in_the_config_file_is_read_as_accelerate_reads_it(tmp_path):
    """accelerate takes `main_process_port: "29641"`; so does the preflight (one machine: nothing to meet)."""
    path = tmp_path / "config.yaml"
    path.write_text('num_machines: 1\nmain_process_port: "29641"\n')
    check(["--config_file", str(path)])
