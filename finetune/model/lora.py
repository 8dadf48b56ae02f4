"""LoRA through peft (`--use_peft`): wrap the loaded model, count its parameters, export it merged.

The wrapped model trains like any other: the optimizer takes its trainable (adapter and head)
parameters only, DDP all-reduces only their gradients, and accelerate's save_state/load_state keep
the frozen base weights and the adapter together, so checkpoints resume exactly. The exported model
is merged (base + B·A·alpha/r) into a plain transformers model that `pipeline` loads without peft;
the adapter alone goes to `adapter/` for `PeftModel.from_pretrained`.

peft is imported inside the functions: a run without --use_peft never pays for importing it.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from finetune.errors import ConfigError
from finetune.model.quantization import dequantized_state, plain_config, weight_count

ADAPTER_DIR = "adapter"


ALL_LINEAR = "all-linear"


def is_peft_model(model: nn.Module) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def lora_settings(config) -> str:
    """What a resumed run must share with its checkpoint's: "none", or the adapters' shape and scale."""
    if not config.use_peft:
        return "none"
    saved = " ".join(config.lora_modules_to_save or ["(the head)"])
    return (
        f"r {config.lora_r}, alpha {config.lora_alpha}, dropout {config.lora_dropout}, "
        f"targets {' '.join(config.lora_target_modules)}, trained in full {saved}"
    )


def classification_head(model: nn.Module) -> str:
    """The name of the top-level module that maps to the labels: BERT and RoBERTa `classifier`,
    Llama and Qwen `score`, ... found as the top-level child holding a Linear with num_labels outputs
    (the last such child, as heads come after the backbone)."""
    num_labels = model.config.num_labels
    found = [
        name
        for name, child in model.named_children()
        if any(isinstance(m, nn.Linear) and m.out_features == num_labels for m in child.modules())
    ]
    if not found:
        raise ConfigError(
            f"--use_peft: no classification head with {num_labels} outputs at the top of this "
            f"{model.config.model_type} model; name it with --lora_modules_to_save"
        )
    return found[-1]


def wrap_with_lora(model: nn.Module, config, task_type: str = "SEQ_CLS") -> nn.Module:
    """The model with LoRA adapters (peft) on --lora_target_modules and a trainable copy of
    --lora_modules_to_save (default: a classifier's head; nothing for a causal LM, whose head is the
    vocabulary's); every other weight frozen. `task_type`: peft's TaskType name (SEQ_CLS, CAUSAL_LM).
    A name the model lacks, or a model peft cannot wrap, is a one-line ConfigError."""
    from peft import LoraConfig, TaskType, get_peft_model

    targets = config.lora_target_modules
    to_save = config.lora_modules_to_save or (
        [] if task_type == "CAUSAL_LM" else [classification_head(model)]
    )
    if targets != [ALL_LINEAR]:
        _check_names_exist(model, targets, "--lora_target_modules", to_save)
        trained_in_full = [name for name in targets if name in to_save]
        if trained_in_full:
            raise ConfigError(
                f"--lora_target_modules {' '.join(trained_in_full)}: trained in full already "
                "(--lora_modules_to_save); give adapters to other layers"
            )
    _check_names_exist(model, to_save, "--lora_modules_to_save")
    lora = LoraConfig(
        task_type=getattr(TaskType, task_type),
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=ALL_LINEAR if targets == [ALL_LINEAR] else list(targets),
        modules_to_save=list(to_save) or None,
    )
    try:
        return get_peft_model(model, lora)
    except (ValueError, TypeError, NotImplementedError) as error:  # peft's refusals
        reason = str(error).strip().split(". ")[0].splitlines()[0][:200]
        raise ConfigError(
            f"--use_peft: peft cannot wrap this {model.config.model_type} model with --lora_target_modules "
            f"{' '.join(targets)} ({reason}); target its Linear layers or train without --use_peft"
        ) from None


def _check_names_exist(model: nn.Module, names: list[str], flag: str, trained_in_full=()) -> None:
    """peft matches a name against the end of a module path ("query" matches
    "bert.encoder.layer.0.attention.self.query"); a name that matches nothing is a typo. The error
    lists the Linear layers that can take adapters (not those trained in full)."""
    paths = [path for path, _ in model.named_modules() if path]
    missing = [n for n in names if not any(p == n or p.endswith(f".{n}") for p in paths)]
    if missing:
        linear = {p.rsplit(".", 1)[-1] for p, m in model.named_modules() if isinstance(m, nn.Linear)}
        linear = sorted(linear - set(trained_in_full))
        raise ConfigError(
            f"{flag}: this {model.config.model_type} model has no module named {', '.join(missing)}; "
            f"its Linear layers are {', '.join(linear)} (or pass {ALL_LINEAR})"
        )


def parameter_counts(model: nn.Module) -> dict:
    """{"trainable_parameters", "total_parameters"}: every parameter of the model being trained once
    (with LoRA: the frozen base, the adapters and the head's trainable copy). Under FSDP a sharded
    parameter's numel() is its full size, so every rank counts the same."""
    params = list(model.parameters())
    return {
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "total_parameters": sum(weight_count(p) for p in params),  # 4-bit: the weights, not the bytes
    }


def describe_parameters(counts: dict) -> str:
    trainable, total = counts["trainable_parameters"], counts["total_parameters"]
    return f"parameters: {trainable:,} trainable of {total:,} ({100 * trainable / total:.2f}%)"


def save_merged_and_adapter(model: nn.Module, state_dict: dict, output_dir: str | Path) -> None:
    """Rank 0: the merged, peft-free model at `output_dir` and the adapter in `output_dir/adapter`.

    `state_dict` is the full (gathered, under FSDP) state of the training model. It is loaded into a
    fresh peft model built on the meta device (no second random init), which peft then saves and
    merges; the training model stays as it is, unmerged. The price: one more copy of the adapted
    layers' weights in memory on rank 0 while the export runs."""
    from accelerate import init_empty_weights
    from peft import get_peft_model

    base = model.get_base_model()
    adapter = model.peft_config[model.active_adapter]
    # --load_in_4bit/8bit: the base dequantised to its dtype, then merged there (quantization.py).
    state_dict = dequantized_state(model, state_dict)
    with init_empty_weights(include_buffers=False):  # buffers (position ids) stay real: not in state_dict
        # A copy: get_peft_model extends the config's modules_to_save in place.
        fresh = get_peft_model(type(base)(plain_config(base.config)), copy.deepcopy(adapter))
    # Merging adds B·A into each adapted layer's base weight in place; without DDP or FSDP
    # state_dict holds the training model's own tensors, so those are copied first.
    copied = {name: t.clone() if ".base_layer." in name else t for name, t in state_dict.items()}
    fresh.load_state_dict(copied, strict=True, assign=True)
    saved = fresh.peft_config[fresh.active_adapter]  # peft appends its head names again on every wrap
    if saved.modules_to_save:
        saved.modules_to_save = list(dict.fromkeys(saved.modules_to_save))
    fresh.save_pretrained(Path(output_dir) / ADAPTER_DIR)
    merged = fresh.merge_and_unload()
    if base.can_generate():  # the training model's decoding (a causal LM's), not one made from its config
        merged.generation_config = base.generation_config
    merged.save_pretrained(output_dir)


def training_flops_per_token(model: nn.Module, non_embedding: int) -> int:
    """LoRA's training FLOPs per token, for MFU: forward (2N) and the backward through the
    activations (2N) still cross every frozen weight; weight gradients (2 per parameter) are taken
    for the trainable ones only. Full fine-tuning is 6N."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return 4 * non_embedding + 2 * trainable


def with_adapter_weights(model: nn.Module, full_state: dict, folder: Path) -> dict:
    """`full_state` (the training model's full state dict) with the LoRA and head weights of the adapter
    saved in `folder` (an export's adapter/): what --load_best_model_at_end loads back. The adapter's
    names are peft's saved ones; `get_peft_model_state_dict` maps the model's names to them and keeps the
    very tensors, which tells which full name each saved name stands for."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    saved_names = get_peft_model_state_dict(model, state_dict=full_state)
    full_name = {id(tensor): name for name, tensor in full_state.items()}
    adapter = load_file(folder / "adapter_model.safetensors")
    unknown = sorted(set(adapter) - set(saved_names))
    if unknown:
        raise ValueError(f"{folder}: adapter weights this model lacks: {', '.join(unknown[:3])}")
    return {**full_state, **{full_name[id(saved_names[name])]: t for name, t in adapter.items()}}
