"""The model as a run leaves it: safetensors plus tokenizer (a LoRA model merged, its adapter
beside it), and the upload to the Hub."""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path

from finetune.model.lora import ADAPTER_DIR, is_peft_model, save_merged_and_adapter
from finetune.output.modes import follow_umask
from finetune.output.writing import writing
from finetune.training.checkpoint import BEST_MODEL_DIR, BEST_RECORD


def export_model(accelerator, model, tokenizer, output_dir: str, gguf_file: str | None = None) -> None:
    """Collective: the final model as safetensors plus its tokenizer, loadable by `pipeline`. A LoRA
    model is saved merged (no peft needed to load it), its adapter in `adapter/` (`gguf_file`: the
    --gguf_file its base was read from, which the adapter's card tells peft to pass)."""
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
            _unshare(Path(output_dir))
            if is_peft_model(model):
                save_merged_and_adapter(model, state_dict, output_dir)
                if gguf_file:
                    write_gguf_adapter_card(Path(output_dir) / ADAPTER_DIR, gguf_file)
            else:
                model.save_pretrained(output_dir, state_dict=_without_tied_copies(model, state_dict))
            for how_it_was_read in ("is_local", "local_files_only"):  # would bind a pushed copy to a disk
                tokenizer.init_kwargs.pop(how_it_was_read, None)
            tokenizer.save_pretrained(output_dir)
            for folder in (Path(output_dir), Path(output_dir) / ADAPTER_DIR):
                follow_umask(folder)
            if not best:
                share_with_best_model(run_dir)
    accelerator.wait_for_everyone()


def _without_tied_copies(model, state_dict: dict) -> dict:
    """`state_dict` less each tied weight's copy (a tied head beside the embeddings it equals): FSDP's
    gathered state dict holds them as separate tensors, which save_pretrained would write twice, where a
    model's own state dict shares one (and from_pretrained ties them again from the config)."""
    import torch

    tied = getattr(model, "all_tied_weights_keys", None) or {}
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return state_dict
    present = {target: source for target, source in tied.items() if {target, source} <= state_dict.keys()}
    copies = {name for name, source in present.items() if torch.equal(state_dict[name], state_dict[source])}
    return {name: tensor for name, tensor in state_dict.items() if name not in copies}


def write_gguf_adapter_card(adapter_dir: Path, gguf_file: str) -> None:
    """adapter/README.md in place of peft's blank template, for a base read from a GGUF file: peft
    loads the base named by adapter_config.json's base_model_name_or_path (the file's folder or Hub
    repo), and transformers reads that only with the file's name, which the config has no field for:
    AutoPeftModelForCausalLM passes its keyword arguments on to the base's from_pretrained (tested)."""
    from finetune.output.card import base_model_name

    base = json.loads((adapter_dir / "adapter_config.json").read_text())["base_model_name_or_path"]
    shown, repo = base_model_name(base, gguf_file)
    (adapter_dir / "README.md").write_text(
        "\n".join([
            "---",
            "library_name: peft",
            "pipeline_tag: text-generation",
            *([f"base_model: {repo}"] if repo else []),
            "tags: [finetune, lora]",
            "---",
            "",
            "# LoRA adapter",
            "",
            f"A LoRA adapter (peft) trained by finetune on {shown} dequantised; the model one folder up",
            "is the same model merged, which loads without peft.",
            "",
            "`adapter_config.json` names the base by the GGUF file's folder (`base_model_name_or_path`);",
            "transformers reads that folder only given the file's name, which the adapter's config has no",
            "field for, so pass it:",
            "",
            "```python",
            "from peft import AutoPeftModelForCausalLM",
            "",
            f'model = AutoPeftModelForCausalLM.from_pretrained("{adapter_dir}", gguf_file="{gguf_file}")',
            "```",
            "",
        ])
    )  # fmt: skip


def _weight_files(folder: Path) -> list[Path]:
    return [*folder.glob("*.safetensors"), *(folder / ADAPTER_DIR).glob("*.safetensors")]


def share_with_best_model(root: Path) -> int:
    """Rank 0, after the root's export: each weight file of the root's that best_model/ holds byte for
    byte (the root is the best model: --load_best_model_at_end, or the best was the last step) becomes
    one file with two names (a hard link), so the disk holds the model once (1.1 GB less for SmolLM2),
    and best_model/ stays what README.md says, a complete model with its step. Where the filesystem
    has no hard links, the copy stays. Returns the bytes no longer held twice."""
    saved = 0
    for file in _weight_files(root):
        twin = root / BEST_MODEL_DIR / file.relative_to(root)
        try:
            if not twin.is_file() or os.path.samefile(file, twin) or not filecmp.cmp(file, twin, False):
                continue
            linking = twin.with_name(f".{twin.name}.linking")
            linking.unlink(missing_ok=True)
            os.link(file, linking)
            os.replace(linking, twin)  # atomic: best_model/ never lacks the file
            saved += file.stat().st_size
        except OSError:  # no hard links here (some network and FAT filesystems): two copies, as before
            continue
    return saved


def _unshare(folder: Path) -> None:
    """Before an export writes into `folder`: a weight file shared with the other folder (a hard link,
    `share_with_best_model`) loses this name first, so that a writer that rewrites a file in place (as
    safetensors before 0.8 did) cannot change the other folder's model. best_model/ loses its record
    first: a write that fails then leaves a folder that claims no step, never one whose weights are
    missing (--load_best_model_at_end then exports the last model, saying so)."""
    shared = [file for file in _weight_files(folder) if file.stat().st_nlink > 1]
    if shared and folder.name == BEST_MODEL_DIR:
        (folder / BEST_RECORD).unlink(missing_ok=True)
    for file in shared:
        file.unlink()


HUB_IGNORED = ["checkpoint-*", ".checkpoint-*", "best_model/*", "wandb/*", "*.partial/*"]


def push_to_hub(output_dir: str, repo_id: str | None) -> str:
    """Uploads the model, tokenizer, card, curves and results (no checkpoints); returns the URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    repo = api.create_repo(repo_id or Path(output_dir).name, exist_ok=True).repo_id
    api.upload_folder(repo_id=repo, folder_path=output_dir, ignore_patterns=HUB_IGNORED)
    return f"https://huggingface.co/{repo}"
