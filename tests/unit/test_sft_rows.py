"""Generative fine-tuning's rows (issue #45): the file's format from its columns, every bad row refused
in one line naming it, and each row's tokens and loss mask as TRL's conventions make them: a
conversation trains on its assistant turns through their end-of-turn token, a prompt-completion on its
completion and EOS, text on everything; templates and tokenizers that would break this are refused."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
from datasets import Dataset, load_dataset
from tokenizers.processors import TemplateProcessing

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE, encode_examples, encode_row
from finetune.families.causal_lm.rows import check_rows, detect_format
from tests.chat_models import CHATML, IM_END, chatml_tokenizer, target_runs

SOURCE = "train.jsonl"
BOS, HEADER, END_HEADER, EOT = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
LLAMA3 = (
    "{% for message in messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
"""Llama 3's template, less its date and tools: turns end with <|eot_id|> and no newline after it."""

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Is the river wide?"},
    {"role": "assistant", "content": "Yes, very wide."},
    {"role": "user", "content": "And deep?"},
    {"role": "assistant", "content": "Not at all."},
]


@pytest.fixture(scope="module")
def chatml():
    return chatml_tokenizer()


@pytest.fixture(scope="module")
def llama3(chatml):
    """The same BPE with Llama 3's special tokens and template; it adds its BOS as Llama 3's does."""
    tokenizer = copy.deepcopy(chatml)
    tokenizer.add_special_tokens({"additional_special_tokens": [BOS, HEADER, END_HEADER, EOT]})
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.chat_template = BOS, EOT, LLAMA3
    bos = [(BOS, tokenizer.bos_token_id)]
    tokenizer._tokenizer.post_processor = TemplateProcessing(single=f"{BOS} $A", special_tokens=bos)
    return tokenizer


def with_template(tokenizer, template: str | None):
    """A copy of `tokenizer` with another chat template: the fixtures' own stay as they are."""
    changed = copy.deepcopy(tokenizer)
    changed.chat_template = template
    return changed


def read(tmp_path, rows: list[dict]):
    """`rows` as a JSON lines file read by `datasets`, as the toolkit reads one (mixed types stay JSON)."""
    path = tmp_path / SOURCE
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))


def encode(row: dict, fmt: str, tokenizer, max_length: int = 512, **flags):
    return encode_row(row, fmt, tokenizer, max_length=max_length, row_number=7, source=SOURCE, **flags)


def refused(call, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as error:
        call(*args, **kwargs)
    assert "\n" not in str(error.value) and str(error.value).startswith(f"{SOURCE}: row ")
    return error.value


# Formats and rows


@pytest.mark.parametrize(
    ("columns", "fmt"),
    [
        (["messages"], "messages"),
        (["prompt", "completion", "id"], "prompt_completion"),
        (["text"], "text"),
        (["messages", "prompt", "completion", "text"], "messages"),  # a JSON lines file mixing formats
        (["prompt", "messages"], "messages"),  # UltraChat's columns: its prompt is the first user turn
        (["prompt", "text"], "text"),
    ],
)
def test_the_format_follows_trls_column_names(columns, fmt):
    assert detect_format(columns, SOURCE) == fmt


def test_a_file_in_no_format_is_refused_naming_it_its_columns_and_the_three_shapes():
    with pytest.raises(ConfigError) as error:
        detect_format(["question", "answer"], "data/qa.jsonl")
    assert str(error.value) == (
        "data/qa.jsonl has no column to train on (its columns: question, answer); give it a `messages` "
        "column, `prompt` and `completion` columns, or a `text` column"
    )


def test_good_rows_of_each_format_pass(tmp_path):
    tool = [{"role": "tool", "content": "42"}, {"role": "developer", "content": "Answer."}]
    check_rows(
        read(tmp_path, [{"messages": CONVERSATION}, {"messages": tool + CONVERSATION[1:3]}]),
        "messages",
        SOURCE,
    )
    strings = [{"prompt": "", "completion": "Once."}, {"prompt": "Say it:", "completion": " twice"}]
    check_rows(read(tmp_path, strings), "prompt_completion", SOURCE)
    conversational = [{"prompt": CONVERSATION[:2], "completion": CONVERSATION[2:3]}]
    check_rows(read(tmp_path, conversational * 2), "prompt_completion", SOURCE)
    check_rows(read(tmp_path, [{"text": "a"}, {"text": "b"}]), "text", SOURCE)


USER = {"role": "user", "content": "Hi"}
REPLY = {"role": "assistant", "content": "Hello."}
GOOD = {
    "messages": {"messages": [USER, REPLY]},
    "prompt_completion": {"prompt": "Q:", "completion": " A"},
    "text": {"text": "t"},
}
BAD_ROWS = [
    # (format, the bad row, what its error says)
    (
        "messages",
        {"prompt": "Q:", "completion": " A"},
        "is in the prompt_completion format, in a file of the messages",
    ),
    ("messages", {"text": "plain"}, "is in the text format"),
    ("messages", {"messages": None}, "has no messages (null)"),
    ("messages", {"messages": "Hi"}, "has a messages cell that is not a list of messages"),
    ("messages", {"messages": [["user", "Hi"]]}, "not a list of messages"),
    ("messages", {"messages": []}, "has an empty messages list"),
    ("messages", {"messages": [{"content": "Hi"}, REPLY]}, "has a message without a role (messages[0])"),
    (
        "messages",
        {"messages": [USER, {"role": "assistant"}]},
        "has a message without a content (messages[1])",
    ),
    ("messages", {"messages": [{"role": "bot", "content": "Hi"}]}, "the role 'bot' (messages[0])"),
    (
        "messages",
        {"messages": [{"role": "user", "content": 3}]},
        "content is not a string (messages[0]: int)",
    ),
    (
        "messages",
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "content is not a string (messages[0]: list)",
    ),
    (
        "messages",
        {"messages": [USER, {"role": "assistant", "content": " \n"}]},
        "has an empty assistant turn",
    ),
    ("prompt_completion", {"prompt": [USER], "completion": [REPLY]}, "as lists of messages, among rows"),
    (
        "prompt_completion",
        {"prompt": [USER], "completion": "Hello."},
        "a prompt of type list and a completion of type str",
    ),
    ("prompt_completion", {"prompt": [], "completion": [REPLY]}, "has an empty prompt list"),
    ("prompt_completion", {"prompt": "Q:", "completion": None}, "has no completion (null)"),
    ("prompt_completion", {"prompt": None, "completion": " A"}, "has no prompt (null)"),
    ("prompt_completion", {"prompt": 5, "completion": " A"}, "has a prompt that is not a string (int)"),
    ("prompt_completion", {"prompt": "Q:", "completion": "  "}, "has an empty completion"),
    ("prompt_completion", {"text": "plain"}, "is in the text format"),
    ("text", {"text": None}, "has no text (null)"),
    ("text", {"text": 12}, "has a text that is not a string (int)"),
    ("text", {"text": " "}, "has an empty text"),
]


@pytest.mark.parametrize(("fmt", "bad", "says"), BAD_ROWS, ids=[says for _, _, says in BAD_ROWS])
def test_each_bad_row_is_refused_naming_its_number(tmp_path, fmt, bad, says):
    rows = read(tmp_path, [GOOD[fmt], GOOD[fmt], bad, GOOD[fmt]])
    error = refused(check_rows, rows, fmt, SOURCE)
    assert str(error).startswith(f"{SOURCE}: row 2 ") and says in str(error)
    assert error.fix and str(error).endswith(f"; {error.fix}")


def test_an_unknown_role_is_refused_in_these_words(tmp_path):
    rows = read(tmp_path, [{"messages": [{"role": "bot", "content": "Hi"}]}])
    assert str(refused(check_rows, rows, "messages", SOURCE)) == (
        "train.jsonl: row 0 has a message with the role 'bot' (messages[0]), not one of system, developer, "
        "user, assistant, tool; give every message one of those roles"
    )


# Conversations


def test_a_chatml_conversation_trains_on_each_assistant_reply_through_im_end(chatml):
    encoded = encode({"messages": CONVERSATION}, "messages", chatml)
    assert target_runs(chatml, encoded) == [f"Yes, very wide.{IM_END}", f"Not at all.{IM_END}"]
    rendered = chatml.apply_chat_template(CONVERSATION, tokenize=False)
    assert encoded.input_ids == chatml(rendered, add_special_tokens=False)["input_ids"]
    assert (
        not encoded.truncated
        and encoded.targets
        == sum(len(chatml(r)["input_ids"]) for r in ["Yes, very wide.", "Not at all."]) + 2
    )
    # Every token: the same ids, all labelled.
    everything = encode({"messages": CONVERSATION}, "messages", chatml, assistant_only_loss=False)
    assert everything.input_ids == encoded.input_ids == everything.labels
    assert chatml.chat_template == CHATML  # the tokenizer is left as it was


def test_an_assistant_message_of_weight_0_is_context_and_other_weights_are_refused(tmp_path, chatml):
    """OpenAI's fine-tuning format: `"weight": 0` makes an assistant message context, 1 a target; a row
    read by `datasets` gives the messages without one a null weight, which trains as 1."""
    messages = [dict(m) for m in CONVERSATION]
    messages[2]["weight"] = 0
    messages[4]["weight"] = 1
    rows = read(tmp_path, [{"messages": messages}, {"messages": CONVERSATION}])
    check_rows(rows, "messages", SOURCE)
    weighed, plain = (encode(row, "messages", chatml) for row in rows)
    assert target_runs(chatml, weighed) == [f"Not at all.{IM_END}"]
    assert target_runs(chatml, plain) == [f"Yes, very wide.{IM_END}", f"Not at all.{IM_END}"]
    assert weighed.input_ids == plain.input_ids  # the weight is not rendered
    # eval_exact_match compares the last turn trained on, not context after it.
    from finetune.families.causal_lm.data import LmTask
    from finetune.families.causal_lm.generation import encode_prompts

    context_last = [*CONVERSATION[:4], {**CONVERSATION[4], "weight": 0}]
    validation = {"validation": Dataset.from_list([{"messages": context_last}])}
    config = SimpleNamespace(max_length=512, predict_with_generate=True)
    prompts = encode_prompts(LmTask("messages", ""), validation, chatml, config, {"validation": SOURCE})
    assert prompts["validation_prompts"].references == ["Yes, very wide."]
    messages[4]["weight"] = 0
    error = refused(encode, {"messages": messages}, "messages", chatml)
    assert "row 7 has no assistant turn to train on (each has weight 0)" in str(error)
    error = refused(encode, {"messages": messages}, "messages", chatml, assistant_only_loss=False)
    assert "row 7 has an assistant message of weight 0 (message 2)" in str(error)
    cases = [(4, 0.5, "of weight 0.5 (messages[4])"), (1, 0, "a weight on a user message")]
    for where, weight, says in cases:
        bad = [dict(m) for m in CONVERSATION]
        bad[where]["weight"] = weight
        rows = read(tmp_path, [{"messages": CONVERSATION}, {"messages": bad}])
        error = refused(check_rows, rows, "messages", SOURCE)
        assert str(error).startswith(f"{SOURCE}: row 1 has ") and says in str(error), str(error)


def test_a_llama3_conversation_trains_through_eot_with_one_bos_and_no_header(llama3):
    encoded = encode({"messages": CONVERSATION}, "messages", llama3)
    assert target_runs(llama3, encoded) == [f"Yes, very wide.{EOT}", f"Not at all.{EOT}"]
    assert encoded.input_ids.count(llama3.bos_token_id) == 1 and encoded.input_ids[0] == llama3.bos_token_id
    header = llama3.convert_tokens_to_ids(END_HEADER)
    assert all(label != header for label in encoded.labels)


def test_a_conversation_without_an_assistant_turn_is_refused_unless_every_token_trains(chatml):
    row = {"messages": CONVERSATION[:2]}
    assert str(refused(encode, row, "messages", chatml)) == (
        "train.jsonl: row 7 has no assistant turn to train on; add one, or --assistant_only_loss false"
    )
    assert encode(row, "messages", chatml, assistant_only_loss=False).targets > 0


def test_a_conversation_that_begins_with_its_assistant_is_refused_unless_every_token_trains(chatml):
    row = {"messages": [REPLY, USER]}
    error = refused(encode, row, "messages", chatml)
    assert "row 7 begins with an assistant turn" in str(error) and error.flag == "--assistant_only_loss"
    assert encode(row, "messages", chatml, assistant_only_loss=False).targets > 0


def test_a_conversational_prompt_completion_trains_on_its_completion_only(chatml):
    row = {"prompt": CONVERSATION[:4], "completion": CONVERSATION[4:]}
    assert target_runs(chatml, encode(row, "prompt_completion", chatml)) == [f"Not at all.{IM_END}"]
    whole = encode(row, "prompt_completion", chatml, completion_only_loss=False)
    assert target_runs(chatml, whole) == [f"Yes, very wide.{IM_END}", f"Not at all.{IM_END}"]
    completion = encode(row, "prompt_completion", chatml, assistant_only_loss=False)
    assert target_runs(chatml, completion) == [f"Not at all.{IM_END}"]  # after the generation prompt
    both_off = encode(row, "prompt_completion", chatml, assistant_only_loss=False, completion_only_loss=False)
    assert both_off.labels == both_off.input_ids
    no_reply = {"prompt": CONVERSATION[:3], "completion": [{"role": "user", "content": "Thanks."}]}
    error = refused(encode, no_reply, "prompt_completion", chatml)
    assert "has no assistant turn in its completion" in str(error) and error.flag == "--assistant_only_loss"


def test_a_row_for_a_tokenizer_without_a_chat_template_is_refused(chatml):
    error = refused(encode, {"messages": CONVERSATION}, "messages", with_template(chatml, None))
    assert error.flag == "--chat_template" and error.fix == "give --chat_template FILE.jinja"


QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'].split('</think>')[-1] }}"
    "{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""Like Qwen3's: an earlier assistant turn loses its reasoning, so it renders differently once answered."""
THINKING_PROMPT = CHATML.replace("'<|im_start|>assistant\n'", "'<|im_start|>assistant\n<think>'")
"""A generation prompt that the rendered assistant turn does not begin with."""
SPLITS_A_TOKEN = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '<|im_end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
"""A generation prompt ending in a space, which byte-level BPE joins to the reply's first word."""


def test_a_template_that_drops_earlier_reasoning_trains_each_turn_on_the_conversation_up_to_it(chatml):
    """Qwen3's template writes an answered turn without its reasoning: the whole conversation is not
    how the model met each turn. Each assistant turn becomes its own example, the conversation up to it
    as the model sees it when answering (earlier turns without their reasoning), trained on that turn
    alone, its reasoning included."""
    messages = [dict(m) for m in CONVERSATION]
    messages[2]["content"] = "<think>Rivers vary.</think>Yes, very wide."
    tokenizer = with_template(chatml, QWEN3_LIKE)
    first, second = encode_examples(
        {"messages": messages}, "messages", tokenizer, max_length=512, row_number=7, source=SOURCE
    )
    assert target_runs(tokenizer, first) == [f"<think>Rivers vary.</think>Yes, very wide.{IM_END}"]
    assert target_runs(tokenizer, second) == [f"Not at all.{IM_END}"]
    context = tokenizer.decode(second.input_ids)
    assert "Yes, very wide." in context and "Rivers vary" not in context
    assert (
        first.input_ids == tokenizer(tokenizer.apply_chat_template(messages[:3], tokenize=False))["input_ids"]
    )
    # A template that renders every turn the same wherever it stands: one example, as before.
    assert len(encode_examples({"messages": messages}, "messages", chatml, max_length=512, row_number=7,
                               source=SOURCE)) == 1  # fmt: skip


def test_turn_by_turn_conversations_are_examples_of_their_own_and_said_on_the_task_line(tmp_path, chatml):
    import contextlib

    from finetune.config.train_config import TrainConfig
    from finetune.families.causal_lm.data import encode_splits, load_lm_splits

    messages = [dict(m) for m in CONVERSATION]
    messages[2]["content"] = "<think>Rivers vary.</think>Yes, very wide."
    path = tmp_path / SOURCE
    path.write_text(
        json.dumps({"messages": messages}) + "\n" + json.dumps({"messages": CONVERSATION[:3]}) + "\n"
    )
    config = TrainConfig(task_type="causal_lm", train_file=str(path), eval_strategy="no")
    task, splits = load_lm_splits(config)
    one_process = SimpleNamespace(main_process_first=contextlib.nullcontext)
    train = encode_splits(task, splits, with_template(chatml, QWEN3_LIKE), config, one_process)["train"]
    assert len(train) == 3 and "turns" not in train.column_names  # 2 turns of the first row, 1 of the second
    assert "train 3 rows" in task.summary() and "train: 1 conversations trained turn by turn (2 examples" in (
        task.summary()
    )


def test_a_generation_prompt_that_does_not_begin_the_turn_is_refused(chatml):
    error = refused(encode, {"messages": CONVERSATION}, "messages", with_template(chatml, THINKING_PROMPT))
    assert "row 7 is rendered by the chat template so that the generation prompt is not how" in str(error)
    assert error.flag == "--chat_template" and error.fix.endswith("or --assistant_only_loss false")


IGNORES_PROMPT = CHATML.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}", ""
)
"""A community template that never writes the generation prompt."""
SHORT_PROMPT = CHATML.replace("'<|im_start|>assistant\n' }}{% endif %}", "'<|im_start|>' }}{% endif %}")
"""A generation prompt that is a strict prefix of the assistant's header."""
LLAMA3_SHORT_PROMPT = LLAMA3.replace("'<|start_header_id|>assistant<|end_header_id|>\n\n'",
                                     "'<|start_header_id|>assistant'")  # fmt: skip


@pytest.mark.parametrize("template", ["ignores", "short", "llama3 short"])
def test_a_generation_prompt_short_of_the_assistants_header_is_refused(chatml, llama3, template):
    """Its targets would begin with the rest of the header: the model would answer "assistant\nred"."""
    tokenizer = {"ignores": with_template(chatml, IGNORES_PROMPT),
                 "short": with_template(chatml, SHORT_PROMPT),
                 "llama3 short": with_template(llama3, LLAMA3_SHORT_PROMPT)}[template]  # fmt: skip
    assert tokenizer.chat_template != CHATML
    error = refused(encode, {"messages": CONVERSATION}, "messages", tokenizer)
    assert "row 7 is rendered by the chat template with a generation prompt" in str(error)
    assert "that is not all of an assistant turn's header" in str(error) and "message 2" in str(error)
    assert ("it ignores add_generation_prompt" in str(error)) == (template == "ignores")
    assert error.flag == "--chat_template" and error.fix.endswith("or --assistant_only_loss false")
    pair = {"prompt": CONVERSATION[:2], "completion": CONVERSATION[2:3]}
    for every_token in (False, True):  # a conversational prompt-completion's completion after the prompt
        refused(encode, pair, "prompt_completion", tokenizer, assistant_only_loss=every_token)
    # Training on every token of a conversation asks for the header too.
    assert encode({"messages": CONVERSATION}, "messages", tokenizer, assistant_only_loss=False).targets > 0
    # A prompt to predict from would leave the header to the model (predictions "assistant\nred").
    from finetune.families.causal_lm.data import LmTask
    from finetune.families.causal_lm.generation import encode_prompts

    test = {"test": Dataset.from_list([{"messages": CONVERSATION[:2]}])}
    config = SimpleNamespace(max_length=64, predict_with_generate=False)
    with pytest.raises(ConfigError, match="row 0 is rendered by the chat template with a generation prompt"):
        encode_prompts(LmTask("messages", ""), test, tokenizer, config, {"test": SOURCE})
    assert encode_prompts(LmTask("messages", ""), test, chatml, config, {"test": SOURCE})["test"].rows


def test_a_template_writing_more_than_its_header_before_the_reply_trains_it(chatml):
    """Qwen3's writes an empty reasoning block after the header and before the reply: the model's to
    write (what makes it answer without reasoning), so it trains, as TRL trains it."""
    think = "('<think></think>' if message['role'] == 'assistant' else '')"
    qwen3 = CHATML.replace("'\n' + message['content']", f"'\n' + {think} + message['content']")
    encoded = encode({"messages": CONVERSATION}, "messages", with_template(chatml, qwen3))
    assert target_runs(chatml, encoded) == [f"<think></think>Yes, very wide.{IM_END}",
                                            f"<think></think>Not at all.{IM_END}"]  # fmt: skip


def test_a_template_whose_turn_starts_inside_a_token_is_refused(chatml):
    tokenizer = with_template(chatml, SPLITS_A_TOKEN)
    error = refused(encode, {"messages": CONVERSATION}, "messages", tokenizer)
    assert "falls inside a token" in str(error) and "row 7" in str(error)


def test_a_template_error_is_refused_naming_the_row(chatml):
    strict = (
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversations start with the user') }}{% endif %}"
    )
    error = refused(encode, {"messages": CONVERSATION}, "messages", with_template(chatml, strict + CHATML))
    assert "row 7 cannot be rendered by the chat template (Conversations start with the user)" in str(error)


def test_a_template_that_fails_in_python_is_refused_naming_the_row(chatml):
    """Not jinja's own TemplateError: a TypeError of the template's arithmetic (a string plus a number)."""
    adds = "{% for m in messages %}{{ m['content'] + loop.index }}{% endfor %}"
    error = refused(encode, {"messages": CONVERSATION}, "messages", with_template(chatml, adds))
    assert "row 7 cannot be rendered by the chat template" in str(error) and error.flag == "--chat_template"


def test_null_fields_that_datasets_adds_to_messages_are_not_rendered(tmp_path, chatml):
    named = (
        "{% for m in messages %}{% if m.name is defined %}[{{ m.name }}]{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [{"role": "user", "content": "Hi", "name": "ann"}, REPLY]
    row = Dataset.from_list([{"messages": messages}])[0]  # Arrow gives the reply "name": None
    assert row["messages"][1]["name"] is None
    encoded = encode(row, "messages", with_template(chatml, named))
    assert "[ann]" in chatml.decode(encoded.input_ids) and "None" not in chatml.decode(encoded.input_ids)


def test_a_template_that_drops_tool_calls_or_tools_is_refused_naming_the_row(tmp_path, chatml):
    """Plain ChatML (SmolLM2's template) writes a message's content only: a tool-calling turn would train
    the model to answer with an empty turn, and the row's tools would never reach the prompt."""
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    calling = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [call]}]  # fmt: skip
    error = refused(encode, {"messages": calling}, "messages", chatml)
    assert "row 7 has an assistant turn whose tool_calls the chat template does not write (message 1" in str(
        error
    ) and error.fix.startswith("give --chat_template FILE.jinja that renders tool_calls")
    schema = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    error = refused(encode, {"messages": CONVERSATION, "tools": [schema]}, "messages", chatml)
    assert "row 7 gives tools, which the chat template does not write" in str(error)
    written = encode(
        {"messages": calling, "tools": [schema]}, "messages", with_template(chatml, TOOLS_CHATML)
    )
    assert written.targets > 0
    # A prediction row's tools too: --do_predict would ask the model without the functions it may call.
    from finetune.families.causal_lm.data import LmTask
    from finetune.families.causal_lm.generation import encode_prompts

    test = {"test": read(tmp_path, [{"messages": calling[:1]}, {"messages": calling[:1], "tools": [schema]}])}
    config = SimpleNamespace(max_length=512, predict_with_generate=False)
    with pytest.raises(ConfigError) as error:
        encode_prompts(LmTask("messages", ""), test, chatml, config, {"test": SOURCE})
    assert str(error.value).startswith(f"{SOURCE}: row 1 gives tools, which the chat template does not write")
    assert error.value.flag == "--chat_template"
    prompts = encode_prompts(LmTask("messages", ""), test, with_template(chatml, TOOLS_CHATML), config,
                             {"test": SOURCE})  # fmt: skip
    assert "get_weather" in chatml.decode(prompts["test"].rows[1]["input_ids"])


def test_a_null_in_a_calls_arguments_is_the_users_and_a_parquet_structs_padding_is_not(tmp_path, chatml):
    """JSON lines keep each object as written: `"unit": null` is an argument the model must learn to write.
    A Parquet file of Arrow structs gives every call every argument any call has, null where it had none:
    those nulls are not the user's, and are not rendered."""
    import contextlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from finetune.config.train_config import TrainConfig
    from finetune.families.causal_lm.data import encode_splits, load_lm_splits

    def conversation(arguments: dict) -> dict:
        call = {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return {"messages": [{"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": "", "tool_calls": [call]}]}  # fmt: skip

    rows = [conversation({"city": "Paris", "unit": None}), conversation({"city": "Rome", "days": 2})]
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pq.write_table(
        pa.Table.from_pylist(rows[1:] + [conversation({"city": "Oslo"})]), tmp_path / "calls.parquet"
    )
    tokenizer = with_template(chatml, TOOLS_CHATML)
    one_process = SimpleNamespace(main_process_first=contextlib.nullcontext)
    texts = {}
    for name in ("calls.jsonl", "calls.parquet"):
        config = TrainConfig(task_type="causal_lm", train_file=str(tmp_path / name), eval_strategy="no")
        task, splits = load_lm_splits(config)
        encoded = encode_splits(task, splits, tokenizer, config, one_process)["train"]
        texts[name] = [tokenizer.decode(ids) for ids in encoded["input_ids"]]
    assert '"arguments": {"city": "Paris", "unit": null}' in texts["calls.jsonl"][0], texts
    assert '"arguments": {"city": "Oslo"}' in texts["calls.parquet"][1], texts  # no "days": null


# Prompt-completion strings and text


def test_a_prompt_completion_trains_on_the_completion_and_eos(chatml):
    row = {"prompt": "The river is", "completion": " wide and deep."}
    encoded = encode(row, "prompt_completion", chatml)
    assert target_runs(chatml, encoded) == [f" wide and deep.{IM_END}"]
    assert encoded.input_ids == chatml("The river is wide and deep.")["input_ids"] + [chatml.eos_token_id]
    prompt = len(chatml("The river is")["input_ids"])
    assert encoded.labels[:prompt] == [IGNORE] * prompt and encoded.targets == len(encoded.input_ids) - prompt
    everything = encode(row, "prompt_completion", chatml, completion_only_loss=False)
    assert everything.labels == everything.input_ids == encoded.input_ids
    ended = encode({"prompt": "The river is", "completion": f" wide.{IM_END}"}, "prompt_completion", chatml)
    assert ended.input_ids.count(chatml.eos_token_id) == 1  # an EOS already there is not doubled


def test_a_bos_adding_tokenizer_begins_a_prompt_completion_with_bos_not_a_target(llama3):
    encoded = encode({"prompt": "Q:", "completion": " yes"}, "prompt_completion", llama3)
    assert encoded.input_ids[0] == llama3.bos_token_id and encoded.labels[0] == IGNORE
    assert target_runs(llama3, encoded) == [f" yes{EOT}"]


def test_a_tokenizer_that_appends_eos_ends_the_row_not_the_prompt(llama3):
    """A post-processor that adds EOS after any text (add_eos_token): the prompt's tokens are its own
    without that EOS, the row ends with one EOS, a target; generation prompts carry none either."""
    from finetune.families.causal_lm.data import LmTask
    from finetune.families.causal_lm.generation import encode_prompts

    tokenizer = copy.deepcopy(llama3)
    ends = [(BOS, tokenizer.bos_token_id), (EOT, tokenizer.eos_token_id)]
    tokenizer._tokenizer.post_processor = TemplateProcessing(single=f"{BOS} $A {EOT}", special_tokens=ends)
    encoded = encode({"prompt": "Q:", "completion": " yes"}, "prompt_completion", tokenizer)
    assert target_runs(tokenizer, encoded) == [f" yes{EOT}"]
    assert encoded.input_ids.count(tokenizer.eos_token_id) == 1
    assert encoded.input_ids[0] == tokenizer.bos_token_id
    test = {"test": Dataset.from_list([{"prompt": "Q:"}])}
    config = SimpleNamespace(max_length=64, predict_with_generate=False)  # what encode_prompts reads
    prompts = encode_prompts(LmTask("prompt_completion", ""), test, tokenizer, config, {"test": SOURCE})
    assert prompts["test"].rows[0]["input_ids"] == tokenizer("Q:")["input_ids"][:-1]  # BOS and the prompt


def test_a_prompt_whose_tokens_change_with_its_completion_is_refused(chatml):
    error = refused(encode, {"prompt": "Hello ", "completion": "world"}, "prompt_completion", chatml)
    assert "row 7 has a prompt whose tokens change when its completion is appended" in str(error)
    assert error.fix == "end the prompt at a token boundary, e.g. move its trailing space into the completion"
    assert encode({"prompt": "Hello", "completion": " world"}, "prompt_completion", chatml).targets > 0


def test_text_trains_on_every_token_and_its_eos(chatml):
    encoded = encode({"text": "The river is wide."}, "text", chatml)
    assert encoded.input_ids == chatml("The river is wide.")["input_ids"] + [chatml.eos_token_id]
    assert encoded.labels == encoded.input_ids
    assert encode({"text": f"Wide.{IM_END}"}, "text", chatml).input_ids.count(chatml.eos_token_id) == 1


# Truncation


def test_truncation_keeps_the_first_tokens_and_may_leave_no_target(chatml):
    full = encode({"messages": CONVERSATION}, "messages", chatml)
    cut = encode({"messages": CONVERSATION}, "messages", chatml, max_length=10)
    assert cut.truncated and cut.input_ids == full.input_ids[:10] and cut.labels == full.labels[:10]
    assert cut.targets == 0  # the replies were past the cut: the caller drops the row
    exact = encode({"messages": CONVERSATION}, "messages", chatml, max_length=len(full.input_ids))
    assert not exact.truncated and exact == full


@pytest.mark.parametrize(
    ("completion_only", "assistant_only", "said"),
    [
        (True, True, "the completion's assistant turns through their end-of-turn token"),
        (False, True, "assistant turns through their end-of-turn token"),
        (True, False, "the completion, every token after the generation prompt"),
        (False, False, "every token"),
    ],
)
def test_the_task_line_says_what_both_flags_train_in_a_conversational_prompt_completion(
    tmp_path, completion_only, assistant_only, said
):
    """What test_a_conversational_prompt_completion_trains_on_its_completion_only trains, in words."""
    from finetune.config.train_config import TrainConfig
    from finetune.families.causal_lm.data import load_lm_splits

    path = tmp_path / SOURCE
    path.write_text(json.dumps({"prompt": CONVERSATION[:4], "completion": CONVERSATION[4:]}) + "\n")
    flags = {"completion_only_loss": completion_only, "assistant_only_loss": assistant_only}
    config = TrainConfig(task_type="causal_lm", train_file=str(path), eval_strategy="no", **flags)
    task, _ = load_lm_splits(config)
    assert task.trained_on == f"{said} (the tokenizer's template)"


def test_a_template_that_closes_turns_with_no_special_token_is_noted_on_the_task_line(tmp_path, chatml):
    """ChatML closes a reply with <|im_end|>, a target that teaches the model to stop; a template that
    writes "assistant:\\n...\\n" has no such token: the run says so on its task line (and still trains)."""
    import contextlib

    from finetune.config.train_config import TrainConfig
    from finetune.families.causal_lm.conversations import end_of_turn
    from finetune.families.causal_lm.data import encode_splits, load_lm_splits

    plain = with_template(chatml, "{% for m in messages %}{{ m['role'] }}:\n{{ m['content'] }}\n{% endfor %}"
                                  "{% if add_generation_prompt %}assistant:\n{% endif %}")  # fmt: skip
    assert end_of_turn(chatml) == [chatml.convert_tokens_to_ids(IM_END)] and end_of_turn(plain) == []
    path = tmp_path / SOURCE
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n")
    config = TrainConfig(task_type="causal_lm", train_file=str(path), eval_strategy="no")
    one_process = SimpleNamespace(main_process_first=contextlib.nullcontext)
    for tokenizer, noted in ((chatml, False), (plain, True)):
        task, splits = load_lm_splits(config)
        encode_splits(task, splits, tokenizer, config, one_process)
        assert ("no target teaches the model to stop" in task.summary()) == noted, task.summary()


TOOLS_CHATML = (
    "{% if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.tool_calls is defined %}"
    "{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML that writes the row's tools into a system turn and an assistant's tool calls as <tool_call>s."""


def test_a_tool_calling_conversation_trains_on_its_calls_with_its_tools_in_the_prompt(tmp_path, chatml):
    """OpenAI's and transformers' form: an assistant turn of `tool_calls` with null content, a `tool`
    turn, and the row's `tools` (TRL's column) given to the template; read by `datasets`, whose nulls (a
    row without tools, a message without calls) are not rendered. The calls and the final reply train."""
    weather = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}  # fmt: skip
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    calling = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "content": "18C"},
               {"role": "assistant", "content": "It is 18C."}]  # fmt: skip
    rows = read(tmp_path, [{"messages": calling, "tools": [weather]}, {"messages": CONVERSATION}])
    check_rows(rows, "messages", SOURCE)
    tokenizer = with_template(chatml, TOOLS_CHATML)
    with_tools, plain = (encode(row, "messages", tokenizer) for row in rows)
    runs = target_runs(tokenizer, with_tools)
    assert runs[0].startswith("<tool_call>") and '"Paris"' in runs[0] and runs[0].endswith(IM_END)
    assert runs[1:] == [f"It is 18C.{IM_END}"]
    text = tokenizer.decode(with_tools.input_ids)
    assert text.startswith("<|im_start|>system\nTools: ") and "get_weather" in text and "null" not in text
    assert "Tools:" not in tokenizer.decode(plain.input_ids)  # a row without tools: none rendered
    from finetune.families.causal_lm.data import LmTask
    from finetune.families.causal_lm.generation import encode_prompts

    test = {"test": read(tmp_path, [{"messages": calling[:1], "tools": [weather]}])}
    config = SimpleNamespace(max_length=512, predict_with_generate=False)
    prompts = encode_prompts(LmTask("messages", ""), test, tokenizer, config, {"test": SOURCE})
    asked = tokenizer.decode(prompts["test"].rows[0]["input_ids"])  # what --do_predict generates from
    assert asked.startswith("<|im_start|>system\nTools: ") and asked.endswith("<|im_start|>assistant\n")
    bad = read(tmp_path, [{"messages": [{"role": "user", "content": "Hi"}, {**REPLY, "tool_calls": "f()"}]}])
    with pytest.raises(ConfigError, match="has tool_calls that are not a list of calls"):
        check_rows(bad, "messages", SOURCE)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "is a folder; give the template's .jinja file"),
        (
            '{"model_max_length": 512, "eos_token": "</s>"}',
            "renders a user turn and a reply without their words",
        ),
        ("{% for m in messages %}{{ m.content }", "does not render a user turn and a reply (unexpected '}')"),
    ],
)
def test_a_chat_template_file_that_is_no_chat_template_is_refused_naming_the_file(tmp_path, content, said):
    """Checked before any row: a folder, a JSON file (a tokenizer_config.json given by mistake: with
    prompt-completion rows nothing else would notice, and the export would carry it), bad Jinja."""
    from finetune.families.causal_lm.family import _check_chat_template

    path = tmp_path / "template.jinja"
    path.mkdir() if content is None else path.write_text(content)
    with pytest.raises(ConfigError) as error:
        _check_chat_template(str(path))
    assert error.value.flag == "--chat_template" and said in str(error.value), error.value
    path = tmp_path / "chatml.jinja"
    path.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    )
    _check_chat_template(str(path))


def test_a_file_mixing_formats_is_read_in_its_first_rows_format_naming_the_stray_row(tmp_path):
    """Its columns are the union of the formats' (as datasets reads JSON lines): the first row decides,
    so the row named is the one that differs, not row 0."""
    from finetune.config.train_config import TrainConfig
    from finetune.families.causal_lm.data import load_lm_splits

    path = tmp_path / SOURCE
    rows = [GOOD["prompt_completion"]] * 3 + [GOOD["messages"]]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ConfigError) as error:
        load_lm_splits(TrainConfig(task_type="causal_lm", train_file=str(path), eval_strategy="no"))
    assert f"{path}: row 3 is in the messages format, in a file of the prompt_completion format" in str(
        error.value
    )
