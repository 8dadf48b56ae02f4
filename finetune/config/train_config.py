"""The one place where a run's settings and their defaults live: `TrainConfig`.

Every field is a `--flag` (finetune/config/parser.py parses them), and `--config FILE.yaml` holds the
same keys (flags given on the command line win over the file).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import huggingface_hub.constants

from finetune.data.tasks import GLUE_TASKS, TASK_CHOICES
from finetune.errors import ConfigError

DATA_EXTENSIONS = (".jsonl", ".json", ".csv", ".tsv", ".parquet")


GLUE_DATASET = "nyu-mll/glue"


# Choice flags are Literal types: `--help` lists them and the parser refuses anything else.
TaskName = Literal[TASK_CHOICES]


ReportTo = Literal["wandb", "tensorboard", "all", "none"]


MixedPrecision = Literal["auto", "no", "bf16", "fp16"]


DropoutKernel = Literal["auto", "packed", "torch"]


AutoSwitch = Literal["auto", "true", "false"]


DdpCommHook = Literal["none", "fp16", "bf16"]


PaddingFree = Literal["auto", "true", "false", "varlen"]


TorchCompileMode = Literal["default", "reduce-overhead", "max-autotune"]


TorchDtype = Literal["auto", "bfloat16", "float16", "float32"]


AttnImplementation = Literal["sdpa", "eager", "flash_attention_2"]


EvalStrategy = Literal["no", "steps", "epoch"]


# The schedules `get_scheduler` builds from warmup and total steps alone; the others need arguments
# this loop does not pass (cosine_with_min_lr, warmup_stable_decay) or a metric (reduce_lr_on_plateau).
LrSchedulerType = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
]


def _help(text: str, **kwargs):
    return field(metadata={"help": text}, **kwargs)


def _choices(annotation) -> tuple | None:
    """The values of a Literal (or Optional Literal) type; None for any other type."""
    if typing.get_origin(annotation) is Literal:
        return typing.get_args(annotation)
    literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is Literal]
    return typing.get_args(literals[0]) if literals else None


@dataclass(frozen=True)
class TrainConfig:
    """What the user asked for, as parsed (flags, then the YAML file, then HF's defaults filled in by
    `__post_init__`); never changed after. What a run resolves for its machine and data is
    `config.resolved.Resolved`; `with_resolved` gives the configuration the run trains with."""

    # --- task, model and data
    task_name: TaskName = _help(
        f"GLUE task ({', '.join(GLUE_TASKS)}) or custom (your files, labels inferred).", default="mnli"
    )
    model_name_or_path: str = _help(
        "Hub model id or local folder with config, weights and tokenizer.", default="bert-base-cased"
    )
    dataset_name: str | None = _help(
        "Hub dataset id, or a local folder of data files (custom tasks); ignored when local files are given.",
        default=GLUE_DATASET,
    )
    dataset_config_name: str | None = _help(
        "Hub dataset subset; default: the task name (GLUE), none (custom).", default=None
    )
    train_split_name: str = _help("Custom task with --dataset_name: its training split.", default="train")
    validation_split_name: str = _help(
        "Custom task with --dataset_name: its validation split (or --validation_split_percentage).",
        default="validation",
    )
    test_split_name: str = _help(
        "Custom task with --dataset_name: the split --do_predict reads.", default="test"
    )
    train_file: str | None = _help(
        "Local training file (.jsonl/.json/.csv/.tsv/.parquet: text column(s) and a label column).",
        default=None,
    )
    validation_file: str | None = _help("Local validation (MNLI: matched) file, same columns.", default=None)
    validation_mismatched_file: str | None = _help(
        "Optional local MNLI validation-mismatched file, same columns.", default=None
    )
    test_file: str | None = _help(
        "Local file to predict with --do_predict; only the text column(s) are needed.", default=None
    )
    text_columns: str | None = _help(
        "Comma-separated text column(s) of the files, one or two; default: the task's own.", default=None
    )
    label_column: str = _help("Label column of the files (class name, class id or a float).", default="label")
    # --- labels: the model's own head, multi-label data, class weights, a carved-out validation split
    ignore_mismatched_sizes: bool = _help(
        "Replace a head trained for something else than the task (other labels, or a regression score "
        "where the task has labels, or the reverse) with a new one (by default that is refused; a head "
        "with the task's labels in another order is always kept).",
        default=False,
    )
    label_separator: str = _help(
        "Separator of several labels in one CSV/TSV label cell (sports|politics): such cells, or JSON "
        "lists in JSONL, make a custom task multi-label (sigmoid per label, BCE loss). 'none': a cell is "
        "one label, whatever it holds.",
        default="|",
    )
    multi_label_threshold: float = _help(
        "Multi-label: a label is predicted when its sigmoid probability is at least this.", default=0.5
    )
    class_weights: str | None = _help(
        "Weights of the classes in the cross-entropy loss (single-label), for unbalanced data: 'balanced' "
        "(n_rows / (n_classes * class count) of the training labels) or a comma list in label order. "
        "eval_loss is weighted the same way.",
        default=None,
    )
    validation_split_percentage: int | None = _help(
        "Without --validation_file: hold out this percentage of --train_file (seeded by --seed, "
        "stratified by label) as the validation split.",
        default=None,
    )
    max_length: int = _help("Longest tokenized pair in tokens; longer pairs are truncated.", default=128)
    max_train_samples: int | None = _help("Use only the first N training rows (debugging).", default=None)
    max_eval_samples: int | None = _help("Use only the first N rows of each evaluation set.", default=None)
    # --- how the checkpoint is loaded (transformers' from_pretrained arguments)
    torch_dtype: TorchDtype = _help(
        "dtype of the weights: float32 (master weights, with --mixed_precision autocast), bfloat16 (for "
        "large decoders; needs native bf16), float16, or auto (the checkpoint's own).",
        default="float32",
    )
    attn_implementation: AttnImplementation | None = _help(
        "Attention kernel: sdpa, eager or flash_attention_2 (CUDA with flash-attn installed); "
        "default: transformers' choice for the model.",
        default=None,
    )
    trust_remote_code: bool = _help(
        "Run the modeling code a checkpoint ships (config.json auto_map); only for code you trust.",
        default=False,
    )
    model_revision: str = _help("Hub branch, tag or commit of the model to load.", default="main")
    group_by_length: bool = _help(
        "Shuffle, then batch pairs of similar length together (far less padding).", default=True
    )
    # --- optimisation
    per_device_train_batch_size: int = _help("Training pairs per micro-batch on each process.", default=32)
    per_device_eval_batch_size: int = _help("Evaluation pairs per batch on each process.", default=64)
    gradient_accumulation_steps: int = _help("Micro-batches summed into one optimizer step.", default=1)
    auto_find_batch_size: bool = _help(
        "Before training, run a forward and backward pass on the longest rows; on out-of-memory halve "
        "--per_device_train_batch_size and double --gradient_accumulation_steps (same global batch, same "
        "results) until it fits.",
        default=False,
    )
    gradient_checkpointing: bool = _help(
        "Recompute each layer's activations in the backward pass instead of storing them: less memory, "
        "one more forward pass of compute per step.",
        default=False,
    )
    learning_rate: float = _help("Peak AdamW learning rate.", default=2e-5)
    weight_decay: float = _help("AdamW weight decay (never applied to biases and LayerNorm).", default=0.01)
    max_grad_norm: float = _help("Clip the global gradient norm to this; 0 disables clipping.", default=1.0)
    adam_beta1: float = _help("AdamW's beta1 (decay of the gradient's running mean).", default=0.9)
    adam_beta2: float = _help("AdamW's beta2 (decay of the squared gradient's running mean).", default=0.999)
    adam_epsilon: float = _help("AdamW's epsilon (added to the denominator).", default=1e-8)
    num_train_epochs: float = _help(
        "Passes over the training data; a fraction (0.5) stops the last pass part-way, as HF Trainer does.",
        default=3,
    )
    max_train_steps: int | None = _help(
        "Stop after this many optimizer steps (overrides epochs).", default=None
    )
    lr_scheduler_type: LrSchedulerType = _help(
        "Learning-rate schedule (transformers' names).", default="linear"
    )
    warmup_ratio: float = _help(
        "Fraction of optimizer steps spent warming up the learning rate.", default=0.1
    )
    warmup_steps: float = _help(
        "Learning-rate warmup as optimizer steps, or below 1 as a fraction of them (HF Trainer 5's rule); "
        "above 0 it overrides --warmup_ratio.",
        default=0,
    )
    label_smoothing_factor: float = _help(
        "Label smoothing of the cross-entropy (single-label classification): the target puts this much "
        "probability evenly over all labels. eval_loss is smoothed the same way, as HF Trainer's.",
        default=0.0,
    )
    seed: int = _help("Seed for weights of new heads, dropout and data order.", default=42)
    mixed_precision: MixedPrecision = _help(
        "auto (the accelerate config's bf16/fp16, else bf16 where the device multiplies it natively, "
        "else fp32), no, bf16 or fp16.",
        default="auto",
    )
    dropout_kernel: DropoutKernel = _help(
        "auto (packed on CPU, torch on CUDA), packed (4 masks per 64-bit random draw) or torch.",
        default="auto",
    )
    padding_free: PaddingFree = _help(
        "auto (on CPU for BERT, RoBERTa, XLM-R and ELECTRA without --torch_compile, except on CPUs with "
        "AMX, whose padded matmuls are fast enough that skipping padding does not pay), true or false: the "
        "encoder skips padding everywhere but in attention; same results, less work. varlen (for CUDA; see "
        "docs/benchmarks.md for its status): the collator packs real tokens only, attention runs torch's "
        "variable-length kernel (on CPU a slow per-pair reference).",
        default="auto",
    )
    pad_to_multiple_of: str = _help(
        "Pad each batch's length up to a multiple of N tokens (capped at --max_length), so a compiled "
        "model meets few shapes: 32 gives 4 at --max_length 128. auto: 8 on CUDA (tensor cores), none on "
        "CPU (padding there is only extra work). A number also has attention masks built without asking "
        "the device whether a batch holds padding (no wait per forward).",
        default="auto",
    )
    keep_freed_memory: AutoSwitch = _help(
        "On CPU with glibc, keep freed memory in the heap for reuse: no page faults re-mapping each "
        "step's embedding gradient, at the cost of keeping memory freed after the peak. auto: on when "
        "the CPU trains in bf16, where the saved faults pay; off in fp32, where they do not "
        "(docs/benchmarks.md); false leaves glibc's own behaviour untouched.",
        default="auto",
    )
    torch_compile: bool = _help(
        "Compile the model with torch.compile (inductor, dynamic shapes). Pays off only on long GPU runs: "
        "compiling costs about a minute and each step gains little back; on CPU eager is faster. "
        "See docs/benchmarks.md.",
        default=False,
    )
    torch_compile_mode: TorchCompileMode | None = _help(
        "torch.compile mode; setting it implies --torch_compile. reduce-overhead replays forward and "
        "backward as CUDA graphs (pair it with --pad_to_multiple_of 32); unset: torch's default.",
        default=None,
    )
    torch_compile_regional: bool = _help(
        "With --torch_compile, compile each repeated encoder layer once and reuse it (Accelerate's "
        "regional compilation): shorter compiles, graph breaks between layers.",
        default=False,
    )
    peak_tflops: float | None = _help(
        "Peak TFLOP/s of one device in the training precision, for MFU in logs and results.json "
        "(bf16 dense: H100 SXM 989, A100 312; `make bench` measures a CPU's); unset: no MFU.",
        default=None,
    )
    # --- LoRA through peft (TRL's flag names)
    use_peft: bool = _help(
        "Train LoRA adapters (peft) instead of every weight; the output is the merged model plus "
        "output_dir/adapter.",
        default=False,
    )
    lora_r: int = _help("LoRA rank: the inner size of each adapter's B·A.", default=16)
    lora_alpha: int = _help("LoRA scaling numerator: adapters add B·A·alpha/r.", default=32)
    lora_dropout: float = _help("Dropout on each adapter's input.", default=0.05)
    lora_target_modules: list[str] = _help(
        "Module names (ends of module paths, e.g. query value) that get adapters; all-linear: every "
        "Linear layer but the head.",
        default_factory=lambda: ["all-linear"],
    )
    lora_modules_to_save: list[str] | None = _help(
        "Modules trained in full beside the adapters; default: the classification head.", default=None
    )
    # --- outputs, checkpoints, logging
    output_dir: str | None = _help(
        "Folder for the model, results, metrics, checkpoints; default outputs/<task_name>.", default=None
    )
    overwrite_output_dir: bool = _help(
        "Allow writing into an output_dir that holds a finished run.", default=False
    )
    checkpointing_steps: str | None = _help(
        "Save full training state every N optimizer steps, or 'epoch'.", default=None
    )
    resume_from_checkpoint: str | None = _help(
        "Checkpoint folder to resume from, or 'auto' for the newest complete one in output_dir.", default=None
    )
    save_total_limit: int | None = _help(
        "Keep the newest N checkpoints (plus the best one); older ones are removed.", default=None
    )
    # --- evaluation schedule, best model, early stopping (Hugging Face Trainer names)
    eval_strategy: EvalStrategy = _help(
        "When to evaluate while training: no, steps (every --eval_steps) or epoch; the last step is "
        "always evaluated unless no.",
        default="epoch",
    )
    eval_steps: int | None = _help(
        "With --eval_strategy steps: evaluate every N optimizer steps; default --logging_steps.", default=None
    )
    metric_for_best_model: str | None = _help(
        "Evaluation metric that picks the best model, kept in output_dir/best_model: eval_loss or a task "
        "metric; default: the task's first (eval_matched_accuracy for MNLI, eval_matthews_correlation for "
        "CoLA). Custom classification: eval_accuracy, eval_f1_macro or a class's eval_precision_<label>, "
        "eval_recall_<label>, eval_f1_<label>, eval_support_<label>; multi-label: eval_f1_micro, "
        "eval_f1_macro, eval_exact_match.",
        default=None,
    )
    greater_is_better: bool | None = _help(
        "Whether a larger --metric_for_best_model is better; default: false for a loss, else true.",
        default=None,
    )
    load_best_model_at_end: bool | None = _help(
        "Export (and predict and push) the best model by --metric_for_best_model instead of the last one; "
        "default: true whenever the run evaluates.",
        default=None,
    )
    early_stopping_patience: int | None = _help(
        "Stop training after N evaluations in a row that do not improve --metric_for_best_model by more "
        "than --early_stopping_threshold; unset: never stop early.",
        default=None,
    )
    early_stopping_threshold: float = _help(
        "How much an evaluation must beat the best one by to reset --early_stopping_patience.", default=0.0
    )
    logging_steps: int = _help("Log loss, learning rate and throughput every N optimizer steps.", default=50)
    report_to: ReportTo = _help(
        "Tracker: wandb, tensorboard, all or none (metrics.jsonl is always written).", default="wandb"
    )
    project_name: str | None = _help(
        "Tracker project name (the W&B project); default finetune-<task_name>.", default=None
    )
    run_name: str | None = _help("Name of the run in W&B; default: W&B's own.", default=None)
    dataloader_num_workers: int = _help("Worker processes feeding each training process.", default=0)
    do_train: bool = _help(
        "Train; with false, only evaluate (and/or predict with) --model_name_or_path.", default=True
    )
    do_predict: bool = _help(
        "Write output_dir/predictions.jsonl: label and probabilities for every row of --test_file.",
        default=False,
    )
    push_to_hub: bool = _help("Upload the model, its card and results to the Hub at the end.", default=False)
    hub_model_id: str | None = _help(
        "Hub repository for --push_to_hub (user/name); default: the output_dir's name.", default=None
    )
    # --- DDP (multi-process runs; passed to torch DistributedDataParallel through accelerate)
    ddp_bucket_cap_mb: int = _help("Gradient bucket size in MB for DDP all-reduce.", default=25)
    ddp_find_unused_parameters: bool = _help(
        "Let DDP tolerate parameters without gradients (slower; only for models that need it).", default=False
    )
    ddp_gradient_as_bucket_view: bool = _help(
        "Gradients as views into DDP's buckets: saves one gradient-sized copy of memory.", default=True
    )
    ddp_comm_hook: DdpCommHook = _help(
        "Compress gradients for all-reduce: none, fp16 or bf16 (halves traffic, for slow interconnects).",
        default="none",
    )
    config: str | None = _help(
        "YAML file holding any of these keys; command-line flags override it.", default=None
    )

    debug: bool = _help("Show full Python tracebacks for errors instead of one line.", default=False)

    def __post_init__(self):
        hints = typing.get_type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            value, choices = getattr(self, f.name), _choices(hints[f.name])
            # The parser checks flags; values from YAML or Python code arrive here unchecked.
            if choices and value is not None and value not in choices:
                raise ConfigError(f"--{f.name} must be one of {', '.join(choices)}, got {value!r}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name} must be a finite number, got {value}")
        positive = (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
            "max_length",
            "logging_steps",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if not self.num_train_epochs > 0:
            raise ConfigError(
                "--num_train_epochs must be a positive integer or fraction (0.5), "
                f"got {self.num_train_epochs}"
            )
        for name in ("max_train_steps", "max_train_samples", "max_eval_samples", "save_total_limit"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name} must be a positive integer or left unset, got {value}")
        if self.learning_rate <= 0:
            raise ConfigError(f"--learning_rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_steps < 0 or (self.warmup_steps >= 1 and not float(self.warmup_steps).is_integer()):
            raise ConfigError(
                f"--warmup_steps must be a whole number of steps, a fraction below 1, or 0 (--warmup_ratio "
                f"decides), got {self.warmup_steps}"
            )
        if float(self.warmup_steps).is_integer():
            self._default("warmup_steps", int(self.warmup_steps))  # shown as 5, not 5.0
        if not 0.0 <= self.label_smoothing_factor < 1.0:
            raise ConfigError(
                f"--label_smoothing_factor must be in [0, 1), got {self.label_smoothing_factor}"
            )
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError("--weight_decay and --max_grad_norm must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.adam_epsilon <= 0:
            raise ConfigError(f"--adam_epsilon must be > 0, got {self.adam_epsilon}")
        if self.dataloader_num_workers < 0:
            raise ConfigError(f"--dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}")
        if self.torch_dtype == "float16" and self.do_train:
            raise ConfigError(
                "--torch_dtype float16: fp16 weights train unstably (no fp32 master copy, gradients the "
                "loss scaler can't unscale); use float32 with --mixed_precision fp16, or bfloat16"
            )
        if self.ddp_bucket_cap_mb <= 0:
            raise ConfigError(f"--ddp_bucket_cap_mb must be a positive integer, got {self.ddp_bucket_cap_mb}")
        self._default("output_dir", self.output_dir or f"outputs/{self.task_name}")
        self._default("project_name", self.project_name or f"finetune-{self.task_name}")
        if self.task_name != "custom":
            self._default("dataset_config_name", self.dataset_config_name or self.task_name)
        if self.metric_for_best_model is not None and not self.metric_for_best_model.startswith("eval_"):
            raise ConfigError(
                f"--metric_for_best_model must name an evaluation metric such as eval_accuracy, "
                f"got {self.metric_for_best_model!r}"
            )
        self._check_evaluation_schedule()
        if self.overwrite_output_dir and self.resume_from_checkpoint:
            raise ConfigError(
                "--overwrite_output_dir starts the run over and --resume_from_checkpoint continues it: "
                "give one"
            )
        if self.text_columns is not None and not 1 <= len(self.text_column_names) <= 2:
            raise ConfigError(f"--text_columns takes 1 or 2 comma-separated names, got {self.text_columns!r}")
        if self.task_name == "custom" and not self.text_columns:
            raise ConfigError("--task_name custom needs --text_columns (one column, or two for pairs)")
        if self.validation_mismatched_file and self.task_name != "mnli":
            raise ConfigError("--validation_mismatched_file is for MNLI only; use --validation_file")
        if self.push_to_hub and huggingface_hub.constants.HF_HUB_OFFLINE:
            raise ConfigError("--push_to_hub needs the Hub; HF_HUB_OFFLINE is set: unset it or drop the flag")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ConfigError(f"--peak_tflops must be > 0 or left unset, got {self.peak_tflops}")
        if self.pad_to_multiple_of != "auto" and not (
            self.pad_to_multiple_of.isdigit() and int(self.pad_to_multiple_of) > 0
        ):
            raise ConfigError(
                f"--pad_to_multiple_of must be a positive integer or auto, got {self.pad_to_multiple_of!r}"
            )
        if self.torch_compile_mode is not None:
            self._default("torch_compile", True)  # as in transformers' TrainingArguments
        if self.lora_r <= 0 or self.lora_alpha <= 0:
            raise ConfigError(
                f"--lora_r and --lora_alpha must be positive, got {self.lora_r} and {self.lora_alpha}"
            )
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"--lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if "all-linear" in self.lora_target_modules and len(self.lora_target_modules) > 1:
            raise ConfigError("--lora_target_modules: give all-linear alone, or module names without it")
        if self.use_peft and not self.do_train:
            raise ConfigError(
                "--use_peft trains new adapters, --do_train false trains nothing: evaluate a LoRA run's "
                "merged model (its output_dir) without --use_peft"
            )
        cs = self.checkpointing_steps
        if cs is not None and cs != "epoch" and not (cs.isdigit() and int(cs) > 0):
            raise ConfigError(f"--checkpointing_steps must be a positive integer or 'epoch', got {cs!r}")
        for name in ("train_file", "validation_file", "validation_mismatched_file", "test_file"):
            path = getattr(self, name)
            if path and Path(path).suffix.lower() not in DATA_EXTENSIONS:
                raise ConfigError(
                    f"--{name} {path}: unsupported extension; use one of {', '.join(DATA_EXTENSIONS)}"
                )
        self._check_label_flags()
        self._check_data_sources()
        if self.uses_local_files:
            if self.do_train and not self.train_file:
                raise ConfigError("training on local files needs --train_file")
            if self.evaluates_training and not (self.validation_file or self.carves_validation):
                raise ConfigError(
                    "training on local files needs --validation_file (it judges the run), or "
                    "--validation_split_percentage, or --eval_strategy no to train without evaluating"
                )
            if self.do_predict and not self.test_file:
                raise ConfigError("--do_predict on local files needs --test_file")
            if not self.do_train and not (self.validation_file or self.do_predict):
                raise ConfigError(
                    "--do_train false: give --validation_file to evaluate, or --do_predict with --test_file"
                )
        elif not self.dataset_name:
            raise ConfigError("give local files (--train_file/--validation_file), or a Hub --dataset_name")
        elif self.task_name == "custom" and self.dataset_name == GLUE_DATASET:
            raise ConfigError(
                "--task_name custom: give local files (--train_file, --validation_file) or --dataset_name (a "
                "Hub dataset id or a local folder of data files)"
            )

    def _check_data_sources(self) -> None:
        split_names = {
            "train_split_name": "train",
            "validation_split_name": "validation",
            "test_split_name": "test",
        }
        renamed = [f"--{flag}" for flag, default in split_names.items() if getattr(self, flag) != default]
        if self.uses_local_files and self.dataset_name != GLUE_DATASET:
            raise ConfigError(
                "--dataset_name and local files (--train_file, ...) name two sources of rows: give one"
            )
        if renamed and (self.uses_local_files or self.task_name != "custom"):
            raise ConfigError(
                f"{renamed[0]} names a split of a custom task's --dataset_name; GLUE tasks and local files "
                "have their own: drop it"
            )
        if self.evaluates_training and self.train_split_name == self.validation_split_name:
            raise ConfigError(
                f"--validation_split_name {self.validation_split_name} is the training split: the run would "
                "judge itself on its training rows; name another split or use --validation_split_percentage"
            )

    def _check_label_flags(self) -> None:
        if not 0.0 < self.multi_label_threshold < 1.0:
            raise ConfigError(f"--multi_label_threshold must be in (0, 1), got {self.multi_label_threshold}")
        if not self.label_separator:
            raise ConfigError("--label_separator must not be empty; the default is |, 'none' splits nothing")
        if self.class_weights not in (None, "balanced"):
            try:
                weights = self.listed_class_weights
            except ValueError:
                weights = ()
            if not weights or not all(math.isfinite(w) and w > 0 for w in weights):
                raise ConfigError(
                    "--class_weights must be 'balanced' or a comma list of positive numbers, got "
                    f"{self.class_weights!r}"
                )
        p = self.validation_split_percentage
        if p is not None:
            if not 0 < p < 100:
                raise ConfigError(f"--validation_split_percentage must be in 1..99, got {p}")
            if self.validation_file or (self.uses_local_files and not self.train_file):
                raise ConfigError(
                    "--validation_split_percentage carves the validation split out of the training rows: "
                    "give --train_file (or --dataset_name) and no --validation_file"
                )

    def _default(self, name: str, value) -> None:
        """A default HF's TrainingArguments also fills in at parse time (the dataclass is frozen after)."""
        object.__setattr__(self, name, value)

    def with_resolved(self, resolved) -> TrainConfig:
        """The configuration a run trains with: these flags, each `auto` or derived choice replaced by
        what `resolved` (a `config.resolved.Resolved`) chose; the flags the user gave stay readable."""
        config = copy.copy(self)  # not dataclasses.replace: the checks of user input ran once, on these flags
        for name, value in dataclasses.asdict(resolved).items():
            object.__setattr__(config, name, value)
        return config

    @property
    def cell_label_separator(self) -> str | None:
        """--label_separator as the text that splits a label cell; None: cells are whole labels."""
        return None if self.label_separator == "none" else self.label_separator

    @property
    def listed_class_weights(self) -> tuple[float, ...] | None:
        """--class_weights given as a comma list, as numbers; None when unset or 'balanced'."""
        if self.class_weights in (None, "balanced"):
            return None
        return tuple(float(w) for w in self.class_weights.split(","))

    @property
    def train_source(self) -> str:
        """The training rows, as a message names them."""
        if self.train_file:
            return f"--train_file {self.train_file}"
        return f"--dataset_name {self.dataset_name} (split {self.train_split_name})"

    @property
    def evaluates_training(self) -> bool:
        """Training, judged on validation rows as it goes (--eval_strategy other than no)."""
        return self.do_train and self.eval_strategy != "no"

    @property
    def carves_validation(self) -> bool:
        return self.validation_split_percentage is not None and not self.validation_file

    @property
    def hub_options(self) -> dict:
        """How every `from_pretrained` of the model folder or Hub id reads it."""
        return {"revision": self.model_revision, "trust_remote_code": self.trust_remote_code}

    def _check_evaluation_schedule(self) -> None:
        """--eval_strategy and what depends on it: refused before anything loads; defaults resolved."""
        evaluates = self.eval_strategy != "no"
        if self.eval_steps is not None and self.eval_strategy != "steps":
            raise ConfigError(
                f"--eval_steps is for --eval_strategy steps (this run has {self.eval_strategy}); add "
                "--eval_strategy steps or drop --eval_steps"
            )
        if self.eval_steps is not None and self.eval_steps <= 0:
            raise ConfigError(f"--eval_steps must be a positive integer, got {self.eval_steps}")
        if self.eval_strategy == "steps" and self.eval_steps is None:
            self._default("eval_steps", self.logging_steps)  # as Hugging Face Trainer does
        if self.load_best_model_at_end and not evaluates:
            raise ConfigError(
                "--load_best_model_at_end needs evaluations to pick the best model; set --eval_strategy "
                "steps or epoch, or drop --load_best_model_at_end"
            )
        if self.load_best_model_at_end is None:
            self._default("load_best_model_at_end", evaluates)
        if self.early_stopping_patience is not None:
            if self.early_stopping_patience <= 0:
                raise ConfigError(
                    f"--early_stopping_patience must be a positive integer or left unset, "
                    f"got {self.early_stopping_patience}"
                )
            if not evaluates or not self.do_train:
                raise ConfigError(
                    "--early_stopping_patience counts evaluations during training; set --eval_strategy steps "
                    "or epoch (with --do_train), or drop --early_stopping_patience"
                )
        if self.early_stopping_threshold < 0:
            raise ConfigError(f"--early_stopping_threshold must be >= 0, got {self.early_stopping_threshold}")

    @property
    def uses_local_files(self) -> bool:
        return any((self.train_file, self.validation_file, self.validation_mismatched_file, self.test_file))

    @property
    def text_column_names(self) -> tuple[str, ...] | None:
        if self.text_columns is None:
            return None
        return tuple(c.strip() for c in self.text_columns.split(",") if c.strip())

    @property
    def checkpoint_every_epoch(self) -> bool:
        return self.checkpointing_steps == "epoch"

    @property
    def checkpoint_every_n_steps(self) -> int | None:
        cs = self.checkpointing_steps
        return int(cs) if cs is not None and cs != "epoch" else None


def greater_is_better_default(metric: str) -> bool:
    """Hugging Face Trainer's rule: a loss is better smaller, any other metric larger."""
    return not metric.endswith("loss")


def default_of(f: dataclasses.Field):
    """A field's default value, made by its factory for the list flags."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def as_flag_value(value) -> str:
    """A value as the command line takes it: lists space-separated (nargs flags)."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def to_dict(config: TrainConfig) -> dict:
    return dataclasses.asdict(config)
