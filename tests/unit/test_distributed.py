"""The guard against launchers whose processes did not join one group. Real 2-rank runs:
tests/e2e/test_distributed.py."""

import pytest

from finetune.distributed.ranks import check_world_size
from finetune.errors import ConfigError


def test_guard_against_processes_that_did_not_join_one_group():
    check_world_size(1, 1)
    check_world_size(2, 2)
    with pytest.raises(ConfigError, match="launcher started 2 processes but Accelerate sees 1"):
        check_world_size(2, 1)
