"""The causal-LM family's flags (`--task_type causal_lm`, most of them DPO's too): targets, templates,
packing, generation and the chunked loss. Read by `finetune.config` through the seam
(finetune/families/__init__.py FLAG_GROUPS)."""

from __future__ import annotations

from dataclasses import dataclass

from finetune.config.families import SPEED, Owned
from finetune.config.system_args import AutoSwitch
from finetune.errors import ConfigError

NAME, DPO = "causal_lm", "dpo"
DECODERS = (NAME, DPO)
CHUNKS = f"{SPEED} (the same loss summed in another order)"
OWNED = {
    "gguf_file": Owned(DECODERS, "loads a causal LM's GGUF checkpoint", before=None),
    "completion_only_loss": Owned((NAME,), "chooses a causal LM's targets", before=True),
    "assistant_only_loss": Owned((NAME,), "chooses a causal LM's targets", before=True),
    "chat_template": Owned(DECODERS, "renders a causal LM's conversations",
                           left_out="in tokenizer: the template's content, wherever the file is"),
    "packing": Owned((NAME,), "packs a causal LM's rows", before=False),
    "predict_with_generate": Owned(DECODERS, "generates a causal LM's completions", before=False),
    # in the identity only with --predict_with_generate (config/identity.py GENERATED)
    "generation_max_new_tokens": Owned(DECODERS, "caps a causal LM's generations", before=128),
    "chunked_loss": Owned((NAME,), "chunks a causal LM's loss over its vocabulary", asks=("true",),
                          left_out=CHUNKS),
    "chunked_loss_tokens": Owned((NAME,), "sizes the chunks of a causal LM's loss", left_out=CHUNKS),
}  # fmt: skip
"""The flags this family reads (some with DPO, which trains a causal LM), as the one refusal rule
(config/families.py) and the run's identity (config/identity.py) read them."""


@dataclass(frozen=True)
class CausalLMArgs:
    """Causal LMs (--task_type causal_lm; dpo reads the model, template and generation flags too): targets,
    templates, packing, generation, the chunked loss."""

    gguf_file: str | None = None
    """causal_lm: a GGUF file (its name in --model_name_or_path's folder or Hub repo, transformers' own
    argument) to read the model and tokenizer from; its weights are dequantised and trained in
    --torch_dtype, and exported as safetensors."""
    completion_only_loss: bool = True
    """causal_lm, prompt-completion rows: train on the completion's tokens and the EOS only (TRL's name);
    false: on every token."""
    assistant_only_loss: bool = True
    """causal_lm, conversations: train on each assistant turn, from after its header through its
    end-of-turn token, found by rendering message prefixes with the chat template (no {% generation %}
    markers needed); false: on every token of the conversation."""
    chat_template: str | None = None
    """causal_lm: a Jinja chat template file (.jinja) that renders the conversations, in place of the
    tokenizer's own; it is exported with the model."""
    packing: bool = False
    """causal_lm: pack the training rows best-fit-decreasing into sequences of up to --max_length tokens
    (TRL's name): fewer, fuller sequences, so far less padding. Each document keeps its own positions
    and attends to and predicts only itself, so the loss is the same as unpacked: on CUDA the packs run as
    one varlen row (sdpa in bf16/fp16 through torch's varlen kernel, or flash_attention_2), elsewhere (sdpa
    in fp32 or on CPU, eager) with a block-causal mask; an attention that cannot keep documents apart is
    refused. The packs are fixed by --seed; --per_device_train_batch_size counts packs, train_samples
    documents. Evaluation is not packed."""
    predict_with_generate: bool = False
    """causal_lm: at each evaluation also generate every validation row's completion, greedy and batched,
    and report eval_exact_match: the share equal to the reference, both stripped and case-folded (Hugging
    Face Seq2SeqTrainer's name). The prompt: a conversation before its last assistant turn, with the
    generation prompt (the reference: that turn), or the prompt of a prompt-completion row (the completion,
    or its first assistant message). Not for `text` rows. dpo: every validation pair's prompt, the
    reference its chosen completion."""
    generation_max_new_tokens: int = 128
    """causal_lm and dpo: the most tokens a generated completion has (--predict_with_generate,
    --do_predict), and max_new_tokens of the exported generation_config.json."""
    chunked_loss: AutoSwitch = "auto"
    """causal_lm: run the output layer and cross-entropy over chunks of --chunked_loss_tokens target tokens,
    each chunk's logits recomputed in the backward pass instead of kept, so memory no longer grows with
    targets x vocabulary (TRL's and torchtune's chunked losses; Liger's fused one). The same loss and
    gradients to rounding, for one more forward matmul of the output layer per chunk; a micro-batch whose
    targets fit one chunk is computed whole. auto: on wherever the model's logits are its output layer's
    (checked at load; Gemma 2's final soft-cap included) and nothing compiles it, under FSDP2 too
    (docs/distributed.md); its speed against false is to be measured (benchmarks/bench_chunked_loss.py).
    true refuses where it cannot be on; false: the whole [targets, vocabulary] logits at once."""
    chunked_loss_tokens: int | None = None
    """causal_lm, with --chunked_loss: target tokens per chunk; default: as many as make 2**25 logits (128 MB
    in fp32), in multiples of 128: 640 at a 49,152-token vocabulary, 256 at 128,256."""

    def __post_init__(self):
        """Checks of this group's flags alone."""
        if self.generation_max_new_tokens <= 0:
            tokens = self.generation_max_new_tokens
            raise ConfigError(f"--generation_max_new_tokens must be a positive integer, got {tokens}")
        tokens = self.chunked_loss_tokens
        if tokens is not None and tokens <= 0:
            raise ConfigError(f"--chunked_loss_tokens must be a positive integer or left unset, got {tokens}")
