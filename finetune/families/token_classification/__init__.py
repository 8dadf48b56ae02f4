"""Token classification (`--task_type token_classification`): a tag per word (NER, POS) from JSONL or
parquet rows, CoNLL and CoNLL-U files; trained on labelled sub-tokens (the loss a mean over every one of
an update), scored and predicted per word, long sentences in windows over words."""
