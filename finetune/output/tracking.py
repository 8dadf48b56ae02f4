"""Where metrics go: metrics.jsonl always, plus W&B and/or TensorBoard through accelerate's trackers."""

from __future__ import annotations

import json
import netrc
import os
import urllib.parse
from pathlib import Path

from finetune.net import answers


def resolve_report_to(report_to: str) -> str:
    """--report_to as a run logs: auto is wandb where this machine is logged in to W&B (or was told
    WANDB_MODE=offline), else none, as transformers 5 defaults to none: no offline folders and banners
    for a user who never asked."""
    if report_to != "auto":
        return report_to
    return "wandb" if wandb_key() or os.environ.get("WANDB_MODE") == "offline" else "none"


def trackers_for(report_to: str) -> list[str]:
    """The trackers --report_to names (`resolve_report_to` first)."""
    resolved = resolve_report_to(report_to)
    return {"none": [], "all": ["wandb", "tensorboard"]}.get(resolved, [resolved])


def auto_trackers_notice(report_to: str) -> str | None:
    """The one line a run prints when --report_to auto found no W&B login."""
    if report_to != "auto" or resolve_report_to(report_to) != "none":
        return None
    return (
        "trackers: none (not logged in to W&B: no WANDB_API_KEY, no `wandb login`); metrics go to "
        "metrics.jsonl; --report_to wandb or tensorboard logs there too"
    )


def wandb_key() -> str | None:
    """The W&B API key this machine has: WANDB_API_KEY, or the one `wandb login` wrote to ~/.netrc."""
    return os.environ.get("WANDB_API_KEY") or _netrc_key()


WANDB_PROBE_S = 3.0
"""How long the start waits for the W&B server to answer before logging offline instead."""


def wandb_offline_notice(trackers: list[str]) -> str | None:
    """Switch W&B to offline mode when it can't work online, instead of prompting for a key, failing
    on a malformed one, or waiting minutes for a server that does not answer.

    Called on every rank before the Accelerator exists (only rank 0 will start W&B). Returns the
    one-line notice to print, or None when W&B is not used, is told its mode, or can go online.
    """
    if "wandb" not in trackers or os.environ.get("WANDB_MODE"):
        return None
    key = wandb_key()
    if not key:
        reason = "no API key configured"
    elif problem := _key_problem(key):
        reason = f"the API key is not valid ({problem.rstrip('.')})"
    elif not answers(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"), WANDB_PROBE_S):
        reason = f"its server did not answer within {WANDB_PROBE_S:.0f} s"
    else:
        return None
    os.environ["WANDB_MODE"] = "offline"
    return (
        f"W&B: {reason}, logging offline to <output_dir>/wandb "
        "(`wandb login` then `wandb sync` uploads it; --report_to none turns it off)"
    )


def _netrc_key() -> str | None:
    """The key `wandb login` wrote for this machine's W&B host (a self-hosted one: WANDB_BASE_URL's)."""
    host = urllib.parse.urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        found = netrc.netrc().authenticators(host or "api.wandb.ai")
    except (OSError, netrc.NetrcParseError):
        return None
    return found[2] if found else None


def _key_problem(key: str) -> str | None:
    """W&B's own format check of a key (no network), where this wandb version has it."""
    try:
        from wandb.sdk.lib.wbauth.validation import check_api_key
    except ImportError:
        return None
    return check_api_key(key)


def start_trackers(
    accelerator,
    project_name: str,
    resolved: dict,
    output_dir,
    run_id: str | None,
    run_name: str | None = None,
) -> str | None:
    """Starts the trackers (accelerate does so on the main process only); returns the W&B run id.

    With `run_id` (from a checkpoint), W&B continues that run instead of starting a new one.
    """
    # Trackers take flat scalars (TensorBoard's hparams reject None and nested values).
    flat = {**resolved, **resolved.get("plan", {})}
    wandb_kwargs = {"dir": str(output_dir)} | ({"id": run_id, "resume": "allow"} if run_id else {})
    wandb_kwargs |= {"name": run_name} if run_name else {}
    # A sweep's study (WANDB_RUN_GROUP, set by finetune/studies/sweep.py) read at every run: wandb reads its
    # environment once per process, so a later study in the same process would lose its group.
    group = os.environ.get("WANDB_RUN_GROUP")
    wandb_kwargs |= {"group": group} if group else {}
    scalars = {k: v for k, v in flat.items() if isinstance(v, (int, float, str, bool))}
    try:
        accelerator.init_trackers(project_name, config=scalars, init_kwargs={"wandb": wandb_kwargs})
    except Exception as error:  # wandb's own errors (a key the server refuses, a lost network)
        if not _is_wandb_error(error) or os.environ.get("WANDB_MODE") == "offline":
            raise
        print(
            f"W&B: {type(error).__name__} ({str(error).strip()[:120]}), logging offline to <output_dir>/wandb"
        )
        os.environ["WANDB_MODE"] = "offline"
        accelerator.trackers = []
        accelerator.init_trackers(project_name, config=scalars, init_kwargs={"wandb": wandb_kwargs})
    if accelerator.is_main_process and any(t.name == "wandb" for t in accelerator.trackers):
        return accelerator.get_tracker("wandb", unwrap=True).id
    return run_id


def _is_wandb_error(error: Exception) -> bool:
    return any(cls.__module__.startswith("wandb") for cls in type(error).__mro__)


class MetricsLog:
    """Appends one JSON line per record to metrics.jsonl and forwards it to the trackers.

    Construct and call it on the main process only; the call sites say so.
    """

    def __init__(self, accelerator, output_dir: str, resumed_step: int | None):
        self.accelerator = accelerator
        self.path = Path(output_dir) / "metrics.jsonl"
        kept = []
        if resumed_step is not None and self.path.exists():
            # Lines past the checkpoint came from steps that are about to be replayed.
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if json.loads(line)["step"] <= resumed_step
            ]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        numbers = {k: v for k, v in record.items() if k != "step" and isinstance(v, (int, float))}
        self.accelerator.log(numbers, step=record["step"])
