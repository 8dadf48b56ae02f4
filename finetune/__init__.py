"""finetune: one Accelerate loop that fine-tunes BERT-style models from CPU to multi-node."""

__version__ = "0.1.0"

# First, so that its window starts with the process: it measures the CPU other jobs use while this one
# starts, to choose torch's threads (finetune/speed/threads.py).
import finetune.speed.threads  # noqa: E402, F401
