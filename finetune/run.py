"""One run, start to end: `setup` (accelerator, data, model, optimizer, resumed state), `execute`
(train, evaluate, predict, export, results.json), `close`. `run_config` ties them together."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate.utils import set_seed

from finetune.config.identity import run_identity
from finetune.config.output_args import resolve_logging_steps
from finetune.config.resolved import Resolved, eval_batch_size
from finetune.config.train_config import TrainConfig, to_dict
from finetune.distributed.accelerator import build_accelerator, describe_runtime
from finetune.distributed.fsdp import fit_block_class, shard_record, watch_gradient_shards
from finetune.distributed.launch_env import launcher_rank, launcher_world_size, processes_asked_of_accelerate
from finetune.distributed.ranks import check_launched_all, replicas_identical
from finetune.distributed.signals import StopSignals, only_noted
from finetune.errors import Stopped, StoppedAfterFinish, TrainingFailed, TrainingInterrupted
from finetune.families import family_for
from finetune.hub import check_model_source, check_push
from finetune.model.flops import flops_per_token
from finetune.model.lora import describe_parameters, parameter_counts
from finetune.model.optimizer import build_optimizer
from finetune.model.options import loading_options
from finetune.model.quantization import describe_quantization, quantization_options
from finetune.output.card import changed_flags
from finetune.output.export import export_model
from finetune.output.lock import holds_lock, release_lock, take_lock
from finetune.output.prerun import (
    check_output_dir,
    finished_run,
    folders_to_create,
    remove_earlier_run,
    remove_failed_start,
)
from finetune.output.record import write_run_record
from finetune.output.terminal import quiet_libraries, run_summary
from finetune.output.tracking import (
    MetricsLog,
    auto_trackers_notice,
    resolve_report_to,
    start_trackers,
    trackers_for,
    wandb_offline_notice,
)
from finetune.output.writing import writing
from finetune.speed.compile import compile_cache_line, compile_counts
from finetune.speed.cuda_graphs import cuda_graphs_for
from finetune.speed.hardware import bf16_is_fast
from finetune.speed.startup import enable_full_determinism, get_scheduler  # without peft's import
from finetune.speed.threads import apply_threads, threads_notice
from finetune.training.best import as_exported, evaluate_as_exported, training_outcome, use_best_model
from finetune.training.checkpoint import TrainState, load_checkpoint, resolve_resume
from finetune.training.loop import Run, train
from finetune.training.meter import model_flops_utilization
from finetune.training.steps import plan_steps


def run_config(args: TrainConfig, build=None, keep_process_group: bool = False) -> dict:
    """Collective: the run `args` describes, `setup` to `close`; its results (a finished run's, read
    back, when relaunched after the end). A failed start or run gives the output folder back.
    `keep_process_group`: another run follows in this process (a study), on the same process group."""
    identity = run_identity(args, launcher_world_size())  # what makes it the same run; read once
    finished = finished_run(args, identity)
    if finished is not None:  # relaunched after the end: nothing trains, nothing of the run changes
        return predict_with_finished(args, finished, build) if args.do_predict else finished
    created = folders_to_create(args.output_dir)
    try:
        run = (build or setup)(args, identity)
    except BaseException:  # a failed start: the folder as it was found, and free for the next one
        if holds_lock(args.output_dir):  # never another start's folder, refused by its lock
            remove_failed_start(args.output_dir, created)
        release_lock(args.output_dir)
        raise
    try:
        results = execute(run)
    except TrainingInterrupted as stopped:
        if run.accelerator.is_main_process:
            # Before close(): a launcher may kill this rank once a peer has exited.
            print(stopped, file=sys.stderr, flush=True)
        close(run)  # every rank stopped at the same step, so they can leave together
        raise
    except BaseException:
        release_lock(args.output_dir)  # a failed run leaves the folder, with its record, to the next one
        raise
    with only_noted() as noted:  # the run is complete: a stop signal does not cut its closing short
        close(run, keep_process_group)
    if noted:
        raise StoppedAfterFinish(noted[0])
    return results


def predict_with_finished(args: TrainConfig, finished: dict, build=None) -> dict:
    """Collective: --do_predict on a finished run (relaunched with --resume_from_checkpoint auto): its
    exported model predicts --test_file, as an evaluate-only run in a scratch folder inside the run's;
    rank 0 then moves predictions.jsonl beside the model and adds predict_samples to results.json."""
    output_dir = Path(args.output_dir)
    scratch = output_dir / ".predicting"
    predicting = dataclasses.replace(
        args,
        model_name_or_path=str(output_dir),
        output_dir=str(scratch),
        do_train=False,
        resume_from_checkpoint=None,
        overwrite_output_dir=True,
        use_peft=False,  # the root holds the merged model, dequantised
        load_in_4bit=False,
        load_in_8bit=False,
        bnb_4bit_quant_type="nf4",
        use_bnb_nested_quant=False,
        early_stopping_patience=None,
        validation_split_percentage=None,  # no training rows to carve from
        report_to="none",
        save_plots=False,  # its charts are not kept
        push_to_hub=False,
        **family_for(args.task_type).done_in_export,  # what the family's finish did to the model
    )
    late = None
    try:
        predicted = run_config(predicting, build)
    except StoppedAfterFinish as stopped:  # the predictions are written: moved below, then it goes on
        late, predicted = stopped, None
    if launcher_rank() == 0:
        predicted = predicted or json.loads((scratch / "results.json").read_text())  # rank 0 wrote it
        with writing("predictions.jsonl", output_dir):
            os.replace(scratch / "predictions.jsonl", output_dir / "predictions.jsonl")
            finished = {**finished, "predict_samples": predicted["predict_samples"]}
            (output_dir / "results.json").write_text(json.dumps(finished, indent=2))
        shutil.rmtree(scratch, ignore_errors=True)
        rows = predicted["predict_samples"]
        print(f"predictions.jsonl ({rows} rows, by the finished run's model): {output_dir.resolve()}")
    if late is not None:
        raise late
    return finished


def setup(args: TrainConfig, identity: dict | None = None) -> Run:
    """Collective: Accelerator, data, model, optimizer, schedule, trackers; resumed state if asked for.
    Resolves every choice `args` leaves to the run (`Resolved`), once. `identity`: run_config's, or
    (scripts that call setup alone) this launch's."""
    started_s = time.perf_counter()
    identity = identity or run_identity(args, launcher_world_size())
    # Before the folder is made: a launch that started fewer processes than asked never trains.
    check_launched_all(processes_asked_of_accelerate(), launcher_world_size(), torch.cuda.is_available())
    output_dir = Path(args.output_dir)
    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir)
    check_output_dir(args, resume is not None, identity)
    take_lock(output_dir)  # rank 0: one run per output folder, until close() (or run_config's failure)
    if not args.debug:
        quiet_libraries()
    trackers = trackers_for(args.report_to)
    report_to = resolve_report_to(args.report_to)
    tracker_notice = wandb_offline_notice(trackers) or auto_trackers_notice(args.report_to)
    if args.full_determinism:  # before the accelerator creates CUDA's handles: cuBLAS reads its variable once
        enable_full_determinism(args.seed)
    accelerator = build_accelerator(args, trackers)
    # torch's threads from the cores other jobs leave free (speed/threads.py), before the model's first op
    threads_line = threads_notice(apply_threads()) if accelerator.device.type == "cpu" else None
    world_size = accelerator.num_processes
    set_seed(args.seed)
    bf16_native = bf16_is_fast()
    loading = loading_options(args, accelerator.device.type, bf16_native)  # refusals before the data
    loading.update(quantization_options(args, accelerator))  # --load_in_4bit / 8bit
    check_model_source(args.model_name_or_path, args.model_revision, args.gguf_file, args.task_type)
    check_push(args.push_to_hub)
    family = family_for(args.task_type)  # what the run learns: its data, model head, loss and metrics
    # "true"/"false"; --cuda_graphs true refused here
    cuda_graphs = cuda_graphs_for(args, accelerator) if family.captures_cuda_graphs else "false"

    task, splits = family.load(args)
    metric = family.choose_metric(args, task, splits)  # before the model loads
    family.check(args, task, splits)
    model, tokenizer, backbone, speed = family.build_model(
        args, task, accelerator, loading, bf16_native, cuda_graphs
    )
    parameters = parameter_counts(model)  # before prepare: FSDP shards them
    on_gpu = accelerator.device.type == "cuda"
    tokenized = family.tokenize(task, splits, tokenizer, args, accelerator)  # collective
    batch = {k: getattr(args, k) for k in ("per_device_train_batch_size", "gradient_accumulation_steps")}
    batch_notice = None
    if args.auto_find_batch_size and args.do_train:  # collective; sets the batch before the loaders
        batch, batch_notice = family.fit_batch_size(args, model, tokenized["train"], tokenizer, accelerator)
    eval_batch = eval_batch_size(args, accelerator.device.type)
    train_rows = len(tokenized["train"]) if args.do_train else 0  # no training: a plan of zero updates
    plan = plan_steps(
        train_rows,
        batch["per_device_train_batch_size"],
        batch["gradient_accumulation_steps"],
        world_size,
        args.num_train_epochs,
        args.max_train_steps if args.do_train else None,
        args.warmup_ratio,
        args.warmup_steps,
    )
    resolved = Resolved(
        **metric,
        **speed,
        **batch,
        per_device_eval_batch_size=eval_batch,
        cuda_graphs=cuda_graphs,
        report_to=report_to,
        logging_steps=resolve_logging_steps(args.logging_steps, plan.total_updates),
    )
    config = args.with_resolved(resolved)  # what the run trains with, from here on
    loaders = family.dataloaders(tokenized, tokenizer, config, world_size, on_gpu, model)
    betas = (config.adam_beta1, config.adam_beta2)
    optimizer = build_optimizer(model, config.learning_rate, config.weight_decay, betas, config.adam_epsilon)
    scheduler = get_scheduler(config.lr_scheduler_type, optimizer, plan.warmup_updates, plan.total_updates)
    wrap_notice = fit_block_class(accelerator, model)  # FSDP's unit: the model's own block class
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.is_fsdp2:
        watch_gradient_shards(optimizer)  # for results.json's fsdp_shards
    # A family's step after prepare (DPO: its frozen reference placed, cast and sharded as the model).
    after_prepare = getattr(family, "after_prepare", None)
    if after_prepare is not None:
        after_prepare(accelerator, model)  # collective under FSDP
    counted = getattr(family, "flops_per_token", flops_per_token)  # DPO adds its reference's forward
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
        **family.record_extras(task),  # the family's own keys
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
        if tracker_notice:
            print(tracker_notice)
        if batch_notice:
            print(batch_notice)
        if wrap_notice:
            print(wrap_notice)
        if threads_line:
            print(threads_line)
        print(run_summary(accelerator, config, plan, resume, state.global_step))
        print(describe_parameters(parameters))
        print(task.summary())
    return Run(
        config=config,
        family=family,
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
        flops_per_token=counted(accelerator.unwrap_model(model), config.use_peft),
        given_flags=changed_flags(args),
        graphs=family.step_graphs(args, config, accelerator, model, task),  # --cuda_graphs, or None
    )


def execute(run: Run) -> dict:
    """Collective: train (unless --do_train false), evaluate, predict (--do_predict); export the model,
    its card and curves; write results.json."""
    accelerator, config, state, task = run.accelerator, run.config, run.state, run.task
    results = {}
    if config.do_train:
        stop = StopSignals()
        try:
            compiled_before = compile_counts()  # torch counts per process, never reset
            runtime_s, eval_runtime_s = train(run, stop)
            if run.graphs is not None:  # their pool and fixed gradients go before the best model is evaluated
                run.graphs = None
                run.optimizer.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError:
            raise TrainingFailed(
                f"out of memory at step {state.global_step + 1} with --per_device_train_batch_size "
                f"{config.per_device_train_batch_size}: halve it and double --gradient_accumulation_steps "
                f"to keep the global batch of {run.plan.global_batch_size}"
            ) from None
        finally:
            stop.restore()
        if stop.received:  # after training's last check: stopped before the export, its checkpoint kept
            raise Stopped(stop.received)
        exported = use_best_model(run)  # collective: the evaluation of the model exported below
        finished = run.family.finish(run)  # collective; its eval_* keys are the finished export's
        if not finished:  # collective: as the export computes (no autocast), where evaluations differ
            exported = as_exported(run, exported)
        export_model(accelerator, run.model, run.tokenizer, config.output_dir, config.gguf_file)
        if config.torch_compile and accelerator.is_main_process:
            print(compile_cache_line(compiled_before))  # whether this run reused earlier compiled code
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
            "metric_for_best_model": config.metric_for_best_model,
            "greater_is_better": config.greater_is_better,
            "best_metric": state.best_metric,
            "best_step": state.best_step,
            **training_outcome(run, exported),
            # Last: the family's finish: its eval_* keys, the exported model's, replace training's.
            **finished,
        }
    elif run.eval_loaders:
        results = evaluate_as_exported(run, run.eval_loaders)  # collective: the given model's own figures
        if accelerator.is_main_process:  # the evaluation's line, as a training run logs each one
            run.log.log({"step": 0, **{k: v for k, v in results.items() if not isinstance(v, dict)}})
    predictions = None
    if run.test_loader is not None:
        predictions = run.family.predict(accelerator, run.model, run.test_loader, task, run.rows["test"])
        results["predict_samples"] = len(predictions)
    results["task"] = task.summary()  # the rows as read: kept, truncated, dropped (no target), and notes
    results.update(describe_runtime(accelerator))
    results.update(parameter_counts(accelerator.unwrap_model(run.model)))
    if describe_quantization(config):  # the metrics are the exported (dequantised) model's
        results["base_quantization"] = describe_quantization(config)
    # Collective: DDP keeps replicas equal by construction; this proves it for this run.
    results["replicas_identical"] = replicas_identical(accelerator, run.model)
    if (shards := shard_record(accelerator, run.model, run.optimizer)) is not None:  # collective
        results["fsdp_shards"] = shards
    write_run_record(run, results, predictions)  # rank 0's files; results.json last
    return results


def close(run: Run, keep_process_group: bool = False) -> None:
    """Collective: finish the trackers and leave the process group, every rank together (unless another
    run of a study follows: a process group cannot be made again on the launcher's rendezvous)."""
    accelerator = run.accelerator
    accelerator.wait_for_everyone()
    # DDP's reducer holds the process group: destroyed after the group, it deadlocks in
    # ~ProcessGroupGloo. So the model and every reference to it go first.
    run.model = run.optimizer = run.scheduler = run.train_loader = None
    run.eval_loaders = {}
    accelerator.free_memory()
    if keep_process_group:
        for tracker in accelerator.trackers:
            tracker.finish()
    else:
        accelerator.end_training()  # the trackers, then the process group
    release_lock(run.config.output_dir)
