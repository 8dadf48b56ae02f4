"""The model group of flags: which checkpoint, how it loads, and LoRA (TRL's flag names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from finetune.errors import ConfigError

TorchDtype = Literal["auto", "bfloat16", "float16", "float32"]
AttnImplementation = Literal["sdpa", "eager", "flash_attention_2"]
QuantType = Literal["nf4", "fp4"]


@dataclass(frozen=True)
class ModelArgs:
    """Model: which checkpoint, how it loads, and LoRA (TRL's flag names)."""

    model_name_or_path: str = "bert-base-cased"
    """Hub model id or local folder with config, weights and tokenizer."""
    model_revision: str = "main"
    """Hub branch, tag or commit of the model to load."""
    torch_dtype: TorchDtype = "float32"
    """dtype of the weights: float32 (master weights, with --mixed_precision autocast), bfloat16 (for large
    decoders; needs native bf16), float16, or auto (the checkpoint's own)."""
    attn_implementation: AttnImplementation | None = None
    """Attention kernel: sdpa, eager or flash_attention_2 (CUDA with flash-attn installed); default:
    transformers' choice for the model."""
    trust_remote_code: bool = False
    """Run the modeling code a checkpoint ships (config.json auto_map); only for code you trust."""
    ignore_mismatched_sizes: bool = False
    """Replace a head trained for something else than the task (other labels, or a regression score where the
    task has labels, or the reverse) with a new one (by default that is refused; a head with the task's labels
    in another order is always kept)."""
    use_peft: bool = False
    """Train LoRA adapters (peft) instead of every weight; the output is the merged model plus
    output_dir/adapter."""
    lora_r: int = 16
    """LoRA rank: the inner size of each adapter's B·A."""
    lora_alpha: int = 32
    """LoRA scaling numerator: adapters add B·A·alpha/r."""
    lora_dropout: float = 0.05
    """Dropout on each adapter's input."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Module names (ends of module paths, e.g. query value, or q_proj,v_proj) that get adapters;
    all-linear: every Linear layer but the head."""
    lora_modules_to_save: list[str] | None = None
    """Modules trained in full beside the adapters (e.g. lm_head); default: the classification head."""
    load_in_4bit: bool = False
    """QLoRA (with --use_peft): the base's Linear weights held in 4 bits (bitsandbytes) and frozen, the
    head and --lora_modules_to_save kept in --torch_dtype; the export dequantises the base to its dtype and
    merges the adapters into it."""
    load_in_8bit: bool = False
    """As --load_in_4bit, with the base's Linear weights held in 8 bits (bitsandbytes LLM.int8())."""
    bnb_4bit_quant_type: QuantType = "nf4"
    """--load_in_4bit's data type: nf4 (NormalFloat, QLoRA's) or fp4."""
    use_bnb_nested_quant: bool = False
    """--load_in_4bit: quantize the quantization constants too (QLoRA's double quantization, ~0.4 bits
    per weight less)."""

    def __post_init__(self):
        """Checks of this group's flags alone; module lists split at commas too (PEFT's CLIs take both)."""
        object.__setattr__(self, "lora_target_modules", _names(self.lora_target_modules))
        if self.lora_modules_to_save is not None:
            object.__setattr__(self, "lora_modules_to_save", _names(self.lora_modules_to_save))
        if self.lora_r <= 0 or self.lora_alpha <= 0:
            raise ConfigError(
                f"--lora_r and --lora_alpha must be positive, got {self.lora_r} and {self.lora_alpha}"
            )
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if "all-linear" in self.lora_target_modules and len(self.lora_target_modules) > 1:
            raise ConfigError("--lora_target_modules: give all-linear alone, or module names without it")
        if self.load_in_4bit and self.load_in_8bit:
            raise ConfigError(
                "--load_in_4bit and --load_in_8bit: a base is held in one of them; drop one",
                flag="--load_in_8bit",
                fix="drop --load_in_4bit or --load_in_8bit",
            )
        if not self.load_in_4bit and (self.bnb_4bit_quant_type != "nf4" or self.use_bnb_nested_quant):
            flag = "--use_bnb_nested_quant" if self.use_bnb_nested_quant else "--bnb_4bit_quant_type"
            raise ConfigError(f"{flag} sets how --load_in_4bit quantizes; add --load_in_4bit or drop {flag}",
                              flag=flag)  # fmt: skip

    @property
    def quantized_bits(self) -> int | None:
        """4 or 8: the bits bitsandbytes holds the base's Linear weights in; None: not quantized."""
        return 4 if self.load_in_4bit else 8 if self.load_in_8bit else None

    @property
    def hub_options(self) -> dict:
        """How every `from_pretrained` of the model folder or Hub id reads it."""
        return {"revision": self.model_revision, "trust_remote_code": self.trust_remote_code}


def _names(values: list[str]) -> list[str]:
    return [name.strip() for value in values for name in value.split(",") if name.strip()]
