"""--long_documents sliding_window in process: the windows' bounds and overlap, the pair case, the
refusals, and windows grouped back into documents whatever their order."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import AutoTokenizer

from finetune.config.train_config import TrainConfig
from finetune.data.windows import by_document, encode_windows
from finetune.errors import ConfigError
from tests.helpers import minilm_dir

TEXT = " ".join(f"w{i}" for i in range(40))  # 'w', '##i': 80 tokens


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(minilm_dir())


def words(tokenizer, ids) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids)


def test_windows_overlap_by_the_stride_and_cover_the_text(tokenizer):
    encoded = encode_windows(tokenizer, [[TEXT, "short"]], max_length=16, doc_stride=4)
    windows = [words(tokenizer, ids) for ids in encoded["input_ids"]]
    assert encoded["doc"] == [0] * (len(windows) - 1) + [1]
    assert all(len(w) <= 16 and w[0] == "[CLS]" and w[-1] == "[SEP]" for w in windows)
    body = [w[1:-1] for w in windows[:-1]]
    for before, after in zip(body, body[1:], strict=False):
        assert before[-4:] == after[:4]  # doc_stride tokens shared by consecutive windows
    covered = body[0] + [t for w in body[1:] for t in w[4:]]
    assert covered == tokenizer.tokenize(TEXT)


def test_a_pair_windows_its_first_text_and_keeps_the_second_whole(tokenizer):
    encoded = encode_windows(tokenizer, [[TEXT], ["x y z"]], max_length=20, doc_stride=3)
    windows = [words(tokenizer, ids) for ids in encoded["input_ids"]]
    assert len(windows) > 3 and set(encoded["doc"]) == {0}
    assert all(w[-5:] == ["[SEP]", "x", "y", "z", "[SEP]"] and len(w) <= 20 for w in windows)
    firsts = [w[1 : w.index("[SEP]")] for w in windows]
    assert all(a[-3:] == b[:3] for a, b in zip(firsts, firsts[1:], strict=False))


def test_a_stride_as_long_as_the_room_is_refused(tokenizer):
    with pytest.raises(ConfigError) as refused:
        encode_windows(tokenizer, [[TEXT]], max_length=16, doc_stride=14)  # room: 16 - [CLS] [SEP]
    assert refused.value.flag == "--doc_stride" and "below 14" in refused.value.fix


def test_a_second_text_that_fills_the_window_is_refused(tokenizer):
    with pytest.raises(ConfigError) as refused:
        encode_windows(tokenizer, [[TEXT], [TEXT]], max_length=32, doc_stride=4)
    assert refused.value.flag == "--max_length" and "--max_length" in refused.value.fix


@pytest.mark.parametrize("second", [None, " ".join(["a"] * 30)], ids=["single", "pair"])
@pytest.mark.parametrize("stride", [None, 6], ids=["default stride", "--doc_stride 6"])
def test_every_value_a_refusal_names_passes_and_its_max_length_is_the_smallest(tokenizer, second, stride):
    """A fix's --max_length failed the next check ("raise --max_length above 83", then 84 refused: the
    default stride, a quarter of it, left no progress), and a fix's --doc_stride could be no stride at
    all ("below 1, e.g. 1"). Now each value named passes every check, and the --max_length is the
    smallest that does."""
    texts = [[TEXT]] if second is None else [[TEXT], [second]]

    def refusal(max_length: int, doc_stride: int | None = None) -> ConfigError | None:
        doc_stride = doc_stride or stride or max_length // 4
        try:
            encode_windows(tokenizer, texts, max_length, doc_stride, default_stride=stride is None)
        except ConfigError as refused:
            return refused
        return None

    refused_at = [m for m in range(1, 60) if refusal(m)]
    assert refused_at  # each case meets the refusals
    for max_length in refused_at:
        fix = refusal(max_length).fix
        named = re.search(r"--max_length (above )?(\d+)", fix)
        assert named, fix
        enough = int(named.group(2)) + bool(named.group(1))
        assert refusal(enough) is None and refusal(enough - 1) is not None, fix
        if given := re.search(r"--doc_stride below \d+, e\.g\. (\d+)", fix):
            assert refusal(max_length, int(given.group(1))) is None, fix


def test_doc_stride_needs_sliding_window():
    with pytest.raises(ConfigError) as refused:
        TrainConfig(doc_stride=8)
    assert refused.value.flag == "--doc_stride"
    assert TrainConfig(long_documents="sliding_window").window_stride == 32


@pytest.mark.parametrize("columns", [3, 1])  # classes (single- and multi-label), a regression score
def test_windows_group_into_documents_in_any_order(columns):
    docs = torch.tensor([4, 4, 2, 4, 7, 2])
    keys = torch.tensor([1, 1, 0, 1, 2, 0])
    logits = torch.randn(6, columns)
    found, doc_keys, mean, counts = by_document(docs, keys, logits, "mean")
    assert found.tolist() == [2, 4, 7] and doc_keys.tolist() == [0, 1, 2] and counts.tolist() == [2, 3, 1]
    torch.testing.assert_close(mean[1], logits[[0, 1, 3]].mean(0))
    _, _, high, _ = by_document(docs, keys, logits, "max")
    torch.testing.assert_close(high[0], logits[[2, 5]].amax(0))  # per class: the highest window's
    shuffled = torch.randperm(6)  # another rank layout: the same documents, the same logits
    again = by_document(docs[shuffled], keys[shuffled], logits[shuffled], "mean")
    torch.testing.assert_close(again[2], mean, rtol=0, atol=1e-7)


def test_every_window_gets_the_tokenizers_special_tokens():
    """A decoder-style tokenizer that adds a BOS token: each window starts with it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<s>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(40)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", pad_token="<pad>")
    encoded = encode_windows(tokenizer, [[TEXT]], max_length=10, doc_stride=3)
    windows = encoded["input_ids"]
    assert len(windows) > 4 and all(w[0] == 0 and 0 not in w[1:] and len(w) <= 10 for w in windows)
    assert all(a[-3:] == b[1:4] for a, b in zip(windows, windows[1:], strict=False))


def test_document_weighting_weighs_each_window_by_one_over_its_windows(tokenizer):
    """Training windows carry 1 / their document's windows; the loss of a batch divided by the sum of
    its weights is the hand-computed weighted mean, i.e. the mean over documents of their windows' mean."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from datasets import Dataset

    from finetune.data.batching import PadCollator
    from finetune.data.tasks import custom_task
    from finetune.data.tokenization import tokenize_splits
    from finetune.families.sequence_classification.evaluation import loss_sum

    task = custom_task(("text",), ("a", "b", "c"))
    rows = Dataset.from_dict({"text": [TEXT, "short", TEXT[:40], "x y"], "label": [0, 2, 1, 1]})
    accelerator = SimpleNamespace(main_process_first=nullcontext)
    train = tokenize_splits(task, {"train": rows}, tokenizer, 16, accelerator, 4, weigh_documents=True)[
        "train"
    ]
    docs = encode_windows(tokenizer, [list(rows["text"])], 16, 4)["doc"]
    windows = [docs.count(d) for d in docs]
    assert max(windows) > 3 and min(windows) == 1
    batch = PadCollator(tokenizer)([train[i] for i in range(len(train))])
    torch.testing.assert_close(batch["weight"], torch.tensor([1 / n for n in windows]))
    logits = torch.randn(len(docs), 3, generator=torch.Generator().manual_seed(0))
    labels, weight = batch["labels"], batch["weight"]
    window_loss = -logits.log_softmax(dim=-1)[torch.arange(len(docs)), labels]
    weighted_mean = (weight * window_loss).sum() / weight.sum()
    torch.testing.assert_close(loss_sum(logits, labels, task, weight) / weight.sum(), weighted_mean)
    per_document = [window_loss[[i for i, d in enumerate(docs) if d == doc]].mean() for doc in range(4)]
    torch.testing.assert_close(weighted_mean, torch.stack(per_document).mean())
    unweighted = tokenize_splits(task, {"train": rows}, tokenizer, 16, accelerator, 4)["train"]
    assert "weight" not in unweighted.column_names  # --window_loss_weighting window: the loss as before


def test_an_update_is_the_weighted_mean_over_its_micro_batches_and_processes():
    """The loop's arithmetic: each micro-batch's weighted sum / the micro-batch size, divided by the
    accumulation steps (Accelerate) and averaged over processes (DDP), then rescaled by the update's
    weights summed over every rank: the gradient of the weighted mean over all the update's windows."""
    from types import SimpleNamespace

    from finetune.training.loop import _average_over_real_window

    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(12, 5, generator=generator), torch.rand(12, generator=generator) + 0.1
    ranks, steps, size = 2, 3, 2  # 2 processes x 3 micro-batches x 2 windows: a full update of 12

    def gradient(rows, scale):
        parameter = torch.ones(5, requires_grad=True)
        (((x[rows] @ parameter) ** 2 * weight[rows]).sum() * scale).backward()
        return parameter.grad

    per_rank = [sum(gradient(slice(r * 6 + s * 2, r * 6 + s * 2 + 2), 1 / size / steps) for s in range(3))
                for r in range(ranks)]  # fmt: skip
    accumulated = SimpleNamespace(grad=sum(per_rank) / ranks)  # DDP's all-reduce: the mean over ranks
    model = SimpleNamespace(parameters=lambda: [accumulated])
    sums = [weight[:6].sum(dtype=torch.float64), weight[6:].sum(dtype=torch.float64)]
    accelerator = SimpleNamespace(num_processes=ranks, device="cpu", reduce=lambda t, op: sums[0] + sums[1])
    _average_over_real_window(accelerator, model, size * steps, ranks * steps * size, sums[0])
    expected = gradient(slice(None), 1 / weight.sum())
    torch.testing.assert_close(accumulated.grad, expected)


def test_document_weighting_needs_sliding_window_and_is_its_default():
    from finetune.config.identity import differences

    with pytest.raises(ConfigError) as refused:
        TrainConfig(window_loss_weighting="document")
    assert refused.value.flag == "--window_loss_weighting"
    assert refused.value.fix == "add --long_documents sliding_window or drop --window_loss_weighting"
    assert TrainConfig(long_documents="sliding_window").window_loss_weighting == "document"
    assert TrainConfig().window_loss_weighting == "window"  # a truncated document is one window
    # Runs recorded before the flag weighed windows: a finished truncated run is still the same run.
    assert differences({"seed": 1}, {"seed": 1, "window_loss_weighting": "window"}) == []
    assert differences({"seed": 1}, {"seed": 1, "window_loss_weighting": "document"}) == [
        "window_loss_weighting"
    ]


@pytest.mark.parametrize(
    ("task_type", "flags", "flag"),
    [
        ("causal_lm", {"doc_stride": 16}, "--doc_stride"),
        ("causal_lm", {"window_loss_weighting": "document"}, "--window_loss_weighting"),
        ("token_classification", {"window_loss_weighting": "document"}, "--window_loss_weighting"),
    ],
)
def test_window_flags_on_a_family_without_sliding_window_advise_dropping_them(task_type, flags, flag):
    """These families refuse --long_documents (config/families.py: classifiers read it), so advising
    --long_documents sliding_window only moved the refusal: the fix is to drop the flag, and with it
    dropped the config is taken."""
    from finetune.families import FLAG_OWNERS as OWNERS

    assert task_type not in OWNERS["long_documents"].families  # the old advice, refused for the family
    files = {"train_file": "t.jsonl", "validation_file": "v.jsonl"}
    with pytest.raises(ConfigError) as refused:
        TrainConfig(task_type=task_type, **files, **flags)
    assert refused.value.flag == flag and refused.value.fix == f"drop {flag}"
    assert "sliding_window" not in str(refused.value).split("; ")[-1]
    assert TrainConfig(task_type=task_type, **files).long_documents == "truncate"
