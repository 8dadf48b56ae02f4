"""A local model folder's files fingerprinted by content, for the run identity (identity.py): a base
retrained in place, the same shape under the same names, is another model."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from finetune.config.train_config import TrainConfig

WHOLE_FILE_BYTES = 64 << 20
"""Weight files up to this size are hashed whole (a tiny or small model: well under a second)."""
PER_TENSOR = 4
"""Blocks read from each tensor of a larger safetensors file, evenly spread over its bytes."""
BLOCK_BYTES = 4 << 10
HEADER_MAX_BYTES = 100 << 20
"""safetensors' own limit on its header."""
SAMPLES = 256
"""Blocks read from a larger file of another format (its tensors' places are not read here)."""


def model_files(config: TrainConfig) -> dict[str, str] | None:
    """A local folder's config.json and weight files, each by content: {name: digest} (None for a Hub
    id, whose revision is a flag). What `model_identity` misses: a base retrained in place keeps its
    config, names and sizes, and its resume would mix two models' updates."""
    folder = Path(config.model_name_or_path)
    if not folder.is_dir():
        return None
    files = [folder / "config.json", *weight_files(folder)]
    return {p.name: file_digest(p) for p in files if p.is_file()}


def file_digest(path: Path) -> str:
    """sha256 of the whole file up to WHOLE_FILE_BYTES. Above (multi-GB weights, read at every launch by
    every rank, often from a network file system, where a full hash costs seconds to minutes): its size
    and bytes sampled where a retrained model differs. A safetensors file: its header (every tensor's
    name, dtype, shape and offsets) and PER_TENSOR blocks of each tensor: training changes nearly every
    value of a tensor it updates, so a model retrained in place, even only its head, differs in the
    samples of each tensor it changed (about 5 MiB read for a 7B model's 300 tensors). Content only,
    never mtime: ranks on two hosts reading their own copies of one model must agree. Another format:
    SAMPLES blocks spread over the file. Unreadable: a digest saying so (loading it reports the error)."""
    digest = hashlib.sha256()
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= WHOLE_FILE_BYTES:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                return digest.hexdigest()[:16]
            digest.update(f"{size}\n".encode())
            spans = _tensor_spans(f, digest, size) if path.suffix == ".safetensors" else None
            if spans is None:  # another format: blocks spread evenly over the file
                step = size // SAMPLES
                spans = [(i * step, i * step + BLOCK_BYTES) for i in range(SAMPLES)]
            for start, end in spans:
                for offset in range(start, end, max(BLOCK_BYTES, (end - start) // PER_TENSOR)):
                    f.seek(offset)
                    digest.update(f.read(min(BLOCK_BYTES, end - offset)))
    except (OSError, ValueError):
        digest.update(b"(unreadable)")
    return digest.hexdigest()[:16]


def _tensor_spans(f, digest, size: int) -> list[tuple[int, int]] | None:
    """A safetensors file's header, hashed whole into `digest`, and each tensor's byte range in the
    file, by name; None where the header is not one."""
    length = int.from_bytes(f.read(8), "little")
    if not 0 < length <= min(size - 8, HEADER_MAX_BYTES):
        return None
    raw = f.read(length)
    digest.update(raw)
    header = json.loads(raw)
    data = 8 + length
    offsets = [v["data_offsets"] for k, v in sorted(header.items()) if k != "__metadata__"]
    return [(data + begin, data + end) for begin, end in offsets if end > begin]


def weight_files(folder: Path) -> list[Path]:
    """The folder's weight files (safetensors, PyTorch, GGUF), by name."""
    weights = (".safetensors", ".bin", ".gguf")
    return sorted(p for p in folder.iterdir() if p.suffix in weights and p.is_file())
