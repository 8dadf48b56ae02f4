"""DPO's rows (issue #61): the preference format from the columns, the implicit prompt of chosen and
rejected alone, every bad row refused in one line naming its file and row, and each pair's two sequences
masked as SFT masks the same prompt and completion, cut to --max_length by the documented rule, with
pairs that teach nothing dropped and counted on the task line."""

from __future__ import annotations

import contextlib
import copy
import json
from types import SimpleNamespace

import pytest
from tokenizers.processors import TemplateProcessing

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE, encode_row
from finetune.families.dpo.data import encode_pairs, load_preference_splits
from finetune.families.dpo.formats import implicit_prompt
from finetune.families.dpo.pairs import truncation
from tests.chat_models import IM_END, chatml_tokenizer, target_runs

ONE_PROCESS = SimpleNamespace(main_process_first=contextlib.nullcontext)
PROMPT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Is the river wide?"}]
CHOSEN = [{"role": "assistant", "content": "Yes, very wide."}]
REJECTED = [{"role": "assistant", "content": "No, it is a narrow stream."}]
STANDARD = {"prompt": "The river is", "chosen": " wide and deep.", "rejected": " narrow."}
HH = "\n\nHuman: Is the river wide?\n\nAssistant:"


@pytest.fixture(scope="module")
def chatml():
    return chatml_tokenizer()


def write(tmp_path, rows: list[dict], name: str = "train.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def config_for(train: str, max_length: int = 512, **flags) -> TrainConfig:
    """A run's config as DPO reads it (task_type causal_lm: the flags it reads are the same)."""
    flags.setdefault("eval_strategy", "no")
    return TrainConfig(task_type="causal_lm", train_file=train, max_length=max_length, **flags)


def encoded(tmp_path, rows: list[dict], tokenizer, max_length: int = 512, **flags):
    config = config_for(write(tmp_path, rows), max_length, **flags)
    task, splits = load_preference_splits(config)
    return task, encode_pairs(task, splits, tokenizer, config, ONE_PROCESS)


def refused(tmp_path, rows: list[dict], row: int) -> ConfigError:
    source = write(tmp_path, rows)
    with pytest.raises(ConfigError) as error:
        load_preference_splits(config_for(source))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{source}: row {row} "), message
    assert error.value.fix and message.endswith(f"; {error.value.fix}")
    return error.value


def side(example: dict, name: str):
    """One sequence of an encoded pair, as target_runs reads an SFT row."""
    return SimpleNamespace(input_ids=example[f"{name}_input_ids"], labels=example[f"{name}_labels"])


# Formats


@pytest.mark.parametrize(
    ("row", "fmt"),
    [
        (STANDARD, "strings, explicit prompt"),
        ({"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}, "conversational, explicit prompt"),
        ({"chosen": HH + " Yes.", "rejected": HH + " No."}, "strings, implicit prompt"),
        ({"chosen": PROMPT + CHOSEN, "rejected": PROMPT + REJECTED}, "conversational, implicit prompt"),
    ],
)
def test_each_format_is_detected_from_its_columns_and_said_on_the_task_line(tmp_path, chatml, row, fmt):
    task, splits = encoded(
        tmp_path, [row, row | {"chosen": row["rejected"], "rejected": row["chosen"]}], chatml
    )
    assert task.summary().startswith(f"dpo: 2 pairs ({fmt}) from {tmp_path / 'train.jsonl'}")
    assert task.metric_keys() == ["eval_rewards/accuracies", "eval_rewards/margins"]
    assert splits["train"]["row"] == [0, 1]


def test_a_file_without_chosen_or_rejected_is_refused_naming_its_columns(tmp_path):
    source = write(tmp_path, [{"prompt": "Q", "completion": " A"}])
    with pytest.raises(ConfigError) as error:
        load_preference_splits(config_for(source))
    assert str(error.value).startswith(f"{source} has no preference pairs (no chosen or rejected column; ")
    assert "its columns: prompt, completion" in str(error.value)
    assert error.value.fix.startswith("give it `prompt`, `chosen` and `rejected` columns")


# The implicit prompt


def test_an_implicit_string_prompt_ends_after_the_last_assistant_marker_both_share():
    chosen = HH + " Yes, it is.\n\nHuman: How wide?\n\nAssistant: A mile."
    rejected = HH + " Yes, it is.\n\nHuman: How wide?\n\nAssistant: An inch."
    cut = implicit_prompt(chosen, rejected)
    assert chosen[:cut] == HH + " Yes, it is.\n\nHuman: How wide?\n\nAssistant:"
    assert (chosen[cut:], rejected[cut:]) == (" A mile.", " An inch.")


def test_an_implicit_string_prompt_without_the_marker_ends_at_the_shared_starts_last_whitespace():
    cut = implicit_prompt("The river is bluish green", "The river is blue")
    assert cut == len("The river is")  # not inside "blu": the completions begin with their space
    assert implicit_prompt("Yes", "No") == implicit_prompt("Yes", "Yesterday") == 0


def test_an_implicit_conversation_prompt_is_the_messages_both_share(tmp_path, chatml):
    chosen, rejected = PROMPT + CHOSEN, PROMPT + REJECTED
    assert implicit_prompt(chosen, rejected) == len(PROMPT)
    _, implicit = encoded(tmp_path, [{"chosen": chosen, "rejected": rejected}], chatml)
    _, explicit = encoded(tmp_path, [{"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}], chatml)
    assert implicit["train"][0] == explicit["train"][0]


def test_an_implicit_conversation_in_parquet_shares_the_turns_arrow_pads_with_nulls(tmp_path, chatml):
    """Arrow gives a column's messages every field any of them has: chosen's system turn reads with the
    `weight` its reply has, rejected's without, and they are still the same prompt turn."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {"chosen": PROMPT + [CHOSEN[0] | {"weight": 1}], "rejected": PROMPT + REJECTED}
    pq.write_table(pa.Table.from_pylist([row]), tmp_path / "train.parquet")
    config = config_for(str(tmp_path / "train.parquet"))
    task, splits = load_preference_splits(config)
    pair = encode_pairs(task, splits, chatml, config, ONE_PROCESS)["train"][0]
    _, explicit = encoded(tmp_path, [{"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}], chatml)
    assert task.format == "implicit_conversational" and pair == explicit["train"][0]


# Masks: SFT's


def test_a_conversational_pair_is_masked_as_sft_masks_its_prompt_and_completion(tmp_path, chatml):
    rows = [{"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}]
    _, splits = encoded(tmp_path, rows, chatml)
    pair = splits["train"][0]
    for name, completion in (("chosen", CHOSEN), ("rejected", REJECTED)):
        sft = encode_row({"prompt": PROMPT, "completion": completion}, "prompt_completion", chatml,
                         max_length=512, row_number=0, source="sft.jsonl")  # fmt: skip
        conversation = encode_row({"messages": PROMPT + completion}, "messages", chatml, max_length=512,
                                  row_number=0, source="sft.jsonl")  # fmt: skip
        assert pair[f"{name}_input_ids"] == sft.input_ids == conversation.input_ids
        assert pair[f"{name}_labels"] == sft.labels == conversation.labels
        assert target_runs(chatml, side(pair, name)) == [completion[0]["content"] + IM_END]
        assert pair[f"{name}_targets"] == sum(label != IGNORE for label in sft.labels[1:])
    assert pair["length"] == max(len(pair["chosen_input_ids"]), len(pair["rejected_input_ids"]))


def test_a_string_pair_trains_on_each_completion_and_one_eos(tmp_path, chatml):
    rows = [STANDARD, STANDARD | {"chosen": f" wide.{IM_END}"}]  # an EOS already there is not doubled
    _, splits = encoded(tmp_path, rows, chatml)
    first, second = splits["train"]
    assert first["chosen_input_ids"] == chatml("The river is wide and deep.")["input_ids"] + [
        chatml.eos_token_id
    ]
    assert target_runs(chatml, side(first, "chosen")) == [f" wide and deep.{IM_END}"]
    assert target_runs(chatml, side(first, "rejected")) == [f" narrow.{IM_END}"]
    assert second["chosen_input_ids"].count(chatml.eos_token_id) == 1
    assert target_runs(chatml, side(second, "chosen")) == [f" wide.{IM_END}"]


def test_a_tokenizer_that_appends_eos_gives_each_completion_one_eos_and_the_prompt_none(tmp_path, chatml):
    """trl#4481: an EOS the tokenizer (or the chat template) already wrote is not appended again."""
    tokenizer = copy.deepcopy(chatml)
    ends = [(IM_END, tokenizer.eos_token_id)]
    tokenizer._tokenizer.post_processor = TemplateProcessing(single=f"$A {IM_END}", special_tokens=ends)
    _, splits = encoded(tmp_path, [STANDARD], tokenizer)
    pair = splits["train"][0]
    for name in ("chosen", "rejected"):
        assert pair[f"{name}_input_ids"].count(tokenizer.eos_token_id) == 1
        assert target_runs(tokenizer, side(pair, name)) == [STANDARD[name] + IM_END]
    _, conversational = encoded(
        tmp_path, [{"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}], chatml
    )
    turns = len(PROMPT) + 1  # ChatML closes every turn with <|im_end|>, the EOS: nothing after the last
    assert conversational["train"][0]["chosen_input_ids"].count(chatml.eos_token_id) == turns


# Truncation


def test_the_truncation_rule_keeps_the_prompts_end_and_the_same_completion_budget_for_both():
    assert truncation(10, 20, 64) == (10, 20)  # within max_length: everything
    assert truncation(50, 30, 64) == (34, 30)  # the prompt cut first: the completions whole
    assert truncation(100, 100, 64) == (32, 32)  # both long: the completion keeps max_length // 2
    assert truncation(10, 100, 64) == (10, 54)  # a short prompt whole, the completions cut to fit
    assert truncation(1, 100, 64) == (1, 63)


def test_a_long_pair_keeps_its_prompts_end_and_cuts_both_completions_the_same(tmp_path, chatml):
    long_prompt = " ".join(f"river{i}" for i in range(40))
    row = {"prompt": long_prompt, "chosen": " wide and deep " * 20, "rejected": " narrow " * 30}
    _, whole = encoded(tmp_path, [row], chatml, max_length=4096)
    task, cut = encoded(tmp_path, [row], chatml, max_length=64)
    full, pair = whole["train"][0], cut["train"][0]
    prompt = full["chosen_labels"].index(next(label for label in full["chosen_labels"] if label != IGNORE))
    assert prompt > 32 and len(full["chosen_input_ids"]) - prompt > 32  # both over max_length // 2
    for name in ("chosen", "rejected"):
        ids, labels = pair[f"{name}_input_ids"], pair[f"{name}_labels"]
        assert len(ids) == 64 and ids[:32] == full[f"{name}_input_ids"][prompt - 32 : prompt]  # prompt's end
        assert ids[32:] == full[f"{name}_input_ids"][prompt : prompt + 32] and labels[:32] == [IGNORE] * 32
    assert task.counts["train"]["truncated"] == 1 and "; 1 truncated" in task.summary()


# Dropped pairs


def test_pairs_that_teach_no_preference_are_dropped_and_counted_on_the_task_line(tmp_path, chatml):
    rows = [
        STANDARD,
        STANDARD | {"rejected": STANDARD["chosen"]},  # the same completion
        STANDARD | {"chosen": " wide" * 40 + " and deep.", "rejected": " wide" * 40 + " and shallow."},
        {"prompt": "The river is", "chosen": " wide.", "rejected": " wide."},
    ]
    task, splits = encoded(tmp_path, rows, chatml, max_length=24)
    assert splits["train"]["row"] == [0]  # each kept pair's number in its split
    counts = task.counts["train"]
    assert (counts["rows"], counts["pairs"], counts["identical"], counts["identical_within_max_length"]) == (
        4, 1, 2, 1,
    )  # fmt: skip
    assert "; 2 dropped: chosen equals rejected; 1 dropped: chosen equals rejected within --max_length" in (
        task.summary()
    )


def test_an_implicit_pair_left_with_an_empty_completion_is_dropped(tmp_path, chatml):
    rows = [{"chosen": HH, "rejected": HH + " No."}, {"chosen": HH + " Yes.", "rejected": HH + " No."}]
    task, splits = encoded(tmp_path, rows, chatml)
    assert splits["train"]["row"] == [1] and task.counts["train"]["no_completion"] == 1
    assert "1 dropped: no completion token left" in task.summary()


def test_pairs_cut_to_no_predicted_completion_token_are_counted_in_the_refusal(tmp_path, chatml):
    """At --max_length 1 a pair keeps 1 token: the prompt's last, or, with an empty prompt (no BOS), the
    completion's first, which nothing before it predicts. Neither has a target: the split is refused."""
    rows = [STANDARD, {"prompt": "", "chosen": " wide.", "rejected": " narrow."}]
    config = config_for(write(tmp_path, rows), max_length=1)
    task, splits = load_preference_splits(config)
    with pytest.raises(ConfigError, match=r"no pair is left to train on \(2 no completion token left; --max"):
        encode_pairs(task, splits, chatml, config, ONE_PROCESS)
    _, kept = encoded(tmp_path, rows, chatml, max_length=2)  # 1 completion token each, predicted
    assert kept["train"]["chosen_targets"] == kept["train"]["rejected_targets"] == [1, 1]
    assert [len(ids) for ids in kept["train"]["chosen_input_ids"]] == [2, 2]


def test_a_split_left_with_no_pair_is_refused_naming_its_file(tmp_path, chatml):
    source = write(tmp_path, [STANDARD | {"rejected": STANDARD["chosen"]}])
    config = config_for(source)
    task, splits = load_preference_splits(config)
    with pytest.raises(ConfigError) as error:
        encode_pairs(task, splits, chatml, config, ONE_PROCESS)
    assert str(error.value).startswith(f"{source}: no pair is left to train on (1 chosen equals rejected; ")
    assert error.value.fix == "give pairs whose chosen and rejected completions differ within --max_length"


# Refusals: the file, the row and the fix


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"prompt": PROMPT, "chosen": CHOSEN, "rejected": {"role": "assistant"}},
         "has a rejected cell that is not a list of messages"),
        ({"prompt": PROMPT, "chosen": [], "rejected": REJECTED}, "has an empty chosen list"),
        ({"prompt": PROMPT, "chosen": CHOSEN, "rejected": ["No."]}, "has a rejected cell that is not a list"),
        ({"prompt": PROMPT, "chosen": [{"role": "user", "content": "Hm."}], "rejected": REJECTED},
         "has no assistant turn in its chosen to train on"),
        ({"prompt": PROMPT, "chosen": " Yes.", "rejected": " No."},
         "has its chosen as a string, among rows that have messages"),
    ],
)  # fmt: skip
def test_each_bad_conversational_row_is_refused_naming_its_file_and_row(tmp_path, bad, says):
    good = {"prompt": PROMPT, "chosen": CHOSEN, "rejected": REJECTED}
    assert says in str(refused(tmp_path, [good, bad], 1))


@pytest.mark.parametrize(
    ("bad", "says", "fix"),
    [
        (STANDARD | {"chosen": "  "}, "has an empty chosen", "give it its chosen, or drop the row"),
        (STANDARD | {"rejected": None}, "has no rejected (null)",
         "give every row its rejected, or drop the row"),
        ({"chosen": " Yes.", "rejected": " No."}, "has no prompt (null), among rows that have one",
         "give every row its prompt, or none (then chosen and rejected share their prompt)"),
        (STANDARD | {"chosen": CHOSEN}, "has its chosen as messages, among rows that have strings",
         "write every row's prompt, chosen and rejected the same way: strings, or lists of messages"),
    ],
)  # fmt: skip
def test_each_bad_string_row_is_refused_naming_its_file_row_and_fix(tmp_path, bad, says, fix):
    error = refused(tmp_path, [STANDARD, bad], 1)
    assert says in str(error) and error.fix == fix


def test_an_implicit_file_refuses_a_row_with_a_prompt_and_a_conversation_sharing_none(tmp_path):
    implicit = {"chosen": HH + " Yes.", "rejected": HH + " No."}
    assert "has a prompt, among rows that have none" in str(refused(tmp_path, [implicit, STANDARD], 1))
    first = [{"chosen": PROMPT + CHOSEN, "rejected": PROMPT + REJECTED}]
    unshared = {"chosen": CHOSEN, "rejected": REJECTED}
    error = refused(tmp_path, [*first, unshared], 1)
    assert (
        "share no prompt" in str(error)
        and error.fix == "begin both with the same prompt turns, or give a prompt column"
    )


def test_splits_of_different_formats_are_refused(tmp_path):
    train, validation = (
        write(tmp_path, [STANDARD]),
        write(tmp_path, [{"chosen": "A b", "rejected": "A c"}], "v.jsonl"),
    )
    with pytest.raises(
        ConfigError, match=r"the splits hold different formats \(.*train.jsonl: strings, explicit"
    ):
        load_preference_splits(config_for(train, validation_file=validation, eval_strategy="epoch"))


# Validation carved, and prompts to predict


def test_validation_pairs_are_carved_from_training_and_encoded_alike(tmp_path, chatml):
    rows = [STANDARD | {"chosen": f" wide{i}."} for i in range(10)]
    task, splits = encoded(tmp_path, rows, chatml, validation_split_percentage=20, eval_strategy="epoch")
    assert (len(splits["train"]), len(splits["validation"])) == (8, 2)
    assert "2 pairs from" in task.summary() and "(--validation_split_percentage 20)" in task.summary()


def test_an_implicit_test_file_becomes_the_prompts_generation_encodes(tmp_path, chatml):
    from finetune.families.causal_lm.generation import encode_prompts

    train = write(tmp_path, [STANDARD])
    test = write(tmp_path, [{"chosen": HH + " Yes.", "rejected": HH + " No."}], "test.jsonl")
    config = config_for(train, test_file=test, do_predict=True)
    task, splits = load_preference_splits(config)
    encoded_splits = encode_pairs(task, splits, chatml, config, ONE_PROCESS)
    assert encoded_splits["test"]["prompt"] == [HH]
    prompts = encode_prompts(task, {"test": encoded_splits["test"]}, chatml, config, task.sources)
    assert prompts["test"].rows[0]["input_ids"] == chatml(HH)["input_ids"]
    assert task.summary().endswith(f"; test: 1 prompt from {test}")


def test_a_prediction_only_run_reads_its_conversations_as_prompts(tmp_path):
    test = write(tmp_path, [{"messages": PROMPT}], "test.jsonl")
    config = TrainConfig(task_type="causal_lm", test_file=test, do_train=False, do_predict=True)
    task, splits = load_preference_splits(config)
    assert task.format == "conversational" and list(splits) == ["test"]


def test_a_dataset_folder_is_read_by_its_split_names(tmp_path, chatml):
    folder = tmp_path / "pairs"
    folder.mkdir()
    write(folder, [STANDARD], "train.jsonl")
    write(
        folder,
        [STANDARD | {"chosen": " wide."}, STANDARD | {"rejected": " wide and deep."}],
        "validation.jsonl",
    )
    config = TrainConfig(
        task_type="causal_lm", dataset_name=str(folder), eval_strategy="epoch", max_length=64
    )
    task, splits = load_preference_splits(config)
    encode_pairs(task, splits, chatml, config, ONE_PROCESS)
    assert task.summary() == (
        f"dpo: 1 pair (strings, explicit prompt) from {folder}:train; 1 pair from {folder}:validation; "
        "1 dropped: chosen equals rejected"
    )
