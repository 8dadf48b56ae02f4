"""QLoRA and 8-bit LoRA (--load_in_4bit, --load_in_8bit with --use_peft): the base's Linear weights held
in bitsandbytes' 4 or 8 bits and frozen, adapters and the head trained beside them.

- Loading: transformers' BitsAndBytesConfig, on the rank's own device (bitsandbytes quantizes as the
  weights arrive there; accelerate refuses to move a quantized model afterwards). The head and
  --lora_modules_to_save stay in --torch_dtype: peft trains a copy of them, and an integer weight takes
  no gradient.
- Not peft's prepare_model_for_kbit_training: it casts every weight that is not quantized to fp32 and
  turns on reentrant gradient checkpointing. Here the unquantized weights keep --torch_dtype, as they do
  in a 16-bit LoRA run (so the two differ only in the quantized Linear weights), and
  --gradient_checkpointing is the toolkit's non-reentrant one, which needs no input gradients.
- Export: each quantized weight dequantised to the base's dtype, then the adapters merged in that dtype
  (peft's merge_and_unload into a Linear4bit re-quantizes base + B·A, rounding the update to 4 bits with it).
- Resume: a checkpoint holds the quantized weights with their constants; they are compared with the
  ones this load quantized (bitsandbytes quantizes a given weight the same way every time) instead of
  loaded, which bitsandbytes cannot do into an already quantized layer.

bitsandbytes is imported inside the functions: only a quantized run needs it.
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from torch import nn

from finetune.errors import ConfigError


def quantization_options(config, accelerator) -> dict:
    """from_pretrained keyword arguments for --load_in_4bit / --load_in_8bit ({} without them); refuses
    what cannot work before any weights are read. Compute in bf16 where the run trains in bf16
    (--torch_dtype bfloat16 or --mixed_precision bf16), else fp32."""
    bits = config.quantized_bits
    if bits is None:
        return {}
    flag = f"--load_in_{bits}bit"
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ConfigError(
            f"{flag} needs the bitsandbytes package; pip install bitsandbytes (or pip install -e '.[qlora]')",
            flag=flag,
            fix="pip install bitsandbytes",
        )
    if accelerator.distributed_type == DistributedType.FSDP:
        raise ConfigError(
            f"{flag} under FSDP: bitsandbytes' quantized weights cannot be sharded here; launch without the "
            f"FSDP accelerate config (DDP: each process holds the whole {bits}-bit base), or drop {flag}",
            flag=flag,
        )
    from transformers import BitsAndBytesConfig

    in_bf16 = config.torch_dtype == "bfloat16" or accelerator.mixed_precision == "bf16"
    if bits == 4:
        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=config.bnb_4bit_quant_type,
            bnb_4bit_use_double_quant=config.use_bnb_nested_quant,
            bnb_4bit_compute_dtype=torch.bfloat16 if in_bf16 else torch.float32,
            llm_int8_skip_modules=config.lora_modules_to_save,  # trained in full: see keeping_head
        )
    else:
        quantization = BitsAndBytesConfig(
            load_in_8bit=True, llm_int8_skip_modules=config.lora_modules_to_save
        )
    return {"quantization_config": quantization, "device_map": {"": accelerator.device}}


def keeping_head(loading: dict, auto_class, model_config, task_type: str) -> dict:
    """`loading` with the modules bitsandbytes must leave in --torch_dtype: those transformers keeps
    (the output embeddings, tied weights), --lora_modules_to_save (`quantization_options` put them in
    llm_int8_skip_modules), else a classifier's head (the one `wrap_with_lora` will train), found on the
    architecture built on the meta device."""
    if "quantization_config" not in loading:
        return loading
    from accelerate import init_empty_weights
    from transformers.quantizers.base import get_keys_to_not_convert

    from finetune.model.lora import classification_head

    remote = loading.get("trust_remote_code", False)
    with init_empty_weights():
        skeleton = auto_class.from_config(model_config, trust_remote_code=remote)
    quantization = copy.deepcopy(loading["quantization_config"])
    kept = list(quantization.llm_int8_skip_modules or [])
    if task_type != "CAUSAL_LM" and not kept:
        kept = [classification_head(skeleton)]
    quantization.llm_int8_skip_modules = sorted({*get_keys_to_not_convert(skeleton), *kept})
    return {**loading, "quantization_config": quantization}


def quantized_layers(model: nn.Module) -> dict[str, nn.Module]:
    """{module path: layer} of bitsandbytes' 4- and 8-bit Linear layers ({} for a model without any)."""
    bnb = sys.modules.get("bitsandbytes")  # never imported: no layer of it anywhere (and no import cost)
    if bnb is None:
        return {}

    kinds = (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)
    return {name: module for name, module in model.named_modules() if isinstance(module, kinds)}


def keep_as_loaded(model: nn.Module) -> None:
    """Turns off bitsandbytes' repacking of a 4-bit weight for its CPU kernel. On a CPU with AVX512-BF16
    (Zen 4, Sapphire Rapids) a Linear4bit repacks its weight at its first forward in eval mode without
    gradients, rounding the blocks' scales (absmax) to bf16 in place: each evaluation would change the
    frozen base the adapters train on, what the checkpoint compares and what the export dequantises
    (0.03 off on a tiny Llama), and the repacking fails on layers narrower than a block. Off, the base
    is the one loaded on every CPU class."""
    for layer in quantized_layers(model).values():
        if hasattr(layer, "support_avx512bf16_for_cpu"):
            layer.support_avx512bf16_for_cpu = False


def weight_count(param: torch.Tensor) -> int:
    """The weights a parameter stands for: a 4-bit one packs two in each byte of its storage."""
    state = getattr(param, "quant_state", None)
    return state.shape.numel() if state is not None else param.numel()


def is_quantized_entry(name: str, layers: dict) -> bool:
    """Whether a state-dict entry is a quantized layer's weight or one of its constants (4-bit:
    weight.absmax, weight.quant_map, weight.quant_state.*, ...; 8-bit: SCB, weight_format)."""
    module, _, entry = name.rpartition(".")
    while module and module not in layers:
        module, _, parent = module.rpartition(".")
        entry = f"{parent}.{entry}"
    return bool(module) and entry != "bias"


def dequantized_state(model: nn.Module, state_dict: dict) -> dict:
    """`state_dict` of a quantized peft model as an unquantized one's: each quantized weight in the base's
    dtype, the quantization constants dropped."""
    from peft.utils.integrations import dequantize_bnb_weight

    layers = quantized_layers(model)
    if not layers:
        return state_dict
    dtype = _unquantized_dtype(model)
    plain = {name: t for name, t in state_dict.items() if not is_quantized_entry(name, layers)}
    for name, layer in layers.items():
        weight = dequantize_bnb_weight(layer.weight, state=getattr(layer, "state", None))
        plain[f"{name}.weight"] = weight.to(dtype).cpu()
    return plain


def _unquantized_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the base was read in: that of its floating weights bitsandbytes left alone."""
    layers = quantized_layers(model)
    for name, param in model.named_parameters():
        owner = name.rpartition(".")[0]
        if param.is_floating_point() and owner not in layers and "lora_" not in name:
            return param.dtype
    return torch.float32


def plain_config(model_config):
    """A copy of the model's config without its quantization record: the exported model is ordinary."""
    plain = copy.deepcopy(model_config)
    for name in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(plain, name):
            delattr(plain, name)
    return plain


def describe_quantization(config) -> str | None:
    """How the base was held while it trained, for results.json and the card; None: not quantized."""
    if config.load_in_4bit:
        nested = ", nested quantization" if config.use_bnb_nested_quant else ""
        return f"4-bit {config.bnb_4bit_quant_type} (bitsandbytes{nested}); exported dequantised and merged"
    if config.load_in_8bit:
        # Its forward rounds activations to 8 bits too: the metrics are not quite the export's.
        return (
            "8-bit LLM.int8() (bitsandbytes); exported dequantised and merged; metrics from the 8-bit "
            "forward, which also rounds activations"
        )
    return None


def load_quantized_checkpoint(model: nn.Module, folder: Path) -> None:
    """A checkpoint's model state into a quantized model: the quantized weights and their constants must
    equal the ones this load made (the same base, quantized the same way), everything else is loaded.
    Replaces accelerate's strict load, which bitsandbytes refuses."""
    from safetensors.torch import load_file

    layers = quantized_layers(model)
    saved = load_file(folder / "model.safetensors", device=str(next(model.parameters()).device))
    current = model.state_dict()
    if saved.keys() != current.keys():
        odd = sorted(saved.keys() ^ current.keys())[:2]
        raise ConfigError(
            f"--resume_from_checkpoint {folder}: its model is not this run's ({', '.join(odd)}); resume "
            "with the flags and model that wrote it"
        )
    quantized = [name for name in saved if is_quantized_entry(name, layers)]
    changed = [name for name in quantized if not torch.equal(saved[name], current[name])]
    if changed:
        raise ConfigError(
            f"--resume_from_checkpoint {folder}: the quantized base differs from the checkpoint's "
            f"({changed[0]}); resume from the model files and bitsandbytes version that wrote it"
        )
    load_all_but_quantized(model, saved)


def load_all_but_quantized(model: nn.Module, state: dict) -> None:
    """`state` (the model's full state) into the model, but for its quantized layers' weights and
    constants, which are frozen (and which bitsandbytes cannot load into a quantized layer); strict
    about everything else."""
    layers = quantized_layers(model)
    rest = {name: tensor for name, tensor in state.items() if not is_quantized_entry(name, layers)}
    missing, unexpected = model.load_state_dict(rest, strict=False)
    left_out = [name for name in missing if not is_quantized_entry(name, layers)]
    if unexpected or left_out:
        raise ValueError(f"weights this model lacks or misses: {', '.join([*unexpected, *left_out][:3])}")


def loading_quantized_models(models: list, input_dir: str) -> None:
    """accelerate's load_state pre-hook: the quantized models of `models` loaded here (and taken out of
    the list, so accelerate does not load them again)."""
    for model in list(models):
        if quantized_layers(model):
            load_quantized_checkpoint(model, Path(input_dir))
            models.remove(model)
