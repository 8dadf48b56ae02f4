"""bench-memory's `--model 1b` folder, at a tiny size: the shards it writes tensor by tensor are a model
transformers loads whole (every weight from the files, none initialised afresh), no shard over its bound;
and a build cut short leaves no folder that would be taken for a model."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from benchmarks.random_decoder import random_decoder
from tests.chat_models import chatml_tokenizer

TINY = {"vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False}  # fmt: skip


def test_random_decoder_loads_whole_from_bounded_shards(tmp_path):
    chatml_tokenizer().save_pretrained(tmp_path / "tokenizer")
    shard_bytes = 64 * 1024  # the embedding (64 KiB) alone fills one: several shards
    folder = random_decoder(tmp_path / "model", tmp_path / "tokenizer", TINY, shard_bytes=shard_bytes)

    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 2
    assert all(path.stat().st_size <= shard_bytes + 4096 for path in shards)  # + the safetensors header
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert model.dtype == torch.float32 and not model.config.tie_word_embeddings
    assert torch.equal(model.model.norm.weight, torch.ones(32))
    assert model.lm_head.weight.std().item() == pytest.approx(model.config.initializer_range, rel=0.1)
    assert not (tmp_path / "model.partial").exists()


def test_random_decoder_cut_short_leaves_no_model(tmp_path, monkeypatch):
    chatml_tokenizer().save_pretrained(tmp_path / "tokenizer")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("safetensors.torch.save_file", fail)
    with pytest.raises(OSError):
        random_decoder(tmp_path / "model", tmp_path / "tokenizer", TINY)
    assert not (tmp_path / "model").exists()
