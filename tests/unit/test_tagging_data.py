"""Reading tagging data: JSONL rows (tag names, ids through --label_names or a ClassLabel), CoNLL and
CoNLL-U files (multiword tokens and empty nodes as UD defines them), the label set and scheme on the task
line, a tag seen only in validation reported; and each bad input refused in one line naming the file and
the row or line, with the fix."""

from __future__ import annotations

import dataclasses
import json

import pytest
from datasets import ClassLabel, Dataset, Features, List, Value

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.families.token_classification.task import load_tag_splits


def tagging_config(tmp_path, train, validation=None, **flags) -> TrainConfig:
    evaluation = {"validation_file": str(validation)} if validation else {"eval_strategy": "no"}
    return TrainConfig(task_type="token_classification", train_file=str(train),
                       output_dir=str(tmp_path / "out"), model_name_or_path=str(tmp_path), **evaluation,
                       **flags)  # fmt: skip


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_rows_with_names_give_sorted_labels_the_scheme_and_counts(tmp_path):
    train = jsonl(tmp_path / "t.jsonl", [{"tokens": ["John", "lives", "in", "New", "York"],
                                          "tags": ["B-PER", "O", "O", "B-LOC", "I-LOC"]}])  # fmt: skip
    validation = jsonl(
        tmp_path / "v.jsonl", [{"tokens": ["Bob", "at", "IBM"], "tags": ["B-PER", "O", "B-ORG"]}]
    )
    task, splits = load_tag_splits(tagging_config(tmp_path, train, validation))
    assert task.label_names == ("O", "B-LOC", "B-PER", "I-LOC")
    assert task.scheme == "IOB2" and task.metrics[0] == "f1"
    assert splits["train"][0] == {"words": ["John", "lives", "in", "New", "York"],
                                  "tags": ["B-PER", "O", "O", "B-LOC", "I-LOC"]}  # fmt: skip
    summary = task.summary()
    assert (
        "tag scheme IOB2 (BIO), 4 tags: O, B-LOC, B-PER, I-LOC; train 1 sentences, 5 words, 2 entities"
        in summary
    )
    # A tag only validation holds: reported on its own line, kept as gold (not mapped to another).
    assert summary.splitlines()[1] == (
        "validation: tags the training data lacks, scored as gold but never predicted (no loss): "
        "B-ORG (1 words)"
    )
    assert splits["validation"][0]["tags"] == ["B-PER", "O", "B-ORG"]


def test_renamed_columns_and_ids_read_through_label_names(tmp_path):
    train = jsonl(tmp_path / "t.jsonl", [{"words": ["a", "Paris"], "pos": [0, 2]}])
    config = tagging_config(
        tmp_path, train, text_columns="words", label_column="pos", label_names="O,B-PER,B-LOC"
    )
    task, splits = load_tag_splits(config)
    assert task.label_names == ("O", "B-PER", "B-LOC")  # --label_names keeps its order
    assert splits["train"][0]["tags"] == ["O", "B-LOC"]


def test_a_test_file_of_raw_text_under_renamed_word_columns(tmp_path):
    """--text_columns names the words of the labelled files; a test file without that column but with
    `text` is raw text to split, as without the flag."""
    train = jsonl(tmp_path / "t.jsonl", [{"words": ["Ann", "ran"], "ner": ["B-PER", "O"]}])
    test = jsonl(tmp_path / "p.jsonl", [{"text": "Ann ran home."}])
    config = tagging_config(tmp_path, train, text_columns="words", label_column="ner", do_predict=True,
                            test_file=str(test))  # fmt: skip
    _, splits = load_tag_splits(config)
    assert splits["test"].column_names == ["text"] and splits["test"][0]["text"] == "Ann ran home."


def test_a_blank_word_in_a_prediction_row_is_refused_naming_the_row(tmp_path):
    """A prediction row's blank word would be tagged (even as an entity) though it is no word."""
    train = jsonl(tmp_path / "t.jsonl", [{"tokens": ["Ann", "ran"], "tags": ["B-PER", "O"]}])
    test = jsonl(tmp_path / "p.jsonl", [{"tokens": ["Ann"]}, {"tokens": ["Ann", "\t"]}])
    config = tagging_config(tmp_path, train, do_predict=True, test_file=str(test))
    with pytest.raises(ConfigError, match=r"p.jsonl: row 1 has a blank word \(word 1: '\\t'\)"):
        load_tag_splits(config)


def tagger_folder(folder, tags):
    """A token classifier's config.json (all `model_labels` reads) with `tags` as its id2label."""
    from transformers import BertConfig

    BertConfig(architectures=["BertForTokenClassification"], id2label=dict(enumerate(tags))).save_pretrained(
        folder
    )
    return folder


def test_label_names_in_another_order_than_the_models_head_keep_the_head(tmp_path):
    """A tagger's head tags O,B-PER,I-PER; --label_names names the same tags in another order: the run
    takes the head's order (kept, not replaced by a random one), and --class_weights stays the listed
    order's."""
    model = tagger_folder(tmp_path / "tagger", ["O", "B-PER", "I-PER"])
    train = jsonl(tmp_path / "t.jsonl", [{"tokens": ["Ann", "Lee", "ran"], "tags": ["B-PER", "I-PER", "O"]}])
    config = tagging_config(tmp_path, train, label_names="I-PER,O,B-PER", class_weights="3,1,2")
    task, _ = load_tag_splits(dataclasses.replace(config, model_name_or_path=str(model)))
    assert task.label_names == ("O", "B-PER", "I-PER")
    assert task.class_weights == (1.0, 2.0, 3.0)


@pytest.mark.parametrize("head", [["O", "B-PER", "I-PER"], None])
def test_evaluating_with_tags_the_head_lacks_is_refused(tmp_path, head):
    """Nothing trains: a head for other tags than the model's (or for a model that tags nothing) would be
    scored untrained, so the run refuses, naming the flag."""
    model = tagger_folder(tmp_path / "tagger", head) if head else tmp_path
    validation = jsonl(tmp_path / "v.jsonl", [{"tokens": ["Ann", "ran"], "tags": ["B-PER", "O"]}])
    config = TrainConfig(task_type="token_classification", model_name_or_path=str(model), do_train=False,
                         validation_file=str(validation), output_dir=str(tmp_path / "out"),
                         label_names="O,B-PER,I-PER,B-LOC")  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        load_tag_splits(config)
    assert refused.value.flag == ("--label_names" if head else "--model_name_or_path")
    assert "nothing trains" in str(refused.value)


def test_class_label_ids_read_as_their_names(tmp_path):
    """The model's labels are the ClassLabel's, all of them in its id order (as run_ner takes them), even
    those the training rows lack: a user's ids and the model's agree."""
    names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    features = Features({"tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=names))})
    Dataset.from_dict(
        {"tokens": [["Ann", "Lee", "ran"]], "ner_tags": [[1, 2, 0]]}, features=features
    ).to_parquet(tmp_path / "t.parquet")
    task, splits = load_tag_splits(tagging_config(tmp_path, tmp_path / "t.parquet"))
    assert splits["train"][0]["tags"] == ["B-PER", "I-PER", "O"] and task.label_names == tuple(names)
    # --label_names orders the model's labels; it never renames the ids the dataset names itself.
    task, splits = load_tag_splits(
        tagging_config(tmp_path, tmp_path / "t.parquet", label_names="I-PER,B-PER,O")
    )
    assert splits["train"][0]["tags"] == ["B-PER", "I-PER", "O"] and task.label_names == (
        "I-PER",
        "B-PER",
        "O",
    )


def test_conll_files_skip_docstart_and_read_the_last_column(tmp_path):
    train = tmp_path / "t.conll"
    train.write_text(
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\nPeter NNP B-NP B-PER\n"
    )
    task, splits = load_tag_splits(tagging_config(tmp_path, train))
    assert splits["train"]["words"] == [["EU", "rejects"], ["Peter"]]
    assert splits["train"]["tags"] == [["B-ORG", "O"], ["B-PER"]]
    assert task.format == "CoNLL files"


CONLLU = """# sent_id = 1
# text = Vámonos al mar.
1-2\tVámonos\t_\t_\t_\t_\t_\t_\t_\t_
1\tVamos\tir\tVERB\t_\t_\t0\troot\t_\t_
2\tnos\tnosotros\tPRON\t_\t_\t1\tobj\t_\t_
3-4\tal\t_\t_\t_\t_\t_\t_\t_\t_
3\ta\ta\tADP\t_\t_\t5\tcase\t_\t_
4\tel\tel\tDET\t_\t_\t5\tdet\t_\t_
4.1\tvan\tir\tVERB\t_\t_\t_\t_\t0:root\t_
5\tmar\tmar\tNOUN\t_\t_\t1\tobl\t_\tSpaceAfter=No
6\t.\t.\tPUNCT\t_\t_\t1\tpunct\t_\t_

"""


@pytest.mark.parametrize("column", ["upos", "deprel"])
def test_conllu_reads_syntactic_words_without_ranges_or_empty_nodes(tmp_path, column):
    train = tmp_path / "t.conllu"
    train.write_text(CONLLU)
    flags = {} if column == "upos" else {"label_column": column}
    task, splits = load_tag_splits(tagging_config(tmp_path, train, **flags))
    assert splits["train"][0]["words"] == ["Vamos", "nos", "a", "el", "mar", "."]
    expected = {"upos": ["VERB", "PRON", "ADP", "DET", "NOUN", "PUNCT"],
                "deprel": ["root", "obj", "case", "det", "obl", "punct"]}  # fmt: skip
    assert splits["train"][0]["tags"] == expected[column]
    assert task.scheme == "none" and task.metrics == ("accuracy", "macro_f1")
    assert task.format == f"CoNLL-U ({column})"


def bad(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


BAD = {
    "lengths": ("t.jsonl",
                '{"tokens": ["a"], "tags": ["O"]}\n{"tokens": ["a", "b", "c"], "tags": ["O", "O"]}\n',
                {}, "t.jsonl: row 1 has 3 words and 2 tags; give every word one tag"),
    "empty": ("t.jsonl", '{"tokens": [], "tags": []}\n', {},
              "t.jsonl: row 0 is an empty sentence (no words); drop the row"),
    "blank word": ("t.jsonl", '{"tokens": ["a"], "tags": ["O"]}\n'
                   '{"tokens": ["EU", " "], "tags": ["B-X", "O"]}\n',
                   {}, "t.jsonl: row 1 has a blank word (word 1: ' '); drop it (and its tag), or write it"),
    "empty word": ("t.jsonl", '{"tokens": ["", "a"], "tags": ["O", "O"]}\n', {},
                   "t.jsonl: row 0 has a blank word (word 0: '')"),
    "conllu blank word": ("t.conllu", "1\t \t_\tX\t_\t_\t0\troot\t_\t_\n", {},
                          "t.conllu line 1: a blank word (FORM ' '); write the word, or drop the line"),
    "tag id": ("t.jsonl", '{"tokens": ["a", "b"], "tags": [0, 3]}\n', {"label_names": "O,B-X,I-X"},
               "t.jsonl: row 0 has tag id 3, outside --label_names' 3 names (ids 0 to 2); give every tag's "
               "name in --label_names"),
    "ids without names": ("t.jsonl", '{"tokens": ["a"], "tags": [0]}\n', {},
                          "t.jsonl: row 0's tags are ids; give their names in id order with --label_names"),
    "conll columns": ("t.conll", "EU NNP B-NP B-ORG\nrejects B-VP O\n", {},
                      "t.conll line 2: 3 columns where its first token line has 4; give every token line the "
                      "same columns (the word first, its tag last)"),
    "conll no tag": ("t.conll", "EU\nrejects\n", {}, "t.conll line 1: a word without a tag"),
    "conllu fields": ("t.conllu", "1\tVamos\tir\tVERB\n", {}, "t.conllu line 1: 4 tab-separated fields"),
    "conllu column absent": ("t.conllu", CONLLU, {"label_column": "xpos"},
                             "--label_column xpos: data file {path} holds no xpos tags (every one is _)"),
    "conllu column unknown": ("t.conllu", CONLLU, {"label_column": "ner"},
                              "--label_column ner: not a CoNLL-U tag column; use upos, xpos or deprel"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_refused_in_one_line_naming_the_row_and_the_fix(tmp_path, case):
    name, text, flags, message = BAD[case]
    path = bad(tmp_path, name, text)
    with pytest.raises(ConfigError) as refused:
        load_tag_splits(tagging_config(tmp_path, path, **flags))
    assert message.format(path=path) in str(refused.value)
    assert "\n" not in str(refused.value) and refused.value.fix


def test_a_training_tag_outside_label_names_is_refused(tmp_path):
    train = jsonl(tmp_path / "t.jsonl", [{"tokens": ["a", "b"], "tags": ["B-X", "O"]}])
    with pytest.raises(ConfigError, match="tag B-X is not in --label_names; add it"):
        load_tag_splits(tagging_config(tmp_path, train, label_names="O"))


@pytest.mark.parametrize(
    ("tags", "said"),
    [
        (["B-PER", "PER"], "row 1 has the tag PER, without a B-/I- prefix, among prefixed tags"),
        (["B-PER", ""], "row 1 has an empty tag"),
        (["B-PER", " I-PER "], "row 1 has the tag ' I-PER ', with spaces around it"),
        (["O", "O"], "every word has the tag O, so there is nothing to learn"),
    ],
)
def test_tags_no_scheme_reads_as_meant_are_refused_naming_the_row(tmp_path, tags, said):
    """One typo among prefixed tags would make the scheme none and the scores per tag, without a word."""
    rows = [{"tokens": ["Ann", "ran"], "tags": [tags[0], "O"]}, {"tokens": ["Lee"], "tags": [tags[1]]}]
    with pytest.raises(ConfigError) as error:
        load_tag_splits(tagging_config(tmp_path, jsonl(tmp_path / "t.jsonl", rows)))
    assert said in str(error.value) and "\n" not in str(error.value), error.value


def test_a_dataset_folder_with_class_label_tags_and_balanced_weights(tmp_path):
    """--dataset_name (a local folder here, a Hub id alike) whose tags are Sequence(ClassLabel): read as
    names; --class_weights balanced from the training words' tags; --validation_split_percentage carves
    sentences with --seed."""
    names = ["O", "B-PER", "I-PER"]
    features = Features({"tokens": List(Value("string")), "ner_tags": List(ClassLabel(names=names))})
    folder = tmp_path / "data"
    folder.mkdir()
    rows = {"tokens": [["Ann", "Lee", "ran"], ["it", "rained"]] * 5, "ner_tags": [[1, 2, 0], [0, 0]] * 5}
    Dataset.from_dict(rows, features=features).to_parquet(folder / "train.parquet")
    config = TrainConfig(task_type="token_classification", dataset_name=str(folder), class_weights="balanced",
                         validation_split_percentage=20, output_dir=str(tmp_path / "out"),
                         model_name_or_path=str(tmp_path))  # fmt: skip
    task, splits = load_tag_splits(config)
    assert len(splits["train"]) == 8 and len(splits["validation"]) == 2
    assert task.label_names == ("O", "B-PER", "I-PER")
    counts = {"O": 0, "B-PER": 0, "I-PER": 0}
    for tags in splits["train"]["tags"]:
        for tag in tags:
            counts[tag] += 1
    total = sum(counts.values())
    assert task.class_weights == pytest.approx([total / (3 * counts[n]) for n in task.label_names])
    assert task.format == f"rows (tokens, ner_tags) of --dataset_name {folder}"


def test_conll_as_real_files_come_byte_order_mark_tab_blank_lines_and_comments(tmp_path):
    """A UTF-8 byte-order mark before -DOCSTART-, a sentence break written as a tab (an exported sheet's),
    and `# ` comment lines (MultiCoNER's ids): three sentences, every word with a tag, nothing invented."""
    from finetune.families.token_classification.reading import read_conll

    path = tmp_path / "ner.conll"
    lines = ["\ufeff-DOCSTART-\tO", "", "# id 1 domain=en", "EU\tB-ORG", "rejects\tO", "\t",
             "Peter\tB-PER", " ", "Blackburn\tI-PER"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    read = read_conll(str(path), True)
    assert read["words"] == [["EU", "rejects"], ["Peter"], ["Blackburn"]]
    assert read["tags"] == [["B-ORG", "O"], ["B-PER"], ["I-PER"]]


def test_the_word_hash_is_a_token_line_and_an_id_line_a_comment(tmp_path):
    """CoNLL-2003's four columns: `# NN I-NP O` is the word `#` (a currency sign) with its tag; a
    MultiCoNER id line of as many columns, ending in no tag, is a comment."""
    from finetune.families.token_classification.reading import read_conll

    path = tmp_path / "ner.conll"
    lines = ["# id 7 domain=en", "EU NNP B-NP B-ORG", "pays VBZ B-VP O", "# NN I-NP O", "5 CD I-NP O"]
    path.write_text("\n".join(lines) + "\n")
    read = read_conll(str(path), True)
    assert read["words"] == [["EU", "pays", "#", "5"]]
    assert read["tags"] == [["B-ORG", "O", "O", "O"]]


def test_raw_text_is_split_as_the_tokenizer_splits_it_cjk_included():
    """Words from the tokenizer's own normalizer and pre-tokenizer (BERT's splits each CJK character),
    with their character spans in the text."""
    from transformers import AutoTokenizer

    from finetune.families.token_classification.encoding import split_text
    from tests.helpers import minilm_dir

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    assert split_text(tokenizer, "李明住在北京")[:2] == (list("李明住在北京"), [(i, i + 1) for i in range(6)])
    words, spans, _ = split_text(tokenizer, "Mr.Smith  lives (Brazil)")
    assert words == ["Mr", ".", "Smith", "lives", "(", "Brazil", ")"]
    assert [("Mr.Smith  lives (Brazil)")[a:b] for a, b in spans] == words


def test_raw_text_splits_at_spaces_where_the_tokenizer_has_no_pre_tokenizer():
    """Llama 2's SentencePiece (as transformers converts it: the normalizer turns spaces into ▁, nothing
    pre-tokenizes) gives the whole text one word id: the words are still the text's own, each a span."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from finetune.families.token_classification.encoding import split_text

    text = "John said that Google will buy a house in London."
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()  # pieces trained within words, as SentencePiece's
    backend.train_from_iterator([text] * 3, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>"]))
    backend.pre_tokenizer = None
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")
    assert set(tokenizer(text, add_special_tokens=False).word_ids()) == {0}  # what it gives: one word
    words, spans, tokens = split_text(tokenizer, text)
    assert words == ["John", "said", "that", "Google", "will", "buy", "a", "house", "in", "London."]
    assert [text[a:b] for a, b in spans] == words
    assert sum(map(len, tokens)) == len(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_a_csv_file_is_refused_naming_the_tagging_formats(tmp_path):
    """A .csv cell holding a JSON list is text: "not a list of words" would send the user to fix it."""
    train = tmp_path / "t.csv"
    train.write_text('tokens,tags\n"[""Ann""]","[""B-PER""]"\n')
    with pytest.raises(ConfigError) as error:
        load_tag_splits(tagging_config(tmp_path, train))
    assert "a .csv file holds no lists of words and tags" in str(error.value) and "CoNLL" in error.value.fix


def test_pre_split_words_get_the_tokens_of_running_text_with_gemmas_tokenizer():
    """transformers' GemmaTokenizer writes the spaces' ▁ in its normalizer: a pre-split word, normalized
    alone, would lose it and train on other tokens than raw text and `pipeline` give the word."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    from finetune.families.token_classification.encoding import spaces_words

    text = "John lives in Paris and Lee lives in Rome"
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.train_from_iterator(
        [text] * 3, trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<s>", "</s>"])
    )
    model = json.loads(backend.to_str())["model"]
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<unk>"}
    tokenizer = GemmaTokenizer(vocab=model["vocab"], merges=[tuple(m) for m in model["merges"]], **specials)
    words = text.split()
    assert spaces_words(tokenizer)
    spaced = tokenizer(
        [words[0], *(" " + w for w in words[1:])], is_split_into_words=True, add_special_tokens=False
    )
    assert spaced["input_ids"] == tokenizer(text, add_special_tokens=False)["input_ids"]
