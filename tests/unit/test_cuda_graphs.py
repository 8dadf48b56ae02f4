"""--cuda_graphs: where it is on, what refuses it, and the FSDP2 norm the step's NaN guard reads. The
capture itself needs CUDA; tests/e2e/test_cuda_graphs.py runs the loop's side of it on CPU."""

import dataclasses

import pytest
import torch
import torch.distributed as dist

from finetune.config.parser import parse_config
from finetune.data.tasks import GLUE_TASKS
from finetune.families.family import class_weights_tensor
from finetune.families.sequence_classification.evaluation import loss_sum
from finetune.speed.cuda_graphs import resolve_cuda_graphs
from finetune.training.loop import whole_norm
from tests.helpers import refused

ON_ONE_GPU = {
    "device_type": "cuda",
    "alone": True,
    "mixed_precision": "bf16",
    "compiled": False,
    "padding_free": "false",
}


def test_auto_is_on_for_one_gpu_and_off_without_cuda():
    assert resolve_cuda_graphs(parse_config([]), **ON_ONE_GPU) == "true"
    assert resolve_cuda_graphs(parse_config(["--cuda_graphs", "false"]), **ON_ONE_GPU) == "false"
    assert resolve_cuda_graphs(parse_config(["--do_train", "false"]), **ON_ONE_GPU) == "false"
    on_cpu = {**ON_ONE_GPU, "device_type": "cpu"}
    assert resolve_cuda_graphs(parse_config([]), **on_cpu) == "false"
    with refused("--cuda_graphs", "drop it"):
        resolve_cuda_graphs(parse_config(["--cuda_graphs", "true"]), **on_cpu)


@pytest.mark.parametrize(
    ("flags", "facts", "fix"),
    [
        (["--gradient_accumulation_steps", "2"], {}, "--gradient_accumulation_steps"),
        (["--auto_find_batch_size"], {}, "--auto_find_batch_size"),
        (["--torch_compile"], {}, "--torch_compile"),
        (["--padding_free", "varlen"], {"padding_free": "varlen"}, "--padding_free false"),
        ([], {"compiled": True}, "dynamo_config"),
        (["--pad_to_multiple_of", "1"], {}, "--pad_to_multiple_of 8"),
        (["--gradient_checkpointing"], {}, "--gradient_checkpointing"),
        ([], {"alone": False}, "several processes"),
        ([], {"mixed_precision": "fp16"}, "bf16"),
    ],
)
def test_what_a_graph_cannot_replay_turns_auto_off_and_refuses_true(flags, facts, fix):
    facts = {**ON_ONE_GPU, **facts}
    assert resolve_cuda_graphs(parse_config(flags), **facts) == "false"
    with refused("--cuda_graphs", fix):
        resolve_cuda_graphs(parse_config([*flags, "--cuda_graphs", "true"]), **facts)


def test_class_weights_reach_the_device_once_not_per_step():
    """A copy from host memory in every loss could not be captured in a graph."""
    task = dataclasses.replace(GLUE_TASKS["mnli"], class_weights=(1.0, 2.0, 0.5))
    before = class_weights_tensor.cache_info().misses
    logits, labels = torch.randn(4, 3), torch.tensor([0, 1, 2, 1])
    first, second = loss_sum(logits, labels, task), loss_sum(logits, labels, task)
    assert torch.equal(first, second)
    assert class_weights_tensor.cache_info().misses == before + 1


def test_fsdp2s_gradient_norm_is_usable_by_the_nan_guard(tmp_path):
    """FSDP2's clip_grad_norm_ returns a DTensor; the guard mixed it with plain tensors and failed on
    the first step (an H100, 2026-11-26). One real gloo process group of one rank."""
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        weight = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
        weight.grad = distribute_tensor(torch.full((4, 2), 0.5), mesh, [Shard(0)])
        norm = torch.nn.utils.clip_grad_norm_([weight], 1.0)
        assert isinstance(norm, DTensor)
        norm = whole_norm(norm)
        first = torch.zeros((), dtype=torch.int64)
        first.copy_(torch.where(~torch.isfinite(norm) & (first == 0), 7, first))  # as _optimizer_step
        assert not isinstance(norm, DTensor) and float(norm) == pytest.approx(2**0.5) and int(first) == 0
        weight.grad = distribute_tensor(torch.full((4, 2), float("nan")), mesh, [Shard(0)])
        norm = whole_norm(torch.nn.utils.clip_grad_norm_([weight], 1.0))
        first.copy_(torch.where(~torch.isfinite(norm) & (first == 0), 7, first))
        assert int(first) == 7
    finally:
        dist.destroy_process_group()
