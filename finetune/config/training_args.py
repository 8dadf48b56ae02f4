"""Two groups of flags: optimization (batches, AdamW, schedule, seed) and evaluation (when to
evaluate, the best model, early stopping), with Hugging Face Trainer's names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finetune.errors import ConfigError

MAX_SEED = 2**32 - 1  # what numpy.random.seed takes (transformers.set_seed seeds numpy too)

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


@dataclass(frozen=True)
class OptimizationArgs:
    """Optimization: training or not, batches, AdamW, the learning-rate schedule, the seed."""

    do_train: bool = True
    """Train; with false, only evaluate (and/or predict with) --model_name_or_path."""
    per_device_train_batch_size: int = 32
    """Training pairs per micro-batch on each process."""
    gradient_accumulation_steps: int = 1
    """Micro-batches summed into one optimizer step."""
    learning_rate: float = 2e-5
    """Peak AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay (never applied to biases and LayerNorm)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping."""
    adam_beta1: float = 0.9
    """AdamW's beta1 (decay of the gradient's running mean)."""
    adam_beta2: float = 0.999
    """AdamW's beta2 (decay of the squared gradient's running mean)."""
    adam_epsilon: float = 1e-8
    """AdamW's epsilon (added to the denominator)."""
    num_train_epochs: float = 3
    """Passes over the training data; a fraction (0.5) stops the last pass part-way, as HF Trainer does."""
    max_train_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs)."""
    lr_scheduler_type: LrSchedulerType = "linear"
    """Learning-rate schedule (transformers' names)."""
    warmup_ratio: float = 0.1
    """Fraction of optimizer steps spent warming up the learning rate."""
    warmup_steps: float = 0
    """Learning-rate warmup as optimizer steps, or below 1 as a fraction of them (HF Trainer 5's rule); above
    0 it overrides --warmup_ratio."""
    seed: int = 42
    """Seed for weights of new heads, dropout and data order."""
    seeds: str | None = None
    """Comma-separated seeds (42,43,44,45,46) in place of --seed: the same run once per seed, each a complete
    run in output_dir/seed-<s>/, then output_dir/summary.json with every evaluation metric's mean, sample
    std, min, max and 95% confidence interval over the seeds, and which seed's folder holds the best and
    the median model. With --resume_from_checkpoint auto a relaunch finishes the missing seeds only."""

    @property
    def seed_list(self) -> list[int]:
        """--seeds as numbers, in the order given ([] when unset)."""
        return [int(s) for s in self.seeds.split(",")] if self.seeds else []

    def __post_init__(self):
        """Checks of this group's flags alone."""
        if self.seeds is not None:
            given = [s.strip() for s in self.seeds.split(",")]
            numbers = [int(s) for s in given if s.isdigit()]  # 01 is 1: one seed, not two
            if len(numbers) != len(given) or len(set(numbers)) != len(numbers) or max(numbers) > MAX_SEED:
                raise ConfigError(
                    f"--seeds must be distinct whole numbers from 0 to {MAX_SEED} joined by commas "
                    f"(42,43,44), got {self.seeds!r}"
                )
            object.__setattr__(self, "seeds", ",".join(map(str, numbers)))
        if not 0 <= self.seed <= MAX_SEED:  # numpy's and torch's seeds are 32-bit
            raise ConfigError(f"--seed must be a whole number from 0 to {MAX_SEED}, got {self.seed}")
        for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if not self.num_train_epochs > 0:
            raise ConfigError(
                "--num_train_epochs must be a positive integer or fraction (0.5), "
                f"got {self.num_train_epochs}"
            )
        if self.max_train_steps is not None and self.max_train_steps <= 0:
            raise ConfigError(
                f"--max_train_steps must be a positive integer or left unset, got {self.max_train_steps}"
            )
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
            object.__setattr__(self, "warmup_steps", int(self.warmup_steps))  # shown as 5, not 5.0
        if self.weight_decay < 0 or self.max_grad_norm < 0:
            raise ConfigError("--weight_decay and --max_grad_norm must be >= 0")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.adam_epsilon <= 0:
            raise ConfigError(f"--adam_epsilon must be > 0, got {self.adam_epsilon}")


@dataclass(frozen=True)
class EvaluationArgs:
    """Evaluation: when to evaluate, the best model, early stopping, predictions (HF Trainer's names)."""

    eval_strategy: EvalStrategy | None = None
    """When to evaluate while training: no, steps (every --eval_steps) or epoch; the last step is always
    evaluated unless no. Default: epoch, or no where local files give no validation rows (no
    --validation_file nor --validation_split_percentage): the run trains without evaluating, as TRL and HF
    Trainer do, and exports the last step's model."""
    eval_steps: int | None = None
    """With --eval_strategy steps: evaluate every N optimizer steps; default --logging_steps."""
    per_device_eval_batch_size: int | None = None
    """Evaluation and prediction pairs per batch on each process; unset: 256 on CUDA, where larger batches
    evaluate several times faster (docs/benchmarks.md), 64 on CPU; both for --max_length 128, and fewer
    pairs for longer rows (the same tokens per batch)."""
    metric_for_best_model: str | None = None
    """Evaluation metric that picks the best model, kept in output_dir/best_model: eval_loss or a task metric;
    default: the task's first (eval_matched_accuracy for MNLI, eval_matthews_correlation for CoLA). Custom
    classification: eval_accuracy, eval_f1_macro or a class's eval_precision_<label>, eval_recall_<label>,
    eval_f1_<label>, eval_support_<label>; multi-label: eval_f1_micro, eval_f1_macro, eval_exact_match. Every
classification task also: eval_ece and eval_brier (ECE and Brier score), per label for multi-label
(eval_ece_<label>, eval_brier_<label>). causal_lm: eval_loss (the default), eval_perplexity, and with
--predict_with_generate eval_exact_match."""
    greater_is_better: bool | None = None
    """Whether a larger --metric_for_best_model is better; default: false for a loss, eval_ece and eval_brier,
    else true."""
    load_best_model_at_end: bool | None = None
    """Export (and predict and push) the best model by --metric_for_best_model instead of the last one;
    default: true whenever the run evaluates."""
    early_stopping_patience: int | None = None
    """Stop training after N evaluations in a row that do not improve --metric_for_best_model by more than
    --early_stopping_threshold; unset: never stop early."""
    early_stopping_threshold: float = 0.0
    """How much an evaluation must beat the best one by to reset --early_stopping_patience."""
    do_predict: bool = False
    """Write output_dir/predictions.jsonl: label and probabilities for every row of --test_file. causal_lm:
    {"row", "completion"}, each row's greedy completion (--generation_max_new_tokens) of its `prompt` (a
    string or messages) or its `messages` with the generation prompt (a conversation ending with an
    assistant turn has that turn generated anew). dpo: the same, of a file of prompts (or of pairs: their
    prompts)."""

    def __post_init__(self):
        """Checks of this group's flags alone; --load_best_model_at_end defaults to whether it evaluates."""
        evaluates = self.eval_strategy != "no"
        if self.per_device_eval_batch_size is not None and self.per_device_eval_batch_size <= 0:
            size = self.per_device_eval_batch_size
            raise ConfigError(f"--per_device_eval_batch_size must be a positive integer, got {size}")
        if self.metric_for_best_model is not None and not self.metric_for_best_model.startswith("eval_"):
            raise ConfigError(
                f"--metric_for_best_model must name an evaluation metric such as eval_accuracy, "
                f"got {self.metric_for_best_model!r}"
            )
        if self.eval_steps is not None and self.eval_strategy != "steps":
            raise ConfigError(
                f"--eval_steps is for --eval_strategy steps (this run has {self.eval_strategy}); add "
                "--eval_strategy steps or drop --eval_steps"
            )
        if self.eval_steps is not None and self.eval_steps <= 0:
            raise ConfigError(f"--eval_steps must be a positive integer, got {self.eval_steps}")
        if self.load_best_model_at_end and not evaluates:
            raise ConfigError(
                "--load_best_model_at_end needs evaluations to pick the best model; set --eval_strategy "
                "steps or epoch, or drop --load_best_model_at_end"
            )
        if self.load_best_model_at_end is None:
            object.__setattr__(self, "load_best_model_at_end", evaluates)
        if self.early_stopping_patience is not None and self.early_stopping_patience <= 0:
            raise ConfigError(
                f"--early_stopping_patience must be a positive integer or left unset, "
                f"got {self.early_stopping_patience}"
            )
        if self.early_stopping_threshold < 0:
            raise ConfigError(f"--early_stopping_threshold must be >= 0, got {self.early_stopping_threshold}")
