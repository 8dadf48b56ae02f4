"""--cuda_graphs, the loop's side, on CPU: capturing CUDA graphs needs a GPU (docs/benchmarks.md has the
H100 run: bitwise the eager weights, resume bitwise), so CUDA's two calls are stood in for. A capture
records the step and runs nothing; a replay runs the recorded step again on the same tensors and
writes its output in place; torch's sync debug mode is a setting a test's model can read. Everything of
ours runs: the shapes' graphs, the inputs copied into them, the fixed gradients, the skipped zero_grad,
the eager fallbacks, the failures."""

import contextlib

import pytest
import torch

import finetune.families.sequence_classification.family
import finetune.run
import finetune.speed.cuda_graphs as cuda_graphs
from finetune.errors import TrainingFailed
from finetune.mnli import cli, main
from finetune.run import setup
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

    def resolve(args, accelerator):
        return cuda_graphs.resolve_cuda_graphs(args, "cuda", True, "bf16", False, args.padding_free)

    monkeypatch.setattr(finetune.run, "cuda_graphs_for", resolve)
    monkeypatch.setattr(cuda_graphs, "record_graph", record)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_rng_state", torch.get_rng_state)
    monkeypatch.setattr(torch.cuda, "set_rng_state", torch.set_rng_state)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: None)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: SYNC_DEBUG["mode"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: SYNC_DEBUG.update(mode=mode))
    return captured


SYNC_DEBUG = {"mode": "default"}


def waits_for_the_device(args, identity):
    """A run whose model's forward asks the device for a value (as `.item()` does): under the sync
    debug mode "error", torch raises there."""

    def forward(module, inputs):
        if SYNC_DEBUG["mode"] == "error":
            raise RuntimeError("called a synchronizing CUDA operation")

    run = setup(args, identity)
    run.model.register_forward_pre_hook(forward)
    return run


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
    print("SHAPES", [tuple(graph.step.args[0]["input_ids"].shape) for graph in graphs_on_cpu])
    assert len(graphs_on_cpu) == len(shapes) >= 3  # one capture per shape, each replayed for its batches
    assert_same_weights(weights(tmp_path), eager)


def test_shapes_past_the_limit_run_eagerly(
    tiny_model_dir, nli_files, tmp_path, eager, graphs_on_cpu, monkeypatch
):
    monkeypatch.setattr(cuda_graphs, "MOST_GRAPHS", 1)
    main(tiny_args(tiny_model_dir, nli_files, tmp_path, *FLAGS))
    assert len(graphs_on_cpu) == 1
    assert_same_weights(weights(tmp_path), eager)


def test_a_model_that_waits_for_the_device_trains_eagerly_under_auto_and_fails_under_true(
    tiny_model_dir, nli_files, tmp_path, eager, graphs_on_cpu, capsys
):
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "auto", *FLAGS), build=waits_for_the_device)
    assert (
        "note: --cuda_graphs auto: cannot capture this model (called a synchronizing"
        in capsys.readouterr().out
    )
    assert not graphs_on_cpu and SYNC_DEBUG["mode"] == "default"
    assert_same_weights(weights(tmp_path / "auto"), eager)
    strict = tiny_args(tiny_model_dir, nli_files, tmp_path / "true", *FLAGS, "--cuda_graphs", "true")
    with pytest.raises(TrainingFailed, match="cannot be captured .*; use --cuda_graphs false$"):
        main(strict, build=waits_for_the_device)


def test_a_capture_that_fails_once_begun_fails_the_run(
    tiny_model_dir, nli_files, tmp_path, graphs_on_cpu, monkeypatch
):
    """CUDA's generator and allocator are not left in a state to train on from: no fallback."""

    def cannot(step, pool, stream):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "record_graph", cannot)
    with pytest.raises(
        TrainingFailed, match="capturing a batch of shape .* failed .*; use --cuda_graphs false"
    ):
        main(tiny_args(tiny_model_dir, nli_files, tmp_path, *FLAGS))


def with_a_decayed_parameter(args, identity, name: str):
    """`setup`'s run, its model holding one more trainable, weight-decayed parameter (ones), seen by the
    optimizer and the graphs too. Returns (run, the parameter)."""
    run = setup(args, identity)
    parameter = torch.nn.Parameter(torch.ones(4))
    run.model.register_parameter(name, parameter)
    decayed = next(group for group in run.optimizer.param_groups if group["weight_decay"] > 0)
    decayed["params"].append(parameter)
    run.graphs = run.family.step_graphs(args, run.config, run.accelerator, run.model, run.task)
    return run, parameter


def with_an_unused_parameter(args, identity):
    """The run's model holds a trainable, weight-decayed parameter its forward never uses (as XLNet's
    mask_emb for classification): eagerly it never has a gradient, so fused AdamW leaves it alone."""
    return with_a_decayed_parameter(args, identity, "unused")[0]


def test_class_weights_and_a_parameter_without_gradient_replay_as_eagerly(
    tiny_model_dir, nli_files, tmp_path, graphs_on_cpu
):
    """Class weights reach the device before the warm-up (its copy would count as a wait); a parameter
    no forward uses keeps no gradient, so weight decay does not touch it."""
    flags = (*FLAGS, "--class_weights", "balanced")
    eager_flags = (*flags, "--cuda_graphs", "false")
    main(
        tiny_args(tiny_model_dir, nli_files, tmp_path / "eager", *eager_flags), build=with_an_unused_parameter
    )
    main(tiny_args(tiny_model_dir, nli_files, tmp_path / "graphs", *flags), build=with_an_unused_parameter)
    assert graphs_on_cpu
    graphed = weights(tmp_path / "graphs")
    assert torch.equal(graphed.pop("unused"), torch.ones(4))
    assert_same_weights(graphed, {k: v for k, v in weights(tmp_path / "eager").items() if k != "unused"})


def with_a_parameter_for_48(args, identity):
    """A parameter only batches of 48 tokens give a gradient (zero-valued) to: that shape, met after the
    first (32), gives gradients to other parameters, which no set of fixed gradients can serve."""
    run, extra = with_a_decayed_parameter(args, identity, "extra")

    def batches_of_48_use_it(module, args, kwargs, output):
        if kwargs["input_ids"].shape[1] == 48:
            output.logits = output.logits + 0 * extra.sum()
        return output

    run.model.register_forward_hook(batches_of_48_use_it, with_kwargs=True)
    return run


def test_a_later_shape_that_uses_other_parameters_falls_back_to_eager(
    tiny_model_dir, nli_files, tmp_path, graphs_on_cpu, capsys
):
    for name, given in (("eager", (*FLAGS, "--cuda_graphs", "false")), ("graphs", FLAGS)):
        main(
            tiny_args(tiny_model_dir, nli_files, tmp_path / name, *given),
            build=with_a_parameter_for_48,
        )
    note = "(this batch shape gives gradients to other parameters than the first); training goes on eagerly"
    assert note in capsys.readouterr().out
    assert graphs_on_cpu  # the first shape was captured, and replayed until the fallback
    assert_same_weights(weights(tmp_path / "graphs"), weights(tmp_path / "eager"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine's own answer: it has CUDA")
def test_asking_for_graphs_without_cuda_is_one_line_before_the_model_loads(
    tiny_model_dir, nli_files, tmp_path, capsys, monkeypatch
):
    """No stand-ins here: this machine's own answer."""

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the refusal")

    monkeypatch.setattr(finetune.families.sequence_classification.family, "build_model", no_model)
    assert cli(tiny_args(tiny_model_dir, nli_files, tmp_path / "out", "--cuda_graphs", "true")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == "error: --cuda_graphs true needs a CUDA device; drop it on this machine"
