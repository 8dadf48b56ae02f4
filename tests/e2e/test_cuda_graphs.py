"""--cuda_graphs, the loop's side, on CPU: capturing CUDA graphs needs a GPU (docs/benchmarks.md has the
H100 run: bitwise the eager weights, resume bitwise), so CUDA's two calls are stood in for. A capture
records the step and runs nothing; a replay runs the recorded step again on the same tensors and
writes its output in place. Everything of ours runs: the shapes' graphs, the inputs copied into them,
the fixed gradients, the skipped zero_grad, the eager fallbacks."""

import contextlib

import pytest
import torch

import finetune.model.build
import finetune.speed.cuda_graphs as cuda_graphs
from finetune.errors import TrainingFailed
from finetune.mnli import main
from tests.helpers import assert_same_weights, tiny_args, weights


class Replayed:
    """A captured step on CPU: `replay()` runs it again and writes its output where the first run put it."""

    def __init__(self, step):
        self.step = step
        random_state = torch.get_rng_state()
        self.output = step()  # the tensor the caller keeps, as a graph's static output
        torch.set_rng_state(random_state)  # a capture draws no random numbers

    def replay(self):
        self.output.copy_(self.step())


class Stream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def graphs_on_cpu(monkeypatch):
    """The run resolves --cuda_graphs as on one GPU; CUDA's capture, streams and random state are the
    CPU's. Yields the captures made, as (graph, output) pairs."""
    captured = []

    def record(step, pool, stream):
        graph = Replayed(step)
        captured.append(graph)
        return graph, graph.output

    def resolve(args, device_type, alone, mixed_precision):
        return cuda_graphs.resolve_cuda_graphs(args, "cuda", alone, "bf16")

    monkeypatch.setattr(finetune.model.build, "resolve_cuda_graphs", resolve)
    monkeypatch.setattr(cuda_graphs, "record_graph", record)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_rng_state", torch.get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", torch.set_rng_state)
    return captured


# Lengths bucketed to 16 at --max_length 64, and a short last batch: several shapes per epoch.
FLAGS = ("--pad_to_multiple_of", "16", "--num_train_epochs", "2")


@pytest.fixture(scope="module")
def eager(tiny_model_dir, nli_files, tmp_path_factory):
    out = tmp_path_factory.mktemp("eager")
    main(tiny_args(tiny_model_dir, nli_files, out, *FLAGS, "--cuda_graphs", "false"))
    return weights(out)


def test_replayed_micro_batches_train_the_eager_weights(
    tiny_model_dir, nli_files, tmp_path, eager, graphs_on_cpu
):
    main(tiny_args(tiny_model_dir, nli_files, tmp_path, *FLAGS))
    shapes = {tuple(graph.step.args[0]["input_ids"].shape) for graph in graphs_on_cpu}
    assert len(graphs_on_cpu) == len(shapes) >= 3  # one capture per shape, each replayed for its batches
    assert_same_weights(weights(tmp_path), eager)


def test_shapes_past_the_limit_and_after_a_failed_capture_run_eagerly(
    tiny_model_dir, nli_files, tmp_path, eager, graphs_on_cpu, monkeypatch, capsys
):
    monkeypatch.setattr(cuda_graphs, "MOST_GRAPHS", 1)
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "limit", *FLAGS))
    assert len(graphs_on_cpu) == 1
    assert_same_weights(weights(tmp_path / "limit"), eager)

    def cannot(step, pool, stream):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "record_graph", cannot)
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "auto", *FLAGS))  # auto: a note, then eager
    assert "note: --cuda_graphs auto: capture failed (operation not permitted" in capsys.readouterr().out
    assert_same_weights(weights(tmp_path / "auto"), eager)
    with pytest.raises(TrainingFailed, match="use --cuda_graphs false$"):
        main(tiny_args(tiny_model_dir, nli_files, tmp_path / "true", *FLAGS, "--cuda_graphs", "true"))
