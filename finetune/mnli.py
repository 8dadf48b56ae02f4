"""Fine-tune a BERT-style model on MNLI: `accelerate launch finetune/mnli.py [--flags]`.

The same script runs on CPU, one GPU, multi-GPU DDP and several nodes; the accelerate config
chooses. `python finetune/mnli.py` and `torchrun finetune/mnli.py` work too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file: import this checkout's package, and keep finetune/ itself off sys.path.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import torch
from accelerate.utils import set_seed
from transformers import get_scheduler

from finetune.checkpoint import (
    TrainState,
    check_output_dir,
    export_model,
    load_checkpoint,
    model_signature,
    resolve_resume,
)
from finetune.config import ConfigError, TrainConfig, parse_config, to_dict
from finetune.data import LABEL_NAMES, build_dataloaders, load_splits, tokenize_splits
from finetune.loop import Run, evaluate_splits, load_metric, train
from finetune.modeling import build_optimizer, load_model_and_tokenizer
from finetune.runtime import (
    StopSignals,
    TrainingFailed,
    TrainingInterrupted,
    build_accelerator,
    describe_runtime,
    replicas_identical,
    run_summary,
)
from finetune.steps import plan_steps
from finetune.tracking import MetricsLog, start_trackers, trackers_for, wandb_offline_notice


def cli(argv: list[str] | None = None, build=None) -> int:
    """The command line: a mistake or failure the user can act on is one line on stderr."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        main(argv, build or setup)
    except (ConfigError, TrainingFailed) as error:
        if "--debug" in argv and "false" not in argv[argv.index("--debug") + 1 :][:1]:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except TrainingInterrupted as stopped:
        return stopped.exit_code  # the main process already said where the checkpoint is
    return 0


def main(argv: list[str] | None = None, build=None) -> dict:
    run = (build or setup)(parse_config(argv))
    try:
        results = execute(run)
    except TrainingInterrupted as stopped:
        if run.accelerator.is_main_process:
            # Before close(): a launcher may kill this rank once a peer has exited.
            print(stopped, file=sys.stderr, flush=True)
        close(run)  # every rank stopped at the same step, so they can leave together
        raise
    close(run)
    return results


def setup(config: TrainConfig) -> Run:
    """Accelerator, data, model, optimizer, schedule, trackers; resumed state if asked for."""
    output_dir = Path(config.output_dir)
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    check_output_dir(output_dir, config.overwrite_output_dir, resuming=resume is not None)
    trackers = trackers_for(config.report_to)
    wandb_notice = wandb_offline_notice(trackers)
    accelerator = build_accelerator(config, trackers)
    world_size = accelerator.num_processes
    set_seed(config.seed)

    splits = load_splits(config)
    measured = [f"eval_{name.removeprefix('validation_')}_accuracy" for name in splits if name != "train"]
    if config.metric_for_best_model not in measured:
        raise ConfigError(
            f"--metric_for_best_model {config.metric_for_best_model}: this run measures {', '.join(measured)}"
        )
    model, tokenizer = load_model_and_tokenizer(config.model_name_or_path, LABEL_NAMES, config.max_length)
    signature = model_signature(config.model_name_or_path, model)
    tokenized = tokenize_splits(splits, tokenizer, config.max_length, accelerator)
    train_loader, eval_loaders = build_dataloaders(
        tokenized, tokenizer, config, world_size, on_gpu=accelerator.device.type == "cuda"
    )
    plan = plan_steps(
        len(tokenized["train"]),
        config.per_device_train_batch_size,
        config.gradient_accumulation_steps,
        world_size,
        config.num_train_epochs,
        config.max_train_steps,
        config.warmup_ratio,
    )
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, plan.warmup_updates, plan.total_updates)
    model, optimizer, train_loader, scheduler, *prepared = accelerator.prepare(
        model, optimizer, train_loader, scheduler, *eval_loaders.values()
    )
    eval_loaders = dict(zip(eval_loaders, prepared, strict=True))
    state = load_checkpoint(accelerator, resume, world_size, signature) if resume else TrainState()
    state.model_signature = signature

    resolved = {**to_dict(config), **describe_runtime(accelerator), "plan": vars(plan)}
    state.tracker_run_id = start_trackers(
        accelerator, config.project_name, resolved, output_dir, state.tracker_run_id
    )
    log = None
    if accelerator.is_main_process:
        (output_dir / "train_config.json").write_text(json.dumps(resolved, indent=2))
        log = MetricsLog(accelerator, config.output_dir, resumed_step=state.global_step if resume else None)
        if wandb_notice:
            print(wandb_notice)
        print(run_summary(accelerator, config, plan, resume, state.global_step))
    return Run(
        config,
        accelerator,
        model,
        tokenizer,
        optimizer,
        scheduler,
        train_loader,
        eval_loaders,
        plan,
        state,
        log,
    )


def execute(run: Run) -> dict:
    """Train (unless --do_train false) and evaluate; export the model; write results.json."""
    accelerator, config, state = run.accelerator, run.config, run.state
    output_dir = Path(config.output_dir)
    if config.do_train:
        stop = StopSignals()
        try:
            last_eval, runtime_s, eval_runtime_s = train(run, stop)
        except torch.OutOfMemoryError:
            raise TrainingFailed(
                f"out of memory at step {state.global_step + 1} with --per_device_train_batch_size "
                f"{config.per_device_train_batch_size}: halve it and double --gradient_accumulation_steps "
                f"to keep the global batch of {run.plan.global_batch_size}"
            ) from None
        finally:
            stop.restore()
        export_model(accelerator, run.model, run.tokenizer, config.output_dir)
        results = {
            **last_eval,
            "global_step": state.global_step,
            "epoch": last_eval.get("epoch", state.epoch),
            "train_runtime_s": runtime_s,
            "train_samples": state.samples_seen,
            "train_samples_per_second": state.samples_seen / runtime_s,
            "train_tokens_per_second": state.tokens_seen / runtime_s,
            "eval_runtime_s": eval_runtime_s,
            "best_metric": state.best_metric,
            "best_step": state.best_step,
        }
    else:
        results = evaluate_splits(
            accelerator, run.model, run.eval_loaders, load_metric("accuracy", accelerator)
        )
    results.update(describe_runtime(accelerator))
    # Collective: DDP keeps replicas equal by construction; this proves it for this run.
    results["replicas_identical"] = replicas_identical(accelerator, run.model)
    if accelerator.is_main_process:
        (output_dir / "results.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        print(f"model, tokenizer, results.json, metrics.jsonl, train_config.json: {output_dir.resolve()}")
    return results


def close(run: Run) -> None:
    """Collective: finish the trackers and leave the process group, every rank together."""
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    # DDP's reducer holds the process group: destroyed after the group, it deadlocks in
    # ~ProcessGroupGloo. So the model and every reference to it go first.
    run.model = run.optimizer = run.scheduler = run.train_loader = None
    run.eval_loaders = {}
    accelerator.free_memory()
    accelerator.end_training()


if __name__ == "__main__":
    sys.exit(cli())
