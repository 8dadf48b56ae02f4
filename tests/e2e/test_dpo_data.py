"""DPO's encoding on two real processes (a gloo group): every rank calls `encode_pairs` (the main one
encodes, the other reads datasets' cache) and gets the same pairs and task line; a split left with no pair
is refused by each rank on its own, so none waits at a barrier for a rank that stopped."""

from __future__ import annotations

import json

import pytest

from tests.warm_ranks import run_ranks

ENCODE = """
import json, sys
from pathlib import Path

from accelerate import Accelerator

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError
from finetune.families.dpo.data import encode_pairs, load_preference_splits
from tests.chat_models import chatml_tokenizer

train, out = sys.argv[1], Path(sys.argv[2])
accelerator = Accelerator(cpu=True)
config = TrainConfig(task_type="causal_lm", train_file=train, eval_strategy="no", max_length=64)
task, splits = load_preference_splits(config)
try:
    encoded = encode_pairs(task, splits, chatml_tokenizer(), config, accelerator)
except ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)
seen = {"world_size": accelerator.num_processes, "train": encoded["train"].to_dict(), "task": task.summary()}
(out / f"rank{accelerator.process_index}.json").write_text(json.dumps(seen))
"""

PROMPT = [{"role": "user", "content": "Is the river wide?"}]


def pair(chosen: str, rejected: str) -> dict:
    return {
        "prompt": PROMPT,
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def write(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.multiprocess
def test_two_ranks_encode_the_same_pairs(tmp_path):
    script = tmp_path / "encode.py"
    script.write_text(ENCODE)
    train = write(
        tmp_path, [pair(f"Yes, {i} miles.", f"No, {i} inches.") for i in range(5)] + [pair("Yes.", "Yes.")]
    )
    done = run_ranks([train, str(tmp_path)], script=str(script))
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [seen["world_size"] for seen in ranks] == [2, 2]
    assert ranks[0] == ranks[1] and ranks[0]["train"]["row"] == [0, 1, 2, 3, 4]
    assert "5 pairs (conversational, explicit prompt)" in ranks[0]["task"]
    assert "1 dropped: chosen equals rejected" in ranks[0]["task"]


@pytest.mark.multiprocess
def test_a_split_left_with_no_pair_is_refused_by_each_rank(tmp_path):
    script = tmp_path / "encode.py"
    script.write_text(ENCODE)
    train = write(tmp_path, [pair("Yes.", "Yes.")])
    done = run_ranks([train, str(tmp_path)], script=str(script), timeout=120)
    assert done.rank_returncodes == [2, 2], done.stderr[-3000:]
    assert f"error: {train}: no pair is left to train on (1 chosen equals rejected; " in done.stderr
