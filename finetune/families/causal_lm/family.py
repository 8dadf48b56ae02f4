"""`--task_type causal_lm`: the family's model (AutoModelForCausalLM, full or LoRA), its loss (summed
cross-entropy over target tokens, their count as units), its evaluation (eval_loss per target token and
eval_perplexity, each row counted once on any number of processes; eval_exact_match of greedy completions
with --predict_with_generate), its predictions (completions, generation.py) and its refusals."""

from __future__ import annotations

import contextlib
import functools
import math
from pathlib import Path

import torch
from accelerate.utils import DynamoBackend
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

from finetune.data.batching import build_dataloaders, resolve_pad_to_multiple_of
from finetune.errors import ConfigError, shorten
from finetune.families.causal_lm.batches import (
    POSITIONS,
    CausalLmCollator,
    head_at,
    heads_at_targets,
    per_row,
    row_losses,
    target_loss,
    targets_at,
)
from finetune.families.causal_lm.chunked_loss import (
    Head,
    chunked_target_loss,
    chunked_token_losses,
    hidden_at,
    resolve_chunked_loss,
)
from finetune.families.causal_lm.conversations import end_of_turn
from finetune.families.causal_lm.data import FORMAT_WORDS, LmTask, encode_splits, load_lm_splits, source_of
from finetune.families.causal_lm.generation import (
    PROMPTS,
    Prompts,
    check_generation,
    encode_prompts,
    predict_completions,
    prepare_generation,
    prompt_loaders,
    with_exact_match,
)
from finetune.families.causal_lm.packing import PackedCollator, forward_inputs, pack_rows, packed_attention
from finetune.families.family import Evaluator, MicroBatch, metric_choice
from finetune.hub import hub_error
from finetune.model.build import plain_speed
from finetune.model.gguf_files import as_plain_weights, check_gguf, read_once
from finetune.model.lora import wrap_with_lora
from finetune.model.options import loading_error, refuse_checkpoint_dtype
from finetune.model.quantization import keep_as_loaded, keeping_head
from finetune.output.card import CardParts
from finetune.speed.attention import computes_in_half, use_causal_varlen_attention
from finetune.speed.memory import enable_gradient_checkpointing
from finetune.training.evaluation import EvaluationAbandoned, progress


class CausalLM:
    name = "causal_lm"
    pipeline_tag = "text-generation"
    captures_cuda_graphs = False
    done_in_export = {}

    def __init__(self):
        self.packed = None
        """--packing: how the model keeps a pack's documents apart (`packing.PackedAttention`), set by
        `build_model`; None: rows one per sequence."""
        self.head_at_targets = False
        """Whether the output layer runs only at the target tokens (`batches.head_at`), set by
        `build_model`: where the model passes `heads_at_targets`' check, and nothing compiles it."""
        self.chunk_tokens = None
        """--chunked_loss: the target tokens per chunk of the loss (`chunked_loss`), or None: the
        targets' logits whole; set by `build_model`."""

    def load(self, config) -> tuple[LmTask, dict]:
        if config.chat_template:
            _check_chat_template(config.chat_template)
        task, splits = load_lm_splits(config)
        check_generation(config, task, splits)
        return task, splits

    def choose_metric(self, config, task: LmTask, splits: dict) -> dict:
        return metric_choice(config, splits, ["eval_loss", *task.metric_keys()], "eval_loss")

    def check(self, config, task: LmTask, splits: dict) -> None:
        """Everything is refused in `load`, before the data is read."""

    def build_model(
        self, args, task: LmTask, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str
    ):
        model, tokenizer = _load(args, loading)
        device_type = accelerator.device.type
        refuse_checkpoint_dtype(model, args, device_type, bf16_native)
        changes = _fit_tokenizer(model, tokenizer)
        if args.packing:  # refused here, before the data is encoded, if the attention cannot
            half = computes_in_half(model, accelerator.mixed_precision)
            self.packed = packed_attention(model, args.max_length, device_type, half)
            if self.packed.torch_kernel:
                use_causal_varlen_attention(model)
        prepare_generation(model, tokenizer, args)  # what generation and the exported model decode with
        # Compiled (the flag or an accelerate config), a hook added per call would recompile the graph.
        compiled = accelerator.state.dynamo_plugin.backend != DynamoBackend.NO
        self.head_at_targets = not compiled and heads_at_targets(model)
        self.chunk_tokens = resolve_chunked_loss(args, model, self.head_at_targets, compiled)
        if args.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        speed = plain_speed(args, model, accelerator)
        speed["chunked_loss"] = "true" if self.chunk_tokens else "false"
        speed["chunked_loss_tokens"] = self.chunk_tokens
        if args.use_peft:
            model = wrap_with_lora(model, args, "CAUSAL_LM")
        backbone = {
            "model_type": model.config.model_type,
            "head": "language model (next token)",
            "dtype": str(model.dtype).removeprefix("torch."),
            "tokenizer_changes": changes,
            # heads_at_targets' verdict: where the output layer runs (batches.head_at)
            "output_layer_at": "target tokens" if self.head_at_targets else "every token",
        }
        return model, tokenizer, backbone, speed

    def tokenize(self, task: LmTask, splits: dict, tokenizer, config, accelerator) -> dict:
        """The encoded rows, and the prompts generation reads (test, and validation's with
        --predict_with_generate); with --packing the training rows as packs (every rank packs the same: a
        pure function of the rows and --seed), counted on the task line."""
        trained = {name: split for name, split in splits.items() if name != "test"}
        sources = {name: source_of(config, name) for name in splits}
        encoded = encode_splits(task, trained, tokenizer, config, accelerator)
        if config.packing and "train" in encoded:
            encoded["train"], packs = pack_rows(encoded["train"], config.max_length, config.seed)
            task.counts["train"].update(packs)
        return {**encoded, **encode_prompts(task, splits, tokenizer, config, sources)}

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
        collator = CausalLmCollator(tokenizer.pad_token_id, multiple, config.max_length)
        if self.packed is not None:  # packs for training; evaluation's rows go to `collator` as they are
            collator = PackedCollator(collator, self.packed.varlen, config.max_length)
        prompts = {name: split for name, split in tokenized.items() if isinstance(split, Prompts)}
        scored = {name: split for name, split in tokenized.items() if name not in prompts}
        loaders = build_dataloaders(scored, tokenizer, config, world_size, on_gpu, collator=collator)
        return {**loaders, **prompt_loaders(prompts, tokenizer.pad_token_id, config, on_gpu)}

    def forward_backward(
        self, model, accelerator, task: LmTask, batch: dict, batch_divisor: int, graphs=None
    ) -> MicroBatch:
        """The summed cross-entropy of the micro-batch's target tokens, and their count: the loop divides
        the window's gradients by every rank's count, so an update is the mean per target token. Rows:
        the documents (a packed micro-batch carries their count as an int)."""
        labels, positions = batch.pop("labels"), batch.pop(POSITIONS)
        tokens = batch["attention_mask"].sum()  # --packing: the 2D mask, before forward_inputs reads it
        if "documents" in batch:
            inputs, rows = forward_inputs(batch, self.packed), batch["documents"]
        else:
            inputs, rows = batch, labels.shape[0]
        hooked = accelerator.unwrap_model(model) if self.head_at_targets else None
        if self.chunk_tokens:
            with hidden_at(hooked, positions) as kept:
                model(**inputs, use_cache=False)
            head = Head(hooked, kept.autocast)
            wanted = targets_at(labels, positions)
            summed, targets = chunked_target_loss(head, kept[0], wanted, self.chunk_tokens)
        else:
            with head_at(hooked, positions):
                logits = model(**inputs, use_cache=False).logits  # the config keeps it on: generation's
            summed, targets = target_loss(logits, labels, positions)
        accelerator.backward(summed / batch_divisor)
        return MicroBatch(summed.detach(), targets, rows, tokens)

    def evaluator(self, task: LmTask, accelerator) -> Evaluator:
        scored = functools.partial(
            _evaluate, accelerator=accelerator, head_at_targets=self.head_at_targets, chunks=self.chunk_tokens
        )
        return with_exact_match(scored, accelerator)

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        """The scored splits: --predict_with_generate's prompts are generated without autocast already."""
        return {name: loader for name, loader in eval_loaders.items() if not name.endswith(PROMPTS)}

    def predict(self, accelerator, model, loader, task: LmTask, num_rows: int) -> list[dict]:
        return predict_completions(accelerator, model, loader)  # each of the num_rows once, checked

    def card_parts(self, config, task: LmTask, results: dict) -> CardParts:
        model = config.hub_model_id or config.output_dir
        pipe = f'pipeline("text-generation", model="{model}")'
        if task.format == "text":
            asked = ['print(generate("Once upon a time", max_new_tokens=64)[0]["generated_text"])']
            use = ("from transformers import pipeline", "", f"generate = {pipe}", *asked)
        elif task.format == "prompt_completion":  # strings: the model learnt to complete prompts, not chats
            asked = [
                'prompt = "..."  # written as the training rows\' prompts are',
                'print(generate(prompt, max_new_tokens=64, return_full_text=False)[0]["generated_text"])',
            ]
            use = ("from transformers import pipeline", "", f"generate = {pipe}", *asked)
        else:
            asked = [
                'messages = [{"role": "user", "content": "Hello!"}]',
                'print(chat(messages, max_new_tokens=64)[0]["generated_text"][-1]["content"])',
            ]
            use = ("from transformers import pipeline", "", f"chat = {pipe}", *asked)
        trained_on = f"{FORMAT_WORDS[task.format]} (loss on {task.trained_on})"
        return CardParts(pipeline_tag=self.pipeline_tag, tag="causal-lm", trained_on=trained_on, use=use)

    def subject(self, config) -> str:
        return "causal LM"

    def record_extras(self, task: LmTask) -> dict:
        return {}

    def fit_batch_size(self, config, model, train, tokenizer, accelerator) -> tuple[dict, str]:
        raise NotImplementedError(
            "--auto_find_batch_size is refused for causal LMs (sequence_classification/flags.py OWNED)"
        )

    def step_graphs(self, args, config, accelerator, model, task: LmTask) -> None:
        """No CUDA graphs (`captures_cuda_graphs`)."""

    def finish(self, run) -> dict:
        """Nothing: the export is the trained model."""
        return {}


def _evaluate(
    model, eval_loaders: dict, should_stop=None, *, accelerator, head_at_targets: bool, chunks: int | None
) -> dict:
    """Collective: eval_loss, the summed cross-entropy of every target token of the split over their
    count (float64 sums of per-row sums, gathered without Accelerate's repeated rows), and
    eval_perplexity, exp(eval_loss); the same for any number of processes and any batch size. `chunks`:
    the targets' logits made that many tokens at a time (--chunked_loss), else whole."""
    model = getattr(model, "_orig_mod", model)
    hooked = accelerator.unwrap_model(model) if head_at_targets else None
    model.eval()
    results = {}
    with torch.no_grad():
        for split, loader in eval_loaders.items():
            losses, counts = [], []
            with progress(accelerator, loader, "eval") as batches:
                for batch in batches:
                    if should_stop is not None and should_stop():  # every rank, at the same batch
                        model.train()
                        raise EvaluationAbandoned
                    labels, positions = batch.pop("labels"), batch.pop(POSITIONS)
                    if chunks:
                        with hidden_at(hooked, positions) as kept:
                            model(**batch, use_cache=False)
                        head = Head(hooked, kept.autocast)
                        wanted = targets_at(labels, positions)
                        losses_each = chunked_token_losses(head, kept[0], wanted, chunks)
                        summed, targets = per_row(losses_each, labels, positions)
                    else:
                        with head_at(hooked, positions):
                            logits = model(**batch, use_cache=False).logits
                        summed, targets = row_losses(logits, labels, positions)
                    summed, targets = accelerator.gather_for_metrics((summed, targets))
                    losses.append(summed)
                    counts.append(targets)
            total, tokens = torch.cat(losses).sum().item(), torch.cat(counts).sum().item()
            loss = total / max(tokens, 1)
            prefix = "eval" if split == "validation" else f"eval_{split}"
            results[f"{prefix}_loss"] = loss
            results[f"{prefix}_perplexity"] = math.exp(min(loss, 700.0))  # exp overflows a float past ~709
            results[f"{prefix}_samples"] = int(torch.cat(counts).numel())
            results[f"{prefix}_tokens"] = int(tokens)
    model.train()
    return results


def _check_chat_template(path: str) -> None:
    """--chat_template's file is a Jinja template that writes a conversation's messages: one that does not
    compile, or renders a user turn and a reply without their words (a JSON file, another template), is
    refused naming the file, before any row is blamed for it."""
    file = Path(path)
    if file.is_dir():
        raise ConfigError(f"--chat_template {path} is a folder; give the template's .jinja file")
    try:
        text = file.read_text()
    except FileNotFoundError:
        raise ConfigError(f"--chat_template {path}: no such file; give a .jinja file") from None
    except (OSError, UnicodeDecodeError) as error:
        why = getattr(error, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"--chat_template {path}: {why}; give a .jinja file") from None
    probe = [{"role": "user", "content": "finetune-probe-question"},
             {"role": "assistant", "content": "finetune-probe-answer"}]  # fmt: skip
    try:
        rendered = str(render_jinja_template([probe], chat_template=text, bos_token="", eos_token="")[0])
    except Exception as error:  # jinja's syntax or the template's own error on a plain conversation
        why = shorten(" ".join(str(error).split()), 120) or type(error).__name__
        raise ConfigError(
            f"--chat_template {path} does not render a user turn and a reply ({why}); give a .jinja chat "
            "template"
        ) from None
    if "finetune-probe-question" not in rendered or "finetune-probe-answer" not in rendered:
        raise ConfigError(
            f"--chat_template {path} renders a user turn and a reply without their words (is it a chat "
            "template?); give a .jinja chat template that writes each message's content"
        )


def _load(args, loading: dict):
    """AutoModelForCausalLM and its tokenizer, with --chat_template's file as the tokenizer's template."""
    name = args.model_name_or_path
    hub = {key: loading[key] for key in ("revision", "trust_remote_code") if key in loading}
    reading = contextlib.nullcontext()
    if args.gguf_file:  # transformers reads the tokenizer and the dequantised weights from it
        check_gguf(name, args.gguf_file)
        hub["gguf_file"] = args.gguf_file
        loading = {**loading, "gguf_file": args.gguf_file}
        reading = read_once()
    try:
        if not args.gguf_file:  # a GGUF file holds a causal LM's weights, or transformers refuses it
            _refuse_without_lm_head(name, AutoConfig.from_pretrained(name, **hub))
        if "quantization_config" in loading:  # the output embeddings and --lora_modules_to_save stay
            architecture = AutoConfig.from_pretrained(name, **hub)
            loading = keeping_head(loading, AutoModelForCausalLM, architecture, "CAUSAL_LM")
        with reading:
            tokenizer = AutoTokenizer.from_pretrained(name, **hub)
            model = AutoModelForCausalLM.from_pretrained(name, **loading)
        keep_as_loaded(model)  # --load_in_4bit: the base the same on every CPU class
    except ConfigError:  # a ValueError too: the line above is the user's already
        raise
    except ValueError as error:
        raise loading_error(name, error, loading) from None
    except OSError as error:
        raise hub_error(name, error) from None
    if args.gguf_file:
        as_plain_weights(model)
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text()
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions is not None and args.max_length > positions:
        raise ConfigError(
            f"--max_length {args.max_length} exceeds the model's {positions} positions; lower it"
        )
    return model, tokenizer


OTHER_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
               "ForMultipleChoice", "ForMaskedLM", "ForPreTraining", "ForNextSentencePrediction",
               "Model")  # fmt: skip
"""How the class names of checkpoints without a causal-LM head end (BertModel: a bare encoder, MiniLM's)."""


def _refuse_without_lm_head(name: str, config) -> None:
    """A checkpoint of classifiers or bare encoders only: AutoModelForCausalLM would load a BERT as
    BertLMHeadModel, a new untrained head on a bidirectional encoder, and the run would then refuse its
    --max_length or its tokenizer (no EOS) without ever saying that it is no causal LM."""
    architectures = getattr(config, "architectures", None) or []
    lm = any(word in a for a in architectures for word in ("CausalLM", "LMHead", "ConditionalGeneration"))
    if architectures and not lm and all(a.endswith(OTHER_HEADS) for a in architectures):
        raise ConfigError(
            f"--model_name_or_path {name} is a {architectures[0]}, with no causal-LM head for --task_type "
            "causal_lm to train; give a causal LM (its config.json's architectures end in ForCausalLM), or "
            "train this one without --task_type causal_lm",
            flag="--model_name_or_path",
        )


def _fit_tokenizer(model, tokenizer) -> list[str]:
    """An EOS token, and a pad token for batches (the EOS token, as TRL does: padding is never a target,
    so it is never learnt), set in the model's config too. A tokenizer without an EOS whose chat template
    ends turns with a special token (<|im_end|>) takes that token as its EOS: rows end with it, and
    generation stops at it (prepare_generation lists it, as the model's own generation config often
    does). Refused only when nothing ends a turn."""
    changes = []
    if tokenizer.eos_token_id is None:
        ends = end_of_turn(tokenizer)
        if not ends:
            raise ConfigError(
                f"--model_name_or_path {model.name_or_path}: its tokenizer has no EOS token and no chat "
                "template ending a turn with a special token, so a completion could never end; give a "
                "tokenizer with an eos_token, or --chat_template FILE.jinja that ends turns with one"
            )
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(ends[0])
        changes.append(f"eos_token={tokenizer.eos_token} (the chat template's end of turn)")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        changes.append(f"pad_token={tokenizer.eos_token} (the EOS token)")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return changes
