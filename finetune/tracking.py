"""Where metrics go: metrics.jsonl always, plus W&B and/or TensorBoard through accelerate's trackers."""

from __future__ import annotations

import json
import netrc
import os
from pathlib import Path


def trackers_for(report_to: str) -> list[str]:
    return {"none": [], "all": ["wandb", "tensorboard"]}.get(report_to, [report_to])


def wandb_offline_notice(trackers: list[str]) -> str | None:
    """Switch W&B to offline mode when no API key is configured, instead of prompting for one.

    Called on every rank before the Accelerator exists (only rank 0 will start W&B). Returns the
    one-line notice to print, or None when W&B is not used or is configured already.
    """
    if "wandb" not in trackers or os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return None
    except (OSError, netrc.NetrcParseError):
        pass
    os.environ["WANDB_MODE"] = "offline"
    return (
        "W&B: no API key configured, logging offline to <output_dir>/wandb "
        "(`wandb login` then `wandb sync` uploads it; --report_to none turns it off)"
    )


def start_trackers(
    accelerator, project_name: str, resolved: dict, output_dir, run_id: str | None
) -> str | None:
    """Starts the trackers (accelerate does so on the main process only); returns the W&B run id.

    With `run_id` (from a checkpoint), W&B continues that run instead of starting a new one.
    """
    # Trackers take flat scalars (TensorBoard's hparams reject None and nested values).
    flat = {**resolved, **resolved.get("plan", {})}
    wandb_kwargs = {"dir": str(output_dir)} | ({"id": run_id, "resume": "allow"} if run_id else {})
    accelerator.init_trackers(
        project_name,
        config={k: v for k, v in flat.items() if isinstance(v, (int, float, str, bool))},
        init_kwargs={"wandb": wandb_kwargs},
    )
    if accelerator.is_main_process and any(t.name == "wandb" for t in accelerator.trackers):
        return accelerator.get_tracker("wandb", unwrap=True).id
    return run_id


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
