"""The model as a run leaves it: safetensors plus tokenizer (a LoRA model merged, its adapter
beside it), and the upload to the Hub."""

from __future__ import annotations

from pathlib import Path

from finetune.model.lora import ADAPTER_DIR, is_peft_model, save_merged_and_adapter
from finetune.output.modes import follow_umask
from finetune.output.writing import writing
from finetune.training.checkpoint import BEST_MODEL_DIR


def export_model(accelerator, model, tokenizer, output_dir: str) -> None:
    """Collective: the final model as safetensors plus its tokenizer, loadable by `pipeline`. A LoRA
    model is saved merged (no peft needed to load it), its adapter in `adapter/`."""
    # get_state_dict gathers shards under FSDP, so every rank takes part.
    state_dict = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        # --torch_compile: the compiled wrapper's names carry an `_orig_mod.` prefix that
        # from_pretrained would not recognise (it would load a randomly initialised model).
        state_dict = {name.removeprefix("_orig_mod."): tensor for name, tensor in state_dict.items()}
        model = accelerator.unwrap_model(model, keep_torch_compile=False)
        best = Path(output_dir).name == BEST_MODEL_DIR
        run_dir = Path(output_dir).parent if best else Path(output_dir)
        with writing(f"the {'best ' if best else ''}model", run_dir):
            if is_peft_model(model):
                save_merged_and_adapter(model, state_dict, output_dir)
            else:
                model.save_pretrained(output_dir, state_dict=state_dict)
            for how_it_was_read in ("is_local", "local_files_only"):  # would bind a pushed copy to a disk
                tokenizer.init_kwargs.pop(how_it_was_read, None)
            tokenizer.save_pretrained(output_dir)
            for folder in (Path(output_dir), Path(output_dir) / ADAPTER_DIR):
                follow_umask(folder)
    accelerator.wait_for_everyone()


HUB_IGNORED = ["checkpoint-*", ".checkpoint-*", "best_model/*", "wandb/*", "*.partial/*"]


def push_to_hub(output_dir: str, repo_id: str | None) -> str:
    """Uploads the model, tokenizer, card, curves and results (no checkpoints); returns the URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id or Path(output_dir).name, exist_ok=True).repo_id
    api.upload_folder(repo_id=repo, folder_path=output_dir, ignore_patterns=HUB_IGNORED)
    return f"https://huggingface.co/{repo}"
