"""bench-memory's `--model 1b`: a random Llama decoder of about 1B parameters, written to a folder once.

Built on the meta device (shapes only) and written tensor by tensor into safetensors shards, so building
it holds about one shard (1 GiB) of memory, not the whole fp32 model and the copies save_pretrained
makes (8+ GB: as much as the DDP run it is for). Written to a sibling folder first and renamed when
complete, so a build cut short is not taken for a model.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SHARD_BYTES = 1 << 30
SIZE_1B = {
    "vocab_size": 49152, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 18,
    "num_attention_heads": 32, "num_key_value_heads": 4, "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}  # fmt: skip


def decoder_1b(folder: Path, tokenizer_from: Path) -> Path:
    """About 1.0B parameters (hidden 2048, 18 layers, GQA 32/4 heads, untied 49,152 vocabulary), fp32,
    with SmolLM2's tokenizer."""
    return random_decoder(folder, tokenizer_from, SIZE_1B)


def random_decoder(folder: Path, tokenizer_from: Path, size: dict, shard_bytes: int = SHARD_BYTES) -> Path:
    """A LlamaForCausalLM of `size` (LlamaConfig's fields), random fp32 weights (normal at the config's
    initializer_range, norms at one, as its own init), in shards of at most `shard_bytes`; kept if there."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**size, torch_dtype="float32")
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in LlamaForCausalLM(config).state_dict().items()}
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    weight_map, total_bytes, shard = {}, 0, {}

    def write(shard: dict) -> None:  # a shard written as it fills: only the one being filled is held
        file = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, partial / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))

    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.empty(shape).normal_(0.0, config.initializer_range, generator=generator)
        if shard and sum(t.nbytes for t in shard.values()) + tensor.nbytes > shard_bytes:
            write(shard)
            shard = {}
        shard[name] = tensor
        total_bytes += tensor.nbytes
    write(shard)
    # transformers' sharded-checkpoint index
    index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
    (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(partial)
    AutoTokenizer.from_pretrained(tokenizer_from).save_pretrained(partial)
    count = sum(torch.Size(s).numel() for s in shapes.values())
    print(f"built a random decoder of {count / 1e9:.2f}B parameters in {folder}", flush=True)
    partial.rename(folder)
    return folder
