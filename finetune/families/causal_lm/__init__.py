"""Supervised fine-tuning of decoder LLMs (`--task_type causal_lm`): conversations, prompt-completion
pairs and plain text, trained on their target tokens only, the loss a mean over every target token of
an update."""
