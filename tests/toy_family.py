"""A task family from outside the package, for the contract test (tests/e2e/test_families.py): it
regresses a number (how many words a text has) from a tiny encoder, and trains, evaluates, predicts,
resumes and exports with no change outside this file.

What a family must provide is `finetune.families.family.TaskFamily` (the Protocol): its `name` (the
--task_type it is registered as), `pipeline_tag`, `captures_cuda_graphs`, `done_in_export`, and the hooks
run.py calls: load, choose_metric, check, build_model, tokenize, dataloaders, forward_backward (a
`MicroBatch`), evaluator, autocast_loaders, predict, card_parts, subject, record_extras, fit_batch_size,
step_graphs and finish. `finetune.families.register(name, factory)` makes it a --task_type in this
process; run as a script, this file registers it on every rank, then runs finetune's CLI."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from finetune.data.batching import PadCollator, build_dataloaders, resolve_pad_to_multiple_of
from finetune.errors import ConfigError
from finetune.families import register
from finetune.families.family import MicroBatch, metric_choice
from finetune.model.build import plain_speed
from finetune.output.card import CardParts
from finetune.training.evaluation import progress

NAME = "toy_word_count"


@dataclass
class CountTask:
    """What the run learns: each text's word count; the rows read per split."""

    counts: dict[str, int] = field(default_factory=dict)
    validation_splits: tuple[str, ...] = ("validation",)

    def metric_keys(self, per_class: bool = True) -> list[str]:
        return ["eval_mae"]

    def summary(self) -> str:
        return f"{NAME}: " + ", ".join(f"{name}: {rows} texts" for name, rows in self.counts.items())


class WordCount:
    name = NAME
    pipeline_tag = "text-classification"
    captures_cuda_graphs = False
    done_in_export = {}

    def load(self, config):
        files = {"train": config.train_file, "validation": config.validation_file, "test": config.test_file}
        wanted = {"train": config.do_train, "validation": True, "test": config.do_predict}
        splits = {name: Dataset.from_json(path) for name, path in files.items() if path and wanted[name]}
        for name, split in splits.items():
            if "text" not in split.column_names:
                raise ConfigError(f"--{name}_file {files[name]} has no `text` column; give one")
        task = CountTask({name: len(split) for name, split in splits.items()})
        return task, splits

    def choose_metric(self, config, task, splits: dict) -> dict:
        return metric_choice(config, splits, ["eval_loss", "eval_mae"], "eval_loss")

    def check(self, config, task, splits: dict) -> None:
        """Nothing this family cannot honour among the flags no family owns."""

    def build_model(self, args, task, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str):
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        model = AutoModelForSequenceClassification.from_pretrained(
            args.model_name_or_path, num_labels=1, problem_type="regression", ignore_mismatched_sizes=True,
            **loading,
        )  # fmt: skip
        backbone = {"model_type": model.config.model_type, "head": "regression (one number)"}
        return model, tokenizer, backbone, plain_speed(args, model, accelerator)

    def tokenize(self, task, splits: dict, tokenizer, config, accelerator) -> dict:
        """No collective: every rank encodes the rows alike."""

        def encode(batch, rows):
            encoded = tokenizer(batch["text"], truncation=True, max_length=config.max_length)
            encoded["labels"] = [float(len(text.split())) for text in batch["text"]]
            encoded["row"] = rows
            encoded["length"] = [len(ids) for ids in encoded["input_ids"]]
            return encoded

        return {
            name: split.map(encode, batched=True, with_indices=True, remove_columns=split.column_names)
            for name, split in splits.items()
        }

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
        collator = PadCollator(tokenizer, multiple, config.max_length)
        return build_dataloaders(tokenized, tokenizer, config, world_size, on_gpu, collator=collator)

    def forward_backward(self, model, accelerator, task, batch: dict, batch_divisor: int, graphs=None):
        """The summed squared error of the micro-batch's texts (units None: the update is the mean per
        text of the window)."""
        labels = batch.pop("labels")
        batch.pop("row")
        summed = _squared_errors(model, batch, labels).sum()
        accelerator.backward(summed / batch_divisor)
        return MicroBatch(summed.detach(), None, labels.shape[0], batch["attention_mask"].sum())

    def evaluator(self, task, accelerator):
        return functools.partial(_evaluate, accelerator=accelerator)

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        return eval_loaders

    def predict(self, accelerator, model, loader, task, num_rows: int) -> list[dict]:
        """Collective: each text's predicted count, in input order."""
        rows, scores, _ = _outputs(accelerator, model, loader)
        order = rows.argsort()
        return [{"row": int(rows[i]), "score": float(scores[i])} for i in order]

    def card_parts(self, config, task, results: dict) -> CardParts:
        use = ("from transformers import pipeline", "", f'count = pipeline("text-classification", '
               f'model="{config.output_dir}", function_to_apply="none")')  # fmt: skip
        return CardParts(pipeline_tag=self.pipeline_tag, tag="toy", trained_on="word counts", use=use)

    def subject(self, config) -> str:
        return "word counts"

    def record_extras(self, task) -> dict:
        return {}

    def fit_batch_size(self, config, model, train, tokenizer, accelerator):
        raise NotImplementedError("--auto_find_batch_size is classification's (config/families.py)")

    def step_graphs(self, args, config, accelerator, model, task) -> None:
        """No CUDA graphs."""

    def finish(self, run) -> dict:
        return {}


def _squared_errors(model, batch: dict, labels: torch.Tensor) -> torch.Tensor:
    return (model(**batch).logits.squeeze(-1).float() - labels.float()) ** 2


def _outputs(accelerator, model, loader) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Collective: every row's number, predicted count and true count (0 without labels), each row once
    (gather_for_metrics drops the rows Accelerate repeats to even the shards)."""
    model.eval()
    kept = []
    with torch.no_grad(), progress(accelerator, loader, "predict") as batches:
        for batch in batches:
            row = batch.pop("row")
            labels = batch.pop("labels", None)
            score = model(**batch).logits.squeeze(-1).float()
            labels = torch.zeros_like(score) if labels is None else labels.float()
            kept.append(accelerator.gather_for_metrics((row, score, labels)))
    model.train()
    return tuple(torch.cat([k[i] for k in kept]).cpu() for i in range(3))


def _evaluate(model, eval_loaders: dict, should_stop=None, *, accelerator) -> dict:
    """Collective: eval_loss (the mean squared error per text) and eval_mae, each text counted once."""
    results = {}
    for split, loader in eval_loaders.items():
        _, scores, labels = _outputs(accelerator, model, loader)
        errors = scores.double() - labels.double()
        prefix = "eval" if split == "validation" else f"eval_{split}"
        results[f"{prefix}_loss"] = float((errors**2).mean())
        results[f"{prefix}_mae"] = float(errors.abs().mean())
        results[f"{prefix}_samples"] = len(errors)
    return results


if __name__ == "__main__":  # finetune's CLI with this family registered (each launched rank runs it)
    from finetune.cli import script

    register(NAME, WordCount)
    sys.exit(script())
