"""The model card (README.md) a finished run leaves for people: base model, data, flags, results,
hardware, time."""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path

import torch

from finetune.config.train_config import TrainConfig, as_flag_value, default_of
from finetune.data.tasks import eval_key
from finetune.output.plots import CONFUSION_FILE, CURVES_FILE, _confusion


def hardware(accelerator) -> str:
    if accelerator.device.type == "cuda":
        name = torch.cuda.get_device_name(accelerator.device)
    else:
        name = _cpu_name() or platform.processor() or "CPU"
        name = f"{name}, {os.cpu_count()} cores"
    return f"{accelerator.num_processes} × {accelerator.device.type} ({name})"


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def changed_flags(config: TrainConfig) -> dict:
    """The flags the user set to other values than the defaults (on the command line or in the YAML
    file): a command line that reproduces the run on another machine, which resolves the auto settings
    (padding_free, dropout_kernel, ...) for itself. A config built in Python rather than by parse_config
    has no such record: then every field that differs from its default (as __post_init__ left it)."""
    given = getattr(config, "user_flags", None)
    if given is not None:
        return dict(given)
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != default_of(f) and f.name != "config"
    }


@dataclasses.dataclass(frozen=True)
class CardParts:
    """What a task family's card says of its own: its pipeline, what the model does, how to use it, and
    the family's lines and sections."""

    pipeline_tag: str
    tag: str
    """The card's finetune tag besides `finetune` (glue-mnli, custom, causal-lm)."""
    trained_on: str
    """After "fine-tuned on": what the model learnt."""
    use: tuple[str, ...]
    """The Python lines of the card's Use section."""
    exported: tuple[str, ...] = ()
    """Training's lines after the exported model's step: what the family's `finish` did to it."""
    training: tuple[str, ...] | None = None
    """Training's lines after the base weights: the family's (its label weights, how long texts were
    read). None: texts truncated to --max_length."""
    sections: tuple[str, ...] = ()
    """The card's last sections (per-class scores, a confusion matrix)."""


def is_model_card(path: Path) -> bool:
    """The card `write_model_card` writes (its front matter), not a README of the user's."""
    head = path.read_text(errors="replace")[:400]
    return head.startswith("---\nlibrary_name: transformers\n") and "tags: [finetune," in head


def write_model_card(
    path: Path,
    config: TrainConfig,
    task,
    results: dict,
    data_rows: dict,
    machine: str,
    wall_s: float,
    given_flags: dict,
    parts: CardParts,
) -> None:
    """A Hugging Face model card (README.md): base model, data, flags, results, hardware, time.
    `parts`: the task family's pipeline, description, use and lines of its own (its `card_parts`)."""
    base, base_repo = base_model_name(config.model_name_or_path, config.gguf_file)
    metadata = ["library_name: transformers", f"pipeline_tag: {parts.pipeline_tag}"]
    if base_repo:
        metadata.append(f"base_model: {base_repo}")
    metadata.append(f"tags: [finetune, {parts.tag}]")
    from_hub = not config.uses_local_files and not Path(config.dataset_name).exists()
    if from_hub:
        metadata.append(f"datasets: [{config.dataset_name}]")
    subset = f" ({config.dataset_config_name})" if config.dataset_config_name else ""
    data = (
        {"train": config.train_file, "validation": config.validation_file or _held_out(config)}
        if config.uses_local_files
        else {"Hub" if from_hub else "local": f"{config.dataset_name}{subset}"}
    )
    flags = " ".join(f"--{k} {as_flag_value(v)}" for k, v in given_flags.items())
    keys = [*task.metric_keys(per_class=False), *(eval_key(s, "loss") for s in task.validation_splits)]
    scores = [(k, results[k]) for k in dict.fromkeys(keys) if isinstance(results.get(k), float)]
    lines = [
        "---",
        *metadata,
        "---",
        "",
        f"# {Path(config.output_dir).name}",
        "",
        f"{base} fine-tuned on {parts.trained_on} with finetune.",
        "",
        "## Results",
        "",
        *(
            ["| metric | value |", "| --- | --- |", *(f"| {k} | {v:.4f} |" for k, v in scores)]
            if scores
            else ["Not evaluated: the run had no validation rows (or --eval_strategy no)."]
        ),
        "",
        "## Training",
        "",
        *(f"- {name} data: `{source}`" for name, source in data.items() if source),
        f"- rows: {', '.join(f'{name} {n:,}' for name, n in data_rows.items())}",
        *([f"- as read: {'; '.join(results['task'].splitlines())}"] if results.get("task") else []),
        f"- steps: {results.get('global_step')} optimizer steps, {results.get('epoch')} epochs"
        + (" (stopped early)" if results.get("stopped_early") else ""),
        *_exported_model_line(config, results, parts.exported),
        *(
            [f"- base weights: trained in {results['base_quantization']}"]
            if results.get("base_quantization")
            else []
        ),
        *(parts.training if parts.training is not None else [_truncated_line(config)]),
        f"- hardware: {machine}, mixed precision {results.get('mixed_precision')}",
        f"- time: {results.get('train_runtime_s', 0):.1f} s training over the whole run "
        f"({results.get('train_samples_per_second', 0):.1f} samples/s); this process ran {wall_s:.1f} s",
        "",
        "The flags given:",
        "",
        "```",
        f"accelerate launch -m finetune {flags}",
        "```",
        "",
        "## Use",
        "",
        "```python",
        *parts.use,
        "```",
        "",
        f"![loss, learning rate and evaluation metrics]({CURVES_FILE})",
        "",
        *parts.sections,
    ]
    if not config.save_plots:  # no chart was drawn: no link to one
        lines = [line for line in lines if not line.startswith("![")]
    path.write_text("\n".join(lines))


def base_model_name(model_name_or_path: str, gguf_file: str | None = None) -> tuple[str, str | None]:
    """(how the card names the base model, in Markdown; its Hub id for `base_model:`, or None). A card
    is for others: a Hub id as given; a local folder by its name, not its path (which would publish
    this disk's layout, and names no model anywhere else), or by the Hub id a Hub cache snapshot's
    path holds (.../models--org--name/snapshots/<commit>); a GGUF file inside either, after it."""
    local = Path(model_name_or_path).expanduser()
    repo = model_name_or_path
    if local.exists():
        resolved = local.resolve()
        cached = [p.name for p in resolved.parents if p.name.startswith("models--")]
        in_cache = cached and resolved.parent.name == "snapshots"
        repo = "/".join(cached[0].removeprefix("models--").split("--")) if in_cache else None
    shown = f"`{repo}`" if repo else f"`{local.resolve().name}` (a local folder)"
    return shown + (f", GGUF file `{gguf_file}`," if gguf_file else ""), repo


def _held_out(config: TrainConfig) -> str | None:
    if not config.carves_validation:
        return None
    return f"{config.validation_split_percentage}% of {config.train_file} (seed {config.seed}, stratified)"


def confusion_section(results: dict) -> list[str]:
    """The evaluation's confusion matrix (token classification's, over words), when it made one."""
    found = _confusion(results)
    if found is None:
        return []
    key, confusion = found
    names = confusion["labels"]
    return [
        f"## Confusion matrix (`{key}`; rows: true, columns: predicted)",
        "",
        "| true \\ predicted | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
        *(
            f"| {name} | " + " | ".join(map(str, counts)) + " |"
            for name, counts in zip(names, confusion["matrix"], strict=True)
        ),  # fmt: skip
        "",
        f"![confusion matrix]({CONFUSION_FILE})",
        "",
    ]


def _truncated_line(config: TrainConfig) -> str:
    return f"- long documents: truncated to --max_length {config.max_length} tokens"


def _exported_model_line(config: TrainConfig, results: dict, family_lines: tuple[str, ...]) -> list[str]:
    """Which step the model in this folder is from, and why; then the family's `family_lines`."""
    step = results.get("exported_model_step")
    if step is None:
        return []
    why = (
        f"the best evaluation by {config.metric_for_best_model}"
        if config.load_best_model_at_end and step == results.get("best_step")
        else "the last step"
    )
    return [f"- this model: the weights of step {step}, {why}", *family_lines]
