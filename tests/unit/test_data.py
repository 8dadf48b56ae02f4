import csv
import itertools
import json

import pytest
import torch
from accelerate import Accelerator
from transformers import AutoTokenizer, DataCollatorWithPadding

from finetune.config.train_config import TrainConfig
from finetune.data.batching import LengthGroupedSampler, PadCollator, build_dataloaders
from finetune.data.splits import load_splits
from finetune.data.tasks import GLUE_TASKS
from finetune.data.tokenization import tokenize_splits
from finetune.errors import ConfigError

LABEL_NAMES = GLUE_TASKS["mnli"].label_names

ROWS = [
    {"premise": "A man plays a guitar.", "hypothesis": "A person makes music.", "label": 0},
    {"premise": "A man plays a guitar.", "hypothesis": "He plays for money.", "label": 1},
    {"premise": "A man plays a guitar.", "hypothesis": "The man is asleep.", "label": 2},
    {"premise": 'A "quoted" sign, half open.', "hypothesis": "A sign is there.", "label": 0},
]


def write(path, rows, label_as_word=False):
    rows = [{**r, "label": LABEL_NAMES[r["label"]] if label_as_word else r["label"]} for r in rows]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".tsv":  # as GLUE writes them: tab-separated, quotes are plain text
        lines = ["\t".join(rows[0])] + ["\t".join(str(v) for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    else:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return path


def config_for(train, validation, **kwargs) -> TrainConfig:
    return TrainConfig(train_file=str(train), validation_file=str(validation), **kwargs)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv"])
@pytest.mark.parametrize("label_as_word", [False, True])
def test_every_format_and_label_spelling_loads_the_same(tmp_path, suffix, label_as_word):
    path = write(tmp_path / f"rows{suffix}", ROWS, label_as_word)
    _, splits = load_splits(config_for(path, path))
    train = splits["train"]
    assert train["label"] == [0, 1, 2, 0]
    assert train["premise"] == [r["premise"] for r in ROWS]
    assert train["hypothesis"] == [r["hypothesis"] for r in ROWS]


def test_labels_outside_the_label_set_are_reported_with_a_row(tmp_path):
    rows = [*ROWS, {"premise": "p", "hypothesis": "h", "label": 3}]
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ConfigError, match=r"bad.jsonl: label value\(s\) 3 \(first at row 4\)"):
        load_splits(config_for(path, path))


def test_missing_columns_lists_what_was_found(tmp_path):
    path = tmp_path / "cols.jsonl"
    path.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "label": 0}) + "\n")
    with pytest.raises(
        ConfigError, match="premise, hypothesis; found sentence1, sentence2, label .*text_columns"
    ):
        load_splits(config_for(path, path))


def test_missing_and_empty_files_are_named(tmp_path):
    good = write(tmp_path / "good.jsonl", ROWS)
    with pytest.raises(ConfigError, match="nope.jsonl does not exist"):
        load_splits(config_for(tmp_path / "nope.jsonl", good))
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ConfigError, match="empty.csv is empty"):
        load_splits(config_for(good, empty))


def test_sample_limits(tmp_path):
    path = write(tmp_path / "rows.jsonl", ROWS)
    _, splits = load_splits(config_for(path, path, max_train_samples=3, max_eval_samples=2))
    assert (len(splits["train"]), len(splits["validation_matched"])) == (3, 2)


def test_tokenized_splits_are_cached(tmp_path, tiny_model_dir):
    """A second run on the same data reads the tokenized rows from the datasets cache."""
    from transformers import AutoTokenizer

    from finetune.data.tokenization import tokenize_splits

    path = write(tmp_path / "rows.jsonl", ROWS)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    accelerator = Accelerator(cpu=True)
    first = tokenize_splits(*load_splits(config_for(path, path)), tokenizer, 32, accelerator)["train"]
    second = tokenize_splits(*load_splits(config_for(path, path)), tokenizer, 32, accelerator)["train"]
    assert first.cache_files and first.cache_files == second.cache_files
    assert second["length"] == [len(ids) for ids in second["input_ids"]]


def test_the_tokens_cache_is_keyed_by_everything_that_decides_the_tokens(tmp_path, tiny_model_dir):
    """The cache key finetune gives datasets (instead of datasets pickling the tokenizer to hash it):
    another tokenizer, another --max_length or other rows never get the cached tokens of the first."""
    from transformers import AutoTokenizer

    from tests.backbones import decoder_tokenizer

    path = write(tmp_path / "rows.jsonl", ROWS)
    accelerator = Accelerator(cpu=True)
    bert = AutoTokenizer.from_pretrained(tiny_model_dir)
    cased = AutoTokenizer.from_pretrained(tiny_model_dir, do_lower_case=False)  # same files, other tokens
    split_special = AutoTokenizer.from_pretrained(tiny_model_dir, split_special_tokens=True)
    llama = decoder_tokenizer()

    def train(tokenizer, max_length=32, rows=path):
        return tokenize_splits(*load_splits(config_for(rows, rows)), tokenizer, max_length, accelerator)[
            "train"
        ]

    first = train(bert)
    assert first._fingerprint == train(bert)._fingerprint  # the same key: cached
    others = [
        train(cased),
        train(llama),
        train(bert, 8),
        train(bert, rows=write(tmp_path / "b.jsonl", ROWS[::-1])),
        train(split_special),
    ]
    assert len({first._fingerprint, *(o._fingerprint for o in others)}) == 6
    for other, tokenizer, max_length in zip(others[:3], (cased, llama, bert), (32, 32, 8), strict=True):
        assert other["input_ids"][0] == tokenizer(ROWS[0]["premise"], ROWS[0]["hypothesis"], truncation=True,
                                                  max_length=max_length)["input_ids"]  # fmt: skip
    assert others[0]["input_ids"] != first["input_ids"]  # cased WordPiece splits "A" otherwise


LENGTHS = [((i * 7919) % 97) + 3 for i in range(1000)]


@pytest.mark.parametrize("group_by_length", [True, False])
def test_sampler_yields_every_index_once_per_epoch(group_by_length):
    sampler = LengthGroupedSampler(LENGTHS, 24, seed=1, group_by_length=group_by_length, mega_batches=10)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        assert sorted(sampler) == list(range(len(LENGTHS)))


def test_sampler_groups_lengths_and_reshuffles_every_epoch():
    batch = 16
    grouped = LengthGroupedSampler(LENGTHS, batch, seed=1)
    plain = LengthGroupedSampler(LENGTHS, batch, seed=1, group_by_length=False)

    def padded_tokens(order):
        batches = [order[i : i + batch] for i in range(0, len(order), batch)]
        return sum(max(LENGTHS[j] for j in b) * len(b) for b in batches)

    assert padded_tokens(list(grouped)) < 0.7 * padded_tokens(list(plain))
    first = list(grouped)
    grouped.set_epoch(1)
    assert list(grouped) != first
    grouped.set_epoch(0)
    assert list(grouped) == first  # a pure function of (seed, epoch): resume sees the same order


def test_sampler_shuffles_the_batches_not_a_long_to_short_sawtooth():
    """Sorted batches (HF Trainer's group_by_length) run long to short through each mega-batch."""
    batch = 16
    order = list(LengthGroupedSampler(LENGTHS, batch, seed=1, mega_batches=50))
    longest = [max(LENGTHS[i] for i in order[s : s + batch]) for s in range(0, len(order), batch)]
    falls = sum(a >= b for a, b in itertools.pairwise(longest))
    assert falls < 0.75 * (len(longest) - 1)  # in sorted order nearly every step falls


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("rows", [1000, 13, 9, 2, 1])
def test_each_row_once_an_epoch_in_as_many_micro_batches_on_every_rank(world_size, rows):
    """Through Accelerate's own sharding, as `prepare` shards the train loader: every row once, on any
    world size and row count; every rank the plan's micro-batches; a full global batch's rows where
    Accelerate's sharding of whole batches put them; a rank the last one leaves empty a placeholder."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from finetune.data.batching import RankBatches
    from finetune.training.steps import plan_steps

    batch, lengths = 4, LENGTHS[:rows]
    sampler = LengthGroupedSampler(lengths, batch * world_size, seed=3)
    batches = RankBatches(sampler, batch, world_size)
    micro = plan_steps(rows, batch, 1, world_size, 1).micro_batches_per_epoch
    for epoch in (0, 1):
        batches.set_epoch(epoch)
        shards = [list(BatchSamplerShard(batches, world_size, rank)) for rank in range(world_size)]
        assert [len(shard) for shard in shards] == [micro] * world_size
        seen = [i for shard in shards for b in shard for i in b if i >= 0]
        assert sorted(seen) == list(range(rows))  # none repeated, none missing
        placeholders = [b for shard in shards for b in shard if b[0] < 0]
        last = rows % (batch * world_size)  # the short last global batch's rows (0: none is short)
        assert len(placeholders) == (world_size - last if 0 < last < world_size else 0)
        shortest = min(range(rows), key=lengths.__getitem__)
        assert all(shard[-1] == [~shortest] for shard in shards if shard[-1][0] < 0)  # only ever last
        whole = rows // (batch * world_size)
        accelerate = [list(BatchSamplerShard(BatchSampler(sampler, batch, False), world_size, rank))
                      for rank in range(world_size)]  # fmt: skip
        assert [shard[:whole] for shard in shards] == [shard[:whole] for shard in accelerate]


def test_a_placeholder_batch_is_marked_and_real_ones_are_not(tmp_path, tiny_model_dir):
    """9 rows, 2 ranks x 4: the last global batch's one row goes to rank 0, rank 1 gets the shortest
    row marked as a placeholder (a Python bool), collated as any batch."""
    from finetune.data.batching import PLACEHOLDER

    write(tmp_path / "train.jsonl", ROWS * 2 + ROWS[:1])
    train = str(tmp_path / "train.jsonl")
    config = TrainConfig(train_file=train, validation_file=train, per_device_train_batch_size=4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenized = tokenize_splits(*load_splits(config), tokenizer, 64, Accelerator(cpu=True))
    loader = build_dataloaders(tokenized, tokenizer, config, world_size=2, on_gpu=False)["train"]
    batches = list(loader)  # unsharded: rank 0's and rank 1's micro-batches in turn
    assert [len(b["labels"]) for b in batches] == [4, 4, 1, 1]
    assert [b.get(PLACEHOLDER) for b in batches] == [None, None, None, True]
    shortest = min(tokenized["train"]["length"])
    assert int(batches[-1]["attention_mask"].sum()) == shortest


@pytest.mark.parametrize(
    ("side", "multiple", "pad_token", "label"),
    [("right", None, None, 1), ("right", 8, None, 1), ("left", 8, "[UNK]", 1), ("right", None, None, 0.5)],
)
def test_pad_collator_builds_the_batches_of_transformers_collator(
    tiny_model_dir, side, multiple, pad_token, label
):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, padding_side=side)
    if pad_token:  # the pad id comes from the tokenizer, not 0
        tokenizer.pad_token = pad_token
    pairs = [(r["premise"], r["hypothesis"]) for r in ROWS] + [
        ("A much longer premise, with more words.", "")
    ]
    encoded = tokenizer([p for p, _ in pairs], [h for _, h in pairs])
    features = [{**{k: encoded[k][i] for k in encoded}, "labels": label, "row": i} for i in range(len(pairs))]
    expected = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)(features)
    batch = PadCollator(tokenizer, pad_to_multiple_of=multiple)(features)
    assert batch.keys() == expected.keys()
    for key in expected:
        assert batch[key].dtype == expected[key].dtype, key
        assert torch.equal(batch[key], expected[key]), key


def test_loaders_sort_by_plain_lengths(tmp_path, tiny_model_dir):
    """The lengths are read once into a list: indexing datasets' lazy Column reads Arrow each time."""
    write(tmp_path / "train.jsonl", ROWS * 3)
    config = TrainConfig(
        train_file=str(tmp_path / "train.jsonl"), validation_file=str(tmp_path / "train.jsonl")
    )
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenized = tokenize_splits(*load_splits(config), tokenizer, 64, Accelerator(cpu=True))
    loaders = build_dataloaders(tokenized, tokenizer, config, world_size=1, on_gpu=False)
    assert type(loaders["train"].batch_sampler.sampler.lengths) is list
    evaluation = next(loader for name, loader in loaders.items() if name != "train")
    lengths = [int(b["attention_mask"].sum(-1).max()) for b in evaluation]
    assert lengths == sorted(lengths)
