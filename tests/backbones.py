"""Tiny random sequence-classification models of each backbone family, built offline from configs.

`build_tiny(family, folder)` saves a 2-layer model (hidden 32-64, random weights) and a tokenizer
beside it: encoders get the MiniLM WordPiece tokenizer (`minilm_dir()`); decoders a byte-level BPE
trained on the shared MNLI rows, saved WITHOUT a pad token (the toolkit must add one), and for
`phi` without an EOS token either (the toolkit must add a new token and grow the embeddings).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import SHARED_MNLI, minilm_dir

ENCODERS = ("bert", "distilbert", "albert", "deberta-v2", "modernbert", "electra", "xlm-roberta")
DECODERS = ("llama", "qwen2", "qwen3", "mistral", "gemma", "gpt2", "phi")
FAMILIES = ENCODERS + DECODERS
EOS = "<|endoftext|>"
DECODER_VOCAB = 600
NO_EOS = ("phi",)  # a decoder whose tokenizer has neither pad nor EOS token


def _encoder_config(family: str, vocab_size: int, pad_id: int, cls_id: int, sep_id: int):
    import transformers as t

    common = {"vocab_size": vocab_size, "num_labels": 3, "pad_token_id": pad_id}
    common["max_position_embeddings"] = 128
    bert_like = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    if family == "bert":
        return t.BertConfig(**common, **bert_like)
    if family == "electra":
        return t.ElectraConfig(**common, **bert_like, embedding_size=32)
    if family == "xlm-roberta":  # its positions count from pad_token_id + 1, so it must be the tokenizer's
        return t.XLMRobertaConfig(**common, **bert_like)
    if family == "albert":
        return t.AlbertConfig(**common, **bert_like, embedding_size=16)
    if family == "deberta-v2":  # DeBERTa-v3's architecture: relative attention, no token types
        return t.DebertaV2Config(
            **common, **bert_like, relative_attention=True, position_buckets=32, max_relative_positions=64,
            pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
        )  # fmt: skip
    if family == "distilbert":
        return t.DistilBertConfig(**common, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    if family == "modernbert":
        return t.ModernBertConfig(
            **common, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            cls_token_id=cls_id, sep_token_id=sep_id, bos_token_id=cls_id, eos_token_id=sep_id,
            global_attn_every_n_layers=2, local_attention=16,
        )  # fmt: skip
    raise ValueError(family)


def _decoder_config(family: str, vocab_size: int, eos_id: int | None):
    import transformers as t

    common = {"vocab_size": vocab_size, "num_labels": 3, "bos_token_id": eos_id, "eos_token_id": eos_id}
    llama_like = {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "max_position_embeddings": 256,
    }  # fmt: skip
    if family == "llama":
        return t.LlamaConfig(**common, **llama_like)
    if family == "qwen2":
        return t.Qwen2Config(**common, **llama_like)
    if family == "qwen3":
        return t.Qwen3Config(**common, **llama_like, head_dim=16)
    if family == "mistral":
        return t.MistralConfig(**common, **llama_like, sliding_window=None)
    if family == "gemma":
        return t.GemmaConfig(**common, **llama_like, head_dim=16)
    if family == "gpt2":
        return t.GPT2Config(**common, n_embd=64, n_layer=2, n_head=4, n_positions=256)
    if family == "phi":
        return t.PhiConfig(**common, **llama_like)
    raise ValueError(family)


def decoder_tokenizer(with_eos: bool = True):
    """A byte-level BPE trained on the shared MNLI training rows; no pad token (EOS only, or nothing)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    with (SHARED_MNLI / "train.jsonl").open() as f:
        for _, line in zip(range(3000), f, strict=False):
            row = json.loads(line)
            texts += [row["premise"], row["hypothesis"]]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=DECODER_VOCAB,
        special_tokens=[EOS] if with_eos else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    special = {"eos_token": EOS} if with_eos else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, model_input_names=["input_ids", "attention_mask"], **special
    )


def build_tiny(family: str, folder: Path, seed: int = 0) -> Path:
    """Saves a tiny random `family` model with its tokenizer in `folder` (created) and returns it."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if family in ENCODERS:
        tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
        # It also makes token_type_ids for DistilBERT and ModernBERT, which take none: the toolkit drops them.
        ids = tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id
        config = _encoder_config(family, tokenizer.vocab_size, *ids)
    elif family in DECODERS:
        tokenizer = decoder_tokenizer(with_eos=family not in NO_EOS)
        config = _decoder_config(family, len(tokenizer), tokenizer.eos_token_id)
    else:
        raise ValueError(f"unknown family {family}; one of {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
