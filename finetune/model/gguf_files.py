"""A causal LM read from a GGUF file (--gguf_file): the checks before transformers reads it, one parse of
the file for the whole load, and the marks transformers leaves on the model taken off."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from pathlib import Path

from finetune.errors import ConfigError


def check_gguf(folder: str, gguf_file: str) -> None:
    """A GGUF file the local folder lacks, named with the ones it has (before transformers' long error);
    the gguf package transformers needs for it."""
    where = Path(folder)
    if where.is_dir() and not (where / gguf_file).is_file():
        found = sorted(p.name for p in where.glob("*.gguf")) or ["none"]
        raise ConfigError(
            f"--gguf_file {gguf_file}: not in {folder} (its .gguf files: {', '.join(found)}); name one "
            "of them",
            flag="--gguf_file",
        )
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--gguf_file needs the gguf package; pip install gguf", flag="--gguf_file"
        ) from None


# One swap at a time: a second thread's load, swapping inside the first's, would put back the first's
# swapped names on leaving, and gguf would keep them.
_SWAPPING = threading.Lock()


@contextlib.contextmanager
def read_once():
    """Within it, gguf's reader is built once per file and its tensor-name map once per architecture.

    Why: to load a model and its tokenizer from a GGUF file, transformers 5 parses the file three times
    (the tokenizer, the config, the weights) and, mapping tensor names, builds gguf's TensorNameMap again
    for every submodule (397 times for SmolLM2-135M). That was 23 s of CPU on a Zen 3, of which this saves
    about half, in every rank of every launch (docs/log.md, 2026-11-28). Both are functions of their
    arguments alone, and transformers only reads what they return, so what it loads is unchanged.

    transformers imports both names from gguf inside the functions that use them, so gguf's module is
    where they are swapped; they are put back on leaving. Loads in other threads wait for it."""
    import gguf

    with _SWAPPING:
        reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        readers = {}

        def reader(path, mode="r"):
            key = (os.path.realpath(path), mode)
            if key not in readers:
                readers[key] = reader_class(path, mode)
            return readers[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map


def as_plain_weights(model) -> None:
    """A model read from a GGUF file holds dequantised weights in --torch_dtype, but transformers still
    marks it quantized, refuses to save it ("not serializable") and writes the GGUF settings into every
    config.json: the marks go, so the export is a plain safetensors model."""
    model.hf_quantizer = None
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config
