"""Sequence classification (`--task_type sequence_classification`, the default): a label (or labels, or a
score) per text; family.py is its `TaskFamily`."""
