"""Fine-tune a BERT-style model on MNLI: `accelerate launch finetune/mnli.py [--flags]`.

The same script runs on CPU, one GPU, multi-GPU DDP and several nodes; the accelerate config
chooses. `python finetune/mnli.py` and `torchrun finetune/mnli.py` work too. `--task_name` picks
another GLUE task or your own files (`finetune/glue.py` is the same run under a general name).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    # Run as a file: import this checkout's package, and keep finetune/ itself off sys.path.
    sys.path[0] = str(Path(__file__).resolve().parents[1])
if __name__ == "__main__":
    from finetune.interrupt import quiet_ctrl_c_while_starting

    quiet_ctrl_c_while_starting()  # before the seconds of imports below

import torch
from accelerate.utils import set_seed
from transformers import get_scheduler

from finetune.attention import use_sync_free_masks, use_varlen_attention, varlen_position_offset
from finetune.checkpoint import (
    BEST_MODEL_DIR,
    TrainState,
    best_model_step,
    export_model,
    load_best_model,
    load_checkpoint,
    resolve_resume,
    writing,
)
from finetune.compile import compile_cache_line
from finetune.config import ConfigError, TrainConfig, parse_config, to_dict
from finetune.data import build_dataloaders, load_splits, resolve_pad_to_multiple_of, tokenize_splits
from finetune.evaluation import evaluate_splits, load_metric, predict
from finetune.identity import run_identity
from finetune.kernels import resolve_dropout_kernel, use_packed_dropout
from finetune.loading import (
    classifies_from_last_token,
    fit_tokenizer_to_model,
    loading_options,
    prepare_decoder,
    refuse_checkpoint_dtype,
)
from finetune.lock import release_lock, take_lock
from finetune.loop import Run, model_flops_utilization, stopped_early, train
from finetune.lora import describe_parameters, parameter_counts, training_flops_per_token, wrap_with_lora
from finetune.memory import enable_gradient_checkpointing, fit_batch_size
from finetune.modeling import build_optimizer, load_model_and_tokenizer, non_embedding_parameters
from finetune.outputs import check_output_dir, finished_run, remove_earlier_run
from finetune.padding_free import resolve_padding_free, use_padding_free
from finetune.report import (
    CONFUSION_FILE,
    CURVES_FILE,
    changed_flags,
    hardware,
    is_model_card,
    plot_confusion_matrix,
    plot_training_curves,
    push_to_hub,
    write_model_card,
)
from finetune.resolved import Resolved, choose_metric
from finetune.runtime import (
    StopSignals,
    TrainingFailed,
    TrainingInterrupted,
    bf16_is_fast,
    build_accelerator,
    describe_runtime,
    keep_freed_memory,
    launcher_world_size,
    replicas_identical,
    resolve_keep_freed_memory,
    run_summary,
)
from finetune.steps import plan_steps
from finetune.tracking import MetricsLog, start_trackers, trackers_for, wandb_offline_notice


def cli(argv: list[str] | None = None, build=None) -> int:
    """The command line: a mistake or failure the user can act on is one line on stderr
    (with `--debug`, its traceback)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt again, handled below
    config = None
    try:
        config = parse_config(argv)
        run_config(config, build)
    except (ConfigError, TrainingFailed) as error:
        if config.debug if config is not None else getattr(error, "debug", False):
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1
    except TrainingInterrupted as stopped:
        return stopped.exit_code  # the main process already said where the checkpoint is
    except KeyboardInterrupt:  # Ctrl-C outside training's own handler (loading, evaluating, exporting)
        if config is not None and config.debug:
            raise
        print(
            "error: interrupted by Ctrl-C; the run did not finish (no results.json); its checkpoints, if "
            "any, continue with --resume_from_checkpoint auto",
            file=sys.stderr,
        )
        return 130
    return 0


def main(argv: list[str] | None = None, build=None) -> dict:
    return run_config(parse_config(argv), build)


def run_config(args: TrainConfig, build=None) -> dict:
    """Collective: one launch of the run `args` asks for (every rank calls it)."""
    identity = run_identity(args, launcher_world_size())  # what makes it the same run; read once
    finished = finished_run(args, identity)
    if finished is not None:
        return finished  # relaunched after the end: nothing to do, nothing changed
    try:
        run = (build or setup)(args, identity)
        results = execute(run)
    except TrainingInterrupted as stopped:
        if run.accelerator.is_main_process:
            # Before close(): a launcher may kill this rank once a peer has exited.
            print(stopped, file=sys.stderr, flush=True)
        close(run)  # every rank stopped at the same step, so they can leave together
        raise
    except BaseException:
        release_lock(args.output_dir)  # a failed start or run leaves the folder to the next one
        raise
    close(run)
    return results


def setup(args: TrainConfig, identity: dict | None = None) -> Run:
    """Collective: Accelerator, data, model, optimizer, schedule, trackers; resumed state if asked for.
    Resolves every choice `args` leaves to the run (`Resolved`), once. `identity`: run_config's, or
    (scripts that call setup alone) this launch's."""
    started_s = time.perf_counter()
    identity = identity or run_identity(args, launcher_world_size())
    output_dir = Path(args.output_dir)
    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir)
    check_output_dir(args, resume is not None, identity)
    take_lock(output_dir)  # rank 0: one run per output folder, until close() (or run_config's failure)
    trackers = trackers_for(args.report_to)
    wandb_notice = wandb_offline_notice(trackers)
    accelerator = build_accelerator(args, trackers)
    world_size = accelerator.num_processes
    set_seed(args.seed)
    bf16_native = bf16_is_fast()
    loading = loading_options(args, accelerator.device.type, bf16_native)  # refusals before the data

    task, splits = load_splits(args)
    metric = choose_metric(args, task, splits)  # before the model loads
    model, tokenizer, backbone, speed = build_model(args, task, accelerator, loading, bf16_native)
    parameters = parameter_counts(model)  # before prepare: FSDP shards them
    on_gpu = accelerator.device.type == "cuda"
    tokenized = tokenize_splits(task, splits, tokenizer, args.max_length, accelerator)
    batch = {k: getattr(args, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps")}
    batch_notice = None
    if args.auto_find_batch_size and args.do_train:  # collective; sets the batch before the loaders
        batch, batch_notice = fit_batch_size(args, model, tokenized["train"], tokenizer, accelerator)
    resolved = Resolved(**metric, **speed, **batch)
    config = args.with_resolved(resolved)  # what the run trains with, from here on
    loaders = build_dataloaders(
        tokenized, tokenizer, config, world_size, on_gpu, position_offset=varlen_position_offset(model)
    )
    train_rows = len(tokenized["train"]) if config.do_train else 0  # no training: a plan of zero updates
    plan = plan_steps(
        train_rows,
        config.per_device_train_batch_size,
        config.gradient_accumulation_steps,
        world_size,
        config.num_train_epochs,
        config.max_train_steps if config.do_train else None,
        config.warmup_ratio,
        config.warmup_steps,
    )
    betas = (config.adam_beta1, config.adam_beta2)
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay, betas, config.adam_epsilon)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, plan.warmup_updates, plan.total_updates)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loaders = {name: accelerator.prepare(loader) for name, loader in loaders.items()}
    train_loader, test_loader = loaders.pop("train", None), loaders.pop("test", None)
    state = load_checkpoint(accelerator, resume, identity) if resume else TrainState()
    state.identity = identity

    if config.overwrite_output_dir and resume is None:
        # Rank 0, once every flag, file and model has loaded: a refused start keeps the earlier run.
        remove_earlier_run(output_dir)
    # The top level is the configuration the run trains with (flags, each auto resolved), as before;
    # `args` the flags as given, `resolved` the choices, `identity` what makes it the same run.
    record = {
        **to_dict(config),
        **describe_runtime(accelerator),
        "plan": vars(plan),
        "backbone": backbone,
        "args": to_dict(args),
        "resolved": to_dict(resolved),
        "identity": identity,
    }
    state.tracker_run_id = start_trackers(
        accelerator, config.project_name, record, output_dir, state.tracker_run_id, config.run_name
    )
    log = None
    if accelerator.is_main_process:
        with writing("train_config.json", output_dir):
            (output_dir / "train_config.json").write_text(json.dumps(record, indent=2))
        log = MetricsLog(accelerator, config.output_dir, resumed_step=state.global_step if resume else None)
        if wandb_notice:
            print(wandb_notice)
        if batch_notice:
            print(batch_notice)
        print(run_summary(accelerator, config, plan, resume, state.global_step))
        print(describe_parameters(parameters))
        print(task.summary())
    return Run(
        config=config,
        task=task,
        accelerator=accelerator,
        model=model,
        tokenizer=tokenizer,
        optimizer=optimizer,
        scheduler=scheduler,
        train_loader=train_loader,
        eval_loaders=loaders,
        test_loader=test_loader,
        plan=plan,
        state=state,
        log=log,
        rows={name: len(split) for name, split in splits.items()},
        started_s=started_s,
        flops_per_token=flops_per_token(accelerator.unwrap_model(model), config.use_peft),
        given_flags=changed_flags(args),
    )


def build_model(args: TrainConfig, task, accelerator, loading: dict, bf16_native: bool):
    """The model and tokenizer, fitted to each other, with this machine's speed paths and the memory
    and LoRA settings. Returns (model, tokenizer, the `backbone` record of train_config.json, the speed
    choices for `Resolved`)."""
    model, tokenizer = load_model_and_tokenizer(args.model_name_or_path, task, args.max_length, loading)
    refuse_checkpoint_dtype(model, args, accelerator.device.type, bf16_native)
    backbone = backbone_summary(model, fit_tokenizer_to_model(model, tokenizer))
    backbone.update(prepare_decoder(model))  # decoders: positions that ignore left padding, no cache
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    device_type = accelerator.device.type
    # Each choice as it is made, in this order: padding-free wraps the attention packed dropout chose.
    speed = {"attn_implementation": model.config._attn_implementation}  # transformers' choice
    # torch for architectures packed dropout can't take
    speed["dropout_kernel"] = resolve_dropout_kernel(args.dropout_kernel, device_type, model)
    if speed["dropout_kernel"] == "packed":
        use_packed_dropout(model)
    speed["padding_free"] = resolve_padding_free(args, model, device_type)  # "true"/"false"/"varlen"
    if speed["padding_free"] == "true":
        use_padding_free(model)
    speed["pad_to_multiple_of"] = resolve_pad_to_multiple_of(args.pad_to_multiple_of, device_type == "cuda")
    if speed["padding_free"] == "varlen":
        use_varlen_attention(model)
    elif speed["padding_free"] == "false" and args.pad_to_multiple_of not in ("auto", "1"):
        use_sync_free_masks(model)  # bucketed as asked (auto stays as measured); see finetune/attention.py
    speed["keep_freed_memory"] = resolve_keep_freed_memory(  # "true"/"false"
        args.keep_freed_memory, device_type, accelerator.mixed_precision
    )
    if speed["keep_freed_memory"] == "true":
        keep_freed_memory()
    if args.use_peft:  # after the kernels patch the model's own modules; before the optimizer
        model = wrap_with_lora(model, args)
    return model, tokenizer, backbone, speed


def flops_per_token(model, use_peft: bool) -> int:
    """Training FLOPs of one real token, for MFU: 6 x non-embedding parameters; LoRA's own count."""
    non_embedding = non_embedding_parameters(model)
    return training_flops_per_token(model, non_embedding) if use_peft else 6 * non_embedding


def backbone_summary(model, tokenizer_changes: list[str]) -> dict:
    """What train_config.json says about the architecture and what was adapted to train it."""
    return {
        "model_type": model.config.model_type,
        "classifier_reads": "last non-pad token" if classifies_from_last_token(model) else "encoder output",
        "dtype": str(model.dtype).removeprefix("torch."),
        "tokenizer_changes": tokenizer_changes,
    }


def execute(run: Run) -> dict:
    """Train (unless --do_train false), evaluate, predict (--do_predict); export the model, its
    card and curves; write results.json."""
    accelerator, config, state, task = run.accelerator, run.config, run.state, run.task
    output_dir = Path(config.output_dir)
    results = {}
    if config.do_train:
        stop = StopSignals()
        try:
            runtime_s, eval_runtime_s = train(run, stop)
        except torch.OutOfMemoryError:
            raise TrainingFailed(
                f"out of memory at step {state.global_step + 1} with --per_device_train_batch_size "
                f"{config.per_device_train_batch_size}: halve it and double --gradient_accumulation_steps "
                f"to keep the global batch of {run.plan.global_batch_size}"
            ) from None
        finally:
            stop.restore()
        exported = use_best_model(run)  # collective: the evaluation of the model exported below
        export_model(accelerator, run.model, run.tokenizer, config.output_dir)
        if config.torch_compile and accelerator.is_main_process:
            print(compile_cache_line())  # whether this run reused an earlier run's compiled code
        last_eval = state.last_evaluation or {}
        results = {
            **{k: v for k, v in exported.items() if k not in ("step", "epoch")},
            "global_step": state.global_step,
            "epoch": last_eval.get("epoch", state.epoch),
            # The whole run: seconds summed over its segments (a resumed run adds its checkpoint's).
            "train_runtime_s": runtime_s,
            "train_samples": state.samples_seen,
            "train_samples_per_second": state.samples_seen / runtime_s,
            "train_tokens_per_second": state.tokens_seen / runtime_s,
            **model_flops_utilization(run, state.tokens_seen / runtime_s, "train_mfu"),
            "eval_runtime_s": eval_runtime_s,
            "best_metric": state.best_metric,
            "best_step": state.best_step,
            **training_outcome(run, exported),
        }
    elif run.eval_loaders:
        results = evaluate_splits(
            accelerator, run.model, run.eval_loaders, load_metric(task, accelerator), task
        )
        if accelerator.is_main_process:  # the evaluation's line, as a training run logs each one
            run.log.log({"step": 0, **{k: v for k, v in results.items() if not isinstance(v, dict)}})
    predictions = None
    if run.test_loader is not None:
        predictions = predict(accelerator, run.model, run.test_loader, task, run.rows["test"])
        results["predict_samples"] = len(predictions)
    results.update(describe_runtime(accelerator))
    results.update(parameter_counts(accelerator.unwrap_model(run.model)))
    # Collective: DDP keeps replicas equal by construction; this proves it for this run.
    results["replicas_identical"] = replicas_identical(accelerator, run.model)
    machine = hardware(accelerator)
    if accelerator.is_main_process:
        if predictions is not None:
            with writing("predictions.jsonl", output_dir), (output_dir / "predictions.jsonl").open("w") as f:
                f.writelines(json.dumps(p) + "\n" for p in predictions)
        if config.do_train:
            with writing(CURVES_FILE, output_dir):
                plot_training_curves(
                    output_dir / "metrics.jsonl", output_dir / CURVES_FILE, task.metric_keys(per_class=False)
                )
            wall_s = time.perf_counter() - run.started_s
            card = output_dir / "README.md"
            if card.exists() and not (card.is_file() and is_model_card(card)):  # the user's: kept
                print(f"{card} is not a model card of finetune's: kept as it is, no model card written")
            else:
                with writing("the model card (README.md)", output_dir):
                    write_model_card(card, config, task, results, run.rows, machine, wall_s, run.given_flags)
        with writing(CONFUSION_FILE, output_dir):  # custom single-label tasks only
            plot_confusion_matrix(results, output_dir / CONFUSION_FILE)
        # Last: results.json marks a finished run.
        with writing("results.json", output_dir):
            (output_dir / "results.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        written = ["model, tokenizer, README.md (model card), training_curves.png"] if config.do_train else []
        written += ["predictions.jsonl"] if predictions is not None else []
        logged = config.do_train or bool(run.eval_loaders)
        written.append(
            "results.json, metrics.jsonl, train_config.json" if logged else "results.json, train_config.json"
        )
        print(f"{', '.join(written)}: {output_dir.resolve()}")
        if config.push_to_hub:
            print(f"pushed to {push_to_hub(config.output_dir, config.hub_model_id)}")
    return results


def use_best_model(run: Run) -> dict:
    """Collective: with --load_best_model_at_end, the best weights (best_model/) put back into the model
    for the export, the predictions and the Hub, as Hugging Face Trainer does. Returns the evaluation
    of the model that stays: the best, or the last one."""
    config, state, accelerator = run.config, run.state, run.accelerator
    if not (config.load_best_model_at_end and state.best_evaluation):
        return state.last_evaluation or {}
    if state.best_step != state.global_step:
        if best_model_step(config.output_dir) != state.best_step:  # read by every rank: the same file
            if accelerator.is_main_process:
                print(
                    f"--load_best_model_at_end: {Path(config.output_dir) / BEST_MODEL_DIR} does not hold the "
                    f"best model (step {state.best_step}; was the checkpoint resumed in another folder?): "
                    f"the model exported is the last one, from step {state.global_step}"
                )
            return state.last_evaluation or {}
        load_best_model(accelerator, run.model, config.output_dir)
    if accelerator.is_main_process:
        print(
            f"--load_best_model_at_end: exporting{' and predicting with' if run.test_loader else ''} the "
            f"best model, from step {state.best_step} ({config.metric_for_best_model} "
            f"{state.best_metric:.4f}); the last step was {state.global_step}"
        )
    return state.best_evaluation


def training_outcome(run: Run, exported: dict) -> dict:
    """results.json's account of the evaluations: the best, the last, which one the exported model is,
    and why training ended."""
    config, state = run.config, run.state
    early = stopped_early(config, state)
    return {
        "best_evaluation": state.best_evaluation,
        "last_evaluation": state.last_evaluation,
        "exported_model_step": exported.get("step", state.global_step),
        "stopped_early": early,
        "early_stopping_step": state.global_step if early else None,
    }


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
    release_lock(run.config.output_dir)


if __name__ == "__main__":
    sys.exit(cli())
