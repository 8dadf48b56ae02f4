"""The task's data: tasks, sources, labels, tokenization, batches."""
