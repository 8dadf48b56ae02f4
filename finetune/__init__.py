"""finetune: one Accelerate loop that fine-tunes BERT-style models from CPU to multi-node."""

__version__ = "0.1.0"
