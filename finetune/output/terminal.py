"""What a run prints: quiet libraries, its start line, and a closing summary; the files hold the rest
(results.json, metrics.jsonl, train_config.json). `--debug` keeps the libraries' own chatter."""

from __future__ import annotations

import logging
import warnings

import torch

from finetune.config.families import reads
from finetune.config.train_config import TrainConfig
from finetune.data.tasks import Task, eval_key
from finetune.distributed.fsdp import describe_fsdp
from finetune.speed.hardware import cpu_class


def quiet_libraries() -> None:
    """No progress bars for datasets' file reads and maps or transformers' weight loads and saves, and no
    load reports (a new head's missing weights are this toolkit's to explain): the training bar and a
    download's stay. Process-wide, as the libraries keep it: a later --debug run in the same process
    stays quiet."""
    import datasets
    import huggingface_hub.utils
    import transformers

    datasets.disable_progress_bars()
    # Accelerate's "Removed shared tensor {'lm_head.weight'} while saving" at each checkpoint of a model
    # with tied embeddings (SmolLM2, GPT-2): safetensors keeps one of two tied tensors, and loading ties
    # them again (resume is tested bitwise).
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    # datasets' "Failed to load JSON from file ..." before the one line that names the bad line and its fix
    # (data/sources.py load_data_file).
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    transformers.utils.logging.set_verbosity_error()
    # --load_in_8bit: "MatMul8bitLt: inputs will be cast from torch.float32 to float16" at every forward;
    # LLM.int8() rounds activations by design (docs/qlora.md says what that does to the metrics).
    logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
    # peft reads transformers' deprecated `is_gradient_checkpointing` as it wraps every causal LM.
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    # peft, saving a LoRA adapter whose base folder holds no config.json (a GGUF file's: the adapter's card
    # says how to load it), guesses that the vocabulary was not resized, mid progress bar. It is right:
    # --gguf_file is causal_lm's, which refuses a tokenizer without EOS, so no pad token was added.
    warnings.filterwarnings("ignore", message="Could not find a config file in ", category=UserWarning)
    transformers.utils.logging.disable_progress_bar()
    # ... which also silences huggingface_hub's: a first download of a model shows its progress again.
    huggingface_hub.utils.enable_progress_bars()


def run_summary(accelerator, config: TrainConfig, plan, resume, global_step: int) -> str:
    """One line, printed once by the main process: what this job really got, every speed path named;
    then, on a line of its own, a resumed run's checkpoint and step."""
    # torch's intra-op threads (speed/threads.py): on cores other jobs share, they decide the speed.
    cpu = (
        f"cpu_class={cpu_class()} torch_threads={torch.get_num_threads()} "
        if accelerator.device.type == "cpu"
        else ""
    )
    job = (
        f"world_size={accelerator.num_processes} device={accelerator.device} "
        f"{describe_fsdp(accelerator)}{cpu}"
        f"mixed_precision={accelerator.mixed_precision} "
    )
    weights = f"torch_dtype={config.torch_dtype} attn_implementation={config.attn_implementation}"
    if not config.do_train:
        return _evaluation_line(job, config, weights)
    line = job + (
        f"per_device_batch={config.per_device_train_batch_size} global_batch={plan.global_batch_size} "
        f"steps={plan.total_updates} "
        f"(warmup {plan.warmup_updates}, {plan.updates_per_epoch}/epoch) "
        f"dropout_kernel={config.dropout_kernel} padding_free={config.padding_free} "
        f"keep_freed_memory={config.keep_freed_memory} torch_compile={str(config.torch_compile).lower()} "
        f"cuda_graphs={config.cuda_graphs} "
        f"{f'chunked_loss={config.chunked_loss} ' if reads(config, 'chunked_loss') else ''}"
        f"{f'prefix_sharing={config.prefix_sharing} ' if reads(config, 'prefix_sharing') else ''}"
        f"pad_to_multiple_of={config.pad_to_multiple_of} "
        f"group_by_length={str(config.group_by_length).lower()} fused_adamw=true "
        f"{weights} gradient_checkpointing={str(config.gradient_checkpointing).lower()}"
    )
    if config.eval_strategy == "no":  # what the exported model is, when nothing judges it
        unjudged = config.uses_local_files and not (config.validation_file or config.carves_validation)
        why = "no validation rows given, so " if unjudged else ""
        line += f" eval_strategy=no ({why}nothing is evaluated; the last step's model is exported)"
    resumed = f"resuming from {resume} at step {global_step}" if resume else None  # a line of its own
    return "\n".join(filter(None, [line, resumed]))


def _evaluation_line(job: str, config: TrainConfig, weights: str) -> str:
    return job + (
        f"evaluation only: per_device_eval_batch={config.per_device_eval_batch_size} "
        f"padding_free={config.padding_free} pad_to_multiple_of={config.pad_to_multiple_of} "
        f"torch_compile={str(config.torch_compile).lower()} {weights}"
    )


def results_summary(results: dict, task: Task) -> str:
    """The closing lines: the task's headline metrics (per class, the confusion matrix and the family's
    other keys are in results.json), then which model was exported and how fast it trained."""
    splits = task.validation_splits
    keys = [*task.metric_keys(per_class=False), *(eval_key(s, "loss") for s in splits)]
    shown = [f"{k} {results[k]:.4f}" for k in dict.fromkeys(keys) if isinstance(results.get(k), float)]
    rows = [results[k] for k in (eval_key(s, "samples") for s in splits) if k in results]
    lines = [f"results: {', '.join(shown)}" + (f" on {' + '.join(map(str, rows))} rows" if rows else "")]
    lines = lines if shown else []  # nothing evaluated (no validation rows): no empty results line
    if "global_step" in results:
        best = results.get("metric_for_best_model")
        exported = results.get("exported_model_step", results["global_step"])
        which = f" (best {best})" if best and exported == results.get("best_step") else ""
        lines.append(
            f"exported the model of step {exported}{which}; {results['global_step']} steps in "
            f"{results['train_runtime_s']:.1f} s, {results['train_samples_per_second']:.1f} samples/s"
        )
    return "\n".join(lines)
