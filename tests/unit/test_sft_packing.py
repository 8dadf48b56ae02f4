"""`--packing` (issue #45): training rows packed best-fit-decreasing into --max_length, each document kept
apart in its pack: every document in exactly one pack, the packs fixed by the seed, positions restarting
per document, no document's first token a target, and a document's logits in a pack those it has alone
(a tiny Llama and Qwen2 through sdpa's and eager's block-causal masks); attentions and models whose
documents would see each other are refused, as is --packing for classification."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM

from finetune.config.parser import parse_config
from finetune.families.causal_lm.batches import CausalLmCollator
from finetune.families.causal_lm.conversations import IGNORE
from finetune.families.causal_lm.packing import (
    PackedCollator,
    best_fit_decreasing,
    block_causal_mask,
    forward_inputs,
    pack_rows,
    packed_attention,
)
from tests.backbones import _decoder_config
from tests.chat_models import build_tiny_lm
from tests.helpers import refused

PAD = 0


def documents(count: int, seed: int = 0, longest: int = 40) -> list[dict]:
    """Encoded rows as `encode_splits` leaves them: ids, unshifted labels; a prompt of -100 first, or
    none (text: every token a target, the first too, as encode_row leaves it)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        length = rng.randint(3, longest)
        ids = [rng.randint(5, 90) for _ in range(length)]
        prompt = rng.choice([0, rng.randint(1, length - 1)])
        rows.append({"input_ids": ids, "labels": [IGNORE] * prompt + ids[prompt:], "length": length})
    return rows


def test_best_fit_decreasing_packs_every_document_once_within_capacity_fixed_by_the_seed():
    lengths = [random.Random(1).choice([3, 7, 12, 20, 33, 50]) for _ in range(300)]
    packs = best_fit_decreasing(lengths, 64, seed=0)
    assert sorted(row for pack in packs for row in pack) == list(range(300))
    assert all(sum(lengths[row] for row in pack) <= 64 for pack in packs)
    # Best fit decreasing: within 11/9 of the fewest packs the tokens need, plus one.
    assert len(packs) <= 11 / 9 * -(-sum(lengths) // 64) + 1
    assert best_fit_decreasing(lengths, 64, seed=0) == packs
    assert best_fit_decreasing(lengths, 64, seed=1) != packs  # equal lengths meet other partners


def test_best_fit_puts_each_document_where_it_leaves_the_least_room():
    # 5 opens a pack (room 3), 4 another (room 4); a 3 fills the first, the other 3 goes to the second
    # (room 1), 2 opens a third, and 1 fills the second, not the third.
    packs = best_fit_decreasing([5, 4, 3, 3, 2, 1], 8, seed=0)
    sizes = [[[5, 4, 3, 3, 2, 1][row] for row in pack] for pack in packs]
    assert sizes == [[5, 3], [4, 3, 1], [2]]


def test_a_document_longer_than_the_packs_is_a_bug_not_a_pack():
    with pytest.raises(ValueError, match="longer than the packs' 8 tokens"):
        best_fit_decreasing([9], 8, seed=0)


def test_packed_rows_keep_their_tokens_and_no_first_token_is_a_target():
    rows = documents(30)
    packed, counts = pack_rows(Dataset.from_list(rows), 64, seed=0)
    assert counts["packs"] == len(packed) < 30 and counts["capacity"] == 64
    assert counts["fill"] == pytest.approx(sum(r["length"] for r in rows) / (64 * len(packed)))
    seen = []
    for pack in packed:
        assert pack["length"] == len(pack["input_ids"]) == sum(pack["document_lengths"]) <= 64
        start = 0
        for length in pack["document_lengths"]:
            ids, labels = pack["input_ids"][start : start + length], pack["labels"][start : start + length]
            row = next(r for r in rows if r["input_ids"] == ids)
            assert labels == [IGNORE, *row["labels"][1:]]
            seen.append(rows.index(row))
            start += length
    assert sorted(seen) == list(range(30))
    assert sum(len(p["document_lengths"]) for p in packed) == 30 and len(packed) >= 3


def collated(rows: list[dict], varlen: bool, capacity: int = 64):
    packed, _ = pack_rows(Dataset.from_list(rows), capacity, seed=0)
    collator = PackedCollator(CausalLmCollator(PAD, 1, capacity), varlen, capacity)
    features = [
        {k: packed[i][k] for k in ("input_ids", "labels", "document_lengths")} for i in range(len(packed))
    ]
    return packed, collator(features)


@pytest.mark.parametrize("varlen", [False, True], ids=["mask", "varlen"])
def test_positions_restart_per_document_and_no_document_predicts_the_next(varlen):
    rows = documents(12)
    packed, batch = collated(rows, varlen)
    assert batch["documents"] == 12 and isinstance(batch["documents"], int)
    lengths = [n for pack in packed["document_lengths"] for n in pack]
    if varlen:  # one row, no padding, bounded per document
        assert batch["input_ids"].shape == (1, sum(lengths))
        assert batch["cu_seq_lens_q"].tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
        assert batch["max_length_q"] == batch["max_length_k"] == 64
        flat = zip([batch["position_ids"][0]], [batch["labels"][0]], [lengths], strict=True)
    else:  # one padded row per pack
        assert batch["input_ids"].shape[0] == len(packed)
        assert batch["attention_mask"].sum().item() == sum(lengths)
        flat = zip(batch["position_ids"], batch["labels"], packed["document_lengths"], strict=True)
    for positions, labels, pack in flat:
        start = 0
        for length in pack:
            assert positions[start : start + length].tolist() == list(range(length))
            # The shifted label at a document's last token would be the next document's first: none.
            assert labels[start + length - 1] == IGNORE
            start += length
        assert (labels[start:] == IGNORE).all()  # padding predicts nothing
    # Every target that is left is a document's own next token.
    targets = (batch["labels"] != IGNORE).sum().item()
    assert targets == sum(sum(label != IGNORE for label in r["labels"][1:]) for r in rows)


def test_the_block_causal_mask_lets_a_token_see_only_its_own_documents_earlier_tokens():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0]])
    mask = block_causal_mask(positions)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bool
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ], dtype=torch.bool)  # fmt: skip
    assert torch.equal(mask[0, 0], expected)
    additive = block_causal_mask(positions, torch.float32)
    assert torch.equal(additive[0, 0] == 0, expected)
    assert (additive[0, 0][~expected] == torch.finfo(torch.float32).min).all()


@pytest.fixture(scope="module")
def tiny_lms(tmp_path_factory):
    folder = tmp_path_factory.mktemp("packing")
    return {family: build_tiny_lm(family, folder / family) for family in ("llama", "qwen2")}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_document_in_a_pack_has_the_logits_it_has_alone(tiny_lms, family, attention):
    model = AutoModelForCausalLM.from_pretrained(tiny_lms[family], attn_implementation=attention).eval()
    rows = documents(10, seed=3, longest=60)
    packed, batch = collated(rows, varlen=False, capacity=128)
    assert max(len(pack) for pack in packed["document_lengths"]) >= 3  # several documents share a pack
    plan = packed_attention(model, 128)
    assert not plan.varlen and plan.mask_dtype == (torch.float32 if attention == "eager" else None)
    with torch.no_grad():
        logits = model(**forward_inputs(batch, plan)).logits
        plain = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        compared = leaked = 0
        for pack, ids, in_pack, causal in zip(
            packed["document_lengths"], batch["input_ids"], logits, plain, strict=True
        ):
            start = 0
            for length in pack:
                alone = model(input_ids=ids[None, start : start + length]).logits[0]
                torch.testing.assert_close(in_pack[start : start + length], alone, rtol=1e-5, atol=1e-5)
                leaked += start > 0 and not torch.allclose(causal[start : start + length], alone, atol=1e-3)
                compared += 1
                start += length
    assert compared == 10
    assert leaked == 10 - len(packed)  # the test can tell: a plain causal mask lets later documents see


def test_the_varlen_row_keeps_each_documents_logits_as_transformers_reads_its_positions(tiny_lms):
    """Flash's layout (one row, positions restarting, no mask), read on CPU by transformers' own packed-
    sequence detection from position_ids (its sdpa path; flash reads the same from cu_seq_lens)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_lms["llama"], attn_implementation="sdpa").eval()
    rows = documents(10, seed=3, longest=60)
    _, batch = collated(rows, varlen=True, capacity=128)
    bounds = batch["cu_seq_lens_q"].tolist()
    with torch.no_grad():
        # No cache, as in training (the family turns it off): with one, transformers reads no packing.
        inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "use_cache": False}
        logits = model(**inputs).logits[0]
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            alone = model(input_ids=batch["input_ids"][:, start:end]).logits[0]
            torch.testing.assert_close(logits[start:end], alone, rtol=1e-5, atol=1e-5)
    assert len(bounds) == 11


def test_an_attention_without_a_block_causal_mask_is_refused(tiny_lms):
    model = AutoModelForCausalLM.from_pretrained(tiny_lms["llama"], attn_implementation="flex_attention")
    with refused("--packing", "--attn_implementation sdpa"):
        packed_attention(model, 64)


def test_a_sliding_window_shorter_than_the_packs_is_refused():
    config = _decoder_config("mistral", 100, 1)
    config.sliding_window, config._attn_implementation = 32, "sdpa"
    model = AutoModelForCausalLM.from_config(config)
    with refused("--packing", "lower --max_length to 32"):
        packed_attention(model, 64)
    assert packed_attention(model, 32).varlen is False  # the window covers every pack: nothing changes


def test_packing_is_for_causal_lm():
    files = ["--train_file", "t.jsonl", "--validation_file", "v.jsonl", "--task_name", "custom"]
    with refused("--packing", "drop --packing"):
        parse_config([*files, "--text_columns", "text", "--packing"])
    assert parse_config(["--task_type", "causal_lm", *files[:4], "--packing"]).packing
