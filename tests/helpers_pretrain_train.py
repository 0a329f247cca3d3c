"""A slowed-down pretraining run for the SIGKILL test (tests/test_pretrain_e2e.py):

    python tests/helpers_pretrain_train.py [--wiki] --sleep S <train_concap(_wiki).py flags>

runs `volta_ml.pretrain` (the real job, data, engine and CLI run function) with every Conceptual Captions sample
read S seconds late, so that a test can kill it in the middle of an epoch.
"""
from __future__ import annotations

import functools
import sys
import time
from pathlib import Path

from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class Slow(Dataset):
    """`dataset` with `sleep` seconds before each sample (and its `set_epoch`)."""

    def __init__(self, dataset, sleep: float):
        self.dataset, self.sleep = dataset, sleep

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        time.sleep(self.sleep)
        return self.dataset[index]


def slow_sets(args, tokenizer, config, info, sleep: float):
    from volta_ml.pretrain.job import concap_sets
    train, val = concap_sets(args, tokenizer, config, info)
    return Slow(train, sleep), val


def main() -> int:
    from volta_ml.cli.train_task import run
    from volta_ml.pretrain.cli import parse_args
    from volta_ml.pretrain.job import build_pretrain_job

    argv = sys.argv[1:]
    wiki = "--wiki" in argv
    argv = [a for a in argv if a != "--wiki"]
    i = argv.index("--sleep")
    sleep = float(argv[i + 1])
    del argv[i:i + 2]
    job = functools.partial(build_pretrain_job, datasets=functools.partial(slow_sets, sleep=sleep))
    return run(parse_args(argv, wiki=wiki), job, "train_concap_wiki.py" if wiki else "train_concap.py")


if __name__ == "__main__":
    sys.exit(main())
