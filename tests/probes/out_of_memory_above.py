"""finetune in which a training forward of more rows than this rank "has memory for" raises a real
torch.OutOfMemoryError, as a GPU would. $FITS_ROWS: comma-separated rows per rank (rank 0 first)."""

import os
import sys

import torch


def out_of_memory_above(rows: int):
    """A global forward pre-hook: any training forward (gradients on) whose word embeddings see more than
    `rows` rows raises OutOfMemoryError; evaluation, without gradients, fits any batch. Returns its handle."""

    def hook(module, args):
        if (
            isinstance(module, torch.nn.Embedding)
            and module.num_embeddings > 1000  # the word embeddings, not positions or token types
            and torch.is_grad_enabled()
            and args[0].shape[0] > rows
        ):
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {args[0].shape[0]} rows")

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


if __name__ == "__main__":
    from finetune.mnli import cli

    fits = [int(n) for n in os.environ["FITS_ROWS"].split(",")]
    out_of_memory_above(fits[int(os.environ.get("RANK", "0"))])
    sys.exit(cli(sys.argv[1:]))
